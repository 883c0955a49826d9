//! Answer links: a signed URL answers one pending Request, as the one it was made for, from a plain HTML form;
//! opening it answers nothing, and it is worth nothing changed, expired, for another Request or once used.

use std::time::Duration;

use serde_json::{Value, json};

use crate::helpers::{BOTH_ERAS, Caller, TestApp, held_as, spawn_app, spawn_app_with, spawn_in, submit, token_entry};

/// `modern` `echo` needs any approver's yes, `confirm_*` the on-call's, and `flood` two people's.
fn gated() -> String {
    format!(
        "{BOTH_ERAS}{}{}{}{}\
         [[approvals]]\nserver = \"modern\"\ntools = [\"echo\"]\n\
         [[approvals]]\nserver = \"modern\"\ntools = [\"confirm_*\"]\napprovers = [\"on-call\"]\n\
         [[approvals]]\nserver = \"modern\"\ntools = [\"flood\"]\nquorum = 2\n",
        token_entry("agent", "agent"),
        token_entry("lead", "approver"),
        token_entry("on-call", "approver"),
        token_entry("ops", "admin"),
    )
}

/// A link to `request` made by `name`: its status and body.
async fn link_as(app: &TestApp, name: &str, request: &str) -> (u16, Value) {
    Caller::new(app, name)
        .post(&format!("/requests/{request}/links"), json!(null))
        .await
}

async fn link(app: &TestApp, name: &str, request: &str) -> String {
    let (status, made) = link_as(app, name, request).await;
    assert_eq!(status, 201, "{made}");
    made["url"].as_str().unwrap().to_owned()
}

/// `GET url`: the status and the page.
async fn open(url: &str) -> (u16, String) {
    let response = reqwest::get(url).await.unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

async fn request(app: &TestApp, id: &str) -> Value {
    Caller::new(app, "ops").get(&format!("/requests/{id}")).await.1
}

#[tokio::test]
async fn an_approval_is_answered_through_its_link_once_and_opening_it_answers_nothing() {
    let app = spawn_app(&gated()).await;
    let (call, approval) = held_as(&app, "agent", "echo", json!({"text": "<b>hello</b>"})).await;
    // An agent may not make a link to approve its own call, nor get one through a shared Request.
    assert_eq!(link_as(&app, "agent", &approval).await.0, 403);
    let url = link(&app, "lead", &approval).await;
    assert!(url.starts_with(&format!("{}/r/", app.address)), "{url}");

    let response = reqwest::get(&url).await.unwrap();
    assert_eq!(response.status(), 200);
    let headers = response.headers();
    assert_eq!(headers["referrer-policy"], "no-referrer");
    assert_eq!(headers["cache-control"], "no-store");
    assert!(headers["content-type"].to_str().unwrap().starts_with("text/html"));
    let page = response.text().await.unwrap();
    assert!(
        page.contains("&lt;b&gt;hello&lt;/b&gt;") && !page.contains("<b>hello"),
        "{page}"
    );
    assert!(page.contains("name=\"decision\" value=\"approve\""), "{page}");
    assert!(page.contains(request(&app, &approval).await["data"]["digest"].as_str().unwrap()));
    // Opened twice, and fetched with no token at all: nothing is answered.
    assert_eq!(open(&url).await.0, 200);
    assert_eq!(request(&app, &approval).await["status"], "pending");

    // A post from another page (another site that learnt the link) answers nothing.
    let across = reqwest::Client::new()
        .post(&url)
        .header("content-type", "application/x-www-form-urlencoded")
        .header("sec-fetch-site", "cross-site")
        .body("decision=approve")
        .send()
        .await
        .unwrap();
    assert_eq!(across.status(), 403);
    assert_eq!(request(&app, &approval).await["status"], "pending");
    let (status, page) = submit(&url, &[("decision", "approve")]).await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("Thank you, lead"), "{page}");
    let answered = request(&app, &approval).await;
    assert_eq!(answered["status"], "answered");
    assert_eq!(answered["answeredBy"], "lead");
    assert_eq!(answered["answerer"], json!({"name": "lead", "via": "link"}));
    let (_, done) = Caller::new(&app, "agent").get(&format!("/calls/{call}?wait=20")).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["result"]["content"][0]["text"], "<b>hello</b>");

    // Used: the same answer again, or another, changes nothing; the page says it is answered.
    assert_eq!(submit(&url, &[("decision", "approve")]).await.0, 410);
    assert_eq!(submit(&url, &[("decision", "decline")]).await.0, 410);
    // A form that says no decision is refused as such first.
    assert_eq!(submit(&url, &[("decision", "approve*")]).await.0, 400);
    let (status, page) = open(&url).await;
    assert_eq!(status, 200);
    assert!(
        page.contains("answered<bdi> by lead</bdi>") && !page.contains("<form"),
        "{page}"
    );
    // A link for a Request no longer pending is not made.
    assert_eq!(link_as(&app, "lead", &approval).await.0, 410);
}

#[tokio::test]
async fn a_changed_link_or_one_for_another_request_answers_nothing() {
    let app = spawn_app(&gated()).await;
    let (_, first) = held_as(&app, "agent", "echo", json!({"text": "one"})).await;
    let (_, second) = held_as(&app, "agent", "echo", json!({"text": "two"})).await;
    let url = link(&app, "lead", &first).await;
    let (base, token) = url.rsplit_once('/').unwrap();
    let (claims, signature) = token.split_once('.').unwrap();

    // The first link's claims with the second Request's id, under the first's signature.
    use base64::Engine;
    let engine = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let said = String::from_utf8(engine.decode(claims).unwrap()).unwrap();
    assert!(said.contains(&first), "{said}");
    let other = engine.encode(said.replace(&first, &second));
    let mut flipped = signature.as_bytes().to_vec();
    flipped[0] = if flipped[0] == b'A' { b'B' } else { b'A' };
    let flipped = String::from_utf8(flipped).unwrap();
    for forged in [
        format!("{base}/{other}.{signature}"),
        format!("{base}/{claims}.{flipped}"),
        format!("{base}/{claims}"),
        format!("{base}/not-a-link"),
    ] {
        let (status, page) = open(&forged).await;
        assert_eq!(status, 404, "{forged}: {page}");
        assert_eq!(submit(&forged, &[("decision", "approve")]).await.0, 404, "{forged}");
    }
    for id in [&first, &second] {
        assert_eq!(request(&app, id).await["status"], "pending");
    }
    // A form that says no decision answers nothing either.
    assert_eq!(submit(&url, &[("verdict", "yes")]).await.0, 400);
    assert_eq!(request(&app, &first).await["status"], "pending");
}

#[tokio::test]
async fn a_link_past_its_request_s_expiry_answers_nothing() {
    let app = spawn_app_with(&gated(), "ttl = \"10m\"").await;
    let (call, approval) = held_as(&app, "agent", "echo", json!({"text": "late"})).await;
    let url = link(&app, "lead", &approval).await;
    app.advance(Duration::from_secs(601));
    let (status, page) = submit(&url, &[("decision", "approve")]).await;
    assert_eq!(status, 410, "{page}");
    assert!(page.contains("expired"), "{page}");
    let (_, ended) = Caller::new(&app, "agent").get(&format!("/calls/{call}?wait=20")).await;
    assert_eq!(ended["status"], "failed", "the call was not forwarded: {ended}");
}

#[tokio::test]
async fn a_link_answers_under_the_policy_s_rules() {
    let app = spawn_app(&gated()).await;
    // Only the on-call may approve confirm_*: the lead gets no link, the on-call's answers.
    let (_, approval) = held_as(&app, "agent", "confirm_action", json!({"action": "deploy"})).await;
    let (status, problem) = link_as(&app, "lead", &approval).await;
    assert_eq!(status, 403, "{problem}");
    let (status, page) = submit(&link(&app, "on-call", &approval).await, &[("decision", "decline")]).await;
    assert_eq!(status, 200, "{page}");
    let declined = request(&app, &approval).await;
    assert_eq!(
        (declined["answer"]["ok"].as_bool(), declined["answeredBy"].as_str()),
        (Some(false), Some("on-call"))
    );

    // Two people for flood: one link's yes is counted and the Request stays pending until the second.
    let (call, approval) = held_as(&app, "agent", "flood", json!({"count": 0})).await;
    let url = link(&app, "lead", &approval).await;
    let (status, page) = submit(&url, &[("decision", "approve")]).await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("counted"), "{page}");
    let pending = request(&app, &approval).await;
    assert_eq!(pending["status"], "pending");
    assert_eq!(pending["decisions"][0]["by"], "lead");
    let (status, page) = open(&url).await;
    assert_eq!(status, 200);
    assert!(page.contains("1 of 2 approvals (by lead)"), "{page}");
    assert_eq!(
        submit(&url, &[("decision", "approve")]).await.0,
        409,
        "one person counts once"
    );
    let (status, page) = submit(&link(&app, "ops", &approval).await, &[("decision", "approve")]).await;
    assert_eq!(status, 200, "{page}");
    let (_, done) = Caller::new(&app, "agent").get(&format!("/calls/{call}?wait=20")).await;
    assert_eq!(done["status"], "completed", "{done}");
}

#[tokio::test]
async fn an_input_request_is_answered_through_its_link_s_form() {
    let app = spawn_app(&gated()).await;
    let call = Caller::new(&app, "agent")
        .post(
            "/calls?wait=20",
            json!({"server": "modern", "tool": "collect_profile", "arguments": {}}),
        )
        .await
        .1;
    let request_id = call["requests"][0].as_str().unwrap().to_owned();
    // The agent's own call: the agent may answer its Request, so it may make a link for it.
    let url = link(&app, "agent", &request_id).await;
    let (status, page) = open(&url).await;
    assert_eq!(status, 200);
    for control in [
        "name=\"f.name\"",
        "type=\"email\" id=\"f.email\"",
        "<select id=\"f.color\"",
        "type=\"checkbox\" id=\"f.tags.0\" name=\"f.tags\" value=\"a\"",
        "name=\"f.newsletter\" value=\"true\"",
    ] {
        assert!(page.contains(control), "{control} in {page}");
    }
    // What does not fit the form is refused with its violations, and the values entered are kept.
    let (status, page) = submit(
        &url,
        &[
            ("decision", "accept"),
            ("f.name", "Ada"),
            ("f.age", "200"),
            ("f.tags", "a"),
        ],
    )
    .await;
    assert_eq!(status, 422, "{page}");
    assert!(page.contains("/age") && page.contains("value=\"Ada\""), "{page}");
    assert_eq!(request(&app, &request_id).await["status"], "pending");
    let (status, page) = submit(
        &url,
        &[
            ("decision", "accept"),
            ("f.name", "Ada"),
            ("f.email", "ada@example.com"),
            ("f.age", "36"),
            ("f.score", "9.5"),
            ("f.newsletter", "true"),
            ("f.color", "green"),
            ("f.tags", "a"),
            ("f.tags", "c"),
        ],
    )
    .await;
    assert_eq!(status, 200, "{page}");
    let answered = request(&app, &request_id).await;
    assert_eq!(
        answered["answer"]["data"],
        json!({"name": "Ada", "email": "ada@example.com", "age": 36, "score": 9.5, "newsletter": true,
            "color": "green", "tags": ["a", "c"]})
    );
    assert_eq!(answered["answerer"]["via"], "link");
}

#[tokio::test]
async fn links_outlive_a_restart_on_the_key_the_store_keeps() {
    let dir = tempfile::tempdir().unwrap();
    let mut app = spawn_in(dir.path(), "", &gated(), "").await;
    let (_, approval) = held_as(&app, "agent", "echo", json!({"text": "kept"})).await;
    let before = link(&app, "lead", &approval).await;
    app.shut_down();
    drop(app);
    let app = spawn_in(dir.path(), "", &gated(), "").await;
    // The port changed; the token is the same, and the key the store kept still reads it.
    let token = before.rsplit_once('/').unwrap().1;
    let after = format!("{}/r/{token}", app.address);
    assert_eq!(request(&app, &approval).await["status"], "pending");
    assert_eq!(open(&after).await.0, 200);
    let (status, page) = submit(&after, &[("decision", "approve")]).await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(request(&app, &approval).await["answerer"]["via"], "link");
}
