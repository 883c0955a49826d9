//! The live records of a PostgreSQL database, read when it opens.

use tokio_postgres::Client;

use crate::records::CallStatus;
use crate::store::live::{Live, Note, PendingRequest};

/// Reads the live records of a database.
pub async fn load(client: &Client) -> Result<Live, tokio_postgres::Error> {
    let mut notes = Vec::new();
    let requests = client
        .query(
            "SELECT id, owner, server, bytes FROM requests WHERE status = 'pending'",
            &[],
        )
        .await?;
    for row in requests {
        let pending = PendingRequest {
            owner: row.try_get(1)?,
            server: row.try_get(2)?,
            bytes: usize::try_from(row.try_get::<_, i64>(3)?).unwrap_or(0),
        };
        notes.push(Note::Pending {
            request: row.try_get(0)?,
            pending,
        });
    }
    let calls = client
        .query(
            "SELECT id, status, owner FROM calls WHERE status IN ('running', 'input_required')",
            &[],
        )
        .await?;
    for row in calls {
        let status: String = row.try_get(1)?;
        if let Some(status) = CallStatus::parse(&status) {
            notes.push(Note::Call {
                call: row.try_get(0)?,
                status,
                owner: row.try_get(2)?,
            });
        }
    }
    Ok(Live::from_notes(notes))
}
