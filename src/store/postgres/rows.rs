//! Records as rows: the columns each read selects, how a row becomes a record, and the `WHERE` clause of a
//! listing.

use std::error::Error;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use tokio_postgres::Row;
use tokio_postgres::types::{FromSql, ToSql, Type};

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
     COALESCE((SELECT json_agg(r.id ORDER BY r.seq)::TEXT FROM requests AS r WHERE r.call_id = c.id), '[]'), \
     c.via";
/// How many columns [`CALL`] names.
pub const CALL_COLUMNS: usize = 14;

/// The columns `session` reads, in order.
pub const SESSION: &str =
    "id, server, owner, status, protocol_version, server_info, created_at, closed_at, detail, replica";

/// The columns `event` reads, in order.
pub const EVENT: &str = "seq, kind, server, session, call_id, owner, data";
/// How many columns [`EVENT`] names.
pub const EVENT_COLUMNS: usize = 7;

/// A Request read with the `REQUEST` columns.
pub fn request(row: &Row) -> Result<RequestView, tokio_postgres::Error> {
    request_at(row, 0)
}

/// A Request read with the `REQUEST` columns, starting at column `at`.
pub fn request_at(row: &Row, at: usize) -> Result<RequestView, tokio_postgres::Error> {
    Ok(RequestView {
        request: Request {
            id: row.try_get(at)?,
            kind: RequestKind::from(row.try_get::<_, String>(at + 1)?),
            prompt: row.try_get(at + 2)?,
            url: row.try_get(at + 3)?,
            data: row
                .try_get::<_, Option<Json<serde_json::Map<String, serde_json::Value>>>>(at + 4)?
                .map(|data| Arc::new(data.0)),
            expires_at: Some(timestamp(row, at + 5)?.rfc3339()),
        },
        status: row.try_get::<_, Named<Status>>(at + 6)?.0,
        server: row.try_get(at + 7)?,
        session: row.try_get(at + 8)?,
        call: row.try_get(at + 9)?,
        owner: row.try_get(at + 10)?,
        created_at: timestamp(row, at + 11)?,
        resolved_at: timestamp_opt(row, at + 12)?,
        answer: json_opt(row, at + 13)?,
        answered_by: row.try_get(at + 14)?,
        result: json_opt(row, at + 15)?,
        detail: row.try_get(at + 16)?,
        completed_at: timestamp_opt(row, at + 17)?,
    })
}

/// A call read with the `CALL` columns.
pub fn call(row: &Row) -> Result<CallView, tokio_postgres::Error> {
    let message: Option<String> = row.try_get(8)?;
    let reason: Option<String> = row.try_get(9)?;
    let error = message.map(|message| CallError {
        message,
        reason: reason.as_deref().and_then(CallFailure::parse),
    });
    Ok(CallView {
        id: row.try_get(0)?,
        server: row.try_get(1)?,
        session: row.try_get(2)?,
        tool: row.try_get(3)?,
        arguments: row.try_get::<_, Json<_>>(4)?.0,
        owner: row.try_get(5)?,
        via: Via::parse(row.try_get(13)?),
        status: row.try_get::<_, Named<CallStatus>>(6)?.0,
        requests: row.try_get::<_, Json<_>>(12)?.0,
        result: json_opt(row, 7)?.map(Box::new),
        error: error.map(Box::new),
        created_at: timestamp(row, 10)?,
        updated_at: timestamp(row, 11)?,
    })
}

/// A session read with the `SESSION` columns.
pub fn session(row: &Row) -> Result<SessionView, tokio_postgres::Error> {
    let owner: Option<String> = row.try_get(2)?;
    Ok(SessionView {
        id: row.try_get(0)?,
        server: row.try_get(1)?,
        shared: owner.is_none(),
        owner,
        status: row.try_get::<_, Named<SessionStatus>>(3)?.0,
        protocol_version: row.try_get(4)?,
        server_info: json_opt(row, 5)?,
        created_at: timestamp(row, 6)?,
        closed_at: timestamp_opt(row, 7)?,
        detail: row.try_get(8)?,
        replica: row.try_get(9)?,
    })
}

/// An event read with the `EVENT` columns.
pub fn event(row: &Row) -> Result<Event, tokio_postgres::Error> {
    Ok(Event {
        id: u64::try_from(row.try_get::<_, i64>(0)?).unwrap_or_default(),
        kind: row.try_get::<_, Named<EventKind>>(1)?.0,
        server: row.try_get(2)?,
        session: row.try_get(3)?,
        call: row.try_get(4)?,
        owner: row.try_get(5)?,
        data: row.try_get(6)?,
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

/// A value read from the JSON text the store keeps.
pub struct Json<T>(pub T);

impl<'a, T: DeserializeOwned> FromSql<'a> for Json<T> {
    fn from_sql(ty: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn Error + Sync + Send>> {
        let text = <&str as FromSql>::from_sql(ty, raw)?;
        Ok(Json(serde_json::from_str(text)?))
    }

    fn accepts(ty: &Type) -> bool {
        <&str as FromSql>::accepts(ty)
    }
}

/// A value the store keeps by its name.
pub struct Named<T>(pub T);

/// What can be read back from its name.
pub trait Name: Sized {
    fn parse(name: &str) -> Option<Self>;
}

impl Name for Status {
    fn parse(name: &str) -> Option<Self> {
        Status::parse(name)
    }
}

impl Name for CallStatus {
    fn parse(name: &str) -> Option<Self> {
        CallStatus::parse(name)
    }
}

impl Name for SessionStatus {
    fn parse(name: &str) -> Option<Self> {
        SessionStatus::parse(name)
    }
}

impl Name for EventKind {
    fn parse(name: &str) -> Option<Self> {
        EventKind::parse(name)
    }
}

impl<'a, T: Name> FromSql<'a> for Named<T> {
    fn from_sql(ty: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn Error + Sync + Send>> {
        let text = <&str as FromSql>::from_sql(ty, raw)?;
        T::parse(text)
            .map(Named)
            .ok_or_else(|| format!("unknown value {text:?}").into())
    }

    fn accepts(ty: &Type) -> bool {
        <&str as FromSql>::accepts(ty)
    }
}

fn json_opt<T: DeserializeOwned>(row: &Row, index: usize) -> Result<Option<T>, tokio_postgres::Error> {
    Ok(row.try_get::<_, Option<Json<T>>>(index)?.map(|json| json.0))
}

fn timestamp(row: &Row, index: usize) -> Result<Timestamp, tokio_postgres::Error> {
    row.try_get::<_, i64>(index).map(Timestamp::from_millis)
}

fn timestamp_opt(row: &Row, index: usize) -> Result<Option<Timestamp>, tokio_postgres::Error> {
    Ok(row.try_get::<_, Option<i64>>(index)?.map(Timestamp::from_millis))
}

/// A parameter of a statement.
pub type Param = Box<dyn ToSql + Sync + Send>;

/// The `WHERE` clause of a listing, naming only the filters given, with its parameters numbered in order.
pub struct Conditions {
    pub sql: String,
    params: Vec<Param>,
}

impl Conditions {
    /// Conditions that let every row through until some are added.
    pub fn all() -> Self {
        Self {
            sql: "TRUE".to_owned(),
            params: Vec::new(),
        }
    }

    /// A condition without parameters.
    pub fn fixed(&mut self, condition: &str) {
        self.sql.push_str(" AND ");
        self.sql.push_str(condition);
    }

    /// `left value`, as in `seq >=` and a cursor.
    pub fn compare(&mut self, left: &str, value: Param) {
        let placeholder = self.param(value);
        self.fixed(&format!("{left} {placeholder}"));
    }

    /// `column = value`, when there is a value.
    pub fn equal(&mut self, column: &str, value: Option<&str>) {
        if let Some(value) = value {
            self.compare(&format!("{column} ="), Box::new(value.to_owned()));
        }
    }

    /// The placeholder of one more parameter, to follow the conditions (a `LIMIT`).
    pub fn param(&mut self, value: Param) -> String {
        self.params.push(value);
        format!("${}", self.params.len())
    }

    /// The parameters, in order.
    pub fn params(&self) -> Vec<&(dyn ToSql + Sync)> {
        self.params
            .iter()
            .map(|param| param.as_ref() as &(dyn ToSql + Sync))
            .collect()
    }
}

/// Ids are kept as their text.
macro_rules! id_columns {
    ($($id:ty),*) => {$(
        impl<'a> FromSql<'a> for $id {
            fn from_sql(ty: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn Error + Sync + Send>> {
                <String as FromSql>::from_sql(ty, raw).map(<$id>::stored)
            }

            fn accepts(ty: &Type) -> bool {
                <String as FromSql>::accepts(ty)
            }
        }

        impl ToSql for $id {
            fn to_sql(
                &self,
                ty: &Type,
                out: &mut tokio_postgres::types::private::BytesMut,
            ) -> Result<tokio_postgres::types::IsNull, Box<dyn Error + Sync + Send>> {
                self.as_str().to_sql(ty, out)
            }

            fn accepts(ty: &Type) -> bool {
                <&str as ToSql>::accepts(ty)
            }

            tokio_postgres::types::to_sql_checked!();
        }
    )*};
}

id_columns!(CallId, RequestId, SessionId);
