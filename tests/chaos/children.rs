//! The runner's child processes, which never outlive it: each runs in a process group of its own (so that a
//! Ctrl-C in the terminal reaches the runner alone, which stops them in order), and a `sh` watchdog whose
//! standard input only the runner holds kills every group it was told of and removes the run's temp dir when
//! that input closes: however the runner ends, SIGKILL included. No `unsafe` is needed for it.

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::helpers::BINARY;

/// The gateway binary the runner drives: `CHAOS_GATEWAY` when set (another build, e.g. an older commit's for a
/// before and after), else the one `cargo test` built.
pub fn gateway_binary() -> PathBuf {
    std::env::var_os("CHAOS_GATEWAY").map_or_else(|| PathBuf::from(BINARY), PathBuf::from)
}

/// The watchdog, run as `sh -c WATCHDOG watchdog DIR`. It reads `group PGID` and `keep` lines; at the end of
/// its input it kills each group with SIGKILL and removes DIR unless told to keep it. It ignores the signals a
/// terminal sends, so that it outlives a runner stopped with Ctrl-C.
const WATCHDOG: &str = r#"
trap '' INT TERM HUP PIPE
dir=$1 keep= groups=
while read -r command argument; do
    case $command in
    group) groups="$groups $argument" ;;
    keep) keep=1 ;;
    esac
done
for group in $groups; do kill -KILL "-$group" 2>/dev/null; done
[ -n "$keep" ] || rm -rf -- "$dir"
"#;

/// The watchdog of one run's children and temp dir.
pub struct Watchdog {
    _child: std::process::Child,
    commands: Mutex<std::process::ChildStdin>,
}

impl Watchdog {
    /// Starts a watchdog that removes `dir` when the runner ends.
    pub fn start(dir: &Path) -> anyhow::Result<Self> {
        use std::os::unix::process::CommandExt;
        let mut child = std::process::Command::new("sh")
            .arg("-c")
            .arg(WATCHDOG)
            .arg("watchdog")
            .arg(dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .process_group(0)
            .spawn()
            .context("cannot start the watchdog (sh)")?;
        let commands = child.stdin.take().context("the watchdog's standard input")?;
        Ok(Self {
            _child: child,
            commands: Mutex::new(commands),
        })
    }

    /// Tells the watchdog to kill process group `group` when the runner ends.
    fn watch(&self, group: u32) {
        let _ = writeln!(self.commands.lock().unwrap(), "group {group}");
    }

    /// Tells the watchdog to leave the temp dir: the run failed and its history is kept.
    pub fn keep(&self) {
        let _ = writeln!(self.commands.lock().unwrap(), "keep");
    }
}

/// A child process in a group of its own, killed with its group when dropped.
pub struct Process {
    child: Child,
    pid: u32,
    /// The first line it printed on stdout (`listening on URL`), without the prefix.
    pub url: String,
}

impl Process {
    /// Starts the gateway binary with `args` and `env`, its stderr appended to `log`, and waits for `listening on`.
    pub async fn start(
        watchdog: &Watchdog,
        args: &[&str],
        env: &[(&'static str, OsString)],
        log: &Path,
    ) -> anyhow::Result<Self> {
        let log_file = std::fs::OpenOptions::new().create(true).append(true).open(log)?;
        let binary = gateway_binary();
        let mut child = Command::new(&binary)
            .args(args)
            .env("RUST_LOG", "info,rmcp=warn")
            .envs(env.iter().cloned())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {}", binary.display()))?;
        let pid = child.id().context("the child's pid")?;
        watchdog.watch(pid);
        // Through a pipe, not the file itself: a file-size limit put on the gateway must not reach its log.
        let mut stderr = child.stderr.take().context("stderr")?;
        tokio::spawn(async move {
            let mut log_file = tokio::fs::File::from_std(log_file);
            let _ = tokio::io::copy(&mut stderr, &mut log_file).await;
        });
        let mut stdout = BufReader::new(child.stdout.take().context("stdout")?).lines();
        let line = tokio::time::timeout(Duration::from_secs(60), stdout.next_line()).await;
        let url = match line {
            Ok(Ok(Some(line))) if line.starts_with("listening on ") => line["listening on ".len()..].trim().to_owned(),
            _ => {
                let _ = child.start_kill();
                bail!(
                    "{} {} did not start; see {}",
                    binary.display(),
                    args.join(" "),
                    log.display()
                )
            }
        };
        // Later lines are read and dropped, so that the child never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = stdout.next_line().await {} });
        Ok(Self { child, pid, url })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Kills the process group with SIGKILL and waits until the process is gone.
    pub async fn kill(&mut self) {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(self.pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
        let _ = self.child.wait().await;
    }

    /// Whether the process has not exited.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits up to `limit` for the process to exit by itself; whether it did.
    pub async fn exited_within(&mut self, limit: Duration) -> bool {
        tokio::time::timeout(limit, self.child.wait()).await.is_ok()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(self.pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// A temp dir for one run, removed by the watchdog unless kept.
pub fn run_dir() -> anyhow::Result<PathBuf> {
    let dir = tempfile::Builder::new().prefix("toolnexus-chaos-").tempdir()?;
    Ok(dir.keep())
}
