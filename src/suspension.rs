//! The toolnexus §10 suspension contract: the `Request` a suspension raises and the `Answer` that resolves it.
//!
//! Wire keys are pinned exactly; optional keys are omitted when unset, never `null`.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// What a suspended call asks of a human, in the §10 wire shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Request {
    /// Unique per suspension; elicitation ids start with `elc-`.
    pub id: String,
    /// Open vocabulary: `input` (form mode) or `authorization` (URL mode) from the elicitation bridge.
    pub kind: String,
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

/// The resolution of a Request, in the §10 wire shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Answer {
    /// Echoes the Request id.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub id: String,
    /// Satisfied or not.
    pub ok: bool,
    /// The values entered (form mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub data: Option<Map<String, Value>>,
    /// Only when `ok` is false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<Reason>,
}

impl Answer {
    /// The Answer the gateway records when a Request expires unanswered.
    pub fn expired(id: &str) -> Self {
        Self {
            id: id.to_owned(),
            ok: false,
            data: None,
            reason: Some(Reason::Expired),
        }
    }
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
            id: "r1".into(),
            kind: "authorization".into(),
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
            id: "r2".into(),
            kind: "input".into(),
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
            ok: true,
            data: None,
            reason: None,
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
        assert_eq!(declined.reason, Some(Reason::Declined));
        assert!(serde_json::from_str::<Answer>(r#"{"ok":false,"reason":"nope"}"#).is_err());
    }
}
