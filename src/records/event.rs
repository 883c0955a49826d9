//! An event: one change to a Request, Call or Session, numbered in the order the changes were made.

use serde::{Deserialize, Serialize};

use super::{CallStatus, CallView, RequestView, SessionView};
use crate::ids::{CallId, SessionId};
use crate::records::{GrantUse, GrantView};
use crate::time::Timestamp;

/// What an event reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventKind {
    #[serde(rename = "request.created")]
    RequestCreated,
    #[serde(rename = "request.resolved")]
    RequestResolved,
    /// A Request changed without being resolved: the upstream reported a URL-mode elicitation complete, or a
    /// resolved one learnt why its call ended.
    #[serde(rename = "request.updated")]
    RequestUpdated,
    #[serde(rename = "call.updated")]
    CallUpdated,
    #[serde(rename = "session.updated")]
    SessionUpdated,
    /// An approver gave a standing grant with an approval.
    #[serde(rename = "grant.created")]
    GrantCreated,
    /// A call ran under a grant, without asking.
    #[serde(rename = "grant.used")]
    GrantUsed,
    #[serde(rename = "grant.revoked")]
    GrantRevoked,
}

impl EventKind {
    /// Every kind.
    pub const ALL: [EventKind; 8] = [
        EventKind::RequestCreated,
        EventKind::RequestResolved,
        EventKind::RequestUpdated,
        EventKind::CallUpdated,
        EventKind::SessionUpdated,
        EventKind::GrantCreated,
        EventKind::GrantUsed,
        EventKind::GrantRevoked,
    ];

    /// The SSE `event:` name.
    pub fn name(self) -> &'static str {
        match self {
            EventKind::RequestCreated => "request.created",
            EventKind::RequestResolved => "request.resolved",
            EventKind::RequestUpdated => "request.updated",
            EventKind::CallUpdated => "call.updated",
            EventKind::SessionUpdated => "session.updated",
            EventKind::GrantCreated => "grant.created",
            EventKind::GrantUsed => "grant.used",
            EventKind::GrantRevoked => "grant.revoked",
        }
    }

    /// The kind named `name`.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.name() == name)
    }
}

/// One event: its number, kind, the full JSON object, and the tags `GET /events` filters on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Its place in the order of every event; set when it is recorded.
    pub id: u64,
    /// When it was recorded, by the store's clock; set then.
    pub at: Timestamp,
    pub kind: EventKind,
    pub data: String,
    pub server: String,
    pub session: String,
    pub call: Option<String>,
    /// The principal that owns the object (`None`: the gateway, as for a shared session).
    pub owner: Option<String>,
}

/// Where an event comes from, for filtering.
#[derive(Debug, Clone, Copy)]
pub struct Tags<'a> {
    pub server: &'a str,
    pub session: &'a str,
    pub call: Option<&'a str>,
    pub owner: Option<&'a str>,
}

impl Event {
    /// The event with its tags and without its data (`has_data` is then false).
    pub fn without_data(&self) -> Self {
        Self {
            id: self.id,
            at: self.at,
            kind: self.kind,
            data: String::new(),
            server: self.server.clone(),
            session: self.session.clone(),
            call: self.call.clone(),
            owner: self.owner.clone(),
        }
    }

    /// Whether the event's tags pass the filters given (`None` lets any value through).
    pub fn tagged(&self, server: Option<&str>, session: Option<&str>, call: Option<&str>, owner: Option<&str>) -> bool {
        server.is_none_or(|server| server == self.server)
            && session.is_none_or(|session| session == self.session)
            && call.is_none_or(|call| Some(call) == self.call.as_deref())
            && owner.is_none_or(|owner| Some(owner) == self.owner.as_deref())
    }

    /// The status of the call a `call.updated` event carries, read from its data.
    pub fn call_status(&self) -> Option<CallStatus> {
        #[derive(Deserialize)]
        struct Status {
            status: CallStatus,
        }
        if self.kind != EventKind::CallUpdated {
            return None;
        }
        serde_json::from_str::<Status>(&self.data)
            .ok()
            .map(|found| found.status)
    }

    /// Whether the event carries its data (only one taken off the live channel may not).
    pub fn has_data(&self) -> bool {
        !self.data.is_empty()
    }

    /// An event about `object`, not yet numbered nor stamped.
    pub fn new(kind: EventKind, object: &impl Serialize, tags: Tags<'_>) -> Self {
        Self {
            id: 0,
            at: Timestamp::from_millis(0),
            kind,
            data: serde_json::to_string(object).unwrap_or_default(),
            server: tags.server.to_owned(),
            session: tags.session.to_owned(),
            call: tags.call.map(str::to_owned),
            owner: tags.owner.map(str::to_owned),
        }
    }

    /// An event about a Request; one posted to `POST /requests` is tagged with an empty server and session.
    pub fn request(kind: EventKind, view: &RequestView) -> Self {
        let tags = Tags {
            server: view.server.as_deref().unwrap_or_default(),
            session: view.session.as_ref().map(SessionId::as_str).unwrap_or_default(),
            call: view.call.as_ref().map(CallId::as_str),
            owner: view.owner.as_deref(),
        };
        Self::new(kind, view, tags)
    }

    /// A `call.updated` event.
    pub fn call(view: &CallView) -> Self {
        let tags = Tags {
            server: &view.server,
            session: view.session.as_str(),
            call: Some(view.id.as_str()),
            owner: Some(&view.owner),
        };
        Self::new(EventKind::CallUpdated, view, tags)
    }

    /// A `session.updated` event.
    pub fn session(view: &SessionView) -> Self {
        let tags = Tags {
            server: &view.server,
            session: view.id.as_str(),
            call: None,
            owner: view.owner.as_deref(),
        };
        Self::new(EventKind::SessionUpdated, view, tags)
    }

    /// A `grant.created` or `grant.revoked` event, owned by the principal whose calls the grant covers.
    pub fn grant(kind: EventKind, view: &GrantView) -> Self {
        let tags = Tags {
            server: &view.server,
            session: view.session.as_ref().map(SessionId::as_str).unwrap_or_default(),
            call: None,
            owner: Some(&view.owner),
        };
        Self::new(kind, view, tags)
    }

    /// A `grant.used` event: `call` ran under the grant, as it is after the use.
    pub fn grant_used(grant: &GrantView, call: &CallView) -> Self {
        let tags = Tags {
            server: &call.server,
            session: call.session.as_str(),
            call: Some(call.id.as_str()),
            owner: Some(&call.owner),
        };
        Self::new(EventKind::GrantUsed, &GrantUse { grant, call: &call.id }, tags)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_names_match_the_wire() {
        for kind in EventKind::ALL {
            assert_eq!(serde_json::to_value(kind).unwrap(), kind.name());
            assert_eq!(EventKind::parse(kind.name()), Some(kind));
        }
    }

    #[test]
    fn a_call_updated_event_carries_its_calls_status() {
        let tags = Tags {
            server: "demo",
            session: "ses-1",
            call: Some("call-1"),
            owner: None,
        };
        let object = serde_json::json!({"id": "call-1", "status": "input_required"});
        let updated = Event::new(EventKind::CallUpdated, &object, tags);
        assert_eq!(updated.call_status(), Some(CallStatus::InputRequired));
        assert_eq!(updated.without_data().call_status(), None);
        let request = Event::new(EventKind::RequestCreated, &object, tags);
        assert_eq!(request.call_status(), None);
    }
}
