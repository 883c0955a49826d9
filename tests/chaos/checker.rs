//! The checker: the rules a history and the final state must keep, each with the name a failure prints.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::history::{Op, Record};
use crate::state::Final;

/// One broken rule.
#[derive(Debug)]
pub struct Violation {
    pub rule: &'static str,
    pub detail: String,
    /// The operations involved, by number.
    pub ops: Vec<u64>,
}

/// Checks every rule; returns what broke them.
pub fn check(record: &Record, state: &Final) -> Vec<Violation> {
    let mut found = Vec::new();
    let answers = answers(&record.ops);
    acknowledged_answers_kept(&answers, state, &mut found);
    one_winning_answer(&answers, &mut found);
    upstream_got_the_winner(state, &mut found);
    approved_forwarded_once(record, state, &mut found);
    events_in_order_without_gaps(record, state, &mut found);
    webhooks_delivered(record, state, &mut found);
    nothing_stuck_after_healing(state, &mut found);
    errors_as_documented(&record.ops, &mut found);
    long_polls_hold(&record.ops, &mut found);
    found
}

/// The answer operations, by Request id.
fn answers(ops: &[Op]) -> BTreeMap<String, Vec<&Op>> {
    let mut answers: BTreeMap<String, Vec<&Op>> = BTreeMap::new();
    for op in ops.iter().filter(|op| op.method == "POST") {
        let path = op.path.split('?').next().unwrap_or_default();
        if let Some(id) = path
            .strip_prefix("/requests/")
            .and_then(|rest| rest.strip_suffix("/answer"))
        {
            answers.entry(id.to_owned()).or_default().push(op);
        }
    }
    answers
}

/// Rule 1: every answer that got `200` is in the final state, unchanged.
fn acknowledged_answers_kept(answers: &BTreeMap<String, Vec<&Op>>, state: &Final, found: &mut Vec<Violation>) {
    for (id, ops) in answers {
        for op in ops.iter().filter(|op| op.status == Some(200)) {
            let kept = state.requests.get(id);
            let answer = kept.map(|request| &request["answer"]);
            if answer != Some(&op.response["answer"]) {
                found.push(Violation {
                    rule: "acknowledged-answers-kept",
                    detail: format!(
                        "{id}: answered {} with 200, the final state has {}",
                        op.response["answer"],
                        kept.map_or("no Request".to_owned(), Value::to_string)
                    ),
                    ops: vec![op.op],
                });
            }
        }
    }
}

/// Rule 2: each Request has one winning answer; an identical replay may be `200`, any other answer is
/// `409`/`410` (or found no store to decide in: `503`, or no response).
fn one_winning_answer(answers: &BTreeMap<String, Vec<&Op>>, found: &mut Vec<Violation>) {
    for (id, ops) in answers {
        let won: Vec<&&Op> = ops.iter().filter(|op| op.status == Some(200)).collect();
        let winners: BTreeSet<String> = won.iter().map(|op| op.response["answer"].to_string()).collect();
        if winners.len() > 1 {
            found.push(Violation {
                rule: "one-winning-answer",
                detail: format!("{id}: 200 for different answers: {winners:?}"),
                ops: won.iter().map(|op| op.op).collect(),
            });
        }
        for op in ops {
            if !matches!(op.status, None | Some(200 | 409 | 410 | 503)) {
                found.push(Violation {
                    rule: "one-winning-answer",
                    detail: format!("{id}: an answer got {:?}, neither 200 nor 409/410", op.status),
                    ops: vec![op.op],
                });
            }
        }
    }
}

/// The rounds a tool of the demo server asks, by name.
fn rounds(tool: &str) -> Option<usize> {
    match tool {
        "confirm_action" => Some(1),
        "two_step" => Some(2),
        _ => None,
    }
}

/// Rule 3: what the upstream received is the winning answer (as the Request's `result` says it was sent), and a
/// completed call's result takes each round once.
fn upstream_got_the_winner(state: &Final, found: &mut Vec<Violation>) {
    for (id, call) in &state.calls {
        let tool = call["tool"].as_str().unwrap_or_default();
        let (Some(rounds), Some(tag)) = (rounds(tool), call["arguments"]["action"].as_str()) else {
            continue;
        };
        let requests: Vec<&Value> = call["requests"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|request| state.requests.get(request.as_str().unwrap_or_default()))
            .collect();
        let sent = |round: usize| {
            requests
                .get(round)
                .map(|request| &request["result"])
                .filter(|r| !r.is_null())
        };
        for line in &state.journal {
            if line["result"] != tool || line["arguments"]["action"] != tag {
                continue;
            }
            let round = line["round"].as_u64().unwrap_or(u64::MAX) as usize;
            if sent(round) != Some(&line["received"]) {
                found.push(Violation {
                    rule: "upstream-got-the-winner",
                    detail: format!(
                        "call {id} ({tag}): round {round} reached the upstream as {}, the Request says {}",
                        line["received"],
                        sent(round).map_or("nothing was sent".to_owned(), Value::to_string)
                    ),
                    ops: Vec::new(),
                });
            }
        }
        if call["status"] == "completed" {
            let results = call["result"]["structuredContent"]["results"].as_array();
            let expected: Option<Vec<&Value>> = (0..rounds).map(sent).collect();
            let taken: Option<Vec<&Value>> = results.map(|results| results.iter().collect());
            if taken != expected {
                found.push(Violation {
                    rule: "upstream-got-the-winner",
                    detail: format!(
                        "call {id} ({tag}) completed with {}, its Requests sent {expected:?}",
                        call["result"]["structuredContent"]
                    ),
                    ops: Vec::new(),
                });
            }
        }
    }
}

/// The faults after which a 2026-07-28 call handed to its session may be sent again: its gateway killed, or a
/// replica taken for gone (stopped or cut off past the lease) whose calls another ends.
const LOSES_HANDOFF: [&str; 3] = ["kill-9", "pause-past-lease", "partition"];

/// Rule 4: an approved call is forwarded at most once, and exactly once when it completed; one not approved
/// never. The one exception README documents: a 2026-07-28 call handed to its session when its gateway was
/// killed, or its replica taken for gone, is sent again (at least once), so it may arrive twice after such a
/// fault that came after its approval.
fn approved_forwarded_once(record: &Record, state: &Final, found: &mut Vec<Violation>) {
    for (id, call) in &state.calls {
        let Some(tag) = call["arguments"]["text"].as_str().filter(|_| call["tool"] == "echo") else {
            continue;
        };
        let forwarded = state
            .journal
            .iter()
            .filter(|line| line["call"] == "echo" && line["arguments"]["text"] == tag)
            .count();
        let approval = call["requests"][0]
            .as_str()
            .and_then(|request| state.requests.get(request));
        let approved = approval.is_some_and(|request| request["answer"]["ok"] == true);
        let approved_at = approval
            .and_then(|request| request["id"].as_str())
            .and_then(|request| first_answered(record, request));
        let killed_after = approved_at.is_some_and(|at| {
            record
                .faults
                .iter()
                .any(|fault| LOSES_HANDOFF.contains(&fault.fault.as_str()) && fault.end >= at)
        });
        let most = if !approved {
            0
        } else if call["server"] == "modern" && killed_after {
            2
        } else {
            1
        };
        let least = usize::from(approved && call["status"] == "completed");
        if forwarded < least || forwarded > most {
            found.push(Violation {
                rule: "approved-forwarded-once",
                detail: format!(
                    "call {id} ({tag}, {}, approved: {approved}) reached the upstream {forwarded} times",
                    call["status"]
                ),
                ops: Vec::new(),
            });
        }
    }
}

/// When the first answer to `request` was sent (whatever came back: a kill may cut off the `200` of an answer
/// that was kept), in ms since the start.
fn first_answered(record: &Record, request: &str) -> Option<u64> {
    let path = format!("/requests/{request}/answer");
    record
        .ops
        .iter()
        .filter(|op| op.path.starts_with(&path))
        .map(|op| op.start)
        .min()
}

/// Rule 5: each consumer sees ids strictly increasing, none twice, and on each connection every event the log
/// holds after the id it resumed from (or after a `resync`), none that the log does not hold.
fn events_in_order_without_gaps(record: &Record, state: &Final, found: &mut Vec<Violation>) {
    let log: BTreeMap<u64, &str> = state.log.iter().map(|(id, kind, _)| (*id, kind.as_str())).collect();
    let consumers: BTreeSet<usize> = record.seen.iter().map(|seen| seen.consumer).collect();
    for consumer in consumers {
        let seen: Vec<_> = record.seen.iter().filter(|seen| seen.consumer == consumer).collect();
        let mut previous: Option<u64> = None;
        // The id after which the connection's events must follow the log without a gap, when known.
        let mut after: Option<u64> = None;
        let mut connection = None;
        for event in seen {
            let rule = |detail: String| Violation {
                rule: "events-in-order-without-gaps",
                detail: format!("consumer {consumer}, connection {}: {detail}", event.connection),
                ops: Vec::new(),
            };
            if connection != Some(event.connection) {
                connection = Some(event.connection);
                after = event.resumed;
            }
            if event.event == "resync" {
                if previous.is_some_and(|previous| event.id < previous) {
                    found.push(rule(format!("a resync at {} after event {previous:?}", event.id)));
                }
                after = Some(event.id);
                continue;
            }
            if previous.is_some_and(|previous| event.id <= previous) {
                found.push(rule(format!("event {} after event {previous:?}", event.id)));
            }
            match log.get(&event.id) {
                Some(kind) if *kind == event.event => {}
                other => found.push(rule(format!(
                    "event {} {} is {other:?} in the log",
                    event.id, event.event
                ))),
            }
            if let Some(after) = after {
                let missed: Vec<u64> = log.range(after + 1..event.id).map(|(id, _)| *id).collect();
                if !missed.is_empty() {
                    found.push(rule(format!(
                        "events {missed:?} of the log were missed between {after} and {}",
                        event.id
                    )));
                }
            }
            previous = Some(event.id);
            after = Some(event.id);
        }
    }
}

/// Rule 6: every event of the log was delivered to the webhook at least once, each time with the same
/// delivery id (the event's) and the same body.
fn webhooks_delivered(record: &Record, state: &Final, found: &mut Vec<Violation>) {
    let mut bodies: BTreeMap<&str, &Value> = BTreeMap::new();
    for delivery in &record.deliveries {
        let id = delivery.webhook_id.as_str();
        if delivery.body["id"].as_u64().map(|event| event.to_string()).as_deref() != Some(id) {
            found.push(Violation {
                rule: "webhooks-delivered",
                detail: format!("delivery id {id} for event {}", delivery.body["id"]),
                ops: Vec::new(),
            });
        }
        match bodies.get(id) {
            Some(body) if *body != &delivery.body => found.push(Violation {
                rule: "webhooks-delivered",
                detail: format!("delivery {id} made with two bodies: {body} and {}", delivery.body),
                ops: Vec::new(),
            }),
            _ => {
                bodies.insert(id, &delivery.body);
            }
        }
    }
    let accepted = record.accepted();
    let missing: Vec<u64> = state
        .log
        .iter()
        .map(|(id, _, _)| *id)
        .filter(|id| !accepted.contains(id.to_string().as_str()))
        .collect();
    if !missing.is_empty() {
        found.push(Violation {
            rule: "webhooks-delivered",
            detail: format!("events never delivered: {missing:?}"),
            ops: Vec::new(),
        });
    }
}

/// Rule 7: after healing, once the ttl has passed, no Request is pending (each is past its `expiresAt`), no
/// call is `running`, and a call `input_required` waits on a pending Request.
fn nothing_stuck_after_healing(state: &Final, found: &mut Vec<Violation>) {
    for (id, request) in &state.requests {
        if request["status"] == "pending" && request["kind"] != "marker" {
            found.push(Violation {
                rule: "nothing-stuck-after-healing",
                detail: format!("{id} is pending past its expiresAt {}", request["expiresAt"]),
                ops: Vec::new(),
            });
        }
    }
    for (id, call) in &state.calls {
        if matches!(call["status"].as_str(), Some("running" | "input_required")) {
            found.push(Violation {
                rule: "nothing-stuck-after-healing",
                detail: format!(
                    "call {id} ({}) is {} after healing and the ttl",
                    call["tool"], call["status"]
                ),
                ops: Vec::new(),
            });
        }
    }
}

/// The statuses README's API section gives a route for a client's faults, by method and route.
fn documented(method: &str, path: &str) -> &'static [u16] {
    let path = path.split('?').next().unwrap_or_default();
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match (method, segments.as_slice()) {
        ("POST", ["requests", _, "answer"]) => &[400, 404, 409, 410, 413, 415, 422, 429],
        ("GET", ["requests", _]) | ("GET", ["calls", _]) => &[400, 404, 429],
        ("GET", ["requests"]) | ("GET", ["calls"]) | ("GET", ["events"]) => &[400, 429],
        ("POST", ["requests"]) => &[400, 409, 413, 415, 422, 429],
        ("POST", ["calls"]) => &[400, 413, 415, 429],
        ("DELETE", ["calls", _]) => &[404],
        ("POST", ["mcp"]) | ("DELETE", ["mcp"]) => &[400, 404, 413, 415, 429],
        _ => &[],
    }
}

/// Rule 8: no `5xx` but a `503` with `Retry-After`; every `4xx` a problem+json with a status README documents
/// for its route.
fn errors_as_documented(ops: &[Op], found: &mut Vec<Violation>) {
    for op in ops {
        let Some(status) = op.status.filter(|status| *status >= 400) else {
            continue;
        };
        let problem = op.content_type.starts_with("application/problem+json")
            && op.response["status"] == status
            && op.response["title"].is_string()
            && op.response["type"].is_string();
        let fault = if status >= 500 {
            (status != 503 || !op.retry_after || !problem)
                .then(|| format!("{status} (Retry-After: {}, problem+json: {problem})", op.retry_after))
        } else if !problem {
            Some(format!(
                "{status} that is no problem+json: {} {}",
                op.content_type, op.response
            ))
        } else if !documented(&op.method, &op.path).contains(&status) {
            Some(format!(
                "{status}, which README does not give {} {}",
                op.method, op.path
            ))
        } else {
            None
        };
        if let Some(detail) = fault {
            found.push(Violation {
                rule: "errors-as-documented",
                detail,
                ops: vec![op.op],
            });
        }
    }
}

/// Beyond the eight: a long-poll on one call or Request holds while it is `running` (or `pending`) until
/// its `wait` passes; one that answered `200` with that status sooner (by more than half a second) did not.
fn long_polls_hold(ops: &[Op], found: &mut Vec<Violation>) {
    for op in ops.iter().filter(|op| op.method == "GET" && op.status == Some(200)) {
        let Some((path, query)) = op.path.split_once('?') else {
            continue;
        };
        let Some(wait) = query.strip_prefix("wait=").and_then(|wait| wait.parse::<u64>().ok()) else {
            continue;
        };
        let waiting = match path.trim_start_matches('/').split('/').collect::<Vec<_>>().as_slice() {
            ["calls", _] => "running",
            ["requests", _] => "pending",
            _ => continue,
        };
        let held = op.end.saturating_sub(op.start);
        if op.response["status"] == waiting && held + 500 < wait * 1000 {
            found.push(Violation {
                rule: "long-polls-hold",
                detail: format!("{} answered {waiting} after {held} ms of a wait of {wait} s", op.path),
                ops: vec![op.op],
            });
        }
    }
}
