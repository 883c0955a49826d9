//! Webhooks: deliveries of the events a webhook asks for, signed the Standard Webhooks way and checked by that
//! spec's Python library, retried when the receiver fails, sent to the configured URL and nowhere else.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode, header};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::sync::{Mutex, mpsc};

use crate::helpers::{BINARY, BOTH_ERAS, spawn_app, spawn_process, start_with};

/// The secret of the signing example every library of the spec tests against.
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
/// What the library says of a delivery it verified, and of a signed one whose id the receiver has seen.
const ACCEPTED: &str = "accepted";
const SEEN: &str = "refused: webhook-id already seen";

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

/// A receiver on 127.0.0.1:0 that records every request, then answers it with the next status the test sends.
async fn puppet() -> (
    String,
    mpsc::UnboundedReceiver<Delivery>,
    mpsc::UnboundedSender<StatusCode>,
) {
    let (record, deliveries) = mpsc::unbounded_channel();
    let (answer, answers) = mpsc::unbounded_channel();
    let answers = Arc::new(Mutex::new(answers));
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |headers: HeaderMap, body: Bytes| {
            let (record, answers) = (record.clone(), answers.clone());
            async move {
                let _ = record.send(Delivery { headers, body });
                answers
                    .lock()
                    .await
                    .recv()
                    .await
                    .unwrap_or(StatusCode::SERVICE_UNAVAILABLE)
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, deliveries, answer)
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

/// The virtualenv with the Standard Webhooks library that scripts/webhook-verifier.sh installs (scripts/test.sh
/// runs it).
fn verifier_venv() -> PathBuf {
    if let Some(venv) = std::env::var_os("STANDARDWEBHOOKS_VENV") {
        return venv.into();
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME is set")).join(".cache"));
    cache.join("toolnexus-gateway/standardwebhooks")
}

/// A delivery as the verifier takes it: its headers, `body` (its own, or one changed on the way), and how long
/// after now the receiver gets it.
fn arriving(delivery: &Delivery, body: &[u8], later: Duration) -> Value {
    let headers: serde_json::Map<String, Value> = delivery
        .headers
        .iter()
        .map(|(name, value)| (name.to_string(), json!(value.to_str().unwrap())))
        .collect();
    json!({"headers": headers, "body": BASE64.encode(body), "later": later.as_secs()})
}

/// What a receiver using the Standard Webhooks library (tests/webhooks/verify.py) says of each delivery, in
/// order: [`ACCEPTED`], or "refused: " and why. The receiver keeps the ids it accepted and refuses them again.
async fn verify(secret: &str, deliveries: &[Value]) -> Vec<String> {
    let venv = verifier_venv();
    let install = format!(
        "the webhook tests verify deliveries with the Standard Webhooks library (standardwebhooks on PyPI): run \
         scripts/webhook-verifier.sh to install it into {} (or set STANDARDWEBHOOKS_VENV to a virtualenv that has it)",
        venv.display()
    );
    let script = format!("{}/tests/webhooks/verify.py", env!("CARGO_MANIFEST_DIR"));
    let mut child = tokio::process::Command::new(venv.join("bin/python"))
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|error| panic!("{install}: {error}"));
    let input = json!({"secret": secret, "deliveries": deliveries}).to_string();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input.as_bytes()).await.unwrap();
    drop(stdin);
    let output = child.wait_with_output().await.unwrap();
    assert!(
        output.status.success(),
        "{install}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

/// A delivery's `webhook-timestamp`.
fn timestamp(delivery: &Delivery) -> i64 {
    delivery.headers["webhook-timestamp"].to_str().unwrap().parse().unwrap()
}

/// A secret from `toolnexus-gateway webhook-secret`.
fn generated_secret() -> String {
    let output = std::process::Command::new(BINARY)
        .arg("webhook-secret")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).unwrap().trim_end().to_owned()
}

#[tokio::test]
async fn deliveries_pass_the_standard_webhooks_library_and_a_retry_keeps_its_id() {
    let (url, mut deliveries) = receiver(1).await;
    let secret = generated_secret();
    let config = format!(
        "{BOTH_ERAS}\n[[webhooks]]\nname = \"approvals\"\nurl = \"{url}\"\nevents = [\"request.created\", \"request.resolved\"]\nsecret = \"{secret}\"\n"
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
    let id = body["id"].to_string();
    assert_eq!(retried.headers["webhook-id"], id.as_str(), "the id is the event's");
    assert_eq!(failed.headers["webhook-id"], id.as_str(), "a retry keeps the id");
    assert!(!retried.headers.contains_key("x-toolnexus-signature"));

    app.answer_ok(
        request["id"].as_str().unwrap(),
        json!({"ok": false, "reason": "declined"}),
    )
    .await;
    let resolved = next(&mut deliveries).await;
    let resolved_body: Value = serde_json::from_slice(&resolved.body).unwrap();
    assert_eq!(
        resolved_body["type"], "request.resolved",
        "call.updated is not asked for"
    );
    assert_eq!(resolved_body["data"]["status"], "answered");

    let mut changed = retried.body.to_vec();
    // `{"id":` and the id's first digit, which stays a digit.
    changed[6] ^= 1;
    let now = Duration::ZERO;
    let verdicts = verify(
        &secret,
        &[
            arriving(&retried, &changed, now),
            arriving(&retried, &retried.body, Duration::from_secs(6 * 60)),
            arriving(&retried, &retried.body, now),
            arriving(&failed, &failed.body, now),
            arriving(&retried, &retried.body, now),
            arriving(&resolved, &resolved.body, Duration::from_secs(4 * 60)),
        ],
    )
    .await;
    assert_eq!(
        verdicts,
        [
            "refused: No matching signature found",
            "refused: Message timestamp too old",
            ACCEPTED,
            SEEN,
            SEEN,
            ACCEPTED,
        ],
        "a byte of the body changed, six minutes late, on time, the first attempt (the same id), the same again, \
         the next event four minutes late"
    );

    // The receiver records a delivery before it answers, so the gateway counts it a moment later.
    app.metric_reaches("toolnexus_webhook_deliveries_total{webhook=\"approvals\",outcome=\"failed\"} 1")
        .await;
    app.metric_reaches("toolnexus_webhook_deliveries_total{webhook=\"approvals\",outcome=\"delivered\"} 2")
        .await;
}

#[tokio::test]
async fn each_attempt_is_stamped_and_signed_at_the_gateways_time() {
    let (url, mut deliveries, answer) = puppet().await;
    let config =
        format!("{BOTH_ERAS}\n[[webhooks]]\nurl = \"{url}\"\nevents = [\"request.created\"]\nsecret = \"{SECRET}\"\n");
    let app = spawn_app(&config).await;
    app.call("modern", "confirm_action", json!({"action": "later"})).await;

    let first = next(&mut deliveries).await;
    app.advance(Duration::from_secs(10 * 60));
    answer.send(StatusCode::INTERNAL_SERVER_ERROR).unwrap();
    let retried = next(&mut deliveries).await;
    answer.send(StatusCode::OK).unwrap();

    assert_eq!(first.headers["webhook-id"], retried.headers["webhook-id"]);
    assert!(
        timestamp(&retried) - timestamp(&first) >= 10 * 60,
        "{} then {}",
        timestamp(&first),
        timestamp(&retried)
    );
    let verdicts = verify(
        SECRET,
        &[
            arriving(&retried, &retried.body, Duration::ZERO),
            arriving(&retried, &retried.body, Duration::from_secs(10 * 60)),
        ],
    )
    .await;
    assert_eq!(
        verdicts,
        ["refused: Message timestamp too new", ACCEPTED],
        "the retry is stamped ten minutes ahead of the receiver's clock, and signed with that stamp"
    );
}

#[test]
fn webhook_secret_prints_a_new_secret_the_gateway_takes() {
    let (first, second) = (generated_secret(), generated_secret());
    assert_ne!(first, second);
    for secret in [&first, &second] {
        let key = secret.strip_prefix("whsec_").unwrap_or_else(|| panic!("{secret}"));
        assert_eq!(BASE64.decode(key).unwrap().len(), 32, "{secret}");
    }

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    let hook = "[[webhooks]]\nurl = \"http://127.0.0.1:9/hook\"\nsecret = \"${HOOK_SECRET}\"\n";
    std::fs::write(
        &path,
        format!("listen = \"127.0.0.1:0\"\n[store]\nurl = \"memory\"\n\n{hook}"),
    )
    .unwrap();
    let output = std::process::Command::new(BINARY)
        .args(["check-config", "--config"])
        .arg(&path)
        .env("HOOK_SECRET", &first)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let printed = String::from_utf8(output.stdout).unwrap();
    assert!(
        printed.contains("secret = \"***\"") && !printed.contains(&first[6..]),
        "{printed}"
    );
}

#[test]
fn a_secret_that_is_not_a_standard_webhooks_one_is_refused_without_showing_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    let text = "listen = \"127.0.0.1:0\"\n[store]\nurl = \"memory\"\n\n[[webhooks]]\nname = \"old\"\n\
                url = \"http://127.0.0.1:9/hook\"\nsecret = \"${HOOK_SECRET}\"\n";
    std::fs::write(&path, text).unwrap();
    for (secret, why) in [
        ("s3cr3t-from-before", "it does not start with whsec_"),
        ("whsec_czNjcjN0", "its key is 6 bytes, not 24 to 64"),
        ("whsec_s3cr3t!", "what follows whsec_ is not base64"),
    ] {
        // check-config first: a gateway that accepted the secret would serve and never exit.
        for command in [&["check-config", "--config"][..], &["--config"]] {
            let output = std::process::Command::new(BINARY)
                .args(command)
                .arg(&path)
                .env("HOOK_SECRET", secret)
                .output()
                .unwrap();

            assert_eq!(output.status.code(), Some(1), "{command:?} accepted {secret}");
            let stderr = String::from_utf8(output.stderr).unwrap();
            assert!(
                stderr.contains(&path.display().to_string())
                    && stderr.contains("line 5")
                    && stderr.contains("webhooks[0].secret of webhook \"old\" is not a Standard Webhooks secret")
                    && stderr.contains(why)
                    && stderr.contains("toolnexus-gateway webhook-secret"),
                "{stderr}"
            );
            let shown = secret.trim_start_matches("whsec_").trim_end_matches('!');
            assert!(!stderr.contains(shown), "{stderr}");
        }
    }
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
        "{BOTH_ERAS}\n[[webhooks]]\nname = \"bouncer\"\nurl = \"{url}\"\nevents = [\"request.created\"]\nattempts = 1\nsecret = \"{SECRET}\"\n"
    );
    let app = spawn_process("", &config, "").await;

    app.call("modern", "confirm_action", json!({"action": "bounce"})).await;

    let delivery = next(&mut deliveries).await;
    assert!(delivery.headers.contains_key("webhook-signature"));
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
        "delivery failed",
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
