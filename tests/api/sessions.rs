//! Servers, sessions, tools, health and readiness.

use serde_json::{Value, json};

use crate::helpers::{BINARY, BOTH_ERAS, spawn_app, start};

#[tokio::test]
async fn servers_and_their_shared_sessions_are_listed() {
    let app = spawn_app(BOTH_ERAS).await;
    let servers = app.get_json("/servers").await;
    assert_eq!(servers.as_array().unwrap().len(), 2);
    for server in servers.as_array().unwrap() {
        assert_eq!(server["transport"], "stdio");
        assert_eq!(server["status"], "ready");
        let session = app
            .get_json(&format!("/sessions/{}", server["session"].as_str().unwrap()))
            .await;
        assert_eq!(session["shared"], true);
        assert_eq!(session["server"], server["name"]);
        assert_eq!(session["serverInfo"]["name"], "toolnexus-demo");
    }
    let sessions = app.get_json("/sessions").await;
    let mut versions: Vec<(&str, &str)> = sessions
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["server"].as_str().unwrap(), s["protocolVersion"].as_str().unwrap()))
        .collect();
    versions.sort();
    assert_eq!(versions, [("legacy", "2025-11-25"), ("modern", "2026-07-28")]);
    assert_eq!(app.get("/servers/nope").await.status(), 404);
    assert_eq!(app.get_json("/healthz").await, json!({"status": "ok"}));
}

#[tokio::test]
async fn tools_are_listed_per_server_and_per_session() {
    let app = spawn_app(BOTH_ERAS).await;
    let tools = app.get_json("/servers/legacy/tools").await;
    let names: Vec<&str> = tools["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    for expected in [
        "echo",
        "confirm_action",
        "collect_profile",
        "authorize",
        "two_step",
        "slow",
        "crash",
    ] {
        assert!(names.contains(&expected), "{names:?}");
    }
    let shared = app.get_json("/servers/modern").await["session"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(app.get_json(&format!("/sessions/{shared}/tools")).await, tools);
    assert_eq!(app.get("/servers/nope/tools").await.status(), 404);
}

#[tokio::test]
async fn private_sessions_open_serve_calls_and_close() {
    let app = spawn_app(BOTH_ERAS).await;
    let response = app.post("/sessions", &json!({"server": "modern"})).await;
    assert_eq!(response.status(), 201);
    let location = response.headers()["location"].to_str().unwrap().to_owned();
    let session: Value = response.json().await.unwrap();
    assert_eq!(location, format!("/sessions/{}", session["id"].as_str().unwrap()));
    assert_eq!(session["shared"], false);
    assert_eq!(session["status"], "ready");
    assert_eq!(session["protocolVersion"], "2026-07-28");

    let call = app
        .call_on(json!({"session": session["id"], "tool": "confirm_action", "arguments": {"action": "x"}}))
        .await;
    assert_eq!(call["session"], session["id"]);
    let request = app.request_of(&call).await;

    let closed = app.delete(&location).await;
    assert_eq!(closed.status(), 200);
    let closed: Value = closed.json().await.unwrap();
    assert_eq!(closed["status"], "closed");
    assert!(closed["closedAt"].is_string());
    let request = app
        .get_json(&format!("/requests/{}", request["id"].as_str().unwrap()))
        .await;
    assert_eq!(request["status"], "cancelled");
    assert!(request["detail"].as_str().unwrap().contains("closed by a client"));
    let call = app.settled(call["id"].as_str().unwrap()).await;
    assert_eq!(call["status"], "failed", "{call}");

    let open: Vec<Value> = app.get_json("/sessions").await.as_array().unwrap().clone();
    assert!(open.iter().all(|s| s["id"] != session["id"]));
    let all = app.get_json("/sessions?status=all").await;
    assert!(all.as_array().unwrap().iter().any(|s| s["id"] == session["id"]));
    let late = app
        .post(
            "/calls",
            &json!({"session": session["id"], "tool": "echo", "arguments": {"text": "x"}}),
        )
        .await;
    assert_eq!(late.status(), 409);

    let shared = app.get_json("/servers/legacy").await["session"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(app.delete(&format!("/sessions/{shared}")).await.status(), 409);
    assert_eq!(app.delete("/sessions/ses-unknown").await.status(), 404);
    assert_eq!(app.post("/sessions", &json!({"server": "nope"})).await.status(), 404);
}

/// An id of the right shape that names nothing, and one of a shape the gateway never mints, are answered alike.
#[tokio::test]
async fn unknown_ids_of_any_shape_name_nothing() {
    let app = spawn_app(BOTH_ERAS).await;
    for call in [
        "call-0190f1d2c3b47000800000000000abcd",
        "call-unknown",
        "ses-0190f1d2c3b47000800000000000abcd",
    ] {
        for response in [
            app.get(&format!("/calls/{call}")).await,
            app.delete(&format!("/calls/{call}")).await,
        ] {
            assert_eq!(response.status(), 404);
            let problem: Value = response.json().await.unwrap();
            assert_eq!(problem["detail"], format!("no call with id {call}"), "{problem}");
        }
    }
    for session in [
        "ses-0190f1d2c3b47000800000000000abcd",
        "ses-unknown",
        "call-0190f1d2c3b47000800000000000abcd",
    ] {
        let responses = [
            app.get(&format!("/sessions/{session}")).await,
            app.delete(&format!("/sessions/{session}")).await,
            app.get(&format!("/sessions/{session}/tools")).await,
            app.post("/calls", &json!({"session": session, "tool": "echo"})).await,
        ];
        for response in responses {
            assert_eq!(response.status(), 404);
            let problem: Value = response.json().await.unwrap();
            assert_eq!(problem["detail"], format!("no session {session}"), "{problem}");
        }
    }
    for (path, id) in [
        (
            "elc-0190f1d2c3b47000800000000000abcd",
            "elc-0190f1d2c3b47000800000000000abcd",
        ),
        ("a%20b", "a b"),
    ] {
        let responses = [
            app.get(&format!("/requests/{path}")).await,
            app.post(
                &format!("/requests/{path}/answer"),
                &json!({"ok": false, "reason": "declined"}),
            )
            .await,
        ];
        for response in responses {
            assert_eq!(response.status(), 404);
            let problem: Value = response.json().await.unwrap();
            assert_eq!(problem["detail"], format!("no Request with id {id}"), "{problem}");
        }
    }
}

#[tokio::test]
async fn bad_call_requests_are_rejected() {
    let app = spawn_app(BOTH_ERAS).await;
    let both = app
        .post(
            "/calls",
            &json!({"server": "legacy", "session": "ses-x", "tool": "echo"}),
        )
        .await;
    assert_eq!(both.status(), 400);
    let neither = app.post("/calls", &json!({"tool": "echo"})).await;
    assert_eq!(neither.status(), 400);
    let unknown = app.post("/calls", &json!({"server": "nope", "tool": "echo"})).await;
    assert_eq!(unknown.status(), 404);
    let args = app
        .post("/calls", &json!({"server": "legacy", "tool": "echo", "arguments": [1]}))
        .await;
    assert_eq!(args.status(), 400);
    assert_eq!(app.get("/calls/call-unknown").await.status(), 404);
    assert_eq!(app.delete("/calls/call-unknown").await.status(), 404);
    let missing_tool = app.call("legacy", "no_such_tool", json!({})).await;
    assert_eq!(missing_tool["status"], "failed", "{missing_tool}");
    let created = app
        .post(
            "/calls",
            &json!({"server": "legacy", "tool": "echo", "arguments": {"text": "x"}}),
        )
        .await;
    assert_eq!(created.status(), 201);
    let location = created.headers()["location"].to_str().unwrap().to_owned();
    let id = created.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(location, format!("/calls/{id}"));
    let calls = app.get_json("/calls?server=legacy").await;
    assert!(calls.as_array().unwrap().iter().any(|c| c["id"] == id.as_str()));
}

#[tokio::test]
async fn a_key_given_twice_in_a_call_or_session_body_is_400_and_starts_nothing() {
    let app = spawn_app(BOTH_ERAS).await;
    let sessions = app.get_json("/sessions").await;
    let cases = [
        (
            "/calls",
            r#"{"server": "legacy", "tool": "echo", "arguments": {"text": "a", "text": "b"}}"#,
            "\"text\"",
        ),
        (
            "/calls",
            r#"{"server": "legacy", "tool": "echo", "arguments": {"deep": [{"k": 1, "k": 1}]}}"#,
            "\"k\"",
        ),
        (
            "/calls",
            r#"{"server": "legacy", "tool": "echo", "tool": "crash"}"#,
            "\"tool\"",
        ),
        ("/sessions", r#"{"server": "legacy", "server": "modern"}"#, "\"server\""),
    ];
    for (path, body, key) in cases {
        let response = app
            .client
            .post(format!("{}{path}", app.address))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 400, "{path} {body}");
        let problem: Value = response.json().await.unwrap();
        let detail = problem["detail"].as_str().unwrap();
        assert!(
            detail.contains(key) && detail.contains("more than once"),
            "{body}: {detail}"
        );
    }
    assert_eq!(app.get_json("/calls").await, json!([]));
    assert_eq!(app.get_json("/sessions").await, sessions);
}

#[tokio::test]
async fn auto_falls_back_to_2025_11_25_for_a_server_without_2026_07_28() {
    let app = spawn_app(&format!(
        "[[servers]]\nname = \"old\"\ncommand = \"{BINARY}\"\nargs = [\"demo-server\", \"--legacy\"]\n"
    ))
    .await;
    let server = app.get_json("/servers/old").await;
    let session = app
        .get_json(&format!("/sessions/{}", server["session"].as_str().unwrap()))
        .await;
    assert_eq!(session["protocolVersion"], "2025-11-25");
    let call = app.call("old", "confirm_action", json!({"action": "legacy"})).await;
    assert_eq!(app.request_of(&call).await["prompt"], "Confirm: legacy?");
}

#[tokio::test]
async fn a_server_pinned_to_2026_07_28_that_does_not_speak_it_fails_clearly() {
    let app = start(
        &format!(
            "[[servers]]\nname = \"old\"\ncommand = \"{BINARY}\"\nargs = [\"demo-server\", \"--legacy\"]\nprotocol = \"2026-07-28\"\n"
        ),
        "",
    );
    let server = app.get_json("/servers/old?wait=20").await;
    assert_eq!(server["status"], "failed", "{server}");
    assert!(
        server["detail"]
            .as_str()
            .unwrap()
            .contains("does not speak protocol 2026-07-28"),
        "{server}"
    );
    let ready = app.get("/readyz").await;
    assert_eq!(ready.status(), 503);
    assert_eq!(ready.json::<Value>().await.unwrap()["notReady"], json!(["old"]));
    let refused = app
        .post(
            "/calls",
            &json!({"server": "old", "tool": "echo", "arguments": {"text": "x"}}),
        )
        .await;
    assert_eq!(refused.status(), 503);
    assert_eq!(refused.headers()["retry-after"], "1");
    let unreachable = app.post("/sessions", &json!({"server": "old"})).await;
    assert_eq!(unreachable.status(), 502);
}
