//! The running calls as this replica last wrote their rows, each with the version of its row that the write
//! left: a call's end that finds its call here writes it and records its event in one statement, where it would
//! otherwise read the row it ended to record it (BENCHMARKS.md, "Store: PostgreSQL ending a call as it last wrote
//! it").

use std::collections::{HashMap, VecDeque};

use crate::ids::CallId;
use crate::records::CallView;
use crate::time::Timestamp;

/// How many bytes of calls it keeps at most (see [`weight`]); past that, the longest kept are forgotten, and their
/// ends read them. A call ended by another replica is forgotten only so.
const KEPT: usize = 4 << 20;

/// What keeping `view` takes, about: its arguments (twice when an approver changed them), its Requests' ids, its
/// task's message, and a share for the rest.
fn weight(view: &CallView) -> usize {
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

#[derive(Debug, Default)]
pub struct LastWritten {
    calls: HashMap<CallId, (Written, u64)>,
    /// The calls in the order they were noted, each with the note it was.
    order: VecDeque<(CallId, u64)>,
    notes: u64,
    /// What the calls kept weigh together.
    bytes: usize,
}

impl LastWritten {
    /// Notes `view` as the call's row at `version`.
    pub fn note(&mut self, mut view: CallView, version: String) {
        // As the row holds them.
        view.created_at = Timestamp::from_millis(view.created_at.millis());
        view.updated_at = Timestamp::from_millis(view.updated_at.millis());
        self.take(&view.id);
        self.notes += 1;
        let id = view.id.clone();
        self.bytes += weight(&view);
        self.calls.insert(id.clone(), (Written { view, version }, self.notes));
        self.order.push_back((id, self.notes));
        while self.bytes > KEPT
            && let Some((id, note)) = self.order.pop_front()
        {
            if self.calls.get(&id).is_some_and(|(_, noted)| *noted == note) {
                self.take(&id);
            }
        }
        // The order keeps the notes of calls since taken until they are many.
        if self.order.len() > 2 * self.calls.len() + 64 {
            let calls = &self.calls;
            self.order
                .retain(|(id, note)| calls.get(id).is_some_and(|(_, noted)| noted == note));
        }
    }

    /// Call `id` as last written, forgotten.
    pub fn take(&mut self, id: &CallId) -> Option<Written> {
        let (written, _) = self.calls.remove(id)?;
        self.bytes -= weight(&written.view);
        Some(written)
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
        let mut written = LastWritten::default();
        let first = CallId::mint();
        written.note(view(&first), "10(0,1)".into());
        written.note(view(&first), "11(0,1)".into());
        let others: Vec<CallId> = (1..room).map(|_| CallId::mint()).collect();
        for other in &others {
            written.note(view(other), "1(0,1)".into());
        }
        assert_eq!(written.calls.len(), room, "all kept");
        assert_eq!(
            written.take(&first).map(|written| written.version),
            Some("11(0,1)".to_owned())
        );
        assert!(written.take(&first).is_none(), "taken once");
        written.note(view(&first), "12(0,1)".into());
        written.note(view(&CallId::mint()), "1(0,1)".into());
        assert_eq!(written.calls.len(), room, "{} bytes", written.bytes);
        assert!(written.take(&others[0]).is_none(), "the longest kept is forgotten");
        assert!(written.take(&first).is_some());
        assert!(written.order.len() <= 2 * written.calls.len() + 64);
    }
}
