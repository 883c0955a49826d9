//! The final state, read through the API once every fault is healed: each Request and call the history
//! names, once it has settled (within the ttl), the whole event log, every webhook delivery, and the journal
//! of what the upstream received.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use futures::StreamExt;
use serde_json::{Value, json};

use crate::api::Api;
use crate::helpers::parse_event;
use crate::history::History;

/// How many reads run at once while the state settles.
const READERS: usize = 32;

/// What the checker reads besides the history.
#[derive(Debug, Default)]
pub struct Final {
    /// Each Request by id, as `GET /requests/{id}` shows it.
    pub requests: BTreeMap<String, Value>,
    /// Each call by id, as `GET /calls/{id}` shows it.
    pub calls: BTreeMap<String, Value>,
    /// The event log, replayed from the start: `(id, type, data)`.
    pub log: Vec<(u64, String, Value)>,
    /// What the upstream received, one object a line (see `demo::Journal`).
    pub journal: Vec<Value>,
}

/// Reads the final state through `api`, once `settle` (the ttl, and the lease with replicas) has let every
/// Request expire and every call end.
pub async fn read(api: &Api, history: &History, settle: Duration, journal: &Path) -> anyhow::Result<Final> {
    // Held while pending: a Request still pending after that (and a margin) has outlived its expiry.
    let settle = settle.as_secs() + 5;
    let (mut requests, mut calls) = (BTreeSet::new(), BTreeSet::new());
    // Settling may start new rounds (a 2026-07-28 call retried with `cancel` asks its next question): what the
    // reads name anew is settled in turn.
    for _ in 0..4 {
        let (named_requests, named_calls) = named(history);
        let new_requests: Vec<String> = named_requests.difference(&requests).cloned().collect();
        let new_calls: Vec<String> = named_calls.difference(&calls).cloned().collect();
        if new_requests.is_empty() && new_calls.is_empty() {
            break;
        }
        futures::stream::iter(&new_requests)
            .for_each_concurrent(READERS, |id| async move {
                api.get(&format!("/requests/{id}?wait={settle}"), settle).await;
            })
            .await;
        requests.extend(new_requests);
        calls.extend(new_calls);
        // Every call again: one that was waiting may be running its next round now.
        futures::stream::iter(&calls)
            .for_each_concurrent(READERS, |id| async move {
                api.get(&format!("/calls/{id}?wait={settle}"), settle).await;
            })
            .await;
    }
    let (requests, calls) = named(history);
    let mut state = Final::default();
    for (ids, kind, into) in [
        (&requests, "requests", &mut state.requests),
        (&calls, "calls", &mut state.calls),
    ] {
        let reads: Vec<(String, crate::api::Reply)> = futures::stream::iter(ids)
            .map(|id| async move { (id.clone(), api.get(&format!("/{kind}/{id}"), 0).await) })
            .buffer_unordered(READERS)
            .collect()
            .await;
        for (id, reply) in reads {
            if reply.is(200) {
                into.insert(id, reply.body);
            }
        }
    }
    // A round asked at the very end is named by its call's last read alone.
    let unread: Vec<String> = state
        .calls
        .values()
        .flat_map(|call| call["requests"].as_array().cloned().unwrap_or_default())
        .filter_map(|id| id.as_str().map(str::to_owned))
        .filter(|id| !state.requests.contains_key(id))
        .collect();
    for id in unread {
        let reply = api.get(&format!("/requests/{id}"), 0).await;
        if reply.is(200) {
            state.requests.insert(id, reply.body);
        }
    }
    state.log = event_log(api).await?;
    state.journal = std::fs::read_to_string(journal)
        .with_context(|| format!("cannot read the journal {}", journal.display()))?
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect();
    Ok(state)
}

/// The ids of every Request and call the history mentions, in a response, a path, an event or a delivery.
fn named(history: &History) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut requests = BTreeSet::new();
    let mut calls = BTreeSet::new();
    let mut note = |id: &str| {
        if id.starts_with("call-") {
            calls.insert(id.to_owned());
        } else if ["elc-", "apv-", "req-", "chaos-"]
            .iter()
            .any(|prefix| id.starts_with(prefix))
        {
            requests.insert(id.to_owned());
        }
    };
    history.read(|record| {
        for op in &record.ops {
            visit(&op.response, &mut note);
            visit(&op.request, &mut note);
        }
        for seen in &record.seen {
            visit(&seen.subject, &mut note);
        }
        for delivery in &record.deliveries {
            visit(&delivery.body["data"], &mut note);
        }
    });
    (requests, calls)
}

/// Calls `note` with every `id`, `call` and `requests` string in a JSON value.
fn visit(value: &Value, note: &mut impl FnMut(&str)) {
    match value {
        Value::Object(fields) => {
            for (key, field) in fields {
                match (key.as_str(), field) {
                    ("id" | "call", Value::String(id)) => note(id),
                    ("requests", Value::Array(ids)) => ids.iter().filter_map(Value::as_str).for_each(&mut *note),
                    _ => visit(field, note),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|item| visit(item, note)),
        _ => {}
    }
}

/// The whole event log: a marker Request is posted, and the log is replayed from the start up to its event.
async fn event_log(api: &Api) -> anyhow::Result<Vec<(u64, String, Value)>> {
    let marker = format!("chaos-end-{}", uuid::Uuid::now_v7().simple());
    let posted = api
        .post(
            "/requests",
            json!({"id": marker, "kind": "marker", "prompt": "the end of the run"}),
            0,
        )
        .await;
    if !posted.is(201) {
        bail!("cannot post the end marker: {:?} {}", posted.status, posted.body);
    }
    let response = reqwest::Client::new()
        .get(format!("{}/events", api.base))
        .header("Last-Event-ID", "0")
        .send()
        .await?;
    let mut response = response.error_for_status()?;
    let mut log = Vec::new();
    let mut buffer = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let chunk = tokio::time::timeout_at(deadline, response.chunk())
            .await
            .context("the event log did not reach the end marker within 60 s")??
            .context("the event stream ended before the end marker")?;
        buffer.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buffer.find("\n\n") {
            let block: String = buffer.drain(..end + 2).collect();
            let Some(event) = parse_event(&block) else { continue };
            if event.event == "resync" {
                bail!("the event log no longer holds the run's first events");
            }
            let id = event.id.parse().context("an event id")?;
            let last = event.event == "request.created" && event.data["id"] == marker.as_str();
            log.push((id, event.event, event.data));
            if last {
                return Ok(log);
            }
        }
    }
}

/// Waits until the receiver has accepted a delivery of every event in the log, or has received nothing for
/// 30 s (each webhook delivers in order, one event at a time, so a backlog after the faults takes a while).
pub async fn deliveries_settled(history: &Arc<History>, log: &[(u64, String, Value)]) {
    let ids: BTreeSet<String> = log.iter().map(|(id, _, _)| id.to_string()).collect();
    let mut last_count = 0;
    let mut quiet_since = tokio::time::Instant::now();
    while quiet_since.elapsed() < Duration::from_secs(30) {
        let (missing, count) = history.read(|record| {
            let accepted = record.accepted();
            let missing = ids.iter().filter(|id| !accepted.contains(id.as_str())).count();
            (missing, record.deliveries.len())
        });
        if missing == 0 {
            return;
        }
        if count != last_count {
            last_count = count;
            quiet_since = tokio::time::Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
