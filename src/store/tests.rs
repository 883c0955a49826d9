//! The store's verbs, each checked against every backend: what they decide must not depend on where the
//! state lives.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::*;
use crate::auth::{Principal, Role};
use crate::decision::{Rules, Upstream};
use crate::ids::{CallId, RequestId, SessionId};
use crate::records::{Arguments, CallStatus, CallTask, EventKind, Finish, SessionFilter, SessionStatus, Status, Via};
use crate::suspension::{Answer, Request, RequestKind, Verdict};
use std::sync::Arc;

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
        Location::Postgres(crate::test_postgres::shared().database()),
    ]
}

async fn open(location: &Location) -> Store {
    open_publishing(location, Feed::default()).await
}

/// [`open`], publishing what the store records to `feed`.
async fn open_publishing(location: &Location, feed: Feed) -> Store {
    Store::open(
        location,
        feed,
        Duration::from_secs(3600),
        "replica-under-test",
        Clock::default(),
    )
    .await
    .unwrap()
}

/// A replica of its own on the PostgreSQL database at `url`, beside any other opened on it.
pub(super) async fn replica(url: &str) -> Store {
    Store::Postgres(Postgres::open(url, Feed::default(), Clock::default()).await.unwrap())
}

/// Lets a store finish its changes and give its file or database up.
pub(super) async fn close(store: Store) {
    match store {
        Store::Memory(_) => {}
        Store::Sqlite(sqlite) => sqlite.close(),
        Store::Postgres(postgres) => postgres.close().await,
    }
}

pub(super) fn new_call(owner: &str) -> NewCall {
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

pub(super) fn new_request(call: Option<&CallId>, input_key: Option<&str>) -> NewRequest {
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
pub(super) fn proposal(confirm: bool) -> Proposal {
    proposal_by("tester", confirm)
}

/// [`proposal`], by `who`.
fn proposal_by(who: &str, confirm: bool) -> Proposal {
    Proposal {
        answer: Answer {
            id: String::new(),
            verdict: Verdict::Accept,
            data: json!({"confirm": confirm}).as_object().cloned(),
            grant: None,
        },
        by: Principal::token(who, Role::Admin),
        upstream: None,
        rules: Arc::new(Rules {
            apply_defaults: true,
            forms: Arc::default(),
        }),
    }
}

/// The horizons of a pruning that forgets every record and event from before `instant`.
fn all_before(instant: crate::time::Timestamp) -> Horizons {
    Horizons {
        records: instant,
        events: instant,
    }
}

/// Records a call and waits until it is kept.
pub(super) async fn insert(store: &Store, call: NewCall) -> crate::records::CallView {
    let started = store.insert_call(call, 10).await.unwrap();
    started.kept.await.unwrap();
    started.view
}

/// A session that ends with more Requests pending than one transaction resolves has each of them cancelled once.
#[tokio::test]
async fn a_session_ending_with_hundreds_pending_has_each_cancelled_once() {
    on_every(|store| async move {
        let requests = (0..600).map(|_| new_request(None, None)).collect();
        store.raise(requests, None, PendingCaps::NONE).await.unwrap();
        let resolution = Resolution::Cancelled {
            detail: "the session ended".to_owned(),
            told_cancel: false,
        };
        let resolved = store.resolve(Pending::Session(ses_1()), resolution).await.unwrap();
        let mut ids: Vec<_> = resolved.views.iter().map(|view| view.request.id.clone()).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), 600);
        assert!(resolved.views.iter().all(|view| view.status == Status::Cancelled));
        assert_eq!(store.pending_count().await.unwrap(), 0);
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
        let started = store.clock().now();
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
        let stamped = page.events.iter().map(|event| event.at);
        assert!(stamped.clone().all(|at| started <= at && at <= store.clock().now()));
        assert!(stamped.clone().zip(stamped.skip(1)).all(|(one, next)| one <= next));
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
        crate::audit::chainer::chain_published(&store).await.unwrap();
        store
            .prune(all_before(Clock::default().now().after(Duration::from_secs(1))))
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

mod answers;
mod audit;
mod calls;
mod caps;
mod counts;
mod filters;
mod gone;
mod grants;
mod layout;
mod raising;
mod replicas;
mod restarts;

/// A burst of reads on a PostgreSQL replica that has no read connection yet opens the few a replica keeps,
/// not one a read: under a role that may hold only a few more connections than that, every read succeeds.
#[tokio::test]
async fn a_burst_of_reads_on_a_new_replica_opens_only_the_connections_it_keeps() {
    let url = crate::test_postgres::shared().database();
    let config: tokio_postgres::Config = url.parse().unwrap();
    let database = config.get_dbname().unwrap().to_owned();
    let role = format!("few_{database}");
    let limit = postgres::READERS + 4;
    connect_raw(&url)
        .await
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN CONNECTION LIMIT {limit}; ALTER DATABASE {database} OWNER TO {role}"
        ))
        .await
        .unwrap();
    let user = config.get_user().unwrap();
    let limited = url.replacen(&format!("{user}@"), &format!("{role}@"), 1);
    assert_ne!(limited, url);
    let store = replica(&limited).await;

    let reads = futures::future::join_all((0..100).map(|_| store.pending_count())).await;
    for read in reads {
        assert_eq!(read.unwrap(), 0);
    }
    close(store).await;
}

/// How many of `tasks` were admitted: returned true.
async fn admitted(tasks: tokio::task::JoinSet<bool>) -> usize {
    tasks.join_all().await.into_iter().filter(|admitted| *admitted).count()
}

/// A connection of its own to the PostgreSQL database at `url`, beside the store's.
pub(super) async fn connect_raw(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    client
}

/// A connection of its own to `url` holding call `call`'s row, in a transaction it keeps until `COMMIT`.
async fn holding_call(url: &str, call: &CallId) -> tokio_postgres::Client {
    let other = connect_raw(url).await;
    other
        .batch_execute(&format!("BEGIN; SELECT 1 FROM calls WHERE id = '{call}' FOR UPDATE"))
        .await
        .unwrap();
    other
}
