//! The audit chain on every engine: each event published is chained once, in the order of the log, and what
//! a pruning leaves still verifies, its first event following the hash of the last one pruned.

use super::*;
use crate::audit::chainer::{Following, chain_published};
use crate::audit::verify::verify;
use crate::audit::{Entry, GENESIS};

/// Records `count` sessions opened and closed: two events each.
async fn sessions(store: &Store, count: usize) {
    for _ in 0..count {
        let id = SessionId::mint();
        let session = NewSession {
            id: id.clone(),
            replica: "replica-under-test".into(),
            server: "demo".into(),
            owner: Some("ada".into()),
        };
        store.insert_session(session, 4).await.unwrap();
        store.end_session(&id, SessionStatus::Closed, "done").await.unwrap();
    }
}

/// Every event chained after `after`, as an export's lines.
async fn export(store: &Store, after: u64) -> Vec<String> {
    let entries = store.chained_after(after, 10_000).await.unwrap();
    entries
        .iter()
        .map(|entry| serde_json::to_string(entry).unwrap())
        .collect()
}

fn verified(lines: &[String], follows: Option<&str>) -> crate::audit::verify::Verified {
    verify(lines.join("\n").as_bytes(), follows).unwrap_or_else(|broken| panic!("{broken}"))
}

#[tokio::test]
async fn every_event_is_chained_once_in_the_order_of_the_log() {
    on_every(|store| async move {
        let before = store.last_event_id().await.unwrap();
        sessions(&store, 3).await;
        assert!(
            store.chained_after(before, 10).await.unwrap().is_empty(),
            "chained after the fact"
        );

        let head = chain_published(&store).await.unwrap().unwrap();
        let events = store.events_after(before, 10).await.unwrap().events;
        let entries = store.chained_after(before, 10).await.unwrap();
        let ids: Vec<u64> = entries.iter().map(|entry| entry.id).collect();
        assert_eq!(ids, events.iter().map(|event| event.id).collect::<Vec<_>>());
        assert_eq!(
            entries[0].prev, GENESIS,
            "the first event ever follows the genesis hash"
        );
        for (entry, event) in entries.iter().zip(&events) {
            assert_eq!(*entry, Entry::chained(event, &entry.prev), "each hash covers its event");
        }
        assert_eq!(head, entries[5].link());
        assert_eq!(store.chain_head().await.unwrap(), Some(head.clone()));
        assert_eq!(verified(&export(&store, before).await, Some(GENESIS)).events, 6);
        assert_eq!(store.chained_after(before, 2).await.unwrap(), entries[..2]);

        // A chainer that comes second adds nothing, and one whose view is old is told the chain moved on.
        assert_eq!(chain_published(&store).await.unwrap(), Some(head.clone()));
        let stale = Some(entries[4].id);
        assert!(!store.extend_chain(stale, vec![entries[5].link()]).await.unwrap());
        sessions(&store, 1).await;
        let newer = chain_published(&store).await.unwrap().unwrap();
        let rest = store.chained_after(head.id, 10).await.unwrap();
        assert_eq!(rest.len(), 2);
        assert_eq!((rest[0].prev.as_str(), rest[1].link()), (head.hash.as_str(), newer));
    })
    .await;
}

#[tokio::test]
async fn the_chainer_chains_what_the_feed_publishes_and_reads_the_log_for_what_it_missed() {
    let dir = tempfile::tempdir().unwrap();
    let [file, database] = durable(&dir);
    for location in &[Location::Memory, file, database] {
        let feed = Feed::default();
        let mut chain = Following::new(feed.subscribe());
        let store = open_publishing(location, feed).await;
        sessions(&store, 2).await;
        chain.pass(&store).await.unwrap();
        let read = store.last_event_id().await.unwrap();
        assert_eq!(chain.after(), read, "the first pass reads the log");

        sessions(&store, 3).await;
        let published = store.last_event_id().await.unwrap();
        while chain.after() < published {
            assert!(chain.receive().await, "the feed is open");
        }
        assert!(
            store.chained_after(read, 10).await.unwrap().is_empty(),
            "gathered, not chained yet"
        );
        chain.pass(&store).await.unwrap();
        let chained = export(&store, 0).await;
        assert_eq!(
            verified(&chained, Some(GENESIS)).events,
            10,
            "each hash covers its event as kept"
        );

        // More events than the feed keeps for a receiver that does not keep up: the log has them.
        sessions(&store, 520).await;
        let last = store.last_event_id().await.unwrap();
        loop {
            chain.gather();
            chain.pass(&store).await.unwrap();
            if store.chain_head().await.unwrap().map(|link| link.id) == Some(last) {
                break;
            }
            assert!(chain.receive().await, "the feed is open");
        }
        let whole = export(&store, 0).await;
        assert_eq!(whole[..10], chained[..]);
        assert_eq!(verified(&whole, Some(GENESIS)).events, 1050, "{location:?}");
        close(store).await;
    }
}

#[tokio::test]
async fn a_pruning_takes_only_chained_events_and_what_it_leaves_follows_what_it_took() {
    on_every(|store| async move {
        sessions(&store, 2).await;
        let later = || all_before(store.clock().now().after(Duration::from_secs(1)));
        store.prune(later()).await.unwrap();
        let kept = store.events_after(0, 10).await.unwrap();
        assert!(
            !kept.gap && kept.events.len() == 4,
            "nothing goes before it is chained: {kept:?}"
        );

        chain_published(&store).await.unwrap();
        sessions(&store, 1).await;
        chain_published(&store).await.unwrap();
        let whole = export(&store, 0).await;
        assert_eq!(verified(&whole, Some(GENESIS)).events, 6);
        let records_only = Horizons {
            events: store.clock().now().before(Duration::from_secs(3600)),
            ..later()
        };
        store.prune(records_only).await.unwrap();
        assert_eq!(export(&store, 0).await, whole, "events are kept by their own horizon");
        store.prune(later()).await.unwrap();
        let left = export(&store, 0).await;
        if !store.is_durable() {
            assert_eq!(left, whole, "memory keeps the last events, whatever their age");
            return;
        }
        assert_eq!(left, whole[5..], "only the newest event and its link stay");
        let pruned_last = verified(&whole[..5], None).last;
        assert_eq!(
            verified(&left, None).follows,
            pruned_last,
            "it follows the last one pruned"
        );

        sessions(&store, 1).await;
        chain_published(&store).await.unwrap();
        let next = export(&store, 0).await;
        assert_eq!(verified(&next, pruned_last.as_deref()).events, 3, "the chain goes on");
    })
    .await;
}

#[tokio::test]
async fn events_forgotten_before_they_were_chained_start_the_chain_again() {
    let store = open(&Location::Memory).await;
    sessions(&store, 2).await;
    chain_published(&store).await.unwrap();
    sessions(&store, memory::REPLAY_CAPACITY / 2 + 1).await;
    let head = chain_published(&store).await.unwrap().unwrap();
    let lines = export(&store, 0).await;
    assert_eq!(lines.len(), memory::REPLAY_CAPACITY);
    let kept = verified(&lines, Some(GENESIS));
    assert_eq!(kept.last.as_deref(), Some(head.hash.as_str()));
}
