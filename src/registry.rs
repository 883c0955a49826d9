//! The Requests: raised from what upstreams ask, answered over REST, expired or cancelled otherwise — each
//! decided once by the store — and each outcome delivered to whatever waits on it in this process.
//!
//! A 2025-11-25 elicitation waits here, on a [`Waiting`], for as long as the upstream's request lives. A
//! 2026-07-28 round waits on nothing: once its last Request is resolved, its call is handed on to be
//! retried (see [`Registry::new`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rmcp::model::{ElicitResult, ElicitationAction};
use serde_json::Value;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{Notify, mpsc, oneshot};
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::auth::Principal;
use crate::decision::{self, Proposal, Rules, Upstream};
pub use crate::decision::{Refusal, may_answer};
use crate::elicitation;
use crate::feed::{Feed, Since};
use crate::forms::Forms;
use crate::ids::{CallId, RequestId, SessionId};
use crate::lock;
use crate::metrics::{Metric, Metrics};
use crate::posted::Posted;
use crate::records::{Event, Filter, RequestView, Status};
use crate::sampling;
use crate::store::{
    Answered, Asked, NewRequest, NewRound, Pending, PendingCap, PendingCaps, RaiseError, Resolution, Resolved, Retry,
    Store, StoreError,
};
use crate::suspension::{Answer, Request};
use crate::time::{Clock, Timestamp};
use crate::validation::Violation;

/// How many due Requests one pass of the reaper expires.
const EXPIRY_BATCH: usize = 1000;
/// The `detail` of an answered Request whose upstream withdrew it before the answer reached it.
const UNDELIVERED: &str = "withdrawn by the upstream before the answer reached it; the answer is kept for the record";

/// How soon a Request that another replica resolved is read again when reading it failed: its waiter here
/// has no other way to learn the outcome.
const REREAD: Duration = Duration::from_secs(1);

/// How Requests live and resolve.
#[derive(Debug, Clone)]
pub struct Policy {
    pub ttl: Duration,
    pub apply_defaults: bool,
    /// How many Requests may be pending, and what they may hold; past a cap new ones are refused.
    pub caps: PendingCaps,
    /// The largest elicitation one Request may hold (its params as sent: message and schema), in bytes.
    pub max_request_bytes: usize,
}

/// Where a Request comes from.
#[derive(Debug, Clone)]
pub struct Origin {
    /// The server that raised it.
    pub server: String,
    /// The session it arrived on; none for an approval, which no session has heard of (it outlives the
    /// session open when it is raised, and the process).
    pub session: Option<SessionId>,
    /// The call it belongs to, when the gateway can tell.
    pub call: Option<CallId>,
    /// The principal that owns that call, or else the session.
    pub owner: Option<String>,
}

/// What a Request waiting in this process receives once it is resolved.
#[derive(Debug)]
pub enum Outcome {
    /// Send this result upstream.
    Reply(ElicitResult),
    /// It was withdrawn or ended without a result to send; the detail says why.
    Withdrawn(String),
}

/// Whether the upstream hears of Requests that end without an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tell {
    /// It gets `cancel`.
    Cancel,
    /// It gets nothing (it withdrew them, or it is gone).
    Nothing,
}

/// A Request an answer resolved, or had already resolved (an identical answer posted again).
#[derive(Debug)]
pub struct AnswerAccepted {
    pub view: RequestView,
    /// The `request.resolved` event of this answer, whose data is the view as JSON; `None` for a repeat.
    pub event: Option<Arc<Event>>,
}

/// Why an Answer was not taken.
#[derive(Debug, thiserror::Error)]
pub enum AnswerError {
    #[error("no Request with id {0}")]
    NotFound(String),
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error("Request {0} was already answered with a different answer")]
    Conflict(RequestId),
    /// The principal approved the pending Request already, and now answers otherwise.
    #[error("{by} approved Request {id} already, and may not change that answer")]
    Approved { id: RequestId, by: String },
    #[error("Request {id} is no longer answerable: it is {}", status.as_str())]
    Gone { id: RequestId, status: Status },
    #[error("{}", invalid(.0))]
    Invalid(Vec<Violation>),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What an answer's violations come to, by where they are: the standing grant it asks for, the approved call's
/// changed arguments, or the data the Request asked for.
pub(crate) fn invalid(violations: &[Violation]) -> &'static str {
    let all_under = |pointer: &str| {
        violations.iter().all(|violation| {
            violation
                .path
                .strip_prefix(pointer)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
        })
    };
    if all_under("/grant") {
        "the answer asks for a standing grant this approval cannot give"
    } else if all_under("/arguments") {
        "the approval's arguments cannot be changed as the answer asks"
    } else {
        "the answer data does not satisfy the requested schema"
    }
}

/// Why what an upstream asked did not become Requests.
#[derive(Debug, thiserror::Error)]
pub enum AskError {
    /// The elicitation is not one the gateway can show (its params, or a schema that is not a flat form).
    #[error("{0}")]
    Unusable(String),
    #[error(transparent)]
    Full(PendingCap),
    /// The call it belongs to has ended: nothing would take the answer.
    #[error("call {0} has ended")]
    CallEnded(CallId),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Why a posted Request was not raised.
#[derive(Debug, thiserror::Error)]
pub enum PostError {
    /// A Request with its id exists already.
    #[error("a Request with id {0} exists already")]
    Duplicate(RequestId),
    /// It is larger than one Request may hold, or its schema cannot be compiled.
    #[error("{0}")]
    Unusable(String),
    #[error(transparent)]
    Full(PendingCap),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<RaiseError> for AskError {
    fn from(error: RaiseError) -> Self {
        match error {
            RaiseError::Full(cap) => AskError::Full(cap),
            RaiseError::CallEnded(call) => AskError::CallEnded(call),
            // Minted ids are never taken; the store says so all the same.
            RaiseError::Taken(id) => AskError::Unusable(format!("a Request with id {id} exists already")),
            RaiseError::Store(error) => AskError::Store(error),
        }
    }
}

/// A 2025-11-25 elicitation raised as a Request, waiting for its outcome.
#[derive(Debug)]
pub struct Waiting {
    pub id: RequestId,
    outcome: oneshot::Receiver<Outcome>,
    /// Tells an answer decided after this is dropped that nothing waits for it any more.
    _stopped: DropGuard,
}

impl Waiting {
    /// The result to send upstream, or why there is none.
    pub async fn outcome(&mut self) -> Outcome {
        (&mut self.outcome)
            .await
            .unwrap_or_else(|_| Outcome::Withdrawn("the gateway stopped waiting for it".to_owned()))
    }
}

/// The Requests; cheap to clone.
#[derive(Debug, Clone)]
pub struct Registry {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    store: Store,
    policy: Policy,
    rules: Arc<Rules>,
    metrics: Metrics,
    /// The 2025-11-25 elicitations waiting in this process, by Request id.
    waiters: Mutex<HashMap<RequestId, Waiter>>,
    /// Followed from before each answer, so that the call it resumes knows whether it ended since.
    feed: Feed,
    /// Told the calls whose round was just completed, with what retrying each takes.
    resumes: mpsc::UnboundedSender<Resume>,
    /// Wakes the reaper when a Request may expire sooner than it planned.
    reaper: Notify,
    /// When the reaper plans to look next (`None`: not until woken).
    reaper_at: Mutex<Option<Timestamp>>,
}

#[derive(Debug)]
struct Waiter {
    reply: oneshot::Sender<Outcome>,
    /// Handed to the store with each answer: an answer after the upstream withdrew is `410`.
    upstream: Upstream,
}

/// A call whose round is completed, to be retried.
pub struct Resume {
    pub retry: Retry,
    /// The events from just before the change that completed the round, where they were followed: they tell
    /// whether the call ended since without reading the store.
    pub seen: Option<Since>,
}

impl Registry {
    /// The Requests kept in `store`, whose changes `feed` tells; each call whose 2026-07-28 round is completed is
    /// sent to `resumes`.
    pub fn new(
        store: Store,
        feed: Feed,
        policy: Policy,
        metrics: Metrics,
        resumes: mpsc::UnboundedSender<Resume>,
    ) -> Self {
        Self {
            shared: Arc::new(Shared {
                store,
                rules: Arc::new(Rules {
                    apply_defaults: policy.apply_defaults,
                    forms: Arc::new(Forms::default()),
                }),
                policy,
                metrics,
                waiters: Mutex::default(),
                feed,
                resumes,
                reaper: Notify::new(),
                reaper_at: Mutex::new(None),
            }),
        }
    }

    /// Raises a 2025-11-25 elicitation (or a `-32042` URL elicitation) as a Request to wait on here;
    /// `withdrawn` fires if the upstream withdraws it.
    pub async fn ask(&self, params: Value, origin: &Origin, withdrawn: CancellationToken) -> Result<Waiting, AskError> {
        let new = self.new_request(&params, origin, None)?;
        self.wait_on(new, &origin.server, withdrawn).await
    }

    /// Raises the Request of a 2025-11-25 `sampling/createMessage` (see [`crate::sampling`]) to wait on here, as
    /// [`Registry::ask`] does an elicitation's.
    pub async fn ask_sampling(
        &self,
        params: Value,
        origin: &Origin,
        withdrawn: CancellationToken,
    ) -> Result<Waiting, AskError> {
        let new = self.new_sampling(&params, origin, None)?;
        self.wait_on(new, &origin.server, withdrawn).await
    }

    /// Raises one Request to wait on here for its outcome; `withdrawn` fires if what raised it stops waiting.
    async fn wait_on(&self, new: NewRequest, server: &str, withdrawn: CancellationToken) -> Result<Waiting, AskError> {
        let id = new.request.id.clone();
        // Registered first, so that an answer arriving as soon as the Request is visible finds it.
        let waiting = self.wait_here(&id, withdrawn);
        if let Err(error) = self.raise(vec![new], None, server).await {
            self.waiters().remove(&id);
            return Err(error.into());
        }
        Ok(waiting)
    }

    /// Registers a waiter here for Request `id`, which `withdrawn` fires on if the upstream withdraws it.
    fn wait_here(&self, id: &RequestId, withdrawn: CancellationToken) -> Waiting {
        let (reply, outcome) = oneshot::channel();
        let stopped = CancellationToken::new();
        let upstream = Upstream {
            withdrawn,
            stopped: stopped.clone(),
        };
        self.waiters().insert(id.to_owned(), Waiter { reply, upstream });
        Waiting {
            id: id.to_owned(),
            outcome,
            _stopped: stopped.drop_guard(),
        }
    }

    /// `what` of `bytes` as JSON fits in one Request, or says why not.
    fn fits(&self, what: &str, bytes: usize) -> Result<(), String> {
        let most = self.shared.policy.max_request_bytes;
        if bytes > most {
            return Err(format!(
                "{what} is {bytes} bytes, more than the {most} one Request may hold (requests.max_request_bytes)"
            ));
        }
        Ok(())
    }

    /// A Request raised for `origin` now, due after `ttl`, holding `bytes` against the caps.
    fn at_origin(&self, mut request: Request, origin: &Origin, ttl: Duration, bytes: usize) -> NewRequest {
        let created_at = self.clock().now();
        let deadline = created_at.after(ttl);
        request.expires_at = Some(deadline.rfc3339());
        NewRequest {
            request,
            created_at,
            deadline,
            server: Some(origin.server.clone()),
            session: origin.session.clone(),
            call: origin.call.clone(),
            owner: origin.owner.clone(),
            elicitation_id: None,
            input_key: None,
            bytes,
        }
    }

    /// Raises the input requests of a 2026-07-28 round as Requests, all of them or none: each of the round's
    /// `inputRequests` that a person answers (an `elicitation/create`, a `sampling/createMessage`) becomes one
    /// Request, keyed as the upstream keyed it; `roots/list` is answered from the config. None expires later
    /// than `by` (a task's end), when given.
    pub async fn ask_round(
        &self,
        round: NewRound,
        origin: &Origin,
        by: Option<Timestamp>,
    ) -> Result<Vec<RequestView>, AskError> {
        let mut requests = round
            .input_requests
            .iter()
            .filter_map(|(key, request)| {
                let params = request.get("params").cloned().unwrap_or_default();
                match Asked::of(request) {
                    Some(Asked::Roots) => None,
                    Some(Asked::Sampling) => Some(self.new_sampling(&params, origin, Some(key.clone()))),
                    _ => Some(self.new_request(&params, origin, Some(key.clone()))),
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        for new in requests.iter_mut().filter(|new| by.is_some_and(|by| by < new.deadline)) {
            new.deadline = by.unwrap_or(new.deadline);
            new.request.expires_at = Some(new.deadline.rfc3339());
        }
        Ok(self.raise(requests, Some(round), &origin.server).await?)
    }

    /// Raises the approval a call needs before it is forwarded, to wait on here; it expires after `ttl`, or
    /// `requests.ttl` when that is `None`.
    pub async fn ask_approval(
        &self,
        request: Request,
        ttl: Option<Duration>,
        origin: &Origin,
    ) -> Result<Waiting, AskError> {
        let bytes = crate::records::json_size(&request);
        self.fits("the approval", bytes).map_err(AskError::Unusable)?;
        let new = self.at_origin(request, origin, ttl.unwrap_or(self.shared.policy.ttl), bytes);
        // Nothing upstream can withdraw an approval; cancelling the call cancels it in the store.
        self.wait_on(new, &origin.server, CancellationToken::new()).await
    }

    /// Waits here on an approval raised before this process started; resolves at once if it is resolved
    /// already.
    pub async fn wait_on_approval(&self, id: &RequestId) -> Result<Waiting, StoreError> {
        // Registered first, so that an answer committed after the status is read finds it.
        let waiting = self.wait_here(id, CancellationToken::new());
        let status = self.status(id).await;
        if !matches!(status, Ok(Some((Status::Pending, _)))) {
            if let Some(waiter) = self.waiters().remove(id) {
                let _ = waiter
                    .reply
                    .send(Outcome::Withdrawn("resolved before this start".to_owned()));
            }
            status?;
        }
        Ok(waiting)
    }

    /// Raises a Request a toolnexus host posted, owned by `owner`: it has no server, session or call, and
    /// nothing upstream waits on it; its poster reads the Answer.
    pub async fn post(&self, posted: Posted, owner: &str) -> Result<RequestView, PostError> {
        let Posted { mut request, deadline } = posted;
        let bytes = crate::records::json_size(&request);
        self.fits("the Request", bytes).map_err(PostError::Unusable)?;
        if let Some(data) = request.data.take() {
            request.data = Some(self.shared.rules.forms.share(data).map_err(PostError::Unusable)?.data);
        }
        let created_at = self.clock().now();
        let deadline = deadline.unwrap_or_else(|| created_at.after(self.shared.policy.ttl));
        request.expires_at = Some(deadline.rfc3339());
        let new = NewRequest {
            request,
            created_at,
            deadline,
            server: None,
            session: None,
            call: None,
            owner: Some(owner.to_owned()),
            elicitation_id: None,
            input_key: None,
            bytes,
        };
        match self.raise(vec![new], None, "").await {
            Ok(mut views) => Ok(views.remove(0)),
            Err(RaiseError::Full(cap)) => Err(PostError::Full(cap)),
            Err(RaiseError::Taken(id)) => Err(PostError::Duplicate(id)),
            Err(RaiseError::Store(error)) => Err(PostError::Store(error)),
            Err(RaiseError::CallEnded(call)) => Err(PostError::Unusable(format!("call {call} has ended"))),
        }
    }

    async fn raise(
        &self,
        requests: Vec<NewRequest>,
        round: Option<NewRound>,
        server: &str,
    ) -> Result<Vec<RequestView>, RaiseError> {
        let count = requests.len();
        let soonest = requests.iter().map(|request| request.deadline).min();
        let views = match self.shared.store.raise(requests, round, self.shared.policy.caps).await {
            Ok(views) => views,
            Err(RaiseError::Full(cap)) => {
                for _ in 0..count {
                    self.shared.metrics.inc(Metric::RequestsRejected, &[("server", server)]);
                }
                return Err(RaiseError::Full(cap));
            }
            Err(refused) => return Err(refused),
        };
        let planned = *lock(&self.shared.reaper_at);
        if soonest.is_some_and(|soonest| planned.is_none_or(|planned| soonest < planned)) {
            self.shared.reaper.notify_one();
        }
        for view in &views {
            self.shared
                .metrics
                .inc(Metric::RequestsCreated, &[("server", server_label(view))]);
            tracing::info!(
                request = %view.request.id,
                server = server_label(view),
                session = view.session.as_ref().map(SessionId::as_str).unwrap_or_default(),
                call = view.call.as_ref().map(CallId::as_str).unwrap_or(""),
                kind = %view.request.kind,
                "request created"
            );
        }
        Ok(views)
    }

    /// The Request `to_request` makes of an upstream's params (`what`, in errors), if they are within the size
    /// bound, with its data shared with every Request of the same schema; and their size.
    fn shaped(
        &self,
        what: &str,
        params: &Value,
        to_request: fn(&Value) -> Request,
    ) -> Result<(Request, usize), AskError> {
        let bytes = crate::records::json_size(params);
        self.fits(what, bytes).map_err(AskError::Unusable)?;
        let mut request = to_request(params);
        if let Some(data) = request.data.take() {
            request.data = Some(self.shared.rules.forms.share(data).map_err(AskError::Unusable)?.data);
        }
        Ok((request, bytes))
    }

    /// A Request for a sampling request's `params` (see [`crate::sampling`]), due after `requests.ttl`.
    fn new_sampling(&self, params: &Value, origin: &Origin, input_key: Option<String>) -> Result<NewRequest, AskError> {
        sampling::check_params(params).map_err(AskError::Unusable)?;
        let (request, bytes) = self.shaped("the sampling request", params, sampling::sampling_to_request)?;
        Ok(NewRequest {
            input_key,
            ..self.at_origin(request, origin, self.shared.policy.ttl, bytes)
        })
    }

    /// A Request for elicitation params, with its data shared with every Request of the same schema.
    fn new_request(&self, params: &Value, origin: &Origin, input_key: Option<String>) -> Result<NewRequest, AskError> {
        elicitation::check_params(params).map_err(AskError::Unusable)?;
        let (request, bytes) = self.shaped("the elicitation", params, elicitation::elicitation_to_request)?;
        let elicitation_id = params
            .get("elicitationId")
            .and_then(Value::as_str)
            .filter(|id| !id.is_empty())
            .map(str::to_owned);
        Ok(NewRequest {
            elicitation_id,
            input_key,
            ..self.at_origin(request, origin, self.shared.policy.ttl, bytes)
        })
    }

    /// Whether `by` may answer Request `id` as it is now: what a door asks before an answer has effects of its
    /// own (a long-poll held, the other answers of one message). Who owns a Request, its kind and its
    /// policy's approvers never change; [`Registry::answer`] decides again all the same.
    pub async fn check_answerer(&self, id: &RequestId, by: &Principal) -> Result<(), AnswerError> {
        let view = self
            .get(id)
            .await?
            .ok_or_else(|| AnswerError::NotFound(id.to_string()))?;
        Ok(may_answer(&view, by)?)
    }

    /// Resolves a pending Request with `by`'s Answer, if `by` may answer it (see [`may_answer`]), and sends the
    /// mapped `ElicitResult` to whatever waits on it.
    ///
    /// Posting the identical answer again returns the same Request.
    pub async fn answer(
        &self,
        id: &RequestId,
        by: &Principal,
        mut answer: Answer,
    ) -> Result<AnswerAccepted, AnswerError> {
        answer.id = id.to_string();
        let proposal = Proposal {
            answer,
            by: by.clone(),
            upstream: self.waiters().get(id).map(|waiter| waiter.upstream.clone()),
            rules: self.shared.rules.clone(),
        };
        let answer = proposal.answer.clone();
        let seen = self.shared.feed.since();
        match self.shared.store.answer(id, proposal).await? {
            Answered::Won { view, event, resumes } => {
                self.settled(std::slice::from_ref(&view), Tell::Cancel);
                if let Some(retry) = resumes {
                    self.resume(*retry, Some(seen));
                }
                Ok(AnswerAccepted {
                    view,
                    event: Some(event),
                })
            }
            Answered::Withdrawn(view) => {
                self.settled(std::slice::from_ref(&view), Tell::Nothing);
                Err(AnswerError::Gone {
                    id: id.to_owned(),
                    status: view.status,
                })
            }
            Answered::Counted { view, event } => Ok(AnswerAccepted {
                view,
                event: Some(event),
            }),
            Answered::Again(view) => Ok(AnswerAccepted { view, event: None }),
            Answered::Changed(view) => Err(AnswerError::Approved {
                id: view.request.id,
                by: by.name.clone(),
            }),
            Answered::Lost(view) => {
                let rules = &self.shared.rules;
                let recorded = rules
                    .recorded(&view, answer.clone())
                    .unwrap_or_else(|_| rules.applied(&view, answer));
                repeat(view, &recorded)
            }
            Answered::Refused(refusal) => Err(refusal.into()),
            Answered::Invalid(violations) => Err(AnswerError::Invalid(violations)),
            Answered::NotFound => Err(AnswerError::NotFound(id.to_string())),
        }
    }

    /// Resolves pending Requests without an answer; returns how many were still pending.
    pub async fn cancel(&self, which: Pending, detail: &str, tell: Tell) -> Result<usize, StoreError> {
        let resolution = Resolution::Cancelled {
            detail: detail.to_owned(),
            told_cancel: tell == Tell::Cancel,
        };
        let resolved = self.shared.store.resolve(which, resolution).await?;
        self.settled(&resolved.views, tell);
        self.resume_all(resolved.resumes);
        Ok(resolved.views.len())
    }

    /// The upstream withdrew the elicitation behind a Request: it is cancelled unless something resolved it
    /// first, in which case that outcome is on its way to the `Waiting`.
    pub async fn withdraw(&self, id: &RequestId) -> bool {
        let cancelled = self
            .cancel(Pending::Ids(vec![id.to_owned()]), decision::WITHDREW, Tell::Nothing)
            .await;
        matches!(cancelled, Ok(1))
    }

    /// The upstream withdrew the elicitation behind an answered Request before the answer reached it: the
    /// Request says so, and becomes `cancelled`, as the upstream saw it.
    pub async fn undelivered(&self, id: &RequestId) {
        match self.shared.store.undelivered(id, UNDELIVERED).await {
            Ok(Some(view)) => tracing::info!(
                request = %view.request.id,
                server = server_label(&view),
                session = view.session.as_ref().map(SessionId::as_str).unwrap_or_default(),
                "request cancelled: the upstream withdrew it before the answer reached it"
            ),
            Ok(None) => {}
            Err(error) => tracing::warn!(%error, request = %id, "an undelivered answer could not be recorded"),
        }
    }

    /// Delivers what ended Requests resolved elsewhere (with their call) means to whatever waits on them.
    pub fn deliver(&self, resolved: Resolved, tell: Tell) {
        self.settled(&resolved.views, tell);
        self.resume_all(resolved.resumes);
    }

    /// Records `notifications/elicitation/complete` on the matching URL-mode Request of a session.
    pub async fn complete(&self, session: &SessionId, elicitation_id: &str) -> bool {
        self.shared
            .store
            .complete(session, elicitation_id)
            .await
            .unwrap_or_else(|error| {
                tracing::warn!(%error, %session, "a URL-mode completion could not be recorded");
                false
            })
    }

    /// How many Requests are pending.
    pub async fn pending_count(&self) -> Result<usize, StoreError> {
        self.shared.store.pending_count().await
    }

    /// One Request by id.
    pub async fn get(&self, id: &RequestId) -> Result<Option<RequestView>, StoreError> {
        self.shared.store.request(id).await
    }

    /// The status and owner of one Request, without reading the rest.
    pub async fn status(&self, id: &RequestId) -> Result<Option<(Status, Option<String>)>, StoreError> {
        self.shared.store.request_status(id).await
    }

    /// Up to `limit` Requests matching the filter, oldest first, starting at `cursor`; and the next page's cursor.
    pub async fn list(
        &self,
        filter: &Filter,
        cursor: u64,
        limit: usize,
    ) -> Result<(Vec<RequestView>, Option<u64>), StoreError> {
        self.shared.store.requests(filter, cursor, limit).await
    }

    /// Expires due Requests until `shutdown`.
    pub async fn reap(self, shutdown: CancellationToken) {
        loop {
            // Unknown while the pass runs, so that a Request raised meanwhile wakes the next pass.
            *lock(&self.shared.reaper_at) = None;
            let next = match self.expire_due().await {
                Ok(next) => next,
                Err(error) => {
                    tracing::warn!(%error, "expiring Requests failed; trying again in a second");
                    Some(self.clock().now().after(Duration::from_secs(1)))
                }
            };
            *lock(&self.shared.reaper_at) = next;
            let sleep = async {
                match next {
                    Some(when) => self.clock().sleep_until(when).await,
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

    /// Expires what is due now; returns when the next Request is due.
    async fn expire_due(&self) -> Result<Option<Timestamp>, StoreError> {
        self.expire_at(self.clock().now()).await
    }

    /// Expires what is due at `now`; returns when the next Request is due.
    async fn expire_at(&self, now: Timestamp) -> Result<Option<Timestamp>, StoreError> {
        loop {
            let resolved = self.shared.store.expire_due(now, EXPIRY_BATCH).await?;
            let more = resolved.views.len() == EXPIRY_BATCH;
            self.deliver(resolved, Tell::Cancel);
            if !more {
                return self.shared.store.next_deadline().await;
            }
        }
    }

    /// Hands each resolved Request's outcome to its waiter here, and counts and logs its resolution.
    fn settled(&self, views: &[RequestView], tell: Tell) {
        for view in views {
            self.hand_over(view, tell);
            log_resolution(view);
            // A posted Request has no result: its answer is counted as the result it would map to.
            let outcome = match (view.status, &view.result, &view.answer) {
                (Status::Answered, Some(result), _) => action_name(&result.action),
                (Status::Answered, None, Some(answer)) => {
                    action_name(&elicitation::answer_to_elicit_result(answer).action)
                }
                (status, _, _) => status.as_str(),
            };
            let metrics = &self.shared.metrics;
            metrics.inc(
                Metric::RequestsResolved,
                &[("server", server_label(view)), ("outcome", outcome)],
            );
            let age = self.clock().since(view.created_at).as_secs_f64();
            metrics.observe(Metric::RequestResolution, &[("server", server_label(view))], age);
        }
    }

    /// The clock Requests are raised, expired and stamped by: the store's.
    pub fn clock(&self) -> &Clock {
        self.shared.store.clock()
    }

    /// Hands a resolved Request's outcome to its waiter here, if it has one.
    fn hand_over(&self, view: &RequestView, tell: Tell) {
        if let Some(waiter) = self.waiters().remove(&view.request.id) {
            let outcome = match (&view.result, tell, view.status) {
                (Some(result), _, Status::Answered | Status::Expired) | (Some(result), Tell::Cancel, _) => {
                    Outcome::Reply(ElicitResult::clone(result))
                }
                _ => Outcome::Withdrawn(view.detail.clone().unwrap_or_default()),
            };
            let _ = waiter.reply.send(outcome);
        }
    }

    /// Hands the outcome of Requests waiting here that another replica resolved to their waiters, as the
    /// events of `feed` tell (published, or committed ahead of that), until `shutdown`; one whose read fails is
    /// read again at the next event or after [`REREAD`], until it is read or nothing here waits on it. Whoever
    /// resolved them counted and logged them.
    pub async fn follow_replicas(self, feed: Feed, shutdown: CancellationToken) {
        let mut events = feed.since();
        // Resolved elsewhere, but not read: their event has passed, so they are read again until they are.
        let mut unread: Vec<RequestId> = Vec::new();
        loop {
            let event = tokio::select! {
                event = events.next() => Some(event),
                () = tokio::time::sleep(REREAD), if !unread.is_empty() => None,
                () = shutdown.cancelled() => return,
            };
            let mut ids = std::mem::take(&mut unread);
            match event {
                Some(Ok(event)) => ids.extend(self.resolved_elsewhere(&event)),
                // After missing events: each Request waiting here is read.
                Some(Err(RecvError::Lagged(_))) => ids.extend(self.waiters().keys().cloned()),
                Some(Err(RecvError::Closed)) => return,
                None => {}
            }
            ids.sort_unstable();
            ids.dedup();
            for id in ids {
                match self.shared.store.request(&id).await {
                    Ok(Some(view)) if view.status != Status::Pending => self.hand_over(&view, Tell::Cancel),
                    Ok(_) => {}
                    Err(error) => {
                        tracing::warn!(%error, request = %id, "a Request resolved elsewhere could not be read; it is read again");
                        unread.push(id);
                    }
                }
            }
            unread.retain(|id| self.waiters().contains_key(id));
        }
    }

    /// The Requests waiting here that `event` may have resolved.
    fn resolved_elsewhere(&self, event: &Event) -> Vec<RequestId> {
        #[derive(serde::Deserialize)]
        struct Named {
            id: RequestId,
        }
        if event.kind != crate::records::EventKind::RequestResolved {
            return Vec::new();
        }
        // Without the event's data, each Request waiting here is read.
        if !event.has_data() {
            return self.waiters().keys().cloned().collect();
        }
        match serde_json::from_str::<Named>(&event.data) {
            Ok(named) if self.waiters().contains_key(&named.id) => vec![named.id],
            _ => Vec::new(),
        }
    }

    /// Hands on a call whose round is answered, to be retried, with the events `seen` from before the change
    /// that answered it, if they were followed.
    pub fn resume(&self, retry: Retry, seen: Option<Since>) {
        let _ = self.shared.resumes.send(Resume { retry, seen });
    }

    fn resume_all(&self, retries: impl IntoIterator<Item = Retry>) {
        for retry in retries {
            self.resume(retry, None);
        }
    }

    fn waiters(&self) -> MutexGuard<'_, HashMap<RequestId, Waiter>> {
        lock(&self.shared.waiters)
    }
}

#[cfg(test)]
impl Registry {
    /// A registry of Requests that live `ttl`, without caps, on the store at `location` opened as replica
    /// `name`; and that store.
    async fn opened(location: &crate::store::Location, name: &str, ttl: Duration) -> (Store, Self) {
        let feed = Feed::default();
        let store = Store::open(
            location,
            feed.clone(),
            Duration::from_secs(86_400),
            name,
            Clock::default(),
        )
        .await
        .unwrap();
        let policy = Policy {
            ttl,
            apply_defaults: true,
            caps: crate::store::PendingCaps::NONE,
            max_request_bytes: usize::MAX,
        };
        let (resumes, _) = mpsc::unbounded_channel();
        (
            store.clone(),
            Self::new(store, feed, policy, Metrics::default(), resumes),
        )
    }
}

/// An answer to a Request already resolved: the same answer again is that Request, another is refused.
fn repeat(view: RequestView, answer: &Answer) -> Result<AnswerAccepted, AnswerError> {
    match view.status {
        Status::Answered if view.answer.as_deref() == Some(answer) => Ok(AnswerAccepted { view, event: None }),
        Status::Answered => Err(AnswerError::Conflict(view.request.id)),
        status => Err(AnswerError::Gone {
            id: view.request.id,
            status,
        }),
    }
}

/// The server a Request is counted and logged under: `""` for a posted one.
fn server_label(view: &RequestView) -> &str {
    view.server.as_deref().unwrap_or_default()
}

fn action_name(action: &ElicitationAction) -> &'static str {
    match action {
        ElicitationAction::Accept => "accept",
        ElicitationAction::Decline => "decline",
        _ => "cancel",
    }
}

/// Logs how a Request ended: the keys of its answer's data, never the values.
fn log_resolution(view: &RequestView) {
    let answer = view.answer.as_deref();
    let keys: Vec<&str> = answer
        .and_then(|answer| answer.data.as_ref())
        .map(|data| data.keys().map(String::as_str).collect())
        .unwrap_or_default();
    tracing::info!(
        request = %view.request.id,
        server = server_label(view),
        session = view.session.as_ref().map(SessionId::as_str).unwrap_or_default(),
        call = view.call.as_ref().map(CallId::as_str).unwrap_or(""),
        status = view.status.as_str(),
        ok = answer.map(Answer::ok),
        answered_by = view.answered_by.as_deref().unwrap_or(""),
        reason = ?answer.and_then(Answer::reason),
        data_keys = ?keys,
        detail = view.detail.as_deref().unwrap_or(""),
        "request resolved"
    );
}

#[cfg(test)]
mod answering;
#[cfg(test)]
mod properties;
#[cfg(test)]
mod replicas;
