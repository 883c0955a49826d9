//! The upstream MCP servers: their shared sessions (re-opened with back-off), private sessions, the live
//! connections behind them, and the calls that run on them.

mod approval;
mod call;
mod client;
mod connect;
mod inbound_ids;
mod legs;
mod reports;
mod stderr;
mod stdio;
mod supervise;
mod task;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, Tool};
use rmcp::{Peer, RoleClient};
use serde::Serialize;
use serde_json::{Map, Value};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use client::{CallRef, SessionCore, capabilities};
pub use connect::ConnectError;
pub use reports::{Following, Progress, Report};
pub use supervise::OpenError;

use legs::Work;
use reports::Reports;

use crate::Background;
use crate::approvals::Approvals;
use crate::auth::Principal;
use crate::calls::Calls;
use crate::config::{LimitsConfig, ProtocolChoice, Server};
use crate::feed::Feed;
use crate::grants::Grants;
use crate::ids::{CallId, SessionId};
use crate::lock;
use crate::records::{Arguments, CallStatus, CallView, Finish, SessionStatus, SessionView, ToolName, Via};
use crate::registry::{Registry, Resume, Tell};
use crate::sessions::Sessions;
use crate::store::{InsertCallError, InsertSessionError, NewCall, Pending, StoreError};
use crate::time::Timestamp;

/// How long closing a session may take before its transport is dropped (which kills a child process).
const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);
/// The first protocol version whose `tools/call` suspends as an `input_required` result the gateway keeps.
const ROUNDS_PROTOCOL: &str = "2026-07-28";

/// Why an upstream operation could not be done.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("no server named {0:?}")]
    UnknownServer(String),
    #[error("no session {0}")]
    UnknownSession(String),
    #[error("no call with id {0}")]
    UnknownCall(String),
    #[error("session {0} is not ready")]
    SessionNotReady(String),
    #[error("the shared session of server {server:?} is not ready: {detail}")]
    ServerNotReady { server: String, detail: String },
    #[error("session {0} is the shared session of its server; the gateway manages it")]
    SharedSession(SessionId),
    /// A private session could not be opened.
    #[error("cannot open a session to {server:?}: {error}")]
    Unopened { server: String, error: OpenError },
    /// The upstream did not answer `tools/list`.
    #[error("tools/list failed: {0}")]
    ToolsList(rmcp::service::ServiceError),
    #[error("session {0} belongs to another principal")]
    NotYours(SessionId),
    /// A principal that may see a session may not change it this way.
    #[error("{principal} may not {action} session {session}")]
    NotPermitted {
        principal: String,
        action: SessionAction,
        session: SessionId,
    },
    #[error("{principal} has {open} sessions open, the most one principal may hold (limits.sessions_per_principal)")]
    TooManySessions { principal: String, open: usize },
    #[error("{principal} has {running} calls running, the most one principal may hold (limits.calls_per_principal)")]
    TooManyCalls { principal: String, running: usize },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What a principal does to a session that is not its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionAction {
    Close,
    CallTools,
}

impl std::fmt::Display for SessionAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SessionAction::Close => "close",
            SessionAction::CallTools => "call tools on",
        })
    }
}

/// Where a call runs.
#[derive(Debug, Clone)]
pub enum Target {
    /// On the shared session of this server.
    Server(String),
    /// On this session.
    Session(SessionId),
}

/// A server's state as `GET /servers` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ServerStatus {
    Starting,
    Ready,
    Failed,
}

/// A server as the REST API shows it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServerView {
    pub name: String,
    /// The gateway replica whose shared session this is (each replica opens its own).
    #[schema(value_type = String)]
    pub replica: Arc<str>,
    pub transport: &'static str,
    pub protocol: &'static str,
    pub status: ServerStatus,
    /// Its shared session, while one is open.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub session: Option<SessionId>,
    /// Why it is not ready, or why its last session ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// How many times its shared session has been re-opened.
    pub restarts: u32,
    /// While the gateway waits before the next attempt to open its shared session: when that attempt starts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_at: Option<Timestamp>,
    /// While the gateway waits before the next attempt: that pause in milliseconds, doubling from 500 to 30000
    /// while attempts keep failing or sessions keep ending within 30 s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backoff_ms: Option<u64>,
}

/// A ready session's connection, which calls use.
#[derive(Debug)]
pub struct Live {
    pub core: Arc<SessionCore>,
    pub peer: Peer<RoleClient>,
    /// The protocol version the handshake settled on.
    pub protocol_version: Option<String>,
    /// Fires when the session ends, for whatever reason.
    pub closed: CancellationToken,
    /// Why it ended, once it has.
    ended: std::sync::OnceLock<String>,
}

impl Live {
    /// Ends the session's calls in flight with `detail` (the first reason given counts).
    fn end(&self, detail: &str) {
        let _ = self.ended.set(detail.to_owned());
        self.closed.cancel();
    }

    /// Why the session ended.
    fn ended(&self) -> &str {
        self.ended.get().map_or("", String::as_str)
    }

    /// Whether its calls suspend as 2026-07-28 rounds, which the gateway keeps, rather than as requests in
    /// flight.
    fn keeps_rounds(&self) -> bool {
        self.protocol_version
            .as_deref()
            .is_some_and(|version| version >= ROUNDS_PROTOCOL)
    }
}

/// What the upstream side records its sessions, Requests and calls in.
#[derive(Debug, Clone)]
pub struct Domain {
    /// This gateway's id among the replicas sharing its store.
    pub replica: String,
    pub sessions: Sessions,
    pub registry: Registry,
    pub calls: Calls,
    pub grants: Grants,
    pub feed: Feed,
}

/// A `tools/call` of a call in flight.
#[derive(Debug)]
struct Leg {
    id: u64,
    /// Fired to abandon it (the upstream is told).
    token: CancellationToken,
}

/// Whether a call just started is kept: the upstream works on it meanwhile, and if it cannot be kept it is
/// abandoned. Dropped before the call is kept (its client went away), it leaves the waiting to a task of its own.
pub struct Keeping(Option<Unkept>);

/// A call not known to be kept yet.
struct Unkept {
    kept: crate::store::Kept,
    /// The call's work upstream, stopped when the call cannot be kept.
    leg: CancellationToken,
    /// What ends the call when it cannot be kept, so that it is not left running.
    upstreams: Arc<Upstreams>,
    call: CallId,
}

impl Unkept {
    /// What the call's keeping came to: if it failed, the call's work upstream stops and the call is ended.
    fn kept(self, kept: Result<(), StoreError>) -> Result<(), StoreError> {
        kept.inspect_err(|_| {
            self.leg.cancel();
            self.upstreams.abandon(self.call);
        })
    }
}

impl Keeping {
    /// For a call kept already.
    fn already() -> Self {
        Self(None)
    }

    /// Waits until the call is kept; if it cannot be, its work upstream stops and the call is ended.
    pub async fn kept(mut self) -> Result<(), UpstreamError> {
        if let Some(unkept) = self.0.as_mut() {
            // Dropped while it waits, the call is still `self`'s, whose drop leaves the waiting to a task.
            let kept = (&mut unkept.kept).await;
            if let Some(unkept) = self.0.take() {
                unkept.kept(kept)?;
            }
        }
        Ok(())
    }
}

impl Drop for Keeping {
    fn drop(&mut self) {
        // Dropped outside a runtime, nothing could wait for the call or end it.
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        if let Some(mut unkept) = self.0.take() {
            let tracker = unkept.upstreams.tracker.clone();
            tracker.spawn(async move {
                let kept = (&mut unkept.kept).await;
                let _ = unkept.kept(kept);
            });
        }
    }
}

/// The upstream side of the gateway.
#[derive(Debug)]
pub struct Upstreams {
    /// This gateway's id among the replicas sharing its store.
    replica: Arc<str>,
    servers: Vec<Slot>,
    sessions: Sessions,
    registry: Registry,
    calls: Calls,
    grants: Grants,
    feed: Feed,
    limits: LimitsConfig,
    /// Whether the store keeps what it holds across restarts (then 2026-07-28 rounds outlive a shutdown).
    durable: bool,
    /// The connections of the sessions that are ready, by session id.
    live: Mutex<HashMap<SessionId, Arc<Live>>>,
    /// The calls with a `tools/call` in flight, each with the token that abandons it.
    legs: Mutex<HashMap<CallId, Leg>>,
    /// Numbers the legs, so that one that ends forgets only itself.
    next_leg: std::sync::atomic::AtomicU64,
    /// How long the upstream has worked on each call (for `limits.call_timeout`).
    worked: Mutex<HashMap<CallId, Duration>>,
    shutdown: CancellationToken,
    tracker: TaskTracker,
    /// The tasks running calls, so shutdown can let them tell their upstreams before the sessions close.
    call_tasks: TaskTracker,
    /// Counts the changes to the tools the servers offer: a server ready or not, a new shared session, an
    /// upstream's `notifications/tools/list_changed`.
    tools_changed: Arc<watch::Sender<u64>>,
    /// Where the upstreams' progress on calls goes.
    reports: Reports,
    /// The calls that wait for a person's approval before they are forwarded.
    approvals: Approvals,
}

#[derive(Debug)]
struct Slot {
    server: Server,
    state: Mutex<ServerView>,
}

impl Upstreams {
    /// Creates the upstream side; `start` opens the shared sessions. Calls `approvals` cover wait for an
    /// approval before they are forwarded. With a `durable` store, 2026-07-28 rounds outlive a shutdown.
    pub fn new(
        servers: Vec<Server>,
        domain: Domain,
        limits: LimitsConfig,
        approvals: Approvals,
        durable: bool,
        background: Background,
    ) -> Arc<Self> {
        let Background { shutdown, tracker } = background;
        let Domain {
            replica,
            sessions,
            registry,
            calls,
            grants,
            feed,
        } = domain;
        let replica: Arc<str> = replica.into();
        let servers = servers
            .into_iter()
            .map(|server| Slot {
                state: Mutex::new(ServerView {
                    name: server.name.clone(),
                    replica: replica.clone(),
                    transport: server.transport.kind(),
                    protocol: match server.protocol {
                        ProtocolChoice::Auto => "auto",
                        ProtocolChoice::Legacy => "2025-11-25",
                        ProtocolChoice::Modern => "2026-07-28",
                    },
                    status: ServerStatus::Starting,
                    session: None,
                    detail: None,
                    restarts: 0,
                    retry_at: None,
                    backoff_ms: None,
                }),
                server,
            })
            .collect();
        Arc::new(Self {
            replica,
            servers,
            sessions,
            registry,
            calls,
            grants,
            feed,
            limits,
            durable,
            live: Mutex::default(),
            legs: Mutex::default(),
            next_leg: std::sync::atomic::AtomicU64::new(0),
            worked: Mutex::default(),
            shutdown,
            tracker,
            call_tasks: TaskTracker::new(),
            tools_changed: Arc::new(watch::Sender::new(0)),
            reports: Reports::default(),
            approvals,
        })
    }

    /// Opens each server's shared session, keeps re-opening it when it ends, retries each call `resumes` names
    /// (2026-07-28 calls whose round was answered), and stops the legs of calls that end elsewhere.
    pub fn start(self: &Arc<Self>, mut resumes: mpsc::UnboundedReceiver<Resume>) {
        for index in 0..self.servers.len() {
            self.tracker.spawn(self.clone().supervise(index));
        }
        self.tracker.spawn(self.clone().stop_legs_of_ended_calls());
        let this = self.clone();
        self.tracker.spawn(async move {
            loop {
                let resume = tokio::select! {
                    resume = resumes.recv() => resume,
                    () = this.shutdown.cancelled() => return,
                };
                let Some(resume) = resume else { return };
                this.clone().resume(resume);
            }
        });
    }

    /// Every server with its state.
    pub fn servers(&self) -> Vec<ServerView> {
        self.servers.iter().map(|slot| lock(&slot.state).clone()).collect()
    }

    /// One server by name.
    pub fn server(&self, name: &str) -> Result<ServerView, UpstreamError> {
        Ok(lock(&self.slot(name)?.state).clone())
    }

    /// Opens a private session to a server for `owner`, ready when it returns.
    pub async fn open(self: &Arc<Self>, server: &str, owner: &str) -> Result<SessionView, UpstreamError> {
        let slot = self.slot(server)?;
        let id = SessionId::mint();
        self.sessions
            .starting(
                id.clone(),
                &slot.server.name,
                Some(owner),
                self.limits.sessions_per_principal,
            )
            .await
            .map_err(|error| match error {
                InsertSessionError::TooMany(open) => UpstreamError::TooManySessions {
                    principal: owner.to_owned(),
                    open,
                },
                InsertSessionError::Store(error) => UpstreamError::Store(error),
            })?;
        self.open_session(id, &slot.server, Some(owner))
            .await
            .map(|(view, _)| view)
            .map_err(|error| UpstreamError::Unopened {
                server: server.to_owned(),
                error,
            })
    }

    /// Closes a private session; its pending Requests are cancelled (the upstream is told `cancel`) and its
    /// calls fail.
    pub async fn close(&self, id: &SessionId, detail: &str, by: &Principal) -> Result<SessionView, UpstreamError> {
        let view = self.session(id, by).await?;
        if view.shared {
            return Err(UpstreamError::SharedSession(id.clone()));
        }
        if !by.may_change(view.owner.as_deref()) {
            return Err(UpstreamError::NotPermitted {
                principal: by.name.clone(),
                action: SessionAction::Close,
                session: id.clone(),
            });
        }
        // Taken first, so that a call whose round this completes is not retried on it.
        let live = lock(&self.live).remove(id);
        self.registry
            .cancel(Pending::Session(id.clone()), detail, Tell::Cancel)
            .await?;
        self.close_live(id, live, SessionStatus::Closed, detail).await;
        self.sessions
            .get(id)
            .await?
            .ok_or_else(|| UpstreamError::UnknownSession(id.to_string()))
    }

    /// This gateway's id among the replicas sharing its store.
    pub fn replica(&self) -> &str {
        &self.replica
    }

    /// A session as `by` may see it.
    pub async fn session(&self, id: &SessionId, by: &Principal) -> Result<SessionView, UpstreamError> {
        let view = self
            .sessions
            .get(id)
            .await?
            .ok_or_else(|| UpstreamError::UnknownSession(id.to_string()))?;
        if view.shared || by.may_see(view.owner.as_deref()) {
            Ok(view)
        } else {
            Err(UpstreamError::NotYours(id.clone()))
        }
    }

    /// Starts a `tools/call` for `by` and returns the running Call, with its upstream's reports followed from
    /// before the upstream hears of it, and what says when it is kept, which the caller awaits before it gives
    /// the call's id to anyone.
    pub async fn start_call(
        self: &Arc<Self>,
        target: Target,
        tool: ToolName,
        arguments: Option<Map<String, Value>>,
        by: &Principal,
        via: Via,
    ) -> Result<(CallView, Following, Keeping), UpstreamError> {
        if let Target::Session(id) = &target {
            let session = self.session(id, by).await?;
            if !session.shared && !by.may_change(session.owner.as_deref()) {
                return Err(UpstreamError::NotPermitted {
                    principal: by.name.clone(),
                    action: SessionAction::CallTools,
                    session: id.clone(),
                });
            }
        }
        let live = self.live(&target).await?;
        let call = NewCall {
            server: live.core.server.clone(),
            session: live.core.id.clone(),
            shared: live.core.owner.is_none(),
            tool: tool.as_str().to_owned(),
            arguments: arguments.as_ref().map_or_else(Arguments::empty, Arguments::of),
            owner: by.id.clone(),
            via,
            protocol_version: live.protocol_version.clone(),
            capabilities: serde_json::to_value(capabilities(false)).unwrap_or_default(),
        };
        let seen = self.feed.since();
        let started = self
            .calls
            .create(call, self.limits.calls_per_principal)
            .await
            .map_err(|error| match error {
                InsertCallError::TooMany(running) => UpstreamError::TooManyCalls {
                    principal: by.name.clone(),
                    running,
                },
                InsertCallError::Store(error) => UpstreamError::Store(error),
            })?;
        let view = started.view;
        let following = self.reports.follow(&view.id);
        if let Some(policy) = self.approvals.find(&view.server, &view.tool) {
            // The call runs once approved, with events followed from the approval's claim.
            drop(seen);
            // Nothing goes upstream before the approval: the call must be kept before it can be raised.
            if let Err(error) = started.kept.await {
                self.abandon(view.id.clone());
                return Err(error.into());
            }
            if self.runs_under_grant(&view, &policy.grants).await {
                let view = self.calls.get(&view.id).await?.unwrap_or(view);
                return Ok((view, following, Keeping::already()));
            }
            let input_schema = if policy.editable {
                approval::input_schema(&live, &view.tool).await
            } else {
                None
            };
            self.hold_for_approval(policy, &view, by, input_schema).await;
            let view = self.calls.get(&view.id).await?.unwrap_or(view);
            return Ok((view, following, Keeping::already()));
        }
        let mut params = CallToolRequestParams::new(String::from(tool));
        params.arguments = arguments;
        tracing::debug!(call = %view.id, server = %view.server, tool = %view.tool, "call started");
        // The upstream starts on it while the store writes the call down; if that fails, the call is abandoned.
        let leg = self
            .clone()
            .spawn_leg(
                CallRef {
                    id: view.id.clone(),
                    owner: view.owner.clone(),
                },
                view.tool.clone(),
                live,
                Work::Send(Box::new(params)),
                0,
                Some(seen),
            )
            .await;
        let keeping = Keeping(Some(Unkept {
            kept: started.kept,
            leg,
            upstreams: self.clone(),
            call: view.id.clone(),
        }));
        Ok((view, following, keeping))
    }

    /// Ends, on a task of its own, a call the store could not keep as it started: its starter was answered that
    /// the store failed and never heard its id, and nothing else would end it, so once the store can be written
    /// the call is recorded as failed rather than left running (holding its owner's place, and sent again after
    /// a restart).
    fn abandon(self: &Arc<Self>, call: CallId) {
        let this = self.clone();
        self.tracker.spawn(async move {
            let message =
                "the store could not keep the call as it started (the client was answered 503); it was abandoned";
            this.end_call(&call, Finish::failed(message)).await;
        });
    }

    /// Cancels a call: its pending Requests become `cancelled` and the upstream is told.
    pub async fn cancel_call(&self, id: &CallId, message: &str) -> Result<CallView, UpstreamError> {
        let cancelled = self.calls.finish(id, Finish::Cancelled(message.to_owned())).await?;
        if cancelled.is_some()
            && let Some(leg) = lock(&self.legs).get(id)
        {
            leg.token.cancel();
        }
        lock(&self.worked).remove(id);
        if let Some(view) = &cancelled {
            self.cancel_task_of(view).await;
        }
        self.calls
            .get(id)
            .await?
            .ok_or_else(|| UpstreamError::UnknownCall(id.to_string()))
    }

    /// The merged `tools/list` of a target.
    pub async fn tools(&self, target: &Target, by: &Principal) -> Result<Vec<Tool>, UpstreamError> {
        if let Target::Session(id) = target {
            self.session(id, by).await?;
        }
        let live = self.live(target).await?;
        live.peer.list_all_tools().await.map_err(UpstreamError::ToolsList)
    }

    /// The progress the upstream reports on a call, while the returned value lives.
    pub fn follow(&self, call: &CallId) -> Following {
        self.reports.follow(call)
    }

    /// Wakes at each change to the tools the servers offer; its value counts them.
    pub fn tools_changed(&self) -> watch::Receiver<u64> {
        self.tools_changed.subscribe()
    }

    /// The names of servers whose shared session is not ready.
    pub fn not_ready(&self) -> Vec<String> {
        self.servers()
            .into_iter()
            .filter(|server| server.status != ServerStatus::Ready)
            .map(|server| server.name)
            .collect()
    }

    /// Ends what cannot outlive the process — calls with a request in flight that will not be sent again,
    /// and 2025-11-25 Requests (the upstreams get `cancel`) — then closes every session and waits for them.
    /// With a durable store, 2026-07-28 Requests stay pending and their calls are retried at the next start;
    /// in memory everything ends.
    pub async fn shut_down(&self) {
        let detail = "the gateway is shutting down";
        for call in self.calls.running(None).await.unwrap_or_default() {
            let resumable = self.durable && self.calls.retry(&call.id).await.ok().flatten().is_some();
            let waiting = self.durable
                && call.status == CallStatus::InputRequired
                && (self.keeps_rounds(&call).await || self.awaits_approval(&call).await);
            if resumable || waiting {
                continue;
            }
            if let Err(error) = self.cancel_call(&call.id, detail).await {
                tracing::warn!(call = %call.id, %error, "cancelling a call at shutdown failed");
            }
        }
        let requests = if self.durable {
            Pending::Elicitations
        } else {
            Pending::All
        };
        if let Err(error) = self.registry.cancel(requests, detail, Tell::Cancel).await {
            tracing::warn!(%error, "cancelling Requests at shutdown failed");
        }
        for leg in lock(&self.legs).values() {
            leg.token.cancel();
        }
        self.call_tasks.close();
        let _ = tokio::time::timeout(CLOSE_TIMEOUT, self.call_tasks.wait()).await;
        let open: Vec<SessionId> = lock(&self.live).keys().cloned().collect();
        for id in open {
            self.end_session(&id, SessionStatus::Closed, detail).await;
        }
        self.tracker.close();
        self.tracker.wait().await;
    }

    /// Whether a call started on a session that suspends as 2026-07-28 rounds.
    async fn keeps_rounds(&self, call: &CallView) -> bool {
        self.sessions
            .get(&call.session)
            .await
            .ok()
            .flatten()
            .and_then(|session| session.protocol_version)
            .is_some_and(|version| version.as_str() >= ROUNDS_PROTOCOL)
    }

    async fn live(&self, target: &Target) -> Result<Arc<Live>, UpstreamError> {
        match target {
            Target::Server(name) => {
                let state = lock(&self.slot(name)?.state).clone();
                state
                    .session
                    .filter(|_| state.status == ServerStatus::Ready)
                    .and_then(|session| lock(&self.live).get(&session).cloned())
                    .ok_or_else(|| UpstreamError::ServerNotReady {
                        server: name.clone(),
                        detail: state.detail.unwrap_or_else(|| "it is starting".to_owned()),
                    })
            }
            Target::Session(id) => {
                if let Some(live) = lock(&self.live).get(id).cloned() {
                    return Ok(live);
                }
                match self.sessions.get(id).await? {
                    Some(_) => Err(UpstreamError::SessionNotReady(id.to_string())),
                    None => Err(UpstreamError::UnknownSession(id.to_string())),
                }
            }
        }
    }

    fn slot(&self, name: &str) -> Result<&Slot, UpstreamError> {
        self.servers
            .iter()
            .find(|slot| slot.server.name == name)
            .ok_or_else(|| UpstreamError::UnknownServer(name.to_owned()))
    }
}
