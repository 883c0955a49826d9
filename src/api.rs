//! The REST API: routes, shared state and the query parameters common to several resources.

mod calls;
mod error;
mod events;
mod extract;
mod health;
mod metrics;
mod requests;
mod sessions;
mod ui;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request};
use axum::http::StatusCode;
use axum::middleware;
use axum::routing::{get, post};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;
use tower_http::LatencyUnit;
use tower_http::trace::{DefaultOnResponse, TraceLayer};

pub use error::ApiError;

use crate::calls::Calls;
use crate::changes::Changes;
use crate::events::Events;
use crate::metrics::Metrics;
use crate::registry::Registry;
use crate::sessions::Sessions;
use crate::upstream::Upstreams;

/// The largest request body accepted.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;
/// The longest a `wait` long-poll holds a response.
pub const MAX_WAIT: Duration = Duration::from_secs(300);

/// What every handler can reach.
#[derive(Debug, Clone)]
pub struct AppState {
    pub registry: Registry,
    pub calls: Calls,
    pub sessions: Sessions,
    pub upstreams: Arc<Upstreams>,
    pub changes: Changes,
    pub events: Events,
    pub metrics: Metrics,
    /// Fires at shutdown, ending every long-poll.
    pub shutdown: CancellationToken,
}

/// The router of the whole API.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/requests", get(requests::list))
        .route("/requests/{id}", get(requests::get))
        .route("/requests/{id}/answer", post(requests::answer))
        .route("/calls", get(calls::list).post(calls::start))
        .route("/calls/{id}", get(calls::get).delete(calls::cancel))
        .route("/sessions", get(sessions::list).post(sessions::open))
        .route("/sessions/{id}", get(sessions::get).delete(sessions::close))
        .route("/sessions/{id}/tools", get(sessions::tools))
        .route("/servers", get(sessions::servers))
        .route("/servers/{name}", get(sessions::server))
        .route("/servers/{name}/tools", get(sessions::server_tools))
        .route("/events", get(events::stream))
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/metrics", get(metrics::render))
        .merge(ui::routes())
        .fallback(|| async { ApiError::not_found("no such resource") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "this resource does not support that method",
            )
        })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(middleware::from_fn_with_state(state.clone(), metrics::record))
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(|request: &Request<_>| {
                    let route = request
                        .extensions()
                        .get::<MatchedPath>()
                        .map_or("", MatchedPath::as_str);
                    tracing::info_span!("http", method = %request.method(), path = %request.uri().path(), route)
                })
                .on_request(())
                .on_response(
                    DefaultOnResponse::new()
                        .level(tracing::Level::DEBUG)
                        .latency_unit(LatencyUnit::Micros),
                ),
        )
        .with_state(state)
}

/// The `wait` query parameter: seconds to hold a response, capped at `MAX_WAIT`.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(try_from = "f64")]
pub struct Wait(Duration);

impl TryFrom<f64> for Wait {
    type Error = String;

    fn try_from(seconds: f64) -> Result<Self, Self::Error> {
        if !seconds.is_finite() || seconds < 0.0 {
            return Err(format!("wait must be a number of seconds >= 0, not {seconds}"));
        }
        Ok(Wait(Duration::from_secs_f64(seconds).min(MAX_WAIT)))
    }
}

impl Wait {
    /// How long to hold the response.
    pub fn duration(self) -> Duration {
        self.0
    }
}

/// A query string with only `wait`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WaitQuery {
    #[serde(default)]
    pub wait: Wait,
}

/// The `limit` query parameter: a page size from 1 to `max`.
pub fn page_size(limit: Option<usize>, max: usize) -> Result<usize, ApiError> {
    match limit {
        None => Ok(100.min(max)),
        Some(limit) if (1..=max).contains(&limit) => Ok(limit),
        Some(limit) => Err(ApiError::bad_request(format!(
            "limit must be between 1 and {max}, not {limit}"
        ))),
    }
}
