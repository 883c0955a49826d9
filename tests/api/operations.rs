//! What operators see: metrics and logs.

use serde_json::{Value, json};

use crate::helpers::{BOTH_ERAS, spawn_app};

#[tokio::test]
async fn metrics_count_requests_calls_sessions_and_http() {
    let app = spawn_app(BOTH_ERAS).await;
    let call = app.call("modern", "confirm_action", json!({"action": "measure"})).await;
    let request = app.request_of(&call).await;
    let pending = app.get("/metrics").await;
    assert_eq!(
        pending.headers()["content-type"],
        "text/plain; version=0.0.4; charset=utf-8"
    );
    assert!(
        pending
            .text()
            .await
            .unwrap()
            .contains("\ntoolnexus_requests_pending 1\n")
    );
    app.answer_ok(
        request["id"].as_str().unwrap(),
        json!({"ok": true, "data": {"confirm": true}}),
    )
    .await;
    app.settled(call["id"].as_str().unwrap()).await;

    let text = app.get("/metrics").await.text().await.unwrap();
    for line in [
        "toolnexus_requests_pending 0",
        "toolnexus_requests_created_total{server=\"modern\"} 1",
        "toolnexus_requests_resolved_total{server=\"modern\",outcome=\"accept\"} 1",
        "toolnexus_request_resolution_seconds_count{server=\"modern\"} 1",
        "toolnexus_calls_started_total{server=\"modern\"} 1",
        "toolnexus_calls_finished_total{server=\"modern\",status=\"completed\"} 1",
        "toolnexus_calls{status=\"completed\"} 1",
        "toolnexus_sessions{server=\"legacy\",state=\"ready\"} 1",
        "toolnexus_server_restarts_total{server=\"modern\"} 0",
        "toolnexus_http_requests_total{route=\"/requests/{id}/answer\",method=\"POST\",status=\"200\"} 1",
        "toolnexus_http_request_duration_seconds_count{route=\"/calls\"} 1",
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
    }
}

#[tokio::test]
async fn json_logs_trace_each_request_without_answer_values() {
    let app = spawn_app(&format!("{BOTH_ERAS}\n[log]\nformat = \"json\"\n")).await;
    let call = app.call("legacy", "confirm_action", json!({"action": "log"})).await;
    let request = app.request_of(&call).await;
    let id = request["id"].as_str().unwrap();
    app.answer_ok(
        id,
        json!({"ok": true, "data": {"confirm": true, "note": "s3cret-note"}}),
    )
    .await;
    app.settled(call["id"].as_str().unwrap()).await;

    let created: Value = serde_json::from_str(&app.stderr().wait_for("\"request created\"")).unwrap();
    assert_eq!(created["request"], id);
    assert_eq!(created["server"], "legacy");
    assert_eq!(created["call"], call["id"]);
    let resolved: Value = serde_json::from_str(&app.stderr().wait_for("\"request resolved\"")).unwrap();
    assert_eq!(resolved["request"], id);
    assert_eq!(resolved["ok"], true);
    assert!(resolved["data_keys"].as_str().unwrap().contains("note"));
    app.stderr().wait_for("\"call completed\"");
    let gateway_lines = app.stderr().lines_starting_with("{");
    assert!(!gateway_lines.is_empty());
    for line in gateway_lines {
        assert!(serde_json::from_str::<Value>(&line).is_ok(), "not JSON: {line}");
        assert!(!line.contains("s3cret-note"), "an answer value was logged: {line}");
    }
}
