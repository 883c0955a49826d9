//! Bounded resources and browser-facing safety: caps, timeouts, body size, Host allow-list, CORS.

use serde_json::{Value, json};

use crate::helpers::{BOTH_ERAS, TestApp, results, spawn_app, spawn_app_with, spawn_in};

#[tokio::test]
async fn past_the_pending_cap_an_elicitation_is_answered_cancel_at_once() {
    let app = spawn_app_with(BOTH_ERAS, "max_pending = 1").await;
    let first = app.call("modern", "confirm_action", json!({"action": "held"})).await;
    assert_eq!(first["status"], "input_required");
    for era in ["modern", "legacy"] {
        let refused = app.call(era, "confirm_action", json!({"action": "refused"})).await;
        assert_eq!(results(&refused), json!([{"action": "cancel"}]), "{era}: {refused}");
        assert_eq!(refused["requests"], json!([]));
    }
    assert_eq!(app.get_json("/requests").await.as_array().unwrap().len(), 1);
    app.metric_reaches("toolnexus_requests_rejected_total{server=\"legacy\"} 1")
        .await;
}

#[tokio::test]
async fn one_principal_cannot_take_every_pending_request() {
    let token = |name: &str| {
        let digest = toolnexus_gateway::auth::digest_hex(&format!("{name}-token"));
        format!("[[auth.tokens]]\nname = \"{name}\"\nrole = \"agent\"\nsha256 = \"{digest}\"\n")
    };
    let app = spawn_app_with(
        &format!("{BOTH_ERAS}\n{}{}", token("agent-a"), token("agent-b")),
        "max_pending = 4\nmax_pending_per_principal = 3\nmax_pending_per_server = 4",
    )
    .await;
    let flood = call_as(&app, "agent-a", "flood", json!({"count": 3})).await;
    assert_eq!(flood["requests"].as_array().unwrap().len(), 3, "{flood}");
    let past_share = call_as(&app, "agent-a", "confirm_action", json!({"action": "one more"})).await;
    assert_eq!(
        results(&past_share),
        json!([{"action": "cancel"}]),
        "past agent-a's share: {past_share}"
    );
    let own = call_as(&app, "agent-b", "confirm_action", json!({"action": "mine"})).await;
    assert_eq!(own["status"], "input_required", "agent-b still gets its Request: {own}");
}

/// `POST /calls?wait=20` of a tool of the `modern` server, with `name`'s token.
async fn call_as(app: &TestApp, name: &str, tool: &str, arguments: Value) -> Value {
    let response = app
        .client
        .post(format!("{}/calls?wait=20", app.address))
        .bearer_auth(format!("{name}-token"))
        .json(&json!({"server": "modern", "tool": tool, "arguments": arguments}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    response.json().await.unwrap()
}

#[tokio::test]
async fn long_polls_check_again_only_after_changes_that_concern_them() {
    const WAITERS: usize = 50;
    let app = spawn_app(BOTH_ERAS).await;
    let mut waiters = Vec::new();
    for _ in 0..WAITERS {
        let request = app
            .client
            .get(format!("{}/requests?server=legacy&wait=60", app.address));
        waiters.push(tokio::spawn(async move {
            request.send().await.unwrap().json::<Value>().await.unwrap()
        }));
    }
    app.metric_reaches(&format!("toolnexus_long_polls {WAITERS}")).await;
    let before = long_poll_checks(&app).await;
    for _ in 0..20 {
        let call = app.call("modern", "echo", json!({"text": "not about legacy"})).await;
        assert_eq!(call["status"], "completed");
    }
    let checks = long_poll_checks(&app).await - before;
    // Each of the 20 calls' own POST checks a few times; the waiters, never.
    assert!(
        checks < WAITERS as u64,
        "{checks} checks for changes that concern no waiter"
    );

    let call = app
        .call("legacy", "confirm_action", json!({"action": "wake them"}))
        .await;
    let request = app.request_of(&call).await;
    for waiter in waiters {
        assert_eq!(waiter.await.unwrap(), json!([request]));
    }
}

#[tokio::test]
async fn one_principal_holds_a_bounded_number_of_long_polls_and_streams() {
    let digest = toolnexus_gateway::auth::digest_hex("agent-a-token");
    let app = spawn_app_with(
        &format!(
            "{BOTH_ERAS}\n[limits]\nlong_polls_per_principal = 2\nstreams_per_principal = 1\n\
             [auth]\npublic_metrics = true\n[[auth.tokens]]\nname = \"agent-a\"\nrole = \"agent\"\nsha256 = \"{digest}\"\n"
        ),
        "",
    )
    .await;
    let get = |path: &str| {
        app.client
            .get(format!("{}{path}", app.address))
            .bearer_auth("agent-a-token")
            .send()
    };
    let held: Vec<_> = (0..2).map(|_| tokio::spawn(get("/requests?wait=60"))).collect();
    app.metric_reaches("toolnexus_long_polls 2").await;
    let refused = get("/requests?wait=60").await.unwrap();
    assert_eq!(refused.status(), 429);
    let problem: Value = refused.json().await.unwrap();
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("limits.long_polls_per_principal"),
        "{problem}"
    );
    assert_eq!(
        get("/requests").await.unwrap().status(),
        200,
        "a plain read is no long-poll"
    );

    let stream = get("/events").await.unwrap();
    assert_eq!(stream.status(), 200);
    assert_eq!(get("/events").await.unwrap().status(), 429);
    drop(stream);
    for waiter in held {
        waiter.abort();
    }
    app.metric_reaches("toolnexus_event_streams 0").await;
    app.metric_reaches("toolnexus_long_polls 0").await;
    assert_eq!(
        get("/events").await.unwrap().status(),
        200,
        "a closed stream is given back"
    );
}

/// `toolnexus_long_poll_checks_total` from `/metrics`.
async fn long_poll_checks(app: &TestApp) -> u64 {
    let text = app.get("/metrics").await.text().await.unwrap();
    text.lines()
        .find_map(|line| line.strip_prefix("toolnexus_long_poll_checks_total "))
        .expect("the checks are counted")
        .parse()
        .unwrap()
}

#[tokio::test]
async fn large_calls_reach_event_streams_whole_and_memory_keeps_a_bounded_history() {
    const TEXT: usize = 700_000;
    for (store, calls) in [("memory", 14), ("sqlite", 2)] {
        let dir = tempfile::tempdir().unwrap();
        let mut settings = "[http]\nmax_body_bytes = 4194304\n".to_owned();
        if store == "memory" {
            settings.push_str("[store]\nurl = \"memory\"\n");
        }
        let app = spawn_in(dir.path(), &settings, BOTH_ERAS, "").await;
        let mut events = app.events("?server=modern", None).await;
        let mut ids = Vec::new();
        for n in 0..calls {
            let text = char::from(b'a' + n).to_string().repeat(TEXT);
            let call = app.call("modern", "echo", json!({ "text": text })).await;
            assert_eq!(call["status"], "completed");
            ids.push(call["id"].as_str().unwrap().to_owned());
        }
        // Larger than the live channel carries, a call's event reaches the stream whole, read from the store.
        loop {
            let event = events.next_of("call.updated").await;
            if event.data["id"] == json!(ids[0]) && event.data["status"] == "completed" {
                let text = event.data["result"]["content"][0]["text"].as_str().unwrap();
                assert_eq!(text.len(), TEXT, "{store}");
                break;
            }
        }
        let newest = app.get(&format!("/calls/{}", ids[ids.len() - 1])).await;
        assert_eq!(newest.status(), 200, "{store}");
        let oldest = app.get(&format!("/calls/{}", ids[0])).await.status();
        match store {
            // 14 calls of 1.4 MB are more than the 16 MiB one principal's ended calls may hold in memory.
            "memory" => assert_eq!(oldest, 404, "the oldest ended calls were forgotten"),
            _ => assert_eq!(oldest, 200, "on disk, history is kept for the retention"),
        }
    }
}

#[tokio::test]
async fn one_principal_holds_a_bounded_number_of_calls_and_sessions() {
    let app = spawn_app(&format!(
        "{BOTH_ERAS}\n[limits]\ncalls_per_principal = 1\nsessions_per_principal = 1\n"
    ))
    .await;
    let held = app.call("modern", "confirm_action", json!({"action": "one"})).await;
    assert_eq!(held["status"], "input_required");
    let second = app
        .post(
            "/calls",
            &json!({"server": "modern", "tool": "echo", "arguments": {"text": "x"}}),
        )
        .await;
    assert_eq!(second.status(), 429);
    app.delete(&format!("/calls/{}", held["id"].as_str().unwrap())).await;
    let after = app.call("modern", "echo", json!({"text": "again"})).await;
    assert_eq!(after["status"], "completed");

    assert_eq!(app.post("/sessions", &json!({"server": "legacy"})).await.status(), 201);
    assert_eq!(app.post("/sessions", &json!({"server": "legacy"})).await.status(), 429);
}

#[tokio::test]
async fn the_call_timeout_counts_upstream_work_not_human_waiting() {
    let app = spawn_app(&format!("{BOTH_ERAS}\n[limits]\ncall_timeout = \"1s\"\n")).await;
    let slow = app.call("modern", "slow", json!({"seconds": 5})).await;
    assert_eq!(slow["status"], "failed", "{slow}");
    assert!(
        slow["error"]["message"]
            .as_str()
            .unwrap()
            .contains("limits.call_timeout"),
        "{slow}"
    );

    let call = app
        .call("legacy", "confirm_action", json!({"action": "take your time"}))
        .await;
    let id = crate::helpers::first_request(&call);
    // Hold a human-sized pause longer than the timeout: the Request stays pending through it.
    let still = app.get_json(&format!("/requests/{id}?wait=1.5")).await;
    assert_eq!(still["status"], "pending");
    app.answer_ok(&id, json!({"ok": true, "data": {"confirm": true}})).await;
    let done = app.settled(call["id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "completed", "{done}");
}

#[tokio::test]
async fn bodies_over_the_configured_limit_are_413() {
    let app = spawn_app(&format!("{BOTH_ERAS}\n[http]\nmax_body_bytes = 64\n")).await;
    let big = json!({"server": "legacy", "tool": "echo", "arguments": {"text": "x".repeat(100)}});
    assert_eq!(app.post("/calls", &big).await.status(), 413);
    let small = json!({"server": "legacy", "tool": "echo"});
    assert_eq!(app.post("/calls", &small).await.status(), 201);
}

#[tokio::test]
async fn on_loopback_only_loopback_host_names_are_answered() {
    let app = spawn_app(BOTH_ERAS).await;
    let port = app.address.rsplit(':').next().unwrap().to_owned();
    for (host, status) in [
        ("evil.example", 403),
        ("localhost", 200),
        ("127.0.0.1", 200),
        ("[::1]", 200),
    ] {
        let response = app
            .client
            .get(format!("{}/servers", app.address))
            .header("host", format!("{host}:{port}"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), status, "{host}");
    }
}

#[tokio::test]
async fn a_request_with_two_host_headers_is_400_with_or_without_the_allow_list() {
    for settings in ["", "\n[http]\nallowed_hosts = []\n"] {
        let app = spawn_app(&format!("{BOTH_ERAS}{settings}")).await;
        let port = app.address.rsplit(':').next().unwrap().to_owned();
        let one = raw_get(&app, &[format!("127.0.0.1:{port}")]).await;
        assert!(one.starts_with("HTTP/1.1 200 "), "{one}");
        for hosts in [
            [format!("127.0.0.1:{port}"), "evil.example".to_owned()],
            ["evil.example".to_owned(), format!("127.0.0.1:{port}")],
            [format!("127.0.0.1:{port}"), format!("127.0.0.1:{port}")],
        ] {
            let response = raw_get(&app, &hosts).await;
            assert!(
                response.starts_with("HTTP/1.1 400 "),
                "{settings:?} {hosts:?}: {response}"
            );
            let (head, body) = response.split_once("\r\n\r\n").unwrap();
            assert!(
                head.to_ascii_lowercase()
                    .contains("content-type: application/problem+json"),
                "{head}"
            );
            let problem: Value = serde_json::from_str(body).unwrap();
            assert!(problem["detail"].as_str().unwrap().contains("Host"), "{problem}");
        }
    }
}

/// `GET /servers` sent over a raw connection with these `Host` header lines; the whole response.
async fn raw_get(app: &crate::helpers::TestApp, hosts: &[String]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let address = app.address.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let hosts: String = hosts.iter().map(|host| format!("Host: {host}\r\n")).collect();
    let head = format!("GET /servers HTTP/1.1\r\n{hosts}Connection: close\r\n\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    response
}

#[tokio::test]
async fn cors_is_off_by_default_and_follows_the_allow_list() {
    let app = spawn_app(BOTH_ERAS).await;
    let plain = app
        .client
        .get(format!("{}/servers", app.address))
        .header("origin", "https://app.example")
        .send()
        .await
        .unwrap();
    assert!(plain.headers().get("access-control-allow-origin").is_none());

    let app = spawn_app(&format!(
        "{BOTH_ERAS}\n[http]\ncors_origins = [\"https://app.example\"]\n"
    ))
    .await;
    let preflight = |origin: &'static str| {
        app.client
            .request(reqwest::Method::OPTIONS, format!("{}/requests", app.address))
            .header("origin", origin)
            .header("access-control-request-method", "GET")
            .header("access-control-request-headers", "authorization")
            .send()
    };
    let allowed = preflight("https://app.example").await.unwrap();
    assert_eq!(allowed.headers()["access-control-allow-origin"], "https://app.example");
    let other = preflight("https://evil.example").await.unwrap();
    assert!(other.headers().get("access-control-allow-origin").is_none());
    let listed: Value = app
        .client
        .get(format!("{}/requests", app.address))
        .header("origin", "https://app.example")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listed, json!([]));
}
