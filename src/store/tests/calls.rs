//! A call as it starts and ends.

use super::*;

#[tokio::test]
async fn a_started_call_is_read_by_its_id_before_it_is_kept() {
    on_every(|store| async move {
        let started = store.insert_call(new_call("ada"), 10).await.unwrap();
        let id = started.view.id.clone();
        assert_eq!(
            store.call_status(&id).await.unwrap(),
            Some((CallStatus::Running, "ada".to_owned()))
        );
        assert_eq!(store.call(&id).await.unwrap(), Some(started.view));
        assert!(store.retry(&id).await.unwrap().is_none());
        started.kept.await.unwrap();
    })
    .await;
}

/// Whether a call has ended is read as committed, on PostgreSQL without waiting for this replica's start of the
/// call to be kept (no end is kept before its start).
#[tokio::test]
async fn whether_a_call_has_ended_is_read_as_committed() {
    on_every(|store| async move {
        let started = store.insert_call(new_call("ada"), 10).await.unwrap();
        let id = started.view.id.clone();
        assert!(!store.call_ended(&id).await.unwrap());
        started.kept.await.unwrap();
        assert!(!store.call_ended(&id).await.unwrap());
        let ended = store.finish_call(&id, Finish::Cancelled("done".into())).await.unwrap();
        assert!(ended.is_some());
        assert!(store.call_ended(&id).await.unwrap());
        assert!(
            !store.call_ended(&CallId::mint()).await.unwrap(),
            "an unknown call has not ended"
        );
    })
    .await;
}

/// The task an upstream made of a call: noted on the call (a `call.updated` event each time) while it lives;
/// retried without a round, to follow the task on.
#[tokio::test]
async fn a_calls_task_is_noted_and_followed_on_without_a_round() {
    on_every(|store| async move {
        let call = insert(&store, new_call("ada")).await;
        assert!(store.retry(&call.id).await.unwrap().is_none(), "no round, no task");
        let before = store.last_event_id().await.unwrap();
        let task = CallTask {
            id: "task-1".into(),
            status: "working".into(),
            status_message: Some("Gathering sources".into()),
            expires_at: Some(Clock::default().now().after(Duration::from_secs(60))),
        };
        assert!(store.note_task(&call.id, &task).await.unwrap());
        let noted = store.call(&call.id).await.unwrap().unwrap();
        assert_eq!(noted.task.as_deref(), Some(&task));
        let events = store.events_after(before, 10).await.unwrap().events;
        assert_eq!(events.len(), 1, "{events:?}");
        assert_eq!(events[0].kind, EventKind::CallUpdated);
        let data: Value = serde_json::from_str(&events[0].data).unwrap();
        assert_eq!(data["task"]["statusMessage"], "Gathering sources");

        let retry = store.retry(&call.id).await.unwrap().unwrap();
        assert_eq!((retry.task.as_deref(), retry.round), (Some("task-1"), 0));
        assert!(retry.input_responses.is_empty());

        store.finish_call(&call.id, Finish::failed("done")).await.unwrap();
        assert!(
            !store.note_task(&call.id, &task).await.unwrap(),
            "an ended call notes nothing"
        );
        assert!(store.retry(&call.id).await.unwrap().is_none());
    })
    .await;
}

/// On PostgreSQL, a call's end writes the call as this replica last wrote it (started, or settled by an answer),
/// and records its event, in one statement, while no other change has written the call's row since and its
/// Requests are still those it names; otherwise it reads the call it ended (here after another connection wrote
/// the row, or a pruning took the call's answered Request). Either way its event and its view are the call as
/// the database has it.
#[tokio::test]
async fn a_calls_end_records_the_call_as_its_row_has_it() {
    let url = crate::test_postgres::shared().database();
    let store = replica(&url).await;
    let other = connect_raw(&url).await;
    // Which statement ended each call.
    other
        .batch_execute(
            "CREATE TABLE ended_by (call TEXT, query TEXT); \
             CREATE FUNCTION note_end() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN INSERT INTO ended_by VALUES (NEW.id, current_query()); RETURN NULL; END $$; \
             CREATE TRIGGER note_end AFTER UPDATE OF ended_at ON calls FOR EACH ROW EXECUTE FUNCTION note_end()",
        )
        .await
        .unwrap();
    // Whether the call's Request was answered, another connection wrote its row, a pruning took its Request,
    // and the writer connected again, before it ended.
    let cases = [
        (false, false, false, false),
        (true, false, false, false),
        (false, true, false, false),
        (true, true, false, false),
        (true, false, true, false),
        (true, false, false, true),
    ];
    for (settled, renamed, pruned, reconnected) in cases {
        let call = insert(&store, new_call("ada")).await;
        if settled {
            let raised = replicas::raise_round(&store, &call.id, &["a"]).await;
            let answered = store.answer(&raised[0].request.id, proposal(true)).await.unwrap();
            assert!(
                matches!(answered, Answered::Won { resumes: Some(_), .. }),
                "{answered:?}"
            );
        }
        if renamed {
            let rename = format!("UPDATE calls SET tool = 'renamed' WHERE id = '{}'", call.id);
            other.batch_execute(&rename).await.unwrap();
        }
        if pruned {
            let later = store.clock().now().after(Duration::from_secs(1));
            store.prune(all_before(later)).await.unwrap();
        }
        if reconnected {
            other
                .batch_execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                     WHERE datname = current_database() AND pid <> pg_backend_pid()",
                )
                .await
                .unwrap();
            // A write that finds its connection gone fails, and the writer connects again for the next.
            let nothing = all_before(crate::time::Timestamp::from_millis(0));
            let mut tries = 0;
            while store.prune(nothing).await.is_err() {
                tries += 1;
                assert!(tries < 100, "the writer does not connect again");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        let before = store.last_event_id().await.unwrap();
        let finished = store
            .finish_call(&call.id, Finish::failed("done"))
            .await
            .unwrap()
            .unwrap();
        let read = store.call(&call.id).await.unwrap().unwrap();
        assert_eq!(finished.view, read);
        assert_eq!(
            (read.status, read.tool.as_str(), read.requests.len()),
            (
                CallStatus::Failed,
                if renamed { "renamed" } else { "two_step" },
                usize::from(settled && !pruned)
            )
        );
        let logged = store.events_after(before, 10).await.unwrap().events;
        assert_eq!(logged.len(), 1, "{logged:?}");
        let data: Value = serde_json::from_str(&logged[0].data).unwrap();
        assert_eq!(data, serde_json::to_value(&read).unwrap());
        let query: String = other
            .query_one("SELECT query FROM ended_by WHERE call = $1", &[&call.id.as_str()])
            .await
            .unwrap()
            .get(0);
        assert_eq!(
            query.contains("INSERT INTO events"),
            !renamed && !pruned && !reconnected,
            "settled {settled}, renamed {renamed}, pruned {pruned}, reconnected {reconnected}: {query}"
        );
    }
    close(store).await;
}
