//! `GET /events`: live events, resumption and filters.

use serde_json::json;

use crate::helpers::{BOTH_ERAS, spawn_app};

#[tokio::test]
async fn a_call_and_its_request_are_pushed_as_they_change() {
    let app = spawn_app(BOTH_ERAS).await;
    let mut events = app.events("?server=modern", None).await;
    let call = app.call("modern", "confirm_action", json!({"action": "push"})).await;
    let created = events.next_of("request.created").await;
    let request = app.request_of(&call).await;
    assert_eq!(created.data, request, "the event carries the whole Request");
    let updated = events.next_of("call.updated").await;
    assert_eq!(updated.data["id"], call["id"]);

    app.answer_ok(
        request["id"].as_str().unwrap(),
        json!({"ok": true, "data": {"confirm": true}}),
    )
    .await;
    let resolved = events.next_of("request.resolved").await;
    assert_eq!(resolved.data["status"], "answered");
    assert_eq!(resolved.data["id"], request["id"]);
    loop {
        let update = events.next_of("call.updated").await;
        assert_eq!(update.data["id"], call["id"]);
        if update.data["status"] == "completed" {
            break;
        }
    }
}

#[tokio::test]
async fn a_reconnect_resumes_after_the_last_event_id() {
    let app = spawn_app(BOTH_ERAS).await;
    let mut events = app.events("", None).await;
    let call = app.call("legacy", "confirm_action", json!({"action": "resume"})).await;
    let created = events.next_of("request.created").await;
    drop(events);

    app.answer_ok(
        created.data["id"].as_str().unwrap(),
        json!({"ok": false, "reason": "declined"}),
    )
    .await;
    app.settled(call["id"].as_str().unwrap()).await;
    let mut resumed = app.events("", Some(&created.id)).await;
    let next = resumed.next().await;
    assert!(next.id.parse::<u64>().unwrap() > created.id.parse::<u64>().unwrap());
    let resolved = resumed.next_of("request.resolved").await;
    assert_eq!(resolved.data["id"], created.data["id"]);

    let mut by_query = app.events(&format!("?lastEventId={}", created.id), None).await;
    assert_eq!(by_query.next().await.id, next.id);
}

#[tokio::test]
async fn an_unknown_last_event_id_is_told_to_relist() {
    let app = spawn_app(BOTH_ERAS).await;
    let mut events = app.events("", Some("999999")).await;
    let resync = events.next().await;
    assert_eq!(resync.event, "resync");
    assert!(
        resync.data["reason"]
            .as_str()
            .unwrap()
            .contains("list the resources again")
    );
    let bad = app
        .client
        .get(format!("{}/events", app.address))
        .header("Last-Event-ID", "x")
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
}

#[tokio::test]
async fn session_events_report_private_sessions() {
    let app = spawn_app(BOTH_ERAS).await;
    let mut events = app.events("?server=legacy", None).await;
    let session = app
        .post("/sessions", &json!({"server": "legacy"}))
        .await
        .json::<serde_json::Value>()
        .await
        .unwrap();
    let mut seen = Vec::new();
    while seen.last().map(String::as_str) != Some("ready") {
        let event = events.next_of("session.updated").await;
        assert_eq!(event.data["id"], session["id"]);
        seen.push(event.data["status"].as_str().unwrap().to_owned());
    }
    assert_eq!(seen, ["starting", "ready"]);
    app.delete(&format!("/sessions/{}", session["id"].as_str().unwrap()))
        .await;
    assert_eq!(events.next_of("session.updated").await.data["status"], "closed");
}
