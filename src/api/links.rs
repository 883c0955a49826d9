//! Answer links: `POST /requests/{id}/links` makes one for the principal asking, and `/r/{token}` is the page a
//! link opens. Its `GET` only shows the Request (mail scanners and chat previews fetch links); only the page's
//! form, posted to the same URL, answers. The token is the page's only credential.

mod page;
pub mod sign_in;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Serialize;
use utoipa::ToSchema;

use super::{ApiError, AppState, Problem, to_completion};
use crate::auth::Principal;
use crate::ids::RequestId;
use crate::links::{Holder, Link, LinkError};
use crate::records::Status;
use crate::suspension::Answer;
use crate::time::Timestamp;

/// A link made for its principal.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MadeLink {
    /// The link's page, under `public_url`.
    url: String,
    /// When it stops working: the Request's expiry.
    expires_at: Timestamp,
}

/// What a link's page posts: the decision, and the form's fields (`f.<property>`, `q.<question>`).
#[derive(Debug, ToSchema)]
#[allow(dead_code, reason = "read as pairs; documents the form")]
pub struct LinkForm {
    #[schema(pattern = "^(approve|accept|decline)$")]
    decision: String,
}

/// `POST /requests/{id}/links`: a link that answers the pending Request as the principal asking, from any
/// browser, until the Request expires.
#[utoipa::path(
    post,
    path = "/requests/{id}/links",
    operation_id = "make_link",
    tag = "requests",
    params(("id" = String, Path, description = "The Request id")),
    responses(
        (status = 201, description = "A link that answers the Request as the principal asking", body = MadeLink),
        (status = 403, description = "The principal may not answer the Request", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No Request with that id", body = Problem, content_type = "application/problem+json"),
        (status = 410, description = "The Request is no longer pending", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "The link would be too long to use: the principal carries too many groups", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn make(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let unknown = || ApiError::not_found(format!("no Request with id {id}"));
    let request = RequestId::parse(&id).ok_or_else(unknown)?;
    state.registry.check_answerer(&request, &principal).await?;
    let view = state.registry.get(&request).await?.ok_or_else(unknown)?;
    let expires_at = view.request.expires_at.as_deref().and_then(Timestamp::parse);
    let expires_at = match (view.status, expires_at) {
        (Status::Pending, Some(expires_at)) => expires_at,
        (status, _) => {
            return Err(ApiError::new(
                StatusCode::GONE,
                format!("Request {id} is no longer answerable: it is {}", status.as_str()),
            ));
        }
    };
    let link = Link {
        request,
        holder: Holder::Asked(principal),
        expires_at,
    };
    let token = state.links.token(&link);
    if token.len() > crate::links::MAX_MADE {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!(
                "a link for {} would be longer than {} characters (it carries the principal's groups): ask for it \
                 as a principal with fewer",
                principal_name(&link),
                crate::links::MAX_MADE
            ),
        ));
    }
    let made = MadeLink {
        url: state.links.url_of(&token),
        expires_at,
    };
    Ok((StatusCode::CREATED, Json(made)).into_response())
}

fn principal_name(link: &Link) -> &str {
    match &link.holder {
        Holder::Asked(principal) => &principal.name,
        Holder::Sent { channel, .. } => channel,
    }
}

/// `GET /r/{token}`: the page of an answer link; it never answers.
#[utoipa::path(
    get,
    path = "/r/{token}",
    operation_id = "open_link",
    tag = "inbox",
    params(("token" = String, Path, description = "The link's signed token")),
    responses(
        (status = 200, description = "The Request, with a form to answer it while it is pending", content_type = "text/html", body = String),
        (status = 404, description = "The link is not valid: changed, made by another gateway or key, or for a Request no longer kept", content_type = "text/html", body = String),
        (status = 410, description = "The link has expired", content_type = "text/html", body = String),
        (status = 503, description = "The Request cannot be read right now (the store is unavailable): try again", content_type = "text/html", body = String),
    )
)]
pub async fn open(State(state): State<AppState>, Path(token): Path<String>, headers: HeaderMap) -> Response {
    match read(&state, &token).await {
        Ok((link, view)) => {
            let call = call_of(&state, &view).await;
            let (_, signing) = answering(&state, &headers, &token, &link);
            html(
                StatusCode::OK,
                page::request(&view, call.as_ref(), &signing, None, &[], &[]),
            )
        }
        Err(refused) => refused,
    }
}

/// `POST /r/{token}`: answers the link's Request with what its page's form posted, as the link's holder.
#[utoipa::path(
    post,
    path = "/r/{token}",
    operation_id = "answer_by_link",
    tag = "inbox",
    params(("token" = String, Path, description = "The link's signed token")),
    request_body(content = LinkForm, content_type = "application/x-www-form-urlencoded",
        description = "`decision=approve|accept|decline`, and the form's fields"),
    responses(
        (status = 200, description = "Answered (or, for an approval that needs several people, counted)", content_type = "text/html", body = String),
        (status = 400, description = "The form says no decision", content_type = "text/html", body = String),
        (status = 401, description = "With links.sign_in: nobody has signed in for this link yet", content_type = "text/html", body = String),
        (status = 403, description = "The link's holder may not answer this Request, or the form was posted from another page", content_type = "text/html", body = String),
        (status = 404, description = "The link is not valid", content_type = "text/html", body = String),
        (status = 409, description = "This person's approval is counted already, or the Request was just answered otherwise", content_type = "text/html", body = String),
        (status = 410, description = "The link has expired, or the Request is no longer pending: the page says how it ended", content_type = "text/html", body = String),
        (status = 413, description = "The form is larger than http.max_body_bytes", content_type = "text/html", body = String),
        (status = 422, description = "The answer does not fit the form: the page again, with the violations", content_type = "text/html", body = String),
        (status = 503, description = "The answer cannot be kept right now (the store is unavailable): nothing was changed, try again", content_type = "text/html", body = String),
    )
)]
pub async fn answer(
    State(state): State<AppState>,
    Path(token): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let body = match body {
        Ok(body) => body,
        Err(rejection) => return html(rejection.status(), page::notice("Not answered", &rejection.body_text())),
    };
    // Only the page's own form answers: a browser says where a post comes from, and one from another page (a
    // sibling site that learnt a link, while its person is signed in) answers nothing.
    let from = headers.get("sec-fetch-site").and_then(|value| value.to_str().ok());
    if from.is_some_and(|from| !matches!(from, "same-origin" | "none")) {
        return html(
            StatusCode::FORBIDDEN,
            page::notice(
                "Not answered",
                "Only the link's own page answers: open the link and answer there.",
            ),
        );
    }
    let (link, view) = match read(&state, &token).await {
        Ok(read) => read,
        Err(refused) => return refused,
    };
    // Read whatever its content type says: a form posts nothing else, and a malformed one is a page, not a 415.
    let form: Vec<(String, String)> = serde_urlencoded::from_bytes(&body).unwrap_or_default();
    let call = call_of(&state, &view).await;
    let (principal, signing) = answering(&state, &headers, &token, &link);
    let refused_page = |status: StatusCode, problem: &str, violations| {
        html(
            status,
            page::request(&view, call.as_ref(), &signing, Some(problem), violations, &form),
        )
    };
    // A form that says no decision is refused as such, whatever became of the Request.
    let accepts = match page::accepts(&form) {
        Ok(accepts) => accepts,
        Err(why) => return refused_page(StatusCode::BAD_REQUEST, &why, &[]),
    };
    if view.status != Status::Pending {
        return html(
            StatusCode::GONE,
            page::request(&view, call.as_ref(), &signing, None, &[], &[]),
        );
    }
    let Some(principal) = principal else {
        return refused_page(
            StatusCode::UNAUTHORIZED,
            "Sign in first: this link answers as the person who does.",
            &[],
        );
    };
    let answer: Answer = match serde_json::from_value(page::answer(&view, &form, accepts)) {
        Ok(answer) => answer,
        Err(error) => return refused_page(StatusCode::BAD_REQUEST, &error.to_string(), &[]),
    };
    let (registry, id, by) = (state.registry.clone(), link.request.clone(), principal.clone());
    let answered = to_completion(async move { Ok(registry.answer(&id, &by, answer).await?) }).await;
    match answered {
        // The same answer again changes nothing: a link answers once.
        Ok(accepted) if accepted.event.is_none() => html(
            StatusCode::CONFLICT,
            page::notice(
                "Answered already",
                "This link's answer was given already: nothing changed.",
            ),
        ),
        Ok(accepted) if accepted.view.status == Status::Pending => html(
            StatusCode::OK,
            page::notice(
                "Approval counted",
                &format!(
                    "Thank you, {}: your approval is counted. The call goes ahead once enough people have \
                     approved.",
                    principal.name
                ),
            ),
        ),
        Ok(accepted) => {
            let said = match accepted.view.answer.as_deref().map(Answer::ok) {
                Some(true) => "Answered",
                _ => "Declined",
            };
            html(
                StatusCode::OK,
                page::notice(
                    said,
                    &format!("Thank you, {}: the gateway has your answer.", principal.name),
                ),
            )
        }
        Err(error) => {
            // The page again for an answer the Request can still take; a notice for one it never will.
            let (status, detail) = (error.status(), error.detail().to_owned());
            match status {
                StatusCode::UNPROCESSABLE_ENTITY => refused_page(status, &detail, error.errors()),
                StatusCode::BAD_REQUEST => refused_page(status, &detail, &[]),
                _ => html(status, page::notice("Not answered", &detail)),
            }
        }
    }
}

/// Who answers through `link` (whose token is `token`), and what its page says of signing in: the link's holder;
/// with `links.sign_in`, the person signed in for the link's Request in this browser (its session cookie, which
/// only [`sign_in::signed_in`] sets), else nobody yet.
fn answering(state: &AppState, headers: &HeaderMap, token: &str, link: &Link) -> (Option<Principal>, page::Signing) {
    if !state.links.sign_in {
        return (Some(link.holder.principal()), page::Signing::Off);
    }
    let now = state.registry.clock().now();
    let session = sign_in::cookie(headers, &sign_in::session_cookie(&link.request))
        .and_then(|value| state.links.read_session(value, now).ok())
        .filter(|session| session.request == link.request);
    match session.map(|session| session.holder) {
        Some(Holder::Asked(person)) => {
            let name = person.name.clone();
            (
                Some(Holder::Asked(person).principal()),
                page::Signing::SignedIn { name },
            )
        }
        _ => (
            None,
            page::Signing::Needed {
                url: format!("{}{token}/sign-in", crate::links::PATH),
            },
        ),
    }
}

/// The link `token` is and its Request as kept now, or the page that says why there is none.
async fn read(state: &AppState, token: &str) -> Result<(Link, crate::records::RequestView), Response> {
    let now = state.registry.clock().now();
    let link = state.links.read(token, now).map_err(|error| {
        let status = match error {
            LinkError::Expired => StatusCode::GONE,
            LinkError::Malformed | LinkError::Signature => StatusCode::NOT_FOUND,
        };
        html(status, page::notice("Link not valid", &error.to_string()))
    })?;
    match state.registry.get(&link.request).await {
        Ok(Some(view)) => Ok((link, view)),
        Ok(None) => Err(html(
            StatusCode::NOT_FOUND,
            page::notice(
                "Link not valid",
                "The gateway no longer keeps the Request this link was for.",
            ),
        )),
        Err(error) => {
            let error = ApiError::from(error);
            Err(html(error.status(), page::notice("Try again", error.detail())))
        }
    }
}

/// The call a Request belongs to, when it can be read: what the page shows of the tool and its arguments.
async fn call_of(state: &AppState, view: &crate::records::RequestView) -> Option<crate::records::CallView> {
    state.calls.get(view.call.as_ref()?).await.ok().flatten()
}

/// An HTML page with the link page's headers: no caching, no referrer (the URL is a credential), never framed.
fn html(status: StatusCode, body: String) -> Response {
    let mut response = (status, body).into_response();
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_TYPE, "text/html; charset=utf-8"),
        (header::CACHE_CONTROL, "no-store"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; base-uri 'none'; \
             frame-ancestors 'none'",
        ),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    headers.insert("x-robots-tag", HeaderValue::from_static("noindex, nofollow"));
    response
}
