//! Authentication and ownership: who may see, start, cancel and answer what.

use std::process::{Command, Stdio};

use serde_json::{Value, json};

use crate::helpers::{BINARY, BOTH_ERAS, Caller, Output, TestApp, first_request, spawn_app, token_entry};

/// Two agents, an approver and an admin, each with its token given as its SHA-256.
fn config() -> String {
    format!(
        "{BOTH_ERAS}\n{}{}{}{}",
        token_entry("agent-a", "agent"),
        token_entry("agent-b", "agent"),
        token_entry("lead", "approver"),
        token_entry("ops", "admin")
    )
}

#[tokio::test]
async fn tokens_are_required_except_on_open_routes() {
    let app = spawn_app_authenticated().await;
    let anonymous = app.get("/requests").await;
    assert_eq!(anonymous.status(), 401);
    assert_eq!(anonymous.headers()["www-authenticate"], "Bearer");
    assert_eq!(anonymous.headers()["content-type"], "application/problem+json");
    let wrong = app
        .client
        .get(format!("{}/calls", app.address))
        .bearer_auth("nope")
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);
    for open in ["/healthz", "/readyz", "/openapi.json", "/ui/"] {
        assert_eq!(app.get(open).await.status(), 200, "{open}");
    }
    assert_eq!(
        app.get("/metrics").await.status(),
        401,
        "metrics need a token unless public_metrics"
    );
    assert_eq!(Caller::new(&app, "lead").get("/metrics").await.0, 200);
    let document = app.get_json("/openapi.json").await;
    assert!(document["paths"]["/requests"]["get"]["responses"].get("401").is_some());
    assert!(document["paths"]["/healthz"]["get"]["responses"].get("401").is_none());
}

#[tokio::test]
async fn a_guess_on_a_shared_stdio_session_gives_no_agent_another_tenant_s_request() {
    let app = spawn_app_authenticated().await;
    let (a, b, lead) = (
        Caller::new(&app, "agent-a"),
        Caller::new(&app, "agent-b"),
        Caller::new(&app, "lead"),
    );
    // While only agent-a's calls have run on the legacy stdio session, the one call in flight is proof enough.
    let call = a.call("legacy", "confirm_action").await;
    let id = first_request(&call);
    assert_eq!(a.get(&format!("/requests/{id}")).await.1["owner"], "agent-a");
    a.post(&format!("/requests/{id}/answer"), json!({"ok": false})).await;

    // Once agent-b's work has run there too, the wire cannot tell whose an elicitation is: nobody's.
    let (status, other) = b
        .post(
            "/calls?wait=20",
            json!({"server": "legacy", "tool": "echo", "arguments": {"text": "b"}}),
        )
        .await;
    assert_eq!((status, &other["status"]), (201, &json!("completed")), "{other}");
    let call = a.call("legacy", "confirm_action").await;
    assert_eq!(call["status"], "input_required", "{call}");
    let id = first_request(&call);
    let (status, unproven) = lead.get(&format!("/requests/{id}")).await;
    assert_eq!(status, 200);
    assert_eq!(unproven["owner"], Value::Null, "{unproven}");
    assert_eq!(unproven["call"], call["id"]);
    assert_eq!(a.get(&format!("/requests/{id}")).await.0, 403);
    assert_eq!(a.get("/requests").await.1, json!([]));
    assert_eq!(b.get("/requests").await.1, json!([]));
    let (status, _) = lead
        .post(
            &format!("/requests/{id}/answer"),
            json!({"ok": true, "data": {"confirm": true}}),
        )
        .await;
    assert_eq!(status, 200);
    let (_, done) = a.get(&format!("/calls/{}?wait=20", call["id"].as_str().unwrap())).await;
    assert_eq!(done["status"], "completed", "{done}");
}

#[tokio::test]
async fn an_agent_sees_and_answers_only_its_own_requests() {
    let app = spawn_app_authenticated().await;
    let (a, b) = (Caller::new(&app, "agent-a"), Caller::new(&app, "agent-b"));
    let call = a.call("modern", "confirm_action").await;
    assert_eq!(call["owner"], "agent-a");
    let id = first_request(&call);

    let (_, mine) = a.get("/requests").await;
    assert_eq!(mine[0]["owner"], "agent-a");
    assert_eq!(
        b.get("/requests").await.1,
        json!([]),
        "agent-b lists nothing of agent-a's"
    );
    assert_eq!(b.get(&format!("/requests/{id}")).await.0, 403);
    assert_eq!(
        b.post(&format!("/requests/{id}/answer"), json!({"ok": false})).await.0,
        403
    );
    assert_eq!(b.get(&format!("/calls/{}", call["id"].as_str().unwrap())).await.0, 403);
    assert_eq!(
        b.delete(&format!("/calls/{}", call["id"].as_str().unwrap())).await.0,
        403
    );
    assert_eq!(b.get("/calls").await.1, json!([]));

    let (status, answered) = a
        .post(
            &format!("/requests/{id}/answer"),
            json!({"ok": true, "data": {"confirm": true}}),
        )
        .await;
    assert_eq!(status, 200, "{answered}");
    assert_eq!(answered["answeredBy"], "agent-a");
}

#[tokio::test]
async fn an_approver_answers_every_request_but_starts_nothing() {
    let app = spawn_app_authenticated().await;
    let (agent, lead, ops) = (
        Caller::new(&app, "agent-b"),
        Caller::new(&app, "lead"),
        Caller::new(&app, "ops"),
    );
    let call = agent.call("legacy", "confirm_action").await;
    let id = first_request(&call);
    assert_eq!(lead.get("/requests").await.1[0]["id"], id.as_str());
    let (status, answered) = lead
        .post(
            &format!("/requests/{id}/answer"),
            json!({"ok": false, "reason": "declined"}),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(answered["answeredBy"], "lead");
    assert_eq!(
        lead.post(
            "/calls",
            json!({"server": "legacy", "tool": "echo", "arguments": {"text": "x"}})
        )
        .await
        .0,
        403
    );
    assert_eq!(lead.post("/sessions", json!({"server": "legacy"})).await.0, 403);

    let second = agent.call("legacy", "confirm_action").await;
    assert_eq!(
        lead.delete(&format!("/calls/{}", second["id"].as_str().unwrap()))
            .await
            .0,
        403
    );
    let (status, cancelled) = ops.delete(&format!("/calls/{}", second["id"].as_str().unwrap())).await;
    assert_eq!((status, cancelled["status"].as_str()), (200, Some("cancelled")));
}

#[tokio::test]
async fn private_sessions_belong_to_whoever_opened_them() {
    let app = spawn_app_authenticated().await;
    let (a, b) = (Caller::new(&app, "agent-a"), Caller::new(&app, "agent-b"));
    let (status, session) = a.post("/sessions", json!({"server": "legacy"})).await;
    assert_eq!(status, 201);
    assert_eq!(session["owner"], "agent-a");
    let id = session["id"].as_str().unwrap();
    assert_eq!(b.get(&format!("/sessions/{id}")).await.0, 403);
    assert_eq!(b.get(&format!("/sessions/{id}/tools")).await.0, 403);
    assert_eq!(
        b.post(
            "/calls",
            json!({"session": id, "tool": "echo", "arguments": {"text": "x"}})
        )
        .await
        .0,
        403
    );
    assert_eq!(b.delete(&format!("/sessions/{id}")).await.0, 403);
    let listed = b.get("/sessions").await.1;
    assert!(listed.as_array().unwrap().iter().all(|s| s["id"] != id), "{listed}");
    assert_eq!(
        listed.as_array().unwrap().len(),
        2,
        "the shared sessions are visible to all"
    );
    assert_eq!(a.delete(&format!("/sessions/{id}")).await.0, 200);
}

#[tokio::test]
async fn an_agents_event_stream_carries_only_its_own_objects() {
    let app = spawn_app_authenticated().await;
    let (a, b) = (Caller::new(&app, "agent-a"), Caller::new(&app, "agent-b"));
    let response = b.client.get(format!("{}/events", app.address)).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let mut events = crate::helpers::EventStream::new(response);
    a.call("modern", "confirm_action").await;
    let own = b.call("modern", "confirm_action").await;
    let created = events.next_of("request.created").await;
    assert_eq!(created.data["owner"], "agent-b");
    assert_eq!(created.data["call"], own["id"]);
}

#[test]
fn without_tokens_it_refuses_a_non_loopback_address() {
    let refused = Command::new(BINARY).args(["--listen", "0.0.0.0:0"]).output().unwrap();
    assert_eq!(refused.status.code(), Some(1));
    let message = String::from_utf8(refused.stderr).unwrap();
    assert!(
        message.contains("refusing to listen on 0.0.0.0:0 without authentication"),
        "{message}"
    );
    assert!(
        message.contains("--allow-unauthenticated") && message.contains("[[auth.tokens]]"),
        "{message}"
    );

    // The built-in default's store is a file in the user's state directory: this run keeps its own.
    let state = tempfile::tempdir().unwrap();
    let mut allowed = Command::new(BINARY)
        .args(["--listen", "0.0.0.0:0", "--allow-unauthenticated"])
        .env("XDG_STATE_HOME", state.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = Output::collect(allowed.stdout.take().unwrap(), "[open gateway] ");
    stdout.wait_for("listening on http://0.0.0.0:");
    crate::helpers::signal(allowed.id(), "TERM");
    assert_eq!(allowed.wait().unwrap().code(), Some(0));
}

async fn spawn_app_authenticated() -> TestApp {
    spawn_app(&config()).await
}
