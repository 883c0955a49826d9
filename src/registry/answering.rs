//! Property test of who may answer: over principals of every role, Requests of every kind (approvals that hold
//! a call, posted Requests of kind `approval`, elicitations of a principal's call or of nobody's) and both ways
//! in (answered at once; or checked first and answered after, as a door whose answer has effects of its own
//! does), an answer is taken exactly
//! when an independent statement of the rule allows it — so an approval is only ever answered by an allowed
//! approver — and a refused one changes nothing.

use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::approvals;
use crate::auth::Role;
use crate::ids::{self, RequestId};
use crate::store::Location;
use crate::suspension::RequestKind;

/// The principals, by name and role; approvals name `on-call` and `ops` among their approvers.
const PRINCIPALS: [(&str, Role); 6] = [
    ("ada", Role::Agent),
    ("bob", Role::Agent),
    ("lead", Role::Approver),
    ("on-call", Role::Approver),
    ("ops", Role::Admin),
    ("root", Role::Admin),
];

/// The approver lists a policy may give.
const LISTS: [&[&str]; 3] = [&[], &["on-call"], &["ops", "lead"]];

/// What a Request is, and whose.
#[derive(Debug, Clone, Copy)]
enum Kind {
    /// An approval that holds a call of `owner`'s, under a policy listing `LISTS[list]`.
    Gated { owner: usize, list: usize },
    /// A Request of kind `approval` posted by `owner`: nothing waits on it.
    PostedApproval { owner: usize },
    /// An elicitation of a call of `owner`'s, or of nobody's (a shared session's that could not be told).
    Elicited { owner: Option<usize> },
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Raise(Kind),
    Answer {
        target: usize,
        by: usize,
        /// Checked first, then answered (as a door does whose answer has effects of its own), or answered at once.
        checked_first: bool,
        ok: bool,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let owner = 0..PRINCIPALS.len();
    let kind = prop_oneof![
        (owner.clone(), 0..LISTS.len()).prop_map(|(owner, list)| Kind::Gated { owner, list }),
        owner.clone().prop_map(|owner| Kind::PostedApproval { owner }),
        prop::option::of(owner).prop_map(|owner| Kind::Elicited { owner }),
    ];
    prop_oneof![
        1 => kind.prop_map(Op::Raise),
        3 => (0..16usize, 0..PRINCIPALS.len(), any::<bool>(), any::<bool>())
            .prop_map(|(target, by, checked_first, ok)| Op::Answer { target, by, checked_first, ok }),
    ]
}

fn principal(index: usize) -> Principal {
    let (name, role) = PRINCIPALS[index];
    Principal::token(name, role)
}

/// The rule, stated on its own: an agent answers only what is its own and never an approval that holds a call;
/// nobody approves their own call; a policy's list, when it has one, is the only ones who may approve.
fn allowed(kind: Kind, by: usize) -> bool {
    let (name, role) = PRINCIPALS[by];
    let own = |owner: Option<usize>| owner == Some(by);
    match kind {
        Kind::Gated { owner, list } => {
            role != Role::Agent && owner != by && (LISTS[list].is_empty() || LISTS[list].contains(&name))
        }
        Kind::PostedApproval { owner } => role != Role::Agent || own(Some(owner)),
        Kind::Elicited { owner } => role != Role::Agent || own(owner),
    }
}

struct Raised {
    id: RequestId,
    kind: Kind,
    /// Kept so that the approval's waiter still listens.
    _waiting: Option<Waiting>,
}

async fn raise(registry: &Registry, kind: Kind) -> Raised {
    let origin = |owner: Option<usize>| Origin {
        server: "demo".into(),
        session: None,
        call: None,
        owner: owner.map(|owner| PRINCIPALS[owner].0.to_owned()),
    };
    let (id, waiting) = match kind {
        Kind::Gated { owner, list } => {
            let approvers: Vec<String> = LISTS[list].iter().map(|name| (*name).to_owned()).collect();
            let caller = PRINCIPALS[owner].0;
            let data = approvals::request_data("demo", "echo", &json!({"text": "x"}), caller, &approvers, false, 1);
            let request = Request {
                id: RequestId::mint(ids::APPROVAL),
                kind: RequestKind::Approval,
                prompt: "Allow echo on demo?".into(),
                url: None,
                data: Some(Arc::new(data)),
                expires_at: None,
            };
            let waiting = registry
                .ask_approval(request, None, &origin(Some(owner)))
                .await
                .unwrap();
            (waiting.id.clone(), Some(waiting))
        }
        Kind::PostedApproval { owner } => {
            let body = json!({"kind": "approval", "prompt": "Ship it?"});
            let posted = Posted::parse(body.as_object().unwrap(), registry.clock().now()).unwrap();
            let view = registry.post(posted, PRINCIPALS[owner].0).await.unwrap();
            (view.request.id, None)
        }
        Kind::Elicited { owner } => {
            let params = json!({"message": "Confirm?", "requestedSchema": {"type": "object",
                "properties": {"confirm": {"type": "boolean"}}}});
            let waiting = registry
                .ask(params, &origin(owner), CancellationToken::new())
                .await
                .unwrap();
            (waiting.id.clone(), Some(waiting))
        }
    };
    Raised {
        id,
        kind,
        _waiting: waiting,
    }
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let (_, registry) = Registry::opened(&Location::Memory, "replica-under-test", Duration::from_secs(3600)).await;
        let mut raised: Vec<Raised> = Vec::new();
        for op in ops {
            match op {
                Op::Raise(kind) => raised.push(raise(&registry, kind).await),
                Op::Answer { .. } if raised.is_empty() => {}
                Op::Answer {
                    target,
                    by,
                    checked_first,
                    ok,
                } => {
                    let entry = &raised[target % raised.len()];
                    let before = registry.get(&entry.id).await.unwrap().unwrap();
                    let answer: Answer = serde_json::from_value(json!({"ok": ok})).unwrap();
                    let principal = principal(by);
                    let result = if checked_first {
                        match registry.check_answerer(&entry.id, &principal).await {
                            Ok(()) => registry.answer(&entry.id, &principal, answer).await,
                            Err(refused) => Err(refused),
                        }
                    } else {
                        registry.answer(&entry.id, &principal, answer).await
                    };
                    let after = registry.get(&entry.id).await.unwrap().unwrap();
                    if allowed(entry.kind, by) {
                        prop_assert!(!matches!(result, Err(AnswerError::Refused(_))), "{result:?}");
                        if before.status == Status::Pending {
                            prop_assert_eq!(after.answered_by.as_deref(), Some(PRINCIPALS[by].0));
                        }
                    } else {
                        prop_assert!(
                            matches!(result, Err(AnswerError::Refused(_))),
                            "{:?}: {result:?}",
                            entry.kind
                        );
                        prop_assert_eq!(before, after, "a refused answer changed the Request");
                    }
                }
            }
        }
        for entry in &raised {
            let view = registry.get(&entry.id).await.unwrap().unwrap();
            if let Some(by) = &view.answered_by {
                let index = PRINCIPALS.iter().position(|(name, _)| name == by).unwrap();
                prop_assert!(allowed(entry.kind, index), "{by} answered {:?}", entry.kind);
            }
        }
        Ok(())
    })
}

proptest! {
    #[test]
    fn only_an_allowed_principal_answers_and_an_approval_only_an_allowed_approver(
        ops in prop::collection::vec(op(), 1..40)
    ) {
        run(ops)?;
    }
}
