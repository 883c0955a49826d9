//! Third-party MCP servers as upstreams: the TypeScript reference `server-everything` (tests/peers, npm) over
//! stdio and streamable HTTP.

use std::path::PathBuf;

use serde_json::{Value, json};

use crate::helpers::spawn_app;

/// A `[[servers]]` entry running server-everything over stdio in the 2025-11-25 era, plus extra keys.
fn everything(name: &str, extra: &str) -> String {
    everything_in(name, "protocol = \"2025-11-25\"", extra)
}

/// A `[[servers]]` entry running server-everything over stdio, with its `protocol` line and extra keys.
fn everything_in(name: &str, protocol: &str, extra: &str) -> String {
    let script = script();
    format!(
        "[[servers]]\nname = \"{name}\"\ncommand = \"node\"\nargs = [\"{}\", \"stdio\"]\n{protocol}\n{extra}\n",
        script.display()
    )
}

/// server-everything's entry point, installed by `npm ci` in tests/peers.
fn script() -> PathBuf {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/peers/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    assert!(
        script.is_file(),
        "the peer tests run @modelcontextprotocol/server-everything: run `npm ci` in tests/peers (scripts/test.sh does)"
    );
    script
}

/// server-everything over streamable HTTP on a free loopback port, killed when dropped, and its `/mcp` URL.
fn everything_over_http() -> (crate::helpers::HttpDemo, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = std::process::Command::new("node")
        .arg(script())
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = crate::helpers::Output::collect(child.stderr.take().unwrap(), "[everything http] ");
    let server = crate::helpers::HttpDemo::of(child);
    stderr.wait_for("listening on port");
    (server, format!("http://127.0.0.1:{port}/mcp"))
}

/// The text of a completed call's result.
fn text(call: &Value) -> String {
    assert_eq!(call["status"], "completed", "{call}");
    call["result"]["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|block| block["text"].as_str())
        .collect()
}

#[tokio::test]
async fn a_2025_11_25_server_asks_for_its_roots_and_hears_the_configured_ones_and_others_hear_of_none() {
    let servers = format!(
        "{}{}{}",
        everything("rooted", "roots = [\"file:///workspace\", \"file:///srv/data\"]"),
        everything("rootless", ""),
        // Under `auto` the server is offered roots and sampling too: it speaks 2025-11-25 after all.
        everything_in("auto", "", "roots = [\"file:///workspace\"]")
    );
    let app = spawn_app(&servers).await;

    let call = app.call("rooted", "get-roots-list", json!({})).await;
    let listed = text(&call);
    assert!(
        listed.contains("file:///workspace") && listed.contains("file:///srv/data"),
        "{listed}"
    );
    // server-everything offers the tool only to a client that declares roots.
    let tools = |server: &str| {
        let app = &app;
        let server = server.to_owned();
        async move {
            let listed = app.get_json(&format!("/servers/{server}/tools")).await;
            listed["tools"]
                .as_array()
                .unwrap_or_else(|| panic!("{listed}"))
                .iter()
                .filter_map(|tool| tool["name"].as_str().map(str::to_owned))
                .collect::<Vec<_>>()
        }
    };
    assert!(tools("rooted").await.contains(&"get-roots-list".to_owned()));
    let rootless = tools("rootless").await;
    assert!(
        !rootless.is_empty() && !rootless.contains(&"get-roots-list".to_owned()),
        "{rootless:?}"
    );
    let auto = tools("auto").await;
    for offered in ["get-roots-list", "trigger-sampling-request"] {
        assert!(auto.contains(&offered.to_owned()), "{offered} under auto: {auto:?}");
    }
    let call = app.call("auto", "get-roots-list", json!({})).await;
    assert!(text(&call).contains("file:///workspace"), "{call}");
}

#[tokio::test]
async fn a_2025_11_25_sampling_request_is_a_request_whose_reply_goes_back_as_the_assistant_s_message() {
    let servers = format!(
        "{}{}",
        everything("asking", ""),
        everything("refusing", "sampling = \"refuse\"")
    );
    let app = spawn_app(&servers).await;
    let start = async || {
        let body = json!({"server": "asking", "tool": "trigger-sampling-request", "arguments": {"prompt": "Ship it?"}});
        let response = app.post("/calls?wait=20", &body).await;
        assert_eq!(response.status(), 201);
        let call: Value = response.json().await.unwrap();
        assert_eq!(call["status"], "input_required", "{call}");
        let request = app.request_of(&call).await;
        (call["id"].as_str().unwrap().to_owned(), request)
    };

    let (call, request) = start().await;
    assert_eq!(request["kind"], "sampling", "{request}");
    assert_eq!(request["prompt"], "Resource trigger-sampling-request context: Ship it?");
    assert_eq!(request["data"]["systemPrompt"], "You are a helpful test server.");
    assert_eq!(request["data"]["messages"][0]["role"], "user");
    let id = request["id"].as_str().unwrap();
    let refused = app.answer(id, json!({"ok": true, "data": {"reply": "no text"}})).await;
    assert_eq!(refused.status(), 422, "a reply has its text");
    let answered = app
        .answer_ok(id, json!({"ok": true, "data": {"text": "Ship it."}}))
        .await;
    assert_eq!(answered["result"]["content"]["text"], "Ship it.", "{answered}");
    let done = app.get_json(&format!("/calls/{call}?wait=20")).await;
    let told = text(&done);
    assert!(
        told.contains("\"model\": \"human\"") && told.contains("Ship it.") && told.contains("\"role\": \"assistant\""),
        "{told}"
    );

    let (call, request) = start().await;
    app.answer_ok(
        request["id"].as_str().unwrap(),
        json!({"ok": false, "reason": "declined"}),
    )
    .await;
    let done = app.get_json(&format!("/calls/{call}?wait=20")).await;
    let told = serde_json::to_string(&done).unwrap();
    assert!(
        told.contains("User rejected sampling request"),
        "the tool heard the refusal: {done}"
    );

    let tools = app.get_json("/servers/refusing/tools").await;
    let names: Vec<&str> = tools["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|tool| tool["name"].as_str())
        .collect();
    assert!(
        !names.contains(&"trigger-sampling-request"),
        "sampling is not offered: {names:?}"
    );
}

/// server-everything's `simulate-research-query` is a tool that must be a task (the experimental tasks of
/// 2025-11-25, SEP-1686): the gateway, refused once, calls it as a task; the clarification its task asks for
/// (an elicitation naming the task, sent on the `tasks/result` stream) is a Request of the call, and the task's
/// result ends it.
#[tokio::test]
async fn a_2025_11_25_task_asks_through_a_request_of_its_call_and_ends_with_its_report() {
    let (_http, url) = everything_over_http();
    let servers = format!(
        "{}{}[[servers]]\nname = \"remote\"\nurl = \"{url}\"\nprotocol = \"2025-11-25\"\n",
        everything("everything", ""),
        everything("plain", "tasks = \"never\"")
    );
    let app = spawn_app(&servers).await;
    let arguments = json!({"topic": "python", "ambiguous": true});
    for server in ["everything", "remote"] {
        let call = app.call(server, "simulate-research-query", arguments.clone()).await;
        assert_eq!(call["status"], "input_required", "{server}: {call}");
        // What the task says of itself is polled: the call shows the task, whichever status it last said.
        assert!(call["task"]["id"].is_string(), "{call}");
        let request = app.request_of(&call).await;
        assert!(
            request["prompt"].as_str().unwrap().contains("multiple interpretations"),
            "{request}"
        );
        let id = call["id"].as_str().unwrap();
        app.answer_ok(
            request["id"].as_str().unwrap(),
            json!({"ok": true, "data": {"interpretation": "snake"}}),
        )
        .await;
        let done = app.settled(id).await;
        assert!(
            text(&done).contains("# Research Report: python (snake)"),
            "{server}: {done}"
        );
        assert_eq!(done["task"]["status"], "completed", "{done}");
    }

    // Without a question, the task runs to its report.
    let plain = app
        .call("everything", "simulate-research-query", json!({"topic": "rust"}))
        .await;
    let plain = app.settled(plain["id"].as_str().unwrap()).await;
    assert!(text(&plain).contains("# Research Report: rust"), "{plain}");
    assert_eq!(plain["requests"], json!([]), "{plain}");

    // Cancelled while its question waits: the Request is cancelled with the call.
    let waiting = app
        .call("everything", "simulate-research-query", arguments.clone())
        .await;
    let request = app.request_of(&waiting).await;
    let deleted = app.delete(&format!("/calls/{}", waiting["id"].as_str().unwrap())).await;
    assert_eq!(deleted.status(), 200);
    let cancelled = app
        .get_json(&format!("/requests/{}", request["id"].as_str().unwrap()))
        .await;
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");

    // A server not to be given tasks: the call ends with the server's refusal.
    let refused = app.call("plain", "simulate-research-query", arguments).await;
    assert_eq!(refused["status"], "completed", "{refused}");
    assert_eq!(refused["result"]["isError"], true, "{refused}");
    assert!(refused.get("task").is_none(), "{refused}");
}
