//! A Session as the REST API shows it, and where it is in its life.

use rmcp::model::Implementation;
use serde::{Deserialize, Serialize};

use crate::ids::SessionId;
use crate::time::Timestamp;

/// Where a Session is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum SessionStatus {
    /// Connecting and handshaking.
    Starting,
    /// Ready for calls.
    Ready,
    /// Closed by a client or the gateway.
    Closed,
    /// Ended by the upstream or never got ready.
    Failed,
}

/// Which sessions a listing returns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum SessionFilter {
    /// Those starting or ready.
    #[default]
    Open,
    /// Closed and failed ones too.
    All,
}

impl SessionStatus {
    /// The status as the API spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            SessionStatus::Starting => "starting",
            SessionStatus::Ready => "ready",
            SessionStatus::Closed => "closed",
            SessionStatus::Failed => "failed",
        }
    }

    /// The status the API spells `name`.
    pub fn parse(name: &str) -> Option<Self> {
        [
            SessionStatus::Starting,
            SessionStatus::Ready,
            SessionStatus::Closed,
            SessionStatus::Failed,
        ]
        .into_iter()
        .find(|status| status.as_str() == name)
    }

    /// Whether the session has ended.
    pub fn is_final(self) -> bool {
        matches!(self, SessionStatus::Closed | SessionStatus::Failed)
    }
}

/// A Session as the REST API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionView {
    #[schema(value_type = String)]
    pub id: SessionId,
    pub server: String,
    pub shared: bool,
    /// The principal that opened it (absent for a shared session, which the gateway owns).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    pub status: SessionStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protocol_version: Option<String>,
    /// The upstream's `serverInfo` (name, version, …).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub server_info: Option<Implementation>,
    pub created_at: Timestamp,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub closed_at: Option<Timestamp>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// The gateway replica that holds it (absent for sessions recorded before replicas were).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replica: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_names_match_the_wire() {
        for status in [
            SessionStatus::Starting,
            SessionStatus::Ready,
            SessionStatus::Closed,
            SessionStatus::Failed,
        ] {
            assert_eq!(serde_json::to_value(status).unwrap(), status.as_str());
            assert_eq!(SessionStatus::parse(status.as_str()), Some(status));
        }
    }
}
