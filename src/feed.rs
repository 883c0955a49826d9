//! The live side of every change: the events as they are recorded, for event streams and webhooks, and a
//! version counter that long-polls wait on.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{broadcast, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::records::Event;

/// How many events a slow subscriber may fall behind before it is told to re-list.
const CHANNEL_CAPACITY: usize = 1024;

/// The change feed; cheap to clone.
#[derive(Debug, Clone)]
pub struct Feed {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    /// Bumped on every change to Requests, Calls, Sessions or servers.
    version: watch::Sender<u64>,
    /// Every event, in the order it was recorded.
    live: broadcast::Sender<Arc<Event>>,
    /// Open `GET /events` streams.
    streams: Arc<AtomicUsize>,
    /// Responses held by `wait=`.
    long_polls: Arc<AtomicUsize>,
}

/// Counts one stream or long-poll while it lives.
#[derive(Debug)]
pub struct Counted(Arc<AtomicUsize>);

impl Counted {
    fn new(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Self(count.clone())
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Default for Feed {
    fn default() -> Self {
        let (live, _) = broadcast::channel(CHANNEL_CAPACITY);
        Self {
            shared: Arc::new(Shared {
                version: watch::Sender::new(0),
                live,
                streams: Arc::default(),
                long_polls: Arc::default(),
            }),
        }
    }
}

impl Feed {
    /// Sends recorded events to every subscriber, in order, and wakes every waiter.
    pub fn publish(&self, events: impl IntoIterator<Item = Arc<Event>>) {
        for event in events {
            let _ = self.shared.live.send(event);
        }
        self.notify();
    }

    /// Records that something without an event changed (a server's state) and wakes every waiter.
    pub fn notify(&self) {
        self.shared
            .version
            .send_modify(|version| *version = version.wrapping_add(1));
    }

    /// The events published from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Event>> {
        self.shared.live.subscribe()
    }

    /// A receiver that wakes on every change after now.
    pub fn versions(&self) -> watch::Receiver<u64> {
        self.shared.version.subscribe()
    }

    /// The events published from now on, for a `GET /events` stream, counted while the guard lives.
    pub fn stream(&self) -> (broadcast::Receiver<Arc<Event>>, Counted) {
        (self.subscribe(), Counted::new(&self.shared.streams))
    }

    /// How many `GET /events` streams are open.
    pub fn streams(&self) -> usize {
        self.shared.streams.load(Ordering::Relaxed)
    }

    /// How many responses `wait=` holds.
    pub fn long_polls(&self) -> usize {
        self.shared.long_polls.load(Ordering::Relaxed)
    }

    /// Re-evaluates `check` after every change until it yields a value, `wait` passes, or `shutdown` fires.
    ///
    /// `check` runs at least once, so a zero `wait` is a plain read.
    pub async fn wait_for<T>(
        &self,
        wait: Duration,
        shutdown: &CancellationToken,
        mut check: impl FnMut() -> Option<T>,
    ) -> Option<T> {
        let deadline = Instant::now() + wait;
        let mut versions = self.versions();
        let _counted = (!wait.is_zero()).then(|| Counted::new(&self.shared.long_polls));
        loop {
            if let Some(found) = check() {
                return Some(found);
            }
            // A timer for a deadline already due still waits for the next tick (about 1 ms).
            if Instant::now() >= deadline {
                return None;
            }
            tokio::select! {
                changed = versions.changed() => if changed.is_err() { return None },
                () = tokio::time::sleep_until(deadline) => return None,
                () = shutdown.cancelled() => return None,
            }
        }
    }
}
