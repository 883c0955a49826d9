//! The MCP front door: `/mcp`, where an MCP client finds every ready server's tools as one server's. A call
//! through it is a Call like any other: what its upstream asks of a human becomes a Request in the inbox,
//! and the client's `tools/call` is held until the call ends, `front_door.max_hold` passes (then it answers
//! that the call waits, and the gateway's own `gateway__await_call` waits again), or the client cancels it.

mod names;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorData, Implementation, JsonObject,
    ListToolsResult, MetaObject, PaginatedRequestParams, ProgressNotificationParam, ServerCapabilities, ServerConfig,
    Tool,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{RoleServer, ServerHandler};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::api::{ApiError, AppState, to_completion};
use crate::auth::Principal;
use crate::config::Prefix;
use crate::feed::Concern;
use crate::records::{CallStatus, CallView, Event, Status, ToolName, Via};
use crate::upstream::{ServerStatus, Target, UpstreamError};
use names::Catalog;

/// Where the front door is served.
pub const PATH: &str = "/mcp";
/// The gateway's own tool that waits again on a call the front door stopped holding.
const AWAIT_CALL: &str = "gateway__await_call";
/// How often a held call reports progress to a client that asked for it: well within the 60 s after which
/// many client SDKs give up on a request.
const HEARTBEAT: Duration = Duration::from_secs(15);
/// The `_meta` key of a result that says which call it is about and how that call stands.
const CALL_META: &str = "io.toolnexus/call";

/// How the front door names tools and holds calls.
#[derive(Debug, Clone, Copy)]
pub struct FrontDoorPolicy {
    pub prefix: Prefix,
    pub max_hold: Duration,
}

/// The routes of the front door, behind the API's own checks (`Host`, authentication) and its own: the
/// `Origin` of a browser page, and a role that may call tools.
pub fn routes(state: &AppState, policy: FrontDoorPolicy) -> Router<AppState> {
    let door = FrontDoor {
        state: state.clone(),
        policy,
        listed: Arc::default(),
        reported: Arc::default(),
    };
    let config = StreamableHttpServerConfig::default()
        // The API checks `Host` for every route, against http.allowed_hosts.
        .disable_allowed_hosts()
        .with_max_request_body_bytes(state.http.max_body_bytes)
        .with_cancellation_token(state.shutdown.child_token());
    let service = StreamableHttpService::new(
        move || Ok(door.clone()),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    Router::new()
        .nest_service(PATH, service)
        .layer(middleware::from_fn_with_state(state.clone(), admit))
}

/// Refuses, before anything runs, a browser page from an origin that is neither the gateway's own nor on
/// `http.cors_origins` (the MCP transport's guard against DNS rebinding), and an approver, which may not
/// call tools.
async fn admit(State(state): State<AppState>, request: Request, next: Next) -> Response {
    if let Some(origin) = request.headers().get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or_default();
        let own = request
            .headers()
            .get(header::HOST)
            .and_then(|host| host.to_str().ok())
            .is_some_and(|host| {
                ["http://", "https://"]
                    .iter()
                    .any(|scheme| origin.eq_ignore_ascii_case(&format!("{scheme}{host}")))
            });
        let listed = state
            .http
            .cors_origins
            .iter()
            .any(|allowed| allowed.eq_ignore_ascii_case(origin));
        if !own && !listed {
            return ApiError::forbidden(format!(
                "the Origin {origin:?} is not one whose pages may use {PATH} (http.cors_origins)"
            ))
            .into_response();
        }
    }
    if let Some(principal) = request.extensions().get::<Principal>()
        && !principal.may_start()
    {
        return ApiError::forbidden(format!("{} is an approver: it may not call tools", principal.name))
            .into_response();
    }
    next.run(request).await
}

/// The handler behind `/mcp`; one per MCP session, all sharing what they learn of the upstreams.
#[derive(Debug, Clone)]
struct FrontDoor {
    state: AppState,
    policy: FrontDoorPolicy,
    /// Each server's tools, by server name: listed again when its shared session changes.
    listed: Arc<Mutex<HashMap<String, Listed>>>,
    /// The name collisions already logged.
    reported: Arc<Mutex<HashSet<String>>>,
}

/// A server's tools as one of its shared sessions listed them.
#[derive(Debug)]
struct Listed {
    session: String,
    tools: Arc<Vec<Tool>>,
}

impl ServerHandler for FrontDoor {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("toolnexus-gateway", env!("CARGO_PKG_VERSION")))
            .with_instructions(format!(
                "The tools of every server behind this gateway. A tool that needs a human's answer waits for it; \
                 when a result says the call is still waiting, call {AWAIT_CALL} with its call id rather than \
                 calling the tool again."
            ))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let mut tools = self.catalog().await.tools;
        tools.push(await_call_tool());
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let principal = principal(&context)?;
        if request.name == AWAIT_CALL {
            let call = request
                .arguments
                .as_ref()
                .and_then(|arguments| arguments.get("call"))
                .and_then(Value::as_str)
                .ok_or_else(|| ErrorData::invalid_params(format!("{AWAIT_CALL} takes {{\"call\": \"<id>\"}}"), None))?;
            let owner = match self.state.calls.status(call).await {
                Ok(Some((_, owner))) => owner,
                Ok(None) => return Err(ErrorData::invalid_params(format!("no call with id {call}"), None)),
                Err(error) => return Err(ErrorData::internal_error(error.to_string(), None)),
            };
            if !principal.may_see(Some(&owner)) {
                return Err(ErrorData::invalid_params(
                    format!("call {call} belongs to another principal"),
                    None,
                ));
            }
            return self.hold(call, &context).await.map(Into::into);
        }
        let catalog = self.catalog().await;
        let route = catalog
            .route(&request.name)
            .ok_or_else(|| ErrorData::invalid_params(format!("no tool named {:?}", request.name), None))?;
        let tool = ToolName::parse(route.tool.clone()).map_err(|error| ErrorData::invalid_params(error, None))?;
        let target = Target::Server(route.server.clone());
        let upstreams = self.state.upstreams.clone();
        let arguments = request.arguments;
        // Started to its end even if the client goes away meanwhile, so that the call is not half made.
        let call = to_completion(async move {
            upstreams
                .start_call(target, tool, arguments, &principal, Via::Mcp)
                .await
                .map_err(ApiError::from)
        })
        .await
        .map_err(refused)?;
        self.hold(&call.id, &context).await.map(Into::into)
    }
}

impl FrontDoor {
    /// The tools of every ready server, named as the policy says.
    async fn catalog(&self) -> Catalog {
        let servers = self.state.upstreams.servers();
        let prefixed = match self.policy.prefix {
            Prefix::Always => true,
            Prefix::WhenNeeded => servers.len() > 1,
        };
        let mut lists = Vec::new();
        for server in servers {
            let Some(session) = server.session.filter(|_| server.status == ServerStatus::Ready) else {
                continue;
            };
            match self.tools_of(&server.name, &session).await {
                Ok(tools) => lists.push((server.name, tools)),
                Err(error) => tracing::warn!(server = %server.name, %error, "listing tools for /mcp failed"),
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
        catalog
    }

    /// A server's tools as its shared session `session` lists them, listed once per session.
    async fn tools_of(&self, server: &str, session: &str) -> Result<Arc<Vec<Tool>>, UpstreamError> {
        if let Some(listed) = lock(&self.listed).get(server)
            && listed.session == session
        {
            return Ok(listed.tools.clone());
        }
        let tools = self
            .state
            .upstreams
            .tools(&Target::Server(server.to_owned()), &Principal::anonymous())
            .await?;
        let tools = Arc::new(tools);
        let listed = Listed {
            session: session.to_owned(),
            tools: tools.clone(),
        };
        lock(&self.listed).insert(server.to_owned(), listed);
        Ok(tools)
    }

    /// Holds a call until it ends, `max_hold` passes or the client cancels the request (which cancels the
    /// call); reports progress meanwhile when the client asked for it.
    async fn hold(&self, call: &str, context: &RequestContext<RoleServer>) -> Result<CallToolResult, ErrorData> {
        let deadline = Instant::now() + self.policy.max_hold;
        let progress = context.meta.get_progress_token();
        let mut beats = 0_u32;
        loop {
            let wait = deadline.saturating_duration_since(Instant::now()).min(HEARTBEAT);
            let view = tokio::select! {
                view = self.ended(call, wait) => view?,
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
                return Ok(ended(view));
            }
            if Instant::now() >= deadline || self.state.shutdown.is_cancelled() {
                return Ok(self.waiting(view, context).await);
            }
            if let Some(token) = &progress {
                beats += 1;
                let mut beat = ProgressNotificationParam::new(token.clone(), f64::from(beats));
                beat.message = Some(format!("call {call} is waiting for a human"));
                let _ = context.peer.notify_progress(beat).await;
            }
        }
    }

    /// The call once it has ended, or as it is when `wait` passes.
    async fn ended(&self, call: &str, wait: Duration) -> Result<CallView, ErrorData> {
        let concerns = |event: &Event| event.call.as_deref() == Some(call);
        let check = || async move {
            match self.state.calls.status(call).await {
                Ok(Some((status, _))) if !status.is_final() => None,
                read => Some(read),
            }
        };
        let waited = self
            .state
            .feed
            .wait_for(wait, &self.state.shutdown, Concern::Events(&concerns), check)
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

    /// The result that tells the client the call waits on a human, and how to go on waiting.
    async fn waiting(&self, view: CallView, context: &RequestContext<RoleServer>) -> CallToolResult {
        let mut pending = Vec::new();
        for id in &view.requests {
            if let Ok(Some((Status::Pending, _))) = self.state.registry.status(id).await {
                pending.push(id.clone());
            }
        }
        let inbox = inbox_url(context);
        let asked = match pending.as_slice() {
            [] => "is still running".to_owned(),
            [one] => format!("is waiting for a human to answer Request {one}"),
            many => format!("is waiting for a human to answer Requests {}", many.join(", ")),
        };
        let text = format!(
            "Call {id} ({server} {tool}) {asked}.{inbox} To wait for its result, call the tool {AWAIT_CALL} \
             with {{\"call\": \"{id}\"}}. Do not call {tool} again: that would start another call and ask again.",
            id = view.id,
            server = view.server,
            tool = view.tool,
            inbox = inbox
                .map(|url| format!(" It can be answered in the inbox at {url}."))
                .unwrap_or_default(),
        );
        let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
        result.meta = Some(call_meta(&view, &pending));
        result
    }
}

/// The result of a call that has ended: the upstream's own, or an error result that says why there is none.
fn ended(view: CallView) -> CallToolResult {
    let id = view.id.clone();
    let completed = view
        .result
        .clone()
        .filter(|_| view.status == CallStatus::Completed)
        .and_then(|result| serde_json::from_value::<CallToolResult>(result).ok());
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
fn call_meta(view: &CallView, pending: &[String]) -> MetaObject {
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

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
