//! Extractors whose rejections are problem+json: JSON bodies (415, 413, 400 in that order) and query strings.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use serde::de::DeserializeOwned;

use super::AppState;
use super::error::ApiError;

/// A JSON object body deserialized into `T`.
#[derive(Debug)]
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        let limit = state.http.max_body_bytes;
        let is_json = request
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.split(';').next())
            .is_some_and(|mime| {
                let mime = mime.trim().to_ascii_lowercase();
                mime == "application/json" || (mime.starts_with("application/") && mime.ends_with("+json"))
            });
        if !is_json {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "the body must be JSON: send Content-Type: application/json",
            ));
        }
        let declared_length = request
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.parse::<usize>().ok());
        if declared_length.is_some_and(|length| length > limit) {
            return Err(too_large(limit));
        }
        let bytes = Bytes::from_request(request, state)
            .await
            .map_err(|rejection| match rejection.status() {
                StatusCode::PAYLOAD_TOO_LARGE => too_large(limit),
                status => ApiError::new(status, rejection.body_text()),
            })?;
        let value: serde_json::Value = serde_json::from_slice(&bytes)
            .map_err(|error| ApiError::bad_request(format!("the body is not valid JSON: {error}")))?;
        if !value.is_object() {
            return Err(ApiError::bad_request("the body must be a JSON object"));
        }
        serde_json::from_value(value)
            .map(JsonBody)
            .map_err(|error| ApiError::bad_request(format!("the body does not have the expected shape: {error}")))
    }
}

/// A query string deserialized into `T`.
#[derive(Debug)]
pub struct QueryParams<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for QueryParams<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let query = parts.uri.query().unwrap_or_default();
        serde_urlencoded::from_str(query)
            .map(QueryParams)
            .map_err(|error| ApiError::bad_request(format!("invalid query string: {error}")))
    }
}

fn too_large(limit: usize) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("the body is larger than {limit} bytes (http.max_body_bytes)"),
    )
}
