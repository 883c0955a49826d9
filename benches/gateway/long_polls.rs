//! Plain calls while many clients wait on a person: long-polls on pending Requests (an agent each, following its
//! own call's), and 2025-11-25 calls whose upstream holds its request open on an elicitation. What the gateway's
//! changes cost the waiters they do not concern.

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};

use crate::process::{BOTH_ERAS, GatewayProcess};
use crate::rest::Rest;
use crate::{Era, Plan, rate, waiting};

/// Echo callers at once.
const CALLERS: usize = 64;

/// What waits while the echo calls run.
#[derive(Clone, Copy)]
enum Waiter {
    /// `GET /requests/{id}?wait=300` on the pending Request of a 2026-07-28 `confirm_action` call.
    LongPoll,
    /// A 2025-11-25 `confirm_action` call, its upstream waiting on the elicitation's answer.
    LegacyCall,
}

/// The section: echo calls/s on one gateway with each count of each kind of waiter held.
pub async fn table(binary: &Path, plan: &Plan) -> anyhow::Result<String> {
    let mut table = format!(
        "\n### Plain calls while clients wait on a person (memory store)\n\n\
         | waiting | held | echo calls/s (c={CALLERS}, 2026-07-28) | against none |\n|---|---|---|---|\n"
    );
    for (waiter, name) in [
        (Waiter::LongPoll, "long-polls on pending Requests"),
        (Waiter::LegacyCall, "2025-11-25 calls"),
    ] {
        let mut alone = None;
        for &held in plan.long_polls {
            eprintln!("long_polls: {held} {name}");
            let echo = measure(binary, plan, waiter, held).await?;
            let alone = *alone.get_or_insert(echo);
            let _ = writeln!(table, "| {name} | {held} | {echo:.0} | {:.2} |", echo / alone);
        }
    }
    let _ = writeln!(
        table,
        "\nEach long-poll is a `GET /requests/{{id}}?wait=300` on the Request of a 2026-07-28 `confirm_action` \
         call, which stays pending, on a connection of its own; each 2025-11-25 call is a `confirm_action` whose \
         upstream waits on its elicitation. The echo calls run for {} ms once every waiter is held.",
        plan.window.as_millis()
    );
    Ok(table)
}

async fn measure(binary: &Path, plan: &Plan, waiter: Waiter, held: usize) -> anyhow::Result<f64> {
    let gateway = GatewayProcess::spawn(binary, BOTH_ERAS).await?;
    gateway.ready().await?;
    let era = match waiter {
        Waiter::LongPoll => Era::Modern,
        Waiter::LegacyCall => Era::Legacy,
    };
    waiting::start_calls(&gateway.rest, era, held).await?;
    waiting::pending(&gateway.rest, era, held).await?;
    let mut polls = tokio::task::JoinSet::new();
    if let Waiter::LongPoll = waiter {
        for request in waiting::pending_ids(&gateway.rest, held).await? {
            // Each on a connection of its own, as the client holds none free while they are open.
            let rest = gateway.rest.clone();
            polls.spawn(async move { rest.get(&format!("/requests/{request}?wait=300")).await });
        }
        held_open(&gateway.rest, held).await?;
    }
    let rest = gateway.rest.clone();
    let echo = rate(CALLERS, plan.window, move || {
        let rest = rest.clone();
        async move { rest.echo(Era::Modern.server()).await }
    })
    .await?;
    ensure!(
        polls.try_join_next().is_none(),
        "a long-poll on a pending Request returned"
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
