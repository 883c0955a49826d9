//! The event log read back, webhook cursors, what a start puts right, and pruning by retention.

use std::sync::Arc;
use std::time::Duration;

use super::requests::{resolve_ids, select_ids};
use super::{Conn, Postgres, rows};
use crate::ids::{CallId, RequestId, SessionId};
use crate::records::{CallError, CallFailure, Finish, SessionStatus};
use crate::store::{
    CLAIMED_UNHEARD, EventPage, HELD_BY_APPROVAL, HeldCall, Lease, Recovered, Resolution, StoreError, maybe_not_sent,
};
use crate::time::Timestamp;

/// How many rows one pruning statement deletes, so that the writer never stops for long.
const PRUNE_BATCH: i64 = 5000;

/// The first protocol version whose suspensions are data the gateway keeps (`input_required`).
const ROUNDS_PROTOCOL: &str = "2026-07-28";

/// Whose records `end_replicas` ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Whose {
    /// The replicas without a heartbeat for longer than the lease.
    Gone,
    /// Those, and what this replica's previous run left (at its start).
    GoneAndPreviousRun,
}

/// How the records of a replica that is gone end.
struct Ending {
    detail: String,
    reason: CallFailure,
}

impl Postgres {
    pub async fn events_after(&self, after: u64, limit: usize) -> Result<EventPage, StoreError> {
        let after = i64::try_from(after).unwrap_or(i64::MAX);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let gap = |resume_after: i64| EventPage {
            events: Vec::new(),
            gap: true,
            resume_after: u64::try_from(resume_after).unwrap_or(0),
        };
        self.read(async |conn| {
            // The page and the oldest event kept, as one snapshot saw them.
            let sql = format!(
                "SELECT {}, (SELECT min(seq) FROM events) FROM events WHERE seq > $1 ORDER BY seq LIMIT $2",
                rows::EVENT
            );
            let found = conn.query(&sql, &[&after, &limit]).await?;
            let Some(first) = found.first() else {
                // Nothing after it: a cursor past the newest event kept resumes from there.
                let last = conn.query_opt("SELECT max(seq) FROM events", &[]).await?;
                let last = match last {
                    Some(row) => row.try_get::<_, Option<i64>>(0)?.unwrap_or(0),
                    None => 0,
                };
                return Ok(if after > last {
                    gap(last)
                } else {
                    EventPage {
                        events: Vec::new(),
                        gap: false,
                        resume_after: u64::try_from(after).unwrap_or(0),
                    }
                });
            };
            let oldest: i64 = first.try_get(rows::EVENT_COLUMNS)?;
            if after + 1 < oldest {
                return Ok(gap(oldest - 1));
            }
            let events = found
                .iter()
                .map(|row| rows::event(row).map(Arc::new))
                .collect::<Result<_, _>>()?;
            Ok(EventPage {
                events,
                gap: false,
                resume_after: u64::try_from(after).unwrap_or(0),
            })
        })
        .await
    }

    pub async fn last_event_id(&self) -> Result<u64, StoreError> {
        self.read(async |conn| last_event_id(conn).await.map(|id| u64::try_from(id).unwrap_or(0)))
            .await
    }

    pub async fn webhook_cursor(&self, webhook: &str) -> Result<Option<u64>, StoreError> {
        self.read(async |conn| {
            let found = conn
                .query_opt("SELECT delivered FROM webhook_cursors WHERE name = $1", &[&webhook])
                .await?;
            Ok(match found {
                Some(row) => row.try_get::<_, Option<i64>>(0)?.and_then(|id| u64::try_from(id).ok()),
                None => None,
            })
        })
        .await
    }

    /// Decided by one statement on the database's clock, so that the gateways' clocks do not matter. It goes
    /// through the writer, after this gateway's cursor saves still waiting there: the cursor it returns is
    /// never behind one this gateway saved before asking.
    pub async fn hold_webhook(&self, webhook: &str, holder: &str, lease: Duration) -> Result<Lease, StoreError> {
        let webhook = webhook.to_owned();
        let holder = holder.to_owned();
        let lease = i64::try_from(lease.as_millis()).unwrap_or(i64::MAX);
        self.write(move |tx| {
            Box::pin(async move {
                let row = tx
                    .query_opt(
                        "INSERT INTO webhook_cursors (name, delivered, holder, held_until) \
                         VALUES ($1, NULL, $2, (extract(epoch FROM clock_timestamp()) * 1000)::BIGINT + $3) \
                         ON CONFLICT (name) DO UPDATE \
                         SET holder = EXCLUDED.holder, held_until = EXCLUDED.held_until \
                         WHERE webhook_cursors.holder = EXCLUDED.holder \
                            OR webhook_cursors.held_until IS NULL \
                            OR webhook_cursors.held_until < (extract(epoch FROM clock_timestamp()) * 1000)::BIGINT \
                         RETURNING delivered",
                        &[&webhook, &holder, &lease],
                    )
                    .await?;
                Ok(match row {
                    Some(row) => Lease::Mine(row.try_get::<_, Option<i64>>(0)?.and_then(|id| u64::try_from(id).ok())),
                    None => Lease::Elsewhere,
                })
            })
        })
        .await
    }

    pub fn save_webhook_cursor(&self, webhook: &str, event: u64) {
        let webhook = webhook.to_owned();
        let event = i64::try_from(event).unwrap_or(i64::MAX);
        self.write_behind(move |tx| {
            Box::pin(async move {
                tx.execute(
                    "INSERT INTO webhook_cursors (name, delivered) VALUES ($1, $2) \
                     ON CONFLICT (name) DO UPDATE \
                     SET delivered = GREATEST(webhook_cursors.delivered, EXCLUDED.delivered)",
                    &[&webhook, &event],
                )
                .await?;
                Ok(())
            })
        });
    }

    /// Sessions of the last run are closed; elicitation requests, and calls whose upstream request died with
    /// the process, end with `restarted` as their reason; 2026-07-28 calls whose round is answered are
    /// returned to be retried.
    /// Ends what this replica's previous run left (it had the same id), and what replicas gone for longer than
    /// the lease left, as [`Postgres::reap`] does.
    pub async fn recover(&self, restarted: &str) -> Result<Recovered, StoreError> {
        let ended = Ending {
            detail: restarted.to_owned(),
            reason: CallFailure::GatewayRestarted,
        };
        let gone = self.end_replicas(Whose::GoneAndPreviousRun, ended).await?;
        let more = self.reap().await?;
        Ok(Recovered {
            resumes: gone.resumes.into_iter().chain(more.resumes).collect(),
            approvals: gone.approvals.into_iter().chain(more.approvals).collect(),
            ended_requests: gone.ended_requests + more.ended_requests,
            ended_calls: gone.ended_calls + more.ended_calls,
            pending: more.pending,
        })
    }

    /// Ends what replicas without a heartbeat for longer than the lease left, once for the fleet: their
    /// sessions close, the 2025-11-25 Requests raised on them are `cancelled`, and their calls fail unless a
    /// 2026-07-28 round lets another replica carry them on; the calls whose round is answered are returned,
    /// for this replica to retry.
    pub async fn reap(&self) -> Result<Recovered, StoreError> {
        let ended = Ending {
            detail: "the replica holding its session is gone".to_owned(),
            reason: CallFailure::ReplicaGone,
        };
        self.end_replicas(Whose::Gone, ended).await
    }

    /// Ends what the replicas gone for longer than the lease left (their records are deleted by the one
    /// replica that does this), and with [`Whose::GoneAndPreviousRun`] what this replica's previous run left.
    async fn end_replicas(&self, whose: Whose, ended: Ending) -> Result<Recovered, StoreError> {
        let lease = i64::try_from(super::LEASE.as_millis()).unwrap_or(i64::MAX);
        let itself = whose == Whose::GoneAndPreviousRun;
        self.write(move |tx| {
            Box::pin(async move {
                let me = tx.replica.to_owned();
                let gone_sql = format!(
                    "DELETE FROM replicas WHERE id <> $1 AND heartbeat_at < {} - $2 RETURNING id",
                    super::DB_NOW
                );
                let mut gone: Vec<String> = tx
                    .query(&gone_sql, &[&me, &lease])
                    .await?
                    .iter()
                    .map(|row| row.try_get(0))
                    .collect::<Result<_, _>>()?;
                if itself {
                    gone.push(me.clone());
                }
                let mut recovered = Recovered::default();
                if gone.is_empty() {
                    recovered.pending = super::requests::pending_count(&*tx).await?;
                    return Ok(recovered);
                }
                // Records from before replicas were recorded belong to whichever run comes first.
                let theirs = if itself {
                    "(replica = ANY($1) OR replica IS NULL)"
                } else {
                    "replica = ANY($1)"
                };
                let now = tx.now().millis();
                let sessions: Vec<SessionId> = tx
                    .query(
                        &format!("SELECT id FROM sessions WHERE status IN ('starting', 'ready') AND {theirs}"),
                        &[&gone],
                    )
                    .await?
                    .iter()
                    .map(|row| row.try_get(0))
                    .collect::<Result<_, _>>()?;
                for id in sessions {
                    tx.execute(
                        "UPDATE sessions SET status = $2, closed_at = $3, detail = $4 WHERE id = $1",
                        &[&id, &SessionStatus::Closed.as_str(), &now, &ended.detail],
                    )
                    .await?;
                    super::calls::session_changed(tx, &id).await?;
                }
                // Raised on one of their sessions, for one of their calls, or (at its own start) on a session
                // never recorded.
                let unrecorded = if itself {
                    " OR (requests.session IS NOT NULL AND NOT EXISTS (SELECT 1 FROM sessions AS s WHERE s.id = requests.session))"
                } else {
                    ""
                };
                let elicitations = select_ids(
                    &*tx,
                    &format!(
                        "status = 'pending' AND round IS NULL AND session IS NOT NULL \
                         AND (session IN (SELECT id FROM sessions WHERE {theirs}) \
                         OR call_id IN (SELECT id FROM calls WHERE {theirs}){unrecorded})"
                    ),
                    &[&gone],
                )
                .await?;
                let resolution = Resolution::Cancelled {
                    detail: format!(
                        "{}: the upstream request this Request answered ended with it",
                        ended.detail
                    ),
                    told_cancel: false,
                };
                recovered.ended_requests += resolve_ids(tx, &elicitations, &resolution).await?.views.len();
                // A round can be retried only on a shared session: a private one ended with its replica.
                let calls = tx
                    .query(
                        &format!(
                            "SELECT c.id, c.protocol_version, \
                             c.shared AND EXISTS (SELECT 1 FROM rounds AS r WHERE r.call_id = c.id), {HELD_BY_APPROVAL}, \
                             c.shared, {CLAIMED_UNHEARD} \
                             FROM calls AS c WHERE c.status IN ('running', 'input_required') AND {theirs} \
                             ORDER BY c.seq"
                        ),
                        &[&gone],
                    )
                    .await?;
                for row in calls {
                    let call: CallId = row.try_get(0)?;
                    let protocol: Option<String> = row.try_get(1)?;
                    let resumable: bool = row.try_get(2)?;
                    // The upstream has not heard of a call waiting on its approval: this replica forwards it.
                    if let Some(approval) = row.try_get::<_, Option<RequestId>>(3)? {
                        tx.execute("UPDATE calls SET replica = $2 WHERE id = $1", &[&call, &me])
                            .await?;
                        recovered.approvals.push(HeldCall { call, approval });
                        continue;
                    }
                    let keeps_rounds = protocol.as_deref().is_some_and(|version| version >= ROUNDS_PROTOCOL);
                    if keeps_rounds && resumable {
                        if super::calls::retry(&*tx, &call).await?.is_some() {
                            tx.execute("UPDATE calls SET replica = $2 WHERE id = $1", &[&call, &me])
                                .await?;
                            recovered.resumes.push(call);
                        }
                        continue;
                    }
                    if let Some(approval) = row.try_get::<_, Option<RequestId>>(5)? {
                        // A 2026-07-28 call may be sent again (at least once); a 2025-11-25 one may not be sent
                        // twice.
                        if keeps_rounds && row.try_get::<_, bool>(4)? {
                            tx.execute(
                                "UPDATE calls SET replica = $2, forwarded_at = NULL WHERE id = $1",
                                &[&call, &me],
                            )
                            .await?;
                            recovered.approvals.push(HeldCall { call, approval });
                        } else {
                            let error = maybe_not_sent(&ended.detail);
                            super::calls::finish_in(tx, &call, Finish::Failed(error)).await?;
                            recovered.ended_calls += 1;
                        }
                        continue;
                    }
                    let error = CallError {
                        message: format!(
                            "{} while the upstream worked on the call, so its result was lost",
                            ended.detail
                        ),
                        reason: Some(ended.reason),
                    };
                    super::calls::finish_in(tx, &call, Finish::Failed(error)).await?;
                    recovered.ended_calls += 1;
                }
                recovered.pending = super::requests::pending_count(&*tx).await?;
                Ok(recovered)
            })
        })
        .await
    }

    pub async fn prune(&self, before: Timestamp) -> Result<(), StoreError> {
        let before = before.millis();
        let statements = [
            "DELETE FROM requests WHERE seq IN \
             (SELECT seq FROM requests WHERE resolved_at < $1 AND status != 'pending' LIMIT $2)",
            // From the rounds' side, so that each batch finds rounds to delete while any are due.
            "DELETE FROM rounds WHERE call_id IN \
             (SELECT r.call_id FROM rounds AS r LEFT JOIN calls AS c ON c.id = r.call_id \
              WHERE c.id IS NULL OR c.ended_at < $1 LIMIT $2)",
            "DELETE FROM calls WHERE seq IN (SELECT seq FROM calls WHERE ended_at < $1 LIMIT $2)",
            "DELETE FROM sessions WHERE seq IN (SELECT seq FROM sessions WHERE closed_at < $1 LIMIT $2)",
            // Events are recorded in time order: those before the first one that is recent enough go, and the
            // newest always stays.
            "DELETE FROM events WHERE seq < LEAST( \
                 COALESCE((SELECT seq FROM events WHERE at >= $1 ORDER BY seq LIMIT 1), (SELECT max(seq) FROM events)), \
                 (SELECT min(seq) FROM events) + $2)",
        ];
        for statement in statements {
            loop {
                let deleted = self
                    .write(move |tx| Box::pin(async move { tx.execute(statement, &[&before, &PRUNE_BATCH]).await }))
                    .await?;
                if i64::try_from(deleted).unwrap_or(i64::MAX) < PRUNE_BATCH {
                    break;
                }
            }
        }
        Ok(())
    }
}

/// The id of the newest event ever recorded (pruning keeps its row).
async fn last_event_id(conn: &Conn) -> Result<i64, tokio_postgres::Error> {
    let last = conn.query_opt("SELECT max(seq) FROM events", &[]).await?;
    Ok(match last {
        Some(row) => row.try_get::<_, Option<i64>>(0)?.unwrap_or(0),
        None => 0,
    })
}
