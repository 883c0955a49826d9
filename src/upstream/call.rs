//! Driving one `tools/call` to its end: legacy elicitations arrive through the session (its stdio transport or
//! its rmcp handler), while 2026-07-28 `input_required` rounds and `-32042` URL elicitations are turned into
//! Requests here.

use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CancelledNotification, CancelledNotificationParam, ClientRequest,
    CustomResult, ElicitationAction, ErrorCode, ErrorData, InputResponses, RequestId, ServerResult,
};
use rmcp::service::{PeerRequestOptions, ServiceError};
use rmcp::{Peer, RoleClient};
use serde_json::{Map, Value};

use super::client::{ELICITATION_CREATE, SessionCore};
use crate::calls::Finish;
use crate::registry::{Outcome, Pending};

/// The most `input_required` rounds one call may take.
const MAX_ROUNDS: usize = 32;
/// JSON-RPC error code of a 2025-11-25 `URLElicitationRequiredError`.
const URL_ELICITATION_REQUIRED: ErrorCode = ErrorCode(-32042);

/// Runs a call on a session until the upstream returns its result or fails it.
pub async fn drive(
    core: &Arc<SessionCore>,
    peer: &Peer<RoleClient>,
    call: &str,
    mut params: CallToolRequestParams,
) -> Finish {
    let mut url_retry_used = false;
    for _ in 0..MAX_ROUNDS {
        let response = match send(core, peer, call, params.clone()).await {
            Ok(response) => response,
            Err(ServiceError::McpError(error)) if error.code == URL_ELICITATION_REQUIRED && !url_retry_used => {
                url_retry_used = true;
                match authorize(core, call, &error).await {
                    Ok(()) => continue,
                    Err(finish) => return finish,
                }
            }
            Err(error) => return Finish::Failed(describe(&error)),
        };
        let input = match response {
            ServerResult::CustomResult(CustomResult(result)) if is_input_required(&result) => result,
            ServerResult::CustomResult(CustomResult(result)) => return completed_json(result),
            ServerResult::InputRequiredResult(input) => serde_json::to_value(input).unwrap_or_default(),
            // What rmcp read over HTTP, through an untagged enum: a result may arrive as another variant.
            other => return completed_json(serde_json::to_value(other).unwrap_or_default()),
        };
        let (requests, state) = match read_input_required(input) {
            Ok(round) => round,
            Err(detail) => {
                return Finish::Failed(format!(
                    "the upstream asked for input the gateway cannot show: {detail}"
                ));
            }
        };
        if requests.is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        params.input_responses = match fulfil(core, call, requests).await {
            Ok(responses) => (!responses.is_empty()).then_some(responses),
            Err(finish) => return finish,
        };
        params.request_state = state;
    }
    Finish::Failed(format!("the upstream asked for input more than {MAX_ROUNDS} times"))
}

fn is_input_required(result: &Value) -> bool {
    result.get("resultType").and_then(Value::as_str) == Some("input_required")
}

/// The `inputRequests` of an `input_required` result and its `requestState`, to be echoed byte for byte.
fn read_input_required(mut result: Value) -> Result<(Map<String, Value>, Option<String>), String> {
    let requests = match result.get_mut("inputRequests").map(Value::take) {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(requests)) => requests,
        Some(_) => return Err("inputRequests is not an object".to_owned()),
    };
    let state = match result.get_mut("requestState").map(Value::take) {
        None | Some(Value::Null) => None,
        Some(Value::String(state)) => Some(state),
        Some(_) => return Err("requestState is not a string".to_owned()),
    };
    Ok((requests, state))
}

/// The end of a call: its result passed on as the upstream wrote it if it is a `CallToolResult` as MCP defines
/// it, with `content` defaulting to `[]` as it does when rmcp reads one.
fn completed_json(mut result: Value) -> Finish {
    let Some(fields) = result.as_object_mut() else {
        return not_a_call_tool_result();
    };
    let complete = fields.get("resultType").is_none_or(|kind| kind == "complete");
    let content = match fields.get("content") {
        None => true,
        Some(Value::Array(blocks)) => blocks
            .iter()
            .all(|block| block.get("type").is_some_and(Value::is_string)),
        Some(_) => false,
    };
    let flag = fields.get("isError").is_none_or(Value::is_boolean);
    let known = ["content", "structuredContent", "isError"]
        .iter()
        .any(|key| fields.contains_key(*key));
    if !(complete && content && flag && known) {
        return not_a_call_tool_result();
    }
    fields.entry("content").or_insert_with(|| Value::Array(Vec::new()));
    Finish::Completed(result)
}

fn not_a_call_tool_result() -> Finish {
    Finish::Failed("the upstream answered tools/call with something that is not a CallToolResult".into())
}

/// Sends one `tools/call` and waits for its response; dropping the future tells the upstream it was cancelled.
async fn send(
    core: &SessionCore,
    peer: &Peer<RoleClient>,
    call: &str,
    params: CallToolRequestParams,
) -> Result<ServerResult, ServiceError> {
    let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
    let handle = peer
        .send_request_with_option(request, PeerRequestOptions::no_options())
        .await?;
    let mut guard = InFlight {
        core,
        peer,
        request: Some(handle.id.clone()),
    };
    core.track(handle.id.clone(), call);
    let response = handle.await_response().await;
    guard.finish();
    response
}

/// Answers the elicitations of an `input_required` result through Requests, keyed as the upstream keyed them.
async fn fulfil(core: &SessionCore, call: &str, requests: Map<String, Value>) -> Result<InputResponses, Finish> {
    let mut pending = Vec::with_capacity(requests.len());
    for (key, mut request) in requests {
        if request.get("method").and_then(Value::as_str) != Some(ELICITATION_CREATE) {
            return Err(Finish::Failed(format!(
                "the upstream asked for input {key:?} of a kind the gateway does not provide (only elicitation is)"
            )));
        }
        let params = request.get_mut("params").map(Value::take).unwrap_or_default();
        pending.push((key, suspend(core, params, call)?));
    }
    let mut responses = InputResponses::new();
    for (key, request) in pending {
        let result = resolved(core, request).await?;
        responses.insert(key, serde_json::to_value(result).unwrap_or_default());
    }
    Ok(responses)
}

/// Turns the URL elicitations of a `-32042` error into Requests; `Ok` when every one was accepted.
async fn authorize(core: &SessionCore, call: &str, error: &ErrorData) -> Result<(), Finish> {
    let elicitations = error
        .data
        .as_ref()
        .and_then(|data| data.get("elicitations"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut pending = Vec::with_capacity(elicitations.len());
    for params in elicitations {
        pending.push(suspend(core, params, call)?);
    }
    for request in pending {
        if resolved(core, request).await?.action != ElicitationAction::Accept {
            return Err(Finish::Failed(error.message.to_string()));
        }
    }
    Ok(())
}

fn suspend(core: &SessionCore, params: Value, call: &str) -> Result<Pending, Finish> {
    core.suspend(params, Some(call.to_owned())).map_err(|error| {
        Finish::Failed(format!(
            "the upstream sent an elicitation the gateway cannot show: {error}"
        ))
    })
}

async fn resolved(core: &SessionCore, request: Pending) -> Result<rmcp::model::ElicitResult, Finish> {
    match request.outcome.await {
        Ok(Outcome::Reply(result)) => Ok(result),
        Ok(Outcome::Withdrawn) | Err(_) => {
            let detail = core
                .registry
                .get(&request.id)
                .and_then(|view| view.detail)
                .unwrap_or_default();
            Err(Finish::Failed(format!(
                "Request {} was cancelled: {detail}",
                request.id
            )))
        }
    }
}

fn describe(error: &ServiceError) -> String {
    match error {
        ServiceError::McpError(error) if error.data == Some(Value::from(super::stdio::UNREADABLE)) => {
            error.message.to_string()
        }
        ServiceError::McpError(error) => format!("the upstream returned error {}: {}", error.code.0, error.message),
        ServiceError::TransportClosed => "the upstream connection closed".to_owned(),
        other => format!("the upstream call failed: {other}"),
    }
}

/// An in-flight `tools/call`: tracked for attribution, and cancelled upstream if abandoned.
struct InFlight<'a> {
    core: &'a SessionCore,
    peer: &'a Peer<RoleClient>,
    request: Option<RequestId>,
}

impl InFlight<'_> {
    fn finish(&mut self) {
        if let Some(request) = self.request.take() {
            self.core.untrack(&request);
        }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let Some(request) = self.request.take() else { return };
        self.core.untrack(&request);
        let peer = self.peer.clone();
        let notification = CancelledNotification::new(CancelledNotificationParam::new(
            Some(request),
            Some("cancelled by the gateway".to_owned()),
        ));
        self.core.sends.spawn(async move {
            let _ = peer.send_notification(notification.into()).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn result(finish: Finish) -> Result<Value, String> {
        match finish {
            Finish::Completed(result) => Ok(result),
            Finish::Failed(message) | Finish::Cancelled(message) => Err(message),
        }
    }

    #[test]
    fn call_tool_results_pass_through_as_the_upstream_wrote_them() {
        let text = json!({"content": [{"type": "text", "text": "hi", "annotations": {"x": 1}}], "isError": false,
            "resultType": "complete", "_meta": {"k": "v"}});
        assert_eq!(result(completed_json(text.clone())), Ok(text));
        let structured = json!({"structuredContent": {"n": 1}});
        assert_eq!(
            result(completed_json(structured)),
            Ok(json!({"structuredContent": {"n": 1}, "content": []}))
        );
        assert_eq!(
            result(completed_json(json!({"isError": true}))),
            Ok(json!({"isError": true, "content": []}))
        );
    }

    #[test]
    fn results_that_are_not_call_tool_results_fail_the_call() {
        for other in [
            json!("text"),
            json!({}),
            json!({"_meta": {}}),
            json!({"tools": []}),
            json!({"content": "hi"}),
            json!({"content": [{"text": "no type"}]}),
            json!({"content": [], "isError": "yes"}),
            json!({"content": [], "resultType": "task"}),
        ] {
            let message = result(completed_json(other.clone())).unwrap_err();
            assert!(message.contains("not a CallToolResult"), "{other}: {message}");
        }
    }
}
