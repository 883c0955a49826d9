//! Authentication at the edge: every route but the open ones needs a bearer token, and handlers get the
//! `Principal` it names. With an OpenID provider, `/mcp` also says where to get a token (RFC 9728).

use axum::Json;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use utoipa::openapi::OpenApi;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityRequirement, SecurityScheme};

use super::{ApiError, AppState, document};
use crate::auth::{AuthError, Authenticator};

/// Where protected resource metadata is served: the bare form, and the form for the resource `/mcp`
/// (RFC 9728 §3.1), which `/mcp`'s challenge names.
const METADATA: &str = "/.well-known/oauth-protected-resource";
const METADATA_OF_MCP: &str = "/.well-known/oauth-protected-resource/mcp";

/// The name of the bearer scheme in the OpenAPI document.
const BEARER: &str = "bearer";

/// Which routes need a token, and the tokens.
#[derive(Debug, Clone, Default)]
pub struct AuthPolicy {
    pub authenticator: Authenticator,
    /// Serve `/metrics` without a token.
    pub public_metrics: bool,
    /// Serve `/openapi.json` without a token.
    pub public_openapi: bool,
    /// The URL of `/mcp` its metadata names, when configured.
    pub resource: Option<String>,
}

impl AuthPolicy {
    /// Whether a path is served without a token.
    pub fn is_open(&self, path: &str) -> bool {
        matches!(path, "/healthz" | "/readyz")
            || path == "/ui"
            || path.starts_with("/ui/")
            || (self.public_metrics && path == "/metrics")
            || (self.public_openapi && path == "/openapi.json")
            || matches!(path, METADATA | METADATA_OF_MCP)
    }

    /// The URL of `/mcp` as a client reached it: the configured one, else from the request's `Host` (and
    /// `X-Forwarded-Proto`, behind a proxy that ends TLS).
    fn resource(&self, headers: &HeaderMap) -> String {
        if let Some(resource) = &self.resource {
            return resource.clone();
        }
        let text = |name| headers.get(name).and_then(|value: &HeaderValue| value.to_str().ok());
        let scheme = match text("x-forwarded-proto") {
            Some(proto) if proto.eq_ignore_ascii_case("https") => "https",
            _ => "http",
        };
        format!("{scheme}://{}/mcp", text(header::HOST.as_str()).unwrap_or("localhost"))
    }

    /// Adds the bearer scheme to the document, and to every route that needs it a `401` response.
    pub fn document(&self, document: &mut OpenApi) {
        if !self.authenticator.enabled() {
            return;
        }
        let components = document.components.get_or_insert_with(Default::default);
        components.add_security_scheme(BEARER, SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)));
        let unauthorized = document::problem("No bearer token, or one that is not valid").build();
        let unauthorized = document::shared(document, "Unauthorized", unauthorized);
        for (path, operation) in document::operations(document) {
            if self.is_open(path) {
                continue;
            }
            operation
                .responses
                .responses
                .insert("401".to_owned(), unauthorized.clone());
            operation.security = Some(vec![SecurityRequirement::new(BEARER, Vec::<String>::new())]);
        }
    }
}

/// Authenticates a request to a route that needs it, recording its `Principal` for the handler; a missing or
/// bad token is the error (answered with [`refused`]).
pub async fn authenticate(policy: &AuthPolicy, request: &mut Request) -> Result<(), AuthError> {
    let authorization = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok());
    match policy.authenticator.authenticate(authorization).await {
        Ok(principal) => {
            request.extensions_mut().insert(principal);
            Ok(())
        }
        Err(_) if policy.is_open(request.uri().path()) => Ok(()),
        Err(error) => Err(error),
    }
}

/// `401` with the bearer challenge, or `403` for a valid token that gives no role. On `/mcp`, with an OpenID
/// provider, the challenge names the protected resource metadata, where an MCP client learns where to sign in.
pub fn refused(policy: &AuthPolicy, error: &AuthError, request: &Request) -> Response {
    if let AuthError::Forbidden(why) = error {
        return ApiError::new(StatusCode::FORBIDDEN, why.clone()).into_response();
    }
    let path = request.uri().path();
    let mut parameters = Vec::new();
    if policy.authenticator.oidc().is_some() && (path == "/mcp" || path.starts_with("/mcp/")) {
        let metadata = metadata_url(&policy.resource(request.headers()));
        parameters.push(format!("resource_metadata=\"{metadata}\""));
    }
    if matches!(error, AuthError::Rejected(_)) {
        parameters.push("error=\"invalid_token\"".to_owned());
    }
    let challenge = match parameters.is_empty() {
        true => "Bearer".to_owned(),
        false => format!("Bearer {}", parameters.join(", ")),
    };
    let mut response = ApiError::new(StatusCode::UNAUTHORIZED, error.to_string()).into_response();
    if let Ok(value) = HeaderValue::from_str(&challenge) {
        response.headers_mut().insert(header::WWW_AUTHENTICATE, value);
    }
    response
}

/// `GET /.well-known/oauth-protected-resource`: OAuth 2.0 Protected Resource Metadata (RFC 9728) for `/mcp`,
/// naming the OpenID provider as its authorization server, so that an MCP client can sign in there.
#[utoipa::path(
    get,
    path = "/.well-known/oauth-protected-resource",
    tag = "operations",
    responses(
        (status = 200, description = "The metadata: `resource` (the URL of `/mcp`), `authorization_servers` (the issuer), `bearer_methods_supported`", body = Object),
        (status = 404, description = "No OpenID provider is configured", body = crate::api::Problem),
    )
)]
pub async fn protected_resource(State(state): State<AppState>, headers: HeaderMap) -> Result<Json<Value>, ApiError> {
    metadata(&state, &headers)
}

/// `GET /.well-known/oauth-protected-resource/mcp`: the same metadata, at the place RFC 9728 derives from the
/// resource `/mcp`.
#[utoipa::path(
    get,
    path = "/.well-known/oauth-protected-resource/mcp",
    tag = "operations",
    responses(
        (status = 200, description = "The metadata, as at `/.well-known/oauth-protected-resource`", body = Object),
        (status = 404, description = "No OpenID provider is configured", body = crate::api::Problem),
    )
)]
pub async fn protected_resource_of_mcp(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    metadata(&state, &headers)
}

/// Where the metadata of `resource` is: its path after the well-known prefix (RFC 9728 §3.1).
fn metadata_url(resource: &str) -> String {
    match reqwest::Url::parse(resource) {
        Ok(mut url) => {
            let path = format!("{METADATA}{}", url.path().trim_end_matches('/'));
            url.set_path(&path);
            url.set_query(None);
            url.to_string()
        }
        Err(_) => METADATA.to_owned(),
    }
}

fn metadata(state: &AppState, headers: &HeaderMap) -> Result<Json<Value>, ApiError> {
    let oidc = state
        .auth
        .authenticator
        .oidc()
        .ok_or_else(|| ApiError::not_found("no OpenID provider is configured ([auth.oidc])"))?;
    Ok(Json(json!({
        "resource": state.auth.resource(headers),
        "authorization_servers": [oidc.issuer()],
        "bearer_methods_supported": ["header"],
        "resource_name": "toolnexus-gateway",
    })))
}
