//! What reads of live records answer without the database: the status and owner of every pending Request
//! and of every call that has not ended, as last kept. The writer updates it once each change is kept.

use std::collections::HashMap;

use rusqlite::Connection;

use crate::records::{CallStatus, Status};

/// The live records' status and owner.
#[derive(Debug, Default)]
pub struct Live {
    /// Pending Requests and their owners.
    requests: HashMap<String, Option<String>>,
    /// Calls that have not ended, with their status and owner.
    calls: HashMap<String, (CallStatus, String)>,
}

/// What one change does to the live records.
#[derive(Debug)]
pub enum Note {
    Pending {
        request: String,
        owner: Option<String>,
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
        let mut statement = conn.prepare("SELECT id, owner FROM requests WHERE status = 'pending'")?;
        let requests = statement.query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?;
        for request in requests {
            let (id, owner) = request?;
            live.requests.insert(id, owner);
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
                Note::Pending { request, owner } => {
                    self.requests.insert(request, owner);
                }
                Note::Resolved(request) => {
                    self.requests.remove(&request);
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
        self.requests.get(id).map(|owner| (Status::Pending, owner.clone()))
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
