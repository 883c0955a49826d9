//! Standing grants. Under PostgreSQL each change runs alongside other replicas' changes: a use updates its grant
//! by id on the condition that it still holds, which under READ COMMITTED is checked again on the newest version
//! of the row, so that a revocation that commits first is never overtaken.

use super::run::{Change, Run};
use crate::ids::GrantId;
use crate::records::{CallView, Event, EventKind, GrantView, NewGrant};
use crate::store::rows;
use crate::store::sql;
use crate::suspension::Lasting;

/// Gives the grant an approval asked for, or reads the one it gave before.
pub async fn give<C: Change>(tx: &mut C, grant: NewGrant) -> Result<GrantView, C::Error> {
    let view = grant.view(tx.now());
    let given = tx
        .execute(
            &sql::GRANT_GIVEN,
            &[
                &view.id,
                &view.request,
                &view.owner,
                &view.server,
                &view.tool,
                &view.scope.as_str(),
                &view.digest,
                &rows::to_json(&view.lasting),
                &view.session,
                &view.expires_at.map(|end| end.millis()),
                &view.by,
                &view.created_at.millis(),
            ],
        )
        .await?;
    if given == 1 {
        tx.record(Event::grant(EventKind::GrantCreated, &view)).await?;
        return Ok(view);
    }
    tx.one_row(&sql::GRANT_OF_REQUEST, &[&view.request]).await
}

/// Uses the oldest grant that holds, covers `call` and lasts as one of `offered`.
pub async fn used<C: Change>(
    tx: &mut C,
    call: CallView,
    digest: String,
    offered: Vec<Lasting>,
) -> Result<Option<GrantView>, C::Error> {
    let now = tx.now().millis();
    let covering: Vec<GrantView> = tx
        .rows(
            &sql::GRANTS_COVERING,
            &[
                &call.owner,
                &call.server,
                &call.tool,
                &digest,
                &call.session,
                &now,
                &sql::COVERING,
            ],
        )
        .await?;
    let Some(grant) = covering.iter().find(|grant| offered.contains(&grant.lasting)) else {
        return Ok(None);
    };
    let used: Option<GrantView> = tx.row(&sql::GRANT_USED, &[&grant.id, &now]).await?;
    if let Some(grant) = &used {
        tx.record(Event::grant_used(grant, &call)).await?;
    }
    Ok(used)
}

pub async fn one<R: Run>(conn: &R, id: &GrantId) -> Result<Option<GrantView>, R::Error> {
    conn.row(&sql::GRANT, &[id]).await
}

/// Up to `limit` grants that hold at `now`, of `owner` or of all.
pub async fn live<R: Run>(conn: &R, now: i64, owner: Option<&str>, limit: usize) -> Result<Vec<GrantView>, R::Error> {
    conn.rows(&sql::GRANTS_LIVE, &[&now, &owner, &sql::limit(limit)]).await
}

pub async fn revoked<C: Change>(tx: &mut C, id: GrantId, by: String) -> Result<Option<GrantView>, C::Error> {
    let now = tx.now().millis();
    let revoked: Option<GrantView> = tx.row(&sql::GRANT_REVOKED, &[&id, &now, &by]).await?;
    if let Some(grant) = &revoked {
        tx.record(Event::grant(EventKind::GrantRevoked, grant)).await?;
    }
    Ok(revoked)
}
