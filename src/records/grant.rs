//! A standing grant as the store keeps it and the API shows it, and which later calls it covers.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::ids::{CallId, GrantId, RequestId, SessionId};
use crate::suspension::{Lasting, Scope};
use crate::time::Timestamp;

/// The longest a `session` grant lasts: a shared session may stay open for weeks.
pub const SESSION_GRANT_LIMIT: Duration = Duration::from_secs(24 * 60 * 60);

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
    /// When it ends: its time, or for a `session` grant a day after it was given if its session is still open.
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
            Lasting::Session => (Some(self.session.clone()), now.after(SESSION_GRANT_LIMIT)),
            Lasting::For(duration) => (None, now.after(duration)),
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
            expires_at: Some(expires_at),
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
    use crate::suspension::Terms;

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
