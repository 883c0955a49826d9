//! The live records of a SQLite database, read when it opens.

use rusqlite::Connection;

use crate::ids::CallId;
use crate::records::CallStatus;
use crate::store::live::{Live, Note, PendingRequest};

/// Reads the live records of a database.
pub fn load(conn: &Connection) -> rusqlite::Result<Live> {
    let mut notes = Vec::new();
    let mut statement = conn.prepare(
        "SELECT id, owner, coalesce(server, ''), coalesce(bytes, \
         length(CAST(prompt AS BLOB)) + coalesce(length(CAST(url AS BLOB)), 0) + coalesce(length(CAST(data AS BLOB)), 0)) \
         FROM requests WHERE status = 'pending'",
    )?;
    let requests = statement.query_map([], |row| {
        let pending = PendingRequest {
            owner: row.get(1)?,
            server: row.get(2)?,
            bytes: row.get::<_, i64>(3).map(|bytes| usize::try_from(bytes).unwrap_or(0))?,
        };
        Ok(Note::Pending {
            request: row.get(0)?,
            pending,
        })
    })?;
    for request in requests {
        notes.push(request?);
    }
    let mut statement =
        conn.prepare("SELECT id, status, owner FROM calls WHERE status IN ('running', 'input_required')")?;
    let calls = statement.query_map([], |row| {
        Ok((
            row.get::<_, CallId>(0)?,
            row.get::<_, String>(1)?,
            row.get::<_, String>(2)?,
        ))
    })?;
    for call in calls {
        let (call, status, owner) = call?;
        if let Some(status) = CallStatus::parse(&status) {
            notes.push(Note::Call { call, status, owner });
        }
    }
    Ok(Live::from_notes(notes))
}
