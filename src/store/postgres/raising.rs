//! Raising Requests in PostgreSQL: the caps checked, the calls locked, the Requests and their events
//! inserted and counted.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::LazyLock;

use futures::FutureExt;
use futures::future::{OptionFuture, try_join_all};
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use super::rounds::{Foreseen, ToAnswer, round_number};
use super::tx::{Holders, RECORD, Raised, Sent, Turn, Tx, Work, insert_event};
use super::written;
use super::{Borrowed, Postgres, RAISE_LOCK, RAISED_ALONGSIDE, Reader, rounds, rows};
use crate::ids::{CallId, RequestId};
use crate::records::{CallStatus, CallView, Event, EventKind, RequestView};
use crate::store::shares::{Held, Shares, server_key};
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
        self.write_raising(turn, raised, move |tx| {
            // Each run its own copy: a run rolled back, or moved alone, runs again.
            let (requests, round, calls) = (requests.clone(), round.clone(), calls.clone());
            Box::pin(async move {
                let tx = &*tx;
                let alongside = tx.turn == Turn::RaisingAlongside;
                let chosen: Vec<&RequestId> = crate::store::chosen_ids(&requests).collect();
                // What the raise decides on, read in one exchange, in this order: the lock's holders before the
                // counts (see above).
                tx.prepare(&[&RAISING, SHARES_HELD, &LIVE_CALL, sql::REQUEST_TAKEN.postgres])
                    .await?;
                let (raising, shares, live, taken) = futures::try_join!(
                    async {
                        if !alongside {
                            return Ok(1);
                        }
                        match OptionFuture::from(tx.holders.clone()).await.flatten() {
                            Some(holders) => Ok(holders),
                            // A raise with no shared read reads for itself; one whose shared read failed, which
                            // aborted the transaction, fails with it.
                            None => tx.query_one(&RAISING, &[]).await?.try_get::<_, i64>(0),
                        }
                    },
                    pending_shares(tx, &requests),
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
                if let Err(cap) = shares.admit(&requests, &room) {
                    if alongside {
                        // Too little room to decide alongside: it runs again alone, and this is dropped.
                        tx.run_alone();
                    }
                    return Ok(Err(RaiseError::Full(cap)));
                }
                let pending = shares.pending();
                if let Some((call, _)) = calls.iter().zip(&live).find(|(_, live)| live.is_none()) {
                    return Ok(Err(RaiseError::CallEnded(call.clone())));
                }
                for (id, taken) in chosen.iter().zip(&taken) {
                    if taken.try_get(0)? {
                        return Ok(Err(RaiseError::Taken((*id).clone())));
                    }
                }
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
                // Each call that had no Request pending becomes `input_required`: its row is locked, so what its
                // event says is known now.
                let mut waiting = Vec::new();
                for (call, live) in calls.iter().zip(&live) {
                    waiting.push(becomes_input_required(live.as_ref(), &views, call, now)?);
                }
                // What it writes, pipelined in one exchange, its `COMMIT` behind it when the change may end its
                // transaction: the round, the pending counts (once per owner and server, and once per call, not
                // once per Request: a row updated once per Request of a large round, in one transaction, grows a
                // chain of versions that each update walks), the Requests, and the calls' events.
                tx.prepare(&[
                    sql::ROUND_RAISED.postgres,
                    SHARES_RAISED,
                    &INSERT_REQUEST,
                    &rounds::RAISED,
                    &RECORD,
                ])
                .await?;
                let mut writes: Vec<Work<'_, Option<Row>>> = Vec::new();
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
                for call in &calls {
                    let raised = requests_of(&views, call);
                    writes.push(Box::pin(async move {
                        tx.query_opt(&rounds::RAISED, &[call, &raised, &now.millis()]).await
                    }));
                }
                for view in waiting.iter().flatten() {
                    let event = Event::call(view);
                    writes.push(Box::pin(async move { tx.record(event).await.map(|_| None) }));
                }
                let sent = Sent::send(writes).await;
                let replies = tx.closing(&[], sent.replies()).await?;
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
                    let (Some(became), Some(live), Some(counted)) = (&waiting[at], &live[at], &replies[raised_at + at])
                    else {
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
                    let settling = settled_by(became, live, counted, round)?;
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

/// The read of how many transactions hold the raising lock, this one included, that the raises pipelined
/// together in a transaction share: the first of them to poll it sends it, once it has prepared [`RAISING`] and
/// before it sends its reads of the counts, so it comes before each raise's. (Reading `pg_locks` costs as much
/// as a raise's other statements together; BENCHMARKS.md, "Fleet: one read of the raising lock's holders per
/// transaction".)
pub(super) fn holders(borrowed: Borrowed<'_>) -> Holders<'_> {
    let read: Pin<Box<dyn Future<Output = Option<i64>> + Send + '_>> = Box::pin(async move {
        let Borrowed { client, statements } = borrowed;
        let statement = statements.get(client, &RAISING).await.ok()?;
        client.query_one(&statement, &[]).await.ok()?.try_get(0).ok()
    });
    read.shared()
}

/// How many transactions hold the raising lock (shared: raising alongside), this one included.
static RAISING: LazyLock<String> = LazyLock::new(|| {
    // A lock on one 64-bit key is listed by its high and low halves.
    format!(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted \
         AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
         AND classid = {}::OID AND objid = {}::OID AND objsubid = 1",
        RAISE_LOCK >> 32,
        RAISE_LOCK & 0xffff_ffff
    )
});

/// The total of pending Requests (the row with no owner and no server), then what the owners `$1` and the
/// servers `$2` hold.
const SHARES_HELD: &str = "SELECT NULL::TEXT, NULL::TEXT, COALESCE(sum(requests), 0)::BIGINT, \
    COALESCE(sum(bytes), 0)::BIGINT FROM pending_shares \
    UNION ALL SELECT owner, server, sum(requests)::BIGINT, sum(bytes)::BIGINT FROM pending_shares \
    WHERE owner = ANY($1) OR server = ANY($2) GROUP BY owner, server";

/// Call `$1` if it is live, its row locked until the transaction ends, with its count of pending Requests and
/// whether its session is shared: read whole only if it has none pending (see [`becomes_input_required`]).
static LIVE_CALL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT {}, c.pending, c.shared FROM calls AS c WHERE c.id = $1 AND c.status IN ('running', 'input_required') FOR UPDATE",
        rows::call_where("c.pending = 0")
    )
});

/// Call `call` (`live`, a row of [`LIVE_CALL`]) once `views` are raised on it at `now`, if that makes it
/// `input_required`: what its `call.updated` says.
fn becomes_input_required(
    live: Option<&Row>,
    views: &[RequestView],
    call: &CallId,
    now: Timestamp,
) -> Result<Option<CallView>, tokio_postgres::Error> {
    let Some(live) = live else { return Ok(None) };
    if live.try_get::<_, i32>(rows::CALL_COLUMNS)? > 0 {
        return Ok(None);
    }
    let mut view = rows::call(live)?;
    view.status = CallStatus::InputRequired;
    view.updated_at = Timestamp::from_millis(now.millis());
    let raised = views.iter().filter(|raised| raised.call.as_ref() == Some(call));
    view.requests.extend(raised.map(|raised| raised.request.id.clone()));
    Ok(Some(view))
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

/// The call that resolving its one Request pending settles, as the raise leaves it: `became`, as its row `live`
/// was read, then the raise's update `counted` left it; with the round the raise opened, and the Request's key
/// in it, if the Request is in it.
fn settled_by(
    became: &CallView,
    live: &Row,
    counted: &Row,
    round: Option<(&NewRound, &str)>,
) -> Result<rounds::Settling, tokio_postgres::Error> {
    let shared: bool = live.try_get(rows::CALL_COLUMNS + 1)?;
    let round = round.filter(|(round, _)| round.call == became.id);
    let version = counted.try_get(rows::CALL_COLUMNS + 1)?;
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

/// The owner a Request counts against in `pending_shares`: `""` for one without.
fn owner_key(request: &NewRequest) -> &str {
    request.owner.as_deref().unwrap_or_default()
}

/// What pending Requests hold, as far as admitting `new` looks: in all, and per owner and per server of `new`.
async fn pending_shares(conn: &impl Reader, new: &[NewRequest]) -> Result<Shares, tokio_postgres::Error> {
    let owners: Vec<&str> = new.iter().map(owner_key).collect();
    let servers: Vec<&str> = new.iter().map(server_key).collect();
    // The total (the row with no owner and no server) and the pairs of `new`'s owners and servers, at once.
    let rows = conn.query(SHARES_HELD, &[&owners, &servers]).await?;
    let mut total = Held::default();
    let mut pairs = Vec::with_capacity(rows.len());
    for row in rows {
        let owner: Option<String> = row.try_get(0)?;
        let server: Option<String> = row.try_get(1)?;
        let held = held(row.try_get(2)?, row.try_get(3)?);
        match (owner, server) {
            (Some(owner), Some(server)) => pairs.push((Some(owner).filter(|owner| !owner.is_empty()), server, held)),
            _ => total = held,
        }
    }
    Ok(Shares::from_pairs(total, pairs))
}

/// What a count and a sum of bytes from the database hold.
fn held(count: i64, bytes: i64) -> Held {
    Held {
        count: usize::try_from(count).unwrap_or(0),
        bytes: usize::try_from(bytes).unwrap_or(0),
    }
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
}
