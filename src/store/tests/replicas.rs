//! PostgreSQL replicas sharing one database: what they decide side by side, their caps, and the locks they
//! wait for.

use super::counts::{counted, recounted};
use super::*;

#[tokio::test]
async fn an_elicitation_withdrawn_after_its_answers_were_sent_takes_none() {
    // PostgreSQL's writer is a task of this test's runtime, so the answers wait for it until this test
    // yields; the other stores' writers do not wait.
    let store = open(&Location::Postgres(crate::test_postgres::shared().database())).await;
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
    let url = crate::test_postgres::shared().database();
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
    crate::test_postgres::shared()
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

/// Two replicas answer a call's last two Requests at once: the other replica's answer is in flight (its
/// transaction open, its call settled as it saw it) when this one's runs, and commits first.
#[tokio::test]
async fn answers_to_a_calls_last_two_requests_committed_side_by_side_leave_it_running_and_hand_it_on_once() {
    let url = crate::test_postgres::shared().database();
    let store = replica(&url).await;
    let call = insert(&store, new_call("ada")).await;
    let raised = raise_round(&store, &call.id, &["a", "b"]).await;

    let (other, watcher) = (connect_raw(&url).await, connect_raw(&url).await);
    other
        .batch_execute(&format!(
            "BEGIN; UPDATE requests SET status = 'answered' WHERE id = '{}'; \
             UPDATE calls AS c SET pending = c.pending - 1, \
             status = CASE WHEN c.pending > 1 THEN 'input_required' ELSE 'running' END WHERE c.id = '{}'",
            raised[0].request.id, call.id
        ))
        .await
        .unwrap();
    let before = store.last_event_id().await.unwrap();
    let view = raised[1].clone();
    let answering = tokio::spawn({
        let store = store.clone();
        async move { store.answer(&view.request.id, proposal(true)).await }
    });
    // This one's answer waits for the call's row, which the other holds. Read while two were pending, it was
    // sent expecting to leave the call as it was, and its transaction to end behind it: it finds otherwise, and
    // runs again.
    until_a_lock_is_awaited(&watcher, "the answer never waited for the other").await;
    other.batch_execute("COMMIT").await.unwrap();

    let answered = answering.await.unwrap().unwrap();
    assert!(
        matches!(answered, Answered::Won { resumes: Some(_), .. }),
        "{answered:?}"
    );
    assert_eq!(store.call(&call.id).await.unwrap().unwrap().status, CallStatus::Running);
    // Nothing of the first run was kept.
    let logged = store.events_after(before, 10).await.unwrap().events;
    let kinds: Vec<EventKind> = logged.iter().map(|event| event.kind).collect();
    assert_eq!(
        kinds,
        [EventKind::RequestResolved, EventKind::CallUpdated],
        "{logged:?}"
    );
    store.close().await;
}

/// An answer to a call's only pending Request foresees the call settled, from the call's row as read; another
/// change of that row, in flight as the answer reads and committed before the answer's statement runs, makes
/// the answer run again, and settle the call as the row now is.
#[tokio::test]
async fn an_answer_that_foresaw_its_call_settled_runs_again_when_the_calls_row_changed_meanwhile() {
    let url = crate::test_postgres::shared().database();
    let store = replica(&url).await;
    let call = insert(&store, new_call("ada")).await;
    let raised = raise_round(&store, &call.id, &["a"]).await;

    let (other, watcher) = (connect_raw(&url).await, connect_raw(&url).await);
    other
        .batch_execute(&format!(
            "BEGIN; UPDATE calls SET tool = 'renamed' WHERE id = '{}'",
            call.id
        ))
        .await
        .unwrap();
    let before = store.last_event_id().await.unwrap();
    let id = raised[0].request.id.clone();
    let answering = tokio::spawn({
        let store = store.clone();
        async move { store.answer(&id, proposal(true)).await }
    });
    until_a_lock_is_awaited(&watcher, "the answer never waited for the call's row").await;
    other.batch_execute("COMMIT").await.unwrap();

    let answered = answering.await.unwrap().unwrap();
    let Answered::Won {
        resumes: Some(retry), ..
    } = answered
    else {
        panic!("{answered:?}")
    };
    assert_eq!(
        retry.tool, "renamed",
        "what retrying takes is read from the row as the other change left it"
    );
    let settled = store.call(&call.id).await.unwrap().unwrap();
    assert_eq!(
        (settled.status, settled.tool.as_str()),
        (CallStatus::Running, "renamed")
    );
    let logged = store.events_after(before, 10).await.unwrap().events;
    let kinds: Vec<EventKind> = logged.iter().map(|event| event.kind).collect();
    assert_eq!(
        kinds,
        [EventKind::RequestResolved, EventKind::CallUpdated],
        "{logged:?}"
    );
    assert!(logged[1].data.contains("\"renamed\""), "{logged:?}");
    store.close().await;
}

/// A call whose start is decided but whose commit waits (here for a lock a trigger takes as it commits) is read
/// by its id once it is kept, never as missing.
#[tokio::test]
async fn a_call_read_while_its_start_commits_is_read_once_kept() {
    let url = crate::test_postgres::shared().database();
    let store = replica(&url).await;
    let (other, watcher) = (connect_raw(&url).await, connect_raw(&url).await);
    other
        .batch_execute(
            "CREATE FUNCTION held() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN PERFORM pg_advisory_xact_lock_shared(77); RETURN NULL; END $$; \
             CREATE CONSTRAINT TRIGGER held AFTER INSERT ON calls DEFERRABLE INITIALLY DEFERRED \
             FOR EACH ROW EXECUTE FUNCTION held(); \
             SELECT pg_advisory_lock(77)",
        )
        .await
        .unwrap();
    // Every read connection open with the reads below prepared, so that a read goes out at once.
    let unknown = CallId::mint();
    for _ in 0..postgres::READERS {
        store.call_status(&unknown).await.unwrap();
    }
    for _ in 0..postgres::READERS {
        store.call(&unknown).await.unwrap();
    }
    let started = store.insert_call(new_call("ada"), 10).await.unwrap();
    until_a_lock_is_awaited(&watcher, "the start's commit never waited for the trigger").await;

    let id = started.view.id.clone();
    let (status, call) = (store.call_status(&id), store.call(&id));
    let (mut status, mut call) = (Box::pin(status), Box::pin(call));
    assert!(futures::poll!(&mut status).is_pending() && futures::poll!(&mut call).is_pending());
    other.batch_execute("SELECT pg_advisory_unlock(77)").await.unwrap();

    assert_eq!(status.await.unwrap(), Some((CallStatus::Running, "ada".to_owned())));
    assert_eq!(call.await.unwrap(), Some(started.view));
    started.kept.await.unwrap();
    close(store).await;
}

/// A raise that more than doubles the pending Requests has PostgreSQL take the statistics of Requests again, so
/// that statements are not planned on figures from when few were pending.
#[tokio::test]
async fn a_raise_that_doubles_the_pending_requests_has_their_statistics_taken_again() {
    let url = crate::test_postgres::shared().database();
    let store = replica(&url).await;
    let raw = connect_raw(&url).await;
    // `ANALYZE` commands only, not autovacuum's.
    let analyzed = async || -> i64 {
        raw.query_one(
            "SELECT analyze_count FROM pg_stat_user_tables WHERE relname = 'requests'",
            &[],
        )
        .await
        .unwrap()
        .get(0)
    };
    assert_eq!(analyzed().await, 0);
    let few = (0..10).map(|_| new_request(None, None)).collect();
    store.raise(few, None, PendingCaps::NONE).await.unwrap();
    let many = (0..1_000).map(|_| new_request(None, None)).collect();
    store.raise(many, None, PendingCaps::NONE).await.unwrap();

    let deadline = Instant::now() + Duration::from_secs(30);
    while analyzed().await == 0 {
        assert!(Instant::now() < deadline, "the statistics were never taken");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    close(store).await;
}

/// One replica's writer waits on a call's row, which another transaction holds: its transaction stays open, and
/// the other replica starts and ends calls and sessions meanwhile, committing side by side with it.
#[tokio::test]
async fn a_replica_waiting_on_a_row_leaves_another_starting_and_ending_calls_and_sessions() {
    let url = crate::test_postgres::shared().database();
    let a = replica(&url).await;
    let b = replica(&url).await;
    let held = insert(&a, new_call("ada")).await;
    let (other, watcher) = (holding_call(&url, &held.id).await, connect_raw(&url).await);
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
    let url = crate::test_postgres::shared().database();
    let a = replica(&url).await;
    let b = replica(&url).await;
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

/// Calls of hundreds of principals started at once share one transaction, which begins holding each one's
/// lock: the reply to its `BEGIN` is read while the calls' statements run after it.
#[tokio::test]
async fn calls_of_hundreds_of_principals_start_in_one_transaction() {
    let store = open(&Location::Postgres(crate::test_postgres::shared().database())).await;
    // All submitted before the writer (a task of this test's runtime) takes any: one batch.
    let starts = (0..500).map(|nth| store.insert_call(new_call(&format!("principal-{nth}")), 1));
    let started = tokio::time::timeout(Duration::from_secs(30), futures::future::join_all(starts))
        .await
        .expect("the writer never finished the batch");
    for started in started {
        started.unwrap().kept.await.unwrap();
    }
    close(store).await;
}

/// A call that ends while a replica is raising Requests on it, and waits for that raise's lock on its row,
/// cancels the Requests the raise committed.
#[tokio::test]
async fn a_call_that_ends_after_a_raise_on_it_commits_cancels_what_it_raised() {
    let url = crate::test_postgres::shared().database();
    let a = replica(&url).await;
    let b = replica(&url).await;
    let call = insert(&a, new_call("ada")).await;
    a.raise(vec![new_request(Some(&call.id), None)], None, PendingCaps::NONE)
        .await
        .unwrap();
    let (other, watcher) = (connect_raw(&url).await, connect_raw(&url).await);
    // The raise below waits for this, having locked the call's row.
    other
        .batch_execute("BEGIN; SELECT 1 FROM pending_shares FOR UPDATE")
        .await
        .unwrap();
    let raising = tokio::spawn({
        let (a, call) = (a.clone(), call.id.clone());
        async move {
            a.raise(vec![new_request(Some(&call), None)], None, PendingCaps::NONE)
                .await
        }
    });
    until_locks_are_awaited(&watcher, 1, "the raise never waited").await;
    let finishing = tokio::spawn({
        let (b, call) = (b.clone(), call.id.clone());
        async move { b.finish_call(&call, Finish::failed("done")).await }
    });
    until_locks_are_awaited(&watcher, 2, "the call's end never waited for the raise").await;

    other.batch_execute("COMMIT").await.unwrap();
    let raised = raising.await.unwrap().unwrap();
    let finished = finishing.await.unwrap().unwrap().unwrap();
    assert_eq!(finished.cancelled.len(), 2, "{:?}", finished.cancelled);
    let late = a.request(&raised[0].request.id).await.unwrap().unwrap();
    assert_eq!(late.status, Status::Cancelled);
    assert_eq!(a.pending_count().await.unwrap(), 0);
    assert_eq!(counted(&url).await, recounted(&url).await);
    close(a).await;
    close(b).await;
}

/// Two replicas start many calls of one principal at once: the cap admits exactly as many as it allows, on
/// both together, and the counts are the calls'.
#[tokio::test]
async fn a_principals_cap_holds_exactly_across_replicas_starting_calls_at_once() {
    const CAP: usize = 3;
    let url = crate::test_postgres::shared().database();
    let a = replica(&url).await;
    let b = replica(&url).await;
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
    assert_eq!(admitted(starting).await, CAP);
    assert_eq!(counted(&url).await.1, vec![("ada".to_owned(), 3)]);
    assert_eq!(counted(&url).await, recounted(&url).await);
    close(a).await;
    close(b).await;
}

/// While another transaction holds a principal's lock, a replica starts that principal's calls within its
/// allowance of the cap; one whose allowance is spent waits for the lock, to deal the cap again.
#[tokio::test]
async fn a_replica_starts_calls_within_its_allowance_while_another_holds_the_principals_lock() {
    let url = crate::test_postgres::shared().database();
    let a = replica(&url).await;
    let b = replica(&url).await;
    // Dealt half of the cap of 10.
    insert(&a, new_call("ada")).await;
    let (other, watcher) = (connect_raw(&url).await, connect_raw(&url).await);
    other
        .batch_execute(&format!("BEGIN; {}", postgres::principal_lock("ada")))
        .await
        .unwrap();

    let within = tokio::time::timeout(Duration::from_secs(30), async {
        for _ in 0..4 {
            insert(&a, new_call("ada")).await;
        }
    });
    within
        .await
        .expect("a start within the replica's allowance waited for the principal's lock");
    let dealing = tokio::spawn({
        let b = b.clone();
        async move { insert(&b, new_call("ada")).await }
    });
    until_a_lock_is_awaited(&watcher, "the start of a replica without an allowance never waited").await;
    let spent = a.insert_call(new_call("ada"), 10);
    let (spent, _) = tokio::join!(spent, async {
        until_locks_are_awaited(&watcher, 2, "the start past the allowance never waited").await;
        assert!(!dealing.is_finished(), "a replica without an allowance started a call");
        other.batch_execute("COMMIT").await.unwrap();
    });
    spent.unwrap().kept.await.unwrap();
    dealing.await.unwrap();
    assert_eq!(counted(&url).await.1, vec![("ada".to_owned(), 7)]);
    assert_eq!(counted(&url).await, recounted(&url).await);
    close(a).await;
    close(b).await;
}

/// Raises round 1 of `call`: a Request for each of `keys`.
pub(super) async fn raise_round(store: &Store, call: &CallId, keys: &[&str]) -> Vec<RequestView> {
    let round = NewRound {
        call: call.clone(),
        number: 1,
        request_state: None,
        input_requests: keys
            .iter()
            .map(|key| ((*key).to_owned(), json!({"method": "elicitation/create"})))
            .collect(),
    };
    let requests = keys.iter().map(|key| new_request(Some(call), Some(key))).collect();
    store.raise(requests, Some(round), PendingCaps::NONE).await.unwrap()
}

/// Returns once `watcher` sees a transaction of its database waiting for a lock; fails, saying `never`, after
/// 30 s.
pub(super) async fn until_a_lock_is_awaited(watcher: &tokio_postgres::Client, never: &str) {
    until_locks_are_awaited(watcher, 1, never).await;
}

/// Returns once `watcher` sees `count` transactions of its database waiting for locks (other tests' do not
/// count); fails, saying `never`, after 30 s.
async fn until_locks_are_awaited(watcher: &tokio_postgres::Client, count: i64, never: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let waiting: i64 = watcher
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if waiting >= count {
            return;
        }
        assert!(Instant::now() < deadline, "{never}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn gateways_sharing_a_database_take_a_webhook_over_once_its_lease_runs_out() {
    let url = crate::test_postgres::shared().database();
    let one = replica(&url).await;
    let two = replica(&url).await;
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
