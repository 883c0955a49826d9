//! Input made to forge log lines: tool names outside the MCP rule are refused before anything goes upstream,
//! and control characters in a logged value are escaped so that it stays on its own line.

use serde_json::{Value, json};

use crate::helpers::{BOTH_ERAS, spawn_app, spawn_process};
use crate::hostile::python_server;

/// A line that would pass for the gateway's own, in the text format.
const FORGED: &str =
    "2026-01-01T00:00:00.000000Z  INFO request resolved request=elc-forged status=\"answered\" answered_by=\"admin\"";

#[tokio::test]
async fn tool_names_outside_the_mcp_rule_are_400_and_never_start_a_call() {
    let app = spawn_app(BOTH_ERAS).await;
    let too_long = "x".repeat(129);
    let bad = [
        format!("confirm_action\n{FORGED}"),
        "echo\u{1b}[2K\r".to_owned(),
        String::new(),
        too_long,
        "a b".to_owned(),
        "files/read".to_owned(),
        "écho".to_owned(),
    ];

    for tool in &bad {
        let response = app.post("/calls", &json!({"server": "legacy", "tool": tool})).await;

        assert_eq!(response.status(), 400, "{tool:?}");
        assert_eq!(response.headers()["content-type"], "application/problem+json");
        let problem: Value = response.json().await.unwrap();
        let detail = problem["detail"].as_str().unwrap();
        assert!(
            detail.contains("`tool` must be 1 to 128 characters") && detail.contains("MCP rule"),
            "{problem}"
        );
    }
    assert_eq!(app.get_json("/calls").await, json!([]), "a refused name started a call");
    let document = app.get_json("/openapi.json").await;
    let tool = &document["components"]["schemas"]["StartCall"]["allOf"][0]["properties"]["tool"];
    assert_eq!(
        tool["pattern"], "^[A-Za-z0-9_.-]{1,128}$",
        "the document states the rule: {tool}"
    );
    let longest = app.call("legacy", &"x".repeat(128), json!({})).await;
    assert_eq!(longest["tool"].as_str().map(str::len), Some(128));
    assert_eq!(app.get_json("/calls").await.as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn control_characters_in_a_logged_value_cannot_start_a_line_of_their_own() {
    let app = spawn_process("", &python_server("quoting", "quoting.py", ""), "").await;
    let path = format!("/tmp/x\n{FORGED}\r\u{1b}[2K\u{9b}2K\u{0}");

    let call = app.call("quoting", "open", json!({"path": path})).await;
    let call = app.settled(call["id"].as_str().unwrap()).await;

    assert_eq!(call["status"], "failed", "{call}");
    let message = call["error"]["message"].as_str().unwrap();
    assert!(
        message.ends_with(&path),
        "the API returns the message as it was: {message:?}"
    );
    let logged = app.stderr().wait_for("call ended");
    assert!(
        logged.contains("cannot open /tmp/x\\n2026-01-01T00:00:00.000000Z  INFO request resolved request=elc-forged"),
        "the value is not on the line of the event that logged it: {logged:?}"
    );
    let lines = app.stderr().lines();
    let forged: Vec<&String> = lines.iter().filter(|line| line.contains("elc-forged")).collect();
    assert_eq!(forged, [&logged], "a forged line was written");
    for line in &lines {
        assert!(
            !line.chars().any(char::is_control),
            "a control character was written: {line:?}"
        );
    }
}
