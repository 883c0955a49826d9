//! `/healthz` and `/readyz`.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde_json::{Value, json};

use super::extract::QueryParams;
use super::{AppState, WaitQuery};

/// `GET /healthz`: the process is up.
pub async fn healthz() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}

/// `GET /readyz`: `200` once every server's shared session is ready, else `503` naming the ones that are not.
///
/// With `wait`, held until everything is ready or the time passes.
pub async fn readyz(
    State(state): State<AppState>,
    QueryParams(query): QueryParams<WaitQuery>,
) -> (StatusCode, Json<Value>) {
    let ready = || state.upstreams.not_ready().is_empty().then_some(());
    let _ = state
        .changes
        .wait_for(query.wait.duration(), &state.shutdown, ready)
        .await;
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
