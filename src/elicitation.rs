//! The toolnexus §2 elicitation bridge: MCP `elicitation/create` params to a §10 Request, and an Answer back
//! to the MCP `ElicitResult`.

use std::sync::Arc;

use rmcp::model::{ElicitResult, ElicitationAction};
use serde_json::{Map, Value};

use crate::ids;
use crate::suspension::{Answer, Reason, Request};

/// `kind` of a form-mode Request.
pub const KIND_INPUT: &str = "input";
/// `kind` of a URL-mode Request.
pub const KIND_AUTHORIZATION: &str = "authorization";

/// Maps MCP elicitation params (as JSON) to a Request with a fresh `elc-` id.
///
/// Mode `"url"` becomes `authorization` with `url` and no `data`; any other mode (absent or `"form"`)
/// becomes `input` with the requested schema under `data.schema`.
pub fn elicitation_to_request(params: &Value) -> Request {
    let is_url = params.get("mode").and_then(Value::as_str) == Some("url");
    let prompt = params
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let url = is_url
        .then(|| params.get("url").and_then(Value::as_str))
        .flatten()
        .filter(|url| !url.is_empty())
        .map(str::to_owned);
    let data = (!is_url)
        .then(|| params.get("requestedSchema"))
        .flatten()
        .filter(|schema| !schema.is_null())
        .map(|schema| Arc::new(Map::from_iter([("schema".to_owned(), schema.clone())])));
    Request {
        id: ids::mint(ids::REQUEST),
        kind: if is_url { KIND_AUTHORIZATION } else { KIND_INPUT }.to_owned(),
        prompt,
        url,
        data,
        expires_at: None,
    }
}

/// Maps an Answer to the MCP `ElicitResult`: `ok` → accept with `data` (or `{}`), `declined` → decline,
/// anything else → cancel.
pub fn answer_to_elicit_result(answer: &Answer) -> ElicitResult {
    if answer.ok {
        let content = answer.data.clone().unwrap_or_default();
        return ElicitResult::new(ElicitationAction::Accept).with_content(Value::Object(content));
    }
    match answer.reason {
        Some(Reason::Declined) => ElicitResult::new(ElicitationAction::Decline),
        _ => ElicitResult::new(ElicitationAction::Cancel),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn answer(value: Value) -> Answer {
        serde_json::from_value(value).unwrap()
    }

    fn wire(result: &ElicitResult) -> Value {
        serde_json::to_value(result).unwrap()
    }

    // Python seed, example 1.
    #[test]
    fn form_mode_becomes_input_with_the_schema() {
        let schema = json!({"type": "object", "properties": {"postal_code": {"type": "string"}}});
        let params = json!({"mode": null, "message": "What is your shipping postal code?", "requestedSchema": schema, "url": null});
        let request = elicitation_to_request(&params);
        assert_eq!(request.kind, "input");
        assert_eq!(request.prompt, "What is your shipping postal code?");
        assert_eq!(
            Value::Object(Arc::unwrap_or_clone(request.data.unwrap())),
            json!({"schema": schema})
        );
        assert_eq!(request.url, None);
        assert!(request.id.starts_with("elc-"));
    }

    // C# seed, example 1: absent mode, schema carried through unchanged.
    #[test]
    fn modeless_form_carries_the_schema_through() {
        let schema = json!({"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]});
        let request = elicitation_to_request(&json!({"message": "Your name?", "requestedSchema": schema}));
        assert_eq!(request.kind, "input");
        assert_eq!(request.prompt, "Your name?");
        assert_eq!(request.url, None);
        assert_eq!(request.data.unwrap()["schema"], schema);
    }

    #[test]
    fn explicit_form_mode_is_input() {
        let request = elicitation_to_request(
            &json!({"mode": "form", "message": "m", "requestedSchema": {"type": "object", "properties": {}}}),
        );
        assert_eq!(request.kind, "input");
    }

    // Python seed, example 2.
    #[test]
    fn url_mode_becomes_authorization_with_the_url() {
        let params = json!({"mode": "url", "message": "Please authorize access to your calendar.",
            "url": "https://example.com/oauth/authorize?state=abc123", "requestedSchema": null});
        let request = elicitation_to_request(&params);
        assert_eq!(request.kind, "authorization");
        assert_eq!(
            request.url.as_deref(),
            Some("https://example.com/oauth/authorize?state=abc123")
        );
        assert_eq!(request.prompt, "Please authorize access to your calendar.");
        assert_eq!(request.data, None);
    }

    // C# seed, example 2.
    #[test]
    fn url_mode_carries_no_schema() {
        let request = elicitation_to_request(
            &json!({"mode": "url", "message": "Log in to continue", "url": "https://example.com/auth"}),
        );
        assert_eq!(request.kind, "authorization");
        assert_eq!(request.url.as_deref(), Some("https://example.com/auth"));
        assert_eq!(request.data, None);
        let with_schema = elicitation_to_request(
            &json!({"mode": "url", "message": "m", "url": "u", "requestedSchema": {"type": "object"}}),
        );
        assert_eq!(with_schema.data, None);
    }

    #[test]
    fn missing_message_is_an_empty_prompt_and_missing_url_is_absent() {
        let request = elicitation_to_request(&json!({"mode": "url"}));
        assert_eq!(request.prompt, "");
        assert_eq!(request.url, None);
        let form = elicitation_to_request(&json!({}));
        assert_eq!((form.kind.as_str(), form.data), ("input", None));
    }

    #[test]
    fn every_request_gets_a_fresh_id() {
        let params = json!({"message": "m"});
        let a = elicitation_to_request(&params);
        let b = elicitation_to_request(&params);
        assert!(a.id.starts_with("elc-") && b.id.starts_with("elc-"));
        assert_ne!(a.id, b.id);
    }

    // Python seed, example 3, and C# seed, example 3.
    #[test]
    fn answers_map_to_accept_decline_cancel() {
        let accepted = answer_to_elicit_result(&answer(
            json!({"id": "elc-1", "ok": true, "data": {"postal_code": "12345"}}),
        ));
        assert_eq!(
            wire(&accepted),
            json!({"action": "accept", "content": {"postal_code": "12345"}})
        );

        let no_data = answer_to_elicit_result(&answer(json!({"id": "elc-2", "ok": true})));
        assert_eq!(wire(&no_data), json!({"action": "accept", "content": {}}));

        let declined = answer_to_elicit_result(&answer(json!({"id": "elc-3", "ok": false, "reason": "declined"})));
        assert_eq!(wire(&declined), json!({"action": "decline"}));

        let expired = answer_to_elicit_result(&answer(json!({"id": "elc-4", "ok": false, "reason": "expired"})));
        assert_eq!(wire(&expired), json!({"action": "cancel"}));

        let no_reason = answer_to_elicit_result(&answer(json!({"id": "elc-5", "ok": false})));
        assert_eq!(wire(&no_reason), json!({"action": "cancel"}));

        let cancelled = answer_to_elicit_result(&answer(json!({"id": "1", "ok": false, "reason": "cancelled"})));
        assert_eq!(wire(&cancelled), json!({"action": "cancel"}));
    }

    #[test]
    fn accept_carries_the_data_through() {
        let accepted = answer_to_elicit_result(&answer(json!({"id": "1", "ok": true, "data": {"name": "Ada"}})));
        assert_eq!(accepted.action, ElicitationAction::Accept);
        assert_eq!(accepted.content.unwrap()["name"], "Ada");
    }
}
