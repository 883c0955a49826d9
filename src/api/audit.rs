//! `GET /audit`: the audit trail as JSON Lines, each event chained so far with the hash it follows and its
//! own ([`crate::audit`]), read from the store a page at a time as the response is sent. Admins only.

use axum::Extension;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use futures::stream;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;
use utoipa::IntoParams;

use super::events::MAX_EVENT_ID;
use super::extract::QueryParams;
use super::{ApiError, AppState, Problem};
use crate::audit::Entry;
use crate::auth::{Principal, Role};
use crate::store::Store;

/// The media type of the export: one JSON object a line (JSON Lines).
pub const JSON_LINES: &str = "application/jsonl";
/// How many events are read from the store at a time.
const PAGE: usize = 256;

#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct AuditQuery {
    /// Only events after this event id, 0 to 2^63-1: the last id of the previous export. Default 0, every event
    /// kept.
    #[param(value_type = Option<i64>, minimum = 0, maximum = 9223372036854775807_i64)]
    since: Option<String>,
}

/// `GET /audit`: every event chained after `since`, oldest first, one event a line with its hashes.
#[utoipa::path(
    get,
    path = "/audit",
    tag = "audit",
    params(AuditQuery),
    responses(
        (status = 200, description = "JSON Lines: one event a line, oldest first, each with `prev` (the hash of the \
            event before it) and `hash` (the SHA-256 of its canonical form); the schema describes one line. Events are \
            chained moments after they are recorded: those not chained yet come in a later export. \
            `toolnexus-gateway audit verify FILE` checks an export", body = Entry, content_type = "application/jsonl"),
        (status = 400, description = "`since` is not an event id (0 to 2^63-1), or a query parameter is unknown or given twice", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Only admins may export the audit trail", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn export(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    QueryParams(query): QueryParams<AuditQuery>,
) -> Result<Response, ApiError> {
    if principal.role != Role::Admin {
        return Err(ApiError::forbidden(format!(
            "{} may not export the audit trail: admins only",
            principal.name
        )));
    }
    let since = match query.since.as_deref() {
        None => 0,
        Some(text) => text.parse().ok().filter(|id| *id <= MAX_EVENT_ID).ok_or_else(|| {
            ApiError::bad_request(format!("since must be an event id, 0 to {MAX_EVENT_ID}, not {text:?}"))
        })?,
    };
    // The first page read here, so that a store that cannot be read is a 503 and not a cut-off body.
    let first = state.store.chained_after(since, PAGE).await?;
    let pages = Pages {
        store: state.store.clone(),
        shutdown: state.shutdown.clone(),
        after: since,
        first: Some(first),
        done: false,
    };
    let mut response = Body::from_stream(stream::unfold(pages, Pages::next)).into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(JSON_LINES));
    Ok(response)
}

/// The export's pages, each sent as it is read. A failure after the first cuts the body off (the connection is
/// closed without its end), so that a client never takes a part of the export for the whole.
struct Pages {
    store: Store,
    shutdown: CancellationToken,
    /// The id of the last event sent.
    after: u64,
    /// The page read before the response started.
    first: Option<Vec<Entry>>,
    done: bool,
}

impl Pages {
    /// The next page's lines; `None` once every event chained has been sent.
    async fn next(mut self) -> Option<(Result<Bytes, std::io::Error>, Self)> {
        if self.done {
            return None;
        }
        let page = match self.first.take() {
            Some(page) => Ok(page),
            None => tokio::select! {
                page = self.store.chained_after(self.after, PAGE) => page.map_err(std::io::Error::other),
                () = self.shutdown.cancelled() => Err(std::io::Error::other("the gateway is shutting down")),
            },
        };
        let page = match page {
            Ok(page) if page.is_empty() => return None,
            Ok(page) => page,
            Err(error) => {
                tracing::warn!(%error, "an export of the audit trail was cut off");
                self.done = true;
                return Some((Err(error), self));
            }
        };
        self.done = page.len() < PAGE;
        self.after = page.last().map_or(self.after, |entry| entry.id);
        let mut lines = Vec::new();
        for entry in &page {
            serde_json::to_writer(&mut lines, entry).expect("an entry is written to memory as JSON");
            lines.push(b'\n');
        }
        Some((Ok(Bytes::from(lines)), self))
    }
}
