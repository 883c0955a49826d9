//! The writer's connection inside a transaction, as a change runs its statements on it.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::task::Poll;

use futures::future::{MaybeDone, Shared, maybe_done};
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use super::super::shares::Held;
use super::{Borrowed, EVENTS_PER_TRANSACTION, Reader};
use crate::ids::CallId;
use crate::records::Event;
use crate::store::sql::Change;
use crate::time::{Clock, Timestamp};

/// The writer's connection inside a transaction, and the events the current change records. What a change
/// reads stays exact until it commits only as far as its [`Turn`] says.
pub struct Tx<'c> {
    /// The writer's connection and the statements it has prepared.
    pub(super) borrowed: Borrowed<'c>,
    /// The turn the change runs in.
    pub(super) turn: Turn,
    /// What the changes raising alongside this one in its transaction add, which it may not see.
    pub(super) beside: Held,
    /// For a raise alongside others, the read of how many transactions hold the raising lock that the raises
    /// of its group share (see [`super::caps::holders`]).
    pub(super) holders: Option<Holders<'c>>,
    /// Set when the change found that it must run alone ([`Tx::run_alone`]).
    pub(super) moved_alone: AtomicBool,
    /// The replica whose writer this is.
    pub replica: &'c str,
    /// The events of the transaction.
    pub(super) recorded: &'c Recorded,
    pub(super) clock: &'c Clock,
    /// When the change may end its transaction (it is alone in it), set once it has sent its last statements:
    /// the writer then sends the `COMMIT` right behind them (see [`Tx::closing`]).
    pub(super) end: Option<&'c AtomicBool>,
}

impl Tx<'_> {
    /// The current instant, by the store's clock.
    pub fn now(&self) -> Timestamp {
        self.clock.now()
    }

    /// Prepares each of `sqls` that the connection has not: statements pipelined after it go out in the order
    /// they are sent in, rather than those not prepared yet behind the others. (Of statements pipelined
    /// together, the first to fail then stands first among them; each after it fails as the transaction is
    /// aborted.)
    pub async fn prepare(&self, sqls: &[&str]) -> Result<(), tokio_postgres::Error> {
        let Borrowed { client, statements } = self.borrowed;
        for sql in sqls {
            statements.get(client, sql).await?;
        }
        Ok(())
    }

    /// Has the change run again in a later transaction, in the turn [`Turn::alone`] gives, and what it returns
    /// now dropped: for a change that found, before it wrote anything, that it cannot decide in this turn. The
    /// transaction goes on without it.
    pub fn run_alone(&self) {
        self.moved_alone.store(true, Ordering::Relaxed);
    }

    /// Whether [`Self::closing`] ends the transaction: the change is the only one in it and may end it.
    pub fn ends(&self) -> bool {
        self.end.is_some()
    }

    /// Runs `last`, the change's last statements (`sqls`, prepared here), with the transaction's `COMMIT` and
    /// the read of the log behind them in the same exchange, when the change may end its transaction
    /// ([`Self::ends`]); otherwise runs them alone, and the writer commits once the change is done. Either way
    /// their rows come back as soon as they arrive, before the `COMMIT` is known to have kept them. If one of
    /// them fails, so does the `COMMIT`, and nothing of the transaction is kept.
    ///
    /// `last` must send every one of its statements the first time it is polled (each prepared, with nothing
    /// awaited before it), and the change must send nothing after it: a statement sent later would run after
    /// the `COMMIT`, outside the transaction.
    pub async fn closing<T>(
        &self,
        sqls: &[&str],
        last: impl Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> Result<T, tokio_postgres::Error> {
        let Some(end) = self.end else {
            return last.await;
        };
        self.prepare(sqls).await?;
        let mut last = std::pin::pin!(last);
        // Polled once, it sends its statements; the writer sends the `COMMIT` as soon as this returns.
        let sent = futures::poll!(last.as_mut());
        end.store(true, Ordering::Relaxed);
        match sent {
            Poll::Ready(done) => done,
            Poll::Pending => last.await,
        }
    }

    /// The rows of `first`, then those of `second`, in one exchange: the server runs `second` once `first` has
    /// run, with a snapshot of its own, which sees what committed while `first` waited for a row.
    pub async fn query_in_turn(
        &self,
        (first, first_params): (&str, &[&(dyn ToSql + Sync)]),
        (second, second_params): (&str, &[&(dyn ToSql + Sync)]),
    ) -> Result<(Vec<Row>, Vec<Row>), tokio_postgres::Error> {
        self.prepare(&[first, second]).await?;
        futures::try_join!(self.query(first, first_params), self.query(second, second_params))
    }

    /// Records an event: it is numbered now and published once the transaction is kept.
    pub async fn record(&self, mut event: Event) -> Result<Arc<Event>, tokio_postgres::Error> {
        let values = self.event_values(&mut event);
        let row = self.query_one(&RECORD, &values.params()).await?;
        Ok(self.numbered(event, row.get(0)))
    }

    /// `event`'s values as [`insert_event`] takes them: the transaction's next place, recorded now (the event
    /// is stamped with that instant).
    pub fn event_values<'e>(&self, event: &'e mut Event) -> EventValues<'e> {
        // Past the transaction's ids, each event takes its last one: the second such insert fails on the
        // primary key, and the transaction with it.
        let place = self
            .recorded
            .next
            .fetch_add(1, Ordering::Relaxed)
            .min(EVENTS_PER_TRANSACTION - 1);
        event.at = self.now();
        crate::lock(&self.recorded.events).push(Some(crate::feed::carried_copy(event)));
        EventValues {
            place,
            at: event.at.millis(),
            kind: event.kind.name(),
            event,
        }
    }

    /// Has the event recorded at `place` ([`EventValues::place`]) stand as `event` now, as a statement of the
    /// change rewrote it.
    pub fn amend(&self, place: i64, event: &Event) {
        let mut events = crate::lock(&self.recorded.events);
        if let Some(recorded) = usize::try_from(place).ok().and_then(|place| events.get_mut(place)) {
            *recorded = Some(crate::feed::carried_copy(event));
        }
    }

    /// Has the event whose values went at `place` ([`EventValues::place`]) to a statement that did not record it
    /// stand as never recorded.
    pub fn withdraw(&self, place: i64) {
        let mut events = crate::lock(&self.recorded.events);
        if let Some(recorded) = usize::try_from(place).ok().and_then(|place| events.get_mut(place)) {
            *recorded = None;
        }
    }

    /// `event` as a statement of this change inserted it, numbered `seq` (the tail publishes it once the
    /// transaction is kept).
    pub fn numbered(&self, mut event: Event, seq: i64) -> Arc<Event> {
        event.id = u64::try_from(seq).unwrap_or_default();
        Arc::new(event)
    }
}

/// The events a transaction records, as its changes hand over their values: the place the next one takes,
/// and each as it stands (a large one without its data, as the live channels carry it), to tell this replica's
/// waiters of them once the transaction commits ([`crate::feed::Feed::committed`]), before the log publishes
/// them. They are not numbered: waiters decide by what an event is about.
#[derive(Default)]
pub struct Recorded {
    next: AtomicI64,
    /// Each by its place; `None` where a statement did not record the event after all.
    events: Mutex<Vec<Option<Event>>>,
}

impl Recorded {
    /// Whether the transaction recorded any event.
    pub fn any(&self) -> bool {
        self.next.load(Ordering::Relaxed) > 0
    }

    /// The events, once the transaction is kept.
    pub fn kept(self) -> Vec<Arc<Event>> {
        let events = self
            .events
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        events.into_iter().flatten().map(Arc::new).collect()
    }
}

/// How many transactions hold the raising lock, read once for a group of raises; `None` when the read failed.
pub type Holders<'c> = Shared<Pin<Box<dyn Future<Output = Option<i64>> + Send + 'c>>>;

/// The statement of [`Tx::record`].
pub static RECORD: LazyLock<String> = LazyLock::new(|| insert_event(1, "VALUES ({})"));

/// The statement inserting an event whose eight values are parameters `$first` on, in the order of
/// [`EventValues::params`], placed in `source` at its `{}` (`VALUES ({})`, or `SELECT {} FROM rows` to record
/// it if another part of the statement has a row: one at most, as the values hold one place); it returns the
/// event's number, which it makes of the transaction's id and the event's place.
pub fn insert_event(first: usize, source: &str) -> String {
    let mut values: Vec<String> = ["BIGINT", "TEXT", "TEXT", "TEXT", "TEXT", "TEXT", "TEXT"]
        .iter()
        .enumerate()
        .map(|(at, kind)| format!("${}::{kind}", first + 1 + at))
        .collect();
    values.insert(
        0,
        format!("pg_current_xact_id()::TEXT::BIGINT * {EVENTS_PER_TRANSACTION} + ${first}::BIGINT"),
    );
    format!(
        "INSERT INTO events (seq, at, kind, server, session, call_id, owner, data) {} RETURNING seq",
        source.replace("{}", &values.join(", "))
    )
}

/// An event's values as [`insert_event`] takes them, from [`Tx::event_values`].
pub struct EventValues<'e> {
    place: i64,
    at: i64,
    kind: &'static str,
    event: &'e Event,
}

impl EventValues<'_> {
    /// The event's place among its transaction's.
    pub fn place(&self) -> i64 {
        self.place
    }

    pub fn params(&self) -> [&(dyn ToSql + Sync); 8] {
        [
            &self.place,
            &self.at,
            &self.kind,
            &self.event.server,
            &self.event.session,
            &self.event.call,
            &self.event.owner,
            &self.event.data,
        ]
    }
}

impl Reader for Tx<'_> {
    fn borrowed(&self) -> Borrowed<'_> {
        self.borrowed
    }
}

impl Change for Tx<'_> {
    fn now(&self) -> Timestamp {
        Tx::now(self)
    }

    async fn record(&mut self, event: Event) -> Result<(), tokio_postgres::Error> {
        Tx::record(self, event).await.map(drop)
    }

    async fn record_last(&mut self, event: Event) -> Result<(), tokio_postgres::Error> {
        self.closing(&[&RECORD], Tx::record(self, event)).await.map(drop)
    }
}

/// What a change's statements come to, with the value they return.
pub type Work<'t, T> = Pin<Box<dyn Future<Output = Result<T, tokio_postgres::Error>> + Send + 't>>;

/// Statements sent in order, each as soon as it is made, whose replies are awaited together: all of them are
/// sent before anything the change sends after, such as its [`Tx::closing`] statements.
pub struct Sent<'t, T>(Vec<MaybeDone<Work<'t, T>>>);

impl<'t, T> Sent<'t, T> {
    /// Sends each of `statements` in order: each must send its statement the first time it is polled (prepared,
    /// with nothing awaited before it), as [`Tx::closing`] asks.
    pub async fn send(statements: Vec<Work<'t, T>>) -> Self {
        let mut sent: Vec<_> = statements.into_iter().map(maybe_done).collect();
        std::future::poll_fn(|cx| {
            for statement in &mut sent {
                let _ = Pin::new(statement).poll(cx);
            }
            Poll::Ready(())
        })
        .await;
        Self(sent)
    }

    /// Their replies, in order.
    pub async fn replies(mut self) -> Result<Vec<T>, tokio_postgres::Error> {
        futures::future::join_all(self.0.iter_mut()).await;
        // Every one is done, so each has its output.
        self.0
            .iter_mut()
            .filter_map(|statement| Pin::new(statement).take_output())
            .collect()
    }
}

/// What a change raising alongside others locks and adds; nothing for any other change.
#[derive(Debug, Clone, Default)]
pub struct Raised {
    /// The calls whose rows it locks: such changes share a transaction only when no two of them lock the same
    /// call, so that none decides on a call's row that another changes meanwhile.
    pub calls: Vec<CallId>,
    /// How many Requests it raises, and their bytes.
    pub adds: Held,
}

/// How a change shares the database with other transactions, and so which locks its transaction takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// The change runs alongside the other such changes at the front of the queue, and alongside other
    /// replicas' transactions of them and of raising: each decides everything it reads and writes in
    /// statements exact at the moment the server runs them, whatever the other changes' statements sent
    /// before or between its own, so that any order of them is one they could have run in one by one.
    Alongside,
    /// The change raises a few Requests alongside other raising: it holds the raising lock shared, and decides
    /// on counts that leave room for all that the raising transactions in flight may add (see
    /// [`Postgres::raise`](super::Postgres::raise)). Such changes are pipelined together, before the changes
    /// alongside that share their transaction (see [`super::writer`]), while they lock no call in common and
    /// add, together, no more than [`RAISED_ALONGSIDE`](super::RAISED_ALONGSIDE) ([`Raised`]).
    RaisingAlongside,
    /// The change raises Requests in turn: it decides on counts that only raising adds to, so it holds the
    /// raising lock alone (every other raising waits for it, and so do the changes alongside that share a
    /// transaction with a raise; the other changes, which only lower those counts, do not). One such change runs
    /// at a time.
    RaisingAlone,
    /// The change runs in a group of its own, in a transaction of changes of its turn only (what the fleet's
    /// upkeep writes: recovering gone replicas' work, pruning, webhook leases and cursors, the kept keys): it
    /// decides as the changes alongside do, and holds no lock that they take.
    Apart,
}

impl Turn {
    /// The turn a change runs again in when it finds that it cannot decide in this one ([`Tx::run_alone`]): a raise
    /// alongside that found too little room for it runs again alone, where it decides exactly.
    pub fn alone(self) -> Turn {
        match self {
            Turn::RaisingAlongside => Turn::RaisingAlone,
            turn => turn,
        }
    }
}
