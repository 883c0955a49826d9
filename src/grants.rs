//! Standing grants: an approver's "stop asking me for this". A grant given with an approval lets later calls of
//! the same principal, server and tool (and, as it says, the same arguments) run without asking, until its time
//! is up, its session ends, or someone revokes it.

use crate::approvals;
use crate::auth::{Principal, Role};
use crate::ids::GrantId;
use crate::records::{CallView, GrantView, NewGrant};
use crate::store::{Store, StoreError};
use crate::suspension::Lasting;

/// The most grants `GET /grants` lists.
pub const MAX_LISTED: usize = 1000;

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

    /// Uses the grant that covers `call`, if one does and lasts as one of `offered` (what the call's policy
    /// offers now: a grant it no longer offers is passed over): the call then runs without asking, and the use
    /// is an event.
    pub async fn use_for(&self, call: &CallView, offered: &[Lasting]) -> Result<Option<GrantView>, StoreError> {
        if offered.is_empty() {
            return Ok(None);
        }
        let digest = approvals::digest(&call.arguments.to_value());
        self.store.use_grant(call, &digest, offered).await
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
