//! Approval policies: which tool calls wait for a person's yes before the gateway forwards them, and the
//! Request that asks for it — its prompt, and the digest that binds the answer to the call's arguments.

use std::time::Duration;

use serde::Serialize;

use crate::suspension::Lasting;
use serde_json::{Map, Value};

/// The prompt of a policy that sets none.
pub const DEFAULT_PROMPT: &str = "Allow {tool} on {server}?";
/// The `server` of a policy that applies to every server.
pub const ANY_SERVER: &str = "*";

/// A glob pattern of tool names: `*` matches any run of characters, `?` any one character. It is case-sensitive,
/// as MCP tool names are: `delete_*` does not match `Delete_file`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Glob(String);

impl Glob {
    /// Parses a pattern: 1 to 128 of the characters a tool name may have, `*` and `?`.
    pub fn parse(pattern: &str) -> Result<Self, String> {
        let fits = (1..=128).contains(&pattern.len())
            && pattern
                .bytes()
                .all(|byte| byte.is_ascii_alphanumeric() || b"_-.*?".contains(&byte));
        if fits {
            Ok(Self(pattern.to_owned()))
        } else {
            Err(format!(
                "{pattern:?} is not a pattern of tool names: 1 to 128 of A-Z a-z 0-9 _ - . and the wildcards * and ?"
            ))
        }
    }

    /// Whether `name` matches the whole pattern.
    pub fn matches(&self, name: &str) -> bool {
        let (pattern, name) = (self.0.as_bytes(), name.as_bytes());
        let (mut p, mut n) = (0, 0);
        // Where the last `*` was, and the name position it has matched up to: on a mismatch, it takes one more.
        let mut star: Option<(usize, usize)> = None;
        while n < name.len() {
            match pattern.get(p) {
                Some(b'*') => {
                    star = Some((p, n));
                    p += 1;
                }
                Some(&byte) if byte == b'?' || byte == name[n] => {
                    p += 1;
                    n += 1;
                }
                _ => match star {
                    Some((at, taken)) => {
                        p = at + 1;
                        n = taken + 1;
                        star = Some((at, taken + 1));
                    }
                    None => return false,
                },
            }
        }
        pattern[p..].iter().all(|&byte| byte == b'*')
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Serialize for Glob {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

/// One `[[approvals]]` entry, checked.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ApprovalPolicy {
    /// A server's name, or `*` for every server.
    pub server: String,
    /// Glob patterns of the upstream tool names it applies to.
    #[schema(value_type = Vec<String>)]
    pub tools: Vec<Glob>,
    /// The Request's prompt; `{tool}`, `{server}` and `{caller}` expand.
    pub prompt: String,
    /// How long the approval stays answerable (`"30m"`); `requests.ttl` when absent.
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "human_duration")]
    #[schema(value_type = Option<String>)]
    pub ttl: Option<Duration>,
    /// Who may answer: token names, `group:<group>` and `user:<name>` of the OpenID provider; empty: any
    /// approver or admin.
    pub approvers: Vec<String>,
    /// Whether the principal that started the call may approve it.
    #[serde(rename = "selfApproval")]
    pub self_approval: bool,
    /// How many different people must approve before the call is forwarded.
    pub quorum: usize,
    /// Whether an approver may approve the call with changed arguments.
    pub editable: bool,
    /// The standing grants an approver may give with an approval (`"session"`, `"1h"`).
    #[schema(value_type = Vec<String>)]
    pub grants: Vec<Lasting>,
    /// Channels told of an approval still pending a while after it was raised.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub escalate: Vec<Escalation>,
}

/// One escalation step: after this long, these `[[notify]]` channels are told of an approval still pending.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Escalation {
    /// How long after it was raised (`"15m"`).
    #[serde(serialize_with = "human")]
    #[schema(value_type = String)]
    pub after: Duration,
    /// The channels' names.
    pub notify: Vec<String>,
}

fn human<S: serde::Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&humantime::format_duration(*duration).to_string())
}

fn human_duration<S: serde::Serializer>(duration: &Option<Duration>, serializer: S) -> Result<S::Ok, S::Error> {
    match duration {
        Some(duration) => serializer.serialize_str(&humantime::format_duration(*duration).to_string()),
        None => serializer.serialize_none(),
    }
}

impl ApprovalPolicy {
    /// Whether a call of `tool` on `server` needs this approval.
    pub fn applies(&self, server: &str, tool: &str) -> bool {
        (self.server == ANY_SERVER || self.server == server) && self.tools.iter().any(|glob| glob.matches(tool))
    }

    /// Its prompt for one call.
    pub fn prompt_for(&self, server: &str, tool: &str, caller: &str) -> String {
        expand(&self.prompt, server, tool, caller)
    }
}

/// The configured policies, in the order written: the first that applies to a call is the one used.
#[derive(Debug, Clone, Default)]
pub struct Approvals(Vec<ApprovalPolicy>);

impl Approvals {
    /// The policies, in order.
    pub fn new(policies: Vec<ApprovalPolicy>) -> Self {
        Self(policies)
    }

    /// The first policy that applies to a call of `tool` on `server`.
    pub fn find(&self, server: &str, tool: &str) -> Option<&ApprovalPolicy> {
        self.0.iter().find(|policy| policy.applies(server, tool))
    }

    /// Every policy, in order.
    pub fn all(&self) -> &[ApprovalPolicy] {
        &self.0
    }
}

/// Expands `{tool}`, `{server}` and `{caller}` in a prompt, in one pass: what they expand to is not expanded
/// again.
pub fn expand(template: &str, server: &str, tool: &str, caller: &str) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(start) = rest.find('{') {
        out.push_str(&rest[..start]);
        let tail = &rest[start..];
        let (value, taken) = [("{tool}", tool), ("{server}", server), ("{caller}", caller)]
            .into_iter()
            .find(|(name, _)| tail.starts_with(name))
            .map_or(("{", 1), |(name, value)| (value, name.len()));
        out.push_str(value);
        rest = &tail[taken..];
    }
    out.push_str(rest);
    out
}

/// The canonical form of arguments that the digest covers: JSON with every object's keys sorted (by their
/// UTF-8 bytes), no whitespace, strings escaped as `serde_json` escapes them.
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort_unstable();
            out.push('{');
            for (index, key) in keys.into_iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(&map[key], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// The lowercase hex SHA-256 of the canonical JSON of `arguments`.
pub fn digest(arguments: &Value) -> String {
    crate::auth::digest_hex(&canonical_json(arguments))
}

/// The key under `data.call` of an approval that keeps its caller's verified email, when the caller signed in
/// with one: what a mailed link is told apart from.
pub const CALLER_EMAIL: &str = "callerEmail";

/// The `data` of an approval Request: the call as it will be forwarded, its digest, and who may answer.
pub fn request_data(
    server: &str,
    tool: &str,
    arguments: &Value,
    caller: &str,
    approvers: &[String],
    self_approval: bool,
    quorum: usize,
) -> Map<String, Value> {
    let mut data = Map::new();
    data.insert(
        "call".to_owned(),
        serde_json::json!({"server": server, "tool": tool, "arguments": arguments, "caller": caller}),
    );
    data.insert("digest".to_owned(), Value::String(digest(arguments)));
    if !approvers.is_empty() {
        data.insert("approvers".to_owned(), Value::from(approvers.to_vec()));
    }
    if self_approval {
        data.insert("selfApproval".to_owned(), Value::Bool(true));
    }
    if quorum > 1 {
        data.insert("quorum".to_owned(), Value::from(quorum));
    }
    data
}

/// The key of an editable approval's `data`, and of the `data` of an answer that approves its call with other
/// arguments: the arguments.
pub const ARGUMENTS: &str = "arguments";

/// Makes an approval's `data` editable: an approver may approve its call with other arguments that fit the tool's
/// `inputSchema`, which it keeps under `call`.
pub fn make_editable(data: &mut Map<String, Value>, input_schema: Value) {
    if let Some(Value::Object(call)) = data.get_mut("call") {
        call.insert("inputSchema".to_owned(), input_schema);
        data.insert("editable".to_owned(), Value::Bool(true));
    }
}

/// The tool's `inputSchema` an editable approval's `data` keeps; `None` when its arguments may not change.
pub fn input_schema(data: &Map<String, Value>) -> Option<&Value> {
    if data.get("editable").and_then(Value::as_bool) != Some(true) {
        return None;
    }
    data.get("call")?.get("inputSchema")
}

/// Offers in an approval's `data` the standing grants its policy lets an approver give (`"grants"`).
pub fn offer_grants(data: &mut Map<String, Value>, grants: &[Lasting]) {
    if !grants.is_empty() {
        data.insert("grants".to_owned(), serde_json::to_value(grants).unwrap_or_default());
    }
}

/// The standing grants an approval's `data` offers.
pub fn grants(data: Option<&Map<String, Value>>) -> Vec<Lasting> {
    let offered = data.and_then(|data| data.get("grants")).and_then(Value::as_array);
    offered
        .into_iter()
        .flatten()
        .filter_map(|lasting| Lasting::parse(lasting.as_str()?).ok())
        .collect()
}

/// The arguments an approval's `data` was raised with.
pub fn arguments(data: &Map<String, Value>) -> Option<&Value> {
    data.get("call")?.get(ARGUMENTS)
}

/// What changed from `from` to `to`, as a JSON Patch (RFC 6902) of `add`, `remove` and `replace` operations:
/// objects are compared key by key, anything else whole.
pub fn changes(from: &Value, to: &Value) -> Vec<Value> {
    let mut patch = Vec::new();
    diff_at(String::new(), from, to, &mut patch);
    patch
}

fn diff_at(path: String, from: &Value, to: &Value, patch: &mut Vec<Value>) {
    match (from, to) {
        (Value::Object(from), Value::Object(to)) => {
            let mut keys: Vec<&String> = from
                .keys()
                .chain(to.keys().filter(|key| !from.contains_key(*key)))
                .collect();
            keys.sort_unstable();
            for key in keys {
                let at = format!("{path}/{}", key.replace('~', "~0").replace('/', "~1"));
                match (from.get(key), to.get(key)) {
                    (Some(before), Some(after)) => diff_at(at, before, after, patch),
                    (Some(_), None) => patch.push(serde_json::json!({"op": "remove", "path": at})),
                    (None, Some(after)) => patch.push(serde_json::json!({"op": "add", "path": at, "value": after})),
                    (None, None) => {}
                }
            }
        }
        _ if from == to => {}
        _ => patch.push(serde_json::json!({"op": "replace", "path": path, "value": to})),
    }
}

/// How many different people an approval's `data` asks to approve it (one unless it says more).
pub fn quorum(data: Option<&Map<String, Value>>) -> usize {
    data.and_then(|data| data.get("quorum"))
        .and_then(Value::as_u64)
        .and_then(|quorum| usize::try_from(quorum).ok())
        .unwrap_or(1)
        .max(1)
}

/// Whether an approval's `data` lets the principal that started the call approve it.
pub fn self_approval(data: Option<&Map<String, Value>>) -> bool {
    data.and_then(|data| data.get("selfApproval")).and_then(Value::as_bool) == Some(true)
}

/// The names an approval's `data` lists as the only ones who may answer it; `None` when it lists none (any
/// approver or admin may).
pub fn approvers(data: Option<&Map<String, Value>>) -> Option<impl Iterator<Item = &str>> {
    let approvers = data?.get("approvers")?.as_array()?;
    Some(approvers.iter().filter_map(Value::as_str))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn glob(pattern: &str) -> Glob {
        Glob::parse(pattern).unwrap()
    }

    #[test]
    fn globs_match_whole_names_with_star_and_question_mark() {
        assert!(glob("echo").matches("echo"));
        assert!(!glob("echo").matches("echo2"));
        assert!(!glob("echo").matches("ech"));
        assert!(glob("confirm_*").matches("confirm_action"));
        assert!(glob("confirm_*").matches("confirm_"));
        assert!(!glob("confirm_*").matches("confirm"));
        assert!(glob("*").matches("anything"));
        assert!(glob("*").matches(""));
        assert!(glob("*_action").matches("confirm_action"));
        assert!(glob("a*b*c").matches("aXbYbZc"));
        assert!(!glob("a*b*c").matches("aXbYbZ"));
        assert!(glob("ech?").matches("echo"));
        assert!(!glob("ech?").matches("ech"));
        assert!(glob("*n?").matches("banana"));
        assert!(!glob("*a?").matches("banana"));
        assert!(glob("**x").matches("x"));
    }

    #[test]
    fn patterns_outside_tool_name_characters_are_refused() {
        for bad in ["", "a b", "a/b", "[ab]", &"x".repeat(129)] {
            assert!(Glob::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn prompts_expand_their_placeholders_once() {
        assert_eq!(expand(DEFAULT_PROMPT, "demo", "echo", "ci"), "Allow echo on demo?");
        assert_eq!(
            expand("{caller} wants {tool}{tool} {unknown} {", "s", "t", "c"),
            "c wants tt {unknown} {"
        );
        assert_eq!(expand("{tool}", "s", "{server}", "c"), "{server}");
    }

    #[test]
    fn the_digest_covers_canonical_json() {
        let a = json!({"b": [1, {"z": true, "a": null}], "a": "x y", "é": 1.5});
        assert_eq!(canonical_json(&a), r#"{"a":"x y","b":[1,{"a":null,"z":true}],"é":1.5}"#);
        let b: Value = serde_json::from_str(r#"{ "é": 1.5, "a": "x y", "b": [1, {"a": null, "z": true}] }"#).unwrap();
        assert_eq!(digest(&a), digest(&b));
        assert_eq!(
            digest(&json!({})),
            "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
        );
        assert_ne!(digest(&json!({"a": 1})), digest(&json!({"a": 2})));
    }

    #[test]
    fn changes_are_a_json_patch_from_the_old_arguments_to_the_new() {
        let from = json!({"path": "/tmp/a", "flags": ["-r"], "opts": {"force": true, "a/b": 1}, "gone": 1});
        let to = json!({"path": "/tmp/a", "flags": ["-r", "--dry-run"], "opts": {"force": false, "a/b": 1}, "new": 2});
        assert_eq!(
            changes(&from, &to),
            [
                json!({"op": "replace", "path": "/flags", "value": ["-r", "--dry-run"]}),
                json!({"op": "remove", "path": "/gone"}),
                json!({"op": "add", "path": "/new", "value": 2}),
                json!({"op": "replace", "path": "/opts/force", "value": false}),
            ]
        );
        assert!(changes(&from, &from).is_empty());
        assert_eq!(
            changes(&json!({"a~b/c": 1}), &json!({"a~b/c": 2})),
            [json!({"op": "replace", "path": "/a~0b~1c", "value": 2})]
        );
    }

    #[test]
    fn an_approval_is_editable_only_once_made_so() {
        let mut data = request_data("s", "t", &json!({"a": 1}), "ci", &[], false, 1);
        assert!(input_schema(&data).is_none());
        assert_eq!(arguments(&data), Some(&json!({"a": 1})));
        make_editable(&mut data, json!({"type": "object"}));
        assert_eq!(input_schema(&data), Some(&json!({"type": "object"})));
    }

    #[test]
    fn an_approval_lists_its_approvers_only_when_its_policy_does() {
        let open = request_data("s", "t", &json!({}), "ci", &[], false, 1);
        assert!(approvers(Some(&open)).is_none());
        let listed = request_data(
            "s",
            "t",
            &json!({}),
            "ci",
            &["on-call".to_owned(), "lead".to_owned()],
            false,
            1,
        );
        assert_eq!(
            approvers(Some(&listed)).unwrap().collect::<Vec<_>>(),
            ["on-call", "lead"]
        );
        assert!(approvers(None).is_none());
    }
}
