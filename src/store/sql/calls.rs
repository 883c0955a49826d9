//! Calls, as both SQL engines read them. A call's start, end and retry are each engine's own.

use super::run::{Change, Run, Text};
use crate::ids::{CallId, SessionId};
use crate::records::{Allowed, Arguments, CallFilter, CallStatus, CallTask, CallView, Event};
use crate::store::listing::Conditions;
use crate::store::{rows, sql};

/// A running call is handed to its session, once, noting who allowed it and the arguments it is sent with.
pub async fn forwarded<C: Change>(
    tx: &mut C,
    id: CallId,
    allowed: Allowed,
    arguments: Arguments,
) -> Result<bool, C::Error> {
    let (now, allowed) = (tx.now().millis(), rows::to_json(&allowed));
    let changed = tx
        .execute(&sql::CALL_FORWARDED, &[&id, &now, &allowed, &arguments.text()])
        .await?;
    if changed == 0 {
        return Ok(false);
    }
    changed_now(tx, &id).await?;
    Ok(true)
}

/// A call that has not ended notes its upstream task as last seen.
pub async fn task_noted<C: Change>(tx: &mut C, id: CallId, task: CallTask) -> Result<bool, C::Error> {
    let (now, task) = (tx.now().millis(), rows::to_json(&task));
    let changed = tx.execute(&sql::CALL_TASK, &[&id, &task, &now]).await?;
    if changed == 0 {
        return Ok(false);
    }
    changed_now(tx, &id).await?;
    Ok(true)
}

/// A call this transaction just changed, with its `call.updated` event recorded last.
async fn changed_now<C: Change>(tx: &mut C, id: &CallId) -> Result<(), C::Error> {
    match one(tx, id).await? {
        Some(view) => tx.record_last(Event::call(&view)).await,
        None => Ok(()),
    }
}

pub async fn one<R: Run>(conn: &R, id: &CallId) -> Result<Option<CallView>, R::Error> {
    conn.row(&sql::CALL, &[id]).await
}

/// Up to `limit` calls of `filter`, in the order they started.
pub async fn page<R: Run>(conn: &R, filter: &CallFilter, limit: usize) -> Result<Vec<CallView>, R::Error> {
    let mut conditions = Conditions::calls(filter, R::DIALECT);
    let statement = conditions.select_calls(sql::CALL_COLUMN_LIST.text(R::DIALECT), sql::limit(limit));
    conn.rows(&statement, &conditions.bound()).await
}

/// The calls that have not ended, of `session` or of all.
pub async fn running<R: Run>(conn: &R, session: Option<&SessionId>) -> Result<Vec<CallView>, R::Error> {
    conn.rows(&sql::CALLS_RUNNING, &[&session]).await
}

/// How many calls have each status.
pub async fn counts<R: Run>(conn: &R) -> Result<Vec<(CallStatus, usize)>, R::Error> {
    let counted: Vec<(String, i64)> = conn.rows(&sql::CALLS_BY_STATUS, &[]).await?;
    let mut counts: Vec<_> = counted
        .into_iter()
        .filter_map(|(status, count)| Some((CallStatus::parse(&status)?, usize::try_from(count).unwrap_or(0))))
        .collect();
    counts.sort();
    Ok(counts)
}

/// A call's status and owner.
pub async fn status<R: Run>(conn: &R, id: &CallId) -> Result<Option<(CallStatus, String)>, R::Error> {
    let found: Option<(String, String)> = conn.row(&sql::CALL_STATUS, &[id]).await?;
    Ok(found.and_then(|(status, owner)| CallStatus::parse(&status).map(|status| (status, owner))))
}
