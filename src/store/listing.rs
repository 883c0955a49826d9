//! The `WHERE` clause of a listing, for both SQL engines: only the filters given are named, so that each can use
//! its index (pending Requests are listed through their own, which the condition must spell out).

use super::rows::REQUEST;
use super::sql::Bind;
use crate::records::{CallFilter, CallStatus, DecisionFilter, Filter, Status};
use crate::suspension::RequestKind;

/// What an engine writes its own way in a listing: its numbered placeholders, and JSON kept as text.
#[derive(Clone, Copy)]
pub enum Dialect {
    /// PostgreSQL: `$1`; JSON text is read as `jsonb`.
    Postgres,
    /// SQLite: `?1`; its JSON operators read JSON text as it is.
    Sqlite,
}

impl Dialect {
    /// `column`, which keeps JSON as text, as the engine's `->` and `->>` take it: both engines then read a
    /// member the same way (`->` gives `true` as the JSON text `'true'`, `->>` a string as SQL text).
    fn json(self, column: &str) -> String {
        match self {
            Dialect::Postgres => format!("{column}::jsonb"),
            Dialect::Sqlite => column.to_owned(),
        }
    }
}

/// A parameter of a listing.
pub enum Param {
    Text(String),
    Integer(i64),
}

/// The conditions of a listing, with their parameters numbered in order, then the `LIMIT`'s.
pub struct Conditions {
    pub sql: String,
    params: Vec<Param>,
    dialect: Dialect,
}

impl Conditions {
    /// The conditions a listing of Requests from `cursor` (a `seq`) on takes.
    pub fn requests(filter: &Filter, cursor: i64, dialect: Dialect) -> Self {
        let mut conditions = Self::all(dialect);
        let cursor = conditions.param(Param::Integer(cursor));
        conditions.fixed(&format!("seq >= {cursor}"));
        match filter.status {
            Some(Status::Pending) => conditions.fixed("status = 'pending'"),
            status => conditions.equal("status", status.map(Status::as_str)),
        }
        conditions.equal("server", filter.server.as_deref());
        conditions.equal("session", filter.session.as_deref());
        conditions.equal("call_id", filter.call.as_deref());
        conditions.equal("kind", filter.kind.as_ref().map(RequestKind::as_str));
        conditions.equal("owner", filter.owner.as_deref());
        conditions.equal("answered_by", filter.answered_by.as_deref());
        if let Some(decision) = filter.decision {
            conditions.decided(decision);
        }
        if let Some(tool) = &filter.tool {
            let tool = conditions.param(Param::Text(tool.clone()));
            conditions.fixed(&format!(
                "EXISTS (SELECT 1 FROM calls AS c WHERE c.id = requests.call_id AND c.tool = {tool})"
            ));
        }
        conditions
    }

    /// The conditions a listing of calls (from `calls AS c`) takes.
    pub fn calls(filter: &CallFilter, dialect: Dialect) -> Self {
        let mut conditions = Self::all(dialect);
        conditions.equal("c.status", filter.status.map(CallStatus::as_str));
        conditions.equal("c.server", filter.server.as_deref());
        conditions.equal("c.session", filter.session.as_deref());
        conditions.equal("c.owner", filter.owner.as_deref());
        conditions
    }

    /// The statement listing the Requests these conditions pick, in order, at most `fetch`: each row is the
    /// Request's `seq`, then its columns.
    pub fn select_requests(&mut self, fetch: i64) -> String {
        let fetch = self.param(Param::Integer(fetch));
        format!(
            "SELECT seq, {REQUEST} FROM requests WHERE {} ORDER BY seq LIMIT {fetch}",
            self.sql
        )
    }

    /// The statement listing the calls these conditions pick, in order, at most `limit`, each read as the
    /// engine's `columns` of `calls AS c`.
    pub fn select_calls(&mut self, columns: &str, limit: i64) -> String {
        let limit = self.param(Param::Integer(limit));
        format!(
            "SELECT {columns} FROM calls AS c WHERE {} ORDER BY c.seq LIMIT {limit}",
            self.sql
        )
    }

    /// The placeholder of one more parameter, to follow the conditions.
    fn param(&mut self, value: Param) -> String {
        self.params.push(value);
        match self.dialect {
            Dialect::Postgres => format!("${}", self.params.len()),
            Dialect::Sqlite => format!("?{}", self.params.len()),
        }
    }

    /// The parameters, in order.
    pub fn bound(&self) -> Vec<&dyn Bind> {
        fn bound(param: &Param) -> &dyn Bind {
            match param {
                Param::Text(text) => text,
                Param::Integer(integer) => integer,
            }
        }
        self.params.iter().map(bound).collect()
    }

    fn all(dialect: Dialect) -> Self {
        Self {
            sql: "1 = 1".to_owned(),
            params: Vec::new(),
            dialect,
        }
    }

    fn fixed(&mut self, condition: &str) {
        self.sql.push_str(" AND ");
        self.sql.push_str(condition);
    }

    /// Only Requests answered with `decision`, as the answer's `ok` and `reason` say (see
    /// [`DecisionFilter::of`]).
    fn decided(&mut self, decision: DecisionFilter) {
        let answer = self.dialect.json("answer");
        let ok = format!("({answer} -> 'ok')");
        let reason = format!("({answer} ->> 'reason')");
        self.fixed("status = 'answered'");
        self.fixed(&match decision {
            DecisionFilter::Accepted => format!("{ok} = 'true'"),
            DecisionFilter::Declined => format!("{ok} = 'false' AND {reason} = 'declined'"),
            DecisionFilter::Cancelled => format!("{ok} = 'false' AND coalesce({reason}, '') <> 'declined'"),
        });
    }

    fn equal(&mut self, column: &str, value: Option<&str>) {
        if let Some(value) = value {
            let placeholder = self.param(Param::Text(value.to_owned()));
            self.fixed(&format!("{column} = {placeholder}"));
        }
    }
}
