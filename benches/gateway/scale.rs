//! Many pending Requests on one gateway: memory per Request, read and answer latencies, and the drain rate.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use serde_json::{Value, json};

use crate::process::GatewayProcess;
use crate::rest::Rest;
use crate::stats::Samples;
use crate::{Era, Plan};

/// How many answers are in flight at once while draining.
pub const DRAIN_CONCURRENCY: usize = 64;

/// The most elicitations one 2026-07-28 `flood` call raises: its `input_required` result carries them all in
/// one JSON-RPC message, and a stdio message may be at most 16 MiB. A 2025-11-25 flood sends one message per
/// elicitation, and must stay one call: over stdio the gateway attributes a legacy elicitation to a call only
/// while that call is the session's only one in flight.
const FLOOD_CHUNK: usize = 20_000;

/// What one scale run measured.
pub struct ScaleRun {
    pub era: Era,
    pub pending: usize,
    /// Gateway RSS growth divided by the pending Requests.
    pub rss_per_request: f64,
    pub list: Samples,
    pub get: Samples,
    pub answer: Samples,
    /// Answers per second while draining the rest at `DRAIN_CONCURRENCY`.
    pub drain_rate: f64,
    /// How long the gateway took to hold all of them.
    pub raise_time: Duration,
}

/// Holds `count` Requests pending on a fresh gateway (`flood` calls), measures, then answers them all.
pub async fn run(binary: &Path, era: Era, count: usize, plan: &Plan) -> anyhow::Result<ScaleRun> {
    let gateway = GatewayProcess::spawn(binary, era.config()).await?;
    gateway.ready().await?;
    let rest = gateway.rest.clone();
    // Pay for lazily built state (connections, first-use allocations) before the baseline.
    flood_and_drain(&rest, era, 8).await?;
    let baseline = gateway.rss()?;

    let started = Instant::now();
    let (calls, ids) = hold(&rest, era, count).await?;
    let raise_time = started.elapsed();
    let rss_per_request = gateway.rss()?.saturating_sub(baseline) as f64 / count as f64;

    let Latencies {
        list,
        get,
        answer,
        sampled,
    } = latencies(&rest, &ids, plan.scale_samples).await?;
    let rest_of = Arc::new(ids[sampled..].to_vec());
    let drain_rate = drain(std::slice::from_ref(&rest), rest_of).await?;
    completed(&rest, &calls).await?;
    Ok(ScaleRun {
        era,
        pending: count,
        rss_per_request,
        list,
        get,
        answer,
        drain_rate,
        raise_time,
    })
}

/// Holds `count` Requests pending with `flood` calls; returns the calls (with how many each raised) and the
/// Requests.
pub async fn hold(rest: &Rest, era: Era, count: usize) -> anyhow::Result<(Vec<(String, usize)>, Vec<String>)> {
    let mut calls = Vec::new();
    let mut remaining = count;
    while remaining > 0 {
        let chunk = match era {
            Era::Modern => remaining.min(FLOOD_CHUNK),
            Era::Legacy => remaining,
        };
        calls.push((start_flood(rest, era, chunk).await?, chunk));
        remaining -= chunk;
    }
    let mut ids = Vec::with_capacity(count);
    for (call, chunk) in &calls {
        ids.extend(pending_ids(rest, call, *chunk).await?);
    }
    Ok((calls, ids))
}

/// Checks that every flood completed with all its answers accepted.
pub async fn completed(rest: &Rest, calls: &[(String, usize)]) -> anyhow::Result<()> {
    for (call, chunk) in calls {
        let deadline = Instant::now() + Duration::from_secs(300);
        let mut done = rest.settled(call).await?;
        // A replica's long-poll may answer while another replica still retries the call's round.
        while done["status"] == "running" && Instant::now() < deadline {
            done = rest.settled(call).await?;
        }
        let accepted = done
            .pointer("/result/structuredContent/accepted")
            .and_then(Value::as_u64);
        ensure!(
            accepted == Some(*chunk as u64),
            "a flood did not complete with every answer accepted: {}",
            done.get("result").unwrap_or(&done["status"])
        );
    }
    Ok(())
}

/// The Request ids of a call once `count` of them exist.
async fn pending_ids(rest: &Rest, call: &str, count: usize) -> anyhow::Result<Vec<String>> {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let (_, view) = rest.get(&format!("/calls/{call}")).await?;
        let ids = view["requests"].as_array().context("no requests")?;
        ensure!(
            !matches!(view["status"].as_str(), Some("failed" | "cancelled")),
            "the flood ended early: {}",
            view["error"]
        );
        if ids.len() >= count {
            return Ok(ids.iter().filter_map(Value::as_str).map(str::to_owned).collect());
        }
        ensure!(
            Instant::now() < deadline,
            "only {} of {count} Requests after 300 s",
            ids.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Answers every id at `DRAIN_CONCURRENCY`, the answerers spread evenly over `gateways` (replicas of one
/// store); returns answers per second.
pub async fn drain(gateways: &[Rest], ids: Arc<Vec<String>>) -> anyhow::Result<f64> {
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for worker in 0..DRAIN_CONCURRENCY {
        let rest = gateways[worker % gateways.len()].clone();
        let (ids, next) = (ids.clone(), next.clone());
        workers.spawn(async move {
            loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                let Some(id) = ids.get(index) else {
                    return anyhow::Ok(());
                };
                rest.answer(id).await?;
            }
        });
    }
    while let Some(joined) = workers.join_next().await {
        joined??;
    }
    Ok(ids.len() as f64 / started.elapsed().as_secs_f64())
}

/// `POST /calls` of a `flood`, without waiting; returns the call id.
async fn start_flood(rest: &Rest, era: Era, count: usize) -> anyhow::Result<String> {
    let body = json!({"server": era.server(), "tool": "flood", "arguments": {"count": count}});
    let (status, call) = rest.post("/calls?wait=0", &body).await?;
    ensure!(status == 201, "POST /calls {body} → {status}: {call}");
    Ok(call["id"].as_str().context("no call id")?.to_owned())
}

/// A small flood answered in full, to warm the gateway up.
pub async fn flood_and_drain(rest: &Rest, era: Era, count: usize) -> anyhow::Result<()> {
    let call = start_flood(rest, era, count).await?;
    let ids = pending_ids(rest, &call, count).await?;
    drain(std::slice::from_ref(rest), Arc::new(ids)).await?;
    let done = rest.settled(&call).await?;
    ensure!(done["status"] == "completed", "warm-up flood: {done}");
    Ok(())
}

/// A tiny deterministic generator for picking Requests.
/// The read and answer latencies of pending Requests.
pub struct Latencies {
    pub list: Samples,
    pub get: Samples,
    pub answer: Samples,
    /// How many of `ids` (the first ones) were answered.
    pub sampled: usize,
}

/// Times `samples` listings of the first page, reads of pending Requests picked from `ids` (all pending), and
/// answers to the first `samples` of them.
pub async fn latencies(rest: &Rest, ids: &[String], samples: usize) -> anyhow::Result<Latencies> {
    let mut list = Samples::default();
    let expected_page = ids.len().min(100);
    for _ in 0..samples {
        let started = Instant::now();
        let (status, page) = rest.get("/requests?limit=100").await?;
        list.push(started.elapsed());
        ensure!(
            status == 200 && page.as_array().map(Vec::len) == Some(expected_page),
            "GET /requests?limit=100 → {status}, not a full page"
        );
    }
    let mut get = Samples::default();
    let mut pick = Lcg(0x5eed);
    for _ in 0..samples {
        let id = &ids[pick.next() % ids.len()];
        let started = Instant::now();
        let (status, view) = rest.get(&format!("/requests/{id}")).await?;
        get.push(started.elapsed());
        ensure!(
            status == 200 && view["status"] == "pending",
            "GET /requests/{id} → {status}: {view}"
        );
    }
    let sampled = samples.min(ids.len());
    let mut answer = Samples::default();
    for id in &ids[..sampled] {
        let started = Instant::now();
        rest.answer(id).await?;
        answer.push(started.elapsed());
    }
    Ok(Latencies {
        list,
        get,
        answer,
        sampled,
    })
}

struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) as usize
    }
}
