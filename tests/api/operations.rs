//! What operators see and set: metrics, logs, config errors and the worker threads.

use serde_json::{Value, json};

use crate::helpers::{
    BOTH_ERAS, ERAS, Process, first_request, results, spawn_app, spawn_process, start_process, token_entry,
};

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
    // Counted once the call's end is kept, which a waiter may see first.
    app.metric_reaches("toolnexus_calls_finished_total{server=\"modern\",status=\"completed\"} 1")
        .await;

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
    let replica = app.get_json("/servers").await[0]["replica"].clone();
    let info = format!("toolnexus_replica_info{{replica={replica}}} 1");
    assert!(text.lines().any(|l| l == info), "missing {info:?} in\n{text}");
}

#[tokio::test]
async fn json_logs_trace_each_request_without_answer_values() {
    let app = spawn_process("", &format!("{BOTH_ERAS}\n[log]\nformat = \"json\"\n"), "").await;
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
fn log_entry(app: &Process, needles: &[&str]) -> Value {
    let line = app.stderr().wait_for_all(needles);
    serde_json::from_str(&line).unwrap_or_else(|error| panic!("not a JSON log line ({error}): {line}"))
}

#[test]
fn check_config_prints_the_effective_config_with_secrets_masked() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    std::fs::write(
        &path,
        "[[servers]]\nname = \"remote\"\nurl = \"https://ada:pw-in-url@mcp.example.com/mcp?key=key-in-query\"\n\
         headers = { Authorization = \"Bearer ${TOOLNEXUS_TEST_TOKEN}\" }\n\
         [[servers]]\nname = \"local\"\ncommand = \"/bin/true\"\nargs = [\"--token=${TOOLNEXUS_TEST_ARG}\"]\n\
         [[webhooks]]\nurl = \"http://127.0.0.1:9/hook?token=hook-token\"\nsecret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\n",
    )
    .unwrap();
    let output = std::process::Command::new(crate::helpers::BINARY)
        .args(["check-config", "--config"])
        .arg(&path)
        .env("TOOLNEXUS_TEST_TOKEN", "token-value")
        .env("TOOLNEXUS_TEST_ARG", "arg-value")
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
    assert_eq!(
        effective["servers"][0]["url"].as_str(),
        Some("https://***@mcp.example.com/mcp?key=***")
    );
    assert_eq!(
        effective["servers"][1]["args"][0].as_str(),
        Some("--token=${TOOLNEXUS_TEST_ARG}"),
        "arguments are shown as written"
    );
    assert_eq!(
        effective["webhooks"][0]["url"].as_str(),
        Some("http://127.0.0.1:9/hook?token=***")
    );
    for secret in [
        "token-value",
        "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        "pw-in-url",
        "key-in-query",
        "arg-value",
        "hook-token",
    ] {
        assert!(!printed.contains(secret), "{secret} shown: {printed}");
    }
    assert_eq!(effective["requests"]["max_pending"].as_integer(), Some(10_000));
    assert_eq!(effective["limits"]["calls_per_principal"].as_integer(), Some(64));
    assert_eq!(effective["http"]["header_timeout"].as_str(), Some("10s"));
}

#[test]
fn check_config_refuses_what_serve_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("[http]\ncors_origins = [\"*\"]\n", "wildcard"),
        (
            "[http]\ncors_origins = [\"https://app.example.com/inbox\"]\n",
            "nothing after it",
        ),
        ("listen = \"0.0.0.0:0\"\n", "without authentication"),
    ];
    for (text, expected) in cases {
        let path = dir.path().join("gateway.toml");
        std::fs::write(&path, format!("{text}[store]\nurl = \"memory\"\n")).unwrap();
        for command in [&["check-config", "--config"][..], &["--config"][..]] {
            let output = std::process::Command::new(crate::helpers::BINARY)
                .args(command)
                .arg(&path)
                .env_remove("TOOLNEXUS_LISTEN")
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert_eq!(output.status.code(), Some(1), "{command:?} with {text}: {stderr}");
            assert!(
                stderr.contains(expected) && !stderr.contains("panicked"),
                "{command:?}: {stderr}"
            );
        }
    }
}

#[tokio::test]
async fn a_server_url_s_secrets_stay_out_of_servers_and_the_logs() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let servers = format!(
        "[[servers]]\nname = \"remote\"\nurl = \"http://ada:pw-in-url@{closed}/mcp?key=key-in-query\"\n\
         startup_timeout = \"2s\"\n"
    );
    let app = start_process("", &servers, "");
    let failed = app.get_json("/servers/remote?wait=10").await;
    assert_eq!(failed["status"], "failed", "{failed}");
    assert!(failed["detail"].as_str().unwrap().contains("/mcp"), "{failed}");
    // rmcp logs the URL it failed on; wait for that line before looking at all of them.
    app.stderr().wait_for("/mcp?");
    let shown = format!("{failed}\n{}", app.stderr().lines().join("\n"));
    for secret in ["pw-in-url", "key-in-query"] {
        assert!(!shown.contains(secret), "{secret} shown: {shown}");
    }
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

/// Runs `check-config` and then `serve` on the config `text`, with `env` set, and expects both to refuse it;
/// returns what each wrote to stderr.
fn refused_config(text: &str, env: &[(&str, &str)]) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, text).unwrap();
    [&["check-config", "--config"][..], &["--config"][..]]
        .into_iter()
        .map(|command| {
            let output = std::process::Command::new(crate::helpers::BINARY)
                .args(command)
                .arg(&path)
                .envs(env.iter().copied())
                .env_remove("TOOLNEXUS_LISTEN")
                .output()
                .unwrap();
            let stderr = String::from_utf8(output.stderr).unwrap();
            assert_eq!(output.status.code(), Some(1), "{command:?} with {text}: {stderr}");
            stderr
        })
        .collect()
}

#[test]
fn config_errors_name_the_key_and_the_variable_never_what_it_holds() {
    let secret = [(
        "TOOLNEXUS_TEST_SECRET",
        "ada:s3cret-in-env@db.example.com/x?key=k3y-in-env",
    )];
    let written = "\"${TOOLNEXUS_TEST_SECRET}\"";
    for (text, line) in [
        (format!("[[servers]]\nname = \"remote\"\nurl = {written}\n"), 3),
        (format!("[store]\nurl = {written}\n"), 2),
        (format!("replica = {written}\n"), 1),
        ("[log]\nlevel = \"${TOOLNEXUS_TEST_SECRET}=x=y\"\n".to_owned(), 2),
        (format!("listen = {written}\n"), 1),
        (format!("[requests]\nttl = {written}\n"), 2),
    ] {
        for stderr in refused_config(&text, &secret) {
            let key_line = text.lines().nth(line - 1).unwrap();
            assert!(
                stderr.contains(&format!("gateway.toml: TOML parse error at line {line}"))
                    && stderr.contains(key_line)
                    && stderr.contains("the value of ${TOOLNEXUS_TEST_SECRET}"),
                "{text}: {stderr}"
            );
            assert!(
                !stderr.contains("s3cret") && !stderr.contains("k3y"),
                "{text}: {stderr}"
            );
        }
    }

    // Values from the environment that override the file's are not quoted either.
    for (variable, value, key) in [
        ("TOOLNEXUS_STORE", "host=db password=s3cret-in-env", "store.url"),
        ("TOOLNEXUS_LOG_LEVEL", "s3cret-in-env=x=y", "log.level"),
    ] {
        for stderr in refused_config("[store]\nurl = \"memory\"\n", &[(variable, value)]) {
            assert!(
                stderr.contains(key) && !stderr.contains("s3cret"),
                "{variable}: {stderr}"
            );
        }
    }
}

#[test]
fn approvers_naming_no_token_that_answers_approvals_are_refused() {
    let policy = |approvers: &str| {
        format!("[[approvals]]\nserver = \"demo\"\ntools = [\"confirm_*\"]\napprovers = [{approvers}]\n")
    };
    let servers = "[[servers]]\nname = \"demo\"\nbuiltin = \"demo\"\n[store]\nurl = \"memory\"\n";
    let tokens = format!("{}{}", token_entry("on-call", "approver"), token_entry("ci", "agent"));
    let cases = [
        (
            format!("{servers}{tokens}{}", policy("\"on-cal\"")),
            "line 14: approvals[0].approvers (server \"demo\"): \"on-cal\" is the name of no [[auth.tokens]] entry, \
             so nobody could answer as it; name one of \"on-call\"",
        ),
        (
            format!("{servers}{tokens}{}", policy("\"ci\"")),
            "line 14: approvals[0].approvers (server \"demo\"): \"ci\" is an agent's token, and agents never answer approvals",
        ),
        (
            format!("{servers}{}", policy("\"on-call\"")),
            "line 6: approvals[0].approvers (server \"demo\"): \"on-call\" names a token, but no [[auth.tokens]] are \
             configured",
        ),
    ];
    for (text, expected) in cases {
        for stderr in refused_config(&text, &[]) {
            assert!(
                stderr.contains(&format!("gateway.toml, {expected}")),
                "{text}\n{stderr}"
            );
        }
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
    let app = start_process("workers = 3", BOTH_ERAS, "");
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
