//! `/calls`: start, read and cancel tool calls.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::{Deserialize, Serialize, Serializer};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use utoipa::{IntoParams, ToSchema};

use super::extract::{JsonBody, QueryParams};
use super::{ApiError, AppState, InvalidQuery, LongPollsHeld, Problem, Wait, WaitQuery, page_size, to_completion};
use crate::auth::{Principal, Role};
use crate::feed::{Key, Since};
use crate::ids::CallId;
use crate::records::{CallFilter, CallStatus, CallView, Event, EventKind, ToolName, Via};
use crate::upstream::Target;

/// The largest page of `GET /calls`.
const MAX_PAGE: usize = 1000;

/// What `POST /calls` starts: a tool on a server's shared session, or on a session.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StartCall {
    /// Run on this server's shared session (give this or `session`).
    server: Option<String>,
    /// Run on this session (give this or `server`).
    session: Option<String>,
    /// The tool's name: 1 to 128 of `A-Z a-z 0-9 _ - .`, as MCP allows.
    #[schema(value_type = String, pattern = "^[A-Za-z0-9_.-]{1,128}$", min_length = 1, max_length = 128)]
    tool: ToolName,
    /// The tool's arguments.
    #[schema(value_type = Option<Object>)]
    arguments: Option<Map<String, Value>>,
}

#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Only calls in this status.
    #[param(inline)]
    status: Option<CallStatus>,
    /// Only calls on this server.
    server: Option<String>,
    /// Only calls on this session.
    session: Option<String>,
    /// At most this many, 1 to 1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<usize>,
}

/// `POST /calls`: starts a tool call; with `wait`, held until it is no longer running.
#[utoipa::path(
    post,
    path = "/calls",
    tag = "calls",
    params(WaitQuery),
    request_body(content = StartCall, content_type = "application/json"),
    responses(
        (status = 201, description = "The call, as it is when it stops running or `wait` passes", body = CallView,
            headers(("Location" = String, description = "`/calls/{id}`"))),
        (status = 400, description = "The body is malformed, repeats a key within an object, names both or neither of `server` and `session`, or `tool` is not 1 to 128 of `A-Z a-z 0-9 _ - .`", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "An approver, or a session of another principal", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such server or session", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The session is closed", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "The principal has as many calls running as limits.calls_per_principal allows, or (with `wait`) holds as many responses as limits.long_polls_per_principal allows", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The server's shared session is not ready", body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = u64, description = "Seconds to wait before trying again"))),
    )
)]
pub async fn start(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    QueryParams(query): QueryParams<WaitQuery>,
    JsonBody(body): JsonBody<StartCall>,
) -> Result<Response, ApiError> {
    if !principal.may_start() {
        return Err(ApiError::forbidden(format!(
            "{} is an approver: it may not start calls",
            principal.name
        )));
    }
    let target = match (body.server, body.session) {
        (Some(server), None) => Target::Server(server),
        (None, Some(session)) => Target::Session(super::sessions::session_id(session)?),
        _ => return Err(ApiError::bad_request("name exactly one of `server` and `session`")),
    };
    // Taken before the call starts: past the principal's long-polls nothing is started.
    let held = state.hold_long_poll(&principal, query.wait.duration())?;
    // Before the call starts, so that the wait misses no change after the start.
    let since = state.feed.since();
    let upstreams = state.upstreams.clone();
    let (call, _, keeping) = to_completion(async move {
        Ok(upstreams
            .start_call(target, body.tool, body.arguments, &principal, Via::Rest)
            .await?)
    })
    .await?;
    let waited = settled(&state, query.wait, since, call.clone(), Known::Started).await;
    // Kept before its id leaves: most often with the change that ended its running, its end or its round. Awaited
    // whatever the wait came to (a read the store failed), so that a call that cannot be kept is abandoned.
    keeping.kept().await?;
    let location = HeaderValue::from_str(&format!("/calls/{}", call.id));
    let call = waited?.unwrap_or_else(|| Found::Read(Box::new(call)));
    drop(held);
    let mut response = (StatusCode::CREATED, Json(&call)).into_response();
    if let Ok(location) = location {
        response.headers_mut().insert(header::LOCATION, location);
    }
    Ok(response)
}

/// `GET /calls`: calls, oldest first.
#[utoipa::path(
    get,
    path = "/calls",
    tag = "calls",
    params(ListQuery),
    responses(
        (status = 200, description = "Calls, oldest first", body = Vec<CallView>),
        (status = 400, response = InvalidQuery),
    )
)]
pub async fn list(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    QueryParams(query): QueryParams<ListQuery>,
) -> Result<Json<Vec<CallView>>, ApiError> {
    let limit = page_size(query.limit, MAX_PAGE)?;
    let filter = CallFilter {
        status: query.status,
        server: query.server,
        session: query.session,
        owner: (principal.role == Role::Agent).then(|| principal.id.clone()),
    };
    Ok(Json(state.calls.list(&filter, limit).await?))
}

/// `GET /calls/{id}`: one call; with `wait`, held while it is running.
#[utoipa::path(
    get,
    path = "/calls/{id}",
    tag = "calls",
    params(("id" = String, Path, description = "The call id"), WaitQuery),
    responses(
        (status = 200, description = "The call", body = CallView),
        (status = 400, response = InvalidQuery),
        (status = 403, description = "The call belongs to another principal", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No call with that id", body = Problem, content_type = "application/problem+json"),
        (status = 429, response = LongPollsHeld),
    )
)]
pub async fn get(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
    QueryParams(query): QueryParams<WaitQuery>,
) -> Result<Json<Found>, ApiError> {
    let since = state.feed.since();
    let call = owned_by(&state, &id, &principal, Principal::may_see).await?;
    let _held = state.hold_long_poll(&principal, query.wait.duration())?;
    settled(&state, query.wait, since, call, Known::Read)
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::not_found(format!("no call with id {id}")))
}

/// `DELETE /calls/{id}`: cancels a call; the upstream gets `notifications/cancelled`.
#[utoipa::path(
    delete,
    path = "/calls/{id}",
    tag = "calls",
    params(("id" = String, Path, description = "The call id")),
    responses(
        (status = 200, description = "The call, cancelled (or as it ended, if it already had)", body = CallView),
        (status = 403, description = "The call belongs to another principal, or the principal is an approver", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No call with that id", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn cancel(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Json<CallView>, ApiError> {
    let id = owned_by(&state, &id, &principal, Principal::may_change).await?.id;
    let upstreams = state.upstreams.clone();
    let call = to_completion(async move {
        Ok(upstreams
            .cancel_call(&id, "cancelled by a client (DELETE /calls)")
            .await?)
    })
    .await?;
    Ok(Json(call))
}

/// The call `id` names, as read: `404` for an unknown call, `403` when the rule says the principal may not touch
/// it.
async fn owned_by(
    state: &AppState,
    id: &str,
    principal: &Principal,
    rule: fn(&Principal, Option<&str>) -> bool,
) -> Result<CallView, ApiError> {
    let unknown = || ApiError::not_found(format!("no call with id {id}"));
    let call = CallId::parse(id).ok_or_else(unknown)?;
    let call = state.calls.get(&call).await?.ok_or_else(unknown)?;
    if rule(principal, Some(&call.owner)) {
        Ok(call)
    } else {
        Err(ApiError::forbidden(format!("call {id} belongs to another principal")))
    }
}

/// A call as a wait found it: read, or as the `call.updated` event that ended the wait carried it.
#[derive(Debug)]
pub(super) enum Found {
    Read(Box<CallView>),
    /// The event's data: the call as the change that the event tells of left it (see [`settled`]).
    Told(Box<RawValue>),
}

impl Serialize for Found {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Found::Read(view) => view.serialize(serializer),
            Found::Told(data) => data.serialize(serializer),
        }
    }
}

/// How the call a wait starts from was known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Known {
    /// Started by the route that waits: every change of the call comes after it.
    Started,
    /// Read: changes the feed tells after the read may be older than what it read.
    Read,
}

/// The call once it is no longer `running`, or as it is when `wait` passes; `known` is the call as read (or
/// started, as `how` says) after `since` subscribed to the feed ([`crate::feed::Feed::since`]), and the answer
/// itself when it is not running or `wait` is zero.
pub(super) async fn settled(
    state: &AppState,
    wait: Wait,
    since: Since,
    known: CallView,
    how: Known,
) -> Result<Option<Found>, ApiError> {
    if known.status != CallStatus::Running || wait.duration().is_zero() {
        return Ok(Some(Found::Read(Box::new(known))));
    }
    let id = &known.id;
    let since = state.feed.narrow(since, Key::Call(id.to_string()));
    // A call's status changes only with a `call.updated` event of it: its Requests' events need no read, nor does
    // one that carries `running` (the call leaves it only with an event of its own). One that carries a final
    // status needs none either, as a call never leaves one, nor does the call it carries. Nor does any other of a
    // call this route started: the call it carries is newer than the one started, if not the newest (events
    // queued behind it, or published by replicas in another order than they committed, may say otherwise, as a
    // read after it might). After any other the call is read again: what it carries may be older than the call
    // as read before the wait.
    let first = AtomicBool::new(true);
    let told = Mutex::new(None);
    let not_running = || async {
        // The first check is `known`, running.
        if first.swap(false, Ordering::Relaxed) {
            return None;
        }
        if let Some(told) = crate::lock(&told).take() {
            return Some(Ok(Some(Found::Told(told))));
        }
        match state.calls.get(id).await {
            Ok(Some(view)) if view.status == CallStatus::Running => None,
            read => Some(read.map(|found| found.map(|view| Found::Read(Box::new(view))))),
        }
    };
    let concerns = |event: &Event| {
        if event.kind != EventKind::CallUpdated || event.call.as_deref() != Some(id.as_str()) {
            return false;
        }
        let status = event.call_status();
        let concerns = status != Some(CallStatus::Running);
        if concerns {
            let carried = (how == Known::Started || status.is_some_and(|status| status.is_final())) && event.has_data();
            *crate::lock(&told) = carried
                .then(|| RawValue::from_string(event.data.clone()).ok())
                .flatten();
        }
        concerns
    };
    let waited = state
        .feed
        .wait_for_since(since, wait.duration(), &state.shutdown, &concerns, not_running)
        .await;
    match waited {
        // A read that failed ends the wait with the failure, not with the call as it was before.
        Some(found) => Ok(found?),
        None => Ok(state.calls.get(id).await?.map(|view| Found::Read(Box::new(view)))),
    }
}
