//! The legs of a call: each `tools/call` sent upstream runs on a task of its own until the call ends or
//! waits on a round of Requests; the answer that completes a round starts the next leg, on the call's
//! session or on its server's current shared one.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, InputResponses};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::call::{self, Driven};
use super::client::Waits;
use super::task::{self, FollowedTask};
use super::{CallRef, Leg, Live, Target, UpstreamError, Upstreams, lock};
use crate::feed::{Concern, Since};
use crate::ids::{CallId, SessionId};
use crate::records::{EventKind, Finish};
use crate::registry::Resume;

/// The first pause before recording a call's end again; it doubles up to `RETRY_MOST`.
const RETRY_FIRST: Duration = Duration::from_millis(250);
const RETRY_MOST: Duration = Duration::from_secs(30);

/// What a leg of a call does.
pub(super) enum Work {
    /// Sends the call's `tools/call` with these params: boxed, as is what runs after the upstream answers, so
    /// that the task of a call waiting on its upstream (a 2025-11-25 elicitation in flight) holds only what that
    /// wait takes.
    Send(Box<CallToolRequestParams>),
    /// Follows the call's task, first sending it the answers of its latest round.
    Follow { task: String, answers: InputResponses },
}

/// Why a call's next `tools/call` has no session to go to.
#[derive(Debug, thiserror::Error)]
pub(super) enum LegError {
    /// The call's private session has ended.
    #[error("the session ended before the call completed")]
    SessionEnded,
    #[error(transparent)]
    UnknownServer(UpstreamError),
    /// The server's shared session was not ready within its `startup_timeout`.
    #[error("the call could not be retried: {0}")]
    NotReady(UpstreamError),
    #[error("the gateway is shutting down")]
    ShuttingDown,
}

impl Upstreams {
    /// Sends one `tools/call` of a call on a task of its own, and acts on how it ends: the call ends, or
    /// waits on a round of Requests (then the answer that completes the round resumes it). `seen` are the
    /// events since just before the change that let the call run (its start, its approval, or the answer that
    /// completed its round), where they were followed.
    pub(super) async fn spawn_leg(
        self: Arc<Self>,
        call: CallRef,
        tool: String,
        live: Arc<Live>,
        work: Work,
        round: u32,
        seen: Option<Since>,
    ) -> CancellationToken {
        let leg = CancellationToken::new();
        let id = self.next_leg.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let entry = Leg { id, token: leg.clone() };
        lock(&self.legs).insert(call.id.clone(), entry);
        // Registered before this check, so that a cancellation either sees the leg or has ended the call. An end
        // committed before the change that let the call run makes that change fail (a call cannot end before it
        // starts; a claim and an answer need it running). One committed after it is published after `seen`
        // began: if `stop_legs_of_ended_calls` took its event before the leg was registered, `seen` holds it now;
        // if later, that finds the leg. Without `seen`, or where it cannot tell, the check reads what is
        // committed, not waiting for the call's start to be kept, and an end committed after that read looks for
        // the leg once it is kept, after the leg was registered.
        let told = seen.and_then(|seen| seen.told_ended(call.id.as_str()));
        let ended = match told {
            Some(ended) => ended,
            None => self.calls.has_ended(&call.id).await,
        };
        if ended {
            self.forget_leg(&call.id, id);
            leg.cancel();
            return leg;
        }
        let span = tracing::info_span!(parent: None, "call", call = %call.id, server = %live.core.server,
            session = %live.core.id, tool = %tool);
        let this = self.clone();
        let token = leg.clone();
        let run = async move {
            let ended = this.drive(&call, &live, work, round, &token).await;
            this.forget_leg(&call.id, id);
            Box::pin(live.core.settle_withdrawn(&call.id)).await;
            let Some(finish) = ended else { return };
            match &finish {
                Finish::Completed(_) => tracing::info!("call completed"),
                Finish::Failed(error) => tracing::info!(message = %error.message, "call ended"),
                Finish::Cancelled(message) => tracing::info!(message, "call ended"),
            }
            Box::pin(this.end_call(&call.id, finish)).await;
        };
        self.tracker.spawn(self.call_tasks.track_future(run.instrument(span)));
        leg
    }

    /// Stops this replica's leg of each call that ends elsewhere (cancelled through another replica, or ended
    /// by one that took this one for gone) as [`Upstreams::cancel_call`] stops one here: the `tools/call` in
    /// flight is dropped, which tells the upstream `notifications/cancelled`. Runs until shutdown.
    pub(super) async fn stop_legs_of_ended_calls(self: Arc<Self>) {
        let mut events = self.feed.subscribe();
        loop {
            let received = tokio::select! {
                received = events.recv() => received,
                () = self.shutdown.cancelled() => return,
            };
            let ended = match received {
                Ok(live) => {
                    let event = &live.event;
                    let Some(call) = event.call.as_deref().filter(|_| event.kind == EventKind::CallUpdated) else {
                        continue;
                    };
                    let Some(call) = lock(&self.legs).get_key_value(call).map(|(call, _)| call.clone()) else {
                        continue;
                    };
                    match event.call_status() {
                        Some(status) if !status.is_final() => continue,
                        Some(_) => vec![call],
                        // An event taken off the live channel without its data: the store says.
                        None => self.ended_of([call]).await,
                    }
                }
                // Events were missed: the store says which of the calls with a leg here have ended.
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    let calls: Vec<CallId> = lock(&self.legs).keys().cloned().collect();
                    self.ended_of(calls).await
                }
                Err(broadcast::error::RecvError::Closed) => return,
            };
            let legs = lock(&self.legs);
            for call in ended {
                if let Some(leg) = legs.get(&call).filter(|leg| !leg.token.is_cancelled()) {
                    tracing::info!(call = %call, "the call has ended; its leg stops");
                    leg.token.cancel();
                }
            }
        }
    }

    /// Those of `calls` that the store says have ended.
    async fn ended_of(&self, calls: impl IntoIterator<Item = CallId>) -> Vec<CallId> {
        let mut ended = Vec::new();
        for call in calls {
            if self.calls.has_ended(&call).await {
                ended.push(call);
            }
        }
        ended
    }

    /// Forgets a call's leg, unless another leg of the call has taken its place.
    fn forget_leg(&self, call: &CallId, id: u64) {
        let mut legs = lock(&self.legs);
        if legs.get(call).is_some_and(|leg| leg.id == id) {
            legs.remove(call);
        }
    }

    /// Records how a call ended, trying again while the store cannot keep it (a full disk): a call left
    /// running would hold its owner's place and, after a restart, be sent again. A call that did not complete
    /// has its upstream task, if it made one, cancelled.
    pub(super) async fn end_call(&self, call: &CallId, finish: Finish) {
        lock(&self.worked).remove(call);
        let mut pause = RETRY_FIRST;
        loop {
            match self.calls.finish(call, finish.clone()).await {
                Ok(ended) => {
                    if let Some(view) = ended {
                        self.cancel_task_of(&view).await;
                    }
                    return;
                }
                Err(error) => tracing::error!(%call, %error, "the call's end could not be recorded; trying again"),
            }
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                () = self.shutdown.cancelled() => return,
            }
            pause = (pause * 2).min(RETRY_MOST);
        }
    }

    /// Drives one leg; `None` when the call goes on without it (it waits on a round, it was cancelled, or
    /// the gateway is shutting down and will send it again at the next start).
    async fn drive(
        &self,
        call: &CallRef,
        live: &Arc<Live>,
        work: Work,
        round: u32,
        leg: &CancellationToken,
    ) -> Option<Finish> {
        let started = tokio::time::Instant::now();
        let budget = self.budget(&call.id, live);
        let ended = tokio::select! {
            biased;
            () = leg.cancelled() => {
                tracing::info!("call cancelled");
                return None;
            }
            ended = self.work(call, live, work, round) => ended,
            limit = budget => Some(Finish::failed(format!(
                "the upstream worked on the call for longer than {}s (limits.call_timeout); it was cancelled",
                limit.as_secs_f64()
            ))),
        };
        // Counted across legs (rounds, a task's turns), and only against a limit.
        if self.limits.call_timeout.is_none() {
            return ended;
        }
        *lock(&self.worked).entry(call.id.clone()).or_default() += started.elapsed();
        ended
    }

    /// Does a leg's work: `None` when the call waits on a round of Requests, or has ended already.
    async fn work(&self, call: &CallRef, live: &Arc<Live>, work: Work, round: u32) -> Option<Finish> {
        let (task, answers, first_look) = match work {
            Work::Send(params) => match call::drive(live, call, params, round, Self::legacy_tasks(live)).await {
                Driven::Ended(finish) => return Some(finish),
                Driven::Waiting => return None,
                Driven::LegacyTask(created) => return Box::pin(self.follow_legacy_task(call, live, &created)).await,
                Driven::Task(created, round) => {
                    let now = live.core.registry.clock().now();
                    let mut task = match FollowedTask::created(&created, round, now) {
                        Ok(task) => task,
                        Err(finish) => return Some(finish),
                    };
                    self.note_task(&call.id, &mut task, &created).await;
                    (task, InputResponses::new(), Some(task::poll_interval(&created)))
                }
            },
            Work::Follow { task, answers } => {
                let noted = match self.calls.get(&call.id).await {
                    Ok(view) => view.and_then(|view| view.task).map(|task| *task),
                    Err(error) => {
                        tracing::warn!(%error, "the call's task as last seen could not be read");
                        None
                    }
                };
                (FollowedTask::resumed(task, round, noted), answers, None)
            }
        };
        Box::pin(self.follow_task(call, live.clone(), task, answers, first_look)).await
    }

    /// Whether a call on `live` may be made an experimental task of 2025-11-25 when its tool requires one.
    fn legacy_tasks(live: &Live) -> bool {
        !live.keeps_rounds() && live.core.offers.tasks
    }

    /// Resolves, with the limit, once a call has used up `limits.call_timeout` of upstream work; never
    /// without a limit. Time the call spends waiting on a Request does not count.
    ///
    /// Boxed, and without a limit empty (a box of nothing allocates nothing), so that a call's task does not
    /// keep room for a budget it does not have.
    fn budget(&self, call: &CallId, live: &Live) -> Pin<Box<dyn Future<Output = Duration> + Send>> {
        let Some(limit) = self.limits.call_timeout else {
            return Box::pin(std::future::pending());
        };
        let used = lock(&self.worked).get(call).copied().unwrap_or_default();
        Box::pin(work_budget(limit, used, Waits::of(&live.core, call)))
    }

    /// Retries a call whose round was answered, on its session or, if that was the server's shared one,
    /// on the shared session open now.
    pub(super) fn resume(self: Arc<Self>, Resume { retry, seen }: Resume) {
        let this = self.clone();
        self.tracker.spawn(async move {
            let call = retry.call.clone();
            let live = match this.session_for(&retry.server, &retry.session, retry.shared).await {
                Ok(live) => live,
                Err(error) => return this.end_call(&call, Finish::failed(error.to_string())).await,
            };
            let answers = match call::input_responses(&retry.asked, retry.input_responses, &live.core.offers) {
                Ok(answers) => answers,
                Err(finish) => return this.end_call(&call, finish).await,
            };
            let work = match retry.task {
                Some(task) => Work::Follow { task, answers },
                None => {
                    let mut params = call::call_params(retry.tool.clone(), &retry.arguments);
                    params.input_responses = Some(answers);
                    params.request_state = retry.request_state;
                    Work::Send(Box::new(params))
                }
            };
            let call = CallRef {
                id: call,
                owner: retry.owner,
            };
            let _ = this.spawn_leg(call, retry.tool, live, work, retry.round, seen).await;
        });
    }

    /// The session a call's next `tools/call` goes to: the call's own while it is open; else the server's
    /// shared session (once it is ready, within the server's `startup_timeout`) if the call was on a shared one.
    pub(super) async fn session_for(
        &self,
        server: &str,
        session: &SessionId,
        shared: bool,
    ) -> Result<Arc<Live>, LegError> {
        if let Some(live) = lock(&self.live).get(session).cloned() {
            return Ok(live);
        }
        if !shared {
            return Err(LegError::SessionEnded);
        }
        let slot = self.slot(server).map_err(LegError::UnknownServer)?;
        let target = Target::Server(server.to_owned());
        let target = &target;
        let ready = || async move { self.live(target).await.ok() };
        let wait = slot.server.startup_timeout;
        if let Some(live) = self.feed.wait_for(wait, &self.shutdown, Concern::Any, ready).await {
            return Ok(live);
        }
        match self.live(target).await {
            Err(error) => Err(LegError::NotReady(error)),
            Ok(_) => Err(LegError::ShuttingDown),
        }
    }
}

/// Resolves, with the limit, once a call has worked for `limit` (having used `used` already), not counting the
/// time it waits on a person through one of its session's elicitations.
pub(super) async fn work_budget(limit: Duration, mut used: Duration, mut waits: Waits) -> Duration {
    loop {
        waits.until(false).await;
        let started = tokio::time::Instant::now();
        tokio::select! {
            () = waits.until(true) => used += started.elapsed(),
            () = tokio::time::sleep(limit.saturating_sub(used)) => return limit,
        }
    }
}
