//! The local webhook receiver: records every delivery, and refuses one in forty (drawn from the seed) so that
//! the gateway makes it again.

use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use serde_json::Value;

use crate::history::{Delivery, History};
use crate::random::Rng;

/// Serves the receiver on a loopback port until the runtime ends; returns its URL.
pub async fn start(history: Arc<History>, rng: Rng) -> anyhow::Result<String> {
    let rng = Arc::new(Mutex::new(rng));
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |headers: HeaderMap, body: Bytes| {
            let (history, rng) = (history.clone(), rng.clone());
            async move {
                let accepted = !rng.lock().unwrap().chance(0.025);
                let webhook_id = headers
                    .get("webhook-id")
                    .and_then(|value| value.to_str().ok())
                    .unwrap_or_default()
                    .to_owned();
                history.delivery(Delivery {
                    webhook_id,
                    body: serde_json::from_slice(&body).unwrap_or(Value::Null),
                    accepted,
                    at: history.now(),
                });
                if accepted {
                    StatusCode::NO_CONTENT
                } else {
                    StatusCode::SERVICE_UNAVAILABLE
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/hook", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(url)
}
