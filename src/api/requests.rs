//! `/requests`: list, read and answer Requests.

use axum::Json;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, header};
use serde::Deserialize;

use super::extract::{JsonBody, QueryParams};
use super::{ApiError, AppState, Wait, WaitQuery, page_size};
use crate::registry::{Filter, RequestView, Status};
use crate::suspension::Answer;

/// The largest page of `GET /requests`.
const MAX_PAGE: usize = 1000;

/// The `status` filter of `GET /requests`.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StatusFilter {
    #[default]
    Pending,
    Answered,
    Expired,
    Cancelled,
    All,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    #[serde(default)]
    status: StatusFilter,
    server: Option<String>,
    session: Option<String>,
    call: Option<String>,
    kind: Option<String>,
    #[serde(default)]
    wait: Wait,
    limit: Option<usize>,
    cursor: Option<u64>,
}

/// `GET /requests`: matching Requests, oldest first, with the next page in a `Link` header.
pub async fn list(
    State(state): State<AppState>,
    RawQuery(raw): RawQuery,
    QueryParams(query): QueryParams<ListQuery>,
) -> Result<(HeaderMap, Json<Vec<RequestView>>), ApiError> {
    let limit = page_size(query.limit, MAX_PAGE)?;
    let filter = Filter {
        status: match query.status {
            StatusFilter::Pending => Some(Status::Pending),
            StatusFilter::Answered => Some(Status::Answered),
            StatusFilter::Expired => Some(Status::Expired),
            StatusFilter::Cancelled => Some(Status::Cancelled),
            StatusFilter::All => None,
        },
        server: query.server,
        session: query.session,
        call: query.call,
        kind: query.kind,
    };
    let cursor = query.cursor.unwrap_or(0);
    let list = || Some(state.registry.list(&filter, cursor, limit)).filter(|(page, _)| !page.is_empty());
    let (page, next) = state
        .changes
        .wait_for(query.wait.duration(), &state.shutdown, list)
        .await
        .unwrap_or_default();
    let mut headers = HeaderMap::new();
    if let Some(next) = next {
        let mut params: Vec<&str> = raw
            .as_deref()
            .unwrap_or_default()
            .split('&')
            .filter(|param| !param.is_empty() && !param.starts_with("cursor="))
            .collect();
        let cursor = format!("cursor={next}");
        params.push(&cursor);
        let link = format!("</requests?{}>; rel=\"next\"", params.join("&"));
        if let Ok(value) = HeaderValue::from_str(&link) {
            headers.insert(header::LINK, value);
        }
    }
    Ok((headers, Json(page)))
}

/// `GET /requests/{id}`: one Request; with `wait`, held while it is pending.
pub async fn get(
    State(state): State<AppState>,
    Path(id): Path<String>,
    QueryParams(query): QueryParams<WaitQuery>,
) -> Result<Json<RequestView>, ApiError> {
    let unknown = || ApiError::not_found(format!("no Request with id {id}"));
    let current = state.registry.get(&id).ok_or_else(unknown)?;
    if current.status != Status::Pending {
        return Ok(Json(current));
    }
    let resolved = || state.registry.get(&id).filter(|view| view.status != Status::Pending);
    match state
        .changes
        .wait_for(query.wait.duration(), &state.shutdown, resolved)
        .await
    {
        Some(view) => Ok(Json(view)),
        None => state.registry.get(&id).map(Json).ok_or_else(unknown),
    }
}

/// `POST /requests/{id}/answer`: resolves a pending Request.
pub async fn answer(
    State(state): State<AppState>,
    Path(id): Path<String>,
    JsonBody(answer): JsonBody<Answer>,
) -> Result<Json<RequestView>, ApiError> {
    if !answer.id.is_empty() && answer.id != id {
        return Err(ApiError::bad_request(format!(
            "the answer's id {:?} differs from the path's {id:?}",
            answer.id
        )));
    }
    if answer.ok && answer.reason.is_some() {
        return Err(ApiError::bad_request("reason is only allowed when ok is false"));
    }
    Ok(Json(state.registry.answer(&id, answer)?))
}
