//! A CPU cgroup of its own for a benchmarked gateway (and the upstream servers it starts): a fixed share of one
//! core, as if it ran on a small machine of its own. cgroup v1's `cpu` controller under `/sys/fs/cgroup/cpu`,
//! else v2's `cpu.max`; creating one takes root.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

/// The scheduling period a quota is a part of, in microseconds.
const PERIOD_US: u64 = 100_000;

/// A CPU cgroup, removed on drop (once its processes have exited).
pub struct CpuGroup {
    dir: PathBuf,
    v2: bool,
}

impl CpuGroup {
    /// A new cgroup named `name`, without a limit yet.
    pub fn create(name: &str) -> anyhow::Result<Self> {
        let v1 = Path::new("/sys/fs/cgroup/cpu");
        let (root, v2) = if v1.join("cpu.cfs_quota_us").exists() {
            (v1.to_path_buf(), false)
        } else {
            let root = PathBuf::from("/sys/fs/cgroup");
            let controllers = std::fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
            if !controllers.split_whitespace().any(|controller| controller == "cpu") {
                bail!("no cgroup cpu controller (v1 /sys/fs/cgroup/cpu, or v2 with cpu)");
            }
            // A child gets the cpu controller only once its parent hands it down.
            std::fs::write(root.join("cgroup.subtree_control"), "+cpu").context("enabling the v2 cpu controller")?;
            (root, true)
        };
        let dir = root.join(name);
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("creating {} (the bench runs as root)", dir.display()))?;
        let group = Self { dir, v2 };
        group.limit(None)?;
        Ok(group)
    }

    /// Limits the cgroup to `cores` of CPU time (`0.3`: 30 ms of every 100 ms), or lifts the limit.
    pub fn limit(&self, cores: Option<f64>) -> anyhow::Result<()> {
        let quota = cores.map(|cores| (cores * PERIOD_US as f64).round() as u64);
        if self.v2 {
            let max = quota.map_or_else(|| "max".to_owned(), |quota| quota.to_string());
            std::fs::write(self.dir.join("cpu.max"), format!("{max} {PERIOD_US}"))?;
        } else {
            std::fs::write(self.dir.join("cpu.cfs_period_us"), PERIOD_US.to_string())?;
            let quota = quota.map_or_else(|| "-1".to_owned(), |quota| quota.to_string());
            std::fs::write(self.dir.join("cpu.cfs_quota_us"), quota)?;
        }
        Ok(())
    }

    /// The command that runs a program inside the cgroup: it moves its own shell in, then becomes the program.
    pub fn wrap(&self) -> Vec<String> {
        ["sh", "-c", r#"echo $$ > "$1/cgroup.procs" && shift && exec "$@""#, "sh"]
            .into_iter()
            .map(str::to_owned)
            .chain([self.dir.display().to_string()])
            .collect()
    }
}

impl Drop for CpuGroup {
    fn drop(&mut self) {
        // The gateway's upstream servers may exit just after it.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}
