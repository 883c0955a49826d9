//! Standing grants: given once per approval, used by the calls they cover (each use an event), revoked at once.

use super::*;
use crate::ids::GrantId;
use crate::records::{GrantView, NewGrant};
use crate::suspension::{Lasting, Scope};

fn new_grant(owner: &str, scope: Scope, lasting: Lasting, request: &str) -> NewGrant {
    NewGrant {
        id: GrantId::mint(),
        owner: owner.into(),
        server: "demo".into(),
        tool: "two_step".into(),
        scope,
        digest: "d1".into(),
        lasting,
        session: ses_1(),
        by: "lead".into(),
        request: RequestId::stored(request),
    }
}

/// Every duration the tests' grants last.
const ANY: &[Lasting] = &[Lasting::Session, Lasting::For(Duration::from_secs(3600))];

#[tokio::test]
async fn a_grant_is_given_once_used_by_what_it_covers_and_revoked_at_once() {
    on_every(|store| async move {
        let open = NewSession {
            id: ses_1(),
            replica: "replica-under-test".into(),
            server: "demo".into(),
            owner: None,
        };
        store.insert_session(open, 4).await.unwrap();
        let hour = Lasting::For(Duration::from_secs(3600));
        let before = store.last_event_id().await.unwrap();
        let given = store
            .give_grant(new_grant("ada", Scope::SameArguments, hour, "apv-1"))
            .await
            .unwrap();
        let again = store
            .give_grant(new_grant("ada", Scope::Tool, hour, "apv-1"))
            .await
            .unwrap();
        assert_eq!(again, given, "one grant per approval");
        assert_eq!((given.digest.as_deref(), given.session.as_ref()), (Some("d1"), None));
        assert!(given.expires_at.is_some());

        let call = insert(&store, new_call("ada")).await;
        let other = insert(&store, new_call("bob")).await;
        assert_eq!(
            store.use_grant(&call, "d2", ANY).await.unwrap(),
            None,
            "other arguments"
        );
        assert_eq!(
            store.use_grant(&other, "d1", ANY).await.unwrap(),
            None,
            "another principal"
        );
        assert_eq!(
            store.use_grant(&call, "d1", &[Lasting::Session]).await.unwrap(),
            None,
            "a grant its policy no longer offers is passed over"
        );
        let used = store.use_grant(&call, "d1", ANY).await.unwrap().unwrap();
        assert_eq!((used.id.clone(), used.uses), (given.id.clone(), 1));

        let session = store
            .give_grant(new_grant("bob", Scope::Tool, Lasting::Session, "apv-2"))
            .await
            .unwrap();
        assert_eq!(session.digest, None);
        let limit = session.created_at.after(crate::records::SESSION_GRANT_LIMIT);
        assert_eq!(session.expires_at, Some(limit), "a session grant lasts a day at most");
        assert_eq!(session.session, Some(ses_1()));
        let elsewhere = NewCall {
            session: SessionId::stored("ses-2"),
            ..new_call("bob")
        };
        let elsewhere = insert(&store, elsewhere).await;
        assert_eq!(
            store.use_grant(&elsewhere, "d9", ANY).await.unwrap(),
            None,
            "another session"
        );
        assert_eq!(
            store.use_grant(&other, "d9", ANY).await.unwrap().unwrap().id,
            session.id
        );

        assert_eq!(
            store.grants(Some("bob"), 10).await.unwrap(),
            [session.clone()].map(|grant| GrantView { uses: 1, ..grant })
        );
        store
            .end_session(&ses_1(), SessionStatus::Closed, "done")
            .await
            .unwrap();
        assert!(
            store.grants(Some("bob"), 10).await.unwrap().is_empty(),
            "it ends with its session"
        );
        let listed = store.grants(Some("ada"), 10).await.unwrap();
        assert_eq!(listed.iter().map(|grant| &grant.id).collect::<Vec<_>>(), [&given.id]);
        let revoked = store.revoke_grant(&given.id, "ops").await.unwrap().unwrap();
        assert_eq!(revoked.revoked_by.as_deref(), Some("ops"));
        assert!(store.revoke_grant(&given.id, "ops").await.unwrap().is_none(), "once");
        assert_eq!(store.use_grant(&call, "d1", ANY).await.unwrap(), None, "revoked");
        assert!(store.grants(Some("ada"), 10).await.unwrap().is_empty());
        assert_eq!(store.grant(&given.id).await.unwrap(), Some(revoked));

        let kinds: Vec<EventKind> = store
            .events_after(before, 100)
            .await
            .unwrap()
            .events
            .iter()
            .map(|event| event.kind)
            .filter(|kind| kind.name().starts_with("grant."))
            .collect();
        assert_eq!(
            kinds,
            [
                EventKind::GrantCreated,
                EventKind::GrantUsed,
                EventKind::GrantCreated,
                EventKind::GrantUsed,
                EventKind::GrantRevoked
            ]
        );
    })
    .await;
}
