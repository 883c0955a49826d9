//! The event log as every replica sees it: events are published here in the order of their ids, whichever
//! replica recorded them, each once. The log is read whenever this replica's writer kept events (by the writer
//! itself, right behind its `COMMIT`, and here again only if that read could not publish all it kept),
//! whenever the database says another replica's transaction did (`LISTEN`), after a reconnect, and at least
//! every second, so that a missed notification delays an event but never loses it.
//!
//! Why no event is skipped or repeated, though transactions commit in any order: an event's id starts with
//! its transaction's id (see [`super::writer`]), and a read publishes only the events below [`PUBLISHED`],
//! the lowest transaction id still in flight in the read's own snapshot (`pg_snapshot_xmin`). Every
//! transaction below it has ended, and the snapshot sees the commits of all of them, so the read sees every
//! event that will ever have an id below it; a transaction that takes its id later (at its first write) takes
//! a higher one. The horizon never moves back, so each read publishes the events after the last one published
//! and below a horizon at least as high: the log's prefix, in order, grown. A transaction that commits out of
//! order (a lower id after a higher) holds the horizon below its id until it ends, and with it every event
//! after its own.

use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::Notify;
use tokio_postgres::{AsyncMessage, Client};
use tokio_util::sync::CancellationToken;

use super::{Connector, EVENTS_PER_TRANSACTION, Postgres, Reader, rows};
use crate::feed::Feed;
use crate::lock;
use crate::records::Event;
use crate::store::EventPage;

/// The channel a transaction that recorded events notifies.
pub const CHANNEL: &str = "toolnexus_events";
/// The first event id not yet published, in a statement: that of the oldest transaction in flight (2^20 ids a
/// transaction, as the writer gives them).
pub const PUBLISHED: &str = "(pg_snapshot_xmin(pg_current_snapshot())::TEXT::BIGINT * 1048576)";
/// How often the log is read without being told of a commit.
const POLL: Duration = Duration::from_secs(1);
/// How long a lost listening connection waits before connecting again.
const RECONNECT: Duration = Duration::from_secs(1);
/// How many events one read of the log takes.
pub const PAGE: usize = 1000;
/// How long events are held back before the tail tells this replica's waiters of those committed.
const HELD_LONG: Duration = Duration::from_millis(8);

/// Publishes events in the order of their ids, each once.
#[derive(Debug)]
pub struct Publisher {
    feed: Feed,
    /// The id of the last event published.
    last: Mutex<u64>,
    /// What the last read of the events held back could not see yet (see [`tell_held_back`]).
    unseen: Mutex<Unseen>,
    /// Asks the tail to read the log.
    wake: Notify,
}

impl Publisher {
    /// Publishes from after event `last`.
    pub fn new(feed: Feed, last: u64) -> Self {
        Self {
            feed,
            last: Mutex::new(last),
            unseen: Mutex::default(),
            wake: Notify::new(),
        }
    }

    /// Has the tail read the log: this replica kept events.
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// Tells this replica's waiters of events it committed that the tail publishes later.
    pub fn committed(&self, events: Vec<Arc<Event>>) {
        self.feed.committed(events);
    }

    /// Publishes a page of the log read after the last event published (`kept`: the newest event kept then,
    /// published or not), and says what is left to read.
    pub fn publish(&self, page: EventPage, kept: u64) -> Next {
        if page.gap {
            tracing::warn!(after = self.last(), "events left the log before this replica read them");
            // Pruned before this replica read them: what follows is published from the oldest kept. Whoever
            // else publishes may have gone past it meanwhile.
            let mut last = lock(&self.last);
            *last = (*last).max(page.resume_after);
            return Next::More;
        }
        let full = page.events.len() == PAGE;
        self.read(page.events);
        if full {
            Next::More
        } else if kept > self.last() {
            Next::HeldBack
        } else {
            Next::Done
        }
    }

    /// Publishes what was read from the log, skipping what was published meanwhile.
    fn read(&self, events: Vec<Arc<Event>>) {
        let mut last = lock(&self.last);
        let fresh: Vec<Arc<Event>> = events.into_iter().filter(|event| event.id > *last).collect();
        if let Some(newest) = fresh.last() {
            *last = newest.id;
            self.feed.publish(fresh);
        }
    }

    /// The id of the last event published.
    pub fn last(&self) -> u64 {
        *lock(&self.last)
    }
}

/// What is left to read of the log after a page of it.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    /// Nothing: every event kept is published.
    Done,
    /// The rest of a full page, or what follows events that left the log unread.
    More,
    /// Events kept behind a transaction with a lower id still in flight.
    HeldBack,
}

/// Waiting for events held back (kept, but behind a transaction with a lower id still in flight): a little
/// longer each time, for at most about [`POLL`] in all, so that a reader sees the events kept before it asked
/// unless a transaction stays open that long.
pub(super) struct HeldBack(Duration);

impl Default for HeldBack {
    fn default() -> Self {
        Self(Duration::from_millis(1))
    }
}

impl HeldBack {
    /// Whether the events have been held back long enough that waiters are told of them as committed: not
    /// while another replica's transaction only takes its usual few milliseconds.
    fn long(&self) -> bool {
        self.0 >= HELD_LONG
    }

    /// Waits before the next read; `false` (at once) when the reader has waited long enough.
    pub(super) async fn wait(&mut self) -> bool {
        if self.0 > POLL {
            return false;
        }
        tokio::time::sleep(self.0).await;
        self.0 *= 2;
        true
    }
}

/// Follows the log until `stop` fires.
pub async fn run(store: Postgres, publisher: Arc<Publisher>, stop: CancellationToken) {
    loop {
        let listening = match listen(&store.shared.connector, publisher.clone(), store.replica()).await {
            Ok(listening) => Some(listening),
            Err(error) => {
                tracing::warn!(%error, "the store cannot listen for other replicas' events; it reads its log every second");
                None
            }
        };
        loop {
            catch_up(&store, &publisher).await;
            tokio::select! {
                () = publisher.wake.notified() => {}
                () = tokio::time::sleep(POLL) => {}
                () = stop.cancelled() => return,
            }
            if listening.as_ref().is_none_or(|(_, closed)| closed.is_cancelled()) {
                break;
            }
        }
        tokio::select! {
            () = tokio::time::sleep(RECONNECT) => {}
            () = stop.cancelled() => return,
        }
    }
}

/// Reads the log up to its end, and again, a little later each time, while events kept are not published yet
/// (a transaction with a lower id is still in flight).
async fn catch_up(store: &Postgres, publisher: &Publisher) {
    let mut held_back = HeldBack::default();
    loop {
        match store.log_after(publisher.last(), PAGE).await {
            Ok((page, kept)) => match publisher.publish(page, kept) {
                Next::Done => {
                    // Nothing is held back: the next hold's first read takes all it holds.
                    *lock(&publisher.unseen) = Unseen::default();
                    return;
                }
                Next::More => {}
                Next::HeldBack => {
                    if held_back.long() {
                        tell_held_back(store, publisher).await;
                    }
                    if !held_back.wait().await {
                        return;
                    }
                }
            },
            Err(error) => {
                tracing::warn!(%error, "the store's event log could not be read");
                return;
            }
        }
    }
}

/// The transactions whose events a read of the events held back could not see: those in flight when it read,
/// and those that took their ids after it (from `next` on). Any other transaction had ended by then, and the read
/// saw its events.
#[derive(Debug, Default)]
struct Unseen {
    next: i64,
    in_flight: Vec<i64>,
}

/// Tells this replica's waiters of the events committed behind a transaction still in flight (that the log
/// does not publish yet), so that a long transaction anywhere holds up streams, but not the waiters of what
/// committed meanwhile ([`Feed::committed`]). Each read takes only the events of the transactions the one
/// before it could not see, so a long hold does not read the same events again and again.
async fn tell_held_back(store: &Postgres, publisher: &Publisher) {
    static HELD: LazyLock<String> = LazyLock::new(|| {
        format!(
            "SELECT e.*, pg_snapshot_xmax(s.snapshot)::TEXT::BIGINT, \
             ARRAY(SELECT x::TEXT::BIGINT FROM pg_snapshot_xip(s.snapshot) AS x) \
             FROM (SELECT pg_current_snapshot() AS snapshot) AS s \
             LEFT JOIN LATERAL (SELECT {} FROM events WHERE seq > $1 AND seq >= {PUBLISHED} \
             AND (seq >= $2::BIGINT * {EVENTS_PER_TRANSACTION} OR seq / {EVENTS_PER_TRANSACTION} = ANY($3)) \
             ORDER BY seq) AS e ON true",
            rows::EVENT
        )
    });
    let after = i64::try_from(publisher.last()).unwrap_or(i64::MAX);
    let (next, in_flight) = {
        let unseen = lock(&publisher.unseen);
        (unseen.next, unseen.in_flight.clone())
    };
    let found = store
        .read(async |conn| {
            let rows = conn.query(&HELD, &[&after, &next, &in_flight]).await?;
            let mut events = Vec::new();
            let mut unseen = Unseen::default();
            for row in &rows {
                unseen = Unseen {
                    next: row.try_get(rows::EVENT_COLUMNS)?,
                    in_flight: row.try_get(rows::EVENT_COLUMNS + 1)?,
                };
                if row.try_get::<_, Option<i64>>(0)?.is_some() {
                    events.push(Arc::new(rows::event(row)?));
                }
            }
            Ok((events, unseen))
        })
        .await;
    match found {
        Ok((events, unseen)) => {
            *lock(&publisher.unseen) = unseen;
            publisher.committed(events);
        }
        Err(error) => tracing::warn!(%error, "the events held back could not be read"),
    }
}

/// Up to `limit` events published after event `after`, and the id of the newest event kept, published or not,
/// in one statement over one snapshot (BENCHMARKS.md, "Store: PostgreSQL with fewer exchanges per change", 47a98e7).
pub(super) async fn log_page(
    conn: &impl Reader,
    after: u64,
    limit: usize,
) -> Result<(EventPage, u64), tokio_postgres::Error> {
    let after = i64::try_from(after).unwrap_or(i64::MAX);
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let gap = |resume_after: i64| EventPage {
        events: Vec::new(),
        gap: true,
        resume_after: u64::try_from(resume_after).unwrap_or(0),
    };
    // The page, the newest event published and kept, and how far the log was pruned, as one snapshot saw them.
    static PAGE: LazyLock<String> = LazyLock::new(|| {
        format!(
            "SELECT e.*, l.pruned_through, l.last, l.kept FROM (SELECT pruned_through, \
             (SELECT max(seq) FROM events WHERE seq < {PUBLISHED}) AS last, \
             (SELECT max(seq) FROM events) AS kept FROM event_log) AS l \
             LEFT JOIN LATERAL (SELECT {} FROM events WHERE seq > $1 AND seq < {PUBLISHED} \
             ORDER BY seq LIMIT $2) AS e ON true",
            rows::EVENT
        )
    });
    let found = conn.query(&PAGE, &[&after, &limit]).await?;
    let Some(first) = found.first() else {
        return Ok((gap(0), 0));
    };
    let pruned_through: i64 = first.try_get(rows::EVENT_COLUMNS)?;
    let last: Option<i64> = first.try_get(rows::EVENT_COLUMNS + 1)?;
    let kept = first
        .try_get::<_, Option<i64>>(rows::EVENT_COLUMNS + 2)?
        .map_or(0, |kept| u64::try_from(kept).unwrap_or(0));
    if after < pruned_through {
        return Ok((gap(pruned_through), kept));
    }
    if first.try_get::<_, Option<i64>>(0)?.is_none() {
        // Nothing after it: a cursor past the newest event published resumes from there.
        let last = last.unwrap_or(pruned_through);
        let page = if after > last {
            gap(last)
        } else {
            EventPage {
                events: Vec::new(),
                gap: false,
                resume_after: u64::try_from(after).unwrap_or(0),
            }
        };
        return Ok((page, kept));
    }
    let events = found
        .iter()
        .map(|row| rows::event(row).map(Arc::new))
        .collect::<Result<_, _>>()?;
    let page = EventPage {
        events,
        gap: false,
        resume_after: u64::try_from(after).unwrap_or(0),
    };
    Ok((page, kept))
}

/// A connection that listens on [`CHANNEL`] and wakes the tail on each notification from another replica
/// than `replica` (whose writer wakes it itself), with a token that fires when it closes.
async fn listen(
    connector: &Connector,
    publisher: Arc<Publisher>,
    replica: &str,
) -> Result<(Client, CancellationToken), tokio_postgres::Error> {
    let replica = replica.to_owned();
    let (client, mut connection) = connector.config.connect(tokio_postgres::NoTls).await?;
    let closed = CancellationToken::new();
    let ended = closed.clone();
    let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
    tokio::spawn(async move {
        while let Some(message) = messages.next().await {
            match message {
                Ok(AsyncMessage::Notification(told)) if told.payload() != replica => publisher.wake.notify_one(),
                Ok(_) => {}
                Err(error) => {
                    tracing::warn!(%error, "the store's listening connection ended");
                    break;
                }
            }
        }
        ended.cancel();
    });
    client.batch_execute(&format!("LISTEN {CHANNEL}")).await?;
    Ok((client, closed))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio_postgres::{Client, NoTls};

    use super::super::EVENTS_PER_TRANSACTION;
    use super::CHANNEL;
    use crate::feed::Feed;
    use crate::store::{Location, Store};
    use crate::time::Clock;

    /// A transaction of another replica that records one event, begun now: its event's id and the connection
    /// it is open on.
    async fn begin_recording(url: &str) -> (u64, Client) {
        let (client, connection) = tokio_postgres::connect(url, NoTls).await.unwrap();
        tokio::spawn(connection);
        client.batch_execute("BEGIN").await.unwrap();
        let xid: i64 = client
            .query_one("SELECT pg_current_xact_id()::TEXT::BIGINT", &[])
            .await
            .unwrap()
            .get(0);
        let id = xid * EVENTS_PER_TRANSACTION;
        client
            .execute(
                "INSERT INTO events (seq, at, kind, server, session, data) \
                 VALUES ($1, 0, 'session.updated', 'demo', 'ses-other', '{}')",
                &[&id],
            )
            .await
            .unwrap();
        (u64::try_from(id).unwrap(), client)
    }

    async fn commit(client: &Client) {
        client
            .batch_execute(&format!("NOTIFY {CHANNEL}, 'another-replica'; COMMIT"))
            .await
            .unwrap();
    }

    /// The replica whose tail the test follows, on the database at `url`, publishing to `feed`.
    async fn replica_under_test(url: &str, feed: Feed) -> Store {
        Store::open(
            &Location::Postgres(url.to_owned()),
            feed,
            Duration::from_secs(3600),
            "replica-under-test",
            Clock::default(),
        )
        .await
        .unwrap()
    }

    #[tokio::test]
    async fn two_replicas_whose_commits_finish_in_the_opposite_order_of_their_ids_are_published_in_id_order() {
        let url = crate::test_postgres::shared().database();
        let feed = Feed::default();
        let mut published = feed.subscribe();
        let store = replica_under_test(&url, feed).await;
        let before = store.last_event_id().await.unwrap();

        let (first, began_first) = begin_recording(&url).await;
        let (second, began_second) = begin_recording(&url).await;
        assert!(first < second);
        commit(&began_second).await;
        // The second is kept, but the first may still commit below it: neither reads nor streams have it.
        let page = store.events_after(before, 10).await.unwrap();
        assert!(page.events.is_empty() && !page.gap, "{page:?}");
        assert_eq!(store.last_event_id().await.unwrap(), before);

        commit(&began_first).await;
        let page = store.events_after(before, 10).await.unwrap();
        let ids: Vec<u64> = page.events.iter().map(|event| event.id).collect();
        assert_eq!(ids, [first, second]);
        assert_eq!(store.last_event_id().await.unwrap(), second);
        for expected in [first, second] {
            let live = tokio::time::timeout(Duration::from_secs(30), published.recv())
                .await
                .expect("published within 30 s")
                .unwrap();
            assert_eq!(live.id, expected, "each published once, in id order");
        }
        let page = store.events_after(first, 10).await.unwrap();
        let ids: Vec<u64> = page.events.iter().map(|event| event.id).collect();
        assert_eq!(ids, [second], "an id resumes after itself");
        store.close().await;
    }

    #[tokio::test]
    async fn waiters_are_told_once_of_each_event_held_back_before_it_is_published() {
        let url = crate::test_postgres::shared().database();
        let feed = Feed::default();
        let mut published = feed.subscribe();
        let mut waiting = feed.since();
        let store = replica_under_test(&url, feed).await;
        let mut seen = std::collections::BTreeMap::<u64, usize>::new();

        let (holding, held) = begin_recording(&url).await;
        let mut behind = Vec::new();
        for _ in 0..3 {
            let (id, client) = begin_recording(&url).await;
            commit(&client).await;
            // Told while the first transaction holds it back, each read of the tail after it taking only what
            // the read before could not see.
            loop {
                let told = tokio::time::timeout(Duration::from_secs(30), waiting.next()).await;
                let told = told.expect("told within 30 s").unwrap().id;
                *seen.entry(told).or_default() += 1;
                if told == id {
                    break;
                }
            }
            behind.push(id);
        }
        commit(&held).await;
        for expected in std::iter::once(holding).chain(behind.iter().copied()) {
            let live = tokio::time::timeout(Duration::from_secs(30), published.recv()).await;
            assert_eq!(live.expect("published within 30 s").unwrap().id, expected);
        }
        while let Ok(Ok(event)) = tokio::time::timeout(Duration::ZERO, waiting.next()).await {
            *seen.entry(event.id).or_default() += 1;
        }
        for id in &behind {
            assert_eq!(seen.get(id), Some(&2), "told once and published once: {seen:?}");
        }
        store.close().await;
    }
}
