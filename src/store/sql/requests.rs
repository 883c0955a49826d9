//! Requests, as both SQL engines change and read them where they do it alike. Raising and resolving Requests
//! is each engine's own.

use super::run::{Change, Run};
use crate::ids::{CallId, RequestId, SessionId};
use crate::records::{Event, EventKind, Filter, RequestView, Status};
use crate::store::listing::Conditions;
use crate::store::sql;
use crate::time::Timestamp;

pub async fn one<R: Run>(conn: &R, id: &RequestId) -> Result<Option<RequestView>, R::Error> {
    conn.row(&sql::REQUEST, &[id]).await
}

/// A Request's status and owner.
pub async fn status<R: Run>(conn: &R, id: &RequestId) -> Result<Option<(Status, Option<String>)>, R::Error> {
    let found: Option<(String, Option<String>)> = conn.row(&sql::REQUEST_STATUS, &[id]).await?;
    Ok(found.and_then(|(status, owner)| Status::parse(&status).map(|status| (status, owner))))
}

/// When the first pending Request expires.
pub async fn next_deadline<R: Run>(conn: &R) -> Result<Option<Timestamp>, R::Error> {
    let first: Option<i64> = conn.one_row(&sql::NEXT_DEADLINE, &[]).await?;
    Ok(first.map(Timestamp::from_millis))
}

/// Up to `limit` Requests of `filter` from `cursor` (a `seq`) on, and the cursor of the next page if there is
/// one.
pub async fn page<R: Run>(
    conn: &R,
    filter: &Filter,
    cursor: u64,
    limit: usize,
) -> Result<(Vec<RequestView>, Option<u64>), R::Error> {
    let cursor = i64::try_from(cursor).unwrap_or(i64::MAX);
    let mut conditions = Conditions::requests(filter, cursor, R::DIALECT);
    let statement = conditions.select_requests(sql::limit(limit.saturating_add(1)));
    let found: Vec<(i64, RequestView)> = conn.rows(&statement, &conditions.bound()).await?;
    let mut page = Vec::with_capacity(found.len().min(limit));
    for (seq, request) in found {
        if page.len() == limit {
            return Ok((page, u64::try_from(seq).ok()));
        }
        page.push(request);
    }
    Ok((page, None))
}

/// The URL-mode Request a session's elicitation of that id raised is completed, once.
pub async fn completed<C: Change>(tx: &mut C, session: SessionId, elicitation_id: String) -> Result<bool, C::Error> {
    let found: Option<RequestId> = tx.row(&sql::ELICITATION, &[&session, &elicitation_id]).await?;
    let Some(id) = found else { return Ok(false) };
    let now = tx.now().millis();
    if tx.execute(&sql::COMPLETED, &[&id, &now]).await? == 0 {
        return Ok(false);
    }
    updated(tx, &id).await?;
    Ok(true)
}

/// An answered Request whose answer never reached its upstream is cancelled, with `detail`.
pub async fn undelivered<C: Change>(
    tx: &mut C,
    id: RequestId,
    detail: String,
) -> Result<Option<RequestView>, C::Error> {
    if tx.execute(&sql::UNDELIVERED, &[&id, &detail]).await? == 0 {
        return Ok(None);
    }
    updated(tx, &id).await
}

/// Each Request of a call's latest round notes `detail`.
pub async fn annotate_round<C: Change>(tx: &mut C, call: CallId, detail: String) -> Result<(), C::Error> {
    let ids: Vec<RequestId> = tx.rows(&sql::LATEST_ROUND, &[&call]).await?;
    for id in ids {
        tx.execute(&sql::DETAIL, &[&id, &detail]).await?;
        updated(tx, &id).await?;
    }
    Ok(())
}

/// A Request this transaction just changed, with its `request.updated` event recorded.
async fn updated<C: Change>(tx: &mut C, id: &RequestId) -> Result<Option<RequestView>, C::Error> {
    let view = one(tx, id).await?;
    if let Some(view) = &view {
        tx.record(Event::request(EventKind::RequestUpdated, view)).await?;
    }
    Ok(view)
}
