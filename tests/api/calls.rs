//! Each demo tool's round trip in both protocol eras, and what ends a call early.

use std::time::Duration;

use serde_json::{Value, json};

use crate::helpers::{
    BOTH_ERAS, ERAS, TestApp, first_request, poll_until, results, spawn_app, spawn_app_with, spawn_process,
};

#[tokio::test]
async fn echo_completes_without_a_request() {
    let app = spawn_app(BOTH_ERAS).await;
    for era in ERAS {
        let call = app.call(era, "echo", json!({"text": "hello"})).await;
        assert_eq!(call["status"], "completed", "{call}");
        assert_eq!(call["result"]["content"][0]["text"], "hello");
        assert_eq!(call["requests"], json!([]));
    }
}

#[tokio::test]
async fn confirm_action_raises_a_form_request_and_completes_with_the_answer() {
    let app = spawn_app(BOTH_ERAS).await;
    for era in ERAS {
        let call = app.call(era, "confirm_action", json!({"action": "deploy"})).await;
        let request = app.request_of(&call).await;
        assert_eq!(request["kind"], "input");
        assert_eq!(request["prompt"], "Confirm: deploy?");
        assert_eq!(request["status"], "pending");
        assert_eq!(request["server"], era);
        assert_eq!(request["call"], call["id"]);
        assert_eq!(request["session"], call["session"]);
        assert_eq!(request["data"]["schema"]["required"], json!(["confirm"]));
        assert!(request["id"].as_str().unwrap().starts_with("elc-"));
        assert!(request.get("url").is_none() && request.get("expiresAt").is_some());
        assert_eq!(call["requests"], json!([request["id"]]));

        let answered = app
            .answer_ok(
                request["id"].as_str().unwrap(),
                json!({"ok": true, "data": {"confirm": true}}),
            )
            .await;
        assert_eq!(answered["status"], "answered");
        assert_eq!(
            answered["result"],
            json!({"action": "accept", "content": {"confirm": true, "note": ""}})
        );

        let done = app.settled(call["id"].as_str().unwrap()).await;
        assert_eq!(
            results(&done),
            json!([{"action": "accept", "content": {"confirm": true, "note": ""}}]),
            "{era}"
        );
        let text: Value = serde_json::from_str(done["result"]["content"][0]["text"].as_str().unwrap()).unwrap();
        assert_eq!(text, done["result"]["structuredContent"]);
    }
}

#[tokio::test]
async fn collect_profile_returns_exactly_the_values_given() {
    let app = spawn_app(BOTH_ERAS).await;
    for era in ERAS {
        let call = app.call(era, "collect_profile", json!({})).await;
        let request = app.request_of(&call).await;
        let properties = &request["data"]["schema"]["properties"];
        let names: Vec<&String> = properties.as_object().unwrap().keys().collect();
        assert_eq!(
            names,
            ["name", "email", "age", "score", "newsletter", "color", "tags"],
            "wire order is kept"
        );
        let data = json!({"name": "Ada", "email": "ada@example.com", "age": 36, "score": 9.5, "color": "green", "tags": ["a", "c"]});
        app.answer_ok(request["id"].as_str().unwrap(), json!({"ok": true, "data": data}))
            .await;
        let mut expected = data.clone();
        expected["newsletter"] = json!(false);
        let done = app.settled(call["id"].as_str().unwrap()).await;
        assert_eq!(
            results(&done),
            json!([{"action": "accept", "content": expected}]),
            "{era}"
        );
    }
}

#[tokio::test]
async fn authorize_raises_a_url_request_whose_accept_carries_no_content() {
    let app = spawn_app(BOTH_ERAS).await;
    for era in ERAS {
        let call = app.call(era, "authorize", json!({"service": "calendar"})).await;
        let request = app.request_of(&call).await;
        assert_eq!(request["kind"], "authorization");
        assert_eq!(request["url"], "https://example.com/authorize?service=calendar");
        assert_eq!(request["prompt"], "Authorize access to calendar");
        assert!(request.get("data").is_none(), "{request}");
        let id = request["id"].as_str().unwrap();
        let answered = app.answer_ok(id, json!({"ok": true})).await;
        assert_eq!(answered["result"], json!({"action": "accept"}));
        let done = app.settled(call["id"].as_str().unwrap()).await;
        assert_eq!(results(&done), json!([{"action": "accept"}]), "{era}");
    }
}

#[tokio::test]
async fn a_legacy_completion_notification_is_recorded_on_the_request() {
    let app = spawn_app(BOTH_ERAS).await;
    let call = app.call("legacy", "authorize", json!({"service": "drive"})).await;
    let id = app.request_of(&call).await["id"].as_str().unwrap().to_owned();
    app.answer_ok(&id, json!({"ok": true})).await;
    app.settled(call["id"].as_str().unwrap()).await;
    // The notification travels apart from the tool result, so it may land just after it.
    poll_until("completedAt set", || async {
        let view = app.get_json(&format!("/requests/{id}")).await;
        view["completedAt"].is_string().then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_long_poll_of_one_sessions_requests_wakes_for_the_request_raised_on_it() {
    let app = spawn_app(BOTH_ERAS).await;
    for era in ERAS {
        let session: Value = app
            .post("/sessions", &json!({"server": era}))
            .await
            .json()
            .await
            .unwrap();
        let session = session["id"].as_str().unwrap();
        let path = format!("/requests?session={session}&wait=30");
        let listed = app.get_json(&path);
        let raise = async {
            // Held before anything is raised on the session, and through a call on another session.
            app.metric_reaches("toolnexus_long_polls 1").await;
            assert_eq!(
                app.call(era, "echo", json!({"text": "elsewhere"})).await["status"],
                "completed"
            );
            app.call_on(json!({"session": session, "tool": "confirm_action", "arguments": {"action": "here"}}))
                .await
        };
        let (listed, call) = tokio::join!(listed, raise);
        assert_eq!(listed.as_array().map(Vec::len), Some(1), "{era}: {listed}");
        assert_eq!(listed[0]["call"], call["id"], "{era}: {listed}");
        app.delete(&format!("/calls/{}", call["id"].as_str().unwrap())).await;
    }
}

#[tokio::test]
async fn two_step_raises_its_requests_in_turn() {
    let app = spawn_app(BOTH_ERAS).await;
    for era in ERAS {
        let call = app.call(era, "two_step", json!({})).await;
        let first = app.request_of(&call).await;
        assert_eq!(first["prompt"], "What is your name?");
        app.answer_ok(
            first["id"].as_str().unwrap(),
            json!({"ok": true, "data": {"name": "Ada"}}),
        )
        .await;

        let call = app.settled(call["id"].as_str().unwrap()).await;
        let second = app.request_of(&call).await;
        assert_eq!(second["prompt"], "Shall I go on?");
        assert_eq!(call["requests"], json!([first["id"], second["id"]]));
        app.answer_ok(
            second["id"].as_str().unwrap(),
            json!({"ok": true, "data": {"confirm": false}}),
        )
        .await;

        let done = app.settled(call["id"].as_str().unwrap()).await;
        assert_eq!(
            results(&done),
            json!([{"action": "accept", "content": {"name": "Ada"}}, {"action": "accept", "content": {"confirm": false}}]),
            "{era}"
        );
    }
}

#[tokio::test]
async fn decline_and_cancel_reach_the_upstream() {
    let app = spawn_app(BOTH_ERAS).await;
    let cases = [
        (json!({"ok": false, "reason": "declined"}), json!({"action": "decline"})),
        (json!({"ok": false}), json!({"action": "cancel"})),
        (json!({"ok": false, "reason": "cancelled"}), json!({"action": "cancel"})),
    ];
    for era in ERAS {
        for (answer, expected) in &cases {
            let call = app.call(era, "confirm_action", json!({"action": "drop"})).await;
            let request = app.request_of(&call).await;
            let answered = app.answer_ok(request["id"].as_str().unwrap(), answer.clone()).await;
            assert_eq!(answered["status"], "answered");
            let done = app.settled(call["id"].as_str().unwrap()).await;
            assert_eq!(results(&done), json!([expected]), "{era} {answer}");
        }
    }
}

#[tokio::test]
async fn an_unanswered_request_expires_and_the_upstream_gets_cancel() {
    let app = spawn_app_with(BOTH_ERAS, "ttl = \"1h\"").await;
    for era in ERAS {
        let call = app.call(era, "confirm_action", json!({"action": "wait"})).await;
        let id = first_request(&call);
        app.advance(Duration::from_secs(3600));
        let expired = app.get_json(&format!("/requests/{id}?wait=20")).await;
        assert_eq!(expired["status"], "expired");
        assert_eq!(expired["answer"], json!({"id": id, "ok": false, "reason": "expired"}));
        assert_eq!(expired["result"], json!({"action": "cancel"}));
        let done = app.settled(call["id"].as_str().unwrap()).await;
        assert_eq!(results(&done), json!([{"action": "cancel"}]), "{era}");
    }
}

#[tokio::test]
async fn flood_raises_many_requests_at_once_and_counts_the_answers() {
    let app = spawn_app(BOTH_ERAS).await;
    for era in ERAS {
        let mut call = app.call(era, "flood", json!({"count": 5})).await;
        let id = call["id"].as_str().unwrap().to_owned();
        while call["status"] != "completed" {
            assert_eq!(call["status"], "input_required", "{era}: {call}");
            for request in app.get_json(&format!("/requests?call={id}")).await.as_array().unwrap() {
                let answer = if request["prompt"] == "Confirm item 2 of 5?" {
                    json!({"ok": false, "reason": "declined"})
                } else {
                    json!({"ok": true, "data": {"confirm": true}})
                };
                app.answer_ok(request["id"].as_str().unwrap(), answer).await;
            }
            call = app.settled(&id).await;
        }
        assert_eq!(call["requests"].as_array().unwrap().len(), 5, "{era}: {call}");
        assert_eq!(
            call["result"]["structuredContent"],
            json!({"accepted": 4, "cancelled": 0, "declined": 1}),
            "{era}"
        );
    }
}

#[tokio::test]
async fn slow_reports_progress_and_completes() {
    let app = spawn_app(BOTH_ERAS).await;
    for era in ERAS {
        let call = app.call(era, "slow", json!({"seconds": 0.2})).await;
        assert_eq!(call["status"], "completed", "{call}");
        assert_eq!(call["result"]["content"][0]["text"], "slept 0.2 seconds");
    }
}

#[tokio::test]
async fn url_elicitation_required_becomes_requests_and_the_call_is_retried_once() {
    let app = spawn_app(BOTH_ERAS).await;
    let call = app.call("legacy", "connect_account", json!({"service": "mail"})).await;
    let request = app.request_of(&call).await;
    assert_eq!(request["kind"], "authorization");
    assert_eq!(request["url"], "https://example.com/authorize?service=mail");
    app.answer_ok(request["id"].as_str().unwrap(), json!({"ok": true}))
        .await;
    let done = app.settled(call["id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["result"]["content"][0]["text"], "connected mail");

    let call = app.call("legacy", "connect_account", json!({"service": "files"})).await;
    let request = app.request_of(&call).await;
    app.answer_ok(
        request["id"].as_str().unwrap(),
        json!({"ok": false, "reason": "declined"}),
    )
    .await;
    let failed = app.settled(call["id"].as_str().unwrap()).await;
    assert_eq!(failed["status"], "failed", "{failed}");
    assert_eq!(failed["error"]["message"], "files is not connected yet");
}

#[tokio::test]
async fn concurrent_calls_on_separate_sessions_are_attributed_to_their_own_call() {
    let app = spawn_app(BOTH_ERAS).await;
    let mut sessions = Vec::new();
    for _ in 0..3 {
        let response = app.post("/sessions", &json!({"server": "legacy"})).await;
        assert_eq!(response.status(), 201);
        sessions.push(
            response.json::<Value>().await.unwrap()["id"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    let start = |i: usize| {
        let body =
            json!({"session": sessions[i], "tool": "confirm_action", "arguments": {"action": format!("task {i}")}});
        app.call_on(body)
    };
    // Each POST holds until its own call waits on input, so the three run at once.
    let (a, b, c) = tokio::join!(start(0), start(1), start(2));
    let calls = [a, b, c];
    for (i, call) in calls.iter().enumerate() {
        let request = app.request_of(call).await;
        assert_eq!(request["prompt"], format!("Confirm: task {i}?"));
        assert_eq!(request["session"], sessions[i].as_str());
        app.answer_ok(
            request["id"].as_str().unwrap(),
            json!({"ok": true, "data": {"confirm": true, "note": format!("n{i}")}}),
        )
        .await;
    }
    for (i, call) in calls.iter().enumerate() {
        let done = app.settled(call["id"].as_str().unwrap()).await;
        assert_eq!(results(&done)[0]["content"]["note"], format!("n{i}"));
    }
}

#[tokio::test]
async fn cancelling_a_call_cancels_its_request_and_tells_the_upstream() {
    let app = spawn_process("", BOTH_ERAS, "").await;
    for era in ERAS {
        let call = app.call(era, "confirm_action", json!({"action": "stop me"})).await;
        let request = app.request_of(&call).await;
        let response = app.delete(&format!("/calls/{}", call["id"].as_str().unwrap())).await;
        assert_eq!(response.status(), 200);
        let cancelled: Value = response.json().await.unwrap();
        assert_eq!(cancelled["status"], "cancelled");
        assert!(
            cancelled["error"]["message"]
                .as_str()
                .unwrap()
                .contains("cancelled by a client")
        );
        let request = app
            .get_json(&format!("/requests/{}", request["id"].as_str().unwrap()))
            .await;
        assert_eq!(request["status"], "cancelled");
        assert!(
            request["detail"].as_str().unwrap().contains("cancelled by a client"),
            "{request}"
        );
        let gone = app
            .answer(
                request["id"].as_str().unwrap(),
                json!({"ok": true, "data": {"confirm": true}}),
            )
            .await;
        assert_eq!(gone.status(), 410);
    }
    app.stderr().wait_for("confirm_action received cancel");
}

#[tokio::test]
async fn an_upstream_cancellation_cancels_the_request() {
    let app = spawn_app(BOTH_ERAS).await;
    let call = app
        .call("legacy", "confirm_action", json!({"action": "hurry", "timeout": 0.3}))
        .await;
    let id = app.request_of(&call).await["id"].as_str().unwrap().to_owned();
    let request = app.get_json(&format!("/requests/{id}?wait=20")).await;
    assert_eq!(request["status"], "cancelled");
    assert!(
        request["detail"].as_str().unwrap().contains("upstream cancelled"),
        "{request}"
    );
    let done = app.settled(call["id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "completed");
    assert_eq!(done["result"]["isError"], true);
    assert_eq!(
        app.answer(&id, json!({"ok": true, "data": {"confirm": true}}))
            .await
            .status(),
        410
    );
}

#[tokio::test]
async fn an_upstream_crash_mid_elicitation_cancels_the_request_fails_the_call_and_reopens() {
    let app = spawn_app(BOTH_ERAS).await;
    let call = app.call("legacy", "crash", json!({})).await;
    // The process exits 50 ms after eliciting: on a loaded machine the session may end before the Request is
    // raised, so the call's end is what is certain.
    let path = format!("/calls/{}", call["id"].as_str().unwrap());
    let failed = poll_until("the call ended", || async {
        let view = app.get_json(&path).await;
        (view["status"] != "input_required" && view["status"] != "running").then_some(view)
    })
    .await;
    assert_eq!(failed["status"], "failed");
    assert!(
        failed["error"]["message"]
            .as_str()
            .unwrap()
            .contains("upstream ended the session"),
        "{failed}"
    );
    for id in failed["requests"].as_array().unwrap() {
        let request = app.get_json(&format!("/requests/{}", id.as_str().unwrap())).await;
        assert_eq!(request["status"], "cancelled", "{request}");
        assert!(
            request["detail"]
                .as_str()
                .unwrap()
                .contains("upstream ended the session"),
            "{request}"
        );
    }
    reopened(&app, "legacy", &call).await;
}

#[tokio::test]
async fn a_round_outlives_the_crash_of_its_upstream_and_completes_on_the_new_session() {
    let app = spawn_app(BOTH_ERAS).await;
    let call = app.call("modern", "crash", json!({})).await;
    let id = first_request(&call);

    // The round is the gateway's: the Request stays pending while the server is re-opened.
    reopened(&app, "modern", &call).await;
    assert_eq!(app.get_json(&format!("/requests/{id}")).await["status"], "pending");
    app.answer_ok(&id, json!({"ok": true, "data": {"ok": true}})).await;

    let done = app.settled(call["id"].as_str().unwrap()).await;
    assert_eq!(results(&done), json!([{"action": "accept", "content": {"ok": true}}]));
}

/// Waits until a server's shared session was re-opened after `call`'s session ended, and checks it works.
async fn reopened(app: &TestApp, server: &str, call: &Value) {
    let mut events = app.events(&format!("?server={server}"), Some("0")).await;
    loop {
        let session = events.next_of("session.updated").await.data;
        if session["status"] == "ready" && session["id"] != call["session"] {
            break;
        }
    }
    let ready = app.get("/readyz?wait=30").await;
    assert_eq!(ready.status(), 200);
    let view = app.get_json(&format!("/servers/{server}")).await;
    assert_eq!(view["restarts"], 1, "{view}");
    let again = app.call(server, "echo", json!({"text": "back"})).await;
    assert_eq!(again["status"], "completed");
}

#[tokio::test]
async fn an_http_upstream_that_redirects_is_not_followed_and_its_headers_go_nowhere_else() {
    let (seen, mut requests) = tokio::sync::mpsc::unbounded_channel();
    let elsewhere = axum::Router::new().fallback(move |headers: axum::http::HeaderMap| {
        let _ = seen.send(headers);
        async { axum::http::StatusCode::NOT_FOUND }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let target = format!("http://{}/mcp", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, elsewhere).await.unwrap() });
    let redirect = axum::Router::new().fallback(move || {
        let target = target.clone();
        async move {
            (
                axum::http::StatusCode::TEMPORARY_REDIRECT,
                [(axum::http::header::LOCATION, target)],
            )
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, redirect).await.unwrap() });

    let servers = format!(
        "[[servers]]\nname = \"bouncing\"\nurl = \"{url}\"\nheaders = {{ X-Api-Key = \"k3y\" }}\nstartup_timeout = \"5s\"\n"
    );
    let app = crate::helpers::start_with("", &servers, "");
    let failed = app.get_json("/servers/bouncing?wait=10").await;
    assert_eq!(failed["status"], "failed", "{failed}");
    assert!(
        requests.try_recv().is_err(),
        "the redirect was followed, with the session's headers"
    );
}

#[tokio::test]
async fn an_http_upstream_works_in_both_eras() {
    let (_demo, url) = crate::helpers::http_demo();
    let servers = format!(
        "[[servers]]\nname = \"legacy\"\nurl = \"{url}\"\nprotocol = \"2025-11-25\"\n\
         [[servers]]\nname = \"modern\"\nurl = \"{url}\"\nheaders = {{ X-Test = \"${{PATH}}\" }}\n"
    );
    let app = spawn_app(&servers).await;
    let servers = app.get_json("/servers").await;
    assert_eq!(servers[0]["transport"], "http");
    let sessions = app.get_json("/sessions").await;
    let mut versions: Vec<&str> = sessions
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["protocolVersion"].as_str().unwrap())
        .collect();
    // The two shared sessions open concurrently, so either may be listed first.
    versions.sort_unstable();
    assert_eq!(versions, ["2025-11-25", "2026-07-28"]);
    for era in ERAS {
        let call = app.call(era, "confirm_action", json!({"action": "over http"})).await;
        let request = app.request_of(&call).await;
        assert_eq!(request["call"], call["id"], "{era}");
        app.answer_ok(
            request["id"].as_str().unwrap(),
            json!({"ok": true, "data": {"confirm": true}}),
        )
        .await;
        let done = app.settled(call["id"].as_str().unwrap()).await;
        assert_eq!(
            results(&done),
            json!([{"action": "accept", "content": {"confirm": true, "note": ""}}]),
            "{era}"
        );
    }
}

#[tokio::test]
async fn a_legacy_stdio_elicitation_with_two_calls_in_flight_is_not_attributed() {
    let app = spawn_app(BOTH_ERAS).await;
    let first = app.call("legacy", "confirm_action", json!({"action": "one"})).await;
    assert_eq!(first["status"], "input_required");
    let second = app
        .post(
            "/calls?wait=2",
            &json!({"server": "legacy", "tool": "confirm_action", "arguments": {"action": "two"}}),
        )
        .await;
    let second: Value = second.json().await.unwrap();
    assert_eq!(
        second["status"], "running",
        "stdio carries no association, so the call cannot be told: {second}"
    );
    let unattributed = app.get_json("/requests?server=legacy&wait=20").await;
    let request = unattributed
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["prompt"] == "Confirm: two?")
        .unwrap()
        .clone();
    assert!(request.get("call").is_none(), "{request}");
    app.answer_ok(
        request["id"].as_str().unwrap(),
        json!({"ok": true, "data": {"confirm": true}}),
    )
    .await;
    let done = app.settled(second["id"].as_str().unwrap()).await;
    assert_eq!(
        results(&done),
        json!([{"action": "accept", "content": {"confirm": true, "note": ""}}])
    );
}

/// An HTTP upstream that dies while a 2025-11-25 call waits on it, and does not come back: the call fails once its
/// response stream cannot be resumed, rather than running until something else is sent on that session.
#[tokio::test]
async fn a_call_in_flight_on_an_http_upstream_that_dies_fails() {
    let (mut demo, url) = crate::helpers::http_demo();
    let servers = format!("[[servers]]\nname = \"legacy\"\nurl = \"{url}\"\nprotocol = \"2025-11-25\"\n");
    let app = spawn_app(&servers).await;
    let call = app.call("legacy", "crash", json!({"action": "die"})).await;
    let id = call["id"].as_str().unwrap();
    demo.exited();
    // Whether its elicitation came before the exit or not, the call ends, and no Request of it stays pending.
    let ended = loop {
        let call = app.get_json(&format!("/calls/{id}?wait=120")).await;
        match call["status"].as_str() {
            Some("input_required") => {
                let request = app.request_of(&call).await;
                let request = app
                    .get_json(&format!("/requests/{}?wait=120", request["id"].as_str().unwrap()))
                    .await;
                assert_eq!(request["status"], "cancelled", "{request}");
            }
            Some("running") => panic!("still running: {call}"),
            _ => break call,
        }
    };
    assert_eq!(ended["status"], "failed", "{ended}");
    let message = ended["error"]["message"].as_str().unwrap();
    assert!(message.contains("the upstream ended the session"), "{ended}");
}

/// An HTTP upstream restarted on its address while one of its elicitations waits: the session carries on with
/// the new server (rmcp's client re-initializes it), whose first elicitation comes under the JSON-RPC id of the
/// one still waiting. Each keeps its own: the old one's end neither cancels the new one nor answers it.
#[tokio::test]
async fn a_restarted_http_upstreams_elicitation_is_not_taken_for_the_previous_ones() {
    let (demo, url) = crate::helpers::http_demo();
    let servers = format!("[[servers]]\nname = \"legacy\"\nurl = \"{url}\"\nprotocol = \"2025-11-25\"\n");
    let app = spawn_app(&servers).await;
    let before = app.call("legacy", "confirm_action", json!({"action": "before"})).await;
    let before_request = app.request_of(&before).await;
    drop(demo);
    let listen = url.trim_start_matches("http://").trim_end_matches("/mcp");
    let (_demo, _) = crate::helpers::http_demo_on(listen);

    let after = app.call("legacy", "confirm_action", json!({"action": "after"})).await;
    let after_request = app.request_of(&after).await;
    let ended = app
        .get_json(&format!("/requests/{}?wait=60", before_request["id"].as_str().unwrap()))
        .await;
    assert_eq!(ended["status"], "cancelled", "{ended}");
    let after_id = after_request["id"].as_str().unwrap();
    let waiting = app.get_json(&format!("/requests/{after_id}")).await;
    assert_eq!(
        waiting["status"], "pending",
        "the new server's elicitation went with the old one's: {waiting}"
    );
    app.answer_ok(after_id, json!({"ok": true, "data": {"confirm": true}}))
        .await;
    let done = app.settled(after["id"].as_str().unwrap()).await;
    assert_eq!(
        results(&done),
        json!([{"action": "accept", "content": {"confirm": true, "note": ""}}]),
        "{done}"
    );
}

/// A 2026-07-28 round may ask for a sampled reply and for the client's roots: the first is a `sampling` Request
/// answered with the reply's text, the second is answered from the config. A refused sampling request ends the
/// call (a 2026-07-28 answer cannot say so), and a server whose config refuses sampling has its call fail.
#[tokio::test]
async fn a_round_asks_for_a_reply_through_a_sampling_request_and_for_roots_from_the_config() {
    let servers = "[[servers]]\nname = \"rooted\"\nbuiltin = \"demo\"\nroots = [\"file:///workspace\"]\n\
                   [[servers]]\nname = \"rootless\"\nbuiltin = \"demo\"\n\
                   [[servers]]\nname = \"refusing\"\nbuiltin = \"demo\"\nsampling = \"refuse\"\n";
    let app = spawn_app(servers).await;
    for (server, roots) in [
        ("rooted", json!([{"uri": "file:///workspace"}])),
        ("rootless", json!([])),
    ] {
        let call = app.call(server, "consult", json!({"question": "Ship it?"})).await;
        let request = app.request_of(&call).await;
        assert_eq!(
            (request["kind"].as_str(), request["prompt"].as_str()),
            (Some("sampling"), Some("Ship it?"))
        );
        app.answer_ok(
            request["id"].as_str().unwrap(),
            json!({"ok": true, "data": {"text": "Yes."}}),
        )
        .await;
        let done = app.settled(call["id"].as_str().unwrap()).await;
        assert_eq!(done["status"], "completed", "{done}");
        let told = &done["result"]["structuredContent"];
        assert_eq!(told["reply"]["content"]["text"], "Yes.", "{done}");
        assert_eq!(
            (&told["reply"]["role"], &told["reply"]["model"]),
            (&json!("assistant"), &json!("human"))
        );
        assert_eq!(told["roots"]["roots"], roots, "{done}");
    }

    // Roots alone are answered at once, with no Request.
    let roots = app
        .call("rooted", "consult", json!({"question": "-", "roots_only": true}))
        .await;
    assert_eq!(roots["status"], "completed", "{roots}");
    assert_eq!(roots["requests"], json!([]), "{roots}");
    assert_eq!(
        roots["result"]["structuredContent"]["roots"]["roots"][0]["uri"],
        "file:///workspace"
    );

    let call = app.call("rooted", "consult", json!({"question": "Ship it?"})).await;
    let request = app.request_of(&call).await;
    app.answer_ok(
        request["id"].as_str().unwrap(),
        json!({"ok": false, "reason": "declined"}),
    )
    .await;
    let declined = app.settled(call["id"].as_str().unwrap()).await;
    assert_eq!(declined["status"], "failed", "{declined}");
    assert!(
        declined["error"]["message"]
            .as_str()
            .unwrap()
            .contains("was not answered with a reply"),
        "{declined}"
    );

    let refused = app.call("refusing", "consult", json!({"question": "Ship it?"})).await;
    assert_eq!(refused["status"], "failed", "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("sampling = \"refuse\""),
        "{refused}"
    );
}
