//! `GET /metrics` in Prometheus text format, and the middleware that measures every HTTP request.

use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::time::Instant;

use super::AppState;
use crate::metrics::Gauge;
use crate::sessions::SessionStatus;

/// `GET /metrics`.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "operations",
    responses((status = 200, description = "Prometheus text format", body = String,
        content_type = "text/plain; version=0.0.4; charset=utf-8"))
)]
pub async fn render(State(state): State<AppState>) -> Response {
    let mut gauges = vec![Gauge {
        name: "toolnexus_requests_pending",
        labels: Vec::new(),
        value: state.registry.pending_count() as f64,
    }];
    for (status, count) in state.calls.count_by_status() {
        let status = status.as_str().to_owned();
        gauges.push(Gauge {
            name: "toolnexus_calls",
            labels: vec![("status", status)],
            value: count as f64,
        });
    }
    let mut sessions = std::collections::BTreeMap::<(String, SessionStatus), usize>::new();
    for session in state.sessions.list(false) {
        *sessions.entry((session.server, session.status)).or_default() += 1;
    }
    for ((server, status), count) in sessions {
        let status = format!("{status:?}").to_lowercase();
        let labels = vec![("server", server), ("state", status)];
        gauges.push(Gauge {
            name: "toolnexus_sessions",
            labels,
            value: count as f64,
        });
    }
    for server in state.upstreams.servers() {
        let labels = vec![("server", server.name)];
        gauges.push(Gauge {
            name: "toolnexus_server_restarts_total",
            labels,
            value: f64::from(server.restarts),
        });
    }
    gauges.push(Gauge {
        name: "toolnexus_event_streams",
        labels: Vec::new(),
        value: state.events.subscribers() as f64,
    });
    gauges.push(Gauge {
        name: "toolnexus_long_polls",
        labels: Vec::new(),
        value: state.changes.waiters() as f64,
    });
    let mut response = state.metrics.render(&gauges).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    response
}

/// Counts every HTTP request by route, method and status, and times it by route.
pub async fn record(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", MatchedPath::as_str)
        .to_owned();
    let method = request.method().as_str().to_owned();
    let started = Instant::now();
    let response = next.run(request).await;
    let status = response.status().as_u16().to_string();
    let labels = [
        ("route", route.as_str()),
        ("method", method.as_str()),
        ("status", status.as_str()),
    ];
    state.metrics.inc("toolnexus_http_requests_total", &labels);
    let elapsed = started.elapsed().as_secs_f64();
    state.metrics.observe(
        "toolnexus_http_request_duration_seconds",
        &[("route", route.as_str())],
        elapsed,
    );
    response
}
