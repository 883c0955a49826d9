//! This replica's place in the fleet: the heartbeat that keeps it, whether its heartbeats have held for long
//! enough that it may take others for gone, and whether another has taken it for gone.
//!
//! A replica whose heartbeat is older than [`LEASE`] is gone, and another ends what it held. The replica that
//! does so marks it (`heartbeat_at = 0`) in the first transaction of that work and deletes it in the last; a
//! heartbeat renews only a replica that is neither, so a replica that comes back once it was taken for gone
//! (stopped, or cut off from the database) learns so at its next heartbeat, and the work on what it held runs
//! to its end whatever it does. From the mark on, none of its transactions is kept ([`NOT_TAKEN`]). What it
//! still holds in memory (its upstream sessions, the calls on them) the store now says are closed and ended:
//! such a replica stops, to start again as a new run.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::{DB_NOW, Postgres, Reader};
use crate::lock;

/// How long a replica without a heartbeat counts as alive; past it, others end what only it could carry on.
pub const LEASE: Duration = Duration::from_secs(15);
/// How often a replica says it is alive; a heartbeat that takes longer has failed.
const HEARTBEAT: Duration = Duration::from_secs(3);

/// Records that replica `$1` is alive now, by the database's clock, as it opens the store: a restart with the
/// same id takes its place again, and ends what its previous run left itself.
pub(super) fn register_sql() -> String {
    format!(
        "INSERT INTO replicas (id, started_at, heartbeat_at) VALUES ($1, {DB_NOW}, {DB_NOW}) \
         ON CONFLICT (id) DO UPDATE SET heartbeat_at = {DB_NOW}"
    )
}

/// Records that replica `$1` is still alive, unless another has taken it for gone.
fn renew_sql() -> String {
    format!("UPDATE replicas SET heartbeat_at = {DB_NOW} WHERE id = $1 AND heartbeat_at > 0 RETURNING id")
}

/// What each of the writer's transactions sends right before its `COMMIT`: once the transaction has written
/// (it has an id), it fails if another replica has taken this one for gone, and otherwise holds this replica's
/// row until the commit (`FOR KEY SHARE`, which a heartbeat does not wait for). The replica that takes it for
/// gone locks that row (`FOR UPDATE SKIP LOCKED`) as it marks it, passing it over while one of its transactions
/// is committing: so no change of a replica is kept once another has begun to end what it held. A transaction
/// that wrote nothing keeps nothing, and takes neither the lock nor an id for it (which would cost its commit
/// a flush of the log).
pub(super) const NOT_TAKEN: &str = "SELECT toolnexus_expect(CASE WHEN pg_current_xact_id_if_assigned() IS NULL \
     THEN true ELSE EXISTS (SELECT 1 FROM replicas \
     WHERE id = current_setting('toolnexus.replica') AND heartbeat_at > 0 FOR KEY SHARE) END)";

/// What this replica knows of its own heartbeats.
#[derive(Debug)]
pub(super) struct Heartbeats {
    /// Since when every heartbeat was recorded; `None` since one failed.
    unbroken: Mutex<Streak>,
    /// Fires when a heartbeat finds that another replica took this one for gone.
    taken: CancellationToken,
}

impl Heartbeats {
    /// Heartbeats of a replica that has just registered.
    pub(super) fn registered() -> Self {
        Self {
            unbroken: Mutex::new(Streak::since(Instant::now())),
            taken: CancellationToken::new(),
        }
    }
}

/// Since when a run of heartbeats has gone unbroken, if one has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Streak(Option<Instant>);

impl Streak {
    fn since(at: Instant) -> Self {
        Self(Some(at))
    }

    /// The streak after a heartbeat at `at` was recorded (`recorded`) or not.
    fn after(self, recorded: bool, at: Instant) -> Self {
        match (recorded, self.0) {
            (true, Some(since)) => Self(Some(since)),
            (true, None) => Self(Some(at)),
            (false, _) => Self(None),
        }
    }

    /// Whether every heartbeat for a whole lease before `now` was recorded. Only then can a replica tell another
    /// that stopped from a database that was away from them both: after an outage, every replica's heartbeat
    /// is old until its next one, and one that judged at once would take the others for gone.
    fn held_a_lease(self, now: Instant) -> bool {
        self.0
            .is_some_and(|since| now.saturating_duration_since(since) >= LEASE)
    }
}

impl Postgres {
    /// Says this replica is alive every [`HEARTBEAT`] until `stop` fires, or until a heartbeat finds that
    /// another replica took it for gone.
    pub(super) async fn beat(self, stop: CancellationToken) {
        let sql = renew_sql();
        let (heartbeats, replica) = (&self.shared.heartbeats, &self.shared.replica);
        loop {
            tokio::select! {
                () = tokio::time::sleep(HEARTBEAT) => {}
                () = stop.cancelled() => return,
            }
            let renew = self.read(async |conn| conn.query(&sql, &[replica]).await);
            let recorded = match tokio::time::timeout(HEARTBEAT, renew).await {
                Ok(Ok(rows)) if rows.is_empty() && stop.is_cancelled() => return,
                Ok(Ok(rows)) if rows.is_empty() => {
                    tracing::error!(
                        %replica,
                        "another replica took this one for gone (its heartbeat was older than the lease) and ended \
                         or carried on what it held: it stops, to start again as a new run"
                    );
                    heartbeats.taken.cancel();
                    return;
                }
                Ok(Ok(_)) => true,
                Ok(Err(error)) => {
                    tracing::warn!(%error, "this replica's heartbeat could not be recorded");
                    false
                }
                Err(_) => {
                    tracing::warn!(timeout = ?HEARTBEAT, "this replica's heartbeat was not recorded in time");
                    false
                }
            };
            let mut unbroken = lock(&heartbeats.unbroken);
            *unbroken = unbroken.after(recorded, Instant::now());
        }
    }

    /// Whether this replica's heartbeats have all been recorded for a whole lease, so that it may take
    /// replicas whose heartbeat is older than that for gone.
    pub fn holds_its_lease(&self) -> bool {
        lock(&self.shared.heartbeats.unbroken).held_a_lease(Instant::now())
    }

    /// Resolves when a heartbeat finds that another replica took this one for gone.
    pub async fn taken_for_gone(&self) {
        self.shared.heartbeats.taken.cancelled().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replica_takes_others_for_gone_only_after_a_whole_lease_of_its_own_heartbeats() {
        let start = Instant::now();
        let streak = Streak::since(start);
        assert!(!streak.held_a_lease(start + LEASE / 2));
        let streak = streak.after(true, start + HEARTBEAT);
        assert!(streak.held_a_lease(start + LEASE));

        // One heartbeat not recorded: a whole lease from the next one that is.
        let broken = streak.after(false, start + LEASE);
        assert!(!broken.held_a_lease(start + LEASE));
        let again = broken.after(true, start + LEASE + HEARTBEAT);
        assert!(!again.held_a_lease(start + LEASE * 2));
        assert!(again.held_a_lease(start + LEASE * 2 + HEARTBEAT));
    }
}
