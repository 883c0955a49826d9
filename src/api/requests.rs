//! `/requests`: list, post, read and answer Requests.

use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{Map, Value};
use utoipa::{IntoParams, ToSchema};

use super::extract::{JsonBody, QueryParams};
use super::{ApiError, AppState, InvalidQuery, LongPollsHeld, Problem, Wait, WaitQuery, page_size, to_completion};
use crate::auth::{Principal, Role};
use crate::feed::{Concern, Key};
use crate::ids::{RequestId, SessionId};
use crate::posted::{Posted, Refusal};
use crate::records::{CallView, DecisionFilter, Event, EventKind, Filter, RequestView, Status};
use crate::suspension::{Answer, RequestKind};

/// The largest page of `GET /requests`.
const MAX_PAGE: usize = 1000;

/// The `status` filter of `GET /requests`.
#[derive(Debug, Clone, Copy, Default, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum StatusFilter {
    #[default]
    Pending,
    Answered,
    Expired,
    Cancelled,
    All,
}

#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Which Requests to list: `pending` by default, `answered` when `answeredBy` or `decision` is given.
    #[param(inline)]
    status: Option<StatusFilter>,
    /// Only Requests of this server.
    server: Option<String>,
    /// Only Requests of this session.
    session: Option<String>,
    /// Only Requests of this call.
    call: Option<String>,
    /// Only Requests of this kind (`input`, `authorization`).
    #[param(value_type = Option<String>)]
    kind: Option<RequestKind>,
    /// Only Requests answered by this name, as `answeredBy` shows it.
    answered_by: Option<String>,
    /// Only Requests answered with this decision: `accepted` (`ok: true`), `declined` (`reason: declined`) or
    /// `cancelled` (any other refusal). An expired or withdrawn Request is listed by its `status`.
    #[param(inline)]
    decision: Option<DecisionFilter>,
    /// Only Requests raised by a call of this tool: its approval, and whatever the tool asked while it ran (a
    /// posted Request, or one no call is known for, has no tool).
    tool: Option<String>,
    /// Seconds to hold the response while nothing matches; a value over 300 counts as 300.
    #[serde(default)]
    #[param(value_type = Option<f64>, minimum = 0)]
    wait: Wait,
    /// Page size, 1 to 1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<usize>,
    /// Where the page starts, as given in the previous page's `Link` header.
    #[param(value_type = Option<i64>, minimum = 0, maximum = 9223372036854775807_i64)]
    cursor: Option<u64>,
}

/// `GET /requests`: matching Requests, oldest first, with the next page in a `Link` header.
#[utoipa::path(
    get,
    path = "/requests",
    tag = "requests",
    params(ListQuery),
    responses(
        (status = 200, description = "Matching Requests, oldest first", body = Vec<RequestView>,
            headers(("Link" = String, description = "The next page, as `<…>; rel=\"next\"`"))),
        (status = 400, response = InvalidQuery),
        (status = 429, response = LongPollsHeld),
    )
)]
pub async fn list(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    RawQuery(raw): RawQuery,
    QueryParams(query): QueryParams<ListQuery>,
) -> Result<(HeaderMap, Json<Vec<RequestView>>), ApiError> {
    let limit = page_size(query.limit, MAX_PAGE)?;
    // Only answered Requests have an answerer or a decision.
    let answered_only = query.answered_by.is_some() || query.decision.is_some();
    let status = query.status.unwrap_or(if answered_only {
        StatusFilter::Answered
    } else {
        StatusFilter::Pending
    });
    let filter = Filter {
        status: match status {
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
        owner: (principal.role == Role::Agent).then(|| principal.id.clone()),
        answered_by: query.answered_by,
        decision: query.decision,
        tool: query.tool,
    };
    let cursor = query.cursor.unwrap_or(0);
    if cursor > i64::MAX as u64 {
        return Err(ApiError::bad_request(format!(
            "cursor must be between 0 and {}, not {cursor}",
            i64::MAX
        )));
    }
    let _held = state.hold_long_poll(&principal, query.wait.duration())?;
    let (registry, listed) = (&state.registry, &filter);
    let list = || async move {
        match registry.list(listed, cursor, limit).await {
            Ok((page, _)) if page.is_empty() => None,
            listed => Some(listed),
        }
    };
    let concerns = |event: &Event| filter.may_concern(event);
    // A list of one call's Requests, or one session's, is woken by that call's or session's events alone.
    let concern = match (&filter.call, &filter.session) {
        (Some(call), _) => Concern::EventsOf(Key::Call(call.clone()), &concerns),
        (None, Some(session)) => Concern::EventsOf(Key::Session(session.clone()), &concerns),
        (None, None) => Concern::Events(&concerns),
    };
    let (page, next) = state
        .feed
        .wait_for(query.wait.duration(), &state.shutdown, concern, list)
        .await
        .unwrap_or_else(|| Ok((Vec::new(), None)))?;
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

/// The body of `POST /requests`: a §10 Request. What each kind requires is checked (see the README).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(
    dead_code,
    reason = "documents the body, which is parsed by `Posted::parse` to list every problem"
)]
pub struct PostRequest {
    /// The Request's id, 1 to 128 of `A-Z a-z 0-9 _ - . :`; the gateway mints a `req-` one when absent.
    #[schema(pattern = "^[A-Za-z0-9_.:-]{1,128}$")]
    id: Option<String>,
    /// Open vocabulary, 1 to 128 of `A-Z a-z 0-9 _ - . :`; `input` needs `data.schema`, `question` needs
    /// `data.questions`, `authorization` needs `url`.
    #[schema(pattern = "^[A-Za-z0-9_.:-]{1,128}$")]
    kind: String,
    /// What is asked, in human words (not blank).
    #[schema(pattern = "\\S")]
    prompt: String,
    /// An http or https URL: where the action happens (`authorization`).
    #[schema(pattern = "^[Hh][Tt][Tt][Pp][Ss]?://[^/?#\\s][^\\s]*$")]
    url: Option<String>,
    /// Kind-specific: `{"schema": …}` (a flat form, as for a form-mode elicitation) for `input`,
    /// `{"questions": [{"question", "header"?, "options"?, "multiple"?}]}` for `question`.
    #[schema(value_type = Option<Object>)]
    data: Option<Map<String, Value>>,
    /// RFC 3339 UTC instant after which the Request expires (default: `requests.ttl` from now).
    #[schema(format = DateTime)]
    expires_at: Option<String>,
}

/// `POST /requests`: raises a Request posted by a toolnexus host, owned by the principal posting it.
#[utoipa::path(
    post,
    path = "/requests",
    tag = "requests",
    request_body(content = PostRequest, content_type = "application/json"),
    responses(
        (status = 201, description = "The Request, pending", body = RequestView,
            headers(("Location" = String, description = "`/requests/{id}`"))),
        (status = 400, description = "The body is malformed, repeats a key within an object, has unknown keys, misses `kind` or `prompt`, or has wrong types; `errors` lists every problem", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "A Request with that id exists already", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "The Request is not what its kind requires, `expiresAt` has passed, or a form or question would collect a credential; `errors` lists every problem", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "As many Requests are pending as requests.max_pending (or the principal's share of it, in count or bytes) allows", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn post(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    JsonBody(body): JsonBody<Map<String, Value>>,
) -> Result<Response, ApiError> {
    let posted = Posted::parse(&body, state.registry.clock().now()).map_err(|refusal| match refusal {
        Refusal::Malformed(problems) => {
            ApiError::listing(StatusCode::BAD_REQUEST, "the body is not a Request", problems)
        }
        Refusal::Unprocessable(problems) => ApiError::listing(
            StatusCode::UNPROCESSABLE_ENTITY,
            "the Request is not one the gateway takes",
            problems,
        ),
    })?;
    let registry = state.registry.clone();
    let view = to_completion(async move { Ok(registry.post(posted, &principal.id).await?) }).await?;
    let mut response = (StatusCode::CREATED, Json(&view)).into_response();
    if let Ok(location) = HeaderValue::from_str(&format!("/requests/{}", view.request.id)) {
        response.headers_mut().insert(header::LOCATION, location);
    }
    Ok(response)
}

/// `GET /requests/{id}`: one Request; with `wait`, held while it is pending.
#[utoipa::path(
    get,
    path = "/requests/{id}",
    tag = "requests",
    params(("id" = String, Path, description = "The Request id"), WaitQuery),
    responses(
        (status = 200, description = "The Request", body = RequestView),
        (status = 400, response = InvalidQuery),
        (status = 403, description = "The Request belongs to another principal", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No Request with that id", body = Problem, content_type = "application/problem+json"),
        (status = 429, response = LongPollsHeld),
    )
)]
pub async fn get(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
    QueryParams(query): QueryParams<WaitQuery>,
) -> Result<Json<RequestView>, ApiError> {
    let unknown = || ApiError::not_found(format!("no Request with id {id}"));
    let id = RequestId::parse(&id).ok_or_else(unknown)?;
    let (status, owner) = state.registry.status(&id).await?.ok_or_else(unknown)?;
    visible(&principal, &id, owner.as_deref())?;
    if status == Status::Pending && !query.wait.duration().is_zero() {
        let _held = state.hold_long_poll(&principal, query.wait.duration())?;
        let (registry, id) = (&state.registry, &id);
        let resolved = || async move {
            match registry.status(id).await {
                Ok(Some((Status::Pending, _))) => None,
                read => Some(read),
            }
        };
        // Only a change to a Request of its call, or of its session when it has no call (none: a posted Request),
        // can resolve it.
        let view = state.registry.get(id).await?.ok_or_else(unknown)?;
        let session = view.session.as_ref().map_or("", SessionId::as_str);
        let key = match &view.call {
            Some(call) => Key::Call(call.to_string()),
            None => Key::Session(session.to_owned()),
        };
        let concerns = |event: &Event| event.kind == EventKind::RequestResolved && event.session == session;
        let waited = state
            .feed
            .wait_for(
                query.wait.duration(),
                &state.shutdown,
                Concern::EventsOf(key, &concerns),
                resolved,
            )
            .await;
        // A read that failed ends the wait with the failure, not with the Request as it was before.
        if let Some(Err(error)) = waited {
            return Err(error.into());
        }
    }
    state.registry.get(&id).await?.map(Json).ok_or_else(unknown)
}

/// `POST /requests/{id}/answer`: resolves a pending Request.
#[utoipa::path(
    post,
    path = "/requests/{id}/answer",
    tag = "requests",
    params(("id" = String, Path, description = "The Request id"), AnswerQuery),
    request_body(content = Answer, content_type = "application/json"),
    responses(
        (status = 200, description = "The resolved Request (also for an identical replay), or, for an approval \
            that needs several people and has not yet had them all, the pending Request with this approval in its \
            `decisions`; with `wait`, and a call the principal may see, that call under `resumedCall` once it \
            stops running again", body = AnsweredRequest),
        (status = 400, description = "The body is malformed, repeats a key within an object, has unknown keys or wrong types, or its id differs from the path", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "The Request belongs to another principal; or, with tokens, it is the approval of the answerer's own call, or its policy's `approvers` do not list the answerer. Nothing changes", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No Request with that id", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Already answered with a different answer; or, on an approval that needs several people, the answerer approved it already and now declines", body = Problem, content_type = "application/problem+json"),
        (status = 410, description = "No longer answerable: expired or cancelled", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "The data does not satisfy the requested schema, an approval's changed arguments do not fit the tool's schema or its policy is not `editable`, or its policy does not offer the `grant` asked for; `errors` lists every violation", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "With `wait`: the principal holds as many responses held by `wait` as limits.long_polls_per_principal allows; nothing was answered", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn answer(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
    QueryParams(query): QueryParams<AnswerQuery>,
    JsonBody(answer): JsonBody<Answer>,
) -> Result<Response, ApiError> {
    // The body's own faults come first (400), then whether the Request exists (404): the order README's API
    // section gives.
    if !answer.id.is_empty() && answer.id != id {
        return Err(ApiError::bad_request(format!(
            "the answer's id {:?} differs from the path's {id:?}",
            answer.id
        )));
    }
    let unknown = || ApiError::not_found(format!("no Request with id {id}"));
    let id = RequestId::parse(&id).ok_or_else(unknown)?;
    // Taken before the answer: past the principal's long-polls nothing is answered. What the Request is comes
    // first all the same (`404`, `403`).
    let held = match state.hold_long_poll(&principal, query.wait.duration()) {
        Ok(held) => held,
        Err(too_many) => {
            state.registry.check_answerer(&id, &principal).await?;
            return Err(too_many);
        }
    };
    let (registry, by) = (state.registry.clone(), principal.clone());
    let answered = to_completion(async move { Ok(registry.answer(&id, &by, answer).await?) }).await?;
    // Before the call is read, so that the wait misses no change after the read.
    let since = held.as_ref().map(|_| state.feed.since());
    if let Some(since) = since
        && let Some(call) = answered.view.call.as_ref()
        && let Some(call) = state.calls.get(call).await?
        && principal.may_see(Some(&call.owner))
    {
        let resumed_call = super::calls::settled(&state, query.wait, since, call, super::calls::Known::Read).await?;
        return Ok(Json(AnsweredRequest {
            request: answered.view,
            resumed_call,
        })
        .into_response());
    }
    Ok(match answered.event {
        // The bytes of the `request.resolved` event, rather than serializing the same view again.
        Some(event) => ([(header::CONTENT_TYPE, "application/json")], event.data.clone()).into_response(),
        None => Json(answered.view).into_response(),
    })
}

/// The query of `POST /requests/{id}/answer`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct AnswerQuery {
    /// Seconds to hold the response, once the answer is kept, until the Request's call stops running again
    /// (completed, failed, cancelled, or waiting on Requests); a value over 300 counts as 300.
    #[serde(default)]
    #[param(value_type = Option<f64>, minimum = 0)]
    wait: Wait,
}

/// A resolved Request, with the call it resumed as that call is once it stops running again.
#[derive(Debug, serde::Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AnsweredRequest {
    #[serde(flatten)]
    request: RequestView,
    /// With `wait`: the Request's call (its id is `call`) once it stopped running, or as it was when `wait`
    /// passed.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<CallView>)]
    resumed_call: Option<super::calls::Found>,
}

/// `403` unless the principal may see the Request `id` owned by `owner`.
fn visible(principal: &Principal, id: &RequestId, owner: Option<&str>) -> Result<(), ApiError> {
    if principal.may_see(owner) {
        Ok(())
    } else {
        Err(ApiError::forbidden(format!(
            "Request {id} belongs to another principal"
        )))
    }
}
