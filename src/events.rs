//! Live events: every change to a Request, Call or Session as a numbered event, with a bounded replay buffer
//! so a client that reconnects with `Last-Event-ID` misses nothing (or is told to re-list).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

/// How many past events a reconnecting client can catch up on.
pub const REPLAY_CAPACITY: usize = 4096;
/// How many events a slow subscriber may fall behind before it is told to re-list.
const CHANNEL_CAPACITY: usize = 1024;

/// What an event reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventKind {
    #[serde(rename = "request.created")]
    RequestCreated,
    #[serde(rename = "request.resolved")]
    RequestResolved,
    #[serde(rename = "call.updated")]
    CallUpdated,
    #[serde(rename = "session.updated")]
    SessionUpdated,
}

impl EventKind {
    /// The SSE `event:` name.
    pub fn name(self) -> &'static str {
        match self {
            EventKind::RequestCreated => "request.created",
            EventKind::RequestResolved => "request.resolved",
            EventKind::CallUpdated => "call.updated",
            EventKind::SessionUpdated => "session.updated",
        }
    }
}

/// One event: its number, kind, the full JSON object, and the tags `GET /events` filters on.
#[derive(Debug)]
pub struct Event {
    pub id: u64,
    pub kind: EventKind,
    pub data: String,
    pub server: String,
    pub session: String,
    pub call: Option<String>,
    pub owner: Option<String>,
}

/// Where an event comes from, for filtering.
#[derive(Debug, Clone, Copy)]
pub struct Tags<'a> {
    pub server: &'a str,
    pub session: &'a str,
    pub call: Option<&'a str>,
    /// The principal that owns the object (`None`: the gateway, as for a shared session).
    pub owner: Option<&'a str>,
}

/// A subscription: the events to replay first, then the live feed.
#[derive(Debug)]
pub struct Subscription {
    /// Missed events still in the buffer, oldest first.
    pub replay: Vec<Arc<Event>>,
    /// Whether some missed events are no longer in the buffer: the client must re-list.
    pub gap: bool,
    pub live: broadcast::Receiver<Arc<Event>>,
}

/// The event feed; cheap to clone.
#[derive(Debug, Clone)]
pub struct Events {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    /// The replay buffer; its lock also orders publication, so ids are gap-free and in order on the channel.
    recent: Mutex<Recent>,
    live: broadcast::Sender<Arc<Event>>,
}

#[derive(Debug, Default)]
struct Recent {
    buffer: VecDeque<Arc<Event>>,
    last_id: u64,
}

impl Default for Events {
    fn default() -> Self {
        let (live, _) = broadcast::channel(CHANNEL_CAPACITY);
        Self {
            shared: Arc::new(Shared {
                recent: Mutex::default(),
                live,
            }),
        }
    }
}

impl Events {
    /// Publishes an event about `object`; the event holds the object's JSON.
    pub fn publish(&self, kind: EventKind, object: &impl Serialize, tags: Tags<'_>) -> Arc<Event> {
        let data = serde_json::to_string(object).unwrap_or_default();
        let mut recent = self.lock();
        recent.last_id += 1;
        let event = Arc::new(Event {
            id: recent.last_id,
            kind,
            data,
            server: tags.server.to_owned(),
            session: tags.session.to_owned(),
            call: tags.call.map(str::to_owned),
            owner: tags.owner.map(str::to_owned),
        });
        if recent.buffer.len() == REPLAY_CAPACITY {
            recent.buffer.pop_front();
        }
        recent.buffer.push_back(event.clone());
        let _ = self.shared.live.send(event.clone());
        event
    }

    /// How many subscriptions are open (one per `GET /events` stream).
    pub fn subscribers(&self) -> usize {
        self.shared.live.receiver_count()
    }

    /// Subscribes to events after `last_seen` (all new ones when `None`).
    pub fn subscribe(&self, last_seen: Option<u64>) -> Subscription {
        let recent = self.lock();
        let live = self.shared.live.subscribe();
        let Some(last_seen) = last_seen else {
            return Subscription {
                replay: Vec::new(),
                gap: false,
                live,
            };
        };
        let oldest = recent.buffer.front().map_or(recent.last_id + 1, |event| event.id);
        let gap = last_seen > recent.last_id || last_seen + 1 < oldest;
        let replay = recent
            .buffer
            .iter()
            .filter(|event| event.id > last_seen)
            .cloned()
            .collect();
        Subscription {
            replay: if gap { Vec::new() } else { replay },
            gap,
            live,
        }
    }

    /// The id of the newest event.
    pub fn last_id(&self) -> u64 {
        self.lock().last_id
    }

    fn lock(&self) -> MutexGuard<'_, Recent> {
        self.shared
            .recent
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TAGS: Tags<'static> = Tags {
        owner: None,
        server: "demo",
        session: "ses-1",
        call: None,
    };

    #[test]
    fn a_reconnect_replays_what_it_missed() {
        let events = Events::default();
        for n in 0..3 {
            events.publish(EventKind::CallUpdated, &n, TAGS);
        }
        let subscription = events.subscribe(Some(1));
        assert!(!subscription.gap);
        assert_eq!(subscription.replay.iter().map(|e| e.id).collect::<Vec<_>>(), [2, 3]);
    }

    #[test]
    fn a_reconnect_past_the_buffer_is_told_to_relist() {
        let events = Events::default();
        for n in 0..REPLAY_CAPACITY + 2 {
            events.publish(EventKind::CallUpdated, &n, TAGS);
        }
        assert!(events.subscribe(Some(1)).gap);
        assert!(!events.subscribe(Some(2)).gap);
        assert!(events.subscribe(Some(u64::MAX)).gap, "an id from another run");
    }

    #[tokio::test]
    async fn live_events_follow_the_replay_without_a_gap() {
        let events = Events::default();
        events.publish(EventKind::CallUpdated, &1, TAGS);
        let mut subscription = events.subscribe(Some(0));
        events.publish(EventKind::CallUpdated, &2, TAGS);
        assert_eq!(subscription.replay.len(), 1);
        assert_eq!(subscription.live.recv().await.unwrap().id, 2);
    }
}
