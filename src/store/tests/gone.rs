//! A gone replica's work, recovered by another replica side by side with the rest of the fleet's changes.

use super::counts::{counted, recounted};
use super::replicas::until_a_lock_is_awaited;
use super::*;

/// The id of replica `store`.
fn replica_id(store: &Store) -> String {
    let Store::Postgres(postgres) = store else {
        unreachable!()
    };
    postgres.replica().to_owned()
}

/// Closes replica `gone` and has its heartbeat read as older than any lease; returns its id.
async fn taken_for_gone(url: &str, gone: Store) -> String {
    let id = replica_id(&gone);
    close(gone).await;
    connect_raw(url)
        .await
        .execute("UPDATE replicas SET heartbeat_at = 0 WHERE id = $1", &[&id])
        .await
        .unwrap();
    id
}

/// Opens session `ses_1` on the replica `store`.
async fn open_session(store: &Store) {
    let session = NewSession {
        id: ses_1(),
        replica: replica_id(store),
        server: "demo".to_owned(),
        owner: Some("ada".to_owned()),
    };
    store.insert_session(session, 5).await.unwrap();
}

/// The Requests raised on a gone replica's session for no call, more than one transaction of the recovery
/// takes, are all cancelled, and its session closed.
#[tokio::test]
async fn every_request_raised_on_a_gone_replicas_session_is_cancelled() {
    let url = crate::test_postgres::shared().database();
    let gone = replica(&url).await;
    open_session(&gone).await;
    let requests = (0..300).map(|_| new_request(None, None)).collect();
    gone.raise(requests, None, PendingCaps::NONE).await.unwrap();
    taken_for_gone(&url, gone).await;
    let a = replica(&url).await;

    let recovered = a.reap().await.unwrap();
    assert_eq!((recovered.ended_requests, recovered.pending), (300, 0));
    let session = a.session(&ses_1()).await.unwrap().unwrap();
    assert_eq!(session.status, SessionStatus::Closed);
    assert_eq!(counted(&url).await, recounted(&url).await);
    close(a).await;
}

/// A replica recovering a gone replica's work waits for a row of it that another transaction holds, and holds
/// up no other replica meanwhile: no transaction takes a lock that every other one takes. Once the row is let
/// go, the recovery ends the gone replica's call and cancels what it raised.
#[tokio::test]
async fn a_replica_recovering_a_gone_ones_work_holds_up_no_other_replica() {
    let url = crate::test_postgres::shared().database();
    let gone = replica(&url).await;
    let held = insert(
        &gone,
        NewCall {
            protocol_version: Some("2025-11-25".into()),
            ..new_call("ada")
        },
    )
    .await;
    let raised = gone
        .raise(vec![new_request(Some(&held.id), None)], None, PendingCaps::NONE)
        .await
        .unwrap();
    taken_for_gone(&url, gone).await;
    let (a, b) = (replica(&url).await, replica(&url).await);
    let (other, watcher) = (holding_call(&url, &held.id).await, connect_raw(&url).await);
    let reaping = tokio::spawn({
        let a = a.clone();
        async move { a.reap().await }
    });
    until_a_lock_is_awaited(&watcher, "the recovery never waited for the call's row").await;

    // A call started, a Request raised on it and answered, the call ended, a webhook's lease taken and a key
    // kept, while `a` recovers.
    tokio::time::timeout(Duration::from_secs(30), async {
        let call = insert(&b, new_call("ada")).await;
        let asked = b
            .raise(vec![new_request(Some(&call.id), None)], None, PendingCaps::NONE)
            .await
            .unwrap();
        let answered = b.answer(&asked[0].request.id, proposal(true)).await.unwrap();
        assert!(matches!(answered, Answered::Won { .. }), "{answered:?}");
        b.finish_call(&call.id, Finish::failed("done")).await.unwrap().unwrap();
        let lease = b.hold_webhook("hook", "b", Duration::from_secs(60)).await.unwrap();
        assert!(matches!(lease, Lease::Mine(None)), "{lease:?}");
        assert_eq!(b.kept_key("signing", "made").await.unwrap(), "made");
    })
    .await
    .expect("the other replica's changes waited for the recovery");
    assert!(!reaping.is_finished(), "the recovery did not wait for the row");

    other.batch_execute("COMMIT").await.unwrap();
    let recovered = reaping.await.unwrap().unwrap();
    assert_eq!((recovered.ended_calls, recovered.ended_requests), (1, 1));
    let ended = a.call(&held.id).await.unwrap().unwrap();
    assert_eq!(ended.status, CallStatus::Failed);
    let request = a.request(&raised[0].request.id).await.unwrap().unwrap();
    assert_eq!(request.status, Status::Cancelled);
    assert_eq!(counted(&url).await, recounted(&url).await);
    close(a).await;
    close(b).await;
}

/// A gone replica's work, more calls and more Requests on its session than one transaction takes, recovered
/// while another replica answers those Requests: each is resolved once, by its answer or by the recovery,
/// whichever came first (a change that lost a deadlock to the other runs again), every call ends, the counts
/// hold, and the gone replica's record goes.
#[tokio::test]
async fn answers_to_a_gone_replicas_requests_while_it_is_recovered_resolve_each_once() {
    let url = crate::test_postgres::shared().database();
    let gone = replica(&url).await;
    open_session(&gone).await;
    let mut asked = Vec::new();
    for _ in 0..300 {
        let call = NewCall {
            protocol_version: Some("2025-11-25".into()),
            ..new_call("ada")
        };
        let started = gone.insert_call(call, 1000).await.unwrap();
        started.kept.await.unwrap();
        let call = started.view;
        let raised = gone
            .raise(vec![new_request(Some(&call.id), None)], None, PendingCaps::NONE)
            .await
            .unwrap();
        asked.push((Some(call.id), raised[0].request.id.clone()));
        // Raised on the session for no call, as an elicitation no call can be told for.
        let raised = gone
            .raise(vec![new_request(None, None)], None, PendingCaps::NONE)
            .await
            .unwrap();
        asked.push((None, raised[0].request.id.clone()));
    }
    let gone_id = taken_for_gone(&url, gone).await;
    let (a, b) = (replica(&url).await, replica(&url).await);

    let answering = asked.iter().map(|(_, id)| b.answer(id, proposal(true)));
    let (recovered, answers) = tokio::join!(a.reap(), futures::future::join_all(answering));
    let recovered = recovered.unwrap();
    let mut won = 0;
    for ((call, id), answered) in asked.iter().zip(answers) {
        let request = a.request(id).await.unwrap().unwrap();
        match answered.unwrap() {
            Answered::Won { .. } => {
                assert_eq!(request.status, Status::Answered);
                won += 1;
            }
            Answered::Lost(_) => assert_eq!(request.status, Status::Cancelled),
            other => panic!("{other:?}"),
        }
        if let Some(call) = call {
            assert_eq!(a.call(call).await.unwrap().unwrap().status, CallStatus::Failed);
        }
    }
    assert_eq!(
        (recovered.ended_calls, recovered.ended_requests),
        (asked.len() / 2, asked.len() - won)
    );
    assert_eq!(counted(&url).await, recounted(&url).await);
    let records = connect_raw(&url)
        .await
        .query("SELECT 1 FROM replicas WHERE id = $1", &[&gone_id])
        .await
        .unwrap();
    assert!(records.is_empty(), "the gone replica's record stayed");
    close(a).await;
    close(b).await;
}

/// No change of a replica is kept once another has begun to end what it held, and it learns at its next
/// heartbeat that it was taken for gone, though it still runs (as one stopped, or cut off from the database,
/// does once it comes back). One whose heartbeat is only late renews it.
#[tokio::test]
async fn no_change_of_a_replica_taken_for_gone_is_kept_and_its_next_heartbeat_tells_it() {
    let url = crate::test_postgres::shared().database();
    let (taken, late) = (replica(&url).await, replica(&url).await);
    let (taken_id, late_id) = (replica_id(&taken), replica_id(&late));
    let held = insert(&taken, new_call("ada")).await;
    let a = replica(&url).await;
    let (raw, watcher) = (connect_raw(&url).await, connect_raw(&url).await);
    let other = holding_call(&url, &held.id).await;
    let lapsed = "UPDATE replicas SET heartbeat_at = 1 WHERE id = $1";
    // The recovery waits for the call's row once it has closed the replica's sessions; again when the
    // replica's heartbeat renewed its lease between the two statements, and nothing was gone.
    let mut reaping = loop {
        raw.execute(lapsed, &[&taken_id]).await.unwrap();
        let mut reaping = tokio::spawn({
            let a = a.clone();
            async move { a.reap().await }
        });
        tokio::select! {
            () = until_a_lock_is_awaited(&watcher, "the recovery never waited for the call's row") => break reaping,
            done = &mut reaping => assert_eq!(done.unwrap().unwrap().ended_calls, 0),
        }
    };
    // Half way through, no change of it is kept any longer. (The row is held no longer than that: a
    // transaction open anywhere in the cluster holds back the events of every test.)
    let session = NewSession {
        id: SessionId::stored("ses-after"),
        replica: taken_id.clone(),
        server: "demo".to_owned(),
        owner: None,
    };
    let refused = tokio::time::timeout(Duration::from_secs(10), taken.insert_session(session, 5))
        .await
        .expect("the change is refused at once, not once the recovery ends");
    assert!(futures::FutureExt::now_or_never(&mut reaping).is_none());
    other.batch_execute("COMMIT").await.unwrap();
    assert!(
        matches!(refused, Err(InsertSessionError::Store(StoreError::Unavailable(_)))),
        "{refused:?}"
    );
    assert!(a.session(&SessionId::stored("ses-after")).await.unwrap().is_none());
    assert_eq!(reaping.await.unwrap().unwrap().ended_calls, 1);
    let gone = "SELECT 1 FROM replicas WHERE id = $1";
    assert!(raw.query_opt(gone, &[&taken_id]).await.unwrap().is_none());
    // Nor is a change that records no event.
    let key = taken.kept_key("after-gone", "secret").await;
    assert!(matches!(key, Err(StoreError::Unavailable(_))), "{key:?}");
    let kept = "SELECT 1 FROM keys WHERE name = 'after-gone'";
    assert!(raw.query_opt(kept, &[]).await.unwrap().is_none());
    tokio::time::timeout(Duration::from_secs(10), taken.taken_for_gone())
        .await
        .expect("a heartbeat tells the replica it was taken for gone");

    raw.execute(lapsed, &[&late_id]).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let recorded = "SELECT heartbeat_at FROM replicas WHERE id = $1";
    while raw.query_one(recorded, &[&late_id]).await.unwrap().get::<_, i64>(0) == 1 {
        assert!(Instant::now() < deadline, "the late replica renews its heartbeat");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(futures::FutureExt::now_or_never(late.taken_for_gone()).is_none());
    for store in [taken, late, a] {
        close(store).await;
    }
}
