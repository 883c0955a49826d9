//! Posted Requests: a toolnexus host posts a §10 Request to `POST /requests`, a person answers it like any
//! other, and the host reads the Answer with `GET /requests/{id}?wait`.

use serde_json::{Value, json};

use crate::helpers::{TestApp, spawn_app, spawn_app_with, spawn_process_in, token_entry};

/// A form with one field.
fn form() -> Value {
    json!({"type": "object", "properties": {"reason": {"type": "string", "minLength": 2}}, "required": ["reason"]})
}

/// Posts a Request and expects `201` with a `Location` naming it; returns the Request.
async fn post_ok(app: &TestApp, body: Value) -> Value {
    let response = app.post("/requests", &body).await;
    let status = response.status();
    let location = response.headers().get("location").cloned();
    let posted: Value = response.json().await.unwrap();
    assert_eq!(status, 201, "POST /requests {body}: {posted}");
    let id = posted["id"].as_str().unwrap();
    assert_eq!(location.unwrap().to_str().unwrap(), format!("/requests/{id}"));
    posted
}

/// Posts a body and returns the status and the paths of the problems listed.
async fn refused(app: &TestApp, body: Value) -> (u16, Vec<String>) {
    let response = app.post("/requests", &body).await;
    let status = response.status().as_u16();
    let problem: Value = response.json().await.unwrap();
    let paths = problem["errors"]
        .as_array()
        .map(|errors| {
            errors
                .iter()
                .map(|error| error["path"].as_str().unwrap().to_owned())
                .collect()
        })
        .unwrap_or_default();
    (status, paths)
}

#[tokio::test]
async fn each_kind_is_posted_listed_answered_and_read_back() {
    let app = spawn_app("").await;
    let questions = json!([{"question": "Which region?", "header": "Region", "options": ["eu", "us"]}]);
    let cases = [
        (
            json!({"kind": "input", "prompt": "Why deploy?", "data": {"schema": form()}}),
            json!({"ok": true, "data": {"reason": "hotfix"}}),
        ),
        (
            json!({"kind": "question", "prompt": "Pick", "data": {"questions": questions}}),
            json!({"ok": true, "data": {"answers": {"Which region?": "eu"}}}),
        ),
        (
            json!({"kind": "authorization", "prompt": "Log in", "url": "https://login.example/start"}),
            json!({"ok": true}),
        ),
        (
            json!({"id": "run-7:approve", "kind": "deploy.approve", "prompt": "Ship it?", "data": {"env": "prod"}}),
            json!({"ok": false, "reason": "declined"}),
        ),
    ];
    let mut events = app.events("", None).await;
    for (body, answer) in cases {
        let posted = post_ok(&app, body.clone()).await;
        let id = posted["id"].as_str().unwrap().to_owned();
        let created = events.next_of("request.created").await;
        assert_eq!(created.data, posted);
        assert_eq!(posted["status"], "pending");
        assert_eq!(posted["kind"], body["kind"]);
        assert_eq!(posted["owner"], "anonymous");
        assert!(
            posted.get("server").is_none() && posted.get("session").is_none(),
            "{posted}"
        );
        assert!(posted["expiresAt"].is_string());
        if let Some(given) = body.get("id") {
            assert_eq!(&id, given);
        } else {
            assert!(id.starts_with("req-"), "{id}");
        }

        let listed = app.get_json("/requests").await;
        assert!(
            listed.as_array().unwrap().iter().any(|request| request["id"] == id),
            "{listed}"
        );

        let waiting = tokio::spawn({
            let (client, url) = (reqwest::Client::new(), format!("{}/requests/{id}?wait=20", app.address));
            async move { client.get(url).send().await.unwrap().json::<Value>().await.unwrap() }
        });
        let answered = app.answer_ok(&id, answer.clone()).await;
        assert_eq!(answered["status"], "answered");
        assert!(answered.get("result").is_none(), "nothing goes upstream: {answered}");

        let resolved = events.next_of("request.resolved").await;
        assert_eq!(resolved.data["id"], id.as_str());
        let read = waiting.await.unwrap();
        assert_eq!(read["status"], "answered", "{read}");
        assert_eq!(read["answer"]["ok"], answer["ok"]);
        assert_eq!(read["answeredBy"], "anonymous");
        if let Some(data) = answer.get("data") {
            assert_eq!(&read["answer"]["data"], data);
        }
    }
}

#[tokio::test]
async fn an_input_answer_is_checked_against_its_schema() {
    let app = spawn_app("").await;
    let posted = post_ok(
        &app,
        json!({"kind": "input", "prompt": "Why?", "data": {"schema": form()}}),
    )
    .await;
    let id = posted["id"].as_str().unwrap();
    let response = app
        .answer(id, json!({"ok": true, "data": {"reason": "x", "extra": 1}}))
        .await;
    assert_eq!(response.status(), 422);
    let problem: Value = response.json().await.unwrap();
    let paths: Vec<&str> = problem["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths.len(), 2, "{problem}");
    assert!(paths.contains(&"/extra"), "{problem}");
}

#[tokio::test]
async fn bad_bodies_list_every_problem() {
    let app = spawn_app("").await;
    let cases = [
        (
            json!({"kind": 7, "extra": true}),
            400,
            vec!["/extra", "/kind", "/prompt"],
        ),
        (json!({"kind": "input", "prompt": "p"}), 422, vec!["/data/schema"]),
        (
            json!({"kind": "input", "prompt": "p", "data": {"schema": {"type": "string"}}}),
            422,
            vec!["/data/schema"],
        ),
        (
            json!({"kind": "input", "prompt": "p", "data": {"schema": {"type": "object", "properties": {
                "user": {"type": "string"}, "password": {"type": "string"}, "pin": {"type": "string", "format": "password"},
            }}}}),
            422,
            vec!["/data/schema/properties/password", "/data/schema/properties/pin"],
        ),
        (
            json!({"kind": "question", "prompt": "p", "data": {"questions": []}}),
            422,
            vec!["/data/questions"],
        ),
        (
            json!({"kind": "question", "prompt": "p", "data": {"questions": [{"options": "a"}, {"question": "q", "multiple": 1}]}}),
            422,
            vec![
                "/data/questions/0/question",
                "/data/questions/0/options",
                "/data/questions/1/multiple",
            ],
        ),
        (json!({"kind": "authorization", "prompt": "p"}), 422, vec!["/url"]),
        (
            json!({"kind": "authorization", "prompt": "p", "url": "javascript:alert(1)"}),
            422,
            vec!["/url"],
        ),
        (
            json!({"kind": "x", "prompt": "p", "expiresAt": "2020-01-01T00:00:00Z"}),
            422,
            vec!["/expiresAt"],
        ),
        (
            json!({"kind": "x", "prompt": "", "id": "a/b"}),
            422,
            vec!["/id", "/prompt"],
        ),
    ];
    for (body, status, paths) in cases {
        let (got, listed) = refused(&app, body.clone()).await;
        assert_eq!(
            (got, listed),
            (status, paths.iter().map(|p| p.to_string()).collect()),
            "{body}"
        );
    }
    let nothing = app.get_json("/requests?status=all").await;
    assert_eq!(nothing, json!([]));
}

#[tokio::test]
async fn a_duplicate_id_is_a_conflict_and_expiry_is_kept() {
    let app = spawn_app("").await;
    let at = "2100-01-01T00:00:00Z";
    let posted = post_ok(&app, json!({"id": "once", "kind": "x", "prompt": "p", "expiresAt": at})).await;
    assert_eq!(posted["expiresAt"], "2100-01-01T00:00:00.000Z");
    let again = app
        .post("/requests", &json!({"id": "once", "kind": "x", "prompt": "p"}))
        .await;
    assert_eq!(again.status(), 409);

    let body = json!({"id": "raced", "kind": "x", "prompt": "p"});
    let racing = (0..8).map(|_| app.post("/requests", &body));
    let mut statuses: Vec<u16> = futures::future::join_all(racing)
        .await
        .iter()
        .map(|response| response.status().as_u16())
        .collect();
    statuses.sort_unstable();
    assert_eq!(statuses, [201, 409, 409, 409, 409, 409, 409, 409]);
}

#[tokio::test]
async fn posted_requests_count_against_max_pending_and_expire() {
    let app = spawn_app_with("", "max_pending = 2\nmax_pending_per_principal = 2\nttl = \"1s\"").await;
    for _ in 0..2 {
        post_ok(&app, json!({"kind": "x", "prompt": "p"})).await;
    }
    let full = app.post("/requests", &json!({"kind": "x", "prompt": "p"})).await;
    assert_eq!(full.status(), 429);
    let expired = app.get_json("/requests?status=expired&wait=10").await;
    assert!(!expired.as_array().unwrap().is_empty(), "{expired}");
    assert!(expired[0].get("result").is_none(), "{expired}");
    assert_eq!(expired[0]["answer"]["reason"], "expired");
}

/// Two agents and an approver, each with its token as its SHA-256.
fn tokens() -> String {
    format!(
        "{}{}{}",
        token_entry("agent-a", "agent"),
        token_entry("agent-b", "agent"),
        token_entry("lead", "approver")
    )
}

/// Sends `request` with `name`'s token; the status and the body.
async fn as_principal(name: &str, request: reqwest::RequestBuilder) -> (u16, Value) {
    let response = request.bearer_auth(format!("{name}-token")).send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn a_posted_request_is_its_posters_and_approvers_may_post() {
    let app = spawn_app(&tokens()).await;
    let client = reqwest::Client::new();
    let url = |path: &str| format!("{}{path}", app.address);
    let body = json!({"kind": "x", "prompt": "p"});

    let (status, posted) = as_principal("agent-a", client.post(url("/requests")).json(&body)).await;
    assert_eq!(status, 201, "{posted}");
    assert_eq!(posted["owner"], "agent-a");
    let id = posted["id"].as_str().unwrap();
    let one = format!("/requests/{id}");

    assert_eq!(as_principal("agent-b", client.get(url(&one))).await.0, 403);
    let (_, listed) = as_principal("agent-b", client.get(url("/requests"))).await;
    assert_eq!(listed, json!([]));
    let answer = json!({"ok": true});
    let (status, _) = as_principal("agent-b", client.post(url(&format!("{one}/answer"))).json(&answer)).await;
    assert_eq!(status, 403);

    let (_, listed) = as_principal("lead", client.get(url("/requests"))).await;
    assert_eq!(listed[0]["id"], id);
    let (status, posted) = as_principal("lead", client.post(url("/requests")).json(&body)).await;
    assert_eq!((status, &posted["owner"]), (201, &json!("lead")));

    let (status, answered) = as_principal("agent-a", client.post(url(&format!("{one}/answer"))).json(&answer)).await;
    assert_eq!(status, 200, "{answered}");
    let (status, read) = as_principal("agent-a", client.get(url(&format!("{one}?wait=5")))).await;
    assert_eq!((status, &read["status"]), (200, &json!("answered")));
    assert_eq!(
        as_principal("agent-a", client.post(url("/requests")).json(&json!({})))
            .await
            .0,
        400
    );
    assert_eq!(
        client.post(url("/requests")).json(&body).send().await.unwrap().status(),
        401
    );
}

#[tokio::test]
async fn a_posted_request_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut app = spawn_process_in(dir.path(), "", "", "").await;
    let body = json!({"kind": "input", "prompt": "Why?", "data": {"schema": form()}});
    let posted = post_ok(&app, body).await;
    let id = posted["id"].as_str().unwrap().to_owned();
    app.kill();

    let app = spawn_process_in(dir.path(), "", "", "").await;
    let kept = app.get_json(&format!("/requests/{id}")).await;
    assert_eq!(kept["status"], "pending", "{kept}");
    assert_eq!(kept["data"], posted["data"]);
    let answered = app
        .answer_ok(&id, json!({"ok": true, "data": {"reason": "restarted"}}))
        .await;
    assert_eq!(answered["answer"]["data"]["reason"], "restarted");
}
