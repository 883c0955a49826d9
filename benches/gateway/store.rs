//! What keeping state costs: the same flows on a gateway with its state in memory and on one with a SQLite
//! file (`synchronous=FULL`), side by side.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::process::{BOTH_ERAS, Backend, GatewayProcess};
use crate::scale;
use crate::stats::{Samples, millis, p50_p99};
use crate::{Era, Plan, record, verdict};

/// What holding and draining many pending Requests measured on one backend.
struct Held {
    rss_per_request: f64,
    drain_rate: f64,
    /// From spawning a gateway on a store holding them to `/readyz` 200 (SQLite only).
    ready_with_them: Option<Duration>,
}

/// The store section: round trips in both eras, then `plan.store_pending` Requests held and drained.
pub async fn table(binary: &Path, plan: &Plan) -> anyhow::Result<String> {
    let mut table = String::from(
        "\n### Store: memory vs SQLite (µs unless stated)\n\n\
         | measurement | protocol | memory | sqlite | sqlite / memory | target |\n|---|---|---|---|---|---|\n",
    );
    let memory = GatewayProcess::spawn_in(binary, BOTH_ERAS, Backend::Memory, tempfile::tempdir()?).await?;
    let sqlite = GatewayProcess::spawn_in(binary, BOTH_ERAS, Backend::Sqlite, tempfile::tempdir()?).await?;
    memory.ready().await?;
    sqlite.ready().await?;
    for era in [Era::Modern, Era::Legacy] {
        eprintln!("store: round trips, {}", era.protocol());
        let (mut in_memory, mut on_disk) = (Samples::default(), Samples::default());
        for round in 0..plan.warmup + plan.iterations {
            let measured = round >= plan.warmup;
            record(measured, &mut in_memory, memory.rest.confirm(era.server())).await?;
            record(measured, &mut on_disk, sqlite.rest.confirm(era.server())).await?;
        }
        let ratio = on_disk.p50().as_secs_f64() / in_memory.p50().as_secs_f64().max(1e-9);
        let target = match era {
            Era::Modern => format!("≤ 1.5: {}", verdict(ratio <= 1.5)),
            Era::Legacy => String::new(),
        };
        let _ = writeln!(
            table,
            "| elicitation round trip | {} | {} | {} | {ratio:.2} | {target} |",
            era.protocol(),
            p50_p99(&in_memory),
            p50_p99(&on_disk),
        );
    }
    drop((memory, sqlite));

    let count = plan.store_pending;
    let in_memory = hold_and_drain(binary, Backend::Memory, count).await?;
    let on_disk = hold_and_drain(binary, Backend::Sqlite, count).await?;
    let _ = writeln!(
        table,
        "| answers/s draining {count} pending (c={}) | 2026-07-28 | {:.0} | {:.0} | {:.2} | sqlite ≥ 20 000: {} |",
        scale::DRAIN_CONCURRENCY,
        in_memory.drain_rate,
        on_disk.drain_rate,
        on_disk.drain_rate / in_memory.drain_rate,
        verdict(on_disk.drain_rate >= 20_000.0)
    );
    let _ = writeln!(
        table,
        "| RSS per pending Request at {count} (B) | 2026-07-28 | {:.0} | {:.0} | {:.2} | sqlite ≤ memory: {} |",
        in_memory.rss_per_request,
        on_disk.rss_per_request,
        on_disk.rss_per_request / in_memory.rss_per_request,
        verdict(on_disk.rss_per_request <= in_memory.rss_per_request)
    );
    let ready = on_disk.ready_with_them.unwrap_or_default();
    let _ = writeln!(
        table,
        "| start → `/readyz` 200 with {count} pending in the file (ms) | 2026-07-28 | | {} | | ≤ 1000 ms: {} |",
        millis(ready),
        verdict(ready <= Duration::from_secs(1))
    );
    let _ = writeln!(
        table,
        "\n{} measured round trips per cell after {} warm-up ones, memory and SQLite alternating; the SQLite \
         gateway is stopped with SIGTERM once the Requests are pending and started again on its file before \
         they are drained.",
        plan.iterations, plan.warmup
    );
    Ok(table)
}

/// Holds `count` Requests pending on a fresh gateway, measures its memory, restarts it (SQLite) and drains
/// them.
async fn hold_and_drain(binary: &Path, backend: Backend, count: usize) -> anyhow::Result<Held> {
    eprintln!("store: {count} pending, {}", backend.name());
    let mut gateway = GatewayProcess::spawn_in(binary, BOTH_ERAS, backend, tempfile::tempdir()?).await?;
    gateway.ready().await?;
    scale::flood_and_drain(&gateway.rest, Era::Modern, 8).await?;
    let baseline = gateway.rss()?;
    let (calls, ids) = scale::hold(&gateway.rest, Era::Modern, count).await?;
    let rss_per_request = gateway.rss()?.saturating_sub(baseline) as f64 / count as f64;
    let mut ready_with_them = None;
    if backend == Backend::Sqlite {
        let dir = gateway.stop().await?;
        let spawned = Instant::now();
        gateway = GatewayProcess::spawn_in(binary, BOTH_ERAS, backend, dir).await?;
        gateway.ready().await?;
        ready_with_them = Some(spawned.elapsed());
    }
    let drain_rate = scale::drain(&gateway.rest, Arc::new(ids)).await?;
    scale::completed(&gateway.rest, &calls).await?;
    Ok(Held {
        rss_per_request,
        drain_rate,
        ready_with_them,
    })
}
