//! The toolnexus §2 elicitation bridge: MCP `elicitation/create` params to a §10 Request, and an Answer back
//! to the MCP `ElicitResult`.

use std::sync::Arc;

use rmcp::model::{ElicitResult, ElicitationAction};
use serde_json::{Map, Value, json};

use crate::ids::{self, RequestId};
use crate::suspension::{Answer, Reason, Request, RequestKind, Verdict};
use crate::validation::UNUSABLE_SCHEMA;

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
        id: RequestId::mint(ids::REQUEST),
        kind: if is_url {
            RequestKind::Authorization
        } else {
            RequestKind::Input
        },
        prompt,
        url,
        data,
        expires_at: None,
    }
}

/// Checks that elicitation params are what MCP defines: an object with a `message`, and a `url` in URL mode or
/// a `requestedSchema` in form mode (whose shape is checked where it is compiled); the error says what is not.
pub fn check_params(params: &Value) -> Result<(), String> {
    let Some(params) = params.as_object() else {
        return Err("the elicitation params are not an object".to_owned());
    };
    if !params.get("message").is_some_and(Value::is_string) {
        return Err("the elicitation has no message".to_owned());
    }
    match params.get("mode") {
        Some(Value::String(mode)) if mode == "url" => match params.get("url") {
            Some(Value::String(_)) => Ok(()),
            _ => Err("the URL-mode elicitation has no url".to_owned()),
        },
        None | Some(Value::Null) => form_schema(params),
        Some(Value::String(mode)) if mode == "form" => form_schema(params),
        Some(mode) => Err(format!("the elicitation has an unknown mode {mode}")),
    }
}

fn form_schema(params: &Map<String, Value>) -> Result<(), String> {
    match params.get("requestedSchema") {
        Some(Value::Object(_)) => Ok(()),
        _ => Err(format!("{UNUSABLE_SCHEMA}: it is missing")),
    }
}

/// Maps an Answer to the MCP `ElicitResult`: `ok` → accept with `data` (or `{}`), `declined` → decline,
/// anything else → cancel.
pub fn answer_to_elicit_result(answer: &Answer) -> ElicitResult {
    match answer.verdict {
        Verdict::Accept => {
            let content = answer.data.clone().unwrap_or_default();
            ElicitResult::new(ElicitationAction::Accept).with_content(Value::Object(content))
        }
        Verdict::Refuse(Some(Reason::Declined)) => ElicitResult::new(ElicitationAction::Decline),
        Verdict::Refuse(_) => ElicitResult::new(ElicitationAction::Cancel),
    }
}

/// The MCP elicitation params that ask a Request of an MCP client (the way back of `elicitation_to_request`):
/// `input` in form mode with `data.schema`, `authorization` in URL mode with the Request's id as its
/// `elicitationId`; `None` for any other kind.
pub fn request_to_elicitation(request: &Request) -> Option<Value> {
    match request.kind {
        RequestKind::Input => Some(json!({
            "mode": "form",
            "message": request.prompt,
            "requestedSchema": request.data.as_ref()?.get("schema")?,
        })),
        RequestKind::Authorization => Some(json!({
            "mode": "url",
            "message": request.prompt,
            "url": request.url.as_ref()?,
            "elicitationId": request.id,
        })),
        _ => None,
    }
}

/// The Answer an MCP client gave as an `ElicitResult` (the way back of `answer_to_elicit_result`): `accept`
/// → `ok` with its `content` as `data`, `decline` → `declined`, anything else → `cancelled`.
pub fn elicit_result_to_answer(id: &str, result: &ElicitResult) -> Answer {
    let (verdict, data) = match result.action {
        ElicitationAction::Accept => (
            Verdict::Accept,
            result.content.as_ref().and_then(Value::as_object).cloned(),
        ),
        ElicitationAction::Decline => (Verdict::Refuse(Some(Reason::Declined)), None),
        _ => (Verdict::Refuse(Some(Reason::Cancelled)), None),
    };
    Answer {
        id: id.to_owned(),
        verdict,
        data,
        grant: None,
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
    fn a_request_asks_an_mcp_client_what_its_elicitation_asked() {
        let schema = json!({"type": "object", "properties": {"ok": {"type": "boolean"}}});
        let form = elicitation_to_request(&json!({"message": "Sure?", "requestedSchema": schema}));
        assert_eq!(
            request_to_elicitation(&form),
            Some(json!({"mode": "form", "message": "Sure?", "requestedSchema": schema}))
        );
        let url = elicitation_to_request(&json!({"mode": "url", "message": "Sign in", "url": "https://x.example/a"}));
        assert_eq!(
            request_to_elicitation(&url),
            Some(json!({"mode": "url", "message": "Sign in", "url": "https://x.example/a", "elicitationId": url.id}))
        );
        let other = Request {
            kind: RequestKind::Question,
            ..form
        };
        assert_eq!(request_to_elicitation(&other), None);
    }

    #[test]
    fn an_mcp_clients_elicit_result_becomes_the_answer_it_maps_from() {
        for answer in [
            json!({"id": "elc-1", "ok": true, "data": {"ok": true}}),
            json!({"id": "elc-1", "ok": false, "reason": "declined"}),
            json!({"id": "elc-1", "ok": false, "reason": "cancelled"}),
        ] {
            let answer: Answer = serde_json::from_value(answer).unwrap();
            assert_eq!(
                elicit_result_to_answer("elc-1", &answer_to_elicit_result(&answer)),
                answer
            );
        }
        let accepted = ElicitResult::new(ElicitationAction::Accept);
        assert_eq!(elicit_result_to_answer("elc-2", &accepted).data, None);
    }

    #[test]
    fn form_mode_becomes_input_with_the_schema() {
        let schema = json!({"type": "object", "properties": {"postal_code": {"type": "string"}}});
        let params = json!({"mode": null, "message": "What is your shipping postal code?", "requestedSchema": schema, "url": null});
        let request = elicitation_to_request(&params);
        assert_eq!(request.kind.as_str(), "input");
        assert_eq!(request.prompt, "What is your shipping postal code?");
        assert_eq!(
            Value::Object(Arc::unwrap_or_clone(request.data.unwrap())),
            json!({"schema": schema})
        );
        assert_eq!(request.url, None);
        assert!(request.id.as_str().starts_with("elc-"));
    }

    // C# seed, example 1: absent mode, schema carried through unchanged.
    #[test]
    fn modeless_form_carries_the_schema_through() {
        let schema = json!({"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]});
        let request = elicitation_to_request(&json!({"message": "Your name?", "requestedSchema": schema}));
        assert_eq!(request.kind.as_str(), "input");
        assert_eq!(request.prompt, "Your name?");
        assert_eq!(request.url, None);
        assert_eq!(request.data.unwrap()["schema"], schema);
    }

    #[test]
    fn explicit_form_mode_is_input() {
        let request = elicitation_to_request(
            &json!({"mode": "form", "message": "m", "requestedSchema": {"type": "object", "properties": {}}}),
        );
        assert_eq!(request.kind.as_str(), "input");
    }

    // Python seed, example 2.
    #[test]
    fn url_mode_becomes_authorization_with_the_url() {
        let params = json!({"mode": "url", "message": "Please authorize access to your calendar.",
            "url": "https://example.com/oauth/authorize?state=abc123", "requestedSchema": null});
        let request = elicitation_to_request(&params);
        assert_eq!(request.kind.as_str(), "authorization");
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
        assert_eq!(request.kind.as_str(), "authorization");
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
    fn params_need_a_message_and_the_url_or_schema_of_their_mode() {
        let schema = json!({"type": "object", "properties": {}});
        assert_eq!(
            check_params(&json!({"message": "m", "requestedSchema": schema})),
            Ok(())
        );
        assert_eq!(
            check_params(&json!({"mode": "form", "message": "m", "requestedSchema": schema})),
            Ok(())
        );
        assert_eq!(
            check_params(&json!({"mode": "url", "message": "m", "url": "https://x"})),
            Ok(())
        );
        for (params, says) in [
            (json!("m"), "not an object"),
            (json!({"requestedSchema": schema}), "no message"),
            (json!({"mode": "url", "message": "m"}), "no url"),
            (json!({"message": "m"}), "flat object"),
            (
                json!({"mode": "form", "message": "m", "requestedSchema": "s"}),
                "flat object",
            ),
            (
                json!({"mode": "voice", "message": "m", "requestedSchema": schema}),
                "unknown mode \"voice\"",
            ),
        ] {
            let error = check_params(&params).unwrap_err();
            assert!(error.contains(says), "{params}: {error}");
        }
    }

    #[test]
    fn every_request_gets_a_fresh_id() {
        let params = json!({"message": "m"});
        let a = elicitation_to_request(&params);
        let b = elicitation_to_request(&params);
        assert!(a.id.as_str().starts_with("elc-") && b.id.as_str().starts_with("elc-"));
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

    mod properties {
        use super::*;
        use proptest::prelude::*;
        use std::collections::HashSet;

        fn leaf() -> impl Strategy<Value = Value> {
            prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::from),
                any::<i64>().prop_map(Value::from),
                ".{0,8}".prop_map(Value::from),
            ]
        }

        fn json() -> impl Strategy<Value = Value> {
            leaf().prop_recursive(3, 16, 4, |inner| {
                prop_oneof![
                    prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                    prop::collection::btree_map("[a-z]{1,4}", inner, 0..4)
                        .prop_map(|map| Value::Object(map.into_iter().collect())),
                ]
            })
        }

        fn object() -> impl Strategy<Value = Map<String, Value>> {
            prop::collection::btree_map("[a-z]{1,6}", json(), 0..4).prop_map(|map| map.into_iter().collect())
        }

        /// Elicitation params: each key absent, null, of its type, or of another type.
        fn params() -> impl Strategy<Value = Value> {
            let mode = prop_oneof![
                Just(None),
                Just(Some(Value::Null)),
                Just(Some(json!("form"))),
                Just(Some(json!("url"))),
                ".{0,6}".prop_map(|mode| Some(json!(mode))),
                Just(Some(json!(1)))
            ];
            let message = prop::option::of(prop_oneof![".{0,12}".prop_map(Value::from), leaf()]);
            let url = prop::option::of(prop_oneof![
                Just(json!("")),
                "https://[a-z]{1,8}\\.example/[a-z]{0,6}".prop_map(Value::from),
                leaf()
            ]);
            let schema = prop::option::of(prop_oneof![Just(Value::Null), object().prop_map(Value::Object)]);
            (mode, message, url, schema).prop_map(|(mode, message, url, schema)| {
                let keys = [
                    ("mode", mode),
                    ("message", message),
                    ("url", url),
                    ("requestedSchema", schema),
                ];
                Value::Object(
                    keys.into_iter()
                        .filter_map(|(key, value)| Some((key.to_owned(), value?)))
                        .collect(),
                )
            })
        }

        fn answers() -> impl Strategy<Value = Answer> {
            let reason = prop::option::of(prop_oneof![
                Just(Reason::Declined),
                Just(Reason::Cancelled),
                Just(Reason::Expired)
            ]);
            let verdict = prop_oneof![Just(Verdict::Accept), reason.prop_map(Verdict::Refuse)];
            ("(elc-[a-z0-9]{1,8})?", verdict, prop::option::of(object())).prop_map(|(id, verdict, data)| Answer {
                id,
                verdict,
                data,
                grant: None,
            })
        }

        /// No top-level key of a serialized value is `null`.
        fn no_null_keys(value: &Value) -> bool {
            value
                .as_object()
                .is_some_and(|object| object.values().all(|value| !value.is_null()))
        }

        proptest! {
            #[test]
            fn params_map_to_a_request_by_the_documented_rules(params in params()) {
                let request = elicitation_to_request(&params);
                let is_url = params.get("mode") == Some(&json!("url"));
                prop_assert!(request.id.as_str().starts_with("elc-"));
                prop_assert_eq!(request.kind.as_str(), if is_url { "authorization" } else { "input" });
                let message = params.get("message").and_then(Value::as_str).unwrap_or_default();
                prop_assert_eq!(request.prompt.as_str(), message);
                let url = params.get("url").and_then(Value::as_str).filter(|url| is_url && !url.is_empty());
                prop_assert_eq!(request.url.as_deref(), url);
                let schema = params.get("requestedSchema").filter(|schema| !is_url && !schema.is_null());
                prop_assert_eq!(request.data.as_ref().map(|data| &data["schema"]), schema);
                prop_assert!(request.data.as_ref().is_none_or(|data| data.len() == 1));
                prop_assert_eq!(&request.expires_at, &None);
                let wire = serde_json::to_value(&request).unwrap();
                prop_assert!(no_null_keys(&wire), "{}", wire);
                prop_assert_eq!(serde_json::from_value::<Request>(wire).unwrap(), request);
            }

            #[test]
            fn request_ids_are_unique(params in prop::collection::vec(params(), 1..20)) {
                let ids: HashSet<RequestId> = params.iter().map(|params| elicitation_to_request(params).id).collect();
                prop_assert_eq!(ids.len(), params.len());
            }

            #[test]
            fn answers_map_to_accept_decline_or_cancel(answer in answers()) {
                let wire = serde_json::to_value(answer_to_elicit_result(&answer)).unwrap();
                let expected = match answer.verdict {
                    Verdict::Accept => json!({"action": "accept", "content": answer.data.clone().unwrap_or_default()}),
                    Verdict::Refuse(Some(Reason::Declined)) => json!({"action": "decline"}),
                    Verdict::Refuse(_) => json!({"action": "cancel"}),
                };
                prop_assert_eq!(wire, expected);
            }

            #[test]
            fn answers_serialize_without_nulls_and_round_trip(answer in answers()) {
                let wire = serde_json::to_value(&answer).unwrap();
                prop_assert!(no_null_keys(&wire), "{}", wire);
                prop_assert_eq!(serde_json::from_value::<Answer>(wire).unwrap(), answer);
            }
        }
    }
}
