//! Hostile and broken upstreams, each a small Python server in `tests/upstreams/` speaking raw JSON-RPC.

use serde_json::{Value, json};

use crate::helpers::{TestApp, poll_until, spawn_app, spawn_app_with, spawn_process, start};

/// A `[[servers]]` entry running `tests/upstreams/{script}` with python3, plus extra keys.
pub fn python_server(name: &str, script: &str, extra: &str) -> String {
    let path = format!("{}/tests/upstreams/{script}", env!("CARGO_MANIFEST_DIR"));
    format!("[[servers]]\nname = \"{name}\"\ncommand = \"python3\"\nargs = [\"{path}\"]\n{extra}\n")
}

/// The longest back-off between two restarts of a server.
const MAX_BACKOFF: std::time::Duration = std::time::Duration::from_secs(30);

/// Reads a server until `done` holds for it; fails the test after 30 s.
async fn server_until(app: &TestApp, name: &str, done: impl Fn(&Value) -> bool) -> Value {
    // Restarts and back-off are timed by the gateway and nothing signals them.
    poll_until(&format!("server {name} in the expected state"), || async {
        let server = app.get_json(&format!("/servers/{name}")).await;
        done(&server).then_some(server)
    })
    .await
}

#[tokio::test]
async fn readiness_probes_without_a_token_hold_no_more_long_polls_than_one_principal() {
    let digest = toolnexus_gateway::auth::digest_hex("ops-token");
    let app = crate::helpers::start_with(
        &format!(
            "[limits]\nlong_polls_per_principal = 2\n[auth]\npublic_metrics = true\n\
             [[auth.tokens]]\nname = \"ops\"\nrole = \"admin\"\nsha256 = \"{digest}\"\n"
        ),
        &python_server("silent", "silent.py", "startup_timeout = \"60s\""),
        "",
    );
    let probe = || app.client.get(format!("{}/readyz?wait=60", app.address)).send();
    let held: Vec<_> = (0..2).map(|_| tokio::spawn(probe())).collect();
    app.metric_reaches("toolnexus_long_polls 2").await;
    // Past the probes' share the answer comes at once, so probes cannot take every connection.
    let answered = probe().await.unwrap();
    assert_eq!(answered.status(), 503);
    let body: Value = answered.json().await.unwrap();
    assert_eq!(body["notReady"], json!(["silent"]));
    for probe in held {
        probe.abort();
    }
}

#[tokio::test]
async fn a_server_that_never_finishes_its_handshake_fails_after_its_startup_timeout() {
    let app = start(&python_server("silent", "silent.py", "startup_timeout = \"1s\""), "");

    let server = server_until(&app, "silent", |server| server["status"] == "failed").await;

    let detail = server["detail"].as_str().unwrap();
    assert!(
        detail.contains("within 1s") && detail.contains("startup_timeout"),
        "{server}"
    );
    assert!(
        server["retryAt"].is_string() && server["backoffMs"].is_u64(),
        "{server}"
    );
    let ready = app.get("/readyz").await;
    assert_eq!(ready.status(), 503);
    let body: Value = ready.json().await.unwrap();
    assert!(body.to_string().contains("silent"), "{body}");
}

#[tokio::test]
async fn garbage_on_stdout_is_skipped_and_the_session_keeps_working() {
    let app = spawn_app(&python_server("garbage", "garbage.py", "")).await;

    for text in ["one", "two"] {
        let call = app.call("garbage", "echo", json!({"text": text})).await;
        assert_eq!(call["status"], "completed", "{call}");
        assert_eq!(call["result"]["content"][0]["text"], text);
    }

    let server = app.get_json("/servers/garbage").await;
    assert_eq!(
        (server["status"].as_str(), server["restarts"].as_u64()),
        (Some("ready"), Some(0))
    );
}

#[tokio::test]
async fn half_a_message_then_exit_fails_the_call_and_cancels_its_requests() {
    let app = spawn_app(&python_server("garbage", "garbage.py", "")).await;
    let mut events = app.events("?server=garbage", None).await;

    app.call("garbage", "half", json!({})).await;

    // `wait=` returns as soon as the call waits on its Request, so its end is read from the event stream.
    let call = loop {
        let update = events.next_of("call.updated").await.data;
        if !["running", "input_required"].contains(&update["status"].as_str().unwrap()) {
            break update;
        }
    };

    assert_eq!(call["status"], "failed", "{call}");
    let message = call["error"]["message"].as_str().unwrap();
    assert!(message.contains("upstream ended the session"), "{message}");
    let requests = app.get_json("/requests?status=all&server=garbage").await;
    for request in requests.as_array().unwrap() {
        assert_eq!(request["status"], "cancelled", "{request}");
    }
    let server = server_until(&app, "garbage", |server| server["restarts"] == 1).await;
    assert!(
        server["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("ended the session"),
        "{server}"
    );
}

#[tokio::test]
async fn an_elicitation_with_a_nested_schema_gets_an_error_with_its_id() {
    let servers = python_server("nested", "nested_schema.py", "protocol = \"2025-11-25\"");
    let app = spawn_app(&servers).await;

    let call = app.call("nested", "ask", json!({})).await;
    let call = app.settled(call["id"].as_str().unwrap()).await;

    // The server waits for the response carrying its request's id and reports it as the tool's result.
    assert_eq!(call["status"], "completed", "{call}");
    let response: Value = serde_json::from_str(call["result"]["content"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(response["id"], "nested-1", "{response}");
    assert_eq!(response["error"]["code"], -32602, "{response}");
    assert!(
        response["error"]["message"]
            .as_str()
            .unwrap()
            .contains("flat object of primitive")
    );
    assert_eq!(app.get_json("/requests?status=all").await, json!([]));
}

#[tokio::test]
async fn an_input_required_with_a_nested_schema_fails_the_call() {
    let servers = python_server("nested", "nested_schema.py", "protocol = \"2026-07-28\"");
    let app = spawn_app(&servers).await;

    let call = app.call("nested", "ask", json!({})).await;
    let call = app.settled(call["id"].as_str().unwrap()).await;

    assert_eq!(call["status"], "failed", "{call}");
    let message = call["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("cannot show") && message.contains("flat object of primitive"),
        "{message}"
    );
    assert_eq!(app.get_json("/requests?status=all").await, json!([]));
    assert_eq!(app.get_json("/servers/nested").await["status"], "ready");
}

#[tokio::test]
async fn a_flood_of_elicitations_leaves_the_gateway_responsive() {
    const FLOOD: usize = 2000;
    let app = spawn_process("", &python_server("flood", "flood.py", "protocol = \"2025-11-25\""), "").await;

    let call = app.call("flood", "flood", json!({"count": FLOOD})).await;
    app.metric_reaches(&format!("toolnexus_requests_pending {FLOOD}")).await;

    assert_eq!(app.get("/healthz").await.status(), 200);
    let page = app.get("/requests?limit=10").await;
    assert_eq!(page.status(), 200);
    assert!(page.headers().contains_key("link"), "a next page is linked");
    assert_eq!(page.json::<Value>().await.unwrap().as_array().unwrap().len(), 10);
    let id = call["id"].as_str().unwrap();
    let call = app.get_json(&format!("/calls/{id}")).await;
    assert_eq!(call["requests"].as_array().unwrap().len(), FLOOD);

    assert_eq!(app.delete(&format!("/calls/{id}")).await.status(), 200);
    app.metric_reaches("toolnexus_requests_pending 0").await;
    app.stderr()
        .wait_for(&format!("[flood] all {FLOOD} elicitations answered"));
}

#[tokio::test]
async fn payloads_of_several_megabytes_pass_and_larger_ones_end_the_session_cleanly() {
    const BIG: usize = 5 << 20;
    let app = spawn_app_with(
        &python_server("huge", "huge.py", "protocol = \"2025-11-25\""),
        "max_request_bytes = 8388608",
    )
    .await;

    let call = app.call("huge", "big", json!({"bytes": BIG})).await;
    assert_eq!(call["status"], "completed");
    assert_eq!(call["result"]["content"][0]["text"].as_str().unwrap().len(), BIG);

    let call = app.call("huge", "big_ask", json!({"bytes": BIG})).await;
    let request = app.request_of(&call).await;
    assert_eq!(request["prompt"].as_str().unwrap().len(), BIG);
    app.answer_ok(
        request["id"].as_str().unwrap(),
        json!({"ok": true, "data": {"ok": true}}),
    )
    .await;
    let call = app.settled(call["id"].as_str().unwrap()).await;
    assert_eq!(call["status"], "completed", "{call}");

    let call = app.call("huge", "big", json!({"bytes": 20 << 20})).await;
    let call = app.settled(call["id"].as_str().unwrap()).await;
    assert_eq!(call["status"], "failed", "{call}");
    assert!(
        call["error"]["message"]
            .as_str()
            .unwrap()
            .contains("larger than 16 MiB"),
        "{call}"
    );
    let server = server_until(&app, "huge", |server| {
        server["restarts"] == 1 && server["status"] == "ready"
    })
    .await;
    assert_eq!(server["status"], "ready");
    assert_eq!(app.get("/healthz").await.status(), 200);
}

#[tokio::test]
async fn an_elicitation_larger_than_one_request_may_hold_is_refused_with_invalid_params() {
    let app = spawn_app_with(
        &python_server("huge", "huge.py", "protocol = \"2025-11-25\""),
        "max_request_bytes = 10000",
    )
    .await;
    let call = app.call("huge", "big_ask", json!({"bytes": 20_000})).await;
    let call = app.settled(call["id"].as_str().unwrap()).await;
    assert_eq!(call["requests"], json!([]), "no Request was raised: {call}");
    let response: Value = serde_json::from_str(call["result"]["content"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(response["error"]["code"], -32602, "{response}");
    assert!(
        response["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_request_bytes"),
        "{response}"
    );

    let fits = app.call("huge", "big_ask", json!({"bytes": 5_000})).await;
    assert_eq!(app.request_of(&fits).await["status"], "pending");
}

#[tokio::test]
async fn a_server_that_dies_in_a_loop_is_restarted_with_growing_back_off() {
    let app = start(
        &python_server("crashy", "crash_loop.py", "protocol = \"2025-11-25\""),
        "",
    );

    // Each look lets the back-off pass at once, as the clock moves past it.
    let server = server_until(&app, "crashy", |server| {
        app.advance(MAX_BACKOFF);
        server["restarts"].as_u64() >= Some(3) && server["backoffMs"].is_u64()
    })
    .await;

    // 500 ms after the first death, doubling each time a session ends soon after opening (or fails to open).
    let restarts = u32::try_from(server["restarts"].as_u64().unwrap()).unwrap();
    assert!(
        server["backoffMs"].as_u64().unwrap() >= 500 * 2u64.pow(restarts - 1),
        "{server}"
    );
    assert!(server["retryAt"].is_string(), "{server}");
    assert!(
        server["detail"].as_str().unwrap().contains("ended the session"),
        "{server}"
    );
}

#[tokio::test]
async fn a_servers_stderr_is_logged_line_by_line_under_its_name_escaped_and_bounded() {
    let servers = format!("{}\n[log]\nformat = \"json\"\n", python_server("noisy", "noisy.py", ""));
    let app = spawn_process("", &servers, "").await;
    let marker = format!("marker-{}", uuid::Uuid::now_v7().simple());

    let call = app.call("noisy", "shout", json!({"text": marker})).await;
    assert_eq!(call["status"], "completed", "{call}");
    app.stderr().wait_for(&format!("after the long line of {marker}"));

    let entries: Vec<Value> = app
        .stderr()
        .lines()
        .iter()
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|_| panic!("a line that is not the gateway's log: {line}"))
        })
        .collect();
    let from_noisy: Vec<&Value> = entries
        .iter()
        .filter(|entry| entry["target"] == "toolnexus_gateway::upstream::stderr")
        .collect();
    for entry in &from_noisy {
        assert_eq!(
            (&entry["server"], &entry["level"]),
            (&json!("noisy"), &json!("INFO")),
            "{entry}"
        );
    }
    let logged = |start: &str| {
        let found = from_noisy
            .iter()
            .find(|entry| entry["message"].as_str().unwrap().starts_with(start));
        (*found.unwrap_or_else(|| panic!("no line starting {start:?} in {from_noisy:#?}"))).clone()
    };
    assert_eq!(logged("[noisy] marker-")["message"], format!("[noisy] {marker}"));
    assert_eq!(
        logged("[noisy] escapes")["message"],
        "[noisy] escapes \\u{1b}[31mred\\u{1b}[0m\\r and \u{fffd}\u{fffd} bytes"
    );
    let long = logged("[noisy] long ");
    assert_eq!(long["truncated"], true, "{long}");
    assert!(
        long["message"].as_str().unwrap().len() <= 16 * 1024,
        "a line of 100 000 bytes was logged whole"
    );
    assert!(
        from_noisy
            .iter()
            .all(|entry| !entry["message"].as_str().unwrap().starts_with("xxx")),
        "the rest of the long line was logged as a line of its own"
    );
}
