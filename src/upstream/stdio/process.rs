//! A stdio server's child process: started as the leader of its own process group, closed in order, and its
//! whole group killed when it is dropped.

use std::collections::BTreeMap;
use std::io;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::process::{Child, ChildStdin, ChildStdout};

/// How long a closing server gets after its stdin closes, and again after `SIGTERM`, before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(3);

/// A server's child process, which leads its own process group.
pub struct Process {
    child: Child,
}

impl Process {
    /// Starts a server in its own process group (a Ctrl-C at the terminal reaches only the gateway, which
    /// then shuts it down in order), its stderr logged line by line under its name; returns it with its stdin
    /// and stdout.
    pub fn spawn(
        server: &str,
        program: &Path,
        args: &[String],
        env: &BTreeMap<String, String>,
    ) -> io::Result<(Self, ChildStdin, ChildStdout)> {
        let mut child = tokio::process::Command::new(program)
            .args(args)
            .envs(env)
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let stdin = child.stdin.take().ok_or_else(|| io::Error::other("no stdin pipe"))?;
        let stdout = child.stdout.take().ok_or_else(|| io::Error::other("no stdout pipe"))?;
        let stderr = child.stderr.take().ok_or_else(|| io::Error::other("no stderr pipe"))?;
        crate::upstream::stderr::follow(server, stderr);
        Ok((Self { child }, stdin, stdout))
    }

    /// Waits for the process to exit (its stdin closed), then sends its group `SIGTERM`, then kills it.
    pub async fn close(&mut self) -> io::Result<()> {
        if tokio::time::timeout(EXIT_GRACE, self.child.wait()).await.is_ok() {
            return Ok(());
        }
        self.signal_group(Signal::SIGTERM);
        if tokio::time::timeout(EXIT_GRACE, self.child.wait()).await.is_ok() {
            return Ok(());
        }
        self.signal_group(Signal::SIGKILL);
        self.child.wait().await.map(|_| ())
    }

    /// Signals the process group while the child has not been reaped (after that its id may be reused).
    fn signal_group(&mut self, signal: Signal) {
        if let (Ok(None), Some(id)) = (self.child.try_wait(), self.child.id())
            && let Ok(id) = i32::try_from(id)
        {
            let _ = killpg(Pid::from_raw(id), signal);
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        // `kill_on_drop` then kills and reaps the child itself.
        self.signal_group(Signal::SIGKILL);
    }
}
