//! Requests that another replica on the same PostgreSQL database resolved reach their waiters here.

use serde_json::json;

use super::*;
use crate::auth::Role;
use crate::feed::Feed;
use crate::ids::RequestId;
use crate::store::Location;
use crate::test_postgres as cluster;

/// A registry on the database at `url` as replica `name`.
async fn replica(url: &str, name: &str) -> Registry {
    let location = Location::Postgres(url.to_owned());
    Registry::opened(&location, name, Duration::from_secs(600)).await.1
}

/// Raises a 2025-11-25 elicitation on `registry` and waits on it there.
async fn ask(registry: &Registry) -> Waiting {
    let params = json!({"message": "Confirm?", "requestedSchema": {"type": "object",
        "properties": {"confirm": {"type": "boolean"}}, "required": ["confirm"]}});
    let origin = Origin {
        server: "demo".into(),
        session: Some(crate::ids::SessionId::stored("ses-1")),
        call: None,
        owner: None,
    };
    registry.ask(params, &origin, CancellationToken::new()).await.unwrap()
}

/// Answers `id` on `registry`, confirming; the `request.resolved` event it recorded.
async fn confirm(registry: &Registry, id: &RequestId) -> Arc<Event> {
    let answer: Answer = serde_json::from_value(json!({"ok": true, "data": {"confirm": true}})).unwrap();
    registry
        .answer(id, &Principal::token("ada", Role::Admin), answer)
        .await
        .unwrap()
        .event
        .unwrap()
}

fn confirmed(outcome: Outcome) -> bool {
    matches!(outcome, Outcome::Reply(result) if result.action == ElicitationAction::Accept)
}

#[tokio::test]
async fn a_request_resolved_elsewhere_whose_read_fails_reaches_its_waiter_once_it_can_be_read() {
    let cluster = cluster::shared();
    let url = cluster.database();
    let (here, elsewhere) = (
        replica(&url, "replica-here").await,
        replica(&url, "replica-elsewhere").await,
    );
    // The test hands `here` the events of what `elsewhere` resolved, so that it can tell when each was taken.
    let events = Feed::default();
    let stop = CancellationToken::new();
    tokio::spawn(here.clone().follow_replicas(events.clone(), stop.clone()));
    let (mut first, mut second) = (ask(&here).await, ask(&here).await);
    let resolved = [
        confirm(&elsewhere, &first.id).await,
        confirm(&elsewhere, &second.id).await,
    ];
    // The first cannot be read, as while the database is down; the second can.
    let status = |status: &str| format!("UPDATE requests SET status = '{status}' WHERE id = '{}'", first.id);
    cluster.query(&url, &status("unreadable")).unwrap();

    events.publish(resolved);
    assert!(confirmed(second.outcome().await));
    cluster.query(&url, &status("answered")).unwrap();

    let outcome = tokio::time::timeout(Duration::from_secs(30), first.outcome()).await;
    assert!(confirmed(
        outcome.expect("the answer reached its waiter once it could be read")
    ));
    stop.cancel();
}
