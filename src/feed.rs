//! The live side of every change: the events as they are recorded, for event streams, webhooks and the
//! long-polls they concern, and a version counter for changes without an event (servers').

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{broadcast, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::lock;
use crate::records::Event;

/// How many events a slow subscriber may fall behind before it is told to re-list.
const CHANNEL_CAPACITY: usize = 1024;
/// The most bytes of data an event carries through the live channel, which keeps the latest events for its
/// slowest subscriber; a larger event goes without its data, which subscribers read from the store.
pub const LIVE_DATA_BYTES: usize = 16 << 10;

/// The change feed; cheap to clone.
#[derive(Debug, Clone)]
pub struct Feed {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    /// Bumped on every change to Requests, Calls, Sessions or servers.
    version: watch::Sender<u64>,
    /// Every event, in the order it was recorded, with the id of the one published before it.
    live: Mutex<Chain>,
    /// Events this replica committed that are published later (see [`Feed::committed`]).
    committed: broadcast::Sender<Arc<Event>>,
    /// Open `GET /events` streams.
    streams: Arc<Held>,
    /// Responses held by `wait=`.
    long_polls: Arc<Held>,
    /// How many times a waiter has checked again after a change.
    checks: AtomicU64,
}

/// The live channel and the id of the event last sent on it.
#[derive(Debug)]
struct Chain {
    sender: broadcast::Sender<Live>,
    last: u64,
}

/// A published event, as subscribers receive it.
#[derive(Debug, Clone)]
pub struct Live {
    /// The id of the event published before it (0 for the first): a subscriber that has passed that one has
    /// missed nothing in between. Event ids increase, but need not be consecutive.
    pub follows: u64,
    pub event: Arc<Event>,
}

impl std::ops::Deref for Live {
    type Target = Event;

    fn deref(&self) -> &Event {
        &self.event
    }
}

/// What is held open: how many in all, and by principal.
#[derive(Debug, Default)]
struct Held {
    total: AtomicUsize,
    by_principal: Mutex<HashMap<String, usize>>,
}

/// What may be held open, per principal.
#[derive(Debug, Clone, Copy)]
pub enum Hold {
    /// A `GET /events` stream.
    Stream,
    /// A response held by `wait=`.
    LongPoll,
}

/// Counts one stream or long-poll while it lives.
#[derive(Debug)]
pub struct Counted {
    held: Arc<Held>,
    principal: String,
}

impl Counted {
    fn new(held: &Arc<Held>, principal: String) -> Self {
        held.total.fetch_add(1, Ordering::Relaxed);
        Self {
            held: held.clone(),
            principal,
        }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.held.total.fetch_sub(1, Ordering::Relaxed);
        let mut by_principal = lock(&self.held.by_principal);
        if let Some(count) = by_principal.get_mut(&self.principal) {
            *count -= 1;
            if *count == 0 {
                by_principal.remove(&self.principal);
            }
        }
    }
}

/// What a waiter follows, as its concern says.
enum Changes<'a> {
    Versions(watch::Receiver<u64>),
    Events(Since, &'a (dyn Fn(&Event) -> bool + Sync)),
}

/// The events a waiter follows from the moment it subscribed ([`Feed::since`]): those published, and those
/// this replica committed ahead of their publication.
pub struct Since {
    live: broadcast::Receiver<Live>,
    committed: broadcast::Receiver<Arc<Event>>,
}

impl Since {
    /// The next event, published or committed, or `Err` when the waiter fell behind some (or the feed closed).
    pub async fn next(&mut self) -> Result<Arc<Event>, broadcast::error::RecvError> {
        tokio::select! {
            live = self.live.recv() => live.map(|live| live.event),
            committed = self.committed.recv() => committed,
        }
    }

    /// Waits for the next event that `concerns` passes; `true` then, or when the waiter fell behind some events
    /// (any of them may have concerned it), `false` when the feed closed.
    pub async fn concerning(&mut self, concerns: impl Fn(&Event) -> bool) -> bool {
        loop {
            match self.next().await {
                Ok(event) if concerns(&event) => return true,
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(_)) => return true,
                Err(broadcast::error::RecvError::Closed) => return false,
            }
        }
    }
}

/// Which changes make a waiter check again.
#[derive(Clone, Copy)]
pub enum Concern<'a> {
    /// Every change, servers' included.
    Any,
    /// The events that pass this test (and, when it fell behind them, any).
    Events(&'a (dyn Fn(&Event) -> bool + Sync)),
}

impl Default for Feed {
    fn default() -> Self {
        let (sender, _) = broadcast::channel(CHANNEL_CAPACITY);
        Self {
            shared: Arc::new(Shared {
                version: watch::Sender::new(0),
                live: Mutex::new(Chain { sender, last: 0 }),
                committed: broadcast::channel(CHANNEL_CAPACITY).0,
                streams: Arc::default(),
                long_polls: Arc::default(),
                checks: AtomicU64::new(0),
            }),
        }
    }
}

/// `event` as the live channels carry it: without its data when that is large.
fn carried(event: Arc<Event>) -> Arc<Event> {
    if event.data.len() > LIVE_DATA_BYTES {
        Arc::new(event.without_data())
    } else {
        event
    }
}

impl Feed {
    /// Sends recorded events to every subscriber, in order, and wakes every waiter.
    pub fn publish(&self, events: impl IntoIterator<Item = Arc<Event>>) {
        {
            let mut chain = lock(&self.shared.live);
            for event in events {
                let id = event.id;
                let _ = chain.sender.send(Live {
                    follows: chain.last,
                    event: carried(event),
                });
                chain.last = id;
            }
        }
        self.notify();
    }

    /// Tells the waiters of events this replica committed that the store publishes later, once every
    /// transaction before theirs has ended (PostgreSQL, whose replicas commit side by side): a waiter they concern,
    /// and every waiter on any change, checks again now, rather than behind whatever another replica's
    /// transaction holds up. Streams and webhooks still see each event once it is published, in order.
    pub fn committed(&self, events: impl IntoIterator<Item = Arc<Event>>) {
        for event in events {
            let _ = self.shared.committed.send(carried(event));
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
    pub fn subscribe(&self) -> broadcast::Receiver<Live> {
        lock(&self.shared.live).sender.subscribe()
    }

    /// What a waiter follows from now on ([`Self::wait_for_since`]).
    pub fn since(&self) -> Since {
        Since {
            live: self.subscribe(),
            committed: self.shared.committed.subscribe(),
        }
    }

    /// A receiver that wakes on every change after now.
    pub fn versions(&self) -> watch::Receiver<u64> {
        self.shared.version.subscribe()
    }

    /// Counts a stream or long-poll of `principal` while the guard lives, unless the principal holds `most`
    /// of them already: then `Err` with that number.
    pub fn hold(&self, hold: Hold, principal: &str, most: usize) -> Result<Counted, usize> {
        let held = match hold {
            Hold::Stream => &self.shared.streams,
            Hold::LongPoll => &self.shared.long_polls,
        };
        {
            let mut by_principal = lock(&held.by_principal);
            let count = by_principal.entry(principal.to_owned()).or_default();
            if *count >= most {
                return Err(most);
            }
            *count += 1;
        }
        Ok(Counted::new(held, principal.to_owned()))
    }

    /// How many `GET /events` streams are open.
    pub fn streams(&self) -> usize {
        self.shared.streams.total.load(Ordering::Relaxed)
    }

    /// How many responses `wait=` holds.
    pub fn long_polls(&self) -> usize {
        self.shared.long_polls.total.load(Ordering::Relaxed)
    }

    /// How many times a waiter has checked again after a change that concerned it.
    pub fn checks(&self) -> u64 {
        self.shared.checks.load(Ordering::Relaxed)
    }

    /// Evaluates `check` again after each change that `concern`s it, until it yields a value, `wait` passes,
    /// or `shutdown` fires.
    ///
    /// `check` runs at least once, so a zero `wait` is a plain read.
    pub async fn wait_for<T, F: Future<Output = Option<T>>>(
        &self,
        wait: Duration,
        shutdown: &CancellationToken,
        concern: Concern<'_>,
        check: impl FnMut() -> F,
    ) -> Option<T> {
        if wait.is_zero() {
            return self.wait_on(None, wait, shutdown, check).await;
        }
        // Subscribed before the first check, so that no change in between is missed; to what concerns it only.
        let changes = match concern {
            Concern::Any => Changes::Versions(self.versions()),
            Concern::Events(concerns) => Changes::Events(self.since(), concerns),
        };
        self.wait_on(Some(changes), wait, shutdown, check).await
    }

    /// [`Self::wait_for`] the events that `concerns` passes, from those `since` received on: a first `check` that
    /// decides on what was read after `since` subscribed ([`Self::since`]) misses no change.
    pub async fn wait_for_since<T, F: Future<Output = Option<T>>>(
        &self,
        since: Since,
        wait: Duration,
        shutdown: &CancellationToken,
        concerns: &(dyn Fn(&Event) -> bool + Sync),
        check: impl FnMut() -> F,
    ) -> Option<T> {
        let changes = Changes::Events(since, concerns);
        self.wait_on(Some(changes).filter(|_| !wait.is_zero()), wait, shutdown, check)
            .await
    }

    /// Runs `check`, and again after each of `changes`, as [`Self::wait_for`] does; once only without them.
    async fn wait_on<T, F: Future<Output = Option<T>>>(
        &self,
        changes: Option<Changes<'_>>,
        wait: Duration,
        shutdown: &CancellationToken,
        mut check: impl FnMut() -> F,
    ) -> Option<T> {
        let Some(mut changes) = changes else {
            return check().await;
        };
        let deadline = Instant::now() + wait;
        loop {
            if let Some(found) = check().await {
                return Some(found);
            }
            // A timer for a deadline already due still waits for the next tick (about 1 ms).
            if Instant::now() >= deadline {
                return None;
            }
            let changed = async {
                match &mut changes {
                    Changes::Versions(versions) => versions.changed().await.is_ok(),
                    Changes::Events(since, concerns) => since.concerning(*concerns).await,
                }
            };
            tokio::select! {
                changed = changed => {
                    if !changed {
                        return None;
                    }
                    self.shared.checks.fetch_add(1, Ordering::Relaxed);
                }
                () = tokio::time::sleep_until(deadline) => return None,
                () = shutdown.cancelled() => return None,
            }
        }
    }
}
