//! An upstream's `sampling/createMessage` (a 2025-11-25 request, or an input request of a 2026-07-28 round) as a
//! Request a person answers: the conversation it
//! carries is shown, and the person's reply goes back as the message a model would have written.

use std::sync::Arc;

#[allow(deprecated, reason = "2025-11-25 servers still ask for sampling")]
use rmcp::model::{CreateMessageResult, SamplingMessage};
use rmcp::model::{ElicitResult, ElicitationAction, ErrorCode, ErrorData};
use serde_json::{Map, Value, json};

use crate::ids::{self, RequestId};
use crate::suspension::{Request, RequestKind};

/// The `model` a person's reply is sent as.
pub const MODEL: &str = "human";

/// The error a declined or cancelled sampling request gets, as MCP's sampling examples give it.
const REJECTED: i32 = -1;

/// The params' keys a sampling Request's `data` keeps, as the server sent them.
const KEPT: [&str; 5] = [
    "messages",
    "systemPrompt",
    "modelPreferences",
    "maxTokens",
    "stopSequences",
];

/// Checks that sampling params are what MCP defines: an object with a list of `messages`.
pub fn check_params(params: &Value) -> Result<(), String> {
    match params.get("messages") {
        Some(Value::Array(messages)) if !messages.is_empty() => Ok(()),
        _ => Err("the sampling request has no messages".to_owned()),
    }
}

/// The Request of a sampling request: kind `sampling`, its prompt the last text a user wrote in the
/// conversation, and its `data` the conversation (`messages`, `systemPrompt`, `modelPreferences`, `maxTokens`,
/// `stopSequences`) with the form of the reply (`schema`: one `text`).
pub fn sampling_to_request(params: &Value) -> Request {
    let text_of = |message: &Value| {
        let content = &message["content"];
        let blocks = content
            .as_array()
            .map_or_else(|| vec![content], |blocks| blocks.iter().collect());
        blocks
            .into_iter()
            .find_map(|block| (block["type"] == "text").then(|| block["text"].as_str()).flatten())
            .map(str::to_owned)
    };
    let prompt = params["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .rev()
        .filter(|message| message["role"] == "user")
        .find_map(text_of)
        .unwrap_or_else(|| "The server asks for a reply to its conversation".to_owned());
    let mut data: Map<String, Value> = KEPT
        .into_iter()
        .filter_map(|key| params.get(key).map(|value| (key.to_owned(), value.clone())))
        .collect();
    data.insert(
        "schema".to_owned(),
        json!({"type": "object", "properties": {"text": {"type": "string", "title": "Reply", "minLength": 1}},
            "required": ["text"]}),
    );
    Request {
        id: RequestId::mint(ids::REQUEST),
        kind: RequestKind::Sampling,
        prompt,
        url: None,
        data: Some(Arc::new(data)),
        expires_at: None,
    }
}

/// What the server gets for the answer to a sampling Request: the reply's text as the assistant's message, or
/// the error of a sampling request the person declined or cancelled.
#[allow(deprecated, reason = "2025-11-25 servers still ask for sampling")]
pub fn reply(result: ElicitResult) -> Result<CreateMessageResult, ErrorData> {
    let text = result.content.as_ref().and_then(|content| content["text"].as_str());
    match (&result.action, text) {
        (ElicitationAction::Accept, Some(text)) => {
            let mut reply = CreateMessageResult::new(SamplingMessage::assistant_text(text), MODEL.to_owned());
            reply.stop_reason = Some(CreateMessageResult::STOP_REASON_END_TURN.to_owned());
            Ok(reply)
        }
        (ElicitationAction::Decline, _) => Err(ErrorData::new(
            ErrorCode(REJECTED),
            "User rejected sampling request",
            None,
        )),
        _ => Err(ErrorData::new(
            ErrorCode(REJECTED),
            "The sampling request was cancelled",
            None,
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sampling_request_is_asked_with_its_last_user_text_and_answered_as_the_assistant() {
        let params = json!({
            "messages": [
                {"role": "user", "content": {"type": "text", "text": "First?"}},
                {"role": "assistant", "content": {"type": "text", "text": "Yes."}},
                {"role": "user", "content": [{"type": "image", "data": "", "mimeType": "image/png"},
                    {"type": "text", "text": "And then?"}]}
            ],
            "systemPrompt": "Be brief.", "maxTokens": 50, "temperature": 0.2
        });
        assert_eq!(check_params(&params), Ok(()));
        let request = sampling_to_request(&params);
        assert_eq!(
            (request.kind.as_str(), request.prompt.as_str()),
            ("sampling", "And then?")
        );
        let data = request.data.unwrap();
        assert_eq!(data["systemPrompt"], "Be brief.");
        assert_eq!(data["messages"], params["messages"]);
        assert!(data.get("temperature").is_none() && data["schema"]["required"] == json!(["text"]));
        assert!(check_params(&json!({"messages": []})).is_err());

        let accepted = ElicitResult::new(ElicitationAction::Accept).with_content(json!({"text": "Then this."}));
        let sent = serde_json::to_value(reply(accepted).unwrap()).unwrap();
        assert_eq!(sent["role"], "assistant");
        assert_eq!(sent["content"]["text"], "Then this.");
        assert_eq!(
            (&sent["model"], &sent["stopReason"]),
            (&json!("human"), &json!("endTurn"))
        );
        let declined = reply(ElicitResult::new(ElicitationAction::Decline)).unwrap_err();
        assert_eq!(declined.code, ErrorCode(REJECTED));
    }
}
