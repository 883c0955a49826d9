//! What dies mid-work holds the fleet that carries on up for how long: three replicas share one PostgreSQL
//! database; the first starts many waiting calls (2025-11-25, whose Requests live on the replica's upstream
//! sessions, so that the death of either ends them), then it is killed, or the upstream server it runs is; the
//! other two serve plain tool calls throughout, and each call's time is kept until every Request has ended.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::ensure;

use crate::cluster::Cluster;
use crate::process::{Backend, GatewayProcess};
use crate::rest::Rest;
use crate::stats::{Samples, millis};
use crate::{Era, Plan, waiting};

/// Plain callers at once, spread over the two replicas that live on.
const CALLERS: usize = 16;
/// How long the plain calls run before the kill, and after the Requests have ended.
const MARGIN: Duration = Duration::from_secs(2);

/// One plain call: the replica it went to (0 or 1), when it ended, and how long it took.
type Timed = (usize, Instant, Duration);

/// What is killed.
#[derive(Debug, Clone, Copy)]
enum Dies {
    /// The first replica: another ends what it left once its lease has run out.
    Replica,
    /// The upstream server the first replica runs: the replica ends the Requests raised on its session.
    Upstream,
}

/// What one death held up.
struct HeldUp {
    /// From the kill until no Request was pending.
    ended: Duration,
    /// Plain calls that ended in that time.
    meanwhile: usize,
    before: Samples,
    /// After the kill, on the replica held up least, then most.
    after: Vec<Samples>,
}

/// The recovery section.
pub async fn table(binary: &Path, plan: &Plan) -> anyhow::Result<String> {
    let cluster = Cluster::start_durable();
    let count = plan.store_pending;
    let mut table = String::from(
        "\n### Recovery: a replica, or its upstream, dies holding waiting calls\n\n\
         | what dies | from the kill until every Request it held had ended (s) | plain calls/s meanwhile | \
         plain calls before: p50 / longest (ms) | after, the replica held up least: p50 / longest (ms) | \
         after, held up most |\n|---|---|---|---|---|---|\n",
    );
    for (dies, what) in [
        (Dies::Replica, "the replica (`SIGKILL`)"),
        (Dies::Upstream, "its upstream server (`SIGKILL`)"),
    ] {
        eprintln!("recovery: {count} waiting calls, then {dies:?} dies");
        let held = held_up(binary, &cluster, count, dies).await?;
        let _ = writeln!(
            table,
            "| {what} | {:.1} | {:.0} | {} / {} | {} / {} | {} / {} |",
            held.ended.as_secs_f64(),
            held.meanwhile as f64 / held.ended.as_secs_f64(),
            millis(held.before.p50()),
            millis(held.before.quantile(1.0)),
            millis(held.after[0].p50()),
            millis(held.after[0].quantile(1.0)),
            millis(held.after[1].p50()),
            millis(held.after[1].quantile(1.0)),
        );
    }
    let _ = writeln!(
        table,
        "\nThree replicas on one durable PostgreSQL 15 server, a fresh database for each row; the first starts \
         {count} `confirm_action` calls ({}) until their Requests are pending, then it, or the demo server it runs, \
         is killed. {CALLERS} callers make plain calls (`echo`) on the other two, half on each, from {} s before \
         the kill until {} s after every Request has ended. A dead replica's heartbeat stops, and one of the \
         others takes it for gone once the lease has run out (15 s); a dead upstream ends its session at once.",
        Era::Legacy.protocol(),
        MARGIN.as_secs(),
        MARGIN.as_secs()
    );
    Ok(table)
}

/// Starts `count` waiting calls on the first of three fresh replicas, kills what `dies` says, and times plain
/// calls on the other two until no Request is pending.
async fn held_up(binary: &Path, cluster: &Cluster, count: usize, dies: Dies) -> anyhow::Result<HeldUp> {
    let era = Era::Legacy;
    let backend = Backend::Postgres(cluster.database());
    let mut gateways = Vec::new();
    for _ in 0..3 {
        let gateway = GatewayProcess::spawn_in(binary, era.config(), &backend, tempfile::tempdir()?).await?;
        gateway.ready().await?;
        gateways.push(gateway);
    }
    let mut dying = gateways.remove(0);
    waiting::start_calls(&dying.rest, era, count).await?;
    waiting::pending(&dying.rest, era, count).await?;
    let living: Vec<Rest> = gateways.iter().map(|gateway| gateway.rest.clone()).collect();
    let timed = Arc::new(Mutex::new(Vec::<Timed>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut callers = tokio::task::JoinSet::new();
    for nth in 0..CALLERS {
        let (rest, timed, stop) = (living[nth % 2].clone(), timed.clone(), stop.clone());
        callers.spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let started = Instant::now();
                rest.echo(era.server()).await?;
                let ended = Instant::now();
                timed.lock().unwrap().push((nth % 2, ended, ended - started));
            }
            anyhow::Ok(())
        });
    }
    tokio::time::sleep(MARGIN).await;
    let killed = Instant::now();
    match dies {
        Dies::Replica => dying.kill(),
        Dies::Upstream => dying.kill_upstreams()?,
    }
    until_none_pending(&living[0]).await?;
    let ended = killed.elapsed();
    tokio::time::sleep(MARGIN).await;
    stop.store(true, Ordering::Relaxed);
    while let Some(caller) = callers.join_next().await {
        caller??;
    }

    let timed = std::mem::take(&mut *timed.lock().unwrap());
    let meanwhile = timed
        .iter()
        .filter(|(_, at, _)| *at >= killed && *at <= killed + ended)
        .count();
    let before = samples(&timed, |_, at| at < killed);
    let mut after: Vec<Samples> = (0..2)
        .map(|replica| samples(&timed, |of, at| of == replica && at >= killed))
        .collect();
    after.sort_by_key(|samples| samples.quantile(1.0));
    drop(dying);
    drop(gateways);
    Ok(HeldUp {
        ended,
        meanwhile,
        before,
        after,
    })
}

/// The durations of the calls `timed` that `keep` (given the replica and the end) keeps.
fn samples(timed: &[Timed], keep: impl Fn(usize, Instant) -> bool) -> Samples {
    let mut samples = Samples::default();
    for &(replica, at, took) in timed {
        if keep(replica, at) {
            samples.push(took);
        }
    }
    samples
}

/// Polls `GET /metrics` until no Request is pending.
async fn until_none_pending(rest: &Rest) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let metrics = rest.text("/metrics").await?;
        let pending = metrics
            .lines()
            .find_map(|line| line.strip_prefix("toolnexus_requests_pending ")?.parse::<f64>().ok());
        if pending == Some(0.0) {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "{pending:?} Requests still pending after 600 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
