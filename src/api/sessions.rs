//! `/sessions` and `/servers`: the upstream sessions and servers, and their tools.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::Value;

use super::extract::{JsonBody, QueryParams};
use super::{ApiError, AppState, WaitQuery};
use crate::sessions::SessionView;
use crate::upstream::{ServerStatus, ServerView, Target};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenSession {
    server: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SessionFilter {
    #[default]
    Open,
    All,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    #[serde(default)]
    status: SessionFilter,
}

/// `POST /sessions`: opens a private session, answering once it is ready.
pub async fn open(State(state): State<AppState>, JsonBody(body): JsonBody<OpenSession>) -> Result<Response, ApiError> {
    let session = state.upstreams.open(&body.server).await?;
    let mut response = (StatusCode::CREATED, Json(&session)).into_response();
    if let Ok(location) = HeaderValue::from_str(&format!("/sessions/{}", session.id)) {
        response.headers_mut().insert(header::LOCATION, location);
    }
    Ok(response)
}

/// `GET /sessions`: open sessions (shared ones included); `status=all` adds closed ones.
pub async fn list(State(state): State<AppState>, QueryParams(query): QueryParams<ListQuery>) -> Json<Vec<SessionView>> {
    Json(state.sessions.list(matches!(query.status, SessionFilter::All)))
}

/// `GET /sessions/{id}`.
pub async fn get(State(state): State<AppState>, Path(id): Path<String>) -> Result<Json<SessionView>, ApiError> {
    state
        .sessions
        .get(&id)
        .map(Json)
        .ok_or_else(|| ApiError::not_found(format!("no session {id}")))
}

/// `DELETE /sessions/{id}`: closes a private session; its pending Requests become `cancelled`.
pub async fn close(State(state): State<AppState>, Path(id): Path<String>) -> Result<Json<SessionView>, ApiError> {
    Ok(Json(
        state.upstreams.close(&id, "closed by a client (DELETE /sessions)")?,
    ))
}

/// `GET /sessions/{id}/tools`: the session's merged `tools/list`.
pub async fn tools(State(state): State<AppState>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    Ok(Json(state.upstreams.tools(&Target::Session(id)).await?))
}

/// `GET /servers`: every configured server and the state of its shared session.
pub async fn servers(State(state): State<AppState>) -> Json<Vec<ServerView>> {
    Json(state.upstreams.servers())
}

/// `GET /servers/{name}`; with `wait`, held while its shared session is starting.
pub async fn server(
    State(state): State<AppState>,
    Path(name): Path<String>,
    QueryParams(query): QueryParams<WaitQuery>,
) -> Result<Json<ServerView>, ApiError> {
    let settled = || {
        state
            .upstreams
            .server(&name)
            .ok()
            .filter(|server| server.status != ServerStatus::Starting)
    };
    let _ = state
        .changes
        .wait_for(query.wait.duration(), &state.shutdown, settled)
        .await;
    Ok(Json(state.upstreams.server(&name)?))
}

/// `GET /servers/{name}/tools`: the merged `tools/list` of the server's shared session.
pub async fn server_tools(State(state): State<AppState>, Path(name): Path<String>) -> Result<Json<Value>, ApiError> {
    Ok(Json(state.upstreams.tools(&Target::Server(name)).await?))
}
