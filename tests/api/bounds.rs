//! Every door keeps every bound: requests held on `/mcp` count against the same per-principal caps as REST
//! long-polls, `/mcp` GET streams against the stream cap, 2025-11-25 sessions against their own, and `/mcp`
//! refuses a key given twice as REST does — with nothing started past a cap, and `/healthz` answering.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{BOTH_ERAS, Caller, TestApp, poll_until, start_with, token_entry};

/// One principal may hold two long-polls, one stream and one `/mcp` session.
async fn spawn_bounded() -> TestApp {
    let settings = format!(
        "[limits]\nlong_polls_per_principal = 2\nstreams_per_principal = 1\nmcp_sessions_per_principal = 1\n\
         [front_door]\nmax_hold = \"60s\"\n{}{}{}",
        token_entry("agent", "agent"),
        token_entry("other", "agent"),
        token_entry("lead", "approver"),
    );
    let app = start_with(&settings, BOTH_ERAS, "");
    assert_eq!(app.get("/readyz?wait=30").await.status(), 200);
    app
}

/// A 2026-07-28 `tools/call` of `name`, sent by `who` as its own request; `state` makes it a retry.
fn call(app: &TestApp, who: &str, name: &str, arguments: Value, state: Option<&str>) -> reqwest::RequestBuilder {
    let mut params = json!({"name": name, "arguments": arguments, "_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "curl", "version": "1"}}});
    if let Some(state) = state {
        params["requestState"] = json!(state);
        params["inputResponses"] = json!({});
    }
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params});
    mcp(app, who, "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", name)
        .body(body.to_string())
}

/// A POST to `/mcp` as `who` in protocol `version`, its body still to be given.
fn mcp(app: &TestApp, who: &str, version: &str) -> reqwest::RequestBuilder {
    app.client
        .post(format!("{}/mcp", app.address))
        .bearer_auth(format!("{who}-token"))
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json")
        .header("mcp-protocol-version", version)
}

/// A 2025-11-25 `initialize` as `who`.
async fn initialize(app: &TestApp, who: &str) -> reqwest::Response {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "curl", "version": "1"}}});
    mcp(app, who, "2025-11-25").body(body.to_string()).send().await.unwrap()
}

/// A GET stream of a 2025-11-25 `session` as `who`.
async fn stream_of(app: &TestApp, who: &str, session: &str) -> reqwest::Response {
    app.client
        .get(format!("{}/mcp", app.address))
        .bearer_auth(format!("{who}-token"))
        .header("accept", "text/event-stream")
        .header("mcp-session-id", session)
        .header("mcp-protocol-version", "2025-11-25")
        .send()
        .await
        .unwrap()
}

/// A `429` naming `setting`.
async fn refused(response: reqwest::Response, setting: &str) {
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    let problem: Value = response.json().await.unwrap();
    assert!(problem["detail"].as_str().unwrap().contains(setting), "{problem}");
}

async fn calls_of(who: &Caller) -> usize {
    let (status, calls) = who.get("/calls").await;
    assert_eq!(status, 200, "{calls}");
    calls.as_array().unwrap().len()
}

#[tokio::test]
async fn held_mcp_requests_count_as_long_polls_and_past_the_cap_nothing_starts() {
    let app = spawn_bounded().await;
    let (agent, lead) = (Caller::new(&app, "agent"), Caller::new(&app, "lead"));
    // The agent takes every cap at once: its one session and its one stream first, then two held calls.
    let opened = initialize(&app, "agent").await;
    assert_eq!(opened.status(), 200);
    let session = opened.headers()["mcp-session-id"].to_str().unwrap().to_owned();
    let stream = stream_of(&app, "agent", &session).await;
    assert_eq!(stream.status(), 200);
    let held: Vec<_> = (0..2)
        .map(|index| {
            let arguments = json!({"action": format!("held {index}")});
            tokio::spawn(call(&app, "agent", "modern__confirm_action", arguments, None).send())
        })
        .collect();
    let pending = poll_until("both calls wait on a human", || async {
        let (_, pending) = lead.get("/requests").await;
        let pending = pending.as_array().cloned().unwrap_or_default();
        (pending.len() == 2).then_some(pending)
    })
    .await;

    let third = call(&app, "agent", "modern__echo", json!({"text": "third"}), None);
    refused(third.send().await.unwrap(), "limits.long_polls_per_principal").await;
    let call_id = pending[0]["call"].as_str().unwrap();
    let awaited = call(&app, "agent", "gateway__await_call", json!({"call": call_id}), None);
    refused(awaited.send().await.unwrap(), "limits.long_polls_per_principal").await;
    let retried = call(&app, "agent", "modern__confirm_action", json!({}), Some(call_id));
    refused(retried.send().await.unwrap(), "limits.long_polls_per_principal").await;
    let (status, problem) = agent.get("/requests?wait=5").await;
    assert_eq!(status, 429, "REST long-polls share the cap: {problem}");
    let (status, problem) = agent.get("/events").await;
    assert_eq!(status, 429, "REST streams share the cap: {problem}");
    assert_eq!(calls_of(&agent).await, 2, "nothing started past the cap");

    let theirs = call(&app, "other", "modern__echo", json!({"text": "theirs"}), None);
    let theirs = theirs.send().await.unwrap();
    assert_eq!(theirs.status(), 200, "another principal's cap is its own");
    assert!(theirs.text().await.unwrap().contains("theirs"));
    assert_eq!(
        app.get("/healthz").await.status(),
        200,
        "health answers while one agent is at every cap"
    );

    // An answer ends a held request, and its place is free again.
    let id = pending[0]["id"].as_str().unwrap();
    let (status, _) = lead
        .post(
            &format!("/requests/{id}/answer"),
            json!({"ok": true, "data": {"confirm": true}}),
        )
        .await;
    assert_eq!(status, 200);
    let ended = futures::future::select_all(held).await.0.unwrap().unwrap();
    assert_eq!(ended.status(), 200);
    let fourth = call(&app, "agent", "modern__echo", json!({"text": "fourth"}), None);
    assert_eq!(fourth.send().await.unwrap().status(), 200);
    drop(stream);
}

#[tokio::test]
async fn mcp_streams_share_the_stream_cap_and_sessions_have_a_cap_of_their_own() {
    let app = spawn_bounded().await;
    let agent = Caller::new(&app, "agent");
    let opened = initialize(&app, "agent").await;
    assert_eq!(opened.status(), 200);
    let session = opened.headers()["mcp-session-id"].to_str().unwrap().to_owned();

    refused(initialize(&app, "agent").await, "limits.mcp_sessions_per_principal").await;
    assert_eq!(
        initialize(&app, "other").await.status(),
        200,
        "the cap is per principal"
    );

    let events = agent
        .client
        .get(format!("{}/events", agent.address))
        .send()
        .await
        .unwrap();
    assert_eq!(events.status(), 200);
    refused(stream_of(&app, "agent", &session).await, "limits.streams_per_principal").await;
    drop(events);
    let stream = poll_until("the /events stream's place is free", || async {
        let stream = stream_of(&app, "agent", &session).await;
        (stream.status() == 200).then_some(stream)
    })
    .await;
    let (status, problem) = agent.get("/events").await;
    assert_eq!(status, 429, "{problem}");
    assert_eq!(app.get("/healthz").await.status(), 200);
    drop(stream);

    let closed = app
        .client
        .delete(format!("{}/mcp", app.address))
        .bearer_auth("agent-token")
        .header("mcp-session-id", &session)
        .header("mcp-protocol-version", "2025-11-25")
        .send()
        .await
        .unwrap();
    assert!(closed.status().is_success(), "{}", closed.status());
    assert_eq!(
        initialize(&app, "agent").await.status(),
        200,
        "a closed session frees its place"
    );
}

#[tokio::test]
async fn a_key_given_twice_in_an_mcp_body_is_400_and_starts_nothing() {
    let app = spawn_bounded().await;
    let agent = Caller::new(&app, "agent");
    let twice = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"modern__echo",
        "arguments":{"text":"shown","text":"run"},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28",
        "io.modelcontextprotocol/clientCapabilities":{},"io.modelcontextprotocol/clientInfo":{"name":"curl","version":"1"}}}}"#;
    let response = mcp(&app, "agent", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", "modern__echo")
        .body(twice)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    let problem: Value = response.json().await.unwrap();
    assert!(problem["detail"].as_str().unwrap().contains("\"text\""), "{problem}");
    assert_eq!(calls_of(&agent).await, 0);

    let initialize = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","method":"tools/list","params":{}}"#;
    let response = mcp(&app, "agent", "2025-11-25").body(initialize).send().await.unwrap();
    assert_eq!(response.status(), 400);
}
