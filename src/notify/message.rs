//! What a notification says, and how it says it: a plain-text mail, a Slack Block Kit message, a Teams
//! Adaptive Card. A new Request's message says what is asked, by whom, for which tool and arguments, when it
//! expires, and carries the link that answers it; a resolved one's says how it ended and who answered it.

use std::time::Duration;

use lettre::Message;
use lettre::message::{Mailbox, header::ContentType};
use serde_json::{Value, json};

use crate::links::visible;
use crate::records::{CallView, EventKind};

/// The most characters of a call's arguments a message shows; the link's page shows them whole.
const MAX_ARGUMENTS: usize = 1500;
/// The most characters of a prompt a heading shows (a Slack header takes 150).
const MAX_HEADING: usize = 140;

/// What one message tells.
#[derive(Debug, Clone, PartialEq)]
pub struct Notice {
    pub id: String,
    pub kind: String,
    pub prompt: String,
    /// Set once the Request resolved: its status, and who answered (for an answer, whether it was a yes).
    pub ended: Option<Ended>,
    pub server: Option<String>,
    pub tool: Option<String>,
    /// The call's arguments as JSON text, cut at [`MAX_ARGUMENTS`].
    pub arguments: Option<String>,
    /// Who started the call, or posted the Request.
    pub asked_by: Option<String>,
    pub expires_at: Option<String>,
    /// For an approval, the digest of its arguments.
    pub digest: Option<String>,
    /// The URL of the page that answers it, for a new Request.
    pub link: Option<String>,
    /// For an escalation: how long it has waited unanswered.
    pub waited: Option<Duration>,
}

/// How a Request ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Ended {
    pub status: String,
    pub answered_by: Option<String>,
    pub ok: Option<bool>,
}

/// The call an approval Request holds (`data.call`): only one a policy raised, never a posted Request's claim.
pub fn held_call(request: &Value) -> Option<&Value> {
    let raised = request.get("server").is_some() && request.get("kind").and_then(Value::as_str) == Some("approval");
    request.get("data").and_then(|data| data.get("call")).filter(|_| raised)
}

/// Whether a link's page can answer a Request of this kind (a sampling reply is written in the inbox).
pub fn link_answers(request: &Value) -> bool {
    request.get("kind").and_then(Value::as_str) != Some("sampling")
}

impl Notice {
    /// The notice of a `request.created` or `request.resolved` event's Request, with its call when known.
    pub fn of(kind: EventKind, request: &Value, call: Option<&CallView>, link: Option<String>) -> Self {
        let text = |value: Option<&Value>| value.and_then(Value::as_str).map(str::to_owned);
        let approved = held_call(request);
        let (tool, arguments, asked_by) = match (approved, call) {
            (Some(approved), _) => (
                text(approved.get("tool")),
                approved.get("arguments").cloned(),
                text(approved.get("caller")),
            ),
            (None, Some(call)) => (
                Some(call.tool.clone()),
                serde_json::to_value(&call.arguments).ok(),
                Some(call.owner.clone()),
            ),
            (None, None) => (None, None, text(request.get("owner"))),
        };
        let ended = (kind == EventKind::RequestResolved).then(|| Ended {
            status: text(request.get("status")).unwrap_or_default(),
            answered_by: text(request.get("answeredBy")).map(|name| visible(&name)),
            ok: request
                .get("answer")
                .and_then(|answer| answer.get("ok"))
                .and_then(Value::as_bool),
        });
        Self {
            id: text(request.get("id")).unwrap_or_default(),
            kind: text(request.get("kind")).unwrap_or_default(),
            prompt: visible(&text(request.get("prompt")).unwrap_or_default()),
            ended,
            server: text(request.get("server")),
            tool,
            arguments: arguments.map(|arguments| cut(&visible(&arguments.to_string()), MAX_ARGUMENTS)),
            asked_by: asked_by.map(|name| visible(&name)),
            expires_at: text(request.get("expiresAt")),
            digest: text(request.get("data").and_then(|data| data.get("digest"))).filter(|_| approved.is_some()),
            link,
            waited: None,
        }
    }

    /// The one-line heading: what is asked, or how it ended.
    pub fn heading(&self) -> String {
        let prompt = cut(&self.prompt, MAX_HEADING);
        match (&self.ended, self.waited) {
            (None, Some(waited)) => format!("Still waiting after {}: {prompt}", humantime::format_duration(waited)),
            (None, None) if self.kind == "approval" => format!("Approval needed: {prompt}"),
            (None, None) => format!("Input needed: {prompt}"),
            (Some(ended), _) => format!("{}: {prompt}", ended.outcome()),
        }
    }

    /// The facts a message lists, by name.
    fn facts(&self) -> Vec<(&'static str, String)> {
        let mut facts = Vec::new();
        let mut add = |name, value: &Option<String>| {
            if let Some(value) = value {
                facts.push((name, value.clone()));
            }
        };
        add("Server", &self.server);
        add("Tool", &self.tool);
        add("Asked by", &self.asked_by);
        if self.ended.is_none() {
            add("Expires", &self.expires_at);
        }
        facts.push(("Request", self.id.clone()));
        facts
    }

    /// A plain-text mail from `from` to `to`.
    pub fn mail(&self, from: Mailbox, to: Mailbox) -> Result<Message, lettre::error::Error> {
        let mut body = format!("{}\n\n", self.prompt);
        for (name, value) in self.facts() {
            body.push_str(&format!("{name}: {value}\n"));
        }
        if let Some(arguments) = &self.arguments {
            body.push_str(&format!("\nArguments:\n{arguments}\n"));
        }
        if let Some(digest) = &self.digest {
            body.push_str(&format!("Digest (SHA-256): {digest}\n"));
        }
        match (&self.ended, &self.link) {
            (Some(ended), _) => body.push_str(&format!("\n{}.\n", ended.sentence())),
            (None, Some(link)) => body.push_str(&format!(
                "\nTo answer, open this link (it answers as you, once, until the Request expires):\n{link}\n"
            )),
            (None, None) => body.push_str("\nAnswer it in the gateway's inbox.\n"),
        }
        Message::builder()
            .from(from)
            .to(to)
            .subject(self.heading())
            .header(ContentType::TEXT_PLAIN)
            .body(body)
    }

    /// A Slack message (Block Kit), with the link as a button.
    pub fn slack(&self) -> Value {
        let fields: Vec<Value> = self
            .facts()
            .into_iter()
            .map(|(name, value)| json!({"type": "mrkdwn", "text": format!("*{name}*\n{}", slack_escape(&value))}))
            .collect();
        let mut blocks = vec![
            json!({"type": "header", "text": {"type": "plain_text", "text": cut(&self.heading(), 150), "emoji": false}}),
            json!({"type": "section", "fields": fields}),
        ];
        if let Some(arguments) = &self.arguments {
            blocks.push(json!({"type": "section", "text": {"type": "mrkdwn",
                "text": format!("*Arguments*\n```{}```", slack_escape(arguments))}}));
        }
        match (&self.ended, &self.link) {
            (Some(ended), _) => blocks.push(json!({"type": "context", "elements": [
                {"type": "mrkdwn", "text": slack_escape(&ended.sentence())}]})),
            (None, Some(link)) => blocks.push(json!({"type": "actions", "elements": [{
                "type": "button", "style": "primary", "url": link, "action_id": "answer",
                "text": {"type": "plain_text", "text": "Review and answer"}}]})),
            (None, None) => {}
        }
        json!({"text": self.heading(), "blocks": blocks})
    }

    /// A Teams message: an Adaptive Card, with the link as an action.
    pub fn teams(&self) -> Value {
        let facts: Vec<Value> = self
            .facts()
            .into_iter()
            .map(|(name, value)| json!({"title": name, "value": value}))
            .collect();
        let mut body = vec![
            json!({"type": "TextBlock", "text": self.heading(), "weight": "bolder", "size": "medium", "wrap": true}),
            json!({"type": "FactSet", "facts": facts}),
        ];
        if let Some(arguments) = &self.arguments {
            body.push(json!({"type": "TextBlock", "text": arguments, "fontType": "monospace", "wrap": true}));
        }
        if let Some(ended) = &self.ended {
            body.push(json!({"type": "TextBlock", "text": ended.sentence(), "wrap": true}));
        }
        let mut card = json!({
            "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
            "type": "AdaptiveCard",
            "version": "1.4",
            "body": body,
        });
        if let (None, Some(link)) = (&self.ended, &self.link) {
            card["actions"] = json!([{"type": "Action.OpenUrl", "title": "Review and answer", "url": link}]);
        }
        json!({"type": "message", "attachments": [{
            "contentType": "application/vnd.microsoft.card.adaptive", "contentUrl": null, "content": card}]})
    }
}

impl Ended {
    /// The outcome in a word or two.
    fn outcome(&self) -> &'static str {
        match (self.status.as_str(), self.ok) {
            ("answered", Some(true)) => "Answered",
            ("answered", _) => "Declined",
            ("expired", _) => "Expired",
            _ => "Cancelled",
        }
    }

    /// The outcome as a sentence: who answered, or that nobody did.
    fn sentence(&self) -> String {
        match (&self.answered_by, self.status.as_str()) {
            (Some(by), "answered") => format!("{} by {by}", self.outcome()),
            (_, "expired") => "Expired: nobody answered in time".to_owned(),
            _ => format!("{}; nobody answered it", self.outcome()),
        }
    }
}

/// `text` without the characters Slack's mrkdwn gives meaning to (`&`, `<`, `>`), as its docs ask.
fn slack_escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// `text` cut to at most `most` characters, with `…` when cut.
fn cut(text: &str, most: usize) -> String {
    if text.chars().count() <= most {
        return text.to_owned();
    }
    let mut cut: String = text.chars().take(most.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

#[cfg(test)]
mod tests {
    use super::*;

    fn approval() -> Value {
        json!({"id": "apv-1", "kind": "approval", "prompt": "Allow deploy on prod?", "status": "pending",
            "server": "prod", "expiresAt": "2026-12-05T10:00:00.000Z",
            "data": {"call": {"server": "prod", "tool": "deploy", "arguments": {"to": "<prod> & more"},
                "caller": "ci-agent"}, "digest": "abc"}})
    }

    #[test]
    fn a_new_approval_names_the_call_and_carries_its_link() {
        let notice = Notice::of(
            EventKind::RequestCreated,
            &approval(),
            None,
            Some("https://g/r/t".into()),
        );
        assert_eq!(notice.heading(), "Approval needed: Allow deploy on prod?");
        assert_eq!(notice.tool.as_deref(), Some("deploy"));
        assert_eq!(notice.asked_by.as_deref(), Some("ci-agent"));
        let slack = notice.slack().to_string();
        assert!(
            slack.contains("&lt;prod&gt; &amp; more") && slack.contains("https://g/r/t"),
            "{slack}"
        );
        let teams = notice.teams();
        assert_eq!(teams["attachments"][0]["content"]["actions"][0]["url"], "https://g/r/t");
        let mail = notice
            .mail("g@example.com".parse().unwrap(), "sre@example.com".parse().unwrap())
            .unwrap();
        let text = String::from_utf8(mail.formatted()).unwrap();
        assert!(
            text.contains("https://g/r/t") && text.contains("Tool: deploy"),
            "{text}"
        );
    }

    #[test]
    fn a_resolved_request_says_who_answered_and_carries_no_link() {
        let mut request = approval();
        request["status"] = json!("answered");
        request["answeredBy"] = json!("lead");
        request["answer"] = json!({"ok": false, "reason": "declined"});
        let notice = Notice::of(EventKind::RequestResolved, &request, None, None);
        assert_eq!(notice.heading(), "Declined: Allow deploy on prod?");
        assert!(notice.slack().to_string().contains("Declined by lead"));
        assert!(notice.teams()["attachments"][0]["content"].get("actions").is_none());
    }

    #[test]
    fn a_posted_request_of_kind_approval_names_no_call() {
        let mut posted = approval();
        posted.as_object_mut().unwrap().remove("server");
        let notice = Notice::of(EventKind::RequestCreated, &posted, None, None);
        assert_eq!((notice.tool, notice.digest), (None, None));
    }

    #[test]
    fn long_text_is_cut_on_a_character() {
        assert_eq!(cut("ééé", 3), "ééé");
        assert_eq!(cut("éééé", 3), "éé…");
    }
}
