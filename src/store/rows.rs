//! Records as rows, for both SQL engines: the columns each read selects, and how a row of either driver (read
//! through [`Columns`]) becomes a record. Only a call's columns are each engine's own (`sqlite::rows`,
//! `postgres::rows`).

use std::cell::RefCell;
use std::collections::HashMap;
use std::error::Error;
use std::marker::PhantomData;
use std::sync::Arc;

use serde::de::DeserializeOwned;

use crate::audit::{Entry, Link};
use crate::ids::{CallId, GrantId, RequestId, SessionId};
use crate::records::GrantView;
use crate::records::{
    CallError, CallFailure, CallStatus, CallView, Event, EventKind, RequestView, SessionStatus, SessionView, Status,
    Via,
};
use crate::suspension::{Request, RequestKind, Scope};
use crate::time::Timestamp;

/// Why a column's text is not the value it should hold.
pub type Malformed = Box<dyn Error + Send + Sync>;

/// A row either driver read: its columns by position, as the kinds of value the store keeps.
pub trait Columns {
    /// The driver's error, which a malformed column or an unexpected NULL becomes as well.
    type Error;
    /// Column `at`'s text.
    fn text(&self, at: usize) -> Result<String, Self::Error>;
    /// Column `at`'s text, or `None` for NULL.
    fn text_opt(&self, at: usize) -> Result<Option<String>, Self::Error>;
    /// Column `at`'s integer.
    fn integer(&self, at: usize) -> Result<i64, Self::Error>;
    /// Column `at`'s integer, or `None` for NULL.
    fn integer_opt(&self, at: usize) -> Result<Option<i64>, Self::Error>;
    /// Column `at`'s text as `P` reads it; text it refuses is the driver's conversion error.
    fn parsed<P: Parse>(&self, at: usize) -> Result<P::Value, Self::Error>;
    /// Column `at`'s text as `P` reads it, or `None` for NULL.
    fn parsed_opt<P: Parse>(&self, at: usize) -> Result<Option<P::Value>, Self::Error>;
}

/// How a value is read from the text a column keeps.
pub trait Parse {
    type Value;
    fn parse(text: &str) -> Result<Self::Value, Malformed>;
}

/// A value kept as its JSON text.
pub struct JsonText<T>(PhantomData<T>);

impl<T: DeserializeOwned> Parse for JsonText<T> {
    type Value = T;
    fn parse(text: &str) -> Result<T, Malformed> {
        Ok(serde_json::from_str(text)?)
    }
}

/// A value kept by its name.
pub struct NameText<T>(PhantomData<T>);

/// What can be read back from its name.
pub trait Name: Sized {
    fn parse(name: &str) -> Option<Self>;
}

impl<T: Name> Parse for NameText<T> {
    type Value = T;
    fn parse(text: &str) -> Result<T, Malformed> {
        T::parse(text).ok_or_else(|| format!("unknown value {text:?}").into())
    }
}

macro_rules! names {
    ($($kind:ty),*) => {$(
        impl Name for $kind {
            fn parse(name: &str) -> Option<Self> {
                <$kind>::parse(name)
            }
        }
    )*};
}

names!(Status, CallStatus, SessionStatus, EventKind, Scope);

/// The `data` of a Request. Requests raised alike (one form put to many callers) hold the same text, which each
/// thread parses once and shares while it keeps being read, as the memory store shares it.
pub struct SharedData;

type RequestData = serde_json::Map<String, serde_json::Value>;

impl Parse for SharedData {
    type Value = Arc<RequestData>;
    fn parse(text: &str) -> Result<Arc<RequestData>, Malformed> {
        /// How many distinct texts a thread keeps parsed, and the longest it keeps, so that what it keeps stays
        /// small (at most 256 KiB of text, and what it parses to).
        const KEPT: usize = 64;
        const LONGEST: usize = 4096;
        thread_local! {
            static PARSED: RefCell<HashMap<Box<str>, Arc<RequestData>>> = RefCell::default();
        }
        let parse = || JsonText::<RequestData>::parse(text).map(Arc::new);
        if text.len() > LONGEST {
            return parse();
        }
        PARSED.with_borrow_mut(|parsed| {
            if let Some(data) = parsed.get(text) {
                return Ok(data.clone());
            }
            let data = parse()?;
            if parsed.len() >= KEPT {
                parsed.clear();
            }
            parsed.insert(text.into(), data.clone());
            Ok(data)
        })
    }
}

/// The columns `request` reads, in order.
macro_rules! request_columns {
    () => {
        "id, kind, prompt, url, data, expires_at, status, server, session, call_id, owner, created_at, resolved_at, \
         answer, answered_by, result, detail, completed_at, decisions, answerer"
    };
}
pub(crate) use request_columns;

/// The columns `call` reads, in order (from `calls AS c`), with `$requests` standing for the ids of the call's
/// Requests, which each engine gathers its own way.
macro_rules! call_columns {
    ($requests:expr) => {
        concat!(
            "c.id, c.server, c.session, c.tool, c.arguments, c.owner, c.status, c.result, c.error_message, ",
            "c.error_reason, c.created_at, c.updated_at, ",
            $requests,
            ", c.via, c.task, c.allowed"
        )
    };
}
pub(crate) use call_columns;

/// The ids of call `c`'s Requests, in order, as a JSON array, in PostgreSQL.
macro_rules! postgres_requests_of_call {
    () => {
        "COALESCE((SELECT json_agg(r.id ORDER BY r.seq)::TEXT FROM requests AS r WHERE r.call_id = c.id), '[]')"
    };
}
pub(crate) use postgres_requests_of_call;

/// The ids of call `c`'s Requests, in order, as a JSON array, in SQLite.
macro_rules! sqlite_requests_of_call {
    () => {
        "(SELECT json_group_array(id) FROM (SELECT r.id FROM requests AS r WHERE r.call_id = c.id ORDER BY r.seq))"
    };
}
pub(crate) use sqlite_requests_of_call;

/// The columns `session` reads, in order.
macro_rules! session_columns {
    () => {
        "id, server, owner, status, protocol_version, server_info, created_at, closed_at, detail, replica"
    };
}
pub(crate) use session_columns;

/// The columns `grant` reads, in order.
macro_rules! grant_columns {
    () => {
        "id, request, owner, server, tool, scope, digest, lasting, session, expires_at, by_name, created_at, uses, \
         revoked_at, revoked_by"
    };
}
pub(crate) use grant_columns;

/// The columns `event` reads, in order.
macro_rules! event_columns {
    () => {
        "seq, kind, server, session, call_id, owner, data, at"
    };
}
pub(crate) use event_columns;

/// The columns `request` reads, in order.
pub const REQUEST: &str = request_columns!();

/// The columns `session` reads, in order.
pub const SESSION: &str = session_columns!();

/// The columns `event` reads, in order.
pub const EVENT: &str = event_columns!();

/// How many columns a call's read selects.
pub const CALL_COLUMNS: usize = 16;
/// How many columns an event's read selects.
pub const EVENT_COLUMNS: usize = 8;

/// A Request read with the `REQUEST` columns, starting at column `at`.
pub fn request_at<R: Columns>(row: &R, at: usize) -> Result<RequestView, R::Error> {
    Ok(RequestView {
        request: Request {
            id: RequestId::stored(row.text(at)?),
            kind: RequestKind::from(row.text(at + 1)?),
            prompt: row.text(at + 2)?,
            url: row.text_opt(at + 3)?,
            data: row.parsed_opt::<SharedData>(at + 4)?,
            expires_at: Some(Timestamp::from_millis(row.integer(at + 5)?).rfc3339()),
        },
        status: row.parsed::<NameText<_>>(at + 6)?,
        server: row.text_opt(at + 7)?,
        session: row.text_opt(at + 8)?.map(SessionId::stored),
        call: row.text_opt(at + 9)?.map(CallId::stored),
        owner: row.text_opt(at + 10)?,
        created_at: Timestamp::from_millis(row.integer(at + 11)?),
        resolved_at: row.integer_opt(at + 12)?.map(Timestamp::from_millis),
        answer: row.parsed_opt::<JsonText<_>>(at + 13)?,
        answered_by: row.text_opt(at + 14)?,
        result: row.parsed_opt::<JsonText<_>>(at + 15)?,
        detail: row.text_opt(at + 16)?,
        completed_at: row.integer_opt(at + 17)?.map(Timestamp::from_millis),
        decisions: row.parsed_opt::<JsonText<_>>(at + 18)?.unwrap_or_default(),
        answerer: row.parsed_opt::<JsonText<_>>(at + 19)?,
    })
}

/// A Request read with the `REQUEST` columns.
pub fn request<R: Columns>(row: &R) -> Result<RequestView, R::Error> {
    request_at(row, 0)
}

/// A call read with the `call_columns!` columns.
pub fn call<R: Columns>(row: &R) -> Result<CallView, R::Error> {
    let reason = row.text_opt(9)?;
    let error = row.text_opt(8)?.map(|message| CallError {
        message,
        reason: reason.as_deref().and_then(CallFailure::parse),
    });
    Ok(CallView {
        id: CallId::stored(row.text(0)?),
        server: row.text(1)?,
        session: SessionId::stored(row.text(2)?),
        tool: row.text(3)?,
        arguments: row.parsed::<JsonText<_>>(4)?,
        owner: row.text(5)?,
        via: Via::parse(&row.text(13)?),
        status: row.parsed::<NameText<_>>(6)?,
        requests: row.parsed::<JsonText<_>>(12)?,
        result: row.parsed_opt::<JsonText<_>>(7)?.map(Box::new),
        error: error.map(Box::new),
        task: row.parsed_opt::<JsonText<_>>(14)?.map(Box::new),
        allowed: row.parsed_opt::<JsonText<_>>(15)?.map(Box::new),
        created_at: Timestamp::from_millis(row.integer(10)?),
        updated_at: Timestamp::from_millis(row.integer(11)?),
    })
}

/// A grant read with the `grant_columns!` columns.
pub fn grant<R: Columns>(row: &R) -> Result<GrantView, R::Error> {
    Ok(GrantView {
        id: GrantId::stored(row.text(0)?),
        request: RequestId::stored(row.text(1)?),
        owner: row.text(2)?,
        server: row.text(3)?,
        tool: row.text(4)?,
        scope: row.parsed::<NameText<_>>(5)?,
        digest: row.text_opt(6)?,
        lasting: row.parsed::<JsonText<_>>(7)?,
        session: row.text_opt(8)?.map(SessionId::stored),
        expires_at: row.integer_opt(9)?.map(Timestamp::from_millis),
        by: row.text(10)?,
        created_at: Timestamp::from_millis(row.integer(11)?),
        uses: u64::try_from(row.integer(12)?).unwrap_or_default(),
        revoked_at: row.integer_opt(13)?.map(Timestamp::from_millis),
        revoked_by: row.text_opt(14)?,
    })
}

/// A session read with the `SESSION` columns.
pub fn session<R: Columns>(row: &R) -> Result<SessionView, R::Error> {
    let owner = row.text_opt(2)?;
    Ok(SessionView {
        id: SessionId::stored(row.text(0)?),
        server: row.text(1)?,
        shared: owner.is_none(),
        owner,
        status: row.parsed::<NameText<_>>(3)?,
        protocol_version: row.text_opt(4)?,
        server_info: row.parsed_opt::<JsonText<_>>(5)?,
        created_at: Timestamp::from_millis(row.integer(6)?),
        closed_at: row.integer_opt(7)?.map(Timestamp::from_millis),
        detail: row.text_opt(8)?,
        replica: row.text_opt(9)?,
    })
}

/// An event read with the `EVENT` columns.
pub fn event<R: Columns>(row: &R) -> Result<Event, R::Error> {
    Ok(Event {
        id: u64::try_from(row.integer(0)?).unwrap_or_default(),
        kind: row.parsed::<NameText<_>>(1)?,
        server: row.text(2)?,
        session: row.text(3)?,
        call: row.text_opt(4)?,
        owner: row.text_opt(5)?,
        data: row.text(6)?,
        at: Timestamp::from_millis(row.integer(7)?),
    })
}

/// An event of the audit trail read with the `EVENT` columns, then its link's `prev` and `hash`.
pub fn entry<R: Columns>(row: &R) -> Result<Entry, R::Error> {
    let event = event(row)?;
    let link = Link {
        id: event.id,
        prev: row.text(EVENT_COLUMNS)?,
        hash: row.text(EVENT_COLUMNS + 1)?,
    };
    Ok(Entry::linked(&event, link))
}

/// A link of the audit chain read as `seq, prev, hash`.
pub fn link<R: Columns>(row: &R) -> Result<Link, R::Error> {
    Ok(Link {
        id: u64::try_from(row.integer(0)?).unwrap_or_default(),
        prev: row.text(1)?,
        hash: row.text(2)?,
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

/// A Request's `decisions` as JSON text, or NULL for none.
pub fn decisions_json(decisions: &[crate::records::Signoff]) -> Option<String> {
    (!decisions.is_empty()).then(|| to_json(&decisions))
}

/// The `inputResponses` of a round, from each of its Requests' `input_key`, status and stored `result`: what
/// a Request that ended without one gets is `cancel`. `None` while one of them is pending.
pub fn input_responses(
    requests: impl IntoIterator<Item = (String, String, Option<String>)>,
) -> Option<serde_json::Map<String, serde_json::Value>> {
    let mut responses = serde_json::Map::new();
    for (key, status, result) in requests {
        if status == Status::Pending.as_str() {
            return None;
        }
        let result = result
            .and_then(|text| serde_json::from_str(&text).ok())
            .unwrap_or_else(|| serde_json::json!({"action": "cancel"}));
        responses.insert(key, result);
    }
    Some(responses)
}
