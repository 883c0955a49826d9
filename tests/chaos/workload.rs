//! The workload: concurrent clients, each running seeded scenarios in turn — calls in both eras over REST and
//! over `/mcp`, approvals, posted Requests — and answering what they raise from several clients at once, with
//! identical replays, conflicting answers, cancellations and Requests left to expire.

use std::collections::HashSet;
use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};

use crate::api::{Api, Reply};
use crate::random::Rng;

/// What a client does with a Request it finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Plan {
    Accept,
    Decline,
    Cancel,
    /// Leaves it to expire.
    Abandon,
    /// Accepts it while another client cancels its call.
    CancelCall,
}

/// A scenario a client runs.
#[derive(Debug, Clone, Copy)]
enum Scenario {
    /// `confirm_action` (or, in 2026-07-28, `two_step`) started with `POST /calls`.
    Elicitation,
    /// `echo`, which waits for approval, started with `POST /calls`.
    Approval,
    /// Either of them through `/mcp` (a 2026-07-28 client).
    FrontDoor,
    /// A Request posted with `POST /requests`.
    Posted,
}

const SCENARIOS: [(Scenario, u64); 4] = [
    (Scenario::Elicitation, 35),
    (Scenario::Approval, 25),
    (Scenario::FrontDoor, 15),
    (Scenario::Posted, 25),
];

const PLANS: [(Plan, u64); 5] = [
    (Plan::Accept, 50),
    (Plan::Decline, 15),
    (Plan::Cancel, 5),
    (Plan::Abandon, 8),
    (Plan::CancelCall, 10),
];

/// The era's server, by a coin.
fn era(rng: &mut Rng) -> &'static str {
    if rng.chance(0.5) { "legacy" } else { "modern" }
}

/// Runs client `me` of `apis` until `until`, its scenarios drawn from `rng`; each scenario's calls and
/// Requests carry a tag of their own (`s7-c1-n12-`), by which the checker and the upstream's journal know them.
pub async fn client(apis: Vec<Api>, me: usize, seed: u64, mut rng: Rng, until: tokio::time::Instant) {
    let mut n = 0;
    while tokio::time::Instant::now() < until {
        let tag = format!("s{seed}-c{me}-n{n}-");
        n += 1;
        let mut scenario_rng = rng.fork(n);
        let client = Client { apis: &apis, me, tag };
        match rng.weighted(&SCENARIOS) {
            Scenario::Elicitation => client.elicitation(&mut scenario_rng).await,
            Scenario::Approval => client.approval(&mut scenario_rng).await,
            Scenario::FrontDoor => client.front_door(&mut scenario_rng).await,
            Scenario::Posted => client.posted(&mut scenario_rng).await,
        }
        tokio::time::sleep(rng.millis(0, 200)).await;
    }
}

/// One client running one scenario.
struct Client<'a> {
    apis: &'a [Api],
    me: usize,
    tag: String,
}

impl Client<'_> {
    fn api(&self) -> &Api {
        &self.apis[self.me]
    }

    /// Another client than this one, `k` places on.
    fn other(&self, k: usize) -> &Api {
        &self.apis[(self.me + k) % self.apis.len()]
    }

    async fn elicitation(&self, rng: &mut Rng) {
        let server = era(rng);
        let tool = if server == "modern" && rng.chance(0.3) {
            "two_step"
        } else {
            "confirm_action"
        };
        let wait = [0, 2, 5][rng.below(3) as usize];
        let body = json!({"server": server, "tool": tool, "arguments": {"action": self.tag}});
        let started = self.api().post(&format!("/calls?wait={wait}"), body, wait).await;
        if let Some(id) = started.is(201).then(|| started.body["id"].as_str()).flatten() {
            self.follow(id, rng).await;
        }
    }

    async fn approval(&self, rng: &mut Rng) {
        let body = json!({"server": era(rng), "tool": "echo", "arguments": {"text": self.tag}});
        let started = self.api().post("/calls?wait=2", body, 2).await;
        if let Some(id) = started.is(201).then(|| started.body["id"].as_str()).flatten() {
            self.follow(id, rng).await;
        }
    }

    /// Drives a call to its end: answers each Request it waits on, as the plan drawn for it says.
    async fn follow(&self, call: &str, rng: &mut Rng) {
        let mut left = HashSet::new();
        for _ in 0..6 {
            let read = self.api().get(&format!("/calls/{call}?wait=5"), 5).await;
            match read.status {
                Some(200) => {}
                None | Some(503) => {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    continue;
                }
                Some(_) => return,
            }
            match read.body["status"].as_str() {
                Some("running") => continue,
                Some("input_required") => {}
                _ => return,
            }
            let pending = self.api().get(&format!("/requests?call={call}"), 0).await;
            let requests = pending.body.as_array().cloned().unwrap_or_default();
            let fresh: Vec<Value> = requests
                .into_iter()
                .filter(|request| !left.contains(request["id"].as_str().unwrap_or_default()))
                .collect();
            if fresh.is_empty() {
                return;
            }
            for request in fresh {
                if self.resolve(&request, rng).await == Plan::Abandon {
                    left.insert(request["id"].as_str().unwrap_or_default().to_owned());
                }
            }
        }
    }

    /// A call through `/mcp`, as a 2026-07-28 client or in a 2025-11-25 session, answered over REST while the
    /// client's request is held.
    async fn front_door(&self, rng: &mut Rng) {
        let server = era(rng);
        let (tool, arguments) = if rng.chance(0.5) {
            ("confirm_action", json!({"action": self.tag}))
        } else {
            ("echo", json!({"text": self.tag}))
        };
        let name = format!("{server}__{tool}");
        let session = if rng.chance(0.5) {
            match self.mcp_session().await {
                Some(session) => Some(session),
                None => return,
            }
        } else {
            None
        };
        let mut params = json!({"name": name, "arguments": arguments});
        let mut headers = vec![("mcp-method", "tools/call"), ("mcp-name", name.as_str())];
        match &session {
            Some(session) => headers.push(("mcp-session-id", session.as_str())),
            None => params["_meta"] = modern_meta(),
        }
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params});
        let held = self.mcp(
            body,
            &headers,
            crate::gateways::MAX_HOLD.as_secs() + 2,
            session.is_some(),
        );
        let answering = async {
            for _ in 0..15 {
                let listed = self
                    .other(1)
                    .get(&format!("/requests?server={server}&limit=1000"), 0)
                    .await;
                let mine = listed.body.as_array().and_then(|requests| {
                    requests
                        .iter()
                        .find(|request| request.to_string().contains(&self.tag))
                        .cloned()
                });
                if let Some(request) = mine {
                    self.resolve(&request, rng).await;
                    return;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        };
        futures::join!(held, answering);
        if let Some(session) = &session {
            let headers = [
                ("mcp-session-id", session.as_str()),
                ("mcp-protocol-version", "2025-11-25"),
            ];
            self.api().send(Method::DELETE, "/mcp", Value::Null, &headers, 0).await;
        }
    }

    /// Opens a 2025-11-25 session on `/mcp`: `initialize`, then `notifications/initialized`.
    async fn mcp_session(&self) -> Option<String> {
        let initialize = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "chaos", "version": "1"}}});
        let opened = self.mcp(initialize, &[], 0, false).await;
        let ok = opened.is(200);
        let session = opened.session.filter(|_| ok)?;
        let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        let headers = [("mcp-session-id", session.as_str())];
        self.mcp(initialized, &headers, 0, true).await;
        Some(session)
    }

    /// `POST /mcp` with the headers both eras send, and the era's version header.
    async fn mcp(&self, body: Value, headers: &[(&str, &str)], wait: u64, legacy: bool) -> Reply {
        let version = if legacy { "2025-11-25" } else { "2026-07-28" };
        let mut all = vec![
            ("accept", "application/json, text/event-stream"),
            ("mcp-protocol-version", version),
        ];
        if body["method"] == "initialize" {
            all.pop();
        }
        all.extend_from_slice(headers);
        self.api().send(Method::POST, "/mcp", body, &all, wait).await
    }

    async fn posted(&self, rng: &mut Rng) {
        let id = format!("chaos-{}", self.tag);
        let body = json!({"id": id, "kind": "input", "prompt": format!("Posted {}", self.tag),
            "data": {"schema": {"type": "object", "properties": {"reason": {"type": "string"}}, "required": ["reason"]}}});
        let mut posted = self.api().post("/requests", body.clone(), 0).await;
        if matches!(posted.status, None | Some(503)) {
            // Posting again after a failure is safe: the id makes it a `409` when the first one was kept.
            tokio::time::sleep(Duration::from_millis(500)).await;
            posted = self.api().post("/requests", body, 0).await;
        }
        if !(posted.is(201) || posted.is(409)) {
            return;
        }
        let read = self.api().get(&format!("/requests/{id}"), 0).await;
        if !read.is(200) {
            return;
        }
        let path = format!("/requests/{id}?wait=5");
        let waiting = self.api().get(&path, 5);
        futures::join!(waiting, self.resolve(&read.body, rng));
    }

    /// Answers a Request as a drawn plan says, from this client and maybe others at once: an identical replay,
    /// a conflicting answer, a cancellation of its call. Returns the plan.
    async fn resolve(&self, request: &Value, rng: &mut Rng) -> Plan {
        let plan = rng.weighted(&PLANS);
        if plan == Plan::Abandon || request["status"] != "pending" {
            return plan;
        }
        let id = request["id"].as_str().unwrap_or_default();
        let wait = if rng.chance(0.3) { 3 } else { 0 };
        let path = if wait > 0 {
            format!("/requests/{id}/answer?wait={wait}")
        } else {
            format!("/requests/{id}/answer")
        };
        let answer = answer_for(request, plan, &self.tag);
        let (replaying, conflicting_too) = (rng.chance(0.3), rng.chance(0.3));
        let main = self.api().post(&path, answer.clone(), wait);
        let replay = async {
            if replaying {
                Some(
                    self.other(1)
                        .post(&format!("/requests/{id}/answer"), answer.clone(), 0)
                        .await,
                )
            } else {
                None
            }
        };
        let conflicting = conflict(request, plan, &self.tag);
        let conflict = async {
            if conflicting_too {
                Some(
                    self.other(2)
                        .post(&format!("/requests/{id}/answer"), conflicting, 0)
                        .await,
                )
            } else {
                None
            }
        };
        let cancel = async {
            match request["call"].as_str() {
                Some(call) if plan == Plan::CancelCall => Some(self.other(3).delete(&format!("/calls/{call}")).await),
                _ => None,
            }
        };
        let _: (Reply, Option<Reply>, Option<Reply>, Option<Reply>) = futures::join!(main, replay, conflict, cancel);
        plan
    }
}

/// The `_meta` a 2026-07-28 request carries in place of a session.
fn modern_meta() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "chaos", "version": "1"}
    })
}

/// The answer a plan gives: an acceptance fills the form (its strings say `tag`, so that two are told apart).
fn answer_for(request: &Value, plan: Plan, tag: &str) -> Value {
    match plan {
        Plan::Accept | Plan::CancelCall | Plan::Abandon => accept(request, &format!("{tag}a")),
        Plan::Decline => json!({"ok": false, "reason": "declined"}),
        Plan::Cancel => json!({"ok": false, "reason": "cancelled"}),
    }
}

/// An answer other than the plan's: another acceptance when the form has a string to differ in, else the
/// opposite of the plan's.
fn conflict(request: &Value, plan: Plan, tag: &str) -> Value {
    let accepts = matches!(plan, Plan::Accept | Plan::CancelCall);
    let has_text = request["data"]["schema"]["properties"]
        .as_object()
        .is_some_and(|properties| properties.values().any(|p| p["type"] == "string"));
    if accepts && !has_text {
        json!({"ok": false, "reason": "declined"})
    } else {
        accept(request, &format!("{tag}b"))
    }
}

/// An acceptance: every property of the Request's form given, strings as `text`, booleans true.
fn accept(request: &Value, text: &str) -> Value {
    let Some(properties) = request["data"]["schema"]["properties"].as_object() else {
        return json!({"ok": true});
    };
    let data: serde_json::Map<String, Value> = properties
        .iter()
        .map(|(name, property)| {
            let value = match property["type"].as_str() {
                Some("boolean") => json!(true),
                _ => json!(text),
            };
            (name.clone(), value)
        })
        .collect();
    json!({"ok": true, "data": data})
}
