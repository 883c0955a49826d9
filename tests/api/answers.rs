//! Every status `POST /requests/{id}/answer` can return, and the order of its checks.

use std::time::Duration;

use serde_json::{Value, json};

use crate::helpers::{BOTH_ERAS, TestApp, first_request, spawn_app, spawn_app_with};

async fn pending_request(app: &TestApp, tool: &str) -> (String, String) {
    let call = app.call("legacy", tool, json!({"action": "check"})).await;
    (first_request(&call), call["id"].as_str().unwrap().to_owned())
}

async fn raw_answer(app: &TestApp, id: &str, content_type: &str, body: impl Into<reqwest::Body>) -> (u16, Value) {
    let response = app
        .client
        .post(format!("{}/requests/{id}/answer", app.address))
        .header("content-type", content_type)
        .body(body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let content_type = response.headers()["content-type"].to_str().unwrap().to_owned();
    let body: Value = response.json().await.unwrap();
    if status >= 400 {
        assert_eq!(content_type, "application/problem+json", "{body}");
        assert_eq!(body["status"], status, "{body}");
        assert!(
            body["title"].is_string() && body["detail"].is_string() && body["type"].is_string(),
            "{body}"
        );
    }
    (status, body)
}

/// Announces a 2 MiB body, sends a little of it and reads the status line, as a client that streams would.
async fn oversized_answer(app: &TestApp, id: &str) -> String {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let address = app.address.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let head = format!(
        "POST /requests/{id}/answer HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{{",
        2 * 1024 * 1024
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut status = String::new();
    BufReader::new(stream).read_line(&mut status).await.unwrap();
    status.trim_end().to_owned()
}

#[tokio::test]
async fn malformed_answers_are_400_and_leave_the_request_pending() {
    let app = spawn_app(BOTH_ERAS).await;
    let (id, _) = pending_request(&app, "confirm_action").await;
    let cases = [
        "{",
        "[1]",
        "\"ok\"",
        r#"{"ok": "yes"}"#,
        r#"{"data": {}}"#,
        r#"{"ok": false, "reason": "nope"}"#,
        r#"{"ok": true, "reason": "declined"}"#,
        r#"{"ok": true, "data": [1]}"#,
        r#"{"ok": true, "extra": 1}"#,
        r#"{"id": "elc-other", "ok": true}"#,
    ];
    for body in cases {
        let (status, problem) = raw_answer(&app, &id, "application/json", body).await;
        assert_eq!(status, 400, "{body}: {problem}");
    }
    let (_, problem) = raw_answer(&app, &id, "application/json", r#"{"ok": true, "reason": "declined"}"#).await;
    let detail = problem["detail"].as_str().unwrap();
    assert!(detail.ends_with("reason is only allowed when ok is false"), "{detail}");
    assert_eq!(app.get_json(&format!("/requests/{id}")).await["status"], "pending");
    let matching_id = app
        .answer(&id, json!({"id": id, "ok": true, "data": {"confirm": true}}))
        .await;
    assert_eq!(matching_id.status(), 200);
}

#[tokio::test]
async fn a_key_given_twice_is_400_at_any_depth_and_leaves_the_request_pending() {
    let app = spawn_app(BOTH_ERAS).await;
    let (id, _) = pending_request(&app, "confirm_action").await;
    let cases = [
        (r#"{"ok": true, "ok": false}"#, "\"ok\""),
        (r#"{"ok": false, "data": {"confirm": true}, "ok": true}"#, "\"ok\""),
        (
            r#"{"ok": true, "data": {"confirm": true, "confirm": false}}"#,
            "\"confirm\"",
        ),
        (
            r#"{"ok": true, "data": {"confirm": true, "note": "a", "note": "a"}}"#,
            "\"note\"",
        ),
    ];
    for (body, key) in cases {
        let (status, problem) = raw_answer(&app, &id, "application/json", body).await;
        assert_eq!(status, 400, "{body}: {problem}");
        let detail = problem["detail"].as_str().unwrap();
        assert!(
            detail.contains(key) && detail.contains("more than once"),
            "{body}: {detail}"
        );
    }
    assert_eq!(app.get_json(&format!("/requests/{id}")).await["status"], "pending");
    let once = app.answer(&id, json!({"ok": true, "data": {"confirm": true}})).await;
    assert_eq!(once.status(), 200);
}

#[tokio::test]
async fn checks_run_in_order_415_413_400_404() {
    let app = spawn_app(BOTH_ERAS).await;
    let (status, _) = raw_answer(&app, "elc-unknown", "text/plain", "{\"ok\": true}").await;
    assert_eq!(status, 415);
    assert_eq!(
        oversized_answer(&app, "elc-unknown").await,
        "HTTP/1.1 413 Payload Too Large"
    );
    let (status, _) = raw_answer(&app, "elc-unknown", "application/json", "{").await;
    assert_eq!(status, 400);
    let (status, problem) = raw_answer(&app, "elc-unknown", "application/json", "{\"ok\": true}").await;
    assert_eq!(status, 404, "{problem}");
    let missing = app.get("/requests/elc-unknown").await;
    assert_eq!(missing.status(), 404);
}

#[tokio::test]
async fn invalid_data_is_422_listing_every_violation() {
    let app = spawn_app(BOTH_ERAS).await;
    let call = app.call("modern", "collect_profile", json!({})).await;
    let id = app.request_of(&call).await["id"].as_str().unwrap().to_owned();
    let data = json!({"name": "", "email": "nope", "age": 12.5, "score": "high", "newsletter": 1, "color": "pink",
        "tags": ["a", "b", "c"], "nickname": "x"});
    let (status, problem) = raw_answer(
        &app,
        &id,
        "application/json",
        json!({"ok": true, "data": data}).to_string(),
    )
    .await;
    assert_eq!(status, 422, "{problem}");
    let mut paths: Vec<&str> = problem["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    paths.sort();
    assert_eq!(
        paths,
        [
            "/age",
            "/color",
            "/email",
            "/name",
            "/newsletter",
            "/nickname",
            "/score",
            "/tags"
        ]
    );
    assert!(
        problem["errors"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["message"].is_string())
    );

    let (status, problem) = raw_answer(&app, &id, "application/json", r#"{"ok": true, "data": {}}"#).await;
    assert_eq!(status, 422);
    assert_eq!(problem["errors"], json!([{"path": "/name", "message": "is required"}]));
    assert_eq!(app.get_json(&format!("/requests/{id}")).await["status"], "pending");
}

#[tokio::test]
async fn a_second_answer_is_409_unless_it_is_identical() {
    let app = spawn_app(BOTH_ERAS).await;
    let (id, _) = pending_request(&app, "confirm_action").await;
    let first = app.answer_ok(&id, json!({"ok": true, "data": {"confirm": true}})).await;
    let replay = app
        .answer_ok(&id, json!({"ok": true, "data": {"confirm": true, "note": ""}}))
        .await;
    assert_eq!(replay, first, "the replay after defaults is identical");
    let (status, problem) = raw_answer(
        &app,
        &id,
        "application/json",
        json!({"ok": false, "reason": "declined"}).to_string(),
    )
    .await;
    assert_eq!(status, 409, "{problem}");
    let (status, _) = raw_answer(
        &app,
        &id,
        "application/json",
        json!({"ok": true, "data": {"confirm": false}}).to_string(),
    )
    .await;
    assert_eq!(status, 409);
}

#[tokio::test]
async fn answers_to_expired_or_cancelled_requests_are_410() {
    let app = spawn_app_with(BOTH_ERAS, "ttl = \"1h\"").await;
    let (expired, first_call) = pending_request(&app, "confirm_action").await;
    app.advance(Duration::from_secs(3600));
    assert_eq!(
        app.get_json(&format!("/requests/{expired}?wait=20")).await["status"],
        "expired"
    );
    let (status, _) = raw_answer(&app, &expired, "application/json", r#"{"ok": false}"#).await;
    assert_eq!(status, 410);
    // The upstream answers the expired elicitation's call in its own time: until it has, a second call on the
    // shared session would share it with this one, and its elicitation could not be attributed to either.
    assert_eq!(app.settled(&first_call).await["status"], "completed");

    let (cancelled, call) = pending_request(&app, "confirm_action").await;
    assert_eq!(app.delete(&format!("/calls/{call}")).await.status(), 200);
    let (status, _) = raw_answer(&app, &cancelled, "application/json", r#"{"ok": false}"#).await;
    assert_eq!(status, 410);
}

#[tokio::test]
async fn listing_filters_pages_and_long_polls() {
    let app = spawn_app(BOTH_ERAS).await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        let call = app.call("modern", "confirm_action", json!({"action": "list"})).await;
        ids.push(app.request_of(&call).await["id"].as_str().unwrap().to_owned());
    }
    let page = app.get("/requests?limit=2&server=modern").await;
    let link = page.headers()["link"].to_str().unwrap().to_owned();
    let first: Value = page.json().await.unwrap();
    assert_eq!(
        first
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["id"].as_str().unwrap())
            .collect::<Vec<_>>(),
        &ids[..2]
    );
    let next = link.trim_start_matches('<').split('>').next().unwrap();
    assert!(link.ends_with("rel=\"next\""), "{link}");
    let second = app.get_json(next).await;
    assert_eq!(second.as_array().unwrap().len(), 1);
    assert_eq!(second[0]["id"], ids[2].as_str());

    assert_eq!(app.get_json("/requests?server=legacy").await, json!([]));
    assert_eq!(app.get_json("/requests?status=answered").await, json!([]));
    assert_eq!(app.get_json("/requests?kind=authorization").await, json!([]));
    app.answer_ok(&ids[0], json!({"ok": false})).await;
    assert_eq!(
        app.get_json("/requests?status=answered").await[0]["id"],
        ids[0].as_str()
    );
    assert_eq!(app.get_json("/requests?status=all").await.as_array().unwrap().len(), 3);

    let waiting = app.get("/requests?server=legacy&wait=20");
    let (listed, call) = tokio::join!(waiting, app.call("legacy", "confirm_action", json!({"action": "late"})));
    let listed: Value = listed.json().await.unwrap();
    assert_eq!(listed[0]["call"], call["id"]);

    for bad in [
        "/requests?limit=1001",
        "/requests?limit=0",
        "/requests?wait=soon",
        "/requests?status=bogus",
        "/requests?colour=red",
    ] {
        assert_eq!(app.get(bad).await.status(), 400, "{bad}");
    }
}

#[tokio::test]
async fn an_answer_with_wait_returns_the_call_it_resumed_once_it_stops_running() {
    let app = spawn_app(BOTH_ERAS).await;
    for era in ["legacy", "modern"] {
        let call = app.call(era, "two_step", json!({})).await;
        let first = first_request(&call);
        let answer = |id: String, data: Value| {
            let url = format!("{}/requests/{id}/answer?wait=20", app.address);
            let body = json!({"ok": true, "data": data});
            let client = app.client.clone();
            async move {
                let response = client.post(url).json(&body).send().await.unwrap();
                assert_eq!(response.status(), 200);
                response.json::<Value>().await.unwrap()
            }
        };

        // Two exchanges per human answer: the call, then each answer, which returns what the call did next.
        let answered = answer(first.clone(), json!({"name": "Ada"})).await;
        assert_eq!(answered["status"], "answered", "{era}: {answered}");
        assert_eq!(answered["call"], call["id"], "the Request's call stays the id");
        let resumed = &answered["resumedCall"];
        assert_eq!(resumed["status"], "input_required", "{era}: a new Request: {answered}");
        let second = resumed["requests"][1].as_str().unwrap().to_owned();
        assert_ne!(second, first);

        let answered = answer(second, json!({"confirm": true})).await;
        let resumed = &answered["resumedCall"];
        assert_eq!(resumed["status"], "completed", "{era}: {answered}");
        assert_eq!(
            resumed["result"]["structuredContent"]["results"],
            json!([{"action": "accept", "content": {"name": "Ada"}}, {"action": "accept", "content": {"confirm": true}}]),
            "{era}"
        );
    }
    // Without wait the answer is the Request alone, as before.
    let call = app.call("modern", "confirm_action", json!({"action": "plain"})).await;
    let plain = app
        .answer_ok(&first_request(&call), json!({"ok": true, "data": {"confirm": true}}))
        .await;
    assert!(plain.get("resumedCall").is_none(), "{plain}");
}
