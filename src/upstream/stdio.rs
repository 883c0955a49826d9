//! The transport of a stdio server: newline-delimited JSON-RPC over its child process's pipes, with bounded
//! messages, and messages rmcp cannot read answered or failed by their id instead of dropped. The upstream's
//! `elicitation/create` requests are answered here, through the session's Requests.

use std::collections::{HashMap, HashSet};
use std::io;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use rmcp::RoleClient;
use rmcp::model::{
    CallToolRequest, CallToolRequestMethod, ClientNotification, ClientRequest, CustomRequest, CustomResult,
    JsonRpcMessage, JsonRpcRequest, JsonRpcResponse, JsonRpcVersion2_0, MetaObject, RequestId, RequestMetaObject,
    ServerRequest, ServerResult,
};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout};
use tokio::sync::{Mutex, oneshot};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::client::{ELICITATION_CREATE, SessionCore};

/// The largest message an upstream may send; a longer line ends its session (the same bound rmcp puts on HTTP).
pub const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;
/// How long a closing server gets after its stdin closes, and again after `SIGTERM`, before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(3);
/// The session detail when the upstream's stdout ends.
pub const ENDED: &str = "the upstream ended the session (its process exited or its connection closed)";
/// The MCP method by which either side cancels a request it sent.
const CANCELLED: &str = "notifications/cancelled";
/// The `data` of an error the gateway puts in place of an upstream response it cannot read.
pub const UNREADABLE: &str = "unreadable-response";

/// A child process spoken to over its stdin and stdout.
pub struct ChildTransport {
    server: String,
    child: Child,
    stdout: BufReader<ChildStdout>,
    /// The line being read; it survives a cancelled `receive`, which rmcp polls inside a `select!`.
    line: Vec<u8>,
    stdin: Arc<Mutex<Option<ChildStdin>>>,
    /// Fires with the reason once the stream ends.
    ended: Option<oneshot::Sender<String>>,
    /// The `tools/call` requests sent and not yet answered or cancelled. Their responses are read straight
    /// as the two results a `tools/call` can have, instead of being tried against every result type.
    tool_calls: HashSet<RequestId>,
    /// The session whose Requests answer the upstream's `elicitation/create` requests; without one they go to rmcp.
    session: Option<Arc<SessionCore>>,
    /// Elicitations waiting on their Request, by JSON-RPC id, each with the token fired if the upstream cancels it.
    elicitations: HashMap<RequestId, CancellationToken>,
    /// Their waits, each ending with its response written; aborted when the transport goes.
    waits: JoinSet<RequestId>,
}

/// How reading one line ended.
enum Line {
    Whole,
    Oversized,
    Eof,
    Failed(io::Error),
}

impl ChildTransport {
    /// Starts a server in its own process group (a Ctrl-C at the terminal reaches only the gateway, which
    /// then shuts it down in order), its stderr logged line by line under its name.
    pub fn spawn(
        server: &str,
        program: &Path,
        args: &[String],
        env: &std::collections::BTreeMap<String, String>,
        ended: oneshot::Sender<String>,
    ) -> io::Result<Self> {
        let mut child = tokio::process::Command::new(program)
            .args(args)
            .envs(env)
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let stdin = child.stdin.take().ok_or_else(|| io::Error::other("no stdin pipe"))?;
        let stdout = child.stdout.take().ok_or_else(|| io::Error::other("no stdout pipe"))?;
        let stderr = child.stderr.take().ok_or_else(|| io::Error::other("no stderr pipe"))?;
        super::stderr::follow(server, stderr);
        Ok(Self {
            server: server.to_owned(),
            child,
            stdout: BufReader::new(stdout),
            line: Vec::new(),
            stdin: Arc::new(Mutex::new(Some(stdin))),
            ended: Some(ended),
            tool_calls: HashSet::new(),
            session: None,
            elicitations: HashMap::new(),
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
        let withdrawn = CancellationToken::new();
        let waiting = session.elicit(id.clone(), params, None, withdrawn.clone());
        self.elicitations.insert(id.clone(), withdrawn);
        let stdin = self.stdin.clone();
        self.waits.spawn(async move {
            let response = match waiting.await {
                Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
                Err(error) => json!({"jsonrpc": "2.0", "id": id, "error": error}),
            };
            let _ = write(stdin, line_of(&response)).await;
            id
        });
    }

    /// Forgets the elicitations whose response has been written.
    fn reap(&mut self) {
        while let Some(done) = self.waits.try_join_next() {
            if let Ok(id) = done {
                self.elicitations.remove(&id);
            }
        }
    }

    /// Fires the token of an elicitation the upstream cancels; the notification still goes on to rmcp.
    fn cancelled(&mut self, line: &[u8]) {
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
        if self.elicitations.is_empty() || !contains(line, CANCELLED) {
            return;
        }
        if let Ok(notification) = serde_json::from_slice::<Notification>(line)
            && notification.method == CANCELLED
            && let Some(withdrawn) = self.elicitations.remove(&notification.params.request_id)
        {
            withdrawn.cancel();
        }
    }

    /// Reads into `self.line` up to a newline without letting it grow past `MAX_MESSAGE_BYTES`; cancel-safe.
    async fn read_line(&mut self) -> Line {
        loop {
            let available = match self.stdout.fill_buf().await {
                Ok([]) => return Line::Eof,
                Ok(available) => available,
                Err(error) => return Line::Failed(error),
            };
            let newline = available.iter().position(|byte| *byte == b'\n');
            let take = newline.map_or(available.len(), |index| index + 1);
            if self.line.len() + take > MAX_MESSAGE_BYTES + 1 {
                return Line::Oversized;
            }
            self.line.extend_from_slice(&available[..take]);
            self.stdout.consume(take);
            if newline.is_some() {
                return Line::Whole;
            }
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
                tokio::spawn(write(self.stdin.clone(), line_of(&reply)));
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

/// A `tools/call` request as rmcp would write it, params `_meta` included, without rmcp's generic request
/// serializer: to merge the `_meta` it turns the params into a JSON tree first, the arguments and any
/// `inputResponses` copied along (a tenth of the gateway's instructions per call). For params without `_meta`
/// of their own; the request's comes from its extensions, the typed one over the legacy one, as in rmcp.
fn tool_call_line(id: &RequestId, call: &CallToolRequest) -> serde_json::Result<Vec<u8>> {
    #[derive(Serialize)]
    struct Head<'a> {
        jsonrpc: JsonRpcVersion2_0,
        id: &'a RequestId,
        method: &'a CallToolRequestMethod,
    }
    let typed = call.extensions.get::<RequestMetaObject>().map(|meta| &meta.0.0);
    let legacy = call.extensions.get::<MetaObject>().map(|meta| &meta.0);
    let merged;
    let meta = match (typed, legacy) {
        (Some(typed), Some(legacy)) => {
            let mut both = legacy.clone();
            both.extend(typed.iter().map(|(key, value)| (key.clone(), value.clone())));
            merged = both;
            Some(&merged)
        }
        (typed, legacy) => typed.or(legacy),
    };
    let mut line = serde_json::to_vec(&Head {
        jsonrpc: JsonRpcVersion2_0,
        id,
        method: &call.method,
    })?;
    line.pop();
    line.extend_from_slice(b",\"params\":");
    let params = serde_json::to_vec(&call.params)?;
    match (meta, params.split_first()) {
        (Some(meta), Some((b'{', rest))) => {
            line.extend_from_slice(b"{\"_meta\":");
            serde_json::to_writer(&mut line, meta)?;
            if rest != b"}" {
                line.push(b',');
            }
            line.extend_from_slice(rest);
        }
        _ => line.extend_from_slice(&params),
    }
    line.push(b'}');
    Ok(line)
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
        let line = match &message {
            JsonRpcMessage::Request(JsonRpcRequest {
                id,
                request: ClientRequest::CallToolRequest(call),
                ..
            }) if call.params.meta.is_none() => tool_call_line(id, call),
            _ => serde_json::to_vec(&message),
        }
        .map(|mut line| {
            line.push(b'\n');
            line
        });
        let stdin = self.stdin.clone();
        async move { write(stdin, line?).await }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        loop {
            match self.read_line().await {
                Line::Whole => {}
                Line::Oversized => {
                    return self.end(format!(
                        "the upstream sent a message larger than {} MiB, so the gateway ended the session",
                        MAX_MESSAGE_BYTES >> 20
                    ));
                }
                Line::Eof => return self.end(ENDED.to_owned()),
                Line::Failed(error) => return self.end(format!("reading from the upstream failed: {error}")),
            }
            self.reap();
            let line = std::mem::take(&mut self.line);
            if let Some(message) = self.interpret(&line) {
                return Some(message);
            }
        }
    }

    /// Closes stdin and waits for the process to exit, then sends its group `SIGTERM`, then kills it.
    async fn close(&mut self) -> Result<(), Self::Error> {
        drop(self.stdin.lock().await.take());
        if tokio::time::timeout(EXIT_GRACE, self.child.wait()).await.is_ok() {
            return Ok(());
        }
        self.signal_group(Signal::SIGTERM);
        if tokio::time::timeout(EXIT_GRACE, self.child.wait()).await.is_ok() {
            return Ok(());
        }
        self.signal_group(Signal::SIGKILL);
        self.child.wait().await.map(|_| ())
    }
}

impl ChildTransport {
    /// Signals the child's process group while the child has not been reaped (after that its id may be reused).
    fn signal_group(&mut self, signal: Signal) {
        if let (Ok(None), Some(id)) = (self.child.try_wait(), self.child.id())
            && let Ok(id) = i32::try_from(id)
        {
            let _ = killpg(Pid::from_raw(id), signal);
        }
    }
}

impl Drop for ChildTransport {
    fn drop(&mut self) {
        // `kill_on_drop` then kills and reaps the child itself.
        self.signal_group(Signal::SIGKILL);
    }
}

fn line_of(message: &Value) -> Vec<u8> {
    let mut line = serde_json::to_vec(message).unwrap_or_default();
    line.push(b'\n');
    line
}

async fn write(stdin: Arc<Mutex<Option<ChildStdin>>>, line: Vec<u8>) -> io::Result<()> {
    let mut stdin = stdin.lock().await;
    let pipe = stdin
        .as_mut()
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotConnected, "the upstream's stdin is closed"))?;
    pipe.write_all(&line).await?;
    pipe.flush().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::{CallToolRequest, CallToolRequestParams, CancelledNotification, CancelledNotificationParam};

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

    #[test]
    fn tool_calls_are_written_as_rmcp_writes_them() {
        let object = |value: Value| value.as_object().cloned().unwrap();
        let mut retry = CallToolRequestParams::new("confirm_action")
            .with_arguments(object(json!({"action": "deploy", "n": [1, {"deep": null}]})))
            .with_input_responses([("k".to_owned(), json!({"action": "accept", "content": {"ok": true}}))].into());
        retry.request_state = Some("st\"ate".to_owned());
        let typed = RequestMetaObject(MetaObject(object(
            json!({"progressToken": 3, "io.modelcontextprotocol/protocolVersion": "2026-07-28"}),
        )));
        let legacy = MetaObject(object(json!({"progressToken": 1, "trace": "t"})));
        let cases = [
            (CallToolRequestParams::new("echo"), None, None),
            (retry.clone(), Some(typed.clone()), None),
            (retry.clone(), None, Some(legacy.clone())),
            (retry, Some(typed), Some(legacy)),
        ];
        for (params, typed, legacy) in cases {
            let mut request = CallToolRequest::new(params);
            if let Some(meta) = typed {
                request.extensions.insert(meta);
            }
            if let Some(meta) = legacy {
                request.extensions.insert(meta);
            }
            let id = RequestId::Number(42);
            let ours: Value = serde_json::from_slice(&tool_call_line(&id, &request).unwrap()).unwrap();
            let message: TxJsonRpcMessage<RoleClient> =
                JsonRpcMessage::request(ClientRequest::CallToolRequest(request), id);
            assert_eq!(ours, serde_json::to_value(&message).unwrap());
        }
    }

    #[tokio::test]
    async fn an_upstream_cancellation_fires_its_elicitations_token() {
        let mut transport = transport();
        let (first, second) = (CancellationToken::new(), CancellationToken::new());
        transport.elicitations.insert(RequestId::Number(1), first.clone());
        transport
            .elicitations
            .insert(RequestId::String("two".into()), second.clone());
        let cancel = |id: &str| {
            format!(
                r#"{{"jsonrpc":"2.0","method":"notifications/cancelled","params":{{"requestId":{id},"reason":"x"}}}}"#
            )
        };
        // Not ours: nothing fires, and the notification still goes on to rmcp.
        let unknown = cancel("7");
        assert!(transport.interpret(unknown.as_bytes()).is_some());
        assert!(!first.is_cancelled() && !second.is_cancelled());
        transport.interpret(cancel("\"two\"").as_bytes());
        assert!(second.is_cancelled() && !first.is_cancelled());
        assert_eq!(transport.elicitations.len(), 1);
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
