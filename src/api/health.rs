//! `/healthz` and `/readyz`.

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde_json::{Value, json};

use super::extract::QueryParams;
use super::{AppState, InvalidQuery, WaitQuery};
use crate::feed::{Concern, Hold};

/// Who holds the `/readyz` long-polls (no token name can be empty).
const PROBES: &str = "";

/// `GET /healthz`: the process is up.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "operations",
    responses((status = 200, description = "The process is up: `{\"status\": \"ok\"}`", body = Object))
)]
pub async fn healthz() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}

/// `GET /readyz`: `200` once every server's shared session is ready, else `503` naming the ones that are not.
///
/// With `wait`, held until everything is ready or the time passes.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "operations",
    params(WaitQuery),
    responses(
        (status = 200, description = "Every shared session is ready: `{\"status\": \"ready\"}`", body = Object),
        (status = 400, response = InvalidQuery),
        (status = 503, description = "Not ready: `{\"status\": \"not ready\", \"notReady\": [server, …]}`, or `{\"status\": \"not ready\", \"store\": \"unreachable\"}` while a PostgreSQL store does not answer", body = Object),
    )
)]
pub async fn readyz(
    State(state): State<AppState>,
    QueryParams(query): QueryParams<WaitQuery>,
) -> (StatusCode, Json<Value>) {
    let ready = || std::future::ready(state.upstreams.not_ready().is_empty().then_some(()));
    // Probes need no token: together they hold at most one principal's long-polls, and past that they are
    // answered at once, so that nobody can fill the connections with them.
    let held = (!query.wait.duration().is_zero())
        .then(|| state.feed.hold(Hold::LongPoll, PROBES, state.holds.long_polls).ok())
        .flatten();
    let wait = if held.is_some() {
        query.wait.duration()
    } else {
        Duration::ZERO
    };
    let _ = state.feed.wait_for(wait, &state.shutdown, Concern::Any, ready).await;
    if !state.store.reachable().await {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "status": "not ready", "store": "unreachable" })),
        );
    }
    let not_ready = state.upstreams.not_ready();
    if not_ready.is_empty() {
        (StatusCode::OK, Json(json!({ "status": "ready" })))
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "status": "not ready", "notReady": not_ready })),
        )
    }
}
