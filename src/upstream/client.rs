//! The MCP client side of a session: the capabilities the gateway declares, how a legacy `elicitation/create`
//! becomes a Request and its answer (`SessionCore::elicit`, for the stdio transport and the rmcp handler
//! alike), and the handler rmcp calls.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};

use rmcp::model::{
    CancelledNotificationParam, ClientCapabilities, ClientConfig, CustomNotification, CustomRequest, CustomResult,
    ElicitRequestParams, ElicitResult, ElicitationAction, ElicitationCapability, ErrorCode, ErrorData,
    FormElicitationCapability, Implementation, ProgressNotificationParam, ProgressToken, ProtocolVersion, RequestId,
    RootsCapabilities, UrlElicitationCapability,
};
#[allow(deprecated, reason = "2025-11-25 servers still ask for roots and sampling")]
use rmcp::model::{
    CreateMessageRequestParams, CreateMessageResult, JsonObject, ListRootsResult, Root, SamplingCapability,
    TASKS_EXTENSION_ID, TaskStatusNotificationParams,
};
use rmcp::service::{InboundStreamOrigin, NotificationContext, RequestContext};
use rmcp::{ClientHandler, RoleClient};

use crate::config::{Sampling, Server, Tasks};
use serde_json::Value;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::reports::{Progress, Report, Reports};
use crate::calls::Calls;
use crate::ids::{self, CallId, SessionId};
use crate::lock;
use crate::registry::{AskError, Origin, Outcome, Registry};

/// The MCP method of a 2025-11-25 elicitation request.
pub const ELICITATION_CREATE: &str = "elicitation/create";
/// How many replied elicitations a session remembers, for withdrawals that cross a reply.
const REPLIES_REMEMBERED: usize = 256;
/// How long after a reply a withdrawal of the same JSON-RPC id counts as having crossed it; an upstream
/// whose ids repeat (a stateless HTTP server numbers each POST from 0) means a later one by the same id.
const CROSSING: std::time::Duration = std::time::Duration::from_secs(10);

/// The MCP method of a URL-mode completion notification (2025-11-25).
const ELICITATION_COMPLETE: &str = "notifications/elicitation/complete";

/// What a session's handler and its calls share.
#[derive(Debug)]
pub struct SessionCore {
    pub id: SessionId,
    pub server: String,
    /// The principal that opened the session (`None` for a shared one).
    pub owner: Option<String>,
    pub registry: Registry,
    pub calls: Calls,
    /// Our in-flight `tools/call` JSON-RPC ids, each with the Call it serves and its progress token.
    in_flight: Mutex<HashMap<RequestId, (CallRef, ProgressToken)>>,
    /// The principals whose calls this session has run.
    served: Mutex<HashSet<String>>,
    /// Legacy elicitations waiting on their Request (shared with the work budgets that follow them).
    elicitations: Arc<Mutex<Elicitations>>,
    /// The latest legacy elicitations replied to, by JSON-RPC id, with their Request: a withdrawal that crosses
    /// the reply on the wire arrives after it.
    replied: Mutex<VecDeque<Replied>>,
    /// Messages still being sent to the upstream (cancellations of abandoned calls); closing waits for them.
    pub sends: TaskTracker,
    /// Held shared by a `tools/call` from being sent until it is tracked, so that attributing an elicitation,
    /// which can arrive in between, waits for it.
    sending: tokio::sync::RwLock<()>,
    /// Counts the changes to the tools the servers offer (the upstream's `tools/list_changed` among them).
    tools_changed: Arc<tokio::sync::watch::Sender<u64>>,
    /// Where the upstream's progress on a call goes.
    reports: Reports,
    /// What the server is answered beyond elicitation.
    pub offers: Offers,
    /// The tasks followed on this session, by id: the call each serves (a 2025-11-25 elicitation that names its
    /// task, in `io.modelcontextprotocol/related-task`, is that call's), and what wakes its follower when the
    /// server says the task changed (`notifications/tasks`).
    tasks: Mutex<Followed>,
}

/// What a session's server is answered beyond elicitation, as its config says: in a 2025-11-25 request or a
/// 2026-07-28 round alike.
#[derive(Debug, Clone, Default)]
pub struct Offers {
    /// Its roots (`file://` URIs); the capability is declared only when there are some.
    pub roots: Arc<[String]>,
    /// Whether its sampling requests are asked of a person (and the capability declared).
    pub sampling: bool,
    /// Whether it is told the gateway follows tasks (and, in 2025-11-25, may have a call sent again as one).
    pub tasks: bool,
}

impl Offers {
    /// What `server`'s config offers it.
    pub fn of(server: &Server) -> Self {
        Self {
            roots: server.roots.clone().into(),
            sampling: server.sampling == Sampling::Ask,
            tasks: server.tasks == Tasks::Auto,
        }
    }

    /// The answer to the server's `roots/list`.
    #[allow(deprecated, reason = "servers still ask for roots")]
    pub fn roots_result(&self) -> ListRootsResult {
        ListRootsResult::new(self.roots.iter().map(Root::new).collect())
    }
}

/// The tasks followed on a session, and the latest the server said changed before anyone followed them.
#[derive(Debug, Default)]
struct Followed {
    followed: HashMap<String, (CallRef, Arc<Notify>)>,
    changed_early: VecDeque<String>,
}

/// How many task ids a session remembers as changed before they were followed: a server may report a change
/// before the gateway has read the task's id from the response that made it.
const CHANGED_EARLY: usize = 64;

impl SessionCore {
    /// Creates the shared part of a session of `server` that is about to connect.
    pub fn new(
        id: SessionId,
        server: &Server,
        owner: Option<String>,
        registry: Registry,
        calls: Calls,
        tools_changed: Arc<tokio::sync::watch::Sender<u64>>,
        reports: Reports,
    ) -> Self {
        Self {
            id,
            server: server.name.clone(),
            offers: Offers::of(server),
            owner,
            registry,
            calls,
            in_flight: Mutex::default(),
            served: Mutex::default(),
            elicitations: Arc::default(),
            replied: Mutex::default(),
            sends: TaskTracker::new(),
            sending: tokio::sync::RwLock::new(()),
            tools_changed,
            reports,
            tasks: Mutex::default(),
        }
    }

    /// Held while a `tools/call` is sent and tracked.
    pub async fn sending(&self) -> tokio::sync::RwLockReadGuard<'_, ()> {
        self.sending.read().await
    }

    /// Records that a call's `tools/call` with this JSON-RPC id is in flight.
    pub fn track(&self, request: RequestId, progress: ProgressToken, call: &CallRef) {
        lock(&self.served).insert(call.owner.clone());
        lock(&self.in_flight).insert(request, (call.clone(), progress));
    }

    /// Forgets an in-flight `tools/call`.
    pub fn untrack(&self, request: &RequestId) {
        lock(&self.in_flight).remove(request);
    }

    /// Records that task `id` serves `call` and is followed, until the guard returned is dropped.
    pub fn relate_task(self: &Arc<Self>, id: &str, call: &CallRef) -> RelatedTask {
        let changed = Arc::new(Notify::new());
        let mut tasks = lock(&self.tasks);
        if let Some(at) = tasks.changed_early.iter().position(|early| early == id) {
            tasks.changed_early.remove(at);
            changed.notify_one();
        }
        tasks.followed.insert(id.to_owned(), (call.clone(), changed.clone()));
        RelatedTask {
            core: self.clone(),
            id: id.to_owned(),
            changed,
        }
    }

    /// The server says task `id` changed: its follower looks at it now.
    pub fn task_changed(&self, id: &str) {
        let mut tasks = lock(&self.tasks);
        if let Some((_, changed)) = tasks.followed.get(id) {
            changed.notify_one();
            return;
        }
        if tasks.changed_early.len() >= CHANGED_EARLY {
            tasks.changed_early.pop_front();
        }
        tasks.changed_early.push_back(id.to_owned());
    }

    /// The call an inbound elicitation belongs to: the one whose HTTP stream carried it, the one whose 2025-11-25
    /// task it names (the server's word for its own task), or the only call in flight, read once no
    /// `tools/call` is between being sent and being tracked.
    ///
    /// Only the first is proof. The only call in flight may not be the one the elicitation comes from (another
    /// principal's earlier call may have left work behind), so its principal gets the Request only while this
    /// session has run no other principal's calls.
    pub async fn attribute(&self, origin: Option<&InboundStreamOrigin>, task: Option<&str>) -> Option<Attribution> {
        drop(self.sending.write().await);
        let in_flight = lock(&self.in_flight);
        let of_task = || task.and_then(|task| lock(&self.tasks).followed.get(task).map(|(call, _)| call.clone()));
        match origin {
            Some(InboundStreamOrigin::OutboundRequest(request)) => {
                in_flight.get(request).map(|(call, _)| Attribution {
                    call: call.clone(),
                    owned: true,
                })
            }
            _ if let Some(call) = of_task() => Some(Attribution { call, owned: true }),
            _ if in_flight.len() == 1 => in_flight.values().next().map(|(call, _)| {
                let served = lock(&self.served);
                Attribution {
                    call: call.clone(),
                    owned: served.len() == 1 && served.contains(&call.owner),
                }
            }),
            _ => None,
        }
    }

    /// Where a Request raised for an attributed elicitation comes from: owned by the call's principal only
    /// when the attribution says it may be.
    fn origin_of(&self, attribution: Option<&Attribution>) -> Origin {
        let mut origin = self.origin(attribution.map(|attribution| &attribution.call));
        if attribution.is_some_and(|attribution| !attribution.owned) {
            origin.owner = self.owner.clone();
        }
        origin
    }

    /// Where a Request raised on this session for `call` comes from: owned by the call's principal, or else
    /// the session's.
    pub fn origin(&self, call: Option<&CallRef>) -> Origin {
        Origin {
            server: self.server.clone(),
            session: Some(self.id.clone()),
            call: call.map(|call| call.id.clone()),
            owner: call.map(|call| call.owner.clone()).or_else(|| self.owner.clone()),
        }
    }

    /// Cancels the Requests of a call's elicitations that the upstream has withdrawn but whose wait has not yet
    /// woken, before the call's end would cancel them for ending.
    ///
    /// rmcp cancels a handler's token before it routes the response that follows, so a call that just ended
    /// runs this to record the upstream's withdrawal rather than its own ending.
    pub async fn settle_withdrawn(&self, call: &CallId) {
        let withdrawn = lock(&self.elicitations).withdrawn_of(call);
        for id in withdrawn {
            self.registry.withdraw(&id).await;
        }
    }

    /// The upstream withdrew the elicitation with JSON-RPC id `request` after the gateway replied to it: the
    /// reply did not count, so an answer in it was never received.
    pub async fn withdrawn_after_reply(&self, request: &RequestId) {
        // One still waiting is withdrawn through its token; this is for one replied to already.
        if lock(&self.elicitations).waits_on(request) {
            return;
        }
        let replied = {
            let mut replied = lock(&self.replied);
            let at = replied
                .iter()
                .rposition(|replied| replied.rpc == *request && replied.at.elapsed() <= CROSSING);
            at.and_then(|at| replied.remove(at))
        };
        if let Some(replied) = replied {
            self.registry.undelivered(&replied.request).await;
        }
    }

    /// The upstream withdrew the elicitation it sent under JSON-RPC id `rpc` (`notifications/cancelled`): fires
    /// its token if it still waits. A transport that reads its own elicitations calls this before it reads on.
    pub fn withdraw_elicitation(&self, rpc: &RequestId) {
        lock(&self.elicitations).withdraw(rpc);
    }

    /// Whether any legacy elicitation waits on this session.
    pub fn elicits(&self) -> bool {
        !lock(&self.elicitations).is_empty()
    }

    /// Answers a 2025-11-25 `elicitation/create` (or, `asking` so, a `sampling/createMessage`) through a Request,
    /// waiting for its outcome; `withdrawn` fires if the upstream cancels it. Params the gateway cannot show are
    /// refused with `-32602`; past the pending cap the upstream gets `cancel` at once.
    ///
    /// It is booked before this returns, so that a withdrawal read right after it finds it even while its
    /// Request is still being raised.
    pub fn elicit(
        self: &Arc<Self>,
        request: RequestId,
        asking: Asking,
        params: Value,
        stream: Option<InboundStreamOrigin>,
        withdrawn: CancellationToken,
    ) -> impl Future<Output = Result<ElicitResult, ErrorData>> + Send + 'static {
        let handle = lock(&self.elicitations).arrive(request.clone(), withdrawn.clone());
        let booked = Booked {
            core: self.clone(),
            handle,
        };
        // Boxed, so that a pending elicitation's future keeps only a pointer to what raising it took.
        let asked = Box::pin(async move {
            let core = &booked.core;
            let task = params
                .pointer("/_meta/io.modelcontextprotocol~1related-task/taskId")
                .and_then(Value::as_str);
            let call = core.attribute(stream.as_ref(), task).await;
            let origin = core.origin_of(call.as_ref());
            let asked = match asking {
                Asking::Elicitation => core.registry.ask(params, &origin, withdrawn.clone()).await,
                Asking::Sampling => core.registry.ask_sampling(params, &origin, withdrawn.clone()).await,
            };
            (booked, asked, withdrawn, origin.call)
        });
        async move {
            let (booked, asked, withdrawn, call) = asked.await;
            let core = booked.core.clone();
            let mut waiting = match asked {
                Ok(waiting) => waiting,
                Err(AskError::Full(cap)) => {
                    tracing::warn!(session = %core.id, %cap, "pending Requests at their cap: elicitation answered cancel");
                    return Ok(ElicitResult::new(ElicitationAction::Cancel));
                }
                Err(AskError::CallEnded(_)) => return Ok(ElicitResult::new(ElicitationAction::Cancel)),
                Err(AskError::Unusable(detail)) => return Err(ErrorData::invalid_params(detail, None)),
                Err(AskError::Store(error)) => return Err(ErrorData::internal_error(error.to_string(), None)),
            };
            booked.raised(&waiting.id, call);
            let outcome = tokio::select! {
                outcome = waiting.outcome() => outcome,
                () = withdrawn.cancelled() => {
                    // Unless an answer resolved it first, in which case that answer is sent. Boxed, as is the
                    // withdrawal after a reply below: a pending elicitation's task keeps room only for its wait.
                    Box::pin(core.registry.withdraw(&waiting.id)).await;
                    waiting.outcome().await
                }
            };
            drop(booked);
            match outcome {
                Outcome::Reply(result) => {
                    // Remembered before the token is read, so that a withdrawal arriving in between is not missed.
                    {
                        let mut replied = lock(&core.replied);
                        if replied.len() == REPLIES_REMEMBERED {
                            replied.pop_front();
                        }
                        replied.push_back(Replied {
                            rpc: request.clone(),
                            request: waiting.id.clone(),
                            at: std::time::Instant::now(),
                        });
                    }
                    if withdrawn.is_cancelled() {
                        // The reply will not be sent (rmcp drops it), or not be taken.
                        Box::pin(core.withdrawn_after_reply(&request)).await;
                    }
                    Ok(result)
                }
                Outcome::Withdrawn(detail) => Err(ErrorData::internal_error(
                    format!("the Request was withdrawn: {detail}"),
                    None,
                )),
            }
        }
    }
}

/// What a 2025-11-25 server's request asks a person for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asking {
    /// A value or a visit (`elicitation/create`).
    Elicitation,
    /// A reply to its conversation (`sampling/createMessage`).
    Sampling,
}

/// The legacy elicitations of a session, from their arrival until their reply is settled: the one place that
/// holds each one's token (fired when the upstream withdraws it), found by its JSON-RPC id as it arrives and,
/// once its Request is raised, by that Request and the call it was attributed to. An upstream whose ids repeat
/// (a stateless HTTP server numbers each POST from 0) can have several under one JSON-RPC id.
#[derive(Debug, Default)]
struct Elicitations {
    next: u64,
    waiting: HashMap<u64, Elicitation>,
    /// Arrival order under each JSON-RPC id.
    by_rpc: HashMap<RequestId, Vec<u64>>,
    by_call: HashMap<CallId, HashSet<u64>>,
    /// For each call whose work budget runs on this session: whether one of its elicitations waits on a person.
    budgets: HashMap<CallId, watch::Sender<bool>>,
}

#[derive(Debug)]
struct Elicitation {
    rpc: RequestId,
    withdrawn: CancellationToken,
    /// Its Request, once raised.
    request: Option<ids::RequestId>,
    call: Option<CallId>,
}

impl Elicitations {
    /// Books an elicitation that just arrived; the handle names it from then on.
    fn arrive(&mut self, rpc: RequestId, withdrawn: CancellationToken) -> u64 {
        let handle = self.next;
        self.next += 1;
        self.by_rpc.entry(rpc.clone()).or_default().push(handle);
        let elicitation = Elicitation {
            rpc,
            withdrawn,
            request: None,
            call: None,
        };
        self.waiting.insert(handle, elicitation);
        handle
    }

    /// Its Request is raised, for `call` if it was attributed to one.
    fn raised(&mut self, handle: u64, request: &ids::RequestId, call: Option<CallId>) {
        let Some(elicitation) = self.waiting.get_mut(&handle) else {
            return;
        };
        elicitation.request = Some(request.clone());
        elicitation.call = call.clone();
        if let Some(call) = &call {
            self.by_call.entry(call.clone()).or_default().insert(handle);
            self.tell_budget(call);
        }
    }

    /// It no longer waits: replied to, refused, or dropped.
    fn leave(&mut self, handle: u64) {
        let Some(elicitation) = self.waiting.remove(&handle) else {
            return;
        };
        if let Some(handles) = self.by_rpc.get_mut(&elicitation.rpc) {
            handles.retain(|waiting| *waiting != handle);
            if handles.is_empty() {
                self.by_rpc.remove(&elicitation.rpc);
            }
        }
        if let Some(call) = elicitation.call
            && let Some(handles) = self.by_call.get_mut(&call)
        {
            handles.remove(&handle);
            if handles.is_empty() {
                self.by_call.remove(&call);
                self.tell_budget(&call);
            }
        }
    }

    /// Tells `call`'s work budget, if it has one here, whether the call waits on a person now.
    fn tell_budget(&self, call: &CallId) {
        if let Some(budget) = self.budgets.get(call) {
            budget.send_replace(self.by_call.contains_key(call));
        }
    }

    /// The upstream withdrew the elicitation it sent last under `rpc`: fires its token, if it still waits.
    fn withdraw(&self, rpc: &RequestId) {
        let latest = self.by_rpc.get(rpc).and_then(|handles| handles.last());
        if let Some(elicitation) = latest.and_then(|handle| self.waiting.get(handle)) {
            elicitation.withdrawn.cancel();
        }
    }

    /// The Requests of `call`'s elicitations that the upstream has withdrawn.
    fn withdrawn_of(&self, call: &CallId) -> Vec<ids::RequestId> {
        let Some(handles) = self.by_call.get(call) else {
            return Vec::new();
        };
        handles
            .iter()
            .filter_map(|handle| self.waiting.get(handle))
            .filter(|elicitation| elicitation.withdrawn.is_cancelled())
            .filter_map(|elicitation| elicitation.request.clone())
            .collect()
    }

    /// Whether an elicitation with JSON-RPC id `rpc` still waits.
    fn waits_on(&self, rpc: &RequestId) -> bool {
        self.by_rpc.contains_key(rpc)
    }

    fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }
}

/// An elicitation's place in its session's book, given up when it no longer waits (however its future ends).
struct Booked {
    core: Arc<SessionCore>,
    handle: u64,
}

impl Booked {
    fn raised(&self, request: &ids::RequestId, call: Option<CallId>) {
        lock(&self.core.elicitations).raised(self.handle, request, call);
    }
}

impl Drop for Booked {
    fn drop(&mut self) {
        lock(&self.core.elicitations).leave(self.handle);
    }
}

/// Whether a call waits on a person through one of its session's elicitations, followed by the call's work
/// budget (`limits.call_timeout`) while it lives: that time is not the upstream's work.
pub struct Waits {
    book: Arc<Mutex<Elicitations>>,
    call: CallId,
    waiting: watch::Receiver<bool>,
}

impl Waits {
    /// Follows `call` on `core`'s session.
    pub fn of(core: &SessionCore, call: &CallId) -> Self {
        Self::in_book(&core.elicitations, call)
    }

    fn in_book(book: &Arc<Mutex<Elicitations>>, call: &CallId) -> Self {
        let mut elicitations = lock(book);
        let waiting = elicitations.by_call.contains_key(call);
        let waiting = (elicitations.budgets.entry(call.clone()))
            .or_insert_with(|| watch::Sender::new(waiting))
            .subscribe();
        Self {
            book: book.clone(),
            call: call.clone(),
            waiting,
        }
    }

    /// Resolves once whether the call waits on a person is `waiting`.
    pub async fn until(&mut self, waiting: bool) {
        // The sender lives as long as `self`: it is taken out of the book only when `self` drops.
        let _ = self.waiting.wait_for(|now| *now == waiting).await;
    }
}

impl Drop for Waits {
    fn drop(&mut self) {
        let mut elicitations = lock(&self.book);
        if (elicitations.budgets.get(&self.call)).is_some_and(|budget| budget.receiver_count() == 1) {
            elicitations.budgets.remove(&self.call);
        }
    }
}

/// A call, and the principal that owns it (and so its Requests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallRef {
    pub id: CallId,
    pub owner: String,
}

/// A task followed for its call, until dropped.
pub struct RelatedTask {
    core: Arc<SessionCore>,
    id: String,
    changed: Arc<Notify>,
}

impl RelatedTask {
    /// Resolves when the server says the task changed.
    pub async fn changed(&self) {
        self.changed.notified().await;
    }
}

impl Drop for RelatedTask {
    fn drop(&mut self) {
        let mut tasks = lock(&self.core.tasks);
        // Unless a later follower of the same task has taken its place.
        if tasks
            .followed
            .get(&self.id)
            .is_some_and(|(_, changed)| Arc::ptr_eq(changed, &self.changed))
        {
            tasks.followed.remove(&self.id);
        }
    }
}

/// A legacy elicitation replied to: its JSON-RPC id, its Request, and when.
#[derive(Debug)]
struct Replied {
    rpc: RequestId,
    request: ids::RequestId,
    at: std::time::Instant,
}

/// The call an elicitation was attributed to, and whether the call's principal may own its Request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attribution {
    pub call: CallRef,
    pub owned: bool,
}

/// What the gateway declares to upstreams: elicitation in form and URL mode, and roots to a 2025-11-25 server
/// that has some configured.
pub fn capabilities(roots: bool) -> ClientCapabilities {
    let mut capabilities = ClientCapabilities::default();
    capabilities.elicitation = Some(
        ElicitationCapability::new()
            .with_form(FormElicitationCapability::new())
            .with_url(UrlElicitationCapability::new()),
    );
    capabilities.roots = roots.then(RootsCapabilities::default);
    capabilities
}

/// The `ClientHandler` of every upstream session.
#[derive(Debug, Clone)]
pub struct GatewayClient {
    core: Arc<SessionCore>,
    protocol: ProtocolVersion,
}

impl GatewayClient {
    /// A handler for the session of `core`, offering `protocol` in a legacy `initialize`.
    pub fn new(core: Arc<SessionCore>, protocol: ProtocolVersion) -> Self {
        Self { core, protocol }
    }

    /// The session this handler serves.
    pub fn core(&self) -> &Arc<SessionCore> {
        &self.core
    }
}

impl ClientHandler for GatewayClient {
    /// A withdrawal of an elicitation already replied to (one still waiting has its token fired by rmcp, or,
    /// when the stdio transport read it, through `withdraw_elicitation`; that notification comes on here too).
    async fn on_cancelled(&self, params: CancelledNotificationParam, _context: NotificationContext<RoleClient>) {
        if let Some(request) = params.request_id {
            self.core.withdrawn_after_reply(&request).await;
        }
    }

    /// Progress on one of the session's calls in flight goes to whoever follows that call.
    async fn on_progress(&self, params: ProgressNotificationParam, _context: NotificationContext<RoleClient>) {
        let call = lock(&self.core.in_flight)
            .values()
            .find(|(_, token)| *token == params.progress_token)
            .map(|(call, _)| call.id.clone());
        if let Some(call) = call {
            let progress = Progress {
                progress: params.progress,
                total: params.total,
                message: params.message,
            };
            self.core.reports.report(&call, Report::Progress(progress));
        }
    }

    /// A log message goes to whoever follows the call it comes from, when the gateway can tell which that is
    /// and that the call's principal may see it (as for an elicitation's Request): the wire does not say.
    #[allow(deprecated, reason = "2025-11-25 clients still get an upstream's log messages")]
    async fn on_logging_message(
        &self,
        params: rmcp::model::LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        if let Some(attribution) = self.core.attribute(None, None).await
            && attribution.owned
        {
            self.core.reports.report(&attribution.call.id, Report::Log(params));
        }
    }

    /// A task's change, which its follower looks at at once rather than at its next poll.
    async fn on_task_status(&self, params: TaskStatusNotificationParams, _context: NotificationContext<RoleClient>) {
        self.core.task_changed(&params.task.task.task_id);
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.core
            .tools_changed
            .send_modify(|version| *version = version.wrapping_add(1));
    }

    /// The roots configured for the server; the capability is declared only when there are some.
    #[allow(deprecated, reason = "2025-11-25 servers still ask for roots")]
    async fn list_roots(&self, _context: RequestContext<RoleClient>) -> Result<ListRootsResult, ErrorData> {
        Ok(self.core.offers.roots_result())
    }

    fn get_info(&self) -> ClientConfig {
        // Roots and sampling in either era: a 2026-07-28 server asks for them in a round, or a task's.
        let offers = &self.core.offers;
        let mut capabilities = capabilities(!offers.roots.is_empty());
        if offers.sampling {
            capabilities.sampling = Some(SamplingCapability::default());
        }
        // Declared in either era: a server that does not know the extension ignores it.
        if offers.tasks {
            capabilities
                .extensions
                .get_or_insert_default()
                .insert(TASKS_EXTENSION_ID.to_owned(), JsonObject::new());
        }
        ClientConfig::new(
            capabilities,
            Implementation::new(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION")),
        )
        .with_protocol_version(self.protocol.clone())
    }

    /// An elicitation rmcp read (over streamable HTTP; the stdio transport answers its own).
    fn create_elicitation(
        &self,
        params: ElicitRequestParams,
        context: RequestContext<RoleClient>,
    ) -> impl Future<Output = Result<ElicitResult, ErrorData>> + Send + '_ {
        let stream = context.extensions.get::<InboundStreamOrigin>().cloned();
        let params = serde_json::to_value(params).unwrap_or_default();
        self.core
            .elicit(context.id, Asking::Elicitation, params, stream, context.ct)
    }

    /// A sampling request: asked of a person when the server's config says `sampling = "ask"` (its capability is
    /// declared only then), the reply sent back as the assistant's message.
    #[allow(deprecated, reason = "2025-11-25 servers still ask for sampling")]
    fn create_message(
        &self,
        params: CreateMessageRequestParams,
        context: RequestContext<RoleClient>,
    ) -> impl Future<Output = Result<CreateMessageResult, ErrorData>> + Send + '_ {
        let stream = context.extensions.get::<InboundStreamOrigin>().cloned();
        let asked = self.core.offers.sampling.then(|| {
            let params = serde_json::to_value(params).unwrap_or_default();
            self.core
                .elicit(context.id, Asking::Sampling, params, stream, context.ct)
        });
        async move {
            let asked = asked.ok_or_else(|| {
                ErrorData::new(ErrorCode::METHOD_NOT_FOUND, "sampling is refused for this server", None)
            })?;
            crate::sampling::reply(asked.await?)
        }
    }

    /// An `elicitation/create` whose params rmcp could not read, or one a stdio transport without a session passes
    /// on unread; any other method is not one the gateway serves.
    fn on_custom_request(
        &self,
        request: CustomRequest,
        context: RequestContext<RoleClient>,
    ) -> impl Future<Output = Result<CustomResult, ErrorData>> + Send + '_ {
        let stream = context.extensions.get::<InboundStreamOrigin>().cloned();
        let elicited = (request.method == ELICITATION_CREATE)
            .then(|| {
                self.core.elicit(
                    context.id,
                    Asking::Elicitation,
                    request.params.unwrap_or_default(),
                    stream,
                    context.ct,
                )
            })
            .ok_or_else(|| ErrorData::new(ErrorCode::METHOD_NOT_FOUND, request.method, None));
        async move {
            let result = elicited?.await?;
            Ok(CustomResult(serde_json::to_value(result).unwrap_or_default()))
        }
    }

    async fn on_custom_notification(
        &self,
        notification: CustomNotification,
        _context: NotificationContext<RoleClient>,
    ) {
        if notification.method != ELICITATION_COMPLETE {
            return;
        }
        if let Some(elicitation_id) = notification
            .params
            .as_ref()
            .and_then(|params| params.get("elicitationId"))
            .and_then(|id| id.as_str())
        {
            self.core.registry.complete(&self.core.id, elicitation_id).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_calls_withdrawn_elicitations_are_found_without_the_others() {
        let mut elicitations = Elicitations::default();
        let (kept, withdrawn, elsewhere) = (
            CancellationToken::new(),
            CancellationToken::new(),
            CancellationToken::new(),
        );
        let handles = [
            elicitations.arrive(RequestId::Number(1), kept),
            elicitations.arrive(RequestId::Number(2), withdrawn.clone()),
            elicitations.arrive(RequestId::Number(3), elsewhere.clone()),
        ];
        let call = Some(CallId::stored("call-a"));
        elicitations.raised(handles[0], &ids::RequestId::stored("req-1"), call.clone());
        elicitations.raised(handles[1], &ids::RequestId::stored("req-2"), call);
        elicitations.raised(handles[2], &ids::RequestId::stored("req-3"), None);
        withdrawn.cancel();
        elsewhere.cancel();
        assert_eq!(
            elicitations.withdrawn_of(&CallId::stored("call-a")),
            [ids::RequestId::stored("req-2")]
        );
        assert!(elicitations.withdrawn_of(&CallId::stored("call-b")).is_empty());
        assert!(elicitations.waits_on(&RequestId::Number(3)));

        for handle in handles {
            elicitations.leave(handle);
        }
        assert!(elicitations.is_empty() && elicitations.by_call.is_empty() && elicitations.by_rpc.is_empty());
        assert!(!elicitations.waits_on(&RequestId::Number(3)));
    }

    #[test]
    fn a_withdrawal_fires_the_latest_elicitation_under_its_id_even_before_its_request_is_raised() {
        let mut elicitations = Elicitations::default();
        let (first, second, other) = (
            CancellationToken::new(),
            CancellationToken::new(),
            CancellationToken::new(),
        );
        let rpc = RequestId::String("two".into());
        elicitations.arrive(rpc.clone(), first.clone());
        let latest = elicitations.arrive(rpc.clone(), second.clone());
        elicitations.arrive(RequestId::Number(1), other.clone());
        // Not one of ours: nothing fires.
        elicitations.withdraw(&RequestId::Number(7));
        assert!(!first.is_cancelled() && !second.is_cancelled() && !other.is_cancelled());
        elicitations.withdraw(&rpc);
        assert!(second.is_cancelled() && !first.is_cancelled() && !other.is_cancelled());
        // Once the latest has gone, the one before it is what the id names.
        elicitations.leave(latest);
        elicitations.withdraw(&rpc);
        assert!(first.is_cancelled() && !other.is_cancelled());
    }

    #[test]
    fn elicitations_under_one_json_rpc_id_wait_until_the_last_is_answered() {
        let mut elicitations = Elicitations::default();
        let rpc = RequestId::Number(0);
        let first = elicitations.arrive(rpc.clone(), CancellationToken::new());
        let second = elicitations.arrive(rpc.clone(), CancellationToken::new());
        elicitations.raised(second, &ids::RequestId::stored("req-2"), Some(CallId::stored("call-a")));
        elicitations.leave(first);
        assert!(elicitations.waits_on(&rpc), "the second still waits under it");
        elicitations.leave(first);
        assert!(elicitations.waits_on(&rpc), "leaving twice counts once");
        elicitations.leave(second);
        assert!(!elicitations.waits_on(&rpc));
        assert!(elicitations.by_rpc.is_empty() && elicitations.by_call.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_calls_work_budget_stops_while_one_of_its_elicitations_waits_on_a_person() {
        use futures::FutureExt;
        use std::time::Duration;

        let book = Arc::<Mutex<Elicitations>>::default();
        let (call, other) = (CallId::stored("call-a"), CallId::stored("call-b"));
        let mut budget = Box::pin(super::super::legs::work_budget(
            Duration::from_secs(1),
            Duration::from_millis(200),
            Waits::in_book(&book, &call),
        ));
        // Looks at the change just made before the time passes, as the budget's task would be woken by it.
        let mut after = async |elapsed: Duration| {
            if let Some(limit) = (&mut budget).now_or_never() {
                return Some(limit);
            }
            tokio::time::advance(elapsed).await;
            (&mut budget).now_or_never()
        };
        let raise = |call: &CallId, request: &str| {
            let mut elicitations = lock(&book);
            let handle = elicitations.arrive(RequestId::Number(0), CancellationToken::new());
            elicitations.raised(handle, &ids::RequestId::stored(request), Some(call.clone()));
            handle
        };

        assert_eq!(after(Duration::from_millis(300)).await, None);
        let others = raise(&other, "req-b");
        let (first, second) = (raise(&call, "req-1"), raise(&call, "req-2"));
        assert_eq!(after(Duration::from_secs(60)).await, None, "a person is asked");
        lock(&book).leave(first);
        assert_eq!(after(Duration::from_secs(60)).await, None, "the second is still asked");
        lock(&book).leave(second);
        assert_eq!(after(Duration::from_millis(400)).await, None);
        assert!(lock(&book).budgets.contains_key(&call));
        lock(&book).leave(others);
        assert_eq!(
            after(Duration::from_millis(100)).await,
            Some(Duration::from_secs(1)),
            "200 ms before, and 300 + 400 + 100 ms since"
        );
        drop(budget);
        assert!(
            lock(&book).budgets.is_empty(),
            "the book forgets a budget that has gone"
        );
    }
}
