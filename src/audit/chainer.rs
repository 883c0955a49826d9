//! The chainer: it follows the event log in order from the newest event chained, and keeps each event's link
//! (the hash it follows and its own) in the store. It runs after the fact, on events published, so that no
//! write waits for the hash of the event before it: in PostgreSQL the replicas' transactions commit side by
//! side, and an event's predecessor is known only once the log is published up to it. One gateway of those
//! sharing a store chains, under a lease ([`crate::lease`]); the chain itself is its cursor.
//!
//! It hashes the events as the feed publishes them, which are the events as the log keeps them, and reads the
//! log only to start, and to catch up when it missed some (it fell behind the feed, or an event was too large
//! for it): a pass under a steady stream of events is then one write.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast::{self, error::RecvError, error::TryRecvError};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{GENESIS, Link};
use crate::feed::{Feed, Live};
use crate::lease::{self, Leased};
use crate::records::Event;
use crate::store::{Store, StoreError};

/// The key the chainer's lease is kept under, which no webhook takes ([`super::KEY_PREFIX`]).
const KEY: &str = "audit:chain";
/// How many events are chained at a time, in one write.
const PAGE: usize = 512;
/// How long the chainer waits before it tries again after the store failed.
const RETRY: Duration = Duration::from_secs(1);
/// The least time between two passes of the chainer: under a steady stream of events, one pass takes what that
/// time brought, rather than one pass per event, each of which writes to the store. The first event after a
/// quiet spell is chained at once.
const GATHER: Duration = Duration::from_millis(250);

/// Starts chaining as `holder` (this gateway, among those sharing the store), while it holds the lease.
pub async fn start(holder: &str, store: &Store, feed: &Feed, shutdown: &CancellationToken, tracker: &TaskTracker) {
    let chainer = Chainer {
        store: store.clone(),
        feed: feed.clone(),
    };
    lease::start(chainer, holder, store, shutdown, tracker).await;
}

/// Chains the events of one store.
struct Chainer {
    store: Store,
    feed: Feed,
}

impl Leased for Chainer {
    /// The chain says where it goes on from, whoever extended it last.
    type Start = ();

    fn key(&self) -> &str {
        KEY
    }

    async fn resume(&self, _saved: Option<u64>) -> Result<(), StoreError> {
        Ok(())
    }

    /// Chains what is published, then again whenever more is.
    async fn work(&self, (): (), shutdown: &CancellationToken) {
        let mut chain = Following::new(self.feed.subscribe());
        loop {
            let next = Instant::now() + GATHER;
            chain.gather();
            if let Err(error) = chain.pass(&self.store).await {
                tracing::warn!(%error, "the audit chain could not be extended");
                tokio::select! {
                    () = tokio::time::sleep(RETRY) => {}
                    () = shutdown.cancelled() => return,
                }
                continue;
            }
            // The first event published wakes the next pass; those published until it is due join it.
            tokio::select! {
                open = chain.receive() => if !open { return },
                () = shutdown.cancelled() => return,
            }
            loop {
                tokio::select! {
                    open = chain.receive() => if !open { return },
                    () = tokio::time::sleep_until(next) => break,
                    () = shutdown.cancelled() => return,
                }
            }
        }
    }
}

/// The chain as the chainer extends it from the feed: its newest link, and the events published after it.
pub struct Following {
    live: broadcast::Receiver<Live>,
    /// The chain's newest link, as this chainer last wrote or read it.
    head: Option<Link>,
    /// Events published after `head`, each following the one before it, not chained yet.
    gathered: Vec<Arc<Event>>,
    /// Whether the log must be read: at the start, and once the chainer missed events or the chain moved on
    /// without it.
    catching_up: bool,
}

impl Following {
    /// Follows what `live` receives from now on; the first pass reads the log up to it.
    pub fn new(live: broadcast::Receiver<Live>) -> Self {
        Self {
            live,
            head: None,
            gathered: Vec::new(),
            catching_up: true,
        }
    }

    /// The id of the last event chained or gathered: the one the next event published must follow.
    pub fn after(&self) -> u64 {
        self.gathered
            .last()
            .map(|event| event.id)
            .or_else(|| self.head.as_ref().map(|link| link.id))
            .unwrap_or(0)
    }

    /// Takes in what is published; false once the feed is closed.
    pub async fn receive(&mut self) -> bool {
        let received = self.live.recv().await;
        self.take(received)
    }

    /// Takes in what has been published and not received yet.
    pub fn gather(&mut self) {
        loop {
            let received = match self.live.try_recv() {
                Ok(event) => Ok(event),
                Err(TryRecvError::Lagged(missed)) => Err(RecvError::Lagged(missed)),
                Err(TryRecvError::Empty | TryRecvError::Closed) => return,
            };
            self.take(received);
        }
    }

    fn take(&mut self, received: Result<Live, RecvError>) -> bool {
        match received {
            // Chained already, or the log will be read past it.
            Ok(event) if self.catching_up || event.id <= self.after() => {}
            Ok(event) if event.has_data() && event.follows == self.after() => self.gathered.push(event.event),
            // Events were missed, or this one was too large for the feed: the log has them.
            Ok(_) | Err(RecvError::Lagged(_)) => self.catch_up(),
            Err(RecvError::Closed) => return false,
        }
        true
    }

    fn catch_up(&mut self) {
        self.catching_up = true;
        self.gathered.clear();
    }

    /// Chains what was gathered, or, when catching up, every event the log has that is not chained yet.
    pub async fn pass(&mut self, store: &Store) -> Result<(), StoreError> {
        let outcome = self.extend(store).await;
        if outcome.is_err() {
            self.catch_up();
        }
        outcome
    }

    async fn extend(&mut self, store: &Store) -> Result<(), StoreError> {
        if self.catching_up {
            self.head = chain_published(store).await?;
            self.catching_up = false;
            return Ok(());
        }
        let gathered = std::mem::take(&mut self.gathered);
        for page in gathered.chunks(PAGE) {
            let links = hashed(page.to_vec(), hash_after(self.head.as_ref())).await;
            let Some(newest) = links.last().cloned() else {
                return Ok(());
            };
            if !store
                .extend_chain(self.head.as_ref().map(|link| link.id), links)
                .await?
            {
                // Another chainer moved the chain on: read where it got to.
                self.catch_up();
                return Ok(());
            }
            self.head = Some(newest);
        }
        Ok(())
    }
}

/// Chains every event published and not chained yet, in the order of the log, and returns the newest link.
///
/// The first event chained follows [`GENESIS`]: the oldest event kept, when a store written before the chain
/// existed is chained for the first time. Events that left the log before they were chained (possible only in
/// memory, which keeps the last 4096) break the chain: the next one follows [`GENESIS`] again.
pub async fn chain_published(store: &Store) -> Result<Option<Link>, StoreError> {
    let mut head = store.chain_head().await?;
    let mut read_after = head.as_ref().map_or(0, |link| link.id);
    let mut prev = hash_after(head.as_ref());
    loop {
        let page = store.events_after(read_after, PAGE).await?;
        if page.gap {
            if page.resume_after <= read_after {
                return Ok(head);
            }
            if head.is_some() {
                tracing::warn!(
                    after = read_after,
                    resume_after = page.resume_after,
                    "events left the log before they were chained: the audit chain starts again after them"
                );
            }
            read_after = page.resume_after;
            prev = GENESIS.to_owned();
            continue;
        }
        if page.events.is_empty() {
            return Ok(head);
        }
        let links = hashed(page.events, prev).await;
        let Some(newest) = links.last().cloned() else {
            return Ok(head);
        };
        let whole_page = links.len() == PAGE;
        if store.extend_chain(head.as_ref().map(|link| link.id), links).await? {
            head = Some(newest);
            // What was published since is news to the chainer's next pass.
            if !whole_page {
                return Ok(head);
            }
        } else {
            // Another chainer moved the chain on: go on from where it got to.
            head = store.chain_head().await?;
        }
        prev = hash_after(head.as_ref());
        read_after = head.as_ref().map_or(0, |link| link.id);
    }
}

/// The hash the event after `head` follows: `head`'s, or [`GENESIS`] when the chain is empty.
fn hash_after(head: Option<&Link>) -> String {
    head.map_or_else(|| GENESIS.to_owned(), |link| link.hash.clone())
}

/// The links of `events`, the first following `prev`: hashed on the blocking pool, so that the hashing (a
/// canonical form and a SHA-256 for each event) takes a core of its own rather than the one serving requests.
async fn hashed(events: Vec<Arc<Event>>, mut prev: String) -> Vec<Link> {
    let hash = move || {
        let mut links = Vec::with_capacity(events.len());
        for event in &events {
            let link = Link::of(event, &prev);
            prev.clone_from(&link.hash);
            links.push(link);
        }
        links
    };
    match tokio::task::spawn_blocking(hash).await {
        Ok(links) => links,
        Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
        // The runtime is shutting down: nothing is chained, and the next start goes on.
        Err(_) => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chainers_lease_is_under_a_key_no_webhook_takes() {
        assert!(KEY.starts_with(crate::audit::KEY_PREFIX));
    }
}
