//! Standing grants in PostgreSQL. Each change runs alongside other replicas' changes: a use updates its grant by
//! id on the condition that it still holds, which under READ COMMITTED is checked again on the newest version of
//! the row, so that a revocation that commits first is never overtaken.

use super::{Postgres, Reader, rows};
use crate::ids::GrantId;
use crate::records::{CallView, Event, EventKind, GrantView, NewGrant};
use crate::store::{StoreError, sql};
use crate::suspension::Lasting;

impl Postgres {
    pub async fn give_grant(&self, grant: NewGrant) -> Result<GrantView, StoreError> {
        self.write_alongside(move |tx| {
            let grant = grant.clone();
            Box::pin(async move {
                let view = grant.view(tx.now());
                let lasting = rows::to_json(&view.lasting);
                let given = tx
                    .execute(
                        sql::GRANT_GIVEN.postgres,
                        &[
                            &view.id.as_str(),
                            &view.request.as_str(),
                            &view.owner,
                            &view.server,
                            &view.tool,
                            &view.scope.as_str(),
                            &view.digest,
                            &lasting,
                            &view.session.as_ref().map(|session| session.as_str()),
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
                let row = tx
                    .query_one(sql::GRANT_OF_REQUEST.postgres, &[&view.request.as_str()])
                    .await?;
                rows::grant(&row)
            })
        })
        .await
    }

    pub async fn use_grant(
        &self,
        call: &CallView,
        digest: &str,
        offered: &[Lasting],
    ) -> Result<Option<GrantView>, StoreError> {
        let (call, digest, offered) = (call.clone(), digest.to_owned(), offered.to_vec());
        self.write_alongside(move |tx| {
            let (call, digest, offered) = (call.clone(), digest.clone(), offered.clone());
            Box::pin(async move {
                let (now, session) = (tx.now().millis(), call.session.as_str());
                let covering = tx
                    .query(
                        sql::GRANTS_COVERING.postgres,
                        &[
                            &call.owner,
                            &call.server,
                            &call.tool,
                            &digest,
                            &session,
                            &now,
                            &sql::COVERING,
                        ],
                    )
                    .await?
                    .iter()
                    .map(rows::grant)
                    .collect::<Result<Vec<_>, _>>()?;
                let Some(grant) = covering.iter().find(|grant| offered.contains(&grant.lasting)) else {
                    return Ok(None);
                };
                let row = tx
                    .query_opt(sql::GRANT_USED.postgres, &[&grant.id.as_str(), &now])
                    .await?;
                let Some(grant) = row.map(|row| rows::grant(&row)).transpose()? else {
                    return Ok(None);
                };
                tx.record(Event::grant_used(&grant, &call)).await?;
                Ok(Some(grant))
            })
        })
        .await
    }

    pub async fn grant(&self, id: &GrantId) -> Result<Option<GrantView>, StoreError> {
        self.read(async |conn| {
            conn.query_opt(sql::GRANT.postgres, &[&id.as_str()])
                .await?
                .map(|row| rows::grant(&row))
                .transpose()
        })
        .await
    }

    pub async fn grants(&self, owner: Option<&str>, limit: usize) -> Result<Vec<GrantView>, StoreError> {
        let now = self.shared.clock.now().millis();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.read(async |conn| {
            let found = conn.query(sql::GRANTS_LIVE.postgres, &[&now, &owner, &limit]).await?;
            found.iter().map(rows::grant).collect()
        })
        .await
    }

    pub async fn revoke_grant(&self, id: &GrantId, by: &str) -> Result<Option<GrantView>, StoreError> {
        let (id, by) = (id.clone(), by.to_owned());
        self.write_alongside(move |tx| {
            let (id, by) = (id.clone(), by.clone());
            Box::pin(async move {
                let now = tx.now().millis();
                let row = tx
                    .query_opt(sql::GRANT_REVOKED.postgres, &[&id.as_str(), &now, &by])
                    .await?;
                let Some(grant) = row.map(|row| rows::grant(&row)).transpose()? else {
                    return Ok(None);
                };
                tx.record(Event::grant(EventKind::GrantRevoked, &grant)).await?;
                Ok(Some(grant))
            })
        })
        .await
    }
}
