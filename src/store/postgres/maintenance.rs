//! The event log read back, webhook leases and cursor saves, and the log's pruning.

use std::sync::LazyLock;
use std::time::Duration;

use super::tail::{HeldBack, PUBLISHED, log_page};
use super::{Postgres, Reader};
use crate::store::sql::maintenance::PRUNE_BATCH;
use crate::store::sql::{self, maintenance};
use crate::store::{EventPage, Horizons, Lease, StoreError};

impl Postgres {
    pub async fn events_after(&self, after: u64, limit: usize) -> Result<EventPage, StoreError> {
        let mut held_back = HeldBack::default();
        loop {
            let (page, kept) = self.log_after(after, limit).await?;
            let through = page.events.last().map_or(after, |event| event.id);
            let behind = !page.gap && page.events.len() < limit && kept > through;
            if !behind || !held_back.wait().await {
                return Ok(page);
            }
        }
    }

    /// [`Self::events_after`], and the id of the newest event kept, published or not.
    pub(super) async fn log_after(&self, after: u64, limit: usize) -> Result<(EventPage, u64), StoreError> {
        self.read(async |conn| log_page(conn, after, limit).await).await
    }

    pub async fn last_event_id(&self) -> Result<u64, StoreError> {
        let mut held_back = HeldBack::default();
        loop {
            let (last, kept) = self.read(async |conn| last_event_id(conn).await).await?;
            if kept <= last || !held_back.wait().await {
                return Ok(u64::try_from(last).unwrap_or(0));
            }
        }
    }

    /// Decided by one statement on the database's clock, so that the gateways' clocks do not matter. It goes
    /// through the writer, after this gateway's cursor saves still waiting there: the cursor it returns is
    /// never behind one this gateway saved before asking.
    pub async fn hold_webhook(&self, webhook: &str, holder: &str, lease: Duration) -> Result<Lease, StoreError> {
        let webhook = webhook.to_owned();
        let holder = holder.to_owned();
        let lease = i64::try_from(lease.as_millis()).unwrap_or(i64::MAX);
        self.write(move |tx| {
            let (webhook, holder) = (webhook.clone(), holder.clone());
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

    /// In a group of its own ([`super::tx::Turn::Apart`]): replicas starting together insert the same key, and
    /// each waits on the first to commit it.
    pub async fn kept_key(&self, name: &str, made: &str) -> Result<String, StoreError> {
        let (name, made) = (name.to_owned(), made.to_owned());
        self.write(move |tx| Box::pin(maintenance::kept_key(tx, name.clone(), made.clone())))
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

    pub async fn prune(&self, horizons: Horizons) -> Result<(), StoreError> {
        let before = horizons.records.millis();
        for statement in maintenance::PRUNE_RECORDS {
            loop {
                let deleted = self
                    .write(move |tx| Box::pin(maintenance::pruned(tx, statement, before)))
                    .await?;
                if i64::try_from(deleted).unwrap_or(i64::MAX) < PRUNE_BATCH {
                    break;
                }
            }
        }
        // Events go as a prefix of the log, so that a reader resuming inside it is told what it missed: up to
        // the newest published event older than `before`, never the newest published, and none that is not
        // chained yet nor the newest chained. Their links in the audit chain go with them.
        static EVENTS: LazyLock<String> = LazyLock::new(|| {
            format!(
                "WITH published AS (SELECT max(seq) AS newest, max(seq) FILTER (WHERE at < $1) AS old \
                 FROM events WHERE seq < {PUBLISHED}), \
                 chained AS (SELECT max(seq) AS head FROM audit_chain), \
                 gone AS (DELETE FROM events WHERE seq IN (SELECT seq FROM events, published, chained \
                 WHERE seq <= published.old AND seq < published.newest AND seq < chained.head ORDER BY seq LIMIT $2) \
                 RETURNING seq), \
                 noted AS (UPDATE event_log SET pruned_through = GREATEST(pruned_through, (SELECT max(seq) FROM gone)) \
                 WHERE EXISTS (SELECT 1 FROM gone)) \
                 SELECT count(*) FROM gone"
            )
        });
        let before = horizons.events.millis();
        loop {
            let deleted: i64 = self
                .write(move |tx| {
                    Box::pin(async move {
                        let deleted = tx.query_one(&EVENTS, &[&before, &PRUNE_BATCH]).await?.try_get(0)?;
                        tx.execute(sql::PRUNE_CHAIN.postgres, &[]).await?;
                        Ok(deleted)
                    })
                })
                .await?;
            if deleted < PRUNE_BATCH {
                break;
            }
        }
        // Each replica's counts of pending Requests, folded into the rows of none, and the live calls of the
        // replicas that are gone; then the rows that count nothing, deleted. Replicas that came and went, and
        // owners and servers that hold nothing, do not pile up rows, and a live replica's rows of live calls stay,
        // with the allowances they hold.
        self.write(move |tx| {
            Box::pin(async move {
                tx.execute(
                    "WITH folded AS (DELETE FROM pending_shares WHERE replica <> '' \
                     RETURNING owner, server, requests, bytes) \
                     INSERT INTO pending_shares (owner, server, replica, requests, bytes) \
                     SELECT owner, server, '', sum(requests), sum(bytes) FROM folded GROUP BY owner, server \
                     ON CONFLICT (owner, server, replica) DO UPDATE \
                     SET requests = pending_shares.requests + EXCLUDED.requests, \
                     bytes = pending_shares.bytes + EXCLUDED.bytes",
                    &[],
                )
                .await?;
                tx.execute("DELETE FROM pending_shares WHERE requests = 0 AND bytes = 0", &[])
                    .await
            })
        })
        .await?;
        // A start dealt its owner's allowances reads every replica's row of the owner, as they were when it began
        // (then their latest versions): the rows of the replicas gone are folded in a transaction that holds
        // their owners' locks, as the start's does, or the start would read neither those rows, deleted, nor
        // the one of none if this made it. (Rows of owners that appear meanwhile are folded the next time.)
        static GONE: &str = "live_calls WHERE replica <> '' AND replica NOT IN (SELECT id FROM replicas)";
        let owners: Vec<String> = self
            .read(async |conn| {
                conn.query(&format!("SELECT DISTINCT owner FROM {GONE}"), &[])
                    .await?
                    .iter()
                    .map(|row| row.try_get(0))
                    .collect()
            })
            .await?;
        self.write_holding(owners.clone(), move |tx| {
            let owners = owners.clone();
            Box::pin(async move {
                tx.execute(
                    &format!(
                        "WITH folded AS (DELETE FROM {GONE} AND owner = ANY($1) RETURNING owner, calls) \
                         INSERT INTO live_calls (owner, replica, calls) \
                         SELECT owner, '', sum(calls) FROM folded GROUP BY owner \
                         ON CONFLICT (owner, replica) DO UPDATE SET calls = live_calls.calls + EXCLUDED.calls"
                    ),
                    &[&owners],
                )
                .await?;
                tx.execute("DELETE FROM live_calls WHERE calls = 0 AND allowance = 0", &[])
                    .await
            })
        })
        .await?;
        Ok(())
    }
}

/// The id of the newest event published (pruning keeps its row).
pub(super) static LAST_EVENT: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT COALESCE((SELECT max(seq) FROM events WHERE seq < {PUBLISHED}), pruned_through), \
         COALESCE((SELECT max(seq) FROM events), pruned_through) FROM event_log"
    )
});

/// The id of the newest event published, and of the newest kept.
async fn last_event_id(conn: &impl Reader) -> Result<(i64, i64), tokio_postgres::Error> {
    Ok(match conn.query_opt(&LAST_EVENT, &[]).await? {
        Some(row) => (row.try_get(0)?, row.try_get(1)?),
        None => (0, 0),
    })
}
