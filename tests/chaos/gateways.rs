//! The processes a topology is made of: a gateway that comes back on its file (or database) and port after
//! each kill, and the upstream — the demo server over HTTP, in a process of its own so that it outlives the
//! gateways and its journal says what it received — that comes back on its port after each crash.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use serde_json::json;

use crate::children::{Process, Watchdog};
use crate::clock::Skew;

/// How long a Request stays answerable: short, so that the run's end waits little for expiries.
pub const TTL: Duration = Duration::from_secs(8);
/// How long `/mcp` holds a `tools/call` waiting on a human.
pub const MAX_HOLD: Duration = Duration::from_secs(3);
/// How many times a process that does not start (its port not released yet) is started again.
const STARTS: usize = 20;

/// A gateway process that can be killed and started again on the same config and port.
pub struct Gateway {
    /// Its config, logs and (SQLite) store.
    dir: PathBuf,
    watchdog: Arc<Watchdog>,
    process: tokio::sync::Mutex<Option<Process>>,
    /// `127.0.0.1:PORT` it listens on, the same after every restart.
    pub listen: String,
    /// Its wall clock, when the runner may move it.
    pub clock: Option<Skew>,
}

impl Gateway {
    /// Writes `config` into `dir` and starts the gateway on it, on a free port, reading `clock` when given.
    pub async fn start(dir: &Path, watchdog: Arc<Watchdog>, config: &str, clock: Option<Skew>) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("gateway.toml"), config)?;
        let env = clock.as_ref().map(Skew::env).unwrap_or_default();
        let process = start_gateway(&watchdog, dir, "127.0.0.1:0", &env).await?;
        let listen = process.url.trim_start_matches("http://").to_owned();
        Ok(Self {
            dir: dir.to_owned(),
            watchdog,
            process: tokio::sync::Mutex::new(Some(process)),
            listen,
            clock,
        })
    }

    /// Its base URL.
    pub fn address(&self) -> String {
        format!("http://{}", self.listen)
    }

    /// Its process id while it runs.
    pub async fn pid(&self) -> Option<u32> {
        self.process.lock().await.as_ref().map(Process::pid)
    }

    /// Kills it with SIGKILL, and starts it again after `down`.
    pub async fn kill(&self, down: Duration) -> anyhow::Result<String> {
        let mut process = self.process.lock().await;
        if let Some(mut old) = process.take() {
            old.kill().await;
        }
        tokio::time::sleep(down).await;
        *process = Some(self.restart().await?);
        Ok(format!("down {} ms", down.as_millis()))
    }

    /// Starts it again should it exit by itself within `within`, as a supervisor (a container's restart policy)
    /// would: a replica that finds the others took it for gone exits. Says which it did.
    pub async fn restart_if_it_exits(&self, within: Duration) -> anyhow::Result<&'static str> {
        let mut process = self.process.lock().await;
        let Some(running) = process.as_mut() else {
            return Ok("it was not running");
        };
        if !running.exited_within(within).await {
            return Ok("it went on");
        }
        *process = Some(self.restart().await?);
        Ok("it exited and was started again")
    }

    /// Starts it again on its port.
    async fn restart(&self) -> anyhow::Result<Process> {
        let env = self.clock.as_ref().map(Skew::env).unwrap_or_default();
        again(|| start_gateway(&self.watchdog, &self.dir, &self.listen, &env)).await
    }

    /// Runs `change` on its process if it runs and is still `pid`; whether it did.
    pub async fn if_still(&self, pid: u32, change: impl FnOnce(u32) -> anyhow::Result<()>) -> anyhow::Result<bool> {
        let process = self.process.lock().await;
        if process.as_ref().map(Process::pid) != Some(pid) {
            return Ok(false);
        }
        change(pid)?;
        Ok(true)
    }

    /// Makes sure it runs (started again if it died), whatever was done to it, lifts its file-size limit and
    /// sets its clock right.
    pub async fn heal(&self) -> anyhow::Result<()> {
        if let Some(clock) = &self.clock {
            clock.set(0)?;
        }
        let mut process = self.process.lock().await;
        let running = process.as_mut().map(|process| (process.running(), process.pid()));
        match running {
            Some((true, pid)) => {
                signal(pid, nix::sys::signal::Signal::SIGCONT)?;
                limit_file_size(pid, "unlimited")?;
            }
            _ => *process = Some(self.restart().await?),
        }
        Ok(())
    }

    /// Waits until it says every server is ready.
    pub async fn ready(&self, client: &reqwest::Client) -> anyhow::Result<()> {
        let url = format!("{}/readyz?wait=60", self.address());
        let response = client.get(&url).timeout(Duration::from_secs(70)).send().await?;
        anyhow::ensure!(
            response.status() == 200,
            "the gateway at {} is not ready: {}",
            self.listen,
            response.text().await?
        );
        Ok(())
    }

    /// Stops it.
    pub async fn stop(&self) {
        if let Some(mut process) = self.process.lock().await.take() {
            process.kill().await;
        }
    }
}

/// The demo server over HTTP, which comes back on its port after each crash.
pub struct Upstream {
    dir: PathBuf,
    watchdog: Arc<Watchdog>,
    process: tokio::sync::Mutex<Option<Process>>,
    /// `127.0.0.1:PORT` it listens on, the same after every restart.
    listen: String,
    /// Its `/mcp` URL.
    pub url: String,
}

impl Upstream {
    /// Starts the demo server, journaling into `dir`.
    pub async fn start(dir: &Path, watchdog: Arc<Watchdog>) -> anyhow::Result<Self> {
        let process = start_demo(&watchdog, dir, "127.0.0.1:0").await?;
        let url = process.url.clone();
        let listen = url.trim_start_matches("http://").trim_end_matches("/mcp").to_owned();
        Ok(Self {
            dir: dir.to_owned(),
            watchdog,
            process: tokio::sync::Mutex::new(Some(process)),
            listen,
            url,
        })
    }

    /// The journal of what it received, across its restarts.
    pub fn journal(&self) -> PathBuf {
        self.dir.join("journal.jsonl")
    }

    /// Crashes it in the middle of a round: a call of its `crash` tool through the gateway at `gateway`, on the
    /// 2025-11-25 server (it sends an elicitation, then the process exits), else SIGKILL; it comes back on its
    /// port after `down`. Not through the 2026-07-28 server: that round outlives the process, and its retry (at
    /// the latest with `cancel` at its expiry) would crash the next process too.
    pub async fn crash(&self, gateway: &str, client: &reqwest::Client, down: Duration) -> anyhow::Result<String> {
        let mut process = self.process.lock().await;
        let crash = json!({"server": "legacy", "tool": "crash", "arguments": {}});
        let sent = client
            .post(format!("{gateway}/calls"))
            .json(&crash)
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .map(|response| response.status().as_u16());
        let mut how = format!("crash through legacy: {sent:?}");
        if let Some(running) = process.as_mut()
            && !running.exited_within(Duration::from_secs(3)).await
        {
            how.push_str(", then SIGKILL");
        }
        if let Some(mut old) = process.take() {
            old.kill().await;
        }
        tokio::time::sleep(down).await;
        *process = Some(self.restart().await?);
        Ok(format!("{how}; down {} ms", down.as_millis()))
    }

    /// Starts it again on its port.
    async fn restart(&self) -> anyhow::Result<Process> {
        again(|| start_demo(&self.watchdog, &self.dir, &self.listen)).await
    }

    /// Makes sure it runs.
    pub async fn heal(&self) -> anyhow::Result<()> {
        let mut process = self.process.lock().await;
        if !process.as_mut().is_some_and(Process::running) {
            *process = Some(self.restart().await?);
        }
        Ok(())
    }

    /// Stops it.
    pub async fn stop(&self) {
        if let Some(mut process) = self.process.lock().await.take() {
            process.kill().await;
        }
    }
}

/// A gateway's config: `store` (`sqlite:…` or `postgres://…`) and `settings` (top-level keys), the demo
/// server in both eras over HTTP, `echo` held for approval, every event posted to the receiver, short expiries.
pub fn config(settings: &str, store: &str, demo: &str, receiver: &str) -> String {
    format!(
        r#"{settings}
[store]
url = "{store}"

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
        ttl = TTL.as_secs(),
        hold = MAX_HOLD.as_secs(),
    )
}

/// Starts a process again with `start`, trying again while its port is not released yet by the kernel.
async fn again<F: Future<Output = anyhow::Result<Process>>>(start: impl Fn() -> F) -> anyhow::Result<Process> {
    let mut last = None;
    for _ in 0..STARTS {
        match start().await {
            Ok(process) => return Ok(process),
            Err(error) => last = Some(error),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Err(last.expect("at least one start"))
}

async fn start_gateway(
    watchdog: &Watchdog,
    dir: &Path,
    listen: &str,
    env: &[(&'static str, OsString)],
) -> anyhow::Result<Process> {
    let config = dir.join("gateway.toml");
    let config = config.to_str().context("a UTF-8 temp dir")?;
    Process::start(
        watchdog,
        &["--config", config, "--listen", listen],
        env,
        &dir.join("gateway.log"),
    )
    .await
}

async fn start_demo(watchdog: &Watchdog, dir: &Path, listen: &str) -> anyhow::Result<Process> {
    let journal = dir.join("journal.jsonl");
    let journal = journal.to_str().context("a UTF-8 temp dir")?;
    let args = ["demo-server", "--http", listen, "--journal", journal];
    Process::start(watchdog, &args, &[], &dir.join("demo.log")).await
}

/// Sets the soft limit on the size of a file process `pid` writes (`unlimited`, or bytes).
pub fn limit_file_size(pid: u32, soft: &str) -> anyhow::Result<()> {
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

/// Sends `signal` to process `pid`.
pub fn signal(pid: u32, signal: nix::sys::signal::Signal) -> anyhow::Result<()> {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), signal)
        .with_context(|| format!("cannot send {signal} to {pid}"))
}
