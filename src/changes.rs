//! One change feed for the whole gateway: every state change bumps a version, and long-polls wait on it.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// A version counter bumped on every change to Requests, Calls or Sessions.
#[derive(Debug, Clone)]
pub struct Changes(Arc<watch::Sender<u64>>);

impl Default for Changes {
    fn default() -> Self {
        Self(Arc::new(watch::Sender::new(0)))
    }
}

impl Changes {
    /// Records that something changed and wakes every waiter.
    pub fn notify(&self) {
        self.0.send_modify(|version| *version = version.wrapping_add(1));
    }

    /// A receiver that wakes on every change after now.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.0.subscribe()
    }

    /// How many waits are in progress (long-polls held by `wait=`).
    pub fn waiters(&self) -> usize {
        self.0.receiver_count()
    }

    /// Re-evaluates `check` after every change until it yields a value, `wait` passes, or `shutdown` fires.
    ///
    /// `check` runs at least once, so a zero `wait` is a plain read.
    pub async fn wait_for<T>(
        &self,
        wait: Duration,
        shutdown: &CancellationToken,
        mut check: impl FnMut() -> Option<T>,
    ) -> Option<T> {
        let deadline = Instant::now() + wait;
        let mut versions = self.0.subscribe();
        loop {
            if let Some(found) = check() {
                return Some(found);
            }
            // A timer for a deadline already due still waits for the next tick (about 1 ms).
            if Instant::now() >= deadline {
                return None;
            }
            tokio::select! {
                changed = versions.changed() => if changed.is_err() { return None },
                () = tokio::time::sleep_until(deadline) => return None,
                () = shutdown.cancelled() => return None,
            }
        }
    }
}
