//! Shutdown: nothing left pending upstream, no child process left behind.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::helpers::{BOTH_ERAS, alive, children, signal, spawn_app};

#[tokio::test]
async fn sigterm_cancels_pending_requests_upstream_and_reaps_every_child() {
    let mut app = spawn_app(BOTH_ERAS).await;
    let mut requests = Vec::new();
    for era in ["legacy", "modern"] {
        let call = app.call(era, "confirm_action", json!({"action": "shutdown"})).await;
        requests.push(app.request_of(&call).await);
    }
    let private = app.post("/sessions", &json!({"server": "legacy"})).await;
    assert_eq!(private.status(), 201);
    let kids = children(app.pid());
    assert_eq!(kids.len(), 3, "three demo servers: {kids:?}");
    let mut open_stream = app.events("?server=none", None).await;

    let code = app.terminate();
    assert_eq!(code, Some(0));
    assert!(open_stream.ended().await, "an open event stream ends with the gateway");
    for kid in kids {
        assert!(!alive(kid), "child {kid} outlived the gateway");
    }
    app.stderr().wait_for("confirm_action received {\"action\":\"cancel\"}");
    app.stderr().wait_for("stopped");
}

#[tokio::test]
async fn sigkill_leaves_no_child_running() {
    let app = spawn_app(BOTH_ERAS).await;
    let call = app.call("legacy", "confirm_action", json!({"action": "kill"})).await;
    assert_eq!(call["status"], "input_required");
    let kids = children(app.pid());
    assert_eq!(kids.len(), 2);
    signal(app.pid(), "KILL");
    // The children see EOF on stdin and exit on their own; nothing signals the test when, so it polls.
    let deadline = Instant::now() + Duration::from_secs(20);
    while kids.iter().any(|kid| alive(*kid)) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for kid in kids {
        assert!(!alive(kid), "child {kid} outlived the killed gateway");
    }
}
