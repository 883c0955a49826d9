//! What an upstream reports about a call while it works on it (its progress, its log messages), handed to
//! whoever follows that call.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

#[allow(deprecated, reason = "2025-11-25 clients still get an upstream's log messages")]
use rmcp::model::LoggingMessageNotificationParam;
use tokio::sync::mpsc;

use crate::ids::CallId;
use crate::lock;

/// One report of an upstream about a call.
#[derive(Debug, Clone, PartialEq)]
pub enum Report {
    Progress(Progress),
    /// A `notifications/message` (2025-11-25; protocol 2026-07-28 has no logging).
    #[allow(deprecated, reason = "2025-11-25 clients still get an upstream's log messages")]
    Log(LoggingMessageNotificationParam),
}

/// The upstream's `notifications/progress`.
#[derive(Debug, Clone, PartialEq)]
pub struct Progress {
    pub progress: f64,
    pub total: Option<f64>,
    pub message: Option<String>,
}

/// The follower of a call: its number, and where its reports go.
type Follower = (u64, mpsc::UnboundedSender<Report>);

/// The followers of calls, each call followed by at most one (the latest).
#[derive(Debug, Clone, Default)]
pub struct Reports {
    followers: Arc<Mutex<HashMap<CallId, Follower>>>,
    next: Arc<AtomicU64>,
}

impl Reports {
    /// Follows a call's reports until the returned value is dropped.
    pub fn follow(&self, call: &CallId) -> Following {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (sender, receiver) = mpsc::unbounded_channel();
        lock(&self.followers).insert(call.clone(), (id, sender));
        Following {
            reports: self.clone(),
            call: call.clone(),
            id,
            receiver,
        }
    }

    /// Hands a report to the call's follower, if it has one.
    pub fn report(&self, call: &CallId, report: Report) {
        if let Some((_, follower)) = lock(&self.followers).get(call) {
            let _ = follower.send(report);
        }
    }
}

/// The reports about one call, while this lives.
#[derive(Debug)]
pub struct Following {
    reports: Reports,
    call: CallId,
    id: u64,
    receiver: mpsc::UnboundedReceiver<Report>,
}

impl Following {
    /// The next report.
    pub async fn next(&mut self) -> Option<Report> {
        self.receiver.recv().await
    }
}

impl Drop for Following {
    fn drop(&mut self) {
        let mut followers = lock(&self.reports.followers);
        if followers.get(&self.call).is_some_and(|(id, _)| *id == self.id) {
            followers.remove(&self.call);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progress(progress: f64) -> Report {
        Report::Progress(Progress {
            progress,
            total: None,
            message: None,
        })
    }

    #[tokio::test]
    async fn a_report_reaches_the_latest_follower_of_its_call_only() {
        let reports = Reports::default();
        let first = reports.follow(&CallId::stored("call-1"));
        let mut latest = reports.follow(&CallId::stored("call-1"));
        let mut other = reports.follow(&CallId::stored("call-2"));
        reports.report(&CallId::stored("call-1"), progress(1.0));
        assert_eq!(latest.next().await, Some(progress(1.0)));
        drop(first);
        reports.report(&CallId::stored("call-1"), progress(2.0));
        assert_eq!(
            latest.next().await,
            Some(progress(2.0)),
            "dropping an older follower keeps the latest"
        );
        drop(latest);
        reports.report(&CallId::stored("call-1"), progress(3.0));
        assert!(lock(&reports.followers).get(&CallId::stored("call-1")).is_none());
        reports.report(&CallId::stored("call-2"), progress(4.0));
        assert_eq!(other.next().await, Some(progress(4.0)));
    }
}
