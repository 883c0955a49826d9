//! Answers on every engine: who may give one, which of two wins, quorums, whole rounds at once, and an
//! elicitation its upstream withdrew.

use super::*;
use crate::decision::Refusal;

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
async fn an_approval_of_three_people_counts_each_once_and_the_last_yes_resolves_it() {
    on_every(|store| async move {
        let mut approval = new_request(None, None);
        approval.request.kind = RequestKind::Approval;
        let data = crate::approvals::request_data("demo", "echo", &json!({}), "ada", &[], false, 3);
        approval.request.data = Some(Arc::new(data));
        let id = approval.request.id.clone();
        store.raise(vec![approval], None, PendingCaps::NONE).await.unwrap();

        let first = store.answer(&id, proposal_by("bo", true)).await.unwrap();
        let Answered::Counted { view, event } = first else {
            panic!("{first:?}");
        };
        assert_eq!((view.status, view.decisions.len()), (Status::Pending, 1));
        assert_eq!(event.kind, EventKind::RequestUpdated);
        let again = store.answer(&id, proposal_by("bo", true)).await.unwrap();
        assert!(matches!(again, Answered::Again(_)), "{again:?}");
        // Two more at once: each is decided on what the other kept, so one counts and the other resolves.
        let (cy, di) = tokio::join!(
            store.answer(&id, proposal_by("cy", true)),
            store.answer(&id, proposal_by("di", true))
        );
        let outcomes = [cy.unwrap(), di.unwrap()];
        let won = outcomes
            .iter()
            .filter(|outcome| matches!(outcome, Answered::Won { .. }))
            .count();
        let counted = outcomes
            .iter()
            .filter(|outcome| matches!(outcome, Answered::Counted { .. }))
            .count();
        assert_eq!((won, counted), (1, 1), "{outcomes:?}");
        let kept = store.request(&id).await.unwrap().unwrap();
        assert_eq!(kept.status, Status::Answered);
        let mut people: Vec<_> = kept
            .decisions
            .iter()
            .map(|signoff| signoff.principal.as_str())
            .collect();
        people.sort_unstable();
        assert_eq!(people, ["bo", "cy", "di"], "{kept:?}");
        assert!(kept.decisions.iter().all(|signoff| signoff.ok));
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
async fn answers_to_whole_rounds_at_once_hand_each_on_once_and_publish_their_events_in_order() {
    const KEYS: usize = 12;
    let dir = tempfile::tempdir().unwrap();
    let [file, database] = durable(&dir);
    for location in &[Location::Memory, file, database] {
        let feed = Feed::default();
        let mut published = feed.subscribe();
        let store = open_publishing(location, feed).await;
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
        // The setup's events, each call's start, its Requests and its status: a PostgreSQL store publishes
        // them once every transaction on the server that took an id before theirs has ended (another test's,
        // here), so the last of them is awaited rather than read as the newest published.
        let mut before = 0;
        for _ in 0..2 * (KEYS + 2) {
            before = published.recv().await.unwrap().id;
        }

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
        // Told it was withdrawn whether or not the answer fits its form.
        for fits in [true, false] {
            let mut form = new_request(None, None);
            let schema = json!({"schema": {"type": "object", "properties": {"confirm": {"type": "boolean"}}}});
            form.request.data = schema.as_object().cloned().map(Arc::new);
            let raised = store.raise(vec![form], None, PendingCaps::NONE).await.unwrap();
            let id = raised[0].request.id.clone();
            let upstream = Upstream::default();
            upstream.withdrawn.cancel();
            let mut proposal = Proposal {
                upstream: Some(upstream),
                ..proposal(true)
            };
            if !fits {
                proposal.answer.data = json!({"confirm": "yes"}).as_object().cloned();
            }
            let outcome = store.answer(&id, proposal).await.unwrap();
            let Answered::Withdrawn(view) = outcome else {
                panic!("{outcome:?}")
            };
            assert_eq!(view.status, Status::Cancelled);
            assert_eq!(view.result, None, "nothing was sent upstream");
            assert_eq!(store.request(&id).await.unwrap().unwrap(), view);
        }
    })
    .await;
}
