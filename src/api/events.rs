//! `GET /events`: Server-Sent Events for every change to Requests, Calls and Sessions.

use std::collections::VecDeque;
use std::convert::Infallible;
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
use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Schema, Type};
use utoipa::openapi::{OpenApi, Ref, RefOr, Required};
use utoipa::{IntoParams, ToSchema};

use super::extract::QueryParams;
use super::{ApiError, AppState, Problem};
use crate::auth::{Principal, Role};
use crate::feed::{Counted, Live};
use crate::records::{CallView, Event, EventKind, RequestView, SessionView};
use crate::records::{GrantUse, GrantView};
use crate::store::Store;

/// How often an idle stream sends a keep-alive comment.
const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// The event that tells a client it missed events and must list the resources again.
const RESYNC: &str = "resync";
/// How many events a stream reads from the log at a time while it catches up.
const PAGE: usize = 512;
/// The schema component of one event, whatever its type.
const EVENT: &str = "ServerSentEvent";
/// The largest event id: the stores number events with signed 64-bit integers.
pub const MAX_EVENT_ID: u64 = i64::MAX as u64;

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
    /// Resume after this event id, 0 to 2^63-1 (the `Last-Event-ID` header takes precedence).
    #[param(value_type = Option<i64>, minimum = 0, maximum = 9223372036854775807_i64)]
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
        ("Last-Event-ID" = i64, Header, minimum = 0, maximum = 9223372036854775807_i64,
            description = "Resume after this event id, 0 to 2^63-1"),
    ),
    responses(
        (status = 200, description = "Server-Sent Events: `request.created`, `request.resolved`, `request.updated`, \
            `call.updated`, `session.updated` (data: the whole object) and `resync`. The schema describes one \
            event: its `event` type, its `id`, and its `data`, JSON whose schema (`contentSchema`) the type sets",
            body = String, content_type = "text/event-stream"),
        (status = 400, description = "A query parameter or Last-Event-ID is invalid, or an event id is over 2^63-1", body = Problem, content_type = "application/problem+json"),
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
    let last_seen = last_seen(&headers, &query)?;
    let counted = state.hold_stream(&principal)?;
    query.owner = (principal.role == Role::Agent).then_some(principal.id);
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

/// The event id to resume after: the `Last-Event-ID` header's, else `lastEventId`'s; `400` when either is not
/// an event id.
fn last_seen(headers: &HeaderMap, query: &EventsQuery) -> Result<Option<u64>, ApiError> {
    let header = headers.get("last-event-id").map(|value| {
        value
            .to_str()
            .ok()
            .and_then(|text| text.trim().parse::<u64>().ok())
            .filter(|id| *id <= MAX_EVENT_ID)
            .ok_or_else(|| ApiError::bad_request(format!("Last-Event-ID must be an event id, 0 to {MAX_EVENT_ID}")))
    });
    let header = header.transpose()?;
    if let Some(id) = query.last_event_id.filter(|id| *id > MAX_EVENT_ID) {
        return Err(ApiError::bad_request(format!(
            "lastEventId must be between 0 and {MAX_EVENT_ID}, not {id}"
        )));
    }
    Ok(header.or(query.last_event_id))
}

/// One stream's place in the event log: it reads the log until it has caught up, then follows the live
/// events, and goes back to the log when it falls behind them.
struct Follow {
    store: Store,
    live: broadcast::Receiver<Live>,
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
                Ok(event) if event.follows == self.after => {
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

/// Describes in the document every event the stream sends, one schema component per type (`CallUpdatedEvent`,
/// `ResyncEvent`, …) under one `ServerSentEvent` one-of, which the stream's content takes as the schema of one
/// event: its `event` type, its `id`, and its `data`, JSON in a string whose schema `contentSchema` gives.
pub fn document(document: &mut OpenApi) {
    let resync = ObjectBuilder::new()
        .required("reason")
        .property("reason", ObjectBuilder::new().schema_type(Type::String))
        .into();
    let types = EventKind::ALL
        .into_iter()
        .map(|kind| (kind.name(), RefOr::Ref(Ref::from_schema_name(data_schema(kind)))))
        .chain([(RESYNC, resync)]);
    let components = document.components.get_or_insert_with(Default::default);
    let mut one_of = OneOfBuilder::new();
    for (name, data) in types {
        let component = format!("{}Event", name.split('.').map(capitalized).collect::<String>());
        one_of = one_of.item(Ref::from_schema_name(&component));
        components.schemas.insert(component, event_schema(name, data));
    }
    components.schemas.insert(EVENT.to_owned(), one_of.into());
    let Some(operation) = document
        .paths
        .paths
        .get_mut("/events")
        .and_then(|item| item.get.as_mut())
    else {
        return;
    };
    // The annotation cannot make a header optional without making it nullable too.
    for parameter in operation.parameters.iter_mut().flatten() {
        if let RefOr::T(parameter) = parameter
            && parameter.name == "Last-Event-ID"
        {
            parameter.required = Required::False;
        }
    }
    if let Some(RefOr::T(response)) = operation.responses.responses.get_mut("200")
        && let Some(RefOr::T(content)) = response.content.get_mut("text/event-stream")
    {
        content.schema = Some(Ref::from_schema_name(EVENT).into());
    }
}

/// The schema component of an event's `data`: the whole object that changed.
fn data_schema(kind: EventKind) -> String {
    match kind {
        EventKind::RequestCreated | EventKind::RequestResolved | EventKind::RequestUpdated => RequestView::name(),
        EventKind::CallUpdated => CallView::name(),
        EventKind::SessionUpdated => SessionView::name(),
        EventKind::GrantCreated | EventKind::GrantRevoked => GrantView::name(),
        EventKind::GrantUsed => GrantUse::name(),
    }
    .into_owned()
}

/// One event of type `name` whose `data` has the schema `data`.
fn event_schema(name: &str, data: RefOr<Schema>) -> RefOr<Schema> {
    let string = || ObjectBuilder::new().schema_type(Type::String);
    ObjectBuilder::new()
        .description(Some(format!("A `{name}` event")))
        .required("event")
        .property("event", string().enum_values(Some([name])))
        .required("id")
        .property("id", string().pattern(Some("^[0-9]+$")))
        .required("data")
        .property(
            "data",
            string()
                .content_media_type("application/json")
                .content_schema(Some(data)),
        )
        .into()
}

/// `word` with its first letter in upper case, for a component name (`call` → `Call`).
fn capitalized(word: &str) -> String {
    let mut chars = word.chars();
    chars
        .next()
        .map(|first| first.to_uppercase().chain(chars).collect())
        .unwrap_or_default()
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
