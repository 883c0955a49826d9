//! Signing in before a link answers (`links.sign_in`): the gateway runs the authorization-code flow with PKCE
//! against the OpenID provider with the inbox's client, server-side, so the link's page needs no script. The
//! attempt (the link, `state`, the PKCE verifier) travels in a sealed cookie; back from the provider, the
//! gateway trades the code for an access token, checks it as it checks any bearer token, and checks that the
//! person is the one the link was for. It then keeps a session for that Request in a sealed cookie: a link of
//! the Request held by that person, for 15 minutes at most.

use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as BASE64URL;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{AppState, html, page, read};
use crate::auth::{Principal, SignIn};
use crate::ids::RequestId;
use crate::links::{Holder, Link, PATH};
use crate::records::Status;
use crate::time::Timestamp;

/// What an attempt's seal is made for, so that no other sealed value passes for one.
const ATTEMPT: &[u8] = b"toolnexus-gateway link sign-in attempt v1.";
/// The cookie an attempt travels in.
const ATTEMPT_COOKIE: &str = "toolnexus-sign-in";
/// How long a person has to sign in at the provider.
const ATTEMPT_LIFETIME: Duration = Duration::from_secs(600);
/// How long a session answers for its person, at most (never past the Request's expiry).
const SESSION_LIFETIME: Duration = Duration::from_secs(900);
/// Where the provider sends the browser back, below the public URL; registered at the provider for the
/// inbox's client.
pub const RETURN_PATH: &str = "/r/signed-in";

/// A sign-in under way.
#[derive(Debug, Serialize, Deserialize)]
struct Attempt {
    /// The link's token.
    token: String,
    state: String,
    verifier: String,
    /// Milliseconds since the Unix epoch.
    expires_at: i64,
}

/// The session cookie of a Request's links.
pub fn session_cookie(request: &RequestId) -> String {
    format!("toolnexus-link-{request}")
}

/// The value of the cookie `name` the request carries.
pub fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find_map(|(key, value)| (key == name).then_some(value))
}

/// `name=value` for the link pages' cookies: sent back only to them, never to scripts, and across the
/// provider's redirect back (`Lax`); `Secure` behind `https://`.
fn set_cookie(state: &AppState, name: &str, value: &str, lifetime: Duration) -> HeaderValue {
    let secure = if state.links.public_url().starts_with("https://") {
        "; Secure"
    } else {
        ""
    };
    let cookie = format!(
        "{name}={value}; Path=/r/; Max-Age={}; HttpOnly; SameSite=Lax{secure}",
        lifetime.as_secs()
    );
    HeaderValue::from_str(&cookie).unwrap_or_else(|_| HeaderValue::from_static("toolnexus-invalid=; Max-Age=0"))
}

fn random() -> Option<String> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).ok()?;
    Some(BASE64URL.encode(bytes))
}

/// `GET /r/{token}/sign-in`: sends the browser to the OpenID provider to sign in before the link answers.
#[utoipa::path(
    get,
    path = "/r/{token}/sign-in",
    operation_id = "sign_in_for_link",
    tag = "inbox",
    params(("token" = String, Path, description = "The link's signed token")),
    responses(
        (status = 303, description = "To the provider's sign-in, with a sealed cookie of the attempt"),
        (status = 404, description = "The link is not valid, or links do not ask to sign in", content_type = "text/html", body = String),
        (status = 410, description = "The link has expired, or the Request is no longer pending", content_type = "text/html", body = String),
        (status = 503, description = "The Request cannot be read right now (the store is unavailable): try again", content_type = "text/html", body = String),
    )
)]
pub async fn sign_in(State(state): State<AppState>, Path(token): Path<String>) -> Response {
    let provider = state.auth.authenticator.oidc().and_then(|oidc| oidc.inbox());
    let Some(provider) = provider.filter(|_| state.links.sign_in) else {
        return html(
            StatusCode::NOT_FOUND,
            page::notice("No sign-in", "This gateway's links answer without signing in."),
        );
    };
    let view = match read(&state, &token).await {
        Ok((_, view)) => view,
        Err(refused) => return refused,
    };
    if view.status != Status::Pending {
        return html(
            StatusCode::GONE,
            page::notice("Nothing to answer", "This Request is no longer pending."),
        );
    }
    let (Some(state_value), Some(verifier)) = (random(), random()) else {
        return html(
            StatusCode::SERVICE_UNAVAILABLE,
            page::notice("Try again", "No random bytes for the sign-in."),
        );
    };
    let challenge = BASE64URL.encode(Sha256::digest(verifier.as_bytes()));
    let now = state.registry.clock().now();
    let attempt = Attempt {
        token,
        state: state_value.clone(),
        verifier,
        expires_at: now.after(ATTEMPT_LIFETIME).millis(),
    };
    let sealed = state.links.seal(ATTEMPT, &attempt);
    let Ok(mut url) = reqwest::Url::parse(&provider.authorization_endpoint) else {
        return html(
            StatusCode::SERVICE_UNAVAILABLE,
            page::notice("Try again", "The provider's sign-in address is not a URL."),
        );
    };
    url.query_pairs_mut()
        .append_pair("response_type", "code")
        .append_pair("client_id", &provider.client_id)
        .append_pair("redirect_uri", &return_url(&state))
        .append_pair("scope", &provider.scope)
        .append_pair("state", &state_value)
        .append_pair("code_challenge", &challenge)
        .append_pair("code_challenge_method", "S256");
    see_other(
        url.as_str(),
        [set_cookie(&state, ATTEMPT_COOKIE, &sealed, ATTEMPT_LIFETIME)],
    )
}

/// A `303` to `location` that sets `cookies`, neither cached nor telling the next page where it came from.
fn see_other<const N: usize>(location: &str, cookies: [HeaderValue; N]) -> Response {
    let mut response = StatusCode::SEE_OTHER.into_response();
    let headers = response.headers_mut();
    if let Ok(location) = HeaderValue::from_str(location) {
        headers.insert(header::LOCATION, location);
    }
    for cookie in cookies {
        headers.append(header::SET_COOKIE, cookie);
    }
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    response
}

fn return_url(state: &AppState) -> String {
    format!("{}{RETURN_PATH}", state.links.public_url())
}

/// What the provider sends back.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct Returned {
    /// The authorization code.
    code: Option<String>,
    /// The attempt's `state`.
    state: Option<String>,
    /// Why the provider refused.
    error: Option<String>,
    error_description: Option<String>,
}

/// `GET /r/signed-in`: back from the provider, takes the person's token and opens the link's page as them.
#[utoipa::path(
    get,
    path = "/r/signed-in",
    operation_id = "signed_in_for_link",
    tag = "inbox",
    params(Returned),
    responses(
        (status = 303, description = "Back to the link's page, with a sealed session cookie for its Request"),
        (status = 400, description = "No sign-in of this browser is under way, or it is not this one", content_type = "text/html", body = String),
        (status = 401, description = "The provider refused, or its token is not one the gateway takes", content_type = "text/html", body = String),
        (status = 403, description = "The person who signed in is not the one the link was sent to", content_type = "text/html", body = String),
        (status = 404, description = "The link is not valid", content_type = "text/html", body = String),
        (status = 410, description = "The link has expired", content_type = "text/html", body = String),
        (status = 502, description = "The provider could not be asked for the token", content_type = "text/html", body = String),
        (status = 503, description = "The Request cannot be read right now (the store is unavailable): try again", content_type = "text/html", body = String),
    )
)]
pub async fn signed_in(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(returned): Query<Returned>,
) -> Response {
    let now = state.registry.clock().now();
    let attempt = cookie(&headers, ATTEMPT_COOKIE)
        .and_then(|sealed| state.links.unseal::<Attempt>(ATTEMPT, sealed).ok())
        .filter(|attempt| Timestamp::from_millis(attempt.expires_at) > now)
        .filter(|attempt| returned.state.as_deref() == Some(attempt.state.as_str()));
    let Some(attempt) = attempt else {
        return html(
            StatusCode::BAD_REQUEST,
            page::notice(
                "Sign in again",
                "No sign-in of this browser is under way, or it took too long: open the link again.",
            ),
        );
    };
    if let Some(error) = returned.error {
        let why = returned.error_description.unwrap_or(error);
        return html(
            StatusCode::UNAUTHORIZED,
            page::notice("Not signed in", &format!("The provider said: {why}")),
        );
    }
    let (link, _) = match read(&state, &attempt.token).await {
        Ok(read) => read,
        Err(refused) => return refused,
    };
    let person = match token_of(&state, returned.code.as_deref().unwrap_or_default(), &attempt.verifier).await {
        Ok(access) => {
            state
                .auth
                .authenticator
                .authenticate(Some(&format!("Bearer {access}")))
                .await
        }
        Err(refused) => return refused,
    };
    let person = match person {
        Ok(person) => person,
        Err(error) => {
            return html(
                StatusCode::UNAUTHORIZED,
                page::notice("Not signed in", &error.to_string()),
            );
        }
    };
    if let Err(why) = is_for(&link.holder, &person) {
        return html(StatusCode::FORBIDDEN, page::notice("Not your link", &why));
    }
    let session = Link {
        request: link.request.clone(),
        holder: Holder::Asked(person),
        expires_at: link.expires_at.min(now.after(SESSION_LIFETIME)),
    };
    let lifetime = state.registry.clock().until(session.expires_at);
    let sealed = state.links.session(&session);
    see_other(
        &format!("{PATH}{}", attempt.token),
        [
            set_cookie(&state, &session_cookie(&link.request), &sealed, lifetime),
            set_cookie(&state, ATTEMPT_COOKIE, "", Duration::ZERO),
        ],
    )
}

/// Trades the provider's `code` for an access token, with the attempt's PKCE `verifier`.
async fn token_of(state: &AppState, code: &str, verifier: &str) -> Result<String, Response> {
    let unreachable = |why: String| html(StatusCode::BAD_GATEWAY, page::notice("Not signed in", &why));
    let (client, provider) = state
        .auth
        .authenticator
        .oidc()
        .and_then(|oidc| Some((oidc.client(), oidc.inbox()?)))
        .ok_or_else(|| unreachable("no provider is configured".to_owned()))?;
    let form = [
        ("grant_type", "authorization_code"),
        ("code", code),
        ("redirect_uri", &return_url(state)),
        ("client_id", &provider.client_id),
        ("code_verifier", verifier),
    ];
    let reply = client
        .post(&provider.token_endpoint)
        .header(header::ACCEPT, "application/json")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(serde_urlencoded::to_string(form).unwrap_or_default())
        .send()
        .await
        .map_err(|error| unreachable(format!("the provider could not be reached: {}", error.without_url())))?;
    let status = reply.status();
    let body: serde_json::Value = reply.json().await.unwrap_or_default();
    match body.get("access_token").and_then(serde_json::Value::as_str) {
        Some(token) if status.is_success() => Ok(token.to_owned()),
        _ => {
            let why = body
                .get("error_description")
                .or_else(|| body.get("error"))
                .and_then(serde_json::Value::as_str)
                .map_or_else(|| format!("the provider answered {status}"), str::to_owned);
            Err(html(StatusCode::UNAUTHORIZED, page::notice("Not signed in", &why)))
        }
    }
}

/// Whether `person` may answer through a link held by `holder`: the address a channel sent it to must be the
/// person's verified email; a link a principal asked for, that principal's; a link posted to a chat channel
/// (no address), anyone who signs in.
fn is_for(holder: &Holder, person: &Principal) -> Result<(), String> {
    let email = match &person.signed_in {
        SignIn::Oidc { email, .. } => email.as_deref(),
        _ => None,
    };
    match holder {
        Holder::Sent { to: Some(to), .. } if email == Some(to.as_str()) => Ok(()),
        Holder::Sent { to: Some(to), .. } => Err(format!(
            "This link was sent to {to}; you signed in as {}, whose verified email is not that.",
            person.name
        )),
        Holder::Sent { to: None, .. } => Ok(()),
        Holder::Asked(asked) if asked.id == person.id => Ok(()),
        Holder::Asked(asked) => Err(format!(
            "This link was made for {}; you signed in as {}.",
            asked.name, person.name
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::Role;

    fn person(id: &str, email: Option<&str>) -> Principal {
        Principal {
            id: format!("https://idp.example.com#{id}"),
            name: id.to_owned(),
            role: Role::Approver,
            signed_in: SignIn::Oidc {
                issuer: "https://idp.example.com".to_owned(),
                subject: id.to_owned(),
                email: email.map(str::to_owned),
                groups: Vec::new(),
            },
        }
    }

    #[test]
    fn a_link_is_for_the_verified_address_it_was_sent_to_or_the_one_who_asked_for_it() {
        let mailed = Holder::Sent {
            channel: "mail".to_owned(),
            to: Some("alice@example.com".to_owned()),
        };
        assert!(is_for(&mailed, &person("alice", Some("alice@example.com"))).is_ok());
        assert!(
            is_for(&mailed, &person("alice", None)).is_err(),
            "an unverified email is no proof"
        );
        assert!(is_for(&mailed, &person("bob", Some("bob@example.com"))).is_err());
        // A token of that name is not the address's owner.
        assert!(is_for(&mailed, &Principal::token("alice@example.com", Role::Approver)).is_err());
        let posted = Holder::Sent {
            channel: "slack".to_owned(),
            to: None,
        };
        assert!(is_for(&posted, &person("bob", None)).is_ok());
        let asked = Holder::Asked(person("alice", None));
        assert!(is_for(&asked, &person("alice", None)).is_ok());
        assert!(is_for(&asked, &person("bob", None)).is_err());
    }

    #[test]
    fn a_cookie_is_found_among_others() {
        let mut headers = HeaderMap::new();
        headers.append(header::COOKIE, HeaderValue::from_static("a=1; toolnexus-sign-in=x.y"));
        headers.append(header::COOKIE, HeaderValue::from_static("b=2"));
        assert_eq!(cookie(&headers, ATTEMPT_COOKIE), Some("x.y"));
        assert_eq!(cookie(&headers, "b"), Some("2"));
        assert_eq!(cookie(&headers, "c"), None);
    }
}
