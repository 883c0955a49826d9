//! The toolnexus §10 suspension contract: the `Request` a suspension raises and the `Answer` that resolves it.
//!
//! Wire keys are pinned exactly; optional keys are omitted when unset, never `null`.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer, de};
use serde_json::{Map, Value};
use utoipa::openapi::{RefOr, schema::Schema};

use crate::ids::RequestId;

/// What a suspended call asks of a human, in the §10 wire shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Request {
    /// Unique per suspension; elicitation ids start with `elc-`.
    #[schema(value_type = String)]
    pub id: RequestId,
    /// Open vocabulary: `input` (form mode) or `authorization` (URL mode) from the elicitation bridge.
    #[schema(value_type = String)]
    pub kind: RequestKind,
    /// What is asked, in human words.
    pub prompt: String,
    /// Where the action happens, for URL mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Kind-specific extra; form mode carries `{"schema": requestedSchema}`.
    ///
    /// Shared: Requests with the same schema hold one copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub data: Option<Arc<Map<String, Value>>>,
    /// RFC 3339 UTC instant after which the Request is stale.
    #[serde(rename = "expiresAt", default, skip_serializing_if = "Option::is_none")]
    #[schema(format = DateTime)]
    pub expires_at: Option<String>,
}

/// What a Request asks for: an open vocabulary, with the kinds the gateway raises or checks named and any
/// other kept as written. On the wire it is a plain string.
#[derive(Debug, Clone, Eq)]
pub enum RequestKind {
    /// A form: `data.schema` describes the values to enter (a form-mode elicitation).
    Input,
    /// An action at `url` (a URL-mode elicitation).
    Authorization,
    /// Whether to let a call through, raised by an approval policy.
    Approval,
    /// toolnexus questions, under `data.questions`.
    Question,
    /// A reply to an upstream's conversation (its `sampling/createMessage`), under `data.messages`.
    Sampling,
    /// Any other kind.
    Other(String),
}

impl RequestKind {
    /// The kind as written on the wire.
    pub fn as_str(&self) -> &str {
        match self {
            Self::Input => "input",
            Self::Authorization => "authorization",
            Self::Approval => "approval",
            Self::Question => "question",
            Self::Sampling => "sampling",
            Self::Other(kind) => kind,
        }
    }
}

impl From<String> for RequestKind {
    fn from(kind: String) -> Self {
        match kind.as_str() {
            "input" => Self::Input,
            "authorization" => Self::Authorization,
            "approval" => Self::Approval,
            "question" => Self::Question,
            "sampling" => Self::Sampling,
            _ => Self::Other(kind),
        }
    }
}

/// Kinds are equal when they are written the same, even an `Other` that names a known kind.
impl PartialEq for RequestKind {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl fmt::Display for RequestKind {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(self.as_str())
    }
}

impl Serialize for RequestKind {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for RequestKind {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(Self::from)
    }
}

/// Why an Answer is not satisfied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Reason {
    /// The human said no.
    Declined,
    /// The human dismissed it without choosing.
    Cancelled,
    /// Nobody answered before `expiresAt`.
    Expired,
}

/// The resolution of a Request, in the §10 wire shape: `{"id", "ok", "data", "reason"}`, with `reason` only
/// when `ok` is false.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// Echoes the Request id; empty when the answerer left it out.
    pub id: String,
    /// Satisfied, or not and why.
    pub verdict: Verdict,
    /// The values entered (form mode).
    pub data: Option<Map<String, Value>>,
    /// With an approval, a standing grant for later calls like it (a gateway extension of the §10 shape).
    pub grant: Option<Terms>,
}

/// What an Answer says: `ok: true`, or `ok: false` with the `reason` if one was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Satisfied (`ok: true`); the upstream gets `accept`.
    Accept,
    /// Not satisfied (`ok: false`); the upstream gets `decline` for `declined`, `cancel` for any other reason or
    /// none.
    Refuse(Option<Reason>),
}

impl Answer {
    /// The Answer the gateway records when a Request expires unanswered.
    pub fn expired(id: &str) -> Self {
        Self {
            id: id.to_owned(),
            verdict: Verdict::Refuse(Some(Reason::Expired)),
            data: None,
            grant: None,
        }
    }

    /// Whether the Answer is satisfied (`ok` on the wire).
    pub fn ok(&self) -> bool {
        self.verdict == Verdict::Accept
    }

    /// The `reason` on the wire: set only for a refusal that gave one.
    pub fn reason(&self) -> Option<Reason> {
        match self.verdict {
            Verdict::Accept => None,
            Verdict::Refuse(reason) => reason,
        }
    }
}

/// The resolution of a Request, in the §10 wire shape.
// An Answer as written, before `ok` and `reason` are known to agree; its doc and fields are the Answer's schema.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct AnswerWire {
    /// Echoes the Request id.
    #[serde(default)]
    id: String,
    /// Satisfied or not.
    ok: bool,
    /// The values entered (form mode).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    data: Option<Map<String, Value>>,
    /// Only when `ok` is false.
    #[serde(default)]
    reason: Option<Reason>,
    /// With `ok: true` to an approval whose policy lists `grants`: later calls like it run without asking.
    #[serde(default)]
    grant: Option<Terms>,
}

impl TryFrom<AnswerWire> for Answer {
    type Error = &'static str;

    fn try_from(wire: AnswerWire) -> Result<Self, Self::Error> {
        let verdict = match (wire.ok, wire.reason) {
            (true, None) => Verdict::Accept,
            (true, Some(_)) => return Err("reason is only allowed when ok is false"),
            (false, _) if wire.grant.is_some() => return Err("grant is only allowed when ok is true"),
            (false, reason) => Verdict::Refuse(reason),
        };
        Ok(Self {
            id: wire.id,
            verdict,
            data: wire.data,
            grant: wire.grant,
        })
    }
}

impl<'de> Deserialize<'de> for Answer {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        AnswerWire::deserialize(deserializer)?
            .try_into()
            .map_err(de::Error::custom)
    }
}

/// An Answer as written: the keys of [`AnswerWire`], those unset left out.
#[derive(Serialize)]
struct AnswerOut<'a> {
    #[serde(skip_serializing_if = "str::is_empty")]
    id: &'a str,
    ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    data: Option<&'a Map<String, Value>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<Reason>,
    #[serde(skip_serializing_if = "Option::is_none")]
    grant: Option<&'a Terms>,
}

impl Serialize for Answer {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        AnswerOut {
            id: &self.id,
            ok: self.ok(),
            data: self.data.as_ref(),
            reason: self.reason(),
            grant: self.grant.as_ref(),
        }
        .serialize(serializer)
    }
}

impl utoipa::PartialSchema for Answer {
    fn schema() -> RefOr<Schema> {
        AnswerWire::schema()
    }
}

impl utoipa::ToSchema for Answer {
    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        AnswerWire::schemas(schemas);
    }
}

// ---- standing grants, as an approver asks for one with an Answer ----

/// The `for` of a grant that lasts as long as the session of the call it was given on.
pub const SESSION: &str = "session";

/// How long a grant lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lasting {
    /// Until the session of the call it was given on ends.
    Session,
    /// This long after it was given.
    For(Duration),
}

impl Lasting {
    /// Parses `"session"` or a duration (`"1h"`, `"8h"`) longer than zero.
    pub fn parse(text: &str) -> Result<Self, String> {
        if text == SESSION {
            return Ok(Lasting::Session);
        }
        match humantime::parse_duration(text) {
            Ok(duration) if !duration.is_zero() => Ok(Lasting::For(duration)),
            _ => Err(format!(
                "{text:?} is neither \"session\" nor a duration longer than zero such as \"1h\""
            )),
        }
    }
}

impl Serialize for Lasting {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Lasting::Session => serializer.serialize_str(SESSION),
            Lasting::For(duration) => serializer.serialize_str(&humantime::format_duration(*duration).to_string()),
        }
    }
}

impl<'de> Deserialize<'de> for Lasting {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Lasting::parse(&String::deserialize(deserializer)?).map_err(serde::de::Error::custom)
    }
}

/// Which later calls a grant covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Scope {
    /// Calls whose arguments have the digest of those approved.
    SameArguments,
    /// Every call of the tool.
    Tool,
}

impl Scope {
    /// The scope as the API spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::SameArguments => "same-arguments",
            Scope::Tool => "tool",
        }
    }

    /// The scope the API spells `name`.
    pub fn parse(name: &str) -> Option<Self> {
        [Scope::SameArguments, Scope::Tool]
            .into_iter()
            .find(|scope| scope.as_str() == name)
    }
}

/// The grant an approver asks for with an approval: `{"for": "1h", "match": "tool"}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Terms {
    /// `"session"`, or how long (`"1h"`); one of those the approval's policy lists under `grants`.
    #[serde(rename = "for")]
    #[schema(value_type = String)]
    pub lasting: Lasting,
    /// `same-arguments` or `tool`.
    #[serde(rename = "match")]
    pub scope: Scope,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(value: Value) -> Map<String, Value> {
        value.as_object().cloned().unwrap()
    }

    #[test]
    fn request_omits_unset_optional_keys() {
        let request = Request {
            id: RequestId::stored("r1"),
            kind: RequestKind::Authorization,
            prompt: "Log in".into(),
            url: Some("https://x/login".into()),
            data: None,
            expires_at: None,
        };
        assert_eq!(
            serde_json::to_string(&request).unwrap(),
            r#"{"id":"r1","kind":"authorization","prompt":"Log in","url":"https://x/login"}"#
        );
    }

    #[test]
    fn full_request_uses_pinned_keys_in_order() {
        let request = Request {
            id: RequestId::stored("r2"),
            kind: RequestKind::Input,
            prompt: "Pick".into(),
            url: Some("u".into()),
            data: Some(Arc::new(object(json!({"k": "v"})))),
            expires_at: Some("2026-01-01T00:00:00Z".into()),
        };
        assert_eq!(
            serde_json::to_string(&request).unwrap(),
            r#"{"id":"r2","kind":"input","prompt":"Pick","url":"u","data":{"k":"v"},"expiresAt":"2026-01-01T00:00:00Z"}"#
        );
    }

    #[test]
    fn answer_serializes_to_pinned_keys() {
        let bare = Answer {
            id: "r1".into(),
            verdict: Verdict::Accept,
            data: None,
            grant: None,
        };
        assert_eq!(serde_json::to_string(&bare).unwrap(), r#"{"id":"r1","ok":true}"#);
        let with_data = Answer {
            data: Some(object(json!({"k": "v"}))),
            ..bare
        };
        assert_eq!(
            serde_json::to_string(&with_data).unwrap(),
            r#"{"id":"r1","ok":true,"data":{"k":"v"}}"#
        );
    }

    #[test]
    fn reasons_are_the_three_lowercase_words() {
        let answer = Answer::expired("r3");
        assert_eq!(
            serde_json::to_string(&answer).unwrap(),
            r#"{"id":"r3","ok":false,"reason":"expired"}"#
        );
        let declined: Answer = serde_json::from_str(r#"{"id":"r","ok":false,"reason":"declined"}"#).unwrap();
        assert_eq!(declined.verdict, Verdict::Refuse(Some(Reason::Declined)));
        assert!(serde_json::from_str::<Answer>(r#"{"ok":false,"reason":"nope"}"#).is_err());
    }

    #[test]
    fn every_legal_answer_reads_and_writes_the_same_bytes() {
        for wire in [
            r#"{"ok":true}"#,
            r#"{"id":"r","ok":true,"data":{"k":"v"}}"#,
            r#"{"ok":false}"#,
            r#"{"id":"r","ok":false,"reason":"cancelled"}"#,
            r#"{"id":"r","ok":false,"data":{"k":"v"},"reason":"declined"}"#,
        ] {
            let answer: Answer = serde_json::from_str(wire).unwrap();
            assert_eq!(serde_json::to_string(&answer).unwrap(), wire);
        }
    }

    #[test]
    fn a_reason_with_ok_true_does_not_parse() {
        let error = serde_json::from_value::<Answer>(json!({"ok": true, "reason": "declined"})).unwrap_err();
        assert_eq!(error.to_string(), "reason is only allowed when ok is false");
        let null_reason: Answer = serde_json::from_value(json!({"ok": true, "reason": null})).unwrap();
        assert_eq!(null_reason.verdict, Verdict::Accept);
    }

    #[test]
    fn kinds_are_plain_strings_and_unknown_ones_round_trip() {
        for (wire, kind) in [
            ("\"input\"", RequestKind::Input),
            ("\"authorization\"", RequestKind::Authorization),
            ("\"approval\"", RequestKind::Approval),
            ("\"question\"", RequestKind::Question),
            ("\"tool_call\"", RequestKind::Other("tool_call".into())),
            ("\"Input\"", RequestKind::Other("Input".into())),
        ] {
            assert_eq!(serde_json::from_str::<RequestKind>(wire).unwrap(), kind);
            assert_eq!(serde_json::to_string(&kind).unwrap(), wire);
        }
        assert_eq!(RequestKind::Other("input".into()), RequestKind::Input);
    }
}
