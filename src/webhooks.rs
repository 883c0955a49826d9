//! Webhooks: every event a webhook asks for is POSTed to it, signed, with retries and a bounded queue so a
//! slow or dead receiver never slows the gateway or grows its memory.

use std::sync::Arc;
use std::time::Duration;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::Webhook;
use crate::events::{Event, Events};
use crate::metrics::Metrics;

/// How many events may wait for one webhook; past that new ones are dropped (and counted).
pub const QUEUE_CAPACITY: usize = 1024;
/// The pause before the first retry; it doubles after each failed attempt.
const FIRST_RETRY: Duration = Duration::from_millis(500);
/// The header carrying `sha256=<hex HMAC of the body>`.
pub const SIGNATURE_HEADER: &str = "x-toolnexus-signature";

/// Starts one delivery task per webhook and the task that feeds them from the event feed.
pub fn start(
    webhooks: Vec<Webhook>,
    events: &Events,
    metrics: &Metrics,
    shutdown: &CancellationToken,
    tracker: &TaskTracker,
) {
    if webhooks.is_empty() {
        return;
    }
    let client = reqwest::Client::new();
    let mut queues = Vec::with_capacity(webhooks.len());
    for webhook in webhooks {
        let webhook = Arc::new(webhook);
        let (queue, pending) = mpsc::channel(QUEUE_CAPACITY);
        queues.push((webhook.clone(), queue));
        let delivery = Delivery {
            webhook,
            client: client.clone(),
            metrics: metrics.clone(),
        };
        tracker.spawn(delivery.run(pending, shutdown.clone()));
    }
    let live = events.subscribe(None).live;
    tracker.spawn(dispatch(live, queues, metrics.clone(), shutdown.clone()));
}

/// Hands each event to the queue of every webhook that wants it, without ever waiting on one.
async fn dispatch(
    mut live: broadcast::Receiver<Arc<Event>>,
    queues: Vec<(Arc<Webhook>, mpsc::Sender<Arc<Event>>)>,
    metrics: Metrics,
    shutdown: CancellationToken,
) {
    loop {
        let event = tokio::select! {
            event = live.recv() => event,
            () = shutdown.cancelled() => return,
        };
        match event {
            Ok(event) => {
                for (webhook, queue) in &queues {
                    if (webhook.events.is_empty() || webhook.events.contains(&event.kind))
                        && queue.try_send(event.clone()).is_err()
                    {
                        metrics.inc(
                            "toolnexus_webhook_deliveries_total",
                            &[("webhook", &webhook.name), ("outcome", "dropped")],
                        );
                        tracing::warn!(webhook = %webhook.name, event = event.id, "webhook queue full: event dropped");
                    }
                }
            }
            Err(RecvError::Lagged(missed)) => {
                for (webhook, _) in &queues {
                    metrics.inc(
                        "toolnexus_webhook_deliveries_total",
                        &[("webhook", &webhook.name), ("outcome", "dropped")],
                    );
                }
                tracing::warn!(missed, "webhooks fell behind the event feed: events dropped");
            }
            Err(RecvError::Closed) => return,
        }
    }
}

/// Delivers one webhook's events in order.
struct Delivery {
    webhook: Arc<Webhook>,
    client: reqwest::Client,
    metrics: Metrics,
}

impl Delivery {
    async fn run(self, mut pending: mpsc::Receiver<Arc<Event>>, shutdown: CancellationToken) {
        loop {
            let event = tokio::select! {
                event = pending.recv() => event,
                () = shutdown.cancelled() => return,
            };
            let Some(event) = event else { return };
            tokio::select! {
                () = self.deliver(&event) => {}
                () = shutdown.cancelled() => return,
            }
        }
    }

    /// POSTs one event, retrying with exponential back-off up to the webhook's attempts.
    async fn deliver(&self, event: &Event) {
        let body = format!(
            r#"{{"id":{},"type":"{}","data":{}}}"#,
            event.id,
            event.kind.name(),
            event.data
        );
        let signature = self
            .webhook
            .secret
            .as_deref()
            .map(|secret| sign(secret, body.as_bytes()));
        let mut pause = FIRST_RETRY;
        for attempt in 1..=self.webhook.attempts {
            let mut request = self
                .client
                .post(&self.webhook.url)
                .timeout(self.webhook.timeout)
                .header("content-type", "application/json")
                .header("x-toolnexus-event", event.kind.name())
                .header("x-toolnexus-delivery", event.id.to_string())
                .body(body.clone());
            if let Some(signature) = &signature {
                request = request.header(SIGNATURE_HEADER, signature);
            }
            let failure = match request.send().await {
                Ok(response) if response.status().is_success() => None,
                Ok(response) => Some(format!("the receiver answered {}", response.status())),
                Err(error) => Some(format!("the request failed: {error}")),
            };
            let labels = [
                ("webhook", self.webhook.name.as_str()),
                ("outcome", if failure.is_none() { "delivered" } else { "failed" }),
            ];
            self.metrics.inc("toolnexus_webhook_deliveries_total", &labels);
            let Some(failure) = failure else { return };
            tracing::warn!(webhook = %self.webhook.name, event = event.id, attempt, failure, "webhook delivery failed");
            if attempt < self.webhook.attempts {
                tokio::time::sleep(pause).await;
                pause *= 2;
            }
        }
        tracing::warn!(webhook = %self.webhook.name, event = event.id, "webhook delivery given up");
    }
}

/// `sha256=<hex HMAC-SHA256 of body under secret>`.
pub fn sign(secret: &str, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes keys of any length");
    mac.update(body);
    let digest = mac.finalize().into_bytes();
    let hex: String = digest.iter().map(|byte| format!("{byte:02x}")).collect();
    format!("sha256={hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    // RFC 4231, test case 2.
    #[test]
    fn signatures_are_hmac_sha256_in_hex() {
        assert_eq!(
            sign("Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
