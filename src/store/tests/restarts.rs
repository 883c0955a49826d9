//! What a restart finds and keeps: Requests, rounds, approvals and the calls they hold, and databases written
//! by an earlier schema.

use super::*;

#[tokio::test]
async fn a_posted_request_is_not_ended_by_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    for location in durable(&dir) {
        let store = open(&location).await;
        let posted = store
            .raise(vec![posted_request("ada")], None, PendingCaps::NONE)
            .await
            .unwrap();
        close(store).await;
        let store = open(&location).await;
        let recovered = store.recover("the gateway restarted").await.unwrap();
        assert_eq!((recovered.ended_requests, recovered.pending), (0, 1));
        let kept = store.request(&posted[0].request.id).await.unwrap().unwrap();
        assert_eq!((kept.status, kept.server), (Status::Pending, None));
        store.resolve(Pending::Elicitations, Resolution::Expired).await.unwrap();
        let kept = store.request(&posted[0].request.id).await.unwrap().unwrap();
        assert_eq!(kept.status, Status::Pending);
        close(store).await;
    }
}

/// The approval of `call`, raised as the gateway raises one: on no session.
fn approval_of(call: &CallId) -> NewRequest {
    let mut request = new_request(Some(call), None);
    request.request.kind = RequestKind::Approval;
    request.session = None;
    request
}

/// Whether `call` is claimed for sending, as approved with the arguments it was started with.
async fn forwarded(store: &Store, call: &CallId) -> bool {
    let view = store.call(call).await.unwrap().unwrap();
    let allowed = Allowed {
        by: "lead".into(),
        request: view.requests[0].clone(),
        grant: None,
        edited_from: None,
    };
    store.forwarding(call, &allowed, &view.arguments).await.unwrap()
}

#[tokio::test]
async fn an_approved_call_is_claimed_for_sending_once() {
    on_every(|store| async move {
        let call = insert(&store, new_call("ada")).await;
        let raised = store
            .raise(vec![approval_of(&call.id)], None, PendingCaps::NONE)
            .await
            .unwrap();
        let edited = Arguments::of(json!({"text": "edited"}).as_object().unwrap());
        let allowed = Allowed {
            by: "lead".into(),
            request: raised[0].request.id.clone(),
            grant: None,
            edited_from: Some(call.arguments.clone()),
        };
        let forwarding = || store.forwarding(&call.id, &allowed, &edited);
        assert!(!forwarding().await.unwrap(), "not while it waits");
        store.resolve(Pending::Elicitations, Resolution::Expired).await.unwrap();
        assert_eq!(
            store.request(&raised[0].request.id).await.unwrap().unwrap().status,
            Status::Pending,
            "an approval is not an elicitation"
        );
        let answered = store.answer(&raised[0].request.id, proposal(true)).await;
        assert!(matches!(answered.unwrap(), Answered::Won { .. }));
        assert!(forwarding().await.unwrap());
        assert!(!forwarding().await.unwrap(), "sent once");
        let forwarded = store.call(&call.id).await.unwrap().unwrap();
        assert_eq!(
            (forwarded.allowed.as_deref(), &forwarded.arguments),
            (Some(&allowed), &edited),
            "it shows who allowed it and what it runs"
        );
    })
    .await;
}

#[tokio::test]
async fn a_restart_hands_over_the_calls_approvals_hold_until_they_are_known_sent() {
    let dir = tempfile::tempdir().unwrap();
    for location in durable(&dir) {
        let store = open(&location).await;
        let mut approvals = Vec::new();
        let mut calls = Vec::new();
        for protocol in ["2026-07-28", "2026-07-28", "2026-07-28", "2025-11-25", "2025-11-25"] {
            let call = NewCall {
                protocol_version: Some(protocol.into()),
                ..new_call("ada")
            };
            let call = insert(&store, call).await;
            let raised = store
                .raise(vec![approval_of(&call.id)], None, PendingCaps::NONE)
                .await
                .unwrap();
            approvals.push(raised[0].clone());
            calls.push(call.id);
        }
        // One waits; one is approved but not claimed for sending; the others were claimed, and only the last
        // upstream showed it had its call (an elicitation of it).
        for approval in &approvals[1..] {
            store.answer(&approval.request.id, proposal(true)).await.unwrap();
        }
        for call in &calls[2..] {
            assert!(forwarded(&store, call).await);
        }
        store
            .raise(vec![new_request(Some(&calls[4]), None)], None, PendingCaps::NONE)
            .await
            .unwrap();
        close(store).await;

        let store = open(&location).await;
        let recovered = store.recover("the gateway restarted").await.unwrap();
        let held = |at: usize| HeldCall {
            call: calls[at].clone(),
            approval: approvals[at].request.id.clone(),
        };
        // A 2026-07-28 call that may not have been sent is sent again: at least once.
        assert_eq!(recovered.approvals, [held(0), held(1), held(2)]);
        assert!(forwarded(&store, &calls[2]).await, "claimed again once handed over");
        assert_eq!(recovered.ended_calls, 2);
        let pending = store.request(&approvals[0].request.id).await.unwrap().unwrap();
        assert_eq!(pending.status, Status::Pending);
        let reason = |view: Option<crate::records::CallView>| view.unwrap().error.unwrap().reason;
        assert_eq!(
            reason(store.call(&calls[3]).await.unwrap()),
            Some(crate::records::CallFailure::MaybeNotSent),
            "a 2025-11-25 call is not sent twice, nor said to have been worked on"
        );
        assert_eq!(
            reason(store.call(&calls[4]).await.unwrap()),
            Some(crate::records::CallFailure::GatewayRestarted)
        );
        close(store).await;
    }
}

#[tokio::test]
async fn a_restart_ends_what_cannot_survive_it_and_keeps_the_rounds() {
    let dir = tempfile::tempdir().unwrap();
    for location in durable(&dir) {
        restart_ends_what_cannot_survive_it(&location).await;
    }
}

async fn restart_ends_what_cannot_survive_it(location: &Location) {
    let store = open(location).await;
    let legacy = NewCall {
        protocol_version: Some("2025-11-25".into()),
        ..new_call("ada")
    };
    let legacy = insert(&store, legacy).await;
    let elicitation = store
        .raise(vec![new_request(Some(&legacy.id), None)], None, PendingCaps::NONE)
        .await
        .unwrap();
    let waiting = insert(&store, new_call("ada")).await;
    let round = NewRound {
        call: waiting.id.clone(),
        number: 1,
        request_state: None,
        input_requests: Default::default(),
    };
    let kept = store
        .raise(
            vec![new_request(Some(&waiting.id), Some("k"))],
            Some(round),
            PendingCaps::NONE,
        )
        .await
        .unwrap();
    // A round answered, whose retry was in flight when the gateway died: it is sent again.
    let retrying = insert(&store, new_call("ada")).await;
    let round = NewRound {
        call: retrying.id.clone(),
        number: 1,
        request_state: Some("s".into()),
        input_requests: Default::default(),
    };
    let answered = store
        .raise(
            vec![new_request(Some(&retrying.id), Some("k"))],
            Some(round),
            PendingCaps::NONE,
        )
        .await
        .unwrap();
    store.answer(&answered[0].request.id, proposal(true)).await.unwrap();
    // A call its upstream made a task of, in either era: the task is followed on.
    let task = NewCall {
        protocol_version: Some("2025-11-25".into()),
        ..new_call("ada")
    };
    let task = insert(&store, task).await;
    let working = CallTask {
        id: "task-1".into(),
        status: "working".into(),
        status_message: None,
        expires_at: None,
    };
    assert!(store.note_task(&task.id, &working).await.unwrap());
    close(store).await;

    let store = open(location).await;
    let recovered = store.recover("the gateway restarted").await.unwrap();
    assert_eq!(
        (recovered.ended_requests, recovered.ended_calls, recovered.pending),
        (1, 1, 1)
    );
    assert_eq!(recovered.resumes, [retrying.id.clone(), task.id.clone()]);
    assert_eq!(
        store.retry(&task.id).await.unwrap().unwrap().task.as_deref(),
        Some("task-1")
    );
    let ended = store.request(&elicitation[0].request.id).await.unwrap().unwrap();
    assert_eq!(ended.status, Status::Cancelled);
    assert!(ended.detail.unwrap().starts_with("the gateway restarted"));
    let failed = store.call(&legacy.id).await.unwrap().unwrap();
    assert_eq!(failed.status, CallStatus::Failed);
    assert_eq!(
        failed.error.unwrap().reason,
        Some(crate::records::CallFailure::GatewayRestarted)
    );
    assert_eq!(
        store.request(&kept[0].request.id).await.unwrap().unwrap().status,
        Status::Pending
    );
    assert_eq!(
        store.call(&waiting.id).await.unwrap().unwrap().status,
        CallStatus::InputRequired
    );
    close(store).await;
}

#[tokio::test]
async fn a_database_of_the_first_schema_is_migrated_and_its_pending_requests_keep_their_shares() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.sqlite3");
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(sqlite::first_schema()).unwrap();
        conn.execute_batch(
            "PRAGMA user_version = 1;
             INSERT INTO requests (id, kind, prompt, expires_at, status, server, session, owner, created_at)
             VALUES ('elc-1', 'input', 'Go on?', 9999999999999, 'pending', 'demo', 'ses-1', 'ada', 0);",
        )
        .unwrap();
    }
    let store = open(&Location::Sqlite(path)).await;
    assert_eq!(store.pending_count().await.unwrap(), 1);
    let caps = PendingCaps {
        per_principal: 1,
        ..PendingCaps::NONE
    };
    let ada = NewRequest {
        owner: Some("ada".into()),
        ..new_request(None, None)
    };
    assert!(matches!(
        store.raise(vec![ada], None, caps).await,
        Err(RaiseError::Full(PendingCap::Principal(1)))
    ));
    close(store).await;
}
