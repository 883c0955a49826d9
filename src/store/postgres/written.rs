//! The running calls as this replica last wrote their rows, in transactions where nothing else wrote them: a
//! call's end that finds its call here writes it and records its event in one statement, where it would otherwise
//! read the row it ended to record it (BENCHMARKS.md, "Store: PostgreSQL ending a call as it last wrote it").

use std::collections::{HashMap, VecDeque};

use super::EVENTS_PER_TRANSACTION;
use crate::ids::CallId;
use crate::records::CallView;
use crate::time::Timestamp;

/// How many bytes of calls it keeps at most (see [`weight`]); past that, the longest kept are forgotten, and their
/// ends read them. A call ended by another replica is forgotten only so.
const KEPT: usize = 4 << 20;

/// What keeping `view` takes, about: its arguments (twice when an approver changed them), and a share for the rest.
fn weight(view: &CallView) -> usize {
    let edited = view.allowed.as_ref().and_then(|allowed| allowed.edited_from.as_ref());
    512 + view.arguments.text().len() + edited.map_or(0, |arguments| arguments.text().len())
}

/// A call as this replica last wrote it.
#[derive(Debug, Clone)]
pub struct Written {
    pub view: CallView,
    /// The version of the call's row that the write left (its `xmin`): the end writes the call only while its
    /// row is still that version, which no change of the row since leaves it.
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
    /// Notes `view` as the transaction that numbered an event `seq` left the call's row: every change of that
    /// transaction's to the row is in `view`.
    pub fn note(&mut self, mut view: CallView, seq: i64) {
        // As the row holds them.
        view.created_at = Timestamp::from_millis(view.created_at.millis());
        view.updated_at = Timestamp::from_millis(view.updated_at.millis());
        self.take(&view.id);
        self.notes += 1;
        let id = view.id.clone();
        self.bytes += weight(&view);
        let version = version(seq);
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

/// The version (`xmin`, a 32-bit transaction id) of the rows that the transaction that numbered an event `seq`
/// wrote: events are numbered from their transaction's 64-bit id (see [`super::writer`]), whose low 32 bits
/// are the id rows carry.
fn version(seq: i64) -> String {
    ((seq / EVENTS_PER_TRANSACTION) & 0xFFFF_FFFF).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The version a transaction's rows carry is the one its events' numbers give.
    #[tokio::test]
    async fn a_rows_version_is_the_one_its_transactions_event_numbers_give() {
        let url = crate::test_postgres::shared().database();
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(connection);
        client
            .batch_execute("CREATE TEMPORARY TABLE versioned (id INTEGER)")
            .await
            .unwrap();
        let row = client
            .query_one(
                &format!(
                    "WITH written AS (INSERT INTO versioned VALUES (1) RETURNING xmin::TEXT AS version) \
                     SELECT pg_current_xact_id()::TEXT::BIGINT * {EVENTS_PER_TRANSACTION} + 3, version FROM written"
                ),
                &[],
            )
            .await
            .unwrap();
        let (seq, written): (i64, String) = (row.get(0), row.get(1));
        assert_eq!(version(seq), written);
        // Past the first epoch, the low 32 bits.
        assert_eq!(version(((5_i64 << 32) + 7) * EVENTS_PER_TRANSACTION + 2), "7");
    }

    #[test]
    fn it_keeps_the_latest_note_of_each_call_and_forgets_the_longest_kept() {
        let call = crate::store::tests::new_call("ada");
        let view = |id: &CallId| crate::store::views::started_view(id.clone(), &call, Timestamp::from_millis(0));
        let room = KEPT / weight(&view(&CallId::mint()));
        let mut written = LastWritten::default();
        let first = CallId::mint();
        written.note(view(&first), 10 * EVENTS_PER_TRANSACTION);
        written.note(view(&first), 11 * EVENTS_PER_TRANSACTION);
        let others: Vec<CallId> = (1..room).map(|_| CallId::mint()).collect();
        for other in &others {
            written.note(view(other), EVENTS_PER_TRANSACTION);
        }
        assert_eq!(written.calls.len(), room, "all kept");
        assert_eq!(
            written.take(&first).map(|written| written.version),
            Some("11".to_owned())
        );
        assert!(written.take(&first).is_none(), "taken once");
        written.note(view(&first), 12 * EVENTS_PER_TRANSACTION);
        written.note(view(&CallId::mint()), EVENTS_PER_TRANSACTION);
        assert_eq!(written.calls.len(), room, "{} bytes", written.bytes);
        assert!(written.take(&others[0]).is_none(), "the longest kept is forgotten");
        assert!(written.take(&first).is_some());
        assert!(written.order.len() <= 2 * written.calls.len() + 64);
    }
}
