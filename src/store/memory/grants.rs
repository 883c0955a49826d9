//! Standing grants in memory.

use super::*;
use crate::ids::GrantId;
use crate::records::{Asked, GrantView, NewGrant};
use crate::suspension::Lasting;

impl Memory {
    pub async fn give_grant(&self, grant: NewGrant) -> Result<GrantView, StoreError> {
        let mut state = self.lock();
        if let Some(given) = state.grants.iter().find(|given| given.request == grant.request) {
            return Ok(given.clone());
        }
        let view = grant.view(self.shared.clock.now());
        state.grants.push(view.clone());
        let events = vec![Event::grant(EventKind::GrantCreated, &view)];
        self.publish(&mut state, Changes { events });
        Ok(view)
    }

    pub async fn use_grant(
        &self,
        call: &CallView,
        digest: &str,
        offered: &[Lasting],
    ) -> Result<Option<GrantView>, StoreError> {
        let now = self.shared.clock.now();
        let asked = Asked {
            owner: &call.owner,
            server: &call.server,
            tool: &call.tool,
            digest,
            session: &call.session,
        };
        let mut state = self.lock();
        let found = state
            .grants
            .iter_mut()
            .find(|grant| grant.covers(&asked, now) && offered.contains(&grant.lasting));
        let Some(grant) = found else {
            return Ok(None);
        };
        grant.uses += 1;
        let used = grant.clone();
        let events = vec![Event::grant_used(&used, call)];
        self.publish(&mut state, Changes { events });
        Ok(Some(used))
    }

    pub async fn grant(&self, id: &GrantId) -> Result<Option<GrantView>, StoreError> {
        Ok(self.lock().grants.iter().find(|grant| grant.id == *id).cloned())
    }

    pub async fn grants(&self, owner: Option<&str>, limit: usize) -> Result<Vec<GrantView>, StoreError> {
        let now = self.shared.clock.now();
        let state = self.lock();
        let open = |session: &SessionId| state.sessions.get(session).is_some_and(|view| !view.status.is_final());
        Ok(state
            .grants
            .iter()
            .filter(|grant| grant.live(now) && owner.is_none_or(|owner| grant.owner == owner))
            .filter(|grant| grant.session.as_ref().is_none_or(open))
            .take(limit)
            .cloned()
            .collect())
    }

    pub async fn revoke_grant(&self, id: &GrantId, by: &str) -> Result<Option<GrantView>, StoreError> {
        let now = self.shared.clock.now();
        let mut state = self.lock();
        let Some(grant) = state.grants.iter_mut().find(|grant| grant.id == *id && grant.live(now)) else {
            return Ok(None);
        };
        grant.revoked_at = Some(now);
        grant.revoked_by = Some(by.to_owned());
        let revoked = grant.clone();
        let events = vec![Event::grant(EventKind::GrantRevoked, &revoked)];
        self.publish(&mut state, Changes { events });
        Ok(Some(revoked))
    }
}
