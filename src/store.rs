//! Where the gateway's state lives and is decided: Requests, Calls, Sessions, the 2026-07-28 rounds and the
//! event log, in process memory, in a SQLite file or in a PostgreSQL database.
//!
//! Every change is one verb here, decided by the store alone (one answer wins, a call ends once), and the
//! events it records are published to the [`Feed`] once the change is kept, in the order they were
//! recorded. Reads see only what is kept.

mod listing;
mod live;
mod location;
mod memory;
mod migrations;
pub mod postgres;
mod recovery;
mod rows;
mod shares;
mod sql;
pub mod sqlite;
pub(crate) mod views;
mod vocabulary;

use rmcp::model::Implementation;

use crate::audit::{Entry, Link};
use crate::decision::Proposal;
use crate::feed::Feed;
use crate::ids::{CallId, GrantId, RequestId, SessionId};
use crate::records::{
    Allowed, Arguments, CallFilter, CallStatus, CallTask, CallView, Filter, Finish, RequestView, SessionFilter,
    SessionStatus, SessionView, Status,
};
use crate::records::{GrantView, NewGrant};
use crate::suspension::Lasting;
use crate::time::{Clock, Timestamp};

pub use location::Location;
pub use memory::Memory;
pub use postgres::Postgres;
pub use recovery::{HeldCall, Recovered};
pub use shares::{PendingCap, PendingCaps};
pub use sqlite::Sqlite;
pub(crate) use vocabulary::chosen_ids;
pub use vocabulary::{
    Answered, Asked, EventPage, Finished, Horizons, InsertCallError, InsertSessionError, Kept, Lease, NewCall,
    NewRequest, NewRound, NewSession, OpenError, Pending, RaiseError, Resolution, Resolved, Retry, Started, StoreError,
};

/// The store; cheap to clone.
#[derive(Debug, Clone)]
pub enum Store {
    Memory(Memory),
    Sqlite(Sqlite),
    Postgres(Postgres),
}

/// Calls `$verb` on whichever backend the store is.
macro_rules! dispatch {
    ($store:expr, $backend:ident => $call:expr) => {
        match $store {
            Store::Memory($backend) => $call,
            Store::Sqlite($backend) => $call,
            Store::Postgres($backend) => $call,
        }
    };
}

/// Runs a verb written once for both SQL engines (see [`sql`]) on a read connection; the memory store runs its
/// own.
macro_rules! read {
    ($store:expr, $memory:ident => $own:expr, $conn:ident => $verb:expr) => {
        match $store {
            Store::Memory($memory) => $own.await,
            Store::Sqlite(sqlite) => sqlite.read(|$conn| sql::at_once($verb)),
            Store::Postgres(postgres) => postgres.read(async |$conn| $verb.await).await,
        }
    };
}

/// Runs a verb written once for both SQL engines (see [`sql`]) as a change, with its own copy of each argument;
/// the memory store runs its own. On PostgreSQL the change runs alongside others in their transaction (a change
/// that must run in a group of its own has an engine method instead), and again, with a copy again, when that
/// transaction failed for another change's sake.
macro_rules! change {
    ($store:expr, $memory:ident => $own:expr, $verb:path, $($arg:ident),*) => {
        match $store {
            Store::Memory($memory) => $own.await,
            Store::Sqlite(sqlite) => {
                $(let $arg = $arg.to_owned();)*
                sqlite.write(move |tx| sql::at_once($verb(tx, $($arg),*))).await
            }
            Store::Postgres(postgres) => {
                $(let $arg = $arg.to_owned();)*
                postgres.write_alongside(move |tx| Box::pin($verb(tx, $($arg.clone()),*))).await
            }
        }
    };
}

impl Store {
    /// Opens the store at `location`, publishing what it records to `feed` and stamping it by `clock`;
    /// `retention` is how long ended records are kept (the memory store forgets them then, a database store
    /// deletes them when it prunes).
    pub async fn open(
        location: &Location,
        feed: Feed,
        retention: std::time::Duration,
        replica: &str,
        clock: Clock,
    ) -> Result<Self, OpenError> {
        Ok(match location {
            Location::Memory => Store::Memory(Memory::new(feed, retention, clock)),
            Location::Sqlite(path) => Store::Sqlite(Sqlite::open(path, feed, clock)?),
            Location::Postgres(url) => Store::Postgres(Postgres::open_as(url, feed, replica, clock).await?),
        })
    }

    /// The clock the store stamps what it records by.
    pub fn clock(&self) -> &Clock {
        dispatch!(self, store => store.clock())
    }

    /// Ends what other replicas that are gone left (in PostgreSQL, which replicas share); elsewhere one
    /// gateway holds the store, and there is nothing to end.
    pub async fn reap(&self) -> Result<Recovered, StoreError> {
        match self {
            Store::Postgres(postgres) => postgres.reap().await,
            Store::Memory(_) | Store::Sqlite(_) => Ok(Recovered::default()),
        }
    }

    /// Whether this gateway may take others for gone: on PostgreSQL, once every one of its own heartbeats has
    /// been recorded for a whole lease; elsewhere there are no others.
    pub fn holds_its_lease(&self) -> bool {
        match self {
            Store::Postgres(postgres) => postgres.holds_its_lease(),
            Store::Memory(_) | Store::Sqlite(_) => false,
        }
    }

    /// Resolves when another replica has taken this one for gone (on PostgreSQL); elsewhere, never.
    pub async fn taken_for_gone(&self) {
        match self {
            Store::Postgres(postgres) => postgres.taken_for_gone().await,
            Store::Memory(_) | Store::Sqlite(_) => std::future::pending().await,
        }
    }

    /// Whether the store answers now: a PostgreSQL server may be away; a file or memory always is.
    pub async fn reachable(&self) -> bool {
        match self {
            Store::Postgres(postgres) => postgres.reachable().await,
            Store::Memory(_) | Store::Sqlite(_) => true,
        }
    }

    /// Lets the store finish the changes it has; later changes fail. A PostgreSQL replica says it is gone, so
    /// that another ends what it leaves at once rather than after the lease.
    pub async fn close(&self) {
        match self {
            Store::Memory(_) => {}
            Store::Sqlite(sqlite) => sqlite.close(),
            Store::Postgres(postgres) => postgres.retire().await,
        }
    }

    /// Whether what it keeps survives the process.
    pub fn is_durable(&self) -> bool {
        matches!(self, Store::Sqlite(_) | Store::Postgres(_))
    }

    /// Raises pending Requests, with the round they answer (2026-07-28), unless they do not fit `caps`, their
    /// call has ended, or a posted one's id is taken; their call, if they have one, waits on them.
    pub async fn raise(
        &self,
        requests: Vec<NewRequest>,
        round: Option<NewRound>,
        caps: PendingCaps,
    ) -> Result<Vec<RequestView>, RaiseError> {
        dispatch!(self, store => store.raise(requests, round, caps).await)
    }

    /// Decides `proposal` on Request `id` as it reads it (see [`crate::decision::decide`]); a decision resolves the
    /// Request unless, at that moment, its upstream has withdrawn it.
    pub async fn answer(&self, id: &RequestId, proposal: Proposal) -> Result<Answered, StoreError> {
        dispatch!(self, store => store.answer(id, proposal).await)
    }

    /// Resolves pending Requests without an answer.
    pub async fn resolve(&self, which: Pending, resolution: Resolution) -> Result<Resolved, StoreError> {
        dispatch!(self, store => store.resolve(which, resolution).await)
    }

    /// Expires the pending Requests due at `now`, at most `limit` of them.
    pub async fn expire_due(&self, now: Timestamp, limit: usize) -> Result<Resolved, StoreError> {
        dispatch!(self, store => store.expire_due(now, limit).await)
    }

    /// When the next pending Request expires.
    pub async fn next_deadline(&self) -> Result<Option<Timestamp>, StoreError> {
        read!(self, memory => memory.next_deadline(), conn => sql::requests::next_deadline(conn))
    }

    /// Records the upstream's completion of a URL-mode elicitation; `false` if no Request matches or it was
    /// recorded already.
    pub async fn complete(&self, session: &SessionId, elicitation_id: &str) -> Result<bool, StoreError> {
        change!(
            self,
            memory => memory.complete(session, elicitation_id),
            sql::requests::completed, session, elicitation_id
        )
    }

    /// Records a running call, unless its owner has `max_running` calls that have not ended. It returns once
    /// the store has decided; the call is kept when [`Started::kept`] says so, so that the caller can start
    /// its work meanwhile.
    pub async fn insert_call(&self, call: NewCall, max_running: usize) -> Result<Started, InsertCallError> {
        dispatch!(self, store => store.insert_call(call, max_running).await)
    }

    /// Ends a call that has not ended, cancelling its pending Requests; `None` if it had ended already.
    pub async fn finish_call(&self, id: &CallId, finish: Finish) -> Result<Option<Finished>, StoreError> {
        dispatch!(self, store => store.finish_call(id, finish).await)
    }

    /// Records that the answer of an answered Request never reached its upstream, which withdrew the
    /// elicitation first: the Request becomes `cancelled` with `detail`, its answer kept for the record. `None`
    /// if it was not answered.
    pub async fn undelivered(&self, id: &RequestId, detail: &str) -> Result<Option<RequestView>, StoreError> {
        change!(self, memory => memory.undelivered(id, detail), sql::requests::undelivered, id, detail)
    }

    /// Records why the upstream refused a call's latest round, on the Requests that answered it.
    pub async fn annotate_round(&self, call: &CallId, detail: &str) -> Result<(), StoreError> {
        change!(self, memory => memory.annotate_round(call, detail), sql::requests::annotate_round, call, detail)
    }

    /// What retrying a call takes, if it has not ended and its latest round is answered, or it follows a task.
    pub async fn retry(&self, call: &CallId) -> Result<Option<Retry>, StoreError> {
        dispatch!(self, store => store.retry(call).await)
    }

    /// Records the upstream task of a call that has not ended, as last seen (a `call.updated` event); `false`
    /// when the call has ended.
    pub async fn note_task(&self, call: &CallId, task: &CallTask) -> Result<bool, StoreError> {
        dispatch!(self, store => store.note_task(call, task).await)
    }

    /// Records a session that is connecting, unless its owner holds `max_open` open sessions.
    pub async fn insert_session(
        &self,
        session: NewSession,
        max_open: usize,
    ) -> Result<SessionView, InsertSessionError> {
        dispatch!(self, store => store.insert_session(session, max_open).await)
    }

    /// Marks a session ready with what its handshake negotiated.
    pub async fn session_ready(
        &self,
        id: &SessionId,
        protocol_version: Option<String>,
        server_info: Option<Implementation>,
    ) -> Result<Option<SessionView>, StoreError> {
        change!(
            self,
            memory => memory.session_ready(id, protocol_version, server_info),
            sql::sessions::ready, id, protocol_version, server_info
        )
    }

    /// Ends a session that is open; `None` if it had ended already.
    pub async fn end_session(
        &self,
        id: &SessionId,
        status: SessionStatus,
        detail: &str,
    ) -> Result<Option<SessionView>, StoreError> {
        change!(self, memory => memory.end_session(id, status, detail), sql::sessions::ended, id, status, detail)
    }

    /// One Request.
    pub async fn request(&self, id: &RequestId) -> Result<Option<RequestView>, StoreError> {
        read!(self, memory => memory.request(id), conn => sql::requests::one(conn, id))
    }

    /// A Request's status and owner, without reading the rest.
    pub async fn request_status(&self, id: &RequestId) -> Result<Option<(Status, Option<String>)>, StoreError> {
        dispatch!(self, store => store.request_status(id).await)
    }

    /// Up to `limit` Requests matching the filter, oldest first, from `cursor`; and the next page's cursor.
    pub async fn requests(
        &self,
        filter: &Filter,
        cursor: u64,
        limit: usize,
    ) -> Result<(Vec<RequestView>, Option<u64>), StoreError> {
        read!(
            self,
            memory => memory.requests(filter, cursor, limit),
            conn => sql::requests::page(conn, filter, cursor, limit)
        )
    }

    /// How many Requests are pending.
    pub async fn pending_count(&self) -> Result<usize, StoreError> {
        dispatch!(self, store => store.pending_count().await)
    }

    /// One call.
    pub async fn call(&self, id: &CallId) -> Result<Option<CallView>, StoreError> {
        dispatch!(self, store => store.call(id).await)
    }

    /// Marks a running call, which its approval held, as sent upstream with `arguments` (those it was started
    /// with, or those its approver changed them to) and who allowed it: `false` if it was already (or is not
    /// running), so that it is sent once whoever sends it.
    pub async fn forwarding(&self, id: &CallId, allowed: &Allowed, arguments: &Arguments) -> Result<bool, StoreError> {
        dispatch!(self, store => store.forwarding(id, allowed, arguments).await)
    }

    /// Gives the grant an approval asked for, once: the grant that approval gave, new or given before.
    pub async fn give_grant(&self, grant: NewGrant) -> Result<GrantView, StoreError> {
        change!(self, memory => memory.give_grant(grant), sql::grants::give, grant)
    }

    /// Uses the oldest grant that holds, covers `call` (whose arguments have `digest`) and lasts as one of
    /// `offered` (what its policy offers now), recording the use (a `grant.used` event): `None` when none does.
    pub async fn use_grant(
        &self,
        call: &CallView,
        digest: &str,
        offered: &[Lasting],
    ) -> Result<Option<GrantView>, StoreError> {
        change!(self, memory => memory.use_grant(call, digest, offered), sql::grants::used, call, digest, offered)
    }

    /// A grant, whether it holds or not.
    pub async fn grant(&self, id: &GrantId) -> Result<Option<GrantView>, StoreError> {
        read!(self, memory => memory.grant(id), conn => sql::grants::one(conn, id))
    }

    /// Up to `limit` grants that hold now, of `owner` or of everyone, oldest first.
    pub async fn grants(&self, owner: Option<&str>, limit: usize) -> Result<Vec<GrantView>, StoreError> {
        let now = self.clock().now().millis();
        read!(
            self,
            memory => memory.grants(owner, limit),
            conn => sql::grants::live(conn, now, owner, limit)
        )
    }

    /// Revokes a grant that is not revoked yet, by `by`: `None` when it is unknown or revoked already.
    pub async fn revoke_grant(&self, id: &GrantId, by: &str) -> Result<Option<GrantView>, StoreError> {
        change!(self, memory => memory.revoke_grant(id, by), sql::grants::revoked, id, by)
    }

    /// A call's status and owner, without reading the rest.
    pub async fn call_status(&self, id: &CallId) -> Result<Option<(CallStatus, String)>, StoreError> {
        dispatch!(self, store => store.call_status(id).await)
    }

    /// Whether a call has ended, as the store has it now. Unlike [`Store::call_status`] it does not wait for a
    /// start of the call this replica has not kept yet: no end of a call is kept before its start, so until then
    /// the call has not ended.
    pub async fn call_ended(&self, id: &CallId) -> Result<bool, StoreError> {
        let status = match self {
            Store::Postgres(store) => store.call_status_now(id).await?,
            store => store.call_status(id).await?,
        };
        Ok(status.is_some_and(|(status, _)| status.is_final()))
    }

    /// Up to `limit` calls matching the filter, oldest first.
    pub async fn calls(&self, filter: &CallFilter, limit: usize) -> Result<Vec<CallView>, StoreError> {
        dispatch!(self, store => store.calls(filter, limit).await)
    }

    /// The calls that have not ended and run on a session (all of them with `None`).
    pub async fn running_calls(&self, session: Option<&SessionId>) -> Result<Vec<CallView>, StoreError> {
        dispatch!(self, store => store.running_calls(session).await)
    }

    /// How many calls are kept in each status.
    pub async fn count_calls(&self) -> Result<Vec<(CallStatus, usize)>, StoreError> {
        dispatch!(self, store => store.count_calls().await)
    }

    /// One session.
    pub async fn session(&self, id: &SessionId) -> Result<Option<SessionView>, StoreError> {
        read!(self, memory => memory.session(id), conn => sql::sessions::one(conn, id))
    }

    /// The sessions `filter` keeps, oldest first.
    pub async fn sessions(&self, filter: SessionFilter) -> Result<Vec<SessionView>, StoreError> {
        let all = filter == SessionFilter::All;
        read!(self, memory => memory.sessions(filter), conn => sql::sessions::list(conn, all))
    }

    /// Up to `limit` events recorded after event `after`, oldest first.
    pub async fn events_after(&self, after: u64, limit: usize) -> Result<EventPage, StoreError> {
        dispatch!(self, store => store.events_after(after, limit).await)
    }

    /// The id of the newest event.
    pub async fn last_event_id(&self) -> Result<u64, StoreError> {
        dispatch!(self, store => store.last_event_id().await)
    }

    /// The newest link of the audit chain; `None` before an event is chained.
    pub async fn chain_head(&self) -> Result<Option<Link>, StoreError> {
        read!(self, memory => memory.chain_head(), conn => sql::audit::head(conn))
    }

    /// Appends `links` (of events published, in the order of the log, each following the one before) to the
    /// audit chain if its newest link is still event `after`'s (`None`: the chain is empty); `false` when
    /// another chainer moved it on meanwhile, and nothing was appended.
    pub async fn extend_chain(&self, after: Option<u64>, links: Vec<Link>) -> Result<bool, StoreError> {
        dispatch!(self, store => store.extend_chain(after, links).await)
    }

    /// Up to `limit` events chained after event `after`, oldest first, each with its link.
    pub async fn chained_after(&self, after: u64, limit: usize) -> Result<Vec<Entry>, StoreError> {
        read!(self, memory => memory.chained_after(after, limit), conn => sql::audit::chained(conn, after, limit))
    }

    /// The id of the last event delivered to a webhook, as last recorded.
    pub async fn webhook_cursor(&self, webhook: &str) -> Result<Option<u64>, StoreError> {
        read!(self, memory => memory.webhook_cursor(webhook), conn => sql::maintenance::webhook_cursor(conn, webhook))
    }

    /// Records that a webhook has had every event up to `event`, unless it is recorded further already; kept
    /// with the next change, not waited for.
    pub fn save_webhook_cursor(&self, webhook: &str, event: u64) {
        dispatch!(self, store => store.save_webhook_cursor(webhook, event))
    }

    /// Takes or renews the lease on a webhook's deliveries (or other leased work, [`crate::lease`]) for
    /// `holder`, for `lease` from now, if it is free, run out, or `holder`'s already. Gateways sharing a
    /// database run the same webhooks; the lease makes one of them deliver each. A memory or SQLite store has
    /// one gateway, which always gets it.
    pub async fn hold_webhook(
        &self,
        webhook: &str,
        holder: &str,
        lease: std::time::Duration,
    ) -> Result<Lease, StoreError> {
        dispatch!(self, store => store.hold_webhook(webhook, holder, lease).await)
    }

    /// The key kept under `name`; when none is kept yet, `made` is kept and returned. Every replica of a
    /// database store gets the one that was kept first.
    pub async fn kept_key(&self, name: &str, made: &str) -> Result<String, StoreError> {
        dispatch!(self, store => store.kept_key(name, made).await)
    }

    /// Puts right what the previous run left: what could not survive it ends, and the calls ready to retry
    /// are returned. `restarted` says why, in the records it ends.
    pub async fn recover(&self, restarted: &str) -> Result<Recovered, StoreError> {
        dispatch!(self, store => store.recover(restarted).await)
    }

    /// Forgets ended records and events older than their horizons; an event only once it is chained, and
    /// never the newest chained.
    pub async fn prune(&self, horizons: Horizons) -> Result<(), StoreError> {
        dispatch!(self, store => store.prune(horizons).await)
    }

    /// How large the store is, in bytes (`None` in memory).
    pub async fn size(&self) -> Option<u64> {
        dispatch!(self, store => store.size().await)
    }
}

#[cfg(test)]
mod tests;
