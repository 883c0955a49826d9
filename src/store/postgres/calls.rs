//! Calls and sessions in PostgreSQL: starts within allowances of their owner's cap, ends, and the reads that
//! wait for this replica's start of a call to be kept.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex};

use futures::FutureExt;
use tokio::sync::oneshot;
use tokio_postgres::types::ToSql;

use super::requests::resolve_ids;
use super::tx::{RECORD, Tx, insert_event};
use super::{Postgres, Reader, rounds, rows, written};
use crate::ids::{self, CallId, RequestId, SessionId};
use crate::lock;
use crate::records::{
    Allowed, Arguments, CallError, CallFilter, CallStatus, CallTask, CallView, Event, Finish, SessionView,
};
use crate::store::shares::{self, Allowance};
use crate::store::sql::{self, calls};
use crate::store::views;
use crate::store::{
    Finished, InsertCallError, InsertSessionError, Kept, NewCall, NewSession, Resolution, Retry, Started, StoreError,
};

impl Postgres {
    /// Starts a call within this replica's allowance of its owner's cap, which its transaction holds on its
    /// own; when the allowance is spent, the cap is dealt again ([`shares::deal`]) in a transaction holding the
    /// owner's lock, which no other replica's start within its allowance waits for. Answers as soon as the
    /// writer has decided, before the change is kept.
    pub async fn insert_call(&self, call: NewCall, max_running: usize) -> Result<Started, InsertCallError> {
        let id = ids::mint(ids::CALL);
        let cap = i64::try_from(max_running).unwrap_or(i64::MAX);
        if let Some(started) = self.start_call(&id, &call, cap, Admission::Allowance).await? {
            return Ok(started);
        }
        let started = self.start_call(&id, &call, cap, Admission::Dealt).await?;
        started.ok_or_else(|| {
            InsertCallError::Store(StoreError::Unavailable(
                "the store dealt the principal's cap but could not start the call".to_owned(),
            ))
        })
    }

    /// Starts call `id` as `admission` says; `None` when this replica's allowance is spent.
    async fn start_call(
        &self,
        id: &str,
        call: &NewCall,
        cap: i64,
        admission: Admission,
    ) -> Result<Option<Started>, InsertCallError> {
        let (decided, decision) = oneshot::channel();
        // What the first run decided: a run again after its transaction was rolled back keeps to it.
        let first = Arc::new(Mutex::new(Decided::Not(decided)));
        let principals = match admission {
            Admission::Allowance => Vec::new(),
            Admission::Dealt => vec![call.owner.clone()],
        };
        let (id, call, this) = (id.to_owned(), call.clone(), self.clone());
        let kept = self.write_holding(principals, move |tx| {
            let (first, id, call, this) = (first.clone(), id.clone(), call.clone(), this.clone());
            Box::pin(async move {
                if matches!(*lock(&first), Decided::NotStarted) {
                    return Ok(false);
                }
                let admitted = start_in(tx, &id, &call, cap, admission).await?;
                if let Admitted::Started { view, version } = &admitted {
                    lock(&this.shared.written).note_call((**view).clone(), version.clone());
                }
                let started = matches!(admitted, Admitted::Started { .. });
                let now = if started { Decided::Started } else { Decided::NotStarted };
                if let Decided::Not(decided) = std::mem::replace(&mut *lock(&first), now) {
                    let _ = decided.send(admitted);
                }
                Ok(started)
            })
        });
        let kept: Kept = Box::pin(async move {
            match kept.await? {
                true => Ok(()),
                false => Err(StoreError::Unavailable(
                    "the call was refused when its change ran again".to_owned(),
                )),
            }
        });
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
            Ok(Admitted::Started { view, .. }) => {
                let kept = self.starting(&view.id, kept);
                Ok(Some(Started { view: *view, kept }))
            }
            Ok(Admitted::Spent) => Ok(None),
            Ok(Admitted::Refused(running)) => Err(InsertCallError::TooMany(usize::try_from(running).unwrap_or(0))),
            Err(_) => Err(InsertCallError::Store(StoreError::Unavailable(
                "the store could not record the call".to_owned(),
            ))),
        }
    }

    /// `kept`, the start of call `id`, which reads of the call wait for until it resolves: the call is read as
    /// soon as it is started, as on every engine.
    fn starting(&self, id: &CallId, kept: Kept) -> Kept {
        let kept = kept.shared();
        lock(&self.shared.starting).insert(id.clone(), kept.clone());
        let (this, id, forgotten) = (self.clone(), id.clone(), kept.clone());
        tokio::spawn(async move {
            let _ = forgotten.await;
            lock(&this.shared.starting).remove(&id);
        });
        Box::pin(kept)
    }

    /// Waits until the start of call `id` is kept (or not), if this replica started it and it has not been.
    async fn started(&self, id: &CallId) {
        let starting = lock(&self.shared.starting).get(id).cloned();
        if let Some(starting) = starting {
            let _ = starting.await;
        }
    }

    /// Ends a call that has not ended: in one statement when this replica last wrote it (see [`written`]), its row
    /// still that version; otherwise reading the call it ended.
    pub async fn finish_call(&self, id: &CallId, finish: Finish) -> Result<Option<Finished>, StoreError> {
        // Taken by the first run only, as it runs (after the writer connected): one that runs again reads the call.
        let first = AtomicBool::new(true);
        let (id, this) = (id.to_owned(), self.clone());
        self.write_alongside(move |tx| {
            let (id, finish) = (id.clone(), finish.clone());
            let written = first
                .swap(false, Ordering::Relaxed)
                .then(|| lock(&this.shared.written).calls.take(&id))
                .flatten();
            Box::pin(async move {
                if let Some(written) = written
                    && let Some(finished) = finish_written(tx, written, finish.clone()).await?
                {
                    return Ok(Some(finished));
                }
                finish_in(tx, &id, finish, true).await
            })
        })
        .await
    }

    pub async fn forwarding(&self, id: &CallId, allowed: &Allowed, arguments: &Arguments) -> Result<bool, StoreError> {
        let (id, allowed, arguments) = (id.to_owned(), allowed.clone(), arguments.clone());
        self.write_alongside(move |tx| Box::pin(calls::forwarded(tx, id.clone(), allowed.clone(), arguments.clone())))
            .await
    }

    pub async fn retry(&self, call: &CallId) -> Result<Option<Retry>, StoreError> {
        self.started(call).await;
        self.read(async |conn| rounds::retry(conn, call).await).await
    }

    pub async fn note_task(&self, id: &CallId, task: &CallTask) -> Result<bool, StoreError> {
        self.started(id).await;
        let (id, task) = (id.to_owned(), task.clone());
        self.write_alongside(move |tx| Box::pin(calls::task_noted(tx, id.clone(), task.clone())))
            .await
    }

    /// Records a session unless its owner has `max_open` open, under the owner's lock as
    /// [`Self::insert_call`] is: the count, the insert and the read in one statement, where SQLite runs three in
    /// its process (BENCHMARKS.md, "Store: PostgreSQL with fewer exchanges per change").
    pub async fn insert_session(
        &self,
        session: NewSession,
        max_open: usize,
    ) -> Result<SessionView, InsertSessionError> {
        let principal = session.owner.clone().unwrap_or_default();
        let max = i64::try_from(max_open).unwrap_or(i64::MAX);
        self.write_holding(vec![principal], move |tx| {
            let session = session.clone();
            Box::pin(async move {
                static INSERT: LazyLock<String> = LazyLock::new(|| {
                    format!(
                        "WITH open AS (SELECT count(*) AS sessions FROM sessions \
                         WHERE owner IS NOT DISTINCT FROM $3::TEXT AND status IN ('starting', 'ready')), \
                         inserted AS (INSERT INTO sessions (id, server, owner, status, created_at, replica) \
                         SELECT $1::TEXT, $2::TEXT, $3::TEXT, 'starting', $4::BIGINT, $5::TEXT FROM open \
                         WHERE open.sessions < $6::BIGINT RETURNING {}) \
                         SELECT inserted.*, open.sessions FROM open LEFT JOIN inserted ON true",
                        rows::SESSION
                    )
                });
                let row = tx
                    .query_one(
                        &INSERT,
                        &[
                            &session.id,
                            &session.server,
                            &session.owner,
                            &tx.now().millis(),
                            &session.replica,
                            &max,
                        ],
                    )
                    .await?;
                if row.try_get::<_, Option<SessionId>>(0)?.is_none() {
                    let open: i64 = row.try_get(row.len() - 1)?;
                    return Ok(Err(InsertSessionError::TooMany(
                        usize::try_from(open).unwrap_or(usize::MAX),
                    )));
                }
                let view = rows::session(&row)?;
                tx.record(Event::session(&view)).await?;
                Ok(Ok(view))
            })
        })
        .await?
    }

    pub async fn call(&self, id: &CallId) -> Result<Option<CallView>, StoreError> {
        self.started(id).await;
        self.read(async |conn| calls::one(conn, id).await).await
    }

    pub async fn call_status(&self, id: &CallId) -> Result<Option<(CallStatus, String)>, StoreError> {
        self.started(id).await;
        self.call_status_now(id).await
    }

    /// A call's status and owner as committed, even while this replica's start of it is not kept.
    pub async fn call_status_now(&self, id: &CallId) -> Result<Option<(CallStatus, String)>, StoreError> {
        self.read(async |conn| calls::status(conn, id).await).await
    }

    pub async fn calls(&self, filter: &CallFilter, limit: usize) -> Result<Vec<CallView>, StoreError> {
        self.read(async |conn| calls::page(conn, filter, limit).await).await
    }

    pub async fn running_calls(&self, session: Option<&SessionId>) -> Result<Vec<CallView>, StoreError> {
        self.read(async |conn| calls::running(conn, session).await).await
    }

    pub async fn count_calls(&self) -> Result<Vec<(CallStatus, usize)>, StoreError> {
        self.read(async |conn| calls::counts(conn).await).await
    }
}

/// What the first run of a call's start decided.
enum Decided {
    /// Nothing yet: the starter waits here.
    Not(oneshot::Sender<Admitted>),
    Started,
    NotStarted,
}

/// How a call's start is admitted under its owner's cap.
#[derive(Debug, Clone, Copy)]
enum Admission {
    /// Within this replica's allowance.
    Allowance,
    /// After dealing the cap again, in a transaction holding the owner's lock.
    Dealt,
}

/// What became of a call's start.
enum Admitted {
    Started {
        view: Box<CallView>,
        /// The version of the call's row (see [`rows::version`]).
        version: String,
    },
    /// This replica's allowance is spent.
    Spent,
    /// The owner has this many calls running, its cap.
    Refused(i64),
}

/// Records call `id` running if this replica's allowance of its owner's `cap` holds one more (after dealing it
/// again, for [`Admission::Dealt`]), deciding in one statement on the replica's row of `live_calls`, which the
/// transaction holds from then on: a start sent after it in the same transaction counts it. (SQLite counts a
/// principal's calls in its process: BENCHMARKS.md, "Fleet: a principal's cap in allowances".)
async fn start_in(
    tx: &mut Tx<'_>,
    id: &str,
    call: &NewCall,
    cap: i64,
    admission: Admission,
) -> Result<Admitted, tokio_postgres::Error> {
    if let Admission::Dealt = admission {
        let found = tx
            .query(
                "SELECT replica, calls, allowance, cap FROM live_calls WHERE owner = $1 FOR UPDATE",
                &[&call.owner],
            )
            .await?;
        let parts = found
            .iter()
            .map(|row| {
                Ok(Allowance {
                    replica: row.try_get(0)?,
                    calls: row.try_get(1)?,
                    allowance: row.try_get(2)?,
                    cap: row.try_get(3)?,
                })
            })
            .collect::<Result<Vec<_>, tokio_postgres::Error>>()?;
        let dealt = match shares::deal(cap, &parts, tx.replica) {
            Ok(dealt) => dealt,
            Err(running) => return Ok(Admitted::Refused(running)),
        };
        let column = |of: fn(&Allowance) -> i64| dealt.iter().map(of).collect::<Vec<i64>>();
        let replicas: Vec<&str> = dealt.iter().map(|part| part.replica.as_str()).collect();
        tx.execute(
            "INSERT INTO live_calls (owner, replica, calls, allowance, cap) \
             SELECT $1, * FROM unnest($2::TEXT[], $3::BIGINT[], $4::BIGINT[], $5::BIGINT[]) \
             ON CONFLICT (owner, replica) DO UPDATE \
             SET calls = EXCLUDED.calls, allowance = EXCLUDED.allowance, cap = EXCLUDED.cap",
            &[
                &call.owner,
                &replicas,
                &column(|part| part.calls),
                &column(|part| part.allowance),
                &column(|part| part.cap),
            ],
        )
        .await?;
    }
    static START: LazyLock<String> = LazyLock::new(|| {
        format!(
            "WITH own AS (SELECT 1 FROM live_calls WHERE owner = $7::TEXT AND replica = $11::TEXT \
             AND cap = $13::BIGINT AND calls < allowance FOR UPDATE), \
             started AS (INSERT INTO calls AS c (id, server, session, shared, tool, arguments, owner, \
             protocol_version, capabilities, status, created_at, updated_at, replica, via) \
             SELECT $1::TEXT, $2::TEXT, $3::TEXT, $4::BOOLEAN, $5::TEXT, $6::TEXT, $7::TEXT, $8::TEXT, $9::TEXT, \
             'running', $10::BIGINT, $10::BIGINT, $11::TEXT, $12::TEXT FROM own RETURNING {} AS version), \
             counted AS (UPDATE live_calls SET calls = calls + 1 WHERE owner = $7::TEXT AND replica = $11::TEXT \
             AND EXISTS (SELECT 1 FROM started)), \
             recorded AS ({}) \
             SELECT started.version FROM recorded, started",
            rows::version("c"),
            insert_event(14, "SELECT {} FROM started")
        )
    });
    let now = tx.now();
    let view = views::started_view(CallId::stored(id), call, now);
    let mut event = Event::call(&view);
    let values = tx.event_values(&mut event);
    let place = values.place();
    let (arguments, capabilities, now, via) = (
        rows::to_json(&call.arguments),
        rows::to_json(&call.capabilities),
        now.millis(),
        call.via.as_str(),
    );
    let mut params: Vec<&(dyn ToSql + Sync)> = vec![
        &id,
        &call.server,
        &call.session,
        &call.shared,
        &call.tool,
        &arguments,
        &call.owner,
        &call.protocol_version,
        &capabilities,
        &now,
        &tx.replica,
        &via,
        &cap,
    ];
    params.extend(values.params());
    // Nothing follows it: it starts the call, or writes nothing.
    let Some(started) = tx.closing(&[&START], tx.query_opt(&START, &params)).await? else {
        tx.withdraw(place);
        return Ok(Admitted::Spent);
    };
    Ok(Admitted::Started {
        view: Box::new(view),
        version: started.try_get(0)?,
    })
}

/// Ends call `written` as this replica last wrote it, and records its event, in one statement that writes it only
/// while its row is still that version (so that the call has no Request pending, and is as `written` has it);
/// `None` when it did not. As the change's last statement, with the `COMMIT` behind it (see [`Tx::closing`]), it
/// fails instead, and the change runs again.
async fn finish_written(
    tx: &mut Tx<'_>,
    written: written::Written,
    finish: Finish,
) -> Result<Option<Finished>, tokio_postgres::Error> {
    static ENDS: LazyLock<String> = LazyLock::new(|| ending_written(false));
    static CLOSING: LazyLock<String> = LazyLock::new(|| ending_written(true));
    let now = tx.now().millis();
    let mut view = written.view;
    views::end_view(&mut view, finish, crate::time::Timestamp::from_millis(now));
    let result = rows::to_json_opt(view.result.as_deref());
    let error = view.error.as_deref();
    let (message, reason) = (
        error.map(|error| error.message.as_str()),
        error.and_then(|error| error.reason).map(|reason| reason.as_str()),
    );
    let mut event = Event::call(&view);
    let values = tx.event_values(&mut event);
    let place = values.place();
    let status = view.status.as_str();
    let requests = i64::try_from(view.requests.len()).unwrap_or(i64::MAX);
    let mut params: Vec<&(dyn ToSql + Sync)> =
        vec![&view.id, &status, &result, &message, &reason, &now, &written.version];
    params.extend(values.params());
    params.push(&requests);
    let found = match tx.ends() {
        true => tx.closing(&[&CLOSING], tx.query_opt(&CLOSING, &params)).await?,
        false => tx.query_opt(&ENDS, &params).await?,
    };
    if found.is_none() {
        tx.withdraw(place);
        return Ok(None);
    }
    Ok(Some(Finished {
        view,
        cancelled: Vec::new(),
    }))
}

/// The statement of [`finish_written`]: the call (`$1`) ended if its row's version is still `$7`, and it has `$16`
/// Requests, counted out of its owner's running calls, and its event, whose values are parameters `$8` to `$15`,
/// recorded. With `closing`, it fails unless it ended the call.
fn ending_written(closing: bool) -> String {
    let ended = format!(
        "WITH ended AS ({} AND {} = $7 \
         AND (SELECT count(*) FROM requests WHERE call_id = $1) = $16 RETURNING owner), \
         counted AS (INSERT INTO live_calls (owner, replica, calls) \
         SELECT owner, COALESCE(current_setting('toolnexus.replica', true), ''), -1 FROM ended \
         ON CONFLICT (owner, replica) DO UPDATE SET calls = live_calls.calls - 1)",
        sql::CALL_ENDED.postgres,
        rows::version("calls")
    );
    let recorded = insert_event(8, "SELECT {} FROM ended");
    match closing {
        false => format!("{ended} {recorded}"),
        true => format!(
            "{ended}, recorded AS ({recorded}) SELECT recorded.seq, toolnexus_expect(recorded.seq IS NOT NULL) \
             FROM (SELECT 1) AS one LEFT JOIN recorded ON true"
        ),
    }
}

/// Ends a call that has not ended, cancelling its pending Requests: the end counted out of `live_calls`
/// ("Fleet: PostgreSQL counting in the statements that change rows"), and the read of the call with its pending
/// Requests in the same exchange (BENCHMARKS.md, "Store: PostgreSQL with fewer exchanges per change"). With
/// `last`, the call's event is the change's last statement (see [`Tx::closing`]).
pub(super) async fn finish_in(
    tx: &mut Tx<'_>,
    id: &CallId,
    finish: Finish,
    last: bool,
) -> Result<Option<Finished>, tokio_postgres::Error> {
    let now = tx.now().millis();
    let detail = crate::store::views::ended_call_detail(&finish);
    let status = finish.status();
    let (result, error) = match finish {
        Finish::Completed(result) => (Some(result), None),
        Finish::Failed(error) => (None, Some(error)),
        Finish::Cancelled(message) => (None, Some(CallError::new(message))),
    };
    // The call ended and counted out of its owner's running calls, then read with its Requests still pending,
    // in a statement of its own: one that waited for the call's row while a replica raised Requests on it sees
    // them (the view names its Requests, whatever they become).
    static ENDED: LazyLock<String> = LazyLock::new(|| {
        format!(
            "WITH ended AS ({} RETURNING owner) \
             INSERT INTO live_calls (owner, replica, calls) \
             SELECT owner, COALESCE(current_setting('toolnexus.replica', true), ''), -1 FROM ended \
             ON CONFLICT (owner, replica) DO UPDATE SET calls = live_calls.calls - 1 RETURNING 1",
            sql::CALL_ENDED.postgres
        )
    });
    static READ: LazyLock<String> = LazyLock::new(|| {
        format!(
            "SELECT {}, ARRAY(SELECT r.id FROM requests AS r WHERE r.call_id = c.id AND r.status = 'pending') \
             FROM calls AS c WHERE c.id = $1",
            rows::CALL
        )
    });
    let (message, reason) = (
        error.as_ref().map(|error| error.message.as_str()),
        error
            .as_ref()
            .and_then(|error| error.reason)
            .map(|reason| reason.as_str()),
    );
    let (result, status) = (rows::to_json_opt(result.as_ref()), status.as_str());
    let (ended, read) = tx
        .query_in_turn(
            (&ENDED, &[&id, &status, &result, &message, &reason, &now]),
            (&READ, &[&id]),
        )
        .await?;
    let (Some(_), Some(row)) = (ended.first(), read.first()) else {
        return Ok(None);
    };
    let view = rows::call(row)?;
    let pending: Vec<RequestId> = row.try_get(rows::CALL_COLUMNS)?;
    let resolution = Resolution::Cancelled {
        detail,
        told_cancel: true,
    };
    let cancelled = resolve_ids(tx, &pending, &resolution).await?.views;
    let recorded = tx.record(Event::call(&view));
    if last {
        tx.closing(&[&RECORD], recorded).await?;
    } else {
        recorded.await?;
    }
    Ok(Some(Finished { view, cancelled }))
}
