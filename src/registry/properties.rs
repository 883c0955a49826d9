//! Property tests of the Request state machine, in both stores: pending, then exactly one terminal status,
//! never changed, with one outcome delivered to whatever waited on it, and what it received agreeing with
//! the status.

use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;
use crate::store::Location;
use crate::suspension::RequestKind;

const TTL: Duration = Duration::from_secs(30);

/// One step of a run; `target` picks a Request by index among those raised so far.
#[derive(Debug, Clone)]
enum Op {
    Ask {
        url: bool,
    },
    Answer {
        target: usize,
        answer: Reply,
    },
    /// The answer that resolved the Request, sent again.
    Replay {
        target: usize,
    },
    Cancel {
        target: usize,
        tell: bool,
    },
    /// The upstream withdraws the elicitation.
    Withdraw {
        target: usize,
    },
    /// The upstream stops listening without a word.
    Drop {
        target: usize,
    },
    Advance {
        seconds: u64,
    },
}

/// What an answer says.
#[derive(Debug, Clone, Copy)]
enum Reply {
    Accept,
    AcceptInvalid,
    Declined,
    Other,
}

fn op() -> impl Strategy<Value = Op> {
    let target = 0..8usize;
    let reply = prop_oneof![
        Just(Reply::Accept),
        Just(Reply::AcceptInvalid),
        Just(Reply::Declined),
        Just(Reply::Other)
    ];
    prop_oneof![
        2 => any::<bool>().prop_map(|url| Op::Ask { url }),
        3 => (target.clone(), reply).prop_map(|(target, answer)| Op::Answer { target, answer }),
        1 => target.clone().prop_map(|target| Op::Replay { target }),
        1 => (target.clone(), any::<bool>()).prop_map(|(target, tell)| Op::Cancel { target, tell }),
        1 => target.clone().prop_map(|target| Op::Withdraw { target }),
        1 => target.prop_map(|target| Op::Drop { target }),
        1 => (1..40u64).prop_map(|seconds| Op::Advance { seconds }),
    ]
}

fn answer(reply: Reply) -> Answer {
    let value = match reply {
        Reply::Accept => json!({"ok": true, "data": {"confirm": true}}),
        Reply::AcceptInvalid => json!({"ok": true, "data": {"confirm": "yes"}}),
        Reply::Declined => json!({"ok": false, "reason": "declined"}),
        Reply::Other => json!({"ok": false}),
    };
    serde_json::from_value(value).unwrap()
}

/// What the test knows about one Request.
struct Tracked {
    id: crate::ids::RequestId,
    waiting: Option<Waiting>,
    withdrawn: CancellationToken,
    received: Option<Outcome>,
    /// The view as it was when it left `pending`.
    resolved: Option<Value>,
    /// The answer that resolved it, for replays.
    answered_with: Option<Answer>,
    /// When it expires unless resolved before.
    deadline: Timestamp,
}

/// A run's registry and the test's own clock, ahead of the wall clock by what `Advance` added.
struct World {
    registry: Registry,
    advanced: Duration,
}

impl World {
    fn now(&self) -> Timestamp {
        self.registry.clock().now().after(self.advanced)
    }
}

fn run(location: &Location, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let (store, registry) = Registry::opened(location, "replica-under-test", TTL).await;
        let mut world = World {
            registry,
            advanced: Duration::ZERO,
        };
        let mut tracked: Vec<Tracked> = Vec::new();
        for op in ops {
            step(&mut world, &mut tracked, op).await?;
            check(&world, &mut tracked).await?;
        }
        if let Store::Sqlite(sqlite) = &store {
            sqlite.close();
        }
        Ok(())
    })
}

async fn step(world: &mut World, tracked: &mut Vec<Tracked>, op: Op) -> Result<(), TestCaseError> {
    let registry = world.registry.clone();
    let pick = |target: usize| (!tracked.is_empty()).then(|| target % tracked.len());
    match op {
        Op::Ask { url } => {
            let params = if url {
                json!({"mode": "url", "message": "Log in", "url": "https://example.com/login", "elicitationId": "e"})
            } else {
                json!({"message": "Confirm?", "requestedSchema": {"type": "object", "properties": {
                    "confirm": {"type": "boolean"}, "note": {"type": "string", "default": ""}}, "required": ["confirm"]}})
            };
            let origin = Origin {
                server: "demo".into(),
                session: Some(crate::ids::SessionId::stored("ses-1")),
                call: None,
                owner: None,
            };
            let withdrawn = CancellationToken::new();
            let before = registry.clock().now();
            let waiting = registry.ask(params, &origin, withdrawn.clone()).await.unwrap();
            tracked.push(Tracked {
                id: waiting.id.clone(),
                waiting: Some(waiting),
                withdrawn,
                received: None,
                resolved: None,
                answered_with: None,
                deadline: before.after(TTL),
            });
        }
        Op::Answer { target, answer: reply } => {
            let Some(index) = pick(target) else { return Ok(()) };
            let entry = &mut tracked[index];
            let before = registry.get(&entry.id).await.unwrap().unwrap();
            let given = answer(reply);
            let result = registry.answer(&entry.id, &admin("tester"), given.clone()).await;
            let gone = entry.withdrawn.is_cancelled() || (entry.waiting.is_none() && entry.received.is_none());
            match before.status {
                // Withdrawn, whatever the answer holds.
                Status::Pending if gone => {
                    prop_assert!(
                        matches!(
                            result,
                            Err(AnswerError::Gone {
                                status: Status::Cancelled,
                                ..
                            })
                        ),
                        "{result:?}"
                    );
                }
                Status::Pending
                    if matches!(reply, Reply::AcceptInvalid) && before.request.kind == RequestKind::Input =>
                {
                    prop_assert!(matches!(result, Err(AnswerError::Invalid(_))), "{result:?}");
                }
                Status::Pending => {
                    let answered = result.unwrap();
                    prop_assert_eq!(answered.view.status, Status::Answered);
                    // The answer's response is its event's data, so that must be the view, byte for byte.
                    let event = answered
                        .event
                        .expect("an answer that resolves records request.resolved");
                    prop_assert_eq!(&event.data, &serde_json::to_string(&answered.view).unwrap());
                    entry.answered_with = Some(given);
                }
                Status::Answered if entry.answered_with.as_ref() == Some(&given) => {
                    let answered = result.unwrap();
                    prop_assert!(answered.event.is_none());
                    let view = serde_json::to_value(answered.view).unwrap();
                    prop_assert_eq!(Some(view), entry.resolved.clone());
                }
                Status::Answered => prop_assert!(matches!(result, Err(AnswerError::Conflict(_))), "{result:?}"),
                status => prop_assert!(
                    matches!(result, Err(AnswerError::Gone { status: gone, .. }) if gone == status),
                    "{result:?}"
                ),
            }
        }
        Op::Replay { target } => {
            let Some(index) = pick(target) else { return Ok(()) };
            let entry = &tracked[index];
            if let Some(given) = entry.answered_with.clone() {
                let view = registry
                    .answer(&entry.id, &admin("someone else"), given)
                    .await
                    .unwrap()
                    .view;
                prop_assert_eq!(Some(serde_json::to_value(view).unwrap()), entry.resolved.clone());
            }
        }
        Op::Cancel { target, tell } => {
            let Some(index) = pick(target) else { return Ok(()) };
            let id = tracked[index].id.clone();
            let pending = registry.get(&id).await.unwrap().unwrap().status == Status::Pending;
            let tell = if tell { Tell::Cancel } else { Tell::Nothing };
            let cancelled = registry
                .cancel(Pending::Ids(vec![id.clone()]), "cancelled by the test", tell)
                .await
                .unwrap();
            prop_assert_eq!(cancelled, usize::from(pending));
            if pending {
                prop_assert_eq!(registry.get(&id).await.unwrap().unwrap().status, Status::Cancelled);
            }
        }
        Op::Withdraw { target } => {
            let Some(index) = pick(target) else { return Ok(()) };
            tracked[index].withdrawn.cancel();
        }
        Op::Drop { target } => {
            let Some(index) = pick(target) else { return Ok(()) };
            tracked[index].waiting = None;
        }
        Op::Advance { seconds } => {
            world.advanced += Duration::from_secs(seconds);
            let now = world.now();
            let mut due = Vec::new();
            for entry in tracked.iter().filter(|entry| entry.deadline <= now) {
                if registry.get(&entry.id).await.unwrap().unwrap().status == Status::Pending {
                    due.push(entry);
                }
            }
            registry.expire_at(now).await.unwrap();
            for entry in due {
                prop_assert_eq!(registry.get(&entry.id).await.unwrap().unwrap().status, Status::Expired);
            }
        }
    }
    Ok(())
}

/// Every Request is pending or has kept the terminal view it first reached, with its one outcome delivered.
async fn check(world: &World, tracked: &mut [Tracked]) -> Result<(), TestCaseError> {
    let registry = &world.registry;
    let mut pending = 0;
    for entry in tracked.iter_mut() {
        if let Some(waiting) = entry.waiting.as_mut() {
            match waiting.outcome.try_recv() {
                Ok(outcome) => {
                    prop_assert!(entry.received.is_none());
                    entry.received = Some(outcome);
                    entry.waiting = None;
                }
                Err(oneshot::error::TryRecvError::Empty) => {}
                Err(oneshot::error::TryRecvError::Closed) => {
                    prop_assert!(false, "{} was dropped without an outcome", entry.id)
                }
            }
        }
        let view = registry.get(&entry.id).await.unwrap().unwrap();
        if view.status == Status::Pending {
            pending += 1;
            prop_assert!(entry.resolved.is_none(), "{} went back to pending", entry.id);
            prop_assert!(entry.received.is_none(), "{} got an outcome while pending", entry.id);
            continue;
        }
        let wire = serde_json::to_value(&view).unwrap();
        match &entry.resolved {
            Some(resolved) => prop_assert_eq!(resolved, &wire, "{} changed after resolution", &entry.id),
            None => entry.resolved = Some(wire),
        }
        let result = view.result.as_ref().map(|result| serde_json::to_value(result).unwrap());
        match (&entry.received, view.status) {
            (Some(Outcome::Reply(sent)), Status::Answered | Status::Expired | Status::Cancelled) => {
                prop_assert_eq!(&Some(serde_json::to_value(sent).unwrap()), &result);
            }
            (Some(Outcome::Withdrawn(_)), Status::Cancelled) => prop_assert_eq!(&result, &None),
            (None, _) => prop_assert!(entry.waiting.is_none(), "{} is resolved but sent nothing", entry.id),
            (received, status) => prop_assert!(false, "{status:?} with {received:?}"),
        }
        if view.status == Status::Expired {
            prop_assert_eq!(result, Some(json!({"action": "cancel"})));
        }
    }
    prop_assert_eq!(registry.pending_count().await.unwrap(), pending);
    let only_pending = Filter {
        status: Some(Status::Pending),
        ..Filter::default()
    };
    let (listed, _) = registry.list(&only_pending, 0, usize::MAX).await.unwrap();
    prop_assert_eq!(listed.len(), pending);
    // Listing pending Requests gives exactly those whose status is pending, in the same order.
    let (every, _) = registry.list(&Filter::default(), 0, usize::MAX).await.unwrap();
    let ids = |views: &[RequestView]| views.iter().map(|view| view.request.id.clone()).collect::<Vec<_>>();
    let pending_in_full: Vec<RequestView> = every
        .into_iter()
        .filter(|view| view.status == Status::Pending)
        .collect();
    prop_assert_eq!(ids(&listed), ids(&pending_in_full));
    Ok(())
}

proptest! {
    #[test]
    fn requests_resolve_exactly_once_and_stay_resolved_in_memory(ops in prop::collection::vec(op(), 1..60)) {
        run(&Location::Memory, ops)?;
    }
}

proptest! {
    // Each change waits for a sync to disk, so fewer runs.
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn requests_resolve_exactly_once_and_stay_resolved_in_sqlite(ops in prop::collection::vec(op(), 1..60)) {
        let dir = tempfile::tempdir().unwrap();
        run(&Location::Sqlite(dir.path().join("store.sqlite3")), ops)?;
    }
}

/// An admin called `name`, who may answer every Request these tests raise.
fn admin(name: &str) -> crate::auth::Principal {
    crate::auth::Principal::token(name, crate::auth::Role::Admin)
}
