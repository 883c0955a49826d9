//! The one connection that writes, on a thread of its own: it takes every change waiting, applies them in
//! one transaction with one sync to disk (group commit), then publishes their events and answers each.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};

use rusqlite::Connection;

use super::super::StoreError;
use crate::feed::Feed;
use crate::records::Event;
use crate::time::Timestamp;

/// The most changes one transaction takes.
const MAX_BATCH: usize = 512;

/// One change: its statements, run inside the batch's transaction. `Err(())` means it failed and has
/// answered its caller already; its statements are rolled back alone.
pub type Job = Box<dyn FnOnce(&mut Tx<'_>) -> Result<Applied, ()> + Send>;

/// A change that was applied, waiting for its transaction to be kept.
pub struct Applied {
    /// Told whether the transaction was kept.
    pub reply: Box<dyn FnOnce(Result<(), StoreError>) + Send>,
}

/// The writer's connection inside a transaction, the events the current change records, and how it
/// changes the number of pending Requests.
pub struct Tx<'a> {
    pub conn: &'a Connection,
    events: Vec<Arc<Event>>,
    /// Pending Requests before this change.
    pending_before: usize,
    /// What this change added to them (or took away).
    pending_delta: isize,
}

impl Tx<'_> {
    /// How many Requests are pending, this change included.
    pub fn pending(&self) -> usize {
        self.pending_before.saturating_add_signed(self.pending_delta)
    }

    /// Records that this change made `delta` more Requests pending (fewer when negative).
    pub fn count_pending(&mut self, delta: isize) {
        self.pending_delta += delta;
    }

    /// Records an event: it is numbered now and published once the transaction is kept.
    pub fn record(&mut self, mut event: Event) -> rusqlite::Result<Arc<Event>> {
        let seq: i64 = self.conn.prepare_cached(
            "INSERT INTO events (at, kind, server, session, call_id, owner, data) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) RETURNING seq",
        )?.query_row(
            rusqlite::params![
                Timestamp::now().millis(),
                event.kind.name(),
                event.server,
                event.session,
                event.call,
                event.owner,
                event.data,
            ],
            |row| row.get(0),
        )?;
        event.id = u64::try_from(seq).unwrap_or_default();
        let event = Arc::new(event);
        self.events.push(event.clone());
        Ok(event)
    }
}

/// Runs the writer until every sender of `jobs` is gone; `pending` is the number of pending Requests kept,
/// which the writer keeps up to date.
pub fn run(conn: Connection, jobs: mpsc::Receiver<Job>, feed: Feed, pending: Arc<AtomicUsize>) {
    while let Ok(first) = jobs.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match jobs.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        commit(&conn, batch, &feed, &pending);
    }
}

/// Applies a batch of changes in one transaction.
fn commit(conn: &Connection, batch: Vec<Job>, feed: &Feed, pending: &AtomicUsize) {
    if let Err(error) = conn.execute_batch("BEGIN IMMEDIATE") {
        // Dropped unapplied, each change tells its caller that the store could not make it.
        tracing::error!(%error, "the store cannot start a transaction");
        return;
    }
    let mut applied = Vec::with_capacity(batch.len());
    let mut events = Vec::new();
    let mut now_pending = pending.load(Ordering::Relaxed);
    for job in batch {
        if conn.execute_batch("SAVEPOINT change").is_err() {
            continue;
        }
        let mut tx = Tx {
            conn,
            events: Vec::new(),
            pending_before: now_pending,
            pending_delta: 0,
        };
        match job(&mut tx) {
            Ok(done) => {
                let _ = conn.execute_batch("RELEASE change");
                now_pending = tx.pending();
                events.extend(tx.events);
                applied.push(done);
            }
            Err(()) => {
                let _ = conn.execute_batch("ROLLBACK TO change; RELEASE change");
            }
        }
    }
    match conn.execute_batch("COMMIT") {
        Ok(()) => {
            pending.store(now_pending, Ordering::Relaxed);
            feed.publish(events);
            for done in applied {
                (done.reply)(Ok(()));
            }
        }
        Err(error) => {
            tracing::error!(%error, "the store could not keep a change; it was not made");
            let _ = conn.execute_batch("ROLLBACK");
            let error = super::unavailable(&error);
            for done in applied {
                (done.reply)(Err(error.clone()));
            }
        }
    }
}
