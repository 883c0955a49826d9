//! The store's verbs, each checked against every backend: what they decide must not depend on where the
//! state lives.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::*;
use crate::auth::{Principal, Role};
use crate::decision::{Rules, Upstream};
use crate::ids::{CallId, RequestId, SessionId};
use crate::records::{Arguments, CallStatus, EventKind, Finish, SessionFilter, SessionStatus, Status, Via};
use crate::suspension::{Answer, RequestKind, Verdict};

/// Runs a scenario on a memory store, on a SQLite file in a temp dir and on a fresh PostgreSQL database.
async fn on_every<F, Fut>(scenario: F)
where
    F: Fn(Store) -> Fut,
    Fut: Future<Output = ()>,
{
    let dir = tempfile::tempdir().unwrap();
    let [file, database] = durable(&dir);
    for location in &[Location::Memory, file, database] {
        let store = open(location).await;
        scenario(store.clone()).await;
        close(store).await;
    }
}

/// A SQLite file in `dir` and a fresh PostgreSQL database: the stores whose state outlives a process.
fn durable(dir: &tempfile::TempDir) -> [Location; 2] {
    [
        Location::Sqlite(dir.path().join("store.sqlite3")),
        Location::Postgres(postgres::cluster::shared().database()),
    ]
}

async fn open(location: &Location) -> Store {
    Store::open(
        location,
        Feed::default(),
        Duration::from_secs(3600),
        "replica-under-test",
        Clock::default(),
    )
    .await
    .unwrap()
}

/// Lets a store finish its changes and give its file or database up.
async fn close(store: Store) {
    match store {
        Store::Memory(_) => {}
        Store::Sqlite(sqlite) => sqlite.close(),
        Store::Postgres(postgres) => postgres.close().await,
    }
}

fn new_call(owner: &str) -> NewCall {
    NewCall {
        server: "demo".into(),
        session: ses_1(),
        shared: true,
        tool: "two_step".into(),
        arguments: Arguments::of(json!({"b": 1, "a": [2]}).as_object().unwrap()),
        owner: owner.into(),
        via: Via::Mcp,
        protocol_version: Some("2026-07-28".into()),
        capabilities: json!({"elicitation": {}}),
    }
}

/// The session the tests' calls and Requests run on.
fn ses_1() -> SessionId {
    SessionId::stored("ses-1")
}

fn new_request(call: Option<&CallId>, input_key: Option<&str>) -> NewRequest {
    let created_at = Clock::default().now();
    let deadline = created_at.after(Duration::from_secs(60));
    NewRequest {
        request: Request {
            id: RequestId::mint(crate::ids::REQUEST),
            kind: RequestKind::Input,
            prompt: "Go on?".into(),
            url: None,
            data: None,
            expires_at: Some(deadline.rfc3339()),
        },
        created_at,
        deadline,
        server: Some("demo".into()),
        session: Some(ses_1()),
        call: call.cloned(),
        owner: Some("ada".into()),
        elicitation_id: None,
        bytes: 100,
        input_key: input_key.map(str::to_owned),
    }
}

/// An admin's answer `{"confirm": confirm}`, with nothing waiting on the Request in this process.
fn proposal(confirm: bool) -> Proposal {
    proposal_by("tester", confirm)
}

/// [`proposal`], by `who`.
fn proposal_by(who: &str, confirm: bool) -> Proposal {
    Proposal {
        answer: Answer {
            id: String::new(),
            verdict: Verdict::Accept,
            data: json!({"confirm": confirm}).as_object().cloned(),
        },
        by: Principal {
            name: who.into(),
            role: Role::Admin,
        },
        upstream: None,
        rules: Arc::new(Rules {
            apply_defaults: true,
            forms: Arc::default(),
        }),
    }
}

/// Records a call and waits until it is kept.
async fn insert(store: &Store, call: NewCall) -> crate::records::CallView {
    let started = store.insert_call(call, 10).await.unwrap();
    started.kept.await.unwrap();
    started.view
}

#[tokio::test]
async fn a_round_answered_in_full_gives_what_its_retry_sends() {
    on_every(|store| async move {
        let call = insert(&store, new_call("ada")).await;
        let round = NewRound {
            call: call.id.clone(),
            number: 1,
            request_state: Some("opaque \"state\"".into()),
            input_requests: json!({"a": {"method": "elicitation/create"}, "b": {"method": "elicitation/create"}})
                .as_object()
                .cloned()
                .unwrap(),
        };
        let requests = vec![
            new_request(Some(&call.id), Some("a")),
            new_request(Some(&call.id), Some("b")),
        ];
        let raised = store.raise(requests, Some(round), PendingCaps::NONE).await.unwrap();
        let waiting = store.call(&call.id).await.unwrap().unwrap();
        assert_eq!(waiting.status, CallStatus::InputRequired);
        assert_eq!(waiting.requests.len(), 2);
        assert_eq!(waiting.via, Via::Mcp);
        assert_eq!(
            store.retry(&call.id).await.unwrap(),
            None,
            "a round with Requests pending is not retried"
        );

        let first = store.answer(&raised[0].request.id, proposal(true)).await.unwrap();
        assert!(matches!(first, Answered::Won { resumes: None, .. }), "{first:?}");
        let resolved = store
            .resolve(Pending::Ids(vec![raised[1].request.id.clone()]), Resolution::Expired)
            .await
            .unwrap();
        assert_eq!(store.call(&call.id).await.unwrap().unwrap().status, CallStatus::Running);
        let retry = store.retry(&call.id).await.unwrap().unwrap();
        assert_eq!(
            resolved.resumes,
            std::slice::from_ref(&retry),
            "the resolution that completes a round hands it on"
        );
        assert_eq!(retry.round, 1);
        assert_eq!(retry.request_state.as_deref(), Some("opaque \"state\""));
        assert_eq!(retry.arguments.to_value(), json!({"b": 1, "a": [2]}));
        assert_eq!(
            Value::Object(retry.input_responses),
            json!({"a": {"action": "accept", "content": {"confirm": true}}, "b": {"action": "cancel"}})
        );
    })
    .await;
}

#[tokio::test]
async fn of_two_answers_one_wins_and_the_other_sees_it() {
    on_every(|store| async move {
        let raised = store
            .raise(vec![new_request(None, None)], None, PendingCaps::NONE)
            .await
            .unwrap();
        let id = raised[0].request.id.clone();
        let (first, second) = tokio::join!(
            store.answer(&raised[0].request.id, proposal(true)),
            store.answer(&raised[0].request.id, proposal(false))
        );
        let outcomes = [first.unwrap(), second.unwrap()];
        let won: Vec<_> = outcomes
            .iter()
            .filter(|outcome| matches!(outcome, Answered::Won { .. }))
            .collect();
        assert_eq!(won.len(), 1, "{outcomes:?}");
        let kept = store.request(&id).await.unwrap().unwrap();
        for outcome in &outcomes {
            match outcome {
                Answered::Won { view, .. } | Answered::Lost(view) => assert_eq!(view.answer, kept.answer),
                other => panic!("{other:?}"),
            }
        }
    })
    .await;
}

#[tokio::test]
async fn an_elicitation_withdrawn_after_its_answers_were_sent_takes_none() {
    // PostgreSQL's writer is a task of this test's runtime, so the answers wait for it until this test
    // yields; the other stores' writers do not wait.
    let store = open(&Location::Postgres(postgres::cluster::shared().database())).await;
    let raised = store
        .raise(vec![new_request(None, None)], None, PendingCaps::NONE)
        .await
        .unwrap();
    let view = &raised[0];
    let upstream = Upstream::default();
    let answer = |confirm| {
        let proposal = Proposal {
            upstream: Some(upstream.clone()),
            ..proposal(confirm)
        };
        Box::pin(store.answer(&view.request.id, proposal))
    };
    let (mut first, mut second) = (answer(true), answer(false));
    assert!(futures::poll!(&mut first).is_pending() && futures::poll!(&mut second).is_pending());
    upstream.withdrawn.cancel();

    let outcomes = [first.await.unwrap(), second.await.unwrap()];
    let kept = store.request(&view.request.id).await.unwrap().unwrap();
    assert_eq!(kept.status, Status::Cancelled, "{outcomes:?}");
    assert_eq!(kept.answer, None);
    assert!(
        matches!(
            outcomes,
            [Answered::Withdrawn(_), Answered::Lost(_)] | [Answered::Lost(_), Answered::Withdrawn(_)]
        ),
        "{outcomes:?}"
    );
    close(store).await;
}

#[tokio::test]
async fn changes_run_alongside_ones_that_fail_run_again_in_the_next_transaction() {
    const DETAIL: [&str; 5] = ["kept", "refused", "kept", "refused", "kept"];
    let url = postgres::cluster::shared().database();
    let store = open(&Location::Postgres(url.clone())).await;
    let mut raised = Vec::new();
    for _ in DETAIL {
        raised.extend(
            store
                .raise(vec![new_request(None, None)], None, PendingCaps::NONE)
                .await
                .unwrap(),
        );
    }
    postgres::cluster::shared()
        .query(
            &url,
            "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'refused'; END $$; \
             CREATE TRIGGER refuse BEFORE UPDATE ON requests FOR EACH ROW WHEN (NEW.detail = 'refused') \
             EXECUTE FUNCTION refuse()",
        )
        .unwrap();
    // All sent before the writer (a task of this test's runtime) takes any: one transaction, until one fails.
    let cancels = raised.iter().zip(DETAIL).map(|(view, detail)| {
        let resolution = Resolution::Cancelled {
            detail: detail.into(),
            told_cancel: false,
        };
        store.resolve(Pending::Ids(vec![view.request.id.clone()]), resolution)
    });
    let outcomes = futures::future::join_all(cancels).await;

    for (at, detail) in DETAIL.iter().enumerate() {
        let kept = store.request(&raised[at].request.id).await.unwrap().unwrap();
        if *detail == "refused" {
            assert!(outcomes[at].is_err(), "{at}: {outcomes:?}");
            assert_eq!(kept.status, Status::Pending);
        } else {
            assert!(
                matches!(&outcomes[at], Ok(resolved) if resolved.views.len() == 1),
                "{at}: {outcomes:?}"
            );
            assert_eq!(kept.status, Status::Cancelled);
        }
    }
    close(store).await;
}

#[tokio::test]
async fn answers_to_whole_rounds_at_once_hand_each_on_once_and_publish_their_events_in_order() {
    const KEYS: usize = 12;
    let dir = tempfile::tempdir().unwrap();
    let [file, database] = durable(&dir);
    for location in &[Location::Memory, file, database] {
        let feed = Feed::default();
        let mut published = feed.subscribe();
        let store = Store::open(
            location,
            feed,
            Duration::from_secs(3600),
            "replica-under-test",
            Clock::default(),
        )
        .await
        .unwrap();
        let mut calls = Vec::new();
        let mut rounds = Vec::new();
        for _ in 0..2 {
            let call = insert(&store, new_call("ada")).await;
            let keys: Vec<String> = (0..KEYS).map(|key| format!("k{key}")).collect();
            let round = NewRound {
                call: call.id.clone(),
                number: 1,
                request_state: None,
                input_requests: keys
                    .iter()
                    .map(|key| (key.clone(), json!({"method": "elicitation/create"})))
                    .collect(),
            };
            let requests = keys.iter().map(|key| new_request(Some(&call.id), Some(key))).collect();
            rounds.push(store.raise(requests, Some(round), PendingCaps::NONE).await.unwrap());
            calls.push(call.id);
        }
        let before = store.last_event_id().await.unwrap();

        // One call's Requests, then the other's, each answered twice at once (one of the two wins), all
        // sent before the store takes any: the first round is completed midway through them.
        let answers = rounds.iter().flatten().flat_map(|view| {
            let store = &store;
            [true, false].map(move |confirm| store.answer(&view.request.id, proposal(confirm)))
        });
        let outcomes: Vec<Answered> = futures::future::join_all(answers)
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();

        let won = outcomes
            .iter()
            .filter(|outcome| matches!(outcome, Answered::Won { .. }));
        assert_eq!(won.count(), 2 * KEYS, "{location:?}: {outcomes:?}");
        let handed_on = outcomes
            .iter()
            .filter(|outcome| matches!(outcome, Answered::Won { resumes: Some(_), .. }));
        assert_eq!(handed_on.count(), 2, "{location:?}: each round is retried once");
        for call in &calls {
            assert_eq!(store.call(call).await.unwrap().unwrap().status, CallStatus::Running);
        }
        let logged = store.events_after(before, 100).await.unwrap().events;
        let ids: Vec<u64> = logged.iter().map(|event| event.id).collect();
        assert_eq!(ids.len(), 2 * KEYS + 2, "{location:?}");
        assert!(ids.is_sorted_by(|a, b| a < b), "{location:?}: {ids:?}");
        let last = *ids.last().unwrap();
        let updated = logged.iter().filter(|event| event.kind == EventKind::CallUpdated);
        assert_eq!(updated.count(), 2, "{location:?}");
        let mut seen = Vec::new();
        while seen.last().is_none_or(|seen| *seen < last) {
            let event = published.recv().await.unwrap();
            if event.id > before {
                seen.push(event.id);
            }
        }
        assert_eq!(seen, ids, "{location:?}: published in the log's order");
        close(store).await;
    }
}

#[tokio::test]
async fn an_answer_by_one_who_may_not_give_it_or_that_does_not_fit_changes_nothing() {
    on_every(|store| async move {
        let mut form = new_request(None, None);
        let schema = json!({"schema": {"type": "object", "properties": {"confirm": {"type": "boolean"}}}});
        form.request.data = schema.as_object().cloned().map(Arc::new);
        let raised = store.raise(vec![form], None, PendingCaps::NONE).await.unwrap();
        let id = raised[0].request.id.clone();
        let mut not_yours = proposal_by("bob", true);
        not_yours.by.role = Role::Agent;
        let outcome = store.answer(&id, not_yours).await.unwrap();
        assert!(
            matches!(&outcome, Answered::Refused(Refusal::NotYours(refused)) if *refused == id),
            "ada's Request: {outcome:?}"
        );
        let mut unfit = proposal(true);
        unfit.answer.data = json!({"confirm": "yes"}).as_object().cloned();
        let outcome = store.answer(&id, unfit).await.unwrap();
        assert!(
            matches!(&outcome, Answered::Invalid(violations) if violations.len() == 1),
            "{outcome:?}"
        );
        assert_eq!(
            store.request(&id).await.unwrap().unwrap(),
            raised[0],
            "still pending, unchanged"
        );
        assert_eq!(store.pending_count().await.unwrap(), 1);

        let outcome = store.answer(&id, proposal(true)).await.unwrap();
        assert!(matches!(outcome, Answered::Won { .. }), "{outcome:?}");
        let outcome = store.answer(&id, proposal(false)).await.unwrap();
        assert!(
            matches!(&outcome, Answered::Lost(view) if view.status == Status::Answered),
            "{outcome:?}"
        );
        let outcome = store
            .answer(&RequestId::stored("req-unknown"), proposal(true))
            .await
            .unwrap();
        assert!(matches!(outcome, Answered::NotFound), "{outcome:?}");
    })
    .await;
}

#[tokio::test]
async fn a_withdrawn_elicitation_takes_no_answer() {
    on_every(|store| async move {
        let raised = store
            .raise(vec![new_request(None, None)], None, PendingCaps::NONE)
            .await
            .unwrap();
        let id = raised[0].request.id.clone();
        let upstream = Upstream::default();
        upstream.withdrawn.cancel();
        let proposal = Proposal {
            upstream: Some(upstream),
            ..proposal(true)
        };
        let outcome = store.answer(&raised[0].request.id, proposal).await.unwrap();
        let Answered::Withdrawn(view) = outcome else {
            panic!("{outcome:?}")
        };
        assert_eq!(view.status, Status::Cancelled);
        assert_eq!(view.result, None, "nothing was sent upstream");
        assert_eq!(store.request(&id).await.unwrap().unwrap(), view);
    })
    .await;
}

#[tokio::test]
async fn past_the_cap_nothing_of_a_round_is_raised() {
    on_every(|store| async move {
        let caps = PendingCaps {
            total: 2,
            ..PendingCaps::NONE
        };
        store.raise(vec![new_request(None, None)], None, caps).await.unwrap();
        let two = vec![new_request(None, None), new_request(None, None)];
        assert!(matches!(
            store.raise(two, None, caps).await,
            Err(RaiseError::Full(PendingCap::Total(2)))
        ));
        assert_eq!(store.pending_count().await.unwrap(), 1);
    })
    .await;
}

#[tokio::test]
async fn each_principal_has_its_share_of_the_bytes() {
    on_every(|store| async move {
        let caps = PendingCaps {
            bytes_per_principal: 150,
            ..PendingCaps::NONE
        };
        let from = |owner: &str| NewRequest {
            owner: Some(owner.to_owned()),
            ..new_request(None, None)
        };
        store.raise(vec![from("ada")], None, caps).await.unwrap();
        assert!(matches!(
            store.raise(vec![from("ada")], None, caps).await,
            Err(RaiseError::Full(PendingCap::PrincipalBytes(150)))
        ));
        store.raise(vec![from("bob")], None, caps).await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn each_principal_and_server_has_its_share_and_gets_it_back() {
    on_every(|store| async move {
        let caps = PendingCaps {
            per_principal: 2,
            per_server: 3,
            bytes: 450,
            ..PendingCaps::NONE
        };
        let from = |owner: &str, server: &str| NewRequest {
            owner: Some(owner.to_owned()),
            server: Some(server.to_owned()),
            ..new_request(None, None)
        };
        // Raised at once, so that the SQLite writer decides them in one transaction.
        let (first, second, third) = tokio::join!(
            store.raise(vec![from("ada", "demo")], None, caps),
            store.raise(vec![from("ada", "demo")], None, caps),
            store.raise(vec![from("ada", "demo")], None, caps),
        );
        let refused: Vec<_> = [&first, &second, &third]
            .into_iter()
            .filter(|raised| raised.is_err())
            .collect();
        assert_eq!(refused.len(), 1, "{first:?} {second:?} {third:?}");
        assert!(matches!(refused[0], Err(RaiseError::Full(PendingCap::Principal(2)))));

        store.raise(vec![from("bob", "demo")], None, caps).await.unwrap();
        assert!(matches!(
            store.raise(vec![from("cy", "demo")], None, caps).await,
            Err(RaiseError::Full(PendingCap::Server(3)))
        ));
        store.raise(vec![from("cy", "other")], None, caps).await.unwrap();
        assert!(matches!(
            store.raise(vec![from("cy", "other")], None, caps).await,
            Err(RaiseError::Full(PendingCap::Bytes(450)))
        ));

        let ada = [first, second, third].into_iter().find_map(Result::ok).unwrap();
        store
            .resolve(Pending::Ids(vec![ada[0].request.id.clone()]), Resolution::Expired)
            .await
            .unwrap();
        store.raise(vec![from("ada", "other")], None, caps).await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn a_principal_s_running_calls_are_counted_until_they_end() {
    on_every(|store| async move {
        let first = insert(&store, new_call("ada")).await;
        insert(&store, new_call("bob")).await;
        assert!(matches!(
            store.insert_call(new_call("ada"), 1).await,
            Err(InsertCallError::TooMany(1))
        ));
        store.finish_call(&first.id, Finish::failed("done")).await.unwrap();
        let started = store.insert_call(new_call("ada"), 1).await.unwrap();
        started.kept.await.unwrap();
        assert!(matches!(
            store.insert_call(new_call("ada"), 1).await,
            Err(InsertCallError::TooMany(1))
        ));
        // Started together (one transaction on SQLite), no more than the cap are taken.
        let together = futures::future::join_all((0..10).map(|_| store.insert_call(new_call("eve"), 3))).await;
        let taken: Vec<bool> = together.iter().map(Result::is_ok).collect();
        assert_eq!(taken.iter().filter(|taken| **taken).count(), 3, "{taken:?}");
    })
    .await;
}

#[tokio::test]
async fn a_call_that_ends_cancels_its_pending_requests_once() {
    on_every(|store| async move {
        let call = insert(&store, new_call("ada")).await;
        assert!(matches!(
            store.insert_call(new_call("ada"), 1).await,
            Err(InsertCallError::TooMany(1))
        ));
        let raised = store
            .raise(vec![new_request(Some(&call.id), None)], None, PendingCaps::NONE)
            .await
            .unwrap();
        let finished = store
            .finish_call(&call.id, Finish::Cancelled("stop".into()))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(finished.view.status, CallStatus::Cancelled);
        assert_eq!(finished.cancelled.len(), 1);
        assert_eq!(finished.cancelled[0].request.id, raised[0].request.id);
        assert_eq!(finished.cancelled[0].detail.as_deref(), Some("stop"));
        assert!(
            store
                .finish_call(&call.id, Finish::failed("again"))
                .await
                .unwrap()
                .is_none()
        );
        assert_eq!(
            store.call(&call.id).await.unwrap().unwrap().error.unwrap().message,
            "stop"
        );
    })
    .await;
}

#[tokio::test]
async fn events_are_numbered_in_order_and_a_reader_past_the_end_is_told_to_relist() {
    on_every(|store| async move {
        let before = store.last_event_id().await.unwrap();
        let session = NewSession {
            id: ses_1(),
            replica: "replica-under-test".into(),
            server: "demo".into(),
            owner: Some("ada".into()),
        };
        store.insert_session(session, 4).await.unwrap();
        store
            .session_ready(&ses_1(), Some("2026-07-28".into()), None)
            .await
            .unwrap();
        store
            .end_session(&ses_1(), SessionStatus::Closed, "done")
            .await
            .unwrap();
        let page = store.events_after(before, 10).await.unwrap();
        assert!(!page.gap);
        let ids: Vec<u64> = page.events.iter().map(|event| event.id).collect();
        assert_eq!(ids.len(), 3);
        assert!(before < ids[0] && ids[0] < ids[1] && ids[1] < ids[2], "{ids:?}");
        assert_eq!(store.last_event_id().await.unwrap(), ids[2]);
        assert!(page.events.iter().all(|event| event.kind == EventKind::SessionUpdated));
        let last: Value = serde_json::from_str(&page.events[2].data).unwrap();
        assert_eq!(last["status"], "closed");
        assert!(store.events_after(ids[2] + 1, 10).await.unwrap().gap);
    })
    .await;
}

/// A Request posted to `POST /requests`: no server, session or call.
fn posted_request(owner: &str) -> NewRequest {
    NewRequest {
        server: None,
        session: None,
        owner: Some(owner.into()),
        ..new_request(None, None)
    }
}

#[tokio::test]
async fn a_posted_request_counts_per_owner_and_in_all_but_against_no_server() {
    on_every(|store| async move {
        let caps = PendingCaps {
            total: 3,
            per_principal: 2,
            per_server: 1,
            ..PendingCaps::NONE
        };
        let first = store.raise(vec![posted_request("ada")], None, caps).await.unwrap();
        assert_eq!(
            (
                first[0].server.as_deref(),
                first[0].session.as_ref().map(SessionId::as_str)
            ),
            (None, None)
        );
        let mut again = posted_request("bob");
        again.request.id = first[0].request.id.clone();
        let taken = store.raise(vec![again], None, caps).await.unwrap_err();
        assert!(
            matches!(&taken, RaiseError::Taken(id) if *id == first[0].request.id),
            "{taken:?}"
        );
        store.raise(vec![posted_request("ada")], None, caps).await.unwrap();
        let refused = store.raise(vec![posted_request("ada")], None, caps).await.unwrap_err();
        assert!(
            matches!(refused, RaiseError::Full(PendingCap::Principal(2))),
            "{refused:?}"
        );
        let raised = NewRequest {
            owner: Some("bob".into()),
            ..new_request(None, None)
        };
        store.raise(vec![raised], None, caps).await.unwrap();
        let refused = store.raise(vec![posted_request("bob")], None, caps).await.unwrap_err();
        assert!(matches!(refused, RaiseError::Full(PendingCap::Total(3))), "{refused:?}");

        let id = first[0].request.id.clone();
        let read = store.request(&id).await.unwrap().unwrap();
        assert_eq!(read, first[0]);
        let Answered::Won { view, .. } = store.answer(&id, proposal(true)).await.unwrap() else {
            panic!("the answer did not win");
        };
        assert_eq!((view.status, view.result), (Status::Answered, None));
        store.raise(vec![posted_request("bob")], None, caps).await.unwrap();
        let expired = store
            .expire_due(Clock::default().now().after(Duration::from_secs(61)), 10)
            .await
            .unwrap();
        assert_eq!(expired.views.len(), 3);
        assert!(
            expired
                .views
                .iter()
                .filter(|view| view.is_posted())
                .all(|view| view.result.is_none())
        );
    })
    .await;
}

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

#[tokio::test]
async fn an_approved_call_is_claimed_for_sending_once() {
    on_every(|store| async move {
        let call = insert(&store, new_call("ada")).await;
        let raised = store
            .raise(vec![approval_of(&call.id)], None, PendingCaps::NONE)
            .await
            .unwrap();
        assert!(!store.forwarding(&call.id).await.unwrap(), "not while it waits");
        store.resolve(Pending::Elicitations, Resolution::Expired).await.unwrap();
        assert_eq!(
            store.request(&raised[0].request.id).await.unwrap().unwrap().status,
            Status::Pending,
            "an approval is not an elicitation"
        );
        let answered = store.answer(&raised[0].request.id, proposal(true)).await;
        assert!(matches!(answered.unwrap(), Answered::Won { .. }));
        assert!(store.forwarding(&call.id).await.unwrap());
        assert!(!store.forwarding(&call.id).await.unwrap(), "sent once");
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
            assert!(store.forwarding(call).await.unwrap());
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
        assert!(
            store.forwarding(&calls[2]).await.unwrap(),
            "claimed again once handed over"
        );
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
    close(store).await;

    let store = open(location).await;
    let recovered = store.recover("the gateway restarted").await.unwrap();
    assert_eq!(
        (recovered.ended_requests, recovered.ended_calls, recovered.pending),
        (1, 1, 1)
    );
    assert_eq!(recovered.resumes, std::slice::from_ref(&retrying.id));
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

#[tokio::test]
async fn a_postgres_database_of_the_first_schema_counts_its_pending_requests_and_running_calls() {
    let url = postgres::cluster::shared().database();
    {
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
        let connection = tokio::spawn(connection);
        client
            .batch_execute(&format!(
                "{}; CREATE TABLE toolnexus_schema (version INTEGER NOT NULL);
                 INSERT INTO toolnexus_schema (version) VALUES (1);
                 INSERT INTO requests (id, kind, prompt, expires_at, status, server, session, owner, created_at, bytes)
                 VALUES ('elc-1', 'input', 'Go on?', 9999999999999, 'pending', 'demo', 'ses-1', 'ada', 0, 100),
                        ('elc-2', 'input', 'Go on?', 9999999999999, 'answered', 'demo', 'ses-1', 'ada', 0, 100);
                 INSERT INTO calls (id, server, session, shared, tool, arguments, owner, capabilities, status,
                                    created_at, updated_at)
                 VALUES ('call-1', 'demo', 'ses-1', TRUE, 'two_step', '{{}}', 'ada', '{{}}', 'running', 0, 0);",
                postgres::first_schema()
            ))
            .await
            .unwrap();
        drop(client);
        connection.await.unwrap().unwrap();
    }
    let store = open(&Location::Postgres(url)).await;
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
    assert!(matches!(
        store.insert_call(new_call("ada"), 1).await,
        Err(InsertCallError::TooMany(1))
    ));
    close(store).await;
}

#[tokio::test]
async fn two_postgres_stores_on_one_database_share_its_caps_and_counts() {
    let url = postgres::cluster::shared().database();
    let a = Store::Postgres(Postgres::open(&url, Feed::default(), Clock::default()).await.unwrap());
    let b = Store::Postgres(Postgres::open(&url, Feed::default(), Clock::default()).await.unwrap());
    let caps = PendingCaps {
        per_principal: 2,
        bytes: 350,
        ..PendingCaps::NONE
    };
    let from = |owner: &str| NewRequest {
        owner: Some(owner.to_owned()),
        ..new_request(None, None)
    };

    let first = a.raise(vec![from("ada")], None, caps).await.unwrap();
    b.raise(vec![from("ada")], None, caps).await.unwrap();
    for store in [&a, &b] {
        assert!(matches!(
            store.raise(vec![from("ada")], None, caps).await,
            Err(RaiseError::Full(PendingCap::Principal(2)))
        ));
        assert_eq!(store.pending_count().await.unwrap(), 2);
    }
    // Raised at once on both: the write lock decides them one after the other.
    let (left, right) = tokio::join!(
        a.raise(vec![from("bob")], None, caps),
        b.raise(vec![from("cy")], None, caps),
    );
    assert_eq!(
        [&left, &right].into_iter().filter(|raised| raised.is_err()).count(),
        1,
        "{left:?} {right:?}"
    );
    assert!(matches!(
        left.as_ref().err().or(right.as_ref().err()),
        Some(RaiseError::Full(PendingCap::Bytes(350)))
    ));

    let id = first[0].request.id.clone();
    b.resolve(Pending::Ids(vec![id.clone()]), Resolution::Expired)
        .await
        .unwrap();
    assert_eq!(
        a.request_status(&id).await.unwrap(),
        Some((Status::Expired, Some("ada".to_owned())))
    );
    a.raise(vec![from("ada")], None, caps).await.unwrap();
    assert_eq!(b.pending_count().await.unwrap(), 3);

    let call = insert(&a, new_call("ada")).await;
    assert!(matches!(
        b.insert_call(new_call("ada"), 1).await,
        Err(InsertCallError::TooMany(1))
    ));
    assert_eq!(
        b.call_status(&call.id).await.unwrap(),
        Some((CallStatus::Running, "ada".to_owned()))
    );
    b.finish_call(&call.id, Finish::failed("done")).await.unwrap().unwrap();
    assert_eq!(
        a.call_status(&call.id).await.unwrap(),
        Some((CallStatus::Failed, "ada".to_owned()))
    );
    let last = insert(&a, new_call("ada")).await;
    assert_eq!(counted(&url).await, recounted(&url).await);

    b.resolve(Pending::All, Resolution::Expired).await.unwrap();
    a.finish_call(&last.id, Finish::failed("done")).await.unwrap().unwrap();
    assert_eq!(
        counted(&url).await,
        (vec![], vec![]),
        "counts that reach zero are deleted"
    );
    close(a).await;
    close(b).await;
}

/// Two replicas answer a call's last two Requests at once: the other replica's answer is in flight (its
/// transaction open, its call settled as it saw it) when this one's runs, and commits first.
#[tokio::test]
async fn answers_to_a_calls_last_two_requests_committed_side_by_side_leave_it_running_and_hand_it_on_once() {
    let url = postgres::cluster::shared().database();
    let store = Store::Postgres(Postgres::open(&url, Feed::default(), Clock::default()).await.unwrap());
    let call = insert(&store, new_call("ada")).await;
    let keys = ["a", "b"];
    let round = NewRound {
        call: call.id.clone(),
        number: 1,
        request_state: None,
        input_requests: keys
            .iter()
            .map(|key| ((*key).to_owned(), json!({"method": "elicitation/create"})))
            .collect(),
    };
    let requests = keys.iter().map(|key| new_request(Some(&call.id), Some(key))).collect();
    let raised = store.raise(requests, Some(round), PendingCaps::NONE).await.unwrap();

    let (other, watcher) = (connect_raw(&url).await, connect_raw(&url).await);
    other
        .batch_execute(&format!(
            "BEGIN; UPDATE requests SET status = 'answered' WHERE id = '{}'; \
             UPDATE calls AS c SET status = CASE WHEN c.pending > 0 THEN 'input_required' ELSE 'running' END \
             WHERE c.id = '{}'",
            raised[0].request.id, call.id
        ))
        .await
        .unwrap();
    let view = raised[1].clone();
    let answering = tokio::spawn({
        let store = store.clone();
        async move { store.answer(&view.request.id, proposal(true)).await }
    });
    // This one's answer waits for the call's row, which the other holds.
    until_a_lock_is_awaited(&watcher, "the answer never waited for the other").await;
    other.batch_execute("COMMIT").await.unwrap();

    let answered = answering.await.unwrap().unwrap();
    assert!(
        matches!(answered, Answered::Won { resumes: Some(_), .. }),
        "{answered:?}"
    );
    assert_eq!(store.call(&call.id).await.unwrap().unwrap().status, CallStatus::Running);
    store.close().await;
}

/// One replica's writer waits on a call's row, which another transaction holds: its transaction stays open, and
/// the other replica starts and ends calls and sessions meanwhile, committing side by side with it.
#[tokio::test]
async fn a_replica_waiting_on_a_row_leaves_another_starting_and_ending_calls_and_sessions() {
    let url = postgres::cluster::shared().database();
    let a = Store::Postgres(Postgres::open(&url, Feed::default(), Clock::default()).await.unwrap());
    let b = Store::Postgres(Postgres::open(&url, Feed::default(), Clock::default()).await.unwrap());
    let held = insert(&a, new_call("ada")).await;
    let (other, watcher) = (connect_raw(&url).await, connect_raw(&url).await);
    other
        .batch_execute(&format!(
            "BEGIN; SELECT 1 FROM calls WHERE id = '{}' FOR UPDATE",
            held.id
        ))
        .await
        .unwrap();
    let finishing = tokio::spawn({
        let (a, id) = (a.clone(), held.id.clone());
        async move { a.finish_call(&id, Finish::failed("done")).await }
    });
    until_a_lock_is_awaited(&watcher, "the finish never waited for the row").await;

    // The same principal's call and others', a session, and the end of both, while `a` waits.
    let started = tokio::time::timeout(Duration::from_secs(30), async {
        let mine = insert(&b, new_call("ada")).await;
        let theirs = insert(&b, new_call("bob")).await;
        for call in [&mine, &theirs] {
            b.finish_call(&call.id, Finish::failed("done")).await.unwrap().unwrap();
        }
        let session = b
            .insert_session(
                NewSession {
                    id: SessionId::mint(),
                    replica: "b".to_owned(),
                    server: "demo".to_owned(),
                    owner: Some("ada".to_owned()),
                },
                5,
            )
            .await
            .unwrap();
        b.session_ready(&session.id, None, None).await.unwrap().unwrap();
        b.end_session(&session.id, SessionStatus::Closed, "done")
            .await
            .unwrap()
            .unwrap()
    })
    .await
    .expect("the other replica's changes waited for the first's transaction");
    assert_eq!(started.status, SessionStatus::Closed);
    assert!(
        !finishing.is_finished(),
        "the first replica's finish did not wait for the row"
    );

    other.batch_execute("COMMIT").await.unwrap();
    let finished = finishing.await.unwrap().unwrap().unwrap();
    assert_eq!(finished.view.status, CallStatus::Failed);
    assert_eq!(counted(&url).await, recounted(&url).await);
    close(a).await;
    close(b).await;
}

/// A replica raising Requests on a call whose row another transaction holds waits for that row, and holds
/// up no other replica's answers meanwhile; the holder ends the call, and the raise reads it ended.
#[tokio::test]
async fn a_raise_waits_for_its_calls_row_alone_and_reads_the_call_as_the_holder_left_it() {
    let url = postgres::cluster::shared().database();
    let a = Store::Postgres(Postgres::open(&url, Feed::default(), Clock::default()).await.unwrap());
    let b = Store::Postgres(Postgres::open(&url, Feed::default(), Clock::default()).await.unwrap());
    let held = insert(&a, new_call("ada")).await;
    let posted = b
        .raise(vec![posted_request("bob")], None, PendingCaps::NONE)
        .await
        .unwrap();
    let (other, watcher) = (connect_raw(&url).await, connect_raw(&url).await);
    other
        .batch_execute(&format!(
            "BEGIN; UPDATE calls SET status = 'failed', ended_at = updated_at WHERE id = '{}'",
            held.id
        ))
        .await
        .unwrap();
    let raising = tokio::spawn({
        let (a, call) = (a.clone(), held.id.clone());
        async move {
            a.raise(vec![new_request(Some(&call), None)], None, PendingCaps::NONE)
                .await
        }
    });
    until_a_lock_is_awaited(&watcher, "the raise never waited for its call's row").await;

    let answered = tokio::time::timeout(Duration::from_secs(30), b.answer(&posted[0].request.id, proposal(true)))
        .await
        .expect("the other replica's answer waited for the raise");
    assert!(matches!(answered, Ok(Answered::Won { .. })), "{answered:?}");
    assert!(!raising.is_finished(), "the raise did not wait for the call's row");

    other.batch_execute("COMMIT").await.unwrap();
    let raised = raising.await.unwrap();
    assert!(
        matches!(&raised, Err(RaiseError::CallEnded(call)) if *call == held.id),
        "{raised:?}"
    );
    let call = a.call(&held.id).await.unwrap().unwrap();
    assert_eq!((call.status, call.requests.len()), (CallStatus::Failed, 0));
    close(a).await;
    close(b).await;
}

/// Two replicas start many calls of one principal at once: the cap admits exactly as many as it allows, on
/// both together, and the counts are the calls'.
#[tokio::test]
async fn a_principals_cap_holds_exactly_across_replicas_starting_calls_at_once() {
    const CAP: usize = 3;
    let url = postgres::cluster::shared().database();
    let a = Store::Postgres(Postgres::open(&url, Feed::default(), Clock::default()).await.unwrap());
    let b = Store::Postgres(Postgres::open(&url, Feed::default(), Clock::default()).await.unwrap());
    let mut starting = tokio::task::JoinSet::new();
    for nth in 0..16 {
        let store = if nth % 2 == 0 { a.clone() } else { b.clone() };
        starting.spawn(async move {
            match store.insert_call(new_call("ada"), CAP).await {
                Ok(started) => {
                    started.kept.await.unwrap();
                    true
                }
                Err(InsertCallError::TooMany(running)) => {
                    assert_eq!(running, CAP);
                    false
                }
                Err(error) => panic!("{error}"),
            }
        });
    }
    let admitted = starting
        .join_all()
        .await
        .into_iter()
        .filter(|admitted| *admitted)
        .count();
    assert_eq!(admitted, CAP);
    assert_eq!(counted(&url).await.1, vec![("ada".to_owned(), 3)]);
    assert_eq!(counted(&url).await, recounted(&url).await);
    close(a).await;
    close(b).await;
}

/// A connection of its own to the PostgreSQL database at `url`, beside the store's.
async fn connect_raw(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    client
}

/// Returns once `watcher` sees a transaction waiting for a lock; fails, saying `never`, after 30 s.
async fn until_a_lock_is_awaited(watcher: &tokio_postgres::Client, never: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let waiting: i64 = watcher
            .query_one("SELECT count(*) FROM pg_locks WHERE NOT granted", &[])
            .await
            .unwrap()
            .get(0);
        if waiting > 0 {
            return;
        }
        assert!(Instant::now() < deadline, "{never}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// What a PostgreSQL database's counting tables hold: pending shares, then live calls.
async fn counted(url: &str) -> (Vec<(String, String, i64, i64)>, Vec<(String, i64)>) {
    counts(
        url,
        "SELECT owner, server, sum(requests)::BIGINT, sum(bytes)::BIGINT FROM pending_shares GROUP BY 1, 2 \
         HAVING sum(requests) <> 0 OR sum(bytes) <> 0 ORDER BY 1, 2",
        "SELECT owner, sum(calls)::BIGINT FROM live_calls GROUP BY owner HAVING sum(calls) <> 0 ORDER BY owner",
    )
    .await
}

/// What a PostgreSQL database's counting tables should hold, counted from its rows.
async fn recounted(url: &str) -> (Vec<(String, String, i64, i64)>, Vec<(String, i64)>) {
    counts(
        url,
        "SELECT COALESCE(owner, ''), server, count(*), sum(bytes)::BIGINT FROM requests \
         WHERE status = 'pending' GROUP BY 1, 2 ORDER BY 1, 2",
        "SELECT owner, count(*) FROM calls WHERE status IN ('running', 'input_required') GROUP BY 1 ORDER BY 1",
    )
    .await
}

async fn counts(url: &str, shares: &str, calls: &str) -> (Vec<(String, String, i64, i64)>, Vec<(String, i64)>) {
    let client = connect_raw(url).await;
    let shares = client.query(shares, &[]).await.unwrap();
    let calls = client.query(calls, &[]).await.unwrap();
    (
        shares
            .iter()
            .map(|row| (row.get(0), row.get(1), row.get(2), row.get(3)))
            .collect(),
        calls.iter().map(|row| (row.get(0), row.get(1))).collect(),
    )
}

#[tokio::test]
async fn listings_cursors_and_pruning_read_what_was_kept() {
    on_every(|store| async move {
        let call = insert(&store, new_call("ada")).await;
        let raised = store
            .raise(
                vec![new_request(Some(&call.id), None), new_request(None, None)],
                None,
                PendingCaps::NONE,
            )
            .await
            .unwrap();
        assert!(store.next_deadline().await.unwrap().is_some());
        let pending = Filter {
            status: Some(Status::Pending),
            owner: Some("ada".into()),
            ..Filter::default()
        };
        let (page, next) = store.requests(&pending, 0, 1).await.unwrap();
        assert_eq!(page[0].request.id, raised[0].request.id);
        let (rest, last) = store.requests(&pending, next.unwrap(), 5).await.unwrap();
        assert_eq!((rest.len(), last), (1, None));
        let running = CallFilter {
            status: Some(CallStatus::InputRequired),
            owner: Some("ada".into()),
            ..CallFilter::default()
        };
        assert_eq!(store.calls(&running, 5).await.unwrap().len(), 1);
        assert_eq!(store.running_calls(Some(&ses_1())).await.unwrap().len(), 1);
        assert_eq!(store.running_calls(None).await.unwrap().len(), 1);
        assert_eq!(store.count_calls().await.unwrap(), [(CallStatus::InputRequired, 1)]);
        assert_eq!(
            store.call_status(&call.id).await.unwrap(),
            Some((CallStatus::InputRequired, "ada".to_owned()))
        );

        let expired = store
            .expire_due(Clock::default().now().after(Duration::from_secs(120)), 10)
            .await
            .unwrap();
        assert_eq!(expired.views.len(), 2);
        assert_eq!(store.pending_count().await.unwrap(), 0);
        assert_eq!(
            store.request_status(&raised[1].request.id).await.unwrap(),
            Some((Status::Expired, Some("ada".to_owned())))
        );
        store.annotate_round(&call.id, "refused").await.unwrap();
        assert!(!store.complete(&ses_1(), "elc-unknown").await.unwrap());
        assert!(
            store
                .undelivered(&raised[1].request.id, "late")
                .await
                .unwrap()
                .is_none()
        );
        store
            .finish_call(&call.id, Finish::failed("done"))
            .await
            .unwrap()
            .unwrap();
        assert!(store.sessions(SessionFilter::All).await.unwrap().is_empty());

        store.save_webhook_cursor("hook", 3);
        store.save_webhook_cursor("hook", 7);
        let last = store.last_event_id().await.unwrap();
        store
            .prune(Clock::default().now().after(Duration::from_secs(1)))
            .await
            .unwrap();
        assert_eq!(store.webhook_cursor("hook").await.unwrap(), Some(7));
        if !store.is_durable() {
            return; // memory forgets ended records by its own retention
        }
        assert_eq!(store.request(&raised[0].request.id).await.unwrap(), None);
        assert_eq!(store.call(&call.id).await.unwrap(), None);
        assert_eq!(store.last_event_id().await.unwrap(), last, "the newest event stays");
        let page = store.events_after(0, 10).await.unwrap();
        assert!(page.gap);
        assert!(page.resume_after < last);
        let after_the_gap = store.events_after(page.resume_after, 10).await.unwrap();
        let ids: Vec<u64> = after_the_gap.events.iter().map(|event| event.id).collect();
        assert_eq!(ids, [last], "only the newest event stays");
    })
    .await;
}

#[tokio::test]
async fn a_webhook_lease_goes_to_its_holder_with_the_cursor_never_moved_back() {
    on_every(|store| async move {
        let lease = Duration::from_secs(60);
        assert_eq!(
            store.hold_webhook("hook", "one", lease).await.unwrap(),
            Lease::Mine(None)
        );
        store.save_webhook_cursor("hook", 7);
        store.save_webhook_cursor("hook", 3);
        assert_eq!(
            store.hold_webhook("hook", "one", lease).await.unwrap(),
            Lease::Mine(Some(7)),
            "renewed, with the cursor saved before"
        );
        assert_eq!(store.webhook_cursor("hook").await.unwrap(), Some(7));
        let second = store.hold_webhook("hook", "two", lease).await.unwrap();
        if matches!(store, Store::Postgres(_)) {
            assert_eq!(second, Lease::Elsewhere);
        } else {
            assert_eq!(
                second,
                Lease::Mine(Some(7)),
                "one gateway per memory store or SQLite file"
            );
        }
    })
    .await;
}

#[tokio::test]
async fn gateways_sharing_a_database_take_a_webhook_over_once_its_lease_runs_out() {
    let url = postgres::cluster::shared().database();
    let one = Store::Postgres(Postgres::open(&url, Feed::default(), Clock::default()).await.unwrap());
    let two = Store::Postgres(Postgres::open(&url, Feed::default(), Clock::default()).await.unwrap());
    let short = Duration::from_millis(200);
    let long = Duration::from_secs(60);

    assert_eq!(one.hold_webhook("hook", "one", short).await.unwrap(), Lease::Mine(None));
    one.save_webhook_cursor("hook", 5);
    assert_eq!(
        one.hold_webhook("hook", "one", short).await.unwrap(),
        Lease::Mine(Some(5))
    );
    assert_eq!(
        two.hold_webhook("hook", "two", long).await.unwrap(),
        Lease::Elsewhere,
        "while fresh"
    );
    let took_over = Instant::now();
    let taken = loop {
        match two.hold_webhook("hook", "two", long).await.unwrap() {
            Lease::Elsewhere if took_over.elapsed() < Duration::from_secs(10) => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            held => break held,
        }
    };

    assert_eq!(taken, Lease::Mine(Some(5)), "taken over from the saved cursor");
    assert!(
        took_over.elapsed() < Duration::from_secs(5),
        "{:?}",
        took_over.elapsed()
    );
    assert_eq!(one.hold_webhook("hook", "one", short).await.unwrap(), Lease::Elsewhere);
    assert_eq!(
        one.hold_webhook("other", "one", short).await.unwrap(),
        Lease::Mine(None),
        "each webhook has its own lease"
    );
    close(two).await;
    close(one).await;
}
