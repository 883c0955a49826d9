//! A call as it starts.

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
