//! Topology 1: one gateway on a SQLite file, the demo server over HTTP as its upstream in both eras (a process
//! of its own, so that it outlives the gateway's kills and says what it received), and a webhook receiver.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use serde_json::json;

use crate::children::{Process, Watchdog};
use crate::history::{Fault, History};
use crate::nemesis::{FaultKind, Target};

/// How long a Request stays answerable: short, so that the run's end waits little for expiries.
pub const TTL: Duration = Duration::from_secs(8);
/// How long `/mcp` holds a `tools/call` waiting on a human.
pub const MAX_HOLD: Duration = Duration::from_secs(3);

/// One gateway on a SQLite file, and its upstream.
pub struct Sqlite {
    dir: PathBuf,
    watchdog: Arc<Watchdog>,
    gateway: tokio::sync::Mutex<Option<Process>>,
    demo: tokio::sync::Mutex<Option<Process>>,
    /// `127.0.0.1:PORT` the gateway listens on, the same after every restart.
    listen: String,
    /// `127.0.0.1:PORT` the demo server listens on, the same after every restart.
    demo_listen: String,
    client: reqwest::Client,
}

impl Sqlite {
    /// Starts the demo server, then the gateway on a new SQLite file in `dir`, posting webhooks to `receiver`.
    pub async fn start(dir: &Path, watchdog: Arc<Watchdog>, receiver: &str) -> anyhow::Result<Self> {
        let demo = start_demo(&watchdog, dir, "127.0.0.1:0").await?;
        let demo_listen = demo
            .url
            .trim_start_matches("http://")
            .trim_end_matches("/mcp")
            .to_owned();
        std::fs::write(dir.join("gateway.toml"), config(dir, &demo.url, receiver))?;
        let gateway = start_gateway(&watchdog, dir, "127.0.0.1:0").await?;
        let listen = gateway.url.trim_start_matches("http://").to_owned();
        let topology = Self {
            dir: dir.to_owned(),
            watchdog,
            gateway: tokio::sync::Mutex::new(Some(gateway)),
            demo: tokio::sync::Mutex::new(Some(demo)),
            listen,
            demo_listen,
            client: reqwest::Client::new(),
        };
        topology.ready().await?;
        Ok(topology)
    }

    /// Waits until the gateway says every server is ready.
    async fn ready(&self) -> anyhow::Result<()> {
        let url = format!("http://{}/readyz?wait=60", self.listen);
        let response = self.client.get(&url).timeout(Duration::from_secs(70)).send().await?;
        anyhow::ensure!(
            response.status() == 200,
            "the gateway is not ready: {}",
            response.text().await?
        );
        Ok(())
    }

    /// Kills the gateway with SIGKILL, and starts it again on the same file and port after `down`.
    async fn kill_gateway(&self, down: Duration) -> anyhow::Result<String> {
        let mut gateway = self.gateway.lock().await;
        if let Some(mut old) = gateway.take() {
            old.kill().await;
        }
        tokio::time::sleep(down).await;
        *gateway = Some(self.restart_gateway().await?);
        Ok(format!("down {} ms", down.as_millis()))
    }

    /// Starts the gateway on its port again; a port the kernel has not released yet is tried again.
    async fn restart_gateway(&self) -> anyhow::Result<Process> {
        let mut last = None;
        for _ in 0..20 {
            match start_gateway(&self.watchdog, &self.dir, &self.listen).await {
                Ok(gateway) => return Ok(gateway),
                Err(error) => last = Some(error),
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        Err(last.unwrap())
    }

    /// Limits the size of any file the gateway writes to 1 KiB for `fill` (every write to its store fails, as on a
    /// full disk), then lifts it, unless the gateway was restarted meanwhile.
    async fn fill_disk(&self, fill: Duration) -> anyhow::Result<String> {
        let pid = self.gateway.lock().await.as_ref().map(Process::pid);
        let Some(pid) = pid else {
            return Ok("no gateway".to_owned());
        };
        limit_file_size(pid, "1024")?;
        tokio::time::sleep(fill).await;
        let gateway = self.gateway.lock().await;
        if gateway.as_ref().map(Process::pid) == Some(pid) {
            limit_file_size(pid, "unlimited")?;
            Ok(format!("full for {} ms", fill.as_millis()))
        } else {
            Ok(format!(
                "full until the gateway was restarted, within {} ms",
                fill.as_millis()
            ))
        }
    }

    /// Crashes the upstream in the middle of a round: a call of the demo's `crash` tool through the gateway
    /// (it sends an elicitation, then the process exits), else SIGKILL; it comes back on its port after `down`.
    async fn crash_upstream(&self, server: &str, down: Duration) -> anyhow::Result<String> {
        let mut demo = self.demo.lock().await;
        let crash = json!({"server": server, "tool": "crash", "arguments": {}});
        let sent = self
            .client
            .post(format!("http://{}/calls", self.listen))
            .json(&crash)
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .map(|response| response.status().as_u16());
        let mut how = format!("crash through {server}: {sent:?}");
        if let Some(process) = demo.as_mut()
            && !process.exited_within(Duration::from_secs(3)).await
        {
            how.push_str(", then SIGKILL");
        }
        if let Some(mut process) = demo.take() {
            process.kill().await;
        }
        tokio::time::sleep(down).await;
        let mut last = None;
        for _ in 0..20 {
            match start_demo(&self.watchdog, &self.dir, &self.demo_listen).await {
                Ok(process) => {
                    *demo = Some(process);
                    return Ok(format!("{how}; down {} ms", down.as_millis()));
                }
                Err(error) => last = Some(error),
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        Err(last.unwrap())
    }

    /// Stops every child.
    pub async fn stop(&self) {
        if let Some(mut gateway) = self.gateway.lock().await.take() {
            gateway.kill().await;
        }
        if let Some(mut demo) = self.demo.lock().await.take() {
            demo.kill().await;
        }
    }
}

impl Target for Sqlite {
    fn address(&self, _client: usize) -> String {
        format!("http://{}", self.listen)
    }

    fn journal(&self) -> PathBuf {
        self.dir.join("journal.jsonl")
    }

    fn faults(&self) -> &'static [(FaultKind, u64)] {
        &[
            (FaultKind::Kill, 4),
            (FaultKind::DiskFull, 4),
            (FaultKind::UpstreamCrash, 1),
        ]
    }

    async fn inflict(&self, kind: FaultKind, mut rng: crate::random::Rng, history: &History) {
        let start = history.now();
        let done = match kind {
            FaultKind::Kill => self.kill_gateway(rng.millis(0, 1500)).await,
            FaultKind::DiskFull => self.fill_disk(rng.millis(500, 5000)).await,
            // Through the 2025-11-25 server, whose elicitation dies with the process: a 2026-07-28 round of
            // `crash` outlives it, and its retry (at the latest with `cancel` at its expiry) would crash the next
            // process too. Both eras' sessions are on the one process that crashes.
            FaultKind::UpstreamCrash => self.crash_upstream("legacy", rng.millis(0, 1500)).await,
        };
        let note = match done {
            Ok(note) => note,
            Err(error) => format!("failed: {error:#}"),
        };
        history.fault(Fault {
            fault: kind.name().to_owned(),
            start,
            end: history.now(),
            note: Some(note),
        });
    }

    async fn heal(&self) -> anyhow::Result<()> {
        {
            let mut gateway = self.gateway.lock().await;
            let running = gateway.as_mut().map(|process| (process.running(), process.pid()));
            match running {
                Some((true, pid)) => limit_file_size(pid, "unlimited")?,
                _ => *gateway = Some(self.restart_gateway().await?),
            }
        }
        {
            let mut demo = self.demo.lock().await;
            if !demo.as_mut().is_some_and(Process::running) {
                *demo = Some(start_demo(&self.watchdog, &self.dir, &self.demo_listen).await?);
            }
        }
        self.ready().await
    }
}

/// The gateway's config: the demo server in both eras over HTTP, `echo` held for approval, every event posted
/// to the receiver, short expiries.
fn config(dir: &Path, demo: &str, receiver: &str) -> String {
    format!(
        r#"[store]
url = "sqlite:{store}"

[requests]
ttl = "{ttl}s"

[front_door]
max_hold = "{hold}s"

[[servers]]
name = "legacy"
url = "{demo}"
protocol = "2025-11-25"

[[servers]]
name = "modern"
url = "{demo}"
protocol = "2026-07-28"

[[approvals]]
server = "*"
tools = ["echo"]

[[webhooks]]
name = "chaos"
url = "{receiver}"
attempts = 8
timeout = "2s"
"#,
        store = dir.join("gateway.sqlite3").display(),
        ttl = TTL.as_secs(),
        hold = MAX_HOLD.as_secs(),
    )
}

async fn start_gateway(watchdog: &Watchdog, dir: &Path, listen: &str) -> anyhow::Result<Process> {
    let config = dir.join("gateway.toml");
    let config = config.to_str().context("a UTF-8 temp dir")?;
    Process::start(
        watchdog,
        &["--config", config, "--listen", listen],
        &dir.join("gateway.log"),
    )
    .await
}

async fn start_demo(watchdog: &Watchdog, dir: &Path, listen: &str) -> anyhow::Result<Process> {
    let journal = dir.join("journal.jsonl");
    let journal = journal.to_str().context("a UTF-8 temp dir")?;
    let args = ["demo-server", "--http", listen, "--journal", journal];
    Process::start(watchdog, &args, &dir.join("demo.log")).await
}

/// Sets the soft limit on the size of a file process `pid` writes (`unlimited`, or bytes).
fn limit_file_size(pid: u32, soft: &str) -> anyhow::Result<()> {
    let status = std::process::Command::new("prlimit")
        .arg("--pid")
        .arg(pid.to_string())
        .arg(format!("--fsize={soft}:unlimited"))
        .stderr(std::process::Stdio::null())
        .status()
        .context("prlimit (util-linux) does not run")?;
    anyhow::ensure!(status.success(), "prlimit --pid {pid} failed");
    Ok(())
}
