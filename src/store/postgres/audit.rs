//! The audit chain in the database: links appended by one statement of their own (read back by
//! [`crate::store::sql::audit`]).

use super::{Postgres, Reader, unavailable};
use crate::audit::Link;
use crate::store::StoreError;

impl Postgres {
    /// One statement, committed on its own on a read connection rather than in the writer: a pass of the chainer
    /// is then one exchange with the database, and waits for no other change. The statement checks that the
    /// chain has not moved on, so that no lock orders the chainers: two chainers (one whose lease ran out while
    /// it worked) compute the same links from the same events, and the second to run appends only what the first
    /// did not, and is told that the chain moved on.
    pub async fn extend_chain(&self, after: Option<u64>, links: Vec<Link>) -> Result<bool, StoreError> {
        const EXTEND: &str = "INSERT INTO audit_chain (seq, prev, hash) \
             SELECT * FROM unnest($1::BIGINT[], $2::TEXT[], $3::TEXT[]) \
             WHERE (SELECT max(seq) FROM audit_chain) IS NOT DISTINCT FROM $4::BIGINT \
             ON CONFLICT (seq) DO NOTHING \
             RETURNING seq";
        let after = after.map(|id| i64::try_from(id).unwrap_or(i64::MAX));
        let ids: Vec<i64> = links
            .iter()
            .map(|link| i64::try_from(link.id).unwrap_or(i64::MAX))
            .collect();
        let prevs: Vec<&str> = links.iter().map(|link| link.prev.as_str()).collect();
        let hashes: Vec<&str> = links.iter().map(|link| link.hash.as_str()).collect();
        let conn = self.reader().await?;
        let appended = conn
            .query(EXTEND, &[&ids, &prevs, &hashes, &after])
            .await
            .map_err(|error| unavailable(&error))?;
        Ok(appended.len() == links.len())
    }
}
