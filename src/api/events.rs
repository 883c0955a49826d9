//! `GET /events`: Server-Sent Events for every change to Requests, Calls and Sessions.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Extension;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures::Stream;
use futures::stream::{self, StreamExt};
use serde::Deserialize;
use tokio::sync::broadcast::error::RecvError;
use utoipa::IntoParams;

use super::extract::QueryParams;
use super::{ApiError, AppState, Problem};
use crate::auth::{Principal, Role};
use crate::events::Event;

/// How often an idle stream sends a keep-alive comment.
const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// The event that tells a client it missed events and must list the resources again.
const RESYNC: &str = "resync";

#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    /// Only events of this server.
    server: Option<String>,
    /// Only events of this session.
    session: Option<String>,
    /// Only events of this call.
    call: Option<String>,
    /// Resume after this event id (the `Last-Event-ID` header takes precedence).
    last_event_id: Option<u64>,
    /// Only events of this owner: an agent sees its own and nothing else.
    #[serde(skip)]
    #[param(ignore)]
    owner: Option<String>,
}

/// `GET /events`: the live feed, resumed after `Last-Event-ID` from the replay buffer when it can be.
#[utoipa::path(
    get,
    path = "/events",
    tag = "events",
    params(
        EventsQuery,
        ("Last-Event-ID" = Option<u64>, Header, description = "Resume after this event id"),
    ),
    responses(
        (status = 200, description = "Server-Sent Events: `request.created`, `request.resolved`, `call.updated`, \
            `session.updated` (data: the whole object) and `resync`", body = String, content_type = "text/event-stream"),
        (status = 400, description = "A query parameter or Last-Event-ID is invalid", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn stream(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    headers: HeaderMap,
    QueryParams(mut query): QueryParams<EventsQuery>,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, ApiError> {
    query.owner = (principal.role == Role::Agent).then_some(principal.name);
    let header = headers.get("last-event-id").map(|value| {
        value
            .to_str()
            .ok()
            .and_then(|text| text.trim().parse::<u64>().ok())
            .ok_or_else(|| ApiError::bad_request("Last-Event-ID must be an event id (a number)"))
    });
    let last_seen = header.transpose()?.or(query.last_event_id);
    let subscription = state.events.subscribe(last_seen);
    let events = state.events.clone();
    let resync = subscription
        .gap
        .then(|| resync_event(events.last_id(), "events were missed"));
    let filter = Arc::new(query);
    let replay_filter = filter.clone();
    let replay = subscription
        .replay
        .into_iter()
        .filter(move |event| replay_filter.matches(event))
        .map(|event| to_sse(&event));
    let live = stream::unfold(subscription.live, move |mut live| {
        let (events, filter) = (events.clone(), filter.clone());
        async move {
            loop {
                match live.recv().await {
                    Ok(event) if filter.matches(&event) => return Some((to_sse(&event), live)),
                    Ok(_) => {}
                    Err(RecvError::Lagged(_)) => {
                        return Some((resync_event(events.last_id(), "this stream fell behind"), live));
                    }
                    Err(RecvError::Closed) => return None,
                }
            }
        }
    });
    let shutdown = state.shutdown.clone();
    let events = stream::iter(resync.into_iter().chain(replay))
        .chain(live)
        .take_until(async move { shutdown.cancelled().await })
        .map(Ok);
    Ok(Sse::new(events).keep_alive(KeepAlive::new().interval(KEEP_ALIVE)))
}

impl EventsQuery {
    fn matches(&self, event: &Event) -> bool {
        self.server.as_ref().is_none_or(|server| *server == event.server)
            && self.session.as_ref().is_none_or(|session| *session == event.session)
            && self.call.as_ref().is_none_or(|call| Some(call) == event.call.as_ref())
            && self
                .owner
                .as_ref()
                .is_none_or(|owner| Some(owner) == event.owner.as_ref())
    }
}

fn to_sse(event: &Event) -> SseEvent {
    SseEvent::default()
        .id(event.id.to_string())
        .event(event.kind.name())
        .data(&event.data)
}

fn resync_event(last_id: u64, reason: &str) -> SseEvent {
    let data = serde_json::json!({ "reason": format!("{reason}: list the resources again") });
    SseEvent::default()
        .id(last_id.to_string())
        .event(RESYNC)
        .data(data.to_string())
}
