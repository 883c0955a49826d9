//! The running calls as this replica last wrote their rows, each with the version of its row that the write
//! left: a call's end that finds its call here writes it and records its event in one statement, where it would
//! otherwise read the row it ended to record it (BENCHMARKS.md, "Store: PostgreSQL ending a call as it last wrote
//! it").

use std::collections::{HashMap, VecDeque};

use super::EVENTS_PER_TRANSACTION;
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

/// A call as this replica last wrote it, and the version of the call's row that the write left: the end writes
/// the call only while its row is still that version, and the call has as many Requests as the view names. A
/// version is its transaction's id (`xmin`) and its place (`ctid`): any write of the row after it, in another
/// transaction or the same one, leaves a version in another place, and the place of a version is free again
/// only once its transaction has ended. A call's Requests are not in its row: each raise writes the row, but
/// the pruning deletes old resolved ones without writing it, and the list a statement returns with the row is
/// read as the statement began.
#[derive(Debug, Clone)]
pub struct Written {
    pub view: CallView,
    pub xmin: String,
    pub place: String,
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
    /// Notes `view` as the version of the call's row at `place` that the transaction that numbered an event `seq`
    /// wrote.
    pub fn note(&mut self, mut view: CallView, seq: i64, place: String) {
        // As the row holds them.
        view.created_at = Timestamp::from_millis(view.created_at.millis());
        view.updated_at = Timestamp::from_millis(view.updated_at.millis());
        self.take(&view.id);
        self.notes += 1;
        let id = view.id.clone();
        self.bytes += weight(&view);
        let xmin = xmin(seq);
        self.calls
            .insert(id.clone(), (Written { view, xmin, place }, self.notes));
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

/// The `xmin` (a 32-bit transaction id) of the rows that the transaction that numbered an event `seq` wrote:
/// events are numbered from their transaction's 64-bit id (see [`super::writer`]), whose low 32 bits are the id
/// rows carry.
fn xmin(seq: i64) -> String {
    ((seq / EVENTS_PER_TRANSACTION) & 0xFFFF_FFFF).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::tests::connect_raw;

    /// The `xmin` a transaction's rows carry is the one its events' numbers give.
    #[tokio::test]
    async fn a_rows_xmin_is_the_one_its_transactions_event_numbers_give() {
        let client = connect_raw(&crate::test_postgres::shared().database()).await;
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
        assert_eq!(xmin(seq), written);
        // Past the first epoch, the low 32 bits.
        assert_eq!(xmin(((5_i64 << 32) + 7) * EVENTS_PER_TRANSACTION + 2), "7");
    }

    /// A write of a row after the version noted, in the same transaction, leaves a version in another place: the
    /// end's condition does not hold for it.
    #[tokio::test]
    async fn a_second_write_in_the_same_transaction_is_another_version() {
        let client = connect_raw(&crate::test_postgres::shared().database()).await;
        client
            .batch_execute("CREATE TABLE versioned (id INTEGER, n INTEGER); BEGIN")
            .await
            .unwrap();
        let noted = client
            .query_one(
                "INSERT INTO versioned VALUES (1, 0) RETURNING xmin::TEXT, ctid::TEXT",
                &[],
            )
            .await
            .unwrap();
        let (xmin, place): (String, String) = (noted.get(0), noted.get(1));
        let same = "SELECT count(*) FROM versioned WHERE id = 1 AND xmin::TEXT = $1 AND ctid = $2::TEXT::TID";
        let count = async |xmin: &String, place: &String| -> i64 {
            client.query_one(same, &[xmin, place]).await.unwrap().get(0)
        };
        assert_eq!(count(&xmin, &place).await, 1);
        client
            .batch_execute("UPDATE versioned SET n = 1 WHERE id = 1")
            .await
            .unwrap();
        assert_eq!(
            count(&xmin, &place).await,
            0,
            "the same transaction wrote the row again"
        );
        client.batch_execute("COMMIT").await.unwrap();
        assert_eq!(count(&xmin, &place).await, 0);
    }

    #[test]
    fn it_keeps_the_latest_note_of_each_call_and_forgets_the_longest_kept() {
        let call = crate::store::tests::new_call("ada");
        let view = |id: &CallId| crate::store::views::started_view(id.clone(), &call, Timestamp::from_millis(0));
        let room = KEPT / weight(&view(&CallId::mint()));
        let mut written = LastWritten::default();
        let first = CallId::mint();
        written.note(view(&first), 10 * EVENTS_PER_TRANSACTION, "(0,1)".into());
        written.note(view(&first), 11 * EVENTS_PER_TRANSACTION, "(0,1)".into());
        let others: Vec<CallId> = (1..room).map(|_| CallId::mint()).collect();
        for other in &others {
            written.note(view(other), EVENTS_PER_TRANSACTION, "(0,1)".into());
        }
        assert_eq!(written.calls.len(), room, "all kept");
        assert_eq!(written.take(&first).map(|written| written.xmin), Some("11".to_owned()));
        assert!(written.take(&first).is_none(), "taken once");
        written.note(view(&first), 12 * EVENTS_PER_TRANSACTION, "(0,1)".into());
        written.note(view(&CallId::mint()), EVENTS_PER_TRANSACTION, "(0,1)".into());
        assert_eq!(written.calls.len(), room, "{} bytes", written.bytes);
        assert!(written.take(&others[0]).is_none(), "the longest kept is forgotten");
        assert!(written.take(&first).is_some());
        assert!(written.order.len() <= 2 * written.calls.len() + 64);
    }
}
