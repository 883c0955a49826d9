//! The event log as every replica sees it: events are published here in the order they were numbered,
//! whichever replica recorded them. A replica's writer hands on what it just kept; events other replicas
//! recorded are read from the log whenever the database says one committed (`LISTEN`), after a reconnect,
//! and at least every second, so that a missed notification delays an event but never loses it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::Notify;
use tokio_postgres::{AsyncMessage, Client};
use tokio_util::sync::CancellationToken;

use super::{Connector, Postgres, lock_mutex};
use crate::feed::Feed;
use crate::records::Event;

/// The channel a transaction that recorded events notifies.
pub const CHANNEL: &str = "toolnexus_events";
/// How often the log is read without being told of a commit.
const POLL: Duration = Duration::from_secs(1);
/// How long a lost listening connection waits before connecting again.
const RECONNECT: Duration = Duration::from_secs(1);
/// How many events one read of the log takes.
const PAGE: usize = 1000;

/// Publishes events in the order of their ids, each once.
#[derive(Debug)]
pub struct Publisher {
    feed: Feed,
    /// The id of the last event published.
    last: Mutex<u64>,
    /// Asks the tail to read the log.
    wake: Notify,
}

impl Publisher {
    /// Publishes from after event `last`.
    pub fn new(feed: Feed, last: u64) -> Self {
        Self {
            feed,
            last: Mutex::new(last),
            wake: Notify::new(),
        }
    }

    /// Publishes events this replica just kept, unless events before them are not published yet: then the
    /// tail reads them all from the log.
    pub fn kept(&self, events: Vec<Arc<Event>>) {
        let Some(first) = events.first() else { return };
        let mut last = lock_mutex(&self.last);
        if first.id == *last + 1 {
            *last = events.last().map_or(*last, |event| event.id);
            self.feed.publish(events);
        } else if first.id > *last + 1 {
            self.wake.notify_one();
        }
    }

    /// Publishes what was read from the log after `after`, skipping what was published meanwhile.
    fn read(&self, events: Vec<Arc<Event>>) {
        let mut last = lock_mutex(&self.last);
        let fresh: Vec<Arc<Event>> = events.into_iter().filter(|event| event.id > *last).collect();
        if let Some(newest) = fresh.last() {
            *last = newest.id;
            self.feed.publish(fresh);
        }
    }

    fn last(&self) -> u64 {
        *lock_mutex(&self.last)
    }
}

/// Follows the log until `stop` fires.
pub async fn run(store: Postgres, publisher: Arc<Publisher>, stop: CancellationToken) {
    loop {
        let listening = match listen(&store.shared.connector, publisher.clone(), store.replica()).await {
            Ok(listening) => Some(listening),
            Err(error) => {
                tracing::warn!(%error, "the store cannot listen for other replicas' events; it reads its log every second");
                None
            }
        };
        loop {
            catch_up(&store, &publisher).await;
            tokio::select! {
                () = publisher.wake.notified() => {}
                () = tokio::time::sleep(POLL) => {}
                () = stop.cancelled() => return,
            }
            if listening.as_ref().is_none_or(|(_, closed)| closed.is_cancelled()) {
                break;
            }
        }
        tokio::select! {
            () = tokio::time::sleep(RECONNECT) => {}
            () = stop.cancelled() => return,
        }
    }
}

/// Reads the log up to its end.
async fn catch_up(store: &Postgres, publisher: &Publisher) {
    loop {
        match store.events_after(publisher.last(), PAGE).await {
            Ok(page) if page.gap => {
                // Pruned before this replica read them: what follows is published from the oldest kept.
                tracing::warn!(
                    after = publisher.last(),
                    "events left the log before this replica read them"
                );
                *lock_mutex(&publisher.last) = page.resume_after;
            }
            Ok(page) => {
                let full = page.events.len() == PAGE;
                publisher.read(page.events);
                if !full {
                    return;
                }
            }
            Err(error) => {
                tracing::warn!(%error, "the store's event log could not be read");
                return;
            }
        }
    }
}

/// A connection that listens on [`CHANNEL`] and wakes the tail on each notification from another replica
/// than `replica` (whose writer publishes what it keeps), with a token that fires when it closes.
async fn listen(
    connector: &Connector,
    publisher: Arc<Publisher>,
    replica: &str,
) -> Result<(Client, CancellationToken), tokio_postgres::Error> {
    let replica = replica.to_owned();
    let (client, mut connection) = connector.config.connect(tokio_postgres::NoTls).await?;
    let closed = CancellationToken::new();
    let ended = closed.clone();
    let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
    tokio::spawn(async move {
        while let Some(message) = messages.next().await {
            match message {
                Ok(AsyncMessage::Notification(told)) if told.payload() != replica => publisher.wake.notify_one(),
                Ok(_) => {}
                Err(error) => {
                    tracing::warn!(%error, "the store's listening connection ended");
                    break;
                }
            }
        }
        ended.cancel();
    });
    client.batch_execute(&format!("LISTEN {CHANNEL}")).await?;
    Ok((client, closed))
}
