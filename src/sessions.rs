//! The Sessions: every MCP client session the gateway holds or held, as records in the store. The live
//! connections behind them are the upstream side's.

use rmcp::model::Implementation;

use crate::ids::SessionId;
use crate::records::{SessionFilter, SessionStatus, SessionView};
use crate::store::{InsertSessionError, NewSession, Store, StoreError};

/// The Sessions; cheap to clone.
#[derive(Debug, Clone)]
pub struct Sessions {
    store: Store,
    /// This gateway's id among the replicas sharing its store.
    replica: String,
}

impl Sessions {
    /// The sessions kept in `store`, opened by replica `replica`.
    pub fn new(store: Store, replica: String) -> Self {
        Self { store, replica }
    }

    /// Records a session that is connecting (a shared one without `owner`), unless its owner already holds
    /// `max_open` open sessions; the count and the record are one change.
    pub async fn starting(
        &self,
        id: SessionId,
        server: &str,
        owner: Option<&str>,
        max_open: usize,
    ) -> Result<SessionView, InsertSessionError> {
        let session = NewSession {
            id,
            replica: self.replica.clone(),
            server: server.to_owned(),
            owner: owner.map(str::to_owned),
        };
        self.store.insert_session(session, max_open).await
    }

    /// Marks a session ready with what its handshake negotiated.
    pub async fn ready(
        &self,
        id: &SessionId,
        protocol_version: Option<String>,
        server_info: Option<Implementation>,
    ) -> Result<Option<SessionView>, StoreError> {
        self.store.session_ready(id, protocol_version, server_info).await
    }

    /// Ends a session that is open; `None` if it had ended already.
    pub async fn end(
        &self,
        id: &SessionId,
        status: SessionStatus,
        detail: &str,
    ) -> Result<Option<SessionView>, StoreError> {
        self.store.end_session(id, status, detail).await
    }

    /// One session by id.
    pub async fn get(&self, id: &SessionId) -> Result<Option<SessionView>, StoreError> {
        self.store.session(id).await
    }

    /// The sessions `filter` keeps, oldest first.
    pub async fn list(&self, filter: SessionFilter) -> Result<Vec<SessionView>, StoreError> {
        self.store.sessions(filter).await
    }
}
