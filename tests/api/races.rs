//! Races: many answers to one Request, and answers racing an expiry: exactly one outcome, seen the same
//! way by the answerer, the Request, the call, the event stream and the upstream.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{Value, json};

use crate::helpers::{
    BOTH_ERAS, ERAS, EventStream, TestApp, first_request, results, spawn_app, spawn_app_with, spawn_process,
};

#[tokio::test]
async fn of_two_hundred_different_answers_exactly_one_wins() {
    let app = spawn_process("", BOTH_ERAS, "").await;
    for (round, era) in ERAS.iter().enumerate() {
        let call = app.call(era, "confirm_action", json!({"action": "race"})).await;
        let id = first_request(&call);
        let url = format!("{}/requests/{id}/answer", app.address);
        let answers: Vec<_> = (0..200)
            .map(|n| {
                let (client, url) = (app.client.clone(), url.clone());
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
        let done = app.settled(call["id"].as_str().unwrap()).await;
        assert_eq!(
            results(&done)[0]["content"]["note"],
            note,
            "{era}: the upstream got the winning answer"
        );
        app.stderr()
            .wait_for_all(&["confirm_action received", &format!("server={era}")]);
        let delivered = app
            .stderr()
            .lines()
            .iter()
            .filter(|line| line.contains("confirm_action received"))
            .count();
        assert_eq!(delivered, round + 1, "{era}: the upstream received exactly one result");
    }
}

#[tokio::test]
async fn an_answer_racing_the_expiry_has_one_outcome_everywhere() {
    let app = spawn_app_with(BOTH_ERAS, "ttl = \"1s\"").await;
    let mut events = app.events("?server=modern", None).await;
    let mut calls = Vec::new();
    for _ in 0..12 {
        calls.push(
            app.call("modern", "confirm_action", json!({"action": "close call"}))
                .await,
        );
    }
    // Spread the answers across the moment of expiry: some land before it, some after.
    let outcomes = answer_at(&app, &calls, |n| Duration::from_millis(880 + 20 * n as u64)).await;
    let resolved = resolutions(&mut events, outcomes.len()).await;
    for ((id, status), call) in outcomes.iter().zip(&calls) {
        let request = app.get_json(&format!("/requests/{id}")).await;
        let done = app.settled(call["id"].as_str().unwrap()).await;
        let action = results(&done)[0]["action"].as_str().unwrap().to_owned();
        let expected = match status {
            200 => ("answered", "accept"),
            410 => ("expired", "cancel"),
            other => panic!("an answer got {other}"),
        };
        assert_eq!((request["status"].as_str().unwrap(), action.as_str()), expected, "{id}");
        assert_eq!(resolved[id], expected.0, "{id}: the event agrees");
    }
}

#[tokio::test]
async fn an_answer_racing_an_upstream_cancellation_has_one_outcome_in_the_gateway() {
    let app = spawn_app(BOTH_ERAS).await;
    let mut events = app.events("?server=legacy", None).await;
    // One session per call: over stdio in 2025-11-25 only a lone call in flight gets its elicitation attributed.
    let mut sessions = Vec::new();
    for _ in 0..8 {
        let session: Value = app
            .post("/sessions", &json!({"server": "legacy"}))
            .await
            .json()
            .await
            .unwrap();
        sessions.push(session["id"].as_str().unwrap().to_owned());
    }
    let mut calls = Vec::new();
    for session in &sessions {
        let arguments = json!({"action": "hurry", "timeout": 0.4});
        calls.push(
            app.call_on(json!({"session": session, "tool": "confirm_action", "arguments": arguments}))
                .await,
        );
    }
    // Around the moment the upstream gives up and withdraws its elicitation.
    let outcomes = answer_at(&app, &calls, |n| Duration::from_millis(340 + 15 * n as u64)).await;
    let resolved = resolutions(&mut events, outcomes.len()).await;
    for (id, status) in &outcomes {
        let request = app.get_json(&format!("/requests/{id}")).await;
        let expected = match status {
            200 => "answered",
            410 => "cancelled",
            other => panic!("an answer got {other}"),
        };
        // An answer that crossed the withdrawal may already read as what the upstream saw (checked below).
        let crossed = *status == 200
            && request["status"] == "cancelled"
            && request["detail"]
                .as_str()
                .is_some_and(|detail| detail.contains("before the answer reached it"));
        if !crossed {
            assert_eq!(request["status"], expected, "{id}: {request}");
        }
        assert_eq!(resolved[id], expected, "{id}: the event agrees");
    }
    // What the tool received and the Request's final status agree: an answer that crossed the upstream's
    // withdrawal on the wire ends `cancelled`, as the upstream saw it.
    for (call, (id, status)) in calls.iter().zip(&outcomes) {
        let done = app.settled(call["id"].as_str().unwrap()).await;
        assert_eq!(done["status"], "completed", "every call ends: {done}");
        let received = done["result"]["isError"] != json!(true);
        let expected = if received { "answered" } else { "cancelled" };
        if *status == 410 {
            assert!(!received, "{id}: a refused answer never reaches the upstream: {done}");
        }
        let mut last = app.get_json(&format!("/requests/{id}")).await;
        while last["status"] != expected {
            let event = events.next_of("request.updated").await;
            if event.data["id"] == json!(id) {
                last = event.data;
            }
        }
        if *status == 200 && !received {
            assert!(
                last["detail"]
                    .as_str()
                    .unwrap()
                    .contains("before the answer reached it"),
                "{last}"
            );
            assert_eq!(last["answer"]["ok"], true, "the answer is kept: {last}");
        }
    }
}

/// Accepts each call's first Request after its own delay, all at once; the Request ids with the HTTP statuses.
async fn answer_at(app: &TestApp, calls: &[Value], delay: impl Fn(usize) -> Duration) -> Vec<(String, u16)> {
    let answers: Vec<_> = calls
        .iter()
        .enumerate()
        .map(|(n, call)| {
            let id = first_request(call);
            let url = format!("{}/requests/{id}/answer", app.address);
            let (client, delay) = (app.client.clone(), delay(n));
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                let body = json!({"ok": true, "data": {"confirm": true}});
                let response = client.post(url).json(&body).send().await.unwrap();
                (id, response.status().as_u16())
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for answer in answers {
        outcomes.push(answer.await.unwrap());
    }
    outcomes
}

/// The status of each of the next `count` Requests resolved on the stream, by id.
async fn resolutions(events: &mut EventStream, count: usize) -> HashMap<String, String> {
    let mut resolved = HashMap::new();
    while resolved.len() < count {
        let event = events.next_of("request.resolved").await;
        resolved.insert(
            event.data["id"].as_str().unwrap().to_owned(),
            event.data["status"].as_str().unwrap().to_owned(),
        );
    }
    resolved
}
