//! `GET /metrics` in Prometheus text format, and the measurement of every HTTP request.

use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderValue, Method, header};
use axum::response::{IntoResponse, Response};
use tokio::time::Instant;

use super::AppState;
use crate::metrics::{Gauge, Metrics};
use crate::records::SessionStatus;

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
        value: state.registry.pending_count().await.unwrap_or_default() as f64,
    }];
    for (status, count) in state.calls.count_by_status().await.unwrap_or_default() {
        let status = status.as_str().to_owned();
        gauges.push(Gauge {
            name: "toolnexus_calls",
            labels: vec![("status", status)],
            value: count as f64,
        });
    }
    let mut sessions = std::collections::BTreeMap::<(String, SessionStatus), usize>::new();
    for session in state.sessions.list(false).await.unwrap_or_default() {
        *sessions.entry((session.server, session.status)).or_default() += 1;
    }
    for ((server, status), count) in sessions {
        let labels = vec![("server", server), ("state", status.as_str().to_owned())];
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
        name: "toolnexus_replica_info",
        labels: vec![("replica", state.upstreams.replica().to_owned())],
        value: 1.0,
    });
    gauges.push(Gauge {
        name: "toolnexus_event_streams",
        labels: Vec::new(),
        value: state.feed.streams() as f64,
    });
    gauges.push(Gauge {
        name: "toolnexus_connections",
        labels: Vec::new(),
        value: state.connections.open() as f64,
    });
    if let Some(bytes) = state.store.size().await {
        gauges.push(Gauge {
            name: "toolnexus_store_bytes",
            labels: Vec::new(),
            value: bytes as f64,
        });
    }
    gauges.push(Gauge {
        name: "toolnexus_long_polls",
        labels: Vec::new(),
        value: state.feed.long_polls() as f64,
    });
    gauges.push(Gauge {
        name: "toolnexus_long_poll_checks_total",
        labels: Vec::new(),
        value: state.feed.checks() as f64,
    });
    let mut response = state.metrics.render(&gauges).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    response
}

/// One HTTP request being measured: counted by route, method and status, and timed by route.
pub struct Measured {
    route: String,
    method: &'static str,
    started: Instant,
}

impl Measured {
    /// Starts measuring a request (after routing, so its route is known).
    pub fn start(request: &Request) -> Self {
        let route = request
            .extensions()
            .get::<MatchedPath>()
            .map_or("unmatched", MatchedPath::as_str)
            .to_owned();
        Self {
            route,
            method: method_name(request.method()),
            started: Instant::now(),
        }
    }

    /// Records the request with the status of its response.
    pub fn finish(self, metrics: &Metrics, response: &Response) {
        let status = response.status();
        let labels = [
            ("route", self.route.as_str()),
            ("method", self.method),
            ("status", status.as_str()),
        ];
        metrics.inc("toolnexus_http_requests_total", &labels);
        metrics.observe(
            "toolnexus_http_request_duration_seconds",
            &[("route", self.route.as_str())],
            self.started.elapsed().as_secs_f64(),
        );
    }
}

/// The method's name, for the methods HTTP defines (extension methods are counted as `other`).
fn method_name(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        Method::CONNECT => "CONNECT",
        Method::TRACE => "TRACE",
        _ => "other",
    }
}
