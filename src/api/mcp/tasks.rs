//! The MCP Tasks extension: a front-door call is a task whose id is the call's, for clients that declare it.

use std::collections::HashSet;
use std::time::Duration;

use rmcp::RoleServer;
use rmcp::model::{DetailedTask, ErrorCode, ErrorData, GetTaskResult, Task, TaskPayload, TaskStatus};
use rmcp::service::RequestContext;
use serde_json::{Value, json};

use super::relay::input_requests;
use super::{FrontDoor, principal};
use crate::api::to_completion;
use crate::auth::Principal;
use crate::records::{CallStatus, CallView};

/// How often a client of the tasks extension is asked to poll a task.
const TASK_POLL: Duration = Duration::from_secs(1);

impl FrontDoor {
    /// The task `id` as `tasks/get` shows it.
    pub(super) async fn task_of(
        &self,
        id: &str,
        context: &RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        let principal = principal(context)?;
        let view = self.own_call(id, &principal, Principal::may_see).await?;
        let payload = match view.status {
            CallStatus::Running => TaskPayload::Working,
            CallStatus::InputRequired => {
                let relayed = match self.relay_to(context) {
                    Some(relay) => self.relayable(&view, &principal, &relay, &HashSet::new()).await,
                    None => Vec::new(),
                };
                if relayed.is_empty() {
                    TaskPayload::Working
                } else {
                    TaskPayload::InputRequired {
                        input_requests: input_requests(relayed),
                    }
                }
            }
            CallStatus::Completed => TaskPayload::Completed {
                result: view
                    .result
                    .as_deref()
                    .and_then(Value::as_object)
                    .cloned()
                    .unwrap_or_default(),
            },
            CallStatus::Failed => {
                let message = view
                    .error
                    .as_ref()
                    .map_or("the call failed", |error| error.message.as_str());
                let error = json!({"code": ErrorCode::INTERNAL_ERROR.0, "message": message});
                TaskPayload::Failed {
                    error: error.as_object().cloned().unwrap_or_default(),
                }
            }
            CallStatus::Cancelled => TaskPayload::Cancelled,
        };
        let mut task = task(&view);
        if matches!(payload, TaskPayload::Working) && view.status == CallStatus::InputRequired {
            task.status_message = Some(self.waiting_text(&view, context).await);
        } else if let Some(upstream) = view.task.as_ref().filter(|_| view.status == CallStatus::Running) {
            // What the upstream's own task says of its progress.
            task.status_message.clone_from(&upstream.status_message);
        }
        Ok(GetTaskResult::new(DetailedTask::new(task, payload)))
    }

    /// `tasks/cancel`: cancels the call.
    pub(super) async fn cancel_as_task(
        &self,
        id: String,
        context: &RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let principal = principal(context)?;
        let view = self.own_call(&id, &principal, Principal::may_change).await?;
        let upstreams = self.state.upstreams.clone();
        to_completion(async move {
            Ok(upstreams
                .cancel_call(&view.id, "cancelled by its MCP client (tasks/cancel)")
                .await?)
        })
        .await
        .map_err(|error| ErrorData::internal_error(error.detail().to_owned(), None))?;
        Ok(())
    }
}

/// A call as the task it is to a client of the tasks extension (its id is the task's).
pub(super) fn task(view: &CallView) -> Task {
    let status = match view.status {
        CallStatus::Running => TaskStatus::Working,
        CallStatus::InputRequired => TaskStatus::InputRequired,
        CallStatus::Completed => TaskStatus::Completed,
        CallStatus::Failed => TaskStatus::Failed,
        CallStatus::Cancelled => TaskStatus::Cancelled,
    };
    Task::new(
        view.id.clone(),
        status,
        view.created_at.rfc3339(),
        view.updated_at.rfc3339(),
    )
    .with_poll_interval_ms(TASK_POLL.as_millis() as u64)
}
