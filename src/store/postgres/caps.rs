//! The caps on pending Requests as PostgreSQL checks them while raising: how many transactions raise alongside
//! each other, what pending Requests hold, and whether new ones fit.

use std::future::Future;
use std::pin::Pin;
use std::sync::LazyLock;

use futures::FutureExt;
use tokio_postgres::types::ToSql;

use super::tx::Holders;
use super::{Borrowed, RAISE_LOCK, RAISED_ALONGSIDE, Reader};
use crate::store::NewRequest;
use crate::store::shares::{Held, Holder, PendingCaps};

/// The limits new Requests must fit (see [`PendingCaps::limits`]) as [`FITS`] takes them.
pub(super) struct Limits {
    /// Each limit's holder: `all`, `principal` or `server`.
    holders: Vec<&'static str>,
    /// The principal or server it names (`""` for the owner-less Requests, and for `all`).
    names: Vec<String>,
    /// What the new Requests add to it: their count, then their bytes.
    adds: [Vec<i64>; 2],
    /// The most it may hold: a count, then bytes.
    most: [Vec<i64>; 2],
}

impl Limits {
    /// The limits `requests` must fit under `caps`.
    pub(super) fn of(requests: &[NewRequest], caps: &PendingCaps) -> Self {
        let mut limits = Limits {
            holders: Vec::new(),
            names: Vec::new(),
            adds: Default::default(),
            most: Default::default(),
        };
        let big = |value: usize| i64::try_from(value).unwrap_or(i64::MAX);
        for limit in caps.limits(requests) {
            let (holder, name) = match limit.holder {
                Holder::All => ("all", String::new()),
                Holder::Principal(owner) => ("principal", owner.unwrap_or_default()),
                Holder::Server(server) => ("server", server),
            };
            limits.holders.push(holder);
            limits.names.push(name);
            limits.adds[0].push(big(limit.adds.count));
            limits.adds[1].push(big(limit.adds.bytes));
            limits.most[0].push(big(limit.most.count));
            limits.most[1].push(big(limit.most.bytes));
        }
        limits
    }

    pub(super) fn params(&self) -> [&(dyn ToSql + Sync); 6] {
        [
            &self.holders,
            &self.names,
            &self.adds[0],
            &self.adds[1],
            &self.most[0],
            &self.most[1],
        ]
    }
}

/// The limits `$1` to `$6` (see [`Limits`]) as `l`, in their order (`l.at`), each with what its holder's pending
/// Requests hold as `h`.
const HOLDINGS: &str = "unnest($1::TEXT[], $2::TEXT[], $3::BIGINT[], $4::BIGINT[], $5::BIGINT[], $6::BIGINT[]) \
    WITH ORDINALITY AS l (holder, name, requests, bytes, most_requests, most_bytes, at) \
    CROSS JOIN LATERAL (SELECT COALESCE(sum(p.requests), 0) AS requests, COALESCE(sum(p.bytes), 0) AS bytes \
    FROM pending_shares AS p WHERE l.holder = 'all' OR (l.holder = 'principal' AND p.owner = l.name) \
    OR (l.holder = 'server' AND p.server = l.name)) AS h";

/// What the holder of each limit `$1` to `$6` holds, in their order (see [`held_by`]).
pub(super) static HELD: LazyLock<String> =
    LazyLock::new(|| format!("SELECT h.requests::BIGINT, h.bytes::BIGINT FROM {HOLDINGS} ORDER BY l.at"));

/// Whether new Requests fit the limits `$1` to `$6` (see [`Limits`]) with room left for all that each other
/// transaction holding the raising lock may add ([`RAISED_ALONGSIDE`] each), as their count was read ([`RAISING`])
/// earlier in the transaction; it fails ([`super::MISSED`]) if not, and returns how many Requests are pending. It
/// decides as [`crate::store::shares::Limit::admits`] does, on what [`HELD`] reads.
pub(super) static FITS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT toolnexus_expect(bool_and( \
         h.requests + l.requests + o.others * {} <= l.most_requests \
         AND h.bytes + l.bytes + o.others * {} <= l.most_bytes)), \
         (SELECT COALESCE(sum(requests), 0) FROM pending_shares)::BIGINT \
         FROM {HOLDINGS} \
         CROSS JOIN (SELECT NULLIF(current_setting('{RAISING_SETTING}', true), '')::BIGINT - 1 AS others) AS o",
        RAISED_ALONGSIDE.count, RAISED_ALONGSIDE.bytes
    )
});

/// Sent before [`FITS`], for the rest of its transaction: its statements are planned once, for any values.
/// Planned for the values at hand, as the planner chooses by a hair of its estimates, `FITS` took three times
/// longer to plan than to run, each raise (BENCHMARKS.md, "Store: the round trip's checks planned once").
pub(super) const PLANNED_ONCE: &str = "SET LOCAL plan_cache_mode = force_generic_plan";

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

/// How many transactions hold the raising lock (shared: raising alongside), this one included; kept in
/// [`RAISING_SETTING`] for the rest of the transaction, for [`FITS`].
pub(super) static RAISING: LazyLock<String> = LazyLock::new(|| {
    // A lock on one 64-bit key is listed by its high and low halves.
    format!(
        "SELECT set_config('{RAISING_SETTING}', count(*)::TEXT, true)::BIGINT FROM pg_locks \
         WHERE locktype = 'advisory' AND granted \
         AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
         AND classid = {}::OID AND objid = {}::OID AND objsubid = 1",
        RAISE_LOCK >> 32,
        RAISE_LOCK & 0xffff_ffff
    )
});

/// The setting where [`RAISING`] keeps its count.
const RAISING_SETTING: &str = "toolnexus.raising";

/// The owner a Request counts against in `pending_shares`: `""` for one without.
pub(super) fn owner_key(request: &NewRequest) -> &str {
    request.owner.as_deref().unwrap_or_default()
}

/// What the holder of each of `limits` holds, in their order: the first, all pending Requests.
pub(super) async fn held_by(conn: &impl Reader, limits: &Limits) -> Result<Vec<Held>, tokio_postgres::Error> {
    let rows = conn.query(&HELD, &limits.params()).await?;
    rows.iter()
        .map(|row| Ok(held(row.try_get(0)?, row.try_get(1)?)))
        .collect()
}

/// What a count and a sum of bytes from the database hold.
fn held(count: i64, bytes: i64) -> Held {
    Held {
        count: usize::try_from(count).unwrap_or(0),
        bytes: usize::try_from(bytes).unwrap_or(0),
    }
}
