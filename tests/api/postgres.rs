//! The gateway on a PostgreSQL store: a real server the tests start, and the real binary on it.

use std::process::{Command, Stdio};

use serde_json::json;

use crate::cluster::{self, Cluster};
use crate::helpers::{BINARY, BOTH_ERAS, ERAS, TestApp, config_text, first_request, results, spawn_in, stored_in};

/// A gateway with the demo server in both eras, storing in the database at `url`.
async fn gateway(dir: &tempfile::TempDir, url: &str) -> TestApp {
    spawn_in(dir.path(), &stored_in(url), BOTH_ERAS, "").await
}

#[tokio::test]
async fn requests_are_raised_answered_and_kept_in_both_eras() {
    let url = cluster::shared().database();
    let dir = tempfile::tempdir().unwrap();
    let mut app = gateway(&dir, &url).await;
    let mut answered = Vec::new();
    for server in ERAS {
        let call = app.call(server, "confirm_action", json!({"action": "deploy"})).await;
        let request = first_request(&call);
        app.answer_ok(&request, json!({"ok": true, "data": {"confirm": true}}))
            .await;
        let done = app.settled(call["id"].as_str().unwrap()).await;
        assert_eq!(
            results(&done),
            json!([{"action": "accept", "content": {"confirm": true, "note": ""}}]),
            "{server}"
        );
        answered.push(request);
    }

    assert_eq!(app.terminate(), Some(0));
    let app = gateway(&dir, &url).await;
    for request in answered {
        let kept = app.get_json(&format!("/requests/{request}")).await;
        assert_eq!(kept["status"], "answered", "{kept}");
        assert_eq!(kept["answeredBy"], "anonymous", "{kept}");
        assert_eq!(kept["answer"]["data"], json!({"confirm": true, "note": ""}), "{kept}");
    }
}

#[tokio::test]
async fn a_round_outlives_a_killed_gateway_and_its_call_completes() {
    let url = cluster::shared().database();
    let dir = tempfile::tempdir().unwrap();
    let mut app = gateway(&dir, &url).await;
    let call = app.call("modern", "two_step", json!({})).await;
    let id = call["id"].as_str().unwrap().to_owned();

    for answer in [
        json!({"ok": true, "data": {"name": "Ada"}}),
        json!({"ok": true, "data": {"confirm": true}}),
    ] {
        app.kill();
        app = gateway(&dir, &url).await;
        let waiting = app.get_json(&format!("/calls/{id}")).await;
        assert_eq!(waiting["status"], "input_required", "{waiting}");
        let request = app.request_of(&waiting).await;
        app.answer_ok(request["id"].as_str().unwrap(), answer).await;
        let next = app.settled(&id).await;
        assert_ne!(next["status"], "failed", "{next}");
    }
    let done = app.get_json(&format!("/calls/{id}")).await;
    assert_eq!(
        results(&done),
        json!([{"action": "accept", "content": {"name": "Ada"}}, {"action": "accept", "content": {"confirm": true}}])
    );
}

#[tokio::test]
async fn the_databases_password_shows_nowhere() {
    let url = cluster::shared().database();
    let with_password = url.replacen("postgres@", "postgres:s3cret-word@", 1);
    let dir = tempfile::tempdir().unwrap();
    let app = gateway(&dir, &with_password).await;
    let logged = app.stderr().wait_for("store: PostgreSQL");
    assert!(logged.contains("postgres://***@127.0.0.1"), "{logged}");

    let config = dir.path().join("gateway.toml");
    let checked = Command::new(BINARY)
        .args(["check-config", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&checked.stdout);
    assert!(checked.status.success(), "{printed}");
    assert!(printed.contains("postgres://***@127.0.0.1"), "{printed}");

    // A database that cannot be reached is a start-up error naming it, masked.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let unreachable = format!("postgres://postgres:s3cret-word@127.0.0.1:{port}/gateway");
    let elsewhere = tempfile::tempdir().unwrap();
    let config = elsewhere.path().join("gateway.toml");
    std::fs::write(
        &config,
        config_text(elsewhere.path(), &stored_in(&unreachable), BOTH_ERAS, ""),
    )
    .unwrap();
    let output = Command::new(BINARY)
        .arg("--config")
        .arg(&config)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "it started: {stderr}");
    assert!(
        stderr.contains(&format!("127.0.0.1:{port}")) && stderr.contains("cannot connect"),
        "{stderr}"
    );
    for shown in [
        &logged,
        &printed.to_string(),
        &stderr.to_string(),
        &app.stderr().lines().join("\n"),
    ] {
        assert!(!shown.contains("s3cret-word"), "{shown}");
    }
}

#[tokio::test]
async fn the_database_going_away_is_503_and_the_gateway_recovers_when_it_returns() {
    let cluster = Cluster::start();
    let url = cluster.database();
    let dir = tempfile::tempdir().unwrap();
    let app = gateway(&dir, &url).await;
    let call = app.call("modern", "confirm_action", json!({"action": "away"})).await;
    let request = first_request(&call);

    cluster.stop();
    let refused = app
        .answer(&request, json!({"ok": true, "data": {"confirm": true}}))
        .await;
    assert_eq!(refused.status(), 503);
    assert!(refused.headers().contains_key("retry-after"));
    assert_eq!(app.get(&format!("/requests/{request}")).await.status(), 503);
    let probed = app.get("/readyz").await;
    assert_eq!(probed.status(), 503);
    assert_eq!(
        probed.json::<serde_json::Value>().await.unwrap()["store"],
        "unreachable"
    );

    cluster.restart();
    assert_eq!(app.get("/readyz").await.status(), 200);
    assert_eq!(app.get_json(&format!("/requests/{request}")).await["status"], "pending");
    app.answer_ok(&request, json!({"ok": true, "data": {"confirm": true}}))
        .await;
    let done = app.settled(call["id"].as_str().unwrap()).await;
    assert_eq!(
        results(&done),
        json!([{"action": "accept", "content": {"confirm": true, "note": ""}}])
    );
}
