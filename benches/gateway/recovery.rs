//! A replica that dies holding many waiting calls, and the fleet that carries on: three replicas share one
//! PostgreSQL database; the first starts the calls (2025-11-25, whose Requests live on the replica's upstream
//! sessions, so that its death ends them) and is killed; the other two serve plain tool calls throughout, and
//! each call's time is kept, until one of them has ended what the dead replica left.

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
/// How long the plain calls run before the kill, and after the dead replica's Requests have ended.
const MARGIN: Duration = Duration::from_secs(2);

/// One plain call: the replica it went to (0 or 1), when it ended, and how long it took.
type Timed = (usize, Instant, Duration);

/// The recovery section.
pub async fn table(binary: &Path, plan: &Plan) -> anyhow::Result<String> {
    let cluster = Cluster::start_durable();
    let count = plan.store_pending;
    let era = Era::Legacy;
    let backend = Backend::Postgres(cluster.database());
    let mut gateways = Vec::new();
    for _ in 0..3 {
        let gateway = GatewayProcess::spawn_in(binary, era.config(), &backend, tempfile::tempdir()?).await?;
        gateway.ready().await?;
        gateways.push(gateway);
    }
    let mut dying = gateways.remove(0);
    eprintln!("recovery: {count} waiting calls on the replica that dies");
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
    dying.kill();
    until_none_pending(&living[0]).await?;
    let ended = killed.elapsed();
    tokio::time::sleep(MARGIN).await;
    stop.store(true, Ordering::Relaxed);
    while let Some(caller) = callers.join_next().await {
        caller??;
    }

    let timed = std::mem::take(&mut *timed.lock().unwrap());
    let before = samples(&timed, |_, at| at < killed);
    let mut after: Vec<Samples> = (0..2)
        .map(|replica| samples(&timed, |of, at| of == replica && at >= killed))
        .collect();
    after.sort_by_key(|samples| samples.quantile(1.0));
    let mut table = String::from(
        "\n### Recovery: a replica dies holding waiting calls\n\n\
         | measurement | value |\n|---|---|\n",
    );
    let _ = writeln!(
        table,
        "| from the kill until every Request it left had ended (s) | {:.1} |",
        ended.as_secs_f64()
    );
    let _ = writeln!(
        table,
        "| plain calls before the kill, both replicas: p50 / longest (ms) | {} / {} |",
        millis(before.p50()),
        millis(before.quantile(1.0))
    );
    for (which, samples) in ["held up least", "held up most"].into_iter().zip(&after) {
        let _ = writeln!(
            table,
            "| plain calls after the kill, the replica {which}: p50 / longest (ms) | {} / {} |",
            millis(samples.p50()),
            millis(samples.quantile(1.0))
        );
    }
    let _ = writeln!(
        table,
        "\nThree replicas on one durable PostgreSQL 15 server; the first starts {count} `confirm_action` calls \
         ({}) until their Requests are pending, and is killed (`SIGKILL`). {CALLERS} callers make plain calls \
         (`echo`) on the other two, half on each, from {} s before the kill until {} s after the dead replica's \
         Requests have all ended: its heartbeat stops, one of the others takes it for gone once the lease has run \
         out (15 s) and ends what it left.",
        era.protocol(),
        MARGIN.as_secs(),
        MARGIN.as_secs()
    );
    drop(gateways);
    Ok(table)
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
