//! Many calls each waiting on its one Request, the shape thousands of agents make: memory per waiting call,
//! read and answer latencies, on the memory and the SQLite store.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use serde_json::json;

use crate::process::{Backend, GatewayProcess};
use crate::rest::{Rest, check_confirmed};
use crate::scale::{Latencies, latencies};
use crate::stats::{Samples, p50_p99};
use crate::{Era, Plan, verdict};

/// How many `POST /calls` (and answers) are in flight at once while starting (and finishing) the calls.
pub const CONCURRENCY: usize = 64;
/// The most the latency columns may grow from the smallest N to the largest.
const FLAT: f64 = 1.5;

/// What one run of waiting calls measured.
struct WaitingRun {
    /// Gateway RSS growth divided by the waiting calls.
    rss_per_call: f64,
    /// From the first `POST /calls` to every Request pending.
    raise_time: Duration,
    list: Samples,
    get: Samples,
    answer: Samples,
}

/// The waiting section: for each era and store, `plan.waiting` calls of `confirm_action` held waiting.
pub async fn table(binary: &Path, plan: &Plan) -> anyhow::Result<String> {
    let mut table = String::from(
        "\n### Waiting calls: N calls, each waiting on its one Request (µs unless stated)\n\n\
         | protocol | store | waiting N | raised in (s) | RSS per waiting call (B) | GET /requests?limit=100 p50 / p99 | \
         GET /requests/{id} p50 / p99 | answer p50 / p99 | target |\n\
         |---|---|---|---|---|---|---|---|---|\n",
    );
    let only: Option<usize> = std::env::var("BENCH_SCALE").ok().and_then(|n| n.parse().ok());
    let counts: Vec<usize> = plan
        .waiting
        .iter()
        .copied()
        .filter(|count| only.is_none_or(|only| only == *count))
        .collect();
    // `BENCH_STORE=memory` (or `sqlite`) runs only that store's rows.
    let store = std::env::var("BENCH_STORE").ok();
    for era in [Era::Modern, Era::Legacy] {
        for backend in [Backend::Memory, Backend::Sqlite] {
            if store.as_deref().is_some_and(|store| store != backend.name()) {
                continue;
            }
            let mut first: Option<WaitingRun> = None;
            for &count in &counts {
                eprintln!("waiting: {} {} N={count}", era.protocol(), backend.name());
                let run = run(binary, era, &backend, count, plan).await?;
                let budget = match era {
                    Era::Modern => 3072.0,
                    Era::Legacy => 6144.0,
                };
                let flat = first.as_ref().is_none_or(|first| {
                    [
                        (&first.list, &run.list),
                        (&first.get, &run.get),
                        (&first.answer, &run.answer),
                    ]
                    .iter()
                    .all(|(before, now)| now.p50().as_secs_f64() <= FLAT * before.p50().as_secs_f64())
                });
                let _ = writeln!(
                    table,
                    "| {} | {} | {count} | {:.2} | {:.0} | {} | {} | {} | ≤ {:.0} KiB: {}{} |",
                    era.protocol(),
                    backend.name(),
                    run.raise_time.as_secs_f64(),
                    run.rss_per_call,
                    p50_p99(&run.list),
                    p50_p99(&run.get),
                    p50_p99(&run.answer),
                    budget / 1024.0,
                    verdict(run.rss_per_call <= budget),
                    if first.is_some() {
                        format!("; p50s ≤ {FLAT}× the first row's: {}", verdict(flat))
                    } else {
                        String::new()
                    },
                );
                first.get_or_insert(run);
            }
        }
    }
    let _ = writeln!(
        table,
        "\n{} samples per latency column. Each call is a `confirm_action` started by `POST /calls?wait=0` on the \
         shared session ({CONCURRENCY} at once); RSS per waiting call = (VmRSS with all N waiting − VmRSS after \
         {} calls made and answered, which fill the event replay buffer) / N. The answers after the timed ones are given by {CONCURRENCY} workers and every call is \
         checked to complete.",
        plan.scale_samples, plan.waiting_warmup
    );
    Ok(table)
}

/// Holds `count` calls waiting on one Request each on a fresh gateway, measures, then answers them all.
async fn run(binary: &Path, era: Era, backend: &Backend, count: usize, plan: &Plan) -> anyhow::Result<WaitingRun> {
    let gateway = GatewayProcess::spawn_in(binary, era.config(), backend, tempfile::tempdir()?).await?;
    gateway.ready().await?;
    let rest = gateway.rest.clone();
    // Pay for lazily built state (connections, first-use allocations) before the baseline.
    let warmup = plan.waiting_warmup;
    start_calls(&rest, era, warmup).await?;
    pending(&rest, era, warmup).await?;
    let ids = pending_ids(&rest, warmup).await?;
    answer_all(&rest, ids).await?;
    completed(&rest, era, warmup).await?;
    let baseline = gateway.rss()?;

    let started = Instant::now();
    let calls = start_calls(&rest, era, count).await?;
    pending(&rest, era, count).await?;
    let raise_time = started.elapsed();
    let rss_per_call = gateway.rss()?.saturating_sub(baseline) as f64 / count as f64;
    let ids = pending_ids(&rest, count).await?;

    let Latencies {
        list,
        get,
        answer,
        sampled,
    } = latencies(&rest, &ids, plan.scale_samples).await?;
    answer_all(&rest, ids[sampled..].to_vec()).await?;
    completed(&rest, era, warmup + count).await?;
    // The latest calls: a gateway keeps the ended calls of one principal up to a count, the oldest forgotten first.
    for call in calls.iter().rev().take(sampled) {
        let done = rest.settled(call).await?;
        check_confirmed(done.pointer("/result/structuredContent"))?;
    }
    Ok(WaitingRun {
        rss_per_call,
        raise_time,
        list,
        get,
        answer,
    })
}

/// Starts `count` `confirm_action` calls without waiting, `CONCURRENCY` at once; returns their ids.
pub async fn start_calls(rest: &Rest, era: Era, count: usize) -> anyhow::Result<Vec<String>> {
    let body = Arc::new(json!({"server": era.server(), "tool": "confirm_action", "arguments": {"action": "bench"}}));
    let ids = each(rest, (0..count).collect(), move |rest, _| {
        let body = body.clone();
        async move {
            let (status, call) = rest.post("/calls?wait=0", &body).await?;
            ensure!(status == 201, "POST /calls {body} → {status}: {call}");
            Ok(call["id"].as_str().context("no call id")?.to_owned())
        }
    })
    .await?;
    Ok(ids)
}

/// Answers every Request, `CONCURRENCY` at once.
async fn answer_all(rest: &Rest, ids: Vec<String>) -> anyhow::Result<()> {
    each(rest, ids, |rest, id| async move { rest.answer(&id).await }).await?;
    Ok(())
}

/// Runs `operation` on every item from `CONCURRENCY` workers; returns the results in the items' order.
async fn each<I, T, F, Fut>(rest: &Rest, items: Vec<I>, operation: F) -> anyhow::Result<Vec<T>>
where
    I: Clone + Send + Sync + 'static,
    T: Send + 'static,
    F: Fn(Rest, I) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = anyhow::Result<T>> + Send,
{
    let items = Arc::new(items);
    let next = Arc::new(AtomicUsize::new(0));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..CONCURRENCY {
        let (rest, items, next, operation) = (rest.clone(), items.clone(), next.clone(), operation.clone());
        workers.spawn(async move {
            let mut done = Vec::new();
            loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                let Some(item) = items.get(index) else {
                    return anyhow::Ok(done);
                };
                done.push((index, operation(rest.clone(), item.clone()).await?));
            }
        });
    }
    let mut results = Vec::with_capacity(items.len());
    while let Some(joined) = workers.join_next().await {
        results.extend(joined??);
    }
    results.sort_unstable_by_key(|(index, _)| *index);
    Ok(results.into_iter().map(|(_, result)| result).collect())
}

/// Waits until `count` Requests are pending.
pub async fn pending(rest: &Rest, era: Era, count: usize) -> anyhow::Result<()> {
    until(std::slice::from_ref(rest), era, "toolnexus_requests_pending", count).await
}

/// Waits until `count` calls have completed since the gateway started, failing if any failed. (The
/// `toolnexus_calls` gauge counts only the ended calls still kept, at most 25 000 per principal.)
async fn completed(rest: &Rest, era: Era, count: usize) -> anyhow::Result<()> {
    completed_on(std::slice::from_ref(rest), era, count).await
}

/// Waits until `count` calls have completed on `gateways` together (replicas of one store: each counts the
/// calls it finished), failing if any failed.
pub async fn completed_on(gateways: &[Rest], era: Era, count: usize) -> anyhow::Result<()> {
    let name = format!(
        "toolnexus_calls_finished_total{{server=\"{}\",status=\"completed\"}}",
        era.server()
    );
    until(gateways, era, &name, count).await
}

/// Polls `GET /metrics` of `gateways` until the sample `name`, summed over them, reaches `count`; fails on a
/// failed or cancelled call.
async fn until(gateways: &[Rest], era: Era, name: &str, count: usize) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let mut metrics = Vec::with_capacity(gateways.len());
        for rest in gateways {
            metrics.push(rest.text("/metrics").await?);
        }
        let sample = |name: &str| {
            metrics
                .iter()
                .flat_map(|metrics| metrics.lines())
                .filter_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse::<f64>().ok())
                .sum::<f64>() as usize
        };
        for ended in ["failed", "cancelled"] {
            let ended = sample(&format!(
                "toolnexus_calls_finished_total{{server=\"{}\",status=\"{ended}\"}}",
                era.server()
            ));
            ensure!(ended == 0, "{ended} calls ended without completing");
        }
        let reached = sample(name);
        if reached >= count {
            return Ok(());
        }
        ensure!(Instant::now() < deadline, "{name} at {reached} of {count} after 600 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The ids of every pending Request, oldest first, read page by page.
pub async fn pending_ids(rest: &Rest, count: usize) -> anyhow::Result<Vec<String>> {
    let mut ids = Vec::with_capacity(count);
    let mut path = "/requests?limit=1000".to_owned();
    loop {
        let (page, next) = rest.page(&path).await?;
        let page = page.as_array().context("GET /requests did not return a list")?;
        ids.extend(
            page.iter()
                .filter_map(|request| request["id"].as_str())
                .map(str::to_owned),
        );
        match next {
            Some(next) if !page.is_empty() => path = next,
            _ => break,
        }
    }
    ensure!(ids.len() == count, "{} Requests pending, not {count}", ids.len());
    Ok(ids)
}
