//! Topology 2: three replicas of the gateway on one PostgreSQL 15 database (a throwaway cluster that syncs
//! each commit, as in production), each reaching it through a TCP relay the runner controls, with the demo
//! server over HTTP as their upstream in both eras and a webhook receiver. Nemeses: `kill -9` of a replica;
//! SIGSTOP of a replica past the lease, then SIGCONT; PostgreSQL stopped `fast` or `immediate` and started
//! again; a replica cut off from the database (its relay closes its connections and refuses new ones) and
//! healed; a replica's wall clock moved forward or back (libfaketime), and set right; an upstream crash.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use crate::children::Watchdog;
use crate::clock::Skew;
use crate::cluster::Cluster;
use crate::gateways::{self, Gateway, Upstream, signal};
use crate::nemesis::{FaultKind, Target};
use crate::random::Rng;
use crate::relay::Relay;

/// How many replicas run.
const REPLICAS: usize = 3;
/// How long a replica whose heartbeat stopped is taken for alive (the store's lease), and the margin past it
/// the others take to end what it held.
const LEASE: Duration = Duration::from_secs(20);
/// How long a replica the others took for gone takes, once it runs again or reaches the database, to learn so
/// at its next heartbeat (every 3 s, failed after 3 s more) and exit.
const TOLD_GONE: Duration = Duration::from_secs(10);
/// The most a replica's clock is moved, either way. A Request raised on a replica whose clock is ahead expires
/// that much later.
const MAX_SKEW: i64 = 15;

/// Three replicas on one PostgreSQL, and their upstream.
pub struct Replicas {
    cluster: Arc<Cluster>,
    replicas: Vec<Gateway>,
    relays: Vec<Relay>,
    upstream: Upstream,
    client: reqwest::Client,
}

impl Replicas {
    /// Starts PostgreSQL, the demo server and three replicas, each with its dir under `dir`.
    pub async fn start(dir: &Path, watchdog: Arc<Watchdog>, receiver: &str) -> anyhow::Result<Self> {
        // Durable: what PostgreSQL acknowledged must outlive its `immediate` restarts, as in production.
        let cluster = Arc::new(tokio::task::spawn_blocking(Cluster::start_durable).await?);
        let blocking = cluster.clone();
        let database = tokio::task::spawn_blocking(move || blocking.database()).await?;
        let upstream = Upstream::start(dir, watchdog.clone()).await?;
        let mut relays = Vec::new();
        let mut replicas = Vec::new();
        for index in 0..REPLICAS {
            let relay = Relay::in_front_of(&database).await?;
            let settings = format!("replica = \"replica-{index}\"\n");
            let config = gateways::config(&settings, &relay.url, &upstream.url, receiver);
            let dir = dir.join(format!("replica-{index}"));
            std::fs::create_dir_all(&dir)?;
            let clock = Skew::new(&dir).context("a replica's clock is moved by libfaketime")?;
            replicas.push(Gateway::start(&dir, watchdog.clone(), &config, Some(clock)).await?);
            relays.push(relay);
        }
        let client = reqwest::Client::new();
        for replica in &replicas {
            replica.ready(&client).await?;
        }
        Ok(Self {
            cluster,
            replicas,
            relays,
            upstream,
            client,
        })
    }

    /// Stops replica `index` with SIGSTOP for `pause` (past the lease, the others take it for gone), then
    /// SIGCONT, unless it was restarted meanwhile.
    async fn pause(&self, index: usize, pause: Duration) -> anyhow::Result<String> {
        let replica = &self.replicas[index];
        let Some(pid) = replica.pid().await else {
            return Ok("no process".to_owned());
        };
        let stop = nix::sys::signal::Signal::SIGSTOP;
        if !replica.if_still(pid, |pid| signal(pid, stop)).await? {
            return Ok("it was restarting".to_owned());
        }
        tokio::time::sleep(pause).await;
        replica
            .if_still(pid, |pid| signal(pid, nix::sys::signal::Signal::SIGCONT))
            .await?;
        let after = replica.restart_if_it_exits(TOLD_GONE).await?;
        Ok(format!("replica {index} stopped for {} ms; {after}", pause.as_millis()))
    }

    /// Stops PostgreSQL (`immediate`: as a crash would) for `down`, then starts it again.
    async fn restart_database(&self, immediate: bool, down: Duration) -> anyhow::Result<String> {
        let cluster = self.cluster.clone();
        tokio::task::spawn_blocking(move || if immediate { cluster.halt() } else { cluster.stop() }).await?;
        tokio::time::sleep(down).await;
        let cluster = self.cluster.clone();
        tokio::task::spawn_blocking(move || cluster.restart()).await?;
        Ok(format!("down {} ms", down.as_millis()))
    }

    /// Moves replica `index`'s wall clock by `seconds` for `held`, then sets it right.
    async fn move_clock(&self, index: usize, seconds: i64, held: Duration) -> anyhow::Result<String> {
        let clock = self.replicas[index].clock.as_ref().context("a replica's clock")?;
        clock.set(seconds)?;
        tokio::time::sleep(held).await;
        clock.set(0)?;
        Ok(format!(
            "replica {index}'s clock {seconds:+} s for {} ms",
            held.as_millis()
        ))
    }

    /// Cuts replica `index` off from the database for `cut`, then heals it.
    async fn partition(&self, index: usize, cut: Duration) -> anyhow::Result<String> {
        self.relays[index].cut();
        tokio::time::sleep(cut).await;
        self.relays[index].heal();
        let after = self.replicas[index].restart_if_it_exits(TOLD_GONE).await?;
        Ok(format!("replica {index} cut off for {} ms; {after}", cut.as_millis()))
    }
}

impl Target for Replicas {
    fn address(&self, client: usize) -> String {
        self.replicas[client % REPLICAS].address()
    }

    fn journal(&self) -> PathBuf {
        self.upstream.journal()
    }

    fn settle(&self) -> Duration {
        gateways::TTL + LEASE + Duration::from_secs(MAX_SKEW.unsigned_abs())
    }

    fn faults(&self) -> &'static [(FaultKind, u64)] {
        &[
            (FaultKind::Kill, 3),
            (FaultKind::Pause, 1),
            (FaultKind::PostgresFast, 1),
            (FaultKind::PostgresImmediate, 1),
            (FaultKind::Partition, 2),
            (FaultKind::ClockMove, 1),
            (FaultKind::UpstreamCrash, 1),
        ]
    }

    async fn inflict(&self, kind: FaultKind, mut rng: Rng) -> anyhow::Result<String> {
        let index = rng.below(REPLICAS as u64) as usize;
        match kind {
            FaultKind::Kill => self.replicas[index]
                .kill(rng.millis(0, 1500))
                .await
                .map(|note| format!("replica {index} {note}")),
            FaultKind::Pause => self.pause(index, rng.millis(16_000, 20_000)).await,
            FaultKind::PostgresFast => self.restart_database(false, rng.millis(0, 3000)).await,
            FaultKind::PostgresImmediate => self.restart_database(true, rng.millis(0, 3000)).await,
            FaultKind::Partition => {
                let cut = if rng.chance(0.3) {
                    rng.millis(16_000, 20_000)
                } else {
                    rng.millis(1000, 8000)
                };
                self.partition(index, cut).await
            }
            FaultKind::ClockMove => {
                let seconds = 3 + rng.below(MAX_SKEW as u64 - 2) as i64;
                let seconds = if rng.chance(0.5) { seconds } else { -seconds };
                self.move_clock(index, seconds, rng.millis(5000, 20_000)).await
            }
            FaultKind::UpstreamCrash => {
                let down = rng.millis(0, 1500);
                self.upstream
                    .crash(&self.replicas[index].address(), &self.client, down)
                    .await
            }
            other => Ok(format!("{} is not a fault of this topology", other.name())),
        }
    }

    async fn heal(&self) -> anyhow::Result<()> {
        // Every fault has ended by now (PostgreSQL runs again); what is left is what died meanwhile.
        for relay in &self.relays {
            relay.heal();
        }
        for replica in &self.replicas {
            replica.heal().await?;
        }
        self.upstream.heal().await?;
        for replica in &self.replicas {
            replica.ready(&self.client).await?;
        }
        Ok(())
    }

    async fn stop(&self) {
        for replica in &self.replicas {
            replica.stop().await;
        }
        self.upstream.stop().await;
    }
}
