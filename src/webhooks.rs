//! Webhooks: each webhook is given every event it asks for from the event log ([`crate::outbox`]), POSTed
//! and signed the Standard Webhooks way. A delivery goes to the webhook's URL and nowhere else: redirects are
//! not followed, and link-local and metadata addresses are refused unless the webhook allows them.

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::Webhook;
use crate::egress::GuardedResolver;
use crate::feed::Feed;
use crate::metrics::{Metric, Metrics};
use crate::outbox::{self, Delivered, Receiver};
use crate::records::Event;
use crate::time::Clock;

/// The header carrying the event's id, the same at every attempt: receivers deduplicate on it.
pub const ID_HEADER: &str = "webhook-id";
/// The header carrying the attempt's time, in seconds since the epoch on the gateway's clock.
pub const TIMESTAMP_HEADER: &str = "webhook-timestamp";
/// The header carrying `v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`, with a secret.
pub const SIGNATURE_HEADER: &str = "webhook-signature";

/// Starts one delivery task per webhook, delivering as `holder` (this gateway, among those sharing the store).
/// Fails only when an HTTP client cannot be built.
pub async fn start(
    webhooks: Vec<Webhook>,
    holder: &str,
    store: &crate::store::Store,
    feed: &Feed,
    metrics: &Metrics,
    shutdown: &CancellationToken,
    tracker: &TaskTracker,
) -> Result<(), reqwest::Error> {
    if webhooks.is_empty() {
        return Ok(());
    }
    let guarded = delivery_client().dns_resolver(GuardedResolver).build()?;
    let open = delivery_client().build()?;
    for webhook in webhooks {
        let client = if webhook.allow_link_local { &open } else { &guarded }.clone();
        let receiver = Posting {
            webhook,
            client,
            clock: store.clock().clone(),
            metrics: metrics.clone(),
        };
        outbox::start(receiver, holder, store, feed, shutdown, tracker).await;
    }
    Ok(())
}

/// A client for deliveries: it never follows a redirect, so a 3xx is a failed delivery and its `Location`
/// gets nothing.
pub fn delivery_client() -> reqwest::ClientBuilder {
    reqwest::Client::builder().redirect(reqwest::redirect::Policy::none())
}

/// One webhook: each event it asks for, POSTed and signed.
struct Posting {
    webhook: Webhook,
    client: reqwest::Client,
    clock: Clock,
    metrics: Metrics,
}

impl Receiver for Posting {
    fn key(&self) -> &str {
        &self.webhook.name
    }

    fn wants(&self, event: &Event) -> bool {
        self.webhook.events.is_empty() || self.webhook.events.contains(&event.kind)
    }

    fn attempts(&self) -> u32 {
        self.webhook.attempts
    }

    /// POSTs the event; each attempt carries its own timestamp, signed anew.
    async fn deliver(&self, event: &Event) -> Result<Delivered, String> {
        let id = event.id.to_string();
        let body = format!(
            r#"{{"id":{},"type":"{}","data":{}}}"#,
            event.id,
            event.kind.name(),
            event.data
        );
        let timestamp = self.clock.now().millis().div_euclid(1000);
        let mut request = self
            .client
            .post(self.webhook.url.clone())
            .timeout(self.webhook.timeout)
            .header("content-type", "application/json")
            .header("x-toolnexus-event", event.kind.name())
            .header("x-toolnexus-delivery", &id)
            .header(ID_HEADER, &id)
            .header(TIMESTAMP_HEADER, timestamp.to_string())
            .body(body.clone());
        if let Some(secret) = &self.webhook.secret {
            request = request.header(SIGNATURE_HEADER, secret.sign(&id, timestamp, body.as_bytes()));
        }
        posted(request.send().await).map(|()| Delivered::Sent)
    }

    fn count(&self, outcome: &str) {
        let labels = [("webhook", self.webhook.name.as_str()), ("outcome", outcome)];
        self.metrics.inc(Metric::WebhookDeliveries, &labels);
    }
}

/// Whether a POST was taken: a 2xx. A redirect is not followed, and says so.
pub fn posted(sent: Result<reqwest::Response, reqwest::Error>) -> Result<(), String> {
    match sent {
        Ok(response) if response.status().is_success() => Ok(()),
        Ok(response) if response.status().is_redirection() => Err(format!(
            "the receiver answered {} (redirects are not followed)",
            response.status()
        )),
        Ok(response) => Err(format!("the receiver answered {}", response.status())),
        Err(error) => Err(format!("the request failed: {}", outbox::causes(&error.without_url()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_guarded_client_refuses_a_metadata_name_before_connecting() {
        let error = delivery_client()
            .dns_resolver(GuardedResolver)
            .build()
            .unwrap()
            .post("http://metadata.google.internal/computeMetadata/v1/")
            .send()
            .await
            .unwrap_err();
        let causes = outbox::causes(&error);
        assert!(
            causes.contains("metadata.google.internal is a cloud metadata service")
                && causes.contains("allow_link_local = true"),
            "{causes}"
        );
    }
}
