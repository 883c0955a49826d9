//! `/sessions` and `/servers`: the upstream sessions and servers, and their tools.

use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{Value, json};
use utoipa::{IntoParams, ToSchema};

use super::extract::{JsonBody, QueryParams};
use super::{ApiError, AppState, InvalidQuery, LongPollsHeld, Problem, WaitQuery, to_completion};
use crate::auth::Principal;
use crate::feed::Concern;
use crate::ids::SessionId;
use crate::records::{SessionFilter, SessionView};
use crate::upstream::{ServerStatus, ServerView, Target, UpstreamError};

/// What `POST /sessions` opens.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OpenSession {
    /// The server to open a private session to.
    server: String,
}

#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// `open` (default) or `all`, which adds closed and failed sessions.
    #[serde(default)]
    #[param(inline)]
    status: SessionFilter,
}

/// `POST /sessions`: opens a private session, answering once it is ready.
#[utoipa::path(
    post,
    path = "/sessions",
    tag = "sessions",
    request_body(content = OpenSession, content_type = "application/json"),
    responses(
        (status = 201, description = "The session, ready", body = SessionView,
            headers(("Location" = String, description = "`/sessions/{id}`"))),
        (status = 400, description = "The body is malformed or repeats a key within an object", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "An approver may not open sessions", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such server", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "The principal has as many sessions open as limits.sessions_per_principal allows", body = Problem, content_type = "application/problem+json"),
        (status = 502, description = "The upstream cannot be reached or refused the session", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn open(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    JsonBody(body): JsonBody<OpenSession>,
) -> Result<Response, ApiError> {
    if !principal.may_start() {
        return Err(ApiError::forbidden(format!(
            "{} is an approver: it may not open sessions",
            principal.name
        )));
    }
    let upstreams = state.upstreams.clone();
    let session = to_completion(async move { Ok(upstreams.open(&body.server, &principal.id).await?) }).await?;
    let mut response = (StatusCode::CREATED, Json(&session)).into_response();
    if let Ok(location) = HeaderValue::from_str(&format!("/sessions/{}", session.id)) {
        response.headers_mut().insert(header::LOCATION, location);
    }
    Ok(response)
}

/// `GET /sessions`: open sessions (shared ones included); `status=all` adds closed ones.
#[utoipa::path(
    get,
    path = "/sessions",
    tag = "sessions",
    params(ListQuery),
    responses(
        (status = 200, description = "Sessions, oldest first", body = Vec<SessionView>),
        (status = 400, response = InvalidQuery),
    )
)]
pub async fn list(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    QueryParams(query): QueryParams<ListQuery>,
) -> Result<Json<Vec<SessionView>>, ApiError> {
    let sessions = state.sessions.list(query.status).await?;
    Ok(Json(
        sessions
            .into_iter()
            .filter(|view| view.shared || principal.may_see(view.owner.as_deref()))
            .collect(),
    ))
}

/// `GET /sessions/{id}`.
#[utoipa::path(
    get,
    path = "/sessions/{id}",
    tag = "sessions",
    params(("id" = String, Path, description = "The session id")),
    responses(
        (status = 200, description = "The session", body = SessionView),
        (status = 403, description = "The session belongs to another principal", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No session with that id", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn get(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Json<SessionView>, ApiError> {
    Ok(Json(state.upstreams.session(&session_id(id)?, &principal).await?))
}

/// `DELETE /sessions/{id}`: closes a private session; its pending Requests become `cancelled`.
#[utoipa::path(
    delete,
    path = "/sessions/{id}",
    tag = "sessions",
    params(("id" = String, Path, description = "The session id")),
    responses(
        (status = 200, description = "The session, closed", body = SessionView),
        (status = 403, description = "The session belongs to another principal", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No session with that id", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "A shared session, which the gateway manages", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn close(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Json<SessionView>, ApiError> {
    let id = session_id(id)?;
    let upstreams = state.upstreams.clone();
    let closed = to_completion(async move {
        Ok(upstreams
            .close(&id, "closed by a client (DELETE /sessions)", &principal)
            .await?)
    })
    .await?;
    Ok(Json(closed))
}

/// `GET /sessions/{id}/tools`: the session's merged `tools/list`.
#[utoipa::path(
    get,
    path = "/sessions/{id}/tools",
    tag = "sessions",
    params(("id" = String, Path, description = "The session id")),
    responses(
        (status = 200, description = "The upstream's `tools/list` result, every page merged: `{\"tools\": [...]}`", body = Object),
        (status = 403, description = "The session belongs to another principal", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No session with that id", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The session is closed", body = Problem, content_type = "application/problem+json"),
        (status = 502, description = "The upstream failed `tools/list`", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn tools(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(
        json!({ "tools": state.upstreams.tools(&Target::Session(session_id(id)?), &principal).await? }),
    ))
}

/// `GET /servers`: every configured server and the state of its shared session.
#[utoipa::path(
    get,
    path = "/servers",
    tag = "servers",
    responses((status = 200, description = "Every configured server", body = Vec<ServerView>))
)]
pub async fn servers(State(state): State<AppState>) -> Json<Vec<ServerView>> {
    Json(state.upstreams.servers())
}

/// `GET /servers/{name}`; with `wait`, held while its shared session is starting.
#[utoipa::path(
    get,
    path = "/servers/{name}",
    tag = "servers",
    params(("name" = String, Path, description = "The server's name"), WaitQuery),
    responses(
        (status = 200, description = "The server", body = ServerView),
        (status = 400, response = InvalidQuery),
        (status = 404, description = "No server with that name", body = Problem, content_type = "application/problem+json"),
        (status = 429, response = LongPollsHeld),
    )
)]
pub async fn server(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
    QueryParams(query): QueryParams<WaitQuery>,
) -> Result<Json<ServerView>, ApiError> {
    state.upstreams.server(&name)?;
    let settled = || {
        std::future::ready(
            state
                .upstreams
                .server(&name)
                .ok()
                .filter(|server| server.status != ServerStatus::Starting),
        )
    };
    let _held = state.hold_long_poll(&principal, query.wait.duration())?;
    let _ = state
        .feed
        .wait_for(query.wait.duration(), &state.shutdown, Concern::Any, settled)
        .await;
    Ok(Json(state.upstreams.server(&name)?))
}

/// `GET /servers/{name}/tools`: the merged `tools/list` of the server's shared session.
#[utoipa::path(
    get,
    path = "/servers/{name}/tools",
    tag = "servers",
    params(("name" = String, Path, description = "The server's name")),
    responses(
        (status = 200, description = "The upstream's `tools/list` result, every page merged: `{\"tools\": [...]}`", body = Object),
        (status = 404, description = "No server with that name", body = Problem, content_type = "application/problem+json"),
        (status = 502, description = "The upstream failed `tools/list`", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The server's shared session is not ready", body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = u64, description = "Seconds to wait before trying again"))),
    )
)]
pub async fn server_tools(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(
        json!({ "tools": state.upstreams.tools(&Target::Server(name), &principal).await? }),
    ))
}

/// The session a client named: one the gateway did not mint is as unknown as one it forgot.
pub(super) fn session_id(text: String) -> Result<SessionId, ApiError> {
    SessionId::parse(&text).ok_or_else(|| UpstreamError::UnknownSession(text).into())
}
