//! The audit trail: `GET /audit` exports the event log with its hashes, and the real binary's `audit verify`
//! takes an export whole and names the line where one was edited, removed or reordered, in the export or in the
//! store's file.

use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::{Value, json};

use crate::cluster;
use crate::helpers::{BINARY, BOTH_ERAS, Caller, TestApp, poll_until, spawn_app, spawn_in, token_entry};
use crate::replicas::fleet;

/// The export once it holds the event of each call's completion, and so every event before them.
async fn export_through(app: &TestApp, calls: &[&str]) -> Vec<String> {
    poll_until("the calls' completions chained", || async {
        let response = app.get("/audit").await;
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["content-type"], "application/jsonl");
        let lines: Vec<String> = response.text().await.unwrap().lines().map(str::to_owned).collect();
        let chained = |call: &&str| lines.iter().any(|line| completes(line, call));
        calls.iter().all(chained).then_some(lines)
    })
    .await
}

/// Whether an export's line is the event of call `call`'s completion.
fn completes(line: &str, call: &str) -> bool {
    let entry: Value = serde_json::from_str(line).unwrap();
    let data: Value = serde_json::from_str(entry["data"].as_str().unwrap()).unwrap();
    entry["kind"] == "call.updated" && data["id"] == call && data["status"] == "completed"
}

/// Where in `lines` call `call` completed.
fn completion(lines: &[String], call: &str) -> usize {
    lines.iter().position(|line| completes(line, call)).unwrap()
}

fn member(line: &str, name: &str) -> Value {
    serde_json::from_str::<Value>(line).unwrap()[name].clone()
}

/// Runs the real binary's `audit verify` on `lines` written to a file in `dir`, with `extra` arguments:
/// whether it verified, and what it said.
fn verify(dir: &Path, lines: &[String], extra: &[&str]) -> (bool, String) {
    let file = dir.join("export.jsonl");
    std::fs::write(&file, lines.iter().map(|line| format!("{line}\n")).collect::<String>()).unwrap();
    let output = Command::new(BINARY)
        .args(["audit", "verify"])
        .arg(&file)
        .args(extra)
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), said)
}

/// Two calls, each with its events, and the export once both are chained: the first call's id, and the export.
async fn two_calls(app: &TestApp) -> (String, Vec<String>) {
    let first = app.call("modern", "echo", json!({"text": "first"})).await;
    let second = app.call("modern", "echo", json!({"text": "second"})).await;
    let lines = export_through(app, &[second["id"].as_str().unwrap()]).await;
    (first["id"].as_str().unwrap().to_owned(), lines)
}

#[tokio::test]
async fn an_export_verifies_and_a_line_edited_removed_or_reordered_is_named() {
    let app = spawn_app(BOTH_ERAS).await;
    let (call, lines) = two_calls(&app).await;
    let dir = tempfile::tempdir().unwrap();
    let (verified, said) = verify(dir.path(), &lines, &[]);
    assert!(verified, "{said}");
    let last = member(lines.last().unwrap(), "hash");
    let (first, newest) = (member(&lines[0], "id"), member(lines.last().unwrap(), "id"));
    let expected = format!("verified {} events, ids {first} to {newest}", lines.len());
    assert!(said.contains(&expected), "{said}");
    assert!(
        said.contains(&format!("last hash {}", last.as_str().unwrap())),
        "{said}"
    );

    let at = completion(&lines, &call);
    let (line, id, next) = (at + 1, member(&lines[at], "id"), member(&lines[at + 1], "id"));
    let mut edited = lines.clone();
    let mut entry: Value = serde_json::from_str(&edited[at]).unwrap();
    entry["data"] = entry["data"]
        .as_str()
        .unwrap()
        .replace("\"completed\"", "\"failed\"")
        .into();
    edited[at] = entry.to_string();
    let (verified, said) = verify(dir.path(), &edited, &[]);
    assert!(!verified);
    assert!(
        said.contains(&format!(
            "line {line}, event {id}: its hash is not the hash of its members"
        )),
        "{said}"
    );

    let mut removed = lines.clone();
    removed.remove(at);
    let (verified, said) = verify(dir.path(), &removed, &[]);
    assert!(!verified);
    assert!(
        said.contains(&format!(
            "line {line}, event {next}: it does not follow the line before"
        )),
        "{said}"
    );

    let mut reordered = lines.clone();
    reordered.swap(at, at + 1);
    let (verified, said) = verify(dir.path(), &reordered, &[]);
    assert!(!verified);
    assert!(
        said.contains(&format!(
            "line {line}, event {next}: it does not follow the line before"
        )),
        "{said}"
    );
}

#[tokio::test]
async fn an_export_from_an_event_on_follows_its_hash_and_reads_from_standard_input() {
    let app = spawn_app(BOTH_ERAS).await;
    let (call, lines) = two_calls(&app).await;
    let at = completion(&lines, &call);
    let since = member(&lines[at], "id");
    let rest: Vec<String> = app
        .get(&format!("/audit?since={since}"))
        .await
        .text()
        .await
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(
        rest[..lines.len() - at - 1],
        lines[at + 1..],
        "the events after it, as before"
    );
    let kept = member(&lines[at], "hash");
    let mut child = Command::new(BINARY)
        .args(["audit", "verify", "-", "--follows", kept.as_str().unwrap()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let text: String = rest.iter().map(|line| format!("{line}\n")).collect();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), text.as_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stdout));

    let dir = tempfile::tempdir().unwrap();
    let (verified, said) = verify_from(dir.path(), &rest, &member(&lines[0], "hash"));
    assert!(!verified);
    assert!(said.contains("line 1, event"), "{said}");
}

/// [`verify`] with `--follows` the hash `follows`.
fn verify_from(dir: &Path, lines: &[String], follows: &Value) -> (bool, String) {
    verify(dir, lines, &["--follows", follows.as_str().unwrap()])
}

#[tokio::test]
async fn a_row_edited_in_the_sqlite_file_no_longer_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_in(dir.path(), "", BOTH_ERAS, "").await;
    let (call, lines) = two_calls(&app).await;
    assert!(verify(dir.path(), &lines, &[]).0);
    let at = completion(&lines, &call);
    let id = member(&lines[at], "id").as_i64().unwrap();
    let file = rusqlite::Connection::open(dir.path().join("gateway.sqlite3")).unwrap();
    file.busy_timeout(std::time::Duration::from_secs(10)).unwrap();

    file.execute(
        "UPDATE events SET data = replace(data, '\"completed\"', '\"failed\"') WHERE seq = ?1",
        [id],
    )
    .unwrap();
    let edited = export_through_edit(&app, id).await;
    let (verified, said) = verify(dir.path(), &edited, &[]);
    assert!(!verified);
    let line = at + 1;
    assert!(
        said.contains(&format!(
            "line {line}, event {id}: its hash is not the hash of its members"
        )),
        "{said}"
    );

    // Its hash in the chain rewritten too: the next event no longer follows it.
    let mut members: serde_json::Map<String, Value> = serde_json::from_str(&edited[at]).unwrap();
    let rehashed = toolnexus_gateway::audit::digest(&members);
    file.execute(
        "UPDATE audit_chain SET hash = ?2 WHERE seq = ?1",
        rusqlite::params![id, rehashed],
    )
    .unwrap();
    members["hash"] = rehashed.into();
    let rewritten = export_through_edit(&app, id).await;
    assert_eq!(rewritten[at], Value::Object(members).to_string());
    let (verified, said) = verify(dir.path(), &rewritten, &[]);
    assert!(!verified);
    let next = member(&rewritten[at + 1], "id");
    assert!(
        said.contains(&format!("line {}, event {next}: it does not follow", line + 1)),
        "{said}"
    );
}

/// The whole export, read after event `id`'s row was changed in the file.
async fn export_through_edit(app: &TestApp, id: i64) -> Vec<String> {
    let text = app.get("/audit").await.text().await.unwrap();
    let lines: Vec<String> = text.lines().map(str::to_owned).collect();
    assert!(lines.iter().any(|line| member(line, "id") == id), "{text}");
    lines
}

#[tokio::test]
async fn only_admins_export_and_a_bad_since_is_a_problem() {
    let tokens = [token_entry("root", "admin"), token_entry("agent", "agent")].concat();
    let app = spawn_app(&format!("{BOTH_ERAS}\n{tokens}")).await;
    let (root, agent) = (Caller::new(&app, "root"), Caller::new(&app, "agent"));

    let (status, problem) = agent.get("/audit").await;
    assert_eq!(status, 403);
    assert_eq!(problem["detail"], "agent may not export the audit trail: admins only");
    let response = root.client.get(format!("{}/audit", app.address)).send().await.unwrap();
    assert_eq!(response.status(), 200);
    for since in ["-1", "x", "9223372036854775808"] {
        let (status, problem) = root.get(&format!("/audit?since={since}")).await;
        assert_eq!(status, 400, "{since}");
        assert_eq!(problem["status"], 400, "{problem}");
        assert!(problem["detail"].as_str().unwrap().contains("since"), "{problem}");
    }
    let (status, _) = root.get("/audit?since=1&since=2").await;
    assert_eq!(status, 400, "given twice");
}

#[tokio::test]
async fn a_fleet_chains_every_replicas_events_once_and_any_replica_exports_the_same_chain() {
    let fleet = fleet(&cluster::shared().database()).await;
    let mut calls = Vec::new();
    for replica in &fleet.replicas {
        let call = replica.call("modern", "echo", json!({"text": "fleet"})).await;
        calls.push(call["id"].as_str().unwrap().to_owned());
    }
    let calls: Vec<&str> = calls.iter().map(String::as_str).collect();

    let lines = export_through(&fleet.replicas[2], &calls).await;
    let dir = tempfile::tempdir().unwrap();
    let (verified, said) = verify(dir.path(), &lines, &["--follows", &"0".repeat(64)]);
    assert!(verified, "{said}");
    for replica in &fleet.replicas[..2] {
        let same = export_through(replica, &calls).await;
        assert_eq!(
            same[..lines.len()],
            lines[..],
            "one chain, whichever replica exports it"
        );
    }
}
