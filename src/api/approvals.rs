//! `GET /approvals`: the approval policies in force.

use axum::Json;
use axum::extract::{Extension, State};

use super::error::ApiError;
use super::{AppState, Problem};
use crate::approvals::ApprovalPolicy;
use crate::auth::{Principal, Role};

/// `GET /approvals`: the `[[approvals]]` policies in the order they are tried (the first that covers a call
/// applies). Admins only.
#[utoipa::path(
    get,
    path = "/approvals",
    tag = "approvals",
    responses(
        (status = 200, description = "Every approval policy, in the order tried", body = Vec<ApprovalPolicy>),
        (status = 403, description = "Only admins may read the policies", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn list(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
) -> Result<Json<Vec<ApprovalPolicy>>, ApiError> {
    if principal.role != Role::Admin {
        return Err(ApiError::forbidden(format!(
            "{} may not read the approval policies: admins only",
            principal.name
        )));
    }
    Ok(Json(state.approvals.all().to_vec()))
}
