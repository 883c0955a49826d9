//! Calls recorded but not written yet. A call is written with the first change that concerns it (its first
//! round, its end), when a read asks for it, or once it has run for [`KEEP_AFTER`] without either: a call that
//! ends at once then takes one transaction, and one sync to disk, rather than two (BENCHMARKS.md, "Store: SQLite
//! after answers decided in the writer and calls written with their first change").

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::ids::CallId;
use crate::lock;
use crate::records::CallView;
use crate::store::live::Live;
use crate::store::shares::Running;
use crate::store::{NewCall, StoreError};

/// How long a call may run before it is written though no change has concerned it.
pub const KEEP_AFTER: Duration = Duration::from_secs(1);

/// The calls recorded but not written.
#[derive(Debug, Default)]
pub struct Deferred(Mutex<Calls>);

#[derive(Debug, Default)]
struct Calls {
    by_id: HashMap<CallId, Entry>,
    /// Their ids in the order they were recorded, with when: the oldest are the first due.
    order: VecDeque<(Instant, CallId)>,
    /// How many each owner has: counted with the calls written against `limits.calls_per_principal`.
    running: Running,
}

#[derive(Debug)]
struct Entry {
    call: Arc<ToWrite>,
    /// Taken by a transaction that has not ended.
    writing: bool,
    /// Told once the call is kept, or that it could not be.
    waiters: Vec<oneshot::Sender<Result<(), StoreError>>>,
}

/// A call to write: what it was started with, and its view as recorded.
#[derive(Debug)]
pub struct ToWrite {
    pub call: NewCall,
    pub view: CallView,
}

impl Deferred {
    /// Records a call, unless its owner has `max_running` calls that have not ended, these and the ones `live`
    /// counts together: then `Err` with that number. `Ok(true)` when no other call was due before it, so
    /// that the writer has no timer set.
    pub fn add(&self, call: NewCall, view: CallView, max_running: usize, live: &Mutex<Live>) -> Result<bool, usize> {
        let mut calls = lock(&self.0);
        // Read under this lock: a call moves from here to `live` when it is kept (`live` first), so that it is
        // always counted once at least.
        let running = lock(live).running(&call.owner) + calls.running.of(&call.owner);
        if running >= max_running {
            return Err(running);
        }
        calls.running.start(&call.owner);
        let first = calls.order.is_empty();
        calls.order.push_back((Instant::now(), view.id.clone()));
        let id = view.id.clone();
        let call = Arc::new(ToWrite { call, view });
        calls.by_id.insert(
            id,
            Entry {
                call,
                writing: false,
                waiters: Vec::new(),
            },
        );
        Ok(first)
    }

    /// Call `id` for the change that writes it, unless it is written or being written.
    pub fn take(&self, id: &CallId) -> Option<Arc<ToWrite>> {
        let mut calls = lock(&self.0);
        let entry = calls.by_id.get_mut(id).filter(|entry| !entry.writing)?;
        entry.writing = true;
        Some(entry.call.clone())
    }

    /// When the oldest call recorded is due to be written, if any is waiting.
    pub fn next_due(&self) -> Option<Instant> {
        lock(&self.0).order.front().map(|(since, _)| *since + KEEP_AFTER)
    }

    /// The calls recorded `KEEP_AFTER` ago or earlier, for a change to take and write.
    pub fn due(&self, now: Instant) -> Vec<CallId> {
        let mut calls = lock(&self.0);
        let mut due = Vec::new();
        while let Some((since, _)) = calls.order.front() {
            if now.saturating_duration_since(*since) < KEEP_AFTER {
                break;
            }
            let (_, id) = calls.order.pop_front().expect("a front entry");
            if calls.by_id.get(&id).is_some_and(|entry| !entry.writing) {
                due.push(id);
            }
        }
        due
    }

    /// Every call waiting to be written, for a change to take and write.
    pub fn all(&self) -> Vec<CallId> {
        let calls = lock(&self.0);
        calls
            .by_id
            .iter()
            .filter(|(_, entry)| !entry.writing)
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Whether no call waits to be written.
    pub fn is_empty(&self) -> bool {
        lock(&self.0).by_id.is_empty()
    }

    /// The owner of call `id` while it waits to be written.
    pub fn owner(&self, id: &CallId) -> Option<String> {
        lock(&self.0).by_id.get(id).map(|entry| entry.call.call.owner.clone())
    }

    /// What tells when call `id` is kept, and whether a change must be made to write it (no change is writing
    /// it); `None` when it does not wait to be written.
    pub fn wait(&self, id: &CallId) -> Option<(oneshot::Receiver<Result<(), StoreError>>, bool)> {
        let mut calls = lock(&self.0);
        let entry = calls.by_id.get_mut(id)?;
        let (sender, receiver) = oneshot::channel();
        entry.waiters.push(sender);
        Some((receiver, !entry.writing))
    }

    /// Records what the transaction that wrote `ids` came to: kept, they are forgotten here (the caller has
    /// counted them in `live` already); otherwise they wait to be written again.
    pub fn settle(&self, ids: &[CallId], outcome: &Result<(), StoreError>) {
        let mut calls = lock(&self.0);
        for id in ids {
            let Some(entry) = calls.by_id.get_mut(id) else {
                continue;
            };
            for waiter in entry.waiters.drain(..) {
                let _ = waiter.send(outcome.clone());
            }
            if outcome.is_ok() {
                let owner = entry.call.call.owner.clone();
                calls.by_id.remove(id);
                calls.running.end(&owner);
            } else {
                entry.writing = false;
                calls.order.push_back((Instant::now(), id.clone()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::records::{Arguments, Via};

    fn call(id: &CallId, owner: &str) -> (NewCall, CallView) {
        let new = NewCall {
            server: "demo".into(),
            session: crate::ids::SessionId::stored("ses-1"),
            shared: true,
            tool: "echo".into(),
            arguments: Arguments::empty(),
            owner: owner.into(),
            via: Via::Rest,
            protocol_version: None,
            capabilities: json!({}),
        };
        let view = crate::store::views::started_view(id.clone(), &new, crate::time::Clock::default().now());
        (new, view)
    }

    fn add(deferred: &Deferred, id: &str, owner: &str, max: usize) -> Result<bool, usize> {
        let (new, view) = call(&CallId::stored(id), owner);
        deferred.add(new, view, max, &Mutex::default())
    }

    #[test]
    fn a_call_is_taken_by_one_change_and_forgotten_once_kept() {
        let deferred = Deferred::default();
        add(&deferred, "cal-1", "ada", 10).unwrap();
        let (told, write) = deferred.wait(&CallId::stored("cal-1")).unwrap();
        assert!(write, "nothing writes it yet");
        assert_eq!(deferred.take(&CallId::stored("cal-1")).unwrap().view.id, "cal-1");
        assert!(deferred.take(&CallId::stored("cal-1")).is_none(), "taken once");
        assert!(!deferred.wait(&CallId::stored("cal-1")).unwrap().1, "being written");
        deferred.settle(&[CallId::stored("cal-1")], &Ok(()));
        assert!(matches!(told.blocking_recv(), Ok(Ok(()))));
        assert!(deferred.is_empty());
        assert!(
            deferred.wait(&CallId::stored("cal-1")).is_none() && deferred.owner(&CallId::stored("cal-1")).is_none()
        );
    }

    #[test]
    fn a_call_not_kept_waits_to_be_written_again() {
        let deferred = Deferred::default();
        add(&deferred, "cal-1", "ada", 10).unwrap();
        let (told, _) = deferred.wait(&CallId::stored("cal-1")).unwrap();
        deferred.take(&CallId::stored("cal-1")).unwrap();
        let failed = Err(StoreError::Unavailable("the disk is full".into()));
        deferred.settle(&[CallId::stored("cal-1")], &failed);
        assert!(matches!(told.blocking_recv(), Ok(Err(_))), "its waiter hears why");
        assert_eq!(deferred.owner(&CallId::stored("cal-1")).as_deref(), Some("ada"));
        assert!(
            deferred.take(&CallId::stored("cal-1")).is_some(),
            "written again by the next change"
        );
    }

    #[test]
    fn calls_waiting_to_be_written_count_against_their_owners_cap() {
        let deferred = Deferred::default();
        add(&deferred, "cal-1", "ada", 2).unwrap();
        add(&deferred, "cal-2", "ada", 2).unwrap();
        assert_eq!(add(&deferred, "cal-3", "ada", 2), Err(2));
        add(&deferred, "cal-4", "bob", 2).unwrap();
        deferred.take(&CallId::stored("cal-1"));
        deferred.settle(&[CallId::stored("cal-1")], &Ok(()));
        add(&deferred, "cal-5", "ada", 2).unwrap();
    }

    #[test]
    fn only_calls_recorded_long_enough_ago_are_due() {
        let deferred = Deferred::default();
        assert_eq!(deferred.next_due(), None);
        assert!(add(&deferred, "cal-1", "ada", 10).unwrap(), "the first to wait");
        let first_due = deferred.next_due().unwrap();
        assert!(!add(&deferred, "cal-2", "ada", 10).unwrap(), "a timer is set already");
        assert_eq!(deferred.next_due(), Some(first_due), "the oldest is due first");
        assert!(deferred.due(Instant::now()).is_empty());
        deferred.take(&CallId::stored("cal-1"));
        let later = Instant::now() + KEEP_AFTER;
        assert_eq!(deferred.due(later), ["cal-2"], "one being written is not due");
        assert!(deferred.due(later).is_empty(), "due once");
        assert_eq!(deferred.next_due(), None, "nothing left to time");
        assert_eq!(deferred.all(), ["cal-2"]);
    }
}
