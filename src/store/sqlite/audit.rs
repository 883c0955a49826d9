//! The audit chain in the file: links appended in the writer (read back by [`crate::store::sql::audit`]).

use rusqlite::params;

use super::Sqlite;
use crate::audit::Link;
use crate::store::StoreError;

impl Sqlite {
    /// Checked and appended in the writer, the file's one: nothing moves the chain on in between.
    pub async fn extend_chain(&self, after: Option<u64>, links: Vec<Link>) -> Result<bool, StoreError> {
        self.write(move |tx| {
            let head: Option<i64> = tx
                .conn
                .prepare_cached("SELECT max(seq) FROM audit_chain")?
                .query_row([], |row| row.get(0))?;
            if head.and_then(|head| u64::try_from(head).ok()) != after {
                return Ok(false);
            }
            let mut insert = tx
                .conn
                .prepare_cached("INSERT INTO audit_chain (seq, prev, hash) VALUES (?1, ?2, ?3)")?;
            for link in &links {
                let id = i64::try_from(link.id).unwrap_or(i64::MAX);
                insert.execute(params![id, link.prev, link.hash])?;
            }
            Ok(true)
        })
        .await
    }
}
