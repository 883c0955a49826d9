//! The upstream MCP servers: their shared sessions (re-opened with back-off), private sessions, and the
//! calls that run on them.

mod call;
mod client;
mod connect;
mod stdio;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rmcp::model::CallToolRequestParams;
use serde::Serialize;
use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

pub use client::{SessionCore, capabilities};

use crate::Background;
use crate::auth::Principal;
use crate::calls::{CallStatus, CallView, Calls, Finish, NewCall};
use crate::changes::Changes;
use crate::config::{LimitsConfig, ProtocolChoice, Server};
use crate::ids;
use crate::registry::Registry;
use crate::sessions::{Live, SessionStatus, SessionView, Sessions};
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

/// Why an upstream operation could not be done.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("no server named {0:?}")]
    UnknownServer(String),
    #[error("no session {0}")]
    UnknownSession(String),
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

/// The upstream side of the gateway.
#[derive(Debug)]
pub struct Upstreams {
    servers: Vec<Slot>,
    sessions: Sessions,
    registry: Registry,
    calls: Calls,
    changes: Changes,
    limits: LimitsConfig,
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
    /// Creates the upstream side; `start` opens the shared sessions.
    pub fn new(
        servers: Vec<Server>,
        sessions: Sessions,
        registry: Registry,
        calls: Calls,
        changes: Changes,
        limits: LimitsConfig,
        background: Background,
    ) -> Arc<Self> {
        let Background { shutdown, tracker } = background;
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
            changes,
            limits,
            shutdown,
            tracker,
            call_tasks: TaskTracker::new(),
        })
    }

    /// Opens each server's shared session, and keeps re-opening it when it ends.
    pub fn start(self: &Arc<Self>) {
        for index in 0..self.servers.len() {
            self.tracker.spawn(self.clone().supervise(index));
        }
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
            .map_err(|open| {
                UpstreamError::TooMany(format!(
                    "{owner} has {open} sessions open, the most one principal may hold (limits.sessions_per_principal)"
                ))
            })?;
        self.open_session(id, &slot.server, Some(owner))
            .await
            .map(|(view, _)| view)
            .map_err(|detail| UpstreamError::Unreachable(format!("cannot open a session to {server:?}: {detail}")))
    }

    /// Closes a private session; its pending Requests are cancelled and the upstream told `cancel`.
    pub fn close(&self, id: &str, detail: &str, by: &Principal) -> Result<SessionView, UpstreamError> {
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
        self.registry.cancel_session(id, detail, true);
        self.sessions.end(id, SessionStatus::Closed, detail);
        self.sessions
            .get(id)
            .ok_or_else(|| UpstreamError::UnknownSession(id.to_owned()))
    }

    /// A session as `by` may see it.
    pub fn session(&self, id: &str, by: &Principal) -> Result<SessionView, UpstreamError> {
        let view = self
            .sessions
            .get(id)
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
    pub fn start_call(
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
            tool: tool.clone(),
            arguments: arguments.clone().map_or(Value::Object(Map::new()), Value::Object),
            owner: by.name.clone(),
        };
        let (view, cancel) = self
            .calls
            .create(call, self.limits.calls_per_principal)
            .map_err(|running| {
                UpstreamError::TooMany(format!(
                    "{} has {running} calls running, the most one principal may hold (limits.calls_per_principal)",
                    by.name
                ))
            })?;
        let mut params = CallToolRequestParams::new(tool);
        params.arguments = arguments;
        let (calls, sessions, id) = (self.calls.clone(), self.sessions.clone(), view.id.clone());
        let budget = work_budget(
            self.limits.call_timeout,
            self.calls.clone(),
            view.id.clone(),
            self.changes.clone(),
        );
        let span = tracing::info_span!(parent: None, "call", call = %id, server = %view.server, session = %view.session, tool = %view.tool);
        tracing::debug!(parent: &span, "call started");
        let run = async move {
            let finish = tokio::select! {
                biased;
                () = cancel.cancelled() => {
                    tracing::info!("call cancelled");
                    return;
                }
                () = live.closed.cancelled() => {
                    let detail = sessions.get(&live.core.id).and_then(|view| view.detail).unwrap_or_default();
                    Finish::Failed(format!("the session ended before the call completed: {detail}"))
                }
                finish = call::drive(&live.core, &live.peer, &id, params) => finish,
                limit = budget => Finish::Failed(format!(
                    "the upstream worked on the call for longer than {}s (limits.call_timeout); it was cancelled",
                    limit.as_secs_f64()
                )),
            };
            live.core.settle_withdrawn();
            match &finish {
                Finish::Completed(_) => tracing::info!("call completed"),
                Finish::Failed(message) | Finish::Cancelled(message) => tracing::info!(message, "call ended"),
            }
            calls.finish(&id, finish);
        };
        self.tracker.spawn(self.call_tasks.track_future(run.instrument(span)));
        Ok(view)
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

    /// Cancels every call and Request (the upstreams get `cancel`), closes every session and waits for them.
    pub async fn shut_down(&self) {
        let detail = "the gateway is shutting down";
        self.calls.cancel_all(detail);
        self.registry.cancel_all(detail);
        self.call_tasks.close();
        let _ = tokio::time::timeout(CLOSE_TIMEOUT, self.call_tasks.wait()).await;
        for id in self.sessions.open_ids() {
            self.sessions.end(&id, SessionStatus::Closed, detail);
        }
        self.tracker.close();
        self.tracker.wait().await;
    }

    fn live(&self, target: &Target) -> Result<Arc<Live>, UpstreamError> {
        match target {
            Target::Server(name) => {
                let state = lock(&self.slot(name)?.state).clone();
                state
                    .session
                    .filter(|_| state.status == ServerStatus::Ready)
                    .and_then(|session| self.sessions.live(&session))
                    .ok_or_else(|| UpstreamError::ServerNotReady {
                        server: name.clone(),
                        detail: state.detail.unwrap_or_else(|| "it is starting".to_owned()),
                    })
            }
            Target::Session(id) => {
                self.sessions
                    .get(id)
                    .ok_or_else(|| UpstreamError::UnknownSession(id.clone()))?;
                self.sessions
                    .live(id)
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
            // Shared sessions have no cap, so this cannot be refused.
            let _ = self.sessions.starting(&id, &slot.server.name, None, usize::MAX);
            match self.open_session(id, &slot.server, None).await {
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
                    let ended = self.sessions.get(&live.core.id).and_then(|view| view.detail);
                    self.update(slot, |state| {
                        state.status = ServerStatus::Starting;
                        state.session = None;
                        state.detail = ended.map(|detail| format!("re-opening: the previous session ended: {detail}"));
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
        self.changes.notify();
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
                self.sessions.end(&id, SessionStatus::Failed, &detail);
                return Err(detail);
            }
        };
        let info = connection.peer_info();
        let live = Arc::new(Live {
            core,
            peer: connection.peer().clone(),
            closed: CancellationToken::new(),
        });
        let view = self
            .sessions
            .ready(
                &id,
                live.clone(),
                info.as_ref().map(|info| info.protocol_version.to_string()),
                info.as_ref().and_then(|info| info.server_info.clone()),
            )
            .ok_or_else(|| "the session vanished while connecting".to_owned())?;
        let this = self.clone();
        let closed = live.closed.clone();
        let sends = live.core.sends.clone();
        self.tracker.spawn(async move {
            let mut connection = connection;
            tokio::select! {
                detail = eof => {
                    let detail = detail.unwrap_or_else(|_| stdio::ENDED.to_owned());
                    // Calls see the session end first, so they fail with its reason rather than a side effect of it.
                    this.sessions.end(&id, SessionStatus::Failed, &detail);
                    this.registry.cancel_session(&id, &detail, false);
                }
                () = closed.cancelled() => {}
            }
            sends.close();
            let _ = tokio::time::timeout(CLOSE_TIMEOUT, sends.wait()).await;
            let _ = connection.close_with_timeout(CLOSE_TIMEOUT).await;
        });
        Ok((view, live))
    }
}

/// Resolves, with the limit, once a call has run for `limit` without waiting on a Request; never without a limit.
async fn work_budget(limit: Option<Duration>, calls: Calls, call: String, changes: Changes) -> Duration {
    let Some(limit) = limit else {
        return std::future::pending().await;
    };
    let mut used = Duration::ZERO;
    let mut versions = changes.subscribe();
    loop {
        let waiting = calls.status(&call) == Some(CallStatus::InputRequired);
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
        if used >= limit {
            return limit;
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
