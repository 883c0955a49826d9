//! The Requests in PostgreSQL once raised ([`super::raising`]): deciding answers, and resolving them otherwise.

use std::sync::LazyLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio_postgres::types::ToSql;

use super::rounds::{Foreseen, ToAnswer};
use super::tx::{Tx, insert_event};
use super::{PER_TRANSACTION, Postgres, Reader, rounds, rows};
use crate::decision::{self, Decided, Decision, Proposal, Undecided, Upstream};
use crate::ids::RequestId;
use crate::records::{Event, EventKind, RequestView, Signoff, Status};
use crate::store::sql::{self, requests};
use crate::store::{Answered, Pending, Resolution, Resolved, Retry, StoreError};
use crate::time::Timestamp;

impl Postgres {
    /// Decides an answer on the Request as this replica raised it (see [`super::written`]) or as a reader connection
    /// reads it, then writes the decision in one statement that resolves it only if it is still pending: the
    /// read stays off the writer, whose transactions it would lengthen. (Who owns a Request and what it asks
    /// never change; its status is decided again by that statement.)
    ///
    /// An approval that needs several people is written only over the decisions its answer was decided on: when
    /// another was kept first, the answer is decided again on the Request as it is now.
    pub async fn answer(&self, id: &RequestId, proposal: Proposal) -> Result<Answered, StoreError> {
        let answering = Answering::new(&self.shared.answering);
        loop {
            // An answer alone may end its transaction in its statement's exchange, if it foresees what that does
            // to its call; among others it shares a transaction with them, and does not read its call (whose row,
            // which a large round's answers each update, is slow to read among them).
            let foresee = answering.alone();
            let Some((ToAnswer { pending, call }, noted)) = self.to_answer(id, foresee).await? else {
                return Ok(Answered::NotFound);
            };
            let now = self.shared.clock.now();
            let written = match decision::decide(&pending, &proposal, now) {
                Ok(Decided::Resolves(decision)) => {
                    let call = if foresee { call } else { Foreseen::Unknown };
                    self.resolve_answer(pending, decision, now, &proposal, call).await?
                }
                Ok(Decided::Counts(signoff)) => self.count(pending, signoff).await?,
                Err(undecided) => {
                    // Refused before it wrote anything, the Request stays pending as it was kept, for the next.
                    if let Some(weight) = noted
                        && !matches!(undecided, Undecided::Resolved)
                    {
                        let kept = ToAnswer {
                            pending: pending.clone(),
                            call,
                        };
                        crate::lock(&self.shared.written)
                            .requests
                            .note(id.clone(), kept, weight);
                    }
                    return Ok(Answered::undecided(undecided, pending));
                }
            };
            if let Some(answered) = written {
                return Ok(answered);
            }
        }
    }

    /// Request `id` as an answer is decided on; with `foresee`, with what resolving it does to its call. As this
    /// replica raised it, if it did (see [`super::written`]), the first time only: an answer decided again reads it.
    /// Taken from what this replica keeps, it comes with what it weighs there.
    async fn to_answer(&self, id: &RequestId, foresee: bool) -> Result<Option<(ToAnswer, Option<usize>)>, StoreError> {
        let raised = crate::lock(&self.shared.written).requests.take_weighed(id);
        if let Some((raised, weight)) = raised {
            if cfg!(debug_assertions) {
                self.check_raised(id, &raised).await;
            }
            return Ok(Some((raised, Some(weight))));
        }
        Ok(self.read_to_answer(id, foresee).await?.map(|read| (read, None)))
    }

    /// Request `id` as an answer is decided on, read; with `foresee`, with what resolving it does to its call.
    pub(super) async fn read_to_answer(&self, id: &RequestId, foresee: bool) -> Result<Option<ToAnswer>, StoreError> {
        if !foresee {
            let pending = self.read(async |conn| requests::one(conn, id).await).await?;
            return Ok(pending.map(|pending| ToAnswer {
                pending,
                call: Foreseen::Unknown,
            }));
        }
        self.read(async |conn| {
            let (pending, settling) = futures::try_join!(requests::one(conn, id), rounds::Settling::read(conn, id))?;
            Ok(pending.map(|pending| ToAnswer {
                pending,
                call: settling.map_or(Foreseen::Stays, |settling| Foreseen::Settles(Box::new(settling))),
            }))
        })
        .await
    }

    /// Checks, in a debug build, that Request `id` as this replica raised it is as a read finds it, wherever what
    /// it was raised with still holds.
    async fn check_raised(&self, id: &RequestId, raised: &ToAnswer) {
        let Ok(Some(read)) = self.read_to_answer(id, true).await else {
            return;
        };
        let (now, then) = (&read.pending, &raised.pending);
        if now.status == Status::Pending
            && (&now.decisions, now.completed_at, &now.detail) == (&then.decisions, then.completed_at, &then.detail)
        {
            assert_eq!(now, then, "the Request as raised");
        }
        if let (Foreseen::Settles(now), Foreseen::Settles(then)) = (&read.call, &raised.call)
            && now.version() == then.version()
        {
            assert_eq!(now, then, "its call as raised");
        }
    }

    /// Writes a decision that resolves `pending`, if it is still pending with the decisions it was read with;
    /// `None` when it is pending with others. When what that does to its call was foreseen (`call`), the
    /// statement that writes it is the change's last, which ends the transaction when the change may (see
    /// [`Tx::closing`]).
    async fn resolve_answer(
        &self,
        pending: RequestView,
        decision: Decision,
        now: Timestamp,
        proposal: &Proposal,
        call: Foreseen,
    ) -> Result<Option<Answered>, StoreError> {
        let id = pending.request.id.clone();
        let decided_on = rows::decisions_json(&pending.decisions);
        let mut view = pending;
        crate::store::views::answer_view(&mut view, decision, now);
        let answer = rows::to_json_opt(view.answer.as_ref());
        let result = rows::to_json_opt(view.result.as_ref());
        let decisions = rows::decisions_json(&view.decisions);
        let answerer = rows::to_json_opt(view.answerer.as_ref());
        let event = Event::request(EventKind::RequestResolved, &view);
        let upstream = proposal.upstream.clone();
        let call = match call {
            Foreseen::Unknown => Foreseen::Unknown,
            Foreseen::Stays => Foreseen::Stays,
            Foreseen::Settles(settling) => Foreseen::Settles(settling.settled(now, &result)),
        };
        // Alongside other answers: what this one decides is read by its own statements as they run. So is a
        // withdrawal's cancellation (a Request with a waiter to withdraw has no round to hand on).
        let this = self.clone();
        self.write_alongside(move |tx| {
            // Each run its own copy: a run that another change's failure cut short runs again.
            let withdrawn = upstream.as_ref().and_then(Upstream::withdrawal);
            let this = this.clone();
            let (id, answer, result) = (id.clone(), answer.clone(), result.clone());
            let (decisions, answerer, decided_on) = (decisions.clone(), answerer.clone(), decided_on.clone());
            let (mut view, event, call) = (view.clone(), event.clone(), call.clone());
            Box::pin(async move {
                if let Some(detail) = withdrawn {
                    let Some(current) = requests::one(tx, &id).await? else {
                        return Ok(Some(Answered::NotFound));
                    };
                    if current.status != Status::Pending {
                        return Ok(Some(Answered::Lost(current)));
                    }
                    let resolution = Resolution::Cancelled {
                        detail,
                        told_cancel: false,
                    };
                    return Ok(Some(match resolve_one(tx, current, &resolution, now).await? {
                        Some((view, _)) => Answered::Withdrawn(view),
                        None => requests::one(tx, &id).await?.map_or(Answered::NotFound, Answered::Lost),
                    }));
                }
                // The Request resolved, counted out and its event numbered, in one statement; ending the change,
                // it also records its call's event if it settles the call.
                const SET: &str = "status = 'answered', resolved_at = $2, answer = $3, answered_by = $4, result = $5, \
                                   decisions = $6, answerer = $7";
                static ANSWER: LazyLock<String> = LazyLock::new(|| answering(None));
                static STAYS: LazyLock<String> = LazyLock::new(|| answering(Some(None)));
                static SETTLES: LazyLock<String> = LazyLock::new(|| answering(Some(Some((18, 19)))));
                fn answering(last: Option<Option<(usize, usize)>>) -> String {
                    rounds::Resolving {
                        set: SET,
                        at: 2,
                        unchanged: Some(8),
                        event: Some(9),
                        last: last.map(|settles| rounds::Last {
                            completed_at: 17,
                            settles,
                        }),
                    }
                    .sql()
                }
                let mut event = event;
                let (resolved_at, values) = (now.millis(), tx.event_values(&mut event));
                let place = values.place();
                let completed_at = view.completed_at.map(Timestamp::millis);
                let mut params: Vec<&(dyn ToSql + Sync)> = vec![
                    &id,
                    &resolved_at,
                    &answer,
                    &view.answered_by,
                    &result,
                    &decisions,
                    &answerer,
                    &decided_on,
                ];
                params.extend(values.params());
                // Ending the change, the statement fails unless it does what was foreseen: the change then runs
                // again, without ending its transaction.
                let ends = tx.ends();
                let found = match &call {
                    Foreseen::Settles(settled) if ends => {
                        let mut called = Event::call(&settled.call);
                        let values = tx.event_values(&mut called);
                        params.extend([&completed_at as &(dyn ToSql + Sync), &settled.version]);
                        params.extend(values.params());
                        tx.closing(&[&SETTLES], tx.query_opt(&SETTLES, &params)).await?
                    }
                    Foreseen::Stays if ends => {
                        params.push(&completed_at);
                        tx.closing(&[&STAYS], tx.query_opt(&STAYS, &params)).await?
                    }
                    _ => tx.query_opt(&ANSWER, &params).await?,
                };
                let Some(won) = found else {
                    tx.withdraw(place);
                    return Ok(match requests::one(tx, &id).await? {
                        None => Some(Answered::NotFound),
                        // Another approval of several was counted since the read.
                        Some(current) if current.status == Status::Pending => None,
                        Some(current) => Some(Answered::Lost(current)),
                    });
                };
                let won = rounds::Won::read(&won)?;
                let seq = won.seq.unwrap_or_default();
                if won.completed_at != view.completed_at {
                    // Its URL-mode completion was kept after the read: the event says so too.
                    view.completed_at = won.completed_at;
                    event = Event {
                        at: event.at,
                        ..Event::request(EventKind::RequestResolved, &view)
                    };
                    tx.execute("UPDATE events SET data = $2 WHERE seq = $1", &[&seq, &event.data])
                        .await?;
                    tx.amend(place, &event);
                }
                let event = tx.numbered(event, seq);
                if let (Some(call), Some(version)) = (&won.settled, &won.version) {
                    crate::lock(&this.shared.written).note_call(call.clone(), version.clone());
                }
                let resumes = match call {
                    Foreseen::Settles(settled) if ends => {
                        debug_assert_eq!(won.settled.as_ref(), Some(&settled.call), "the call as foreseen");
                        settled.resumes
                    }
                    _ => rounds::on_settled(tx, won.settled, won.round, true).await?,
                };
                Ok(Some(Answered::Won {
                    view,
                    event,
                    resumes: resumes.map(Box::new),
                }))
            })
        })
        .await
    }

    /// Records one approval of the several a pending Request needs, if its decisions are still those `read`
    /// has; `None` when they are not (another decision on it was kept first), to be decided again.
    async fn count(&self, read: RequestView, signoff: Signoff) -> Result<Option<Answered>, StoreError> {
        let before = rows::decisions_json(&read.decisions);
        let mut view = read;
        view.decisions.push(signoff);
        let after = rows::decisions_json(&view.decisions);
        let event = Event::request(EventKind::RequestUpdated, &view);
        self.write_alongside(move |tx| {
            let (before, after, view, event) = (before.clone(), after.clone(), view.clone(), event.clone());
            Box::pin(async move {
                // The decision counted and its event recorded in one statement, which writes nothing if the
                // decisions are no longer those read: nothing follows it.
                static COUNT: LazyLock<String> = LazyLock::new(|| {
                    format!(
                        "WITH counted AS (UPDATE requests SET decisions = $2 \
                         WHERE id = $1 AND status = 'pending' AND decisions IS NOT DISTINCT FROM $3 RETURNING 1) {}",
                        insert_event(4, "SELECT {} FROM counted")
                    )
                });
                let mut event = event;
                let values = tx.event_values(&mut event);
                let place = values.place();
                let mut params: Vec<&(dyn ToSql + Sync)> = vec![&view.request.id, &after, &before];
                params.extend(values.params());
                let Some(counted) = tx.closing(&[&COUNT], tx.query_opt(&COUNT, &params)).await? else {
                    tx.withdraw(place);
                    return Ok(None);
                };
                let event = tx.numbered(event, counted.try_get(0)?);
                Ok(Some(Answered::Counted { view, event }))
            })
        })
        .await
    }

    /// In transactions of at most [`PER_TRANSACTION`] Requests each (a session may end with thousands pending).
    pub async fn resolve(&self, which: Pending, resolution: Resolution) -> Result<Resolved, StoreError> {
        let per = usize::try_from(PER_TRANSACTION).unwrap_or(usize::MAX);
        let mut resolved = Resolved::default();
        if let Pending::Ids(ids) = &which {
            for some in ids.chunks(per) {
                resolved.add(self.resolve_some(Pending::Ids(some.to_vec()), &resolution).await?.0);
            }
            return Ok(resolved);
        }
        loop {
            let (some, selected) = self.resolve_some(which.clone(), &resolution).await?;
            resolved.add(some);
            if selected < per {
                return Ok(resolved);
            }
        }
    }

    /// Resolves `which` in one transaction, at most [`PER_TRANSACTION`] of them unless they are named; says how
    /// many it selected.
    async fn resolve_some(&self, which: Pending, resolution: &Resolution) -> Result<(Resolved, usize), StoreError> {
        let first = |sql: &str| format!("{sql} ORDER BY seq LIMIT {PER_TRANSACTION}");
        let resolution = resolution.clone();
        self.write_alongside(move |tx| {
            let (which, resolution) = (which.clone(), resolution.clone());
            Box::pin(async move {
                let ids: Vec<RequestId> = match which {
                    Pending::Ids(ids) => ids,
                    Pending::Session(session) => {
                        select_ids(tx, &first(sql::PENDING_OF_SESSION.postgres), &[&session]).await?
                    }
                    Pending::Elicitations => select_ids(tx, &first(sql::PENDING_ELICITATIONS.postgres), &[]).await?,
                    Pending::All => select_ids(tx, &first(sql::PENDING.postgres), &[]).await?,
                };
                Ok((resolve_ids(tx, &ids, &resolution).await?, ids.len()))
            })
        })
        .await
    }

    pub async fn expire_due(&self, now: Timestamp, limit: usize) -> Result<Resolved, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.write_alongside(move |tx| {
            Box::pin(async move {
                let ids = select_ids(tx, sql::PENDING_DUE.postgres, &[&now.millis(), &limit]).await?;
                resolve_ids(tx, &ids, &Resolution::Expired).await
            })
        })
        .await
    }

    pub async fn request_status(&self, id: &RequestId) -> Result<Option<(Status, Option<String>)>, StoreError> {
        self.read(async |conn| requests::status(conn, id).await).await
    }
}

/// How many Requests are pending.
pub(super) async fn pending_count(conn: &impl Reader) -> Result<usize, tokio_postgres::Error> {
    let row = conn
        .query_opt("SELECT COALESCE(sum(requests), 0)::BIGINT FROM pending_shares", &[])
        .await?;
    let count = match row {
        Some(row) => row.try_get::<_, i64>(0)?,
        None => 0,
    };
    Ok(usize::try_from(count).unwrap_or(0))
}

/// The ids of the Requests that `sql` selects.
pub(super) async fn select_ids(
    conn: &impl Reader,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Vec<RequestId>, tokio_postgres::Error> {
    conn.query(sql, params)
        .await?
        .iter()
        .map(|row| row.try_get(0))
        .collect()
}

/// Resolves the Requests still pending among `ids`.
pub(super) async fn resolve_ids(
    tx: &mut Tx<'_>,
    ids: &[RequestId],
    resolution: &Resolution,
) -> Result<Resolved, tokio_postgres::Error> {
    let now = tx.now();
    let mut resolved = Resolved::default();
    for id in ids {
        let Some(view) = requests::one(tx, id)
            .await?
            .filter(|view| view.status == Status::Pending)
        else {
            continue;
        };
        if let Some((view, resumes)) = resolve_one(tx, view, resolution, now).await? {
            resolved.views.push(view);
            resolved.resumes.extend(resumes);
        }
    }
    Ok(resolved)
}

/// Resolves one Request read as pending without an answer; returns it and the call whose round it completed,
/// or `None` if something resolved it since the read (an answer run alongside).
async fn resolve_one(
    tx: &mut Tx<'_>,
    mut view: RequestView,
    resolution: &Resolution,
    now: Timestamp,
) -> Result<Option<(RequestView, Option<Retry>)>, tokio_postgres::Error> {
    crate::store::views::resolve_view(&mut view, resolution, now);
    static RESOLVE: LazyLock<String> = LazyLock::new(|| {
        rounds::Resolving {
            set: "status = $2, resolved_at = $3, answer = $4, result = $5, detail = $6",
            at: 3,
            unchanged: None,
            event: None,
            last: None,
        }
        .sql()
    });
    let (answer, result) = (
        rows::to_json_opt(view.answer.as_ref()),
        rows::to_json_opt(view.result.as_ref()),
    );
    let resolved_at = now.millis();
    let params: [&(dyn ToSql + Sync); 6] = [
        &view.request.id,
        &view.status.as_str(),
        &resolved_at,
        &answer,
        &result,
        &view.detail,
    ];
    let Some(won) = tx.query_opt(&RESOLVE, &params).await? else {
        return Ok(None);
    };
    let won = rounds::Won::read(&won)?;
    // As the statement found it: a completion or an approval of several kept since the read counts too.
    view.completed_at = won.completed_at;
    view.decisions = won.decisions;
    // The Request's event, the call's, and the call's claim, in one exchange.
    let event = Event::request(EventKind::RequestResolved, &view);
    let (_, resumes) = futures::try_join!(tx.record(event), rounds::on_settled(tx, won.settled, won.round, false))?;
    Ok(Some((view, resumes)))
}

/// An answer counted among those the replica is deciding and writing, while it lives.
struct Answering<'a>(&'a AtomicUsize);

impl<'a> Answering<'a> {
    fn new(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Self(count)
    }

    /// Whether no other answer is being decided or written.
    fn alone(&self) -> bool {
        self.0.load(Ordering::Relaxed) == 1
    }
}

impl Drop for Answering<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}
