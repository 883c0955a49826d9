//! Following the task an upstream made of a call (the MCP Tasks extension of 2026-07-28): `tasks/get` at the
//! server's poll interval until the task ends. Its input requests become a round of Requests of the call, and
//! the call waits on them with nothing in flight, as on an `input_required` result; the answers go back by
//! `tasks/update`, and the gateway follows the task on. A restart, or another replica, follows it on alike: the
//! store keeps the task's id with the call.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{
    CancelTaskParams, ClientRequest, CustomRequest, DetailedTask, ErrorCode, GetTaskParams, InputResponses, Task,
    TaskPayload, TaskStatus, UpdateTaskParams,
};
use rmcp::service::ServiceError;
use serde_json::{Map, Value, json};

use super::call::{self, Booked, MAX_ROUNDS, book_round, completed_json};
use super::{CallRef, Live, Upstreams};
use crate::ids::CallId;
use crate::records::{CallError, CallFailure, CallStatus, CallTask, CallView, Finish};
use crate::time::Timestamp;

/// How often a task is polled when its server suggests nothing, and the bounds on what it may suggest.
const POLL_DEFAULT: Duration = Duration::from_secs(1);
const POLL_LEAST: Duration = Duration::from_millis(100);
const POLL_MOST: Duration = Duration::from_secs(30);
/// The longest task id followed, and the most of a status message kept (in bytes): what a server sends is
/// stored with the call and sent in each of its events.
const MAX_ID: usize = 1024;
const MAX_MESSAGE: usize = 4096;
/// How long cancelling a task may hold up the end of its call.
const CANCEL_WAIT: Duration = Duration::from_secs(5);

/// A call's task as the gateway follows it.
pub(super) struct FollowedTask {
    pub id: String,
    /// The round of Requests the call is at: a new one is numbered after it.
    pub round: u32,
    /// The input requests answered already, which a server that updates its task late may still list.
    pub answered: HashSet<String>,
    /// When the server may forget the task.
    pub expires_at: Option<Timestamp>,
    /// What the call shows of the task, as last recorded.
    noted: Option<CallTask>,
}

impl FollowedTask {
    /// A task the server has just made of a call, from its `CreateTaskResult`; the end of the call if its id
    /// is too long to follow.
    pub fn created(task: &Task, round: u32, now: Timestamp) -> Result<Self, Finish> {
        if task.task_id.len() > MAX_ID {
            return Err(Finish::failed(format!(
                "the upstream made a task of the call whose id is longer than {MAX_ID} bytes"
            )));
        }
        Ok(Self {
            id: task.task_id.clone(),
            round,
            answered: HashSet::new(),
            expires_at: task.ttl_ms.map(|ttl| now.after(Duration::from_millis(ttl))),
            noted: None,
        })
    }

    /// A task followed on after a round of its input requests was answered, or after a restart.
    pub fn resumed(id: String, round: u32, noted: Option<CallTask>) -> Self {
        Self {
            id,
            round,
            answered: HashSet::new(),
            expires_at: noted.as_ref().and_then(|task| task.expires_at),
            noted,
        }
    }

    /// Whether the task has passed its time to live.
    fn expired(&self, live: &Live) -> bool {
        self.expires_at.is_some_and(|at| live.core.registry.clock().now() >= at)
    }

    /// Sends the task answers to its input requests (`tasks/update`).
    async fn answer(&mut self, live: &Live, answers: InputResponses) -> Result<(), Finish> {
        let keys: Vec<String> = answers.keys().cloned().collect();
        live.peer
            .update_task(UpdateTaskParams::new(self.id.clone(), answers))
            .await
            .map_err(|error| failed(&self.id, "tasks/update", &error))?;
        self.answered.extend(keys);
        Ok(())
    }

    /// The end of a call whose task passed its time to live.
    fn lost_to_time(&self) -> Finish {
        lost(format!(
            "the upstream's task {} passed its time to live before it ended",
            self.id
        ))
    }
}

/// What one look at a task found.
enum Seen {
    /// It is still working (or waits on input the call has asked for already).
    Working(Duration),
    Ended(Finish),
    /// Its new input requests are raised as Requests: the call waits on them.
    Waiting,
}

impl Upstreams {
    /// Follows a call's task until it ends (`Some`) or waits on a round of Requests (`None`). With `answers`,
    /// first sends them to it (`tasks/update`); with `first_look` after that poll interval, else at once.
    pub(super) async fn follow_task(
        &self,
        call: &CallRef,
        mut live: Arc<Live>,
        mut task: FollowedTask,
        answers: InputResponses,
        first_look: Option<Duration>,
    ) -> Option<Finish> {
        if task.expired(&live) {
            return Some(task.lost_to_time());
        }
        if !answers.is_empty()
            && let Err(finish) = task.answer(&live, answers).await
        {
            return Some(finish);
        }
        let mut wait = first_look.unwrap_or_default();
        let mut related = live.core.relate_task(&task.id, call);
        loop {
            if task.expired(&live) {
                return Some(task.lost_to_time());
            }
            let looked_at = tokio::time::Instant::now();
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                // Woken early, though not more often than the least interval.
                () = related.changed() => tokio::time::sleep_until(looked_at + POLL_LEAST).await,
                () = live.closed.cancelled() => {}
            }
            // Ended meanwhile (cancelled on another replica, say): nothing more to follow.
            if self.calls.has_ended(&call.id).await {
                return None;
            }
            let looked = tokio::select! {
                looked = live.peer.get_task(GetTaskParams::new(task.id.clone())) => looked,
                () = live.closed.cancelled() => Err(ServiceError::TransportClosed),
            };
            let detailed = match looked {
                Ok(looked) => looked.task,
                Err(ServiceError::TransportClosed) => match self.session_after(call, &live).await {
                    Ok(next) => {
                        live = next;
                        related = live.core.relate_task(&task.id, call);
                        wait = Duration::ZERO;
                        continue;
                    }
                    Err(finish) => return Some(finish),
                },
                Err(error) => return Some(failed(&task.id, "tasks/get", &error)),
            };
            self.note_task(&call.id, &mut task, &detailed.task).await;
            match self.seen(call, &live, &mut task, detailed).await {
                Seen::Working(poll) => wait = poll,
                Seen::Ended(finish) => return Some(finish),
                Seen::Waiting => return None,
            }
        }
    }

    /// Acts on what `tasks/get` said of a call's task.
    async fn seen(&self, call: &CallRef, live: &Live, task: &mut FollowedTask, detailed: DetailedTask) -> Seen {
        let poll = poll_interval(&detailed.task);
        let requests = match detailed.payload {
            TaskPayload::Completed { result } => return Seen::Ended(completed_json(Value::Object(result))),
            // A server may fail a task that outlived its time to live, or forget it; it may fail it a little before
            // the gateway's clock, which started the time to live once it heard of the task, says so.
            TaskPayload::Failed { .. } if task.expired(live) || outlived(&detailed.task) => {
                return Seen::Ended(task.lost_to_time());
            }
            TaskPayload::Failed { error } => {
                let code = error.get("code").and_then(Value::as_i64).unwrap_or_default();
                let message = error.get("message").and_then(Value::as_str).unwrap_or_default();
                return Seen::Ended(Finish::failed(format!(
                    "the upstream's task {} failed: error {code}: {message}",
                    task.id
                )));
            }
            TaskPayload::Cancelled => {
                return Seen::Ended(Finish::Cancelled(format!(
                    "the upstream cancelled its task {}",
                    task.id
                )));
            }
            TaskPayload::InputRequired { input_requests } => input_requests,
            _ => return Seen::Working(poll),
        };
        let requests: Map<String, Value> = match serde_json::to_value(requests) {
            Ok(Value::Object(requests)) => requests
                .into_iter()
                .filter(|(key, _)| !task.answered.contains(key))
                .collect(),
            _ => Map::new(),
        };
        if requests.is_empty() {
            return Seen::Working(poll);
        }
        if task.round >= MAX_ROUNDS {
            return Seen::Ended(Finish::failed(format!(
                "the upstream asked for input more than {MAX_ROUNDS} times"
            )));
        }
        task.round += 1;
        match book_round(&live.core, call, task.round, None, requests, task.expires_at).await {
            Booked::Waiting => Seen::Waiting,
            Booked::Ended(Some(finish)) => Seen::Ended(finish),
            // The call has ended: nothing more is asked of its task.
            Booked::Ended(None) => Seen::Waiting,
            Booked::Answered(answers) => match task.answer(live, answers).await {
                Ok(()) => Seen::Working(poll),
                Err(finish) => Seen::Ended(finish),
            },
        }
    }

    /// Records what the call shows of its task, when that changed.
    pub(super) async fn note_task(&self, call: &CallId, task: &mut FollowedTask, seen: &Task) {
        let note = CallTask {
            id: task.id.clone(),
            status: status_name(seen.status).to_owned(),
            status_message: seen.status_message.as_deref().map(|message| {
                let mut end = message.len().min(MAX_MESSAGE);
                while !message.is_char_boundary(end) {
                    end -= 1;
                }
                message[..end].to_owned()
            }),
            expires_at: task.expires_at,
        };
        if task.noted.as_ref() == Some(&note) {
            return;
        }
        match self.calls.note_task(call, &note).await {
            Ok(_) => task.noted = Some(note),
            Err(error) => tracing::warn!(%call, %error, "the call's task could not be noted"),
        }
    }

    /// Follows an experimental task of 2025-11-25 (SEP-1686) to its end: `tasks/result`, sent as a request of
    /// the call, waits for the task's result, while the elicitations the task sends (each naming it) become
    /// Requests of the call as any 2025-11-25 elicitation does; `tasks/get` at the server's poll interval keeps
    /// what the call shows of the task current. The server holds such a task in its session: it is not
    /// followed on after the session ends.
    pub(super) async fn follow_legacy_task(&self, call: &CallRef, live: &Live, created: &Task) -> Option<Finish> {
        let now = live.core.registry.clock().now();
        let mut task = match FollowedTask::created(created, 0, now) {
            Ok(task) => task,
            Err(finish) => return Some(finish),
        };
        let related = live.core.relate_task(&task.id, call);
        self.note_task(&call.id, &mut task, created).await;
        let of_task = json!({"taskId": task.id});
        let request = Box::new(ClientRequest::CustomRequest(CustomRequest::new(
            "tasks/result",
            Some(of_task.clone()),
        )));
        let mut result = std::pin::pin!(call::send(&live.core, &live.peer, call, request));
        let mut poll = poll_interval(created);
        let mut last = created.clone();
        loop {
            tokio::select! {
                got = &mut result => {
                    let (status, finish) = match got {
                        Ok(response) => (
                            TaskStatus::Completed,
                            completed_json(serde_json::to_value(response).unwrap_or_default()),
                        ),
                        Err(error) => (TaskStatus::Failed, failed(&task.id, "tasks/result", &error)),
                    };
                    last.status = status;
                    self.note_task(&call.id, &mut task, &last).await;
                    return Some(finish);
                }
                () = live.closed.cancelled() => {
                    return Some(Finish::failed(format!(
                        "the session ended before the call's task did: {}",
                        live.ended()
                    )));
                }
                () = tokio::time::sleep(poll) => {}
                () = related.changed() => {}
            }
            let looking = ClientRequest::CustomRequest(CustomRequest::new("tasks/get", Some(of_task.clone())));
            // Its result, or the session's end, is not kept waiting on a look that is not answered.
            let looked = tokio::select! {
                looked = live.peer.send_request(looking) => looked.ok(),
                () = live.closed.cancelled() => None,
                () = tokio::time::sleep(POLL_MOST) => None,
            };
            if let Some(looked) = looked
                && let Some(seen) = call::legacy_task(&serde_json::to_value(looked).unwrap_or_default())
            {
                poll = poll_interval(&seen);
                self.note_task(&call.id, &mut task, &seen).await;
                last = seen;
            }
        }
    }

    /// The session a call's task is followed on once the one it was followed on has ended: the server's
    /// shared session open now, for a call on a shared one.
    async fn session_after(&self, call: &CallRef, ended: &Live) -> Result<Arc<Live>, Finish> {
        let gone = || {
            Finish::failed(format!(
                "the session ended before the call's task did: {}",
                ended.ended()
            ))
        };
        if ended.core.owner.is_some() {
            return Err(gone());
        }
        // The transport may say it closed before the session is seen to end: wait for that, briefly.
        let _ = tokio::time::timeout(CANCEL_WAIT, ended.closed.cancelled()).await;
        let view = match self.calls.get(&call.id).await {
            Ok(Some(view)) => view,
            _ => {
                return Err(Finish::failed(
                    "the call's session ended, and the call could not be read",
                ));
            }
        };
        let next = self
            .session_for(&view.server, &view.session, true)
            .await
            .map_err(|error| Finish::failed(format!("the call's task could not be followed on: {error}")))?;
        if next.core.id == ended.core.id {
            return Err(gone());
        }
        Ok(next)
    }

    /// Tells the server of a call that has ended other than completed to cancel the task it made of the call,
    /// if any, waiting at most [`CANCEL_WAIT`]; a failure is logged only, for the call has ended.
    pub(super) async fn cancel_task_of(&self, call: &CallView) {
        let Some(task) = call.task.as_ref().filter(|_| call.status != CallStatus::Completed) else {
            return;
        };
        let cancel = async {
            // The call's session while it is open, else its server's shared one: a task outlives a session.
            let live = self
                .session_for(&call.server, &call.session, true)
                .await
                .map_err(|error| error.to_string())?;
            live.peer
                .cancel_task(CancelTaskParams::new(task.id.clone()))
                .await
                .map_err(|error| error.to_string())
        };
        let outcome = match tokio::time::timeout(CANCEL_WAIT, cancel).await {
            Ok(outcome) => outcome,
            Err(_) => Err(format!("no answer within {}s", CANCEL_WAIT.as_secs())),
        };
        if let Err(error) = outcome {
            tracing::info!(call = %call.id, task = %task.id, %error, "the call's task could not be cancelled");
        }
    }
}

/// How long to wait before asking about a task again: what its server suggests, within bounds.
pub(super) fn poll_interval(task: &Task) -> Duration {
    task.poll_interval_ms
        .map_or(POLL_DEFAULT, Duration::from_millis)
        .clamp(POLL_LEAST, POLL_MOST)
}

/// Whether `task` was last updated once its time to live had passed, as its server's own timestamps say.
fn outlived(task: &Task) -> bool {
    let (Some(created), Some(updated), Some(ttl)) = (
        Timestamp::parse(&task.created_at),
        Timestamp::parse(&task.last_updated_at),
        task.ttl_ms,
    ) else {
        return false;
    };
    updated >= created.after(Duration::from_millis(ttl))
}

/// The end of a call whose task its server no longer knows.
fn lost(message: String) -> Finish {
    Finish::Failed(CallError {
        message,
        reason: Some(CallFailure::TaskLost),
    })
}

/// The end of a call whose task could not be asked about or answered.
fn failed(task: &str, method: &str, error: &ServiceError) -> Finish {
    match error {
        ServiceError::McpError(error) if error.code == ErrorCode::INVALID_PARAMS => lost(format!(
            "the upstream no longer knows the call's task {task} ({method}: {})",
            error.message
        )),
        ServiceError::McpError(error) => Finish::failed(format!(
            "the upstream returned error {} to {method} for the call's task {task}: {}",
            error.code.0, error.message
        )),
        ServiceError::UnexpectedResponse => Finish::failed(format!(
            "the upstream answered {method} for the call's task {task} with something that does not read as a \
             task: an input request of a kind MCP does not define, or an experimental task of 2025-11-25, which is \
             followed only on the session it began on"
        )),
        other => Finish::failed(format!(
            "{method} for the call's task {task} failed: {}",
            super::call::without_type_names(other)
        )),
    }
}

fn status_name(status: TaskStatus) -> &'static str {
    match status {
        TaskStatus::Working => "working",
        TaskStatus::InputRequired => "input_required",
        TaskStatus::Completed => "completed",
        TaskStatus::Failed => "failed",
        TaskStatus::Cancelled => "cancelled",
        _ => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A task its server failed once its time to live had passed, by the server's own timestamps, is lost to time.
    #[test]
    fn a_task_updated_past_its_time_to_live_outlived_it() {
        let task = |updated: &str, ttl_ms: Option<u64>| {
            let mut task = Task::new("t", TaskStatus::Failed, "2026-12-07T01:59:28.190Z", updated);
            task.ttl_ms = ttl_ms;
            task
        };
        assert!(outlived(&task("2026-12-07T01:59:29.190Z", Some(1000))));
        assert!(outlived(&task("2026-12-07T01:59:29.203Z", Some(1000))));
        assert!(!outlived(&task("2026-12-07T01:59:29.189Z", Some(1000))));
        assert!(!outlived(&task("2026-12-07T01:59:29.203Z", None)), "no time to live");
        assert!(!outlived(&task("not a time", Some(1000))));
    }
}
