//! `/grants`: the standing grants approvers gave, and their revocation.

use axum::Json;
use axum::extract::{Extension, Path, State};

use super::error::ApiError;
use super::{AppState, Problem};
use crate::auth::Principal;
use crate::grants::RevokeError;
use crate::ids::GrantId;
use crate::records::GrantView;

/// `GET /grants`: the grants that hold now, oldest first (at most 1000): every one to approvers and admins,
/// its own to an agent.
#[utoipa::path(
    get,
    path = "/grants",
    tag = "grants",
    responses(
        (status = 200, description = "The grants that hold now: not revoked, their time not up, their session open", body = Vec<GrantView>),
    )
)]
pub async fn list(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
) -> Result<Json<Vec<GrantView>>, ApiError> {
    Ok(Json(state.grants.list(&principal).await?))
}

/// `DELETE /grants/{id}`: revokes a grant at once; the next call it would have covered asks again.
#[utoipa::path(
    delete,
    path = "/grants/{id}",
    tag = "grants",
    params(("id" = String, Path, description = "The grant id")),
    responses(
        (status = 200, description = "The grant, revoked (as it was, if it had been revoked or had ended already)", body = GrantView),
        (status = 404, description = "No grant with that id, or none of the agent's own", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn revoke(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Json<GrantView>, ApiError> {
    let unknown = || ApiError::not_found(format!("no grant with id {id}"));
    let id = GrantId::parse(&id).ok_or_else(unknown)?;
    match state.grants.revoke(&id, &principal).await {
        Ok(grant) => Ok(Json(grant)),
        Err(RevokeError::NotFound(_)) => Err(unknown()),
        Err(RevokeError::Store(error)) => Err(error.into()),
    }
}
