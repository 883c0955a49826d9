//! What operators see and set: metrics, logs, config errors and the worker threads.

use serde_json::{Value, json};

use crate::helpers::{BOTH_ERAS, ERAS, TestApp, first_request, results, spawn_app, start_with};

#[tokio::test]
async fn metrics_count_requests_calls_sessions_and_http() {
    let app = spawn_app(BOTH_ERAS).await;
    let call = app.call("modern", "confirm_action", json!({"action": "measure"})).await;
    let request = app.request_of(&call).await;
    let pending = app.get("/metrics").await;
    assert_eq!(
        pending.headers()["content-type"],
        "text/plain; version=0.0.4; charset=utf-8"
    );
    assert!(
        pending
            .text()
            .await
            .unwrap()
            .contains("\ntoolnexus_requests_pending 1\n")
    );
    app.answer_ok(
        request["id"].as_str().unwrap(),
        json!({"ok": true, "data": {"confirm": true}}),
    )
    .await;
    app.settled(call["id"].as_str().unwrap()).await;

    let text = app.get("/metrics").await.text().await.unwrap();
    for line in [
        "toolnexus_requests_pending 0",
        "toolnexus_requests_created_total{server=\"modern\"} 1",
        "toolnexus_requests_resolved_total{server=\"modern\",outcome=\"accept\"} 1",
        "toolnexus_request_resolution_seconds_count{server=\"modern\"} 1",
        "toolnexus_calls_started_total{server=\"modern\"} 1",
        "toolnexus_calls_finished_total{server=\"modern\",status=\"completed\"} 1",
        "toolnexus_calls{status=\"completed\"} 1",
        "toolnexus_sessions{server=\"legacy\",state=\"ready\"} 1",
        "toolnexus_server_restarts_total{server=\"modern\"} 0",
        "toolnexus_http_requests_total{route=\"/requests/{id}/answer\",method=\"POST\",status=\"200\"} 1",
        "toolnexus_http_request_duration_seconds_count{route=\"/calls\"} 1",
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
    }
}

#[tokio::test]
async fn json_logs_trace_each_request_without_answer_values() {
    let app = spawn_app(&format!("{BOTH_ERAS}\n[log]\nformat = \"json\"\n")).await;
    for era in ERAS {
        let call = app.call(era, "confirm_action", json!({"action": "log"})).await;
        let request = app.request_of(&call).await;
        let id = request["id"].as_str().unwrap();
        app.answer_ok(
            id,
            json!({"ok": true, "data": {"confirm": true, "note": "s3cret-note"}}),
        )
        .await;
        app.settled(call["id"].as_str().unwrap()).await;

        let created = log_entry(&app, &["\"request created\"", id]);
        assert_eq!(created["server"], era);
        assert_eq!(created["call"], call["id"]);
        let resolved = log_entry(&app, &["\"request resolved\"", id]);
        assert_eq!(resolved["ok"], true);
        assert!(resolved["data_keys"].as_str().unwrap().contains("note"));
        // The demo server logs what it received; the gateway logs that line as its server's.
        let received = log_entry(&app, &["confirm_action received", &format!("\"server\":\"{era}\"")]);
        assert_eq!(received["target"], "toolnexus_gateway::upstream::stderr", "{received}");
    }
    app.stderr().wait_for("\"call completed\"");
    let lines = app.stderr().lines();
    for line in lines {
        assert!(
            serde_json::from_str::<Value>(&line).is_ok(),
            "not a JSON log line: {line}"
        );
        assert!(
            !line.contains("s3cret-note"),
            "an answer value reached the logs: {line}"
        );
    }
}

/// The first JSON log line containing every needle.
fn log_entry(app: &TestApp, needles: &[&str]) -> Value {
    let line = app.stderr().wait_for_all(needles);
    serde_json::from_str(&line).unwrap_or_else(|error| panic!("not a JSON log line ({error}): {line}"))
}

#[test]
fn check_config_prints_the_effective_config_with_secrets_masked() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    std::fs::write(
        &path,
        "[[servers]]\nname = \"remote\"\nurl = \"https://mcp.example.com/mcp\"\nheaders = { Authorization = \"Bearer ${TOOLNEXUS_TEST_TOKEN}\" }\n\
         [[webhooks]]\nurl = \"http://127.0.0.1:9/hook\"\nsecret = \"hook-secret\"\n",
    )
    .unwrap();
    let output = std::process::Command::new(crate::helpers::BINARY)
        .args(["check-config", "--config"])
        .arg(&path)
        .env("TOOLNEXUS_TEST_TOKEN", "token-value")
        .env("TOOLNEXUS_LISTEN", "127.0.0.1:9999")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let printed = String::from_utf8(output.stdout).unwrap();
    let effective: toml::Table = toml::from_str(&printed).unwrap();
    assert_eq!(
        effective["listen"].as_str(),
        Some("127.0.0.1:9999"),
        "the environment overrides the file"
    );
    assert_eq!(
        effective["servers"][0]["headers"]["Authorization"].as_str(),
        Some("***")
    );
    assert_eq!(effective["webhooks"][0]["secret"].as_str(), Some("***"));
    assert!(
        !printed.contains("token-value") && !printed.contains("hook-secret"),
        "{printed}"
    );
}

#[test]
fn config_errors_name_the_file_line_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "listen = \"127.0.0.1:0\"\n\n[[servers]]\nname = \"a\"\nbuiltin = \"demo\"\n\n[[servers]]\nname = \"a\"\nbuiltin = \"demo\"\n",
            "line 7",
        ),
        ("[requests]\nttl = \"10m\"\nttl_max = \"1h\"\n", "line 3"),
        ("listen = \"127.0.0.1:0\"\nworkers = 0\n", "line 2"),
        (
            "[[servers]]\nname = \"x\"\ncommand = \"${TOOLNEXUS_TEST_UNSET}\"\n",
            "TOOLNEXUS_TEST_UNSET",
        ),
    ];
    for (text, expected) in cases {
        let path = dir.path().join("bad.toml");
        std::fs::write(&path, text).unwrap();
        let output = std::process::Command::new(crate::helpers::BINARY)
            .arg("--config")
            .arg(&path)
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(1));
        let stderr = String::from_utf8(output.stderr).unwrap();
        assert!(
            stderr.contains(&path.display().to_string()) && stderr.contains(expected),
            "{stderr}"
        );
    }
}

#[test]
fn healthcheck_exits_0_while_the_gateway_is_up_and_1_when_nothing_answers() {
    let app = crate::helpers::start(BOTH_ERAS, "");
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let healthcheck = |url: Option<String>, listen: &str| {
        let mut command = std::process::Command::new(crate::helpers::BINARY);
        command
            .arg("healthcheck")
            .env_remove("TOOLNEXUS_CONFIG")
            .env("TOOLNEXUS_LISTEN", listen);
        if let Some(url) = url {
            command.args(["--url", &url]);
        }
        command.output().unwrap()
    };
    let listen = app.address.trim_start_matches("http://");

    let up = healthcheck(Some(format!("{}/healthz", app.address)), &closed.to_string());
    let from_listen = healthcheck(None, listen);
    let down = healthcheck(Some(format!("http://{closed}/healthz")), listen);
    let not_found = healthcheck(Some(format!("{}/nothing-here", app.address)), listen);

    assert_eq!(up.status.code(), Some(0), "{}", String::from_utf8_lossy(&up.stderr));
    assert_eq!(
        from_listen.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&from_listen.stderr)
    );
    for failed in [down, not_found] {
        assert_eq!(failed.status.code(), Some(1));
        let stderr = String::from_utf8(failed.stderr).unwrap();
        assert!(
            stderr.starts_with("error: GET http://") && stderr.lines().count() == 1,
            "{stderr}"
        );
    }
}

#[tokio::test]
async fn workers_spread_the_gateway_over_that_many_threads() {
    let app = start_with("workers = 3", BOTH_ERAS, "");
    assert_eq!(app.get("/readyz?wait=30").await.status(), 200);
    let threads = std::fs::read_dir(format!("/proc/{}/task", app.pid())).unwrap().count();
    assert!(threads > 3, "workers = 3 runs on {threads} threads");
    let call = app.call("modern", "confirm_action", json!({"action": "spread"})).await;
    app.answer_ok(&first_request(&call), json!({"ok": true, "data": {"confirm": true}}))
        .await;
    let done = app.settled(call["id"].as_str().unwrap()).await;
    assert_eq!(
        results(&done),
        json!([{"action": "accept", "content": {"confirm": true, "note": ""}}])
    );
}

#[test]
fn a_worker_count_out_of_range_is_refused() {
    for workers in ["0", "65"] {
        let output = std::process::Command::new(crate::helpers::BINARY)
            .args(["--workers", workers])
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2));
        let stderr = String::from_utf8(output.stderr).unwrap();
        assert!(stderr.contains("--workers") && stderr.contains("1..=64"), "{stderr}");
    }
}
