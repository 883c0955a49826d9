//! Standing grants in SQLite.

use rusqlite::{OptionalExtension, params};

use super::{Sqlite, rows};
use crate::ids::GrantId;
use crate::records::{CallView, Event, EventKind, GrantView, NewGrant};
use crate::store::{StoreError, sql};
use crate::suspension::Lasting;

impl Sqlite {
    pub async fn give_grant(&self, grant: NewGrant) -> Result<GrantView, StoreError> {
        self.write(move |tx| {
            let view = grant.view(tx.now());
            let given = tx.conn.prepare_cached(sql::GRANT_GIVEN.sqlite)?.execute(params![
                view.id.as_str(),
                view.request.as_str(),
                view.owner,
                view.server,
                view.tool,
                view.scope.as_str(),
                view.digest,
                rows::to_json(&view.lasting),
                view.session.as_ref().map(|session| session.as_str()),
                view.expires_at.map(|end| end.millis()),
                view.by,
                view.created_at.millis(),
            ])?;
            if given == 1 {
                tx.record(Event::grant(EventKind::GrantCreated, &view))?;
                return Ok(view);
            }
            tx.conn
                .prepare_cached(sql::GRANT_OF_REQUEST.sqlite)?
                .query_row([view.request.as_str()], rows::grant)
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
        self.write(move |tx| {
            let now = tx.now().millis();
            let covering: Vec<GrantView> = tx
                .conn
                .prepare_cached(sql::GRANTS_COVERING.sqlite)?
                .query_map(
                    params![
                        call.owner,
                        call.server,
                        call.tool,
                        digest,
                        call.session.as_str(),
                        now,
                        sql::COVERING
                    ],
                    rows::grant,
                )?
                .collect::<rusqlite::Result<_>>()?;
            let Some(grant) = covering.iter().find(|grant| offered.contains(&grant.lasting)) else {
                return Ok(None);
            };
            let used = tx
                .conn
                .prepare_cached(sql::GRANT_USED.sqlite)?
                .query_row(params![grant.id.as_str(), now], rows::grant)
                .optional()?;
            if let Some(grant) = &used {
                tx.record(Event::grant_used(grant, &call))?;
            }
            Ok(used)
        })
        .await
    }

    pub async fn grant(&self, id: &GrantId) -> Result<Option<GrantView>, StoreError> {
        self.read(|conn| {
            conn.prepare_cached(sql::GRANT.sqlite)?
                .query_row([id.as_str()], rows::grant)
                .optional()
        })
    }

    pub async fn grants(&self, owner: Option<&str>, limit: usize) -> Result<Vec<GrantView>, StoreError> {
        let now = self.shared.clock.now().millis();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.read(|conn| {
            conn.prepare_cached(sql::GRANTS_LIVE.sqlite)?
                .query_map(params![now, owner, limit], rows::grant)?
                .collect()
        })
    }

    pub async fn revoke_grant(&self, id: &GrantId, by: &str) -> Result<Option<GrantView>, StoreError> {
        let (id, by) = (id.clone(), by.to_owned());
        self.write(move |tx| {
            let now = tx.now().millis();
            let revoked = tx
                .conn
                .prepare_cached(sql::GRANT_REVOKED.sqlite)?
                .query_row(params![id.as_str(), now, by], rows::grant)
                .optional()?;
            if let Some(grant) = &revoked {
                tx.record(Event::grant(EventKind::GrantRevoked, grant))?;
            }
            Ok(revoked)
        })
        .await
    }
}
