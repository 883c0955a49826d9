//! PostgreSQL replicas raising Requests: side by side while far from the caps, in turn near them, and never
//! past them.

use super::counts::{counted, recounted};
use super::replicas::until_a_lock_is_awaited;
use super::*;

/// A raise of a few Requests far from the caps commits while another replica's raising transaction is in
/// flight.
#[tokio::test]
async fn replicas_raise_side_by_side_while_far_from_the_caps() {
    let url = crate::test_postgres::shared().database();
    let a = replica(&url).await;
    let other = connect_raw(&url).await;
    other
        .batch_execute(&format!("BEGIN; {}", postgres::raising_lock_shared()))
        .await
        .unwrap();

    let raised = tokio::time::timeout(
        Duration::from_secs(30),
        a.raise(vec![new_request(None, None)], None, PendingCaps::NONE),
    )
    .await
    .expect("the raise waited for the other replica's raising");
    assert_eq!(raised.unwrap().len(), 1);
    other.batch_execute("COMMIT").await.unwrap();
    close(a).await;
}

/// A raise that would leave too little room for what another replica's raising in flight may add waits until
/// that commits, and then decides alone, on exact counts.
#[tokio::test]
async fn a_raise_near_a_cap_waits_for_the_raising_in_flight_and_decides_alone() {
    let url = crate::test_postgres::shared().database();
    let a = replica(&url).await;
    let caps = PendingCaps {
        total: 2,
        ..PendingCaps::NONE
    };
    let (other, watcher) = (connect_raw(&url).await, connect_raw(&url).await);
    other
        .batch_execute(&format!("BEGIN; {}", postgres::raising_lock_shared()))
        .await
        .unwrap();

    let raising = tokio::spawn({
        let a = a.clone();
        async move { a.raise(vec![new_request(None, None)], None, caps).await }
    });
    until_a_lock_is_awaited(
        &watcher,
        "the raise near the cap never waited for the raising in flight",
    )
    .await;
    assert!(!raising.is_finished());
    other.batch_execute("COMMIT").await.unwrap();
    assert_eq!(raising.await.unwrap().unwrap().len(), 1);
    a.raise(vec![new_request(None, None)], None, caps).await.unwrap();
    assert!(matches!(
        a.raise(vec![new_request(None, None)], None, caps).await,
        Err(RaiseError::Full(PendingCap::Total(2)))
    ));
    close(a).await;
}

/// Another replica's raising that commits while a raise waits for its call's row is counted: in the pending
/// counts if it committed before they were read, or in the room left for it, as it held the raising lock when
/// its holders were read first.
#[tokio::test]
async fn a_raising_that_commits_while_a_raise_reads_is_counted_once_way_or_the_other() {
    let url = crate::test_postgres::shared().database();
    let a = replica(&url).await;
    let call = insert(&a, new_call("ada")).await.id;
    let caps = PendingCaps {
        total: 1,
        ..PendingCaps::NONE
    };
    let (other, watcher) = (connect_raw(&url).await, connect_raw(&url).await);
    // As another replica's raise of one Request would: the raising lock shared, the Request counted, and the
    // call's row locked.
    other
        .batch_execute(&format!(
            "BEGIN; {}; INSERT INTO pending_shares (owner, server, replica, requests, bytes) \
             VALUES ('ada', 'demo', 'other', 1, 10); SELECT 1 FROM calls WHERE id = '{call}' FOR UPDATE",
            postgres::raising_lock_shared()
        ))
        .await
        .unwrap();

    let raising = tokio::spawn({
        let a = a.clone();
        async move { a.raise(vec![new_request(Some(&call), None)], None, caps).await }
    });
    until_a_lock_is_awaited(&watcher, "the raise never waited for its call's row").await;
    other.batch_execute("COMMIT").await.unwrap();
    let raised = raising.await.unwrap();
    assert!(
        matches!(raised, Err(RaiseError::Full(PendingCap::Total(1)))),
        "{raised:?}"
    );
    close(a).await;
}

/// Raises on three replicas at once, near the cap and past it, admit exactly as many Requests as the cap (in
/// several databases, as the order the raises meet in varies).
#[tokio::test]
async fn the_pending_cap_holds_exactly_across_replicas_raising_at_once() {
    const CAP: usize = 8;
    let caps = PendingCaps {
        total: CAP,
        ..PendingCaps::NONE
    };
    for _ in 0..4 {
        let url = crate::test_postgres::shared().database();
        let mut replicas = Vec::new();
        for _ in 0..3 {
            replicas.push(replica(&url).await);
        }
        let mut raising = tokio::task::JoinSet::new();
        for nth in 0..48 {
            let store = replicas[nth % replicas.len()].clone();
            raising.spawn(async move {
                match store.raise(vec![new_request(None, None)], None, caps).await {
                    Ok(_) => true,
                    Err(RaiseError::Full(PendingCap::Total(CAP))) => false,
                    Err(error) => panic!("{error}"),
                }
            });
        }
        assert_eq!(admitted(raising).await, CAP);
        assert_eq!(replicas[0].pending_count().await.unwrap(), CAP);
        assert_eq!(counted(&url).await, recounted(&url).await);
        for store in replicas {
            close(store).await;
        }
    }
}

/// Raises on one call at once are never pipelined together: each reads the call as the one before it left it,
/// so the call becomes `input_required` once, with every Request (a raise that foresaw its call wrongly fails a
/// check of debug builds, as these tests are).
#[tokio::test]
async fn raises_on_one_call_at_once_each_read_the_call_as_the_last_left_it() {
    let url = crate::test_postgres::shared().database();
    let a = replica(&url).await;
    let call = insert(&a, new_call("ada")).await.id;
    let mut raising = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let (a, call) = (a.clone(), call.clone());
        raising.spawn(async move {
            a.raise(vec![new_request(Some(&call), None)], None, PendingCaps::NONE)
                .await
                .unwrap()
        });
    }
    raising.join_all().await;
    let read = a.call(&call).await.unwrap().unwrap();
    assert_eq!((read.status, read.requests.len()), (CallStatus::InputRequired, 8));
    let updated: i64 = connect_raw(&url)
        .await
        .query_one(
            "SELECT count(*) FROM events WHERE kind = 'call.updated' AND call_id = $1",
            &[&call],
        )
        .await
        .unwrap()
        .get(0);
    // Its start's, and the one that made it `input_required`.
    assert_eq!(updated, 2, "the call became input_required more than once");
    close(a).await;
}

/// A raise decided on its call as this replica wrote it, which another replica has ended since, runs again
/// reading the call, and raises nothing.
#[tokio::test]
async fn a_raise_on_a_call_ended_elsewhere_since_this_replica_wrote_it_raises_nothing() {
    let url = crate::test_postgres::shared().database();
    let (here, there) = (replica(&url).await, replica(&url).await);
    let call = insert(&here, new_call("ada")).await;
    there
        .finish_call(&call.id, Finish::Cancelled("elsewhere".into()))
        .await
        .unwrap()
        .expect("ended there");
    let raised = here
        .raise(vec![new_request(Some(&call.id), None)], None, PendingCaps::NONE)
        .await;
    assert!(
        matches!(&raised, Err(RaiseError::CallEnded(ended)) if *ended == call.id),
        "{raised:?}"
    );
    assert_eq!(here.pending_count().await.unwrap(), 0);
    close(here).await;
    close(there).await;
}

/// A raise decided on its call as this replica wrote it checks the caps in its own exchange, against what
/// other replicas have raised meanwhile.
#[tokio::test]
async fn a_raise_on_a_call_written_here_fits_the_caps_that_other_replicas_fill() {
    let url = crate::test_postgres::shared().database();
    let (here, there) = (replica(&url).await, replica(&url).await);
    let call = insert(&here, new_call("ada")).await;
    let caps = PendingCaps {
        total: 2,
        ..PendingCaps::NONE
    };
    there
        .raise(vec![new_request(None, None), new_request(None, None)], None, caps)
        .await
        .unwrap();
    let raised = here.raise(vec![new_request(Some(&call.id), None)], None, caps).await;
    assert!(
        matches!(&raised, Err(RaiseError::Full(PendingCap::Total(2)))),
        "{raised:?}"
    );
    assert_eq!(here.pending_count().await.unwrap(), 2);
    close(here).await;
    close(there).await;
}
