//! The one connection that writes, on a thread of its own: it takes every change waiting, applies them in
//! one transaction with one sync to disk (group commit), then publishes their events and answers each.

use std::sync::{Arc, Mutex, mpsc};
use std::time::Instant;

use rusqlite::{Connection, params};

use super::super::StoreError;
use super::deferred::{Deferred, ToWrite};
use super::rows;
use crate::feed::Feed;
use crate::ids::CallId;
use crate::records::{CallStatus, Event};
use crate::store::listing::Dialect;
use crate::store::live::{self, Live, Note};
use crate::store::shares::Shares;
use crate::store::sql::{Bind, Change, Record, Run, Text};
use crate::time::{Clock, Timestamp};

/// The most changes one transaction takes.
const MAX_BATCH: usize = 512;

/// One change: its statements, run inside the batch's transaction. `Err(())` means it failed and has
/// answered its caller already; the transaction is rolled back with it.
pub type Job = Box<dyn FnOnce(&mut Tx<'_>) -> Result<Applied, ()> + Send>;

/// What the writer is sent.
pub enum Message {
    /// A change to apply.
    Change(Job),
    /// The first call waiting to be written was just recorded: the writer, idle until now, sets a timer.
    Deferred,
}

/// A change that was applied, waiting for its transaction to be kept.
pub struct Applied {
    /// Told whether the transaction was kept.
    pub reply: Box<dyn FnOnce(Result<(), StoreError>) + Send>,
}

/// The writer's connection inside a transaction, and the events and live records the current change
/// records.
pub struct Tx<'a> {
    pub conn: &'a Connection,
    events: Vec<Arc<Event>>,
    notes: Vec<Note>,
    /// Pending Requests before this change.
    pending_before: usize,
    /// What pending Requests hold as last kept, plus what this transaction's changes raised so far (what
    /// they resolved is released once kept: a Request is admitted against the larger figure); copied from
    /// `live` by the first change that raises, so that a batch of answers copies nothing.
    shares: &'a mut Option<Shares>,
    live: &'a Mutex<Live>,
    deferred: &'a Deferred,
    /// The deferred calls this transaction's changes wrote so far.
    written: &'a mut Vec<CallId>,
    clock: &'a Clock,
}

impl Run for Tx<'_> {
    type Error = rusqlite::Error;
    const DIALECT: Dialect = Dialect::Sqlite;

    async fn execute(&self, statement: &(impl Text + ?Sized), params: &[&dyn Bind]) -> rusqlite::Result<u64> {
        Run::execute(self.conn, statement, params).await
    }

    async fn rows<T: Record>(
        &self,
        statement: &(impl Text + ?Sized),
        params: &[&dyn Bind],
    ) -> rusqlite::Result<Vec<T>> {
        self.conn.rows(statement, params).await
    }

    async fn row<T: Record>(
        &self,
        statement: &(impl Text + ?Sized),
        params: &[&dyn Bind],
    ) -> rusqlite::Result<Option<T>> {
        self.conn.row(statement, params).await
    }

    async fn one_row<T: Record>(&self, statement: &(impl Text + ?Sized), params: &[&dyn Bind]) -> rusqlite::Result<T> {
        self.conn.one_row(statement, params).await
    }
}

impl Change for Tx<'_> {
    fn now(&self) -> Timestamp {
        Tx::now(self)
    }

    async fn record(&mut self, event: Event) -> rusqlite::Result<()> {
        Tx::record(self, event).map(drop)
    }
}

impl Tx<'_> {
    /// The current instant, by the store's clock.
    pub fn now(&self) -> Timestamp {
        self.clock.now()
    }

    /// How many Requests are pending, this change included.
    pub fn pending(&self) -> usize {
        self.pending_before
            .saturating_add_signed(live::pending_delta(&self.notes))
    }

    /// What pending Requests hold, counting those this transaction raised.
    pub fn shares(&mut self) -> &mut Shares {
        let live = self.live;
        self.shares.get_or_insert_with(|| crate::lock(live).shares().clone())
    }

    /// Writes deferred call `id` as it was recorded, unless it is written or another change is writing it.
    pub fn write_deferred(&mut self, id: &CallId) -> rusqlite::Result<()> {
        let Some(deferred) = self.deferred.take(id) else {
            return Ok(());
        };
        self.written.push(id.clone());
        let ToWrite { call, view } = &*deferred;
        self.conn
            .prepare_cached(
                "INSERT INTO calls (id, server, session, shared, tool, arguments, owner, protocol_version, \
                 capabilities, status, created_at, updated_at, via) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, 'running', ?10, ?10, ?11)",
            )?
            .execute(params![
                view.id,
                call.server,
                call.session,
                call.shared,
                call.tool,
                rows::to_json(&call.arguments),
                call.owner,
                call.protocol_version,
                rows::to_json(&call.capabilities),
                view.created_at.millis(),
                call.via.as_str(),
            ])?;
        self.note(Note::Call {
            call: view.id.clone(),
            status: CallStatus::Running,
            owner: view.owner.clone(),
        });
        self.record(Event::call(view))?;
        Ok(())
    }

    /// Records what the change does to the live records, applied once it is kept.
    pub fn note(&mut self, note: Note) {
        if let Note::Pending { pending, .. } = &note {
            self.shares()
                .add(pending.owner.as_deref(), &pending.server, pending.bytes);
        }
        self.notes.push(note);
    }

    /// Records an event: it is numbered now and published once the transaction is kept.
    pub fn record(&mut self, mut event: Event) -> rusqlite::Result<Arc<Event>> {
        event.at = self.now();
        // The row id, not `RETURNING`, which would build a temporary table per event.
        self.conn
            .prepare_cached(
                "INSERT INTO events (at, kind, server, session, call_id, owner, data) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )?
            .execute(rusqlite::params![
                event.at.millis(),
                event.kind.name(),
                event.server,
                event.session,
                event.call,
                event.owner,
                event.data,
            ])?;
        let seq = self.conn.last_insert_rowid();
        event.id = u64::try_from(seq).unwrap_or_default();
        let event = Arc::new(event);
        self.events.push(event.clone());
        Ok(event)
    }
}

/// Runs the writer until every sender of `messages` is gone, keeping `live` up to date, and writes each
/// deferred call no change has written within [`KEEP_AFTER`](super::deferred::KEEP_AFTER) of its start (and,
/// at the end, every one left).
pub fn run(
    conn: Connection,
    messages: mpsc::Receiver<Message>,
    feed: Feed,
    live: Arc<Mutex<Live>>,
    deferred: Arc<Deferred>,
    clock: Clock,
) {
    let open = loop {
        let mut batch = Vec::new();
        // Idle with no call waiting to be written, the writer sleeps until it is sent something.
        let received = match deferred.next_due() {
            Some(due) => messages.recv_timeout(due.saturating_duration_since(Instant::now())),
            None => messages.recv().map_err(|_| mpsc::RecvTimeoutError::Disconnected),
        };
        match received {
            Ok(Message::Change(job)) => batch.push(job),
            Ok(Message::Deferred) | Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break false,
        }
        while batch.len() < MAX_BATCH {
            match messages.try_recv() {
                Ok(Message::Change(job)) => batch.push(job),
                Ok(Message::Deferred) => {}
                Err(_) => break,
            }
        }
        let due = deferred.due(Instant::now());
        if !due.is_empty() {
            batch.push(write_calls(due));
        }
        let mut batch = batch.into_iter();
        while batch.len() > 0 {
            commit(&conn, &mut batch, &feed, &live, &deferred, &clock);
        }
    };
    debug_assert!(!open);
    let left = deferred.all();
    if !left.is_empty() {
        commit(
            &conn,
            &mut vec![write_calls(left)].into_iter(),
            &feed,
            &live,
            &deferred,
            &clock,
        );
    }
}

/// A change that writes the deferred calls `ids` that no other change has taken.
pub fn write_calls(ids: Vec<CallId>) -> Job {
    Box::new(move |tx| {
        for id in &ids {
            if let Err(error) = tx.write_deferred(id) {
                tracing::error!(%error, "the store could not write a call");
                return Err(());
            }
        }
        Ok(Applied {
            reply: Box::new(|_| {}),
        })
    })
}

/// Applies changes from `batch` in one transaction until one fails; the ones applied share its fate (the
/// failure rolls them back: a change that fails midway leaves nothing of itself), and the rest are left
/// for the next transaction.
fn commit(
    conn: &Connection,
    batch: &mut std::vec::IntoIter<Job>,
    feed: &Feed,
    live: &Mutex<Live>,
    deferred: &Deferred,
    clock: &Clock,
) {
    if let Err(error) = conn.execute_batch("BEGIN IMMEDIATE") {
        // Dropped unapplied, each change tells its caller that the store could not make it.
        tracing::error!(%error, "the store cannot start a transaction");
        batch.for_each(drop);
        return;
    }
    let mut applied = Vec::with_capacity(batch.len());
    let mut events = Vec::new();
    let mut notes = Vec::new();
    let mut now_pending = crate::lock(live).pending();
    let mut shares = None;
    let mut written = Vec::new();
    let mut failed = false;
    for job in batch.by_ref() {
        let mut tx = Tx {
            conn,
            events: Vec::new(),
            notes: Vec::new(),
            pending_before: now_pending,
            shares: &mut shares,
            live,
            deferred,
            written: &mut written,
            clock,
        };
        match job(&mut tx) {
            Ok(done) => {
                now_pending = tx.pending();
                events.extend(tx.events);
                notes.extend(tx.notes);
                applied.push(done);
            }
            Err(()) => {
                failed = true;
                break;
            }
        }
    }
    let committed = if failed {
        Err(StoreError::Unavailable(
            "another change of the same transaction failed; nothing was changed".to_owned(),
        ))
    } else {
        conn.execute_batch("COMMIT").map_err(|error| {
            tracing::error!(%error, "the store could not keep a change; it was not made");
            super::unavailable(&error)
        })
    };
    match committed {
        Ok(()) => {
            // Counted in `live` before they leave `deferred`, so that the cap on running calls always sees them.
            crate::lock(live).apply(notes);
            deferred.settle(&written, &Ok(()));
            if !events.is_empty() {
                feed.publish(events);
            }
            for done in applied {
                (done.reply)(Ok(()));
            }
        }
        Err(error) => {
            let _ = conn.execute_batch("ROLLBACK");
            deferred.settle(&written, &Err(error.clone()));
            for done in applied {
                (done.reply)(Err(error.clone()));
            }
        }
    }
}
