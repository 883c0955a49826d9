//! SSE consumers of `GET /events` that drop their stream at seeded times and resume with `Last-Event-ID`
//! (on another gateway, where the topology has several), recording every event they read.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;

use crate::helpers::parse_event;
use crate::history::{History, Op, Seen};
use crate::random::Rng;

/// Runs consumer `index` until `until`, reading each stream for 1 to 8 s, its addresses given by `address`.
pub async fn consumer(
    address: impl Fn(u64) -> String,
    index: usize,
    client: reqwest::Client,
    history: Arc<History>,
    mut rng: Rng,
    until: Instant,
) {
    let mut last: Option<u64> = None;
    let mut connection = 0u64;
    while Instant::now() < until {
        let lifetime = rng.millis(1000, 8000);
        let resumed = last;
        let mut request = client.get(format!("{}/events", address(connection)));
        if let Some(id) = resumed {
            request = request.header("Last-Event-ID", id.to_string());
        }
        let start = history.now();
        let sent = tokio::time::timeout(Duration::from_secs(5), request.send()).await;
        let mut op = Op {
            op: 0,
            client: format!("consumer-{index}"),
            method: "GET".to_owned(),
            path: "/events".to_owned(),
            request: resumed.map_or(Value::Null, |id| Value::from(format!("Last-Event-ID: {id}"))),
            start,
            end: history.now(),
            status: None,
            error: None,
            retry_after: false,
            content_type: String::new(),
            response: Value::Null,
        };
        let mut response = match sent {
            Ok(Ok(response)) => response,
            Ok(Err(error)) => {
                op.error = Some(format!("no response: {error}"));
                history.op(op);
                tokio::time::sleep(Duration::from_millis(300)).await;
                continue;
            }
            Err(_) => {
                op.error = Some("timed out".to_owned());
                history.op(op);
                continue;
            }
        };
        op.status = Some(response.status().as_u16());
        op.retry_after = response.headers().contains_key("retry-after");
        op.content_type = header(&response, "content-type");
        if response.status() != 200 {
            op.response = response.json().await.unwrap_or(Value::Null);
            history.op(op);
            tokio::time::sleep(Duration::from_millis(300)).await;
            continue;
        }
        history.op(op);
        let deadline = Instant::now() + lifetime;
        let mut buffer = String::new();
        while let Ok(Ok(Some(chunk))) = tokio::time::timeout_at(deadline.min(until), response.chunk()).await {
            buffer.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(end) = buffer.find("\n\n") {
                let block: String = buffer.drain(..end + 2).collect();
                let Some(event) = parse_event(&block) else { continue };
                let id = event.id.parse::<u64>().ok();
                history.seen(Seen {
                    consumer: index,
                    connection,
                    resumed,
                    id: id.unwrap_or(u64::MAX),
                    event: event.event,
                    subject: event.data["id"].clone(),
                    at: history.now(),
                });
                if id.is_some() {
                    last = id;
                }
            }
        }
        connection += 1;
    }
}

fn header(response: &reqwest::Response, name: &str) -> String {
    response
        .headers()
        .get(name)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}
