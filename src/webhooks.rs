//! Webhooks: each webhook follows the event log from where it left off and POSTs every event it asks for,
//! signed the Standard Webhooks way, in order, with retries. A receiver that is down holds up only its own
//! webhook; its events wait in the log (and with a durable store, across restarts), never in memory. A delivery
//! goes to the webhook's URL and nowhere else: redirects are not followed, and link-local and metadata
//! addresses are refused unless the webhook allows them.

use std::time::Duration;

use tokio::time::Instant;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::Webhook;
use crate::egress::GuardedResolver;
use crate::feed::Feed;
use crate::metrics::{Metric, Metrics};
use crate::records::Event;
use crate::store::{Lease, Store, StoreError};

/// How many events a webhook reads from the log at a time.
const PAGE: usize = 256;
/// The pause before the first retry; it doubles after each failed attempt.
const FIRST_RETRY: Duration = Duration::from_millis(500);
/// How long a webhook waits before reading the log again after the store failed a read.
const READ_RETRY: Duration = Duration::from_secs(1);
/// How long a gateway holds a webhook's lease without renewing it: when the gateway delivering a webhook
/// dies, another takes its deliveries over from the saved cursor within this and one [`RENEW`].
const LEASE: Duration = Duration::from_secs(15);
/// How often the holder renews the lease (a third of it, so that two renewals may fail), and how often the
/// other gateways ask for it.
const RENEW: Duration = Duration::from_secs(5);
/// The header carrying the event's id, the same at every attempt: receivers deduplicate on it.
pub const ID_HEADER: &str = "webhook-id";
/// The header carrying the attempt's time, in seconds since the epoch on the gateway's clock.
pub const TIMESTAMP_HEADER: &str = "webhook-timestamp";
/// The header carrying `v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`, with a secret.
pub const SIGNATURE_HEADER: &str = "webhook-signature";

/// Starts one delivery task per webhook, delivering as `holder` (this gateway, among those sharing the store).
/// A webhook goes on from the last event it was given; one the store has never seen starts with the events
/// recorded from now on. Fails only when an HTTP client cannot be built.
pub async fn start(
    webhooks: Vec<Webhook>,
    holder: &str,
    store: &Store,
    feed: &Feed,
    metrics: &Metrics,
    shutdown: &CancellationToken,
    tracker: &TaskTracker,
) -> Result<(), reqwest::Error> {
    if webhooks.is_empty() {
        return Ok(());
    }
    let guarded = delivery_client().dns_resolver(GuardedResolver).build()?;
    let open = delivery_client().build()?;
    for webhook in webhooks {
        let client = if webhook.allow_link_local { &open } else { &guarded }.clone();
        let delivery = Delivery {
            webhook,
            holder: holder.to_owned(),
            client,
            store: store.clone(),
            feed: feed.clone(),
            metrics: metrics.clone(),
        };
        // Taken before the gateway serves, so that a new webhook gets every event of this run.
        let first = delivery.take().await;
        tracker.spawn(delivery.run(first, shutdown.clone()));
    }
    Ok(())
}

/// A client for deliveries: it never follows a redirect, so a 3xx is a failed delivery and its `Location`
/// gets nothing.
fn delivery_client() -> reqwest::ClientBuilder {
    reqwest::Client::builder().redirect(reqwest::redirect::Policy::none())
}

/// Delivers one webhook's events in order, while it holds the webhook's lease.
struct Delivery {
    webhook: Webhook,
    /// Who this gateway is to the other gateways sharing the store.
    holder: String,
    client: reqwest::Client,
    store: Store,
    feed: Feed,
    metrics: Metrics,
}

/// What an attempt to take a webhook's lease came to.
enum Taken {
    /// This gateway delivers, after this event.
    Mine(u64),
    /// Another gateway holds the lease.
    Elsewhere,
    Failed(StoreError),
}

impl Delivery {
    /// Delivers while this gateway holds the webhook's lease and waits for it while another does, until
    /// `shutdown`; `first` is what the first attempt to take it came to.
    async fn run(self, first: Taken, shutdown: CancellationToken) {
        let mut taken = first;
        loop {
            match taken {
                Taken::Mine(cursor) => {
                    let held_until = Instant::now() + LEASE;
                    tokio::select! {
                        () = self.follow(cursor, &shutdown) => return,
                        () = self.keep(held_until) => {}
                    }
                }
                Taken::Elsewhere => {}
                Taken::Failed(error) => {
                    tracing::warn!(webhook = %self.webhook.name, %error, "the webhook's lease could not be taken");
                }
            }
            tokio::select! {
                () = tokio::time::sleep(RENEW) => {}
                () = shutdown.cancelled() => return,
            }
            taken = self.take().await;
        }
    }

    /// Takes the webhook's lease, with the saved cursor. A webhook without one starts after the newest event,
    /// also across a restart before its first delivery.
    async fn take(&self) -> Taken {
        match self.hold().await {
            Ok(Lease::Mine(Some(cursor))) => Taken::Mine(cursor),
            Ok(Lease::Mine(None)) => match self.store.last_event_id().await {
                Ok(start) => {
                    self.store.save_webhook_cursor(&self.webhook.name, start);
                    Taken::Mine(start)
                }
                Err(error) => Taken::Failed(error),
            },
            Ok(Lease::Elsewhere) => Taken::Elsewhere,
            Err(error) => Taken::Failed(error),
        }
    }

    /// Takes or renews the webhook's lease.
    async fn hold(&self) -> Result<Lease, StoreError> {
        self.store.hold_webhook(&self.webhook.name, &self.holder, LEASE).await
    }

    /// Renews the lease every [`RENEW`]; returns once another gateway holds it, or once it may have run out
    /// (`held_until`, on this process's clock) while the store could not renew it.
    async fn keep(&self, mut held_until: Instant) {
        loop {
            tokio::time::sleep(RENEW).await;
            let asked = Instant::now();
            match self.hold().await {
                Ok(Lease::Mine(_)) => held_until = asked + LEASE,
                Ok(Lease::Elsewhere) => {
                    tracing::warn!(webhook = %self.webhook.name, "another gateway took the webhook's deliveries over");
                    return;
                }
                Err(error) if Instant::now() + RENEW < held_until => {
                    tracing::warn!(webhook = %self.webhook.name, %error, "the webhook's lease could not be renewed");
                }
                Err(error) => {
                    tracing::warn!(webhook = %self.webhook.name, %error, "the webhook's lease may have run out: its deliveries stop");
                    return;
                }
            }
        }
    }

    /// Delivers every event after `cursor`, then each new one as it is recorded; returns at `shutdown`.
    async fn follow(&self, mut cursor: u64, shutdown: &CancellationToken) {
        let mut versions = self.feed.versions();
        loop {
            let page = match self.store.events_after(cursor, PAGE).await {
                Ok(page) => page,
                Err(error) => {
                    tracing::warn!(webhook = %self.webhook.name, %error, "the event log could not be read");
                    tokio::select! {
                        () = tokio::time::sleep(READ_RETRY) => continue,
                        () = shutdown.cancelled() => return,
                    }
                }
            };
            if page.gap {
                let missed = page.resume_after.saturating_sub(cursor);
                for _ in 0..missed {
                    self.count("dropped");
                }
                tracing::warn!(webhook = %self.webhook.name, missed, "events left the log before this webhook got them");
                cursor = page.resume_after;
                self.store.save_webhook_cursor(&self.webhook.name, cursor);
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
                if self.webhook.events.is_empty() || self.webhook.events.contains(&event.kind) {
                    tokio::select! {
                        () = self.deliver(&event) => {}
                        () = shutdown.cancelled() => return,
                    }
                }
                cursor = event.id;
                self.store.save_webhook_cursor(&self.webhook.name, cursor);
            }
        }
    }

    /// POSTs one event, retrying with exponential back-off up to the webhook's attempts; each attempt carries
    /// its own timestamp, signed anew.
    async fn deliver(&self, event: &Event) {
        let id = event.id.to_string();
        let body = format!(
            r#"{{"id":{},"type":"{}","data":{}}}"#,
            event.id,
            event.kind.name(),
            event.data
        );
        let mut pause = FIRST_RETRY;
        for attempt in 1..=self.webhook.attempts {
            let timestamp = self.store.clock().now().millis().div_euclid(1000);
            let mut request = self
                .client
                .post(self.webhook.url.clone())
                .timeout(self.webhook.timeout)
                .header("content-type", "application/json")
                .header("x-toolnexus-event", event.kind.name())
                .header("x-toolnexus-delivery", &id)
                .header(ID_HEADER, &id)
                .header(TIMESTAMP_HEADER, timestamp.to_string())
                .body(body.clone());
            if let Some(secret) = &self.webhook.secret {
                request = request.header(SIGNATURE_HEADER, secret.sign(&id, timestamp, body.as_bytes()));
            }
            let failure = match request.send().await {
                Ok(response) if response.status().is_success() => None,
                Ok(response) if response.status().is_redirection() => Some(format!(
                    "the receiver answered {} (redirects are not followed)",
                    response.status()
                )),
                Ok(response) => Some(format!("the receiver answered {}", response.status())),
                Err(error) => Some(format!("the request failed: {}", causes(&error.without_url()))),
            };
            self.count(if failure.is_none() { "delivered" } else { "failed" });
            let Some(failure) = failure else { return };
            tracing::warn!(webhook = %self.webhook.name, event = event.id, attempt, failure, "webhook delivery failed");
            if attempt < self.webhook.attempts {
                tokio::time::sleep(pause).await;
                pause *= 2;
            }
        }
        tracing::warn!(webhook = %self.webhook.name, event = event.id, "webhook delivery given up");
    }

    fn count(&self, outcome: &str) {
        let labels = [("webhook", self.webhook.name.as_str()), ("outcome", outcome)];
        self.metrics.inc(Metric::WebhookDeliveries, &labels);
    }
}

/// An error and its sources, `: `-separated, so that a refused address is named and not only "error sending
/// request".
fn causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_guarded_client_refuses_a_metadata_name_before_connecting() {
        let error = delivery_client()
            .dns_resolver(GuardedResolver)
            .build()
            .unwrap()
            .post("http://metadata.google.internal/computeMetadata/v1/")
            .send()
            .await
            .unwrap_err();
        let causes = causes(&error);
        assert!(
            causes.contains("metadata.google.internal is a cloud metadata service")
                && causes.contains("allow_link_local = true"),
            "{causes}"
        );
    }
}
