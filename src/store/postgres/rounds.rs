//! The rounds of 2026-07-28 calls: what retrying a call whose latest round is answered takes.

use tokio_postgres::Row;

use super::Reader;
use super::writer::Tx;
use crate::ids::CallId;
use crate::store::Retry;
use crate::store::rows::{self, Columns, JsonText};

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
