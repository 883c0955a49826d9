//! Raising Requests in PostgreSQL: the caps checked, the calls locked, the Requests and their events
//! inserted and counted.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::LazyLock;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::future::{OptionFuture, try_join_all};
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use super::caps::{FITS, HELD, Limits, PLANNED_ONCE, RAISING, held_by, owner_key};
use super::rounds::{Foreseen, ToAnswer, round_number};
use super::tx::{RECORD, Raised, Sent, Turn, Tx, Work, insert_event};
use super::written::{self, Written};
use super::{Postgres, RAISED_ALONGSIDE, Reader, rounds, rows};
use crate::ids::{CallId, RequestId};
use crate::records::{CallStatus, CallView, Event, EventKind, RequestView};
use crate::store::shares::{Held, server_key};
use crate::store::sql;
use crate::store::{NewRequest, NewRound, PendingCaps, RaiseError};
use crate::time::Timestamp;

impl Postgres {
    /// Raises Requests. A raise of a few ([`RAISED_ALONGSIDE`] at most) that chooses no ids runs alongside other
    /// raising ([`Turn::RaisingAlongside`]); any other runs alone ([`Turn::RaisingAlone`]), and so does one
    /// alongside that finds too little room, again. Either decides on what it reads:
    /// - that the Requests fit the caps, on counts that only raising adds to: a change alongside that lowers them
    ///   and has not committed only makes them read higher than they are, never lower. Alone, no other raising
    ///   is in flight, so what it reads is exact. Alongside, it first reads how many transactions hold the
    ///   raising lock (its own included), then the counts, and leaves room under every cap for all that each
    ///   of the others may add ([`RAISED_ALONGSIDE`] each) and for what the raises of its own transaction beside
    ///   it add, whose writes it may not see. Take the raise that read the lock's holders last among those
    ///   committed at any moment. Every other kept by then either held the lock as it read them, and it left
    ///   room for it, or had released it, and so committed (PostgreSQL makes a commit seen before it releases
    ///   its locks), before the counts were read, which counted it; one that took the lock later would have
    ///   read its holders later. So the caps hold whatever order the transactions commit in;
    /// - that each call is running: its row is locked as it is read (`FOR UPDATE`), so a change ending it on
    ///   another replica either commits first, and the call reads as ended, or waits until this commits and
    ///   then cancels the Requests raised on it;
    /// - that a posted Request's id is free: only raising inserts Requests, and a raise that chooses an id runs
    ///   alone.
    ///
    /// A raise alongside that ends its own transaction, on calls this replica last wrote, decides on those calls
    /// as written instead, and sends its reads with its writes, in one exchange: the caps are checked by a
    /// statement ([`FITS`]) that reads the counts after the lock's holders were read, as above, and the update of
    /// each call's count ([`rounds::RAISED_AS_WRITTEN`]) takes its row's lock as the read would have, checking that
    /// the row is still the version written. Either fails unless what it checks holds, and the transaction with
    /// it; the raise then runs again, reading (BENCHMARKS.md, "Store: a raise in one exchange, and changes
    /// answered before the log's read").
    pub async fn raise(
        &self,
        requests: Vec<NewRequest>,
        round: Option<NewRound>,
        caps: PendingCaps,
    ) -> Result<Vec<RequestView>, RaiseError> {
        let adds = Held {
            count: requests.len(),
            bytes: requests.iter().map(|new| new.bytes).sum(),
        };
        let turn = match !adds.exceeds(&RAISED_ALONGSIDE) && crate::store::chosen_ids(&requests).next().is_none() {
            true => Turn::RaisingAlongside,
            false => Turn::RaisingAlone,
        };
        let calls: Vec<CallId> = requests
            .iter()
            .filter_map(|new| new.call.clone())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let raised = Raised {
            calls: calls.clone(),
            adds,
        };
        // Taken by the first run only, as it runs: one that runs again reads its calls.
        let (first, this) = (AtomicBool::new(true), self.clone());
        self.write_raising(turn, raised, move |tx| {
            // Each run its own copy: a run rolled back, or moved alone, runs again.
            let (requests, round, calls) = (requests.clone(), round.clone(), calls.clone());
            let written = (first.swap(false, Ordering::Relaxed) && decides_as_written(tx))
                .then(|| this.written_live(&calls))
                .flatten();
            Box::pin(async move {
                let tx = &*tx;
                let known = match written {
                    Some(written) => Known::Written(written),
                    None => match read(tx, &requests, &calls, caps).await? {
                        Ok(read) => read,
                        Err(refused) => return Ok(Err(refused)),
                    },
                };
                let now = tx.now();
                let number = round.as_ref().map(|round| round_number(round.number));
                let input_requests = round.as_ref().map(|round| rows::to_json(&round.input_requests));
                let mut shares: BTreeMap<(&str, &str), Held> = BTreeMap::new();
                for new in &requests {
                    shares
                        .entry((owner_key(new), server_key(new)))
                        .or_default()
                        .add(new.bytes);
                }
                let views: Vec<RequestView> = requests.iter().map(crate::store::views::raised_view).collect();
                // Each call that had no Request pending becomes `input_required`: its row is locked as read, or
                // checked to be as written, so what its event says is known now.
                let mut waiting = Vec::new();
                for (at, call) in calls.iter().enumerate() {
                    waiting.push(becomes_input_required(known.unpending(at)?, &views, call, now));
                }
                // What it writes, pipelined in one exchange, its `COMMIT` behind it when the change may end its
                // transaction: the round, the pending counts (once per owner and server, and once per call, not
                // once per Request: a row updated once per Request of a large round, in one transaction, grows a
                // chain of versions that each update walks), the Requests, and the calls' events.
                tx.prepare(&[
                    &RAISING,
                    &FITS,
                    sql::ROUND_RAISED.postgres,
                    SHARES_RAISED,
                    &INSERT_REQUEST,
                    &rounds::RAISED,
                    &rounds::RAISED_AS_WRITTEN,
                    &RECORD,
                ])
                .await?;
                let limits = matches!(known, Known::Written(_)).then(|| Limits::of(&requests, &caps.less(tx.beside)));
                let mut writes: Vec<Work<'_, Option<Row>>> = Vec::new();
                // Decided on the calls as written, the caps are checked in the same exchange: the lock's holders
                // read first, then the counts (see above), by a statement that fails unless the Requests fit.
                let mut fits_at = None;
                if let Some(limits) = &limits {
                    writes.push(Box::pin(async move {
                        let _ = OptionFuture::from(tx.holders.clone()).await;
                        Ok(None)
                    }));
                    fits_at = Some(writes.len());
                    writes.push(Box::pin(async move {
                        let params = limits.params();
                        let planned_once = tx.borrowed.client.batch_execute(PLANNED_ONCE);
                        let (_, fits) = futures::try_join!(planned_once, tx.query_one(&FITS, &params))?;
                        Ok(Some(fits))
                    }));
                }
                if let Some(round) = &round {
                    let (number, input_requests) = (&number, &input_requests);
                    writes.push(Box::pin(async move {
                        let params: [&(dyn ToSql + Sync); 5] =
                            [&round.call, number, &round.request_state, input_requests, &now.millis()];
                        tx.execute(sql::ROUND_RAISED.postgres, &params).await.map(|_| None)
                    }));
                }
                for ((owner, server), held) in &shares {
                    let count = i64::try_from(held.count).unwrap_or(i64::MAX);
                    let bytes = i64::try_from(held.bytes).unwrap_or(i64::MAX);
                    writes.push(Box::pin(async move {
                        tx.execute(SHARES_RAISED, &[owner, server, &count, &bytes])
                            .await
                            .map(|_| None)
                    }));
                }
                for (new, view) in requests.iter().zip(&views) {
                    let event = Event::request(EventKind::RequestCreated, view);
                    let number = round.as_ref().map(|round| round.number);
                    writes.push(Box::pin(async move {
                        insert_request(tx, new, number, event).await.map(|()| None)
                    }));
                }
                let raised_at = writes.len();
                for (at, call) in calls.iter().enumerate() {
                    let raised = requests_of(&views, call);
                    let written = match &known {
                        Known::Written(written) => {
                            let requests = written[at].view.requests.len() + usize::try_from(raised).unwrap_or(0);
                            Some((&written[at].version, i64::try_from(requests).unwrap_or(i64::MAX)))
                        }
                        Known::Read { .. } => None,
                    };
                    writes.push(Box::pin(async move {
                        match written {
                            Some((version, requests)) => {
                                let params: [&(dyn ToSql + Sync); 5] =
                                    [call, &raised, &now.millis(), version, &requests];
                                tx.query_opt(&rounds::RAISED_AS_WRITTEN, &params).await
                            }
                            None => tx.query_opt(&rounds::RAISED, &[call, &raised, &now.millis()]).await,
                        }
                    }));
                }
                for view in waiting.iter().flatten() {
                    let event = Event::call(view);
                    writes.push(Box::pin(async move { tx.record(event).await.map(|_| None) }));
                }
                let sent = Sent::send(writes).await;
                let replies = tx.closing(&[], sent.replies()).await?;
                let pending = match (&known, fits_at) {
                    (Known::Read { pending, .. }, _) => *pending,
                    // As `FITS` counted them.
                    (Known::Written(_), at) => {
                        let fits = at.and_then(|at| replies[at].as_ref());
                        fits.map_or(Ok(0), |fits| fits.try_get::<_, i64>(1))?
                    }
                };
                let pending = usize::try_from(pending).unwrap_or(0);
                if cfg!(debug_assertions) {
                    for (row, foreseen) in replies[raised_at..].iter().zip(&waiting) {
                        let changed = row.as_ref().map(rounds::changed).transpose()?.flatten();
                        assert_eq!(&changed, foreseen, "the call as foreseen");
                    }
                }
                // What an answer to each is decided on (see [`super::written`]): one on no call leaves no call as
                // it is, and one alone on a call that had none pending settles it.
                let mut noted = Vec::new();
                for (new, view) in requests.iter().zip(&views).filter(|(_, view)| view.call.is_none()) {
                    noted.push(raised_here(new, view, Foreseen::Stays, 0));
                }
                for (at, call) in calls.iter().enumerate() {
                    let (Some(became), Some(counted)) = (&waiting[at], &replies[raised_at + at]) else {
                        continue;
                    };
                    let mut on_call = requests
                        .iter()
                        .zip(&views)
                        .filter(|(_, view)| view.call.as_ref() == Some(call));
                    let (Some((new, view)), None) = (on_call.next(), on_call.next()) else {
                        continue;
                    };
                    let round = round.as_ref().zip(new.input_key.as_deref());
                    let settling = settled_by(became, counted, round)?;
                    noted.push(raised_here(
                        new,
                        view,
                        Foreseen::Settles(Box::new(settling)),
                        written::weight(became),
                    ));
                }
                Ok(Ok((views, pending, noted)))
            })
        })
        .await?
        .map(|(views, before, noted)| {
            self.pending_grew(before, before + views.len());
            let mut written = crate::lock(&self.shared.written);
            // Their calls wait on them now: their ends read them.
            for call in views.iter().filter_map(|view| view.call.as_ref()) {
                written.calls.take(call);
            }
            for (id, raised, weight) in noted {
                written.requests.note(id, raised, weight);
            }
            views
        })
    }
}

impl Postgres {
    /// Calls `calls` as this replica last wrote them, taken, if it wrote each of them last and none had ended.
    fn written_live(&self, calls: &[CallId]) -> Option<Vec<Written>> {
        let mut written = crate::lock(&self.shared.written);
        let taken: Vec<Option<Written>> = calls.iter().map(|call| written.calls.take(call)).collect();
        taken
            .into_iter()
            .map(|taken| taken.filter(|taken| !taken.view.status.is_final()))
            .collect()
    }
}

/// Whether a raise in `tx` may decide on its calls as this replica last wrote them, in one exchange: it raises
/// alongside others (so it chose no ids), and its statements end the transaction, so that one failing only has
/// it run again, reading.
fn decides_as_written(tx: &Tx<'_>) -> bool {
    tx.turn == Turn::RaisingAlongside && tx.ends() && tx.holders.is_some()
}

/// What a raise decides on.
enum Known {
    /// Read in its transaction: how many Requests were pending, and each call's row if it was live (see
    /// [`LIVE_CALL`]).
    Read { pending: i64, live: Vec<Option<Row>> },
    /// Each call as this replica last wrote it; the raise's statements fail unless each call's row is still
    /// that, and the Requests fit the caps ([`FITS`]).
    Written(Vec<Written>),
}

impl Known {
    /// Call `at` of the raise as it was, if it had no Request pending.
    fn unpending(&self, at: usize) -> Result<Option<CallView>, tokio_postgres::Error> {
        match self {
            Known::Read { live, .. } => match &live[at] {
                Some(live) if live.try_get::<_, i32>(rows::CALL_COLUMNS)? == 0 => Ok(Some(rows::call(live)?)),
                _ => Ok(None),
            },
            Known::Written(written) => {
                let view = &written[at].view;
                Ok((view.status == CallStatus::Running).then(|| view.clone()))
            }
        }
    }
}

/// Reads, in one exchange, what a raise of `requests` on `calls` decides on, in this order: the lock's holders
/// before the counts (see [`Postgres::raise`]); or why they cannot be raised.
async fn read(
    tx: &Tx<'_>,
    requests: &[NewRequest],
    calls: &[CallId],
    caps: PendingCaps,
) -> Result<Result<Known, RaiseError>, tokio_postgres::Error> {
    let alongside = tx.turn == Turn::RaisingAlongside;
    let chosen: Vec<&RequestId> = crate::store::chosen_ids(requests).collect();
    // What each limit's holder holds is read with the caps as they are; the room left is known once the lock's
    // holders are.
    let limits = Limits::of(requests, &caps);
    tx.prepare(&[&RAISING, &HELD, &LIVE_CALL, sql::REQUEST_TAKEN.postgres])
        .await?;
    let (raising, held, live, taken) = futures::try_join!(
        async {
            if !alongside {
                return Ok(1);
            }
            match OptionFuture::from(tx.holders.clone()).await.flatten() {
                Some(holders) => Ok(holders),
                // A raise with no shared read reads for itself; one whose shared read failed, which aborted the
                // transaction, fails with it.
                None => tx.query_one(&RAISING, &[]).await?.try_get::<_, i64>(0),
            }
        },
        held_by(tx, &limits),
        try_join_all(
            calls
                .iter()
                .map(|call| async move { tx.query_opt(&LIVE_CALL, &[call]).await })
        ),
        try_join_all(
            chosen
                .iter()
                .map(|id| async move { tx.query_one(sql::REQUEST_TAKEN.postgres, &[id]).await })
        ),
    )?;
    let others = usize::try_from(raising - 1).unwrap_or(0);
    let room = caps.less(RAISED_ALONGSIDE.times(others).plus(tx.beside));
    let fits = room
        .limits(requests)
        .iter()
        .zip(&held)
        .try_for_each(|(limit, held)| limit.admits(*held));
    if let Err(cap) = fits {
        if alongside {
            // Too little room to decide alongside: it runs again alone, and this is dropped.
            tx.run_alone();
        }
        return Ok(Err(RaiseError::Full(cap)));
    }
    if let Some((call, _)) = calls.iter().zip(&live).find(|(_, live)| live.is_none()) {
        return Ok(Err(RaiseError::CallEnded(call.clone())));
    }
    for (id, taken) in chosen.iter().zip(&taken) {
        if taken.try_get(0)? {
            return Ok(Err(RaiseError::Taken((*id).clone())));
        }
    }
    let pending = i64::try_from(held.first().map_or(0, |all| all.count)).unwrap_or(i64::MAX);
    Ok(Ok(Known::Read { pending, live }))
}

/// Call `$1` if it is live, its row locked until the transaction ends, with its count of pending Requests: read
/// whole only if it has none pending (see [`becomes_input_required`]).
static LIVE_CALL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT {}, c.pending FROM calls AS c WHERE c.id = $1 AND c.status IN ('running', 'input_required') FOR UPDATE",
        rows::call_where("c.pending = 0")
    )
});

/// Call `call` once `views` are raised on it at `now`, if that makes it `input_required` (`unpending`, the call
/// before, if it had no Request pending): what its `call.updated` says.
fn becomes_input_required(
    unpending: Option<CallView>,
    views: &[RequestView],
    call: &CallId,
    now: Timestamp,
) -> Option<CallView> {
    let mut view = unpending?;
    view.status = CallStatus::InputRequired;
    view.updated_at = Timestamp::from_millis(now.millis());
    let raised = views.iter().filter(|raised| raised.call.as_ref() == Some(call));
    view.requests.extend(raised.map(|raised| raised.request.id.clone()));
    Some(view)
}

/// What an answer to Request `view` (raised as `new`) is decided on, and what keeping that takes: `call` what
/// resolving it does to its call, which weighs `call_weight`.
fn raised_here(
    new: &NewRequest,
    view: &RequestView,
    call: Foreseen,
    call_weight: usize,
) -> (RequestId, ToAnswer, usize) {
    let mut pending = view.clone();
    // As the row holds it.
    pending.created_at = Timestamp::from_millis(pending.created_at.millis());
    let weight = 512 + new.bytes + call_weight;
    (view.request.id.clone(), ToAnswer { pending, call }, weight)
}

/// The call that resolving its one Request pending settles, as the raise leaves it: `became`, as the raise's
/// update `counted` left it; with the round the raise opened, and the Request's key in it, if the Request is in it.
fn settled_by(
    became: &CallView,
    counted: &Row,
    round: Option<(&NewRound, &str)>,
) -> Result<rounds::Settling, tokio_postgres::Error> {
    let version = counted.try_get(rows::CALL_COLUMNS + 1)?;
    let shared: bool = counted.try_get(rows::CALL_COLUMNS + 2)?;
    let round = round.filter(|(round, _)| round.call == became.id);
    Ok(rounds::Settling::raised(
        became.clone(),
        version,
        round.map(|(round, key)| (round, key, shared)),
    ))
}

/// Adds `$3` Requests of `$4` bytes to this replica's share of owner `$1` and server `$2`.
const SHARES_RAISED: &str = "INSERT INTO pending_shares (owner, server, replica, requests, bytes) \
    VALUES ($1, $2, COALESCE(current_setting('toolnexus.replica', true), ''), $3, $4) \
    ON CONFLICT (owner, server, replica) DO UPDATE \
    SET requests = pending_shares.requests + EXCLUDED.requests, bytes = pending_shares.bytes + EXCLUDED.bytes";

/// A pending Request and its `request.created` event (parameters `$16` on).
static INSERT_REQUEST: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH raised AS ({} RETURNING 1) {}",
        sql::REQUEST_RAISED.postgres,
        insert_event(16, "SELECT {} FROM raised")
    )
});

/// How many of `views` are Requests of `call`.
fn requests_of(views: &[RequestView], call: &CallId) -> i32 {
    let count = views.iter().filter(|view| view.call.as_ref() == Some(call)).count();
    i32::try_from(count).unwrap_or(i32::MAX)
}

/// Inserts a pending Request and its `request.created` event, in one statement (BENCHMARKS.md, "Store:
/// PostgreSQL with fewer exchanges per change", "Again at cee0786").
async fn insert_request(
    tx: &Tx<'_>,
    new: &NewRequest,
    round: Option<u32>,
    mut event: Event,
) -> Result<(), tokio_postgres::Error> {
    let request = &new.request;
    let (data, deadline, created_at) = (
        rows::to_json_opt(request.data.as_deref()),
        new.deadline.millis(),
        new.created_at.millis(),
    );
    let (round, bytes) = (
        round.filter(|_| new.input_key.is_some()).map(round_number),
        i64::try_from(new.bytes).unwrap_or(i64::MAX),
    );
    let kind = request.kind.as_str();
    let values = tx.event_values(&mut event);
    let mut params: Vec<&(dyn ToSql + Sync)> = vec![
        &request.id,
        &kind,
        &request.prompt,
        &request.url,
        &data,
        &deadline,
        &new.server,
        &new.session,
        &new.call,
        &round,
        &new.input_key,
        &new.elicitation_id,
        &new.owner,
        &created_at,
        &bytes,
    ];
    params.extend(values.params());
    tx.query_one(&INSERT_REQUEST, &params).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::rounds::Foreseen;
    use crate::auth::{Principal, Role};
    use crate::store::tests::{close, insert, new_call, new_request, proposal, replica};
    use crate::store::{Answered, NewRound, PendingCaps, Store};

    /// A Request raised here, the only one pending on its call, is kept as an answer reads it (the Request, and
    /// its call as it settles, with the round the raise opened), and the answer here takes it.
    #[tokio::test]
    async fn a_request_raised_here_is_kept_as_an_answer_reads_it() {
        let store = replica(&crate::test_postgres::shared().database()).await;
        let Store::Postgres(postgres) = &store else {
            unreachable!("a PostgreSQL store")
        };
        let call = insert(&store, new_call("ada")).await;
        let input_requests = [
            (
                "a",
                json!({"method": "elicitation/create", "params": {"message": "a?"}}),
            ),
            ("r", json!({"method": "roots/list"})),
        ];
        let round = NewRound {
            call: call.id.clone(),
            number: 1,
            request_state: Some("state".to_owned()),
            input_requests: input_requests
                .into_iter()
                .map(|(key, asked)| (key.to_owned(), asked))
                .collect(),
        };
        let raised = store
            .raise(
                vec![new_request(Some(&call.id), Some("a"))],
                Some(round),
                PendingCaps::NONE,
            )
            .await
            .unwrap();
        let id = &raised[0].request.id;
        let kept = crate::lock(&postgres.shared.written).requests.take(id).expect("kept");
        let read = postgres.read_to_answer(id, true).await.unwrap().unwrap();
        assert_eq!(kept.pending, read.pending);
        assert!(matches!(kept.call, Foreseen::Settles(_)), "{:?}", kept.call);
        assert_eq!(kept.call, read.call);
        crate::lock(&postgres.shared.written).requests.note(id.clone(), kept, 0);
        let answered = store.answer(id, proposal(true)).await.unwrap();
        let Answered::Won {
            resumes: Some(retry), ..
        } = answered
        else {
            panic!("{answered:?}")
        };
        assert_eq!(retry.request_state.as_deref(), Some("state"));
        assert!(
            crate::lock(&postgres.shared.written).requests.take(id).is_none(),
            "taken by the answer"
        );
        close(store).await;
    }

    /// An answer refused before it writes leaves the Request kept as raised, for the answer after it.
    #[tokio::test]
    async fn an_answer_refused_leaves_the_request_kept() {
        let store = replica(&crate::test_postgres::shared().database()).await;
        let Store::Postgres(postgres) = &store else {
            unreachable!("a PostgreSQL store")
        };
        let call = insert(&store, new_call("ada")).await;
        let raised = store
            .raise(vec![new_request(Some(&call.id), None)], None, PendingCaps::NONE)
            .await
            .unwrap();
        let id = &raised[0].request.id;
        let mut not_yours = proposal(true);
        not_yours.by = Principal::token("bob", Role::Agent);
        let refused = store.answer(id, not_yours).await.unwrap();
        assert!(matches!(refused, Answered::Refused(_)), "{refused:?}");
        let kept = crate::lock(&postgres.shared.written).requests.take(id);
        assert!(kept.is_some_and(|kept| kept.pending.request.id == *id), "kept");
        close(store).await;
    }

    /// A raise decided on its call as this replica wrote it, on which another replica has raised since, runs
    /// again reading the call: the call was `input_required` already, so its Request alone does not settle it.
    #[tokio::test]
    async fn a_raise_on_a_call_another_replica_raised_on_since_reads_it() {
        let url = crate::test_postgres::shared().database();
        let (here, there) = (replica(&url).await, replica(&url).await);
        let call = insert(&here, new_call("ada")).await;
        let first = there
            .raise(vec![new_request(Some(&call.id), None)], None, PendingCaps::NONE)
            .await
            .unwrap();
        let second = here
            .raise(vec![new_request(Some(&call.id), None)], None, PendingCaps::NONE)
            .await
            .unwrap();
        let Store::Postgres(postgres) = &here else {
            unreachable!("a PostgreSQL store")
        };
        let id = &second[0].request.id;
        assert!(crate::lock(&postgres.shared.written).requests.take(id).is_none());
        let read = here.call(&call.id).await.unwrap().unwrap();
        assert_eq!(read.requests, [first[0].request.id.clone(), id.clone()]);
        close(here).await;
        close(there).await;
    }
}
