//! The upstream MCP servers: their shared sessions (re-opened with back-off), private sessions, the live
//! connections behind them, and the calls that run on them.

mod call;
mod client;
mod connect;
mod stdio;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rmcp::model::CallToolRequestParams;
use rmcp::{Peer, RoleClient};
use serde::Serialize;
use serde_json::{Map, Value};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

pub use client::{CallRef, SessionCore, capabilities};

use crate::Background;
use crate::auth::Principal;
use crate::calls::Calls;
use crate::config::{LimitsConfig, ProtocolChoice, Server};
use crate::feed::Feed;
use crate::ids;
use crate::records::{CallStatus, CallView, Finish, SessionStatus, SessionView};
use crate::registry::{Registry, Tell};
use crate::sessions::Sessions;
use crate::store::{InsertCallError, InsertSessionError, NewCall, Pending, Retry, StoreError};
use crate::time::Timestamp;
use client::GatewayClient;

/// The first pause before re-opening a shared session; it doubles up to `MAX_BACKOFF`.
const INITIAL_BACKOFF: Duration = Duration::from_millis(500);
/// The longest pause between attempts to re-open a shared session.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// How long a shared session must stay open for the back-off to start again from `INITIAL_BACKOFF`.
const STABLE_AFTER: Duration = Duration::from_secs(30);
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
    SharedSession(String),
    #[error("{0}")]
    Unreachable(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    TooMany(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Where a call runs.
#[derive(Debug, Clone)]
pub enum Target {
    /// On the shared session of this server.
    Server(String),
    /// On this session.
    Session(String),
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
    pub transport: &'static str,
    pub protocol: &'static str,
    pub status: ServerStatus,
    /// Its shared session, while one is open.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
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
    pub sessions: Sessions,
    pub registry: Registry,
    pub calls: Calls,
    pub feed: Feed,
}

/// The upstream side of the gateway.
#[derive(Debug)]
pub struct Upstreams {
    servers: Vec<Slot>,
    sessions: Sessions,
    registry: Registry,
    calls: Calls,
    feed: Feed,
    limits: LimitsConfig,
    /// Whether the store keeps what it holds across restarts (then 2026-07-28 rounds outlive a shutdown).
    durable: bool,
    /// The connections of the sessions that are ready, by session id.
    live: Mutex<HashMap<String, Arc<Live>>>,
    /// The calls with a `tools/call` in flight, each with the token that abandons it.
    legs: Mutex<HashMap<String, CancellationToken>>,
    /// How long the upstream has worked on each call (for `limits.call_timeout`).
    worked: Mutex<HashMap<String, Duration>>,
    shutdown: CancellationToken,
    tracker: TaskTracker,
    /// The tasks running calls, so shutdown can let them tell their upstreams before the sessions close.
    call_tasks: TaskTracker,
}

#[derive(Debug)]
struct Slot {
    server: Server,
    state: Mutex<ServerView>,
}

impl Upstreams {
    /// Creates the upstream side; `start` opens the shared sessions. With a `durable` store, 2026-07-28
    /// rounds outlive a shutdown.
    pub fn new(
        servers: Vec<Server>,
        domain: Domain,
        limits: LimitsConfig,
        durable: bool,
        background: Background,
    ) -> Arc<Self> {
        let Background { shutdown, tracker } = background;
        let Domain {
            sessions,
            registry,
            calls,
            feed,
        } = domain;
        let servers = servers
            .into_iter()
            .map(|server| Slot {
                state: Mutex::new(ServerView {
                    name: server.name.clone(),
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
            servers,
            sessions,
            registry,
            calls,
            feed,
            limits,
            durable,
            live: Mutex::default(),
            legs: Mutex::default(),
            worked: Mutex::default(),
            shutdown,
            tracker,
            call_tasks: TaskTracker::new(),
        })
    }

    /// Opens each server's shared session, keeps re-opening it when it ends, and retries each call `resumes`
    /// names (2026-07-28 calls whose round was answered).
    pub fn start(self: &Arc<Self>, mut resumes: mpsc::UnboundedReceiver<Retry>) {
        for index in 0..self.servers.len() {
            self.tracker.spawn(self.clone().supervise(index));
        }
        let this = self.clone();
        self.tracker.spawn(async move {
            loop {
                let retry = tokio::select! {
                    retry = resumes.recv() => retry,
                    () = this.shutdown.cancelled() => return,
                };
                let Some(retry) = retry else { return };
                this.clone().resume(retry);
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
        let id = ids::mint(ids::SESSION);
        self.sessions
            .starting(&id, &slot.server.name, Some(owner), self.limits.sessions_per_principal)
            .await
            .map_err(|error| match error {
                InsertSessionError::TooMany(open) => UpstreamError::TooMany(format!(
                    "{owner} has {open} sessions open, the most one principal may hold (limits.sessions_per_principal)"
                )),
                InsertSessionError::Store(error) => UpstreamError::Store(error),
            })?;
        self.open_session(id, &slot.server, Some(owner))
            .await
            .map(|(view, _)| view)
            .map_err(|detail| UpstreamError::Unreachable(format!("cannot open a session to {server:?}: {detail}")))
    }

    /// Closes a private session; its pending Requests are cancelled (the upstream is told `cancel`) and its
    /// calls fail.
    pub async fn close(&self, id: &str, detail: &str, by: &Principal) -> Result<SessionView, UpstreamError> {
        let view = self.session(id, by)?;
        if view.shared {
            return Err(UpstreamError::SharedSession(id.to_owned()));
        }
        if !by.may_change(view.owner.as_deref()) {
            return Err(UpstreamError::Forbidden(format!(
                "{} may not close session {id}",
                by.name
            )));
        }
        // Taken first, so that a call whose round this completes is not retried on it.
        let live = lock(&self.live).remove(id);
        self.registry
            .cancel(Pending::Session(id.to_owned()), detail, Tell::Cancel)
            .await?;
        self.close_live(id, live, SessionStatus::Closed, detail).await;
        self.sessions
            .get(id)?
            .ok_or_else(|| UpstreamError::UnknownSession(id.to_owned()))
    }

    /// A session as `by` may see it.
    pub fn session(&self, id: &str, by: &Principal) -> Result<SessionView, UpstreamError> {
        let view = self
            .sessions
            .get(id)?
            .ok_or_else(|| UpstreamError::UnknownSession(id.to_owned()))?;
        if view.shared || by.may_see(view.owner.as_deref()) {
            Ok(view)
        } else {
            Err(UpstreamError::Forbidden(format!(
                "session {id} belongs to another principal"
            )))
        }
    }

    /// Starts a `tools/call` for `by` and returns the running Call.
    pub async fn start_call(
        self: &Arc<Self>,
        target: Target,
        tool: String,
        arguments: Option<Map<String, Value>>,
        by: &Principal,
    ) -> Result<CallView, UpstreamError> {
        if let Target::Session(id) = &target {
            let session = self.session(id, by)?;
            if !session.shared && !by.may_change(session.owner.as_deref()) {
                return Err(UpstreamError::Forbidden(format!(
                    "{} may not call tools on session {id}",
                    by.name
                )));
            }
        }
        let live = self.live(&target)?;
        let call = NewCall {
            server: live.core.server.clone(),
            session: live.core.id.clone(),
            shared: live.core.owner.is_none(),
            tool: tool.clone(),
            arguments: arguments.clone().map_or(Value::Object(Map::new()), Value::Object),
            owner: by.name.clone(),
            protocol_version: live.protocol_version.clone(),
            capabilities: serde_json::to_value(capabilities()).unwrap_or_default(),
        };
        let started = self
            .calls
            .create(call, self.limits.calls_per_principal)
            .await
            .map_err(|error| match error {
                InsertCallError::TooMany(running) => UpstreamError::TooMany(format!(
                    "{} has {running} calls running, the most one principal may hold (limits.calls_per_principal)",
                    by.name
                )),
                InsertCallError::Store(error) => UpstreamError::Store(error),
            })?;
        let view = started.view;
        let mut params = CallToolRequestParams::new(tool);
        params.arguments = arguments;
        tracing::debug!(call = %view.id, server = %view.server, tool = %view.tool, "call started");
        // The upstream starts on it while the store writes the call down; if that fails, the call is abandoned.
        let leg = self.clone().spawn_leg(
            CallRef {
                id: view.id.clone(),
                owner: view.owner.clone(),
            },
            view.tool.clone(),
            live,
            params,
            0,
        );
        if let Err(error) = started.kept.await {
            leg.cancel();
            return Err(UpstreamError::Store(error));
        }
        Ok(view)
    }

    /// Cancels a call: its pending Requests become `cancelled` and the upstream is told.
    pub async fn cancel_call(&self, id: &str, message: &str) -> Result<CallView, UpstreamError> {
        let cancelled = self.calls.finish(id, Finish::Cancelled(message.to_owned())).await?;
        if cancelled.is_some()
            && let Some(leg) = lock(&self.legs).get(id)
        {
            leg.cancel();
        }
        self.calls
            .get(id)?
            .ok_or_else(|| UpstreamError::UnknownCall(id.to_owned()))
    }

    /// The merged `tools/list` of a target.
    pub async fn tools(&self, target: &Target, by: &Principal) -> Result<Value, UpstreamError> {
        if let Target::Session(id) = target {
            self.session(id, by)?;
        }
        let live = self.live(target)?;
        let tools = live
            .peer
            .list_all_tools()
            .await
            .map_err(|error| UpstreamError::Unreachable(format!("tools/list failed: {error}")))?;
        Ok(serde_json::json!({ "tools": tools }))
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
        for call in self.calls.running(None).unwrap_or_default() {
            let resumable = self.durable && self.calls.retry(&call.id).ok().flatten().is_some();
            let waiting = self.durable && call.status == CallStatus::InputRequired && self.keeps_rounds(&call);
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
            leg.cancel();
        }
        self.call_tasks.close();
        let _ = tokio::time::timeout(CLOSE_TIMEOUT, self.call_tasks.wait()).await;
        let open: Vec<String> = lock(&self.live).keys().cloned().collect();
        for id in open {
            self.end_session(&id, SessionStatus::Closed, detail).await;
        }
        self.tracker.close();
        self.tracker.wait().await;
    }

    /// Whether a call started on a session that suspends as 2026-07-28 rounds.
    fn keeps_rounds(&self, call: &CallView) -> bool {
        self.sessions
            .get(&call.session)
            .ok()
            .flatten()
            .and_then(|session| session.protocol_version)
            .is_some_and(|version| version.as_str() >= ROUNDS_PROTOCOL)
    }

    fn live(&self, target: &Target) -> Result<Arc<Live>, UpstreamError> {
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
                self.sessions
                    .get(id)?
                    .ok_or_else(|| UpstreamError::UnknownSession(id.clone()))?;
                lock(&self.live)
                    .get(id)
                    .cloned()
                    .ok_or_else(|| UpstreamError::SessionNotReady(id.clone()))
            }
        }
    }

    fn slot(&self, name: &str) -> Result<&Slot, UpstreamError> {
        self.servers
            .iter()
            .find(|slot| slot.server.name == name)
            .ok_or_else(|| UpstreamError::UnknownServer(name.to_owned()))
    }

    /// Sends one `tools/call` of a call on a task of its own, and acts on how it ends: the call ends, or
    /// waits on a round of Requests (then the answer that completes the round resumes it).
    fn spawn_leg(
        self: Arc<Self>,
        call: CallRef,
        tool: String,
        live: Arc<Live>,
        params: CallToolRequestParams,
        round: u32,
    ) -> CancellationToken {
        let leg = CancellationToken::new();
        lock(&self.legs).insert(call.id.clone(), leg.clone());
        let span = tracing::info_span!(parent: None, "call", call = %call.id, server = %live.core.server,
            session = %live.core.id, tool = %tool);
        let this = self.clone();
        let token = leg.clone();
        let run = async move {
            let ended = this.drive(&call, &live, params, round, &token).await;
            lock(&this.legs).remove(&call.id);
            live.core.settle_withdrawn().await;
            let Some(finish) = ended else { return };
            match &finish {
                Finish::Completed(_) => tracing::info!("call completed"),
                Finish::Failed(error) => tracing::info!(message = %error.message, "call ended"),
                Finish::Cancelled(message) => tracing::info!(message, "call ended"),
            }
            lock(&this.worked).remove(&call.id);
            if let Err(error) = this.calls.finish(&call.id, finish).await {
                tracing::error!(%error, "the call's end could not be recorded");
            }
        };
        self.tracker.spawn(self.call_tasks.track_future(run.instrument(span)));
        leg
    }

    /// Drives one leg; `None` when the call goes on without it (it waits on a round, it was cancelled, or
    /// the gateway is shutting down and will send it again at the next start).
    async fn drive(
        &self,
        call: &CallRef,
        live: &Arc<Live>,
        params: CallToolRequestParams,
        round: u32,
        leg: &CancellationToken,
    ) -> Option<Finish> {
        let started = tokio::time::Instant::now();
        let budget = self.budget(&call.id);
        let ended = tokio::select! {
            biased;
            () = leg.cancelled() => {
                tracing::info!("call cancelled");
                return None;
            }
            () = live.closed.cancelled() => {
                Some(Finish::failed(format!("the session ended before the call completed: {}", live.ended())))
            }
            ended = call::drive(&live.core, &live.peer, call, params, round) => ended,
            limit = budget => Some(Finish::failed(format!(
                "the upstream worked on the call for longer than {}s (limits.call_timeout); it was cancelled",
                limit.as_secs_f64()
            ))),
        };
        if !live.keeps_rounds() {
            return ended;
        }
        *lock(&self.worked).entry(call.id.clone()).or_default() += started.elapsed();
        ended
    }

    /// Resolves, with the limit, once a call has used up `limits.call_timeout` of upstream work; never
    /// without a limit. Time the call spends waiting on a Request does not count.
    fn budget(&self, call: &str) -> impl Future<Output = Duration> + Send + 'static {
        let limit = self.limits.call_timeout;
        let used = lock(&self.worked).get(call).copied().unwrap_or_default();
        let (calls, call, feed) = (self.calls.clone(), call.to_owned(), self.feed.clone());
        async move {
            let Some(limit) = limit else {
                return std::future::pending().await;
            };
            work_budget(limit, used, calls, call, feed).await
        }
    }

    /// Retries a call whose round was answered, on its session or, if that was the server's shared one,
    /// on the shared session open now.
    fn resume(self: Arc<Self>, retry: Retry) {
        let this = self.clone();
        self.tracker.spawn(async move {
            let call = retry.call.clone();
            let live = match this.session_for(&retry).await {
                Ok(live) => live,
                Err(detail) => {
                    let failed = this.calls.finish(&call, Finish::failed(detail)).await;
                    if let Err(error) = failed {
                        tracing::error!(%call, %error, "the call's end could not be recorded");
                    }
                    return;
                }
            };
            let mut params = CallToolRequestParams::new(retry.tool.clone());
            params.arguments = match retry.arguments {
                Value::Object(arguments) => Some(arguments),
                _ => None,
            };
            params.input_responses = Some(retry.input_responses.into_iter().collect());
            params.request_state = retry.request_state;
            let call = CallRef {
                id: call,
                owner: retry.owner,
            };
            let _ = this.spawn_leg(call, retry.tool, live, params, retry.round);
        });
    }

    /// The session a retry goes to: the call's own while it is open; else the server's shared session (once
    /// it is ready, within the server's `startup_timeout`) if the call ran on a shared one.
    async fn session_for(&self, retry: &Retry) -> Result<Arc<Live>, String> {
        if let Some(live) = lock(&self.live).get(&retry.session).cloned() {
            return Ok(live);
        }
        if !retry.shared {
            return Err("the session ended before the call completed".to_owned());
        }
        let slot = self.slot(&retry.server).map_err(|error| error.to_string())?;
        let target = Target::Server(retry.server.clone());
        let ready = || self.live(&target).ok();
        let wait = slot.server.startup_timeout;
        self.feed
            .wait_for(wait, &self.shutdown, ready)
            .await
            .ok_or_else(|| match self.live(&target) {
                Err(error) => format!("the call could not be retried: {error}"),
                Ok(_) => "the gateway is shutting down".to_owned(),
            })
    }

    /// Keeps a server's shared session open until shutdown, re-opening it with back-off.
    ///
    /// The back-off grows while attempts fail or sessions end soon after opening, so a server that dies in a
    /// loop is not restarted in a tight one.
    async fn supervise(self: Arc<Self>, index: usize) {
        let slot = &self.servers[index];
        let mut backoff = INITIAL_BACKOFF;
        loop {
            self.update(slot, |state| {
                state.status = ServerStatus::Starting;
                state.retry_at = None;
                state.backoff_ms = None;
            });
            let id = ids::mint(ids::SESSION);
            let opened = match self.sessions.starting(&id, &slot.server.name, None, usize::MAX).await {
                Ok(_) => self.open_session(id, &slot.server, None).await,
                Err(error) => Err(format!("the store cannot record its session: {error}")),
            };
            match opened {
                Ok((view, live)) => {
                    let opened = tokio::time::Instant::now();
                    self.update(slot, |state| {
                        state.status = ServerStatus::Ready;
                        state.session = Some(view.id);
                        state.detail = None;
                    });
                    tokio::select! {
                        () = live.closed.cancelled() => {}
                        () = self.shutdown.cancelled() => return,
                    }
                    if opened.elapsed() >= STABLE_AFTER {
                        backoff = INITIAL_BACKOFF;
                    }
                    let ended = live.ended().to_owned();
                    self.update(slot, |state| {
                        state.status = ServerStatus::Starting;
                        state.session = None;
                        state.detail = Some(format!("re-opening: the previous session ended: {ended}"));
                        state.restarts += 1;
                    });
                }
                Err(detail) => self.update(slot, |state| {
                    state.status = ServerStatus::Failed;
                    state.detail = Some(format!("{detail} (retrying in {}ms)", backoff.as_millis()));
                }),
            }
            self.update(slot, |state| {
                state.retry_at = Some(Timestamp::now().after(backoff));
                state.backoff_ms = Some(u64::try_from(backoff.as_millis()).unwrap_or(u64::MAX));
            });
            tokio::select! {
                () = tokio::time::sleep(backoff) => {}
                () = self.shutdown.cancelled() => return,
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    fn update(&self, slot: &Slot, change: impl FnOnce(&mut ServerView)) {
        change(&mut lock(&slot.state));
        self.feed.notify();
    }

    /// Connects a session recorded as starting (a shared one without `owner`, a private one with it) and hands
    /// its connection to a task that owns it until it ends.
    async fn open_session(
        self: &Arc<Self>,
        id: String,
        server: &Server,
        owner: Option<&str>,
    ) -> Result<(SessionView, Arc<Live>), String> {
        let core = Arc::new(SessionCore::new(
            id.clone(),
            server.name.clone(),
            owner.map(str::to_owned),
            self.registry.clone(),
            self.calls.clone(),
        ));
        let connected = tokio::select! {
            connected = connect::connect(server, |protocol| GatewayClient::new(core.clone(), protocol)) => connected,
            () = self.shutdown.cancelled() => Err("the gateway is shutting down".to_owned()),
        };
        let (connection, eof) = match connected {
            Ok(connected) => connected,
            Err(detail) => {
                self.record_end(&id, SessionStatus::Failed, &detail).await;
                return Err(detail);
            }
        };
        let info = connection.peer_info();
        let protocol_version = info.as_ref().map(|info| info.protocol_version.to_string());
        let live = Arc::new(Live {
            core,
            peer: connection.peer().clone(),
            protocol_version: protocol_version.clone(),
            closed: CancellationToken::new(),
            ended: std::sync::OnceLock::new(),
        });
        lock(&self.live).insert(id.clone(), live.clone());
        let server_info = info.as_ref().and_then(|info| info.server_info.clone());
        let view = match self.sessions.ready(&id, protocol_version, server_info).await {
            Ok(Some(view)) => view,
            Ok(None) | Err(_) => {
                self.end_session(&id, SessionStatus::Failed, "the session could not be recorded as ready")
                    .await;
                return Err("the session vanished while connecting".to_owned());
            }
        };
        let this = self.clone();
        let closed = live.closed.clone();
        let sends = live.core.sends.clone();
        self.tracker.spawn(async move {
            let mut connection = connection;
            tokio::select! {
                detail = eof => {
                    let detail = detail.unwrap_or_else(|_| stdio::ENDED.to_owned());
                    // Calls see the session end first, so they fail with its reason rather than a side effect of it.
                    let live = lock(&this.live).remove(&id);
                    if let Some(live) = &live {
                        live.end(&detail);
                    }
                    this.close_live(&id, live, SessionStatus::Failed, &detail).await;
                    let cancelled = this.registry.cancel(Pending::Session(id.clone()), &detail, Tell::Nothing).await;
                    if let Err(error) = cancelled {
                        tracing::error!(session = %id, %error, "the session's Requests could not be cancelled");
                    }
                }
                () = closed.cancelled() => {}
            }
            sends.close();
            let _ = tokio::time::timeout(CLOSE_TIMEOUT, sends.wait()).await;
            let _ = connection.close_with_timeout(CLOSE_TIMEOUT).await;
        });
        Ok((view, live))
    }

    /// Ends a session: its connection closes, and its 2026-07-28 calls waiting on Requests fail unless it is a
    /// shared session, whose successor takes their retries.
    async fn end_session(&self, id: &str, status: SessionStatus, detail: &str) {
        let live = lock(&self.live).remove(id);
        self.close_live(id, live, status, detail).await;
    }

    /// Records a session's end and closes its connection, taken off the live ones already.
    async fn close_live(&self, id: &str, live: Option<Arc<Live>>, status: SessionStatus, detail: &str) {
        if let Some(live) = &live {
            live.end(detail);
        }
        self.record_end(id, status, detail).await;
        let Some(live) = live else { return };
        if live.core.owner.is_none() {
            return;
        }
        for call in self.calls.running(Some(id)).unwrap_or_default() {
            if lock(&self.legs).contains_key(&call.id) {
                continue;
            }
            let message = format!("the session ended before the call completed: {detail}");
            if let Err(error) = self.calls.finish(&call.id, Finish::failed(message)).await {
                tracing::error!(call = %call.id, %error, "the call's end could not be recorded");
            }
        }
    }

    async fn record_end(&self, id: &str, status: SessionStatus, detail: &str) {
        if let Err(error) = self.sessions.end(id, status, detail).await {
            tracing::error!(session = %id, %error, "the session's end could not be recorded");
        }
    }
}

/// Resolves, with the limit, once a call has worked for `limit` (having used `used` already) without
/// waiting on a Request.
async fn work_budget(limit: Duration, mut used: Duration, calls: Calls, call: String, feed: Feed) -> Duration {
    let mut versions = feed.versions();
    loop {
        if used >= limit {
            return limit;
        }
        let waiting = calls
            .status(&call)
            .ok()
            .flatten()
            .is_some_and(|(status, _)| status == CallStatus::InputRequired);
        let started = tokio::time::Instant::now();
        if waiting {
            let _ = versions.changed().await;
            continue;
        }
        tokio::select! {
            _ = versions.changed() => {}
            () = tokio::time::sleep(limit - used) => return limit,
        }
        used += started.elapsed();
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
