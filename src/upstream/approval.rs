//! Calls an approval policy covers: the approval Request raised before anything goes upstream, and what its
//! outcome does — the recorded call forwarded once, or the call failed without the upstream hearing of it.

use std::sync::Arc;

use rmcp::model::CallToolRequestParams;
use serde_json::Value;

use super::{CallRef, Live, Upstreams};
use crate::approvals::{self, ApprovalPolicy, KIND_APPROVAL};
use crate::records::{CallError, CallFailure, CallView, Finish, RequestView, Status};
use crate::registry::{Origin, Waiting};
use crate::suspension::{Reason, Request};

/// What an approval's outcome does to its call.
#[derive(Debug, PartialEq)]
enum Verdict {
    /// Send exactly these arguments upstream.
    Forward(Option<serde_json::Map<String, Value>>),
    /// End the call without sending it.
    Fail(CallError),
}

impl Upstreams {
    /// Raises the approval a call needs and waits for it on a task of its own; the call is `input_required`
    /// meanwhile. When the approval cannot be raised, the call fails saying why.
    pub(super) async fn hold_for_approval(self: &Arc<Self>, policy: &ApprovalPolicy, view: &CallView, live: Arc<Live>) {
        let data = approvals::request_data(
            &view.server,
            &view.tool,
            &view.arguments,
            &view.owner,
            &policy.approvers,
        );
        let request = Request {
            id: String::new(),
            kind: KIND_APPROVAL.to_owned(),
            prompt: policy.prompt_for(&view.server, &view.tool, &view.owner),
            url: None,
            data: Some(Arc::new(data)),
            expires_at: None,
        };
        let origin = Origin {
            server: view.server.clone(),
            session: view.session.clone(),
            call: Some(view.id.clone()),
            owner: Some(view.owner.clone()),
        };
        let call = CallRef {
            id: view.id.clone(),
            owner: view.owner.clone(),
        };
        match self.registry.ask_approval(request, policy.ttl, &origin).await {
            Ok(waiting) => {
                tracing::info!(call = %view.id, request = %waiting.id, tool = %view.tool, "call waits for approval");
                let this = self.clone();
                let tool = view.tool.clone();
                self.tracker
                    .spawn(async move { this.await_approval(waiting, call, tool, live).await });
            }
            Err(error) => {
                let message = format!("the approval the call needs could not be raised: {error}");
                self.end_call(&call.id, Finish::failed(message)).await;
            }
        }
    }

    /// Waits for an approval's outcome, then forwards the call as recorded or ends it.
    async fn await_approval(self: Arc<Self>, mut waiting: Waiting, call: CallRef, tool: String, live: Arc<Live>) {
        tokio::select! {
            biased;
            _ = waiting.outcome() => {}
            // Still pending: a durable store keeps the approval, and the next start fails the call and cancels it.
            () = self.shutdown.cancelled() => return,
        }
        let verdict = match self.registry.get(&waiting.id).await {
            Ok(Some(view)) => verdict(&view),
            Ok(None) => Verdict::Fail(CallError::new(format!("approval {} is gone", waiting.id))),
            Err(error) => Verdict::Fail(CallError::new(format!(
                "approval {} could not be read: {error}",
                waiting.id
            ))),
        };
        match verdict {
            Verdict::Forward(arguments) => {
                tracing::info!(call = %call.id, request = %waiting.id, "call approved; forwarding it");
                let mut params = CallToolRequestParams::new(tool.clone());
                params.arguments = arguments;
                let _ = self.spawn_leg(call, tool, live, params, 0).await;
            }
            Verdict::Fail(error) => {
                tracing::info!(call = %call.id, request = %waiting.id, message = %error.message, "call not approved");
                self.end_call(&call.id, Finish::Failed(error)).await;
            }
        }
    }
}

/// What a resolved approval does to its call: an answer `ok: true` forwards the arguments it approved (those
/// whose digest it carries), anything else fails the call saying who or what decided.
fn verdict(view: &RequestView) -> Verdict {
    let id = &view.request.id;
    let by = view.answered_by.as_deref().unwrap_or("nobody");
    match (view.status, &view.answer) {
        (Status::Answered, Some(answer)) if answer.ok => approved_arguments(view).map_or_else(
            || {
                Verdict::Fail(CallError::new(format!(
                    "approval {id} does not match the call it approved"
                )))
            },
            Verdict::Forward,
        ),
        (Status::Answered, Some(answer)) => {
            let said = match answer.reason {
                Some(Reason::Cancelled) => "cancelled",
                _ => "declined",
            };
            Verdict::Fail(CallError {
                message: format!("approval {id} was {said} by {by}; the call was not forwarded"),
                reason: Some(CallFailure::Declined),
            })
        }
        (Status::Expired, _) => Verdict::Fail(CallError {
            message: format!("approval {id} expired unanswered; the call was not forwarded"),
            reason: Some(CallFailure::Expired),
        }),
        _ => Verdict::Fail(CallError::new(format!(
            "approval {id} was cancelled ({}); the call was not forwarded",
            view.detail.as_deref().unwrap_or("no reason given")
        ))),
    }
}

/// The arguments an approval carries, when their digest is the one it was raised with.
fn approved_arguments(view: &RequestView) -> Option<Option<serde_json::Map<String, Value>>> {
    let data = view.request.data.as_ref()?;
    let arguments = data.get("call")?.get("arguments")?;
    if data.get("digest")?.as_str()? != approvals::digest(arguments) {
        return None;
    }
    match arguments {
        Value::Object(map) if map.is_empty() => Some(None),
        Value::Object(map) => Some(Some(map.clone())),
        _ => None,
    }
}
