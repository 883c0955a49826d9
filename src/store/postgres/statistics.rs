//! The planner's statistics of Requests and calls, taken again when pending Requests grow fast.
//!
//! PostgreSQL plans each statement on statistics that autovacuum refreshes about once a minute at best. Taken
//! while few Requests were pending, they make the partial indexes of pending Requests and of live calls look
//! empty, and a lookup by id then walks one of them whole: after a round of 20 000 Requests was raised, each
//! answer scanned the 20 000 entries of the index of pending deadlines, and drains ran at 600 answers/s instead
//! of several thousand, depending on whether autovacuum had come by (BENCHMARKS.md, "Store: PostgreSQL
//! statistics that follow the pending Requests").

use std::time::Duration;

use super::Postgres;
use crate::lock;

/// Growth below this many pending Requests never calls for new statistics.
const AT_LEAST: usize = 1000;
/// How long taking them may last before it is given up (and may be tried again).
const TAKING: Duration = Duration::from_secs(60);

/// When this replica last had the statistics taken, in pending Requests.
#[derive(Debug, Default)]
pub struct Statistics {
    /// The fewest Requests pending since the statistics were last taken, as this replica's raises saw them.
    low: usize,
    /// Whether they are being taken now.
    taking: bool,
}

impl Statistics {
    /// A raise took the pending Requests from `before` to `after`; whether the statistics should be taken
    /// again: once the pending Requests have more than doubled (and grown by [`AT_LEAST`]) since the fewest
    /// seen after they were last taken.
    fn raised(&mut self, before: usize, after: usize) -> bool {
        self.low = self.low.min(before);
        if self.taking || after < self.low.saturating_mul(2).saturating_add(AT_LEAST) {
            return false;
        }
        self.low = after;
        self.taking = true;
        true
    }
}

impl Postgres {
    /// A raise took the pending Requests from `before` to `after`: takes the statistics of Requests and calls
    /// again, on a connection of its own, when they have grown fast since they were last taken.
    pub(super) fn pending_grew(&self, before: usize, after: usize) {
        if !lock(&self.shared.statistics).raised(before, after) {
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            let analyze = async {
                let client = this.shared.connector.connect().await?;
                client
                    .batch_execute(&format!(
                        "SET statement_timeout = {}; ANALYZE requests, calls",
                        TAKING.as_millis()
                    ))
                    .await
            };
            tokio::select! {
                analyzed = tokio::time::timeout(TAKING, analyze) => match analyzed {
                    Ok(Ok(())) => {}
                    Ok(Err(error)) => tracing::warn!(%error, "the store could not refresh the planner's statistics"),
                    Err(_) => tracing::warn!("the store gave up refreshing the planner's statistics after a minute"),
                },
                () = this.shared.background.cancelled() => {}
            }
            lock(&this.shared.statistics).taking = false;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::{AT_LEAST, Statistics};

    #[test]
    fn statistics_are_taken_again_once_pending_requests_more_than_double() {
        let mut statistics = Statistics::default();
        assert!(!statistics.raised(0, AT_LEAST - 1), "below the floor");
        assert!(statistics.raised(AT_LEAST - 1, 20_000), "a large round");
        assert!(!statistics.raised(20_000, 40_000), "while they are being taken");
        statistics.taking = false;
        assert!(
            !statistics.raised(20_000, 40_000),
            "doubled, but not grown by the floor on top"
        );
        assert!(statistics.raised(40_000, 41_001));
        statistics.taking = false;
        // Drained, then raised again: growth counts from the fewest seen.
        assert!(!statistics.raised(10, 500));
        assert!(statistics.raised(500, 1_100));
    }
}
