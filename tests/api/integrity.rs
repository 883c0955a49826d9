//! Approval integrity: who may answer is decided once, so every door — REST, `/mcp` in both eras and both
//! modes, `tasks/update` — refuses the same answers, and an approval runs only on an allowed person's yes.

use rmcp::ServiceError;
use rmcp::model::{CallToolRequestParams, GetTaskParams, ProtocolVersion, TaskPayload, UpdateTaskParams};
use serde_json::{Value, json};

use crate::front_door::{
    CLIENT_ERAS, Confirming, Tasking, call_as, connect_as, params, spawn_front_door, text, waiting_call,
};
use crate::helpers::{BOTH_ERAS, Caller, TestApp, first_request, token_entry};

/// `modern` `echo` needs any approver's yes, `confirm_*` the on-call's.
const POLICIES: &str = "[[approvals]]\nserver = \"modern\"\ntools = [\"echo\"]\n\n\
    [[approvals]]\nserver = \"modern\"\ntools = [\"confirm_*\"]\napprovers = [\"on-call\"]\n";

/// Two agents, an approver, the on-call approver and an admin; the front door in `mode`, holding a call 1 s.
async fn spawn_gated(mode: &str) -> TestApp {
    let settings = format!(
        "[front_door]\nmax_hold = \"1s\"\nelicitation = \"{mode}\"\n{}{}{}{}{}",
        token_entry("agent", "agent"),
        token_entry("agent-b", "agent"),
        token_entry("lead", "approver"),
        token_entry("on-call", "approver"),
        token_entry("ops", "admin"),
    );
    spawn_front_door(&format!("{BOTH_ERAS}{POLICIES}"), &settings).await
}

/// A `tools/call` that answers the Requests of `call` as a 2026-07-28 retry does.
fn retry(call: &str, answers: &[(&str, Value)]) -> CallToolRequestParams {
    let mut retry = params("modern__echo", json!({}));
    retry.request_state = Some(call.to_owned());
    retry.input_responses = Some(
        answers
            .iter()
            .map(|(id, answer)| ((*id).to_owned(), answer.clone()))
            .collect(),
    );
    retry
}

fn accept() -> Value {
    json!({"action": "accept", "content": {}})
}

/// Answers `request` of `call` as the principal of `token` through both `/mcp` doors in `era`: a `tools/call`
/// retry, and `tasks/update` from a client of the tasks extension; each must be refused saying `why`.
pub(crate) async fn refused_through_mcp(
    app: &TestApp,
    token: &str,
    era: &ProtocolVersion,
    call: &str,
    request: &str,
    why: &str,
) {
    let client = connect_as(app, era, Some(token), Confirming::default()).await;
    let error = client.call_tool(retry(call, &[(request, accept())])).await.unwrap_err();
    assert!(refusal(&error).contains(why), "tools/call retry: {error}");
    client.cancel().await.unwrap();
    let tasking = connect_as(app, era, Some(token), Tasking { elicits: true }).await;
    let task = tasking.peer().get_task(GetTaskParams::new(call)).await.unwrap().task;
    assert!(
        !matches!(task.payload, TaskPayload::InputRequired { .. }),
        "an approval is never a task's input: {task:?}"
    );
    let update = UpdateTaskParams::new(call, [(request.to_owned(), accept())].into());
    let error = tasking.peer().update_task(update).await.unwrap_err();
    assert!(refusal(&error).contains(why), "tasks/update: {error}");
    tasking.cancel().await.unwrap();
}

fn refusal(error: &ServiceError) -> String {
    match error {
        ServiceError::McpError(error) => error.message.to_string(),
        other => panic!("not a JSON-RPC error: {other}"),
    }
}

/// The pending Request of `call`, as an approver lists it.
pub(crate) async fn pending_of(lead: &Caller, call: &str) -> Value {
    let (status, listed) = lead.get(&format!("/requests?call={call}&wait=30")).await;
    assert_eq!(status, 200, "{listed}");
    listed[0].clone()
}

/// `request` is still pending and its call waits on it: nothing was taken, nothing forwarded.
pub(crate) async fn untouched(lead: &Caller, request: &str, call: &str) {
    let (_, approval) = lead.get(&format!("/requests/{request}")).await;
    assert_eq!(approval["status"], "pending", "{approval}");
    let (_, held) = lead.get(&format!("/calls/{call}")).await;
    assert_eq!(held["status"], "input_required", "{held}");
    assert_eq!(held["requests"], json!([request]), "nothing went upstream: {held}");
}

#[tokio::test]
async fn no_agent_or_admin_approves_its_own_call_through_any_door_in_either_era_or_mode() {
    for mode in ["rest", "relay"] {
        let app = spawn_gated(mode).await;
        let lead = Caller::new(&app, "lead");
        for era in CLIENT_ERAS {
            for starter in ["agent", "ops"] {
                let case = format!("{mode}, {era:?}, {starter}");
                let asked = Confirming::default();
                let token = format!("{starter}-token");
                let client = connect_as(&app, &era, Some(&token), asked.clone()).await;
                let held = call_as(&client, "modern__echo", json!({"text": case})).await;
                let call = waiting_call(&held)["id"].as_str().unwrap().to_owned();
                let approval = pending_of(&lead, &call).await;
                assert_eq!(approval["kind"], "approval", "{case}: {approval}");
                let request = approval["id"].as_str().unwrap();
                assert!(
                    asked.asked.lock().unwrap().is_empty(),
                    "{case}: an approval is never put to the client whose call it holds"
                );

                refused_through_mcp(&app, &token, &era, &call, request, "may not approve").await;
                let (status, problem) = Caller::new(&app, starter)
                    .post(&format!("/requests/{request}/answer"), json!({"ok": true}))
                    .await;
                assert_eq!(status, 403, "{case}: {problem}");
                assert!(
                    problem["detail"].as_str().unwrap().contains("may not approve"),
                    "{problem}"
                );
                untouched(&lead, request, &call).await;

                let (status, approved) = lead
                    .post(&format!("/requests/{request}/answer"), json!({"ok": true}))
                    .await;
                assert_eq!((status, &approved["answeredBy"]), (200, &json!("lead")), "{case}");
                let done = call_as(&client, "gateway__await_call", json!({"call": call})).await;
                assert_eq!(text(&done), case);
                let (_, ended) = lead.get(&format!("/calls/{call}")).await;
                assert_eq!(ended["requests"], json!([request]), "{case}: forwarded once: {ended}");
                client.cancel().await.unwrap();
            }
        }
    }
}

#[tokio::test]
async fn an_approval_listing_its_approvers_is_refused_to_everyone_else_at_every_door() {
    let app = spawn_gated("rest").await;
    let (agent, ops, on_call) = (
        Caller::new(&app, "agent"),
        Caller::new(&app, "ops"),
        Caller::new(&app, "on-call"),
    );
    // Started over REST: the front door's answers are refused all the same.
    let (status, call) = agent
        .post(
            "/calls?wait=20",
            json!({"server": "modern", "tool": "confirm_action", "arguments": {"action": "page"}}),
        )
        .await;
    assert_eq!((status, &call["status"]), (201, &json!("input_required")), "{call}");
    let (id, request) = (call["id"].as_str().unwrap().to_owned(), first_request(&call));
    for (who, why) in [("agent", "may not approve"), ("ops", "not among the approvers")] {
        for era in CLIENT_ERAS {
            refused_through_mcp(&app, &format!("{who}-token"), &era, &id, &request, why).await;
        }
    }
    assert_eq!(
        ops.post(&format!("/requests/{request}/answer"), json!({"ok": true}))
            .await
            .0,
        403
    );
    untouched(&Caller::new(&app, "lead"), &request, &id).await;

    // The on-call approves; what the upstream then asks of the agent's own call is the agent's to answer.
    let (status, _) = on_call
        .post(&format!("/requests/{request}/answer"), json!({"ok": true}))
        .await;
    assert_eq!(status, 200);
    let asked = pending_of(&Caller::new(&app, "lead"), &id).await;
    assert_eq!(asked["kind"], "input", "{asked}");
    let client = connect_as(
        &app,
        &ProtocolVersion::V_2026_07_28,
        Some("agent-token"),
        Confirming::default(),
    )
    .await;
    let confirmed = json!({"action": "accept", "content": {"confirm": true}});
    let done = client
        .call_tool(retry(&id, &[(asked["id"].as_str().unwrap(), confirmed)]))
        .await
        .unwrap();
    assert_eq!(
        done.structured_content.unwrap()["results"][0]["action"],
        "accept",
        "the agent's answer reached the tool"
    );
    let (_, answered) = agent.get(&format!("/requests/{}", asked["id"].as_str().unwrap())).await;
    assert_eq!(answered["answeredBy"], "agent");
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn an_agent_answers_no_owner_less_request_of_a_shared_session_through_mcp() {
    let app = spawn_gated("rest").await;
    let (agent, other, lead) = (
        Caller::new(&app, "agent"),
        Caller::new(&app, "agent-b"),
        Caller::new(&app, "lead"),
    );
    // Once another principal's work has run on the shared stdio session, its elicitations are nobody's.
    let (status, _) = other
        .post(
            "/calls?wait=20",
            json!({"server": "legacy", "tool": "echo", "arguments": {"text": "b"}}),
        )
        .await;
    assert_eq!(status, 201);
    let (status, call) = agent
        .post(
            "/calls?wait=20",
            json!({"server": "legacy", "tool": "confirm_action", "arguments": {"action": "x"}}),
        )
        .await;
    assert_eq!((status, &call["status"]), (201, &json!("input_required")), "{call}");
    let (id, request) = (call["id"].as_str().unwrap().to_owned(), first_request(&call));
    assert_eq!(lead.get(&format!("/requests/{request}")).await.1["owner"], Value::Null);

    let client = connect_as(
        &app,
        &ProtocolVersion::V_2026_07_28,
        Some("agent-token"),
        Confirming::default(),
    )
    .await;
    let confirmed = json!({"action": "accept", "content": {"confirm": true}});
    let error = client
        .call_tool(retry(&id, &[(&request, confirmed)]))
        .await
        .unwrap_err();
    assert!(refusal(&error).contains("belongs to another principal"), "{error}");
    assert_eq!(lead.get(&format!("/requests/{request}")).await.1["status"], "pending");
    client.cancel().await.unwrap();
}
