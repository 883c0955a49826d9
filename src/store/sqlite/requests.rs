//! The Requests in SQLite: raising them with their round, deciding answers, and resolving them otherwise.

use std::collections::BTreeSet;

use rusqlite::{Connection, OptionalExtension, params};

use super::writer::Tx;
use super::{Sqlite, rows};
use crate::decision::{self, Proposal, Upstream};
use crate::ids::{CallId, RequestId};
use crate::records::{CallStatus, Event, EventKind, RequestView, Status};
use crate::store::live::{Note, PendingRequest};
use crate::store::sql::{self, at_once, requests};
use crate::store::{
    Answered, NewRequest, NewRound, Pending, PendingCaps, RaiseError, Resolution, Resolved, Retry, StoreError,
};
use crate::time::Timestamp;

impl Sqlite {
    pub async fn raise(
        &self,
        requests: Vec<NewRequest>,
        round: Option<NewRound>,
        caps: PendingCaps,
    ) -> Result<Vec<RequestView>, RaiseError> {
        self.write(move |tx| {
            if let Err(cap) = tx.shares().admit(&requests, &caps) {
                return Ok(Err(RaiseError::Full(cap)));
            }
            let calls: BTreeSet<&CallId> = requests.iter().filter_map(|new| new.call.as_ref()).collect();
            for call in calls {
                tx.write_deferred(call)?;
                let live: bool = tx
                    .conn
                    .prepare_cached(
                        "SELECT EXISTS (SELECT 1 FROM calls WHERE id = ?1 AND status IN ('running', 'input_required'))",
                    )?
                    .query_row([call], |row| row.get(0))?;
                if !live {
                    return Ok(Err(RaiseError::CallEnded(call.clone())));
                }
            }
            for id in crate::store::chosen_ids(&requests) {
                let taken: bool = tx
                    .conn
                    .prepare_cached(sql::REQUEST_TAKEN.sqlite)?
                    .query_row([id], |row| row.get(0))?;
                if taken {
                    return Ok(Err(RaiseError::Taken(id.to_owned())));
                }
            }
            let now = tx.now();
            if let Some(round) = &round {
                tx.conn.prepare_cached(sql::ROUND_RAISED.sqlite)?.execute(params![
                    round.call,
                    round.number,
                    round.request_state,
                    rows::to_json(&round.input_requests),
                    now.millis()
                ])?;
            }
            let mut views = Vec::with_capacity(requests.len());
            let mut calls = BTreeSet::new();
            for new in requests {
                insert_request(tx.conn, &new, round.as_ref().map(|round| round.number))?;
                tx.note(Note::Pending {
                    request: new.request.id.clone(),
                    pending: PendingRequest {
                        owner: new.owner.clone(),
                        server: new.server.clone().unwrap_or_default(),
                        bytes: new.bytes,
                    },
                });
                let view = crate::store::views::raised_view(&new);
                tx.record(Event::request(EventKind::RequestCreated, &view))?;
                if let Some(call) = &new.call {
                    calls.insert(call.clone());
                }
                views.push(view);
            }
            for call in calls {
                call_changed(tx, &call, now)?;
            }
            Ok(Ok(views))
        })
        .await?
    }

    /// Decides an answer in the writer, which reads the Request where its pages are at hand and decides on what
    /// it read: nothing changes the row in between.
    pub async fn answer(&self, id: &RequestId, proposal: Proposal) -> Result<Answered, StoreError> {
        let id = id.to_owned();
        self.write(move |tx| {
            let Some((row, current)) = pending_request(tx.conn, &id)? else {
                return Ok(Answered::NotFound);
            };
            let now = tx.now();
            let decision = match decision::decide(&current, &proposal, now) {
                Ok(decision::Decided::Resolves(decision)) => decision,
                Ok(decision::Decided::Counts(signoff)) => {
                    let mut view = current;
                    view.decisions.push(signoff);
                    tx.conn
                        .prepare_cached("UPDATE requests SET decisions = ?2 WHERE seq = ?1")?
                        .execute(params![row.seq, rows::decisions_json(&view.decisions)])?;
                    let event = tx.record(Event::request(EventKind::RequestUpdated, &view))?;
                    return Ok(Answered::Counted { view, event });
                }
                Err(undecided) => return Ok(Answered::undecided(undecided, current)),
            };
            if let Some(detail) = proposal.upstream.as_ref().and_then(Upstream::withdrawal) {
                let resolution = Resolution::Cancelled {
                    detail,
                    told_cancel: false,
                };
                let (view, _) = resolve_one(tx, row, current, &resolution, now)?;
                return Ok(Answered::Withdrawn(view));
            }
            let mut view = current;
            crate::store::views::answer_view(&mut view, decision, now);
            tx.conn
                .prepare_cached(
                    "UPDATE requests SET status = 'answered', resolved_at = ?2, answer = ?3, answered_by = ?4, \
                     result = ?5, decisions = ?6, answerer = ?7 WHERE seq = ?1",
                )?
                .execute(params![
                    row.seq,
                    now.millis(),
                    rows::to_json_opt(view.answer.as_ref()),
                    view.answered_by,
                    rows::to_json_opt(view.result.as_ref()),
                    rows::decisions_json(&view.decisions),
                    rows::to_json_opt(view.answerer.as_ref())
                ])?;
            tx.note(Note::Resolved(id.clone()));
            let event = tx.record(Event::request(EventKind::RequestResolved, &view))?;
            let resumes = after_resolution(tx, view.call.clone(), row.round, now)?;
            Ok(Answered::Won {
                view,
                event,
                resumes: resumes.map(Box::new),
            })
        })
        .await
    }

    pub async fn resolve(&self, which: Pending, resolution: Resolution) -> Result<Resolved, StoreError> {
        self.write(move |tx| {
            let ids: Vec<RequestId> = match which {
                Pending::Ids(ids) => ids,
                Pending::Session(session) => select_ids(tx.conn, sql::PENDING_OF_SESSION.sqlite, [session])?,
                Pending::Elicitations => select_ids(tx.conn, sql::PENDING_ELICITATIONS.sqlite, [])?,
                Pending::All => select_ids(tx.conn, sql::PENDING.sqlite, [])?,
            };
            resolve_ids(tx, &ids, &resolution)
        })
        .await
    }

    pub async fn expire_due(&self, now: Timestamp, limit: usize) -> Result<Resolved, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.write(move |tx| {
            let ids = select_ids(tx.conn, sql::PENDING_DUE.sqlite, [now.millis(), limit])?;
            resolve_ids(tx, &ids, &Resolution::Expired)
        })
        .await
    }

    pub async fn request_status(&self, id: &RequestId) -> Result<Option<(Status, Option<String>)>, StoreError> {
        if let Some(pending) = crate::lock(&self.shared.live).request(id) {
            return Ok(Some(pending));
        }
        self.read(|conn| at_once(requests::status(conn, id)))
    }
}

/// The ids of the Requests that `sql` selects.
pub(super) fn select_ids(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
) -> rusqlite::Result<Vec<RequestId>> {
    let mut statement = conn.prepare_cached(sql)?;
    let ids = statement.query_map(params, |row| row.get(0))?;
    ids.collect()
}

fn insert_request(conn: &Connection, new: &NewRequest, round: Option<u32>) -> rusqlite::Result<()> {
    let request = &new.request;
    conn.prepare_cached(sql::REQUEST_RAISED.sqlite)?.execute(params![
        request.id,
        request.kind.as_str(),
        request.prompt,
        request.url,
        rows::to_json_opt(request.data.as_deref()),
        new.deadline.millis(),
        new.server,
        new.session,
        new.call,
        round.filter(|_| new.input_key.is_some()),
        new.input_key,
        new.elicitation_id,
        new.owner,
        new.created_at.millis(),
        i64::try_from(new.bytes).unwrap_or(i64::MAX),
    ])?;
    Ok(())
}

/// Resolves the Requests still pending among `ids`.
pub(super) fn resolve_ids(tx: &mut Tx<'_>, ids: &[RequestId], resolution: &Resolution) -> rusqlite::Result<Resolved> {
    let now = tx.now();
    let mut resolved = Resolved::default();
    for id in ids {
        let Some((row, view)) = pending_request(tx.conn, id)?.filter(|(_, view)| view.status == Status::Pending) else {
            continue;
        };
        let (view, resumes) = resolve_one(tx, row, view, resolution, now)?;
        resolved.views.push(view);
        resolved.resumes.extend(resumes);
    }
    Ok(resolved)
}

/// Where a Request's row is, and the round it answers.
struct RowOf {
    seq: i64,
    round: Option<i64>,
}

/// Request `id`, with where its row is. Read, then updated by `seq`, rather than one `UPDATE … RETURNING`, which
/// builds a temporary table per statement: the writer is the only one changing rows, so nothing changes in
/// between (BENCHMARKS.md, "Store: SQLite after the statement fixes", 0dd0bca). PostgreSQL's writers decide in
/// one statement on the row as it stands (`rounds::resolving`).
fn pending_request(conn: &Connection, id: &RequestId) -> rusqlite::Result<Option<(RowOf, RequestView)>> {
    let sql = format!("SELECT seq, round, {} FROM requests WHERE id = ?1", rows::REQUEST);
    conn.prepare_cached(&sql)?
        .query_row([id], |row| {
            let at = RowOf {
                seq: row.get(0)?,
                round: row.get(1)?,
            };
            Ok((at, rows::request_at(row, 2)?))
        })
        .optional()
}

/// Resolves one pending Request without an answer; returns it and the call whose round it completed.
fn resolve_one(
    tx: &mut Tx<'_>,
    row: RowOf,
    mut view: RequestView,
    resolution: &Resolution,
    now: Timestamp,
) -> rusqlite::Result<(RequestView, Option<Retry>)> {
    crate::store::views::resolve_view(&mut view, resolution, now);
    tx.conn
        .prepare_cached(
            "UPDATE requests SET status = ?2, resolved_at = ?3, answer = ?4, result = ?5, detail = ?6 WHERE seq = ?1",
        )?
        .execute(params![
            row.seq,
            view.status.as_str(),
            now.millis(),
            rows::to_json_opt(view.answer.as_ref()),
            rows::to_json_opt(view.result.as_ref()),
            view.detail,
        ])?;
    tx.note(Note::Resolved(view.request.id.clone()));
    tx.record(Event::request(EventKind::RequestResolved, &view))?;
    let resumes = after_resolution(tx, view.call.clone(), row.round, now)?;
    Ok((view, resumes))
}

/// Updates the call of a Request just resolved (from round `round` of it); returns what retrying the call
/// takes if this completed that round.
fn after_resolution(
    tx: &mut Tx<'_>,
    call: Option<CallId>,
    round: Option<i64>,
    now: Timestamp,
) -> rusqlite::Result<Option<Retry>> {
    let Some(call) = call else { return Ok(None) };
    let status = call_changed(tx, &call, now)?;
    if round.is_none() || status != Some(CallStatus::Running) {
        return Ok(None);
    }
    super::rounds::retry(tx.conn, &call)
}

/// Sets a call that has not ended to `input_required` or `running` as its pending Requests say, recording
/// `call.updated` when that changes it; returns that status, or `None` if the call has ended. PostgreSQL keeps
/// the count on the call's row instead, changed in the statement that resolves a Request (BENCHMARKS.md, "Fleet:
/// PostgreSQL counting in the statements that change rows"); here the writer alone changes rows, and the read
/// costs no exchange.
pub(super) fn call_changed(tx: &mut Tx<'_>, call: &CallId, now: Timestamp) -> rusqlite::Result<Option<CallStatus>> {
    let found: Option<(String, bool)> = tx
        .conn
        .prepare_cached(
            "SELECT c.status, EXISTS (SELECT 1 FROM requests AS r WHERE r.call_id = c.id AND r.status = 'pending') \
             FROM calls AS c WHERE c.id = ?1 AND c.status IN ('running', 'input_required')",
        )?
        .query_row([call], |row| Ok((row.get(0)?, row.get(1)?)))
        .optional()?;
    let Some((before, waiting)) = found else {
        return Ok(None);
    };
    let status = CallStatus::unended(waiting);
    if before != status.as_str() {
        tx.conn
            .prepare_cached("UPDATE calls SET status = ?2, updated_at = ?3 WHERE id = ?1")?
            .execute(params![call, status.as_str(), now.millis()])?;
        if let Some(view) = rows::one_call(tx.conn, call)? {
            tx.note(Note::Call {
                call: call.clone(),
                status,
                owner: view.owner.clone(),
            });
            tx.record(Event::call(&view))?;
        }
    }
    Ok(Some(status))
}
