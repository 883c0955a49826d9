//! `GET /events`: live events, resumption and filters.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use crate::helpers::{BOTH_ERAS, SseEvent, TestApp, spawn_app};

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

#[tokio::test]
async fn every_event_type_matches_the_schema_the_document_gives_it() {
    let granting = "[[approvals]]\nserver = \"modern\"\ntools = [\"echoes\"]\ngrants = [\"1h\"]\n";
    let app = spawn_app(&format!("{BOTH_ERAS}{granting}")).await;
    let document = app.get_json("/openapi.json").await;
    let schemas = EventSchemas::of(&document);
    assert_eq!(
        schemas.types(),
        [
            "call.updated",
            "grant.created",
            "grant.revoked",
            "grant.used",
            "request.created",
            "request.resolved",
            "request.updated",
            "resync",
            "session.updated"
        ]
    );
    // From the first event: the shared sessions' `session.updated` are already in the log.
    let mut events = app.events("?lastEventId=0", None).await;

    let confirm = app
        .call("modern", "confirm_action", json!({"action": "validate"}))
        .await;
    let request = app.request_of(&confirm).await;
    app.answer_ok(
        request["id"].as_str().unwrap(),
        json!({"ok": true, "data": {"confirm": true}}),
    )
    .await;
    // A URL-mode Request the upstream reports complete once accepted: `request.updated`.
    let authorize = app.call("legacy", "authorize", json!({"service": "drive"})).await;
    let request = app.request_of(&authorize).await;
    app.answer_ok(request["id"].as_str().unwrap(), json!({"ok": true}))
        .await;
    let session = app.post("/sessions", &json!({"server": "legacy"})).await;
    let session: Value = session.json().await.unwrap();
    app.delete(&format!("/sessions/{}", session["id"].as_str().unwrap()))
        .await;
    // A grant given, used and revoked.
    let held = app.call("modern", "echoes", json!({"text": "x"})).await;
    let request = app.request_of(&held).await;
    let grant = json!({"ok": true, "grant": {"for": "1h", "match": "tool"}});
    app.answer_ok(request["id"].as_str().unwrap(), grant).await;
    app.settled(held["id"].as_str().unwrap()).await;
    let used = app.call("modern", "echoes", json!({"text": "y"})).await;
    let grant = used["allowed"]["grant"].as_str().unwrap();
    assert_eq!(app.delete(&format!("/grants/{grant}")).await.status(), 200);

    let live: BTreeSet<String> = schemas
        .types()
        .into_iter()
        .filter(|name| *name != "resync")
        .map(str::to_owned)
        .collect();
    let mut seen = BTreeSet::new();
    while !live.is_subset(&seen) {
        let event = events.next().await;
        schemas.check(&event);
        seen.insert(event.event);
    }
    let resync = app.events("", Some("999999")).await.next().await;
    assert_eq!(resync.event, "resync");
    schemas.check(&resync);
}

/// The schema `/openapi.json` gives each event type, as the `ServerSentEvent` one-of lists them.
struct EventSchemas {
    document: Value,
    /// Each type's component, by type.
    components: Vec<(String, Value)>,
}

impl EventSchemas {
    fn of(document: &Value) -> Self {
        let content = &document["paths"]["/events"]["get"]["responses"]["200"]["content"]["text/event-stream"];
        let event = resolve(document, &content["schema"]);
        let components = event["oneOf"]
            .as_array()
            .expect("ServerSentEvent is a oneOf")
            .iter()
            .map(|branch| {
                let component = resolve(document, branch);
                let name = component["properties"]["event"]["enum"][0].as_str().unwrap().to_owned();
                (name, component)
            })
            .collect();
        Self {
            document: document.clone(),
            components,
        }
    }

    fn types(&self) -> Vec<&str> {
        let mut types: Vec<&str> = self.components.iter().map(|(name, _)| name.as_str()).collect();
        types.sort_unstable();
        types
    }

    /// Fails the test unless the event, and the JSON in its `data`, match its type's schema.
    fn check(&self, event: &SseEvent) {
        let (_, component) = self
            .components
            .iter()
            .find(|(name, _)| *name == event.event)
            .unwrap_or_else(|| panic!("the document has no schema for {event:?}"));
        let envelope = json!({"event": event.event, "id": event.id, "data": event.data.to_string()});
        self.validate(component, &envelope, event);
        let data = &component["properties"]["data"];
        assert_eq!(data["contentMediaType"], "application/json", "{data}");
        self.validate(&data["contentSchema"], &event.data, event);
    }

    fn validate(&self, schema: &Value, instance: &Value, event: &SseEvent) {
        let mut root = schema.clone();
        root["components"] = self.document["components"].clone();
        let validator = jsonschema::options()
            .with_draft(jsonschema::Draft::Draft202012)
            .should_validate_formats(true)
            .build(&root)
            .unwrap_or_else(|error| panic!("the schema of {} does not compile: {error}", event.event));
        let errors: Vec<String> = validator.iter_errors(instance).map(|error| error.to_string()).collect();
        assert!(
            errors.is_empty(),
            "{} {}: {errors:?}\n{instance}",
            event.event,
            event.id
        );
    }
}

/// The schema a `$ref` into `#/components/schemas/` names, or the schema itself.
fn resolve(document: &Value, schema: &Value) -> Value {
    match schema["$ref"].as_str() {
        Some(pointer) => document
            .pointer(pointer.trim_start_matches('#'))
            .unwrap_or_else(|| panic!("{pointer} is not in the document"))
            .clone(),
        None => schema.clone(),
    }
}

#[tokio::test]
async fn malformed_or_out_of_range_resumption_and_filters_are_problems() {
    let app = spawn_app(BOTH_ERAS).await;
    for query in [
        "?lastEventId=-1",
        "?lastEventId=x",
        "?lastEventId=1.5",
        "?lastEventId=9223372036854775808",
        "?lastEventId=18446744073709551616",
        "?lastEventId=1&lastEventId=2",
        "?server=demo&server=other",
        "?owner=someone",
        "?unknown=1",
    ] {
        assert_problem(&app, query, None).await;
    }
    for header in ["x", "-1", "1.5", "", "9223372036854775808"] {
        assert_problem(&app, "", Some(header)).await;
    }
    // The largest event id is one the stream takes: it is told to relist.
    let mut at_the_edge = app.events("?lastEventId=9223372036854775807", None).await;
    assert_eq!(at_the_edge.next().await.event, "resync");
}

/// Fails the test unless `GET /events` with this query and `Last-Event-ID` is a `400` problem.
async fn assert_problem(app: &TestApp, query: &str, header: Option<&str>) {
    let mut request = app.client.get(format!("{}/events{query}", app.address));
    if let Some(header) = header {
        request = request.header("Last-Event-ID", header);
    }
    let response = request.send().await.unwrap();
    let what = format!("{query} with Last-Event-ID {header:?}");
    assert_eq!(response.status(), 400, "{what}");
    assert_eq!(response.headers()["content-type"], "application/problem+json", "{what}");
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["status"], 400, "{what}");
    assert!(!problem["detail"].as_str().unwrap().is_empty(), "{what}");
}
