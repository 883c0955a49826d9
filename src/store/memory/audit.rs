//! The audit chain in memory: the links of the events kept for replay, appended under the store's lock.

use std::sync::Arc;

use super::Memory;
use crate::audit::{Entry, Link};
use crate::records::Event;
use crate::store::StoreError;

impl Memory {
    pub async fn chain_head(&self) -> Result<Option<Link>, StoreError> {
        Ok(self.lock().chain.back().cloned())
    }

    pub async fn extend_chain(&self, after: Option<u64>, links: Vec<Link>) -> Result<bool, StoreError> {
        let mut state = self.lock();
        if state.chain.back().map(|link| link.id) != after {
            return Ok(false);
        }
        // Links of events forgotten meanwhile are not kept.
        let oldest = state.events.front().map_or(u64::MAX, |event| event.id);
        state.chain.extend(links.into_iter().filter(|link| link.id >= oldest));
        Ok(true)
    }

    pub async fn chained_after(&self, after: u64, limit: usize) -> Result<Vec<Entry>, StoreError> {
        let state = self.lock();
        let Some(oldest) = state.events.front().map(|event| event.id) else {
            return Ok(Vec::new());
        };
        let first = state.chain.partition_point(|link| link.id <= after);
        let event = |link: &Link| -> Option<&Arc<Event>> {
            let at = usize::try_from(link.id.checked_sub(oldest)?).ok()?;
            state.events.get(at)
        };
        Ok(state
            .chain
            .range(first..)
            .map_while(|link| Some(Entry::linked(event(link)?, link.clone())))
            .take(limit)
            .collect())
    }
}
