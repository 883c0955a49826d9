//! Driving one `tools/call` of a call to its end: legacy elicitations arrive through the session (its stdio
//! transport or its rmcp handler) while the request is in flight; a 2026-07-28 `input_required` round becomes
//! Requests kept by the store, and the call waits on them with nothing in flight; `-32042` URL elicitations
//! are answered here.

use std::sync::Arc;

use futures::FutureExt;

use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CancelledNotification, CancelledNotificationParam, ClientRequest,
    CreateTaskResult, CustomRequest, CustomResult, ElicitResult, ElicitationAction, ErrorCode, ErrorData,
    InputResponses, RequestId, ServerResult, Task,
};
use rmcp::service::{PeerRequestOptions, RequestHandle, ServiceError};
use rmcp::{Peer, RoleClient};
use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;

use super::Live;
use super::client::{CallRef, Offers, SessionCore};
use crate::ids::CallId;
use crate::records::{Arguments, CallError, CallFailure, Finish};
use crate::registry::{AskError, Outcome};
use crate::store::{Asked, NewRound};
use crate::time::Timestamp;

/// The most `input_required` rounds one call may take.
pub(super) const MAX_ROUNDS: u32 = 32;
/// JSON-RPC error code of a 2025-11-25 `URLElicitationRequiredError`.
const URL_ELICITATION_REQUIRED: ErrorCode = ErrorCode(-32042);

/// Why an `input_required` result cannot be read.
#[derive(Debug, thiserror::Error)]
enum RoundError {
    #[error("inputRequests is not an object")]
    Requests,
    #[error("requestState is not a string")]
    State,
}

/// Where a call's `tools/call` left it.
pub enum Driven {
    Ended(Finish),
    /// It waits on a round of Requests, or its end is recorded already.
    Waiting,
    /// The upstream made a task of it, at this round: the call follows the task.
    Task(Box<Task>, u32),
    /// A 2025-11-25 server made an experimental task of it (SEP-1686), whose result `tasks/result` waits for.
    LegacyTask(Box<Task>),
}

/// Sends a call's `tools/call` (after `round` answered rounds) and follows it to where it leaves the call. With
/// `legacy_tasks`, a tool a 2025-11-25 server says requires a task is called again as one.
///
/// Only the request in flight holds the call's arguments: a later `tools/call` of the call (a retry after a
/// URL elicitation, or the next round) reads them again from the store, which keeps them exactly as sent.
pub async fn drive(
    live: &Live,
    call: &CallRef,
    params: Box<CallToolRequestParams>,
    mut round: u32,
    legacy_tasks: bool,
) -> Driven {
    let (core, peer) = (&live.core, &live.peer);
    let mut url_retry_used = false;
    let mut next = Next {
        input_responses: params.input_responses.clone(),
        request_state: params.request_state.clone(),
        as_task: false,
    };
    let tool = params.name.to_string();
    let mut first = Some(params);
    while round <= MAX_ROUNDS {
        let params = match first.take() {
            Some(params) => params,
            // Boxed: a read of the store is a large future, and a call's task keeps room only for its wait.
            None => match Box::pin(next.params(core, &call.id)).await {
                Ok(params) => params,
                Err(finish) => return Driven::Ended(finish),
            },
        };
        let retrying = next.input_responses.is_some() || next.request_state.is_some();
        // Only the wait for the response races the session's end: a response read before it, such as a round
        // the upstream returned just before it exited, is acted on in full.
        let request = Box::new(tools_call(*params, next.as_task));
        let mut sending = std::pin::pin!(send(core, peer, call, request));
        let sent = tokio::select! {
            biased;
            () = live.closed.cancelled() => match sending.as_mut().now_or_never() {
                Some(Ok(response)) => Ok(response),
                _ => {
                    return Driven::Ended(Finish::failed(format!(
                        "the session ended before the call completed: {}",
                        live.ended()
                    )));
                }
            },
            sent = &mut sending => sent,
        };
        let turn = Turn {
            retrying,
            legacy_tasks: legacy_tasks.then_some(tool.as_str()),
            url_retry_used: &mut url_retry_used,
            next: &mut next,
            round: &mut round,
        };
        // Boxed: a call's task keeps room only for waiting on the upstream, not for what follows its response.
        match Box::pin(after(core, call, sent, turn)).await {
            Then::SendAgain => {}
            Then::Ended(finish) => return Driven::Ended(finish),
            Then::Done => return Driven::Waiting,
            Then::Task(task) => return Driven::Task(task, round),
            Then::LegacyTask(task) => return Driven::LegacyTask(task),
        }
    }
    Driven::Ended(Finish::failed(format!(
        "the upstream asked for input more than {MAX_ROUNDS} times"
    )))
}

/// The params of a call's `tools/call`: its tool, and its arguments as the store keeps them.
pub fn call_params(tool: String, arguments: &Arguments) -> CallToolRequestParams {
    let mut params = CallToolRequestParams::new(tool);
    params.arguments = Some(arguments.to_map());
    params
}

/// What a call's next `tools/call` carries besides its tool and arguments.
struct Next {
    input_responses: Option<InputResponses>,
    request_state: Option<String>,
    /// Whether it asks for a task (`task`, the experimental tasks of 2025-11-25).
    as_task: bool,
}

impl Next {
    /// The next `tools/call`'s params, of the call as the store keeps it.
    async fn params(&self, core: &SessionCore, call: &CallId) -> Result<Box<CallToolRequestParams>, Finish> {
        let view = match core.calls.get(call).await {
            Ok(Some(view)) => view,
            Ok(None) => return Err(Finish::failed("the call is no longer kept, so it cannot be sent again")),
            Err(error) => {
                return Err(Finish::failed(format!(
                    "the gateway could not read the call to send it again: {error}"
                )));
            }
        };
        let mut params = call_params(view.tool, &view.arguments);
        params.input_responses = self.input_responses.clone();
        params.request_state = self.request_state.clone();
        Ok(Box::new(params))
    }
}

/// How a call goes on after one response.
enum Then {
    /// Another `tools/call` is sent.
    SendAgain,
    Ended(Finish),
    /// Nothing more runs here: the call waits on a round of Requests, or its end is recorded already.
    Done,
    /// The upstream made a task of the call.
    Task(Box<Task>),
    /// A 2025-11-25 upstream made an experimental task of the call.
    LegacyTask(Box<Task>),
}

/// What one response of a call's loop may change for the next `tools/call`.
struct Turn<'a> {
    /// Whether the request carried answers, or a state, to the upstream.
    retrying: bool,
    /// The tool, when the server may say it requires a task (then it is called again as one).
    legacy_tasks: Option<&'a str>,
    url_retry_used: &'a mut bool,
    next: &'a mut Next,
    round: &'a mut u32,
}

/// Acts on the response to one `tools/call`, and says how the call goes on.
async fn after(
    core: &Arc<SessionCore>,
    call: &CallRef,
    sent: Result<ServerResult, ServiceError>,
    turn: Turn<'_>,
) -> Then {
    let response = match sent {
        Ok(response) => response,
        Err(ServiceError::McpError(error)) if error.code == URL_ELICITATION_REQUIRED && !*turn.url_retry_used => {
            *turn.url_retry_used = true;
            return match authorize(core, call, &error).await {
                Ok(()) => Then::SendAgain,
                Err(finish) => Then::Ended(finish),
            };
        }
        Err(ServiceError::McpError(error)) if turn.retrying && error.code == ErrorCode::INVALID_PARAMS => {
            return Then::Ended(state_rejected(core, &call.id, &error).await);
        }
        Err(error) => return Then::Ended(Finish::failed(describe(&error))),
    };
    let input = match response {
        ServerResult::CreateTaskResult(created) => return Then::Task(Box::new(created.task)),
        ServerResult::CustomResult(CustomResult(result))
            if turn.next.as_task && result.get("task").is_some_and(Value::is_object) =>
        {
            return match legacy_task(&result["task"]) {
                Some(task) => Then::LegacyTask(Box::new(task)),
                None => Then::Ended(Finish::failed(
                    "the upstream made a task of the call that the gateway cannot read",
                )),
            };
        }
        ServerResult::CustomResult(CustomResult(result)) if is_task(&result) => {
            return match serde_json::from_value::<CreateTaskResult>(result) {
                Ok(created) => Then::Task(Box::new(created.task)),
                Err(error) => Then::Ended(Finish::failed(format!(
                    "the upstream made a task of the call that the gateway cannot read: {error}"
                ))),
            };
        }
        ServerResult::CustomResult(CustomResult(result)) if is_input_required(&result) => result,
        ServerResult::InputRequiredResult(input) => serde_json::to_value(input).unwrap_or_default(),
        ServerResult::CustomResult(CustomResult(result)) => return completed(result, turn),
        // What rmcp read over HTTP, through an untagged enum: a result may arrive as another variant.
        other => return completed(serde_json::to_value(other).unwrap_or_default(), turn),
    };
    let (requests, state) = match read_input_required(input) {
        Ok(round) => round,
        Err(error) => {
            return Then::Ended(Finish::failed(format!(
                "the upstream asked for input the gateway cannot show: {error}"
            )));
        }
    };
    *turn.round += 1;
    turn.next.input_responses = None;
    turn.next.request_state = state.clone();
    if requests.is_empty() {
        return Then::SendAgain;
    }
    match book_round(core, call, *turn.round, state, requests, None).await {
        Booked::Waiting => Then::Done,
        Booked::Answered(responses) => {
            turn.next.input_responses = Some(responses);
            Then::SendAgain
        }
        Booked::Ended(Some(finish)) => Then::Ended(finish),
        Booked::Ended(None) => Then::Done,
    }
}

/// What became of a round of input requests.
pub(super) enum Booked {
    /// Its Requests are raised: the call waits on them.
    Waiting,
    /// Answered here at once, with these answers: nothing in it is for a person (roots), or pending Requests are
    /// at their cap and each elicitation is answered `cancel`.
    Answered(InputResponses),
    /// The call ends so, or (`None`) has ended already.
    Ended(Option<Finish>),
}

/// Raises round `number` of a call's input requests (an `input_required` result's or a task's) as Requests,
/// none expiring later than `by` (the task's end).
pub(super) async fn book_round(
    core: &SessionCore,
    call: &CallRef,
    number: u32,
    request_state: Option<String>,
    requests: Map<String, Value>,
    by: Option<Timestamp>,
) -> Booked {
    let mut asked = Vec::with_capacity(requests.len());
    for (key, request) in &requests {
        match Asked::of(request) {
            Some(Asked::Sampling) if !core.offers.sampling => {
                return Booked::Ended(Some(Finish::failed(format!(
                    "the upstream asked for sampling ({key:?}), which this server's config refuses (sampling = \"refuse\")"
                ))));
            }
            Some(kind) => asked.push((key.clone(), kind)),
            None => {
                return Booked::Ended(Some(Finish::failed(format!(
                    "the upstream asked for input {key:?} of a kind the gateway does not provide (elicitation, \
                     sampling and roots are)"
                ))));
            }
        }
    }
    let answered_here = |answers| match input_responses(&asked, answers, &core.offers) {
        Ok(responses) => Booked::Answered(responses),
        Err(finish) => Booked::Ended(Some(finish)),
    };
    if asked.iter().all(|(_, kind)| *kind == Asked::Roots) {
        return answered_here(Map::new());
    }
    let new_round = NewRound {
        call: call.id.clone(),
        number,
        request_state,
        input_requests: requests,
    };
    match core.registry.ask_round(new_round, &core.origin(Some(call)), by).await {
        Ok(_) => Booked::Waiting,
        Err(AskError::Full(cap)) if asked.iter().any(|(_, kind)| *kind == Asked::Sampling) => {
            Booked::Ended(Some(Finish::failed(format!(
                "pending Requests are at their cap ({cap}): the upstream's sampling request cannot be asked, and \
                 a 2026-07-28 answer cannot refuse it"
            ))))
        }
        Err(AskError::Full(cap)) => {
            tracing::warn!(
                call = %call.id,
                %cap,
                "pending Requests at their cap: the round's input requests answered cancel"
            );
            // No answers: each elicitation gets `cancel`.
            answered_here(Map::new())
        }
        Err(AskError::Unusable(detail)) => Booked::Ended(Some(Finish::failed(format!(
            "the upstream asked for input the gateway cannot show: {detail}"
        )))),
        // The call was cancelled while its upstream worked: its end is recorded already.
        Err(AskError::CallEnded(_)) => Booked::Ended(None),
        Err(AskError::Store(error)) => Booked::Ended(Some(Finish::failed(format!(
            "the gateway could not record the round: {error}"
        )))),
    }
}

/// The `inputResponses` of a round: each Request's answer (`answers`, by key) sent as what its input request
/// asked for, a reply to a sampling request as the assistant's message, and roots from the server's config. A
/// refused sampling request ends the call: a 2026-07-28 answer has no way to say so (rmcp's client fails the
/// call alike).
pub(super) fn input_responses(
    asked: &[(String, Asked)],
    mut answers: Map<String, Value>,
    offers: &Offers,
) -> Result<InputResponses, Finish> {
    let cancel = || serde_json::to_value(ElicitResult::new(ElicitationAction::Cancel)).unwrap_or_default();
    let mut responses = InputResponses::new();
    for (key, kind) in asked {
        let answer = answers.remove(key);
        let response = match kind {
            Asked::Elicitation => answer.unwrap_or_else(cancel),
            Asked::Roots => serde_json::to_value(offers.roots_result()).unwrap_or_default(),
            Asked::Sampling => {
                let result = answer
                    .and_then(|answer| serde_json::from_value::<ElicitResult>(answer).ok())
                    .unwrap_or_else(|| ElicitResult::new(ElicitationAction::Cancel));
                match crate::sampling::reply(result) {
                    Ok(reply) => serde_json::to_value(reply).unwrap_or_default(),
                    Err(refused) => {
                        return Err(Finish::failed(format!(
                            "the server's sampling request {key:?} was not answered with a reply ({}), which a \
                             2026-07-28 answer cannot say: the call ends",
                            refused.message
                        )));
                    }
                }
            }
        };
        responses.insert(key.clone(), response);
    }
    responses.extend(answers);
    Ok(responses)
}

/// The end of a call whose retry the upstream refused: the `requestState` the gateway echoed is not one it
/// accepts any more. The Requests that answered the round say so too.
async fn state_rejected(core: &SessionCore, call: &CallId, error: &ErrorData) -> Finish {
    let detail = format!(
        "the upstream refused this round's answers when the call was retried: {}",
        error.message
    );
    if let Err(failure) = core.calls.annotate_round(call, &detail).await {
        tracing::warn!(%call, %failure, "the refused round could not be noted on its Requests");
    }
    Finish::Failed(CallError {
        message: format!(
            "the upstream refused the call's requestState with its answers (error {}: {}): it may have \
             restarted with a new key, or the state expired; start the call again",
            error.code.0, error.message
        ),
        reason: Some(CallFailure::StateRejected),
    })
}

/// The end of a call with the result its `tools/call` got, unless the server said the tool requires a task
/// (the experimental tasks of 2025-11-25): then it is sent again, as a task, once.
fn completed(result: Value, turn: Turn<'_>) -> Then {
    if let Some(tool) = turn.legacy_tasks
        && !turn.next.as_task
        && requires_task(&result, tool)
    {
        turn.next.as_task = true;
        return Then::SendAgain;
    }
    Then::Ended(completed_json(result))
}

/// Whether a result is the TypeScript SDK's refusal to run `tool` other than as a task, word for word: rmcp
/// does not read a tool's `execution.taskSupport`, so the refusal is how the gateway learns that the tool
/// needs one. The SDK refuses before the tool runs, so sending it again runs it once.
fn requires_task(result: &Value, tool: &str) -> bool {
    let refusal = format!("MCP error -32601: Tool {tool} requires task augmentation (taskSupport: 'required')");
    result["isError"] == true
        && result["content"]
            .as_array()
            .is_some_and(|blocks| blocks.len() == 1 && blocks[0]["text"] == refusal.as_str())
}

/// An experimental task of 2025-11-25 (its `CreateTaskResult`'s `task`, or a `tasks/get` result) as the
/// Tasks extension's, whose fields it shares under other names (`ttl`, `pollInterval`).
pub(super) fn legacy_task(task: &Value) -> Option<Task> {
    let mut fields = task.as_object()?.clone();
    for (old, new) in [("ttl", "ttlMs"), ("pollInterval", "pollIntervalMs")] {
        if let Some(value) = fields.remove(old) {
            fields.insert(new.to_owned(), value);
        }
    }
    fields.entry("ttlMs").or_insert(Value::Null);
    serde_json::from_value(Value::Object(fields)).ok()
}

/// A call's `tools/call`, asking for a task when `as_task` (2025-11-25: rmcp's params have no `task`).
fn tools_call(params: CallToolRequestParams, as_task: bool) -> ClientRequest {
    if !as_task {
        return ClientRequest::CallToolRequest(CallToolRequest::new(params));
    }
    let mut params = serde_json::to_value(params).unwrap_or_default();
    params["task"] = serde_json::json!({});
    ClientRequest::CustomRequest(CustomRequest::new("tools/call", Some(params)))
}

fn is_input_required(result: &Value) -> bool {
    result.get("resultType").and_then(Value::as_str) == Some("input_required")
}

fn is_task(result: &Value) -> bool {
    result.get("resultType").and_then(Value::as_str) == Some("task")
}

/// The `inputRequests` of an `input_required` result and its `requestState`, to be echoed byte for byte.
fn read_input_required(mut result: Value) -> Result<(Map<String, Value>, Option<String>), RoundError> {
    let requests = match result.get_mut("inputRequests").map(Value::take) {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(requests)) => requests,
        Some(_) => return Err(RoundError::Requests),
    };
    let state = match result.get_mut("requestState").map(Value::take) {
        None | Some(Value::Null) => None,
        Some(Value::String(state)) => Some(state),
        Some(_) => return Err(RoundError::State),
    };
    Ok((requests, state))
}

/// The end of a call: its result passed on as the upstream wrote it if it is a `CallToolResult` as MCP defines
/// it, with `content` defaulting to `[]` as it does when rmcp reads one.
pub(super) fn completed_json(mut result: Value) -> Finish {
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
    Finish::failed("the upstream answered tools/call with something that is not a CallToolResult")
}

/// Sends one request of a call (its `tools/call`, or a 2025-11-25 task's `tasks/result`) and waits for its
/// response; dropping the future tells the upstream it was cancelled.
pub(super) async fn send(
    core: &SessionCore,
    peer: &Peer<RoleClient>,
    call: &CallRef,
    request: Box<ClientRequest>,
) -> Result<ServerResult, ServiceError> {
    // Boxed: what sending and tracking the request take (rmcp's future alone is about 3 KB) is not kept while
    // the response is awaited.
    let (handle, mut guard) = Box::pin(start(core, peer, call, request)).await?;
    // The response itself, as `RequestHandle::await_response` gives it without a timeout (none is set): that
    // future keeps room for its timeouts and their cancellations, about 3 KB more per call in flight.
    let response = handle.rx.await.unwrap_or(Err(ServiceError::TransportClosed));
    guard.finish();
    response
}

/// Sends one request of a call and tracks it as in flight, until the guard returned is finished or dropped.
async fn start<'a>(
    core: &'a SessionCore,
    peer: &'a Peer<RoleClient>,
    call: &CallRef,
    request: Box<ClientRequest>,
) -> Result<(RequestHandle<RoleClient>, InFlight<'a>), ServiceError> {
    let sending = core.sending().await;
    let handle = peer
        .send_request_with_option(*request, PeerRequestOptions::no_options())
        .await?;
    let guard = InFlight {
        core,
        peer,
        request: Some(handle.id.clone()),
    };
    core.track(handle.id.clone(), handle.progress_token.clone(), call);
    drop(sending);
    Ok((handle, guard))
}

/// Turns the URL elicitations of a `-32042` error into Requests; `Ok` when every one was accepted.
async fn authorize(core: &Arc<SessionCore>, call: &CallRef, error: &ErrorData) -> Result<(), Finish> {
    let elicitations = error
        .data
        .as_ref()
        .and_then(|data| data.get("elicitations"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let origin = core.origin(Some(call));
    let mut waiting = Vec::with_capacity(elicitations.len());
    for params in elicitations {
        let asked = core.registry.ask(params, &origin, CancellationToken::new()).await;
        match asked {
            Ok(asked) => waiting.push(asked),
            Err(AskError::Full(_)) => return Err(Finish::failed(error.message.to_string())),
            Err(error) => {
                return Err(Finish::failed(format!(
                    "the upstream sent an elicitation the gateway cannot show: {error}"
                )));
            }
        }
    }
    for mut asked in waiting {
        match asked.outcome().await {
            Outcome::Reply(result) if result.action == ElicitationAction::Accept => {}
            Outcome::Reply(_) => return Err(Finish::failed(error.message.to_string())),
            Outcome::Withdrawn(detail) => {
                return Err(Finish::failed(format!("Request {} was cancelled: {detail}", asked.id)));
            }
        }
    }
    Ok(())
}

fn describe(error: &ServiceError) -> String {
    match error {
        ServiceError::McpError(error) if error.data == Some(Value::from(super::stdio::UNREADABLE)) => {
            error.message.to_string()
        }
        ServiceError::McpError(error) => format!("the upstream returned error {}: {}", error.code.0, error.message),
        // Whichever notices first, rmcp's service or the transport's end of input, the call ends alike.
        ServiceError::TransportClosed => super::stdio::ENDED.to_owned(),
        other => format!("the upstream call failed: {}", without_type_names(other)),
    }
}

/// A service error as people read it: a transport's failure by what failed, not by the Rust type of the
/// transport that rmcp names in its message.
pub(super) fn without_type_names(error: &ServiceError) -> String {
    match error {
        ServiceError::TransportSend(sent) => {
            format!("the request could not be sent: {}", crate::outbox::causes(&*sent.error))
        }
        other => other.to_string(),
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

    #[test]
    fn call_tool_results_pass_through_as_the_upstream_wrote_them() {
        let text = json!({"content": [{"type": "text", "text": "hi", "annotations": {"x": 1}}], "isError": false,
            "resultType": "complete", "_meta": {"k": "v"}});
        assert_eq!(completed_json(text.clone()), Finish::Completed(text));
        let structured = json!({"structuredContent": {"n": 1}});
        assert_eq!(
            completed_json(structured),
            Finish::Completed(json!({"structuredContent": {"n": 1}, "content": []}))
        );
        assert_eq!(
            completed_json(json!({"isError": true})),
            Finish::Completed(json!({"isError": true, "content": []}))
        );
    }

    #[test]
    fn an_experimental_task_reads_as_the_extension_s_and_a_refusal_to_run_without_one_is_known() {
        let task = legacy_task(&json!({"taskId": "t1", "status": "working", "statusMessage": "m",
            "createdAt": "2026-01-01T00:00:00Z", "lastUpdatedAt": "2026-01-01T00:00:00Z",
            "ttl": 60000, "pollInterval": 500}))
        .unwrap();
        assert_eq!(
            (task.task_id.as_str(), task.ttl_ms, task.poll_interval_ms),
            ("t1", Some(60000), Some(500))
        );
        assert!(legacy_task(&json!({"status": "working"})).is_none());

        let refusal = |text: &str| json!({"content": [{"type": "text", "text": text}], "isError": true});
        let exact = "MCP error -32601: Tool x requires task augmentation (taskSupport: 'required')";
        assert!(requires_task(&refusal(exact), "x"));
        assert!(!requires_task(&refusal(exact), "y"), "another tool's refusal");
        assert!(
            !requires_task(&refusal(&format!("echo: {exact}")), "x"),
            "a text quoting it"
        );
        assert!(!requires_task(&refusal("the disk is full"), "x"));
        let mut succeeded = refusal(exact);
        succeeded["isError"] = json!(false);
        assert!(!requires_task(&succeeded, "x"));
    }

    #[test]
    fn a_round_s_answers_go_back_as_what_each_input_request_asked_for() {
        let offers = Offers {
            roots: vec!["file:///w".to_owned()].into(),
            sampling: true,
            tasks: true,
        };
        let asked = [
            ("e".to_owned(), Asked::Elicitation),
            ("s".to_owned(), Asked::Sampling),
            ("r".to_owned(), Asked::Roots),
            ("unanswered".to_owned(), Asked::Elicitation),
        ];
        let answers = json!({"e": {"action": "accept", "content": {"x": 1}},
            "s": {"action": "accept", "content": {"text": "Yes."}}});
        let sent = input_responses(&asked, answers.as_object().cloned().unwrap(), &offers).unwrap();
        assert_eq!(sent["e"], answers["e"]);
        assert_eq!(
            (&sent["s"]["content"]["text"], &sent["s"]["model"]),
            (&json!("Yes."), &json!("human"))
        );
        assert_eq!(sent["r"], json!({"roots": [{"uri": "file:///w"}]}));
        assert_eq!(sent["unanswered"], json!({"action": "cancel"}));

        let declined = json!({"s": {"action": "decline"}});
        let ended = input_responses(&asked[1..2], declined.as_object().cloned().unwrap(), &offers).unwrap_err();
        assert!(matches!(ended, Finish::Failed(error) if error.message.contains("\"s\" was not answered")));
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
            assert_eq!(completed_json(other), not_a_call_tool_result());
        }
    }

    #[test]
    fn a_transport_failure_says_what_failed_and_names_no_rust_type() {
        let io = std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the server's input is closed");
        let sent = rmcp::transport::DynamicTransportError::from_parts(
            "toolnexus_gateway::upstream::connect::EofWatch<rmcp::transport::io::Transport>",
            std::any::TypeId::of::<()>(),
            Box::new(io),
        );
        let described = describe(&ServiceError::TransportSend(sent));
        assert_eq!(
            described,
            "the upstream call failed: the request could not be sent: the server's input is closed"
        );
    }
}
