//! The Requests: pending suspensions waiting for an Answer, and resolved ones kept for the retention window.
//!
//! The registry owns every state transition of a Request (pending → answered, expired or cancelled,
//! exactly once) and delivers the resulting `ElicitResult` to whoever suspended.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rmcp::model::{ElicitResult, ElicitationAction};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::changes::Changes;
use crate::elicitation::{self, KIND_AUTHORIZATION};
use crate::events::{Event, EventKind, Events, Tags};
use crate::metrics::Metrics;
use crate::retained::Retained;
use crate::suspension::{Answer, Request};
use crate::time::Timestamp;
use crate::validation::{self, Violation};

/// Where a Request is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Waiting for an Answer.
    Pending,
    /// Resolved by an Answer (accept, decline or cancel).
    Answered,
    /// Nobody answered in time; the upstream got `cancel`.
    Expired,
    /// Withdrawn by the upstream, or ended with its session or call.
    Cancelled,
}

impl Status {
    /// The status as the API spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Answered => "answered",
            Status::Expired => "expired",
            Status::Cancelled => "cancelled",
        }
    }
}

/// A Request as the REST API shows it: the §10 shape plus the gateway's fields.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RequestView {
    #[serde(flatten)]
    pub request: Request,
    pub status: Status,
    pub server: String,
    pub session: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub call: Option<String>,
    /// The principal that owns the Request's call or session (absent for a shared session's unattributed one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    pub created_at: Timestamp,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resolved_at: Option<Timestamp>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answer: Option<Answer>,
    /// The principal whose answer resolved it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answered_by: Option<String>,
    /// The MCP `ElicitResult` sent upstream.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub result: Option<ElicitResult>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<Timestamp>,
}

/// A Request an answer resolved, or had already resolved (an identical answer posted again).
#[derive(Debug)]
pub struct Answered {
    pub view: RequestView,
    /// The `request.resolved` event of this answer, whose data is the view as JSON; `None` for a repeat.
    pub event: Option<Arc<Event>>,
}

/// What a suspended upstream exchange receives once its Request is resolved.
#[derive(Debug)]
pub enum Outcome {
    /// Send this result upstream.
    Reply(ElicitResult),
    /// The Request was withdrawn: there is nothing to send.
    Withdrawn,
}

/// A new suspension raised by an upstream session.
#[derive(Debug, Clone)]
pub struct Suspension {
    /// The MCP `elicitation/create` params, as JSON.
    pub params: Value,
    /// The server that raised it.
    pub server: String,
    /// The session it arrived on.
    pub session: String,
    /// The call it belongs to, when the gateway can tell.
    pub call: Option<String>,
    /// The principal that owns that call, or else the session.
    pub owner: Option<String>,
}

/// A Request handed out by `suspend`: its id and the receiver of its outcome.
#[derive(Debug)]
pub struct Pending {
    pub id: String,
    pub outcome: oneshot::Receiver<Outcome>,
}

/// Why an Answer was not taken.
#[derive(Debug, thiserror::Error)]
pub enum AnswerError {
    #[error("no Request with id {0}")]
    NotFound(String),
    #[error("Request {0} was already answered with a different answer")]
    Conflict(String),
    #[error("Request {id} is no longer answerable: it is {}", status.as_str())]
    Gone { id: String, status: Status },
    #[error("the answer data does not satisfy the requested schema")]
    Invalid(Vec<Violation>),
}

/// Why a suspension could not become a Request.
#[derive(Debug, thiserror::Error)]
pub enum SuspendError {
    /// The elicitation is not one the gateway can show (its params, or a schema that is not a flat form).
    #[error("{0}")]
    Unusable(String),
    #[error("{0} Requests are pending already, the most the gateway holds")]
    Full(usize),
}

/// Which Requests `list` returns, oldest first.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// `None` means every status.
    pub status: Option<Status>,
    pub server: Option<String>,
    pub session: Option<String>,
    pub call: Option<String>,
    pub kind: Option<String>,
    /// Only Requests owned by this principal.
    pub owner: Option<String>,
}

/// How Requests live and resolve.
#[derive(Debug, Clone)]
pub struct Policy {
    pub ttl: Duration,
    pub retention: Duration,
    pub apply_defaults: bool,
    /// The most Requests pending at once; past it new elicitations are answered `cancel` at once.
    pub max_pending: usize,
}

/// The store of Requests; cheap to clone.
#[derive(Debug, Clone)]
pub struct Registry {
    shared: Arc<Shared>,
}

/// Told the id of a Call whenever one of its Requests is raised or resolved.
pub type CallHook = Box<dyn Fn(&str, &str) + Send + Sync>;

struct Shared {
    state: Mutex<State>,
    /// Wakes the reaper when a new deadline comes first.
    reaper: Notify,
    changes: Changes,
    events: Events,
    metrics: Metrics,
    call_hook: std::sync::OnceLock<CallHook>,
    policy: Policy,
    data: SharedData,
    /// URL-mode Requests by session and `elicitationId`, to match `notifications/elicitation/complete`
    /// without looking through every Request kept.
    completions: Mutex<HashMap<(String, String), String>>,
}

/// The most distinct `data` objects `SharedData` keeps; it starts over when full.
const MAX_SHARED_DATA: usize = 256;

/// One copy of each distinct Request `data` (a form's schema) and of its compiled validator, held by every
/// Request that carries it: elicitations repeat their schemas, and a schema is most of a pending Request's
/// memory.
#[derive(Debug, Default)]
struct SharedData(Mutex<HashMap<String, Held>>);

/// A Request's `data` and the validator of its schema (`None` without a schema).
#[derive(Debug, Clone)]
struct Held {
    data: Arc<Map<String, Value>>,
    validator: Option<Arc<jsonschema::Validator>>,
}

impl SharedData {
    /// The copy of `data` already held, or `data` itself with what `compile` makes of it, now held (a copy
    /// already held was compiled when it was first seen).
    fn share(
        &self,
        data: Arc<Map<String, Value>>,
        compile: impl FnOnce(&Map<String, Value>) -> Result<Option<Arc<jsonschema::Validator>>, String>,
    ) -> Result<Held, String> {
        let key = serde_json::to_string(&data).unwrap_or_default();
        if let Some(copy) = self.lock().get(&key) {
            return Ok(copy.clone());
        }
        let validator = compile(&data)?;
        let fresh = Held { data, validator };
        let mut held = self.lock();
        if held.len() >= MAX_SHARED_DATA {
            held.clear();
        }
        held.insert(key, fresh.clone());
        Ok(fresh)
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Held>> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("state", &self.state)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

/// Every Request kept, in creation order; the live ones are the pending ones. Every Request lives for the
/// same TTL, so the oldest pending Request is also the first to expire.
///
/// Boxed: a table slot stays small, and the table is over-allocated by up to half as it grows.
type State = Retained<Box<Entry>>;

#[derive(Debug)]
struct Entry {
    view: RequestView,
    /// The compiled schema its answers are validated with (shared with every Request of the same data).
    validator: Option<Arc<jsonschema::Validator>>,
    deadline: Instant,
    /// `elicitationId` of a URL-mode elicitation, to match `notifications/elicitation/complete`.
    elicitation_id: Option<String>,
    reply: Option<oneshot::Sender<Outcome>>,
    /// Fired when the upstream withdraws the elicitation; an answer after that is `410`.
    withdrawn: Option<CancellationToken>,
}

impl Registry {
    /// Creates an empty registry.
    pub fn new(policy: Policy, changes: Changes, events: Events, metrics: Metrics) -> Self {
        let shared = Shared {
            state: Mutex::default(),
            reaper: Notify::new(),
            changes,
            events,
            metrics,
            call_hook: std::sync::OnceLock::new(),
            policy,
            data: SharedData::default(),
            completions: Mutex::default(),
        };
        Self {
            shared: Arc::new(shared),
        }
    }

    /// Sets what to tell when a Call's Requests are resolved (once; later calls are ignored).
    pub fn on_call_change(&self, hook: CallHook) {
        let _ = self.shared.call_hook.set(hook);
    }

    /// Turns an upstream elicitation into a pending Request.
    pub fn suspend(&self, suspension: Suspension) -> Result<Pending, SuspendError> {
        let mut request = elicitation::elicitation_to_request(&suspension.params);
        let mut validator = None;
        if let Some(data) = request.data.take() {
            let compile = |data: &Map<String, Value>| {
                data.get("schema")
                    .map(|schema| validation::compile(schema).map(Arc::new))
                    .transpose()
            };
            let shared = self.shared.data.share(data, compile).map_err(SuspendError::Unusable)?;
            request.data = Some(shared.data);
            validator = shared.validator;
        }
        let created_at = Timestamp::now();
        request.expires_at = Some(created_at.after(self.shared.policy.ttl).rfc3339());
        let id = request.id.clone();
        let elicitation_id = suspension
            .params
            .get("elicitationId")
            .and_then(Value::as_str)
            .filter(|id| !id.is_empty())
            .map(str::to_owned);
        let completion = elicitation_id
            .clone()
            .map(|elicitation_id| (suspension.session.clone(), elicitation_id));
        let (reply, outcome) = oneshot::channel();
        let view = RequestView {
            request,
            status: Status::Pending,
            server: suspension.server,
            session: suspension.session,
            call: suspension.call,
            owner: suspension.owner,
            answered_by: None,
            created_at,
            resolved_at: None,
            answer: None,
            result: None,
            detail: None,
            completed_at: None,
        };
        let first_deadline = {
            let mut state = self.lock();
            if state.live_count() >= self.shared.policy.max_pending {
                self.shared
                    .metrics
                    .inc("toolnexus_requests_rejected_total", &[("server", &view.server)]);
                return Err(SuspendError::Full(self.shared.policy.max_pending));
            }
            // Taken under the lock, so that deadlines follow creation order.
            let deadline = Instant::now() + self.shared.policy.ttl;
            self.publish(EventKind::RequestCreated, &view);
            self.shared
                .metrics
                .inc("toolnexus_requests_created_total", &[("server", &view.server)]);
            tracing::info!(
                request = %id,
                server = %view.server,
                session = %view.session,
                call = view.call.as_deref().unwrap_or(""),
                kind = %view.request.kind,
                "request created"
            );
            let entry = Entry {
                view,
                validator,
                deadline,
                elicitation_id,
                reply: Some(reply),
                withdrawn: None,
            };
            state.insert(&id, Box::new(entry));
            state.live_count() == 1
        };
        if first_deadline {
            self.shared.reaper.notify_one();
        }
        if let Some(key) = completion {
            self.completions().insert(key, id.clone());
        }
        // The call lists the Request (and publishes its new state) once the caller attributes it.
        self.changed([]);
        Ok(Pending { id, outcome })
    }

    /// Resolves a pending Request with an Answer and sends the mapped `ElicitResult` upstream.
    ///
    /// Posting the identical answer again returns the same Request. `by` is the principal answering.
    pub fn answer(&self, id: &str, mut answer: Answer, by: &str) -> Result<Answered, AnswerError> {
        answer.id = id.to_owned();
        let mut state = self.lock();
        let entry = state.get_mut(id).ok_or_else(|| AnswerError::NotFound(id.to_owned()))?;
        let request_data = entry.view.request.data.clone();
        let schema = request_data.as_ref().and_then(|data| data.get("schema"));
        let is_url = entry.view.request.kind == KIND_AUTHORIZATION;
        if answer.ok && !is_url {
            let data = answer.data.get_or_insert_with(Default::default);
            if let Some(schema) = schema
                && self.shared.policy.apply_defaults
            {
                validation::apply_defaults(schema, data);
            }
        }
        match entry.view.status {
            Status::Pending => {}
            Status::Answered if entry.view.answer.as_ref() == Some(&answer) => {
                return Ok(Answered {
                    view: entry.view.clone(),
                    event: None,
                });
            }
            Status::Answered => return Err(AnswerError::Conflict(id.to_owned())),
            status => {
                return Err(AnswerError::Gone {
                    id: id.to_owned(),
                    status,
                });
            }
        }
        if answer.ok
            && let (Some(validator), Some(data)) = (&entry.validator, &answer.data)
        {
            validation::violations(validator, data).map_err(AnswerError::Invalid)?;
        }
        let mut result = elicitation::answer_to_elicit_result(&answer);
        if is_url {
            result.content = None;
        }
        if entry.withdrawn.as_ref().is_some_and(CancellationToken::is_cancelled) {
            let detail = "the upstream cancelled the elicitation".to_owned();
            self.retire(&mut state, id, Status::Cancelled, Some(detail));
            let call = state.get(id).and_then(|entry| entry.view.call.clone());
            drop(state);
            self.changed([(call, id.to_owned())]);
            return Err(AnswerError::Gone {
                id: id.to_owned(),
                status: Status::Cancelled,
            });
        }
        let delivered = entry
            .reply
            .take()
            .is_some_and(|reply| reply.send(Outcome::Reply(result.clone())).is_ok());
        let outcome = if delivered {
            entry.view.answer = Some(answer);
            entry.view.answered_by = Some(by.to_owned());
            entry.view.result = Some(result);
            let (view, event) = self.retire(&mut state, id, Status::Answered, None);
            Ok(Answered {
                view,
                event: Some(event),
            })
        } else {
            let detail = "withdrawn by the upstream before the answer arrived".to_owned();
            self.retire(&mut state, id, Status::Cancelled, Some(detail));
            Err(AnswerError::Gone {
                id: id.to_owned(),
                status: Status::Cancelled,
            })
        };
        let call = state.get(id).and_then(|entry| entry.view.call.clone());
        drop(state);
        self.changed([(call, id.to_owned())]);
        outcome
    }

    /// Cancels pending Requests; with `reply_cancel` the upstream is told `cancel`, else nothing is sent.
    ///
    /// Returns how many were still pending.
    pub fn cancel<'a>(&self, ids: impl IntoIterator<Item = &'a str>, detail: &str, reply_cancel: bool) -> usize {
        let mut calls = Vec::new();
        {
            let mut state = self.lock();
            for id in ids {
                if state.get(id).is_some_and(|entry| entry.view.status == Status::Pending) {
                    let view = self.withdraw(&mut state, id, detail, reply_cancel);
                    calls.push((view.call, view.request.id));
                }
            }
        }
        let cancelled = calls.len();
        self.changed(calls);
        cancelled
    }

    /// Cancels every pending Request of a session; with `reply_cancel` the upstream is told `cancel`.
    pub fn cancel_session(&self, session: &str, detail: &str, reply_cancel: bool) -> usize {
        let ids: Vec<String> = {
            let state = self.lock();
            state
                .live()
                .filter(|entry| entry.view.session == session)
                .map(|entry| entry.view.request.id.clone())
                .collect()
        };
        self.cancel(ids.iter().map(String::as_str), detail, reply_cancel)
    }

    /// Cancels every pending Request, telling each upstream `cancel` (used at shutdown).
    pub fn cancel_all(&self, detail: &str) -> usize {
        let ids: Vec<String> = self.lock().live().map(|entry| entry.view.request.id.clone()).collect();
        self.cancel(ids.iter().map(String::as_str), detail, true)
    }

    /// Records `notifications/elicitation/complete` on the matching URL-mode Request of a session.
    pub fn complete(&self, session: &str, elicitation_id: &str) -> bool {
        let key = (session.to_owned(), elicitation_id.to_owned());
        let Some(id) = self.completions().remove(&key) else {
            return false;
        };
        let found = self
            .lock()
            .get_mut(&id)
            .filter(|entry| entry.view.completed_at.is_none())
            .map(|entry| entry.view.completed_at = Some(Timestamp::now()))
            .is_some();
        if found {
            self.shared.changes.notify();
        }
        found
    }

    /// Ties a Request to the token its upstream exchange is cancelled by, so a late answer is refused.
    pub fn watch_withdrawal(&self, id: &str, withdrawn: CancellationToken) {
        if let Some(entry) = self.lock().get_mut(id) {
            entry.withdrawn = Some(withdrawn);
        }
    }

    /// How many Requests are pending.
    pub fn pending_count(&self) -> usize {
        self.lock().live_count()
    }

    /// One Request by id.
    pub fn get(&self, id: &str) -> Option<RequestView> {
        self.lock().get(id).map(|entry| entry.view.clone())
    }

    /// The status of one Request, without copying it.
    pub fn status(&self, id: &str) -> Option<Status> {
        self.lock().get(id).map(|entry| entry.view.status)
    }

    /// The owner of one Request (`Some(None)`: it has none), without copying the Request.
    pub fn owner(&self, id: &str) -> Option<Option<String>> {
        self.lock().get(id).map(|entry| entry.view.owner.clone())
    }

    /// Whether any of these Requests is still pending.
    pub fn any_pending<'a>(&self, ids: impl IntoIterator<Item = &'a String>) -> bool {
        let state = self.lock();
        ids.into_iter()
            .any(|id| state.get(id).is_some_and(|entry| entry.view.status == Status::Pending))
    }

    /// Up to `limit` Requests matching the filter, oldest first, starting at `cursor`; and the next page's cursor.
    ///
    /// Listing pending Requests walks only those, however many resolved ones are kept.
    pub fn list(&self, filter: &Filter, cursor: u64, limit: usize) -> (Vec<RequestView>, Option<u64>) {
        let state = self.lock();
        let candidates: Box<dyn Iterator<Item = (u64, &Box<Entry>)>> = if filter.status == Some(Status::Pending) {
            Box::new(state.live_range(cursor..))
        } else {
            Box::new(state.range(cursor..))
        };
        let mut page = Vec::new();
        for (seq, entry) in candidates {
            if filter.matches(&entry.view) {
                if page.len() == limit {
                    return (page, Some(seq));
                }
                page.push(entry.view.clone());
            }
        }
        (page, None)
    }

    /// Expires due Requests and forgets retired ones, until `shutdown`.
    pub async fn reap(self, shutdown: CancellationToken) {
        loop {
            let next = self.reap_due(Instant::now());
            let sleep = async {
                match next {
                    Some(when) => tokio::time::sleep_until(when).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = sleep => {}
                () = self.shared.reaper.notified() => {}
                () = shutdown.cancelled() => return,
            }
        }
    }

    /// Expires and purges what is due at `now`; returns when to look again.
    fn reap_due(&self, now: Instant) -> Option<Instant> {
        let mut expired = Vec::new();
        let mut state = self.lock();
        let first_due = |state: &State| {
            let first = state.live().next()?;
            (first.deadline <= now).then(|| first.view.request.id.clone())
        };
        while let Some(id) = first_due(&state) {
            let entry = state.get_mut(&id).expect("a live Request has its entry");
            entry.view.answer = Some(Answer::expired(&id));
            let result = ElicitResult::new(ElicitationAction::Cancel);
            entry.view.result = Some(result.clone());
            if let Some(reply) = entry.reply.take() {
                let _ = reply.send(Outcome::Reply(result));
            }
            let (view, _) = self.retire(&mut state, &id, Status::Expired, None);
            expired.push((view.call, id));
        }
        let purged = state.purge(now);
        self.forget_completions(&purged);
        let next_deadline = state.live().next().map(|entry| entry.deadline);
        let next_purge = state.next_purge();
        drop(state);
        if !expired.is_empty() {
            self.changed(expired);
        }
        next_deadline.into_iter().chain(next_purge).min()
    }

    /// Cancels a pending entry, replying `cancel` upstream or withdrawing it.
    fn withdraw(&self, state: &mut State, id: &str, detail: &str, reply_cancel: bool) -> RequestView {
        let entry = state.get_mut(id).expect("caller checked the entry");
        let reply = entry.reply.take();
        if reply_cancel {
            let result = ElicitResult::new(ElicitationAction::Cancel);
            if reply.is_some_and(|reply| reply.send(Outcome::Reply(result.clone())).is_ok()) {
                entry.view.result = Some(result);
            }
        } else if let Some(reply) = reply {
            let _ = reply.send(Outcome::Withdrawn);
        }
        self.retire(state, id, Status::Cancelled, Some(detail.to_owned())).0
    }

    /// Moves a pending entry to a terminal status, schedules its purge and publishes `request.resolved`.
    fn retire(&self, state: &mut State, id: &str, status: Status, detail: Option<String>) -> (RequestView, Arc<Event>) {
        let entry = state.get_mut(id).expect("caller checked the entry");
        debug_assert_eq!(entry.view.status, Status::Pending);
        entry.view.status = status;
        entry.view.resolved_at = Some(Timestamp::now());
        entry.view.detail = detail;
        let view = entry.view.clone();
        log_resolution(&view);
        let outcome = match (status, &view.result) {
            (Status::Answered, Some(result)) => serde_json::to_value(&result.action)
                .ok()
                .and_then(|action| action.as_str().map(str::to_owned))
                .unwrap_or_default(),
            _ => status.as_str().to_owned(),
        };
        let metrics = &self.shared.metrics;
        metrics.inc(
            "toolnexus_requests_resolved_total",
            &[("server", &view.server), ("outcome", &outcome)],
        );
        let age = (entry.deadline - self.shared.policy.ttl).elapsed().as_secs_f64();
        metrics.observe("toolnexus_request_resolution_seconds", &[("server", &view.server)], age);
        state.retire(id, Instant::now() + self.shared.policy.retention);
        let event = self.publish(EventKind::RequestResolved, &view);
        (view, event)
    }

    fn publish(&self, kind: EventKind, view: &RequestView) -> Arc<Event> {
        let tags = Tags {
            server: &view.server,
            session: &view.session,
            call: view.call.as_deref(),
            owner: view.owner.as_deref(),
        };
        self.shared.events.publish(kind, view, tags)
    }

    /// Wakes long-polls and tells the call hook which Requests of which calls were resolved.
    fn changed(&self, resolved: impl IntoIterator<Item = (Option<String>, String)>) {
        self.shared.changes.notify();
        if let Some(hook) = self.shared.call_hook.get() {
            for (call, request) in resolved {
                if let Some(call) = call {
                    hook(&call, &request);
                }
            }
        }
    }

    /// Drops the completion keys of purged Requests (unless a newer Request took the key over).
    fn forget_completions(&self, purged: &[Box<Entry>]) {
        let mut completions = None;
        for entry in purged {
            if let Some(elicitation_id) = &entry.elicitation_id {
                let completions = completions.get_or_insert_with(|| self.completions());
                let key = (entry.view.session.clone(), elicitation_id.clone());
                if completions.get(&key) == Some(&entry.view.request.id) {
                    completions.remove(&key);
                }
            }
        }
    }

    fn completions(&self) -> MutexGuard<'_, HashMap<(String, String), String>> {
        self.shared
            .completions
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.shared
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Logs how a Request ended: the keys of its answer's data, never the values.
fn log_resolution(view: &RequestView) {
    let answer = view.answer.as_ref();
    let keys: Vec<&str> = answer
        .and_then(|answer| answer.data.as_ref())
        .map(|data| data.keys().map(String::as_str).collect())
        .unwrap_or_default();
    tracing::info!(
        request = %view.request.id,
        server = %view.server,
        session = %view.session,
        call = view.call.as_deref().unwrap_or(""),
        status = ?view.status,
        ok = answer.map(|answer| answer.ok),
        answered_by = view.answered_by.as_deref().unwrap_or(""),
        reason = ?answer.and_then(|answer| answer.reason),
        data_keys = ?keys,
        detail = view.detail.as_deref().unwrap_or(""),
        "request resolved"
    );
}

impl Filter {
    fn matches(&self, view: &RequestView) -> bool {
        self.status.is_none_or(|status| status == view.status)
            && self.server.as_ref().is_none_or(|server| *server == view.server)
            && self.session.as_ref().is_none_or(|session| *session == view.session)
            && self.call.as_ref().is_none_or(|call| Some(call) == view.call.as_ref())
            && self.kind.as_ref().is_none_or(|kind| *kind == view.request.kind)
            && self
                .owner
                .as_ref()
                .is_none_or(|owner| Some(owner) == view.owner.as_ref())
    }
}

#[cfg(test)]
mod properties;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::Events;
    use crate::metrics::Metrics;
    use serde_json::json;

    #[test]
    fn status_names_match_the_wire() {
        for status in [Status::Pending, Status::Answered, Status::Expired, Status::Cancelled] {
            assert_eq!(serde_json::to_value(status).unwrap(), status.as_str());
        }
    }

    fn registry(ttl: Duration) -> Registry {
        Registry::new(
            Policy {
                ttl,
                retention: Duration::from_secs(60),
                apply_defaults: true,
                max_pending: 5,
            },
            Changes::default(),
            Events::default(),
            Metrics::default(),
        )
    }

    fn form(registry: &Registry, call: Option<&str>) -> Pending {
        let params = json!({"message": "Confirm?", "requestedSchema": {"type": "object",
            "properties": {"confirm": {"type": "boolean"}, "note": {"type": "string", "default": ""}}, "required": ["confirm"]}});
        registry
            .suspend(Suspension {
                params,
                server: "demo".into(),
                session: "ses-1".into(),
                call: call.map(Into::into),
                owner: None,
            })
            .unwrap()
    }

    fn answer(value: Value) -> Answer {
        serde_json::from_value(value).unwrap()
    }

    fn reply(pending: &mut Pending) -> Value {
        match pending.outcome.try_recv().unwrap() {
            Outcome::Reply(result) => serde_json::to_value(result).unwrap(),
            Outcome::Withdrawn => Value::Null,
        }
    }

    #[test]
    fn an_accept_fills_defaults_and_reaches_the_upstream_once() {
        let registry = registry(Duration::from_secs(60));
        let mut pending = form(&registry, Some("call-1"));
        let view = registry
            .answer(
                &pending.id,
                answer(json!({"ok": true, "data": {"confirm": true}})),
                "tester",
            )
            .unwrap()
            .view;
        assert_eq!(view.status, Status::Answered);
        assert_eq!(
            reply(&mut pending),
            json!({"action": "accept", "content": {"confirm": true, "note": ""}})
        );

        let replay = registry
            .answer(
                &pending.id,
                answer(json!({"ok": true, "data": {"confirm": true}})),
                "tester",
            )
            .unwrap()
            .view;
        assert_eq!(replay.resolved_at, view.resolved_at);
        let other = registry.answer(&pending.id, answer(json!({"ok": false})), "tester");
        assert!(matches!(other, Err(AnswerError::Conflict(_))));
    }

    #[test]
    fn an_invalid_accept_leaves_the_request_pending() {
        let registry = registry(Duration::from_secs(60));
        let pending = form(&registry, None);
        let error = registry
            .answer(
                &pending.id,
                answer(json!({"ok": true, "data": {"confirm": "yes"}})),
                "tester",
            )
            .unwrap_err();
        assert!(
            matches!(error, AnswerError::Invalid(ref v) if v[0].path == "/confirm"),
            "{error:?}"
        );
        assert_eq!(registry.get(&pending.id).unwrap().status, Status::Pending);
    }

    #[test]
    fn a_withdrawn_request_is_gone_and_sends_nothing() {
        let registry = registry(Duration::from_secs(60));
        let mut pending = form(&registry, None);
        assert_eq!(
            registry.cancel([pending.id.as_str()], "the upstream cancelled it", false),
            1
        );
        assert_eq!(reply(&mut pending), Value::Null);
        let error = registry
            .answer(
                &pending.id,
                answer(json!({"ok": false, "reason": "declined"})),
                "tester",
            )
            .unwrap_err();
        assert!(matches!(
            error,
            AnswerError::Gone {
                status: Status::Cancelled,
                ..
            }
        ));
        assert_eq!(
            registry.get(&pending.id).unwrap().detail.as_deref(),
            Some("the upstream cancelled it")
        );
    }

    #[test]
    fn an_answer_after_the_upstream_stopped_listening_is_gone() {
        let registry = registry(Duration::from_secs(60));
        let pending = form(&registry, None);
        let id = pending.id.clone();
        drop(pending);
        assert!(matches!(
            registry.answer(&id, answer(json!({"ok": false})), "tester"),
            Err(AnswerError::Gone { .. })
        ));
        assert_eq!(registry.get(&id).unwrap().status, Status::Cancelled);
    }

    #[tokio::test(start_paused = true)]
    async fn expiry_answers_cancel_and_records_an_expired_answer() {
        let registry = registry(Duration::from_secs(10));
        let shutdown = CancellationToken::new();
        tokio::spawn(registry.clone().reap(shutdown.clone()));
        let mut pending = form(&registry, None);
        let outcome = (&mut pending.outcome).await.unwrap();
        assert!(matches!(outcome, Outcome::Reply(ref r) if r.action == ElicitationAction::Cancel));
        let view = registry.get(&pending.id).unwrap();
        assert_eq!(view.status, Status::Expired);
        assert_eq!(
            serde_json::to_value(&view.answer).unwrap(),
            json!({"id": pending.id, "ok": false, "reason": "expired"})
        );
        assert!(matches!(
            registry.answer(&pending.id, answer(json!({"ok": true})), "tester"),
            Err(AnswerError::Gone { .. })
        ));
        shutdown.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn resolved_requests_are_forgotten_after_retention() {
        let registry = registry(Duration::from_secs(10));
        let pending = form(&registry, None);
        registry
            .answer(&pending.id, answer(json!({"ok": false})), "tester")
            .unwrap();
        tokio::time::advance(Duration::from_secs(59)).await;
        registry.reap_due(Instant::now());
        assert!(registry.get(&pending.id).is_some());
        tokio::time::advance(Duration::from_secs(2)).await;
        registry.reap_due(Instant::now());
        assert!(registry.get(&pending.id).is_none());
    }

    #[test]
    fn past_the_cap_a_suspension_is_refused() {
        let registry = registry(Duration::from_secs(60));
        let held: Vec<Pending> = (0..5).map(|_| form(&registry, None)).collect();
        let params = json!({"message": "one too many"});
        let refused = registry.suspend(Suspension {
            params,
            server: "demo".into(),
            session: "s".into(),
            call: None,
            owner: None,
        });
        assert!(matches!(refused, Err(SuspendError::Full(5))));
        registry
            .answer(&held[0].id, answer(json!({"ok": false})), "tester")
            .unwrap();
        assert!(
            registry
                .suspend(Suspension {
                    params: json!({}),
                    server: "demo".into(),
                    session: "s".into(),
                    call: None,
                    owner: None
                })
                .is_ok()
        );
    }

    #[test]
    fn a_schema_is_checked_once_and_its_data_shared() {
        let registry = registry(Duration::from_secs(60));
        let suspend = |schema: Value| {
            registry.suspend(Suspension {
                params: json!({"message": "Pick", "requestedSchema": schema}),
                server: "demo".into(),
                session: "ses-1".into(),
                call: None,
                owner: None,
            })
        };
        let unusable = json!({"type": "object", "properties": {"n": {"type": "integer", "minimum": "one"}}});
        for _ in 0..2 {
            assert!(matches!(suspend(unusable.clone()), Err(SuspendError::Unusable(_))));
        }
        let usable = json!({"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}});
        let first = suspend(usable.clone()).unwrap();
        let second = suspend(usable).unwrap();
        let data = |pending: &Pending| registry.get(&pending.id).unwrap().request.data.unwrap();
        assert!(Arc::ptr_eq(&data(&first), &data(&second)));
        assert_eq!(registry.pending_count(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_completion_marks_its_url_request_once_until_it_is_purged() {
        let registry = registry(Duration::from_secs(60));
        let url = |elicitation_id: &str| {
            registry
                .suspend(Suspension {
                    params: json!({"mode": "url", "message": "Sign in", "url": "https://example.com/a",
                        "elicitationId": elicitation_id}),
                    server: "demo".into(),
                    session: "ses-1".into(),
                    call: None,
                    owner: None,
                })
                .unwrap()
        };
        let first = url("e1");
        url("e2");
        assert!(!registry.complete("ses-2", "e1") && !registry.complete("ses-1", "nobody"));
        assert!(registry.complete("ses-1", "e1"));
        assert!(registry.get(&first.id).unwrap().completed_at.is_some());
        assert!(!registry.complete("ses-1", "e1"), "a second completion changes nothing");
        // Expired after the TTL, then purged after the retention: its key goes with it.
        tokio::time::advance(Duration::from_secs(61)).await;
        registry.reap_due(Instant::now());
        assert_eq!(
            registry.completions().len(),
            1,
            "e2's key stays while its Request is kept"
        );
        tokio::time::advance(Duration::from_secs(61)).await;
        registry.reap_due(Instant::now());
        assert!(registry.get(&first.id).is_none());
        assert!(registry.completions().is_empty());
    }

    #[test]
    fn listing_is_oldest_first_filtered_and_paged() {
        let registry = registry(Duration::from_secs(60));
        let ids: Vec<String> = (0..5)
            .map(|i| form(&registry, Some(if i % 2 == 0 { "a" } else { "b" })).id)
            .collect();
        let filter = Filter {
            status: Some(Status::Pending),
            call: Some("a".into()),
            ..Filter::default()
        };
        let (first, next) = registry.list(&filter, 0, 2);
        assert_eq!(
            first.iter().map(|v| v.request.id.clone()).collect::<Vec<_>>(),
            [ids[0].clone(), ids[2].clone()]
        );
        let (second, last) = registry.list(&filter, next.unwrap(), 2);
        assert_eq!(
            second.iter().map(|v| v.request.id.clone()).collect::<Vec<_>>(),
            [ids[4].clone()]
        );
        assert_eq!(last, None);
    }
}
