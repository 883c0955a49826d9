//! An id-keyed store that keeps insertion order, indexes the entries still live, and forgets an entry a
//! while after it is retired.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::ops::RangeFrom;
use std::sync::Arc;

use crate::time::Timestamp;

/// Entries by id, listed oldest first; a retired entry is forgotten once its time is up.
///
/// Every listing of live entries walks the live index only, so its cost does not grow with the entries
/// retired and still kept.
#[derive(Debug)]
pub struct Retained<V> {
    entries: HashMap<Arc<str>, (u64, V)>,
    /// Every entry by insertion sequence number.
    order: BTreeMap<u64, Arc<str>>,
    /// The sequence numbers of the entries not yet retired.
    live: BTreeSet<u64>,
    next_seq: u64,
    /// Retired entries by the time they are forgotten, in retirement order.
    retired: VecDeque<(Timestamp, Arc<str>)>,
}

impl<V> Default for Retained<V> {
    fn default() -> Self {
        Self {
            entries: HashMap::new(),
            order: BTreeMap::new(),
            live: BTreeSet::new(),
            next_seq: 0,
            retired: VecDeque::new(),
        }
    }
}

impl<V> Retained<V> {
    /// Adds a live entry after every other.
    pub fn insert(&mut self, id: impl AsRef<str>, value: V) {
        let id: Arc<str> = id.as_ref().into();
        let seq = self.next_seq;
        self.next_seq += 1;
        self.order.insert(seq, id.clone());
        self.live.insert(seq);
        self.entries.insert(id, (seq, value));
    }

    /// One entry.
    pub fn get(&self, id: impl AsRef<str>) -> Option<&V> {
        self.entries.get(id.as_ref()).map(|(_, value)| value)
    }

    /// One entry, to change.
    pub fn get_mut(&mut self, id: impl AsRef<str>) -> Option<&mut V> {
        self.entries.get_mut(id.as_ref()).map(|(_, value)| value)
    }

    /// Every entry with its sequence number, oldest first, from sequence number `from`.
    pub fn range(&self, from: RangeFrom<u64>) -> impl Iterator<Item = (u64, &V)> {
        self.order.range(from).map(|(seq, id)| (*seq, &self.entries[id].1))
    }

    /// The live entries with their sequence numbers, oldest first, from sequence number `from`.
    pub fn live_range(&self, from: RangeFrom<u64>) -> impl Iterator<Item = (u64, &V)> {
        self.live
            .range(from)
            .map(|seq| (*seq, &self.entries[&self.order[seq]].1))
    }

    /// Every entry, oldest first.
    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.range(0..).map(|(_, value)| value)
    }

    /// The live entries, oldest first.
    pub fn live(&self) -> impl Iterator<Item = &V> {
        self.live_range(0..).map(|(_, value)| value)
    }

    /// How many entries are live.
    pub fn live_count(&self) -> usize {
        self.live.len()
    }

    /// Retires a live entry: it leaves the live index and is forgotten at `until` (retire with
    /// non-decreasing times). Retiring an entry again, or an unknown one, does nothing.
    pub fn retire(&mut self, id: impl AsRef<str>, until: Timestamp) {
        if let Some((id, (seq, _))) = self.entries.get_key_value(id.as_ref())
            && self.live.remove(seq)
        {
            self.retired.push_back((until, id.clone()));
        }
    }

    /// When the next retired entry is due to be forgotten.
    pub fn next_purge(&self) -> Option<Timestamp> {
        self.retired.front().map(|(until, _)| *until)
    }

    /// Forgets a retired entry before its time; `None` if it is live or unknown.
    pub fn forget(&mut self, id: impl AsRef<str>) -> Option<V> {
        let id = id.as_ref();
        let (seq, _) = self.entries.get(id)?;
        if self.live.contains(seq) {
            return None;
        }
        let (seq, value) = self.entries.remove(id)?;
        self.order.remove(&seq);
        Some(value)
    }

    /// The id of the entry retired longest ago that is still kept.
    pub fn oldest_retired(&mut self) -> Option<Arc<str>> {
        while let Some((_, id)) = self.retired.front() {
            if self.entries.contains_key(id) {
                return Some(id.clone());
            }
            self.retired.pop_front();
        }
        None
    }

    /// Forgets the retired entries whose time has come, and returns them.
    pub fn purge(&mut self, now: Timestamp) -> Vec<V> {
        let mut purged = Vec::new();
        while let Some((until, id)) = self.retired.front() {
            if *until > now {
                break;
            }
            if let Some((seq, value)) = self.entries.remove(id) {
                self.order.remove(&seq);
                purged.push(value);
            }
            self.retired.pop_front();
        }
        purged
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Test instants: `Timestamp::now()` does not repeat, so tests build theirs from a fixed one.
    fn now() -> Timestamp {
        Timestamp::from_millis(1_000_000)
    }

    #[test]
    fn entries_list_oldest_first_and_go_once_retired_and_due() {
        let mut store = Retained::default();
        for id in ["a", "b", "c"] {
            store.insert(id, id.to_uppercase());
        }
        let now = now();
        store.retire("b", now);
        store.retire("c", now.after(Duration::from_secs(60)));
        assert_eq!(store.next_purge(), Some(now));
        assert_eq!(store.purge(now), ["B"]);
        assert_eq!(store.values().cloned().collect::<Vec<_>>(), ["A", "C"]);
        assert_eq!(store.next_purge(), Some(now.after(Duration::from_secs(60))));
        assert!(store.get("b").is_none());
        *store.get_mut("a").unwrap() = "Z".to_owned();
        assert_eq!(store.get("a").map(String::as_str), Some("Z"));
    }

    #[test]
    fn the_live_index_holds_what_is_not_retired() {
        let mut store = Retained::default();
        for id in ["a", "b", "c", "d"] {
            store.insert(id, id);
        }
        let later = now().after(Duration::from_secs(60));
        store.retire("b", later);
        store.retire("b", later);
        store.retire("nobody", later);
        assert_eq!(store.live().copied().collect::<Vec<_>>(), ["a", "c", "d"]);
        assert_eq!(store.live_count(), 3);
        assert_eq!(store.live_range(2..).collect::<Vec<_>>(), [(2, &"c"), (3, &"d")]);
        assert_eq!(store.range(1..).map(|(seq, _)| seq).collect::<Vec<_>>(), [1, 2, 3]);
        store.purge(later);
        assert_eq!(store.values().copied().collect::<Vec<_>>(), ["a", "c", "d"]);
        assert_eq!(store.next_purge(), None);
    }
}
