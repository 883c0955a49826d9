//! A replica's wall clock, moved: each replica runs with libfaketime preloaded (Debian's `faketime` package),
//! which takes the offset of the wall clock from a file the runner rewrites, read again at most once a second.
//! Monotonic time is left alone, so that timers and timeouts run at the pace they would on a skewed machine.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// Where Debian and a build from source put libfaketime's thread-safe library.
const LIBRARIES: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1",
    "/usr/local/lib/faketime/libfaketimeMT.so.1",
];

/// libfaketime's library, or what to do about its absence.
pub fn library() -> Result<PathBuf, String> {
    LIBRARIES
        .iter()
        .map(PathBuf::from)
        .find(|path| path.is_file())
        .ok_or_else(|| "libfaketime is missing: apt-get install faketime".to_owned())
}

/// The offset of one process's wall clock.
pub struct Skew {
    library: PathBuf,
    file: PathBuf,
}

impl Skew {
    /// A clock at the right time, its offset kept in `dir`.
    pub fn new(dir: &Path) -> anyhow::Result<Self> {
        let skew = Self {
            library: library().map_err(anyhow::Error::msg)?,
            file: dir.join("clock-offset"),
        };
        skew.set(0)?;
        Ok(skew)
    }

    /// The environment that makes a process read this clock.
    pub fn env(&self) -> Vec<(&'static str, OsString)> {
        vec![
            ("LD_PRELOAD", self.library.clone().into_os_string()),
            ("FAKETIME_TIMESTAMP_FILE", self.file.clone().into_os_string()),
            ("FAKETIME_CACHE_DURATION", "1".into()),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1".into()),
        ]
    }

    /// Moves the clock to `seconds` from the true time (before it when negative).
    pub fn set(&self, seconds: i64) -> anyhow::Result<()> {
        std::fs::write(&self.file, format!("{seconds:+}s\n"))?;
        Ok(())
    }
}
