//! The sessions' connections: each server's shared session kept open (re-opened with back-off), a session
//! connected and handed to a task that owns it until it ends, and what ending a session ends with it.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::client::GatewayClient;
use super::connect::ConnectError;
use super::{CLOSE_TIMEOUT, Live, ServerStatus, ServerView, SessionCore, Slot, Upstreams, connect, lock, stdio};
use crate::config::Server;
use crate::ids::SessionId;
use crate::records::{Finish, SessionStatus, SessionView};
use crate::registry::Tell;
use crate::store::{InsertSessionError, Pending};

/// The first pause before re-opening a shared session; it doubles up to `MAX_BACKOFF`.
const INITIAL_BACKOFF: Duration = Duration::from_millis(500);
/// The longest pause between attempts to re-open a shared session.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// How long a shared session must stay open for the back-off to start again from `INITIAL_BACKOFF`.
const STABLE_AFTER: Duration = Duration::from_secs(30);
/// The first pause before recording a session's end again; it doubles up to `MAX_BACKOFF`.
const RECORD_RETRY: Duration = Duration::from_millis(250);

/// Why a session could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("the store cannot record its session: {0}")]
    Unrecorded(InsertSessionError),
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error("the gateway is shutting down")]
    ShuttingDown,
    /// Its record was gone once it was connected.
    #[error("the session vanished while connecting")]
    Vanished,
}

impl Upstreams {
    /// Keeps a server's shared session open until shutdown, re-opening it with back-off.
    ///
    /// The back-off grows while attempts fail or sessions end soon after opening, so a server that dies in a
    /// loop is not restarted in a tight one.
    pub(super) async fn supervise(self: Arc<Self>, index: usize) {
        let slot = &self.servers[index];
        let mut backoff = INITIAL_BACKOFF;
        loop {
            self.update(slot, |state| {
                state.status = ServerStatus::Starting;
                state.retry_at = None;
                state.backoff_ms = None;
            });
            let id = SessionId::mint();
            let opened = match self
                .sessions
                .starting(id.clone(), &slot.server.name, None, usize::MAX)
                .await
            {
                Ok(_) => self.open_session(id, &slot.server, None).await,
                Err(error) => Err(OpenError::Unrecorded(error)),
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
                Err(error) => self.update(slot, |state| {
                    state.status = ServerStatus::Failed;
                    state.detail = Some(format!("{error} (retrying in {}ms)", backoff.as_millis()));
                }),
            }
            self.update(slot, |state| {
                state.retry_at = Some(self.registry.clock().now().after(backoff));
                state.backoff_ms = Some(u64::try_from(backoff.as_millis()).unwrap_or(u64::MAX));
            });
            tokio::select! {
                () = self.registry.clock().sleep(backoff) => {}
                () = self.shutdown.cancelled() => return,
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    fn update(&self, slot: &Slot, change: impl FnOnce(&mut ServerView)) {
        let offered = {
            let mut state = lock(&slot.state);
            let before = (state.status, state.session.clone());
            change(&mut state);
            before != (state.status, state.session.clone())
        };
        if offered {
            self.tools_changed
                .send_modify(|version| *version = version.wrapping_add(1));
        }
        self.feed.notify();
    }

    /// Connects a session recorded as starting (a shared one without `owner`, a private one with it) and hands
    /// its connection to a task that owns it until it ends.
    pub(super) async fn open_session(
        self: &Arc<Self>,
        id: SessionId,
        server: &Server,
        owner: Option<&str>,
    ) -> Result<(SessionView, Arc<Live>), OpenError> {
        let core = Arc::new(SessionCore::new(
            id.clone(),
            server,
            owner.map(str::to_owned),
            self.registry.clone(),
            self.calls.clone(),
            self.tools_changed.clone(),
            self.reports.clone(),
        ));
        let connected = tokio::select! {
            connected = connect::connect(server, |protocol| GatewayClient::new(core.clone(), protocol)) => {
                connected.map_err(OpenError::Connect)
            }
            () = self.shutdown.cancelled() => Err(OpenError::ShuttingDown),
        };
        let (connection, eof) = match connected {
            Ok(connected) => connected,
            Err(error) => {
                self.record_end(&id, SessionStatus::Failed, &error.to_string()).await;
                return Err(error);
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
                return Err(OpenError::Vanished);
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
    pub(super) async fn end_session(&self, id: &SessionId, status: SessionStatus, detail: &str) {
        let live = lock(&self.live).remove(id);
        self.close_live(id, live, status, detail).await;
    }

    /// Records a session's end and closes its connection, taken off the live ones already.
    pub(super) async fn close_live(
        &self,
        id: &SessionId,
        live: Option<Arc<Live>>,
        status: SessionStatus,
        detail: &str,
    ) {
        if let Some(live) = &live {
            live.end(detail);
        }
        self.record_end(id, status, detail).await;
        let Some(live) = live else { return };
        if live.core.owner.is_none() {
            return;
        }
        for call in self.calls.running(Some(id)).await.unwrap_or_default() {
            if lock(&self.legs).contains_key(&call.id) {
                continue;
            }
            let message = format!("the session ended before the call completed: {detail}");
            self.end_call(&call.id, Finish::failed(message)).await;
        }
    }

    /// Records a session's end, trying again while the store cannot keep it: an open session left behind
    /// would hold its owner's place.
    async fn record_end(&self, id: &SessionId, status: SessionStatus, detail: &str) {
        let mut pause = RECORD_RETRY;
        while let Err(error) = self.sessions.end(id, status, detail).await {
            tracing::error!(session = %id, %error, "the session's end could not be recorded; trying again");
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                () = self.shutdown.cancelled() => return,
            }
            pause = (pause * 2).min(MAX_BACKOFF);
        }
    }
}
