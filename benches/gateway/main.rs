//! The benchmark harness: the gateway (the real binary, driven over REST on loopback) measured side by side
//! with a direct in-process MCP client of the same demo server.
//!
//! `cargo bench --bench gateway` builds in release mode and prints a markdown table; names after `--` (`latency`,
//! `throughput`, `scale`, `footprint`, `front_door`, `store`, `waiting`, `long_polls`, `fleet`, `recovery`) run only those sections.
//! Every section but `store`, `fleet` and `recovery` runs the gateway with its state in memory; `store` compares that
//! with a SQLite file and with a PostgreSQL database (a throwaway durable server, started for the section), one replica
//! and three, and `fleet` measures one replica against three, unconstrained and with a CPU quota per gateway
//! (`BENCH_CPU_QUOTA=0.3`, the default; `0` skips it), and `recovery` how long a replica, or its upstream, that dies
//! holding `BENCH_PENDING` waiting calls holds the other two up. Under `cargo test` it runs every code path once with
//! tiny counts and checks only that everything completed correctly.
//!
//! `BENCH_ITERATIONS=N` overrides the round trips per latency cell, `BENCH_PENDING=N` the Requests the store, fleet and
//! recovery sections hold (100 000), `BENCH_SCALE=N` runs only the scale (and waiting) rows of N,
//! `BENCH_WRAP="valgrind --tool=callgrind"` runs the gateway under a profiler (`heaptrack` too), `BENCH_GATEWAY=path`
//! runs another build of it, and `BENCH_LOG=1` shows the gateway's stderr.

#[allow(dead_code, reason = "the bench uses only part of the tests' PostgreSQL harness")]
#[path = "../../src/test_postgres.rs"]
mod cluster;
mod database;
mod direct;
mod fleet;
mod front_door;
mod long_polls;
mod process;
mod quota;
mod recovery;
#[allow(dead_code, reason = "the benchmark counts round trips; it never cuts the relay")]
#[path = "../../tests/shared/relay.rs"]
mod relay;
mod rest;
mod scale;
mod stats;
mod store;
mod waiting;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use direct::Direct;
use process::{BOTH_ERAS, GatewayProcess, MODERN_ONLY};
use rest::{EventStream, Rest};
use stats::{Samples, millis, overhead, p50_p99};

/// A protocol era of the upstream session, on both paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Era {
    /// 2026-07-28 (`server/discover`, `input_required` results): the gateway's default with the demo server.
    Modern,
    /// 2025-11-25 (`initialize`, `elicitation/create` requests).
    Legacy,
}

impl Era {
    /// The gateway's server name for the demo server in this era.
    pub fn server(self) -> &'static str {
        match self {
            Era::Modern => "modern",
            Era::Legacy => "legacy",
        }
    }

    /// The protocol version, for the report.
    pub fn protocol(self) -> &'static str {
        match self {
            Era::Modern => "2026-07-28",
            Era::Legacy => "2025-11-25",
        }
    }

    /// A gateway config with only this era's demo server.
    pub fn config(self) -> &'static str {
        match self {
            Era::Modern => MODERN_ONLY,
            Era::Legacy => process::LEGACY_ONLY,
        }
    }
}

/// How much to measure.
#[derive(Debug)]
pub struct Plan {
    /// Unmeasured round trips before the measured ones.
    pub warmup: usize,
    /// Measured round trips per path, alternating direct and gateway.
    pub iterations: usize,
    /// How long each throughput point runs.
    pub window: Duration,
    pub concurrencies: &'static [usize],
    /// Pending-Request counts, each on a fresh gateway.
    pub scale: &'static [(Era, usize)],
    /// Samples per latency column of the scale test.
    pub scale_samples: usize,
    /// Gateway starts measured for the footprint.
    pub footprint_runs: usize,
    /// Requests held pending in the store comparison.
    pub store_pending: usize,
    /// Waiting-call counts, each on a fresh gateway per era and store.
    pub waiting: &'static [usize],
    /// Calls made and answered on each of those gateways before its baseline RSS: enough to fill the event
    /// replay buffer (`REPLAY_CAPACITY` events), which every gateway that has served a while holds.
    pub waiting_warmup: usize,
    /// Idle long-polls held while plain calls run, each on a fresh gateway.
    pub long_polls: &'static [usize],
}

const FULL: Plan = Plan {
    warmup: 200,
    iterations: 2000,
    window: Duration::from_secs(3),
    concurrencies: &[1, 16, 64],
    scale: &[
        (Era::Modern, 1_000),
        (Era::Modern, 10_000),
        (Era::Modern, 100_000),
        (Era::Legacy, 1_000),
        (Era::Legacy, 10_000),
        (Era::Legacy, 100_000),
    ],
    scale_samples: 500,
    footprint_runs: 7,
    store_pending: 100_000,
    waiting: &[1_000, 10_000, 100_000],
    waiting_warmup: 1_024,
    long_polls: &[0, 1_000, 5_000],
};

const SMOKE: Plan = Plan {
    warmup: 1,
    iterations: 3,
    window: Duration::from_millis(100),
    concurrencies: &[1, 16],
    scale: &[(Era::Modern, 20), (Era::Legacy, 20)],
    scale_samples: 3,
    footprint_runs: 1,
    store_pending: 20,
    waiting: &[20],
    waiting_warmup: 8,
    long_polls: &[0, 20],
};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let measuring = args.iter().any(|arg| arg == "--bench");
    let mut plan = if measuring { FULL } else { SMOKE };
    if let Some(iterations) = std::env::var("BENCH_ITERATIONS").ok().and_then(|n| n.parse().ok()) {
        plan.iterations = iterations;
        plan.warmup = plan.warmup.min(iterations);
    }
    if let Some(pending) = std::env::var("BENCH_PENDING").ok().and_then(|n| n.parse().ok()) {
        plan.store_pending = pending;
    }
    let plan = &plan;
    let sections: Vec<&str> = args
        .iter()
        .map(String::as_str)
        .filter(|arg| !arg.starts_with('-'))
        .collect();
    let wanted = |section: &str| sections.is_empty() || sections.contains(&section);
    // `BENCH_GATEWAY=path` measures another build of the gateway (an older commit's, for a before/after in one run).
    let binary = std::env::var_os("BENCH_GATEWAY")
        .map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_toolnexus-gateway")), PathBuf::from);
    let runtime = tokio::runtime::Runtime::new()?;
    if !measuring {
        println!("\n(smoke run: tiny counts to check the harness; these timings are not measurements)");
    }
    runtime.block_on(async {
        if wanted("latency") {
            show(latency(&binary, plan).await?);
        }
        if wanted("throughput") {
            show(throughput(&binary, plan).await?);
        }
        if wanted("scale") {
            show(scale_table(&binary, plan).await?);
        }
        if wanted("footprint") {
            show(footprint(&binary, plan).await?);
        }
        if wanted("front_door") {
            show(front_door::table(&binary, plan).await?);
        }
        if wanted("store") {
            show(store::table(&binary, plan).await?);
        }
        if wanted("waiting") {
            show(waiting::table(&binary, plan).await?);
        }
        if wanted("long_polls") {
            show(long_polls::table(&binary, plan).await?);
        }
        if wanted("fleet") {
            show(fleet::table(&binary, plan).await?);
        }
        if wanted("recovery") {
            show(recovery::table(&binary, plan).await?);
        }
        anyhow::Ok(())
    })?;
    Ok(())
}

/// Section 1: elicitation round trip, plain tool call and elicitation discovery, direct vs gateway, alternating.
///
/// Discovery runs `confirm_action` with `stamp`: the demo server ends the prompt with its wall-clock send time, and
/// the time is taken when the elicitation reaches the direct client's handler, or when the `request.created` event's
/// bytes reach a client subscribed to `GET /events` (same machine, same clock).
async fn latency(binary: &Path, plan: &Plan) -> anyhow::Result<String> {
    let gateway = GatewayProcess::spawn(binary, BOTH_ERAS).await?;
    gateway.ready().await?;
    let rest = &gateway.rest;
    let mut table = String::from(
        "\n### Latency: direct rmcp client vs gateway over REST (µs)\n\n\
         | operation | protocol | direct p50 / p99 | gateway p50 / p99 | added p50 | ratio p50 | target |\n\
         |---|---|---|---|---|---|---|\n",
    );
    let mut floor = Samples::default();
    for era in [Era::Modern, Era::Legacy] {
        eprintln!("latency: {}", era.protocol());
        let direct = Direct::connect(binary, era).await?;
        let (mut direct_confirm, mut gateway_confirm) = (Samples::default(), Samples::default());
        let mut gateway_confirm_in_two = Samples::default();
        let (mut direct_echo, mut gateway_echo) = (Samples::default(), Samples::default());
        for round in 0..plan.warmup + plan.iterations {
            let measured = round >= plan.warmup;
            record(measured, &mut direct_confirm, direct.confirm()).await?;
            record(measured, &mut gateway_confirm, rest.confirm(era.server())).await?;
            record(measured, &mut gateway_confirm_in_two, rest.confirm_in_two(era.server())).await?;
            record(measured, &mut direct_echo, direct.echo()).await?;
            record(measured, &mut gateway_echo, rest.echo(era.server())).await?;
            record(measured, &mut floor, rest.healthz()).await?;
        }
        let mut events = EventStream::open(rest, &format!("?server={}", era.server())).await?;
        let (mut direct_discovery, mut gateway_discovery) = (Samples::default(), Samples::default());
        for round in 0..plan.warmup + plan.iterations {
            let (direct_took, gateway_took) = (
                direct.discover().await?,
                rest.discover(era.server(), &mut events).await?,
            );
            if round >= plan.warmup {
                direct_discovery.push(direct_took);
                gateway_discovery.push(gateway_took);
            }
        }
        drop(events);
        direct.close().await;
        let (added, ratio) = overhead(&direct_confirm, &gateway_confirm);
        let met = verdict(
            gateway_confirm.p50().saturating_sub(direct_confirm.p50()) <= Duration::from_micros(200)
                && gateway_confirm.p50().as_secs_f64() <= 2.0 * direct_confirm.p50().as_secs_f64(),
        );
        let _ = writeln!(
            table,
            "| elicitation round trip | {} | {} | {} | {added} | {ratio} | ≤ +200, ≤ 2.0: {met} |",
            era.protocol(),
            p50_p99(&direct_confirm),
            p50_p99(&gateway_confirm),
        );
        let (added, ratio) = overhead(&direct_confirm, &gateway_confirm_in_two);
        let limit = match era {
            Era::Modern => 1.5,
            Era::Legacy => 1.8,
        };
        let met = verdict(gateway_confirm_in_two.p50().as_secs_f64() <= limit * direct_confirm.p50().as_secs_f64());
        let _ = writeln!(
            table,
            "| elicitation round trip in two exchanges (`answer?wait`) | {} | {} | {} | {added} | {ratio} | ≤ {limit}: {met} |",
            era.protocol(),
            p50_p99(&direct_confirm),
            p50_p99(&gateway_confirm_in_two),
        );
        let (added, ratio) = overhead(&direct_echo, &gateway_echo);
        let met = verdict(gateway_echo.p50().saturating_sub(direct_echo.p50()) <= Duration::from_micros(150));
        let _ = writeln!(
            table,
            "| echo tool call | {} | {} | {} | {added} | {ratio} | ≤ +150: {met} |",
            era.protocol(),
            p50_p99(&direct_echo),
            p50_p99(&gateway_echo),
        );
        let (added, ratio) = overhead(&direct_discovery, &gateway_discovery);
        let met = verdict(gateway_discovery.p50() <= Duration::from_micros(100));
        let _ = writeln!(
            table,
            "| discovery: upstream sends → client has it (gateway: `request.created` on `/events`) | {} | {} | {} | {added} | {ratio} | ≤ 100 p50: {met} |",
            era.protocol(),
            p50_p99(&direct_discovery),
            p50_p99(&gateway_discovery),
        );
    }
    let _ = writeln!(
        table,
        "| floor: one HTTP exchange that does no work (`GET /healthz`) | both | | {} | | | a round trip is three exchanges, echo one |",
        p50_p99(&floor),
    );
    let _ = writeln!(
        table,
        "\n{} measured round trips per cell after {} warm-up ones; direct and gateway alternate.",
        plan.iterations, plan.warmup
    );
    Ok(table)
}

pub async fn record(
    measured: bool,
    samples: &mut Samples,
    operation: impl Future<Output = anyhow::Result<()>>,
) -> anyhow::Result<()> {
    let started = Instant::now();
    operation.await?;
    if measured {
        samples.push(started.elapsed());
    }
    Ok(())
}

/// Section 2: echo calls per second at each concurrency, direct vs gateway (default era).
async fn throughput(binary: &Path, plan: &Plan) -> anyhow::Result<String> {
    let gateway = GatewayProcess::spawn(binary, MODERN_ONLY).await?;
    gateway.ready().await?;
    let direct = Arc::new(Direct::connect(binary, Era::Modern).await?);
    let mut table = String::from(
        "\n### Echo throughput, 2026-07-28 (calls per second)\n\n\
         | concurrency | direct | gateway | gateway / direct |\n|---|---|---|---|\n",
    );
    for &concurrency in plan.concurrencies {
        eprintln!("throughput: concurrency {concurrency}");
        let direct_rate = direct.echo_rate(concurrency, plan.window).await?;
        let gateway_rate = {
            let rest: Rest = gateway.rest.clone();
            rate(concurrency, plan.window, move || {
                let rest = rest.clone();
                async move { rest.echo(Era::Modern.server()).await }
            })
            .await?
        };
        let _ = writeln!(
            table,
            "| {concurrency} | {direct_rate:.0} | {gateway_rate:.0} | {:.2} |",
            gateway_rate / direct_rate
        );
    }
    if let Ok(direct) = Arc::try_unwrap(direct) {
        direct.close().await;
    }
    Ok(table)
}

/// Runs `operation` from `concurrency` workers for `window`; returns completions per second.
pub async fn rate<F, Fut>(concurrency: usize, window: Duration, operation: F) -> anyhow::Result<f64>
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: Future<Output = anyhow::Result<()>> + Send,
{
    let started = Instant::now();
    let deadline = started + window;
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let operation = operation.clone();
        workers.spawn(async move {
            let mut done = 0u64;
            while Instant::now() < deadline {
                operation().await?;
                done += 1;
            }
            anyhow::Ok(done)
        });
    }
    let mut total = 0;
    while let Some(joined) = workers.join_next().await {
        total += joined??;
    }
    Ok(total as f64 / started.elapsed().as_secs_f64())
}

/// Section 3: N pending Requests on one gateway.
async fn scale_table(binary: &Path, plan: &Plan) -> anyhow::Result<String> {
    let mut table = String::from(
        "\n### Pending Requests at scale (µs unless stated)\n\n\
         | protocol | pending N | raised in (s) | RSS per Request (B) | GET /requests?limit=100 p50 / p99 | GET /requests/{id} p50 / p99 | answer p50 / p99 | answers/s draining (c=64) |\n\
         |---|---|---|---|---|---|---|---|\n",
    );
    let only: Option<usize> = std::env::var("BENCH_SCALE").ok().and_then(|n| n.parse().ok());
    for &(era, count) in plan
        .scale
        .iter()
        .filter(|(_, count)| only.is_none_or(|only| only == *count))
    {
        eprintln!("scale: {} N={count}", era.protocol());
        let run = scale::run(binary, era, count, plan).await?;
        let _ = writeln!(
            table,
            "| {} | {} | {:.2} | {:.0} | {} | {} | {} | {:.0} |",
            run.era.protocol(),
            run.pending,
            run.raise_time.as_secs_f64(),
            run.rss_per_request,
            p50_p99(&run.list),
            p50_p99(&run.get),
            p50_p99(&run.answer),
            run.drain_rate,
        );
    }
    let _ = writeln!(
        table,
        "\n{} samples per latency column; the first answers are timed one at a time, the rest drained by {} workers.",
        plan.scale_samples,
        scale::DRAIN_CONCURRENCY
    );
    Ok(table)
}

/// Section 4: idle RSS and start-up time.
async fn footprint(binary: &Path, plan: &Plan) -> anyhow::Result<String> {
    let (mut listening, mut ready, mut bare_ready, mut handshake) = (
        Samples::default(),
        Samples::default(),
        Samples::default(),
        Samples::default(),
    );
    let mut idle_rss = Vec::new();
    for _ in 0..plan.footprint_runs {
        eprintln!("footprint");
        let gateway = GatewayProcess::spawn(binary, MODERN_ONLY).await?;
        listening.push(gateway.listening_after);
        ready.push(gateway.ready().await?);
        tokio::time::sleep(Duration::from_millis(500)).await;
        idle_rss.push(gateway.rss()?);
        drop(gateway);
        let bare = GatewayProcess::spawn(binary, "").await?;
        bare_ready.push(bare.ready().await?);
        drop(bare);
        let started = Instant::now();
        let direct = Direct::connect(binary, Era::Modern).await?;
        handshake.push(started.elapsed());
        direct.close().await;
    }
    idle_rss.sort_unstable();
    let idle = idle_rss[idle_rss.len() / 2] as f64 / (1024.0 * 1024.0);
    let upstream_excluded = ready.p50().saturating_sub(handshake.p50());
    let mut table = String::from("\n### Footprint (medians)\n\n| measurement | value | target |\n|---|---|---|\n");
    let _ = writeln!(
        table,
        "| idle RSS, demo server attached | {idle:.1} MiB | ≤ 15 MiB: {} |",
        verdict(idle <= 15.0)
    );
    let _ = writeln!(table, "| start → `listening on` | {} ms | |", millis(listening.p50()));
    let _ = writeln!(
        table,
        "| start → `/readyz` 200, demo attached | {} ms | |",
        millis(ready.p50())
    );
    let _ = writeln!(
        table,
        "| demo server start + handshake (direct client) | {} ms | |",
        millis(handshake.p50())
    );
    let _ = writeln!(
        table,
        "| ready, excluding the upstream's start-up (difference of the two above) | {} ms | ≤ 100 ms: {} |",
        millis(upstream_excluded),
        verdict(upstream_excluded <= Duration::from_millis(100))
    );
    let _ = writeln!(
        table,
        "| start → `/readyz` 200, no servers | {} ms | ≤ 100 ms: {} |",
        millis(bare_ready.p50()),
        verdict(bare_ready.p50() <= Duration::from_millis(100))
    );
    let _ = writeln!(table, "\n{} starts; p50 of each.", plan.footprint_runs);
    Ok(table)
}

/// Prints a finished section at once, so a later failure does not lose it.
fn show(section: String) {
    print!("{section}");
    let _ = std::io::Write::flush(&mut std::io::stdout());
}

pub fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "**missed**" }
}
