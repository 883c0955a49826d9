//! The audit chain as both SQL engines read it. Links are appended each engine's own way.

use super::run::Run;
use crate::audit::{Entry, Link};
use crate::store::sql;

/// The newest link.
pub async fn head<R: Run>(conn: &R) -> Result<Option<Link>, R::Error> {
    conn.row(&sql::CHAIN_HEAD, &[]).await
}

/// Up to `limit` events chained after event `after`, with their links, in order.
pub async fn chained<R: Run>(conn: &R, after: u64, limit: usize) -> Result<Vec<Entry>, R::Error> {
    let after = i64::try_from(after).unwrap_or(i64::MAX);
    conn.rows(&sql::CHAINED, &[&after, &sql::limit(limit)]).await
}
