//! The one HTTP error type: every failure leaves the API as RFC 9457 `application/problem+json`.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::registry::{AnswerError, PostError};
use crate::store::StoreError;
use crate::upstream::UpstreamError;
use crate::validation::Violation;

/// Seconds a client should wait before retrying a call on a server that is not ready, or a change the store
/// could not keep.
const RETRY_AFTER_SECS: u64 = 1;

/// A problem to report to the HTTP client.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    detail: String,
    errors: Option<Vec<Violation>>,
    retry_after: Option<u64>,
}

impl ApiError {
    /// A problem with this status and detail.
    pub fn new(status: StatusCode, detail: impl Into<String>) -> Self {
        Self {
            status,
            detail: detail.into(),
            errors: None,
            retry_after: None,
        }
    }

    /// The response's status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The violations it lists, if any.
    pub fn errors(&self) -> &[Violation] {
        self.errors.as_deref().unwrap_or_default()
    }

    /// What went wrong, as the problem's `detail` says it.
    pub fn detail(&self) -> &str {
        &self.detail
    }

    /// `400`: the request is malformed.
    pub fn bad_request(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, detail)
    }

    /// A problem listing every way the request is wrong, under `errors`.
    pub fn listing(status: StatusCode, detail: impl Into<String>, errors: Vec<Violation>) -> Self {
        Self {
            errors: Some(errors),
            ..Self::new(status, detail)
        }
    }

    /// `403`: the principal's role or ownership does not allow it.
    pub fn forbidden(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, detail)
    }

    /// `404`: nothing by that id or name.
    pub fn not_found(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, detail)
    }
}

impl From<AnswerError> for ApiError {
    fn from(error: AnswerError) -> Self {
        let detail = error.to_string();
        match error {
            AnswerError::NotFound(_) => Self::not_found(detail),
            AnswerError::Refused(_) => Self::forbidden(detail),
            AnswerError::Conflict(_) | AnswerError::Approved { .. } => Self::new(StatusCode::CONFLICT, detail),
            AnswerError::Gone { .. } => Self::new(StatusCode::GONE, detail),
            AnswerError::Invalid(violations) => Self {
                errors: Some(violations),
                ..Self::new(StatusCode::UNPROCESSABLE_ENTITY, detail)
            },
            AnswerError::Store(error) => error.into(),
        }
    }
}

impl From<PostError> for ApiError {
    fn from(error: PostError) -> Self {
        let detail = error.to_string();
        match error {
            PostError::Duplicate(_) => Self::new(StatusCode::CONFLICT, detail),
            PostError::Unusable(message) => Self::listing(
                StatusCode::UNPROCESSABLE_ENTITY,
                "the Request cannot be raised",
                vec![Violation {
                    path: String::new(),
                    message,
                }],
            ),
            PostError::Full(_) => Self::new(StatusCode::TOO_MANY_REQUESTS, detail),
            PostError::Store(error) => error.into(),
        }
    }
}

impl From<StoreError> for ApiError {
    /// `503` with `Retry-After`: the store could not keep or read the change (nothing was changed).
    fn from(error: StoreError) -> Self {
        Self {
            retry_after: Some(RETRY_AFTER_SECS),
            ..Self::new(StatusCode::SERVICE_UNAVAILABLE, error.to_string())
        }
    }
}

impl From<UpstreamError> for ApiError {
    fn from(error: UpstreamError) -> Self {
        let detail = error.to_string();
        match error {
            UpstreamError::UnknownServer(_) | UpstreamError::UnknownSession(_) | UpstreamError::UnknownCall(_) => {
                Self::not_found(detail)
            }
            UpstreamError::SessionNotReady(_) | UpstreamError::SharedSession(_) => {
                Self::new(StatusCode::CONFLICT, detail)
            }
            UpstreamError::ServerNotReady { .. } => Self {
                retry_after: Some(RETRY_AFTER_SECS),
                ..Self::new(StatusCode::SERVICE_UNAVAILABLE, detail)
            },
            UpstreamError::Unopened { .. } | UpstreamError::ToolsList(_) => Self::new(StatusCode::BAD_GATEWAY, detail),
            UpstreamError::NotYours(_) | UpstreamError::NotPermitted { .. } => Self::forbidden(detail),
            UpstreamError::TooManySessions { .. } | UpstreamError::TooManyCalls { .. } => {
                Self::new(StatusCode::TOO_MANY_REQUESTS, detail)
            }
            UpstreamError::Store(error) => error.into(),
        }
    }
}

/// An RFC 9457 problem, as every error response carries it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Problem {
    /// Always `about:blank`: the status code says what kind of problem it is.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The status code's reason phrase.
    pub title: &'static str,
    pub status: u16,
    /// What went wrong, in human words.
    pub detail: String,
    /// Every way the body is wrong: for a `422`, each way an answer's data fails the requested schema; for
    /// `POST /requests`, each problem of the posted Request (`400` and `422`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub errors: Option<Vec<Violation>>,
}

/// A query parameter is invalid, or the request has more than one Host header.
#[derive(utoipa::ToResponse)]
#[response(content_type = "application/problem+json")]
#[allow(dead_code, reason = "documents a response that ApiError renders")]
pub struct InvalidQuery(Problem);

/// The principal holds as many responses held by `wait` as limits.long_polls_per_principal allows.
#[derive(utoipa::ToResponse)]
#[response(content_type = "application/problem+json")]
#[allow(dead_code, reason = "documents a response that ApiError renders")]
pub struct LongPollsHeld(Problem);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = Problem {
            kind: "about:blank",
            title: self.status.canonical_reason().unwrap_or("Error"),
            status: self.status.as_u16(),
            detail: self.detail,
            errors: self.errors,
        };
        let body = serde_json::to_string(&body).unwrap_or_default();
        let mut response = (self.status, body).into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(seconds) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}
