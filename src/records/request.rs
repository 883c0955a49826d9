//! A Request as the REST API shows it, and where it is in its life.

use rmcp::model::ElicitResult;
use serde::{Deserialize, Serialize};

use super::{Event, EventKind};
use crate::ids::{CallId, SessionId};
use crate::suspension::{Answer, Reason, Request, RequestKind};
use crate::time::Timestamp;

/// Where a Request is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Waiting for an Answer.
    Pending,
    /// Resolved by an Answer (accept, decline or cancel).
    Answered,
    /// Nobody answered in time; the upstream got `cancel`.
    Expired,
    /// Withdrawn by the upstream, or ended with its session or call.
    Cancelled,
}

impl Status {
    /// The status as the API spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Answered => "answered",
            Status::Expired => "expired",
            Status::Cancelled => "cancelled",
        }
    }

    /// The status the API spells `name`.
    pub fn parse(name: &str) -> Option<Self> {
        [Status::Pending, Status::Answered, Status::Expired, Status::Cancelled]
            .into_iter()
            .find(|status| status.as_str() == name)
    }
}

/// Who gave an answer: the name `answeredBy` shows, how they signed in, and for an OpenID principal the
/// provider and subject behind that name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Answerer {
    pub name: String,
    /// `token` (a configured token, or everyone without tokens), `oidc` (an OpenID provider's JWT) or `link` (a
    /// signed answer link).
    pub via: String,
    /// The OpenID provider that signed them in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuer: Option<String>,
    /// Their `sub` at that provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
}

/// One person's decision on an approval that needs several (its policy's `quorum`), as `decisions` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Signoff {
    /// Who decided, by the name `answeredBy` shows.
    pub by: String,
    /// Their stable identity (a token's name, or an OpenID issuer and subject): one person counts once.
    pub principal: String,
    pub at: Timestamp,
    /// Whether they approved.
    pub ok: bool,
}

/// A Request as the REST API shows it: the §10 shape plus the gateway's fields.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RequestView {
    #[serde(flatten)]
    pub request: Request,
    pub status: Status,
    /// The server that raised it; absent for a Request posted to `POST /requests`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
    /// The session it arrived on; absent for a posted Request.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub session: Option<SessionId>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub call: Option<CallId>,
    /// The principal that owns the Request's call or session (absent for a shared session's unattributed one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    pub created_at: Timestamp,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resolved_at: Option<Timestamp>,
    /// Boxed, as `result` is: both are set only once the Request is resolved, and a pending one (a store may
    /// keep many) keeps no room for them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answer: Option<Box<Answer>>,
    /// The principal whose answer resolved it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answered_by: Option<String>,
    /// Who that was: how they signed in and, for an OpenID principal, its provider and subject.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answerer: Option<Box<Answerer>>,
    /// The MCP `ElicitResult` sent upstream.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub result: Option<Box<ElicitResult>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<Timestamp>,
    /// An approval that needs several people: each one's decision so far, in order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub decisions: Vec<Signoff>,
}

impl RequestView {
    /// Whether it was posted to `POST /requests` rather than raised by an upstream: no upstream waits on it.
    pub fn is_posted(&self) -> bool {
        self.server.is_none()
    }
}

/// What the answer that resolved a Request said, as a listing picks it (`GET /requests?decision=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum DecisionFilter {
    /// `ok: true`: accepted, or for an approval, approved.
    Accepted,
    /// `ok: false` with the reason `declined`.
    Declined,
    /// `ok: false` for any other reason or none: dismissed without choosing.
    Cancelled,
}

impl DecisionFilter {
    /// The decision an answer gave.
    pub fn of(answer: &Answer) -> Self {
        match (answer.ok(), answer.reason()) {
            (true, _) => Self::Accepted,
            (false, Some(Reason::Declined)) => Self::Declined,
            (false, _) => Self::Cancelled,
        }
    }
}

/// Which Requests a listing returns, oldest first.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// `None` means every status.
    pub status: Option<Status>,
    pub server: Option<String>,
    pub session: Option<String>,
    pub call: Option<String>,
    pub kind: Option<RequestKind>,
    /// Only Requests owned by this principal.
    pub owner: Option<String>,
    /// Only Requests answered by this name (`answeredBy`).
    pub answered_by: Option<String>,
    /// Only Requests answered (status `answered`) with this decision.
    pub decision: Option<DecisionFilter>,
    /// Only Requests raised by a call of this tool: its approval, and what the tool asked while it ran. A
    /// Request of no call (posted, or unattributed on a shared session) has no tool.
    pub tool: Option<String>,
}

impl Filter {
    /// Whether a Request, raised by a call of `tool` (if any), is one the filter lets through.
    pub fn matches(&self, view: &RequestView, tool: Option<&str>) -> bool {
        self.status.is_none_or(|status| status == view.status)
            && self
                .server
                .as_ref()
                .is_none_or(|server| Some(server) == view.server.as_ref())
            && self
                .session
                .as_ref()
                .is_none_or(|session| view.session.as_ref().is_some_and(|id| id == session.as_str()))
            && self
                .call
                .as_ref()
                .is_none_or(|call| view.call.as_ref().is_some_and(|id| id == call.as_str()))
            && self.kind.as_ref().is_none_or(|kind| *kind == view.request.kind)
            && self
                .owner
                .as_ref()
                .is_none_or(|owner| Some(owner) == view.owner.as_ref())
            && self
                .answered_by
                .as_ref()
                .is_none_or(|name| Some(name) == view.answered_by.as_ref())
            && self.decision.is_none_or(|decision| {
                view.status == Status::Answered && view.answer.as_deref().map(DecisionFilter::of) == Some(decision)
            })
            && self.tool.as_deref().is_none_or(|wanted| Some(wanted) == tool)
    }

    /// Whether an event may change what the filter lets through: an event about a Request it may let
    /// through (its status, kind, answerer, decision and tool are not among an event's tags, so those are not
    /// looked at).
    pub fn may_concern(&self, event: &Event) -> bool {
        let about_a_request = match event.kind {
            EventKind::RequestCreated => self.status.is_none_or(|status| status == Status::Pending),
            EventKind::RequestResolved | EventKind::RequestUpdated => true,
            EventKind::CallUpdated
            | EventKind::SessionUpdated
            | EventKind::GrantCreated
            | EventKind::GrantUsed
            | EventKind::GrantRevoked => false,
        };
        about_a_request
            && event.tagged(
                self.server.as_deref(),
                self.session.as_deref(),
                self.call.as_deref(),
                self.owner.as_deref(),
            )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_names_match_the_wire() {
        for status in [Status::Pending, Status::Answered, Status::Expired, Status::Cancelled] {
            assert_eq!(serde_json::to_value(status).unwrap(), status.as_str());
            assert_eq!(Status::parse(status.as_str()), Some(status));
        }
    }
}
