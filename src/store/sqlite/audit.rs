//! The audit chain in the file: its newest link, links appended in the writer, and chained events read back.

use rusqlite::{OptionalExtension, params};

use super::Sqlite;
use crate::audit::{Entry, Link};
use crate::store::{StoreError, rows, sql};

impl Sqlite {
    pub async fn chain_head(&self) -> Result<Option<Link>, StoreError> {
        self.read(|conn| {
            conn.prepare_cached(sql::CHAIN_HEAD.sqlite)?
                .query_row([], |row| rows::link(row))
                .optional()
        })
    }

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

    pub async fn chained_after(&self, after: u64, limit: usize) -> Result<Vec<Entry>, StoreError> {
        let after = i64::try_from(after).unwrap_or(i64::MAX);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.read(|conn| {
            let mut statement = conn.prepare_cached(sql::CHAINED.sqlite)?;
            let entries = statement.query_map(params![after, limit], |row| rows::entry(row))?;
            entries.collect()
        })
    }
}
