//! What the API accepts and from where: body size, the `Host` (exactly one header, on the allow-list against
//! DNS rebinding) and CORS.

use std::collections::btree_map::Entry;

use axum::extract::Request;
use axum::http::{HeaderName, HeaderValue, Method, header};
use tower_http::cors::{AllowOrigin, CorsLayer};
use utoipa::openapi::{OpenApi, RefOr};

use super::{ApiError, document};

/// The `Host` names answered by default when the gateway listens on loopback.
pub const LOOPBACK_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// The HTTP-level settings of the API.
#[derive(Debug, Clone)]
pub struct HttpPolicy {
    /// The largest request body, in bytes.
    pub max_body_bytes: usize,
    /// Host names (without port) the API answers; `None` answers any.
    pub allowed_hosts: Option<Vec<String>>,
    /// Origins whose pages may call the API; empty turns CORS off.
    pub cors_origins: Vec<String>,
}

impl HttpPolicy {
    /// Documents what every route answers about the `Host` (`400` to more than one `Host` header, and `403` to
    /// a `Host` off the allow-list) and what every route with a body answers about it (`413` past the configured
    /// `http.max_body_bytes`, and, for a JSON body, `415` when it is not JSON).
    pub fn document(&self, document: &mut OpenApi) {
        let bad_request = document::problem("Bad Request: the request has more than one Host header").build();
        let bad_request = document::shared(document, "MoreThanOneHost", bad_request);
        let forbidden = self.allowed_hosts.as_ref().map(|_| {
            let forbidden = document::problem(
                "Forbidden: the role or owner does not fit, or the Host is not on http.allowed_hosts",
            );
            document::shared(document, "Forbidden", forbidden.build())
        });
        let too_large = document::problem(&format!(
            "The body is larger than {} bytes (http.max_body_bytes)",
            self.max_body_bytes
        ));
        let too_large = document::shared(document, "BodyTooLarge", too_large.build());
        let not_json = document::problem("The body is not JSON: send Content-Type: application/json").build();
        let not_json = document::shared(document, "NotJson", not_json);
        for (_, operation) in document::operations(document) {
            let responses = &mut operation.responses.responses;
            match responses.entry("400".to_owned()) {
                Entry::Occupied(mut documented) => {
                    if let RefOr::T(documented) = documented.get_mut() {
                        documented
                            .description
                            .push_str(", or the request has more than one Host header");
                    }
                }
                Entry::Vacant(undocumented) => {
                    undocumented.insert(bad_request.clone());
                }
            }
            if let Some(forbidden) = &forbidden {
                responses.entry("403".to_owned()).or_insert_with(|| forbidden.clone());
            }
            if let Some(body) = &operation.request_body {
                responses.entry("413".to_owned()).or_insert_with(|| too_large.clone());
                let json = match body {
                    RefOr::T(body) => body.content.contains_key("application/json"),
                    RefOr::Ref(_) => true,
                };
                if json {
                    responses.insert("415".to_owned(), not_json.clone());
                }
            }
        }
    }
}

/// `400` for a request with more than one `Host` header (RFC 9112 §3.2: which one counts would depend on
/// who reads it), then `403` for a `Host` not on the allow-list: a page on another name, rebound to this
/// address, cannot reach the API.
pub fn check_host(policy: &HttpPolicy, request: &Request) -> Result<(), ApiError> {
    if request.headers().get_all(header::HOST).iter().nth(1).is_some() {
        return Err(ApiError::bad_request("the request has more than one Host header"));
    }
    if let Some(allowed) = &policy.allowed_hosts {
        let host = request
            .headers()
            .get(header::HOST)
            .and_then(|value| value.to_str().ok())
            .or_else(|| request.uri().host())
            .map(host_name)
            .unwrap_or_default();
        if !allowed.iter().any(|name| name.eq_ignore_ascii_case(&host)) {
            let detail = format!("the Host {host:?} is not one this gateway answers (http.allowed_hosts)");
            return Err(ApiError::forbidden(detail));
        }
    }
    Ok(())
}

/// The CORS layer, when origins are listed; without it the API sends no CORS headers at all.
pub fn cors(policy: &HttpPolicy) -> Option<CorsLayer> {
    if policy.cors_origins.is_empty() {
        return None;
    }
    let origins: Vec<HeaderValue> = policy
        .cors_origins
        .iter()
        .filter_map(|origin| HeaderValue::from_str(origin).ok())
        .collect();
    let layer = CorsLayer::new()
        .allow_origin(AllowOrigin::list(origins))
        .allow_methods([Method::GET, Method::POST, Method::DELETE])
        .allow_headers([
            header::AUTHORIZATION,
            header::CONTENT_TYPE,
            HeaderName::from_static("last-event-id"),
            HeaderName::from_static("mcp-session-id"),
            HeaderName::from_static("mcp-protocol-version"),
        ])
        .expose_headers([
            header::LINK,
            header::LOCATION,
            header::RETRY_AFTER,
            HeaderName::from_static("mcp-session-id"),
        ]);
    Some(layer)
}

/// The name in a `Host` value, without port or IPv6 brackets, lowercased.
fn host_name(host: &str) -> String {
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or_default(),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    name.to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names_lose_their_port_and_brackets() {
        assert_eq!(host_name("localhost:8080"), "localhost");
        assert_eq!(host_name("[::1]:8080"), "::1");
        assert_eq!(host_name("Example.COM"), "example.com");
    }
}
