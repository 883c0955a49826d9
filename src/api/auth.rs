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
            || path.starts_with(crate::links::PATH)
            || (self.public_metrics && path == "/metrics")
            || (self.public_openapi && path == "/openapi.json")
            || matches!(path, METADATA | METADATA_OF_MCP)
    }

    /// The URL of `/mcp` as a client reached it: the configured one, else from the request's `Host` (and
    /// `X-Forwarded-Proto`, behind a proxy that ends TLS); `None` when `Host` is not a plain host and port.
    fn resource(&self, headers: &HeaderMap) -> Option<String> {
        if let Some(resource) = &self.resource {
            return Some(resource.clone());
        }
        let text = |name| headers.get(name).and_then(|value: &HeaderValue| value.to_str().ok());
        let scheme = match text("x-forwarded-proto") {
            Some(proto) if proto.eq_ignore_ascii_case("https") => "https",
            _ => "http",
        };
        let host = text(header::HOST.as_str())?;
        let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']');
        (!host.is_empty() && host.chars().all(plain)).then(|| format!("{scheme}://{host}/mcp"))
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
    if policy.authenticator.oidc().is_some()
        && (path == "/mcp" || path.starts_with("/mcp/"))
        && let Some(resource) = policy.resource(request.headers())
    {
        parameters.push(format!("resource_metadata=\"{}\"", metadata_url(&resource)));
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
        (status = 400, description = "The `Host` header is not a host and port, and no `resource` is configured", body = crate::api::Problem, content_type = "application/problem+json"),
        (status = 404, description = "No OpenID provider is configured", body = crate::api::Problem, content_type = "application/problem+json"),
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
        (status = 400, description = "The `Host` header is not a host and port, and no `resource` is configured", body = crate::api::Problem, content_type = "application/problem+json"),
        (status = 404, description = "No OpenID provider is configured", body = crate::api::Problem, content_type = "application/problem+json"),
    )
)]
pub async fn protected_resource_of_mcp(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    metadata(&state, &headers)
}

/// `GET /ui/sign-in.json`: where the inbox signs in, with `[auth.oidc] ui_client_id`: the issuer, the inbox's
/// client id and scopes, and the provider's authorization and token endpoints.
#[utoipa::path(
    get,
    path = "/ui/sign-in.json",
    tag = "inbox",
    responses(
        (status = 200, description = "`issuer`, `clientId`, `scope`, `authorizationEndpoint`, `tokenEndpoint`", body = Object),
        (status = 204, description = "The inbox signs in at no provider (no `auth.oidc.ui_client_id`)"),
    )
)]
pub async fn inbox_sign_in(State(state): State<AppState>) -> Response {
    match state.auth.authenticator.oidc().and_then(|oidc| oidc.inbox()) {
        Some(inbox) => Json(inbox).into_response(),
        None => StatusCode::NO_CONTENT.into_response(),
    }
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
    let resource = state.auth.resource(headers).ok_or_else(|| {
        ApiError::bad_request("the Host header is not a host and port: set [auth.oidc] resource to /mcp's URL")
    })?;
    Ok(Json(json!({
        "resource": resource,
        "authorization_servers": [oidc.issuer()],
        "bearer_methods_supported": ["header"],
        "resource_name": "toolnexus-gateway",
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_resource_is_built_only_from_a_plain_host_and_its_metadata_sits_under_the_well_known_prefix() {
        let policy = AuthPolicy::default();
        let resource = |host: &str, proto: Option<&str>| {
            let mut headers = HeaderMap::new();
            headers.insert(header::HOST, HeaderValue::from_str(host).unwrap());
            if let Some(proto) = proto {
                headers.insert("x-forwarded-proto", HeaderValue::from_str(proto).unwrap());
            }
            policy.resource(&headers)
        };
        assert_eq!(
            resource("127.0.0.1:8080", None).as_deref(),
            Some("http://127.0.0.1:8080/mcp")
        );
        assert_eq!(
            resource("gw.example.com", Some("https")).as_deref(),
            Some("https://gw.example.com/mcp")
        );
        assert_eq!(resource("[::1]:9", None).as_deref(), Some("http://[::1]:9/mcp"));
        for hostile in ["a\"b,c=\"d", "a b", "x/y", "user@host", ""] {
            assert_eq!(resource(hostile, None), None, "{hostile:?}");
        }
        assert_eq!(
            metadata_url("https://gw.example.com/mcp"),
            "https://gw.example.com/.well-known/oauth-protected-resource/mcp"
        );
    }
}
