//! Authentication at the edge: every route but the open ones needs a bearer token, and handlers get the
//! `Principal` it names.

use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use utoipa::openapi::OpenApi;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityRequirement, SecurityScheme};

use super::{ApiError, document};
use crate::auth::{AuthError, Authenticator};

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
}

impl AuthPolicy {
    /// Whether a path is served without a token.
    pub fn is_open(&self, path: &str) -> bool {
        matches!(path, "/healthz" | "/readyz")
            || path == "/ui"
            || path.starts_with("/ui/")
            || (self.public_metrics && path == "/metrics")
            || (self.public_openapi && path == "/openapi.json")
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
/// bad token is the error (answered with [`unauthorized`]).
pub fn authenticate(policy: &AuthPolicy, request: &mut Request) -> Result<(), AuthError> {
    let authorization = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok());
    match policy.authenticator.authenticate(authorization) {
        Ok(principal) => {
            request.extensions_mut().insert(principal);
            Ok(())
        }
        Err(_) if policy.is_open(request.uri().path()) => Ok(()),
        Err(error) => Err(error),
    }
}

/// `401` with the bearer challenge.
pub fn unauthorized(error: &AuthError) -> Response {
    let mut response = ApiError::new(StatusCode::UNAUTHORIZED, error.to_string()).into_response();
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}
