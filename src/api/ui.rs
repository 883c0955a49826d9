//! `/ui`: the approval inbox, a page and its assets compiled into the binary.

use axum::Router;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use utoipa::PartialSchema;
use utoipa::openapi::path::{HttpMethod, OperationBuilder};
use utoipa::openapi::{ContentBuilder, HeaderBuilder, OpenApi, ResponseBuilder};

/// Where the page may load from and talk to: this origin only (and, when it signs in at an OpenID provider,
/// that provider's token endpoint), nothing inline, never framed.
fn content_security_policy(sign_in: Option<&str>) -> HeaderValue {
    let connect = sign_in.map(|origin| format!(" {origin}")).unwrap_or_default();
    let policy = format!(
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'{connect}; img-src 'self'; \
         base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    );
    HeaderValue::from_str(&policy).unwrap_or_else(|_| HeaderValue::from_static("default-src 'none'"))
}

/// Each file of the inbox: its path, content type and contents.
const ASSETS: [(&str, &str, &str); 10] = [
    ("/ui/", "text/html; charset=utf-8", include_str!("../../ui/index.html")),
    (
        "/ui/app.js",
        "text/javascript; charset=utf-8",
        include_str!("../../ui/app.js"),
    ),
    (
        "/ui/signin.js",
        "text/javascript; charset=utf-8",
        include_str!("../../ui/signin.js"),
    ),
    (
        "/ui/display.js",
        "text/javascript; charset=utf-8",
        include_str!("../../ui/display.js"),
    ),
    (
        "/ui/fields.js",
        "text/javascript; charset=utf-8",
        include_str!("../../ui/fields.js"),
    ),
    (
        "/ui/edit.js",
        "text/javascript; charset=utf-8",
        include_str!("../../ui/edit.js"),
    ),
    (
        "/ui/grants.js",
        "text/javascript; charset=utf-8",
        include_str!("../../ui/grants.js"),
    ),
    (
        "/ui/app.css",
        "text/css; charset=utf-8",
        include_str!("../../ui/app.css"),
    ),
    ("/ui/favicon.svg", "image/svg+xml", include_str!("../../ui/favicon.svg")),
    (
        "/ui/link.css",
        "text/css; charset=utf-8",
        include_str!("../../ui/link.css"),
    ),
];

/// The routes of the inbox, to merge into the API router; each is added to the OpenAPI document too. `sign_in` is
/// the origin of the OpenID provider's token endpoint, when the inbox signs in there.
pub fn routes<S: Clone + Send + Sync + 'static>(document: &mut OpenApi, sign_in: Option<&str>) -> Router<S> {
    let policy = content_security_policy(sign_in);
    let redirect = ResponseBuilder::new()
        .description("Redirects to `/ui/`")
        .header("Location", HeaderBuilder::new().schema(Some(String::schema())).build());
    let operation = OperationBuilder::new()
        .tag("inbox")
        .summary(Some("The approval inbox"))
        .response("308", redirect);
    document
        .paths
        .add_path_operation("/ui", vec![HttpMethod::Get], operation);
    let router = Router::new().route("/ui", get(|| async { Redirect::permanent("/ui/") }));
    ASSETS.into_iter().fold(router, |router, (path, content_type, body)| {
        let content = ContentBuilder::new().schema(Some(String::schema())).build();
        let file = ResponseBuilder::new()
            .description("A file of the inbox, embedded in the binary")
            .content(content_type, content);
        let operation = OperationBuilder::new()
            .tag("inbox")
            .summary(Some(path))
            .response("200", file);
        document
            .paths
            .add_path_operation(path, vec![HttpMethod::Get], operation);
        let policy = policy.clone();
        router.route(path, get(move || async move { asset(content_type, body, policy) }))
    })
}

/// An embedded asset with the inbox's security headers.
fn asset(content_type: &'static str, body: &'static str, policy: HeaderValue) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_SECURITY_POLICY, policy);
    for (name, value) in [
        (header::CONTENT_TYPE, content_type),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::CACHE_CONTROL, "no-cache"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}
