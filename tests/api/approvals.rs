//! Approval policies: calls they cover wait for a person's yes before anything goes upstream.

use std::time::Duration;

use reqwest::header::AUTHORIZATION;
use serde_json::{Value, json};

use crate::helpers::{BOTH_ERAS, TestApp, held_as, spawn_app, spawn_process_in, token_entry};

/// `modern` calls of `confirm_*` and `echo` need approval; `legacy` calls of `confirm_*` need it within a second.
const POLICIES: &str = r#"
[[approvals]]
server = "modern"
tools = ["confirm_*", "echo"]
prompt = "{caller} wants {tool} on {server}"

[[approvals]]
server = "legacy"
tools = ["confirm_*"]
ttl = "1h"
"#;

async fn spawn_gated() -> TestApp {
    spawn_app(&format!("{BOTH_ERAS}{POLICIES}")).await
}

/// Every Request of a call, whatever its status.
async fn requests_of(app: &TestApp, call: &str) -> Vec<Value> {
    let listed = app.get_json(&format!("/requests?call={call}&status=all")).await;
    listed.as_array().unwrap().clone()
}

/// The call once the Request it waits on is resolved and the call has stopped running again.
async fn after(app: &TestApp, request: &str, call: &str) -> Value {
    let resolved = app.get_json(&format!("/requests/{request}?wait=20")).await;
    assert_ne!(resolved["status"], "pending", "{resolved}");
    app.settled(call).await
}

#[tokio::test]
async fn an_approved_call_is_forwarded_once_with_the_arguments_approved() {
    let app = spawn_gated().await;
    let call = app.call("modern", "echo", json!({"text": "hello", "a": [1]})).await;
    let id = call["id"].as_str().unwrap();
    assert_eq!(call["status"], "input_required", "{call}");
    let approval = app.request_of(&call).await;
    assert_eq!(call["requests"], json!([approval["id"]]));
    assert_eq!(approval["kind"], "approval");
    assert_eq!(approval["prompt"], "anonymous wants echo on modern");
    assert_eq!(
        approval["data"]["call"],
        json!({"server": "modern", "tool": "echo", "arguments": {"text": "hello", "a": [1]}, "caller": "anonymous"})
    );
    let canonical = r#"{"a":[1],"text":"hello"}"#;
    assert_eq!(
        approval["data"]["digest"],
        toolnexus_gateway::approvals::digest(&json!({"text": "hello", "a": [1]}))
    );
    assert_eq!(
        toolnexus_gateway::approvals::canonical_json(&approval["data"]["call"]["arguments"]),
        canonical
    );
    let request = approval["id"].as_str().unwrap();
    app.answer_ok(request, json!({"ok": true})).await;
    let done = after(&app, request, id).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["result"]["content"][0]["text"], "hello");

    // The upstream sees what was approved: confirm_action asks about the action it was given.
    let call = app.call("modern", "confirm_action", json!({"action": "deploy"})).await;
    let approval = app.request_of(&call).await;
    let request = approval["id"].as_str().unwrap();
    app.answer_ok(request, json!({"ok": true})).await;
    let asked = after(&app, request, call["id"].as_str().unwrap()).await;
    let confirm = app.request_of(&asked).await;
    assert_eq!(
        (confirm["kind"].as_str(), confirm["prompt"].as_str()),
        (Some("input"), Some("Confirm: deploy?"))
    );
    assert_eq!(
        requests_of(&app, call["id"].as_str().unwrap()).await.len(),
        2,
        "forwarded once"
    );
}

#[tokio::test]
async fn a_declined_call_never_reaches_the_upstream() {
    let app = spawn_gated().await;
    for (reason, said) in [("declined", "declined"), ("cancelled", "cancelled")] {
        let call = app.call("modern", "confirm_action", json!({"action": "drop"})).await;
        let id = call["id"].as_str().unwrap();
        let request = app.request_of(&call).await["id"].as_str().unwrap().to_owned();
        app.answer_ok(&request, json!({"ok": false, "reason": reason})).await;
        let failed = after(&app, &request, id).await;
        assert_eq!(failed["status"], "failed", "{failed}");
        assert_eq!(failed["error"]["reason"], "declined");
        let message = failed["error"]["message"].as_str().unwrap();
        assert!(message.contains(said) && message.contains("anonymous"), "{message}");
        assert_eq!(
            requests_of(&app, id).await.len(),
            1,
            "the upstream asked nothing: it never ran"
        );
    }
}

#[tokio::test]
async fn an_approval_nobody_answers_expires_and_fails_its_call() {
    let app = spawn_gated().await;
    let call = app.call("legacy", "confirm_action", json!({"action": "wait"})).await;
    let approval = app.request_of(&call).await;
    app.advance(Duration::from_secs(3600));
    let failed = after(&app, approval["id"].as_str().unwrap(), call["id"].as_str().unwrap()).await;
    assert_eq!(failed["status"], "failed", "{failed}");
    assert_eq!(failed["error"]["reason"], "expired");
    assert_eq!(
        requests_of(&app, call["id"].as_str().unwrap()).await[0]["status"],
        "expired"
    );
}

#[tokio::test]
async fn calls_no_policy_covers_run_at_once() {
    let app = spawn_gated().await;
    for (server, tool) in [("legacy", "echo"), ("modern", "flood")] {
        let call = app.call(server, tool, json!({"text": "now", "count": 0})).await;
        assert_eq!(call["status"], "completed", "{server} {tool}: {call}");
        assert!(requests_of(&app, call["id"].as_str().unwrap()).await.is_empty());
    }
}

/// An agent, an approver, the on-call approver and an admin; `confirm_*` needs the on-call's yes.
fn authenticated() -> String {
    format!(
        "{BOTH_ERAS}{}{}{}{}[[approvals]]\nserver = \"*\"\ntools = [\"confirm_*\"]\napprovers = [\"on-call\"]\n\
         [[approvals]]\nserver = \"modern\"\ntools = [\"echo\"]\n",
        token_entry("agent", "agent"),
        token_entry("lead", "approver"),
        token_entry("on-call", "approver"),
        token_entry("ops", "admin"),
    )
}

/// Sends a request as `name`, returning the status and the JSON body.
async fn as_(app: &TestApp, name: &str, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
    let mut request = app
        .client
        .request(method, format!("{}{path}", app.address))
        .header(AUTHORIZATION, format!("Bearer {name}-token"));
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    (response.status().as_u16(), response.json().await.unwrap_or(Value::Null))
}

async fn answer_as(app: &TestApp, name: &str, request: &str, ok: bool) -> (u16, Value) {
    let path = format!("/requests/{request}/answer");
    as_(app, name, reqwest::Method::POST, &path, Some(json!({"ok": ok}))).await
}

#[tokio::test]
async fn nobody_approves_their_own_call_and_approvers_are_honoured() {
    let app = spawn_app(&authenticated()).await;
    let (call, request) = held_as(&app, "agent", "echo", json!({"text": "mine"})).await;
    let (status, problem) = answer_as(&app, "agent", &request, true).await;
    assert_eq!(status, 403, "{problem}");
    assert!(
        problem["detail"].as_str().unwrap().contains("may not approve"),
        "{problem}"
    );
    let (_, still) = as_(&app, "ops", reqwest::Method::GET, &format!("/requests/{request}"), None).await;
    assert_eq!(still["status"], "pending", "a refused answer changes nothing");
    assert_eq!(answer_as(&app, "lead", &request, true).await.0, 200);
    let (_, done) = as_(
        &app,
        "agent",
        reqwest::Method::GET,
        &format!("/calls/{call}?wait=20"),
        None,
    )
    .await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["result"]["content"][0]["text"], "mine");

    let (_, request) = held_as(&app, "ops", "echo", json!({"text": "admin's own"})).await;
    assert_eq!(
        answer_as(&app, "ops", &request, true).await.0,
        403,
        "an admin's own call too"
    );

    let (call, request) = held_as(&app, "agent", "confirm_action", json!({"action": "page"})).await;
    for off_the_list in ["lead", "ops"] {
        let (status, problem) = answer_as(&app, off_the_list, &request, false).await;
        assert_eq!(status, 403, "{off_the_list}: {problem}");
        assert!(
            problem["detail"].as_str().unwrap().contains("not among the approvers"),
            "{problem}"
        );
    }
    let (status, answered) = answer_as(&app, "on-call", &request, false).await;
    assert_eq!(
        (status, answered["answeredBy"].as_str()),
        (200, Some("on-call")),
        "{answered}"
    );
    let (_, failed) = as_(
        &app,
        "agent",
        reqwest::Method::GET,
        &format!("/calls/{call}?wait=20"),
        None,
    )
    .await;
    assert_eq!(failed["error"]["reason"], "declined", "{failed}");
    assert!(
        failed["error"]["message"].as_str().unwrap().contains("on-call"),
        "{failed}"
    );
}

#[tokio::test]
async fn the_policies_are_listed_to_admins_only() {
    let app = spawn_app(&authenticated()).await;
    let (status, policies) = as_(&app, "ops", reqwest::Method::GET, "/approvals", None).await;
    assert_eq!(status, 200, "{policies}");
    assert_eq!(
        policies,
        json!([
            {"server": "*", "tools": ["confirm_*"], "prompt": "Allow {tool} on {server}?", "approvers": ["on-call"], "selfApproval": false, "quorum": 1, "editable": false, "grants": []},
            {"server": "modern", "tools": ["echo"], "prompt": "Allow {tool} on {server}?", "approvers": [], "selfApproval": false, "quorum": 1, "editable": false, "grants": []},
        ])
    );
    for name in ["agent", "lead"] {
        let (status, problem) = as_(&app, name, reqwest::Method::GET, "/approvals", None).await;
        assert_eq!(status, 403, "{name}: {problem}");
    }
}

/// A call waiting on its approval on a shared session outlives a restart (tests/api/restart.rs); on a
/// private session, which ends with the process, it does not.
#[tokio::test]
async fn a_call_awaiting_approval_on_a_private_session_ends_with_the_process() {
    for how in ["terminate", "kill"] {
        let dir = tempfile::tempdir().unwrap();
        let servers = format!("{BOTH_ERAS}{POLICIES}");
        let mut app = spawn_process_in(dir.path(), "", &servers, "").await;
        let session = app.post("/sessions", &json!({"server": "modern"})).await;
        assert_eq!(session.status(), 201);
        let session = session.json::<Value>().await.unwrap()["id"].clone();
        let call = app
            .call_on(json!({"session": session, "tool": "echo", "arguments": {"text": "later"}}))
            .await;
        let id = call["id"].as_str().unwrap().to_owned();
        let request = app.request_of(&call).await["id"].as_str().unwrap().to_owned();
        match how {
            "terminate" => assert_eq!(app.terminate(), Some(0)),
            _ => app.kill(),
        }
        let app = spawn_process_in(dir.path(), "", &servers, "").await;
        let ended = app.get_json(&format!("/calls/{id}")).await;
        assert_eq!(ended["status"], "failed", "{how}: {ended}");
        let approval = app.get_json(&format!("/requests/{request}")).await;
        assert_eq!(approval["status"], "cancelled", "{how}: {approval}");
        assert_eq!(app.answer(&request, json!({"ok": true})).await.status(), 410);
        assert!(requests_of(&app, &id).await.len() == 1, "{how}: nothing went upstream");
    }
}

#[tokio::test]
async fn cancelling_a_call_cancels_its_approval() {
    let app = spawn_gated().await;
    let call = app.call("modern", "echo", json!({"text": "never"})).await;
    let id = call["id"].as_str().unwrap();
    let request = app.request_of(&call).await["id"].as_str().unwrap().to_owned();
    assert_eq!(app.delete(&format!("/calls/{id}")).await.status(), 200);
    let approval = app.get_json(&format!("/requests/{request}?wait=20")).await;
    assert_eq!(approval["status"], "cancelled", "{approval}");
    assert_eq!(app.answer(&request, json!({"ok": true})).await.status(), 410);
    assert_eq!(app.settled(id).await["status"], "cancelled");
}
