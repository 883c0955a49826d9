//! Standing grants: an approver's "stop asking me for this". A grant given with an approval lets later calls of
//! the same principal, server and tool (and, as it says, the same arguments) run without asking, until its time
//! is up, its session ends, or someone revokes it.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::approvals;
use crate::auth::{Principal, Role};
use crate::ids::{CallId, GrantId, RequestId, SessionId};
use crate::records::CallView;
use crate::store::{Store, StoreError};
use crate::time::Timestamp;

/// The most grants `GET /grants` lists.
pub const MAX_LISTED: usize = 1000;

/// The `for` of a grant that lasts as long as the session of the call it was given on.
pub const SESSION: &str = "session";

/// How long a grant lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lasting {
    /// Until the session of the call it was given on ends.
    Session,
    /// This long after it was given.
    For(Duration),
}

impl Lasting {
    /// Parses `"session"` or a duration (`"1h"`, `"8h"`) longer than zero.
    pub fn parse(text: &str) -> Result<Self, String> {
        if text == SESSION {
            return Ok(Lasting::Session);
        }
        match humantime::parse_duration(text) {
            Ok(duration) if !duration.is_zero() => Ok(Lasting::For(duration)),
            _ => Err(format!(
                "{text:?} is neither \"session\" nor a duration longer than zero such as \"1h\""
            )),
        }
    }
}

impl Serialize for Lasting {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Lasting::Session => serializer.serialize_str(SESSION),
            Lasting::For(duration) => serializer.serialize_str(&humantime::format_duration(*duration).to_string()),
        }
    }
}

impl<'de> Deserialize<'de> for Lasting {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Lasting::parse(&String::deserialize(deserializer)?).map_err(serde::de::Error::custom)
    }
}

/// Which later calls a grant covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Scope {
    /// Calls whose arguments have the digest of those approved.
    SameArguments,
    /// Every call of the tool.
    Tool,
}

impl Scope {
    /// The scope as the API spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::SameArguments => "same-arguments",
            Scope::Tool => "tool",
        }
    }

    /// The scope the API spells `name`.
    pub fn parse(name: &str) -> Option<Self> {
        [Scope::SameArguments, Scope::Tool]
            .into_iter()
            .find(|scope| scope.as_str() == name)
    }
}

/// The grant an approver asks for with an approval: `{"for": "1h", "match": "tool"}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Terms {
    /// `"session"`, or how long (`"1h"`); one of those the approval's policy lists under `grants`.
    #[serde(rename = "for")]
    #[schema(value_type = String)]
    pub lasting: Lasting,
    /// `same-arguments` or `tool`.
    #[serde(rename = "match")]
    pub scope: Scope,
}

/// A grant to be given: what it covers, and who gave it with which approval.
#[derive(Debug, Clone, PartialEq)]
pub struct NewGrant {
    pub id: GrantId,
    /// The principal whose calls it covers.
    pub owner: String,
    pub server: String,
    pub tool: String,
    pub scope: Scope,
    /// The digest of the arguments approved, which a `same-arguments` grant matches.
    pub digest: String,
    pub lasting: Lasting,
    /// The session of the call it was given on, which a `session` grant lasts as long as.
    pub session: SessionId,
    /// Who gave it.
    pub by: String,
    /// The approval it was given with (one grant at most per approval).
    pub request: RequestId,
}

/// A grant as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct GrantView {
    #[schema(value_type = String)]
    pub id: GrantId,
    /// The principal whose calls it covers.
    pub owner: String,
    pub server: String,
    pub tool: String,
    #[serde(rename = "match")]
    pub scope: Scope,
    /// The digest of the arguments approved; a `same-arguments` grant covers only calls with these.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// `"session"` or how long it lasts.
    #[serde(rename = "for")]
    #[schema(value_type = String)]
    pub lasting: Lasting,
    /// The session a `session` grant lasts as long as.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub session: Option<SessionId>,
    /// When a grant for a time ends.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<Timestamp>,
    /// Who gave it.
    pub by: String,
    /// The approval it was given with.
    #[schema(value_type = String)]
    pub request: RequestId,
    pub created_at: Timestamp,
    /// How many calls ran under it.
    pub uses: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<Timestamp>,
    /// Who revoked it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revoked_by: Option<String>,
}

impl NewGrant {
    /// The grant as given at `now`.
    pub fn view(&self, now: Timestamp) -> GrantView {
        let (session, expires_at) = match self.lasting {
            Lasting::Session => (Some(self.session.clone()), None),
            Lasting::For(duration) => (None, Some(now.after(duration))),
        };
        GrantView {
            id: self.id.clone(),
            owner: self.owner.clone(),
            server: self.server.clone(),
            tool: self.tool.clone(),
            scope: self.scope,
            digest: (self.scope == Scope::SameArguments).then(|| self.digest.clone()),
            lasting: self.lasting,
            session,
            expires_at,
            by: self.by.clone(),
            request: self.request.clone(),
            created_at: now,
            uses: 0,
            revoked_at: None,
            revoked_by: None,
        }
    }
}

/// A call that a grant may cover.
#[derive(Debug, Clone, Copy)]
pub struct Asked<'a> {
    pub owner: &'a str,
    pub server: &'a str,
    pub tool: &'a str,
    /// The digest of its arguments.
    pub digest: &'a str,
    pub session: &'a SessionId,
}

impl GrantView {
    /// Whether it still holds at `now`: not revoked, and its time not up. (A `session` grant's session is the
    /// store's to look up.)
    pub fn live(&self, now: Timestamp) -> bool {
        self.revoked_at.is_none() && self.expires_at.is_none_or(|end| now < end)
    }

    /// Whether it covers `call` at `now`: the same principal, server and tool, the same arguments where it says
    /// so, the same session where it lasts as long as one.
    pub fn covers(&self, call: &Asked<'_>, now: Timestamp) -> bool {
        self.live(now)
            && self.owner == call.owner
            && self.server == call.server
            && self.tool == call.tool
            && self.digest.as_deref().is_none_or(|digest| digest == call.digest)
            && self.session.as_ref().is_none_or(|session| session == call.session)
    }
}

/// The standing grants kept in the store, and who may see and revoke them; cheap to clone.
#[derive(Debug, Clone)]
pub struct Grants {
    store: Store,
}

/// Why a grant was not revoked.
#[derive(Debug, thiserror::Error)]
pub enum RevokeError {
    /// No grant has the id, or none the principal may see (an agent sees its own).
    #[error("no grant with id {0}")]
    NotFound(GrantId),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Grants {
    /// The grants kept in `store`.
    pub fn new(store: Store) -> Self {
        Self { store }
    }

    /// Gives the grant an approval's answer asked for (once, whoever acts on the approval).
    pub async fn give(&self, grant: NewGrant) -> Result<GrantView, StoreError> {
        self.store.give_grant(grant).await
    }

    /// Uses the grant that covers `call`, if one does: the call then runs without asking, and the use is an
    /// event.
    pub async fn use_for(&self, call: &CallView) -> Result<Option<GrantView>, StoreError> {
        let digest = approvals::digest(&call.arguments.to_value());
        self.store.use_grant(call, &digest).await
    }

    /// The grants that hold now, as `by` may see them: all of them for approvers and admins, an agent's own for
    /// an agent.
    pub async fn list(&self, by: &Principal) -> Result<Vec<GrantView>, StoreError> {
        let owner = (by.role == Role::Agent).then_some(by.id.as_str());
        self.store.grants(owner, MAX_LISTED).await
    }

    /// Revokes grant `id` at once, as `by`: an approver or admin any grant, an agent its own. A grant revoked or
    /// ended already is returned as it is.
    pub async fn revoke(&self, id: &GrantId, by: &Principal) -> Result<GrantView, RevokeError> {
        let found = self
            .store
            .grant(id)
            .await?
            .filter(|grant| by.may_see(Some(&grant.owner)))
            .ok_or_else(|| RevokeError::NotFound(id.clone()))?;
        Ok(self.store.revoke_grant(id, &by.name).await?.unwrap_or(found))
    }
}

/// A use of a grant: the `data` of a `grant.used` event.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct GrantUse<'a> {
    pub grant: &'a GrantView,
    /// The call that ran under it.
    #[schema(value_type = String)]
    pub call: &'a CallId,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn given(scope: Scope, lasting: Lasting) -> GrantView {
        NewGrant {
            id: GrantId::stored("grt-1"),
            owner: "ci".into(),
            server: "demo".into(),
            tool: "echo".into(),
            scope,
            digest: "d1".into(),
            lasting,
            session: SessionId::stored("ses-1"),
            by: "lead".into(),
            request: RequestId::stored("apv-1"),
        }
        .view(Timestamp::from_millis(1_000))
    }

    #[test]
    fn terms_read_as_the_api_writes_them() {
        let terms: Terms = serde_json::from_value(json!({"for": "1h", "match": "same-arguments"})).unwrap();
        assert_eq!(terms.lasting, Lasting::For(Duration::from_secs(3600)));
        assert_eq!(terms.scope, Scope::SameArguments);
        assert_eq!(
            serde_json::to_value(terms).unwrap(),
            json!({"for": "1h", "match": "same-arguments"})
        );
        for bad in [
            json!({"for": "0s", "match": "tool"}),
            json!({"for": "forever", "match": "tool"}),
            json!({"for": "session", "match": "any"}),
            json!({"for": "session"}),
            json!({"for": "session", "match": "tool", "extra": 1}),
        ] {
            assert!(serde_json::from_value::<Terms>(bad.clone()).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_grant_covers_the_same_principal_server_tool_and_what_it_says() {
        let asked = |owner, tool, digest, session: &'static str| {
            let session: &'static SessionId = Box::leak(Box::new(SessionId::stored(session)));
            Asked {
                owner,
                server: "demo",
                tool,
                digest,
                session,
            }
        };
        let now = Timestamp::from_millis(2_000);
        let same = given(Scope::SameArguments, Lasting::For(Duration::from_secs(60)));
        assert!(same.covers(&asked("ci", "echo", "d1", "ses-2"), now));
        assert!(
            !same.covers(&asked("ci", "echo", "d2", "ses-1"), now),
            "other arguments"
        );
        assert!(
            !same.covers(&asked("bot", "echo", "d1", "ses-1"), now),
            "another principal"
        );
        assert!(!same.covers(&asked("ci", "echoes", "d1", "ses-1"), now), "another tool");
        assert!(
            !same.covers(&asked("ci", "echo", "d1", "ses-1"), Timestamp::from_millis(61_000)),
            "its time is up"
        );
        let session = given(Scope::Tool, Lasting::Session);
        assert!(session.covers(&asked("ci", "echo", "d9", "ses-1"), now));
        assert!(
            !session.covers(&asked("ci", "echo", "d9", "ses-2"), now),
            "another session"
        );
        let revoked = GrantView {
            revoked_at: Some(now),
            ..session
        };
        assert!(!revoked.covers(&asked("ci", "echo", "d9", "ses-1"), now));
    }
}
