//! Webhook cursors, kept keys and the pruning of ended records, as both SQL engines run them. The event log's
//! reads and pruning, and a webhook's lease, are each engine's own.

use super::Shared;
use super::run::{Change, Run};
use crate::store::sql;

/// How many rows one pruning statement deletes, so that the writer never stops for long.
pub const PRUNE_BATCH: i64 = 5000;

/// The statements that prune ended records, each run until it deletes fewer than [`PRUNE_BATCH`] rows.
pub const PRUNE_RECORDS: [Shared; 5] = [
    sql::PRUNE_REQUESTS,
    sql::PRUNE_ROUNDS,
    sql::PRUNE_CALLS,
    sql::PRUNE_SESSIONS,
    sql::PRUNE_GRANTS,
];

/// One batch of a pruning statement, deleting what ended before `before`: how many rows it deleted.
pub async fn pruned<C: Change>(tx: &mut C, statement: Shared, before: i64) -> Result<u64, C::Error> {
    tx.execute(&statement, &[&before, &PRUNE_BATCH]).await
}

/// The last event delivered to a webhook.
pub async fn webhook_cursor<R: Run>(conn: &R, webhook: &str) -> Result<Option<u64>, R::Error> {
    let delivered: Option<Option<i64>> = conn.row(&sql::WEBHOOK_DELIVERED, &[&webhook]).await?;
    Ok(delivered.flatten().and_then(|id| u64::try_from(id).ok()))
}

/// The key kept under `name`, which is `made` unless one was kept under it already.
pub async fn kept_key<C: Change>(tx: &mut C, name: String, made: String) -> Result<String, C::Error> {
    let now = tx.now().millis();
    tx.execute(&sql::KEY_KEPT, &[&name, &made, &now]).await?;
    tx.one_row(&sql::KEY, &[&name]).await
}
