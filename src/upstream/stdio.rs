//! The transport of a stdio server: rmcp's messages as lines on its child process's pipes, with messages rmcp
//! cannot read answered or failed by their id instead of dropped, and the responses to `tools/call` passed on
//! as JSON. The upstream's `elicitation/create` requests are answered here, through the session's Requests.

mod framing;
mod process;

use std::collections::{BTreeMap, HashSet};
use std::io;
use std::path::Path;
use std::sync::Arc;

use rmcp::RoleClient;
use rmcp::model::{
    ClientNotification, ClientRequest, CustomRequest, CustomResult, JsonRpcMessage, JsonRpcResponse, JsonRpcVersion2_0,
    RequestId, ServerRequest, ServerResult,
};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::client::{Asking, ELICITATION_CREATE, SessionCore};
use framing::{Line, MAX_MESSAGE_BYTES, Reader, Writer};
use process::Process;

/// The session detail when the upstream's stdout ends.
pub const ENDED: &str = "the upstream ended the session (its process exited or its connection closed)";
/// The MCP method by which either side cancels a request it sent.
const CANCELLED: &str = "notifications/cancelled";
/// The `data` of an error the gateway puts in place of an upstream response it cannot read.
pub const UNREADABLE: &str = "unreadable-response";

/// A child process spoken to over its stdin and stdout.
pub struct ChildTransport {
    server: String,
    process: Process,
    stdout: Reader,
    stdin: Writer,
    /// Fires with the reason once the stream ends.
    ended: Option<oneshot::Sender<String>>,
    /// The `tools/call` requests sent and not yet answered or cancelled. Their responses are read straight
    /// as the two results a `tools/call` can have, instead of being tried against every result type.
    tool_calls: HashSet<RequestId>,
    /// The session whose Requests answer the upstream's `elicitation/create` requests; without one they go to rmcp.
    session: Option<Arc<SessionCore>>,
    /// The waits of its elicitations, each ending with its response written; aborted when the transport goes.
    waits: JoinSet<()>,
}

impl ChildTransport {
    /// Starts a server in its own process group, its stderr logged line by line under its name.
    pub fn spawn(
        server: &str,
        program: &Path,
        args: &[String],
        env: &BTreeMap<String, String>,
        ended: oneshot::Sender<String>,
    ) -> io::Result<Self> {
        let (process, stdin, stdout) = Process::spawn(server, program, args, env)?;
        Ok(Self {
            server: server.to_owned(),
            process,
            stdout: Reader::new(stdout),
            stdin: Writer::new(stdin),
            ended: Some(ended),
            tool_calls: HashSet::new(),
            session: None,
            waits: JoinSet::new(),
        })
    }

    /// Answers the upstream's `elicitation/create` requests here, through the session's Requests, rather than
    /// handing them to rmcp, which would keep a task with its request context alive per pending elicitation.
    pub fn answering(mut self, session: Arc<SessionCore>) -> Self {
        self.session = Some(session);
        self
    }

    /// Raises the Request of an `elicitation/create` and waits for it on a task that writes the response.
    fn elicit(&mut self, session: &Arc<SessionCore>, id: RequestId, params: Value) {
        let waiting = session.elicit(id.clone(), Asking::Elicitation, params, None, CancellationToken::new());
        let stdin = self.stdin.clone();
        // Boxed, as is writing the response: the task keeps one copy of the wait, and room for nothing else.
        let waiting = Box::pin(waiting);
        let task = async move {
            let outcome = waiting.await;
            Box::pin(async move {
                let response = match outcome {
                    Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
                    Err(error) => json!({"jsonrpc": "2.0", "id": id, "error": error}),
                };
                if let Ok(line) = framing::line(&response) {
                    let _ = stdin.write(line).await;
                }
            })
            .await
        };
        self.waits.spawn(task);
    }

    /// Lets go of the waits whose response has been written.
    fn reap(&mut self) {
        while self.waits.try_join_next().is_some() {}
    }

    /// Withdraws an elicitation the upstream cancels, before the next line is read; the notification still goes
    /// on to rmcp.
    fn cancelled(&self, line: &[u8]) {
        #[derive(Deserialize)]
        struct Notification {
            method: String,
            params: Params,
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Params {
            request_id: RequestId,
        }
        let Some(session) = &self.session else { return };
        if !session.elicits() || !contains(line, CANCELLED) {
            return;
        }
        if let Ok(notification) = serde_json::from_slice::<Notification>(line)
            && notification.method == CANCELLED
        {
            session.withdraw_elicitation(&notification.params.request_id);
        }
    }

    fn end(&mut self, detail: String) -> Option<RxJsonRpcMessage<RoleClient>> {
        if let Some(ended) = self.ended.take() {
            let _ = ended.send(detail);
        }
        None
    }

    /// The message a line carries; `None` when there is nothing for rmcp (garbage, or a request answered here).
    fn interpret(&mut self, line: &[u8]) -> Option<RxJsonRpcMessage<RoleClient>> {
        let line = line.strip_suffix(b"\n").unwrap_or(line);
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let line = line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line);
        if line.iter().all(u8::is_ascii_whitespace) {
            return None;
        }
        if let Some(message) = self.tool_call_response(line) {
            return Some(message);
        }
        if let Some((id, params)) = elicitation_request(line) {
            let Some(session) = self.session.clone() else {
                let request = CustomRequest::new(ELICITATION_CREATE, Some(params));
                return Some(JsonRpcMessage::request(ServerRequest::CustomRequest(request), id));
            };
            self.elicit(&session, id, params);
            return None;
        }
        self.cancelled(line);
        let error = match serde_json::from_slice(line) {
            Ok(message) => {
                let answered = match &message {
                    JsonRpcMessage::Response(response) => Some(&response.id),
                    JsonRpcMessage::Error(error) => error.id.as_ref(),
                    _ => None,
                };
                if let Some(id) = answered {
                    self.tool_calls.remove(id);
                }
                return Some(message);
            }
            Err(error) => error,
        };
        let Ok(value) = serde_json::from_slice::<Value>(line) else {
            let preview = String::from_utf8_lossy(&line[..line.len().min(80)]).into_owned();
            tracing::warn!(server = %self.server, preview, "ignoring a line from the upstream that is not JSON");
            return None;
        };
        let id = value.get("id").filter(|id| id.is_string() || id.is_number());
        match (id, value.get("method").and_then(Value::as_str)) {
            (Some(id), Some(method)) => {
                tracing::warn!(server = %self.server, method, %error, "the upstream sent a request the gateway cannot read; answering it with an error");
                let reply = json!({"code": -32600, "message": format!("the gateway cannot read this {method} request: {error}")});
                let reply = json!({"jsonrpc": "2.0", "id": id, "error": reply});
                if let Ok(line) = framing::line(&reply) {
                    let stdin = self.stdin.clone();
                    tokio::spawn(async move { stdin.write(line).await });
                }
                None
            }
            (Some(id), None) if value.get("result").is_some() || value.get("error").is_some() => {
                if let Ok(id) = serde_json::from_value(id.clone()) {
                    self.tool_calls.remove(&id);
                }
                tracing::warn!(server = %self.server, %error, "the upstream sent a response the gateway cannot read; failing its request");
                let message = format!("the upstream sent a response the gateway cannot read: {error}");
                let failed = json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32603, "message": message, "data": UNREADABLE}});
                serde_json::from_value(failed).ok()
            }
            _ => {
                tracing::debug!(server = %self.server, %error, "ignoring a message from the upstream the gateway cannot read");
                None
            }
        }
    }

    /// The response to a pending `tools/call`, its result passed on as JSON: the call reads an `input_required`
    /// result's elicitations as JSON, as the §2 mapping does, and a `CallToolResult` goes to the REST client as
    /// it is. `None` sends the line down the general path (any other message).
    fn tool_call_response(&mut self, line: &[u8]) -> Option<RxJsonRpcMessage<RoleClient>> {
        /// Only a response: a line that also names a method or an error is left to the general path.
        #[derive(Deserialize)]
        struct Response {
            #[serde(rename = "jsonrpc")]
            _version: JsonRpcVersion2_0,
            id: RequestId,
            result: Value,
            method: Option<IgnoredAny>,
            error: Option<IgnoredAny>,
        }
        if self.tool_calls.is_empty() || !contains(line, "\"result\"") {
            return None;
        }
        let response: Response = serde_json::from_slice(line).ok()?;
        if response.method.is_some() || response.error.is_some() || !self.tool_calls.contains(&response.id) {
            return None;
        }
        let result = ServerResult::CustomResult(CustomResult(response.result));
        self.tool_calls.remove(&response.id);
        Some(JsonRpcMessage::Response(JsonRpcResponse {
            jsonrpc: JsonRpcVersion2_0,
            id: response.id,
            result,
        }))
    }
}

/// The id and params of a 2025-11-25 `elicitation/create` request, its params unread: the gateway reads them
/// as JSON (rmcp would parse the schema into its own types only for the gateway to turn it back into JSON).
fn elicitation_request(line: &[u8]) -> Option<(RequestId, Value)> {
    /// Only a request: a line that also carries a result or an error is left to the general path.
    #[derive(Deserialize)]
    struct Request {
        #[serde(rename = "jsonrpc")]
        _version: JsonRpcVersion2_0,
        id: RequestId,
        method: String,
        #[serde(default)]
        params: Value,
        result: Option<IgnoredAny>,
        error: Option<IgnoredAny>,
    }
    if !contains(line, ELICITATION_CREATE) {
        return None;
    }
    let request: Request = serde_json::from_slice(line).ok()?;
    if request.method != ELICITATION_CREATE || request.result.is_some() || request.error.is_some() {
        return None;
    }
    Some((request.id, request.params))
}

fn contains(line: &[u8], text: &str) -> bool {
    line.windows(text.len()).any(|window| window == text.as_bytes())
}

impl Transport<RoleClient> for ChildTransport {
    type Error = io::Error;

    fn send(
        &mut self,
        message: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        match &message {
            JsonRpcMessage::Request(request) if matches!(request.request, ClientRequest::CallToolRequest(_)) => {
                self.tool_calls.insert(request.id.clone());
            }
            JsonRpcMessage::Notification(notification) => {
                if let ClientNotification::CancelledNotification(cancelled) = &notification.notification
                    && let Some(id) = &cancelled.params.request_id
                {
                    self.tool_calls.remove(id);
                }
            }
            _ => {}
        }
        let line = framing::line(&message);
        let stdin = self.stdin.clone();
        async move { stdin.write(line?).await }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        loop {
            let line = match self.stdout.read_line().await {
                Line::Whole(line) => line,
                Line::Oversized => {
                    return self.end(format!(
                        "the upstream sent a message larger than {} MiB, so the gateway ended the session",
                        MAX_MESSAGE_BYTES >> 20
                    ));
                }
                Line::Eof => return self.end(ENDED.to_owned()),
                Line::Failed(error) => return self.end(format!("reading from the upstream failed: {error}")),
            };
            self.reap();
            if let Some(message) = self.interpret(&line) {
                return Some(message);
            }
        }
    }

    /// Closes stdin and waits for the process to exit, then sends its group `SIGTERM`, then kills it.
    async fn close(&mut self) -> Result<(), Self::Error> {
        self.stdin.close().await;
        self.process.close().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::{
        CallToolRequest, CallToolRequestParams, CancelledNotification, CancelledNotificationParam, JsonRpcRequest,
    };

    fn transport() -> ChildTransport {
        let (ended, _) = oneshot::channel();
        ChildTransport::spawn("test", Path::new("cat"), &[], &Default::default(), ended).unwrap()
    }

    fn tool_call(id: i64) -> TxJsonRpcMessage<RoleClient> {
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(CallToolRequestParams::new("echo")));
        JsonRpcMessage::request(request, RequestId::Number(id))
    }

    fn response(message: Option<RxJsonRpcMessage<RoleClient>>) -> ServerResult {
        match message {
            Some(JsonRpcMessage::Response(response)) => response.result,
            other => panic!("not a response: {other:?}"),
        }
    }

    #[tokio::test]
    async fn tool_call_responses_are_passed_on_as_json_until_answered() {
        let mut transport = transport();
        drop(transport.send(tool_call(7)));
        drop(transport.send(tool_call(8)));
        assert_eq!(transport.tool_calls.len(), 2);
        let done = br#"{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"hi"}]}}"#;
        match response(transport.interpret(done)) {
            ServerResult::CustomResult(CustomResult(result)) => assert_eq!(result["content"][0]["text"], "hi"),
            other => panic!("not passed on as JSON: {other:?}"),
        }
        assert!(!transport.tool_calls.contains(&RequestId::Number(7)));
        let asking = br#"{"jsonrpc":"2.0","id":8,"result":{"resultType":"input_required","inputRequests":{"a":
            {"method":"elicitation/create","params":{"message":"Sure?","requestedSchema":{"type":"object",
            "properties":{"ok":{"type":"boolean"}}}}}}}}"#;
        let asking: Vec<u8> = asking.iter().copied().filter(|byte| *byte != b'\n').collect();
        match response(transport.interpret(&asking)) {
            ServerResult::CustomResult(CustomResult(result)) => {
                assert_eq!(result["inputRequests"]["a"]["params"]["message"], "Sure?");
            }
            other => panic!("not passed on as JSON: {other:?}"),
        }
        assert!(transport.tool_calls.is_empty());
    }

    #[tokio::test]
    async fn elicitation_requests_are_passed_on_with_their_params_unread() {
        let mut transport = transport();
        let line = br#"{"jsonrpc":"2.0","id":"e1","method":"elicitation/create","params":{"message":"Sure?",
            "requestedSchema":{"type":"object","properties":{"where":{"type":"object"}}}}}"#;
        let line: Vec<u8> = line.iter().copied().filter(|byte| *byte != b'\n').collect();
        match transport.interpret(&line) {
            Some(JsonRpcMessage::Request(request)) => {
                assert_eq!(request.id, RequestId::String("e1".into()));
                let ServerRequest::CustomRequest(custom) = request.request else {
                    panic!("not passed on unread: {:?}", request.request);
                };
                assert_eq!(custom.method, "elicitation/create");
                assert_eq!(
                    custom.params.unwrap()["requestedSchema"]["properties"]["where"]["type"],
                    "object"
                );
            }
            other => panic!("not a request: {other:?}"),
        }
        // Any other request takes rmcp's path.
        let ping = br#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#;
        assert!(matches!(
            transport.interpret(ping),
            Some(JsonRpcMessage::Request(JsonRpcRequest {
                request: ServerRequest::PingRequest(_),
                ..
            }))
        ));
    }

    #[tokio::test]
    async fn other_lines_take_the_general_path_and_settle_their_ids() {
        let mut transport = transport();
        drop(transport.send(tool_call(1)));
        drop(transport.send(tool_call(2)));
        drop(transport.send(tool_call(3)));
        assert_eq!(transport.tool_calls.len(), 3);
        // Not a tools/call of ours: read by rmcp's own rules.
        let other = br#"{"jsonrpc":"2.0","id":99,"result":{"tools":[]}}"#;
        assert!(matches!(
            response(transport.interpret(other)),
            ServerResult::ListToolsResult(_)
        ));
        // An error response settles its id.
        let failed = br#"{"jsonrpc":"2.0","id":1,"error":{"code":-32602,"message":"unknown tool"}}"#;
        assert!(matches!(transport.interpret(failed), Some(JsonRpcMessage::Error(_))));
        assert!(!transport.tool_calls.contains(&RequestId::Number(1)));
        // A result and an error at once is not a response: the request is failed with its id.
        let both = br#"{"jsonrpc":"2.0","id":2,"result":{"content":[]},"error":{"code":1,"message":"x"}}"#;
        assert!(matches!(transport.interpret(both), Some(JsonRpcMessage::Error(_))));
        assert!(!transport.tool_calls.contains(&RequestId::Number(2)));
        // Cancelling a call forgets it.
        let cancelled = CancelledNotification::new(CancelledNotificationParam::new(Some(RequestId::Number(3)), None));
        drop(transport.send(JsonRpcMessage::notification(cancelled.into())));
        assert!(transport.tool_calls.is_empty());
    }
}
