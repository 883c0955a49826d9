//! Topology 1: one gateway on a SQLite file, the demo server over HTTP as its upstream in both eras, and a
//! webhook receiver. Nemeses: `kill -9`, a full disk, an upstream crash.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::children::Watchdog;
use crate::gateways::{self, Gateway, Upstream, limit_file_size};
use crate::nemesis::{FaultKind, Target};
use crate::random::Rng;

/// One gateway on a SQLite file, and its upstream.
pub struct Sqlite {
    gateway: Gateway,
    upstream: Upstream,
    client: reqwest::Client,
}

impl Sqlite {
    /// Starts the demo server, then the gateway on a new SQLite file in `dir`, posting webhooks to `receiver`.
    pub async fn start(dir: &Path, watchdog: Arc<Watchdog>, receiver: &str) -> anyhow::Result<Self> {
        let upstream = Upstream::start(dir, watchdog.clone()).await?;
        let store = format!("sqlite:{}", dir.join("gateway.sqlite3").display());
        let config = gateways::config("", &store, &upstream.url, receiver);
        let gateway = Gateway::start(dir, watchdog, &config, None).await?;
        let client = reqwest::Client::new();
        gateway.ready(&client).await?;
        Ok(Self {
            gateway,
            upstream,
            client,
        })
    }

    /// Limits the size of any file the gateway writes to 1 KiB for `fill` (every write to its store fails, as on a
    /// full disk), then lifts it, unless the gateway was restarted meanwhile.
    async fn fill_disk(&self, fill: Duration) -> anyhow::Result<String> {
        let Some(pid) = self.gateway.pid().await else {
            return Ok("no gateway".to_owned());
        };
        if !self.gateway.if_still(pid, |pid| limit_file_size(pid, "1024")).await? {
            return Ok("the gateway was restarting".to_owned());
        }
        tokio::time::sleep(fill).await;
        if self
            .gateway
            .if_still(pid, |pid| limit_file_size(pid, "unlimited"))
            .await?
        {
            Ok(format!("full for {} ms", fill.as_millis()))
        } else {
            Ok(format!(
                "full until the gateway was restarted, within {} ms",
                fill.as_millis()
            ))
        }
    }

    /// Stops every child.
    pub async fn stop(&self) {
        self.gateway.stop().await;
        self.upstream.stop().await;
    }
}

impl Target for Sqlite {
    fn address(&self, _client: usize) -> String {
        self.gateway.address()
    }

    fn journal(&self) -> PathBuf {
        self.upstream.journal()
    }

    fn settle(&self) -> Duration {
        gateways::TTL
    }

    fn faults(&self) -> &'static [(FaultKind, u64)] {
        &[
            (FaultKind::Kill, 4),
            (FaultKind::DiskFull, 4),
            (FaultKind::UpstreamCrash, 1),
        ]
    }

    async fn inflict(&self, kind: FaultKind, mut rng: Rng) -> anyhow::Result<String> {
        match kind {
            FaultKind::Kill => self.gateway.kill(rng.millis(0, 1500)).await,
            FaultKind::DiskFull => self.fill_disk(rng.millis(500, 5000)).await,
            FaultKind::UpstreamCrash => {
                let down = rng.millis(0, 1500);
                self.upstream.crash(&self.gateway.address(), &self.client, down).await
            }
            other => Ok(format!("{} is not a fault of this topology", other.name())),
        }
    }

    async fn heal(&self) -> anyhow::Result<()> {
        self.gateway.heal().await?;
        self.upstream.heal().await?;
        self.gateway.ready(&self.client).await
    }

    async fn stop(&self) {
        Sqlite::stop(self).await;
    }
}
