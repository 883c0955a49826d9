//! Calls, their rounds, and Sessions in PostgreSQL.

use rmcp::model::Implementation;
use serde_json::Map;
use tokio::sync::oneshot;
use tokio_postgres::Row;

use super::requests::resolve_ids;
use super::writer::Tx;
use super::{Postgres, Reader, rows};
use crate::ids::{self, CallId, RequestId, SessionId};
use crate::records::{
    CallError, CallFilter, CallStatus, CallView, Event, Finish, SessionFilter, SessionStatus, SessionView, Status,
};
use crate::store::listing::{Conditions, Param, Placeholders};
use crate::store::rows::{Columns, JsonText};
use crate::store::{
    Finished, InsertCallError, InsertSessionError, Kept, NewCall, NewSession, Resolution, Retry, Started, StoreError,
};

impl Postgres {
    /// Answers as soon as the writer has decided (the cap, then the row), before the change is kept.
    pub async fn insert_call(&self, call: NewCall, max_running: usize) -> Result<Started, InsertCallError> {
        let (decided, decision) = oneshot::channel();
        let replica = self.shared.replica.clone();
        let kept = self.write(move |tx| {
            Box::pin(async move {
                let inserted = insert_call_in(tx, &call, max_running, &replica).await;
                let early = match &inserted {
                    Ok(Ok(view)) => Ok(Ok(view.clone())),
                    Ok(Err(InsertCallError::TooMany(running))) => Ok(Err(InsertCallError::TooMany(*running))),
                    Ok(Err(InsertCallError::Store(error))) => Ok(Err(InsertCallError::Store(error.clone()))),
                    Err(error) => Err(super::unavailable(error)),
                };
                let _ = decided.send(early);
                inserted.map(|_| ())
            })
        });
        let kept: Kept = Box::pin(kept);
        let (kept, decision) = {
            // The write runs on the writer; its decision arrives first, its outcome once the batch is kept.
            let mut kept = kept;
            tokio::select! {
                biased;
                decision = decision => (kept, decision),
                outcome = &mut kept => {
                    let error = outcome.err().unwrap_or_else(|| StoreError::Unavailable("the call was not recorded".into()));
                    return Err(InsertCallError::Store(error));
                }
            }
        };
        match decision {
            Ok(Ok(Ok(view))) => Ok(Started {
                view,
                kept,
                deferred: false,
            }),
            Ok(Ok(Err(refused))) => Err(refused),
            Ok(Err(error)) => Err(InsertCallError::Store(error)),
            Err(_) => Err(InsertCallError::Store(StoreError::Unavailable(
                "the store could not record the call".to_owned(),
            ))),
        }
    }

    pub async fn finish_call(&self, id: &CallId, finish: Finish) -> Result<Option<Finished>, StoreError> {
        let id = id.to_owned();
        self.write(move |tx| Box::pin(async move { finish_in(tx, &id, finish).await }))
            .await
    }

    pub async fn forwarding(&self, id: &CallId) -> Result<bool, StoreError> {
        let id = id.to_owned();
        self.write(move |tx| {
            Box::pin(async move {
                let changed = tx
                    .execute(
                        "UPDATE calls SET forwarded_at = $2 WHERE id = $1 AND forwarded_at IS NULL AND status = 'running'",
                        &[&id, &tx.now().millis()],
                    )
                    .await?;
                Ok(changed == 1)
            })
        })
        .await
    }

    pub async fn retry(&self, call: &CallId) -> Result<Option<Retry>, StoreError> {
        self.read(async |conn| retry(conn, call).await).await
    }

    pub async fn insert_session(
        &self,
        session: NewSession,
        max_open: usize,
    ) -> Result<SessionView, InsertSessionError> {
        self.write(move |tx| {
            Box::pin(async move {
                let open: i64 = tx
                    .query_one(
                        "SELECT count(*) FROM sessions WHERE owner IS NOT DISTINCT FROM $1 \
                         AND status IN ('starting', 'ready')",
                        &[&session.owner],
                    )
                    .await?
                    .try_get(0)?;
                let open = usize::try_from(open).unwrap_or(usize::MAX);
                if open >= max_open {
                    return Ok(Err(InsertSessionError::TooMany(open)));
                }
                tx.execute(
                    "INSERT INTO sessions (id, server, owner, status, created_at, replica) \
                     VALUES ($1, $2, $3, 'starting', $4, $5)",
                    &[
                        &session.id,
                        &session.server,
                        &session.owner,
                        &tx.now().millis(),
                        &session.replica,
                    ],
                )
                .await?;
                let row = tx
                    .query_one(
                        &format!("SELECT {} FROM sessions WHERE id = $1", rows::SESSION),
                        &[&session.id],
                    )
                    .await?;
                let view = rows::session(&row)?;
                tx.record(Event::session(&view)).await?;
                Ok(Ok(view))
            })
        })
        .await?
    }

    pub async fn session_ready(
        &self,
        id: &SessionId,
        protocol_version: Option<String>,
        server_info: Option<Implementation>,
    ) -> Result<Option<SessionView>, StoreError> {
        let id = id.to_owned();
        self.write(move |tx| {
            Box::pin(async move {
                let changed = tx
                    .execute(
                        "UPDATE sessions SET status = 'ready', protocol_version = $2, server_info = $3 \
                         WHERE id = $1 AND status IN ('starting', 'ready')",
                        &[&id, &protocol_version, &rows::to_json_opt(server_info.as_ref())],
                    )
                    .await?;
                if changed == 0 {
                    return Ok(None);
                }
                session_changed(tx, &id).await
            })
        })
        .await
    }

    pub async fn end_session(
        &self,
        id: &SessionId,
        status: SessionStatus,
        detail: &str,
    ) -> Result<Option<SessionView>, StoreError> {
        let (id, detail) = (id.to_owned(), detail.to_owned());
        self.write(move |tx| {
            Box::pin(async move {
                let changed = tx
                    .execute(
                        "UPDATE sessions SET status = $2, closed_at = $3, detail = $4 \
                         WHERE id = $1 AND status IN ('starting', 'ready')",
                        &[&id, &status.as_str(), &tx.now().millis(), &detail],
                    )
                    .await?;
                if changed == 0 {
                    return Ok(None);
                }
                session_changed(tx, &id).await
            })
        })
        .await
    }

    pub async fn call(&self, id: &CallId) -> Result<Option<CallView>, StoreError> {
        self.read(async |conn| call(conn, id).await).await
    }

    pub async fn call_status(&self, id: &CallId) -> Result<Option<(CallStatus, String)>, StoreError> {
        self.read(async |conn| {
            let Some(row) = conn
                .query_opt("SELECT status, owner FROM calls WHERE id = $1", &[&id])
                .await?
            else {
                return Ok(None);
            };
            let status: String = row.try_get(0)?;
            let owner: String = row.try_get(1)?;
            Ok(CallStatus::parse(&status).map(|status| (status, owner)))
        })
        .await
    }

    pub async fn calls(&self, filter: &CallFilter, limit: usize) -> Result<Vec<CallView>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut conditions = Conditions::calls(filter, Placeholders::Dollar);
        let limit = conditions.param(Param::Integer(limit));
        let sql = format!(
            "SELECT {} FROM calls AS c WHERE {} ORDER BY c.seq LIMIT {limit}",
            rows::CALL,
            conditions.sql
        );
        self.read(async |conn| {
            conn.query(&sql, &rows::params(&conditions))
                .await?
                .iter()
                .map(rows::call)
                .collect()
        })
        .await
    }

    pub async fn running_calls(&self, session: Option<&SessionId>) -> Result<Vec<CallView>, StoreError> {
        self.read(async |conn| {
            let sql = format!(
                "SELECT {} FROM calls AS c WHERE c.status IN ('running', 'input_required') \
                 AND ($1::TEXT IS NULL OR c.session = $1) ORDER BY c.seq",
                rows::CALL
            );
            conn.query(&sql, &[&session]).await?.iter().map(rows::call).collect()
        })
        .await
    }

    pub async fn count_calls(&self) -> Result<Vec<(CallStatus, usize)>, StoreError> {
        self.read(async |conn| {
            let counts = conn
                .query(
                    "SELECT status, count(*) FROM calls GROUP BY status ORDER BY status",
                    &[],
                )
                .await?;
            let mut found = Vec::new();
            for row in counts {
                let status: String = row.try_get(0)?;
                let count: i64 = row.try_get(1)?;
                if let Some(status) = CallStatus::parse(&status) {
                    found.push((status, usize::try_from(count).unwrap_or(0)));
                }
            }
            found.sort();
            Ok(found)
        })
        .await
    }

    pub async fn session(&self, id: &SessionId) -> Result<Option<SessionView>, StoreError> {
        self.read(async |conn| session(conn, id).await).await
    }

    pub async fn sessions(&self, filter: SessionFilter) -> Result<Vec<SessionView>, StoreError> {
        let all = filter == SessionFilter::All;
        self.read(async |conn| {
            let sql = format!(
                "SELECT {} FROM sessions WHERE $1::BOOLEAN OR status IN ('starting', 'ready') ORDER BY seq",
                rows::SESSION
            );
            conn.query(&sql, &[&all]).await?.iter().map(rows::session).collect()
        })
        .await
    }
}

/// One call.
pub(super) async fn call(conn: &impl Reader, id: &CallId) -> Result<Option<CallView>, tokio_postgres::Error> {
    let sql = format!("SELECT {} FROM calls AS c WHERE c.id = $1", rows::CALL);
    conn.row(&sql, &[&id]).await?.map(|row| rows::call(&row)).transpose()
}

/// A session just changed in this transaction, with its `session.updated` event recorded.
pub(super) async fn session_changed(
    tx: &mut Tx<'_>,
    id: &SessionId,
) -> Result<Option<SessionView>, tokio_postgres::Error> {
    let view = session(&*tx, id).await?;
    if let Some(view) = &view {
        tx.record(Event::session(view)).await?;
    }
    Ok(view)
}

/// One session.
pub(super) async fn session(conn: &impl Reader, id: &SessionId) -> Result<Option<SessionView>, tokio_postgres::Error> {
    let sql = format!("SELECT {} FROM sessions WHERE id = $1", rows::SESSION);
    conn.row(&sql, &[&id]).await?.map(|row| rows::session(&row)).transpose()
}

/// Records a running call unless its owner has `max_running` calls that have not ended.
async fn insert_call_in(
    tx: &mut Tx<'_>,
    call: &NewCall,
    max_running: usize,
    replica: &str,
) -> Result<Result<CallView, InsertCallError>, tokio_postgres::Error> {
    let running: i64 = match tx
        .query_opt("SELECT calls FROM live_calls WHERE owner = $1", &[&call.owner])
        .await?
    {
        Some(row) => row.try_get(0)?,
        None => 0,
    };
    let running = usize::try_from(running).unwrap_or(usize::MAX);
    if running >= max_running {
        return Ok(Err(InsertCallError::TooMany(running)));
    }
    let id = ids::mint(ids::CALL);
    let now = tx.now().millis();
    let inserted = format!(
        "INSERT INTO calls AS c (id, server, session, shared, tool, arguments, owner, protocol_version, \
         capabilities, status, created_at, updated_at, replica, via) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 'running', $10, $10, $11, $12) RETURNING {}",
        rows::CALL
    );
    let row = tx
        .query_one(
            &inserted,
            &[
                &id,
                &call.server,
                &call.session,
                &call.shared,
                &call.tool,
                &rows::to_json(&call.arguments),
                &call.owner,
                &call.protocol_version,
                &rows::to_json(&call.capabilities),
                &now,
                &replica,
                &call.via.as_str(),
            ],
        )
        .await?;
    let view = rows::call(&row)?;
    tx.record(Event::call(&view)).await?;
    Ok(Ok(view))
}

/// Ends a call that has not ended, cancelling its pending Requests.
pub(super) async fn finish_in(
    tx: &mut Tx<'_>,
    id: &CallId,
    finish: Finish,
) -> Result<Option<Finished>, tokio_postgres::Error> {
    let now = tx.now().millis();
    let detail = crate::store::ended_call_detail(&finish);
    let status = finish.status();
    let (result, error) = match finish {
        Finish::Completed(result) => (Some(result), None),
        Finish::Failed(error) => (None, Some(error)),
        Finish::Cancelled(message) => (None, Some(CallError::new(message))),
    };
    // The call as ended, and its Requests still pending: the view names its Requests, whatever they become.
    let ended = format!(
        "UPDATE calls AS c SET status = $2, result = $3, error_message = $4, error_reason = $5, \
         updated_at = $6, ended_at = $6 WHERE c.id = $1 AND c.status IN ('running', 'input_required') \
         RETURNING {}, ARRAY(SELECT r.id FROM requests AS r WHERE r.call_id = c.id AND r.status = 'pending')",
        rows::CALL
    );
    let row = tx
        .query_opt(
            &ended,
            &[
                &id,
                &status.as_str(),
                &rows::to_json_opt(result.as_ref()),
                &error.as_ref().map(|error| error.message.as_str()),
                &error
                    .as_ref()
                    .and_then(|error| error.reason)
                    .map(|reason| reason.as_str()),
                &now,
            ],
        )
        .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    let view = rows::call(&row)?;
    let pending: Vec<RequestId> = row.try_get(rows::CALL_COLUMNS)?;
    let resolution = Resolution::Cancelled {
        detail,
        told_cancel: true,
    };
    let cancelled = resolve_ids(tx, &pending, &resolution).await?.views;
    tx.record(Event::call(&view)).await?;
    Ok(Some(Finished { view, cancelled }))
}

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
    let mut input_responses = Map::new();
    for ((key, status), result) in keys.into_iter().zip(statuses).zip(results) {
        if status == Status::Pending.as_str() {
            return Ok(None);
        }
        let result = result
            .and_then(|text| serde_json::from_str(&text).ok())
            .unwrap_or_else(|| serde_json::json!({"action": "cancel"}));
        input_responses.insert(key, result);
    }
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
