//! Webhooks: signed deliveries of the events a webhook asks for, retried when the receiver fails, sent to the
//! configured URL and nowhere else.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode, header};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::helpers::{BINARY, BOTH_ERAS, spawn_app, spawn_process, start_with};

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

/// A receiver on 127.0.0.1:0 that records every request and answers `307 Temporary Redirect` to `location`.
async fn redirector(location: String) -> (String, mpsc::UnboundedReceiver<Delivery>) {
    let (record, deliveries) = mpsc::unbounded_channel();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |headers: HeaderMap, body: Bytes| {
            let _ = record.send(Delivery { headers, body });
            let location = location.clone();
            async move { (StatusCode::TEMPORARY_REDIRECT, [(header::LOCATION, location)]) }
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
    let failed = "toolnexus_webhook_deliveries_total{webhook=\"webhook-1\",outcome=\"failed\"} ";
    app.metric_line("a failed delivery counted", |line| line.starts_with(failed))
        .await;
}

#[tokio::test]
async fn a_redirect_is_a_failed_delivery_and_its_location_gets_nothing() {
    let (elsewhere, mut bounced) = receiver(0).await;
    let (url, mut deliveries) = redirector(elsewhere).await;
    let config = format!(
        "{BOTH_ERAS}\n[[webhooks]]\nname = \"bouncer\"\nurl = \"{url}\"\nevents = [\"request.created\"]\nattempts = 1\nsecret = \"s3cr3t\"\n"
    );
    let app = spawn_process("", &config, "").await;

    app.call("modern", "confirm_action", json!({"action": "bounce"})).await;

    let delivery = next(&mut deliveries).await;
    assert!(delivery.headers.contains_key("x-toolnexus-signature"));
    app.metric_reaches("toolnexus_webhook_deliveries_total{webhook=\"bouncer\",outcome=\"failed\"} 1")
        .await;
    // A followed redirect would have reached the second receiver before the gateway counted the delivery.
    assert!(
        bounced.try_recv().is_err(),
        "the signed event was sent on to the redirect's Location"
    );
    let metrics = app.get("/metrics").await.text().await.unwrap();
    assert!(!metrics.contains("outcome=\"delivered\""), "{metrics}");
    app.stderr().wait_for_all(&[
        "webhook delivery failed",
        "bouncer",
        "307 Temporary Redirect (redirects are not followed)",
    ]);
}

#[test]
fn webhooks_to_link_local_or_metadata_addresses_are_refused_unless_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    for url in [
        "http://169.254.169.254/latest/meta-data/",
        "http://[fe80::1]:8080/hook",
        "http://metadata.google.internal/computeMetadata/v1/",
    ] {
        let text = format!(
            "listen = \"127.0.0.1:0\"\n[store]\nurl = \"memory\"\n\n[[webhooks]]\nname = \"meta\"\nurl = \"{url}\"\n"
        );
        std::fs::write(&path, &text).unwrap();
        // check-config first: a gateway that accepted the webhook would serve and never exit.
        for command in [&["check-config", "--config"][..], &["--config"]] {
            let output = std::process::Command::new(BINARY)
                .args(command)
                .arg(&path)
                .output()
                .unwrap();

            assert_eq!(output.status.code(), Some(1), "{command:?} accepted {url}");
            let stderr = String::from_utf8(output.stderr).unwrap();
            assert!(
                stderr.contains(&path.display().to_string())
                    && stderr.contains("line 5")
                    && stderr.contains("webhooks[0].url of webhook \"meta\"")
                    && stderr.contains("allow_link_local = true"),
                "{stderr}"
            );
        }

        std::fs::write(&path, format!("{text}allow_link_local = true\n")).unwrap();
        let output = std::process::Command::new(BINARY)
            .args(["check-config", "--config"])
            .arg(&path)
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let effective: toml::Table = toml::from_str(&String::from_utf8(output.stdout).unwrap()).unwrap();
        assert_eq!(effective["webhooks"][0]["allow_link_local"].as_bool(), Some(true));
    }

    let allowed = start_with(
        "",
        "[[webhooks]]\nname = \"meta\"\nurl = \"http://169.254.169.254/latest/meta-data/\"\nallow_link_local = true\n",
        "",
    );
    assert!(
        allowed.address.starts_with("http://127.0.0.1:"),
        "an allowed webhook starts"
    );
}
