//! The MCP front door: real rmcp clients at `/mcp`, in both protocol eras, whose calls raise Requests that are
//! answered over REST.

use std::sync::{Arc, Mutex};

use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams,
    CancelledNotificationParam, ClientCapabilities, ClientConfig, ClientRequest, DetailedTask, ElicitRequestParams,
    ElicitResult, ElicitationAction, ElicitationCapability, ErrorData, FormElicitationCapability, GetTaskParams,
    Implementation, ProgressNotificationParam, ProtocolVersion, ServerNotification, SubscriptionFilter, TaskPayload,
    TaskStatus, UpdateTaskParams,
};
use rmcp::service::{NotificationContext, PeerRequestOptions, RequestContext, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientHandler, ClientLifecycleMode, ClientServiceExt, RoleClient, ServiceExt};
use serde_json::{Value, json};
use tokio::sync::Notify;

use crate::helpers::{BOTH_ERAS, TestApp, children, signal, spawn_app, spawn_process, start_with, token_entry};

/// The eras a front-door client may speak.
pub(crate) const CLIENT_ERAS: [ProtocolVersion; 2] = [ProtocolVersion::V_2025_11_25, ProtocolVersion::V_2026_07_28];

/// An MCP client that keeps the progress notifications it gets.
#[derive(Clone, Default)]
struct Agent {
    progress: Arc<Mutex<Vec<ProgressNotificationParam>>>,
    /// Signalled at each progress notification.
    progressed: Arc<Notify>,
    /// Signalled at each `notifications/tools/list_changed`.
    tools_changed: Arc<Notify>,
    /// The `data` of each log message.
    logs: Arc<Mutex<Vec<Value>>>,
}

impl ClientHandler for Agent {
    async fn on_progress(&self, params: ProgressNotificationParam, _context: NotificationContext<RoleClient>) {
        self.progress.lock().unwrap().push(params);
        self.progressed.notify_one();
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.tools_changed.notify_one();
    }

    #[allow(deprecated, reason = "2025-11-25 has logging")]
    async fn on_logging_message(
        &self,
        params: rmcp::model::LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.logs.lock().unwrap().push(params.data);
    }
}

type Client = RunningService<RoleClient, Agent>;

/// An MCP client that declares form-mode elicitation and accepts every form it is shown.
#[derive(Clone, Default)]
pub(crate) struct Confirming {
    /// The message of each form it was shown.
    pub(crate) asked: Arc<Mutex<Vec<String>>>,
}

impl ClientHandler for Confirming {
    fn get_info(&self) -> ClientConfig {
        let mut capabilities = ClientCapabilities::default();
        capabilities.elicitation = Some(ElicitationCapability::new().with_form(FormElicitationCapability::new()));
        ClientConfig::new(capabilities, Implementation::new("confirming", "1"))
    }

    async fn create_elicitation(
        &self,
        params: ElicitRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        let asked = serde_json::to_value(&params).unwrap()["message"]
            .as_str()
            .unwrap()
            .to_owned();
        self.asked.lock().unwrap().push(asked);
        Ok(ElicitResult::new(ElicitationAction::Accept)
            .with_content(json!({"confirm": true, "note": "from the client"})))
    }
}

/// An MCP client that declares form-mode elicitation and never answers what it is shown.
#[derive(Clone, Default)]
struct Hesitant {
    /// Signalled when it is asked something.
    asked: Arc<Notify>,
    /// The reasons of the `notifications/cancelled` it got.
    withdrawn: Arc<Mutex<Vec<Option<String>>>>,
    /// Signalled at each `notifications/cancelled`.
    told: Arc<Notify>,
}

impl ClientHandler for Hesitant {
    fn get_info(&self) -> ClientConfig {
        let mut capabilities = ClientCapabilities::default();
        capabilities.elicitation = Some(ElicitationCapability::new().with_form(FormElicitationCapability::new()));
        ClientConfig::new(capabilities, Implementation::new("hesitant", "1"))
    }

    async fn create_elicitation(
        &self,
        _params: ElicitRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        self.asked.notify_one();
        context.ct.cancelled().await;
        Err(ErrorData::internal_error("withdrawn", None))
    }

    async fn on_cancelled(&self, params: CancelledNotificationParam, _context: NotificationContext<RoleClient>) {
        self.withdrawn.lock().unwrap().push(params.reason);
        self.told.notify_one();
    }
}

/// An MCP client that declares the tasks extension and, with `elicits`, form-mode elicitation.
#[derive(Clone, Default)]
pub(crate) struct Tasking {
    pub(crate) elicits: bool,
}

impl ClientHandler for Tasking {
    fn get_info(&self) -> ClientConfig {
        let mut capabilities = ClientCapabilities::builder().enable_tasks().build();
        if self.elicits {
            capabilities.elicitation = Some(ElicitationCapability::new().with_form(FormElicitationCapability::new()));
        }
        ClientConfig::new(capabilities, Implementation::new("tasking", "1"))
    }
}

/// The task a `tools/call` of a client of the tasks extension starts.
async fn start_task(client: &RunningService<RoleClient, Tasking>, action: &str) -> String {
    let started = client
        .peer()
        .call_tool_once(params("modern__confirm_action", json!({"action": action})))
        .await
        .unwrap();
    let CallToolResponse::Task(created) = started else {
        panic!("not a task: {started:?}")
    };
    assert_eq!(created.task.status, TaskStatus::Working);
    created.task.task_id
}

async fn task_of(client: &RunningService<RoleClient, Tasking>, id: &str) -> DetailedTask {
    client.peer().get_task(GetTaskParams::new(id)).await.unwrap().task
}

/// An MCP client of the gateway's `/mcp` in the era given, sending `token` when there is one.
async fn connect(app: &TestApp, era: &ProtocolVersion, token: Option<&str>) -> Client {
    connect_as(app, era, token, Agent::default()).await
}

/// Like `connect`, with the client's handler given.
pub(crate) async fn connect_as<H: ClientHandler>(
    app: &TestApp,
    era: &ProtocolVersion,
    token: Option<&str>,
    agent: H,
) -> RunningService<RoleClient, H> {
    let mut config = StreamableHttpClientTransportConfig::with_uri(format!("{}/mcp", app.address));
    if let Some(token) = token {
        config = config.auth_header(token);
    }
    let transport = StreamableHttpClientTransport::with_client(reqwest::Client::new(), config);
    if *era >= ProtocolVersion::V_2026_07_28 {
        let lifecycle = ClientLifecycleMode::Discover {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
        };
        agent.serve_with_lifecycle(transport, lifecycle).await.unwrap()
    } else {
        agent.serve(transport).await.unwrap()
    }
}

pub(crate) fn params(name: &str, arguments: Value) -> CallToolRequestParams {
    let mut params = CallToolRequestParams::new(name.to_owned());
    params.arguments = arguments.as_object().cloned();
    params
}

async fn call(client: &Client, name: &str, arguments: Value) -> CallToolResult {
    client.call_tool(params(name, arguments)).await.unwrap()
}

pub(crate) async fn call_as<H: ClientHandler>(
    client: &RunningService<RoleClient, H>,
    name: &str,
    arguments: Value,
) -> CallToolResult {
    client.call_tool(params(name, arguments)).await.unwrap()
}

pub(crate) fn text(result: &CallToolResult) -> String {
    result
        .content
        .iter()
        .filter_map(|block| block.as_text().map(|text| text.text.clone()))
        .collect()
}

/// The call a waiting result names, from its `_meta`.
pub(crate) fn waiting_call(result: &CallToolResult) -> Value {
    let meta = result.meta.as_ref().expect("a waiting result carries _meta");
    meta.0["io.toolnexus/call"].clone()
}

/// The pending Request of a call, once it has one.
async fn pending_request_of(app: &TestApp) -> Value {
    let listed = app.get_json("/requests?status=pending&wait=30").await;
    listed[0].clone()
}

#[tokio::test]
async fn tools_of_every_server_are_listed_prefixed_with_the_gateways_own() {
    let app = spawn_app(BOTH_ERAS).await;
    for era in CLIENT_ERAS {
        let client = connect(&app, &era, None).await;
        let tools = client.list_all_tools().await.unwrap();
        let names: Vec<&str> = tools.iter().map(|tool| tool.name.as_ref()).collect();
        for expected in [
            "legacy__echo",
            "modern__echo",
            "modern__confirm_action",
            "gateway__await_call",
        ] {
            assert!(names.contains(&expected), "{era:?}: {expected} not in {names:?}");
        }
        let echo = tools.iter().find(|tool| tool.name == "modern__echo").unwrap();
        assert!(echo.description.is_some() && echo.input_schema.contains_key("properties"));
        let result = call(&client, "legacy__echo", json!({"text": "through the door"})).await;
        assert_eq!(text(&result), "through the door", "{era:?}");
        client.cancel().await.unwrap();
    }
}

#[tokio::test]
async fn clients_are_told_when_the_tools_offered_change_in_both_eras() {
    let app = spawn_process("", "[[servers]]\nname = \"demo\"\nbuiltin = \"demo\"\n", "").await;
    let legacy = connect(&app, &ProtocolVersion::V_2025_11_25, None).await;
    let modern = connect(&app, &ProtocolVersion::V_2026_07_28, None).await;
    let filter = SubscriptionFilter::builder().tools_list_changed().build();
    let mut subscription = modern.peer().listen(filter).await.unwrap();
    assert_eq!(subscription.acknowledged().tools_list_changed, Some(true));
    // The demo server dies: its shared session ends and the gateway opens another.
    for child in children(app.pid()) {
        signal(child, "KILL");
    }
    legacy.service().tools_changed.notified().await;
    let told = subscription.next().await.unwrap();
    assert!(
        matches!(told, Some(ServerNotification::ToolListChangedNotification(_))),
        "{told:?}"
    );
    assert_eq!(app.get("/readyz?wait=30").await.status(), 200);
    let tools = legacy.list_all_tools().await.unwrap();
    assert!(tools.iter().any(|tool| tool.name == "demo__echo"));
}

#[tokio::test]
async fn long_names_are_shortened_to_what_llm_apis_accept_and_still_lead_to_their_tool() {
    let server = "a-server-whose-name-is-long-enough-to-push-its-tools-past.sixty-four";
    let app = spawn_app(&format!("[[servers]]\nname = \"{server}\"\nbuiltin = \"demo\"\n")).await;
    let client = connect(&app, &ProtocolVersion::V_2026_07_28, None).await;
    let tools = client.list_all_tools().await.unwrap();
    let fits = |name: &str| {
        (1..=64).contains(&name.len()) && name.chars().all(|c| c.is_ascii_alphanumeric() || "_-".contains(c))
    };
    assert!(tools.iter().all(|tool| fits(&tool.name)), "{tools:?}");
    let echo = tools
        .iter()
        .find(|tool| {
            tool.description
                .as_deref()
                .is_some_and(|description| description.starts_with("Returns"))
        })
        .map(|tool| tool.name.to_string())
        .unwrap();
    assert_eq!(echo.len(), 64);
    assert!(echo.starts_with(&server.replace('.', "_")[..55]), "{echo}");
    assert_eq!(
        text(&call(&client, &echo, json!({"text": "short enough"})).await),
        "short enough"
    );
}

#[test]
fn servers_whose_tools_would_get_the_same_names_are_a_start_up_error_naming_both() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    let servers = "[[servers]]\nname = \"files.v2\"\nbuiltin = \"demo\"\n\n[[servers]]\nname = \"files_v2\"\nbuiltin = \"demo\"\n";
    std::fs::write(
        &path,
        format!("listen = \"127.0.0.1:0\"\n{servers}[store]\nurl = \"memory\"\n"),
    )
    .unwrap();
    let output = std::process::Command::new(crate::helpers::BINARY)
        .arg("--config")
        .arg(&path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("\"files.v2\"") && stderr.contains("\"files_v2\"") && stderr.contains("/mcp"),
        "{stderr}"
    );
}

#[tokio::test]
async fn a_call_that_elicits_waits_for_its_request_to_be_answered_over_rest_in_both_eras() {
    let app = spawn_app(BOTH_ERAS).await;
    for (era, server) in CLIENT_ERAS.iter().zip(["modern", "legacy"]) {
        let client = connect(&app, era, None).await;
        let name = format!("{server}__confirm_action");
        let waiting = tokio::spawn({
            let peer = client.peer().clone();
            async move {
                peer.call_tool(params(&name, json!({"action": "deploy"})))
                    .await
                    .unwrap()
            }
        });
        let request = pending_request_of(&app).await;
        let calls = app.get_json(&format!("/calls?server={server}")).await;
        let call = calls.as_array().unwrap().last().unwrap();
        assert_eq!(call["via"], "mcp");
        assert_eq!(call["status"], "input_required");
        assert_eq!(request["call"], call["id"]);
        app.answer_ok(
            request["id"].as_str().unwrap(),
            json!({"ok": true, "data": {"confirm": true, "note": "go"}}),
        )
        .await;
        let result = waiting.await.unwrap();
        assert_eq!(
            result.structured_content.unwrap()["results"],
            json!([{"action": "accept", "content": {"confirm": true, "note": "go"}}]),
            "{era:?} client, {server} upstream"
        );
        client.cancel().await.unwrap();
    }
}

#[tokio::test]
async fn a_declined_request_reaches_the_tool_as_decline() {
    let app = spawn_app(BOTH_ERAS).await;
    let client = connect(&app, &ProtocolVersion::V_2025_11_25, None).await;
    let waiting = tokio::spawn({
        let peer = client.peer().clone();
        async move {
            peer.call_tool(params("modern__confirm_action", json!({"action": "drop"})))
                .await
                .unwrap()
        }
    });
    let request = pending_request_of(&app).await;
    app.answer_ok(
        request["id"].as_str().unwrap(),
        json!({"ok": false, "reason": "declined"}),
    )
    .await;
    let result = waiting.await.unwrap();
    assert_eq!(
        result.structured_content.unwrap()["results"],
        json!([{"action": "decline"}])
    );
}

#[tokio::test]
async fn a_waiting_call_of_a_tool_with_an_output_schema_is_told_as_an_error_result() {
    let app = spawn_front_door(BOTH_ERAS, "[front_door]\nmax_hold = \"1s\"\n").await;
    let client = connect(&app, &ProtocolVersion::V_2026_07_28, None).await;
    let tools = client.list_all_tools().await.unwrap();
    let two_step = tools.iter().find(|tool| tool.name == "modern__two_step").unwrap();
    assert!(two_step.output_schema.is_some(), "{two_step:?}");
    // A success without the structuredContent its schema promises is one clients refuse.
    let held = call(&client, "modern__two_step", json!({})).await;
    assert_eq!(
        (held.is_error, held.structured_content.is_none()),
        (Some(true), true),
        "{held:?}"
    );
    let waiting = waiting_call(&held);
    assert_eq!(waiting["status"], "input_required");
    assert!(text(&held).contains("gateway__await_call"), "{held:?}");
    let id = waiting["id"].as_str().unwrap();
    assert_eq!(app.delete(&format!("/calls/{id}")).await.status(), 200);
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn past_max_hold_the_client_is_told_to_await_the_call_and_awaiting_gets_its_result() {
    let app = spawn_front_door(BOTH_ERAS, "[front_door]\nmax_hold = \"1s\"\n").await;
    for era in CLIENT_ERAS {
        let client = connect(&app, &era, None).await;
        let held = call(&client, "modern__confirm_action", json!({"action": "later"})).await;
        assert_ne!(held.is_error, Some(true), "waiting is not an error: {held:?}");
        let waiting = waiting_call(&held);
        let id = waiting["id"].as_str().unwrap().to_owned();
        assert_eq!(waiting["status"], "input_required");
        let request = waiting["requests"][0].as_str().unwrap().to_owned();
        let message = text(&held);
        for needed in [id.as_str(), request.as_str(), "gateway__await_call", "/ui"] {
            assert!(message.contains(needed), "{needed} not in {message}");
        }
        let again = call(&client, "gateway__await_call", json!({"call": id})).await;
        assert_eq!(waiting_call(&again)["id"], id.as_str(), "still waiting: the same call");
        app.answer_ok(&request, json!({"ok": true, "data": {"confirm": true}}))
            .await;
        let done = call(&client, "gateway__await_call", json!({"call": id})).await;
        assert_eq!(
            done.structured_content.unwrap()["results"],
            json!([{"action": "accept", "content": {"confirm": true, "note": ""}}]),
            "{era:?}"
        );
        let calls = app.get_json("/calls").await;
        assert_eq!(
            calls
                .as_array()
                .unwrap()
                .iter()
                .filter(|call| call["id"] == id.as_str())
                .count(),
            1,
            "awaiting started no second call"
        );
        client.cancel().await.unwrap();
    }
}

#[tokio::test]
async fn a_call_through_the_door_waits_for_its_approval_given_over_rest_and_declined_never_runs() {
    let policy = "[[approvals]]\nserver = \"modern\"\ntools = [\"echo\"]\n";
    let app = spawn_front_door(&format!("{BOTH_ERAS}{policy}"), "[front_door]\nmax_hold = \"1s\"\n").await;
    let client = connect(&app, &ProtocolVersion::V_2026_07_28, None).await;
    let held = call(&client, "modern__echo", json!({"text": "approved"})).await;
    let waiting = waiting_call(&held);
    assert_eq!(waiting["status"], "input_required", "{waiting}");
    let approval = pending_request_of(&app).await;
    assert_eq!(approval["kind"], "approval");
    assert_eq!(approval["call"], waiting["id"]);
    assert_eq!(approval["data"]["call"]["arguments"], json!({"text": "approved"}));
    app.answer_ok(approval["id"].as_str().unwrap(), json!({"ok": true}))
        .await;
    let done = call(&client, "gateway__await_call", json!({"call": waiting["id"]})).await;
    assert_eq!(text(&done), "approved");

    // Declined, the call fails and the upstream never hears of it.
    let refused = waiting_call(&call(&client, "modern__echo", json!({"text": "refused"})).await);
    let approval = pending_request_of(&app).await;
    assert_eq!(approval["call"], refused["id"]);
    app.answer_ok(approval["id"].as_str().unwrap(), json!({"ok": false}))
        .await;
    let failed = call(&client, "gateway__await_call", json!({"call": refused["id"]})).await;
    assert_eq!(failed.is_error, Some(true), "{failed:?}");
    assert!(text(&failed).contains("declined"), "{failed:?}");
    let ended = app
        .get_json(&format!("/calls/{}", refused["id"].as_str().unwrap()))
        .await;
    assert_eq!(ended["error"]["reason"], "declined", "{ended}");
    assert_eq!(ended["requests"], json!([approval["id"]]), "it never ran: {ended}");
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn a_held_call_reports_progress_while_a_human_is_awaited() {
    let app = spawn_front_door(BOTH_ERAS, "[front_door]\nmax_hold = \"40s\"\n").await;
    let client = connect(&app, &ProtocolVersion::V_2025_11_25, None).await;
    let agent = client.service().clone();
    let waiting = tokio::spawn({
        let peer = client.peer().clone();
        async move {
            peer.call_tool(params("modern__confirm_action", json!({"action": "slowly"})))
                .await
                .unwrap()
        }
    });
    let request = pending_request_of(&app).await;
    // Answered only after the first heartbeat, which comes 15 s into the hold.
    agent.progressed.notified().await;
    app.answer_ok(
        request["id"].as_str().unwrap(),
        json!({"ok": true, "data": {"confirm": true}}),
    )
    .await;
    let result = waiting.await.unwrap();
    assert!(result.structured_content.is_some());
    let progress = agent.progress.lock().unwrap().clone();
    assert!(progress[0].message.as_deref().unwrap().contains("waiting for a human"));
    assert!(progress.windows(2).all(|pair| pair[0].progress < pair[1].progress));
}

#[tokio::test]
#[allow(deprecated, reason = "2025-11-25 has logging")]
async fn the_upstreams_log_messages_reach_a_2025_11_25_client() {
    let app = spawn_app(BOTH_ERAS).await;
    let client = connect(&app, &ProtocolVersion::V_2025_11_25, None).await;
    let agent = client.service().clone();
    let level = rmcp::model::SetLevelRequestParams::new(rmcp::model::LoggingLevel::Debug);
    client.peer().set_level(level).await.unwrap();
    let result = call(&client, "legacy__slow", json!({"seconds": 0.2})).await;
    assert_eq!(text(&result), "slept 0.2 seconds");
    assert_eq!(*agent.logs.lock().unwrap(), [json!("sleeping 0.2 seconds")]);
}

#[tokio::test]
async fn the_upstreams_progress_reaches_the_client_numbered_by_the_gateway() {
    let app = spawn_app(BOTH_ERAS).await;
    for (era, server) in CLIENT_ERAS.iter().zip(["legacy", "modern"]) {
        let client = connect(&app, era, None).await;
        let agent = client.service().clone();
        let result = call(&client, &format!("{server}__slow"), json!({"seconds": 0.5})).await;
        assert_eq!(text(&result), "slept 0.5 seconds");
        let progress = agent.progress.lock().unwrap().clone();
        assert!(
            progress
                .iter()
                .any(|report| report.message.as_deref() == Some("progress 1 of 10")),
            "{era:?} client, {server} upstream: {progress:?}"
        );
        assert!(progress.windows(2).all(|pair| pair[0].progress < pair[1].progress));
        client.cancel().await.unwrap();
    }
}

#[tokio::test]
async fn in_relay_mode_a_client_that_can_elicit_answers_and_one_that_cannot_leaves_it_to_the_inbox() {
    let app = spawn_front_door(BOTH_ERAS, "[front_door]\nelicitation = \"relay\"\n").await;
    for era in &CLIENT_ERAS {
        for server in ["legacy", "modern"] {
            let confirming = Confirming::default();
            let client = connect_as(&app, era, None, confirming.clone()).await;
            let action = format!("relay-{server}");
            let result = call_as(&client, &format!("{server}__confirm_action"), json!({"action": action})).await;
            assert_eq!(
                result.structured_content.unwrap()["results"],
                json!([{"action": "accept", "content": {"confirm": true, "note": "from the client"}}]),
                "{era:?} client, {server} upstream"
            );
            assert_eq!(*confirming.asked.lock().unwrap(), [format!("Confirm: {action}?")]);
            let calls = app.get_json(&format!("/calls?server={server}&status=completed")).await;
            let call = calls.as_array().unwrap().last().unwrap();
            assert_eq!(call["arguments"]["action"], action.as_str());
            let request = app
                .get_json(&format!("/requests/{}", call["requests"][0].as_str().unwrap()))
                .await;
            assert_eq!(
                (request["status"].as_str(), request["answeredBy"].as_str()),
                (Some("answered"), Some("anonymous"))
            );
            client.cancel().await.unwrap();
        }
        // A client that declared no elicitation is not asked: the Request waits in the inbox.
        let client = connect(&app, era, None).await;
        let waiting = tokio::spawn({
            let peer = client.peer().clone();
            async move {
                peer.call_tool(params("modern__confirm_action", json!({"action": "inbox"})))
                    .await
                    .unwrap()
            }
        });
        let request = pending_request_of(&app).await;
        app.answer_ok(
            request["id"].as_str().unwrap(),
            json!({"ok": true, "data": {"confirm": false}}),
        )
        .await;
        let result = waiting.await.unwrap();
        assert_eq!(
            result.structured_content.unwrap()["results"][0]["content"]["confirm"],
            false
        );
        client.cancel().await.unwrap();
    }
}

#[tokio::test]
async fn in_relay_mode_a_question_answered_in_the_inbox_first_is_withdrawn_from_the_client() {
    let app = spawn_front_door(BOTH_ERAS, "[front_door]\nelicitation = \"relay\"\n").await;
    let hesitant = Hesitant::default();
    let client = connect_as(&app, &ProtocolVersion::V_2025_11_25, None, hesitant.clone()).await;
    let waiting = tokio::spawn({
        let peer = client.peer().clone();
        async move {
            peer.call_tool(params("legacy__confirm_action", json!({"action": "either"})))
                .await
                .unwrap()
        }
    });
    hesitant.asked.notified().await;
    let request = pending_request_of(&app).await;
    app.answer_ok(
        request["id"].as_str().unwrap(),
        json!({"ok": true, "data": {"confirm": true}}),
    )
    .await;
    tokio::time::timeout(std::time::Duration::from_secs(30), hesitant.told.notified())
        .await
        .expect("the client was told its question is withdrawn");
    let reasons = hesitant.withdrawn.lock().unwrap().clone();
    assert_eq!(reasons.len(), 1, "{reasons:?}");
    assert!(
        reasons[0].as_deref().unwrap_or_default().contains("resolved"),
        "{reasons:?}"
    );
    let result = waiting.await.unwrap();
    assert_eq!(
        result.structured_content.unwrap()["results"],
        json!([{"action": "accept", "content": {"confirm": true, "note": ""}}]),
        "the inbox's answer is the one the upstream got"
    );
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn a_client_of_the_tasks_extension_gets_a_task_at_once_and_follows_it_to_its_result() {
    let app = spawn_app(BOTH_ERAS).await;
    let client = connect_as(&app, &ProtocolVersion::V_2026_07_28, None, Tasking::default()).await;
    let task = start_task(&client, "as a task").await;
    let request = pending_request_of(&app).await;
    assert_eq!(request["call"], task.as_str(), "the task is the call");
    let id = request["id"].as_str().unwrap();
    let waiting = task_of(&client, &task).await;
    assert_eq!(
        waiting.status(),
        TaskStatus::Working,
        "the inbox answers it, not the client"
    );
    assert!(waiting.task.status_message.unwrap().contains(id));
    let answered = app
        .post(
            &format!("/requests/{id}/answer?wait=30"),
            &json!({"ok": true, "data": {"confirm": true}}),
        )
        .await;
    assert_eq!(
        answered.json::<Value>().await.unwrap()["resumedCall"]["status"],
        "completed"
    );
    let TaskPayload::Completed { result } = task_of(&client, &task).await.payload else {
        panic!("not completed")
    };
    assert_eq!(
        result["structuredContent"]["results"],
        json!([{"action": "accept", "content": {"confirm": true, "note": ""}}])
    );

    let task = start_task(&client, "to cancel").await;
    let request = pending_request_of(&app).await;
    client.peer().cancel_task(CancelTaskParams::new(&task)).await.unwrap();
    let id = request["id"].as_str().unwrap();
    assert_eq!(
        app.get_json(&format!("/requests/{id}?wait=30")).await["status"],
        "cancelled"
    );
    assert_eq!(task_of(&client, &task).await.status(), TaskStatus::Cancelled);
}

/// A call the upstream made a task of is a task at the front door too, which says what the upstream's says of its
/// progress.
#[tokio::test]
async fn a_task_shows_what_the_upstream_task_says_of_its_progress() {
    let app = spawn_app(BOTH_ERAS).await;
    let client = connect_as(&app, &ProtocolVersion::V_2026_07_28, None, Tasking::default()).await;
    let started = client
        .peer()
        .call_tool_once(params("modern__research", json!({"topic": "rust", "seconds": 600})))
        .await
        .unwrap();
    let CallToolResponse::Task(created) = started else {
        panic!("not a task: {started:?}")
    };
    let task = created.task.task_id;
    let request = pending_request_of(&app).await;
    let id = request["id"].as_str().unwrap();
    app.answer_ok(id, json!({"ok": true, "data": {"reading": "technical"}}))
        .await;
    let message = crate::helpers::poll_until("the upstream's progress at the front door", || async {
        let seen = task_of(&client, &task).await;
        (seen.status() == TaskStatus::Working)
            .then_some(seen.task.status_message)
            .flatten()
            .filter(|message| message == "Synthesizing findings")
    })
    .await;
    assert_eq!(message, "Synthesizing findings");
    client.peer().cancel_task(CancelTaskParams::new(&task)).await.unwrap();
    assert_eq!(task_of(&client, &task).await.status(), TaskStatus::Cancelled);
}

#[tokio::test]
async fn in_relay_mode_a_task_asks_its_client_and_takes_its_answer() {
    let app = spawn_front_door(BOTH_ERAS, "[front_door]\nelicitation = \"relay\"\n").await;
    let client = connect_as(&app, &ProtocolVersion::V_2026_07_28, None, Tasking { elicits: true }).await;
    let task = start_task(&client, "relayed task").await;
    let request = pending_request_of(&app).await;
    let id = request["id"].as_str().unwrap().to_owned();
    let TaskPayload::InputRequired { input_requests } = task_of(&client, &task).await.payload else {
        panic!("not input_required")
    };
    assert_eq!(input_requests.keys().collect::<Vec<_>>(), [&id]);
    let refused = client
        .peer()
        .update_task(UpdateTaskParams::new(
            &task,
            [(id.clone(), json!({"action": "accept", "content": {"confirm": "yes"}}))].into(),
        ))
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("schema"), "{refused}");
    let accepted = json!({"action": "accept", "content": {"confirm": true, "note": "task"}});
    client
        .peer()
        .update_task(UpdateTaskParams::new(&task, [(id.clone(), accepted)].into()))
        .await
        .unwrap();
    let answered = app.get_json(&format!("/requests/{id}")).await;
    assert_eq!(answered["answeredBy"], "anonymous");
    app.settled(&task).await;
    let TaskPayload::Completed { result } = task_of(&client, &task).await.payload else {
        panic!("not completed")
    };
    assert_eq!(result["structuredContent"]["results"][0]["content"]["note"], "task");
}

#[tokio::test]
async fn a_client_that_cancels_cancels_its_call_and_its_requests() {
    let app = spawn_app(BOTH_ERAS).await;
    for era in CLIENT_ERAS {
        let client = connect(&app, &era, None).await;
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params(
            "legacy__confirm_action",
            json!({"action": "abandon"}),
        )));
        let handle = client
            .peer()
            .send_cancellable_request(request, PeerRequestOptions::no_options())
            .await
            .unwrap();
        let raised = pending_request_of(&app).await;
        let id = raised["id"].as_str().unwrap().to_owned();
        if era >= ProtocolVersion::V_2026_07_28 {
            // A 2026-07-28 request is cancelled by closing its response stream: the client goes away.
            client.cancel().await.unwrap();
        } else {
            handle.cancel(Some("the user gave up".into())).await.unwrap();
        }
        let settled = app.get_json(&format!("/requests/{id}?wait=30")).await;
        assert_eq!(settled["status"], "cancelled", "{era:?}: {settled}");
        let call = app
            .get_json(&format!("/calls/{}", raised["call"].as_str().unwrap()))
            .await;
        assert_eq!(call["status"], "cancelled", "{era:?}: {call}");
        let late = app.answer(&id, json!({"ok": true, "data": {"confirm": true}})).await;
        assert_eq!(late.status(), 410);
    }
}

#[tokio::test]
async fn tokens_decide_who_may_use_the_front_door_and_whose_calls_they_see() {
    let settings = format!(
        "[front_door]\nmax_hold = \"1s\"\n{}{}{}",
        token_entry("agent-a", "agent"),
        token_entry("agent-b", "agent"),
        token_entry("lead", "approver")
    );
    let app = spawn_front_door(BOTH_ERAS, &settings).await;
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "curl", "version": "1"}}});
    let post = |token: Option<&str>, origin: Option<&str>| {
        let mut request = app
            .client
            .post(format!("{}/mcp", app.address))
            .header("accept", "application/json, text/event-stream")
            .json(&initialize);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(origin) = origin {
            request = request.header("origin", origin);
        }
        request.send()
    };
    let anonymous = post(None, None).await.unwrap();
    assert_eq!(anonymous.status(), 401);
    assert_eq!(anonymous.headers()["www-authenticate"], "Bearer");
    assert_eq!(post(Some("lead-token"), None).await.unwrap().status(), 403);
    let foreign = post(Some("agent-a-token"), Some("http://evil.example")).await.unwrap();
    assert_eq!(foreign.status(), 403);
    assert!(foreign.text().await.unwrap().contains("Origin"));

    // A 2025-11-25 session answers only the principal that opened it.
    let opened = post(Some("agent-a-token"), None).await.unwrap();
    let session = opened.headers()["mcp-session-id"].to_str().unwrap().to_owned();
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let in_session = |token: &str| {
        app.client
            .post(format!("{}/mcp", app.address))
            .header("accept", "application/json, text/event-stream")
            .header("mcp-session-id", &session)
            .header("mcp-protocol-version", "2025-11-25")
            .bearer_auth(token)
            .json(&initialized)
            .send()
    };
    assert_eq!(in_session("agent-b-token").await.unwrap().status(), 404);
    assert_eq!(in_session("agent-a-token").await.unwrap().status(), 202);

    let a = connect(&app, &ProtocolVersion::V_2026_07_28, Some("agent-a-token")).await;
    let held = call(&a, "modern__confirm_action", json!({"action": "mine"})).await;
    let id = waiting_call(&held)["id"].as_str().unwrap().to_owned();
    let as_b = app
        .client
        .get(format!("{}/calls/{id}", app.address))
        .bearer_auth("agent-b-token")
        .send()
        .await
        .unwrap();
    assert_eq!(as_b.status(), 403);
    let as_a: Value = app
        .client
        .get(format!("{}/calls/{id}", app.address))
        .bearer_auth("agent-a-token")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        (as_a["owner"].as_str(), as_a["via"].as_str()),
        (Some("agent-a"), Some("mcp"))
    );
    let b = connect(&app, &ProtocolVersion::V_2026_07_28, Some("agent-b-token")).await;
    let refused = b
        .call_tool(params("gateway__await_call", json!({"call": id})))
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("of yours"), "{refused}");
}

/// A gateway with extra settings (e.g. `[front_door]`), ready.
pub(crate) async fn spawn_front_door(servers: &str, settings: &str) -> TestApp {
    let app = start_with(settings, servers, "");
    let ready = app.get("/readyz?wait=30").await;
    assert_eq!(ready.status(), 200);
    app
}
