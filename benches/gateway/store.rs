//! What keeping state costs: the same flows on a gateway with its state in memory, on one with a SQLite
//! file (`synchronous=FULL`) and on PostgreSQL (durable commits), side by side; and the drain over three
//! replicas sharing one PostgreSQL database against one.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cluster::Cluster;
use crate::database::{Counters, PerAnswer};
use crate::process::{BOTH_ERAS, Backend, GatewayProcess};
use crate::relay::Relay;
use crate::scale;
use crate::stats::{Samples, millis, p50_p99};
use crate::{Era, Plan, record, verdict};

/// The replicas of the fleet measured against one gateway.
const FLEET: usize = 3;
/// The drain target, answers per second (SQLite: one gateway; PostgreSQL: the fleet).
const DRAIN_TARGET: f64 = 20_000.0;
/// A PostgreSQL round trip this slow waited out a long-poll: sampling stops rather than take hours.
const STALL: Duration = Duration::from_secs(5);
/// The limit on database round trips per answer.
const ROUND_TRIPS_TARGET: f64 = 2.0;
/// How many pending Requests are drained through the relay that counts round trips.
const RELAYED: usize = 10_000;

/// What holding and draining many pending Requests measured on one backend.
struct Held {
    rss_per_request: f64,
    drain_rate: f64,
    /// From spawning a gateway on a store holding them to `/readyz` 200 (SQLite only).
    ready_with_them: Option<Duration>,
    /// What the database counted per answer, from before the drain to every call completed (PostgreSQL only).
    per_answer: Option<PerAnswer>,
}

/// The PostgreSQL server of the section, and whether it counts statements.
struct Postgres {
    cluster: Cluster,
    statements: bool,
}

impl Postgres {
    /// A durable server, with `pg_stat_statements` where the server has it.
    fn start() -> Self {
        let cluster = Cluster::start_durable();
        let probe = cluster.database();
        let statements = cluster.counts_statements(&probe);
        Self { cluster, statements }
    }

    /// A fresh database, ready to count its statements.
    fn database(&self) -> Backend {
        let url = self.cluster.database();
        if self.statements {
            self.cluster.counts_statements(&url);
        }
        Backend::Postgres(url)
    }
}

/// The store section: round trips in both eras on each store, then `plan.store_pending` Requests held and
/// drained. `BENCH_STORE=sqlite` (or `postgres`) compares that store with memory only.
pub async fn table(binary: &Path, plan: &Plan) -> anyhow::Result<String> {
    let only = std::env::var("BENCH_STORE").ok();
    let wanted = |name: &str| only.as_deref().is_none_or(|only| only == name);
    let postgres = wanted("postgres").then(Postgres::start);
    let mut table = String::from(
        "\n### Store: memory vs SQLite vs PostgreSQL (µs unless stated)\n\n\
         | measurement | protocol | memory | sqlite | postgres | sqlite / memory | postgres / memory | target |\n\
         |---|---|---|---|---|---|---|---|\n",
    );
    round_trips(binary, plan, wanted("sqlite"), postgres.as_ref(), &mut table).await?;

    let count = plan.store_pending;
    let relayed = RELAYED.min(count);
    let in_memory = hold_and_drain(binary, &Backend::Memory, 1, count, None).await?;
    let on_disk = match wanted("sqlite") {
        true => Some(hold_and_drain(binary, &Backend::Sqlite, 1, count, None).await?),
        false => None,
    };
    let (one, fleet) = match &postgres {
        Some(postgres) => (
            Some(hold_and_drain(binary, &postgres.database(), 1, count, Some(postgres)).await?),
            Some(hold_and_drain(binary, &postgres.database(), FLEET, count, Some(postgres)).await?),
        ),
        None => (None, None),
    };
    let c = scale::DRAIN_CONCURRENCY;
    let rate = |held: &Option<Held>| held.as_ref().map(|held| held.drain_rate);
    let _ = writeln!(
        table,
        "| answers/s draining {count} pending (c={c}), one gateway | 2026-07-28 | {:.0} | {} | {} | {} | {} | \
         {} |",
        in_memory.drain_rate,
        cell(rate(&on_disk), 0),
        cell(rate(&one), 0),
        cell(rate(&on_disk).map(|rate| rate / in_memory.drain_rate), 2),
        cell(rate(&one).map(|rate| rate / in_memory.drain_rate), 2),
        rate(&on_disk).map_or(String::new(), |rate| format!(
            "sqlite ≥ 20 000: {}",
            verdict(rate >= DRAIN_TARGET)
        ))
    );
    if let (Some(one), Some(fleet), Some(postgres)) = (&one, &fleet, &postgres) {
        let _ = writeln!(
            table,
            "| answers/s draining {count} pending (c={c}), {FLEET} replicas on one database | 2026-07-28 | | | {:.0} | | \
             {:.2} | fleet ≥ 20 000: {} ({:.2}× one replica) |",
            fleet.drain_rate,
            fleet.drain_rate / in_memory.drain_rate,
            verdict(fleet.drain_rate >= DRAIN_TARGET),
            fleet.drain_rate / one.drain_rate,
        );
        for (replicas, count, held) in [("one replica", 1, one), ("three replicas", FLEET, fleet)] {
            let round_trips = relayed_round_trips(binary, postgres, count, relayed).await?;
            per_answer_rows(&mut table, replicas, held.per_answer.as_ref(), Some(round_trips));
        }
    }
    let rss = |held: &Option<Held>| held.as_ref().map(|held| held.rss_per_request);
    let _ = writeln!(
        table,
        "| RSS per pending Request at {count} (B), one gateway | 2026-07-28 | {:.0} | {} | {} | {} | {} | \
         {} |",
        in_memory.rss_per_request,
        cell(rss(&on_disk), 0),
        cell(rss(&one), 0),
        cell(rss(&on_disk).map(|rss| rss / in_memory.rss_per_request), 2),
        cell(rss(&one).map(|rss| rss / in_memory.rss_per_request), 2),
        rss(&on_disk).map_or(String::new(), |rss| {
            format!("sqlite ≤ memory: {}", verdict(rss <= in_memory.rss_per_request))
        })
    );
    if let Some(on_disk) = &on_disk {
        let ready = on_disk.ready_with_them.unwrap_or_default();
        let _ = writeln!(
            table,
            "| start → `/readyz` 200 with {count} pending in the file (ms) | 2026-07-28 | | {} | | | | ≤ 1000 ms: {} |",
            millis(ready),
            verdict(ready <= Duration::from_secs(1))
        );
    }
    let statements = postgres.as_ref().is_some_and(|postgres| postgres.statements);
    let _ = writeln!(
        table,
        "\n{} measured round trips per cell after {} warm-up ones, memory, SQLite and PostgreSQL alternating. \
         PostgreSQL 15 runs on the same machine with `fsync`, `synchronous_commit` and `full_page_writes` on{}; \
         each PostgreSQL drain has a fresh database, and the {FLEET} replicas' answerers take the Requests in \
         turn. The SQLite gateway is stopped with SIGTERM once the Requests are pending and started again on \
         its file before they are drained. Database counts run from just before the drain until every flood \
         call has completed (so they include the rounds' retries and the replicas' heartbeats and event-log \
         reads meanwhile), read from `pg_stat_database.xact_commit`{}. Round trips are counted in runs of their \
         own, with {relayed} pending answered through a loopback relay in front of the server ({ONE_BY_ONE} \
         of them one at a time, the rest drained until their calls completed): each time a connection's \
         client sends after having received something, one (statements sent together or pipelined, on one \
         connection, share it; answers in flight at once share a transaction's). Round trips per elicitation round \
         trip are counted the same way on a gateway of their own, over {RELAYED_ELICITATIONS} round trips of \
         each era sent one after another, after as many to warm up.",
        plan.iterations,
        plan.warmup,
        if statements {
            " and `pg_stat_statements` loaded"
        } else {
            ""
        },
        if statements {
            " and the sum of `pg_stat_statements.calls` (every statement, `BEGIN` and `COMMIT` included)"
        } else {
            ""
        },
    );
    Ok(table)
}

/// Elicitation round trips in both eras on memory and the stores asked for, alternating.
async fn round_trips(
    binary: &Path,
    plan: &Plan,
    sqlite: bool,
    postgres: Option<&Postgres>,
    table: &mut String,
) -> anyhow::Result<()> {
    let memory = GatewayProcess::spawn_in(binary, BOTH_ERAS, &Backend::Memory, tempfile::tempdir()?).await?;
    let sqlite = match sqlite {
        true => Some(GatewayProcess::spawn_in(binary, BOTH_ERAS, &Backend::Sqlite, tempfile::tempdir()?).await?),
        false => None,
    };
    let pg = match postgres {
        Some(postgres) => {
            Some(GatewayProcess::spawn_in(binary, BOTH_ERAS, &postgres.database(), tempfile::tempdir()?).await?)
        }
        None => None,
    };
    for gateway in [Some(&memory), sqlite.as_ref(), pg.as_ref()].into_iter().flatten() {
        gateway.ready().await?;
    }
    let relayed = match postgres {
        Some(postgres) => Some(relayed_elicitations(binary, postgres).await?),
        None => None,
    };
    for era in [Era::Modern, Era::Legacy] {
        eprintln!("store: round trips, {}", era.protocol());
        let (mut in_memory, mut on_disk, mut in_postgres) =
            (Samples::default(), Samples::default(), Samples::default());
        let mut stalled = None;
        for round in 0..plan.warmup + plan.iterations {
            let measured = round >= plan.warmup;
            record(measured, &mut in_memory, memory.rest.confirm(era.server())).await?;
            if let Some(sqlite) = &sqlite {
                record(measured, &mut on_disk, sqlite.rest.confirm(era.server())).await?;
            }
            if let Some(pg) = pg.as_ref().filter(|_| stalled.is_none()) {
                let started = Instant::now();
                record(measured, &mut in_postgres, pg.rest.confirm(era.server())).await?;
                stalled = Some(started.elapsed()).filter(|took| *took >= STALL);
            }
        }
        let ratio = |samples: &Samples| samples.p50().as_secs_f64() / in_memory.p50().as_secs_f64().max(1e-9);
        let (sqlite_cell, sqlite_ratio, target) = match (&sqlite, era) {
            (None, _) => (String::new(), String::new(), String::new()),
            (Some(_), Era::Modern) => (
                p50_p99(&on_disk),
                format!("{:.2}", ratio(&on_disk)),
                format!("sqlite ≤ 1.5: {}", verdict(ratio(&on_disk) <= 1.5)),
            ),
            (Some(_), Era::Legacy) => (p50_p99(&on_disk), format!("{:.2}", ratio(&on_disk)), String::new()),
        };
        let (postgres_cell, postgres_ratio) = match (&pg, stalled) {
            (None, _) => (String::new(), String::new()),
            (Some(_), Some(took)) => (
                format!("stalled: one took {:.1} s, then not sampled", took.as_secs_f64()),
                String::new(),
            ),
            (Some(_), None) => (p50_p99(&in_postgres), format!("{:.2}", ratio(&in_postgres))),
        };
        let _ = writeln!(
            table,
            "| elicitation round trip | {} | {} | {sqlite_cell} | {postgres_cell} | {sqlite_ratio} | {postgres_ratio} | \
             {target} |",
            era.protocol(),
            p50_p99(&in_memory),
        );
        if let Some(relayed) = &relayed {
            let _ = writeln!(
                table,
                "| database: round trips per elicitation round trip (counted at a relay) | {} | | | {:.2} | | | |",
                era.protocol(),
                relayed[usize::from(era == Era::Legacy)]
            );
        }
    }
    Ok(())
}

/// How many elicitation round trips of each era [`relayed_elicitations`] counts, after as many to warm up.
const RELAYED_ELICITATIONS: usize = 100;

/// Database round trips per elicitation round trip (the call, its Request, the answer and the call's end), in
/// 2026-07-28 then 2025-11-25, each sent once the one before has completed: counted at a relay in front of a
/// fresh database of `postgres`, its own gateway's heartbeats and event-log reads meanwhile included.
async fn relayed_elicitations(binary: &Path, postgres: &Postgres) -> anyhow::Result<[f64; 2]> {
    eprintln!("store: round trips of elicitation round trips through a relay");
    let Backend::Postgres(url) = postgres.database() else {
        unreachable!("a PostgreSQL database")
    };
    let relay = Relay::in_front_of(&url).await?;
    let backend = Backend::Postgres(relay.url.clone());
    let gateway = GatewayProcess::spawn_in(binary, BOTH_ERAS, &backend, tempfile::tempdir()?).await?;
    gateway.ready().await?;
    let mut per_era = [0.0; 2];
    for (era, per) in [Era::Modern, Era::Legacy].into_iter().zip(&mut per_era) {
        for _ in 0..RELAYED_ELICITATIONS {
            gateway.rest.confirm(era.server()).await?;
        }
        let before = relay.round_trips();
        for _ in 0..RELAYED_ELICITATIONS {
            gateway.rest.confirm(era.server()).await?;
        }
        *per = (relay.round_trips() - before) as f64 / RELAYED_ELICITATIONS as f64;
    }
    Ok(per_era)
}

/// A table cell: the value with `decimals` places, or empty when not measured.
fn cell(value: Option<f64>, decimals: usize) -> String {
    value.map_or_else(String::new, |value| format!("{value:.decimals$}"))
}

/// The rows of what the database counted per answer while `replicas` drained.
fn per_answer_rows(
    table: &mut String,
    replicas: &str,
    per_answer: Option<&PerAnswer>,
    round_trips: Option<RoundTrips>,
) {
    let Some(per_answer) = per_answer else { return };
    let _ = writeln!(
        table,
        "| database: transactions committed per answer, {replicas} | 2026-07-28 | | | {:.3} | | | |",
        per_answer.commits
    );
    let _ = writeln!(
        table,
        "| database: `requests` rows updated per answer, {replicas} | 2026-07-28 | | | {:.3} | | | |",
        per_answer.request_updates
    );
    if let Some(statements) = per_answer.statements {
        let _ = writeln!(
            table,
            "| database: statements per answer, {replicas} | 2026-07-28 | | | {statements:.3} | | | |"
        );
    }
    if let Some(round_trips) = round_trips {
        let _ = writeln!(
            table,
            "| database: round trips per answer sent one at a time (counted at a relay), {replicas} | \
             2026-07-28 | | | {:.3} | | | |",
            round_trips.one_by_one
        );
        let _ = writeln!(
            table,
            "| database: round trips per answer draining (c={}, counted at a relay), {replicas} | \
             2026-07-28 | | | {:.3} | | | ≤ 2: {} |",
            scale::DRAIN_CONCURRENCY,
            round_trips.draining,
            verdict(round_trips.draining <= ROUND_TRIPS_TARGET)
        );
    }
}

/// Database round trips per answer, counted at a relay in front of the database.
struct RoundTrips {
    /// The first [`ONE_BY_ONE`] answers, each sent once the one before was answered.
    one_by_one: f64,
    /// The rest, drained at [`scale::DRAIN_CONCURRENCY`] until their calls have completed.
    draining: f64,
}

/// How many answers of a relayed run are sent one at a time.
const ONE_BY_ONE: usize = 200;

/// Round trips per answer between `replicas` fresh gateways and a fresh database of `postgres`, counted at a
/// relay in front of the database from just before `count` pending Requests are answered (the replicas'
/// heartbeats and event-log reads meanwhile included). Its own run, as the relay slows what it counts.
async fn relayed_round_trips(
    binary: &Path,
    postgres: &Postgres,
    replicas: usize,
    count: usize,
) -> anyhow::Result<RoundTrips> {
    eprintln!("store: round trips of {count} answers through a relay, postgres × {replicas}");
    let Backend::Postgres(url) = postgres.database() else {
        unreachable!("a PostgreSQL database")
    };
    let relay = Relay::in_front_of(&url).await?;
    let backend = Backend::Postgres(relay.url.clone());
    let mut gateways = Vec::with_capacity(replicas);
    for _ in 0..replicas {
        let gateway = GatewayProcess::spawn_in(binary, BOTH_ERAS, &backend, tempfile::tempdir()?).await?;
        gateway.ready().await?;
        gateways.push(gateway);
    }
    let (calls, mut ids) = scale::hold(&gateways[0].rest, Era::Modern, count).await?;
    let rest_of = ids.split_off(ONE_BY_ONE.min(ids.len() / 2));
    let per = |from: u64, answers: usize| (relay.round_trips() - from) as f64 / answers.max(1) as f64;
    let before = relay.round_trips();
    for (nth, id) in ids.iter().enumerate() {
        gateways[nth % replicas].rest.answer(id).await?;
    }
    let one_by_one = per(before, ids.len());
    let before = relay.round_trips();
    let rests: Vec<_> = gateways.iter().map(|gateway| gateway.rest.clone()).collect();
    let draining = rest_of.len();
    scale::drain(&rests, Arc::new(rest_of)).await?;
    scale::completed(&gateways[0].rest, &calls).await?;
    Ok(RoundTrips {
        one_by_one,
        draining: per(before, draining),
    })
}

/// Holds `count` Requests pending on `replicas` fresh gateways sharing `backend`, measures the first one's
/// memory, restarts it (SQLite) and drains them with answerers spread over the replicas; `postgres` counts
/// what the database did meanwhile.
async fn hold_and_drain(
    binary: &Path,
    backend: &Backend,
    replicas: usize,
    count: usize,
    postgres: Option<&Postgres>,
) -> anyhow::Result<Held> {
    eprintln!("store: {count} pending, {} × {replicas}", backend.name());
    let mut gateways = Vec::with_capacity(replicas);
    for _ in 0..replicas {
        let gateway = GatewayProcess::spawn_in(binary, BOTH_ERAS, backend, tempfile::tempdir()?).await?;
        gateway.ready().await?;
        gateways.push(gateway);
    }
    scale::flood_and_drain(&gateways[0].rest, Era::Modern, 8).await?;
    let baseline = gateways[0].rss()?;
    let (calls, ids) = scale::hold(&gateways[0].rest, Era::Modern, count).await?;
    let rss_per_request = gateways[0].rss()?.saturating_sub(baseline) as f64 / count as f64;
    let mut ready_with_them = None;
    if *backend == Backend::Sqlite {
        let dir = gateways.remove(0).stop().await?;
        let spawned = Instant::now();
        let gateway = GatewayProcess::spawn_in(binary, BOTH_ERAS, backend, dir).await?;
        gateway.ready().await?;
        ready_with_them = Some(spawned.elapsed());
        gateways.insert(0, gateway);
    }
    let counting = match (postgres, backend) {
        (Some(postgres), Backend::Postgres(url)) => Some((postgres, url)),
        _ => None,
    };
    let before = match counting {
        Some((postgres, url)) => Some(Counters::read(&postgres.cluster, url, postgres.statements).await?),
        None => None,
    };
    let rests: Vec<_> = gateways.iter().map(|gateway| gateway.rest.clone()).collect();
    let drain_rate = scale::drain(&rests, Arc::new(ids)).await?;
    scale::completed(&gateways[0].rest, &calls).await?;
    let per_answer = match (counting, before) {
        (Some((postgres, url)), Some(before)) => {
            let after = Counters::read(&postgres.cluster, url, postgres.statements).await?;
            Some(before.per_answer(&after, count))
        }
        _ => None,
    };
    Ok(Held {
        rss_per_request,
        drain_rate,
        ready_with_them,
        per_answer,
    })
}
