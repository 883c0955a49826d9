//! What reads of live records answer without the database: the status and owner of every pending Request
//! and of every call that has not ended, and what pending Requests hold, as last kept. The SQLite store loads
//! it when it opens (it is the one gateway using its file) and its writer updates it once each change is
//! kept; the PostgreSQL store, which other gateways may share, counts in the database instead.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::ids::{CallId, RequestId};
use crate::records::{CallStatus, Status};
use crate::store::shares::{Running, Shares};

/// The live records' status and owner.
#[derive(Debug, Default)]
pub struct Live {
    /// Pending Requests.
    requests: HashMap<RequestId, Holder>,
    /// The owners and servers of pending Requests, each name kept once.
    names: HashSet<Arc<str>>,
    /// What they hold.
    shares: Shares,
    /// Calls that have not ended, with their status and owner.
    calls: HashMap<CallId, (CallStatus, String)>,
    /// How many of them each owner has.
    running: Running,
}

/// A pending Request's owner, and what it holds.
#[derive(Debug)]
pub struct PendingRequest {
    pub owner: Option<String>,
    pub server: String,
    pub bytes: usize,
}

/// Whose a pending Request is, as kept here: its names shared with every other Request of theirs.
#[derive(Debug)]
struct Holder {
    owner: Option<Arc<str>>,
    server: Arc<str>,
    bytes: usize,
}

/// What one change does to the live records.
#[derive(Debug)]
pub enum Note {
    Pending {
        request: RequestId,
        pending: PendingRequest,
    },
    Resolved(RequestId),
    Call {
        call: CallId,
        status: CallStatus,
        owner: String,
    },
    Ended(CallId),
}

impl Live {
    /// The live records that `notes` (pending Requests and calls) describe.
    pub fn from_notes(notes: impl IntoIterator<Item = Note>) -> Self {
        let mut live = Live::default();
        live.apply(notes);
        live
    }

    /// Applies what kept changes did.
    pub fn apply(&mut self, notes: impl IntoIterator<Item = Note>) {
        for note in notes {
            match note {
                Note::Pending { request, pending } => self.hold(request, pending),
                Note::Resolved(request) => {
                    if let Some(gone) = self.requests.remove(&request) {
                        self.shares.remove(gone.owner.as_deref(), &gone.server, gone.bytes);
                    }
                }
                Note::Call { call, status, owner } => {
                    if !self.calls.contains_key(&call) {
                        self.running.start(&owner);
                    }
                    self.calls.insert(call, (status, owner));
                }
                Note::Ended(call) => {
                    if let Some((_, owner)) = self.calls.remove(&call) {
                        self.running.end(&owner);
                    }
                }
            }
        }
    }

    /// How many Requests are pending.
    pub fn pending(&self) -> usize {
        self.requests.len()
    }

    /// A pending Request's status and owner; `None` if it is not pending (or unknown).
    pub fn request(&self, id: &RequestId) -> Option<(Status, Option<String>)> {
        self.requests
            .get(id)
            .map(|pending| (Status::Pending, pending.owner.as_deref().map(str::to_owned)))
    }

    /// Counts a pending Request.
    fn hold(&mut self, request: RequestId, pending: PendingRequest) {
        self.shares
            .add(pending.owner.as_deref(), &pending.server, pending.bytes);
        let holder = Holder {
            owner: pending.owner.map(|owner| self.name(owner)),
            server: self.name(pending.server),
            bytes: pending.bytes,
        };
        self.requests.insert(request, holder);
    }

    /// The one copy of a name.
    fn name(&mut self, name: String) -> Arc<str> {
        if let Some(kept) = self.names.get(name.as_str()) {
            return kept.clone();
        }
        let kept: Arc<str> = name.into();
        self.names.insert(kept.clone());
        kept
    }

    /// What pending Requests hold.
    pub fn shares(&self) -> &Shares {
        &self.shares
    }

    /// How many calls that have not ended `owner` has.
    pub fn running(&self, owner: &str) -> usize {
        self.running.of(owner)
    }

    /// A live call's status and owner; `None` if it has ended (or is unknown).
    pub fn call(&self, id: &CallId) -> Option<(CallStatus, String)> {
        self.calls.get(id).cloned()
    }
}

/// How many more Requests `notes` leave pending (fewer when negative).
pub fn pending_delta(notes: &[Note]) -> isize {
    notes
        .iter()
        .map(|note| match note {
            Note::Pending { .. } => 1,
            Note::Resolved(_) => -1,
            _ => 0,
        })
        .sum()
}
