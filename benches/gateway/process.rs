//! The gateway as a user runs it: the real binary with a temp config on `127.0.0.1:0`.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdout, Command};

use crate::rest::Rest;

/// Both protocol eras of the demo server, named after the era they speak.
pub const BOTH_ERAS: &str = r#"
[[servers]]
name = "modern"
builtin = "demo"

[[servers]]
name = "legacy"
builtin = "demo"
protocol = "2025-11-25"
"#;

/// The demo server alone, in the default era (auto, which reaches 2026-07-28).
pub const MODERN_ONLY: &str = r#"
[[servers]]
name = "modern"
builtin = "demo"
"#;

/// The demo server alone, pinned to 2025-11-25.
pub const LEGACY_ONLY: &str = r#"
[[servers]]
name = "legacy"
builtin = "demo"
protocol = "2025-11-25"
"#;

/// Where a benchmarked gateway keeps its state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    Memory,
    /// A SQLite file in the gateway's temp dir.
    Sqlite,
    /// A PostgreSQL database, by URL; gateways given the same one are replicas of one fleet.
    Postgres(String),
}

impl Backend {
    /// Its name in the report.
    pub fn name(&self) -> &'static str {
        match self {
            Backend::Memory => "memory",
            Backend::Sqlite => "sqlite",
            Backend::Postgres(_) => "postgres",
        }
    }
}

/// A running gateway process, stopped with SIGTERM on drop (killed if it does not exit within 10 s).
pub struct GatewayProcess {
    child: Child,
    /// The REST client bound to its address.
    pub rest: Rest,
    /// When the process was spawned.
    pub spawned: Instant,
    /// From spawn to the `listening on` line.
    pub listening_after: Duration,
    _stdout: BufReader<ChildStdout>,
    dir: Option<tempfile::TempDir>,
}

impl GatewayProcess {
    /// Spawns the binary with `servers` (TOML) and its state in memory, and waits for its `listening on` line.
    pub async fn spawn(binary: &Path, servers: &str) -> anyhow::Result<Self> {
        Self::spawn_in(binary, servers, &Backend::Memory, tempfile::tempdir()?).await
    }

    /// Spawns the binary with `servers` and the `backend` store, with its config (and SQLite file) in `dir`.
    /// `BENCH_WRAP="valgrind --tool=callgrind"` runs it under a profiler.
    pub async fn spawn_in(
        binary: &Path,
        servers: &str,
        backend: &Backend,
        dir: tempfile::TempDir,
    ) -> anyhow::Result<Self> {
        let wrap = std::env::var("BENCH_WRAP").unwrap_or_default();
        let wrap: Vec<String> = wrap.split_whitespace().map(str::to_owned).collect();
        Self::spawn_wrapped(binary, servers, backend, dir, &wrap).await
    }

    /// [`Self::spawn_in`], the binary run by the command `wrap` (its program and first arguments) when given.
    pub async fn spawn_wrapped(
        binary: &Path,
        servers: &str,
        backend: &Backend,
        dir: tempfile::TempDir,
        wrap: &[String],
    ) -> anyhow::Result<Self> {
        let config = dir.path().join("gateway.toml");
        // The scale rows hold more Requests than the default `requests.max_pending` (and their bytes), and the
        // waiting rows more calls than the default `limits.calls_per_principal`.
        let requests = "[requests]\nmax_pending = 1000000\nmax_pending_bytes = 4294967296\n\
                        [limits]\ncalls_per_principal = 1000000\n";
        let store = match backend {
            Backend::Memory => "memory".to_owned(),
            Backend::Sqlite => format!("sqlite:{}", dir.path().join("gateway.sqlite3").display()),
            Backend::Postgres(url) => url.clone(),
        };
        std::fs::write(
            &config,
            format!("listen = \"127.0.0.1:0\"\n{requests}{servers}\n[store]\nurl = \"{store}\"\n"),
        )?;
        let log = std::env::var_os("BENCH_LOG").is_some();
        let spawned = Instant::now();
        let mut words = wrap.iter();
        let mut command = match words.next() {
            Some(program) => {
                let mut command = Command::new(program);
                command.args(words).arg(binary);
                command
            }
            None => Command::new(binary),
        };
        let mut child = command
            .arg("--config")
            .arg(&config)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(if log { Stdio::inherit() } else { Stdio::null() })
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {}", binary.display()))?;
        let mut stdout = BufReader::new(child.stdout.take().context("no stdout")?);
        let mut line = String::new();
        stdout.read_line(&mut line).await?;
        // A wrapper (heaptrack) may print lines of its own first.
        while !wrap.is_empty() && !line.is_empty() && !line.starts_with("listening on ") {
            line.clear();
            stdout.read_line(&mut line).await?;
        }
        let listening_after = spawned.elapsed();
        let Some(address) = line.trim().strip_prefix("listening on ") else {
            bail!("the gateway's first line was {line:?}, not `listening on …`");
        };
        Ok(Self {
            child,
            rest: Rest::new(address),
            spawned,
            listening_after,
            _stdout: stdout,
            dir: Some(dir),
        })
    }

    /// Stops the gateway with SIGTERM, waits for it to exit, and hands back its directory (and store).
    pub async fn stop(mut self) -> anyhow::Result<tempfile::TempDir> {
        if let Some(pid) = self.child.id() {
            std::process::Command::new("kill")
                .arg("-TERM")
                .arg(pid.to_string())
                .status()?;
        }
        self.child.wait().await?;
        self.dir.take().context("the gateway's directory is gone")
    }

    /// Kills the gateway (`SIGKILL`): it says nothing to anyone on its way out.
    pub fn kill(&mut self) {
        let _ = self.child.start_kill();
    }

    /// Kills the upstream servers the gateway runs as its child processes (`SIGKILL`).
    pub fn kill_upstreams(&self) -> anyhow::Result<()> {
        let pid = self.child.id().context("the gateway has exited")?;
        // Each thread that spawned a child lists it.
        let mut children = String::new();
        for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
            children += &std::fs::read_to_string(task?.path().join("children")).unwrap_or_default();
        }
        ensure!(!children.trim().is_empty(), "the gateway runs no upstream server");
        for child in children.split_whitespace() {
            std::process::Command::new("kill").arg("-KILL").arg(child).status()?;
        }
        Ok(())
    }

    /// Waits until `GET /readyz` answers `200`; returns the time since spawn.
    pub async fn ready(&self) -> anyhow::Result<Duration> {
        let (status, body) = self.rest.get("/readyz?wait=30").await?;
        if status != 200 {
            bail!("not ready: {body}");
        }
        Ok(self.spawned.elapsed())
    }

    /// The gateway's resident set size in bytes (`VmRSS`).
    pub fn rss(&self) -> anyhow::Result<u64> {
        let pid = self.child.id().context("the gateway has exited")?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        let kib = status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .context("no VmRSS in /proc/<pid>/status")?;
        Ok(kib * 1024)
    }
}

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        let Some(pid) = self.child.id() else { return };
        let _ = std::process::Command::new("kill")
            .arg("-TERM")
            .arg(pid.to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = self.child.start_kill();
    }
}
