//! A call as its Requests resolve: its status while they are pending, and, for a 2026-07-28 call whose latest
//! round is answered, what retrying it takes.

use std::sync::LazyLock;

use tokio_postgres::Row;

use super::tx::{RECORD, Tx, insert_event};
use super::{Reader, rows as call_rows};
use crate::ids::{CallId, RequestId};
use crate::records::{CallStatus, CallTask, CallView, Event, RequestView, Signoff, Status};
use crate::store::rows::{self, Columns, JsonText};
use crate::store::{Asked, NewRound, Retry};
use crate::time::Timestamp;

/// What retrying a call takes, if it has not ended and its latest round is answered, or it follows a task.
pub(super) async fn retry(conn: &impl Reader, id: &CallId) -> Result<Option<Retry>, tokio_postgres::Error> {
    match conn.query_opt(&RETRY, &[&id]).await? {
        Some(found) => Ok(Round::read(id, &found, 0)?.retry(None)),
        None => Ok(None),
    }
}

/// The live call `$1` as [`Round::read`] reads it, if it has a round or follows a task.
static RETRY: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT {} FROM calls AS c {LATEST_ROUND} WHERE c.id = $1 AND c.status IN ('running', 'input_required') \
         AND (r.round IS NOT NULL OR c.task IS NOT NULL)",
        round_columns()
    )
});

/// The latest round `r` of call `c`, if it has one.
const LATEST_ROUND: &str = "LEFT JOIN LATERAL (SELECT round, request_state, input_requests FROM rounds \
    WHERE call_id = c.id ORDER BY round DESC LIMIT 1) AS r ON true";

/// The columns [`Round::read`] reads of call `c`, its latest round `r`, and that round's Requests (read for that
/// round only): one statement (BENCHMARKS.md, "Store: PostgreSQL with fewer exchanges per change"), where SQLite
/// runs three that it compiles once each.
fn round_columns() -> String {
    let of_round = |column: &str| {
        format!(
            "ARRAY(SELECT q.{column} FROM requests AS q WHERE q.call_id = c.id AND q.round = r.round ORDER BY q.seq)"
        )
    };
    format!(
        "c.server, c.session, c.shared, c.tool, c.arguments, r.round, r.request_state, c.owner, {}, {}, {}, c.task, \
         r.input_requests",
        of_round("input_key"),
        of_round("status"),
        of_round("result")
    )
}

/// A call's latest round as [`round_columns`] reads it.
#[derive(Debug, Clone, PartialEq)]
struct Round {
    /// What retrying the call takes, but the round's answers.
    retry: Retry,
    /// Each Request of the round: its input request's key, its status and its result.
    requests: Vec<(String, String, Option<String>)>,
}

impl Round {
    /// Call `id`'s round, read with [`round_columns`] from column `at` on.
    fn read(id: &CallId, found: &Row, at: usize) -> Result<Round, tokio_postgres::Error> {
        // A task is followed on without a round (then the round and its Requests are NULL and empty).
        let round: Option<i32> = found.try_get(at + 5)?;
        let keys: Vec<String> = found.try_get(at + 8)?;
        let statuses: Vec<String> = found.try_get(at + 9)?;
        let results: Vec<Option<String>> = found.try_get(at + 10)?;
        let requests = keys.into_iter().zip(statuses).zip(results);
        Ok(Round {
            retry: Retry {
                call: id.to_owned(),
                owner: found.try_get(at + 7)?,
                server: found.try_get(at)?,
                session: found.try_get(at + 1)?,
                shared: found.try_get(at + 2)?,
                tool: found.try_get(at + 3)?,
                arguments: found.parsed::<JsonText<_>>(at + 4)?,
                round: round.and_then(|round| u32::try_from(round).ok()).unwrap_or(0),
                request_state: found.try_get(at + 6)?,
                input_responses: serde_json::Map::new(),
                asked: found
                    .parsed_opt::<JsonText<serde_json::Map<String, serde_json::Value>>>(at + 12)?
                    .map(|input_requests| Asked::of_round(&input_requests))
                    .unwrap_or_default(),
                task: found.parsed_opt::<JsonText<CallTask>>(at + 11)?.map(|task| task.id),
            },
            requests: requests.map(|((key, status), result)| (key, status, result)).collect(),
        })
    }

    /// What retrying the call takes; `None` while a Request of its round is pending. With `resolving`, as it will
    /// be once the Request of the round still pending is answered with that result.
    fn retry(self, resolving: Option<&Option<String>>) -> Option<Retry> {
        let mut requests = self.requests;
        if let Some(result) = resolving {
            for (_, status, was) in &mut requests {
                if status == Status::Pending.as_str() {
                    (*status, *was) = (Status::Answered.as_str().to_owned(), result.clone());
                }
            }
        }
        Some(Retry {
            input_responses: rows::input_responses(requests)?,
            ..self.retry
        })
    }
}

/// A round's number as the database keeps it.
pub(super) fn round_number(number: u32) -> i32 {
    i32::try_from(number).unwrap_or(i32::MAX)
}

/// A Request as an answer is decided on.
#[derive(Debug)]
pub(super) struct ToAnswer {
    pub pending: RequestView,
    /// What resolving it does to its call, as read with it.
    pub call: Foreseen,
}

/// What resolving a Request does to its call, as an answer read it (`S`: the call as read, then as it will be
/// once settled).
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Foreseen<S = Box<Settling>> {
    /// Not read: the statements that resolve the Request find it.
    Unknown,
    /// It leaves the call's status as it is (or the Request has no live call).
    Stays,
    /// It settles the call: the Request is the call's only one pending.
    Settles(S),
}

/// A live call as an answer reads it when its Request is the only one of the call still pending, to foresee
/// what resolving that Request will make of it.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Settling {
    /// The call as read.
    call: CallView,
    /// The version of the call's row that was read (see [`call_rows::version`]).
    version: String,
    /// Its latest round, if resolving the Request retries it.
    round: Option<Round>,
}

/// The live call of Request `$1` if the Request is its only one pending, as [`call_rows::CALL`] reads it, the
/// version of its row, whether resolving the Request retries the call (it is in a round, and the call has one
/// as [`RETRY`] reads it), and the call's round (see [`round_columns`]). The call is found by its id, read in a
/// subquery: joined to the Request, it was planned as a scan of the live calls.
static SETTLING: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT {}, {}, \
         (SELECT round FROM requests WHERE id = $1) IS NOT NULL AND (r.round IS NOT NULL OR c.task IS NOT NULL), {} \
         FROM calls AS c {LATEST_ROUND} WHERE c.id = (SELECT call_id FROM requests WHERE id = $1) \
         AND c.status IN ('running', 'input_required') AND c.pending = 1",
        call_rows::CALL,
        call_rows::version("c"),
        round_columns()
    )
});

impl Settling {
    /// The call of Request `id` if resolving the Request would settle it.
    pub(super) async fn read(conn: &impl Reader, id: &RequestId) -> Result<Option<Self>, tokio_postgres::Error> {
        let Some(found) = conn.query_opt(&SETTLING, &[&id]).await? else {
            return Ok(None);
        };
        let call = call_rows::call(&found)?;
        let retries: bool = found.try_get(rows::CALL_COLUMNS + 1)?;
        let round = match retries {
            true => Some(Round::read(&call.id, &found, rows::CALL_COLUMNS + 2)?),
            false => None,
        };
        Ok(Some(Settling {
            version: found.try_get(rows::CALL_COLUMNS)?,
            call,
            round,
        }))
    }

    /// Call `call` as a raise of its one Request pending left it, its row at `version`: with the round the raise
    /// opened, if the Request is in it (the round, the Request's key in it, and whether the call's session is
    /// shared), as [`Self::read`] would read them.
    pub(super) fn raised(call: CallView, version: String, round: Option<(&NewRound, &str, bool)>) -> Self {
        let round = round.map(|(round, key, shared)| Round {
            retry: Retry {
                call: call.id.clone(),
                owner: call.owner.clone(),
                server: call.server.clone(),
                session: call.session.clone(),
                shared,
                tool: call.tool.clone(),
                arguments: call.arguments.clone(),
                round: u32::try_from(round_number(round.number)).unwrap_or(0),
                request_state: round.request_state.clone(),
                input_responses: serde_json::Map::new(),
                asked: Asked::of_round(&round.input_requests),
                task: call.task.as_ref().map(|task| task.id.clone()),
            },
            requests: vec![(key.to_owned(), Status::Pending.as_str().to_owned(), None)],
        });
        Settling { call, version, round }
    }

    /// The version of the call's row it was read or written at.
    pub(super) fn version(&self) -> &str {
        &self.version
    }

    /// What resolving the call's last pending Request at `at` with `result` makes of the call, if nothing changes
    /// it first.
    pub(super) fn settled(self, at: Timestamp, result: &Option<String>) -> Settled {
        let call = CallView {
            status: CallStatus::Running,
            updated_at: Timestamp::from_millis(at.millis()),
            ..self.call
        };
        Settled {
            call,
            version: self.version,
            resumes: self.round.and_then(|round| round.retry(Some(result))),
        }
    }
}

/// A call as the statement that resolves its last pending Request will settle it (see [`Last::settles`]): what
/// [`on_settled`] would record and read after it.
#[derive(Clone)]
pub(super) struct Settled {
    /// The call once settled: its `call.updated` event's data.
    pub call: CallView,
    /// The version of the call's row it was foreseen from: the statement settles the call only while its row is
    /// still that version.
    pub version: String,
    /// What retrying it takes, if settling it completes its round.
    pub resumes: Option<Retry>,
}

/// The status of a live call whose count of pending Requests is `count`, an SQL expression (see
/// [`CallStatus::unended`]).
fn unended(count: &str) -> String {
    format!("CASE WHEN {count} > 0 THEN 'input_required' ELSE 'running' END")
}

/// An update of the live call `c` that `target` picks (`WHERE c.id = $1`, or `WHERE c.id = (SELECT …)`) adding
/// `delta` to its count of pending Requests and setting its status by that count, with `updated_at` = `at`
/// when that changes it; if it sets the call `running` and `claim` holds, the call is this replica's, which
/// retries it, until it ends. It returns the call's row, then whether its status changed, the version of the row
/// it left, and whether the call's session is shared.
///
/// Every statement that changes a live call's count sets its status in the same update, so the status is
/// always the one the count gives, and it changes exactly when the count crosses zero. The update decides on
/// the row's own columns only, so it is exact whatever runs alongside: a change that updated the row holds it
/// until it commits, and an update that waited for it decides on the row as that change left it. Of two
/// answers run side by side on different replicas to a call's last two Requests, the one that commits second
/// sets `running`, and claims the call: one change, and one only.
fn count_pending(delta: &str, at: &str, target: &str, claim: &str) -> String {
    let (before, after) = ("c.pending".to_owned(), format!("c.pending + ({delta})"));
    // In `RETURNING`, `c` is the row as updated.
    let changed = format!("(c.pending - ({delta}) > 0) <> (c.pending > 0)");
    format!(
        "UPDATE calls AS c SET pending = {after}, status = {}, \
         updated_at = CASE WHEN ({before} > 0) = ({after} > 0) THEN c.updated_at ELSE {at} END, \
         replica = CASE WHEN {after} = 0 AND {claim} THEN {REPLICA} ELSE c.replica END \
         {target} AND c.status IN ('running', 'input_required') \
         RETURNING {}, {changed} AS changed, {} AS version, c.shared",
        unended(&after),
        call_rows::call_where(&changed),
        call_rows::version("c")
    )
}

/// The replica whose writer runs the statement.
const REPLICA: &str = "COALESCE(current_setting('toolnexus.replica', true), '')";

/// The call of a row of [`count_pending`] (at its start), if its status changed: the call's columns, whether its
/// status changed, and the version of the row it left.
pub(super) fn changed(row: &Row) -> Result<Option<CallView>, tokio_postgres::Error> {
    match row.try_get::<_, Option<bool>>(rows::CALL_COLUMNS)? {
        Some(true) => Ok(Some(call_rows::call(row)?)),
        _ => Ok(None),
    }
}

/// Counts `$2` more pending Requests of live call `$1` at `$3`.
pub(super) static RAISED: LazyLock<String> = LazyLock::new(|| count_pending("$2", "$3", "WHERE c.id = $1", "false"));

/// [`RAISED`], if call `$1`'s row is still version `$4` and the call has `$5` Requests (those just raised
/// included); it fails ([`super::MISSED`]) otherwise.
pub(super) static RAISED_AS_WRITTEN: LazyLock<String> = LazyLock::new(|| {
    let target = format!(
        "WHERE c.id = $1 AND {} = $4 AND (SELECT count(*) FROM requests WHERE call_id = $1) = $5",
        call_rows::version("c")
    );
    format!(
        "WITH counted AS ({}) SELECT counted.*, toolnexus_expect((SELECT count(*) FROM counted) = 1) \
         FROM (SELECT 1) AS one LEFT JOIN counted ON true",
        count_pending("$2", "$3", &target, "false")
    )
});

/// The statement resolving Request `$1` if it is pending (and, with `unchanged`, only if its `decisions` are still
/// parameter `$unchanged`), setting `set` (the columns of `UPDATE requests SET`),
/// that also takes the Request out of the counts of pending Requests (its call's, with [`count_pending`] at
/// parameter `$at`, which claims the call when that completes its round, and its owner's and server's in
/// `pending_shares`), and records the event whose values are parameters `$event` on (see [`insert_event`]), if
/// any. Its row, if it resolved the Request, is read by [`Won::read`]. (BENCHMARKS.md, "Fleet: PostgreSQL
/// counting in the statements that change rows": one statement where the triggers ran four.)
///
/// With `last`, it is its change's last statement, its `COMMIT` sent right behind it: it fails (see
/// [`super::MISSED`]) unless it resolved the Request with the completion time it was read with, and did to its
/// call what was foreseen, so that the change needs no statement after it. (BENCHMARKS.md, "Store: PostgreSQL
/// answers ending their own transaction".)
///
/// The call is found by its id, read from the Request's row in a subquery, not by a join: joined, with
/// statistics taken before a large round was raised, its update scanned an index of live calls holding every
/// version of the call's row that the round's answers left.
pub(super) struct Resolving<'s> {
    pub set: &'s str,
    pub at: usize,
    pub unchanged: Option<usize>,
    pub event: Option<usize>,
    pub last: Option<Last>,
}

/// The parameters of a [`Resolving`] statement that is its change's last.
pub(super) struct Last {
    /// The completion time the Request was read with.
    pub completed_at: usize,
    /// If resolving the Request settles its call (see [`Settling`]): the version of the call's row that was read,
    /// and the first of the call's event values, which the statement records.
    pub settles: Option<(usize, usize)>,
}

impl Resolving<'_> {
    pub(super) fn sql(&self) -> String {
        let unchanged = self
            .unchanged
            .map(|at| format!(" AND decisions IS NOT DISTINCT FROM ${at}"))
            .unwrap_or_default();
        let (numbered, seq, joined) = match self.event {
            Some(first) => (
                format!("numbered AS ({}), ", insert_event(first, "SELECT {} FROM won")),
                "numbered.seq",
                " CROSS JOIN numbered",
            ),
            None => (String::new(), "NULL::BIGINT", ""),
        };
        let (columns, from) = (
            format!("settled.*, won.round, won.completed_at, {seq}, won.decisions"),
            format!("won{joined}"),
        );
        let settles = self.last.as_ref().and_then(|last| last.settles);
        let select = match &self.last {
            None => format!("SELECT {columns} FROM {from} LEFT JOIN settled ON true"),
            // One row whatever the statement did, so that the check runs.
            Some(last) => format!(
                "SELECT {columns}, toolnexus_expect(won.id IS NOT NULL AND settled.changed IS {} TRUE \
                 AND won.completed_at IS NOT DISTINCT FROM ${}) \
                 FROM (SELECT 1) AS one LEFT JOIN ({from}) ON true LEFT JOIN settled ON true",
                if settles.is_some() { "" } else { "NOT" },
                last.completed_at
            ),
        };
        let (version, called) = match settles {
            Some((version, event)) => (
                format!(" AND {} = ${version}", call_rows::version("c")),
                format!(
                    ", called AS ({})",
                    insert_event(event, "SELECT {} FROM settled WHERE settled.changed")
                ),
            ),
            None => (String::new(), String::new()),
        };
        format!(
            "WITH won AS (UPDATE requests SET {} WHERE id = $1 AND status = 'pending'{unchanged} \
             RETURNING id, round, completed_at, call_id, owner, server, bytes, decisions), {numbered}\
             shared AS (INSERT INTO pending_shares (owner, server, replica, requests, bytes) \
             SELECT COALESCE(owner, ''), COALESCE(server, ''), {REPLICA}, -1, -bytes FROM won \
             ON CONFLICT (owner, server, replica) DO UPDATE \
             SET requests = pending_shares.requests + EXCLUDED.requests, bytes = pending_shares.bytes + EXCLUDED.bytes), \
             settled AS ({}){called} {select}",
            self.set,
            count_pending(
                "-1",
                &format!("${}", self.at),
                &format!("WHERE c.id = (SELECT call_id FROM won){version}"),
                "(SELECT round FROM won) IS NOT NULL"
            )
        )
    }
}

/// What a statement [`Resolving`] made did, when it resolved its Request.
pub(super) struct Won {
    /// The round of the Request, if it has one.
    pub round: Option<i32>,
    /// When its URL-mode completion was told, as the statement read it.
    pub completed_at: Option<Timestamp>,
    /// The number of the event the statement recorded, if it recorded one.
    pub seq: Option<i64>,
    /// The Request's call, if resolving it changed the call's status.
    pub settled: Option<CallView>,
    /// The version of the call's row the statement left, if it changed the row.
    pub version: Option<String>,
    /// The decisions of an approval that needs several people, as the statement read them.
    pub decisions: Vec<Signoff>,
}

impl Won {
    pub(super) fn read(row: &Row) -> Result<Won, tokio_postgres::Error> {
        let at = rows::CALL_COLUMNS + 3;
        Ok(Won {
            settled: changed(row)?,
            version: row.try_get(rows::CALL_COLUMNS + 1)?,
            round: row.try_get(at)?,
            completed_at: row.try_get::<_, Option<i64>>(at + 1)?.map(Timestamp::from_millis),
            seq: row.try_get(at + 2)?,
            decisions: row
                .try_get::<_, Option<String>>(at + 3)?
                .and_then(|text| serde_json::from_str(&text).ok())
                .unwrap_or_default(),
        })
    }
}

/// Records the `call.updated` of a call whose status changed (`settled`, if any), after a Request of its round
/// `round` was resolved; returns what retrying the call takes if that set it `running` (and claimed it for this
/// replica). The event and the read of what the retry takes go in one exchange; with `last`, they are the
/// change's last statements (see [`Tx::closing`]).
pub(super) async fn on_settled(
    tx: &Tx<'_>,
    settled: Option<CallView>,
    round: Option<i32>,
    last: bool,
) -> Result<Option<Retry>, tokio_postgres::Error> {
    let Some(call) = settled else { return Ok(None) };
    let event = Event::call(&call);
    let retries = round.is_some() && call.status == CallStatus::Running;
    let statements = async {
        if !retries {
            tx.record(event).await?;
            return Ok(None);
        }
        let (_, retry) = futures::try_join!(tx.record(event), self::retry(tx, &call.id))?;
        Ok(retry)
    };
    if !last {
        return statements.await;
    }
    tx.closing(&[&RECORD, &RETRY], statements).await
}
