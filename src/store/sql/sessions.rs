//! Sessions, as both SQL engines change and read them. A session's start is each engine's own: PostgreSQL
//! counts, inserts and reads in one statement, where SQLite runs three in its process.

use rmcp::model::Implementation;

use super::run::{Change, Run};
use crate::ids::SessionId;
use crate::records::{Event, SessionStatus, SessionView};
use crate::store::{rows, sql};

/// A session that has not closed is ready, with what its server said it is.
pub async fn ready<C: Change>(
    tx: &mut C,
    id: SessionId,
    protocol_version: Option<String>,
    server_info: Option<Implementation>,
) -> Result<Option<SessionView>, C::Error> {
    let info = rows::to_json_opt(server_info.as_ref());
    let changed = tx
        .execute(&sql::SESSION_READY, &[&id, &protocol_version, &info])
        .await?;
    if changed == 0 {
        return Ok(None);
    }
    changed_now(tx, &id).await
}

/// A session that has not closed closes, with `status`.
pub async fn ended<C: Change>(
    tx: &mut C,
    id: SessionId,
    status: SessionStatus,
    detail: String,
) -> Result<Option<SessionView>, C::Error> {
    let now = tx.now().millis();
    let changed = tx
        .execute(&sql::SESSION_ENDED, &[&id, &status.as_str(), &now, &detail])
        .await?;
    if changed == 0 {
        return Ok(None);
    }
    changed_now(tx, &id).await
}

/// A session closes, whatever it was, for `detail`.
pub async fn closed<C: Change>(tx: &mut C, id: &SessionId, now: i64, detail: &str) -> Result<(), C::Error> {
    let status = SessionStatus::Closed.as_str();
    tx.execute(&sql::SESSION_CLOSED, &[id, &status, &now, &detail]).await?;
    changed_now(tx, id).await.map(drop)
}

/// A session this transaction just changed, with its `session.updated` event recorded.
async fn changed_now<C: Change>(tx: &mut C, id: &SessionId) -> Result<Option<SessionView>, C::Error> {
    let view = one(tx, id).await?;
    if let Some(view) = &view {
        tx.record(Event::session(view)).await?;
    }
    Ok(view)
}

pub async fn one<R: Run>(conn: &R, id: &SessionId) -> Result<Option<SessionView>, R::Error> {
    conn.row(&sql::SESSION, &[id]).await
}

/// The sessions open, or all of them.
pub async fn list<R: Run>(conn: &R, all: bool) -> Result<Vec<SessionView>, R::Error> {
    conn.rows(&sql::SESSIONS, &[&all]).await
}
