//! `GET /events`: Server-Sent Events for every change to Requests, Calls and Sessions.

use std::collections::VecDeque;
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
use tokio::sync::broadcast;
use tokio::sync::broadcast::error::RecvError;
use utoipa::IntoParams;

use super::extract::QueryParams;
use super::{ApiError, AppState, Problem};
use crate::auth::{Principal, Role};
use crate::feed::Counted;
use crate::records::Event;
use crate::store::Store;

/// How often an idle stream sends a keep-alive comment.
const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// The event that tells a client it missed events and must list the resources again.
const RESYNC: &str = "resync";
/// How many events a stream reads from the log at a time while it catches up.
const PAGE: usize = 512;

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

/// `GET /events`: the live feed, resumed after `Last-Event-ID` from the event log when it can be.
#[utoipa::path(
    get,
    path = "/events",
    tag = "events",
    params(
        EventsQuery,
        ("Last-Event-ID" = Option<u64>, Header, description = "Resume after this event id"),
    ),
    responses(
        (status = 200, description = "Server-Sent Events: `request.created`, `request.resolved`, `request.updated`, \
            `call.updated`, `session.updated` (data: the whole object) and `resync`", body = String, content_type = "text/event-stream"),
        (status = 400, description = "A query parameter or Last-Event-ID is invalid", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The event log cannot be read", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "The principal has as many event streams open as limits.streams_per_principal allows", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn stream(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    headers: HeaderMap,
    QueryParams(mut query): QueryParams<EventsQuery>,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, ApiError> {
    let counted = state.hold_stream(&principal)?;
    query.owner = (principal.role == Role::Agent).then_some(principal.name);
    let header = headers.get("last-event-id").map(|value| {
        value
            .to_str()
            .ok()
            .and_then(|text| text.trim().parse::<u64>().ok())
            .ok_or_else(|| ApiError::bad_request("Last-Event-ID must be an event id (a number)"))
    });
    let last_seen = header.transpose()?.or(query.last_event_id);
    // Subscribed before the log is read, so that nothing recorded in between is missed.
    let live = state.feed.subscribe();
    let after = match last_seen {
        Some(id) => id,
        None => state.store.last_event_id().await?,
    };
    let follow = Follow {
        store: state.store.clone(),
        live,
        after,
        catching_up: last_seen.is_some(),
        ready: VecDeque::new(),
        filter: query,
        _counted: counted,
    };
    let shutdown = state.shutdown.clone();
    let events = stream::unfold(follow, |mut follow| async move {
        let event = follow.next().await?;
        Some((event, follow))
    })
    .take_until(async move { shutdown.cancelled().await })
    .map(Ok);
    Ok(Sse::new(events).keep_alive(KeepAlive::new().interval(KEEP_ALIVE)))
}

/// One stream's place in the event log: it reads the log until it has caught up, then follows the live
/// events, and goes back to the log when it falls behind them.
struct Follow {
    store: Store,
    live: broadcast::Receiver<Arc<Event>>,
    /// The id of the last event this stream has passed.
    after: u64,
    catching_up: bool,
    /// SSE events read and not yet sent.
    ready: VecDeque<SseEvent>,
    filter: EventsQuery,
    _counted: Counted,
}

impl Follow {
    /// The next SSE event of the stream; `None` when the gateway stops publishing.
    async fn next(&mut self) -> Option<SseEvent> {
        loop {
            if let Some(event) = self.ready.pop_front() {
                return Some(event);
            }
            if self.catching_up {
                self.catch_up().await;
                continue;
            }
            match self.live.recv().await {
                Ok(event) if event.id <= self.after => {}
                // Too large for the live channel: read from the log.
                Ok(event) if !event.has_data() => self.catching_up = true,
                Ok(event) if event.id == self.after + 1 => {
                    self.after = event.id;
                    if self.filter.matches(&event) {
                        return Some(to_sse(&event));
                    }
                }
                Ok(_) | Err(RecvError::Lagged(_)) => self.catching_up = true,
                Err(RecvError::Closed) => return None,
            }
        }
    }

    /// Reads the next page of the log into `ready`, or a `resync` when the log no longer has what was missed.
    async fn catch_up(&mut self) {
        match self.store.events_after(self.after, PAGE).await {
            Ok(page) if page.gap => {
                // The client re-reads the state on `resync`: what follows is what happens from now on.
                self.after = self.store.last_event_id().await.unwrap_or(page.resume_after);
                self.ready.push_back(resync_event(self.after, "events were missed"));
                self.catching_up = false;
            }
            Ok(page) => {
                self.catching_up = page.events.len() == PAGE;
                for event in page.events {
                    self.after = event.id;
                    if self.filter.matches(&event) {
                        self.ready.push_back(to_sse(&event));
                    }
                }
            }
            Err(error) => {
                tracing::warn!(%error, "an event stream could not read the event log");
                self.ready
                    .push_back(resync_event(self.after, "the event log could not be read"));
                self.catching_up = false;
            }
        }
    }
}

impl EventsQuery {
    fn matches(&self, event: &Event) -> bool {
        event.tagged(
            self.server.as_deref(),
            self.session.as_deref(),
            self.call.as_deref(),
            self.owner.as_deref(),
        )
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
