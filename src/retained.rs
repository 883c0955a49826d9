//! An id-keyed store that keeps insertion order and forgets an entry a while after it ends.

use std::collections::{BTreeMap, HashMap, VecDeque};

use tokio::time::Instant;

/// Entries by id, listed oldest first; a retired entry is forgotten once its time is up.
#[derive(Debug)]
pub struct Retained<V> {
    entries: HashMap<String, (u64, V)>,
    order: BTreeMap<u64, String>,
    next_seq: u64,
    /// Retired entries by the time they are forgotten, in retirement order.
    retired: VecDeque<(Instant, String)>,
}

impl<V> Default for Retained<V> {
    fn default() -> Self {
        Self {
            entries: HashMap::new(),
            order: BTreeMap::new(),
            next_seq: 0,
            retired: VecDeque::new(),
        }
    }
}

impl<V> Retained<V> {
    /// Adds an entry after every other.
    pub fn insert(&mut self, id: String, value: V) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.order.insert(seq, id.clone());
        self.entries.insert(id, (seq, value));
    }

    /// One entry.
    pub fn get(&self, id: &str) -> Option<&V> {
        self.entries.get(id).map(|(_, value)| value)
    }

    /// One entry, to change.
    pub fn get_mut(&mut self, id: &str) -> Option<&mut V> {
        self.entries.get_mut(id).map(|(_, value)| value)
    }

    /// Every entry, oldest first.
    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.order.values().map(|id| &self.entries[id].1)
    }

    /// Forgets the entry at `until` (retire each entry once, with non-decreasing times).
    pub fn retire(&mut self, id: &str, until: Instant) {
        self.retired.push_back((until, id.to_owned()));
    }

    /// Forgets the retired entries whose time has come.
    pub fn purge(&mut self, now: Instant) {
        while let Some((until, id)) = self.retired.front() {
            if *until > now {
                break;
            }
            if let Some((seq, _)) = self.entries.remove(id) {
                self.order.remove(&seq);
            }
            self.retired.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn entries_list_oldest_first_and_go_once_retired_and_due() {
        let mut store = Retained::default();
        for id in ["a", "b", "c"] {
            store.insert(id.to_owned(), id.to_uppercase());
        }
        let now = Instant::now();
        store.retire("b", now);
        store.retire("c", now + Duration::from_secs(60));
        store.purge(now);
        assert_eq!(store.values().cloned().collect::<Vec<_>>(), ["A", "C"]);
        assert!(store.get("b").is_none());
        *store.get_mut("a").unwrap() = "Z".to_owned();
        assert_eq!(store.get("a").map(String::as_str), Some("Z"));
    }
}
