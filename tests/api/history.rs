//! `GET /requests` lists resolved Requests by who answered them, what was decided, and the tool whose call
//! raised them.

use serde_json::{Value, json};

use crate::helpers::{BOTH_ERAS, Caller, TestApp, held_as, spawn_app, token_entry};

/// An agent and two approvers; `modern` calls of `echo` need an approval.
fn team() -> String {
    format!(
        "{BOTH_ERAS}{}{}{}[[approvals]]\nserver = \"modern\"\ntools = [\"echo\"]\n",
        token_entry("agent", "agent"),
        token_entry("lead", "approver"),
        token_entry("bo", "approver"),
    )
}

/// The Requests of a gateway answered in every way, in the order raised: an `echo` approval the lead approved,
/// one bo declined, a `confirm_action` elicitation bo cancelled, a posted Request the lead refused without a
/// reason, and an `echo` approval still pending.
async fn answered_in_every_way() -> (TestApp, [String; 5]) {
    let app = spawn_app(&team()).await;
    let answer = async |name: &str, request: &str, answer: Value| {
        let (status, body) = Caller::new(&app, name)
            .post(&format!("/requests/{request}/answer"), answer)
            .await;
        assert_eq!(status, 200, "{body}");
    };
    let (_, approved) = held_as(&app, "agent", "echo", json!({"text": "yes"})).await;
    answer("lead", &approved, json!({"ok": true})).await;
    let (_, declined) = held_as(&app, "agent", "echo", json!({"text": "no"})).await;
    answer("bo", &declined, json!({"ok": false, "reason": "declined"})).await;
    let (_, cancelled) = held_as(&app, "agent", "confirm_action", json!({"action": "x"})).await;
    answer("bo", &cancelled, json!({"ok": false, "reason": "cancelled"})).await;
    let (status, posted) = Caller::new(&app, "agent")
        .post("/requests", json!({"kind": "input.note", "prompt": "Anything?"}))
        .await;
    assert_eq!(status, 201, "{posted}");
    let posted = posted["id"].as_str().unwrap().to_owned();
    answer("lead", &posted, json!({"ok": false})).await;
    let (_, pending) = held_as(&app, "agent", "echo", json!({"text": "later"})).await;
    (app, [approved, declined, cancelled, posted, pending])
}

/// The ids `query` lists, as the lead sees them.
async fn listed(app: &TestApp, query: &str) -> Vec<String> {
    let (status, page) = Caller::new(app, "lead").get(&format!("/requests?{query}")).await;
    assert_eq!(status, 200, "{query}: {page}");
    let ids = page
        .as_array()
        .unwrap()
        .iter()
        .map(|request| request["id"].as_str().unwrap());
    ids.map(str::to_owned).collect()
}

#[tokio::test]
async fn requests_are_listed_by_who_answered_them() {
    let (app, [approved, declined, cancelled, posted, _]) = answered_in_every_way().await;

    assert_eq!(
        listed(&app, "status=all&answeredBy=lead").await,
        [approved.as_str(), posted.as_str()]
    );
    assert_eq!(
        listed(&app, "status=answered&answeredBy=bo").await,
        [declined.as_str(), cancelled.as_str()]
    );
    assert_eq!(
        listed(&app, "answeredBy=lead").await,
        [approved.as_str(), posted.as_str()],
        "answered by default"
    );
    assert!(
        listed(&app, "status=pending&answeredBy=lead").await.is_empty(),
        "none pending is answered yet"
    );
    assert!(
        listed(&app, "status=all&answeredBy=le").await.is_empty(),
        "the whole name"
    );
    assert!(listed(&app, "status=all&answeredBy=agent").await.is_empty());
    let (status, problem) = Caller::new(&app, "lead").get("/requests?answered_by=lead").await;
    assert_eq!(status, 400, "{problem}");
}

#[tokio::test]
async fn requests_are_listed_by_what_was_decided() {
    let (app, [approved, declined, cancelled, posted, _]) = answered_in_every_way().await;

    assert_eq!(listed(&app, "status=all&decision=accepted").await, [approved.as_str()]);
    assert_eq!(listed(&app, "status=all&decision=declined").await, [declined.as_str()]);
    assert_eq!(
        listed(&app, "decision=declined").await,
        [declined.as_str()],
        "answered by default"
    );
    assert_eq!(
        listed(&app, "status=answered&decision=cancelled").await,
        [cancelled.as_str(), posted.as_str()]
    );
    assert_eq!(
        listed(&app, "status=all&decision=cancelled&answeredBy=lead").await,
        [posted.as_str()]
    );
    assert!(listed(&app, "status=expired&decision=declined").await.is_empty());
    for bad in [
        "decision=approved",
        "decision=expired",
        "decision=Accepted",
        "decision=",
    ] {
        let (status, problem) = Caller::new(&app, "lead")
            .get(&format!("/requests?status=all&{bad}"))
            .await;
        assert_eq!(status, 400, "{bad}: {problem}");
        assert_eq!(problem["status"], 400, "{problem}");
    }
}

#[tokio::test]
async fn requests_are_listed_by_the_tool_whose_call_raised_them() {
    let (app, [approved, declined, cancelled, _, pending]) = answered_in_every_way().await;

    assert_eq!(
        listed(&app, "status=all&tool=echo").await,
        [approved.as_str(), declined.as_str(), pending.as_str()]
    );
    assert_eq!(listed(&app, "tool=echo").await, [pending.as_str()]);
    assert_eq!(
        listed(&app, "status=all&tool=confirm_action").await,
        [cancelled.as_str()]
    );
    assert_eq!(
        listed(&app, "status=all&tool=echo&decision=declined").await,
        [declined.as_str()]
    );
    assert!(listed(&app, "status=all&tool=ech").await.is_empty(), "the whole name");
    assert!(listed(&app, "status=all&tool=echo&server=legacy").await.is_empty());
    // An agent lists only its own Requests, by tool as by anything else.
    let (status, own) = Caller::new(&app, "agent").get("/requests?status=all&tool=echo").await;
    assert_eq!(status, 200, "{own}");
    assert_eq!(own.as_array().unwrap().len(), 3, "{own}");
}
