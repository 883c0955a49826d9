//! Plain calls while many clients long-poll Requests that wait on a person (an agent each, following its own
//! call's): what the gateway's changes cost the waiters they do not concern.

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};

use crate::process::{GatewayProcess, MODERN_ONLY};
use crate::rest::Rest;
use crate::{Era, Plan, rate, waiting};

/// Echo callers at once.
const CALLERS: usize = 64;

/// The long-polls section: echo calls/s with each count of idle long-polls held, on one gateway.
pub async fn table(binary: &Path, plan: &Plan) -> anyhow::Result<String> {
    let mut table = format!(
        "\n### Plain calls while clients long-poll pending Requests (memory store, 2026-07-28)\n\n\
         | long-polls held | echo calls/s (c={CALLERS}) | against none |\n|---|---|---|\n"
    );
    let mut alone = None;
    for &held in plan.long_polls {
        eprintln!("long_polls: {held} held");
        let echo = measure(binary, plan, held).await?;
        let alone = *alone.get_or_insert(echo);
        let _ = writeln!(table, "| {held} | {echo:.0} | {:.2} |", echo / alone);
    }
    let _ = writeln!(
        table,
        "\nEach long-poll is a `GET /requests/{{id}}?wait=300` on the Request of a `confirm_action` call, which \
         stays pending, on a connection of its own; the echo calls run for {} ms once the gateway counts every \
         long-poll held.",
        plan.window.as_millis()
    );
    Ok(table)
}

async fn measure(binary: &Path, plan: &Plan, held: usize) -> anyhow::Result<f64> {
    let gateway = GatewayProcess::spawn(binary, MODERN_ONLY).await?;
    gateway.ready().await?;
    let era = Era::Modern;
    waiting::start_calls(&gateway.rest, era, held).await?;
    waiting::pending(&gateway.rest, era, held).await?;
    let mut polls = tokio::task::JoinSet::new();
    for request in waiting::pending_ids(&gateway.rest, held).await? {
        // Each on a connection of its own, as the client holds none free while they are open.
        let rest = gateway.rest.clone();
        polls.spawn(async move { rest.get(&format!("/requests/{request}?wait=300")).await });
    }
    held_open(&gateway.rest, held).await?;
    let rest = gateway.rest.clone();
    let echo = rate(CALLERS, plan.window, move || {
        let rest = rest.clone();
        async move { rest.echo(era.server()).await }
    })
    .await?;
    ensure!(
        polls.try_join_next().is_none(),
        "a long-poll on a waiting call returned"
    );
    polls.abort_all();
    Ok(echo)
}

/// Waits until the gateway holds `count` long-polls.
async fn held_open(rest: &Rest, count: usize) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let metrics = rest.text("/metrics").await?;
        let held: f64 = metrics
            .lines()
            .find_map(|line| line.strip_prefix("toolnexus_long_polls "))
            .context("no toolnexus_long_polls in /metrics")?
            .trim()
            .parse()?;
        if held >= count as f64 {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "{held} of {count} long-polls held after 120 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
