//! What reads of live records answer without the database: the status and owner of every pending Request
//! and of every call that has not ended, and what pending Requests hold, as last kept. The writer updates it
//! once each change is kept.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use rusqlite::Connection;

use crate::records::{CallStatus, Status};
use crate::store::shares::Shares;

/// The live records' status and owner.
#[derive(Debug, Default)]
pub struct Live {
    /// Pending Requests.
    requests: HashMap<String, Holder>,
    /// The owners and servers of pending Requests, each name kept once.
    names: HashSet<Arc<str>>,
    /// What they hold.
    shares: Shares,
    /// Calls that have not ended, with their status and owner.
    calls: HashMap<String, (CallStatus, String)>,
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
        request: String,
        pending: PendingRequest,
    },
    Resolved(String),
    Call {
        call: String,
        status: CallStatus,
        owner: String,
    },
    Ended(String),
}

impl Live {
    /// Reads the live records of a database.
    pub fn load(conn: &Connection) -> rusqlite::Result<Self> {
        let mut live = Live::default();
        let mut statement = conn.prepare(
            "SELECT id, owner, server, coalesce(bytes, \
             length(CAST(prompt AS BLOB)) + coalesce(length(CAST(url AS BLOB)), 0) + coalesce(length(CAST(data AS BLOB)), 0)) \
             FROM requests WHERE status = 'pending'",
        )?;
        let requests = statement.query_map([], |row| {
            let pending = PendingRequest {
                owner: row.get(1)?,
                server: row.get(2)?,
                bytes: row.get::<_, i64>(3).map(|bytes| usize::try_from(bytes).unwrap_or(0))?,
            };
            Ok((row.get(0)?, pending))
        })?;
        for request in requests {
            let (id, pending): (String, PendingRequest) = request?;
            live.hold(id, pending);
        }
        let mut statement =
            conn.prepare("SELECT id, status, owner FROM calls WHERE status IN ('running', 'input_required')")?;
        let calls = statement.query_map([], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, String>(1)?,
                row.get::<_, String>(2)?,
            ))
        })?;
        for call in calls {
            let (id, status, owner) = call?;
            if let Some(status) = CallStatus::parse(&status) {
                live.calls.insert(id, (status, owner));
            }
        }
        Ok(live)
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
                    self.calls.insert(call, (status, owner));
                }
                Note::Ended(call) => {
                    self.calls.remove(&call);
                }
            }
        }
    }

    /// How many Requests are pending.
    pub fn pending(&self) -> usize {
        self.requests.len()
    }

    /// A pending Request's status and owner; `None` if it is not pending (or unknown).
    pub fn request(&self, id: &str) -> Option<(Status, Option<String>)> {
        self.requests
            .get(id)
            .map(|pending| (Status::Pending, pending.owner.as_deref().map(str::to_owned)))
    }

    /// Counts a pending Request.
    fn hold(&mut self, request: String, pending: PendingRequest) {
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

    /// A live call's status and owner; `None` if it has ended (or is unknown).
    pub fn call(&self, id: &str) -> Option<(CallStatus, String)> {
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
