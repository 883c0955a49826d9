//! `wait`: every long-poll takes it alike, and a wait over the 300 s cap is held for the cap, not refused.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use crate::helpers::{BOTH_ERAS, confirming, spawn_app};

/// Seconds over the cap, so far over that they do not fit a 64-bit float.
const OVER_THE_CAP: &str = "1e400";

/// Every route with `wait`, as `METHOD path`.
const LONG_POLLS: [&str; 7] = [
    "GET /calls/{id}",
    "GET /readyz",
    "GET /requests",
    "GET /requests/{id}",
    "GET /servers/{name}",
    "POST /calls",
    "POST /requests/{id}/answer",
];

#[tokio::test]
async fn every_wait_is_documented_alike_with_its_cap_and_no_maximum() {
    let app = spawn_app(BOTH_ERAS).await;
    let document = app.get_json("/openapi.json").await;
    let waits = documented_waits(&document);
    let routes: BTreeSet<&str> = waits.iter().map(|(route, _)| route.as_str()).collect();
    assert_eq!(routes, BTreeSet::from(LONG_POLLS));
    for (route, parameter) in &waits {
        assert_eq!(parameter["required"], false, "{route}");
        let schema = &parameter["schema"];
        assert_eq!(schema["type"], "number", "{route}: {schema}");
        assert_eq!(schema["minimum"], 0, "{route}: {schema}");
        // Over the cap is taken (and held for the cap): a `maximum` would call it invalid.
        assert!(schema.get("maximum").is_none(), "{route}: {schema}");
        let description = parameter["description"].as_str().unwrap();
        assert!(
            description.contains("a value over 300 counts as 300"),
            "{route}: {description}"
        );
    }
}

#[tokio::test]
async fn a_wait_over_the_cap_is_taken_by_every_long_poll() {
    let app = spawn_app(BOTH_ERAS).await;
    // Each route is asked about what already holds, so it answers at once whatever the wait.
    let echo = json!({"server": "modern", "tool": "echo", "arguments": {"text": "capped"}});
    let started = app.post(&format!("/calls?wait={OVER_THE_CAP}"), &echo).await;
    assert_eq!(started.status(), 201);
    let call: Value = started.json().await.unwrap();
    assert_eq!(call["status"], "completed", "{call}");
    let confirm = app.call("modern", "confirm_action", json!({"action": "cap"})).await;
    let request = app.request_of(&confirm).await;
    let id = request["id"].as_str().unwrap();
    let answer = json!({"ok": true, "data": {"confirm": true}});
    let answered = app
        .post(&format!("/requests/{id}/answer?wait={OVER_THE_CAP}"), &answer)
        .await;
    assert_eq!(answered.status(), 200);
    let answered: Value = answered.json().await.unwrap();
    assert_eq!(answered["resumedCall"]["status"], "completed", "{answered}");

    for path in [
        format!("/calls/{}?", call["id"].as_str().unwrap()),
        "/readyz?".to_owned(),
        "/requests?status=answered&".to_owned(),
        format!("/requests/{id}?"),
        "/servers/modern?".to_owned(),
    ] {
        let response = app.get(&format!("{path}wait={OVER_THE_CAP}")).await;
        assert_eq!(response.status(), 200, "{path}");
    }
}

#[tokio::test]
async fn a_wait_that_is_not_a_duration_is_a_problem_on_every_long_poll() {
    let app = spawn_app(BOTH_ERAS).await;
    let document = app.get_json("/openapi.json").await;
    for (route, _) in documented_waits(&document) {
        let (method, path) = route.split_once(' ').unwrap();
        let path = path.replace("{id}", "x").replace("{name}", "modern");
        for wait in ["-1", "-0.5", "-inf", "x", "NaN", ""] {
            let url = format!("{}{path}?wait={wait}", app.address);
            let request = match method {
                "GET" => app.client.get(&url),
                _ => app.client.post(&url).json(&json!({})),
            };
            let response = request.send().await.unwrap();
            assert_eq!(response.status(), 400, "{route} wait={wait}");
            assert_eq!(response.headers()["content-type"], "application/problem+json");
        }
    }
}

/// Each documented `wait` parameter, by `METHOD path`.
fn documented_waits(document: &Value) -> Vec<(String, Value)> {
    let mut waits = Vec::new();
    for (path, item) in document["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            let parameters = operation["parameters"].as_array().into_iter().flatten();
            for parameter in parameters.filter(|parameter| parameter["name"] == "wait") {
                waits.push((format!("{} {path}", method.to_uppercase()), parameter.clone()));
            }
        }
    }
    waits
}

/// A wait that ends on the `call.updated` that made its call final answers with the call that event carries, in
/// place of reading it again: byte for byte what a read of the call gives, whichever route waited.
#[tokio::test]
async fn a_call_a_wait_saw_end_is_the_call_a_read_gives() {
    let app = spawn_app(BOTH_ERAS).await;
    for era in ["legacy", "modern"] {
        let body = json!({"server": era, "tool": "echo", "arguments": {"text": "hello"}});
        let started = app.post("/calls?wait=20", &body).await;
        assert_eq!(started.status(), 201);
        let started = started.text().await.unwrap();
        let id = serde_json::from_str::<Value>(&started).unwrap()["id"]
            .as_str()
            .unwrap()
            .to_owned();
        let read = app.get(&format!("/calls/{id}")).await.text().await.unwrap();
        assert!(read.contains(r#""status":"completed""#), "{read}");
        assert_eq!(started, read, "{era}: POST /calls?wait");

        let confirm = json!({"server": era, "tool": "confirm_action", "arguments": {"action": "deploy"}});
        let call = app.call_on(confirm.clone()).await;
        let (id, request) = (call["id"].as_str().unwrap(), call["requests"][0].as_str().unwrap());
        let answered = app
            .post(&format!("/requests/{request}/answer?wait=20"), &confirming(""))
            .await;
        assert_eq!(answered.status(), 200);
        let resumed = answered.json::<Value>().await.unwrap()["resumedCall"].clone();
        let read = app.get(&format!("/calls/{id}")).await.text().await.unwrap();
        assert!(read.contains(r#""status":"completed""#), "{read}");
        assert_eq!(
            resumed,
            serde_json::from_str::<Value>(&read).unwrap(),
            "{era}: answer?wait"
        );

        let call = app.call_on(confirm).await;
        let (id, request) = (call["id"].as_str().unwrap(), call["requests"][0].as_str().unwrap());
        app.answer_ok(request, confirming("")).await;
        let waited = app.get(&format!("/calls/{id}?wait=20")).await.text().await.unwrap();
        let read = app.get(&format!("/calls/{id}")).await.text().await.unwrap();
        assert!(read.contains(r#""status":"completed""#), "{read}");
        assert_eq!(waited, read, "{era}: GET /calls/{{id}}?wait");
    }
}
