//! Approving with changes: an editable policy's approver may forward the call with other arguments, which must
//! fit the tool's `inputSchema`; the upstream receives exactly them, and the Request and the Call say so.

use std::path::Path;

use serde_json::{Value, json};

use crate::helpers::{BINARY, TestApp, spawn_app};

/// `echo` on a demo server that journals what it receives into `journal`: editable, and `echoes` not.
fn gated(journal: &Path) -> String {
    format!(
        "[[servers]]\nname = \"demo\"\ncommand = \"{BINARY}\"\nargs = [\"demo-server\", \"--journal\", \"{}\"]\n\n\
         [[approvals]]\nserver = \"demo\"\ntools = [\"echo\"]\neditable = true\n\n\
         [[approvals]]\nserver = \"demo\"\ntools = [\"echoes\"]\n",
        journal.display()
    )
}

/// The arguments of each call the demo server received, in order.
fn received(journal: &Path) -> Vec<Value> {
    std::fs::read_to_string(journal)
        .unwrap_or_default()
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .filter(|line| line.get("call").is_some())
        .map(|line| line["arguments"].clone())
        .collect()
}

/// A call of `tool` held for its approval: the call and the approval.
async fn held(app: &TestApp, tool: &str, arguments: Value) -> (String, Value) {
    let call = app.call("demo", tool, arguments).await;
    let approval = app.request_of(&call).await;
    (call["id"].as_str().unwrap().to_owned(), approval)
}

#[tokio::test]
async fn an_edited_approval_forwards_exactly_the_edited_arguments_and_says_who_changed_what() {
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("journal.jsonl");
    let app = spawn_app(&gated(&journal)).await;
    let (call, approval) = held(&app, "echo", json!({"text": "rm -rf /"})).await;
    assert_eq!(approval["data"]["editable"], true, "{approval}");
    assert_eq!(
        approval["data"]["call"]["inputSchema"]["properties"]["text"]["type"],
        "string"
    );
    let id = approval["id"].as_str().unwrap();

    let edited = json!({"text": "ls --dry-run", "note": "extra keys the schema allows"});
    let resolved = app
        .answer_ok(id, json!({"ok": true, "data": {"arguments": edited}}))
        .await;
    let data = &resolved["answer"]["data"];
    assert_eq!(data["arguments"], edited, "{resolved}");
    assert_eq!(data["digest"], toolnexus_gateway::approvals::digest(&edited));
    assert_ne!(data["digest"], approval["data"]["digest"]);
    assert_eq!(
        data["changes"],
        json!([
            {"op": "add", "path": "/note", "value": "extra keys the schema allows"},
            {"op": "replace", "path": "/text", "value": "ls --dry-run"},
        ])
    );

    let done = app.settled(&call).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["result"]["content"][0]["text"], "ls --dry-run");
    assert_eq!(done["arguments"], edited, "the call shows what it ran");
    assert_eq!(
        done["allowed"],
        json!({"by": "anonymous", "request": id, "editedFrom": {"text": "rm -rf /"}})
    );
    assert_eq!(received(&journal), [edited], "the upstream received exactly the edit");
}

#[tokio::test]
async fn edits_that_do_not_fit_or_are_not_allowed_are_refused_and_nothing_is_forwarded() {
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("journal.jsonl");
    let app = spawn_app(&gated(&journal)).await;
    let (call, approval) = held(&app, "echo", json!({"text": "hello"})).await;
    let id = approval["id"].as_str().unwrap();
    for (arguments, path, message) in [
        (json!({"text": 5}), "/arguments/text", "is not of type \"string\""),
        (json!({}), "/arguments/text", "is required"),
        (json!("text"), "/arguments", "must be an object"),
    ] {
        let response = app
            .answer(id, json!({"ok": true, "data": {"arguments": arguments}}))
            .await;
        assert_eq!(response.status(), 422, "{arguments}");
        let problem: Value = response.json().await.unwrap();
        assert_eq!(problem["errors"][0]["path"], path, "{problem}");
        let said = problem["errors"][0]["message"].as_str().unwrap();
        assert!(said.contains(message), "{said}");
        assert_eq!(
            problem["detail"], "the approval's arguments cannot be changed as the answer asks",
            "{problem}"
        );
    }
    let still = app.get_json(&format!("/requests/{id}")).await;
    assert_eq!(still["status"], "pending", "{still}");

    // Without `editable`, arguments in an approval's answer are refused.
    let (other, fixed) = held(&app, "echoes", json!({"text": "hello"})).await;
    assert!(fixed["data"].get("editable").is_none(), "{fixed}");
    let fixed = fixed["id"].as_str().unwrap();
    let response = app
        .answer(fixed, json!({"ok": true, "data": {"arguments": {"text": "bye"}}}))
        .await;
    assert_eq!(response.status(), 422);
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["errors"][0]["path"], "/arguments", "{problem}");
    assert!(
        problem["errors"][0]["message"].as_str().unwrap().contains("editable"),
        "{problem}"
    );
    assert!(received(&journal).is_empty(), "nothing was forwarded");

    // Approved as asked: the same arguments sent back are no edit.
    app.answer_ok(id, json!({"ok": true, "data": {"arguments": {"text": "hello"}}}))
        .await;
    let done = app.settled(&call).await;
    assert_eq!(done["allowed"], json!({"by": "anonymous", "request": id}), "{done}");
    app.answer_ok(fixed, json!({"ok": true})).await;
    let done = app.settled(&other).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(received(&journal), [json!({"text": "hello"}), json!({"text": "hello"})]);
}

#[tokio::test]
async fn an_edited_answer_sent_again_is_the_same_answer_and_no_answer_writes_the_edit_record() {
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("journal.jsonl");
    let app = spawn_app(&gated(&journal)).await;
    let (_, approval) = held(&app, "echo", json!({"text": "a"})).await;
    let id = approval["id"].as_str().unwrap();
    let edit = json!({"ok": true, "data": {"arguments": {"text": "b"}}});
    let first = app.answer_ok(id, edit.clone()).await;
    let again = app.answer_ok(id, edit).await;
    assert_eq!(
        again["answer"], first["answer"],
        "a retry is answered 200, as the first was"
    );

    // An approval answered without a change keeps no record of one, whatever the answer claims.
    let (call, approval) = held(&app, "echo", json!({"text": "c"})).await;
    let id = approval["id"].as_str().unwrap();
    let claim = json!({"changes": [{"op": "replace", "path": "/text", "value": "safe"}], "digest": "0"});
    let answered = app.answer_ok(id, json!({"ok": true, "data": claim})).await;
    assert_eq!(answered["answer"]["data"], json!({}), "{answered}");
    let done = app.settled(&call).await;
    assert_eq!(done["arguments"], json!({"text": "c"}));
}
