//! The Sessions: every MCP client session the gateway holds or held, kept for the retention window once closed.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rmcp::model::Implementation;
use rmcp::{Peer, RoleClient};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::changes::Changes;
use crate::events::{EventKind, Events, Tags};
use crate::retained::Retained;
use crate::time::Timestamp;
use crate::upstream::SessionCore;

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

/// A Session as the REST API shows it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionView {
    pub id: String,
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
}

/// The handles of a ready session that calls use.
#[derive(Debug)]
pub struct Live {
    pub core: Arc<SessionCore>,
    pub peer: Peer<RoleClient>,
    /// Fires when the session ends, for whatever reason.
    pub closed: CancellationToken,
}

/// The store of Sessions; cheap to clone.
#[derive(Debug, Clone)]
pub struct Sessions {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<Retained<Entry>>,
    changes: Changes,
    events: Events,
    retention: Duration,
}

#[derive(Debug)]
struct Entry {
    view: SessionView,
    live: Option<Arc<Live>>,
}

impl Sessions {
    /// Creates an empty store.
    pub fn new(changes: Changes, events: Events, retention: Duration) -> Self {
        Self {
            shared: Arc::new(Shared {
                state: Mutex::default(),
                changes,
                events,
                retention,
            }),
        }
    }

    /// Wakes long-polls and publishes `session.updated`.
    fn changed(&self, view: &SessionView) {
        self.shared.changes.notify();
        let tags = Tags {
            server: &view.server,
            session: &view.id,
            call: None,
            owner: view.owner.as_deref(),
        };
        self.shared.events.publish(EventKind::SessionUpdated, view, tags);
    }

    /// Records a session that is connecting, unless its owner already holds `max_open` open sessions (then
    /// `Err` with how many); the count and the insert happen under one lock.
    pub fn starting(&self, id: &str, server: &str, owner: Option<&str>, max_open: usize) -> Result<(), usize> {
        let view = SessionView {
            id: id.to_owned(),
            server: server.to_owned(),
            shared: owner.is_none(),
            owner: owner.map(str::to_owned),
            status: SessionStatus::Starting,
            protocol_version: None,
            server_info: None,
            created_at: Timestamp::now(),
            closed_at: None,
            detail: None,
        };
        {
            let mut state = self.lock();
            state.purge(Instant::now());
            let open = state.live().filter(|entry| entry.view.owner == view.owner).count();
            if open >= max_open {
                return Err(open);
            }
            state.insert(
                id,
                Entry {
                    view: view.clone(),
                    live: None,
                },
            );
        }
        self.changed(&view);
        Ok(())
    }

    /// Marks a session ready with what its handshake negotiated.
    pub fn ready(
        &self,
        id: &str,
        live: Arc<Live>,
        protocol_version: Option<String>,
        server_info: Option<Implementation>,
    ) -> Option<SessionView> {
        let view = {
            let mut state = self.lock();
            let entry = state.get_mut(id)?;
            entry.view.status = SessionStatus::Ready;
            entry.view.protocol_version = protocol_version;
            entry.view.server_info = server_info;
            entry.live = Some(live);
            entry.view.clone()
        };
        self.changed(&view);
        Some(view)
    }

    /// Ends a session; returns its live handles if it was still open.
    pub fn end(&self, id: &str, status: SessionStatus, detail: &str) -> Option<Arc<Live>> {
        let (live, view) = {
            let mut state = self.lock();
            let entry = state.get_mut(id)?;
            if matches!(entry.view.status, SessionStatus::Closed | SessionStatus::Failed) {
                return None;
            }
            entry.view.status = status;
            entry.view.closed_at = Some(Timestamp::now());
            entry.view.detail = Some(detail.to_owned());
            let found = (entry.live.take(), entry.view.clone());
            state.retire(id, Instant::now() + self.shared.retention);
            found
        };
        if let Some(live) = &live {
            live.closed.cancel();
        }
        self.changed(&view);
        live
    }

    /// One session by id.
    pub fn get(&self, id: &str) -> Option<SessionView> {
        self.lock().get(id).map(|entry| entry.view.clone())
    }

    /// The live handles of a ready session.
    pub fn live(&self, id: &str) -> Option<Arc<Live>> {
        self.lock().get(id).and_then(|entry| entry.live.clone())
    }

    /// Sessions oldest first; closed and failed ones only with `all`.
    pub fn list(&self, all: bool) -> Vec<SessionView> {
        let state = self.lock();
        if all {
            state.values().map(|entry| entry.view.clone()).collect()
        } else {
            state.live().map(|entry| entry.view.clone()).collect()
        }
    }

    /// The ids of every session that is still open.
    pub fn open_ids(&self) -> Vec<String> {
        self.list(false).into_iter().map(|view| view.id).collect()
    }

    fn lock(&self) -> MutexGuard<'_, Retained<Entry>> {
        self.shared
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_owner_holds_at_most_the_cap_of_open_sessions() {
        let sessions = Sessions::new(Changes::default(), Events::default(), Duration::from_secs(60));
        assert_eq!(sessions.starting("s1", "demo", Some("ada"), 2), Ok(()));
        assert_eq!(sessions.starting("s2", "demo", Some("ada"), 2), Ok(()));
        assert_eq!(sessions.starting("s3", "demo", Some("ada"), 2), Err(2));
        assert_eq!(sessions.starting("s4", "demo", Some("bob"), 2), Ok(()));
        assert_eq!(sessions.starting("s5", "demo", None, usize::MAX), Ok(()));
        sessions.end("s1", SessionStatus::Closed, "done");
        assert_eq!(sessions.starting("s6", "demo", Some("ada"), 2), Ok(()));
        assert_eq!(sessions.list(false).len(), 4);
    }
}
