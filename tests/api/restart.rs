//! What a restart keeps: the same SQLite store in a temp dir, a gateway stopped with SIGTERM or killed with
//! SIGKILL, and a new one started on it.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{Value, json};

use crate::helpers::{BOTH_ERAS, Process, first_request, results, spawn_in, spawn_in_with, spawn_process_in};

/// How a gateway stops.
#[derive(Debug, Clone, Copy)]
enum Stop {
    Terminate,
    Kill,
}

fn stop(app: &mut Process, how: Stop) {
    match how {
        Stop::Terminate => assert_eq!(app.terminate(), Some(0)),
        Stop::Kill => app.kill(),
    }
}

/// A gateway on `dir`'s store with the demo server in both eras.
async fn gateway(dir: &tempfile::TempDir) -> Process {
    spawn_process_in(dir.path(), "", BOTH_ERAS, "").await
}

#[tokio::test]
async fn a_round_stays_answerable_across_restarts_and_the_call_completes() {
    let dir = tempfile::tempdir().unwrap();
    let mut app = gateway(&dir).await;
    let call = app.call("modern", "two_step", json!({})).await;
    let id = call["id"].as_str().unwrap().to_owned();
    let first = first_request(&call);

    for (how, answer) in [
        (Stop::Terminate, json!({"ok": true, "data": {"name": "Ada"}})),
        (Stop::Kill, json!({"ok": true, "data": {"confirm": true}})),
    ] {
        stop(&mut app, how);
        app = gateway(&dir).await;
        let waiting = app.get_json(&format!("/calls/{id}")).await;
        assert_eq!(waiting["status"], "input_required", "after {how:?}: {waiting}");
        let request = app.request_of(&waiting).await;
        assert_eq!(request["status"], "pending");
        app.answer_ok(request["id"].as_str().unwrap(), answer).await;
        let next = app.settled(&id).await;
        assert_ne!(next["status"], "failed", "{next}");
    }

    let done = app.get_json(&format!("/calls/{id}")).await;
    assert_eq!(
        results(&done),
        json!([{"action": "accept", "content": {"name": "Ada"}}, {"action": "accept", "content": {"confirm": true}}])
    );
    let answered = app.get_json(&format!("/requests/{first}")).await;
    assert_eq!(answered["answer"]["data"], json!({"name": "Ada"}), "{answered}");
}

#[tokio::test]
async fn a_round_on_a_private_session_ends_with_the_process() {
    let dir = tempfile::tempdir().unwrap();
    let mut app = gateway(&dir).await;
    let session = app.post("/sessions", &json!({"server": "modern"})).await;
    assert_eq!(session.status(), 201);
    let session = session.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let call = app
        .call_on(json!({"session": session, "tool": "two_step", "arguments": {}}))
        .await;
    assert_eq!(call["status"], "input_required", "{call}");
    let request = first_request(&call);

    stop(&mut app, Stop::Kill);
    app = gateway(&dir).await;

    let ended = app.get_json(&format!("/calls/{}", call["id"].as_str().unwrap())).await;
    assert_eq!(ended["status"], "failed", "{ended}");
    assert_eq!(ended["error"]["reason"], "gateway_restarted", "{ended}");
    let view = app.get_json(&format!("/requests/{request}")).await;
    assert_eq!(view["status"], "cancelled", "{view}");
}

#[tokio::test]
async fn an_elicitation_in_flight_ends_with_the_process_and_says_why() {
    for how in [Stop::Terminate, Stop::Kill] {
        let dir = tempfile::tempdir().unwrap();
        let mut app = gateway(&dir).await;
        let call = app.call("legacy", "confirm_action", json!({"action": "deploy"})).await;
        let request = first_request(&call);
        let merely_running = app.call("modern", "slow", json!({"seconds": 60})).await;
        assert_eq!(merely_running["status"], "running");

        stop(&mut app, how);
        app = gateway(&dir).await;

        let view = app.get_json(&format!("/requests/{request}")).await;
        assert_eq!(view["status"], "cancelled", "after {how:?}: {view}");
        let answer = app
            .answer(&request, json!({"ok": true, "data": {"confirm": true}}))
            .await;
        assert_eq!(answer.status(), 410);
        for call in [&call, &merely_running] {
            let ended = app.get_json(&format!("/calls/{}", call["id"].as_str().unwrap())).await;
            match how {
                Stop::Terminate => assert_eq!(ended["status"], "cancelled", "{ended}"),
                Stop::Kill => {
                    assert_eq!(ended["status"], "failed", "{ended}");
                    assert_eq!(ended["error"]["reason"], "gateway_restarted", "{ended}");
                    assert!(view["detail"].as_str().unwrap().contains("restarted"), "{view}");
                }
            }
        }
    }
}

#[tokio::test]
async fn a_call_waiting_on_its_approval_outlives_restarts_and_runs_once_approved() {
    let dir = tempfile::tempdir().unwrap();
    let servers = format!("{BOTH_ERAS}[[approvals]]\nserver = \"*\"\ntools = [\"confirm_*\"]\n");
    let mut app = spawn_process_in(dir.path(), "", &servers, "").await;
    let approved: Vec<Value> = [("modern", "deploy"), ("legacy", "ship")]
        .into_iter()
        .map(|(server, action)| json!({"server": server, "tool": "confirm_action", "arguments": {"action": action}}))
        .collect();
    let mut calls = Vec::new();
    for body in approved
        .iter()
        .chain([&json!({"server": "legacy", "tool": "confirm_action",
        "arguments": {"action": "drop"}})])
    {
        let call = app.call_on(body.clone()).await;
        let approval = app.request_of(&call).await;
        calls.push((
            call["id"].as_str().unwrap().to_owned(),
            approval["id"].as_str().unwrap().to_owned(),
        ));
    }

    for how in [Stop::Terminate, Stop::Kill] {
        stop(&mut app, how);
        app = spawn_process_in(dir.path(), "", &servers, "").await;
        for (call, approval) in &calls {
            let waiting = app.get_json(&format!("/calls/{call}")).await;
            assert_eq!(waiting["status"], "input_required", "after {how:?}: {waiting}");
            let view = app.get_json(&format!("/requests/{approval}")).await;
            assert_eq!(view["status"], "pending", "after {how:?}: {view}");
        }
    }

    for ((call, approval), body) in calls.iter().zip(&approved) {
        app.answer_ok(approval, json!({"ok": true})).await;
        app.get_json(&format!("/requests/{approval}?wait=20")).await;
        let asked = app.settled(call).await;
        // confirm_action asks about the action it was given: the upstream got the arguments approved.
        let confirm = app.request_of(&asked).await;
        let action = body["arguments"]["action"].as_str().unwrap();
        assert_eq!(confirm["prompt"], format!("Confirm: {action}?"), "{confirm}");
        app.answer_ok(
            confirm["id"].as_str().unwrap(),
            json!({"ok": true, "data": {"confirm": true}}),
        )
        .await;
        let done = app.settled(call).await;
        assert_eq!(done["status"], "completed", "{done}");
        assert_eq!(done["requests"].as_array().unwrap().len(), 2, "forwarded once: {done}");
    }

    let (call, approval) = &calls[2];
    app.answer_ok(approval, json!({"ok": false})).await;
    app.get_json(&format!("/requests/{approval}?wait=20")).await;
    let declined = app.settled(call).await;
    assert_eq!(declined["status"], "failed", "{declined}");
    assert_eq!(declined["error"]["reason"], "declined", "{declined}");
    assert_eq!(
        declined["requests"].as_array().unwrap().len(),
        1,
        "never forwarded: {declined}"
    );
}

#[tokio::test]
async fn every_answer_that_got_200_holds_after_a_kill_in_the_middle_of_a_burst() {
    let dir = tempfile::tempdir().unwrap();
    let mut app = gateway(&dir).await;
    let call = app.call("modern", "flood", json!({"count": 150})).await;
    let requests = app
        .get_json(&format!("/requests?call={}&limit=1000", call["id"].as_str().unwrap()))
        .await;
    let ids: Vec<String> = requests
        .as_array()
        .unwrap()
        .iter()
        .map(|request| request["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids.len(), 150);

    // Two different answers race for each Request; the gateway is killed once some have been taken.
    let (taken, mut first_taken) = tokio::sync::mpsc::unbounded_channel();
    let mut racing = tokio::task::JoinSet::new();
    for id in &ids {
        for confirm in [true, false] {
            let (client, address, id, taken) = (app.client.clone(), app.address.clone(), id.clone(), taken.clone());
            racing.spawn(async move {
                let answer = json!({"ok": true, "data": {"confirm": confirm}});
                let response = client
                    .post(format!("{address}/requests/{id}/answer"))
                    .json(&answer)
                    .send()
                    .await;
                let ok = response.is_ok_and(|response| response.status() == 200);
                if ok {
                    let _ = taken.send(());
                }
                (id, confirm, ok)
            });
        }
    }
    for _ in 0..20 {
        first_taken.recv().await.unwrap();
    }
    app.kill();
    let mut accepted: HashMap<String, Vec<bool>> = HashMap::new();
    while let Some(raced) = racing.join_next().await {
        let (id, confirm, ok) = raced.unwrap();
        if ok {
            accepted.entry(id).or_default().push(confirm);
        }
    }

    let app = gateway(&dir).await;
    assert!(accepted.len() >= 20);
    for (id, confirms) in &accepted {
        assert_eq!(confirms.len(), 1, "{id} was answered twice: {confirms:?}");
        let view = app.get_json(&format!("/requests/{id}")).await;
        assert_eq!(view["status"], "answered", "{view}");
        assert_eq!(view["answer"]["data"]["confirm"], confirms[0], "{view}");
    }
    for id in ids.iter().filter(|id| !accepted.contains_key(*id)) {
        let view = app.get_json(&format!("/requests/{id}")).await;
        assert!(
            ["pending", "answered"].contains(&view["status"].as_str().unwrap()),
            "{view}"
        );
    }
}

#[tokio::test]
async fn an_event_id_from_before_a_restart_resumes_the_stream() {
    let dir = tempfile::tempdir().unwrap();
    let mut app = gateway(&dir).await;
    let call = app.call("modern", "confirm_action", json!({"action": "resume"})).await;
    let request = first_request(&call);
    let mut events = app.events("?server=modern", Some("0")).await;
    let created = loop {
        let event = events.next_of("request.created").await;
        if event.data["id"] == request.as_str() {
            break event;
        }
    };
    drop(events);
    app.terminate();

    let app = gateway(&dir).await;
    app.answer_ok(&request, json!({"ok": false, "reason": "declined"}))
        .await;
    let mut resumed = app.events("?server=modern", Some(&created.id)).await;
    let next = resumed.next().await;
    assert_ne!(next.event, "resync", "{next:?}");
    let resolved = resumed.next_of("request.resolved").await;
    assert_eq!(resolved.data["id"], request.as_str());
    assert!(resolved.id.parse::<u64>().unwrap() > created.id.parse::<u64>().unwrap());

    let mut future = app.events("", Some("999999999")).await;
    assert_eq!(future.next().await.event, "resync");
}

#[tokio::test]
async fn a_round_whose_state_the_upstream_refuses_fails_the_call_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let sealed =
        "[[servers]]\nname = \"sealed\"\nbuiltin = \"demo\"\nargs = [\"--seal-state\"]\nprotocol = \"2026-07-28\"\n";
    let mut app = spawn_process_in(dir.path(), "", sealed, "").await;
    let call = app.call("sealed", "two_step", json!({})).await;
    let request = first_request(&call);

    // The demo server is started afresh with the gateway, with a new key.
    app.terminate();
    let app = spawn_process_in(dir.path(), "", sealed, "").await;
    app.answer_ok(&request, json!({"ok": true, "data": {"name": "Ada"}}))
        .await;

    let failed = app.settled(call["id"].as_str().unwrap()).await;
    assert_eq!(failed["status"], "failed", "{failed}");
    assert_eq!(failed["error"]["reason"], "state_rejected", "{failed}");
    let answered = app.get_json(&format!("/requests/{request}?wait=5")).await;
    assert_eq!(answered["status"], "answered");
    assert!(
        answered["detail"].as_str().unwrap_or_default().contains("refused"),
        "{answered}"
    );
}

#[tokio::test]
async fn a_request_due_while_the_gateway_was_down_expires_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let mut app = spawn_in(dir.path(), "", BOTH_ERAS, "ttl = \"1h\"").await;
    let call = app.call("modern", "confirm_action", json!({"action": "late"})).await;
    let request = app.request_of(&call).await;
    let clock = app.clock().clone();
    app.shut_down();

    // The Request's hour runs out while no gateway is serving its store.
    clock.advance(Duration::from_secs(3601));
    let app = spawn_in_with(dir.path(), "", BOTH_ERAS, "ttl = \"1h\"", clock).await;

    let id = request["id"].as_str().unwrap();
    let expired = app.get_json(&format!("/requests/{id}?wait=10")).await;
    assert_eq!(expired["status"], "expired", "{expired}");
    let done = app.settled(call["id"].as_str().unwrap()).await;
    assert_eq!(results(&done), json!([{"action": "cancel"}]));
}

#[tokio::test]
async fn a_call_that_runs_on_is_recorded_while_its_starter_still_waits() {
    let dir = tempfile::tempdir().unwrap();
    let mut app = gateway(&dir).await;
    let mut events = app.events("?server=modern", None).await;
    let body = json!({"server": "modern", "tool": "slow", "arguments": {"seconds": 60}});
    let mut started = Box::pin(app.post("/calls?wait=20", &body));
    let recorded = tokio::select! {
        event = events.next_of("call.updated") => event,
        response = &mut started => panic!("the call was answered ({}) before it was recorded", response.status()),
    };
    assert_eq!(recorded.data["status"], "running", "{:?}", recorded.data);
    let id = recorded.data["id"].as_str().unwrap().to_owned();
    drop(started);

    stop(&mut app, Stop::Kill);
    app = gateway(&dir).await;
    let ended = app.get_json(&format!("/calls/{id}")).await;
    assert_eq!(ended["status"], "failed", "{ended}");
    assert_eq!(ended["error"]["reason"], "gateway_restarted", "{ended}");
}

/// A gateway killed at many points between an approval's answer and its call's send (before the answer is kept,
/// before the call is claimed for sending, between the claim and the send, after it): after the restart every
/// approved 2026-07-28 call has run, at least once; every 2025-11-25 one has run once or failed saying it may
/// not have been sent, and was never sent twice; and no call fails saying the upstream worked on it when it
/// received nothing. The upstream is an HTTP demo server of its own, which outlives the gateway and counts what
/// it received.
#[tokio::test]
async fn an_approved_call_killed_anywhere_before_its_send_is_sent_after_the_restart_or_failed_saying_so() {
    let (_demo, url) = crate::helpers::http_demo();
    let servers = format!(
        "[[servers]]\nname = \"legacy\"\nurl = \"{url}\"\nprotocol = \"2025-11-25\"\n\
         [[servers]]\nname = \"modern\"\nurl = \"{url}\"\n\
         [[approvals]]\nserver = \"*\"\ntools = [\"echo\"]\n"
    );
    let dir = tempfile::tempdir().unwrap();
    let mut outcomes: HashMap<String, usize> = HashMap::new();
    for round in 0..12u64 {
        let mut app = spawn_process_in(dir.path(), "", &servers, "").await;
        let mut calls = Vec::new();
        for era in crate::helpers::ERAS {
            let text = format!("{era} {round}");
            let call = app.call(era, "echo", json!({"text": text})).await;
            assert_eq!(call["status"], "input_required", "{call}");
            calls.push((era, text, call["id"].as_str().unwrap().to_owned(), first_request(&call)));
        }
        let answers: Vec<_> = calls
            .iter()
            .map(|(_, _, _, approval)| app.send_answer(approval, json!({"ok": true})))
            .collect();
        // The kill lands at a different point of the approval's way upstream in each round.
        tokio::time::sleep(Duration::from_micros(round * 1500)).await;
        app.kill();
        for answer in answers {
            let _ = answer.await;
        }

        let app = spawn_process_in(dir.path(), "", &servers, "").await;
        for (era, text, call, approval) in &calls {
            if app.get_json(&format!("/requests/{approval}")).await["status"] == "pending" {
                app.answer_ok(approval, json!({"ok": true})).await;
            }
            let ended = app.settled(call).await;
            let received = app.call("modern", "echoes", json!({"text": text})).await;
            let received: u64 = received["result"]["content"][0]["text"]
                .as_str()
                .unwrap()
                .parse()
                .unwrap();
            let outcome = match (ended["status"].as_str(), ended["error"]["reason"].as_str()) {
                (Some("completed"), _) => {
                    assert!(received >= 1, "{era} {round}: completed unsent: {ended}");
                    "completed"
                }
                (Some("failed"), Some("maybe_not_sent")) => {
                    assert_eq!(*era, "legacy", "a 2026-07-28 call is sent again: {ended}");
                    "maybe_not_sent"
                }
                _ => panic!("{era} {round}: {ended}"),
            };
            if *era == "legacy" {
                assert!(received <= 1, "{era} {round}: sent {received} times: {ended}");
            }
            *outcomes.entry(format!("{era} {outcome}")).or_default() += 1;
        }
        drop(app);
    }
    eprintln!("outcomes over the rounds: {outcomes:?}");
}
