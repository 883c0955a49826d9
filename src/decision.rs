//! How an answer to a Request is decided, the same way in every store engine and without reading the store:
//! who may answer it, the answer as it applies to it (a form's defaults), whether it fits (its schema), and the
//! `ElicitResult` it maps to. Every door (REST, `/mcp` in both eras and both modes, `tasks/update`) hands
//! the store a [`Proposal`]; the store reads the Request and calls [`decide`] on it, which never calls back.

use std::sync::Arc;

use rmcp::model::ElicitResult;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::approvals;
use crate::auth::{ANONYMOUS, Principal, SignIn};
use crate::elicitation;
use crate::forms::Forms;
use crate::ids::RequestId;
use crate::records::{Answerer, RequestView, Signoff, Status};
use crate::suspension::{Answer, RequestKind, Terms};
use crate::time::Timestamp;
use crate::validation::{self, Violation};

/// The `detail` of a Request whose upstream withdrew its elicitation.
pub const WITHDREW: &str = "the upstream cancelled the elicitation";

/// The `detail` of a Request whose upstream stopped waiting for it.
const STOPPED_LISTENING: &str = "withdrawn by the upstream before the answer arrived";

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
    /// A link a channel sent names nobody the call's principal or the other approvers can be told apart from:
    /// a chat channel's names nobody at all, a mailed one only an address.
    #[error(
        "a link sent to {0} does not say who answers well enough to approve this call: answer it in the inbox, or \
         have people sign in first (links.sign_in)"
    )]
    Unidentified(String),
}

/// What the gateway's policy makes of every answer.
#[derive(Debug)]
pub struct Rules {
    /// Whether an accepted form's defaults fill in what the answer leaves out.
    pub apply_defaults: bool,
    /// The forms Requests carry, with their compiled schemas.
    pub forms: Arc<Forms>,
}

/// An answer offered to a Request: what it says, who gives it, what waits on the Request in this process,
/// and the rules it is decided by.
#[derive(Debug, Clone)]
pub struct Proposal {
    pub answer: Answer,
    pub by: Principal,
    /// The 2025-11-25 elicitation waiting on the Request in this process, if one does.
    pub upstream: Option<Upstream>,
    pub rules: Arc<Rules>,
}

/// The upstream side of a 2025-11-25 elicitation waiting in this process, as the store sees it when it
/// decides: whether the upstream withdrew the elicitation, and whether it still waits for the answer.
#[derive(Debug, Clone, Default)]
pub struct Upstream {
    /// Fired when the upstream withdraws the elicitation.
    pub withdrawn: CancellationToken,
    /// Fired when nothing here waits for the outcome any more (the upstream's request ended).
    pub stopped: CancellationToken,
}

impl Upstream {
    /// Why the Request can no longer take an answer, as things stand now; `None` while it can.
    pub fn withdrawal(&self) -> Option<String> {
        if self.withdrawn.is_cancelled() {
            Some(WITHDREW.to_owned())
        } else if self.stopped.is_cancelled() {
            Some(STOPPED_LISTENING.to_owned())
        } else {
            None
        }
    }
}

/// An answer checked and mapped, to be recorded as the one that resolves its Request.
#[derive(Debug, Clone)]
pub struct Decision {
    pub answer: Answer,
    /// The `ElicitResult` the answer maps to; `None` for a posted Request, which has no upstream.
    pub result: Option<ElicitResult>,
    /// The principal answering.
    pub by: Answerer,
    /// On an approval that needs several people, this one's decision, the last of its `decisions`.
    pub signoff: Option<Signoff>,
}

/// What an answer decides.
#[derive(Debug, Clone)]
#[allow(
    clippy::large_enum_variant,
    reason = "one lives briefly per answer, and most answers resolve: boxing the common case would allocate for it"
)]
pub enum Decided {
    /// It resolves the Request.
    Resolves(Decision),
    /// It is one approval of the several its Request needs: recorded, the Request stays pending.
    Counts(Signoff),
}

/// Why an answer decides nothing.
#[derive(Debug)]
pub enum Undecided {
    Refused(Refusal),
    /// The Request is no longer pending.
    Resolved,
    /// The answer does not fit the Request's form.
    Invalid(Vec<Violation>),
    /// Its principal approved the pending Request already, and approves again: nothing changes.
    Again,
    /// Its principal approved the pending Request already, and now answers otherwise.
    Changed,
}

/// Decides `proposal` on the Request as the store reads it at `now`: who answers comes first, then whether it
/// is still pending, then whether the answer fits, then, on an approval that needs several people, whether
/// this one completes it. Whether its upstream withdrew it is the store's to ask ([`Proposal::upstream`]) at
/// the moment it writes; an answer to one withdrawn already is not checked against the form, so that it is
/// told the Request was withdrawn whatever it holds.
pub fn decide(view: &RequestView, proposal: &Proposal, now: Timestamp) -> Result<Decided, Undecided> {
    may_answer(view, &proposal.by).map_err(Undecided::Refused)?;
    if view.status != Status::Pending {
        return Err(Undecided::Resolved);
    }
    let answer = proposal
        .rules
        .recorded(view, proposal.answer.clone())
        .map_err(Undecided::Invalid)?;
    let withdrawn = proposal.upstream.as_ref().and_then(Upstream::withdrawal).is_some();
    if answer.ok()
        && !holds_call(view)
        && !withdrawn
        && let (Some(data), Some(form)) = (&answer.data, &view.request.data)
        && let Some(validator) = proposal.rules.forms.validator(form)
    {
        validation::violations(&validator, data).map_err(Undecided::Invalid)?;
    }
    let result = (!view.is_posted()).then(|| {
        let mut result = elicitation::answer_to_elicit_result(&answer);
        if view.request.kind == RequestKind::Authorization {
            result.content = None;
        }
        result
    });
    if let Some(terms) = &answer.grant {
        grant(view, terms, &proposal.by).map_err(|message| {
            Undecided::Invalid(vec![Violation {
                path: "/grant".to_owned(),
                message,
            }])
        })?;
    }
    let by = &proposal.by;
    let quorum = match (&view.request.kind, view.is_posted()) {
        (RequestKind::Approval, false) => approvals::quorum(view.request.data.as_deref()),
        _ => 1,
    };
    let mut signoff = None;
    if quorum > 1 {
        if let Some(mine) = view.decisions.iter().find(|signoff| signoff.principal == by.id) {
            return Err(if mine.ok && answer.ok() {
                Undecided::Again
            } else {
                Undecided::Changed
            });
        }
        let this = Signoff {
            by: by.name.clone(),
            principal: by.id.clone(),
            at: now,
            ok: answer.ok(),
        };
        // Only approvals are kept while it is pending: a decline resolves it.
        if answer.ok() && view.decisions.len() + 1 < quorum {
            return Ok(Decided::Counts(this));
        }
        signoff = Some(this);
    }
    Ok(Decided::Resolves(Decision {
        answer,
        result,
        by: by.answerer(),
        signoff,
    }))
}

/// Whether `view` is an approval that holds a call (not a posted Request of that kind, which holds nothing).
fn holds_call(view: &RequestView) -> bool {
    view.request.kind == RequestKind::Approval && !view.is_posted()
}

/// Whether an approver may give the standing grant `terms` with an answer to `view`: the approval's policy offers
/// it, one person approves it, and the approver is not the call's own principal (who, under `self_approval`,
/// may approve a call but not stop being asked); the error says why not.
fn grant(view: &RequestView, terms: &Terms, by: &Principal) -> Result<(), String> {
    let data = view.request.data.as_deref();
    let offered = if holds_call(view) {
        approvals::grants(data)
    } else {
        Vec::new()
    };
    if offered.is_empty() || approvals::quorum(data) > 1 {
        return Err("this Request's policy offers no standing grants".to_owned());
    }
    if !offered.contains(&terms.lasting) {
        return Err(format!(
            "this approval's policy offers grants for {}",
            serde_json::to_string(&offered).unwrap_or_default()
        ));
    }
    if view.owner.as_deref() == Some(by.id.as_str()) && !by.is_anonymous() {
        return Err(format!(
            "{} started this call: it may approve it (self_approval), but not give itself a standing grant",
            by.name
        ));
    }
    Ok(())
}

/// The keys of an approval's answer `data` that only the gateway writes: the digest of changed arguments, and
/// what changed.
const EDIT_RECORD: [&str; 2] = ["digest", "changes"];

/// An approval's `ok` answer as it applies to its call. Arguments it carries are the call's arguments changed by
/// the approver: allowed only where the approval is editable (one person approves it), they must fit the
/// tool's `inputSchema`, and are recorded with their digest and what changed (none, when nothing did). What an
/// answer says of an edit itself is dropped: the gateway writes that record.
fn edit(view: &RequestView, answer: &mut Answer, forms: &Forms) -> Result<(), Vec<Violation>> {
    if let Some(data) = answer.data.as_mut() {
        for key in EDIT_RECORD {
            data.remove(key);
        }
    }
    let Some(edited) = answer.data.as_mut().and_then(|data| data.remove(approvals::ARGUMENTS)) else {
        return Ok(());
    };
    let refuse = |message: &str| {
        vec![Violation {
            path: format!("/{}", approvals::ARGUMENTS),
            message: message.to_owned(),
        }]
    };
    let data = view.request.data.as_ref();
    let editable = data.is_some_and(|data| approvals::input_schema(data).is_some());
    if !editable || approvals::quorum(data.map(|data| &**data)) > 1 {
        return Err(refuse(
            "this approval's arguments cannot be changed: its policy is not editable (editable = true), or the tool's \
             schema could not be had when it was raised",
        ));
    }
    let Value::Object(arguments) = edited else {
        return Err(refuse("must be an object: the tool's arguments"));
    };
    let validator = data
        .and_then(|data| forms.arguments(data))
        .ok_or_else(|| refuse("the tool's inputSchema does not compile, so no change can be checked"))?;
    validation::violations(&validator, &arguments).map_err(|violations| {
        violations
            .into_iter()
            .map(|violation| Violation {
                path: format!("/{}{}", approvals::ARGUMENTS, violation.path),
                ..violation
            })
            .collect::<Vec<_>>()
    })?;
    let original = data
        .and_then(|data| approvals::arguments(data))
        .cloned()
        .unwrap_or_default();
    let edited = Value::Object(arguments);
    if edited != original {
        let data = answer.data.get_or_insert_with(Default::default);
        data.insert("digest".to_owned(), Value::String(approvals::digest(&edited)));
        data.insert(
            "changes".to_owned(),
            Value::from(approvals::changes(&original, &edited)),
        );
        data.insert(approvals::ARGUMENTS.to_owned(), edited);
    }
    Ok(())
}

impl Rules {
    /// `answer` as the store records it on `view`: [`Rules::applied`], and an approval's changed arguments
    /// checked and recorded; the error lists why a change does not fit.
    pub fn recorded(&self, view: &RequestView, answer: Answer) -> Result<Answer, Vec<Violation>> {
        let mut answer = self.applied(view, answer);
        if answer.ok() && holds_call(view) {
            edit(view, &mut answer, &self.forms)?;
        }
        Ok(answer)
    }

    /// `answer` as it applies to a Request: an accepting answer to a form carries data (`{}` when it has
    /// none), with the form's defaults filled in when the policy says so.
    pub fn applied(&self, view: &RequestView, mut answer: Answer) -> Answer {
        if answer.ok() && view.request.kind != RequestKind::Authorization {
            let data = answer.data.get_or_insert_with(Default::default);
            if let Some(schema) = view.request.data.as_ref().and_then(|data| data.get("schema"))
                && self.apply_defaults
            {
                validation::apply_defaults(schema, data);
            }
        }
        answer
    }
}

/// Whether `principal` may answer `view`: it must see it; and an approval that holds a call (not a posted
/// Request of that kind, which holds nothing) is never answered by the call's own principal, and only by its
/// policy's approvers when it lists them. An agent sees no approval but of its own calls, so it approves none.
/// Without tokens everyone is the one anonymous principal, whom nothing tells apart: the approval rules are off.
pub fn may_answer(view: &RequestView, principal: &Principal) -> Result<(), Refusal> {
    if !principal.may_see(view.owner.as_deref()) {
        return Err(Refusal::NotYours(view.request.id.clone()));
    }
    if view.request.kind != RequestKind::Approval || view.is_posted() || principal.is_anonymous() {
        return Ok(());
    }
    let data = view.request.data.as_deref();
    let own = !approvals::self_approval(data);
    if view.owner.as_deref() == Some(principal.id.as_str()) && own {
        return Err(Refusal::OwnCall(principal.name.clone()));
    }
    // A link a channel sent answers as the address it went to, or as nobody. That address is no identity the
    // call's principal or another approver is known by, so: a channel's link approves nothing; a mailed one
    // approves no call whose caller the approval names by that address (its name or verified email, in any
    // case), and takes no part in an approval that needs several people, where it could count one person
    // twice. Signing in first (`links.sign_in`) answers as the person instead. A call of the one anonymous
    // principal of a gateway without tokens has nobody to tell apart.
    if let SignIn::Link { asked: None, to } = &principal.signed_in
        && view.owner.as_deref() != Some(ANONYMOUS)
    {
        let call = data.and_then(|data| data.get("call"));
        let named = |key: &str, address: &str| {
            call.and_then(|call| call.get(key))
                .and_then(serde_json::Value::as_str)
                .is_some_and(|name| name.eq_ignore_ascii_case(address))
        };
        match to {
            None => return Err(Refusal::Unidentified(principal.name.clone())),
            Some(_) if approvals::quorum(data) > 1 => return Err(Refusal::Unidentified(principal.name.clone())),
            Some(address) if own && (named("caller", address) || named(approvals::CALLER_EMAIL, address)) => {
                return Err(Refusal::OwnCall(principal.name.clone()));
            }
            Some(_) => {}
        }
    }
    let listed = approvals::approvers(data).map(|mut approvers| approvers.any(|entry| principal.is_listed(entry)));
    if listed == Some(false) {
        return Err(Refusal::NotAnApprover(principal.name.clone()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::auth::{ANONYMOUS, Role};
    use crate::ids::{self, RequestId};
    use crate::suspension::{Request, Verdict};
    use crate::time::Timestamp;

    /// A pending Request of `kind` owned by `owner`, raised on server `demo` (posted, without it), carrying `data`.
    fn pending(kind: RequestKind, owner: &str, data: Value) -> RequestView {
        RequestView {
            request: Request {
                id: RequestId::mint(if kind == RequestKind::Approval {
                    ids::APPROVAL
                } else {
                    ids::REQUEST
                }),
                kind,
                prompt: "Go on?".into(),
                url: None,
                data: data.as_object().cloned().map(Arc::new),
                expires_at: None,
            },
            status: Status::Pending,
            server: Some("demo".into()),
            session: None,
            call: None,
            owner: Some(owner.to_owned()),
            created_at: Timestamp::from_millis(0),
            resolved_at: None,
            answer: None,
            answered_by: None,
            answerer: None,
            result: None,
            detail: None,
            completed_at: None,
            decisions: Vec::new(),
        }
    }

    /// What `proposal` decides on `view`, when it resolves it.
    fn resolves(view: &RequestView, proposal: &Proposal) -> Result<Decision, Undecided> {
        match decide(view, proposal, Timestamp::from_millis(0))? {
            Decided::Resolves(decision) => Ok(decision),
            Decided::Counts(signoff) => panic!("counted, not resolved: {signoff:?}"),
        }
    }

    fn form() -> Value {
        json!({"schema": {"type": "object", "properties": {
            "confirm": {"type": "boolean"}, "size": {"type": "integer", "default": 3}
        }}})
    }

    fn proposal(by: &str, role: Role, data: Option<Value>) -> Proposal {
        Proposal {
            answer: Answer {
                id: String::new(),
                verdict: Verdict::Accept,
                data: data.and_then(|data| data.as_object().cloned()),
                grant: None,
            },
            by: Principal::token(by, role),
            upstream: None,
            rules: Arc::new(Rules {
                apply_defaults: true,
                forms: Arc::default(),
            }),
        }
    }

    #[test]
    fn an_accepted_form_gets_its_defaults_and_maps_to_accept_with_them() {
        let view = pending(RequestKind::Input, "ada", form());
        let decision = resolves(&view, &proposal("ada", Role::Agent, Some(json!({"confirm": true})))).unwrap();
        assert_eq!(
            decision.answer.data,
            json!({"confirm": true, "size": 3}).as_object().cloned()
        );
        assert_eq!(decision.by.name, "ada");
        let result = serde_json::to_value(decision.result.unwrap()).unwrap();
        assert_eq!(
            result,
            json!({"action": "accept", "content": {"confirm": true, "size": 3}})
        );
    }

    #[test]
    fn who_answers_is_decided_first_then_whether_it_is_pending_then_whether_it_fits() {
        let mut view = pending(RequestKind::Input, "ada", form());
        let unfit = Some(json!({"confirm": "yes"}));
        let refused = resolves(&view, &proposal("bob", Role::Agent, unfit.clone())).unwrap_err();
        assert!(
            matches!(refused, Undecided::Refused(Refusal::NotYours(_))),
            "{refused:?}"
        );
        let invalid = resolves(&view, &proposal("ada", Role::Agent, unfit.clone())).unwrap_err();
        assert!(
            matches!(&invalid, Undecided::Invalid(violations) if violations[0].path == "/confirm"),
            "{invalid:?}"
        );
        view.status = Status::Answered;
        let resolved = resolves(&view, &proposal("ada", Role::Agent, unfit.clone())).unwrap_err();
        assert!(matches!(resolved, Undecided::Resolved), "{resolved:?}");
        let refused = resolves(&view, &proposal("bob", Role::Agent, unfit)).unwrap_err();
        assert!(matches!(refused, Undecided::Refused(_)), "{refused:?}");
    }

    #[test]
    fn an_approval_is_answered_by_a_listed_approver_other_than_its_caller() {
        let data = approvals::request_data("demo", "echo", &json!({}), "ada", &["on-call".to_owned()], false, 1);
        let view = pending(RequestKind::Approval, "ada", Value::Object(data));
        let by = |name: &str, role| resolves(&view, &proposal(name, role, None));
        assert!(matches!(
            by("ada", Role::Admin),
            Err(Undecided::Refused(Refusal::OwnCall(_)))
        ));
        assert!(matches!(
            by("ops", Role::Admin),
            Err(Undecided::Refused(Refusal::NotAnApprover(_)))
        ));
        assert!(matches!(
            by("on-call", Role::Agent),
            Err(Undecided::Refused(Refusal::NotYours(_)))
        ));
        assert_eq!(by("on-call", Role::Approver).unwrap().by.name, "on-call");
    }

    #[test]
    fn a_quorum_counts_each_person_once_and_ends_on_its_last_yes_or_any_no() {
        let data = approvals::request_data("demo", "echo", &json!({}), "ada", &[], false, 2);
        let mut view = pending(RequestKind::Approval, "ada", Value::Object(data));
        let at = Timestamp::from_millis(5);
        let yes = |name: &str| proposal(name, Role::Approver, None);
        let no = |name: &str| Proposal {
            answer: Answer {
                id: String::new(),
                verdict: Verdict::Refuse(None),
                data: None,
                grant: None,
            },
            ..yes(name)
        };
        let Ok(Decided::Counts(first)) = decide(&view, &yes("lead"), at) else {
            panic!("one yes of two is counted");
        };
        assert_eq!(
            (first.by.as_str(), first.principal.as_str(), first.at, first.ok),
            ("lead", "lead", at, true)
        );
        view.decisions.push(first.clone());
        assert!(
            matches!(decide(&view, &yes("lead"), at), Err(Undecided::Again)),
            "one person counts once"
        );
        assert!(matches!(decide(&view, &no("lead"), at), Err(Undecided::Changed)));
        let Ok(Decided::Resolves(last)) = decide(&view, &yes("ops"), at) else {
            panic!("the second person's yes resolves it");
        };
        assert_eq!((last.by.name.as_str(), last.answer.ok()), ("ops", true));
        assert_eq!(last.signoff.map(|signoff| signoff.principal), Some("ops".to_owned()));
        let Ok(Decided::Resolves(declined)) = decide(&view, &no("ops"), at) else {
            panic!("a no resolves it");
        };
        assert!(!declined.answer.ok() && declined.signoff.is_some_and(|signoff| !signoff.ok));
        view.decisions.clear();
        let Ok(Decided::Resolves(first_no)) = decide(&view, &no("lead"), at) else {
            panic!("a no before any yes resolves it too");
        };
        assert!(!first_no.answer.ok());
    }

    #[test]
    fn a_channel_s_link_approves_nothing_and_a_mailed_one_not_for_its_own_caller() {
        use crate::links::Holder;
        let sent = |to: Option<&str>| {
            Holder::Sent {
                channel: "sre".to_owned(),
                to: to.map(str::to_owned),
            }
            .principal()
        };
        let data = approvals::request_data("demo", "echo", &json!({}), "alice@example.com", &[], false, 1);
        let approval = pending(
            RequestKind::Approval,
            "https://idp.example.com#alice",
            Value::Object(data.clone()),
        );
        assert!(matches!(
            may_answer(&approval, &sent(None)),
            Err(Refusal::Unidentified(_))
        ));
        assert!(matches!(
            may_answer(&approval, &sent(Some("alice@example.com"))),
            Err(Refusal::OwnCall(_))
        ));
        assert!(matches!(
            may_answer(&approval, &sent(Some("ALICE@example.com"))),
            Err(Refusal::OwnCall(_))
        ));
        assert!(may_answer(&approval, &sent(Some("bob@example.com"))).is_ok());
        // The caller known by another name, and by the verified email the approval keeps.
        let mut known = approvals::request_data("demo", "echo", &json!({}), "alice", &[], false, 1);
        known["call"][approvals::CALLER_EMAIL] = json!("alice@example.com");
        let known = pending(
            RequestKind::Approval,
            "https://idp.example.com#alice",
            Value::Object(known),
        );
        assert!(matches!(
            may_answer(&known, &sent(Some("alice@example.com"))),
            Err(Refusal::OwnCall(_))
        ));
        // Two people: a mailed link could be a person counted already, under another name.
        let two = approvals::request_data("demo", "echo", &json!({}), "ci", &[], false, 2);
        let two = pending(RequestKind::Approval, "ci", Value::Object(two));
        assert!(matches!(
            may_answer(&two, &sent(Some("bob@example.com"))),
            Err(Refusal::Unidentified(_))
        ));
        // An elicitation is answered by whoever it reaches; a gateway without tokens tells nobody apart.
        let input = pending(
            RequestKind::Input,
            "https://idp.example.com#alice",
            json!({"schema": {}}),
        );
        assert!(may_answer(&input, &sent(None)).is_ok());
        let anonymous = pending(RequestKind::Approval, ANONYMOUS, Value::Object(data));
        assert!(may_answer(&anonymous, &sent(None)).is_ok());
    }

    #[test]
    fn an_edit_is_taken_only_where_editable_fits_the_tool_and_records_what_changed() {
        let schema = json!({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]});
        let raised = |editable: bool, quorum: usize| {
            let mut data = approvals::request_data("demo", "echo", &json!({"text": "a"}), "ci", &[], false, quorum);
            if editable {
                approvals::make_editable(&mut data, schema.clone());
            }
            pending(RequestKind::Approval, "ci", Value::Object(data))
        };
        let edit = |arguments: Value| proposal("lead", Role::Approver, Some(json!({"arguments": arguments})));
        let invalid = |view: &RequestView, arguments: Value| match resolves(view, &edit(arguments)) {
            Err(Undecided::Invalid(violations)) => violations,
            other => panic!("{other:?}"),
        };
        assert_eq!(invalid(&raised(false, 1), json!({"text": "b"}))[0].path, "/arguments");
        assert_eq!(invalid(&raised(true, 2), json!({"text": "b"}))[0].path, "/arguments");
        assert_eq!(invalid(&raised(true, 1), json!({"text": 1}))[0].path, "/arguments/text");
        assert_eq!(invalid(&raised(true, 1), json!({}))[0].path, "/arguments/text");

        let decision = resolves(&raised(true, 1), &edit(json!({"text": "b"}))).unwrap();
        assert_eq!(
            decision.answer.data.unwrap(),
            *json!({
                "arguments": {"text": "b"},
                "digest": approvals::digest(&json!({"text": "b"})),
                "changes": [{"op": "replace", "path": "/text", "value": "b"}],
            })
            .as_object()
            .unwrap()
        );
        let unchanged = resolves(&raised(true, 1), &edit(json!({"text": "a"}))).unwrap();
        assert_eq!(
            unchanged.answer.data,
            Some(Default::default()),
            "the same arguments are no edit"
        );
        let declined = Proposal {
            answer: Answer {
                id: String::new(),
                verdict: Verdict::Refuse(None),
                data: json!({"arguments": {"text": 1}}).as_object().cloned(),
                grant: None,
            },
            ..edit(json!({}))
        };
        assert!(
            resolves(&raised(false, 1), &declined).is_ok(),
            "a decline changes nothing"
        );
    }

    #[test]
    fn a_grant_is_taken_only_where_the_approval_offers_it() {
        use crate::suspension::{Lasting, Scope, Terms};
        let hour = Lasting::For(std::time::Duration::from_secs(3600));
        let raised = |offered: &[Lasting], quorum: usize| {
            let mut data = approvals::request_data("demo", "echo", &json!({}), "ci", &[], false, quorum);
            approvals::offer_grants(&mut data, offered);
            pending(RequestKind::Approval, "ci", Value::Object(data))
        };
        let asking = |lasting| Proposal {
            answer: Answer {
                grant: Some(Terms {
                    lasting,
                    scope: Scope::Tool,
                }),
                ..proposal("lead", Role::Approver, None).answer
            },
            ..proposal("lead", Role::Approver, None)
        };
        let refused = |view: &RequestView, lasting| match resolves(view, &asking(lasting)) {
            Err(Undecided::Invalid(violations)) => violations[0].path == "/grant",
            _ => false,
        };
        let granted = resolves(&raised(&[Lasting::Session, hour], 1), &asking(hour)).unwrap();
        assert!(granted.answer.grant.is_some());
        assert!(refused(&raised(&[Lasting::Session], 1), hour), "not offered");
        assert!(refused(&raised(&[], 1), hour), "none offered");
        assert!(
            refused(&raised(&[hour], 2), hour),
            "one person's grant would skip the others"
        );
        let input = pending(RequestKind::Input, "ci", form());
        assert!(refused(&input, hour), "an elicitation gives no grant");
        // Under self_approval the caller approves its call, but gives itself no grant.
        let mut data = approvals::request_data("demo", "echo", &json!({}), "ci", &[], true, 1);
        approvals::offer_grants(&mut data, &[hour]);
        let own = pending(RequestKind::Approval, "ci", Value::Object(data));
        let by_itself = Proposal {
            by: Principal::token("ci", Role::Agent),
            ..asking(hour)
        };
        assert!(matches!(resolves(&own, &by_itself), Err(Undecided::Invalid(_))));
        assert!(resolves(&own, &asking(hour)).is_ok(), "an approver may give it");
    }

    #[test]
    fn self_approval_lets_the_caller_approve_and_nobody_unlisted() {
        let listed = ["user:ada".to_owned()];
        let data = approvals::request_data("demo", "echo", &json!({}), "ada", &listed, true, 1);
        let view = pending(RequestKind::Approval, "ada", Value::Object(data));
        assert_eq!(
            may_answer(&view, &Principal::token("ops", Role::Admin)),
            Err(Refusal::NotAnApprover("ops".into()))
        );
        assert_eq!(
            may_answer(&view, &Principal::token("ada", Role::Agent)),
            Err(Refusal::NotAnApprover("ada".into())),
            "a token is no user: entry"
        );
        let data = approvals::request_data("demo", "echo", &json!({}), "ada", &[], true, 1);
        let view = pending(RequestKind::Approval, "ada", Value::Object(data));
        assert_eq!(may_answer(&view, &Principal::token("ada", Role::Agent)), Ok(()));
    }

    #[test]
    fn without_tokens_the_one_anonymous_principal_answers_everything() {
        let anonymous = Principal::anonymous();
        for approvers in [vec![], vec!["on-call".to_owned()]] {
            let data = approvals::request_data("demo", "echo", &json!({}), ANONYMOUS, &approvers, false, 1);
            let view = pending(RequestKind::Approval, ANONYMOUS, Value::Object(data));
            assert_eq!(may_answer(&view, &anonymous), Ok(()));
        }
    }

    #[test]
    fn a_posted_request_maps_to_no_result_and_an_authorization_to_none_of_its_data() {
        let mut posted = pending(RequestKind::Input, "ada", form());
        posted.server = None;
        let decision = resolves(&posted, &proposal("ada", Role::Agent, None)).unwrap();
        assert_eq!(
            (decision.answer.data, decision.result),
            (json!({"size": 3}).as_object().cloned(), None)
        );

        let authorization = pending(RequestKind::Authorization, "ada", Value::Null);
        let decision = resolves(
            &authorization,
            &proposal("ada", Role::Agent, Some(json!({"code": "x"}))),
        )
        .unwrap();
        assert_eq!(decision.result.unwrap().content, None);
    }

    #[test]
    fn an_upstream_that_withdrew_or_stopped_waiting_says_so() {
        let upstream = Upstream::default();
        assert_eq!(upstream.withdrawal(), None);
        upstream.stopped.cancel();
        assert_eq!(upstream.withdrawal().as_deref(), Some(STOPPED_LISTENING));
        upstream.withdrawn.cancel();
        assert_eq!(upstream.withdrawal().as_deref(), Some(WITHDREW));
    }
}
