//! Webhooks: signed deliveries of the events a webhook asks for, retried when the receiver fails.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::helpers::{BOTH_ERAS, spawn_app};

struct Delivery {
    headers: HeaderMap,
    body: Bytes,
}

/// A receiver on 127.0.0.1:0 that fails its first `failures` requests and records every request.
async fn receiver(failures: usize) -> (String, mpsc::UnboundedReceiver<Delivery>) {
    let (record, deliveries) = mpsc::unbounded_channel();
    let seen = Arc::new(AtomicUsize::new(0));
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |headers: HeaderMap, body: Bytes| {
            let (record, seen) = (record.clone(), seen.clone());
            async move {
                let _ = record.send(Delivery { headers, body });
                if seen.fetch_add(1, Ordering::SeqCst) < failures {
                    StatusCode::INTERNAL_SERVER_ERROR
                } else {
                    StatusCode::OK
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, deliveries)
}

async fn next(deliveries: &mut mpsc::UnboundedReceiver<Delivery>) -> Delivery {
    tokio::time::timeout(Duration::from_secs(20), deliveries.recv())
        .await
        .expect("no delivery within 20 s")
        .unwrap()
}

#[tokio::test]
async fn events_are_delivered_signed_and_retried_after_a_failure() {
    let (url, mut deliveries) = receiver(1).await;
    let config = format!(
        "{BOTH_ERAS}\n[[webhooks]]\nname = \"approvals\"\nurl = \"{url}\"\nevents = [\"request.created\", \"request.resolved\"]\nsecret = \"s3cr3t\"\n"
    );
    let app = spawn_app(&config).await;
    let call = app.call("modern", "confirm_action", json!({"action": "hook"})).await;
    let request = app.request_of(&call).await;

    let failed = next(&mut deliveries).await;
    let retried = next(&mut deliveries).await;
    assert_eq!(failed.body, retried.body, "the retry carries the same event");
    let body: Value = serde_json::from_slice(&retried.body).unwrap();
    assert_eq!(body["type"], "request.created");
    assert_eq!(body["data"], request);
    assert_eq!(retried.headers["x-toolnexus-event"], "request.created");
    assert_eq!(retried.headers["x-toolnexus-delivery"], body["id"].to_string().as_str());
    let signature = toolnexus_gateway::webhooks::sign("s3cr3t", &retried.body);
    assert_eq!(retried.headers["x-toolnexus-signature"], signature.as_str());

    app.answer_ok(
        request["id"].as_str().unwrap(),
        json!({"ok": false, "reason": "declined"}),
    )
    .await;
    let resolved: Value = serde_json::from_slice(&next(&mut deliveries).await.body).unwrap();
    assert_eq!(resolved["type"], "request.resolved", "call.updated is not asked for");
    assert_eq!(resolved["data"]["status"], "answered");

    // The receiver records a delivery before it answers, so the gateway counts it a moment later.
    app.metric_reaches("toolnexus_webhook_deliveries_total{webhook=\"approvals\",outcome=\"failed\"} 1")
        .await;
    app.metric_reaches("toolnexus_webhook_deliveries_total{webhook=\"approvals\",outcome=\"delivered\"} 2")
        .await;
}

#[tokio::test]
async fn a_dead_receiver_does_not_hold_up_calls() {
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", closed.local_addr().unwrap());
    drop(closed);
    let app = spawn_app(&format!("{BOTH_ERAS}\n[[webhooks]]\nurl = \"{url}\"\nattempts = 2\n")).await;
    for _ in 0..3 {
        let call = app.call("modern", "confirm_action", json!({"action": "anyway"})).await;
        let request = app.request_of(&call).await;
        app.answer_ok(
            request["id"].as_str().unwrap(),
            json!({"ok": true, "data": {"confirm": true}}),
        )
        .await;
        assert_eq!(app.settled(call["id"].as_str().unwrap()).await["status"], "completed");
    }
    app.metric_reaches("toolnexus_webhook_deliveries_total{webhook=\"webhook-1\",outcome=\"failed\"} ")
        .await;
}
