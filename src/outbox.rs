//! Delivery from the event log to receivers outside the gateway (webhooks, notification channels): each
//! receiver follows the log from where it left off and is given every event it asks for, in order, with
//! retries. A receiver that is down holds up only itself; its events wait in the log (and with a durable
//! store, across restarts), never in memory. Gateways sharing a store deliver each receiver's events once
//! between them: the one holding the receiver's lease delivers, from the cursor it saved.

use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::feed::Feed;
use crate::lease::{self, Leased};
use crate::records::Event;
use crate::store::{Store, StoreError};

/// How many events a receiver reads from the log at a time.
const PAGE: usize = 256;
/// The pause before the first retry; it doubles after each failed attempt.
const FIRST_RETRY: Duration = Duration::from_millis(500);
/// How long a receiver waits before reading the log again after the store failed a read.
const READ_RETRY: Duration = Duration::from_secs(1);

/// Where events go: one webhook, or one destination of a notification channel.
pub trait Receiver: Send + Sync + 'static {
    /// What it is called in logs, and the key its cursor and lease are kept under (unique among receivers).
    fn key(&self) -> &str;

    /// Whether it is given `event`.
    fn wants(&self, event: &Event) -> bool;

    /// How many times an event is tried before it is given up.
    fn attempts(&self) -> u32;

    /// One attempt to deliver `event`; the error says why it failed.
    fn deliver(&self, event: &Event) -> impl Future<Output = Result<Delivered, String>> + Send;

    /// Counts an attempt's outcome (`delivered`, `skipped`, `failed`) or an event it never got (`dropped`).
    fn count(&self, outcome: &str);
}

/// What a successful attempt came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivered {
    Sent,
    /// Nothing was due by the time the event's turn came (an escalation whose approval was answered).
    Skipped,
}

/// Starts delivering to `receiver` as `holder` (this gateway, among those sharing the store), while it holds
/// the receiver's lease ([`crate::lease`]). A receiver goes on from the last event it was given; one the store
/// has never seen starts with the events recorded from now on, which the lease taken here, before the gateway
/// serves, makes every event of this run.
pub async fn start<R: Receiver>(
    receiver: R,
    holder: &str,
    store: &Store,
    feed: &Feed,
    shutdown: &CancellationToken,
    tracker: &TaskTracker,
) {
    let delivery = Delivery {
        receiver,
        store: store.clone(),
        feed: feed.clone(),
    };
    lease::start(delivery, holder, store, shutdown, tracker).await;
}

/// Delivers one receiver's events in order.
struct Delivery<R> {
    receiver: R,
    store: Store,
    feed: Feed,
}

impl<R: Receiver> Leased for Delivery<R> {
    /// The last event given to the receiver.
    type Start = u64;

    fn key(&self) -> &str {
        self.receiver.key()
    }

    /// The saved cursor; a receiver without one starts after the newest event, also across a restart before
    /// its first delivery.
    async fn resume(&self, saved: Option<u64>) -> Result<u64, StoreError> {
        if let Some(cursor) = saved {
            return Ok(cursor);
        }
        let start = self.store.last_event_id().await?;
        self.store.save_webhook_cursor(self.key(), start);
        Ok(start)
    }

    async fn work(&self, cursor: u64, shutdown: &CancellationToken) {
        self.follow(cursor, shutdown).await;
    }
}

impl<R: Receiver> Delivery<R> {
    fn key(&self) -> &str {
        self.receiver.key()
    }

    /// Delivers every event after `cursor`, then each new one as it is recorded; returns at `shutdown`.
    async fn follow(&self, mut cursor: u64, shutdown: &CancellationToken) {
        let mut versions = self.feed.versions();
        loop {
            let page = match self.store.events_after(cursor, PAGE).await {
                Ok(page) => page,
                Err(error) => {
                    tracing::warn!(receiver = %self.key(), %error, "the event log could not be read");
                    tokio::select! {
                        () = tokio::time::sleep(READ_RETRY) => continue,
                        () = shutdown.cancelled() => return,
                    }
                }
            };
            if page.gap {
                let missed = page.resume_after.saturating_sub(cursor);
                for _ in 0..missed {
                    self.receiver.count("dropped");
                }
                tracing::warn!(receiver = %self.key(), missed, "events left the log before they were delivered");
                cursor = page.resume_after;
                self.store.save_webhook_cursor(self.key(), cursor);
                continue;
            }
            if page.events.is_empty() {
                tokio::select! {
                    changed = versions.changed() => if changed.is_err() { return },
                    () = shutdown.cancelled() => return,
                }
                continue;
            }
            for event in page.events {
                if self.receiver.wants(&event) {
                    tokio::select! {
                        () = self.deliver(&event) => {}
                        () = shutdown.cancelled() => return,
                    }
                }
                cursor = event.id;
                self.store.save_webhook_cursor(self.key(), cursor);
            }
        }
    }

    /// Tries one event up to the receiver's attempts, with exponential back-off.
    async fn deliver(&self, event: &Event) {
        let mut pause = FIRST_RETRY;
        let attempts = self.receiver.attempts();
        for attempt in 1..=attempts {
            let failure = self.receiver.deliver(event).await.err();
            self.receiver
                .count(if failure.is_none() { "delivered" } else { "failed" });
            let Some(failure) = failure else { return };
            tracing::warn!(receiver = %self.key(), event = event.id, attempt, failure, "delivery failed");
            if attempt < attempts {
                tokio::time::sleep(pause).await;
                pause *= 2;
            }
        }
        tracing::warn!(receiver = %self.key(), event = event.id, "delivery given up");
    }
}

/// An error and its sources, `: `-separated, so that a refused address is named and not only "error sending
/// request".
pub fn causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
