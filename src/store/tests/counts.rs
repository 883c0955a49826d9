//! The counts PostgreSQL keeps so that every replica admits against the same figures: pending Requests per
//! owner and server, and running calls per principal.

use super::*;

#[tokio::test]
async fn a_postgres_database_of_the_first_schema_counts_its_pending_requests_and_running_calls() {
    let url = crate::test_postgres::shared().database();
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
    let url = crate::test_postgres::shared().database();
    let a = replica(&url).await;
    let b = replica(&url).await;
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
    // Raised at once on both: the raising lock decides them one after the other.
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
        "nothing is counted once nothing is pending or running"
    );
    close(a).await;
    close(b).await;
}

/// The pruning folds every replica's pending counts, and the live calls of a replica that is gone, into the rows
/// of none, deletes the rows that count nothing, and leaves a live replica's rows of live calls with the
/// allowance they hold, so that it goes on starting calls without dealing the cap again.
#[tokio::test]
async fn pruning_folds_the_counts_and_keeps_the_allowances_of_live_replicas() {
    let url = crate::test_postgres::shared().database();
    let store = replica(&url).await;
    insert(&store, new_call("ada")).await;
    let raw = connect_raw(&url).await;
    raw.batch_execute("INSERT INTO live_calls (owner, replica, calls) VALUES ('ada', 'gone', 1), ('bob', 'gone', 0)")
        .await
        .unwrap();
    let allowances = async || -> Vec<(String, i64, i64)> {
        raw.query(
            "SELECT replica, calls, allowance FROM live_calls WHERE owner = 'ada' ORDER BY replica",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2)))
        .collect()
    };
    let before = allowances().await;
    let (replica, calls, allowance) = before.iter().find(|(replica, ..)| replica != "gone").unwrap().clone();
    assert!(calls == 1 && allowance > 1, "{before:?}");
    // Counts that only add up across replicas: a Request raised on one and answered on another.
    raw.execute(
        "INSERT INTO pending_shares (owner, server, replica, requests, bytes) \
         VALUES ('ada', 'demo', 'gone', 2, 20), ('ada', 'demo', $1, -1, -10), ('bob', 'demo', 'gone', 1, 10), \
         ('bob', 'demo', $1, -1, -10)",
        &[&replica],
    )
    .await
    .unwrap();

    store.prune(all_before(Clock::default().now())).await.unwrap();
    assert_eq!(
        allowances().await,
        vec![(String::new(), 1, 0), (replica, calls, allowance)]
    );
    let shares: Vec<(String, String, i64)> = raw
        .query(
            "SELECT owner, replica, requests FROM pending_shares ORDER BY owner, replica",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2)))
        .collect();
    assert_eq!(shares, vec![("ada".to_owned(), String::new(), 1)]);
    let bob: i64 = raw
        .query_one("SELECT count(*) FROM live_calls WHERE owner = 'bob'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(bob, 0, "a row that counts nothing is deleted");
    close(store).await;
}

/// What a PostgreSQL database's counting tables hold: pending shares, then live calls.
pub(super) async fn counted(url: &str) -> (Vec<(String, String, i64, i64)>, Vec<(String, i64)>) {
    counts(
        url,
        "SELECT owner, server, sum(requests)::BIGINT, sum(bytes)::BIGINT FROM pending_shares GROUP BY 1, 2 \
         HAVING sum(requests) <> 0 OR sum(bytes) <> 0 ORDER BY 1, 2",
        "SELECT owner, sum(calls)::BIGINT FROM live_calls GROUP BY owner HAVING sum(calls) <> 0 ORDER BY owner",
    )
    .await
}

/// What a PostgreSQL database's counting tables should hold, counted from its rows.
pub(super) async fn recounted(url: &str) -> (Vec<(String, String, i64, i64)>, Vec<(String, i64)>) {
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
