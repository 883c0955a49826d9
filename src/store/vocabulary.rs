//! The store's vocabulary: what its verbs take and give, in domain terms only, whichever engine keeps it.

use std::sync::Arc;

use serde_json::{Map, Value};

use crate::decision::{Refusal, Undecided};
use crate::ids::{CallId, RequestId, SessionId};
use crate::records::{Arguments, CallView, Event, RequestView, Via};
use crate::store::PendingCap;
use crate::suspension::Request;
use crate::time::Timestamp;
use crate::validation::Violation;

/// Why the store could not keep a change, or read what it holds.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The database refused the write or the read (disk full, I/O error); nothing was changed.
    #[error("the store cannot be used right now: {0}")]
    Unavailable(String),
}

/// Why a store cannot be opened.
#[derive(Debug, thiserror::Error)]
#[error("store {path}: {cause}")]
pub struct OpenError {
    pub path: String,
    pub cause: String,
}

/// A Request about to be raised.
#[derive(Debug, Clone)]
pub struct NewRequest {
    /// The §10 Request, with its id and `expiresAt`.
    pub request: Request,
    pub created_at: Timestamp,
    /// When it expires (its `expiresAt`).
    pub deadline: Timestamp,
    /// The server and session it arrived on; `None` for a Request posted to `POST /requests`.
    pub server: Option<String>,
    pub session: Option<SessionId>,
    pub call: Option<CallId>,
    pub owner: Option<String>,
    /// The `elicitationId` of a URL-mode elicitation, to match the upstream's completion notification.
    pub elicitation_id: Option<String>,
    /// Its key in the `inputRequests` of its call's latest round (2026-07-28); `None` for an elicitation
    /// request, which lives only as long as the upstream's request does.
    pub input_key: Option<String>,
    /// What it holds while pending: the size of what the upstream asked, message and schema.
    pub bytes: usize,
}

/// A 2026-07-28 round: what an `input_required` result asked, to be answered and echoed back.
#[derive(Debug, Clone, PartialEq)]
pub struct NewRound {
    pub call: CallId,
    /// 1 for the call's first `input_required` result, and so on.
    pub number: u32,
    /// The `requestState` as the upstream sent it, to be echoed byte for byte.
    pub request_state: Option<String>,
    /// The `inputRequests` as the upstream sent them.
    pub input_requests: Map<String, Value>,
}

/// What an input request of a round asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asked {
    /// `elicitation/create`: a Request of its own.
    Elicitation,
    /// `sampling/createMessage`: a Request of kind `sampling`.
    Sampling,
    /// `roots/list`: answered from the server's config, with no Request.
    Roots,
}

impl Asked {
    /// What an input request (`{"method", "params"}`) asks for; `None` for what the gateway does not provide.
    pub fn of(request: &Value) -> Option<Self> {
        match request.get("method").and_then(Value::as_str)? {
            "elicitation/create" => Some(Self::Elicitation),
            "sampling/createMessage" => Some(Self::Sampling),
            "roots/list" => Some(Self::Roots),
            _ => None,
        }
    }

    /// What each of a round's input requests asks for, as the round's JSON keeps them; an unknown method counts
    /// as an elicitation (the round was raised only once each was known).
    pub fn of_round(input_requests: &Map<String, Value>) -> Vec<(String, Self)> {
        input_requests
            .iter()
            .map(|(key, request)| (key.clone(), Self::of(request).unwrap_or(Self::Elicitation)))
            .collect()
    }
}

/// Why Requests were not raised.
#[derive(Debug, thiserror::Error)]
pub enum RaiseError {
    #[error(transparent)]
    Full(#[from] PendingCap),
    /// Their call has ended (or is unknown): nothing would take their answers.
    #[error("call {0} has ended")]
    CallEnded(CallId),
    /// A posted Request's id is taken by a Request kept already.
    #[error("a Request with id {0} exists already")]
    Taken(RequestId),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The ids of `requests` that their posters chose (a minted id is never taken), to be checked as not taken.
pub(crate) fn chosen_ids(requests: &[NewRequest]) -> impl Iterator<Item = &RequestId> {
    requests
        .iter()
        .filter(|new| new.server.is_none())
        .map(|new| &new.request.id)
}

/// What deciding an answer came to.
#[derive(Debug)]
pub enum Answered {
    /// This answer resolved the Request.
    Won {
        view: RequestView,
        /// The `request.resolved` event it recorded.
        event: Arc<Event>,
        /// The call whose round this answer completed, to be retried.
        resumes: Option<Box<Retry>>,
    },
    /// The upstream had withdrawn the elicitation: the Request is now `cancelled`.
    Withdrawn(RequestView),
    /// This answer is one approval of the several the Request needs: recorded, and the Request stays pending.
    Counted {
        view: RequestView,
        /// The `request.updated` event it recorded.
        event: Arc<Event>,
    },
    /// Its principal approved the pending Request already: nothing changed.
    Again(RequestView),
    /// Its principal approved the pending Request already, and answered otherwise now: nothing changed.
    Changed(RequestView),
    /// The Request was resolved already (by this same answer, perhaps).
    Lost(RequestView),
    /// The principal may not answer the Request.
    Refused(Refusal),
    /// The answer does not fit the Request, which stays pending.
    Invalid(Vec<Violation>),
    NotFound,
}

impl Answered {
    /// What an answer that decided nothing comes to, on the Request as the store read it.
    pub(crate) fn undecided(undecided: Undecided, view: RequestView) -> Self {
        match undecided {
            Undecided::Refused(refusal) => Answered::Refused(refusal),
            Undecided::Resolved => Answered::Lost(view),
            Undecided::Invalid(violations) => Answered::Invalid(violations),
            Undecided::Again => Answered::Again(view),
            Undecided::Changed => Answered::Changed(view),
        }
    }
}

/// How pending Requests end without an answer.
#[derive(Debug, Clone)]
pub enum Resolution {
    /// Their time ran out: the answer recorded is `expired` and the upstream gets `cancel`.
    Expired,
    /// They were cancelled, for `detail`; with `told_cancel` the upstream gets `cancel`, otherwise nothing.
    Cancelled { detail: String, told_cancel: bool },
}

/// Which pending Requests a resolution applies to.
#[derive(Debug, Clone)]
pub enum Pending {
    Ids(Vec<RequestId>),
    /// The elicitation requests (2025-11-25) raised on a session, which cannot outlive it.
    Session(SessionId),
    /// Elicitation requests (2025-11-25), which cannot outlive the upstream request they answer: those raised
    /// on a session outside a round (posted Requests and approvals, which no upstream request waits on, are
    /// not among them).
    Elicitations,
    /// Every one.
    All,
}

/// Requests resolved without an answer.
#[derive(Debug, Default)]
pub struct Resolved {
    pub views: Vec<RequestView>,
    /// Calls whose round this completed, to be retried.
    pub resumes: Vec<Retry>,
}

impl Resolved {
    /// Adds what `more` resolved after this.
    pub fn add(&mut self, more: Resolved) {
        self.views.extend(more.views);
        self.resumes.extend(more.resumes);
    }
}

/// A call about to start.
#[derive(Debug, Clone)]
pub struct NewCall {
    pub server: String,
    pub session: SessionId,
    /// Whether the session is the server's shared one, which a retry after a restart may replace.
    pub shared: bool,
    pub tool: String,
    /// The arguments exactly as they are sent upstream.
    pub arguments: Arguments,
    pub owner: String,
    pub via: Via,
    /// The protocol version of the session it starts on.
    pub protocol_version: Option<String>,
    /// The client capabilities the gateway declared on that session.
    pub capabilities: Value,
}

/// Why a call was not recorded.
#[derive(Debug, thiserror::Error)]
pub enum InsertCallError {
    /// Its owner already has this many calls that have not ended.
    #[error("{0} calls running")]
    TooMany(usize),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A call the store has decided to record. The store's reads of the call by its id see it at once, but it may
/// not be kept yet: its starter waits for `kept` before it gives the call's id to anyone.
pub struct Started {
    pub view: CallView,
    /// Resolves once the call is kept, or with why it could not be.
    pub kept: Kept,
}

impl std::fmt::Debug for Started {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Started")
            .field("view", &self.view)
            .finish_non_exhaustive()
    }
}

/// Whether a change the store decided was kept.
pub type Kept = std::pin::Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send>>;

/// A call that just ended, and its Requests that were still pending.
#[derive(Debug)]
pub struct Finished {
    pub view: CallView,
    pub cancelled: Vec<RequestView>,
}

/// What a 2026-07-28 call needs to be retried after its latest round was answered.
#[derive(Debug, Clone, PartialEq)]
pub struct Retry {
    pub call: CallId,
    /// The principal that started the call.
    pub owner: String,
    pub server: String,
    pub session: SessionId,
    pub shared: bool,
    pub tool: String,
    pub arguments: Arguments,
    pub round: u32,
    pub request_state: Option<String>,
    /// The `ElicitResult` of every input request a Request answered, under the key the upstream gave it.
    pub input_responses: Map<String, Value>,
    /// What each input request of the round asked for, by its key: what is not a Request's (roots) is
    /// answered from the config, and a Request's answer is sent as what was asked for.
    pub asked: Vec<(String, Asked)>,
    /// The id of the upstream task the call became: the answers go to it, and the gateway follows it on.
    pub task: Option<String>,
}

/// A session about to connect.
#[derive(Debug, Clone)]
pub struct NewSession {
    pub id: SessionId,
    /// The gateway replica that opens it.
    pub replica: String,
    pub server: String,
    /// The principal that opens it; `None` for a server's shared session.
    pub owner: Option<String>,
}

/// Why a session was not recorded.
#[derive(Debug, thiserror::Error)]
pub enum InsertSessionError {
    /// Its owner already has this many sessions open.
    #[error("{0} sessions open")]
    TooMany(usize),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Recorded events after some event id.
#[derive(Debug, Default)]
pub struct EventPage {
    pub events: Vec<Arc<Event>>,
    /// Some events after the id are no longer kept (or the id was never given out): the reader must re-list.
    pub gap: bool,
    /// After a gap: the id to read on from (the event before the oldest kept, or the newest of all).
    pub resume_after: u64,
}

/// What a pruning forgets: ended records from before `records`, and events (with their links in the audit chain)
/// from before `events`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Horizons {
    /// Resolved Requests, ended calls and sessions older than this go (`requests.retention`).
    pub records: Timestamp,
    /// Events older than this go (`audit.retention`).
    pub events: Timestamp,
}

/// Who holds the lease on a webhook's deliveries (or other leased work, [`crate::lease`]), as
/// [`Store::hold_webhook`](crate::store::Store::hold_webhook) decided it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lease {
    /// The asking holder has the lease until it runs out; with the webhook's saved cursor, `None` for a
    /// webhook that has none yet.
    Mine(Option<u64>),
    /// Another holder's lease has not run out: it delivers the webhook.
    Elsewhere,
}
