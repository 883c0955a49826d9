//! The rounds of 2026-07-28 calls in SQLite: what retrying a call whose latest round is answered takes.

use rusqlite::{Connection, OptionalExtension, params};

use crate::ids::{CallId, SessionId};
use crate::records::CallTask;
use crate::store::rows::{self, Columns, JsonText};
use crate::store::{Asked, Retry};

/// What retrying a call takes, if it has not ended and its latest round is answered, or it follows a task:
/// three statements, none of which SQLite compiles again per call, as one with `ORDER BY round DESC LIMIT 1`
/// would (BENCHMARKS.md, "Store: SQLite after the statement fixes", and "Changes that mattered", 20).
pub(super) fn retry(conn: &Connection, id: &CallId) -> rusqlite::Result<Option<Retry>> {
    let found = conn
        .prepare_cached(
            "SELECT server, session, shared, tool, arguments, owner, task FROM calls \
             WHERE id = ?1 AND status IN ('running', 'input_required')",
        )?
        .query_row([id], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, SessionId>(1)?,
                row.get::<_, bool>(2)?,
                row.get::<_, String>(3)?,
                row.parsed::<JsonText<_>>(4)?,
                row.get::<_, String>(5)?,
                row.parsed_opt::<JsonText<CallTask>>(6)?,
            ))
        })
        .optional()?;
    let Some((server, session, shared, tool, arguments, owner, task)) = found else {
        return Ok(None);
    };
    // The latest round, taken here: `ORDER BY round DESC LIMIT 1` (or `max`) would have SQLite compile the
    // statement again for every call id it is given.
    let mut latest: Option<(u32, Option<String>, String)> = None;
    let mut rounds =
        conn.prepare_cached("SELECT round, request_state, input_requests FROM rounds WHERE call_id = ?1")?;
    for found in rounds.query_map([id], |row| {
        Ok((row.get::<_, u32>(0)?, row.get::<_, Option<String>>(1)?, row.get(2)?))
    })? {
        let found = found?;
        if latest.as_ref().is_none_or(|(round, _, _)| found.0 > *round) {
            latest = Some(found);
        }
    }
    // A task is followed on without a round; a call that is no task is retried only to answer one.
    let (round, request_state, input_responses, asked) = match latest {
        Some((round, request_state, input_requests)) => {
            let mut statement = conn
                .prepare_cached("SELECT input_key, status, result FROM requests WHERE call_id = ?1 AND round = ?2")?;
            let answers = statement
                .query_map(params![id, round], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            let Some(input_responses) = rows::input_responses(answers) else {
                return Ok(None);
            };
            let input_requests = serde_json::from_str(&input_requests).unwrap_or_default();
            (round, request_state, input_responses, Asked::of_round(&input_requests))
        }
        None if task.is_some() => (0, None, serde_json::Map::new(), Vec::new()),
        None => return Ok(None),
    };
    Ok(Some(Retry {
        call: id.clone(),
        owner,
        server,
        session,
        shared,
        tool,
        arguments,
        round,
        request_state,
        input_responses,
        asked,
        task: task.map(|task| task.id),
    }))
}
