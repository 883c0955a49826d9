//! What a start finds of the previous run (or a replica of one that is gone), and the SQL both engines share
//! to find it.

use crate::ids::{CallId, RequestId};
use crate::records::{CallError, CallFailure};

/// What a start found of the previous run, once it was put right.
#[derive(Debug, Default)]
pub struct Recovered {
    /// 2026-07-28 calls whose latest round is answered, to be retried.
    pub resumes: Vec<CallId>,
    /// Calls their approval holds, to be sent upstream once (and if) it is given.
    pub approvals: Vec<HeldCall>,
    /// How many Requests and calls could not survive and were ended.
    pub ended_requests: usize,
    pub ended_calls: usize,
    /// How many Requests are still pending.
    pub pending: usize,
}

impl Recovered {
    /// Adds what `more` recovered after this; its count of pending Requests is the later one.
    pub fn add(&mut self, more: Recovered) {
        self.resumes.extend(more.resumes);
        self.approvals.extend(more.approvals);
        self.ended_requests += more.ended_requests;
        self.ended_calls += more.ended_calls;
        self.pending = more.pending;
    }
}

/// A call its approval holds, which the upstream has not heard of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldCall {
    pub call: CallId,
    /// The approval Request.
    pub approval: RequestId,
}

/// The approval of a call `c` it holds that has not been sent upstream, in the SQL both engines share. A call
/// on a private session is not among them: its session ended with the process that opened it.
pub(crate) const HELD_BY_APPROVAL: &str = "(SELECT q.id FROM requests AS q \
     WHERE q.call_id = c.id AND c.shared AND c.forwarded_at IS NULL AND q.kind = 'approval' LIMIT 1)";

/// The approval of a call `c` that was claimed for sending (`forwarded_at`) when nothing from its upstream (an
/// elicitation of its own, a round) shows that the upstream had it: it may not have been sent.
pub(crate) const CLAIMED_UNHEARD: &str = "(SELECT q.id FROM requests AS q \
     WHERE q.call_id = c.id AND c.forwarded_at IS NOT NULL AND q.kind = 'approval' \
     AND NOT EXISTS (SELECT 1 FROM requests AS e WHERE e.call_id = c.id AND e.kind != 'approval') \
     AND NOT EXISTS (SELECT 1 FROM rounds AS r WHERE r.call_id = c.id) LIMIT 1)";

/// Why a call that was claimed for sending, but not known to have reached its upstream, is not sent again.
pub(crate) fn maybe_not_sent(stopped: &str) -> CallError {
    CallError {
        message: format!(
            "{stopped} after the approved call was handed to its session and before anything showed the upstream \
             had it: it may not have been sent, and it is not sent twice"
        ),
        reason: Some(CallFailure::MaybeNotSent),
    }
}
