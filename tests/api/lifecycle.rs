//! Shutdown: nothing left pending upstream, no child process left behind.

use serde_json::json;

use crate::helpers::{BOTH_ERAS, alive, children, poll_until, signal, spawn_app, spawn_process};
use crate::hostile::python_server;

#[tokio::test]
async fn sigterm_cancels_pending_requests_upstream_and_reaps_every_child() {
    let mut app = spawn_process("", BOTH_ERAS, "").await;
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
    app.stderr().wait_for("confirm_action received cancel");
    app.stderr().wait_for("stopped");
}

#[tokio::test]
async fn sessions_that_end_unused_end_without_an_error() {
    let mut app = spawn_process("", BOTH_ERAS, "").await;
    assert_eq!(app.terminate(), Some(0));
    app.stderr().wait_for("stopped");
    // A 2026-07-28 session sends no `initialize` (its requests stand alone): its server ends it without one.
    let lines = app.stderr().lines();
    assert!(!lines.iter().any(|line| line.contains("error")), "{lines:#?}");
}

#[tokio::test]
async fn sigkill_leaves_no_child_running() {
    let app = spawn_process("", BOTH_ERAS, "").await;
    let call = app.call("legacy", "confirm_action", json!({"action": "kill"})).await;
    assert_eq!(call["status"], "input_required");
    let kids = children(app.pid());
    assert_eq!(kids.len(), 2);
    signal(app.pid(), "KILL");
    // The children see EOF on stdin and exit on their own; nothing signals the test when.
    poll_until(&format!("children {kids:?} exiting after the gateway"), || async {
        kids.iter().all(|kid| !alive(*kid)).then_some(())
    })
    .await;
}

#[tokio::test]
async fn sigterm_cancels_running_calls_and_tells_each_upstream() {
    let servers = [
        python_server("slow-a", "slow.py", "protocol = \"2025-11-25\""),
        python_server("slow-b", "slow.py", "protocol = \"2026-07-28\""),
    ]
    .concat();
    let mut app = spawn_process("", &servers, "").await;
    let mut calls = Vec::new();
    for server in ["slow-a", "slow-b"] {
        let call = app.post("/calls", &json!({"server": server, "tool": "wait"})).await;
        assert_eq!(call.status(), 201);
        calls.push(
            call.json::<serde_json::Value>().await.unwrap()["id"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    let kids = children(app.pid());
    assert_eq!(kids.len(), 2, "{kids:?}");
    for kid in &kids {
        app.stderr().wait_for_all(&[&format!("[slow {kid}]"), "waiting"]);
    }

    assert_eq!(app.terminate(), Some(0));

    for call in &calls {
        app.stderr().wait_for_all(&[call, "call cancelled"]);
    }
    for kid in &kids {
        app.stderr()
            .wait_for_all(&[&format!("[slow {kid}] got"), "\"method\": \"notifications/cancelled\""]);
    }
    for kid in kids {
        assert!(!alive(kid), "child {kid} outlived the gateway");
    }
}

#[tokio::test]
async fn clients_that_disconnect_from_long_polls_and_streams_leave_nothing_behind() {
    let app = spawn_app(BOTH_ERAS).await;
    let mut held = Vec::new();
    for _ in 0..20 {
        held.push(app.events("", None).await);
    }
    let polls: Vec<_> = (0..20)
        .map(|_| {
            let request = app.client.get(format!("{}/requests?wait=30&server=none", app.address));
            tokio::spawn(request.send())
        })
        .collect();
    app.metric_reaches("toolnexus_event_streams 20").await;
    app.metric_reaches("toolnexus_long_polls 20").await;

    drop(held);
    for poll in polls {
        poll.abort();
    }

    app.metric_reaches("toolnexus_event_streams 0").await;
    app.metric_reaches("toolnexus_long_polls 0").await;
    let call = app.call("legacy", "echo", json!({"text": "still here"})).await;
    assert_eq!(call["status"], "completed");
}
