//! Records as SQLite rows: a row's columns as `store::rows` reads them, the statements of [`crate::store::sql`]
//! run on a connection, and ids bound as their text.

use rusqlite::ToSql;
use rusqlite::types::{FromSql, FromSqlResult, ToSqlOutput, Type, ValueRef};
use rusqlite::{Connection, OptionalExtension, Row};

use crate::ids::{CallId, GrantId, RequestId, SessionId};
use crate::records::{CallView, Event, RequestView, SessionView};
use crate::store::listing::Dialect;
use crate::store::rows::{self as records, Columns, Parse};
pub use crate::store::rows::{EVENT, REQUEST, decisions_json, to_json, to_json_opt};
use crate::store::sql::{Bind, Record, Run, Text, at_once, calls, sessions};

/// Call `id`, read whole.
pub fn one_call(conn: &Connection, id: &CallId) -> rusqlite::Result<Option<CallView>> {
    at_once(calls::one(conn, id))
}

/// Session `id`, read whole.
pub fn one_session(conn: &Connection, id: &SessionId) -> rusqlite::Result<Option<SessionView>> {
    at_once(sessions::one(conn, id))
}

// The readers rusqlite's `query_map` takes: a function of a row of any lifetime.

/// A Request read with the `REQUEST` columns, starting at column `at`.
pub fn request_at(row: &Row<'_>, at: usize) -> rusqlite::Result<RequestView> {
    records::request_at(row, at)
}

/// An event read with the `EVENT` columns.
pub fn event(row: &Row<'_>) -> rusqlite::Result<Event> {
    records::event(row)
}

impl Columns for Row<'_> {
    type Error = rusqlite::Error;

    fn text(&self, at: usize) -> rusqlite::Result<String> {
        self.get(at)
    }

    fn text_opt(&self, at: usize) -> rusqlite::Result<Option<String>> {
        self.get(at)
    }

    fn integer(&self, at: usize) -> rusqlite::Result<i64> {
        self.get(at)
    }

    fn integer_opt(&self, at: usize) -> rusqlite::Result<Option<i64>> {
        self.get(at)
    }

    fn parsed<P: Parse>(&self, at: usize) -> rusqlite::Result<P::Value> {
        let text = self.get_ref(at)?.as_str()?;
        P::parse(text).map_err(|error| rusqlite::Error::FromSqlConversionFailure(at, Type::Text, error))
    }

    fn parsed_opt<P: Parse>(&self, at: usize) -> rusqlite::Result<Option<P::Value>> {
        let Some(text) = self.get_ref(at)?.as_str_or_null()? else {
            return Ok(None);
        };
        P::parse(text)
            .map(Some)
            .map_err(|error| rusqlite::Error::FromSqlConversionFailure(at, Type::Text, error))
    }
}

impl Run for Connection {
    type Error = rusqlite::Error;
    const DIALECT: Dialect = Dialect::Sqlite;

    async fn execute(&self, statement: &(impl Text + ?Sized), params: &[&dyn Bind]) -> rusqlite::Result<u64> {
        let changed = self
            .prepare_cached(statement.text(Self::DIALECT))?
            .execute(bound(params))?;
        Ok(u64::try_from(changed).unwrap_or(u64::MAX))
    }

    async fn rows<T: Record>(
        &self,
        statement: &(impl Text + ?Sized),
        params: &[&dyn Bind],
    ) -> rusqlite::Result<Vec<T>> {
        let mut prepared = self.prepare_cached(statement.text(Self::DIALECT))?;
        let found = prepared.query_map(bound(params), |row| T::read(row))?;
        found.collect()
    }

    async fn row<T: Record>(
        &self,
        statement: &(impl Text + ?Sized),
        params: &[&dyn Bind],
    ) -> rusqlite::Result<Option<T>> {
        self.prepare_cached(statement.text(Self::DIALECT))?
            .query_row(bound(params), |row| T::read(row))
            .optional()
    }

    async fn one_row<T: Record>(&self, statement: &(impl Text + ?Sized), params: &[&dyn Bind]) -> rusqlite::Result<T> {
        self.prepare_cached(statement.text(Self::DIALECT))?
            .query_row(bound(params), |row| T::read(row))
    }
}

/// Parameters as rusqlite binds them.
fn bound<'p>(params: &'p [&'p dyn Bind]) -> impl rusqlite::Params + 'p {
    rusqlite::params_from_iter(params.iter().map(|param| *param as &dyn ToSql))
}

/// Ids are kept as their text.
macro_rules! id_columns {
    ($($id:ty),*) => {$(
        impl FromSql for $id {
            fn column_result(value: ValueRef<'_>) -> FromSqlResult<Self> {
                String::column_result(value).map(<$id>::stored)
            }
        }

        impl ToSql for $id {
            fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
                Ok(ToSqlOutput::Borrowed(ValueRef::Text(self.as_str().as_bytes())))
            }
        }
    )*};
}

id_columns!(CallId, GrantId, RequestId, SessionId);

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rusqlite::Connection;

    use super::*;
    use crate::store::rows::SharedData;

    type RequestData = serde_json::Map<String, serde_json::Value>;

    fn read(conn: &Connection, text: Option<&str>) -> rusqlite::Result<Option<Arc<RequestData>>> {
        conn.query_row("SELECT ?1", [text], |row| row.parsed_opt::<SharedData>(0))
    }

    #[test]
    fn requests_with_the_same_data_share_it_once_parsed() {
        let conn = Connection::open_in_memory().unwrap();
        let form = r#"{"requestedSchema":{"type":"object","properties":{"confirm":{"type":"boolean"}}}}"#;
        let first = read(&conn, Some(form)).unwrap().unwrap();
        let again = read(&conn, Some(form)).unwrap().unwrap();
        assert!(Arc::ptr_eq(&first, &again));
        assert_eq!(first["requestedSchema"]["type"], "object");
        let other = read(&conn, Some(r#"{"url":"https://example.com"}"#)).unwrap().unwrap();
        assert!(!Arc::ptr_eq(&first, &other));
        assert_eq!(read(&conn, None).unwrap(), None);
        assert!(read(&conn, Some("{not json")).is_err());
    }

    #[test]
    fn long_data_is_parsed_each_time_rather_than_kept() {
        let conn = Connection::open_in_memory().unwrap();
        let long = serde_json::json!({"message": "x".repeat(5000)}).to_string();
        let first = read(&conn, Some(&long)).unwrap().unwrap();
        let again = read(&conn, Some(&long)).unwrap().unwrap();
        assert!(!Arc::ptr_eq(&first, &again));
        assert_eq!(first, again);
    }
}
