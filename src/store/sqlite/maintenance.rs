//! The event log read back, webhook cursor saves, kept keys, what a start puts right, and pruning by retention.

use std::sync::Arc;
use std::time::Duration;

use rusqlite::params;

use super::requests::{resolve_ids, select_ids};
use super::writer::Tx;
use super::{Sqlite, rows};
use crate::ids::{CallId, RequestId, SessionId};
use crate::records::{CallError, CallFailure, Finish};
use crate::store::recovery::{CLAIMED_UNHEARD, HELD_BY_APPROVAL, maybe_not_sent};
use crate::store::sql::maintenance::PRUNE_BATCH;
use crate::store::sql::{self, at_once, maintenance};
use crate::store::{EventPage, HeldCall, Horizons, Lease, Recovered, Resolution, StoreError};

/// The first protocol version whose suspensions are data the gateway keeps (`input_required`).
const ROUNDS_PROTOCOL: &str = "2026-07-28";

impl Sqlite {
    pub async fn events_after(&self, after: u64, limit: usize) -> Result<EventPage, StoreError> {
        let after = i64::try_from(after).unwrap_or(i64::MAX);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.read(|conn| {
            let last = last_event_id(conn)?;
            let oldest: Option<i64> = conn
                .prepare_cached("SELECT min(seq) FROM events")?
                .query_row([], |row| row.get(0))?;
            let oldest = oldest.unwrap_or(last + 1);
            if after > last || after + 1 < oldest {
                let resume_after = if after > last { last } else { oldest - 1 };
                return Ok(EventPage {
                    events: Vec::new(),
                    gap: true,
                    resume_after: u64::try_from(resume_after).unwrap_or(0),
                });
            }
            let sql = format!(
                "SELECT {} FROM events WHERE seq > ?1 ORDER BY seq LIMIT ?2",
                rows::EVENT
            );
            let mut statement = conn.prepare_cached(&sql)?;
            let events = statement.query_map(params![after, limit], rows::event)?;
            let events = events
                .map(|event| event.map(Arc::new))
                .collect::<rusqlite::Result<_>>()?;
            Ok(EventPage {
                events,
                gap: false,
                resume_after: u64::try_from(after).unwrap_or(0),
            })
        })
    }

    pub async fn last_event_id(&self) -> Result<u64, StoreError> {
        self.read(|conn| last_event_id(conn).map(|id| u64::try_from(id).unwrap_or(0)))
    }

    pub fn save_webhook_cursor(&self, webhook: &str, event: u64) {
        let webhook = webhook.to_owned();
        let event = i64::try_from(event).unwrap_or(i64::MAX);
        self.write_behind(move |tx| {
            tx.conn
                .prepare_cached(
                    "INSERT INTO webhook_cursors (name, delivered) VALUES (?1, ?2) \
                     ON CONFLICT (name) DO UPDATE SET delivered = max(delivered, excluded.delivered)",
                )?
                .execute(params![webhook, event])?;
            Ok(())
        });
    }

    pub async fn kept_key(&self, name: &str, made: &str) -> Result<String, StoreError> {
        let (name, made) = (name.to_owned(), made.to_owned());
        self.write(move |tx| at_once(maintenance::kept_key(tx, name, made)))
            .await
    }

    /// The one gateway of a SQLite file (it holds the file alone) always holds its webhooks. Read in the
    /// writer, after the cursor saves still waiting there.
    pub async fn hold_webhook(&self, webhook: &str, _holder: &str, _lease: Duration) -> Result<Lease, StoreError> {
        let webhook = webhook.to_owned();
        self.write(move |tx| at_once(maintenance::webhook_cursor(tx, &webhook)).map(Lease::Mine))
            .await
    }

    /// Sessions of the last run are closed; elicitation requests, and calls whose upstream request died with
    /// the process, end with `restarted` as their reason; 2026-07-28 calls whose round is answered are
    /// returned to be retried.
    pub async fn recover(&self, restarted: &str) -> Result<Recovered, StoreError> {
        let restarted = restarted.to_owned();
        self.write(move |tx| {
            let now = tx.now().millis();
            let sessions: Vec<SessionId> = {
                let mut statement = tx
                    .conn
                    .prepare_cached("SELECT id FROM sessions WHERE status IN ('starting', 'ready')")?;
                let ids = statement.query_map([], |row| row.get(0))?;
                ids.collect::<rusqlite::Result<_>>()?
            };
            for id in sessions {
                at_once(sql::sessions::closed(tx, &id, now, &restarted))?;
            }
            let mut recovered = Recovered::default();
            let elicitations = select_ids(tx.conn, sql::PENDING_ELICITATIONS.sqlite, [])?;
            let detail = format!("{restarted}: the upstream request this Request answered ended with the previous run");
            let resolution = Resolution::Cancelled {
                detail,
                told_cancel: false,
            };
            recovered.ended_requests += resolve_ids(tx, &elicitations, &resolution)?.views.len();
            // A round can be retried, and a task followed, only on a shared session: a private one ended with the
            // previous run.
            type Unended = (CallId, Option<String>, bool, bool, Option<RequestId>, Option<RequestId>, bool);
            let calls: Vec<Unended> = {
                let mut statement = tx.conn.prepare_cached(&format!(
                    "SELECT c.id, c.protocol_version, c.shared = 1, \
                     c.shared = 1 AND (c.task IS NOT NULL OR EXISTS (SELECT 1 FROM rounds AS r WHERE r.call_id = c.id)), \
                     {HELD_BY_APPROVAL}, {CLAIMED_UNHEARD}, c.task IS NOT NULL \
                     FROM calls AS c WHERE c.status IN ('running', 'input_required') ORDER BY c.seq"
                ))?;
                let calls = statement.query_map([], |row| {
                    Ok((
                        row.get(0)?,
                        row.get(1)?,
                        row.get(2)?,
                        row.get(3)?,
                        row.get(4)?,
                        row.get(5)?,
                        row.get(6)?,
                    ))
                })?;
                calls.collect::<rusqlite::Result<_>>()?
            };
            for (call, protocol, shared, resumable, approval, unheard, task) in calls {
                if let Some(approval) = approval {
                    recovered.approvals.push(HeldCall { call, approval });
                    continue;
                }
                let keeps_rounds = protocol.as_deref().is_some_and(|version| version >= ROUNDS_PROTOCOL);
                if (keeps_rounds || task) && resumable {
                    if super::rounds::retry(tx.conn, &call)?.is_some() {
                        recovered.resumes.push(call);
                    }
                    continue;
                }
                if let Some(approval) = unheard {
                    // A 2026-07-28 call may be sent again (at least once); a 2025-11-25 one may not be sent twice.
                    if keeps_rounds && shared {
                        tx.conn
                            .prepare_cached("UPDATE calls SET forwarded_at = NULL WHERE id = ?1")?
                            .execute(params![call])?;
                        recovered.approvals.push(HeldCall { call, approval });
                    } else {
                        super::calls::finish_in(tx, &call, Finish::Failed(maybe_not_sent(&restarted)))?;
                        recovered.ended_calls += 1;
                    }
                    continue;
                }
                let error = CallError {
                    message: format!("{restarted} while the upstream worked on the call, so its result was lost"),
                    reason: Some(CallFailure::GatewayRestarted),
                };
                super::calls::finish_in(tx, &call, Finish::Failed(error))?;
                recovered.ended_calls += 1;
            }
            recovered.pending = tx.pending();
            Ok(recovered)
        })
        .await
    }

    pub async fn prune(&self, horizons: Horizons) -> Result<(), StoreError> {
        let before = horizons.records.millis();
        for statement in maintenance::PRUNE_RECORDS {
            self.in_batches(move |tx| at_once(maintenance::pruned(tx, statement, before)))
                .await?;
        }
        // Events are recorded in time order: those before the first one that is recent enough go, with their
        // links in the audit chain, but none that is not chained yet, and never the newest chained (nor so the
        // newest of all).
        let before = horizons.events.millis();
        self.in_batches(move |tx| {
            let deleted = tx
                .conn
                .prepare_cached(
                    "DELETE FROM events WHERE seq < min( \
                     coalesce((SELECT seq FROM events WHERE at >= ?1 ORDER BY seq LIMIT 1), (SELECT max(seq) FROM events)), \
                     (SELECT min(seq) FROM events) + ?2, \
                     coalesce((SELECT max(seq) FROM audit_chain), 0))",
                )?
                .execute(params![before, PRUNE_BATCH])?;
            tx.conn.prepare_cached(sql::PRUNE_CHAIN.sqlite)?.execute([])?;
            Ok(u64::try_from(deleted).unwrap_or(u64::MAX))
        })
        .await
    }

    /// Runs a pruning statement in the writer until a run deletes fewer than [`PRUNE_BATCH`] rows, so that the
    /// writer never stops for long.
    async fn in_batches(
        &self,
        delete: impl Fn(&mut Tx<'_>) -> rusqlite::Result<u64> + Clone + Send + 'static,
    ) -> Result<(), StoreError> {
        loop {
            let deleted = self.write(delete.clone()).await?;
            if i64::try_from(deleted).unwrap_or(i64::MAX) < PRUNE_BATCH {
                return Ok(());
            }
        }
    }
}

/// The id of the newest event ever recorded (pruning keeps its row).
fn last_event_id(conn: &rusqlite::Connection) -> rusqlite::Result<i64> {
    let last: Option<i64> = conn
        .prepare_cached("SELECT max(seq) FROM events")?
        .query_row([], |row| row.get(0))?;
    Ok(last.unwrap_or(0))
}
