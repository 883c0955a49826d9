//! What a request to `/mcp` must pass before the MCP transport sees it: the page's `Origin`, a role that may
//! call tools, a 2025-11-25 session of its own, a body in which no key is given twice, and the principal's
//! bounds — each request in flight counts as a long-poll, each GET stream as a stream, each session against
//! `limits.mcp_sessions_per_principal` — so that `/mcp` keeps every rule REST keeps.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;

use super::{PATH, SESSION_ID, lock};
use crate::api::extract::{JsonFault, body_bytes, is_json, unrepeated_method};
use crate::api::{ApiError, AppState};
use crate::auth::Principal;
use crate::connections::Guarded;

/// The fewest recorded holders at which those of ended sessions are looked for.
const PRUNE_HOLDERS_FROM: usize = 64;

/// The principal that opened each 2025-11-25 session, by `Mcp-Session-Id`: a session answers no other.
#[derive(Clone)]
pub(super) struct Holders {
    by_session: Arc<Mutex<HashMap<String, String>>>,
    /// Sessions being opened, by principal: counted with those open, so that no burst of `initialize`s
    /// passes the cap together.
    opening: Arc<Mutex<HashMap<String, usize>>>,
    /// How many holders there may be before those of ended sessions are forgotten.
    prune_at: Arc<AtomicUsize>,
    /// The sessions rmcp holds, which end unseen here when they idle out.
    sessions: Arc<LocalSessionManager>,
}

impl Holders {
    /// The holders of the sessions `sessions` keeps.
    pub(super) fn of(sessions: Arc<LocalSessionManager>) -> Self {
        Self {
            by_session: Arc::default(),
            opening: Arc::default(),
            prune_at: Arc::new(AtomicUsize::new(PRUNE_HOLDERS_FROM)),
            sessions,
        }
    }

    /// Records who opened `session`, first forgetting the holders of sessions that idled out once there are
    /// twice as many as the last time (so that each opening pays a constant amount for it).
    async fn opened(&self, session: &str, principal: String) {
        if lock(&self.by_session).len() >= self.prune_at.load(Ordering::Relaxed) {
            let live = self.sessions.sessions.read().await;
            let mut by_session = lock(&self.by_session);
            by_session.retain(|id, _| live.contains_key(id.as_str()));
            let next = (by_session.len() * 2).max(PRUNE_HOLDERS_FROM);
            self.prune_at.store(next, Ordering::Relaxed);
        }
        lock(&self.by_session).insert(session.to_owned(), principal);
    }

    /// A place for one more session of `principal`, held until the guard drops; `None` when it has `most` open
    /// or being opened. Its sessions that idled out are forgotten first.
    async fn reserve(&self, principal: &str, most: usize) -> Option<Opening> {
        let theirs: Vec<String> = lock(&self.by_session)
            .iter()
            .filter(|(_, holder)| *holder == principal)
            .map(|(session, _)| session.clone())
            .collect();
        let ended: Vec<String> = {
            let live = self.sessions.sessions.read().await;
            theirs
                .into_iter()
                .filter(|session| !live.contains_key(session.as_str()))
                .collect()
        };
        let mut by_session = lock(&self.by_session);
        for session in ended {
            by_session.remove(&session);
        }
        let open = by_session.values().filter(|holder| *holder == principal).count();
        let mut opening = lock(&self.opening);
        let being_opened = opening.entry(principal.to_owned()).or_default();
        if open + *being_opened >= most {
            return None;
        }
        *being_opened += 1;
        Some(Opening {
            opening: self.opening.clone(),
            principal: principal.to_owned(),
        })
    }
}

/// A session being opened, counted against its principal's cap until it is open or refused.
struct Opening {
    opening: Arc<Mutex<HashMap<String, usize>>>,
    principal: String,
}

impl Drop for Opening {
    fn drop(&mut self) {
        let mut opening = lock(&self.opening);
        if let Some(count) = opening.get_mut(&self.principal) {
            *count -= 1;
            if *count == 0 {
                opening.remove(&self.principal);
            }
        }
    }
}

/// Refuses, before anything runs: a browser page from an origin that is neither the gateway's own nor on
/// `http.cors_origins` (the MCP transport's guard against DNS rebinding), an approver, which may not call
/// tools, a 2025-11-25 session named by another principal than the one that opened it (`404`, as for a session
/// that does not exist, so that a client opens its own), a JSON body with a key twice (`400`), and a request
/// past the principal's bounds (`429`).
pub(super) async fn admit(
    State((state, holders)): State<(AppState, Holders)>,
    request: Request,
    next: Next,
) -> Response {
    match admitted(&state, &holders, request).await {
        Ok(Admitted { request, guard }) => {
            let session = request
                .headers()
                .get(SESSION_ID)
                .and_then(|session| session.to_str().ok())
                .map(str::to_owned);
            let principal = request
                .extensions()
                .get::<Principal>()
                .map(|principal| principal.id.clone())
                .unwrap_or_default();
            let closing = request.method() == Method::DELETE;
            let response = next.run(request).await;
            match (&session, response.headers().get(SESSION_ID)) {
                (None, Some(opened)) => {
                    if let Ok(opened) = opened.to_str() {
                        holders.opened(opened, principal).await;
                    }
                }
                (Some(session), _) if (closing && response.status().is_success()) || response.status() == 404 => {
                    lock(&holders.by_session).remove(session);
                }
                _ => {}
            }
            // A request in flight, or a stream, is counted for as long as its response is being sent.
            response.map(|body| Guarded::body(body, guard))
        }
        Err(refused) => refused.into_response(),
    }
}

/// A request let through, with what counts it against its principal's bounds while it lives.
struct Admitted {
    request: Request,
    guard: Vec<Box<dyn Send + 'static>>,
}

async fn admitted(state: &AppState, holders: &Holders, request: Request) -> Result<Admitted, ApiError> {
    if let Some(origin) = request.headers().get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or_default();
        let own = request
            .headers()
            .get(header::HOST)
            .and_then(|host| host.to_str().ok())
            .is_some_and(|host| {
                ["http://", "https://"]
                    .iter()
                    .any(|scheme| origin.eq_ignore_ascii_case(&format!("{scheme}{host}")))
            });
        let listed = state
            .http
            .cors_origins
            .iter()
            .any(|allowed| allowed.eq_ignore_ascii_case(origin));
        if !own && !listed {
            return Err(ApiError::forbidden(format!(
                "the Origin {origin:?} is not one whose pages may use {PATH} (http.cors_origins)"
            )));
        }
    }
    let principal = request
        .extensions()
        .get::<Principal>()
        .cloned()
        .unwrap_or_else(Principal::anonymous);
    if !principal.may_start() {
        return Err(ApiError::forbidden(format!(
            "{} is an approver: it may not call tools",
            principal.name
        )));
    }
    let session = request
        .headers()
        .get(SESSION_ID)
        .and_then(|session| session.to_str().ok());
    if let Some(session) = session
        && lock(&holders.by_session)
            .get(session)
            .is_some_and(|holder| *holder != principal.id)
    {
        return Err(ApiError::not_found(format!("no session {session:?} of yours")));
    }
    let opens_session = session.is_none();
    let mut guard: Vec<Box<dyn Send + 'static>> = Vec::new();
    let request = match *request.method() {
        Method::GET => {
            guard.push(Box::new(state.hold_stream(&principal)?));
            request
        }
        Method::POST => {
            guard.extend(
                state
                    .hold_long_poll(&principal, state.front_door.max_hold)?
                    .map(|held| Box::new(held) as Box<dyn Send>),
            );
            let (request, initialize) = read_body(state, request).await?;
            if initialize && opens_session && !principal.is_anonymous() {
                let most = state.holds.mcp_sessions;
                let opening = holders.reserve(&principal.id, most).await.ok_or_else(|| {
                    ApiError::new(
                        StatusCode::TOO_MANY_REQUESTS,
                        format!(
                            "{} has {most} {PATH} sessions open, the most one principal may hold \
                             (limits.mcp_sessions_per_principal)",
                            principal.name
                        ),
                    )
                })?;
                guard.push(Box::new(opening));
            }
            request
        }
        _ => request,
    };
    Ok(Admitted { request, guard })
}

/// Reads a JSON body whole, refusing one in which an object has a key twice (`400`, as REST does: parsers
/// disagree on which value counts); says whether it is an `initialize`. A body that is not JSON, or not valid
/// JSON, goes on as it came for the MCP transport to answer.
async fn read_body(state: &AppState, request: Request) -> Result<(Request, bool), ApiError> {
    if !is_json(request.headers()) {
        return Ok((request, false));
    }
    let (parts, body) = request.into_parts();
    // The body limit travels in the extensions.
    let mut whole = Request::new(body);
    *whole.extensions_mut() = parts.extensions.clone();
    let bytes = body_bytes(whole, state).await?;
    let initialize = match unrepeated_method(&bytes) {
        Ok(method) => method.as_deref() == Some("initialize"),
        Err(JsonFault::Ambiguous(detail)) => return Err(ApiError::bad_request(detail)),
        Err(JsonFault::Invalid(_)) => false,
    };
    Ok((Request::from_parts(parts, Body::from(bytes)), initialize))
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use rmcp::transport::streamable_http_server::session::SessionManager;

    use super::*;

    #[tokio::test]
    async fn holders_of_sessions_that_ended_are_forgotten_as_new_ones_open() {
        let sessions = Arc::new(LocalSessionManager::default());
        let holders = Holders::of(sessions.clone());
        let (open, _transport) = sessions.create_session().await.unwrap();
        holders.opened(&open, "ada".to_owned()).await;
        for ended in 1..PRUNE_HOLDERS_FROM {
            holders.opened(&format!("ended-{ended}"), "bob".to_owned()).await;
        }
        assert_eq!(lock(&holders.by_session).len(), PRUNE_HOLDERS_FROM);
        holders.opened("newest", "eve".to_owned()).await;
        let kept: HashSet<String> = lock(&holders.by_session).keys().cloned().collect();
        assert_eq!(kept, HashSet::from([open.to_string(), "newest".to_owned()]));
    }

    #[tokio::test]
    async fn a_principal_reserves_sessions_up_to_its_cap_counting_those_being_opened() {
        let sessions = Arc::new(LocalSessionManager::default());
        let holders = Holders::of(sessions.clone());
        let (open, _transport) = sessions.create_session().await.unwrap();
        holders.opened(&open, "ada".to_owned()).await;
        holders.opened("idled-out", "ada".to_owned()).await;
        let opening = holders
            .reserve("ada", 2)
            .await
            .expect("one open, one idled out: room for one");
        assert!(
            holders.reserve("ada", 2).await.is_none(),
            "one open and one being opened"
        );
        assert!(
            holders.reserve("bob", 2).await.is_some(),
            "another principal's cap is its own"
        );
        drop(opening);
        assert!(holders.reserve("ada", 2).await.is_some());
    }
}
