//! Listing Requests by who answered them, what they decided, and the tool whose call raised them.

use super::*;
use crate::records::DecisionFilter;
use crate::suspension::Reason;

/// `who`'s answer with `verdict`, without data.
fn answer_by(who: &str, verdict: Verdict) -> Proposal {
    let mut proposal = proposal_by(who, true);
    proposal.answer = Answer {
        id: String::new(),
        verdict,
        data: None,
        grant: None,
    };
    proposal
}

/// The ids of the Requests `filter` lists, oldest first.
async fn listed(store: &Store, filter: Filter) -> Vec<RequestId> {
    let (page, next) = store.requests(&filter, 0, 100).await.unwrap();
    assert_eq!(next, None);
    page.into_iter().map(|view| view.request.id).collect()
}

#[tokio::test]
async fn requests_are_listed_by_who_answered_what_was_decided_and_the_tool_that_asked() {
    on_every(|store| async move {
        let echo = insert(
            &store,
            NewCall {
                tool: "echo".into(),
                ..new_call("ada")
            },
        )
        .await;
        let two_step = insert(&store, new_call("ada")).await;
        let raised = store
            .raise(
                vec![
                    new_request(Some(&echo.id), None),
                    new_request(Some(&echo.id), None),
                    new_request(Some(&two_step.id), None),
                    new_request(Some(&two_step.id), None),
                    posted_request("ada"),
                    new_request(Some(&two_step.id), None),
                ],
                None,
                PendingCaps::NONE,
            )
            .await
            .unwrap();
        let ids: Vec<RequestId> = raised.iter().map(|view| view.request.id.clone()).collect();
        let answers = [
            answer_by("bo", Verdict::Accept),
            answer_by("cy", Verdict::Refuse(Some(Reason::Declined))),
            answer_by("bo", Verdict::Refuse(Some(Reason::Cancelled))),
            answer_by("cy", Verdict::Refuse(None)),
            answer_by("bo", Verdict::Accept),
        ];
        for (id, answer) in ids.iter().zip(answers) {
            let outcome = store.answer(id, answer).await.unwrap();
            assert!(matches!(outcome, Answered::Won { .. }), "{outcome:?}");
        }
        // The last one expires: its answer refuses, but nobody decided it.
        let expired = store
            .expire_due(Clock::default().now().after(Duration::from_secs(120)), 10)
            .await
            .unwrap();
        assert_eq!(expired.views.len(), 1);
        let pick = |ids: &[RequestId], at: &[usize]| at.iter().map(|&i| ids[i].clone()).collect::<Vec<_>>();
        let by = |name: &str| Filter {
            answered_by: Some(name.into()),
            ..Filter::default()
        };
        let decided = |decision| Filter {
            decision: Some(decision),
            ..Filter::default()
        };
        let of = |tool: &str| Filter {
            tool: Some(tool.into()),
            ..Filter::default()
        };

        assert_eq!(listed(&store, by("bo")).await, pick(&ids, &[0, 2, 4]));
        assert_eq!(listed(&store, by("cy")).await, pick(&ids, &[1, 3]));
        assert!(listed(&store, by("b")).await.is_empty());
        let accepted = listed(&store, decided(DecisionFilter::Accepted)).await;
        assert_eq!(accepted, pick(&ids, &[0, 4]));
        let declined = listed(&store, decided(DecisionFilter::Declined)).await;
        assert_eq!(declined, pick(&ids, &[1]));
        let cancelled = listed(&store, decided(DecisionFilter::Cancelled)).await;
        assert_eq!(cancelled, pick(&ids, &[2, 3]), "not the expired one");
        assert_eq!(listed(&store, of("echo")).await, pick(&ids, &[0, 1]));
        assert_eq!(listed(&store, of("two_step")).await, pick(&ids, &[2, 3, 5]));
        assert!(listed(&store, of("two")).await.is_empty());

        let combined = Filter {
            status: Some(Status::Answered),
            answered_by: Some("bo".into()),
            tool: Some("two_step".into()),
            ..Filter::default()
        };
        assert_eq!(listed(&store, combined).await, pick(&ids, &[2]));
        let expired = Filter {
            status: Some(Status::Expired),
            ..of("two_step")
        };
        assert_eq!(listed(&store, expired).await, pick(&ids, &[5]));
        let never = Filter {
            status: Some(Status::Expired),
            ..decided(DecisionFilter::Cancelled)
        };
        assert!(listed(&store, never).await.is_empty());
    })
    .await;
}
