//! The Calls: `tools/call`s started over REST, their status and result, kept in the store.

use crate::ids::{CallId, SessionId};
use crate::metrics::{Metric, Metrics};
use crate::records::{Allowed, Arguments, CallFilter, CallStatus, CallTask, CallView, Finish};
use crate::registry::{Registry, Tell};
use crate::store::{InsertCallError, NewCall, Retry, Started, Store, StoreError};

/// The Calls; cheap to clone.
#[derive(Debug, Clone)]
pub struct Calls {
    store: Store,
    registry: Registry,
    metrics: Metrics,
}

impl Calls {
    /// The calls kept in `store`; their Requests are the registry's.
    pub fn new(store: Store, registry: Registry, metrics: Metrics) -> Self {
        Self {
            store,
            registry,
            metrics,
        }
    }

    /// Records a new running call, unless its owner already has `max_running` calls that have not ended;
    /// returns once the store has decided, with what says when the call is kept.
    pub async fn create(&self, call: NewCall, max_running: usize) -> Result<Started, InsertCallError> {
        let started = self.store.insert_call(call, max_running).await?;
        self.metrics
            .inc(Metric::CallsStarted, &[("server", &started.view.server)]);
        Ok(started)
    }

    /// Ends a call that has not ended; its Requests still pending are cancelled with the reason it ended (the
    /// upstream is told `cancel`). `None` if it had ended already.
    pub async fn finish(&self, id: &CallId, finish: Finish) -> Result<Option<CallView>, StoreError> {
        let Some(finished) = self.store.finish_call(id, finish).await? else {
            return Ok(None);
        };
        let view = finished.view;
        let resolved = crate::store::Resolved {
            views: finished.cancelled,
            resumes: Vec::new(),
        };
        self.registry.deliver(resolved, Tell::Cancel);
        let labels = [("server", view.server.as_str()), ("status", view.status.as_str())];
        self.metrics.inc(Metric::CallsFinished, &labels);
        Ok(Some(view))
    }

    /// Records why the upstream refused the call's latest round, on the Requests that answered it.
    pub async fn annotate_round(&self, id: &CallId, detail: &str) -> Result<(), StoreError> {
        self.store.annotate_round(id, detail).await
    }

    /// Records the upstream task of a call that has not ended, as last seen; `false` when the call has ended.
    pub async fn note_task(&self, id: &CallId, task: &CallTask) -> Result<bool, StoreError> {
        self.store.note_task(id, task).await
    }

    /// What retrying a call takes, if it has not ended and its latest round is answered, or it follows a task.
    pub async fn retry(&self, id: &CallId) -> Result<Option<Retry>, StoreError> {
        self.store.retry(id).await
    }

    /// One call by id.
    pub async fn get(&self, id: &CallId) -> Result<Option<CallView>, StoreError> {
        self.store.call(id).await
    }

    /// Claims the sending of a call its approval held: `false` when it was sent already (or is not running).
    pub async fn forwarding(&self, id: &CallId, allowed: &Allowed, arguments: &Arguments) -> Result<bool, StoreError> {
        self.store.forwarding(id, allowed, arguments).await
    }

    /// Whether the store says the call has ended; a call it does not know, or a read that fails, has not.
    pub async fn has_ended(&self, id: &CallId) -> bool {
        self.store.call_ended(id).await.unwrap_or(false)
    }

    /// A call's status and owner, without reading the rest.
    pub async fn status(&self, id: &CallId) -> Result<Option<(CallStatus, String)>, StoreError> {
        self.store.call_status(id).await
    }

    /// The calls matching the filter, oldest first.
    pub async fn list(&self, filter: &CallFilter, limit: usize) -> Result<Vec<CallView>, StoreError> {
        self.store.calls(filter, limit).await
    }

    /// The calls that have not ended, on one session or on all.
    pub async fn running(&self, session: Option<&SessionId>) -> Result<Vec<CallView>, StoreError> {
        self.store.running_calls(session).await
    }

    /// How many calls are kept in each status.
    pub async fn count_by_status(&self) -> Result<Vec<(CallStatus, usize)>, StoreError> {
        self.store.count_calls().await
    }
}
