//! Calls and sessions in SQLite: what is its own (deferred starts and the writes that keep them), and the
//! verbs of [`crate::store::sql::calls`] that wait for those writes first.

use rusqlite::params;

use super::requests::{resolve_ids, select_ids};
use super::writer::{Message, Tx};
use super::{Sqlite, rounds, rows};
use crate::ids::{CallId, SessionId};
use crate::records::{
    Allowed, Arguments, CallError, CallFilter, CallStatus, CallTask, CallView, Event, Finish, SessionView,
};
use crate::store::live::Note;
use crate::store::sql::{self, at_once, calls};
use crate::store::{
    Finished, InsertCallError, InsertSessionError, Kept, NewCall, NewSession, Resolution, Retry, Started, StoreError,
};

impl Sqlite {
    /// Records the call as deferred (see [`super::deferred`]): the cap is decided at once, and the call is kept
    /// once the change that writes it is.
    pub async fn insert_call(&self, call: NewCall, max_running: usize) -> Result<Started, InsertCallError> {
        let view = crate::store::views::started_view(CallId::mint(), &call, self.shared.clock.now());
        let first = self
            .shared
            .deferred
            .add(call, view.clone(), max_running, &self.shared.live)
            .map_err(InsertCallError::TooMany)?;
        if first {
            self.send(Message::Deferred);
        }
        let kept = self.keep(view.id.clone());
        Ok(Started { view, kept })
    }

    /// Resolves once call `id` is kept: at once if it is written, else once the change that writes it is kept
    /// (a change of its own when no other is writing it).
    fn keep(&self, id: CallId) -> Kept {
        let this = self.clone();
        Box::pin(async move {
            let Some((kept, write)) = this.shared.deferred.wait(&id) else {
                return Ok(());
            };
            if write {
                this.write_behind(move |tx| tx.write_deferred(&id));
            }
            kept.await
                .unwrap_or_else(|_| Err(StoreError::Unavailable("the call was not recorded".to_owned())))
        })
    }

    /// Writes every deferred call, for a read that must see every call started.
    async fn keep_all(&self) -> Result<(), StoreError> {
        if self.shared.deferred.is_empty() {
            return Ok(());
        }
        let ids = self.shared.deferred.all();
        self.write(move |tx| ids.iter().try_for_each(|id| tx.write_deferred(id)))
            .await
    }

    pub async fn finish_call(&self, id: &CallId, finish: Finish) -> Result<Option<Finished>, StoreError> {
        let id = id.to_owned();
        self.write(move |tx| {
            tx.write_deferred(&id)?;
            finish_in(tx, &id, finish)
        })
        .await
    }

    pub async fn retry(&self, call: &CallId) -> Result<Option<Retry>, StoreError> {
        self.read(|conn| rounds::retry(conn, call))
    }

    pub async fn note_task(&self, id: &CallId, task: &CallTask) -> Result<bool, StoreError> {
        let (id, task) = (id.to_owned(), task.clone());
        self.write(move |tx| {
            tx.write_deferred(&id)?;
            at_once(calls::task_noted(tx, id, task))
        })
        .await
    }

    pub async fn insert_session(
        &self,
        session: NewSession,
        max_open: usize,
    ) -> Result<SessionView, InsertSessionError> {
        self.write(move |tx| {
            let open: i64 = tx
                .conn
                .prepare_cached("SELECT count(*) FROM sessions WHERE owner IS ?1 AND status IN ('starting', 'ready')")?
                .query_row([&session.owner], |row| row.get(0))?;
            let open = usize::try_from(open).unwrap_or(usize::MAX);
            if open >= max_open {
                return Ok(Err(InsertSessionError::TooMany(open)));
            }
            tx.conn
                .prepare_cached(
                    "INSERT INTO sessions (id, server, owner, status, created_at, replica) \
                     VALUES (?1, ?2, ?3, 'starting', ?4, ?5)",
                )?
                .execute(params![
                    session.id,
                    session.server,
                    session.owner,
                    tx.now().millis(),
                    session.replica
                ])?;
            let view = rows::one_session(tx.conn, &session.id)?.ok_or(rusqlite::Error::QueryReturnedNoRows)?;
            tx.record(Event::session(&view))?;
            Ok(Ok(view))
        })
        .await?
    }

    pub async fn call(&self, id: &CallId) -> Result<Option<CallView>, StoreError> {
        self.keep(id.clone()).await?;
        self.read(|conn| rows::one_call(conn, id))
    }

    pub async fn forwarding(&self, id: &CallId, allowed: &Allowed, arguments: &Arguments) -> Result<bool, StoreError> {
        let (id, allowed, arguments) = (id.to_owned(), allowed.clone(), arguments.clone());
        self.write(move |tx| {
            tx.write_deferred(&id)?;
            at_once(calls::forwarded(tx, id, allowed, arguments))
        })
        .await
    }

    pub async fn call_status(&self, id: &CallId) -> Result<Option<(CallStatus, String)>, StoreError> {
        if let Some(live) = crate::lock(&self.shared.live).call(id) {
            return Ok(Some(live));
        }
        if let Some(owner) = self.shared.deferred.owner(id) {
            return Ok(Some((CallStatus::Running, owner)));
        }
        self.read(|conn| at_once(calls::status(conn, id)))
    }

    pub async fn calls(&self, filter: &CallFilter, limit: usize) -> Result<Vec<CallView>, StoreError> {
        self.keep_all().await?;
        self.read(|conn| at_once(calls::page(conn, filter, limit)))
    }

    pub async fn running_calls(&self, session: Option<&SessionId>) -> Result<Vec<CallView>, StoreError> {
        self.keep_all().await?;
        self.read(|conn| at_once(calls::running(conn, session)))
    }

    pub async fn count_calls(&self) -> Result<Vec<(CallStatus, usize)>, StoreError> {
        self.keep_all().await?;
        self.read(|conn| at_once(calls::counts(conn)))
    }
}

/// Ends a call that has not ended, cancelling its pending Requests.
pub(super) fn finish_in(tx: &mut Tx<'_>, id: &CallId, finish: Finish) -> rusqlite::Result<Option<Finished>> {
    let now = tx.now().millis();
    let detail = crate::store::views::ended_call_detail(&finish);
    let status = finish.status();
    let (result, error) = match finish {
        Finish::Completed(result) => (Some(result), None),
        Finish::Failed(error) => (None, Some(error)),
        Finish::Cancelled(message) => (None, Some(CallError::new(message))),
    };
    let changed = tx.conn.prepare_cached(sql::CALL_ENDED.sqlite)?.execute(params![
        id,
        status.as_str(),
        rows::to_json_opt(result.as_ref()),
        error.as_ref().map(|error| error.message.as_str()),
        error
            .as_ref()
            .and_then(|error| error.reason)
            .map(|reason| reason.as_str()),
        now,
    ])?;
    if changed == 0 {
        return Ok(None);
    }
    let pending = select_ids(
        tx.conn,
        "SELECT id FROM requests WHERE call_id = ?1 AND status = 'pending'",
        [id],
    )?;
    let resolution = Resolution::Cancelled {
        detail,
        told_cancel: true,
    };
    let cancelled = resolve_ids(tx, &pending, &resolution)?.views;
    let view = rows::one_call(tx.conn, id)?.ok_or(rusqlite::Error::QueryReturnedNoRows)?;
    tx.note(Note::Ended(id.clone()));
    tx.record(Event::call(&view))?;
    Ok(Some(Finished { view, cancelled }))
}
