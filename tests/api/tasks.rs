//! Upstream tasks (the MCP Tasks extension of 2026-07-28): a call the server makes a task of is followed to its
//! end, its input requests are Requests of the call, and it survives the gateway's restart. The upstream is the
//! demo server (an rmcp server using rmcp's own task support), over stdio and over HTTP.

use serde_json::{Value, json};

use crate::helpers::{BOTH_ERAS, TestApp, first_request, http_demo, http_demo_on, spawn_app, spawn_process_in};

/// A call of `tool` that has become a task waiting on its question, checked as such; its id.
async fn asking(app: &TestApp, server: &str, tool: &str, arguments: Value) -> (Value, String) {
    let call = app.call(server, tool, arguments).await;
    assert_eq!(call["status"], "input_required", "{call}");
    assert_eq!(call["task"]["status"], "input_required", "{call}");
    assert!(!call["task"]["id"].as_str().unwrap().is_empty(), "{call}");
    let id = call["id"].as_str().unwrap().to_owned();
    (call, id)
}

/// What the upstream's task of a call says of itself, asked of the demo server directly.
async fn upstream_status(app: &TestApp, server: &str, call: &Value) -> Value {
    let task = call["task"]["id"].as_str().unwrap();
    let status = app.call(server, "task_status", json!({"id": task})).await;
    status["result"]["structuredContent"]["status"].clone()
}

/// Returns once the upstream's task of a call has stopped as cancelled (the demo's task stops when it next
/// looks).
async fn upstream_cancelled(app: &TestApp, server: &str, call: &Value) {
    let status = crate::helpers::poll_until("the upstream task to be cancelled", || async {
        let status = upstream_status(app, server, call).await;
        (status == "cancelled").then_some(status)
    })
    .await;
    assert_eq!(status, "cancelled");
}

#[tokio::test]
async fn a_task_asks_through_a_request_of_its_call_and_ends_with_its_result() {
    let (_demo, url) = http_demo();
    let servers = format!("{BOTH_ERAS}\n[[servers]]\nname = \"remote\"\nurl = \"{url}\"\n");
    let app = spawn_app(&servers).await;
    // rmcp serves the extension to a 2025-11-25 session that declares it as well.
    for server in ["legacy", "modern", "remote"] {
        for (answer, received) in [
            (
                json!({"ok": true, "data": {"reading": "technical"}}),
                json!({"action": "accept", "content": {"reading": "technical"}}),
            ),
            (json!({"ok": false, "reason": "declined"}), json!({"action": "decline"})),
        ] {
            let (call, id) = asking(&app, server, "research", json!({"topic": "python"})).await;
            assert!(
                call["task"]["statusMessage"]
                    .as_str()
                    .unwrap()
                    .contains("Asking which reading"),
                "{call}"
            );
            let request = app.request_of(&call).await;
            assert_eq!(request["kind"], "input", "{request}");
            assert_eq!(request["prompt"], "Which reading of \"python\" do you mean?");
            app.answer_ok(request["id"].as_str().unwrap(), answer).await;

            let done = app.settled(&id).await;
            assert_eq!(done["status"], "completed", "{server}: {done}");
            assert_eq!(
                done["result"]["structuredContent"]["results"],
                json!([received]),
                "{done}"
            );
            assert_eq!(done["task"]["status"], "completed", "{done}");
            assert_eq!(done["requests"], json!([request["id"]]), "{done}");
        }
    }
}

#[tokio::test]
async fn a_server_not_told_of_tasks_answers_the_call_itself() {
    let app = spawn_app("[[servers]]\nname = \"plain\"\nbuiltin = \"demo\"\ntasks = \"never\"\n").await;
    let call = app.call("plain", "research", json!({"topic": "rust"})).await;
    assert_eq!(call["status"], "completed", "{call}");
    assert_eq!(call["result"]["content"][0]["text"], "rust: reported without a task");
    assert!(call.get("task").is_none(), "{call}");
}

#[tokio::test]
async fn deleting_a_call_cancels_its_task_upstream() {
    let app = spawn_app(BOTH_ERAS).await;
    let (waiting, id) = asking(&app, "modern", "research", json!({"topic": "rust"})).await;
    let request = first_request(&waiting);
    let deleted = app.delete(&format!("/calls/{id}")).await;
    assert_eq!(deleted.status(), 200);
    let cancelled = app.get_json(&format!("/calls/{id}")).await;
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    assert_eq!(
        app.get_json(&format!("/requests/{request}")).await["status"],
        "cancelled"
    );
    // The demo's task, asked to cancel while it waits on its question, stops as cancelled.
    upstream_cancelled(&app, "modern", &waiting).await;
}

#[tokio::test]
async fn a_task_that_outlives_the_call_timeout_fails_the_call_and_is_cancelled() {
    let app = spawn_app(&format!("{BOTH_ERAS}\n[limits]\ncall_timeout = \"1s\"\n")).await;
    let (waiting, id) = asking(&app, "modern", "research", json!({"topic": "rust", "seconds": 600})).await;
    app.answer_ok(
        &first_request(&waiting),
        json!({"ok": true, "data": {"reading": "historical"}}),
    )
    .await;
    let failed = app.settled(&id).await;
    assert_eq!(failed["status"], "failed", "{failed}");
    assert!(
        failed["error"]["message"]
            .as_str()
            .unwrap()
            .contains("limits.call_timeout"),
        "{failed}"
    );
    upstream_cancelled(&app, "modern", &waiting).await;
}

/// A task past its time to live fails its call, whether it worked past it after its answer or its question
/// went unanswered: a task's Requests expire with it.
#[tokio::test]
async fn a_task_past_its_time_to_live_fails_the_call_saying_so() {
    let app = spawn_app(BOTH_ERAS).await;
    let arguments = json!({"topic": "rust", "seconds": 600, "ttl_ms": 1000});
    let (answered, answered_id) = asking(&app, "modern", "research", arguments.clone()).await;
    let (unanswered, unanswered_id) = asking(&app, "modern", "research", arguments).await;
    let request = app.request_of(&unanswered).await;
    assert_eq!(request["expiresAt"], unanswered["task"]["expiresAt"], "{request}");
    app.answer_ok(
        &first_request(&answered),
        json!({"ok": true, "data": {"reading": "historical"}}),
    )
    .await;
    let expired = app
        .get_json(&format!("/requests/{}?wait=20", request["id"].as_str().unwrap()))
        .await;
    assert_eq!(expired["status"], "expired", "{expired}");
    for id in [answered_id, unanswered_id] {
        let failed = app.settled(&id).await;
        assert_eq!(failed["status"], "failed", "{failed}");
        assert_eq!(failed["error"]["reason"], "task_lost", "{failed}");
        assert!(
            failed["error"]["message"]
                .as_str()
                .unwrap()
                .contains("passed its time to live"),
            "{failed}"
        );
    }
}

/// The HTTP demo server outlives the gateway, so its tasks do: a gateway killed while a task waits on its
/// question, or while it works after the answer, follows it on after the restart.
#[tokio::test]
async fn a_task_is_followed_on_after_the_gateway_is_killed() {
    let (_demo, url) = http_demo();
    let servers = format!("[[servers]]\nname = \"remote\"\nurl = \"{url}\"\n");
    let dir = tempfile::tempdir().unwrap();

    // Killed while the task waits on its question: the Request stays pending and answerable.
    let mut app = spawn_process_in(dir.path(), "", &servers, "").await;
    let (waiting, id) = asking(&app, "remote", "research", json!({"topic": "rust"})).await;
    app.kill();
    let mut app = spawn_process_in(dir.path(), "", &servers, "").await;
    let request = app.request_of(&app.get_json(&format!("/calls/{id}")).await).await;
    assert_eq!(request["id"], waiting["requests"][0]);
    app.answer_ok(
        request["id"].as_str().unwrap(),
        json!({"ok": true, "data": {"reading": "technical"}}),
    )
    .await;
    let done = app.settled(&id).await;
    assert_eq!(done["status"], "completed", "{done}");

    // Killed while the task works after its answer: the restarted gateway polls it to its end.
    let (waiting, id) = asking(&app, "remote", "research", json!({"topic": "rust", "seconds": 3})).await;
    app.answer_ok(
        &first_request(&waiting),
        json!({"ok": true, "data": {"reading": "historical"}}),
    )
    .await;
    let working = app.get_json(&format!("/calls/{id}")).await;
    assert_eq!(working["status"], "running", "{working}");
    app.kill();
    let app = spawn_process_in(dir.path(), "", &servers, "").await;
    let done = app.settled(&id).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(
        done["result"]["structuredContent"]["results"],
        json!([{"action": "accept", "content": {"reading": "historical"}}])
    );
}

#[tokio::test]
async fn a_task_its_server_forgot_fails_the_call_with_a_reason() {
    let (demo, url) = http_demo();
    let servers = format!("[[servers]]\nname = \"remote\"\nurl = \"{url}\"\n");
    let app = spawn_app(&servers).await;
    let (waiting, id) = asking(&app, "remote", "research", json!({"topic": "rust"})).await;
    // The server restarts on the same address, knowing no task.
    let listen = url.trim_start_matches("http://").trim_end_matches("/mcp").to_owned();
    drop(demo);
    let (_demo, _) = http_demo_on(&listen);
    app.answer_ok(
        &first_request(&waiting),
        json!({"ok": true, "data": {"reading": "technical"}}),
    )
    .await;
    let failed = app.settled(&id).await;
    assert_eq!(failed["status"], "failed", "{failed}");
    assert_eq!(failed["error"]["reason"], "task_lost", "{failed}");
    assert!(
        failed["error"]["message"].as_str().unwrap().contains("no longer knows"),
        "{failed}"
    );
}

/// A call's status, and its error message, once it has stopped running.
fn ended(call: &Value) -> (&str, &str) {
    (
        call["status"].as_str().unwrap(),
        call["error"]["message"].as_str().unwrap_or_default(),
    )
}

/// Tasks that misbehave (tests/upstreams/tasks.py) end their calls, each saying what happened; none hangs.
#[tokio::test]
async fn tasks_that_misbehave_end_their_calls_saying_what_happened() {
    let servers = crate::hostile::python_server("tasks", "tasks.py", "roots = [\"file:///workspace\"]");
    let app = spawn_app(&format!("{servers}\n[limits]\ncall_timeout = \"2s\"\n")).await;
    for (tool, status, says) in [
        ("never", "failed", "limits.call_timeout"),
        (
            "flaky",
            "failed",
            "error -32603 to tasks/get for the call's task flaky-",
        ),
        ("reappears", "cancelled", "the upstream cancelled its task reappears-"),
        ("fails", "failed", "failed: error -32000: the disk is full"),
        ("long_id", "failed", "whose id is longer than 1024 bytes"),
        ("unknown", "failed", "an input request of a kind MCP does not define"),
    ] {
        let call = app.call("tasks", tool, json!({})).await;
        let (ended_as, message) = ended(&call);
        assert_eq!(ended_as, status, "{tool}: {call}");
        assert!(message.contains(says), "{tool}: {call}");
    }
    let never = app.call("tasks", "never", json!({})).await;
    assert_eq!(never["task"]["statusMessage"], "still at it", "{never}");

    // Polled every 30 s, but said at once to have completed: the call ends without waiting for the poll.
    let notified = app.call("tasks", "notifies", json!({})).await;
    assert_eq!(notified["status"], "completed", "{notified}");

    // What it says of its progress is kept to its first 4 KiB.
    let chatty = app.call("tasks", "chatty", json!({})).await;
    assert_eq!(
        chatty["task"]["statusMessage"].as_str().unwrap().len(),
        4096,
        "{chatty}"
    );

    // Its roots are answered from the config, with no Request.
    let roots = app.call("tasks", "roots", json!({})).await;
    assert_eq!(roots["status"], "completed", "{roots}");
    assert_eq!(roots["requests"], json!([]), "{roots}");
    let sent: Value = serde_json::from_str(roots["result"]["content"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(sent, json!({"r": {"roots": [{"uri": "file:///workspace"}]}}));

    // Completed, then working again: the call ended with the result.
    let backwards = app.call("tasks", "backwards", json!({})).await;
    assert_eq!(backwards["status"], "completed", "{backwards}");
    assert_eq!(backwards["result"]["content"][0]["text"], "done");
    let id = backwards["id"].as_str().unwrap();
    assert_eq!(app.get_json(&format!("/calls/{id}")).await["status"], "completed");

    // A question still listed after its answer is not asked again.
    let (repeats, id) = asking(&app, "tasks", "repeats", json!({})).await;
    app.answer_ok(&first_request(&repeats), json!({"ok": true, "data": {"go": true}}))
        .await;
    let done = app.settled(&id).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["requests"].as_array().unwrap().len(), 1, "{done}");

    // The answer reaches a server that forgot the task.
    let (forgets, id) = asking(&app, "tasks", "forgets", json!({})).await;
    app.answer_ok(&first_request(&forgets), json!({"ok": true, "data": {"go": true}}))
        .await;
    let lost = app.settled(&id).await;
    assert_eq!(lost["error"]["reason"], "task_lost", "{lost}");
}
