//! Three replicas of the real binary on one PostgreSQL database behave as one gateway.

use serde_json::{Value, json};

use crate::cluster;
use crate::helpers::{
    BOTH_ERAS, ERAS, Process, confirming, first_request, results, signal, start_process_in, stored_in, submit,
};

/// Three gateways with the demo server in both eras, storing in the database at `url`, and their dirs.
pub struct Fleet {
    pub replicas: Vec<Process>,
    _dirs: Vec<tempfile::TempDir>,
}

/// Starts three replicas on `url` together (their first start migrates the database once) and waits until
/// each is ready.
pub async fn fleet(url: &str) -> Fleet {
    fleet_of(url, BOTH_ERAS).await
}

/// Like `fleet`, with `servers` (TOML: servers, webhooks) as each replica's config.
async fn fleet_of(url: &str, servers: &str) -> Fleet {
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let replicas: Vec<Process> = dirs
        .iter()
        .map(|dir| start_process_in(dir.path(), &stored_in(url), servers, ""))
        .collect();
    for replica in &replicas {
        let ready = replica.get("/readyz?wait=30").await;
        assert_eq!(ready.status(), 200, "not ready: {}", ready.text().await.unwrap());
    }
    Fleet { replicas, _dirs: dirs }
}

#[tokio::test]
async fn any_replica_lists_answers_and_waits_on_what_another_started_in_both_eras() {
    let fleet = fleet(&cluster::shared().database()).await;
    let [a, b, c] = &fleet.replicas[..] else { unreachable!() };
    let replica_of = |servers: Value| servers[0]["replica"].as_str().unwrap().to_owned();
    let ids = [
        replica_of(a.get_json("/servers").await),
        replica_of(b.get_json("/servers").await),
        replica_of(c.get_json("/servers").await),
    ];
    assert!(ids[0] != ids[1] && ids[1] != ids[2] && ids[0] != ids[2], "{ids:?}");
    // Each replica holds its own shared session to each server, and every replica lists them all.
    let sessions = c.get_json("/sessions").await;
    let holders: std::collections::BTreeSet<&str> = sessions
        .as_array()
        .unwrap()
        .iter()
        .map(|session| session["replica"].as_str().unwrap())
        .collect();
    assert_eq!(holders.len(), 3, "{sessions}");
    assert_eq!(sessions.as_array().unwrap().len(), 6, "{sessions}");

    for server in ERAS {
        let path = format!("/requests?server={server}&wait=20");
        let listed = b.get(&path);
        let (listed, call) = tokio::join!(listed, a.call(server, "confirm_action", json!({"action": "fleet"})));
        let listed: Value = listed.json().await.unwrap();
        assert_eq!(listed[0]["call"], call["id"], "{server}: B lists what A raised");
        let request = first_request(&call);
        assert_eq!(c.get_json(&format!("/requests/{request}")).await["status"], "pending");

        b.answer_ok(&request, json!({"ok": true, "data": {"confirm": true}}))
            .await;
        let done = c.settled(call["id"].as_str().unwrap()).await;
        assert_eq!(
            results(&done),
            json!([{"action": "accept", "content": {"confirm": true, "note": ""}}]),
            "{server}: C waited on the call A started and B's answer completed"
        );
    }
}

#[tokio::test]
async fn of_two_hundred_answers_over_three_replicas_exactly_one_wins() {
    let fleet = fleet(&cluster::shared().database()).await;
    for (round, era) in ERAS.iter().enumerate() {
        let call = fleet.replicas[0]
            .call(era, "confirm_action", json!({"action": "race"}))
            .await;
        let id = first_request(&call);
        let answers: Vec<_> = (0..200)
            .map(|n| {
                let replica = &fleet.replicas[n % 3];
                let (client, url) = (
                    replica.client.clone(),
                    format!("{}/requests/{id}/answer", replica.address),
                );
                tokio::spawn(async move {
                    let body = json!({"ok": true, "data": {"confirm": true, "note": format!("answer-{n}")}});
                    let response = client.post(url).json(&body).send().await.unwrap();
                    (response.status().as_u16(), response.json::<Value>().await.unwrap())
                })
            })
            .collect();
        let mut winners = Vec::new();
        for answer in answers {
            let (status, body) = answer.await.unwrap();
            match status {
                200 => winners.push(body),
                409 => {}
                other => panic!("{era}: an answer got {other}: {body}"),
            }
        }
        assert_eq!(winners.len(), 1, "{era}: exactly one answer wins");
        let note = winners[0]["answer"]["data"]["note"].clone();
        let done = fleet.replicas[1].settled(call["id"].as_str().unwrap()).await;
        assert_eq!(
            results(&done)[0]["content"]["note"],
            note,
            "{era}: the upstream got the winner"
        );
        let delivered: usize = fleet
            .replicas
            .iter()
            .map(|replica| {
                replica
                    .stderr()
                    .lines()
                    .iter()
                    .filter(|line| line.contains("confirm_action received"))
                    .count()
            })
            .sum();
        assert_eq!(
            delivered,
            round + 1,
            "{era}: the fleet's upstreams received exactly one result"
        );
    }
}

#[tokio::test]
async fn an_event_stream_on_one_replica_shows_what_another_records() {
    let fleet = fleet(&cluster::shared().database()).await;
    let [a, b, c] = &fleet.replicas[..] else { unreachable!() };
    let mut events = c.events("?server=modern", None).await;
    let call = a.call("modern", "confirm_action", json!({"action": "stream"})).await;
    let request = first_request(&call);
    let created = events.next_of("request.created").await;
    assert_eq!(created.data["id"], request.as_str());

    let resumed_from = created.id.clone();
    b.answer_ok(&request, json!({"ok": false})).await;
    let resolved = events.next_of("request.resolved").await;
    assert_eq!(resolved.data["id"], request.as_str());
    // An event id one replica gave resumes on another.
    let mut again = a.events("?server=modern", Some(&resumed_from)).await;
    assert_eq!(again.next_of("request.resolved").await.id, resolved.id);
}

#[tokio::test]
async fn what_a_killed_replica_held_ends_or_goes_on_elsewhere() {
    let mut fleet = fleet(&cluster::shared().database()).await;
    let legacy = fleet.replicas[0]
        .call("legacy", "confirm_action", json!({"action": "orphan"}))
        .await;
    let modern = fleet.replicas[0].call("modern", "two_step", json!({})).await;
    let orphan = first_request(&legacy);
    fleet.replicas[0].kill();
    let b = &fleet.replicas[1];

    // 2025-11-25: the upstream request died with its replica; a survivor ends its Request and its call.
    let ended = b.get_json(&format!("/requests/{orphan}?wait=60")).await;
    assert_eq!(ended["status"], "cancelled", "{ended}");
    assert!(ended["detail"].as_str().unwrap().contains("replica"), "{ended}");
    let failed = b.settled(legacy["id"].as_str().unwrap()).await;
    assert_eq!(failed["status"], "failed", "{failed}");
    assert_eq!(failed["error"]["reason"], "replica_gone", "{failed}");

    // 2026-07-28: the round belongs to no replica; answered on a survivor, the call completes there.
    let id = modern["id"].as_str().unwrap();
    for answer in [
        json!({"ok": true, "data": {"name": "Ada"}}),
        json!({"ok": true, "data": {"confirm": true}}),
    ] {
        let waiting = b.get_json(&format!("/calls/{id}")).await;
        let request = b.request_of(&waiting).await;
        b.answer_ok(request["id"].as_str().unwrap(), answer).await;
        b.settled(id).await;
    }
    let done = fleet.replicas[2].get_json(&format!("/calls/{id}")).await;
    assert_eq!(
        results(&done),
        json!([{"action": "accept", "content": {"name": "Ada"}}, {"action": "accept", "content": {"confirm": true}}])
    );
}

/// A replica stopped past the lease is taken for gone. Let run again, it learns so at its next heartbeat and
/// exits, saying why, rather than serve on the sessions the fleet has closed.
#[tokio::test]
async fn a_replica_taken_for_gone_exits_when_it_runs_again() {
    let mut fleet = fleet(&cluster::shared().database()).await;
    let legacy = fleet.replicas[0]
        .call("legacy", "confirm_action", json!({"action": "stopped"}))
        .await;
    let orphan = first_request(&legacy);
    let stopped = fleet.replicas[0].pid();
    signal(stopped, "STOP");

    let ended = fleet.replicas[1].get_json(&format!("/requests/{orphan}?wait=60")).await;
    assert_eq!(ended["status"], "cancelled", "{ended}");
    signal(stopped, "CONT");
    let replica = &mut fleet.replicas[0];
    replica
        .stderr()
        .wait_for("error: another replica took this one for gone");
    assert_eq!(replica.exit_code(), Some(1));
    let failed = fleet.replicas[2].settled(legacy["id"].as_str().unwrap()).await;
    assert_eq!(failed["error"]["reason"], "replica_gone", "{failed}");
}

/// An approved `confirm_action` call, read on replica `via`, was forwarded once (it asks about the `action`
/// approved) and completes once that is confirmed.
async fn forwarded_once(fleet: &Fleet, via: usize, call: &Value, action: &str) {
    let b = &fleet.replicas[1];
    let id = call["id"].as_str().unwrap();
    let asked = fleet.replicas[via].get_json(&format!("/calls/{id}?wait=60")).await;
    let confirm = b.request_of(&asked).await;
    assert_eq!(confirm["prompt"], format!("Confirm: {action}?"), "{confirm}");
    b.answer_ok(
        confirm["id"].as_str().unwrap(),
        json!({"ok": true, "data": {"confirm": true}}),
    )
    .await;
    let done = fleet.replicas[2].settled(id).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["requests"].as_array().unwrap().len(), 2, "forwarded once: {done}");
}

#[tokio::test]
async fn an_approval_answered_on_any_replica_forwards_its_call_once_even_when_its_replica_is_gone() {
    let servers = format!("{BOTH_ERAS}[[approvals]]\nserver = \"*\"\ntools = [\"confirm_*\"]\n");
    let mut fleet = fleet_of(&cluster::shared().database(), &servers).await;
    let start = |action: &str| json!({"server": "legacy", "tool": "confirm_action", "arguments": {"action": action}});
    let held = fleet.replicas[0].call_on(start("held")).await;
    let orphaned = fleet.replicas[0].call_on(start("orphaned")).await;
    // Approved on B, the call A holds is forwarded by A.
    fleet.replicas[1]
        .answer_ok(&first_request(&held), json!({"ok": true}))
        .await;
    forwarded_once(&fleet, 0, &held, "held").await;

    // A is killed with a call waiting on its approval: approved on B, a survivor forwards it.
    fleet.replicas[0].kill();
    fleet.replicas[1]
        .answer_ok(&first_request(&orphaned), json!({"ok": true}))
        .await;
    forwarded_once(&fleet, 1, &orphaned, "orphaned").await;
}

#[tokio::test]
async fn answers_in_flight_to_a_replica_killed_with_sigkill_are_kept_whole_or_not_at_all() {
    let mut fleet = fleet(&cluster::shared().database()).await;
    // 2026-07-28 calls on every replica; a 2025-11-25 one on B and one on C (A's would die with it, and a
    // stdio session cannot tell two apart).
    let mut calls = Vec::new();
    for n in 0..16 {
        let (era, on) = if n < 2 { ("legacy", n + 1) } else { ("modern", n % 3) };
        let call = fleet.replicas[on]
            .call(era, "confirm_action", json!({"action": format!("kill-{n}")}))
            .await;
        calls.push((era, call));
    }
    let requests: Vec<String> = calls.iter().map(|(_, call)| first_request(call)).collect();

    // Every answer goes to A at once; A is killed as soon as one comes back.
    let mut in_flight = tokio::task::JoinSet::new();
    for (index, request) in requests.iter().enumerate() {
        let reply = fleet.replicas[0].send_answer(request, confirming(&format!("a-{index}")));
        in_flight.spawn(async move { (index, reply.await.unwrap()) });
    }
    let mut won = vec![false; requests.len()];
    let mut killed = false;
    while let Some(done) = in_flight.join_next().await {
        let (index, reply) = done.unwrap();
        let Some(reply) = reply else { continue };
        assert_eq!(reply.status, 200, "a-{index}: {reply:?}");
        assert_eq!(reply.body["answer"]["data"]["note"], format!("a-{index}"), "{reply:?}");
        won[index] = true;
        if !killed {
            fleet.replicas[0].kill();
            killed = true;
        }
    }

    let [_, b, c] = &fleet.replicas[..] else { unreachable!() };
    let mut kept = Vec::new();
    for (index, request) in requests.iter().enumerate() {
        let sent = format!("a-{index}");
        let stored = b.get_json(&format!("/requests/{request}")).await;
        let note = match stored["status"].as_str() {
            // Kept, with a 200 or without: the answer A was sent, as nobody else answered.
            Some("answered") => {
                assert_eq!(stored["answer"]["data"]["note"], sent.as_str(), "{stored}");
                sent
            }
            Some("pending") => {
                assert!(!won[index], "{request} got a 200 but is pending");
                let note = format!("b-{index}");
                b.answer_ok(request, confirming(&note)).await;
                note
            }
            _ => panic!("{request}: {stored}"),
        };
        let again = b.answer(request, confirming("again")).await;
        assert_eq!(again.status(), 409, "{request} took a second answer");
        kept.push(note);
    }

    // A's calls whose round it took go on on a survivor once A's lease has run out.
    for ((era, call), note) in calls.iter().zip(kept) {
        let id = call["id"].as_str().unwrap();
        let done = c.get_json(&format!("/calls/{id}?wait=60")).await;
        assert_eq!(
            results(&done),
            json!([{"action": "accept", "content": {"confirm": true, "note": note}}]),
            "{era}: {id}"
        );
    }
}

/// A webhook receiver that takes every delivery, and the event ids it got, in order.
async fn receiver() -> (String, tokio::sync::mpsc::UnboundedReceiver<u64>) {
    let (record, deliveries) = tokio::sync::mpsc::unbounded_channel();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |body: axum::body::Bytes| {
            let record = record.clone();
            async move {
                let event: Value = serde_json::from_slice(&body).unwrap();
                let _ = record.send(event["id"].as_u64().unwrap());
                axum::http::StatusCode::OK
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, deliveries)
}

#[tokio::test]
async fn each_event_reaches_a_webhook_once_for_the_fleet() {
    let (url, mut deliveries) = receiver().await;
    let servers = format!(
        "{BOTH_ERAS}\n[[webhooks]]\nname = \"fleet\"\nurl = \"{url}\"\nevents = [\"request.created\", \"request.resolved\"]\n"
    );
    let fleet = fleet_of(&cluster::shared().database(), &servers).await;
    let mut received = Vec::new();
    for n in 0..4 {
        let call = fleet.replicas[n % 3]
            .call("modern", "confirm_action", json!({"action": "hook"}))
            .await;
        let request = first_request(&call);
        fleet.replicas[(n + 1) % 3]
            .answer_ok(&request, json!({"ok": false}))
            .await;
        // Its two events, and any other replica's copy of an earlier one, which would come before them.
        while received.len() < 2 * (n + 1) {
            let next = tokio::time::timeout(std::time::Duration::from_secs(30), deliveries.recv())
                .await
                .expect("a delivery within 30 s")
                .unwrap();
            received.push(next);
        }
    }
    let mut once = received.clone();
    once.sort_unstable();
    once.dedup();
    assert_eq!(once.len(), received.len(), "an event was delivered twice: {received:?}");
    assert!(received.is_sorted(), "out of order: {received:?}");
}

/// A task one replica's call became (the HTTP demo server keeps it, for every replica) is answered on another,
/// which follows it on; killed while the task works, a survivor follows it to its end.
#[tokio::test]
async fn a_task_is_answered_on_any_replica_and_followed_on_by_a_survivor() {
    let (_demo, url) = crate::helpers::http_demo();
    let servers = format!("[[servers]]\nname = \"remote\"\nurl = \"{url}\"\n");
    let mut fleet = fleet_of(&cluster::shared().database(), &servers).await;
    let call = fleet.replicas[0]
        .call("remote", "research", json!({"topic": "rust", "seconds": 3}))
        .await;
    assert_eq!(call["task"]["status"], "input_required", "{call}");
    let id = call["id"].as_str().unwrap().to_owned();
    fleet.replicas[1]
        .answer_ok(
            &first_request(&call),
            json!({"ok": true, "data": {"reading": "technical"}}),
        )
        .await;
    let working = fleet.replicas[2].get_json(&format!("/calls/{id}")).await;
    assert_eq!(working["status"], "running", "{working}");
    // Which replica follows it is the one that took the answer; with it gone, a survivor follows the task.
    fleet.replicas[1].kill();
    let done = fleet.replicas[2].get_json(&format!("/calls/{id}?wait=60")).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(
        done["result"]["structuredContent"]["results"],
        json!([{"action": "accept", "content": {"reading": "technical"}}])
    );
}

/// Replicas started together agree on the key that signs links: a link made on one answers on another.
#[tokio::test]
async fn a_link_made_on_one_replica_answers_on_another() {
    let servers = format!("{BOTH_ERAS}[[approvals]]\nserver = \"*\"\ntools = [\"confirm_*\"]\n");
    let fleet = fleet_of(&cluster::shared().database(), &servers).await;
    let [a, b, c] = &fleet.replicas[..] else { unreachable!() };
    let start = json!({"server": "legacy", "tool": "confirm_action", "arguments": {"action": "linked"}});
    let held = a.call_on(start).await;
    let approval = first_request(&held);
    let made = a.post(&format!("/requests/{approval}/links"), &json!(null)).await;
    assert_eq!(made.status(), 201);
    let made: Value = made.json().await.unwrap();
    let token = made["url"].as_str().unwrap().rsplit_once('/').unwrap().1.to_owned();
    let (status, page) = submit(&format!("{}/r/{token}", c.address), &[("decision", "approve")]).await;
    assert_eq!(status, 200, "{page}");
    forwarded_once(&fleet, 0, &held, "linked").await;
    assert_eq!(
        b.get_json(&format!("/requests/{approval}")).await["answerer"]["via"],
        "link"
    );
}

/// A channel's messages are sent once for the fleet, not once per replica.
#[tokio::test]
async fn three_replicas_send_a_channel_one_message_each() {
    let (base, mut messages) = crate::notify::chat_receiver().await;
    let url = format!("{base}/slack");
    let servers = format!("{BOTH_ERAS}\n[[notify]]\nname = \"fleet\"\nslack = {{ webhook = \"{url}\" }}\n");
    let fleet = fleet_of(&cluster::shared().database(), &servers).await;
    let mut prompts = Vec::new();
    for n in 0..3 {
        let action = format!("told-{n}");
        let call = fleet.replicas[n]
            .call("modern", "confirm_action", json!({"action": action}))
            .await;
        fleet.replicas[(n + 1) % 3]
            .answer_ok(&first_request(&call), json!({"ok": false}))
            .await;
        // Its two messages, and any other replica's copy of an earlier one, which would come before them.
        while prompts.len() < 2 * (n + 1) {
            let (_, message) = tokio::time::timeout(std::time::Duration::from_secs(30), messages.recv())
                .await
                .expect("a message within 30 s")
                .unwrap();
            prompts.push(message["text"].as_str().unwrap().to_owned());
        }
    }
    let expected: Vec<String> = (0..3)
        .flat_map(|n| {
            [
                format!("Input needed: Confirm: told-{n}?"),
                format!("Declined: Confirm: told-{n}?"),
            ]
        })
        .collect();
    assert_eq!(prompts, expected);
}

/// A grant given through one replica lets the next matching call run on another, and its revocation on a third
/// holds for all.
#[tokio::test]
async fn a_grant_given_on_one_replica_is_honoured_and_revoked_on_the_others() {
    let servers = format!("{BOTH_ERAS}[[approvals]]\nserver = \"*\"\ntools = [\"echo\"]\ngrants = [\"1h\"]\n");
    let fleet = fleet_of(&cluster::shared().database(), &servers).await;
    let [a, b, c] = &fleet.replicas[..] else { unreachable!() };
    let arguments = json!({"text": "granted"});
    let held = a.call("modern", "echo", arguments.clone()).await;
    let grant = json!({"ok": true, "grant": {"for": "1h", "match": "same-arguments"}});
    assert_eq!(
        b.post(&format!("/requests/{}/answer", first_request(&held)), &grant)
            .await
            .status(),
        200
    );
    let done = a.settled(held["id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "completed", "{done}");
    let again = c.call("modern", "echo", arguments.clone()).await;
    assert_eq!(again["status"], "completed", "{again}");
    let id = again["allowed"]["grant"]
        .as_str()
        .expect("it ran under the grant")
        .to_owned();
    assert_eq!(b.get_json("/grants").await[0]["uses"], 1);
    assert_eq!(a.delete(&format!("/grants/{id}")).await.status(), 200);
    let asked = b.call("modern", "echo", arguments).await;
    assert_eq!(asked["status"], "input_required", "{asked}");
}

#[tokio::test]
async fn a_call_cancelled_through_another_replica_is_cancelled_upstream() {
    let fleet = fleet(&cluster::shared().database()).await;
    let [a, b, _] = &fleet.replicas[..] else { unreachable!() };
    let started = a
        .post(
            "/calls",
            &json!({"server": "modern", "tool": "slow", "arguments": {"seconds": 60}}),
        )
        .await;
    assert_eq!(started.status(), 201);
    let call: Value = started.json().await.unwrap();
    a.stderr().wait_for("demo-server: slow sleeps 60 seconds");

    let cancelled = b.delete(&format!("/calls/{}", call["id"].as_str().unwrap())).await;
    assert_eq!(cancelled.status(), 200);
    let cancelled: Value = cancelled.json().await.unwrap();
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    // The replica running the call stops it, which tells its upstream.
    a.stderr().wait_for("demo-server: slow was cancelled");
}

/// A transaction of another client of the database that records an event and stays open, as a long one of
/// another replica would: no event after its own is published until it ends.
async fn holding_events_back(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    client
        .batch_execute(
            "BEGIN; INSERT INTO events (seq, at, kind, server, session, data) \
             VALUES (pg_current_xact_id()::TEXT::BIGINT * 1048576, 0, 'session.updated', 'elsewhere', \
             'ses-elsewhere', '{\"id\": \"ses-elsewhere\"}')",
        )
        .await
        .unwrap();
    client
}

#[tokio::test]
async fn waiting_clients_are_answered_though_another_transaction_holds_the_fleets_events_back() {
    let url = cluster::shared().database();
    let fleet = fleet(&url).await;
    let [a, b, _] = &fleet.replicas[..] else { unreachable!() };
    let mut events = a.events("", None).await;
    let held = holding_events_back(&url).await;

    // A hang, not a speed, is what the timeouts catch: without the replicas telling their waiters of what
    // committed, each answer below waits for the open transaction, here for the whole `wait` (300 s).
    let within = std::time::Duration::from_secs(60);
    let echo = json!({"server": "modern", "tool": "echo", "arguments": {"text": "held"}});
    let called = tokio::time::timeout(within, a.post("/calls?wait=300", &echo))
        .await
        .expect("the call's waiter was answered");
    let called: Value = called.json().await.unwrap();
    assert_eq!(called["status"], "completed", "{called}");

    // Answered on the replica that runs the call, then on another: the upstream of a 2025-11-25 call hears of
    // an answer kept elsewhere, and a client waiting elsewhere of the end of the call.
    for (server, answering, on) in [
        ("legacy", a, "a"),
        ("modern", a, "a"),
        ("legacy", b, "b"),
        ("modern", b, "b"),
    ] {
        let call = a.call(server, "confirm_action", json!({"action": "held"})).await;
        assert_eq!(call["status"], "input_required", "{server}: {call}");
        let request = first_request(&call);
        let answer = json!({"ok": true, "data": {"confirm": true}});
        let path = format!("/requests/{request}/answer?wait=300");
        let response = tokio::time::timeout(within, answering.post(&path, &answer))
            .await
            .unwrap_or_else(|_| panic!("{server}, answered on {on}: the answer's waiter was not answered"));
        let answered: Value = response.json().await.unwrap();
        assert_eq!(answered["resumedCall"]["status"], "completed", "{server}: {answered}");
    }

    // What the stream shows stays in the log's order: the open transaction's event, then what came after.
    held.batch_execute("COMMIT").await.unwrap();
    loop {
        let event = events.next().await;
        assert_ne!(
            event.event, "call.updated",
            "a call's event before the one held back: {event:?}"
        );
        if event.data["id"] == "ses-elsewhere" {
            break;
        }
    }
    let next = events.next_of("call.updated").await;
    assert_eq!(next.data["id"], called["id"], "{next:?}");
}
