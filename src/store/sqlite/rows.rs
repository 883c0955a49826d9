//! Records as SQLite rows: a row's columns as `store::rows` reads them, the columns of a call's read, and the
//! `WHERE` clause of a listing.

use rusqlite::ToSql;
use rusqlite::types::{FromSql, FromSqlResult, ToSqlOutput, Type, ValueRef};
use rusqlite::{Connection, OptionalExtension, Row};

use crate::ids::{CallId, RequestId, SessionId};
use crate::records::GrantView;
use crate::records::{CallView, Event, RequestView, SessionView};
use crate::store::listing::{Conditions, Param};
use crate::store::rows::{self as records, Columns, Parse};
pub use crate::store::rows::{EVENT, REQUEST, decisions_json, to_json, to_json_opt};

/// The columns `call` reads, in order (from `calls AS c`): each engine gathers a call's Requests its own way.
pub const CALL: &str = "c.id, c.server, c.session, c.tool, c.arguments, c.owner, c.status, c.result, \
     c.error_message, c.error_reason, c.created_at, c.updated_at, \
     (SELECT json_group_array(id) FROM (SELECT r.id FROM requests AS r WHERE r.call_id = c.id ORDER BY r.seq)), c.via, c.task, c.allowed";

/// Call `id`, read whole.
pub fn one_call(conn: &Connection, id: &CallId) -> rusqlite::Result<Option<CallView>> {
    let sql = format!("SELECT {CALL} FROM calls AS c WHERE c.id = ?1");
    conn.prepare_cached(&sql)?.query_row([id], call).optional()
}

/// Session `id`, read whole.
pub fn one_session(conn: &Connection, id: &SessionId) -> rusqlite::Result<Option<SessionView>> {
    conn.prepare_cached(crate::store::sql::SESSION.sqlite)?
        .query_row([id], session)
        .optional()
}

// The readers rusqlite's `query_map` takes: a function of a row of any lifetime.

/// A Request read with the `REQUEST` columns.
pub fn request(row: &Row<'_>) -> rusqlite::Result<RequestView> {
    records::request(row)
}

/// A Request read with the `REQUEST` columns, starting at column `at`.
pub fn request_at(row: &Row<'_>, at: usize) -> rusqlite::Result<RequestView> {
    records::request_at(row, at)
}

/// A call read with the `CALL` columns.
pub fn call(row: &Row<'_>) -> rusqlite::Result<CallView> {
    records::call(row)
}

/// A session read with the `SESSION` columns.
pub fn session(row: &Row<'_>) -> rusqlite::Result<SessionView> {
    records::session(row)
}

/// A grant read with the `grant_columns!` columns.
pub fn grant(row: &Row<'_>) -> rusqlite::Result<GrantView> {
    records::grant(row)
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

/// A listing's parameters, as rusqlite binds them.
pub fn params(conditions: &Conditions) -> impl rusqlite::Params + '_ {
    rusqlite::params_from_iter(conditions.params().iter().map(|param| match param {
        Param::Text(text) => ToSqlOutput::Borrowed(ValueRef::Text(text.as_bytes())),
        Param::Integer(integer) => ToSqlOutput::Borrowed(ValueRef::Integer(*integer)),
    }))
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

id_columns!(CallId, RequestId, SessionId);

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
