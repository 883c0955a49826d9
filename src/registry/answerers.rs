//! Who may answer a Request: the one rule every door (REST, `/mcp` in both eras and both modes, `tasks/update`)
//! goes through, since [`Registry::answer`](super::Registry::answer) takes only an [`Answerable`] this rule
//! let through.

use crate::approvals;
use crate::auth::Principal;
use crate::ids::RequestId;
use crate::records::RequestView;
use crate::suspension::RequestKind;

/// Why a principal may not answer a Request. Nothing changes when one is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// An agent answers only Requests of its own; one owned by another principal, or by nobody (raised on a
    /// shared session whose call could not be told), is not its to answer.
    #[error("Request {0} belongs to another principal")]
    NotYours(RequestId),
    /// Nobody approves a call they started, whatever their role.
    #[error("{0} started this call and may not approve it")]
    OwnCall(String),
    /// The approval's policy lists who may answer it, and not this principal.
    #[error("{0} is not among the approvers of this call")]
    NotAnApprover(String),
}

/// A Request that a principal may answer, as [`Registry::answerable`](super::Registry::answerable) found it;
/// only the registry makes one.
#[derive(Debug)]
pub struct Answerable {
    pub(super) id: RequestId,
    pub(super) by: String,
    /// The whole Request, when finding it read it.
    pub(super) read: Option<Box<RequestView>>,
}

impl Answerable {
    /// The Request it is.
    pub fn id(&self) -> &RequestId {
        &self.id
    }
}

/// `principal` may see, and so answer, something owned by `owner`.
pub(super) fn sees(id: &RequestId, owner: Option<&str>, principal: &Principal) -> Result<(), Refusal> {
    if principal.may_see(owner) {
        Ok(())
    } else {
        Err(Refusal::NotYours(id.clone()))
    }
}

/// Whether `principal` may answer `view`: it must see it; and an approval that holds a call (not a posted
/// Request of that kind, which holds nothing) is never answered by the call's own principal, and only by its
/// policy's approvers when it lists them. An agent sees no approval but of its own calls, so it approves none.
/// Without tokens everyone is the one anonymous principal, whom nothing tells apart: the approval rules are off.
pub fn may_answer(view: &RequestView, principal: &Principal) -> Result<(), Refusal> {
    sees(&view.request.id, view.owner.as_deref(), principal)?;
    if view.request.kind != RequestKind::Approval || view.is_posted() || principal.is_anonymous() {
        return Ok(());
    }
    let by = principal.name.as_str();
    if view.owner.as_deref() == Some(by) {
        return Err(Refusal::OwnCall(by.to_owned()));
    }
    let listed =
        approvals::approvers(view.request.data.as_deref()).map(|mut approvers| approvers.any(|name| name == by));
    if listed == Some(false) {
        return Err(Refusal::NotAnApprover(by.to_owned()));
    }
    Ok(())
}
