//! The nemeses: which faults a topology can cause, and the seeded schedule of when they strike.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::json;

use crate::history::{Fault, History};
use crate::random::Rng;

/// A fault a topology can cause.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// `kill -9` a gateway, and start it again.
    Kill,
    /// Fill the disk under the SQLite file for a while.
    DiskFull,
    /// Crash the upstream in the middle of a round, and start it again.
    UpstreamCrash,
    /// SIGSTOP a replica for longer than the lease, then SIGCONT.
    Pause,
    /// Stop PostgreSQL (`fast` shutdown) and start it again.
    PostgresFast,
    /// Stop PostgreSQL (`immediate` shutdown, as a crash would) and start it again.
    PostgresImmediate,
    /// Cut a replica off from the database, and heal it.
    Partition,
    /// Move a replica's wall clock forward or back for a while, and set it right.
    ClockMove,
}

impl FaultKind {
    /// Its name in the history and the output.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Kill => "kill-9",
            FaultKind::DiskFull => "disk-full",
            FaultKind::UpstreamCrash => "upstream-crash",
            FaultKind::Pause => "pause-past-lease",
            FaultKind::PostgresFast => "postgres-restart-fast",
            FaultKind::PostgresImmediate => "postgres-restart-immediate",
            FaultKind::Partition => "partition",
            FaultKind::ClockMove => "clock-moved",
        }
    }
}

/// What the runner drives: the gateways of one topology, their upstream, and the faults it can cause.
pub trait Target {
    /// The base URL (`http://127.0.0.1:PORT`) that client number `client` talks to.
    fn address(&self, client: usize) -> String;
    /// The demo server's journal: what the upstream received.
    fn journal(&self) -> PathBuf;
    /// How long after the workload a Request or a call may take to settle: the ttl, and the lease where a
    /// replica's calls pass to another.
    fn settle(&self) -> Duration;
    /// The faults it can cause, each with its weight in the schedule.
    fn faults(&self) -> &'static [(FaultKind, u64)];
    /// Causes one fault, its details drawn from `rng`, and heals it after its duration; says what it did.
    fn inflict(&self, kind: FaultKind, rng: Rng) -> impl Future<Output = anyhow::Result<String>>;
    /// Ends every fault still in force and waits until every gateway is ready.
    fn heal(&self) -> impl Future<Output = anyhow::Result<()>>;
    /// Stops every process it started.
    fn stop(&self) -> impl Future<Output = ()>;
}

/// One fault of the schedule.
#[derive(Debug, Clone)]
pub struct Planned {
    /// When it strikes, from the start of the workload.
    pub at: Duration,
    pub kind: FaultKind,
    /// What decides its details (how long, which server).
    pub rng: Rng,
}

/// The faults of a run of `duration`, from `rng`: one every 3 to 9 s, none in the first and last 2 s, an
/// upstream crash at most every 35 s (the gateway's back-off between its reconnections grows up to 30 s).
pub fn schedule(faults: &[(FaultKind, u64)], duration: Duration, mut rng: Rng) -> Vec<Planned> {
    let mut planned = Vec::new();
    let mut at = Duration::from_secs(2);
    let mut last_crash: Option<Duration> = None;
    loop {
        at += rng.millis(3000, 9000);
        if at + Duration::from_secs(2) > duration {
            return planned;
        }
        let mut kind = rng.weighted(faults);
        if kind == FaultKind::UpstreamCrash && last_crash.is_some_and(|last| at - last < Duration::from_secs(35)) {
            kind = FaultKind::Kill;
        }
        if kind == FaultKind::UpstreamCrash {
            last_crash = Some(at);
        }
        planned.push(Planned {
            at,
            kind,
            rng: rng.fork(planned.len() as u64),
        });
    }
}

/// Causes the planned faults at their times; each goes on while the next ones strike, so that they overlap.
pub async fn run(target: &impl Target, plan: &[Planned], history: &History) {
    use futures::StreamExt;
    let start = tokio::time::Instant::now();
    let mut striking = futures::stream::FuturesUnordered::new();
    for fault in plan {
        let due = tokio::time::sleep_until(start + fault.at);
        tokio::pin!(due);
        loop {
            tokio::select! {
                () = &mut due => break,
                Some(()) = striking.next(), if !striking.is_empty() => {}
            }
        }
        history.note("schedule", &json!({"fault": fault.kind.name(), "at": history.now()}));
        striking.push(async move {
            let start = history.now();
            let done = target.inflict(fault.kind, fault.rng.clone()).await;
            history.fault(Fault {
                fault: fault.kind.name().to_owned(),
                start,
                end: history.now(),
                note: Some(done.unwrap_or_else(|error| format!("failed: {error:#}"))),
            });
        });
    }
    while striking.next().await.is_some() {}
}
