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
