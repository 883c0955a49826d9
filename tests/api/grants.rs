//! Standing grants: an approver's "stop asking me for this". Later calls a grant covers run without asking,
//! each naming the grant; others still ask; a grant ends at its time, with its session, or when revoked.

use std::time::Duration;

use serde_json::{Value, json};

use crate::helpers::{Caller, TestApp, spawn_app, token_entry};

/// `echo` on `modern` asks for approval, and may be granted for its session or an hour; `echoes` offers no grant.
fn gated() -> String {
    format!(
        "{}{}{}{}[[servers]]\nname = \"modern\"\nbuiltin = \"demo\"\n\n\
         [[approvals]]\nserver = \"modern\"\ntools = [\"echo\"]\ngrants = [\"session\", \"1h\"]\n\n\
         [[approvals]]\nserver = \"modern\"\ntools = [\"echoes\"]\n",
        token_entry("ci", "agent"),
        token_entry("bot", "agent"),
        token_entry("lead", "approver"),
        token_entry("ops", "admin"),
    )
}

/// Starts `tool` as `name` with `arguments` on `modern`, and waits until it stops running.
async fn call_as(app: &TestApp, name: &str, tool: &str, arguments: Value) -> Value {
    let (status, call) = Caller::new(app, name)
        .post(
            "/calls?wait=20",
            json!({"server": "modern", "tool": tool, "arguments": arguments}),
        )
        .await;
    assert_eq!(status, 201, "{call}");
    call
}

/// The first Request of a call that waits for its approval.
fn approval_of(call: &Value) -> String {
    assert_eq!(call["status"], "input_required", "{call}");
    call["requests"][0].as_str().unwrap().to_owned()
}

/// Answers as `name`: the status and the body.
async fn answer_as(app: &TestApp, name: &str, request: &str, answer: Value) -> (u16, Value) {
    Caller::new(app, name)
        .post(&format!("/requests/{request}/answer?wait=20"), answer)
        .await
}

/// `GET /grants` as `name`.
async fn grants_as(app: &TestApp, name: &str) -> Vec<Value> {
    let (status, grants) = Caller::new(app, name).get("/grants").await;
    assert_eq!(status, 200, "{grants}");
    grants.as_array().unwrap().clone()
}

#[tokio::test]
async fn a_grant_lets_the_next_matching_call_run_and_not_one_with_other_arguments_or_principal() {
    let app = spawn_app(&gated()).await;
    let first = call_as(&app, "ci", "echo", json!({"text": "deploy"})).await;
    let grant = json!({"for": "1h", "match": "same-arguments"});
    let (status, answered) = answer_as(&app, "lead", &approval_of(&first), json!({"ok": true, "grant": grant})).await;
    assert_eq!(status, 200, "{answered}");
    assert_eq!(answered["answer"]["grant"], grant, "the answer records the grant");
    assert_eq!(answered["resumedCall"]["status"], "completed", "{answered}");

    let listed = grants_as(&app, "lead").await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    let id = listed[0]["id"].as_str().unwrap().to_owned();
    assert_eq!(
        (
            &listed[0]["owner"],
            &listed[0]["tool"],
            &listed[0]["match"],
            &listed[0]["for"],
            &listed[0]["by"]
        ),
        (
            &json!("ci"),
            &json!("echo"),
            &json!("same-arguments"),
            &json!("1h"),
            &json!("lead")
        )
    );
    assert_eq!(
        listed[0]["digest"],
        toolnexus_gateway::approvals::digest(&json!({"text": "deploy"}))
    );
    assert_eq!(grants_as(&app, "ci").await.len(), 1, "an agent sees its own");
    assert!(grants_as(&app, "bot").await.is_empty(), "and only its own");

    let again = call_as(&app, "ci", "echo", json!({"text": "deploy"})).await;
    assert_eq!(again["status"], "completed", "{again}");
    assert_eq!(again["requests"], json!([]), "nobody was asked");
    assert_eq!(
        again["allowed"],
        json!({"by": "lead", "request": approval_of(&first), "grant": id})
    );
    assert_eq!(grants_as(&app, "ops").await[0]["uses"], 1);

    let other = call_as(&app, "ci", "echo", json!({"text": "rollback"})).await;
    approval_of(&other);
    let someone_else = call_as(&app, "bot", "echo", json!({"text": "deploy"})).await;
    approval_of(&someone_else);

    // Revoked mid-way: the next call asks again. An agent cannot see another's grant to revoke it.
    let (status, _) = Caller::new(&app, "bot").delete(&format!("/grants/{id}")).await;
    assert_eq!(status, 404);
    let (status, revoked) = Caller::new(&app, "lead").delete(&format!("/grants/{id}")).await;
    assert_eq!((status, &revoked["revokedBy"]), (200, &json!("lead")), "{revoked}");
    assert!(grants_as(&app, "lead").await.is_empty());
    let after = call_as(&app, "ci", "echo", json!({"text": "deploy"})).await;
    approval_of(&after);
}

#[tokio::test]
async fn a_grant_for_a_time_ends_on_the_gateways_clock_and_one_for_a_session_with_it() {
    let app = spawn_app(&gated()).await;
    let first = call_as(&app, "ci", "echo", json!({"text": "a"})).await;
    let hour = json!({"ok": true, "grant": {"for": "1h", "match": "tool"}});
    assert_eq!(answer_as(&app, "lead", &approval_of(&first), hour).await.0, 200);
    let covered = call_as(&app, "ci", "echo", json!({"text": "any text"})).await;
    assert_eq!(
        covered["status"], "completed",
        "a tool grant covers any arguments: {covered}"
    );
    app.advance(Duration::from_secs(3600));
    let expired = call_as(&app, "ci", "echo", json!({"text": "a"})).await;
    let asked = approval_of(&expired);
    assert!(grants_as(&app, "lead").await.is_empty());

    // A session grant covers the calls on the session of the call it was given with, and no other.
    let session = json!({"ok": true, "grant": {"for": "session", "match": "tool"}});
    assert_eq!(answer_as(&app, "lead", &asked, session).await.0, 200);
    let shared = call_as(&app, "ci", "echo", json!({"text": "b"})).await;
    assert_eq!(shared["status"], "completed", "{shared}");
    let (status, private) = Caller::new(&app, "ci")
        .post("/sessions", json!({"server": "modern"}))
        .await;
    assert_eq!(status, 201, "{private}");
    let (status, elsewhere) = Caller::new(&app, "ci")
        .post(
            "/calls?wait=20",
            json!({"session": private["id"], "tool": "echo", "arguments": {"text": "b"}}),
        )
        .await;
    assert_eq!(status, 201, "{elsewhere}");
    approval_of(&elsewhere);
}

#[tokio::test]
async fn a_grant_the_policy_does_not_offer_is_refused_and_nothing_changes() {
    let app = spawn_app(&gated()).await;
    let call = call_as(&app, "ci", "echo", json!({"text": "a"})).await;
    let approval = approval_of(&call);
    for (grant, said) in [
        (
            json!({"for": "8h", "match": "tool"}),
            "offers grants for [\"session\",\"1h\"]",
        ),
        (json!({"for": "2h", "match": "tool"}), "offers grants for"),
    ] {
        let (status, problem) = answer_as(&app, "lead", &approval, json!({"ok": true, "grant": grant})).await;
        assert_eq!(
            (status, &problem["errors"][0]["path"]),
            (422, &json!("/grant")),
            "{problem}"
        );
        let message = problem["errors"][0]["message"].as_str().unwrap();
        assert!(message.contains(said), "{message}");
        assert_eq!(
            problem["detail"], "the answer asks for a standing grant this approval cannot give",
            "{problem}"
        );
    }
    let (status, problem) = answer_as(
        &app,
        "lead",
        &approval,
        json!({"ok": false, "grant": {"for": "1h", "match": "tool"}}),
    )
    .await;
    assert_eq!(status, 400, "{problem}");
    let fixed = call_as(&app, "ci", "echoes", json!({"text": "a"})).await;
    let (status, problem) = answer_as(
        &app,
        "lead",
        &approval_of(&fixed),
        json!({"ok": true, "grant": {"for": "1h", "match": "tool"}}),
    )
    .await;
    assert_eq!(status, 422, "{problem}");
    assert!(grants_as(&app, "lead").await.is_empty());
    let (_, still) = Caller::new(&app, "lead").get(&format!("/requests/{approval}")).await;
    assert_eq!(still["status"], "pending", "{still}");
    let (status, _) = Caller::new(&app, "lead").delete("/grants/grt-nothing").await;
    assert_eq!(status, 404);
}
