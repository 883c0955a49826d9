//! The live side of every change: the events as they are recorded, for event streams, webhooks and the
//! long-polls they concern, and a version counter for changes without an event (servers').

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{broadcast, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::lock;
use crate::records::{Event, EventKind};

/// How many events a slow subscriber may fall behind before it is told to re-list.
const CHANNEL_CAPACITY: usize = 1024;
/// How many events of its key a waiter may fall behind before it checks again whatever they were: a call has few
/// between a waiter's looks, and each place is kept for as long as the key is followed.
const KEYED_CAPACITY: usize = 4;
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
    /// The channels of the waiters that follow one key's events, published or committed.
    keyed: Mutex<Keyed>,
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

/// What a waiter may follow instead of every event: the events of one call, or of one session (a Request's
/// events carry its call, and its session).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Key {
    Call(String),
    Session(String),
}

impl Key {
    fn concerns(&self, event: &Event) -> bool {
        match self {
            Key::Call(call) => event.call.as_deref() == Some(call.as_str()),
            Key::Session(session) => event.session == *session,
        }
    }
}

/// A channel for each key some waiter follows, so that an event wakes only the waiters of its call and its
/// session: thousands of clients waiting on their own Requests cost each change nothing.
#[derive(Debug, Default)]
struct Keyed {
    calls: HashMap<String, broadcast::Sender<Arc<Event>>>,
    sessions: HashMap<String, broadcast::Sender<Arc<Event>>>,
}

impl Keyed {
    fn of<'k>(&mut self, key: &'k Key) -> (&mut HashMap<String, broadcast::Sender<Arc<Event>>>, &'k str) {
        match key {
            Key::Call(call) => (&mut self.calls, call),
            Key::Session(session) => (&mut self.sessions, session),
        }
    }

    fn send(&self, event: &Arc<Event>) {
        let call = event.call.as_deref().and_then(|call| self.calls.get(call));
        for sender in call.into_iter().chain(self.sessions.get(&event.session)) {
            let _ = sender.send(event.clone());
        }
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

/// The events a waiter follows from the moment it subscribed ([`Feed::since`], [`Feed::since_of`]): those
/// published, and those this replica committed ahead of their publication.
pub struct Since {
    source: Source,
    /// Events taken over when the waiter narrowed to a key ([`Feed::narrow`]), and whether it fell behind then.
    backlog: VecDeque<Arc<Event>>,
    lagged: bool,
}

enum Source {
    Every {
        live: broadcast::Receiver<Live>,
        committed: broadcast::Receiver<Arc<Event>>,
    },
    Of(KeyedReceiver),
}

/// A waiter's receiver of one key's events; the key's channel goes with its last receiver.
struct KeyedReceiver {
    shared: Arc<Shared>,
    key: Key,
    receiver: broadcast::Receiver<Arc<Event>>,
}

impl Drop for KeyedReceiver {
    fn drop(&mut self) {
        let mut keyed = lock(&self.shared.keyed);
        let (channels, key) = keyed.of(&self.key);
        if channels.get(key).is_some_and(|sender| sender.receiver_count() == 1) {
            channels.remove(key);
        }
    }
}

impl Since {
    fn following(source: Source) -> Self {
        Self {
            source,
            backlog: VecDeque::new(),
            lagged: false,
        }
    }

    /// The next event, published or committed, or `Err` when the waiter fell behind some (or the feed closed).
    pub async fn next(&mut self) -> Result<Arc<Event>, broadcast::error::RecvError> {
        if std::mem::take(&mut self.lagged) {
            return Err(broadcast::error::RecvError::Lagged(0));
        }
        if let Some(event) = self.backlog.pop_front() {
            return Ok(event);
        }
        match &mut self.source {
            Source::Every { live, committed } => tokio::select! {
                live = live.recv() => live.map(|live| live.event),
                committed = committed.recv() => committed,
            },
            Source::Of(keyed) => keyed.receiver.recv().await,
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

    /// Whether the events received so far, without waiting, say that call `id` ended: `None` when they cannot
    /// tell, the waiter having fallen behind some, or an event of the call having come without its data.
    pub fn told_ended(mut self, id: &str) -> Option<bool> {
        let (mut ended, mut unreadable) = (false, self.lagged);
        let mut look = |event: Arc<Event>| {
            if event.kind != EventKind::CallUpdated || event.call.as_deref() != Some(id) {
                return;
            }
            match event.call_status() {
                Some(status) => ended |= status.is_final(),
                None => unreadable = true,
            }
        };
        std::mem::take(&mut self.backlog).into_iter().for_each(&mut look);
        let lagged = self.source.take_held(look);
        match (ended, unreadable || lagged) {
            (true, _) => Some(true),
            (false, true) => None,
            (false, false) => Some(false),
        }
    }
}

impl Source {
    /// Hands `take` every event held now, published or committed, without waiting; whether it had fallen behind.
    fn take_held(&mut self, mut take: impl FnMut(Arc<Event>)) -> bool {
        match self {
            Source::Every { live, committed } => {
                let live_lagged = take_held(live, |live| take(live.event));
                take_held(committed, take) | live_lagged
            }
            Source::Of(keyed) => take_held(&mut keyed.receiver, take),
        }
    }
}

/// Hands `take` what `receiver` holds now, without waiting; whether it had fallen behind. (`try_recv`, not
/// `recv`: a task out of its scheduling budget is refused by `recv` though events are there.)
fn take_held<T: Clone>(receiver: &mut broadcast::Receiver<T>, mut take: impl FnMut(T)) -> bool {
    let mut lagged = false;
    loop {
        match receiver.try_recv() {
            Ok(value) => take(value),
            Err(broadcast::error::TryRecvError::Lagged(_)) => lagged = true,
            Err(_) => return lagged,
        }
    }
}

/// Which changes make a waiter check again.
#[derive(Clone)]
pub enum Concern<'a> {
    /// Every change, servers' included.
    Any,
    /// The events that pass this test (and, when it fell behind them, any).
    Events(&'a (dyn Fn(&Event) -> bool + Sync)),
    /// The events of the key that pass this test: only those wake the waiter.
    EventsOf(Key, &'a (dyn Fn(&Event) -> bool + Sync)),
}

impl Default for Feed {
    fn default() -> Self {
        let (sender, _) = broadcast::channel(CHANNEL_CAPACITY);
        Self {
            shared: Arc::new(Shared {
                version: watch::Sender::new(0),
                live: Mutex::new(Chain { sender, last: 0 }),
                committed: broadcast::channel(CHANNEL_CAPACITY).0,
                keyed: Mutex::default(),
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

/// A copy of `event` as the live channels would carry it, for a store that keeps one to tell waiters of later
/// ([`Feed::committed`]): a large event's data is not copied only to be dropped.
pub fn carried_copy(event: &Event) -> Event {
    if event.data.len() > LIVE_DATA_BYTES {
        event.without_data()
    } else {
        event.clone()
    }
}

impl Feed {
    /// Sends recorded events to every subscriber, in order, and wakes every waiter.
    pub fn publish(&self, events: impl IntoIterator<Item = Arc<Event>>) {
        {
            let mut chain = lock(&self.shared.live);
            let keyed = lock(&self.shared.keyed);
            for event in events {
                let (id, event) = (event.id, carried(event));
                keyed.send(&event);
                let _ = chain.sender.send(Live {
                    follows: chain.last,
                    event,
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
        {
            let keyed = lock(&self.shared.keyed);
            for event in events {
                let event = carried(event);
                keyed.send(&event);
                let _ = self.shared.committed.send(event);
            }
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
        Since::following(Source::Every {
            live: self.subscribe(),
            committed: self.shared.committed.subscribe(),
        })
    }

    /// What a waiter on `key`'s events follows from now on: no other event wakes it.
    pub fn since_of(&self, key: Key) -> Since {
        let receiver = {
            let mut keyed = lock(&self.shared.keyed);
            let (channels, name) = keyed.of(&key);
            match channels.get(name) {
                Some(sender) => sender.subscribe(),
                None => {
                    let (sender, receiver) = broadcast::channel(KEYED_CAPACITY);
                    channels.insert(name.to_owned(), sender);
                    receiver
                }
            }
        };
        Since::following(Source::Of(KeyedReceiver {
            shared: self.shared.clone(),
            key,
            receiver,
        }))
    }

    /// `since` narrowed to `key`'s events, once the key is known (a call's id once it has started): what `since`
    /// received of them meanwhile is kept, and from now on no other event wakes the waiter.
    pub fn narrow(&self, since: Since, key: Key) -> Since {
        let mut narrowed = self.since_of(key.clone());
        let Since {
            mut source,
            mut backlog,
            mut lagged,
        } = since;
        // Taken after the key's channel is subscribed: an event sent in between may come twice, never not at all.
        lagged |= source.take_held(|event| backlog.push_back(event));
        backlog.retain(|event| key.concerns(event));
        narrowed.backlog = backlog;
        narrowed.lagged = lagged;
        narrowed
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
            Concern::EventsOf(key, concerns) => Changes::Events(self.since_of(key), concerns),
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

#[cfg(test)]
mod tests {
    use futures::FutureExt;

    use super::*;
    use crate::records::{EventKind, Tags};

    fn event(id: u64, session: &str, call: Option<&str>) -> Arc<Event> {
        let tags = Tags {
            server: "demo",
            session,
            call,
            owner: None,
        };
        Arc::new(Event {
            id,
            ..Event::new(EventKind::CallUpdated, &id, tags)
        })
    }

    /// Whether the waiter is told of an event now, without waiting.
    fn told(since: &mut Since) -> Option<u64> {
        since.next().now_or_never().map(|event| event.unwrap().id)
    }

    #[test]
    fn a_waiter_on_a_key_is_told_only_of_its_keys_events_published_or_committed() {
        let feed = Feed::default();
        let mut on_call = feed.since_of(Key::Call("call-a".to_owned()));
        let mut on_session = feed.since_of(Key::Session("s1".to_owned()));
        let mut every = feed.since();

        feed.publish([event(1, "s2", Some("call-b"))]);
        assert_eq!(told(&mut on_call), None, "another call's event does not wake it");
        assert_eq!(told(&mut on_session), None);
        assert_eq!(told(&mut every), Some(1));

        feed.publish([event(2, "s1", Some("call-a"))]);
        feed.committed([event(3, "s1", None)]);
        assert_eq!((told(&mut on_call), told(&mut on_call)), (Some(2), None));
        assert_eq!((told(&mut on_session), told(&mut on_session)), (Some(2), Some(3)));
    }

    #[test]
    fn a_waiter_narrowed_to_a_key_keeps_what_it_received_of_it_before() {
        let feed = Feed::default();
        let since = feed.since();
        feed.publish([event(1, "s1", Some("call-b")), event(2, "s1", Some("call-a"))]);
        feed.committed([event(3, "s1", Some("call-a"))]);
        let mut narrowed = feed.narrow(since, Key::Call("call-a".to_owned()));
        feed.publish([event(4, "s1", Some("call-b")), event(5, "s1", Some("call-a"))]);
        let ids: Vec<_> = std::iter::from_fn(|| told(&mut narrowed)).collect();
        assert_eq!(ids, [2, 3, 5]);
    }

    #[test]
    fn what_was_seen_since_tells_whether_a_call_ended_or_says_it_cannot() {
        let status = |id: u64, call: &str, status: &str| {
            let tags = Tags {
                server: "demo",
                session: "s1",
                call: Some(call),
                owner: None,
            };
            Arc::new(Event {
                id,
                ..Event::new(EventKind::CallUpdated, &serde_json::json!({"status": status}), tags)
            })
        };
        let feed = Feed::default();
        let seen = || feed.since();
        let (running, other_ended, ended, committed, unreadable, behind, behind_then_told) =
            (seen(), seen(), seen(), seen(), seen(), seen(), seen());
        feed.publish([status(1, "call-a", "running"), status(2, "call-b", "cancelled")]);
        assert_eq!(running.told_ended("call-a"), Some(false));
        assert_eq!(
            other_ended.told_ended("call-a"),
            Some(false),
            "another call's end is not its"
        );

        feed.committed([status(3, "call-a", "cancelled")]);
        assert_eq!(
            ended.told_ended("call-a"),
            Some(true),
            "committed here, not yet published"
        );
        feed.publish([status(3, "call-a", "cancelled")]);
        assert_eq!(committed.told_ended("call-a"), Some(true));

        feed.publish([Arc::new(status(4, "call-c", "completed").without_data())]);
        assert_eq!(
            unreadable.told_ended("call-c"),
            None,
            "an event without its data cannot tell"
        );
        feed.publish((5..).take(CHANNEL_CAPACITY).map(|id| status(id, "call-d", "running")));
        assert_eq!(behind.told_ended("call-f"), None, "what it fell behind may have told");
        feed.publish([status(CHANNEL_CAPACITY as u64 + 5, "call-e", "failed")]);
        assert_eq!(
            behind_then_told.told_ended("call-e"),
            Some(true),
            "told after it fell behind"
        );
        assert_eq!(seen().told_ended("call-a"), Some(false), "nothing since");
    }

    #[test]
    fn a_keys_channel_goes_with_its_last_waiter() {
        let feed = Feed::default();
        let key = Key::Call("call-a".to_owned());
        let (first, second) = (feed.since_of(key.clone()), feed.since_of(key));
        let channels = || lock(&feed.shared.keyed).calls.len();
        assert_eq!(channels(), 1);
        drop(first);
        assert_eq!(channels(), 1, "the second still follows it");
        drop(second);
        assert_eq!(channels(), 0);
    }
}
