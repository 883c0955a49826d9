//! Calls an approval policy covers: the approval Request raised before anything goes upstream, and what its
//! outcome does — the recorded call forwarded once, or the call failed without the upstream hearing of it.

use std::sync::Arc;
use std::time::Duration;

use rmcp::model::CallToolRequestParams;
use serde_json::{Map, Value};

use super::legs::{LegError, Work};
use super::{CallRef, Live, Upstreams};
use crate::approvals::{self, ApprovalPolicy};
use crate::auth::{Principal, SignIn};
use crate::ids::{self, CallId, GrantId, RequestId};
use crate::records::NewGrant;
use crate::records::{Allowed, Arguments, CallError, CallFailure, CallView, Finish, RequestView, Status, json_size};
use crate::registry::{Origin, Waiting};
use crate::store::{HeldCall, StoreError};
use crate::suspension::{Answer, Lasting, Reason, Request, RequestKind, Terms};
use crate::validation;

/// Why an approved call could not be forwarded.
#[derive(Debug, thiserror::Error)]
enum ForwardError {
    #[error("the approved call could not be read or claimed: {0}")]
    Store(#[from] StoreError),
    #[error("call {0} is gone")]
    Gone(CallId),
    #[error(transparent)]
    Session(#[from] LegError),
}

/// What an approval's outcome does to its call.
#[derive(Debug, PartialEq)]
enum Verdict {
    /// Send exactly these arguments upstream, allowed as this says, after giving the grant the approver asked
    /// for with them.
    Forward(Map<String, Value>, Allowed, Option<Terms>),
    /// End the call without sending it.
    Fail(CallError),
}

impl Upstreams {
    /// Raises the approval a call of `by` needs and waits for it on a task of its own; the call is
    /// `input_required` meanwhile. When the approval cannot be raised, the call fails saying why. The approval
    /// names its caller as people know them (`by`'s name); its `owner` is `by`'s identity. With the tool's
    /// `input_schema`, an editable policy's approver may change the arguments.
    pub(super) async fn hold_for_approval(
        self: &Arc<Self>,
        policy: &ApprovalPolicy,
        view: &CallView,
        by: &Principal,
        input_schema: Option<Value>,
    ) {
        let mut data = approvals::request_data(
            &view.server,
            &view.tool,
            &view.arguments.to_value(),
            &by.name,
            &policy.approvers,
            policy.self_approval,
            policy.quorum,
        );
        if let SignIn::Oidc { email: Some(email), .. } = &by.signed_in
            && let Some(Value::Object(call)) = data.get_mut("call")
        {
            call.insert(approvals::CALLER_EMAIL.to_owned(), Value::String(email.clone()));
        }
        if let Some(schema) = input_schema {
            approvals::make_editable(&mut data, schema);
        }
        approvals::offer_grants(&mut data, &policy.grants);
        let request = Request {
            id: RequestId::mint(ids::APPROVAL),
            kind: RequestKind::Approval,
            prompt: policy.prompt_for(&view.server, &view.tool, &by.name),
            url: None,
            data: Some(Arc::new(data)),
            expires_at: None,
        };
        let origin = Origin {
            server: view.server.clone(),
            // The call goes to whichever session is open once it is approved.
            session: None,
            call: Some(view.id.clone()),
            owner: Some(view.owner.clone()),
        };
        match self.registry.ask_approval(request, policy.ttl, &origin).await {
            Ok(waiting) => {
                tracing::info!(call = %view.id, request = %waiting.id, tool = %view.tool, "call waits for approval");
                let (this, call) = (self.clone(), view.id.clone());
                self.tracker
                    .spawn(async move { this.await_approval(waiting, call).await });
            }
            Err(error) => {
                let message = format!("the approval the call needs could not be raised: {error}");
                self.end_call(&view.id, Finish::failed(message)).await;
            }
        }
    }

    /// Waits, each on a task of its own, on the approvals of calls a previous run of this gateway (or a
    /// replica that is gone) held; each call is forwarded or ended as its approval says.
    pub fn adopt_approvals(self: &Arc<Self>, held: Vec<HeldCall>) {
        for HeldCall { call, approval } in held {
            let this = self.clone();
            self.tracker.spawn(async move {
                match this.registry.wait_on_approval(&approval).await {
                    Ok(waiting) => this.await_approval(waiting, call).await,
                    Err(error) => {
                        let message = format!("approval {approval} could not be read: {error}");
                        this.end_call(&call, Finish::failed(message)).await;
                    }
                }
            });
        }
    }

    /// Waits for an approval's outcome, then forwards the call as recorded or ends it.
    async fn await_approval(self: Arc<Self>, mut waiting: Waiting, call: CallId) {
        tokio::select! {
            biased;
            _ = waiting.outcome() => {}
            // Still pending: a durable store keeps the approval, and the next start waits on it again.
            () = self.shutdown.cancelled() => return,
        }
        let verdict = match self.registry.get(&waiting.id).await {
            Ok(Some(view)) => verdict(&view),
            Ok(None) => Verdict::Fail(CallError::new(format!("approval {} is gone", waiting.id))),
            Err(error) => Verdict::Fail(CallError::new(format!(
                "approval {} could not be read: {error}",
                waiting.id
            ))),
        };
        match verdict {
            Verdict::Forward(arguments, allowed, grant) => {
                tracing::info!(%call, request = %waiting.id, edited = allowed.edited_from.is_some(), "call approved; forwarding it");
                if let Err(error) = self.forward(&call, arguments, allowed, grant).await {
                    self.end_call(&call, Finish::failed(error.to_string())).await;
                }
            }
            Verdict::Fail(error) => {
                tracing::info!(%call, request = %waiting.id, message = %error.message, "call not approved");
                self.end_call(&call, Finish::Failed(error)).await;
            }
        }
    }

    /// Whether a call on a shared session waits on its approval: nothing upstream has heard of it, and a
    /// durable store keeps it for the next start.
    pub(super) async fn awaits_approval(&self, call: &CallView) -> bool {
        let session = self.sessions.get(&call.session).await.ok().flatten();
        if !session.is_some_and(|session| session.shared) {
            return false;
        }
        for id in &call.requests {
            if let Ok(Some(view)) = self.registry.get(id).await
                && view.request.kind == RequestKind::Approval
                && view.status == Status::Pending
            {
                return true;
            }
        }
        false
    }

    /// Runs a call its approval policy covers at once when a standing grant covers it that lasts as one of the
    /// policy's `offered` grants: the use is recorded, and the call forwarded as allowed by the grant. A grant
    /// that cannot be looked up is as none: the call asks.
    pub(super) async fn runs_under_grant(self: &Arc<Self>, view: &CallView, offered: &[Lasting]) -> bool {
        let grant = match self.grants.use_for(view, offered).await {
            Ok(Some(grant)) => grant,
            Ok(None) => return false,
            Err(error) => {
                tracing::warn!(call = %view.id, %error, "standing grants could not be read: the call asks for approval");
                return false;
            }
        };
        tracing::info!(call = %view.id, grant = %grant.id, by = %grant.by, "call runs under a standing grant");
        let allowed = Allowed {
            by: grant.by,
            request: grant.request,
            grant: Some(grant.id),
            edited_from: None,
        };
        if let Err(error) = self.forward(&view.id, view.arguments.to_map(), allowed, None).await {
            self.end_call(&view.id, Finish::failed(error.to_string())).await;
        }
        true
    }

    /// Sends an approved call upstream with the arguments approved, on its session or, if that was the
    /// server's shared one and has ended since, on the shared session open now; first, the standing grant its
    /// approver gave with them, if one did.
    async fn forward(
        self: &Arc<Self>,
        call: &CallId,
        arguments: Map<String, Value>,
        allowed: Allowed,
        grant: Option<Terms>,
    ) -> Result<(), ForwardError> {
        let view = self
            .calls
            .get(call)
            .await?
            .ok_or_else(|| ForwardError::Gone(call.clone()))?;
        let grant = grant.map(|terms| NewGrant {
            id: GrantId::mint(),
            owner: view.owner.clone(),
            server: view.server.clone(),
            tool: view.tool.clone(),
            scope: terms.scope,
            digest: approvals::digest(&Value::Object(arguments.clone())),
            lasting: terms.lasting,
            session: view.session.clone(),
            by: allowed.by.clone(),
            request: allowed.request.clone(),
        });
        let session = self.sessions.get(&view.session).await?;
        let shared = session.is_some_and(|session| session.shared);
        let live = self.session_for(&view.server, &view.session, shared).await?;
        // Whoever waited on the approval — this process, a previous run, or another replica — sends it once.
        let seen = self.feed.since();
        let claimed = self
            .calls
            .forwarding(call, &allowed, &Arguments::of(&arguments))
            .await?;
        // The grant goes with the call it was given with, once that is sent: by this claim or, before a restart,
        // by one that did not live to give it.
        if let Some(grant) = grant {
            let sent = claimed
                || self.calls.get(call).await?.is_some_and(|view| {
                    view.allowed
                        .is_some_and(|sent| sent.request == allowed.request && sent.grant.is_none())
                });
            if sent {
                let given = self.grants.give(grant).await?;
                tracing::info!(%call, grant = %given.id, by = %given.by, "standing grant given");
            }
        }
        if !claimed {
            return Ok(());
        }
        let mut params = CallToolRequestParams::new(view.tool.clone());
        params.arguments = (!arguments.is_empty()).then_some(arguments);
        let call = CallRef {
            id: view.id,
            owner: view.owner,
        };
        let _ = self
            .clone()
            .spawn_leg(call, view.tool, live, Work::Send(Box::new(params)), 0, Some(seen))
            .await;
        Ok(())
    }
}

/// How long listing the tools for an editable approval's schema may take before the approval is raised without.
const TOOLS_LIST_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest tool schema an approval carries, as JSON: it counts towards `requests.max_request_bytes` (64 KiB
/// by default) with the call's arguments.
const MAX_INPUT_SCHEMA_BYTES: usize = 16 * 1024;

/// The `inputSchema` of `tool` as `live` lists it, which an editable approval checks changed arguments against;
/// `None`, and the approval not editable, when it cannot be had in time, is too large, or does not compile.
pub(super) async fn input_schema(live: &Live, tool: &str) -> Option<Value> {
    let why = match tokio::time::timeout(TOOLS_LIST_TIMEOUT, live.peer.list_all_tools()).await {
        Ok(Ok(tools)) => match tools.into_iter().find(|listed| listed.name == tool) {
            Some(listed) => {
                let schema = Value::Object((*listed.input_schema).clone());
                match validation::compile_arguments(&schema) {
                    Ok(_) if json_size(&schema) <= MAX_INPUT_SCHEMA_BYTES => return Some(schema),
                    Ok(_) => format!("its inputSchema is larger than {MAX_INPUT_SCHEMA_BYTES} bytes"),
                    Err(error) => error,
                }
            }
            None => "the server does not list the tool".to_owned(),
        },
        Ok(Err(error)) => format!("the tools could not be listed: {error}"),
        Err(_) => format!("the tools were not listed within {TOOLS_LIST_TIMEOUT:?}"),
    };
    tracing::warn!(%tool, why, "the approval cannot be edited");
    None
}

/// What a resolved approval does to its call: an answer `ok: true` forwards the arguments it approved (those
/// whose digest it carries), anything else fails the call saying who or what decided.
fn verdict(view: &RequestView) -> Verdict {
    let id = &view.request.id;
    let by = view.answered_by.as_deref().unwrap_or("nobody");
    match (view.status, &view.answer) {
        (Status::Answered, Some(answer)) if answer.ok() => match approved_arguments(view, answer) {
            Some((arguments, edited_from)) => Verdict::Forward(
                arguments,
                Allowed {
                    by: by.to_owned(),
                    request: id.clone(),
                    grant: None,
                    edited_from,
                },
                answer.grant,
            ),
            None => Verdict::Fail(CallError::new(format!(
                "approval {id} does not match the call it approved"
            ))),
        },
        (Status::Answered, Some(answer)) => {
            let said = match answer.reason() {
                Some(Reason::Cancelled) => "cancelled",
                _ => "declined",
            };
            Verdict::Fail(CallError {
                message: format!("approval {id} was {said} by {by}; the call was not forwarded"),
                reason: Some(CallFailure::Declined),
            })
        }
        (Status::Expired, _) => Verdict::Fail(CallError {
            message: format!("approval {id} expired unanswered; the call was not forwarded"),
            reason: Some(CallFailure::Expired),
        }),
        _ => Verdict::Fail(CallError::new(format!(
            "approval {id} was cancelled ({}); the call was not forwarded",
            view.detail.as_deref().unwrap_or("no reason given")
        ))),
    }
}

/// The arguments an approval approved, each set only with the digest it was recorded with: those it was raised
/// with or, when its approver changed them, those of its answer, with the ones the call was started with.
fn approved_arguments(view: &RequestView, answer: &Answer) -> Option<(Map<String, Value>, Option<Arguments>)> {
    let sealed = |data: &Map<String, Value>, arguments: &Value| match arguments {
        Value::Object(map) if data.get("digest")?.as_str()? == approvals::digest(arguments) => Some(map.clone()),
        _ => None,
    };
    let data = view.request.data.as_ref()?;
    let raised = sealed(data, approvals::arguments(data)?)?;
    let edit = answer.data.as_ref();
    match edit.and_then(|edit| edit.get(approvals::ARGUMENTS)).zip(edit) {
        Some((edited, edit)) => Some((sealed(edit, edited)?, Some(Arguments::of(&raised)))),
        None => Some((raised, None)),
    }
}
