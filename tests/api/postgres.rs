//! The gateway on a PostgreSQL store: a real server the tests start, and the real binary on it.

use std::process::{Command, Stdio};
use std::sync::Arc;

use serde_json::json;
use tokio::task::{JoinHandle, JoinSet};

use crate::cluster::{self, Cluster};
use crate::helpers::{
    BINARY, BOTH_ERAS, ERAS, Process, Reply, config_text, confirming, first_request, results, spawn_process_in,
    stored_in,
};
use crate::replicas::fleet;

/// A gateway with the demo server in both eras, storing in the database at `url`.
async fn gateway(dir: &tempfile::TempDir, url: &str) -> Process {
    spawn_process_in(dir.path(), &stored_in(url), BOTH_ERAS, "").await
}

#[tokio::test]
async fn requests_are_raised_answered_and_kept_in_both_eras() {
    let url = cluster::shared().database();
    let dir = tempfile::tempdir().unwrap();
    let mut app = gateway(&dir, &url).await;
    let mut answered = Vec::new();
    for server in ERAS {
        let call = app.call(server, "confirm_action", json!({"action": "deploy"})).await;
        let request = first_request(&call);
        app.answer_ok(&request, json!({"ok": true, "data": {"confirm": true}}))
            .await;
        let done = app.settled(call["id"].as_str().unwrap()).await;
        assert_eq!(
            results(&done),
            json!([{"action": "accept", "content": {"confirm": true, "note": ""}}]),
            "{server}"
        );
        answered.push(request);
    }

    assert_eq!(app.terminate(), Some(0));
    let app = gateway(&dir, &url).await;
    for request in answered {
        let kept = app.get_json(&format!("/requests/{request}")).await;
        assert_eq!(kept["status"], "answered", "{kept}");
        assert_eq!(kept["answeredBy"], "anonymous", "{kept}");
        assert_eq!(kept["answer"]["data"], json!({"confirm": true, "note": ""}), "{kept}");
    }
}

#[tokio::test]
async fn a_round_outlives_a_killed_gateway_and_its_call_completes() {
    let url = cluster::shared().database();
    let dir = tempfile::tempdir().unwrap();
    let mut app = gateway(&dir, &url).await;
    let call = app.call("modern", "two_step", json!({})).await;
    let id = call["id"].as_str().unwrap().to_owned();

    for answer in [
        json!({"ok": true, "data": {"name": "Ada"}}),
        json!({"ok": true, "data": {"confirm": true}}),
    ] {
        app.kill();
        app = gateway(&dir, &url).await;
        let waiting = app.get_json(&format!("/calls/{id}")).await;
        assert_eq!(waiting["status"], "input_required", "{waiting}");
        let request = app.request_of(&waiting).await;
        app.answer_ok(request["id"].as_str().unwrap(), answer).await;
        let next = app.settled(&id).await;
        assert_ne!(next["status"], "failed", "{next}");
    }
    let done = app.get_json(&format!("/calls/{id}")).await;
    assert_eq!(
        results(&done),
        json!([{"action": "accept", "content": {"name": "Ada"}}, {"action": "accept", "content": {"confirm": true}}])
    );
}

#[tokio::test]
async fn the_databases_password_shows_nowhere() {
    let url = cluster::shared().database();
    let with_password = url.replacen("postgres@", "postgres:s3cret-word@", 1);
    let dir = tempfile::tempdir().unwrap();
    let app = gateway(&dir, &with_password).await;
    let logged = app.stderr().wait_for("store: PostgreSQL");
    assert!(logged.contains("postgres://***@127.0.0.1"), "{logged}");

    let config = dir.path().join("gateway.toml");
    let checked = Command::new(BINARY)
        .args(["check-config", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&checked.stdout);
    assert!(checked.status.success(), "{printed}");
    assert!(printed.contains("postgres://***@127.0.0.1"), "{printed}");

    // A database that cannot be reached is a start-up error naming it, masked.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let unreachable = format!("postgres://postgres:s3cret-word@127.0.0.1:{port}/gateway");
    let elsewhere = tempfile::tempdir().unwrap();
    let config = elsewhere.path().join("gateway.toml");
    std::fs::write(
        &config,
        config_text(elsewhere.path(), &stored_in(&unreachable), BOTH_ERAS, ""),
    )
    .unwrap();
    let output = Command::new(BINARY)
        .arg("--config")
        .arg(&config)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "it started: {stderr}");
    assert!(
        stderr.contains(&format!("127.0.0.1:{port}")) && stderr.contains("cannot connect"),
        "{stderr}"
    );
    for shown in [
        &logged,
        &printed.to_string(),
        &stderr.to_string(),
        &app.stderr().lines().join("\n"),
    ] {
        assert!(!shown.contains("s3cret-word"), "{shown}");
    }
}

#[tokio::test]
async fn the_database_going_away_is_503_and_the_gateway_recovers_when_it_returns() {
    let cluster = Cluster::start();
    let url = cluster.database();
    let dir = tempfile::tempdir().unwrap();
    let app = gateway(&dir, &url).await;
    let call = app.call("modern", "confirm_action", json!({"action": "away"})).await;
    let request = first_request(&call);

    cluster.stop();
    let refused = app
        .answer(&request, json!({"ok": true, "data": {"confirm": true}}))
        .await;
    assert_eq!(refused.status(), 503);
    assert!(refused.headers().contains_key("retry-after"));
    assert_eq!(app.get(&format!("/requests/{request}")).await.status(), 503);
    let probed = app.get("/readyz").await;
    assert_eq!(probed.status(), 503);
    assert_eq!(
        probed.json::<serde_json::Value>().await.unwrap()["store"],
        "unreachable"
    );

    cluster.restart();
    assert_eq!(app.get("/readyz").await.status(), 200);
    assert_eq!(app.get_json(&format!("/requests/{request}")).await["status"], "pending");
    app.answer_ok(&request, json!({"ok": true, "data": {"confirm": true}}))
        .await;
    let done = app.settled(call["id"].as_str().unwrap()).await;
    assert_eq!(
        results(&done),
        json!([{"action": "accept", "content": {"confirm": true, "note": ""}}])
    );
}

/// Answers kept coming to a set of Requests, two in flight for each until it is answered: each answer goes to
/// the next replica with a note of its own, and what came back is filed under its Request.
struct Load<'a> {
    replicas: &'a [Process],
    requests: &'a [String],
    in_flight: JoinSet<(usize, String, Option<Reply>)>,
    /// How many answers each Request was sent.
    sent: Vec<usize>,
    /// Each Request's answers, by note, with what came back.
    replies: Vec<Vec<(String, Reply)>>,
}

impl<'a> Load<'a> {
    /// Sends the first two answers to each of `requests`.
    fn start(replicas: &'a [Process], requests: &'a [String]) -> Self {
        let mut load = Self {
            replicas,
            requests,
            in_flight: JoinSet::new(),
            sent: vec![0; requests.len()],
            replies: requests.iter().map(|_| Vec::new()).collect(),
        };
        for index in 0..requests.len() {
            load.send(index);
            load.send(index);
        }
        load
    }

    fn send(&mut self, index: usize) {
        let attempt = self.sent[index];
        self.sent[index] += 1;
        let note = format!("{index}-{attempt}");
        let reply = self.replicas[(index + attempt) % self.replicas.len()]
            .send_answer(&self.requests[index], confirming(&note));
        self.in_flight.spawn(async move { (index, note, reply.await.unwrap()) });
    }

    /// Files the next answer to come back, and sends another to its Request if the store could not decide
    /// it; its status, or `None` once every Request is answered.
    async fn next(&mut self) -> Option<u16> {
        let (index, note, reply) = self.in_flight.join_next().await?.unwrap();
        let status = self.file(index, note, reply);
        if status == 503 {
            self.send(index);
        }
        Some(status)
    }

    /// Files what came back for an answer: 200 with it, 409 (another answer was kept first), or 503 with
    /// `Retry-After`.
    fn file(&mut self, index: usize, note: String, reply: Option<Reply>) -> u16 {
        let reply = reply.unwrap_or_else(|| panic!("no response to {note}"));
        let status = reply.status;
        match status {
            200 => assert_eq!(reply.body["answer"]["data"]["note"], note.as_str(), "{reply:?}"),
            409 => assert_eq!(reply.body["status"], 409, "{note}: {reply:?}"),
            503 => assert!(reply.retry_after && reply.body["status"] == 503, "{note}: {reply:?}"),
            _ => panic!("{note}: {reply:?}"),
        }
        self.replies[index].push((note, reply));
        status
    }

    /// Keeps the answers coming until `work` ends.
    async fn during<T>(&mut self, work: JoinHandle<T>) -> T {
        tokio::pin!(work);
        loop {
            tokio::select! {
                done = &mut work => return done.unwrap(),
                Some(_) = self.next(), if !self.in_flight.is_empty() => {}
            }
        }
    }

    /// Sends no more, and waits for the answers in flight.
    async fn finish(mut self) -> Vec<Vec<(String, Reply)>> {
        while let Some(done) = self.in_flight.join_next().await {
            let (index, note, reply) = done.unwrap();
            self.file(index, note, reply);
        }
        self.replies
    }
}

#[tokio::test]
async fn answers_racing_the_database_stopping_and_restarting_are_kept_or_refused_never_lost() {
    let cluster = Arc::new(Cluster::start());
    let fleet = fleet(&cluster.database()).await;
    let replicas = &fleet.replicas;
    // 2026-07-28 calls, and one 2025-11-25 call on each replica (a stdio session cannot tell two apart).
    let mut calls = Vec::new();
    for n in 0..12 {
        let era = if n % 4 == 0 { "legacy" } else { "modern" };
        let call = replicas[n % 3]
            .call(era, "confirm_action", json!({"action": format!("load-{n}")}))
            .await;
        calls.push((era, call));
    }
    let requests: Vec<String> = calls.iter().map(|(_, call)| first_request(call)).collect();

    // The first eight take answers throughout: the database stops once one is kept, and starts again once it
    // is down. The other four wait until it is back.
    let mut load = Load::start(replicas, &requests[..8]);
    while load.next().await.is_some_and(|status| status != 200) {}
    let stopping = cluster.clone();
    load.during(tokio::task::spawn_blocking(move || stopping.stop())).await;
    for (from, replica) in replicas.iter().enumerate() {
        assert_eq!(replica.get("/readyz").await.status(), 503);
        let refused = replica.answer(&requests[0], confirming("while-down")).await;
        assert_eq!(refused.status(), 503, "from replica {from}");
        assert!(refused.headers().contains_key("retry-after"));
    }
    let restarting = cluster.clone();
    load.during(tokio::task::spawn_blocking(move || restarting.restart()))
        .await;
    let replies = load.finish().await;

    for replica in replicas {
        let probed = replica.get("/readyz").await;
        let status = probed.status();
        assert_eq!(status, 200, "{}", probed.text().await.unwrap());
    }
    let mut kept = Vec::new();
    for (index, request) in requests.iter().enumerate() {
        let reader = &replicas[(index + 1) % 3];
        let stored = reader.get_json(&format!("/requests/{request}")).await;
        let sent = replies.get(index).map_or(&[][..], Vec::as_slice);
        let with = |status: u16| -> Vec<&str> {
            sent.iter()
                .filter(|(_, reply)| reply.status == status)
                .map(|(note, _)| note.as_str())
                .collect()
        };
        let won = with(200);
        assert!(won.len() <= 1, "{request}: more than one answer won: {won:?}");
        let note = match stored["status"].as_str() {
            Some("answered") => stored["answer"]["data"]["note"].as_str().unwrap().to_owned(),
            Some("pending") => {
                assert!(
                    won.is_empty() && with(409).is_empty(),
                    "{request} lost its answer: {sent:?}"
                );
                let note = format!("after-{index}");
                reader.answer_ok(request, confirming(&note)).await;
                note
            }
            _ => panic!("{request}: {stored}"),
        };
        match won[..] {
            [winner] => assert_eq!(winner, note, "{request}: the answer that got 200 is the one kept"),
            // A commit whose acknowledgement the stop cut off: its sender was told to try again.
            _ => assert!(
                note.starts_with("after-") || with(503).contains(&note.as_str()),
                "{request}: {note} was kept, but nobody was told: {sent:?}"
            ),
        }
        assert!(!with(409).contains(&note.as_str()), "{request}: {sent:?}");
        kept.push(note);
    }

    for (index, (era, call)) in calls.iter().enumerate() {
        let done = replicas[(index + 2) % 3].settled(call["id"].as_str().unwrap()).await;
        assert_eq!(
            results(&done),
            json!([{"action": "accept", "content": {"confirm": true, "note": kept[index]}}]),
            "{era}: {}",
            call["id"]
        );
    }
    let delivered: usize = replicas
        .iter()
        .map(|replica| {
            let lines = replica.stderr().lines();
            lines
                .iter()
                .filter(|line| line.contains("confirm_action received"))
                .count()
        })
        .sum();
    assert_eq!(delivered, calls.len(), "each upstream received its one result once");
}
