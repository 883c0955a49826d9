//! How a fleet scales: one replica against three sharing one PostgreSQL database, in the shape users make
//! (many calls, each waiting on its one Request; many callers, each its own call). Each mode runs both
//! fleets in one run: the gateways unconstrained, then each gateway (with the upstream servers it starts) in
//! a CPU cgroup of its own with a fixed quota, the database and the clients unconstrained, which is what
//! each gateway would have on a small machine of its own.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use crate::cluster::Cluster;
use crate::database::{self, Statement};
use crate::process::{Backend, GatewayProcess};
use crate::quota::CpuGroup;
use crate::rest::Rest;
use crate::{Era, Plan, rate, scale, verdict, waiting};

/// The replicas of the fleet measured against one gateway.
const FLEET: usize = 3;
/// Echo callers at once.
const CALLERS: usize = 64;
/// The quota each gateway gets unless `BENCH_CPU_QUOTA` says otherwise (`0` runs only unconstrained).
const DEFAULT_QUOTA: f64 = 0.3;
/// Three replicas should do this many times what one does, each under the quota.
const SCALE_TARGET: f64 = 2.5;
/// The statements shown of where the database's time goes while draining, the costliest first.
const STATEMENTS_SHOWN: usize = 12;
/// How much of a statement's text names it there.
const LABEL_CHARS: usize = 72;

/// What one fleet measured.
struct Measured {
    raise: f64,
    drain: f64,
    echo: f64,
    /// The database's statements per drained answer; empty where `pg_stat_statements` is not loaded.
    statements: Vec<Statement>,
}

/// The fleet section.
pub async fn table(binary: &Path, plan: &Plan) -> anyhow::Result<String> {
    let quota = match std::env::var("BENCH_CPU_QUOTA") {
        Ok(value) => value.parse::<f64>()?,
        Err(_) => DEFAULT_QUOTA,
    };
    let cluster = Cluster::start_durable();
    let count = plan.store_pending;
    let era = Era::Modern;
    let mut table = format!(
        "\n### Fleet: one replica vs {FLEET} on one PostgreSQL database\n\n\
         | measurement | CPU per gateway | one replica | {FLEET} replicas | {FLEET} / one | target |\n\
         |---|---|---|---|---|---|\n"
    );
    let mut work = String::new();
    let mut modes = vec![None];
    let mut skipped = None;
    if quota > 0.0 {
        match CpuGroup::create(&format!("toolnexus-bench-{}-probe", std::process::id())) {
            Ok(_) => modes.push(Some(quota)),
            Err(error) => skipped = Some(format!("{error:#}")),
        }
    }
    for cores in modes {
        let one = measure(binary, &cluster, era, 1, cores, count, plan).await?;
        let fleet = measure(binary, &cluster, era, FLEET, cores, count, plan).await?;
        let (cpu, target, rule): (String, f64, String) = match cores {
            None => ("unlimited".to_owned(), 1.0, "never slower than one".to_owned()),
            Some(cores) => (format!("{cores} core"), SCALE_TARGET, format!("≥ {SCALE_TARGET}× one")),
        };
        work.push_str(&statements_table(&cpu, &one.statements, &fleet.statements));
        for (what, one, fleet) in [
            (
                format!(
                    "calls raised/s starting {count} waiting calls (c={} per replica)",
                    waiting::CONCURRENCY
                ),
                one.raise,
                fleet.raise,
            ),
            (
                format!(
                    "answers/s draining {count} pending, one per call (c={})",
                    scale::DRAIN_CONCURRENCY
                ),
                one.drain,
                fleet.drain,
            ),
            (format!("plain tool calls/s (echo, c={CALLERS})"), one.echo, fleet.echo),
        ] {
            let ratio = fleet / one;
            let _ = writeln!(
                table,
                "| {what} | {cpu} | {one:.0} | {fleet:.0} | {ratio:.2} | {rule}: {} |",
                verdict(ratio >= target)
            );
        }
    }
    let _ = writeln!(
        table,
        "\nEach fleet has a fresh database on one durable PostgreSQL 15 server (`fsync`, `synchronous_commit` and \
         `full_page_writes` on) on the same machine. The {count} calls (`confirm_action`, {era}) are started \
         spread over the replicas, each replica's share {} at a time, until all their Requests are pending (the \
         raising row); the answerers, and then the echo callers for {} s, take the replicas in turn. A quota is \
         cgroup CPU time per gateway and the demo server it starts (`BENCH_CPU_QUOTA`, default {DEFAULT_QUOTA}; \
         cgroup v1 `cpu.cfs_quota_us` of a 100 ms period, or v2 `cpu.max`); the database and the bench are not \
         limited.{}",
        waiting::CONCURRENCY,
        plan.window.as_secs_f64(),
        skipped.map_or(String::new(), |why| format!(" The quota runs were skipped: {why}.")),
        era = era.protocol(),
    );
    table.push_str(&work);
    Ok(table)
}

/// Measures `replicas` fresh gateways on a fresh database, each under `cores` of CPU when given.
async fn measure(
    binary: &Path,
    cluster: &Cluster,
    era: Era,
    replicas: usize,
    cores: Option<f64>,
    count: usize,
    plan: &Plan,
) -> anyhow::Result<Measured> {
    let cpu = cores.map_or_else(|| "unlimited".to_owned(), |cores| format!("{cores} core"));
    eprintln!("fleet: {replicas} × postgres, {cpu}");
    let url = cluster.database();
    let backend = Backend::Postgres(url.clone());
    let mut groups = Vec::new();
    let mut gateways = Vec::with_capacity(replicas);
    for nth in 0..replicas {
        let wrap = match cores {
            Some(_) => {
                let group = CpuGroup::create(&format!("toolnexus-bench-{}-{nth}", std::process::id()))?;
                let wrap = group.wrap();
                groups.push(group);
                wrap
            }
            None => Vec::new(),
        };
        let gateway =
            GatewayProcess::spawn_wrapped(binary, era.config(), &backend, tempfile::tempdir()?, &wrap).await?;
        gateway.ready().await?;
        gateways.push(gateway);
    }
    let rests: Vec<Rest> = gateways.iter().map(|gateway| gateway.rest.clone()).collect();
    for group in &groups {
        group.limit(cores)?;
    }
    let since = Instant::now();
    let mut starting = tokio::task::JoinSet::new();
    for (nth, rest) in rests.iter().enumerate() {
        let share = count / replicas + usize::from(nth < count % replicas);
        let rest = rest.clone();
        starting.spawn(async move { waiting::start_calls(&rest, era, share).await });
    }
    while let Some(started) = starting.join_next().await {
        started??;
    }
    waiting::pending(&rests[0], era, count).await?;
    let raise = count as f64 / since.elapsed().as_secs_f64();
    let ids = waiting::pending_ids(&rests[0], count).await?;
    let counted = database::reset_statements(cluster, &url);
    let drain = scale::drain(&rests, Arc::new(ids)).await?;
    let statements = if counted {
        database::statements(cluster, &url, count).await?
    } else {
        Vec::new()
    };
    waiting::completed_on(&rests, era, count).await?;
    let next = Arc::new(AtomicUsize::new(0));
    let echo = rate(CALLERS, plan.window, move || {
        let rest = rests[next.fetch_add(1, Ordering::Relaxed) % rests.len()].clone();
        async move { rest.echo(era.server()).await }
    })
    .await?;
    for group in &groups {
        group.limit(None)?;
    }
    drop(gateways);
    Ok(Measured {
        raise,
        drain,
        echo,
        statements,
    })
}

/// Where the database's time went while one replica and the fleet drained, statement by statement; nothing
/// where the statements were not counted.
fn statements_table(cpu: &str, one: &[Statement], fleet: &[Statement]) -> String {
    if one.is_empty() || fleet.is_empty() {
        return String::new();
    }
    let mut table = format!(
        "\n#### The database's work per drained answer ({cpu})\n\n\
         | statement (`pg_stat_statements`, the costliest {STATEMENTS_SHOWN} with {FLEET} replicas) | runs, one | µs, one | \
         runs, {FLEET} | µs, {FLEET} |\n|---|---|---|---|---|\n"
    );
    let find = |text: &str| one.iter().find(|statement| statement.text == text);
    for statement in fleet.iter().take(STATEMENTS_SHOWN) {
        let (runs, micros) = find(&statement.text).map_or((0.0, 0.0), |one| (one.runs, one.micros));
        let mut label: String = statement.text.chars().take(LABEL_CHARS).collect();
        if label.len() < statement.text.len() {
            label.push('…');
        }
        let _ = writeln!(
            table,
            "| `{}` | {runs:.3} | {micros:.1} | {:.3} | {:.1} |",
            label.replace('|', "\\|"),
            statement.runs,
            statement.micros
        );
    }
    let total = |statements: &[Statement]| {
        statements.iter().fold((0.0, 0.0), |(runs, micros), statement| {
            (runs + statement.runs, micros + statement.micros)
        })
    };
    let ((one_runs, one_micros), (fleet_runs, fleet_micros)) = (total(one), total(fleet));
    let _ = writeln!(
        table,
        "| every statement | {one_runs:.2} | {one_micros:.1} | {fleet_runs:.2} | {fleet_micros:.1} |\n\n\
         µs are execution time, which counts time a backend waited for a lock or for a CPU."
    );
    table
}
