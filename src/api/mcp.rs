//! The MCP front door: `/mcp`, where an MCP client finds every ready server's tools as one server's. A call
//! through it is a Call like any other: what its upstream asks of a human becomes a Request in the inbox,
//! and the client's `tools/call` is held until the call ends, `front_door.max_hold` passes (then it answers
//! that the call waits, and the gateway's own `gateway__await_call` waits again), or the client cancels it.

mod admission;
mod names;
mod relay;
mod tasks;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::http::header;
use axum::middleware;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, ContentBlock, CreateTaskResult,
    ErrorData, GetTaskParams, GetTaskResult, Implementation, JsonObject, ListToolsResult, MetaObject,
    PaginatedRequestParams, ProgressNotificationParam, ServerCapabilities, ServerConfig, SubscriptionFilter, Tool,
    UpdateTaskParams,
};
use rmcp::service::{NotificationContext, RequestContext, SubscriptionContext};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{Peer, RoleServer, ServerHandler};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{ApiError, AppState, to_completion};
use crate::auth::Principal;
use crate::config::Prefix;
use crate::feed::{Concern, Key};
use crate::ids::{CallId, RequestId};
use crate::lock;
use crate::records::{CallStatus, CallView, Event, Status, ToolName, Via};
use crate::upstream::{Following, Progress, Report, ServerStatus, Target};
use admission::{Holders, admit};
use names::Catalog;
use relay::{input_required, returned_era};
use tasks::task;

/// Where the front door is served.
pub const PATH: &str = "/mcp";
/// The gateway's own tool that waits again on a call the front door stopped holding.
const AWAIT_CALL: &str = "gateway__await_call";
/// How often a held call reports progress to a client that asked for it: well within the 60 s after which
/// many client SDKs give up on a request.
const HEARTBEAT: Duration = Duration::from_secs(15);
/// The header that names a 2025-11-25 session.
const SESSION_ID: &str = "mcp-session-id";
/// The `_meta` key of a result that says which call it is about and how that call stands.
const CALL_META: &str = "io.toolnexus/call";

/// How the front door names tools and holds calls.
#[derive(Debug, Clone, Copy)]
pub struct FrontDoorPolicy {
    pub prefix: Prefix,
    /// Ask MCP clients that can show them what their calls' upstreams ask, rather than only the inbox.
    pub relay: bool,
    pub max_hold: Duration,
}

/// The routes of the front door, behind the API's own checks (`Host`, authentication) and its own: the
/// `Origin` of a browser page, and a role that may call tools.
pub fn routes(state: &AppState, policy: FrontDoorPolicy) -> Router<AppState> {
    let door = FrontDoor {
        state: state.clone(),
        policy,
        catalog: Arc::default(),
        reported: Arc::default(),
        asking: Arc::default(),
        sessions: Arc::default(),
    };
    tokio::spawn(tell_sessions(
        door.sessions.clone(),
        state.upstreams.tools_changed(),
        state.shutdown.clone(),
    ));
    let config = StreamableHttpServerConfig::default()
        // The API checks `Host` for every route, against http.allowed_hosts.
        .disable_allowed_hosts()
        .with_max_request_body_bytes(state.http.max_body_bytes)
        // A response that is one message goes as JSON rather than as an event stream.
        .with_json_response(true)
        .with_cancellation_token(state.shutdown.child_token());
    let sessions = Arc::new(LocalSessionManager::default());
    let holders = Holders::of(sessions.clone());
    let service = StreamableHttpService::new(move || Ok(door.clone()), sessions, config);
    Router::new()
        .nest_service(PATH, service)
        .layer(middleware::from_fn_with_state((state.clone(), holders), admit))
}

/// The handler behind `/mcp`; one per MCP session, all sharing what they learn of the upstreams.
#[derive(Debug, Clone)]
struct FrontDoor {
    state: AppState,
    policy: FrontDoorPolicy,
    /// The catalog as listed at a count of the changes to the tools offered.
    catalog: Arc<Mutex<Option<Listed>>>,
    /// The name collisions already logged.
    reported: Arc<Mutex<HashSet<String>>>,
    /// The Requests being asked of 2025-11-25 clients.
    asking: Arc<Mutex<HashSet<RequestId>>>,
    /// The 2025-11-25 sessions, told when the tools change.
    sessions: Arc<Mutex<Vec<Peer<RoleServer>>>>,
}

/// The catalog, and the count of the changes to the tools offered when it was listed.
type Listed = (u64, Arc<Catalog>);

impl ServerHandler for FrontDoor {
    fn get_info(&self) -> ServerConfig {
        #[allow(deprecated, reason = "2025-11-25 clients still get an upstream's log messages")]
        let capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_tool_list_changed()
            .enable_logging()
            .enable_tasks()
            .build();
        ServerConfig::new(capabilities)
            .with_server_info(Implementation::new("toolnexus-gateway", env!("CARGO_PKG_VERSION")))
            .with_instructions(format!(
                "The tools of every server behind this gateway. A tool that needs a human's answer waits for it; \
                 when a result says the call is still waiting, call {AWAIT_CALL} with its call id rather than \
                 calling the tool again."
            ))
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        let mut sessions = lock(&self.sessions);
        sessions.retain(|peer| !peer.is_transport_closed());
        sessions.push(context.peer);
    }

    /// Accepted, so that a client that sets a level goes on; what can be attributed is forwarded at every level.
    #[allow(deprecated, reason = "2025-11-25 clients still get an upstream's log messages")]
    async fn set_level(
        &self,
        _request: rmcp::model::SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        Ok(())
    }

    /// A 2026-07-28 client's `subscriptions/listen` may ask for `notifications/tools/list_changed`.
    fn accepted_subscription_filter(&self, requested: &SubscriptionFilter) -> Option<SubscriptionFilter> {
        let mut accepted = SubscriptionFilter::new();
        accepted.tools_list_changed = requested.tools_list_changed;
        Some(accepted)
    }

    async fn listen(&self, subscription: SubscriptionContext) -> Result<(), ErrorData> {
        let mut changes = self.state.upstreams.tools_changed();
        loop {
            tokio::select! {
                () = subscription.cancelled() => return Ok(()),
                () = self.state.shutdown.cancelled() => return Ok(()),
                changed = changes.changed() => {
                    if changed.is_err() || subscription.sink().notify_tool_list_changed().await.is_err() {
                        return Ok(());
                    }
                }
            }
        }
    }

    /// A front-door call as a task: working while it runs or waits on the inbox, `input_required` with the
    /// Requests it may be relayed, and its result, error or cancellation once it ends.
    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        self.task_of(&request.task_id, &context).await
    }

    /// The answers of a task's client to the Requests `tasks/get` relayed to it.
    async fn update_task(
        &self,
        request: UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let principal = principal(&context)?;
        let call = relay::relayed_call(&request.task_id)?;
        self.answer_relayed(&call, request.input_responses, &principal).await
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.cancel_as_task(request.task_id, &context).await
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let mut tools = self.catalog().await.tools.clone();
        tools.push(await_call_tool());
        Ok(ListToolsResult::with_all_items(tools))
    }

    fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<CallToolResponse, ErrorData>> + Send + '_ {
        // rmcp spawns each request's handling with room for the largest method's future and moves it whole
        // more than once on the way: boxed, what it moves of a call is a pointer, not ~9 KB.
        Box::pin(self.call(request, context))
    }
}

impl FrontDoor {
    /// A `tools/call`: an upstream tool's call held to its end, `gateway__await_call`, or the answers of a
    /// 2026-07-28 client to the Requests it was relayed.
    async fn call(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let principal = principal(&context)?;
        if let Some(state) = request.request_state.as_deref() {
            let call = relay::relayed_call(state)?;
            let responses = request.input_responses.unwrap_or_default();
            self.answer_relayed(&call, responses, &principal).await?;
            return self.hold(&call, &principal, &context, None).await;
        }
        if request.name == AWAIT_CALL {
            let call = request
                .arguments
                .as_ref()
                .and_then(|arguments| arguments.get("call"))
                .and_then(Value::as_str)
                .ok_or_else(|| ErrorData::invalid_params(format!("{AWAIT_CALL} takes {{\"call\": \"<id>\"}}"), None))?;
            let view = self.own_call(call, &principal, Principal::may_see).await?;
            return self.hold(&view.id, &principal, &context, None).await;
        }
        let catalog = self.catalog().await;
        let route = catalog
            .route(&request.name)
            .ok_or_else(|| ErrorData::invalid_params(format!("no tool named {:?}", request.name), None))?;
        let tool = ToolName::parse(route.tool.clone()).map_err(|error| ErrorData::invalid_params(error, None))?;
        let target = Target::Server(route.server.clone());
        let upstreams = self.state.upstreams.clone();
        let arguments = request.arguments;
        let by = principal.clone();
        // Started to its end even if the client goes away meanwhile, so that the call is not half made.
        let (call, reports, keeping) = to_completion(async move {
            upstreams
                .start_call(target, tool, arguments, &by, Via::Mcp)
                .await
                .map_err(ApiError::from)
        })
        .await
        .map_err(refused)?;
        if context
            .client_capabilities()
            .is_some_and(|capabilities| capabilities.supports_tasks())
        {
            keeping.kept().await.map_err(|error| refused(error.into()))?;
            return Ok(CreateTaskResult::new(task(&call)).into());
        }
        let held = self.hold(&call.id, &principal, &context, Some(reports)).await;
        // Whatever the client is told names the call, or follows from it: the call is kept first.
        keeping.kept().await.map_err(|error| refused(error.into()))?;
        held
    }

    /// The tools of every ready server, named as the policy says; listed again after each change to the tools
    /// offered.
    async fn catalog(&self) -> Arc<Catalog> {
        let version = *self.state.upstreams.tools_changed().borrow();
        if let Some((listed_at, catalog)) = &*lock(&self.catalog)
            && *listed_at == version
        {
            return catalog.clone();
        }
        let servers = self.state.upstreams.servers();
        let prefixed = match self.policy.prefix {
            Prefix::Always => true,
            Prefix::WhenNeeded => servers.len() > 1,
        };
        let mut lists = Vec::new();
        let mut complete = true;
        for server in servers
            .into_iter()
            .filter(|server| server.status == ServerStatus::Ready)
        {
            let target = Target::Server(server.name.clone());
            match self.state.upstreams.tools(&target, &Principal::anonymous()).await {
                Ok(tools) => lists.push((server.name, tools)),
                Err(error) => {
                    complete = false;
                    tracing::warn!(server = %server.name, %error, "listing tools for /mcp failed");
                }
            }
        }
        let (catalog, collisions) = Catalog::build(
            lists.iter().map(|(server, tools)| (server.as_str(), tools.as_slice())),
            prefixed,
            &[AWAIT_CALL],
        );
        for collision in collisions {
            if lock(&self.reported).insert(collision.to_string()) {
                tracing::error!(%collision, "two tools would have the same name on /mcp");
            }
        }
        let catalog = Arc::new(catalog);
        if complete {
            *lock(&self.catalog) = Some((version, catalog.clone()));
        }
        catalog
    }

    /// Holds a call until it ends, `max_hold` passes or the client cancels the request (which cancels the
    /// call). A client that asked for progress gets the upstream's, and a heartbeat when there was none for
    /// `HEARTBEAT`, numbered by the gateway so that it keeps increasing (from `reports`, when the caller
    /// already follows the call). With `front_door.elicitation =
    /// "relay"`, the call's Requests that the client declared it can show are put to it: a 2025-11-25 client
    /// is sent `elicitation/create`, a 2026-07-28 one gets them as an `input_required` result.
    async fn hold(
        &self,
        call: &CallId,
        principal: &Principal,
        context: &RequestContext<RoleServer>,
        reports: Option<Following>,
    ) -> Result<CallToolResponse, ErrorData> {
        let relay = self.relay_to(context);
        let mut handled = HashSet::new();
        let deadline = Instant::now() + self.policy.max_hold;
        let progress = context.meta.get_progress_token();
        let mut reports = reports.unwrap_or_else(|| self.state.upstreams.follow(call));
        let mut sent = 0_u32;
        let mut tell = async |message: String| {
            if let Some(token) = &progress {
                sent += 1;
                let mut notification = ProgressNotificationParam::new(token.clone(), f64::from(sent));
                notification.message = Some(message);
                let _ = context.peer.notify_progress(notification).await;
            }
        };
        loop {
            let wait = deadline.saturating_duration_since(Instant::now()).min(HEARTBEAT);
            let relayed = relay.as_ref().map(|_| &handled);
            let view = tokio::select! {
                view = self.changed(call, wait, relayed) => view?,
                Some(report) = reports.next() => {
                    match report {
                        Report::Progress(report) => tell(upstream_progress(&report)).await,
                        Report::Log(message) if !returned_era(context) => {
                            #[allow(deprecated, reason = "2025-11-25 clients still get an upstream's log messages")]
                            let _ = context.peer.notify_logging_message(message).await;
                        }
                        Report::Log(_) => {}
                    }
                    continue;
                }
                () = context.ct.cancelled() => {
                    let upstreams = self.state.upstreams.clone();
                    let id = call.to_owned();
                    let _ = to_completion(async move {
                        Ok(upstreams.cancel_call(&id, "cancelled by its MCP client").await?)
                    })
                    .await;
                    return Err(ErrorData::internal_error("the request was cancelled", None));
                }
            };
            if view.status.is_final() {
                return Ok(ended(view).into());
            }
            if let Some(relay) = &relay
                && view.status == CallStatus::InputRequired
            {
                let asks = self.relayable(&view, principal, relay, &handled).await;
                handled.extend(view.requests.iter().cloned());
                if relay.returned {
                    if !asks.is_empty() {
                        return Ok(input_required(call, asks).into());
                    }
                } else {
                    for (request, params) in asks {
                        self.ask(context.peer.clone(), call, request, params, principal.clone());
                    }
                }
            }
            if Instant::now() >= deadline || self.state.shutdown.is_cancelled() {
                return Ok(self.waiting(view, context).await.into());
            }
            tell(format!("call {call} is waiting for a human")).await;
        }
    }

    /// The call once it has ended (or, given the Requests already relayed, waits on one that is not), or as it
    /// is when `wait` passes.
    async fn changed(
        &self,
        call: &CallId,
        wait: Duration,
        relayed: Option<&HashSet<RequestId>>,
    ) -> Result<CallView, ErrorData> {
        let concerns = |event: &Event| event.call.as_deref() == Some(call.as_str());
        let check = || async move {
            let Some(relayed) = relayed else {
                return match self.state.calls.status(call).await {
                    Ok(Some((status, _))) if !status.is_final() => None,
                    read => Some(read.map(|_| ())),
                };
            };
            match self.state.calls.get(call).await {
                Ok(Some(view)) => {
                    let unrelayed = view.status == CallStatus::InputRequired
                        && view.requests.iter().any(|id| !relayed.contains(id));
                    (view.status.is_final() || unrelayed).then_some(Ok(()))
                }
                read => Some(read.map(|_| ())),
            }
        };
        let waited = self
            .state
            .feed
            .wait_for(
                wait,
                &self.state.shutdown,
                Concern::EventsOf(Key::Call(call.to_string()), &concerns),
                check,
            )
            .await;
        if let Some(Err(error)) = waited {
            return Err(ErrorData::internal_error(error.to_string(), None));
        }
        match self.state.calls.get(call).await {
            Ok(Some(view)) => Ok(view),
            Ok(None) => Err(ErrorData::internal_error(format!("call {call} is gone"), None)),
            Err(error) => Err(ErrorData::internal_error(error.to_string(), None)),
        }
    }

    /// A call the principal may see (or change, as `rule` says); an id naming none, or another principal's,
    /// is `-32602`.
    async fn own_call(
        &self,
        id: &str,
        principal: &Principal,
        rule: fn(&Principal, Option<&str>) -> bool,
    ) -> Result<CallView, ErrorData> {
        let unknown = || ErrorData::invalid_params(format!("no call {id:?} of yours"), None);
        let call = CallId::parse(id).ok_or_else(unknown)?;
        match self.state.calls.get(&call).await {
            Ok(Some(view)) if rule(principal, Some(&view.owner)) => Ok(view),
            Ok(_) => Err(unknown()),
            Err(error) => Err(ErrorData::internal_error(error.to_string(), None)),
        }
    }

    /// The result that tells the client the call waits on a human, and how to go on waiting.
    async fn waiting(&self, view: CallView, context: &RequestContext<RoleServer>) -> CallToolResult {
        let pending = self.pending(&view).await;
        let told = vec![ContentBlock::text(waiting_text(&view, &pending, context))];
        // A successful result of a tool with an `outputSchema` must carry `structuredContent` that fits it, which
        // a waiting call has none of; clients check no schema against an error result.
        let mut result = if self.catalog().await.declares_output(&view.server, &view.tool) {
            CallToolResult::error(told)
        } else {
            CallToolResult::success(told)
        };
        result.meta = Some(call_meta(&view, &pending));
        result
    }

    /// What tells the client the call waits on a human, and how to go on waiting.
    async fn waiting_text(&self, view: &CallView, context: &RequestContext<RoleServer>) -> String {
        waiting_text(view, &self.pending(view).await, context)
    }

    /// The call's Requests still pending.
    async fn pending(&self, view: &CallView) -> Vec<RequestId> {
        let mut pending = Vec::new();
        for id in &view.requests {
            if let Ok(Some((Status::Pending, _))) = self.state.registry.status(id).await {
                pending.push(id.clone());
            }
        }
        pending
    }
}

/// What tells the client the call waits on a human (its `pending` Requests), and how to go on waiting.
fn waiting_text(view: &CallView, pending: &[RequestId], context: &RequestContext<RoleServer>) -> String {
    let asked = match pending {
        [] => "is still running".to_owned(),
        [one] => format!("is waiting for a human to answer Request {one}"),
        many => {
            let ids: Vec<&str> = many.iter().map(RequestId::as_str).collect();
            format!("is waiting for a human to answer Requests {}", ids.join(", "))
        }
    };
    format!(
        "Call {id} ({server} {tool}) {asked}.{inbox} To wait for its result, call the tool {AWAIT_CALL} \
         with {{\"call\": \"{id}\"}}. Do not call {tool} again: that would start another call and ask again.",
        id = view.id,
        server = view.server,
        tool = view.tool,
        inbox = inbox_url(context)
            .map(|url| format!(" It can be answered in the inbox at {url}."))
            .unwrap_or_default(),
    )
}

/// Sends `notifications/tools/list_changed` to every open 2025-11-25 session at each change to the tools
/// offered, until shutdown.
async fn tell_sessions(
    sessions: Arc<Mutex<Vec<Peer<RoleServer>>>>,
    mut changes: watch::Receiver<u64>,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            changed = changes.changed() => if changed.is_err() { return },
            () = shutdown.cancelled() => return,
        }
        let open = {
            let mut sessions = lock(&sessions);
            sessions.retain(|peer| !peer.is_transport_closed());
            sessions.clone()
        };
        for peer in open {
            let _ = peer.notify_tool_list_changed().await;
        }
    }
}

/// The message that carries an upstream's progress report, whose own numbers the gateway's replace.
fn upstream_progress(report: &Progress) -> String {
    let done = match report.total {
        Some(total) => format!("{} of {total}", report.progress),
        None => report.progress.to_string(),
    };
    match &report.message {
        Some(message) => format!("{message} ({done})"),
        None => format!("progress {done}"),
    }
}

/// The result of a call that has ended: the upstream's own, or an error result that says why there is none.
fn ended(view: CallView) -> CallToolResult {
    let id = view.id.clone();
    let completed = view
        .result
        .clone()
        .filter(|_| view.status == CallStatus::Completed)
        .and_then(|result| serde_json::from_value::<CallToolResult>(*result).ok());
    if let Some(result) = completed {
        return result;
    }
    let why = view
        .error
        .as_ref()
        .map_or_else(|| "no result".to_owned(), |error| error.message.clone());
    let mut result = CallToolResult::error(vec![ContentBlock::text(format!(
        "call {id} {}: {why}",
        view.status.as_str()
    ))]);
    result.meta = Some(call_meta(&view, &[]));
    result
}

/// `_meta` naming the call, its status and the Requests it waits on.
fn call_meta(view: &CallView, pending: &[RequestId]) -> MetaObject {
    let mut meta = JsonObject::new();
    meta.insert(
        CALL_META.to_owned(),
        json!({"id": view.id, "status": view.status, "requests": pending}),
    );
    MetaObject(meta)
}

/// The inbox's address as the client reached the gateway.
fn inbox_url(context: &RequestContext<RoleServer>) -> Option<String> {
    let parts = context.extensions.get::<axum::http::request::Parts>()?;
    let host = parts.headers.get(header::HOST)?.to_str().ok()?;
    let scheme = parts
        .headers
        .get("x-forwarded-proto")
        .and_then(|value| value.to_str().ok())
        .filter(|scheme| ["http", "https"].contains(scheme))
        .unwrap_or("http");
    Some(format!("{scheme}://{host}/ui"))
}

/// Who sent the request, as the API authenticated it.
fn principal(context: &RequestContext<RoleServer>) -> Result<Principal, ErrorData> {
    context
        .extensions
        .get::<axum::http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<Principal>())
        .cloned()
        .ok_or_else(|| ErrorData::internal_error("the request reached /mcp unauthenticated", None))
}

/// The error for a call the gateway would not start.
fn refused(error: ApiError) -> ErrorData {
    ErrorData::invalid_request(error.detail().to_owned(), None)
}

/// `gateway__await_call`, as `tools/list` offers it.
fn await_call_tool() -> Tool {
    let schema: JsonObject = json!({
        "type": "object",
        "properties": {"call": {"type": "string", "description": "The call id a waiting result named"}},
        "required": ["call"],
    })
    .as_object()
    .cloned()
    .unwrap_or_default();
    Tool::new(
        AWAIT_CALL,
        "Waits for a call that is waiting for a human (a result named its id) and returns its result, or says \
         again that it is waiting.",
        Arc::new(schema),
    )
}
