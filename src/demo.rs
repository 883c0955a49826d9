//! The built-in demo MCP server (`toolnexus-gateway demo-server`): tools that elicit in form and URL mode,
//! in several steps, slowly, or by crashing, in both protocol eras.
//!
//! Every eliciting tool returns each `ElicitResult` it received, in order, as
//! `structuredContent: {"results": [...]}` and the same JSON as its text. With a journal, every tool call and
//! every result it received is also appended to a file, which outlives the process: what the upstream received,
//! for the fault-schedule runner's checker.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, CustomNotification, DiscoverResult,
    ElicitRequest, ElicitRequestParams, ElicitResult, ElicitationAction, ErrorCode, ErrorData, Implementation,
    InputRequest, InputRequiredResult, JsonObject, ListToolsResult, PaginatedRequestParams, ProgressNotificationParam,
    ProtocolVersion, ServerCapabilities, ServerConfig, ServerNotification, Tool,
};
use rmcp::model::{CancelTaskParams, CreateTaskResult, GetTaskParams, GetTaskResult, UpdateTaskParams};
use rmcp::service::RequestContext;
use rmcp::task_manager::{TaskExit, TaskManager, TaskOptions};
use rmcp::{RoleServer, ServerHandler, ServiceExt};
use serde_json::{Value, json};

/// How long `crash` lets its elicitation reach the client before the process exits.
const CRASH_DELAY: Duration = Duration::from_millis(50);

/// JSON-RPC error code of a 2025-11-25 `URLElicitationRequiredError`.
const URL_ELICITATION_REQUIRED: ErrorCode = ErrorCode(-32042);

/// The most elicitations one `flood` call raises.
const MAX_FLOOD: u64 = 200_000;
/// How many different texts `echo` counts for `echoes`; later ones are not counted.
const MAX_ECHOES_COUNTED: usize = 4096;
/// The most lines one process appends to its journal; later calls and results are not written.
const MAX_JOURNAL_LINES: u64 = 1_000_000;

/// The protocol eras the demo server speaks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Eras {
    /// 2026-07-28 as well as 2025-11-25 and earlier.
    #[default]
    All,
    /// Only 2025-11-25 and earlier, like a server that predates `server/discover`.
    LegacyOnly,
}

/// How the demo server hands out `requestState` (2026-07-28).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum StateSeal {
    /// Plain JSON, which any process of the demo accepts.
    #[default]
    None,
    /// Sealed with a key made when the process starts, as SDK servers do by default: a later process (or a
    /// tampered state) is refused with `-32602`.
    ThisProcess,
}

/// The demo server.
#[derive(Debug, Clone, Default)]
pub struct Demo {
    eras: Eras,
    /// The key `requestState` is sealed with (2026-07-28), made when the process starts; without one the
    /// state is plain JSON that any process accepts.
    state_key: Option<[u8; 32]>,
    /// Services `connect_account` has already sent to authorization (2025-11-25 only).
    connecting: Arc<Mutex<HashSet<String>>>,
    /// How many times `echo` was called with each text, for `echoes`: what this process received.
    echoed: Arc<Mutex<HashMap<String, u64>>>,
    /// Where each tool call and each result received is appended, when the server keeps a journal.
    journal: Option<Arc<Journal>>,
    /// The tasks `research` made (MCP Tasks, 2026-07-28), shared by every session of the process.
    tasks: Tasks,
}

/// The demo's tasks.
#[derive(Clone, Default)]
struct Tasks(TaskManager);

impl std::fmt::Debug for Tasks {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("Tasks")
    }
}

/// An append-only file of what the demo server received, one JSON object a line: `{"call": tool,
/// "arguments"}` for each `tools/call` (a 2026-07-28 retry included) and `{"result": tool, "arguments",
/// "round", "received"}` for each `ElicitResult`, its round counted from 0.
#[derive(Debug)]
pub struct Journal {
    /// The file and how many lines it was given; written whole lines at a time, so a crash cuts none.
    file: Mutex<(std::fs::File, u64)>,
}

impl Journal {
    /// Appends to the file at `path`, creating it when missing.
    pub fn open(path: &std::path::Path) -> std::io::Result<Self> {
        let file = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
        Ok(Self {
            file: Mutex::new((file, 0)),
        })
    }

    /// Appends one line; a write that fails is reported on stderr and otherwise ignored.
    fn append(&self, line: &Value) {
        let mut guard = self.file.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let (file, lines) = &mut *guard;
        if *lines >= MAX_JOURNAL_LINES {
            return;
        }
        *lines += 1;
        let mut text = line.to_string();
        text.push('\n');
        if let Err(error) = file.write_all(text.as_bytes()) {
            eprintln!("demo-server: cannot write the journal: {error}");
        }
    }
}

impl Demo {
    /// A demo server speaking `eras`, sealing its `requestState` as `seal` says.
    pub fn new(eras: Eras, seal: StateSeal) -> Self {
        Self {
            eras,
            state_key: (seal == StateSeal::ThisProcess).then(process_key),
            connecting: Arc::default(),
            echoed: Arc::default(),
            journal: None,
            tasks: Tasks::default(),
        }
    }

    /// The same server, appending what it receives to `journal`.
    pub fn with_journal(self, journal: Journal) -> Self {
        Self {
            journal: Some(Arc::new(journal)),
            ..self
        }
    }

    /// Appends to the journal, when there is one.
    fn note(&self, line: impl FnOnce() -> Value) {
        if let Some(journal) = &self.journal {
            journal.append(&line());
        }
    }

    /// `requestState` for the results so far: their JSON, after an HMAC of it when the state is sealed.
    fn seal(&self, results: &[Value]) -> String {
        let state = serde_json::to_string(results).unwrap_or_default();
        match &self.state_key {
            Some(key) => format!("{}.{state}", mac(key, &state)),
            None => state,
        }
    }

    /// The results a `requestState` carries; an error when a sealed state does not verify.
    fn unseal(&self, state: Option<&str>) -> Result<Vec<Value>, ErrorData> {
        let Some(state) = state else { return Ok(Vec::new()) };
        let state = match &self.state_key {
            Some(key) => match state.split_once('.') {
                Some((tag, state)) if tag == mac(key, state) => state,
                _ => {
                    return Err(ErrorData::invalid_params(
                        "Invalid or expired requestState",
                        Some(json!({"reason": "invalid_request_state"})),
                    ));
                }
            },
            None => state,
        };
        Ok(serde_json::from_str(state).unwrap_or_default())
    }
}

/// A key no other process has.
fn process_key() -> [u8; 32] {
    use sha2::Digest;
    let mut hasher = sha2::Sha256::new();
    hasher.update(uuid::Uuid::now_v7().as_bytes());
    hasher.update(std::process::id().to_le_bytes());
    hasher.update(uuid::Uuid::now_v7().as_bytes());
    hasher.finalize().into()
}

/// The hex HMAC-SHA256 of `text` under `key`.
fn mac(key: &[u8; 32], text: &str) -> String {
    use hmac::{KeyInit, Mac};
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(key).expect("HMAC takes keys of any length");
    mac.update(text.as_bytes());
    mac.finalize()
        .into_bytes()
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// Serves the demo over stdin/stdout until the client goes away.
pub async fn serve_stdio(demo: Demo) -> anyhow::Result<()> {
    match demo.serve(rmcp::transport::stdio()).await {
        Ok(running) => {
            running.waiting().await?;
            Ok(())
        }
        // A client that never sent `initialize` (one of 2026-07-28, whose requests stand alone) went away.
        Err(rmcp::service::ServerInitializeError::ConnectionClosed(_)) => Ok(()),
        Err(error) => Err(error.into()),
    }
}

/// Serves the demo over streamable HTTP at `/mcp`, printing the endpoint on stdout, until `shutdown`.
pub async fn serve_http(
    demo: Demo,
    listen: SocketAddr,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    use rmcp::transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
    };
    let service = StreamableHttpService::new(
        move || Ok(demo.clone()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    use axum::serve::ListenerExt;
    let listener = tokio::net::TcpListener::bind(listen).await?;
    println!("listening on http://{}/mcp", listener.local_addr()?);
    // Without it a response written in pieces (an event stream) waits on the client's delayed ACK: ~40 ms.
    let listener = listener.tap_io(|stream| {
        let _ = stream.set_nodelay(true);
    });
    let router = axum::Router::new().nest_service("/mcp", service);
    axum::serve(listener, router).with_graceful_shutdown(shutdown).await?;
    Ok(())
}

impl ServerHandler for Demo {
    fn get_info(&self) -> ServerConfig {
        #[allow(deprecated, reason = "`slow` logs in 2025-11-25, which has logging")]
        let capabilities = ServerCapabilities::builder()
            .enable_logging()
            .enable_tools()
            .enable_tasks()
            .build();
        ServerConfig::new(capabilities)
            .with_server_info(Implementation::new("toolnexus-demo", env!("CARGO_PKG_VERSION")))
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        if self.eras == Eras::LegacyOnly {
            Cow::Borrowed(ProtocolVersion::known_up_to(&ProtocolVersion::V_2025_11_25))
        } else {
            Cow::Borrowed(ProtocolVersion::KNOWN_VERSIONS)
        }
    }

    async fn discover(&self, _context: RequestContext<RoleServer>) -> Result<DiscoverResult, ErrorData> {
        if self.eras == Eras::LegacyOnly {
            return Err(ErrorData::new(ErrorCode::METHOD_NOT_FOUND, "server/discover", None));
        }
        Ok(DiscoverResult::from_server_info(
            self.supported_protocol_versions().into_owned(),
            self.get_info(),
        ))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(tools()))
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        self.tasks.0.get_task(&request.task_id).map(GetTaskResult::new)
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.tasks.0.update_task(&request.task_id, request.input_responses)
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.tasks.0.cancel_task(&request.task_id)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let arguments = request.arguments.clone().unwrap_or_default();
        self.note(|| json!({"call": request.name, "arguments": arguments}));
        let text = |name: &str| {
            arguments
                .get(name)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        match request.name.as_ref() {
            "echo" => {
                let echoed = text("text");
                let mut counts = self.echoed.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                if counts.len() < MAX_ECHOES_COUNTED || counts.contains_key(&echoed) {
                    *counts.entry(echoed.clone()).or_default() += 1;
                }
                Ok(CallToolResult::success(vec![ContentBlock::text(echoed)]).into())
            }
            "echoes" => {
                let counts = self.echoed.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                let count = counts.get(&text("text")).copied().unwrap_or_default();
                Ok(CallToolResult::success(vec![ContentBlock::text(count.to_string())]).into())
            }
            "flood" => {
                let count = arguments.get("count").and_then(Value::as_u64).unwrap_or(1);
                if count > MAX_FLOOD {
                    return Err(ErrorData::invalid_params(
                        format!("count must be at most {MAX_FLOOD}"),
                        None,
                    ));
                }
                if count == 0 {
                    return Ok(flood_tally(std::iter::empty()));
                }
                if context
                    .protocol_version()
                    .is_some_and(|v| v >= ProtocolVersion::V_2026_07_28)
                {
                    flood_round(count, &request)
                } else {
                    flood_at_once(count, &context).await
                }
            }
            "research" => Ok(self.research(&arguments, &context)),
            "consult" => consult(&request, &context),
            "task_status" => {
                let status = match self.tasks.0.get_task(&text("id")) {
                    Ok(task) => serde_json::to_value(task.status()).unwrap_or_default(),
                    Err(error) => Value::String(error.message.into_owned()),
                };
                Ok(CallToolResult::structured(json!({"status": status})).into())
            }
            "slow" => {
                slow(
                    arguments.get("seconds").and_then(Value::as_f64).unwrap_or(1.0),
                    &context,
                )
                .await
            }
            name => {
                let modern = context
                    .protocol_version()
                    .is_some_and(|v| v >= ProtocolVersion::V_2026_07_28);
                if name == "connect_account" && !modern {
                    return self.connect_account(&text("service"));
                }
                let steps = steps(name, &arguments)?;
                let timeout = arguments
                    .get("timeout")
                    .and_then(Value::as_f64)
                    .map(Duration::from_secs_f64);
                if name == "crash" {
                    // Its one elicitation goes out before the exit.
                    exit_soon();
                }
                if modern {
                    self.next_round(name, steps, &request)
                } else {
                    let received = |round: usize, result: &Value| {
                        self.note(
                            || json!({"result": name, "arguments": arguments, "round": round, "received": result}),
                        );
                    };
                    elicit_in_turn(name, steps, &context, timeout, received).await
                }
            }
        }
    }
}

impl Demo {
    /// `research`: a task when the client follows tasks, which asks which reading of the topic is meant (a form
    /// elicitation), works on for `seconds`, and reports; without tasks, the report at once, without asking.
    fn research(&self, arguments: &JsonObject, context: &RequestContext<RoleServer>) -> CallToolResponse {
        let topic = arguments
            .get("topic")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let follows_tasks = context.client_capabilities().is_some_and(|caps| caps.supports_tasks());
        if !follows_tasks {
            return CallToolResult::success(vec![ContentBlock::text(format!("{topic}: reported without a task"))])
                .into();
        }
        let seconds = arguments.get("seconds").and_then(Value::as_f64).unwrap_or(0.2);
        let work = Duration::from_secs_f64(seconds.clamp(0.0, 3600.0));
        let mut options = TaskOptions::new()
            .with_poll_interval_ms(100)
            .with_status_message("Gathering sources");
        if let Some(ttl) = arguments.get("ttl_ms").and_then(Value::as_u64) {
            options = options.with_ttl_ms(ttl);
        }
        let task = self.tasks.0.spawn(options, move |task| {
            Box::pin(async move {
                task.set_status_message(format!("Asking which reading of {topic:?} is meant"));
                let question: ElicitRequestParams = serde_json::from_value(json!({
                    "mode": "form",
                    "message": format!("Which reading of {topic:?} do you mean?"),
                    "requestedSchema": {"type": "object", "properties": {
                        "reading": {"type": "string", "title": "Reading", "enum": ["technical", "historical"]}
                    }, "required": ["reading"]}
                }))
                .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
                let answer = task
                    .request_input("reading", InputRequest::Elicitation(ElicitRequest::new(question)))
                    .await?;
                task.set_status_message("Synthesizing findings");
                tokio::select! {
                    () = tokio::time::sleep(work) => {}
                    () = task.cancelled() => return Err(TaskExit::Cancelled),
                }
                Ok(CallToolResult::structured(json!({"topic": topic, "results": [answer]})))
            })
        });
        CallToolResponse::Task(CreateTaskResult::new(task))
    }

    /// 2025-11-25: the first call for a service fails with `-32042` (authorize at a URL), the retry succeeds.
    fn connect_account(&self, service: &str) -> Result<CallToolResponse, ErrorData> {
        let first_time = self
            .connecting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(service.to_owned());
        if !first_time {
            return Ok(CallToolResult::success(vec![ContentBlock::text(format!("connected {service}"))]).into());
        }
        let elicitation = authorization(service, None);
        let data = json!({ "elicitations": [elicitation] });
        Err(ErrorData::new(
            URL_ELICITATION_REQUIRED,
            format!("{service} is not connected yet"),
            Some(data),
        ))
    }
}

/// A URL-mode elicitation asking to authorize a service at `url`, by default example.com's page for it.
fn authorization(service: &str, url: Option<&str>) -> Value {
    let url = match url {
        Some(url) => url.to_owned(),
        None => format!("https://example.com/authorize?service={}", percent_encoded(service)),
    };
    json!({
        "mode": "url",
        "message": format!("Authorize access to {service}"),
        "url": url,
        "elicitationId": format!("demo-{}", uuid::Uuid::now_v7().simple())
    })
}

/// `text` with every byte but the unreserved ones of RFC 3986 percent-encoded.
fn percent_encoded(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn tools() -> Vec<Tool> {
    let schema = |value: Value| -> JsonObject { value.as_object().cloned().unwrap_or_default() };
    let object = |properties: Value, required: &[&str]| {
        schema(json!({"type": "object", "properties": properties, "required": required}))
    };
    vec![
        Tool::new(
            "echo",
            "Returns the text; no elicitation.",
            object(json!({"text": {"type": "string"}}), &["text"]),
        ),
        Tool::new(
            "echoes",
            "How many times this server process has received `echo` with the text (the first 4096 texts are counted).",
            object(json!({"text": {"type": "string"}}), &["text"]),
        ),
        Tool::new(
            "confirm_action",
            "Asks to confirm an action (one form elicitation). With `timeout`, gives up after that many seconds and cancels the elicitation. With `stamp`, the prompt ends with the wall-clock time the elicitation was sent, in nanoseconds since the Unix epoch.",
            object(
                json!({"action": {"type": "string"}, "timeout": {"type": "number", "minimum": 0}, "stamp": {"type": "boolean"}}),
                &["action"],
            ),
        ),
        Tool::new(
            "collect_profile",
            "Asks for a profile with one field of every primitive kind.",
            object(json!({}), &[]),
        ),
        Tool::new(
            "authorize",
            "Asks to authorize a service at a URL (URL mode): https://example.com/authorize?service=<service>, or `url` when given, sent as it is.",
            object(
                json!({"service": {"type": "string"}, "url": {"type": "string"}}),
                &["service"],
            ),
        ),
        Tool::new(
            "connect_account",
            "Connects an account: in 2025-11-25 the first call fails with -32042 (URL elicitation required) and the retry succeeds.",
            object(json!({"service": {"type": "string"}}), &["service"]),
        ),
        Tool::new(
            "two_step",
            "Asks for a name, then for a confirmation.",
            object(json!({}), &[]),
        )
        .with_raw_output_schema(Arc::new(object(
            json!({"results": {"type": "array", "items": {"type": "object"}}}),
            &["results"],
        ))),
        Tool::new(
            "slow",
            "Sleeps, reporting progress (and in 2025-11-25 logging that it sleeps), until done or cancelled; no \
             elicitation.",
            object(json!({"seconds": {"type": "number", "minimum": 0}}), &["seconds"]),
        ),
        Tool::new(
            "flood",
            "Raises `count` form elicitations at once and returns how many were accepted, declined and cancelled.",
            object(
                json!({"count": {"type": "integer", "minimum": 0, "maximum": MAX_FLOOD}}),
                &["count"],
            ),
        ),
        Tool::new(
            "research",
            "Researches a topic. To a client that follows tasks (MCP Tasks, 2026-07-28) it is a task: it asks which reading of the topic is meant, then works `seconds` (default 0.2) and reports; `ttl_ms` sets the task's time to live. Otherwise it reports at once, without asking.",
            object(
                json!({"topic": {"type": "string"}, "seconds": {"type": "number", "minimum": 0}, "ttl_ms": {"type": "integer", "minimum": 1}}),
                &["topic"],
            ),
        ),
        Tool::new(
            "consult",
            "2026-07-28 only: asks in one round for a reply to `question` (sampling) and for the client's roots (with `roots_only`, for the roots alone), and returns what it received.",
            object(
                json!({"question": {"type": "string"}, "roots_only": {"type": "boolean"}}),
                &["question"],
            ),
        ),
        Tool::new(
            "task_status",
            "The status of one of this process's tasks, or why it has none by that id.",
            object(json!({"id": {"type": "string"}}), &["id"]),
        ),
        Tool::new(
            "crash",
            "Sends a form elicitation, then exits the process.",
            object(json!({}), &[]),
        ),
    ]
}

/// The `confirm_action` prompt; with `stamp`, it ends with ` @<ns since the Unix epoch>`, for latency measurements.
fn confirm_message(action: &str, arguments: &JsonObject) -> String {
    if arguments.get("stamp").and_then(Value::as_bool) != Some(true) {
        return format!("Confirm: {action}?");
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    format!("Confirm: {action}? @{}", now.as_nanos())
}

/// The elicitations a tool raises, in order, as `elicitation/create` params.
fn steps(tool: &str, arguments: &JsonObject) -> Result<Vec<Value>, ErrorData> {
    let text = |name: &str| {
        arguments
            .get(name)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let steps = match tool {
        "confirm_action" => vec![json!({
            "mode": "form",
            "message": confirm_message(&text("action"), arguments),
            "requestedSchema": {"type": "object", "properties": {
                "confirm": {"type": "boolean", "title": "Confirm"},
                "note": {"type": "string", "title": "Note", "default": ""}
            }, "required": ["confirm"]}
        })],
        "collect_profile" => vec![json!({
            "mode": "form",
            "message": "Tell us about yourself",
            "requestedSchema": {"type": "object", "properties": {
                "name": {"type": "string", "title": "Name", "minLength": 1},
                "email": {"type": "string", "title": "Email", "format": "email"},
                "age": {"type": "integer", "title": "Age", "minimum": 0, "maximum": 150},
                "score": {"type": "number", "title": "Score"},
                "newsletter": {"type": "boolean", "title": "Newsletter", "default": false},
                "color": {"type": "string", "title": "Favourite colour", "enum": ["red", "green", "blue"]},
                "tags": {"type": "array", "title": "Tags", "items": {"type": "string", "enum": ["a", "b", "c"]}, "maxItems": 2}
            }, "required": ["name"]}
        })],
        "authorize" => vec![authorization(
            &text("service"),
            arguments.get("url").and_then(Value::as_str),
        )],
        "connect_account" => vec![authorization(&text("service"), None)],
        "two_step" => vec![
            json!({"mode": "form", "message": "What is your name?", "requestedSchema": {"type": "object",
                "properties": {"name": {"type": "string", "title": "Name"}}, "required": ["name"]}}),
            json!({"mode": "form", "message": "Shall I go on?", "requestedSchema": {"type": "object",
                "properties": {"confirm": {"type": "boolean", "title": "Confirm"}}, "required": ["confirm"]}}),
        ],
        "crash" => vec![
            json!({"mode": "form", "message": "This server exits before you answer", "requestedSchema": {
            "type": "object", "properties": {"ok": {"type": "boolean"}}}}),
        ],
        other => return Err(ErrorData::invalid_params(format!("unknown tool {other:?}"), None)),
    };
    Ok(steps)
}

/// 2025-11-25: sends each elicitation as a request and waits for its result.
async fn elicit_in_turn(
    tool: &str,
    steps: Vec<Value>,
    context: &RequestContext<RoleServer>,
    timeout: Option<Duration>,
    journal: impl Fn(usize, &Value),
) -> Result<CallToolResponse, ErrorData> {
    let mut results = Vec::new();
    for step in steps {
        let params: ElicitRequestParams =
            serde_json::from_value(step).map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        let received = context
            .peer
            .create_elicitation_with_timeout(params.clone(), timeout)
            .await;
        let result = match received {
            Ok(result) => result,
            Err(rmcp::ServiceError::Timeout { .. }) => {
                eprintln!("demo-server: {tool} gave up waiting and cancelled its elicitation");
                return Ok(CallToolResult::error(vec![ContentBlock::text("no answer in time")]).into());
            }
            Err(error) => return Err(ErrorData::internal_error(format!("elicitation failed: {error}"), None)),
        };
        log_received(tool, &result);
        if let ElicitRequestParams::UrlElicitationParams { elicitation_id, .. } = &params
            && result.action == ElicitationAction::Accept
        {
            let complete = CustomNotification::new(
                "notifications/elicitation/complete",
                Some(json!({"elicitationId": elicitation_id})),
            );
            let _ = context
                .peer
                .send_notification(ServerNotification::CustomNotification(complete))
                .await;
        }
        let result = serde_json::to_value(result).unwrap_or_default();
        journal(results.len(), &result);
        results.push(result);
    }
    Ok(CallToolResult::structured(json!({ "results": results })).into())
}

impl Demo {
    /// 2026-07-28: returns the next elicitation as `input_required`, carrying the results so far in `requestState`.
    ///
    /// The state is sealed only with `--seal-state`: a real server must protect it (HMAC or AEAD).
    fn next_round(
        &self,
        tool: &str,
        steps: Vec<Value>,
        request: &CallToolRequestParams,
    ) -> Result<CallToolResponse, ErrorData> {
        let mut results = self.unseal(request.request_state.as_deref())?;
        let key = |round: usize| format!("step{round}");
        if let Some(result) = request
            .input_responses
            .as_ref()
            .and_then(|r| r.get(&key(results.len())))
        {
            if let Ok(parsed) = serde_json::from_value::<ElicitResult>(result.clone()) {
                log_received(tool, &parsed);
            }
            let round = results.len();
            self.note(|| json!({"result": tool, "arguments": request.arguments, "round": round, "received": result}));
            results.push(result.clone());
        }
        let Some(step) = steps.get(results.len()) else {
            return Ok(CallToolResult::structured(json!({ "results": results })).into());
        };
        let params: ElicitRequestParams =
            serde_json::from_value(step.clone()).map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        let requests = BTreeMap::from([(
            key(results.len()),
            InputRequest::Elicitation(ElicitRequest::new(params)),
        )]);
        Ok(InputRequiredResult::new(Some(requests), Some(self.seal(&results))).into())
    }
}

/// `consult` (2026-07-28): one round asking for a sampled reply to the question and for the roots; the retry
/// returns the two responses as they came.
fn consult(
    request: &CallToolRequestParams,
    context: &RequestContext<RoleServer>,
) -> Result<CallToolResponse, ErrorData> {
    if !context
        .protocol_version()
        .is_some_and(|version| version >= ProtocolVersion::V_2026_07_28)
    {
        return Err(ErrorData::invalid_request("consult speaks 2026-07-28 only", None));
    }
    if let Some(responses) = &request.input_responses {
        return Ok(CallToolResult::structured(json!({
            "reply": responses.get("reply"),
            "roots": responses.get("roots"),
        }))
        .into());
    }
    let question = request
        .arguments
        .as_ref()
        .and_then(|arguments| arguments.get("question"))
        .cloned()
        .unwrap_or_default();
    let ask = |request: Value| {
        serde_json::from_value::<InputRequest>(request).map_err(|e| ErrorData::internal_error(e.to_string(), None))
    };
    let mut requests = BTreeMap::from([
        (
            "reply".to_owned(),
            ask(json!({"method": "sampling/createMessage", "params": {
                "messages": [{"role": "user", "content": {"type": "text", "text": question}}],
                "systemPrompt": "Answer in one sentence.", "maxTokens": 100
            }}))?,
        ),
        ("roots".to_owned(), ask(json!({"method": "roots/list"}))?),
    ]);
    if request
        .arguments
        .as_ref()
        .is_some_and(|arguments| arguments.get("roots_only") == Some(&Value::Bool(true)))
    {
        requests.remove("reply");
    }
    Ok(InputRequiredResult::new(Some(requests), None).into())
}

/// The form each `flood` elicitation asks for.
fn flood_item(index: u64, count: u64) -> Result<ElicitRequestParams, ErrorData> {
    serde_json::from_value(json!({
        "mode": "form",
        "message": format!("Confirm item {index} of {count}?"),
        "requestedSchema": {"type": "object", "properties": {
            "confirm": {"type": "boolean", "title": "Confirm"},
            "note": {"type": "string", "title": "Note", "default": ""}
        }, "required": ["confirm"]}
    }))
    .map_err(|e| ErrorData::internal_error(e.to_string(), None))
}

/// `{"accepted", "declined", "cancelled"}` counts of the results a `flood` received.
fn flood_tally<'a>(actions: impl Iterator<Item = &'a Value>) -> CallToolResponse {
    let mut tally = BTreeMap::from([("accepted", 0u64), ("cancelled", 0), ("declined", 0)]);
    for action in actions {
        let key = match action.get("action").and_then(Value::as_str) {
            Some("accept") => "accepted",
            Some("decline") => "declined",
            _ => "cancelled",
        };
        *tally.entry(key).or_default() += 1;
    }
    CallToolResult::structured(json!(tally)).into()
}

/// 2025-11-25: sends every elicitation of a `flood` at once and waits for all their results.
async fn flood_at_once(count: u64, context: &RequestContext<RoleServer>) -> Result<CallToolResponse, ErrorData> {
    let mut sent = tokio::task::JoinSet::new();
    for index in 1..=count {
        let params = flood_item(index, count)?;
        let peer = context.peer.clone();
        sent.spawn(async move { peer.create_elicitation(params).await });
    }
    let mut results = Vec::with_capacity(sent.len());
    while let Some(joined) = sent.join_next().await {
        results.push(match joined {
            Ok(Ok(result)) => serde_json::to_value(result).unwrap_or_default(),
            Ok(Err(_)) | Err(_) => json!({"action": "cancel"}),
        });
    }
    Ok(flood_tally(results.iter()))
}

/// 2026-07-28: asks for every elicitation of a `flood` in one `input_required` result, then counts the responses.
fn flood_round(count: u64, request: &CallToolRequestParams) -> Result<CallToolResponse, ErrorData> {
    if let Some(responses) = &request.input_responses {
        return Ok(flood_tally(responses.values()));
    }
    let mut requests = BTreeMap::new();
    for index in 1..=count {
        let params = flood_item(index, count)?;
        requests.insert(
            format!("item{index:06}"),
            InputRequest::Elicitation(ElicitRequest::new(params)),
        );
    }
    Ok(InputRequiredResult::new(Some(requests), Some(count.to_string())).into())
}

async fn slow(seconds: f64, context: &RequestContext<RoleServer>) -> Result<CallToolResponse, ErrorData> {
    let total = Duration::from_secs_f64(seconds.clamp(0.0, 3600.0));
    let ticks = 10u32;
    let token = context.meta.get_progress_token();
    if context
        .protocol_version()
        .is_some_and(|version| version < ProtocolVersion::V_2026_07_28)
    {
        #[allow(deprecated, reason = "2025-11-25 has logging")]
        let _ = context
            .peer
            .notify_logging_message(rmcp::model::LoggingMessageNotificationParam::new(
                rmcp::model::LoggingLevel::Info,
                json!(format!("sleeping {seconds} seconds")),
            ))
            .await;
    }
    eprintln!("demo-server: slow sleeps {seconds} seconds");
    for tick in 1..=ticks {
        tokio::select! {
            () = tokio::time::sleep(total / ticks) => {}
            () = context.ct.cancelled() => {
                eprintln!("demo-server: slow was cancelled");
                return Err(ErrorData::internal_error("cancelled by the client", None));
            }
        }
        if let Some(token) = &token {
            let mut progress = ProgressNotificationParam::new(token.clone(), f64::from(tick));
            progress.total = Some(f64::from(ticks));
            let _ = context.peer.notify_progress(progress).await;
        }
    }
    Ok(CallToolResult::success(vec![ContentBlock::text(format!("slept {seconds} seconds"))]).into())
}

fn exit_soon() {
    tokio::spawn(async {
        tokio::time::sleep(CRASH_DELAY).await;
        eprintln!("demo-server: crash: exiting");
        std::process::exit(3);
    });
}

/// Logs the action of a result and the keys of its content, never its values: they are the human's answer.
fn log_received(tool: &str, result: &ElicitResult) {
    let action = serde_json::to_value(&result.action).unwrap_or_default();
    let action = action.as_str().unwrap_or("an unknown action");
    match result.content.as_ref().and_then(Value::as_object) {
        Some(content) => {
            let keys: Vec<&str> = content.keys().map(String::as_str).collect();
            eprintln!("demo-server: {tool} received {action} with keys [{}]", keys.join(", "));
        }
        None => eprintln!("demo-server: {tool} received {action}"),
    }
}
