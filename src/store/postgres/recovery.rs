//! What a replica that is gone left, ended or carried on by another in short transactions, side by side with the
//! rest of the fleet's changes.

use super::requests::{resolve_ids, select_ids};
use super::tx::Tx;
use super::{PER_TRANSACTION, Postgres, Reader};
use crate::ids::{CallId, RequestId, SessionId};
use crate::records::{CallError, CallFailure, Finish};
use crate::store::recovery::{CLAIMED_UNHEARD, HELD_BY_APPROVAL, maybe_not_sent};
use crate::store::sql;
use crate::store::{HeldCall, Recovered, Resolution, StoreError};

/// The first protocol version whose suspensions are data the gateway keeps (`input_required`).
const ROUNDS_PROTOCOL: &str = "2026-07-28";

/// Whose records [`Postgres::end_replicas`] ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Whose {
    /// The replicas without a heartbeat for longer than the lease.
    Gone,
    /// Those, and what this replica's previous run left (at its start).
    GoneAndPreviousRun,
}

/// How the records of a replica that is gone end.
#[derive(Clone)]
struct Ending {
    detail: String,
    reason: CallFailure,
}

/// What one transaction of [`Postgres::end_replicas`] takes on.
#[derive(Debug, Clone, Copy)]
enum Stage {
    /// The sessions, and up to [`PER_TRANSACTION`] of the Requests raised on them for no live call of theirs.
    Sessions,
    /// Up to [`PER_TRANSACTION`] of the live calls that started after `after`, and what they raised.
    Calls { after: i64 },
}

/// What one transaction of [`Postgres::end_replicas`] did, and what the next takes on, if anything is left.
struct Step {
    recovered: Recovered,
    next: Option<Stage>,
}

impl Postgres {
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
        let mut recovered = self.end_replicas(Whose::GoneAndPreviousRun, ended).await?;
        recovered.add(self.reap().await?);
        Ok(recovered)
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

    /// Ends what the replicas gone for longer than the lease left, and with [`Whose::GoneAndPreviousRun`] what
    /// this replica's previous run left, in transactions of [`PER_TRANSACTION`]: first their sessions and what
    /// was raised on them for no live call of theirs, then their live calls in the order they started. Each
    /// transaction claims the gone replicas' records for itself (their rows, locked; a replica another
    /// transaction holds is passed over, for that one to end), and the last deletes them.
    async fn end_replicas(&self, whose: Whose, ended: Ending) -> Result<Recovered, StoreError> {
        let mut recovered = Recovered::default();
        let mut stage = Stage::Sessions;
        loop {
            let ended = ended.clone();
            let step = self
                .write(move |tx| {
                    let ended = ended.clone();
                    Box::pin(async move { end_some(tx, whose, &ended, stage).await })
                })
                .await?;
            recovered.add(step.recovered);
            match step.next {
                Some(next) => stage = next,
                None => break,
            }
        }
        recovered.pending = self.pending_count().await?;
        Ok(recovered)
    }
}

/// One transaction of [`Postgres::end_replicas`], taking `stage` on for the replicas gone it claims.
async fn end_some(tx: &mut Tx<'_>, whose: Whose, ended: &Ending, stage: Stage) -> Result<Step, tokio_postgres::Error> {
    let lease = i64::try_from(super::LEASE.as_millis()).unwrap_or(i64::MAX);
    let itself = whose == Whose::GoneAndPreviousRun;
    let me = tx.replica.to_owned();
    let gone_sql = format!(
        "SELECT id FROM replicas WHERE id <> $1 AND heartbeat_at < {} - $2 FOR UPDATE SKIP LOCKED",
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
    let mut step = Step {
        recovered: Recovered::default(),
        next: None,
    };
    if gone.is_empty() {
        return Ok(step);
    }
    // Marked as taken for gone: should one come back, its heartbeat renews nothing and tells it so
    // (`heartbeat.rs`), and the rest of this work still finds it gone.
    tx.execute(
        "UPDATE replicas SET heartbeat_at = 0 WHERE id = ANY($1) AND id <> $2 AND heartbeat_at <> 0",
        &[&gone, &me],
    )
    .await?;
    // Records from before replicas were recorded belong to whichever run comes first.
    let theirs = if itself {
        "(replica = ANY($1) OR replica IS NULL)"
    } else {
        "replica = ANY($1)"
    };
    let resolution = Resolution::Cancelled {
        detail: format!(
            "{}: the upstream request this Request answered ended with it",
            ended.detail
        ),
        told_cancel: false,
    };
    let after = match stage {
        Stage::Sessions => {
            close_sessions(tx, theirs, &gone, ended).await?;
            // Raised on one of their sessions or (at its own start) on a session never recorded, for no live call
            // of theirs: those of their live calls end with them.
            let unrecorded = if itself {
                " OR (requests.session IS NOT NULL AND NOT EXISTS (SELECT 1 FROM sessions AS s WHERE s.id = requests.session))"
            } else {
                ""
            };
            let sql = format!(
                "{} AND (session IN (SELECT id FROM sessions WHERE {theirs}){unrecorded}) \
                 AND (call_id IS NULL OR call_id NOT IN \
                 (SELECT id FROM calls WHERE status IN ('running', 'input_required') AND {theirs})) \
                 ORDER BY seq LIMIT $2",
                sql::PENDING_ELICITATIONS.postgres
            );
            let elicitations = select_ids(&*tx, &sql, &[&gone, &PER_TRANSACTION]).await?;
            step.recovered.ended_requests += resolve_ids(tx, &elicitations, &resolution).await?.views.len();
            step.next = Some(match i64::try_from(elicitations.len()).unwrap_or(i64::MAX) {
                PER_TRANSACTION => Stage::Sessions,
                _ => Stage::Calls { after: i64::MIN },
            });
            return Ok(step);
        }
        Stage::Calls { after } => after,
    };
    // Their live calls are locked before anything of them is read. Every change of a live call, or of whether
    // its Requests are pending, updates the call's row: such a change waits for this transaction, and what it
    // reads of them below stays exact until it commits. (A change that already holds one of their Requests and
    // then waits for its call loses a deadlock, or wins it; whichever loses runs again.)
    let locked: Vec<(CallId, i64)> = tx
        .query(
            &format!(
                "SELECT id, seq FROM calls WHERE status IN ('running', 'input_required') AND {theirs} \
                 AND seq > $2 ORDER BY seq LIMIT $3 FOR UPDATE"
            ),
            &[&gone, &after, &PER_TRANSACTION],
        )
        .await?
        .iter()
        .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
        .collect::<Result<_, tokio_postgres::Error>>()?;
    let calls: Vec<CallId> = locked.iter().map(|(id, _)| id.clone()).collect();
    let pending = sql::PENDING_ELICITATIONS.postgres;
    let elicitations = select_ids(&*tx, &format!("{pending} AND call_id = ANY($1)"), &[&calls]).await?;
    let recovered = &mut step.recovered;
    recovered.ended_requests += resolve_ids(tx, &elicitations, &resolution).await?.views.len();
    // A round can be retried, and a task followed, only on a shared session: a private one ended with its
    // replica.
    let rows = tx
        .query(
            &format!(
                "SELECT c.id, c.protocol_version, \
                 c.shared AND (c.task IS NOT NULL OR EXISTS (SELECT 1 FROM rounds AS r WHERE r.call_id = c.id)), \
                 {HELD_BY_APPROVAL}, \
                 c.shared, {CLAIMED_UNHEARD}, c.task IS NOT NULL \
                 FROM calls AS c WHERE c.id = ANY($1) AND c.status IN ('running', 'input_required') \
                 ORDER BY c.seq"
            ),
            &[&calls],
        )
        .await?;
    for row in rows {
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
        let task: bool = row.try_get(6)?;
        if (keeps_rounds || task) && resumable {
            if super::rounds::retry(&*tx, &call).await?.is_some() {
                tx.execute("UPDATE calls SET replica = $2 WHERE id = $1", &[&call, &me])
                    .await?;
                recovered.resumes.push(call);
            }
            continue;
        }
        if let Some(approval) = row.try_get::<_, Option<RequestId>>(5)? {
            // A 2026-07-28 call may be sent again (at least once); a 2025-11-25 one may not be sent twice.
            if keeps_rounds && row.try_get::<_, bool>(4)? {
                tx.execute(
                    "UPDATE calls SET replica = $2, forwarded_at = NULL WHERE id = $1",
                    &[&call, &me],
                )
                .await?;
                recovered.approvals.push(HeldCall { call, approval });
            } else {
                let error = maybe_not_sent(&ended.detail);
                super::calls::finish_in(tx, &call, Finish::Failed(error), false).await?;
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
        super::calls::finish_in(tx, &call, Finish::Failed(error), false).await?;
        recovered.ended_calls += 1;
    }
    // Whether live calls of theirs follow, read anew: the lock above may have taken fewer than it may though
    // more follow (a call another transaction ended while this one waited for it is passed over).
    let last = locked.last().map_or(after, |(_, seq)| *seq);
    let more: bool = tx
        .query_one(
            &format!(
                "SELECT EXISTS (SELECT 1 FROM calls WHERE status IN ('running', 'input_required') AND {theirs} \
                 AND seq > $2)"
            ),
            &[&gone, &last],
        )
        .await?
        .try_get(0)?;
    if more {
        step.next = Some(Stage::Calls { after: last });
    } else {
        // The last of it: the gone replicas' records go.
        tx.execute("DELETE FROM replicas WHERE id = ANY($1) AND id <> $2", &[&gone, &me])
            .await?;
    }
    Ok(step)
}

/// Closes the replicas' sessions still open.
async fn close_sessions(
    tx: &mut Tx<'_>,
    theirs: &str,
    gone: &[String],
    ended: &Ending,
) -> Result<(), tokio_postgres::Error> {
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
        sql::sessions::closed(tx, &id, now, &ended.detail).await?;
    }
    Ok(())
}
