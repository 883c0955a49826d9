//! The REST API: routes, shared state and the query parameters common to several resources.

mod approvals;
mod audit;
mod auth;
mod calls;
mod document;
mod error;
mod events;
mod extract;
mod grants;
mod health;
mod http;
mod links;
mod mcp;
mod metrics;
mod requests;
mod sessions;
mod ui;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Router};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;
use tower_http::LatencyUnit;
use tower_http::trace::{DefaultOnResponse, TraceLayer};
use utoipa::{IntoParams, OpenApi};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub use auth::AuthPolicy;
pub use error::{ApiError, InvalidQuery, LongPollsHeld, Problem};
pub use http::{HttpPolicy, LOOPBACK_HOSTS};
pub use mcp::FrontDoorPolicy;

use crate::approvals::Approvals;
use crate::auth::Principal;
use crate::calls::Calls;
use crate::connections::Connections;
use crate::feed::{Counted, Feed, Hold};
use crate::grants::Grants;
use crate::links::Links;
use crate::metrics::Metrics;
use crate::registry::Registry;
use crate::sessions::Sessions;
use crate::store::Store;
use crate::upstream::Upstreams;

/// The longest a `wait` long-poll holds a response.
pub const MAX_WAIT: Duration = Duration::from_secs(300);

/// What every handler can reach; cloned for each request by each layer, so it is one shared pointer.
#[derive(Debug, Clone)]
pub struct AppState(Arc<Services>);

impl AppState {
    pub fn new(services: Services) -> Self {
        Self(Arc::new(services))
    }
}

impl std::ops::Deref for AppState {
    type Target = Services;

    fn deref(&self) -> &Services {
        &self.0
    }
}

/// The stores, upstreams and policies behind the API.
#[derive(Debug)]
pub struct Services {
    pub registry: Registry,
    pub calls: Calls,
    /// The standing grants approvers gave.
    pub grants: Grants,
    pub sessions: Sessions,
    pub upstreams: Arc<Upstreams>,
    /// The approval policies, as `GET /approvals` lists them.
    pub approvals: Approvals,
    /// Every change as it happens: long-polls wait on it, event streams follow it.
    pub feed: Feed,
    pub store: Store,
    pub metrics: Metrics,
    /// The open connections to the API.
    pub connections: Connections,
    /// Who may call which route.
    pub auth: AuthPolicy,
    /// What the API accepts, and from where.
    pub http: HttpPolicy,
    /// Fires at shutdown, ending every long-poll.
    pub shutdown: CancellationToken,
    /// Long-polls and event streams one principal may hold.
    pub holds: HoldLimits,
    /// How `/mcp` names tools and holds calls.
    pub front_door: FrontDoorPolicy,
    /// Makes and reads answer links.
    pub links: Links,
}

/// How many long-polls and event streams one principal may hold at once (without tokens there is one
/// principal for everyone, and no such limit).
#[derive(Debug, Clone, Copy)]
pub struct HoldLimits {
    pub long_polls: usize,
    pub streams: usize,
    /// 2025-11-25 `/mcp` sessions.
    pub mcp_sessions: usize,
}

impl Services {
    /// Counts a long-poll of `principal` (a `wait` longer than zero) while the guard lives; `429` when the
    /// principal holds as many as it may.
    pub fn hold_long_poll(&self, principal: &Principal, wait: Duration) -> Result<Option<Counted>, ApiError> {
        if wait.is_zero() {
            return Ok(None);
        }
        let most = self.holds.long_polls;
        self.hold(
            principal,
            Hold::LongPoll,
            most,
            "responses held open (by wait, or on /mcp)",
            "limits.long_polls_per_principal",
        )
        .map(Some)
    }

    /// Counts an event stream of `principal` while the guard lives; `429` when the principal holds as many as
    /// it may.
    pub fn hold_stream(&self, principal: &Principal) -> Result<Counted, ApiError> {
        let most = self.holds.streams;
        self.hold(
            principal,
            Hold::Stream,
            most,
            "event streams open (on /events or /mcp)",
            "limits.streams_per_principal",
        )
    }

    fn hold(
        &self,
        principal: &Principal,
        hold: Hold,
        most: usize,
        what: &str,
        setting: &str,
    ) -> Result<Counted, ApiError> {
        let most = if principal.is_anonymous() { usize::MAX } else { most };
        self.feed.hold(hold, &principal.id, most).map_err(|most| {
            ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                format!(
                    "{} has {most} {what}, the most one principal may hold ({setting})",
                    principal.name
                ),
            )
        })
    }
}

/// The OpenAPI document's frame; every path in it comes from the handlers' annotations.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "toolnexus-gateway",
        description = "Turns MCP elicitations into Requests that can be listed and answered over REST."
    ),
    components(schemas(crate::records::GrantUse), responses(InvalidQuery, LongPollsHeld)),
    tags(
        (name = "requests", description = "What upstreams ask of a human, and the answers"),
        (name = "calls", description = "Tool calls started over REST"),
        (name = "sessions", description = "MCP client sessions to the upstream servers"),
        (name = "servers", description = "The configured upstream servers"),
        (name = "approvals", description = "The policies that hold tool calls for a person's approval"),
        (name = "grants", description = "Standing grants: later calls like an approved one run without asking"),
        (name = "events", description = "Live events"),
        (name = "audit", description = "The audit trail: every event, chained by hashes"),
        (name = "operations", description = "Health, readiness, metrics and this document"),
        (name = "inbox", description = "The approval inbox, a page served from the binary"),
    )
)]
struct ApiDoc;

/// The rendered OpenAPI document, served at `/openapi.json`.
#[derive(Debug, Clone)]
struct OpenApiJson(Arc<str>);

/// The router of the whole API, and its OpenAPI document.
///
/// Every route is registered through `routes!`, so the document describes each one by construction.
pub fn router(state: AppState) -> Router {
    let sign_in = state
        .auth
        .authenticator
        .oidc()
        .and_then(|oidc| oidc.inbox())
        .and_then(|inbox| reqwest::Url::parse(&inbox.token_endpoint).ok())
        .map(|endpoint| endpoint.origin().ascii_serialization());
    let (router, mut document) = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(requests::list, requests::post))
        .routes(routes!(requests::get))
        .routes(routes!(requests::answer))
        .routes(routes!(links::make))
        .routes(routes!(links::open, links::answer))
        .routes(routes!(links::sign_in::sign_in))
        .routes(routes!(links::sign_in::signed_in))
        .routes(routes!(calls::list, calls::start))
        .routes(routes!(calls::get, calls::cancel))
        .routes(routes!(sessions::list, sessions::open))
        .routes(routes!(sessions::get, sessions::close))
        .routes(routes!(sessions::tools))
        .routes(routes!(sessions::servers))
        .routes(routes!(sessions::server))
        .routes(routes!(sessions::server_tools))
        .routes(routes!(approvals::list))
        .routes(routes!(grants::list))
        .routes(routes!(grants::revoke))
        .routes(routes!(events::stream))
        .routes(routes!(audit::export))
        .routes(routes!(health::healthz))
        .routes(routes!(health::readyz))
        .routes(routes!(metrics::render))
        .routes(routes!(openapi))
        .routes(routes!(auth::protected_resource))
        .routes(routes!(auth::protected_resource_of_mcp))
        .routes(routes!(auth::inbox_sign_in))
        .split_for_parts();
    let router = router
        .merge(ui::routes(&mut document, sign_in.as_deref()))
        .merge(mcp::routes(&state, state.front_door));
    document::constrain(&mut document);
    document::unique_operation_ids(&mut document);
    events::document(&mut document);
    document::unavailable(&mut document);
    state.auth.document(&mut document);
    state.http.document(&mut document);
    let document = OpenApiJson(document.to_json().unwrap_or_default().into());
    let router = router
        .fallback(|| async { ApiError::not_found("no such resource") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "this resource does not support that method",
            )
        })
        .layer(Extension(document))
        .layer(DefaultBodyLimit::max(state.http.max_body_bytes))
        .layer(middleware::from_fn_with_state(state.clone(), gate))
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(|request: &Request<_>| {
                    let route = request
                        .extensions()
                        .get::<MatchedPath>()
                        .map_or("", MatchedPath::as_str);
                    // An answer link's path is its credential: it is never written to the log.
                    let path = request.uri().path();
                    let path = if path.starts_with(crate::links::PATH) {
                        route
                    } else {
                        path
                    };
                    tracing::info_span!("http", method = %request.method(), path, route)
                })
                .on_request(())
                .on_response(
                    DefaultOnResponse::new()
                        .level(tracing::Level::DEBUG)
                        .latency_unit(LatencyUnit::Micros),
                ),
        );
    // Outermost, so a preflight is answered before authentication asks for a token it never carries.
    let router = match http::cors(&state.http) {
        Some(cors) => router.layer(cors),
        None => router,
    };
    router.with_state(state)
}

/// What every request passes through after routing: it is measured, then its `Host` is checked, then it is
/// authenticated. One middleware rather than three, because axum clones the rest of the stack for each
/// middleware a request passes through.
async fn gate(State(state): State<AppState>, mut request: Request, next: Next) -> Response {
    let measured = metrics::Measured::start(&request);
    let response = if let Err(refused) = http::check_host(&state.http, &request) {
        refused.into_response()
    } else if let Err(error) = auth::authenticate(&state.auth, &mut request).await {
        auth::refused(&state.auth, &error, &request)
    } else {
        next.run(request).await
    };
    measured.finish(&state.metrics, &response);
    response
}

/// `GET /openapi.json`: this document, OpenAPI 3.1.
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "operations",
    responses((status = 200, description = "The OpenAPI 3.1 document of this API", body = Object))
)]
async fn openapi(Extension(document): Extension<OpenApiJson>) -> Response {
    let mut response = document.0.to_string().into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// Runs a change to its end even if the client goes away: a handler's future is dropped with its connection,
/// and a change the store has kept must still reach whatever waits on it (the upstream, a call's retry).
pub async fn to_completion<T: Send + 'static>(
    change: impl Future<Output = Result<T, ApiError>> + Send + 'static,
) -> Result<T, ApiError> {
    match tokio::spawn(change).await {
        Ok(done) => done,
        Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
        Err(_) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "the gateway is shutting down",
        )),
    }
}

/// The `wait` query parameter: seconds to hold a response, capped at `MAX_WAIT`. A wait over the cap is held
/// for the cap rather than refused: a long-poll may end early anyway, so a client asks again either way.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(try_from = "f64")]
pub struct Wait(Duration);

impl TryFrom<f64> for Wait {
    type Error = String;

    fn try_from(seconds: f64) -> Result<Self, Self::Error> {
        // Infinity is a number over the cap too (`1e400` parses to it).
        if seconds.is_nan() || seconds < 0.0 {
            return Err(format!("wait must be a number of seconds >= 0, not {seconds}"));
        }
        Ok(Wait(Duration::from_secs_f64(seconds.min(MAX_WAIT.as_secs_f64()))))
    }
}

impl Wait {
    /// How long to hold the response.
    pub fn duration(self) -> Duration {
        self.0
    }
}

/// A query string with only `wait`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct WaitQuery {
    /// Seconds to hold the response; a value over 300 counts as 300.
    #[serde(default)]
    #[param(value_type = Option<f64>, minimum = 0)]
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_huge_wait_is_capped_not_a_panic() {
        assert_eq!(Wait::try_from(1.8e19).unwrap().duration(), MAX_WAIT);
        assert_eq!(Wait::try_from(f64::MAX).unwrap().duration(), MAX_WAIT);
        assert_eq!(Wait::try_from(f64::INFINITY).unwrap().duration(), MAX_WAIT);
        assert_eq!(Wait::try_from(1.5).unwrap().duration(), Duration::from_millis(1500));
        for refused in [-1.0, f64::NEG_INFINITY, f64::NAN] {
            assert!(Wait::try_from(refused).is_err(), "{refused}");
        }
    }

    /// Every source file of the API, to check how routes are registered.
    const SOURCES: [(&str, &str); 13] = [
        ("api.rs", include_str!("api.rs")),
        ("approvals.rs", include_str!("api/approvals.rs")),
        ("audit.rs", include_str!("api/audit.rs")),
        ("calls.rs", include_str!("api/calls.rs")),
        ("document.rs", include_str!("api/document.rs")),
        ("events.rs", include_str!("api/events.rs")),
        ("extract.rs", include_str!("api/extract.rs")),
        ("health.rs", include_str!("api/health.rs")),
        ("links.rs", include_str!("api/links.rs")),
        ("metrics.rs", include_str!("api/metrics.rs")),
        ("requests.rs", include_str!("api/requests.rs")),
        ("sessions.rs", include_str!("api/sessions.rs")),
        ("error.rs", include_str!("api/error.rs")),
    ];

    /// Handlers join the router only through `routes!`, which documents them; the inbox documents its own.
    #[test]
    fn no_route_bypasses_the_openapi_document() {
        for (file, source) in SOURCES {
            let source = source.split("#[cfg(test)]").next().unwrap_or_default();
            for call in [".route(", ".route_service(", ".nest(", ".nest_service("] {
                assert!(
                    !source.contains(call),
                    "{file} registers a route with {call} outside the OpenAPI router"
                );
            }
        }
        let ui = include_str!("api/ui.rs");
        assert_eq!(ui.matches(".route(").count(), ui.matches("add_path_operation(").count());
    }
}
