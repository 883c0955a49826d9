//! A call as its Requests resolve: its status while they are pending, and, for a 2026-07-28 call whose latest
//! round is answered, what retrying it takes.

use std::sync::LazyLock;

use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use super::writer::Tx;
use super::{Reader, rows as call_rows};
use crate::ids::CallId;
use crate::records::{CallStatus, Event};
use crate::store::Retry;
use crate::store::rows::{self, Columns, JsonText};
use crate::time::Timestamp;

/// What retrying a call takes, if its latest round is answered and it has not ended.
pub(super) async fn retry(conn: &impl Reader, id: &CallId) -> Result<Option<Retry>, tokio_postgres::Error> {
    match conn.row(&retry_sql(""), &[&id]).await? {
        Some(found) => retry_from(id, &found),
        None => Ok(None),
    }
}

/// [`retry`], with the call claimed by this replica, which retries it: the call is its own until it ends.
pub(super) async fn claim_retry(tx: &Tx<'_>, id: &CallId) -> Result<Option<Retry>, tokio_postgres::Error> {
    let claimed = retry_sql("WITH claimed AS (UPDATE calls SET replica = $2 WHERE id = $1) ");
    match tx.query_opt(&claimed, &[&id, &tx.replica]).await? {
        Some(found) => retry_from(id, &found),
        None => Ok(None),
    }
}

/// The call `$1`, its latest round, and that round's Requests (read for that round only), in one exchange, after
/// `prefix`.
fn retry_sql(prefix: &str) -> String {
    let of_round = |column: &str| {
        format!(
            "ARRAY(SELECT q.{column} FROM requests AS q WHERE q.call_id = c.id AND q.round = r.round ORDER BY q.seq)"
        )
    };
    format!(
        "{prefix}SELECT c.server, c.session, c.shared, c.tool, c.arguments, r.round, r.request_state, c.owner, \
         {}, {}, {} FROM calls AS c CROSS JOIN LATERAL (SELECT round, request_state FROM rounds \
         WHERE call_id = c.id ORDER BY round DESC LIMIT 1) AS r \
         WHERE c.id = $1 AND c.status IN ('running', 'input_required')",
        of_round("input_key"),
        of_round("status"),
        of_round("result")
    )
}

/// What retrying call `id` takes, from the row of [`retry_sql`]; `None` while a Request of its round is pending.
fn retry_from(id: &CallId, found: &Row) -> Result<Option<Retry>, tokio_postgres::Error> {
    let round: i32 = found.try_get(5)?;
    let keys: Vec<String> = found.try_get(8)?;
    let statuses: Vec<String> = found.try_get(9)?;
    let results: Vec<Option<String>> = found.try_get(10)?;
    let answers = keys.into_iter().zip(statuses).zip(results);
    let Some(input_responses) = rows::input_responses(answers.map(|((key, status), result)| (key, status, result)))
    else {
        return Ok(None);
    };
    Ok(Some(Retry {
        call: id.to_owned(),
        owner: found.try_get(7)?,
        server: found.try_get(0)?,
        session: found.try_get(1)?,
        shared: found.try_get(2)?,
        tool: found.try_get(3)?,
        arguments: found.parsed::<JsonText<_>>(4)?,
        round: u32::try_from(round).unwrap_or(0),
        request_state: found.try_get(6)?,
        input_responses,
    }))
}

/// The status of a call that has not ended, by the count of its pending Requests (see
/// [`CallStatus::unended`]).
const UNENDED: &str = "(CASE WHEN c.pending > 0 THEN 'input_required' ELSE 'running' END)";

/// Sets a call that has not ended to `input_required` while Requests of it are pending and to `running`
/// otherwise, recording `call.updated` when that changes it.
pub(super) async fn settle(tx: &Tx<'_>, call: &CallId, now: Timestamp) -> Result<(), tokio_postgres::Error> {
    let settled = tx.query_opt(&SETTLE, &[&call, &now.millis()]).await?;
    on_settled(tx, settled.as_ref(), None).await?;
    Ok(())
}

/// The row of `resolving`, a statement resolving a Request of `call` (if it has one; a Request's call never
/// changes), and the row of the call's [`SETTLE`] at `at`, sent right behind it in one exchange.
pub(super) async fn resolve_and_settle(
    tx: &Tx<'_>,
    resolving: (&str, &[&(dyn ToSql + Sync)]),
    call: Option<&CallId>,
    at: i64,
) -> Result<(Option<Row>, Option<Row>), tokio_postgres::Error> {
    let Some(call) = call else {
        return Ok((tx.query_opt(resolving.0, resolving.1).await?, None));
    };
    let (resolved, settled) = tx.query_in_turn(resolving, (&SETTLE, &[call, &at])).await?;
    Ok((resolved.into_iter().next(), settled.into_iter().next()))
}

/// The statement of [`settle`], with parameters the call and the instant: it returns the call's row when it
/// changed it. A statement resolving a Request sends it right behind its own, in the same exchange, and hands
/// its row to [`on_settled`].
///
/// It reads the count of the call's pending Requests on the call's row, which a trigger keeps as Requests
/// change, and the update decides on the row's own columns only, so it is exact whatever runs alongside: the
/// change that resolved a Request holds its call's row from then until it commits, and the update of another
/// that waited for it decides on the row as the first left it. Of two answers run side by side on different
/// replicas to a call's last two Requests, the one that commits second sets `running`: one change, and one only.
pub(super) static SETTLE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE calls AS c SET status = {UNENDED}, updated_at = $2 \
         WHERE c.id = $1 AND c.status IN ('running', 'input_required') AND c.status <> {UNENDED} RETURNING {}",
        call_rows::CALL
    )
});

/// Records the `call.updated` of a call [`SETTLE`] changed (`settled` is its row, if any), after a Request of
/// its round `round` was resolved; returns what retrying the call takes if that set it `running`, having
/// claimed it for this replica. The event and the claim go in one exchange.
pub(super) async fn on_settled(
    tx: &Tx<'_>,
    settled: Option<&Row>,
    round: Option<i32>,
) -> Result<Option<Retry>, tokio_postgres::Error> {
    let Some(row) = settled else { return Ok(None) };
    let call = call_rows::call(row)?;
    let event = Event::call(&call);
    if round.is_none() || call.status != CallStatus::Running {
        tx.record(event).await?;
        return Ok(None);
    }
    let (_, retry) = futures::try_join!(tx.record(event), claim_retry(tx, &call.id))?;
    Ok(retry)
}
