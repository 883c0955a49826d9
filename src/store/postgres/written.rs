//! Rows as this replica last wrote them, so that a change that finds its row here needs no read of it:
//! - the running calls, each with the version of its row that the write left: a call's end that finds its call
//!   writes it and records its event in one statement, where it would otherwise read the row it ended to record
//!   it (BENCHMARKS.md, "Store: PostgreSQL ending a call as it last wrote it");
//! - the Requests raised here, with what resolving each does to its call: an answer is decided on them, where it
//!   would otherwise read the Request and its call first (BENCHMARKS.md, "Store: an answer decided on the Request
//!   as its replica raised it"). The answer's statement writes only over what it was decided on, as it does after
//!   a read.
//!
//! Both are forgotten each time the writer connects: after a failover or a restore, transaction ids are given
//! again.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;

use super::rounds::ToAnswer;
use crate::ids::{CallId, RequestId};
use crate::records::CallView;
use crate::time::Timestamp;

/// How many bytes of each it keeps at most, as their notes weigh them; past that, the longest kept are forgotten,
/// and what would have found them reads their rows. A call ended, or a Request answered, by another replica is
/// forgotten only so.
const KEPT: usize = 4 << 20;

/// What keeping `view` takes, about: its arguments (twice when an approver changed them), its Requests' ids, its
/// task's message, and a share for the rest.
pub fn weight(view: &CallView) -> usize {
    let edited = view.allowed.as_ref().and_then(|allowed| allowed.edited_from.as_ref());
    let message = view.task.as_ref().and_then(|task| task.status_message.as_ref());
    512 + view.arguments.text().len()
        + edited.map_or(0, |arguments| arguments.text().len())
        + 64 * view.requests.len()
        + message.map_or(0, String::len)
}

/// A call as this replica last wrote it, and the version of the call's row that the write left (see
/// [`super::rows::version`]): the end writes the call only while its row is still that version, and the call has
/// as many Requests as the view names. A call's Requests are not in its row: each raise writes the row, but the
/// pruning deletes old resolved ones without writing it, and the list a statement returns with the row is read
/// as the statement began.
#[derive(Debug, Clone)]
pub struct Written {
    pub view: CallView,
    pub version: String,
}

/// What this replica last wrote.
#[derive(Debug, Default)]
pub struct LastWritten {
    pub calls: Kept<CallId, Written>,
    pub requests: Kept<RequestId, ToAnswer>,
}

impl LastWritten {
    /// Keeps call `view` as its row holds it at `version`.
    pub fn note_call(&mut self, mut view: CallView, version: String) {
        // As the row holds them.
        view.created_at = Timestamp::from_millis(view.created_at.millis());
        view.updated_at = Timestamp::from_millis(view.updated_at.millis());
        let weight = weight(&view);
        self.calls.note(view.id.clone(), Written { view, version }, weight);
    }
}

/// Values by their key, [`KEPT`] bytes of them at most.
#[derive(Debug)]
pub struct Kept<K, V> {
    /// Each with its note and its weight.
    values: HashMap<K, (V, u64, usize)>,
    /// The keys in the order they were noted, each with the note it was.
    order: VecDeque<(K, u64)>,
    notes: u64,
    /// What the values kept weigh together.
    bytes: usize,
}

impl<K, V> Default for Kept<K, V> {
    fn default() -> Self {
        Self {
            values: HashMap::new(),
            order: VecDeque::new(),
            notes: 0,
            bytes: 0,
        }
    }
}

impl<K: Hash + Eq + Clone, V> Kept<K, V> {
    /// Keeps `value`, which weighs `weight` bytes, under `key`, in place of what was.
    pub fn note(&mut self, key: K, value: V, weight: usize) {
        self.take(&key);
        self.notes += 1;
        self.bytes += weight;
        self.values.insert(key.clone(), (value, self.notes, weight));
        self.order.push_back((key, self.notes));
        while self.bytes > KEPT
            && let Some((key, note)) = self.order.pop_front()
        {
            if self.values.get(&key).is_some_and(|(_, noted, _)| *noted == note) {
                self.take(&key);
            }
        }
        // The order keeps the notes of values since taken until they are many.
        if self.order.len() > 2 * self.values.len() + 64 {
            let values = &self.values;
            self.order
                .retain(|(key, note)| values.get(key).is_some_and(|(_, noted, _)| noted == note));
        }
    }

    /// What `key` keeps, forgotten.
    pub fn take(&mut self, key: &K) -> Option<V> {
        self.take_weighed(key).map(|(value, _)| value)
    }

    /// What `key` keeps, forgotten, with what it weighs.
    pub fn take_weighed(&mut self, key: &K) -> Option<(V, usize)> {
        let (value, _, weight) = self.values.remove(key)?;
        self.bytes -= weight;
        Some((value, weight))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_keeps_the_latest_note_of_each_call_and_forgets_the_longest_kept() {
        let call = crate::store::tests::new_call("ada");
        let view = |id: &CallId| crate::store::views::started_view(id.clone(), &call, Timestamp::from_millis(0));
        let room = KEPT / weight(&view(&CallId::mint()));
        let mut last = LastWritten::default();
        let mut note = |id: &CallId, version: &str| last.note_call(view(id), version.into());
        let first = CallId::mint();
        note(&first, "10(0,1)");
        note(&first, "11(0,1)");
        let others: Vec<CallId> = (1..room).map(|_| CallId::mint()).collect();
        for other in &others {
            note(other, "1(0,1)");
        }
        let written = &mut last.calls;
        assert_eq!(written.values.len(), room, "all kept");
        assert_eq!(
            written.take(&first).map(|written| written.version),
            Some("11(0,1)".to_owned())
        );
        assert!(written.take(&first).is_none(), "taken once");
        last.note_call(view(&first), "12(0,1)".into());
        last.note_call(view(&CallId::mint()), "1(0,1)".into());
        let written = &mut last.calls;
        assert_eq!(written.values.len(), room, "{} bytes", written.bytes);
        assert!(written.take(&others[0]).is_none(), "the longest kept is forgotten");
        assert!(written.take(&first).is_some());
        assert!(written.order.len() <= 2 * written.values.len() + 64);
    }
}
