//! A Call as the REST API shows it, where it is in its life, and how it ends.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::ids::{CallId, GrantId, RequestId, SessionId};
use crate::time::Timestamp;

/// Where a Call is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CallStatus {
    /// The upstream is working on it.
    Running,
    /// It waits on at least one pending Request.
    InputRequired,
    /// The upstream returned a `CallToolResult` (a tool-level `isError` included).
    Completed,
    /// The transport, the protocol or the upstream failed it.
    Failed,
    /// A client or the gateway cancelled it.
    Cancelled,
}

impl CallStatus {
    /// The status of a call that has not ended: `input_required` while one of its Requests is pending
    /// (`waiting`), `running` otherwise. Every store keeps its calls by this rule.
    pub fn unended(waiting: bool) -> Self {
        if waiting {
            CallStatus::InputRequired
        } else {
            CallStatus::Running
        }
    }

    /// Whether the call has ended.
    pub fn is_final(self) -> bool {
        matches!(self, CallStatus::Completed | CallStatus::Failed | CallStatus::Cancelled)
    }

    /// The status as the API spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            CallStatus::Running => "running",
            CallStatus::InputRequired => "input_required",
            CallStatus::Completed => "completed",
            CallStatus::Failed => "failed",
            CallStatus::Cancelled => "cancelled",
        }
    }

    /// The status the API spells `name`.
    pub fn parse(name: &str) -> Option<Self> {
        [
            CallStatus::Running,
            CallStatus::InputRequired,
            CallStatus::Completed,
            CallStatus::Failed,
            CallStatus::Cancelled,
        ]
        .into_iter()
        .find(|status| status.as_str() == name)
    }
}

/// A tool's name as MCP allows it: 1 to 128 of `A-Z a-z 0-9 _ - .`. Nothing else reaches an upstream or a
/// log line.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct ToolName(String);

impl ToolName {
    /// The longest name MCP allows.
    pub const MAX_LEN: usize = 128;

    /// The name, if it keeps to the rule.
    pub fn parse(name: String) -> Result<Self, String> {
        let allowed = |c: char| c.is_ascii_alphanumeric() || "_-.".contains(c);
        if (1..=Self::MAX_LEN).contains(&name.len()) && name.chars().all(allowed) {
            Ok(Self(name))
        } else {
            Err(format!(
                "`tool` must be 1 to {} characters of A-Z, a-z, 0-9, '_', '-' and '.' (the MCP rule for tool names)",
                Self::MAX_LEN
            ))
        }
    }

    /// The name as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for ToolName {
    type Error = String;

    fn try_from(name: String) -> Result<Self, Self::Error> {
        Self::parse(name)
    }
}

impl From<ToolName> for String {
    fn from(name: ToolName) -> Self {
        name.0
    }
}

/// Why a call failed, where a program may want to act on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CallFailure {
    /// The upstream refused the `requestState` the gateway echoed after a round of answers (it restarted
    /// with a new key, or the state outlived its lifetime): start the call again.
    StateRejected,
    /// The gateway restarted while the upstream worked on the call, so its result was lost.
    GatewayRestarted,
    /// The replica that held the call's session is gone (its heartbeat stopped), and its result with it.
    ReplicaGone,
    /// The approval the call needed was answered no (`declined` or `cancelled`); it was never forwarded.
    Declined,
    /// The approval the call needed expired unanswered; it was never forwarded.
    Expired,
    /// The gateway (or the replica holding the call) stopped after the approved call was handed to its
    /// session and before anything showed the upstream had it: it may not have been sent, and a 2025-11-25
    /// call is not sent twice.
    MaybeNotSent,
    /// The upstream no longer knows the task it made of the call: the task passed its time to live, or the
    /// server forgot it (it restarted).
    TaskLost,
}

impl CallFailure {
    /// The reason as the API spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            CallFailure::StateRejected => "state_rejected",
            CallFailure::GatewayRestarted => "gateway_restarted",
            CallFailure::ReplicaGone => "replica_gone",
            CallFailure::Declined => "declined",
            CallFailure::Expired => "expired",
            CallFailure::MaybeNotSent => "maybe_not_sent",
            CallFailure::TaskLost => "task_lost",
        }
    }

    /// The reason the API spells `name`.
    pub fn parse(name: &str) -> Option<Self> {
        [
            CallFailure::StateRejected,
            CallFailure::GatewayRestarted,
            CallFailure::ReplicaGone,
            CallFailure::Declined,
            CallFailure::Expired,
            CallFailure::MaybeNotSent,
            CallFailure::TaskLost,
        ]
        .into_iter()
        .find(|reason| reason.as_str() == name)
    }
}

/// Why a call failed or was cancelled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct CallError {
    pub message: String,
    /// Set where the failure has a name a program can act on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<CallFailure>,
}

impl CallError {
    /// An error with a message and no named reason.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            reason: None,
        }
    }
}

/// How a Call was started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Via {
    /// `POST /calls`.
    Rest,
    /// A `tools/call` to the gateway's MCP endpoint, `/mcp`.
    Mcp,
}

impl Via {
    /// The name as the API spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Via::Rest => "rest",
            Via::Mcp => "mcp",
        }
    }

    /// The way the API spells `name`; anything unknown reads as REST, which every call before this column was.
    pub fn parse(name: &str) -> Self {
        if name == Via::Mcp.as_str() { Via::Mcp } else { Via::Rest }
    }
}

/// A call's arguments as JSON text, exactly as they are sent upstream: a store keeps many, and parsed they
/// would be a tree of allocations several times the size of the text.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Arguments(Box<RawValue>);

impl Arguments {
    /// The arguments of `map`.
    pub fn of(map: &Map<String, Value>) -> Self {
        Self(serde_json::value::to_raw_value(map).expect("a JSON map serializes"))
    }

    /// No arguments: `{}`.
    pub fn empty() -> Self {
        Self::of(&Map::new())
    }

    /// The arguments as a JSON object.
    pub fn to_map(&self) -> Map<String, Value> {
        serde_json::from_str(self.0.get()).unwrap_or_default()
    }

    /// The arguments as a JSON value.
    pub fn to_value(&self) -> Value {
        Value::Object(self.to_map())
    }

    /// The JSON text.
    pub fn text(&self) -> &str {
        self.0.get()
    }
}

impl PartialEq for Arguments {
    fn eq(&self, other: &Self) -> bool {
        self.text() == other.text()
    }
}

/// A Call as the REST API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CallView {
    #[schema(value_type = String)]
    pub id: CallId,
    pub server: String,
    #[schema(value_type = String)]
    pub session: SessionId,
    pub tool: String,
    #[schema(value_type = Object)]
    pub arguments: Arguments,
    /// The principal that started it.
    pub owner: String,
    /// How it was started.
    pub via: Via,
    pub status: CallStatus,
    #[schema(value_type = Vec<String>)]
    pub requests: Vec<RequestId>,
    /// The MCP `CallToolResult`, once completed. Boxed, as `error` is: a running call (a store may keep many)
    /// keeps no room for either.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub result: Option<Box<Value>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<Box<CallError>>,
    /// The task the upstream made of the call (MCP Tasks), as the gateway last saw it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task: Option<Box<CallTask>>,
    /// Who let a call an approval policy covers go upstream, once someone has.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allowed: Option<Box<Allowed>>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

/// Who let a call an approval policy covers go upstream, and how.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Allowed {
    /// Who approved it (the last of them, when it needed several).
    pub by: String,
    /// The approval Request that allowed it, or that the grant it ran under was given with.
    #[schema(value_type = String)]
    pub request: RequestId,
    /// The standing grant it ran under, without asking.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub grant: Option<GrantId>,
    /// The arguments the call was started with, when the approver changed them: the call's `arguments` are
    /// those it ran with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub edited_from: Option<Arguments>,
}

/// The task an upstream made of a call (the MCP Tasks extension): the gateway follows it to its end.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CallTask {
    /// The task's id at its server.
    pub id: String,
    /// Its status as the server last reported it: `working`, `input_required`, `completed`, `failed` or
    /// `cancelled`.
    pub status: String,
    /// What the server last said of its progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_message: Option<String>,
    /// When the server may forget the task (its `ttlMs` after the gateway learnt of it); none when it keeps
    /// it without limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<Timestamp>,
}

/// How a call ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Finish {
    Completed(Value),
    Failed(CallError),
    Cancelled(String),
}

impl Finish {
    /// A failure with a message and no named reason.
    pub fn failed(message: impl Into<String>) -> Self {
        Finish::Failed(CallError::new(message))
    }

    /// The status a call ends in.
    pub fn status(&self) -> CallStatus {
        match self {
            Finish::Completed(_) => CallStatus::Completed,
            Finish::Failed(_) => CallStatus::Failed,
            Finish::Cancelled(_) => CallStatus::Cancelled,
        }
    }
}

/// Which Calls a listing returns, oldest first.
#[derive(Debug, Clone, Default)]
pub struct CallFilter {
    pub status: Option<CallStatus>,
    pub server: Option<String>,
    pub session: Option<String>,
    /// Only calls started by this principal.
    pub owner: Option<String>,
}

impl CallFilter {
    /// Whether a call is one the filter lets through.
    pub fn matches(&self, view: &CallView) -> bool {
        self.status.is_none_or(|status| status == view.status)
            && self.server.as_ref().is_none_or(|server| *server == view.server)
            && self
                .session
                .as_ref()
                .is_none_or(|session| view.session == session.as_str())
            && self.owner.as_ref().is_none_or(|owner| *owner == view.owner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_and_reason_names_match_the_wire() {
        for status in [
            CallStatus::Running,
            CallStatus::InputRequired,
            CallStatus::Completed,
            CallStatus::Failed,
            CallStatus::Cancelled,
        ] {
            assert_eq!(serde_json::to_value(status).unwrap(), status.as_str());
            assert_eq!(CallStatus::parse(status.as_str()), Some(status));
        }
        for reason in [
            CallFailure::StateRejected,
            CallFailure::GatewayRestarted,
            CallFailure::ReplicaGone,
            CallFailure::Declined,
            CallFailure::Expired,
            CallFailure::MaybeNotSent,
        ] {
            assert_eq!(serde_json::to_value(reason).unwrap(), reason.as_str());
            assert_eq!(CallFailure::parse(reason.as_str()), Some(reason));
        }
    }

    #[test]
    fn tool_names_keep_to_the_mcp_rule() {
        let longest = "x".repeat(ToolName::MAX_LEN);
        for good in ["echo", "a", "get_weather.v2-beta", longest.as_str()] {
            assert_eq!(ToolName::parse(good.to_owned()).unwrap().as_str(), good);
        }
        let too_long = "x".repeat(ToolName::MAX_LEN + 1);
        for bad in ["", "a b", "a/b", "é", "x\n", "x\u{1b}[2K", "x\u{85}", too_long.as_str()] {
            assert!(ToolName::parse(bad.to_owned()).is_err(), "{bad:?} was accepted");
        }
    }
}
