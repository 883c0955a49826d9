//! The Calls: `tools/call`s started over REST, their status and result, kept for the retention window.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::changes::Changes;
use crate::events::{EventKind, Events, Tags};
use crate::ids;
use crate::metrics::Metrics;
use crate::registry::Registry;
use crate::retained::Retained;
use crate::time::Timestamp;

/// Where a Call is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CallStatus {
    /// The upstream is working on it.
    Running,
    /// It waits on at least one pending Request.
    InputRequired,
    /// The upstream returned a `CallToolResult` (a tool-level `isError` included).
    Completed,
    /// The transport, the protocol or the upstream failed it.
    Failed,
    /// A client or the gateway cancelled it.
    Cancelled,
}

impl CallStatus {
    /// Whether the call has ended.
    pub fn is_final(self) -> bool {
        matches!(self, CallStatus::Completed | CallStatus::Failed | CallStatus::Cancelled)
    }

    /// The status as the API spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            CallStatus::Running => "running",
            CallStatus::InputRequired => "input_required",
            CallStatus::Completed => "completed",
            CallStatus::Failed => "failed",
            CallStatus::Cancelled => "cancelled",
        }
    }
}

/// Why a call failed or was cancelled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct CallError {
    pub message: String,
}

/// A Call as the REST API shows it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CallView {
    pub id: String,
    pub server: String,
    pub session: String,
    pub tool: String,
    #[schema(value_type = Object)]
    pub arguments: Value,
    /// The principal that started it.
    pub owner: String,
    pub status: CallStatus,
    pub requests: Vec<String>,
    /// The MCP `CallToolResult`, once completed.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub result: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<CallError>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

/// How a call ended.
#[derive(Debug, Clone)]
pub enum Finish {
    Completed(Value),
    Failed(String),
    Cancelled(String),
}

/// Which Calls `list` returns, oldest first.
#[derive(Debug, Clone, Default)]
pub struct CallFilter {
    pub status: Option<CallStatus>,
    pub server: Option<String>,
    pub session: Option<String>,
    /// Only calls started by this principal.
    pub owner: Option<String>,
}

/// A new call, before it is started.
#[derive(Debug, Clone)]
pub struct NewCall {
    pub server: String,
    pub session: String,
    pub tool: String,
    pub arguments: Value,
    pub owner: String,
}

/// The store of Calls; cheap to clone.
#[derive(Debug, Clone)]
pub struct Calls {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<Retained<Entry>>,
    registry: Registry,
    changes: Changes,
    events: Events,
    metrics: Metrics,
    retention: Duration,
}

#[derive(Debug)]
struct Entry {
    /// `status` here is never `InputRequired`: that is derived from `pending`.
    view: CallView,
    cancel: CancellationToken,
    /// The call's Requests still pending.
    pending: HashSet<String>,
    /// The status last published in `call.updated`.
    published: Option<CallStatus>,
}

impl Entry {
    /// The status as the API shows it.
    fn status(&self) -> CallStatus {
        if self.view.status == CallStatus::Running && !self.pending.is_empty() {
            CallStatus::InputRequired
        } else {
            self.view.status
        }
    }

    /// The view as the API shows it.
    fn current(&self) -> CallView {
        CallView {
            status: self.status(),
            ..self.view.clone()
        }
    }
}

impl Calls {
    /// Creates an empty store.
    pub fn new(registry: Registry, changes: Changes, events: Events, metrics: Metrics, retention: Duration) -> Self {
        let shared = Arc::new(Shared {
            state: Mutex::default(),
            registry: registry.clone(),
            changes,
            events,
            metrics,
            retention,
        });
        let calls = Arc::downgrade(&shared);
        registry.on_call_change(Box::new(move |call, request| {
            if let Some(shared) = calls.upgrade() {
                let calls = Calls { shared };
                if let Some(entry) = calls.lock().get_mut(call) {
                    entry.pending.remove(request);
                }
                calls.updated(call);
            }
        }));
        Self { shared }
    }

    /// Publishes `call.updated` when the call's status has changed since it was last published.
    fn updated(&self, call: &str) {
        let mut state = self.lock();
        let Some(entry) = state.get_mut(call) else { return };
        let status = entry.status();
        if entry.published == Some(status) {
            return;
        }
        entry.published = Some(status);
        // Serialized in place, showing the derived status, rather than from a copy of the whole call.
        let stored = std::mem::replace(&mut entry.view.status, status);
        let view = &entry.view;
        let tags = Tags {
            server: &view.server,
            session: &view.session,
            call: Some(&view.id),
            owner: Some(&view.owner),
        };
        self.shared.events.publish(EventKind::CallUpdated, view, tags);
        entry.view.status = stored;
    }

    /// Records a new running call, unless its owner already has `max_running` calls that have not ended
    /// (then that count is the error); the token fires when the call is cancelled.
    pub fn create(&self, call: NewCall, max_running: usize) -> Result<(CallView, CancellationToken), usize> {
        let now = Timestamp::now();
        let view = CallView {
            id: ids::mint(ids::CALL),
            server: call.server,
            session: call.session,
            tool: call.tool,
            arguments: call.arguments,
            owner: call.owner,
            status: CallStatus::Running,
            requests: Vec::new(),
            result: None,
            error: None,
            created_at: now,
            updated_at: now,
        };
        let cancel = CancellationToken::new();
        {
            let mut state = self.lock();
            state.purge(Instant::now());
            let running = state.live().filter(|entry| entry.view.owner == view.owner).count();
            if running >= max_running {
                return Err(running);
            }
            state.insert(
                &view.id,
                Entry {
                    view: view.clone(),
                    cancel: cancel.clone(),
                    pending: HashSet::new(),
                    published: None,
                },
            );
        }
        self.shared.changes.notify();
        self.shared
            .metrics
            .inc("toolnexus_calls_started_total", &[("server", &view.server)]);
        self.updated(&view.id);
        Ok((view, cancel))
    }

    /// Attributes a Request to a call.
    pub fn add_request(&self, call: &str, request: &str) {
        if let Some(entry) = self.lock().get_mut(call) {
            entry.view.requests.push(request.to_owned());
            entry.view.updated_at = Timestamp::now();
            // A Request resolved before it was attributed is not pending; the registry is asked under this lock,
            // so a resolution cannot slip between the check and the insert unseen.
            if self.shared.registry.any_pending([&request.to_owned()]) {
                entry.pending.insert(request.to_owned());
            }
        }
        self.shared.changes.notify();
        self.updated(call);
    }

    /// Ends a running call; a call that already ended keeps its first ending.
    ///
    /// Requests of the call still pending are cancelled with the reason the call ended.
    pub fn finish(&self, call: &str, finish: Finish) {
        let (pending, detail) = {
            let mut state = self.lock();
            let Some(entry) = state.get_mut(call) else {
                return;
            };
            if entry.view.status.is_final() {
                return;
            }
            let (status, result, message) = match finish {
                Finish::Completed(result) => (CallStatus::Completed, Some(result), None),
                Finish::Failed(message) => (CallStatus::Failed, None, Some(message)),
                Finish::Cancelled(message) => (CallStatus::Cancelled, None, Some(message)),
            };
            let detail = message
                .clone()
                .unwrap_or_else(|| "the call completed before the Request was answered".into());
            entry.view.status = status;
            entry.view.result = result;
            entry.view.error = message.map(|message| CallError { message });
            entry.view.updated_at = Timestamp::now();
            let requests = entry.view.requests.clone();
            state.retire(call, Instant::now() + self.shared.retention);
            (requests, detail)
        };
        self.settled(call, &pending, &detail);
    }

    /// Cancels a call: its pending Requests become `cancelled` and the upstream is told.
    pub fn cancel(&self, call: &str, message: &str) -> Option<CallView> {
        let (requests, token) = {
            let mut state = self.lock();
            let entry = state.get_mut(call)?;
            if entry.view.status.is_final() {
                return Some(entry.view.clone());
            }
            entry.view.status = CallStatus::Cancelled;
            entry.view.error = Some(CallError {
                message: message.to_owned(),
            });
            entry.view.updated_at = Timestamp::now();
            let found = (entry.view.requests.clone(), entry.cancel.clone());
            state.retire(call, Instant::now() + self.shared.retention);
            found
        };
        self.settled(call, &requests, message);
        token.cancel();
        self.get(call)
    }

    /// After a call ended: cancels its pending Requests and publishes its final state once.
    fn settled(&self, call: &str, requests: &[String], detail: &str) {
        let ended = self
            .lock()
            .get(call)
            .map(|entry| (entry.view.server.clone(), entry.status()));
        if let Some((server, status)) = ended {
            let labels = [("server", server.as_str()), ("status", status.as_str())];
            self.shared.metrics.inc("toolnexus_calls_finished_total", &labels);
        }
        self.shared
            .registry
            .cancel(requests.iter().map(String::as_str), detail, true);
        self.updated(call);
        self.shared.changes.notify();
    }

    /// Cancels every running call (used at shutdown).
    pub fn cancel_all(&self, message: &str) {
        let running: Vec<String> = self.lock().live().map(|entry| entry.view.id.clone()).collect();
        for call in running {
            self.cancel(&call, message);
        }
    }

    /// One call by id, with its current status.
    pub fn get(&self, call: &str) -> Option<CallView> {
        self.lock().get(call).map(Entry::current)
    }

    /// A call's status, without copying the call.
    pub fn status(&self, call: &str) -> Option<CallStatus> {
        self.lock().get(call).map(Entry::status)
    }

    /// The calls matching the filter, oldest first.
    pub fn list(&self, filter: &CallFilter, limit: usize) -> Vec<CallView> {
        let state = self.lock();
        state
            .values()
            .map(Entry::current)
            .filter(|view| filter.matches(view))
            .take(limit)
            .collect()
    }

    /// The principal that started a call.
    pub fn owner(&self, call: &str) -> Option<String> {
        self.lock().get(call).map(|entry| entry.view.owner.clone())
    }

    /// How many calls are held in each status.
    pub fn count_by_status(&self) -> BTreeMap<CallStatus, usize> {
        let mut counts = BTreeMap::new();
        for entry in self.lock().values() {
            *counts.entry(entry.status()).or_default() += 1;
        }
        counts
    }

    fn lock(&self) -> MutexGuard<'_, Retained<Entry>> {
        self.shared
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl CallFilter {
    fn matches(&self, view: &CallView) -> bool {
        self.status.is_none_or(|status| status == view.status)
            && self.server.as_ref().is_none_or(|server| *server == view.server)
            && self.session.as_ref().is_none_or(|session| *session == view.session)
            && self.owner.as_ref().is_none_or(|owner| *owner == view.owner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_names_match_the_wire() {
        for status in [
            CallStatus::Running,
            CallStatus::InputRequired,
            CallStatus::Completed,
            CallStatus::Failed,
            CallStatus::Cancelled,
        ] {
            assert_eq!(serde_json::to_value(status).unwrap(), status.as_str());
        }
    }
}
