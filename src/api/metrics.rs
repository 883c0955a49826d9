//! `GET /metrics` in Prometheus text format, and the measurement of every HTTP request.

use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderValue, Method, header};
use axum::response::{IntoResponse, Response};
use tokio::time::Instant;

use super::AppState;
use crate::metrics::{Metric, Metrics, Reading};
use crate::records::{SessionFilter, SessionStatus};

/// `GET /metrics`.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "operations",
    responses((status = 200, description = "Prometheus text format", body = String,
        content_type = "text/plain; version=0.0.4; charset=utf-8"))
)]
pub async fn render(State(state): State<AppState>) -> Response {
    let pending = state.registry.pending_count().await.unwrap_or_default();
    let mut readings = vec![Reading::new(Metric::RequestsPending, pending as f64)];
    for (status, count) in state.calls.count_by_status().await.unwrap_or_default() {
        let labels = vec![("status", status.as_str().to_owned())];
        readings.push(Reading::labelled(Metric::Calls, labels, count as f64));
    }
    let mut sessions = std::collections::BTreeMap::<(String, SessionStatus), usize>::new();
    for session in state.sessions.list(SessionFilter::Open).await.unwrap_or_default() {
        *sessions.entry((session.server, session.status)).or_default() += 1;
    }
    for ((server, status), count) in sessions {
        let labels = vec![("server", server), ("state", status.as_str().to_owned())];
        readings.push(Reading::labelled(Metric::Sessions, labels, count as f64));
    }
    for server in state.upstreams.servers() {
        let labels = vec![("server", server.name)];
        readings.push(Reading::labelled(
            Metric::ServerRestarts,
            labels,
            f64::from(server.restarts),
        ));
    }
    let replica = vec![("replica", state.upstreams.replica().to_owned())];
    readings.push(Reading::labelled(Metric::ReplicaInfo, replica, 1.0));
    readings.push(Reading::new(Metric::EventStreams, state.feed.streams() as f64));
    readings.push(Reading::new(Metric::Connections, state.connections.open() as f64));
    if let Some(bytes) = state.store.size().await {
        readings.push(Reading::new(Metric::StoreBytes, bytes as f64));
    }
    readings.push(Reading::new(Metric::LongPolls, state.feed.long_polls() as f64));
    readings.push(Reading::new(Metric::LongPollChecks, state.feed.checks() as f64));
    let mut response = state.metrics.render(&readings).into_response();
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
        metrics.inc(Metric::HttpRequests, &labels);
        metrics.observe(
            Metric::HttpRequestDuration,
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
