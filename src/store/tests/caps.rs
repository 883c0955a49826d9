//! The caps on pending Requests and running calls, and each principal's and server's share of them.

use super::*;

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
