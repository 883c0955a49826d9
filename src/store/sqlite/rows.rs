//! Records as rows: the columns each read selects, and how a row becomes a record.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use rusqlite::Row;
use rusqlite::ToSql;
use rusqlite::types::{FromSql, FromSqlResult, ToSqlOutput, Type, Value, ValueRef};

use serde::de::DeserializeOwned;

use crate::ids::{CallId, RequestId, SessionId};
use crate::records::{
    CallError, CallFailure, CallStatus, CallView, Event, EventKind, RequestView, SessionStatus, SessionView, Status,
    Via,
};
use crate::suspension::{Request, RequestKind};
use crate::time::Timestamp;

/// The columns `request` reads, in order.
pub const REQUEST: &str = "id, kind, prompt, url, data, expires_at, status, server, session, call_id, owner, \
     created_at, resolved_at, answer, answered_by, result, detail, completed_at";

/// The columns `call` reads, in order (from `calls AS c`).
pub const CALL: &str = "c.id, c.server, c.session, c.tool, c.arguments, c.owner, c.status, c.result, \
     c.error_message, c.error_reason, c.created_at, c.updated_at, \
     (SELECT json_group_array(id) FROM (SELECT r.id FROM requests AS r WHERE r.call_id = c.id ORDER BY r.seq)), c.via";

/// The columns `session` reads, in order.
pub const SESSION: &str =
    "id, server, owner, status, protocol_version, server_info, created_at, closed_at, detail, replica";

/// The columns `event` reads, in order.
pub const EVENT: &str = "seq, kind, server, session, call_id, owner, data";

/// A Request read with the `REQUEST` columns.
pub fn request(row: &Row<'_>) -> rusqlite::Result<RequestView> {
    request_at(row, 0)
}

/// A Request read with the `REQUEST` columns, starting at column `at`.
pub fn request_at(row: &Row<'_>, at: usize) -> rusqlite::Result<RequestView> {
    Ok(RequestView {
        request: Request {
            id: row.get(at)?,
            kind: RequestKind::from(row.get::<_, String>(at + 1)?),
            prompt: row.get(at + 2)?,
            url: row.get(at + 3)?,
            data: shared_data(row, at + 4)?,
            expires_at: Some(timestamp(row, at + 5)?.rfc3339()),
        },
        status: parsed(row, at + 6, Status::parse)?,
        server: row.get(at + 7)?,
        session: row.get(at + 8)?,
        call: row.get(at + 9)?,
        owner: row.get(at + 10)?,
        created_at: timestamp(row, at + 11)?,
        resolved_at: timestamp_opt(row, at + 12)?,
        answer: json_opt(row, at + 13)?,
        answered_by: row.get(at + 14)?,
        result: json_opt(row, at + 15)?,
        detail: row.get(at + 16)?,
        completed_at: timestamp_opt(row, at + 17)?,
    })
}

/// A call read with the `CALL` columns.
pub fn call(row: &Row<'_>) -> rusqlite::Result<CallView> {
    let message: Option<String> = row.get(8)?;
    let reason: Option<String> = row.get(9)?;
    let error = message.map(|message| CallError {
        message,
        reason: reason.as_deref().and_then(CallFailure::parse),
    });
    Ok(CallView {
        id: row.get(0)?,
        server: row.get(1)?,
        session: row.get(2)?,
        tool: row.get(3)?,
        arguments: json(row, 4)?,
        owner: row.get(5)?,
        via: Via::parse(&row.get::<_, String>(13)?),
        status: parsed(row, 6, CallStatus::parse)?,
        requests: json(row, 12)?,
        result: json_opt(row, 7)?.map(Box::new),
        error: error.map(Box::new),
        created_at: timestamp(row, 10)?,
        updated_at: timestamp(row, 11)?,
    })
}

/// A session read with the `SESSION` columns.
pub fn session(row: &Row<'_>) -> rusqlite::Result<SessionView> {
    let owner: Option<String> = row.get(2)?;
    Ok(SessionView {
        id: row.get(0)?,
        server: row.get(1)?,
        shared: owner.is_none(),
        owner,
        status: parsed(row, 3, SessionStatus::parse)?,
        protocol_version: row.get(4)?,
        server_info: json_opt(row, 5)?,
        created_at: timestamp(row, 6)?,
        closed_at: timestamp_opt(row, 7)?,
        detail: row.get(8)?,
        replica: row.get(9)?,
    })
}

/// An event read with the `EVENT` columns.
pub fn event(row: &Row<'_>) -> rusqlite::Result<Event> {
    Ok(Event {
        id: u64::try_from(row.get::<_, i64>(0)?).unwrap_or_default(),
        kind: parsed(row, 1, EventKind::parse)?,
        server: row.get(2)?,
        session: row.get(3)?,
        call: row.get(4)?,
        owner: row.get(5)?,
        data: row.get(6)?,
    })
}

/// A value as the JSON text the store keeps.
pub fn to_json(value: &impl serde::Serialize) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

/// An optional value as JSON text, or NULL.
pub fn to_json_opt<T: serde::Serialize>(value: Option<&T>) -> Option<String> {
    value.map(to_json)
}

/// The value the JSON text of column `index` holds; text that is not such a value is a conversion error.
pub(super) fn from_json<T: DeserializeOwned>(text: &str, index: usize) -> rusqlite::Result<T> {
    serde_json::from_str(text)
        .map_err(|error| rusqlite::Error::FromSqlConversionFailure(index, Type::Text, Box::new(error)))
}

fn json<T: DeserializeOwned>(row: &Row<'_>, index: usize) -> rusqlite::Result<T> {
    let text: String = row.get(index)?;
    from_json(&text, index)
}

fn json_opt<T: DeserializeOwned>(row: &Row<'_>, index: usize) -> rusqlite::Result<Option<T>> {
    let text: Option<String> = row.get(index)?;
    text.map(|text| from_json(&text, index)).transpose()
}

/// The `data` of a Request as read. Requests raised alike (one form put to many callers) hold the same text,
/// which each thread parses once and shares while it keeps being read, as the memory store shares it.
fn shared_data(row: &Row<'_>, index: usize) -> rusqlite::Result<Option<Arc<RequestData>>> {
    /// How many distinct texts a thread keeps parsed, and the longest it keeps, so that what it keeps stays
    /// small (at most 256 KiB of text, and what it parses to).
    const KEPT: usize = 64;
    const LONGEST: usize = 4096;
    thread_local! {
        static PARSED: RefCell<HashMap<Box<str>, Arc<RequestData>>> = RefCell::default();
    }
    let Some(text) = row.get_ref(index)?.as_str_or_null()? else {
        return Ok(None);
    };
    let parse = || from_json(text, index).map(Arc::new);
    if text.len() > LONGEST {
        return parse().map(Some);
    }
    PARSED.with_borrow_mut(|parsed| {
        if let Some(data) = parsed.get(text) {
            return Ok(Some(data.clone()));
        }
        let data = parse()?;
        if parsed.len() >= KEPT {
            parsed.clear();
        }
        parsed.insert(text.into(), data.clone());
        Ok(Some(data))
    })
}

type RequestData = serde_json::Map<String, serde_json::Value>;

fn timestamp(row: &Row<'_>, index: usize) -> rusqlite::Result<Timestamp> {
    row.get::<_, i64>(index).map(Timestamp::from_millis)
}

fn timestamp_opt(row: &Row<'_>, index: usize) -> rusqlite::Result<Option<Timestamp>> {
    Ok(row.get::<_, Option<i64>>(index)?.map(Timestamp::from_millis))
}

fn parsed<T>(row: &Row<'_>, index: usize, parse: fn(&str) -> Option<T>) -> rusqlite::Result<T> {
    let text: String = row.get(index)?;
    parse(&text).ok_or_else(|| {
        let message = format!("unknown value {text:?}");
        rusqlite::Error::FromSqlConversionFailure(index, Type::Text, message.into())
    })
}

/// The `WHERE` clause of a listing, naming only the filters given, with its parameters in order.
pub struct Conditions {
    pub sql: String,
    params: Vec<Value>,
}

impl Conditions {
    /// Conditions that let every row through until some are added.
    pub fn all() -> Self {
        Self {
            sql: "1".to_owned(),
            params: Vec::new(),
        }
    }

    /// Conditions starting with one that takes one parameter.
    pub fn new(condition: &str, value: impl Into<Value>) -> Self {
        Self {
            sql: condition.to_owned(),
            params: vec![value.into()],
        }
    }

    /// A condition without parameters.
    pub fn fixed(&mut self, condition: &str) {
        self.sql.push_str(" AND ");
        self.sql.push_str(condition);
    }

    /// `column = value`, when there is a value.
    pub fn equal(&mut self, column: &str, value: Option<&str>) {
        if let Some(value) = value {
            self.fixed(&format!("{column} = ?"));
            self.params.push(value.to_owned().into());
        }
    }

    /// The parameters, then the `LIMIT` that ends the statement.
    pub fn params_then(&self, limit: i64) -> impl rusqlite::Params + '_ {
        rusqlite::params_from_iter(self.params.iter().cloned().chain([Value::Integer(limit)]))
    }
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
    use rusqlite::Connection;

    use super::*;

    fn read(conn: &Connection, text: Option<&str>) -> rusqlite::Result<Option<Arc<RequestData>>> {
        conn.query_row("SELECT ?1", [text], |row| shared_data(row, 0))
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
