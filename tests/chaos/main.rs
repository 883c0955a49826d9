//! The fault-schedule runner (issue 33): drives the real gateway binary under a seeded, concurrent workload
//! while nemeses kill it, fill its disk and crash its upstream, records a history of every operation, event,
//! delivery and fault, heals, reads the final state through the API and checks the rules of `checker`.
//!
//! `cargo test --test chaos` runs the short schedule CI runs; `scripts/chaos.sh --topology sqlite --seed N
//! --duration SECONDS [--history PATH]` any other. The same seed gives the same schedule of operations and
//! faults. The last line is the verdict; the exit status is 1 on a violation and 2 on bad arguments.

mod api;
mod checker;
mod children;
mod clock;
#[allow(dead_code, reason = "the runner starts its own cluster, and never counts statements")]
#[path = "../../src/test_postgres.rs"]
mod cluster;
mod consumers;
mod gateways;
#[allow(
    dead_code,
    reason = "the API tests' helpers, of which the runner uses the SSE parser and the binary"
)]
#[path = "../api/helpers.rs"]
mod helpers;
mod history;
mod nemesis;
mod random;
mod receiver;
#[allow(dead_code, reason = "the runner cuts the relay, and never counts round trips")]
#[path = "../shared/relay.rs"]
mod relay;
mod replicas;
mod sqlite;
mod state;
mod workload;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use crate::api::Api;
use crate::children::Watchdog;
use crate::history::History;
use crate::nemesis::Target;
use crate::random::Rng;

/// The short schedules `cargo test` runs (and so CI): a fixed seed and duration per topology.
const CI_RUNS: [(Topology, u64, u64); 2] = [(Topology::Sqlite, 7, 30), (Topology::Replicas, 7, 40)];
/// Clients running scenarios at once.
const CLIENTS: usize = 4;
/// SSE consumers at once.
const CONSUMERS: usize = 2;

/// Which gateways run, on what store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Topology {
    /// One gateway on a SQLite file.
    Sqlite,
    /// Three replicas on one PostgreSQL.
    Replicas,
}

/// One run the command line asked for.
#[derive(Debug)]
struct Run {
    topology: Topology,
    seed: u64,
    duration: Duration,
    history: Option<PathBuf>,
}

/// What the arguments ask.
enum Asked {
    Runs(Vec<Run>),
    /// A `cargo test` filter that names another target's tests.
    Nothing,
}

fn main() -> ExitCode {
    let asked = match parse(std::env::args().skip(1).collect()) {
        Ok(asked) => asked,
        Err(problem) => {
            eprintln!("chaos: {problem}");
            eprintln!(
                "usage: scripts/chaos.sh --topology sqlite|replicas --seed N --duration SECONDS [--history PATH]"
            );
            return ExitCode::from(2);
        }
    };
    let Asked::Runs(runs) = asked else {
        return ExitCode::SUCCESS;
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let mut failed = false;
        for run in runs {
            let interrupted = async {
                use tokio::signal::unix::{SignalKind, signal};
                let mut interrupt = signal(SignalKind::interrupt()).expect("SIGINT");
                let mut terminate = signal(SignalKind::terminate()).expect("SIGTERM");
                let mut hangup = signal(SignalKind::hangup()).expect("SIGHUP");
                tokio::select! {
                    _ = interrupt.recv() => {}
                    _ = terminate.recv() => {}
                    _ = hangup.recv() => {}
                }
            };
            // A signal drops the run: its children are killed, and the watchdog removes its temp dir.
            let outcome = tokio::select! {
                outcome = execute(&run) => outcome,
                () = interrupted => {
                    eprintln!("chaos: interrupted, seed {}", run.seed);
                    return ExitCode::from(130);
                }
            };
            match outcome {
                Ok(true) => {}
                Ok(false) => failed = true,
                Err(error) => {
                    eprintln!("chaos: the run could not go on: {error:#}");
                    println!("chaos: the run failed, seed {}", run.seed);
                    failed = true;
                }
            }
        }
        if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS }
    })
}

/// Reads the arguments: the runner's own flags, or those `cargo test` passes (a filter, `--nocapture`…).
fn parse(args: Vec<String>) -> Result<Asked, String> {
    let ours = ["--topology", "--seed", "--duration", "--history"];
    if !args
        .iter()
        .any(|arg| ours.iter().any(|flag| arg.split('=').next() == Some(flag)))
    {
        let filters: Vec<&String> = args.iter().filter(|arg| !arg.starts_with('-')).collect();
        if filters.iter().any(|filter| !"chaos".contains(filter.as_str())) {
            return Ok(Asked::Nothing);
        }
        let runs = CI_RUNS
            .iter()
            .map(|&(topology, seed, seconds)| Run {
                topology,
                seed,
                duration: Duration::from_secs(seconds),
                history: None,
            })
            .collect();
        return Ok(Asked::Runs(runs));
    }
    let (mut topology, mut seed, mut duration, mut history) = (None, None, None, None);
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) => (flag.to_owned(), Some(value.to_owned())),
            None => (arg, None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| args.next())
                .ok_or(format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--topology" => {
                topology = Some(match value()?.as_str() {
                    "sqlite" => Topology::Sqlite,
                    "replicas" => Topology::Replicas,
                    other => return Err(format!("unknown topology {other:?}: give sqlite or replicas")),
                })
            }
            "--seed" => {
                let text = value()?;
                seed = Some(
                    text.parse::<u64>()
                        .map_err(|_| format!("the seed {text:?} is not a number (0 to {})", u64::MAX))?,
                );
            }
            "--duration" => {
                let text = value()?;
                let seconds = text
                    .parse::<u64>()
                    .ok()
                    .filter(|seconds| (10..=86_400).contains(seconds))
                    .ok_or(format!(
                        "the duration {text:?} is not a number of seconds from 10 to 86400"
                    ))?;
                duration = Some(Duration::from_secs(seconds));
            }
            "--history" => history = Some(PathBuf::from(value()?)),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    let topology = topology.ok_or("--topology is missing")?;
    if topology == Topology::Replicas {
        cluster::installed().map_err(|missing| format!("the replicas topology needs PostgreSQL 15: {missing}"))?;
        clock::library().map_err(|missing| format!("the replicas topology moves a replica's clock: {missing}"))?;
    }
    Ok(Asked::Runs(vec![Run {
        topology,
        seed: seed.ok_or("--seed is missing")?,
        duration: duration.ok_or("--duration is missing")?,
        history,
    }]))
}

/// Runs one schedule and prints its verdict last; whether it kept every rule. The run's temp dir is removed,
/// unless the run failed: then it is kept with the history, and named.
async fn execute(run: &Run) -> anyhow::Result<bool> {
    let dir = children::run_dir()?;
    let watchdog = Arc::new(Watchdog::start(&dir)?);
    let path = run.history.clone().unwrap_or_else(|| dir.join("history.jsonl"));
    let outcome = schedule(run, &dir, &watchdog, &path).await;
    if matches!(outcome, Ok((true, _))) {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        watchdog.keep();
        println!(
            "chaos: the history is kept in {} (the run's files in {})",
            path.display(),
            dir.display()
        );
    }
    let (kept, verdict) = outcome?;
    println!("{verdict}");
    Ok(kept)
}

/// Runs one schedule in `dir`, recording its history at `path`, and prints what broke a rule; whether it kept
/// every rule, and the verdict.
async fn schedule(
    run: &Run,
    dir: &std::path::Path,
    watchdog: &Arc<Watchdog>,
    path: &std::path::Path,
) -> anyhow::Result<(bool, String)> {
    let history = Arc::new(History::create(path)?);
    let rng = Rng::new(run.seed);
    let receiver = receiver::start(history.clone(), rng.fork(1000)).await?;
    match run.topology {
        Topology::Sqlite => {
            let target = sqlite::Sqlite::start(dir, watchdog.clone(), &receiver).await?;
            drive(run, &target, &history, path, rng).await
        }
        Topology::Replicas => {
            cluster::installed()
                .map_err(|missing| anyhow::anyhow!("the replicas topology needs PostgreSQL 15: {missing}"))?;
            let target = replicas::Replicas::start(dir, watchdog.clone(), &receiver).await?;
            drive(run, &target, &history, path, rng).await
        }
    }
}

/// Runs the workload and the nemeses on `target`, heals, reads and checks; whether every rule held, and the
/// verdict.
async fn drive(
    run: &Run,
    target: &impl Target,
    history: &Arc<History>,
    path: &std::path::Path,
    rng: Rng,
) -> anyhow::Result<(bool, String)> {
    let plan = nemesis::schedule(target.faults(), run.duration, rng.fork(2000));
    history.note(
        "run",
        &json!({"seed": run.seed, "topology": format!("{:?}", run.topology), "duration": run.duration.as_secs(),
            "faults": plan.iter().map(|p| json!({"fault": p.kind.name(), "at": p.at.as_millis() as u64})).collect::<Vec<_>>()}),
    );
    eprintln!(
        "chaos: {:?}, seed {}, {} s, {} faults planned; history in {}",
        run.topology,
        run.seed,
        run.duration.as_secs(),
        plan.len(),
        path.display()
    );
    let http = reqwest::Client::new();
    let apis: Vec<Api> = (0..CLIENTS)
        .map(|client| {
            Api::new(
                format!("client-{client}"),
                target.address(client),
                http.clone(),
                history.clone(),
            )
        })
        .collect();
    let until = tokio::time::Instant::now() + run.duration;
    let clients = (0..CLIENTS).map(|me| workload::client(apis.clone(), me, run.seed, rng.fork(me as u64), until));
    let consumers = (0..CONSUMERS).map(|index| {
        let address = move |connection: u64| target.address(index + connection as usize);
        consumers::consumer(
            address,
            index,
            http.clone(),
            history.clone(),
            rng.fork(100 + index as u64),
            until,
        )
    });
    futures::join!(
        futures::future::join_all(clients),
        futures::future::join_all(consumers),
        nemesis::run(target, &plan, history)
    );
    target.heal().await?;
    let checker_api = Api::new("checker".to_owned(), target.address(0), http.clone(), history.clone());
    let state = state::read(&checker_api, history, target.settle(), &target.journal()).await?;
    state::deliveries_settled(history, &state.log).await;
    target.stop().await;
    let violations = history.read(|record| checker::check(record, &state));
    let operations = history.read(|record| record.ops.len());
    for violation in &violations {
        println!("chaos: rule {} broken: {}", violation.rule, violation.detail);
        history.read(|record| {
            for op in &violation.ops {
                if let Some(op) = record.ops.get(*op as usize) {
                    println!("  op {}", serde_json::to_string(op).unwrap_or_default());
                }
            }
        });
        history.note(
            "violation",
            &json!({"rule": violation.rule, "detail": violation.detail, "ops": violation.ops}),
        );
    }
    let verdict = format!(
        "chaos: {} violations in {operations} operations, seed {}",
        violations.len(),
        run.seed
    );
    history.note("verdict", &json!(verdict));
    history.flush();
    Ok((violations.is_empty(), verdict))
}
