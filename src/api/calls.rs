//! `/calls`: start, read and cancel tool calls.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Map, Value};

use super::extract::{JsonBody, QueryParams};
use super::{ApiError, AppState, Wait, WaitQuery, page_size};
use crate::calls::{CallFilter, CallStatus, CallView};
use crate::upstream::Target;

/// The largest page of `GET /calls`.
const MAX_PAGE: usize = 1000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartCall {
    server: Option<String>,
    session: Option<String>,
    tool: String,
    arguments: Option<Map<String, Value>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    status: Option<CallStatus>,
    server: Option<String>,
    session: Option<String>,
    limit: Option<usize>,
}

/// `POST /calls`: starts a tool call; with `wait`, held until it is no longer running.
pub async fn start(
    State(state): State<AppState>,
    QueryParams(query): QueryParams<WaitQuery>,
    JsonBody(body): JsonBody<StartCall>,
) -> Result<Response, ApiError> {
    let target = match (body.server, body.session) {
        (Some(server), None) => Target::Server(server),
        (None, Some(session)) => Target::Session(session),
        _ => return Err(ApiError::bad_request("name exactly one of `server` and `session`")),
    };
    let call = state.upstreams.start_call(target, body.tool, body.arguments)?;
    let call = settled(&state, &call.id, query.wait).await.unwrap_or(call);
    let mut response = (StatusCode::CREATED, Json(&call)).into_response();
    if let Ok(location) = HeaderValue::from_str(&format!("/calls/{}", call.id)) {
        response.headers_mut().insert(header::LOCATION, location);
    }
    Ok(response)
}

/// `GET /calls`: calls, oldest first.
pub async fn list(
    State(state): State<AppState>,
    QueryParams(query): QueryParams<ListQuery>,
) -> Result<Json<Vec<CallView>>, ApiError> {
    let limit = page_size(query.limit, MAX_PAGE)?;
    let filter = CallFilter {
        status: query.status,
        server: query.server,
        session: query.session,
    };
    Ok(Json(state.calls.list(&filter, limit)))
}

/// `GET /calls/{id}`: one call; with `wait`, held while it is running.
pub async fn get(
    State(state): State<AppState>,
    Path(id): Path<String>,
    QueryParams(query): QueryParams<WaitQuery>,
) -> Result<Json<CallView>, ApiError> {
    settled(&state, &id, query.wait)
        .await
        .map(Json)
        .ok_or_else(|| ApiError::not_found(format!("no call with id {id}")))
}

/// `DELETE /calls/{id}`: cancels a call; the upstream gets `notifications/cancelled`.
pub async fn cancel(State(state): State<AppState>, Path(id): Path<String>) -> Result<Json<CallView>, ApiError> {
    state
        .calls
        .cancel(&id, "cancelled by a client (DELETE /calls)")
        .map(Json)
        .ok_or_else(|| ApiError::not_found(format!("no call with id {id}")))
}

/// The call once it is no longer `running`, or as it is when `wait` passes.
async fn settled(state: &AppState, id: &str, wait: Wait) -> Option<CallView> {
    let not_running = || state.calls.get(id).filter(|call| call.status != CallStatus::Running);
    match state
        .changes
        .wait_for(wait.duration(), &state.shutdown, not_running)
        .await
    {
        Some(call) => Some(call),
        None => state.calls.get(id),
    }
}
