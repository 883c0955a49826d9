//! A Request posted to `POST /requests` by a toolnexus host: its body parsed into a §10 Request, with every
//! problem listed — the shape (`400`) first, then what each kind requires and the credential rule (`422`).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde_json::{Map, Value};

use crate::ids::{self, RequestId};
use crate::suspension::{Request, RequestKind};
use crate::time::Timestamp;
use crate::validation::{self, Violation};

/// The keys a posted body may have.
const KEYS: [&str; 6] = ["id", "kind", "prompt", "url", "data", "expiresAt"];
/// The keys one of `data.questions` may have.
const QUESTION_KEYS: [&str; 4] = ["question", "header", "options", "multiple"];

/// What a property name or a question's header must not contain (compared lowercase, without `_`, `-`, `.`
/// or spaces): a form that asks for one of these collects a credential, which goes through `authorization`.
const CREDENTIAL_NAMES: [&str; 9] = [
    "password",
    "passwd",
    "passphrase",
    "secret",
    "token",
    "apikey",
    "privatekey",
    "credential",
    "pincode",
];
/// What a question's text must not ask for, in the same form.
const CREDENTIAL_WORDS: [&str; 7] = [
    "password",
    "passwd",
    "passphrase",
    "apikey",
    "privatekey",
    "secretkey",
    "accesstoken",
];

/// Why a body is not a Request the gateway takes.
#[derive(Debug)]
pub enum Refusal {
    /// Its shape is wrong: unknown keys, wrong types, missing keys (`400`).
    Malformed(Vec<Violation>),
    /// Well formed, but not what its kind requires, or it would collect a credential (`422`).
    Unprocessable(Vec<Violation>),
}

/// A posted Request, checked: its id (minted when the body gave none) and when it expires (`None`: after
/// `requests.ttl`).
#[derive(Debug, Clone)]
pub struct Posted {
    pub request: Request,
    pub deadline: Option<Timestamp>,
}

impl Posted {
    /// Parses a body posted at `now`, listing every problem.
    pub fn parse(body: &Map<String, Value>, now: Timestamp) -> Result<Self, Refusal> {
        let mut shape = Vec::new();
        for key in body.keys().filter(|key| !KEYS.contains(&key.as_str())) {
            shape.push(problem(&format!("/{key}"), "is not a key of a Request"));
        }
        let id = text(body, "id", Presence::Optional, &mut shape);
        let kind = text(body, "kind", Presence::Required, &mut shape);
        let prompt = text(body, "prompt", Presence::Required, &mut shape);
        let url = text(body, "url", Presence::Optional, &mut shape);
        let expires_at = text(body, "expiresAt", Presence::Optional, &mut shape);
        let data = match body.get("data") {
            None | Some(Value::Null) => None,
            Some(Value::Object(data)) => Some(data.clone()),
            Some(_) => {
                shape.push(problem("/data", "must be an object"));
                None
            }
        };
        if !shape.is_empty() {
            return Err(Refusal::Malformed(shape));
        }
        let (kind, prompt) = (kind.unwrap_or_default(), prompt.unwrap_or_default());
        let mut wrong = Vec::new();
        let id = id.as_deref().map(RequestId::parse);
        if let Some(None) = id {
            wrong.push(problem("/id", "must be 1 to 128 of A-Z a-z 0-9 _ - . :"));
        }
        if !ids::is_name(&kind) {
            wrong.push(problem("/kind", "must be 1 to 128 of A-Z a-z 0-9 _ - . :"));
        }
        if prompt.trim().is_empty() {
            wrong.push(problem("/prompt", "must not be empty"));
        }
        if let Some(url) = &url
            && !is_web_url(url)
        {
            wrong.push(problem("/url", "must be an http or https URL"));
        }
        let deadline = expires_at.as_deref().and_then(|at| deadline(at, now, &mut wrong));
        let kind = RequestKind::from(kind);
        check_kind(&kind, url.as_deref(), data.as_ref(), &mut wrong);
        if !wrong.is_empty() {
            return Err(Refusal::Unprocessable(wrong));
        }
        Ok(Self {
            request: Request {
                id: id.flatten().unwrap_or_else(|| RequestId::mint(ids::POSTED)),
                kind,
                prompt,
                url,
                data: data.map(Arc::new),
                expires_at,
            },
            deadline,
        })
    }
}

/// Checks what each kind requires, and that `data.schema`, whatever the kind, is a usable form that
/// collects no credential.
fn check_kind(kind: &RequestKind, url: Option<&str>, data: Option<&Map<String, Value>>, wrong: &mut Vec<Violation>) {
    let schema = data.and_then(|data| data.get("schema"));
    match kind {
        RequestKind::Input if schema.is_none() => wrong.push(problem("/data/schema", "is required for kind \"input\"")),
        RequestKind::Question => check_questions(data.and_then(|data| data.get("questions")), wrong),
        RequestKind::Authorization if url.is_none() => {
            wrong.push(problem("/url", "is required for kind \"authorization\""))
        }
        _ => {}
    }
    if let Some(schema) = schema {
        if let Err(why) = validation::compile(schema) {
            wrong.push(problem("/data/schema", &why));
        }
        let properties = schema.get("properties").and_then(Value::as_object);
        for (name, property) in properties.into_iter().flatten() {
            let password = property.get("format").and_then(Value::as_str) == Some("password");
            if password || looks_like(name, &CREDENTIAL_NAMES) {
                wrong.push(problem(
                    &format!("/data/schema/properties/{}", pointer_segment(name)),
                    "asks for a credential: collect secrets with kind \"authorization\" and a url",
                ));
            }
        }
    }
}

/// Checks `data.questions`: `[{question, header?, options?, multiple?}]`, not empty, asking for no credential.
fn check_questions(questions: Option<&Value>, wrong: &mut Vec<Violation>) {
    let questions = match questions {
        Some(Value::Array(questions)) if !questions.is_empty() => questions,
        Some(_) => return wrong.push(problem("/data/questions", "must be a non-empty array")),
        None => return wrong.push(problem("/data/questions", "is required for kind \"question\"")),
    };
    for (index, question) in questions.iter().enumerate() {
        let at = |key: &str| format!("/data/questions/{index}{key}");
        let Some(question) = question.as_object() else {
            wrong.push(problem(&at(""), "must be an object"));
            continue;
        };
        for key in question.keys().filter(|key| !QUESTION_KEYS.contains(&key.as_str())) {
            wrong.push(problem(
                &at(&format!("/{}", pointer_segment(key))),
                "is not a key of a question",
            ));
        }
        match question.get("question") {
            Some(Value::String(text)) if !text.trim().is_empty() => {
                if looks_like(text, &CREDENTIAL_WORDS) {
                    wrong.push(problem(
                        &at("/question"),
                        "asks for a credential: collect secrets with kind \"authorization\" and a url",
                    ));
                }
            }
            Some(Value::String(_)) => wrong.push(problem(&at("/question"), "must not be empty")),
            Some(_) => wrong.push(problem(&at("/question"), "must be a string")),
            None => wrong.push(problem(&at("/question"), "is required")),
        }
        match question.get("header") {
            Some(Value::String(header)) if looks_like(header, &CREDENTIAL_NAMES) => {
                wrong.push(problem(
                    &at("/header"),
                    "asks for a credential: collect secrets with kind \"authorization\" and a url",
                ));
            }
            None | Some(Value::String(_)) => {}
            Some(_) => wrong.push(problem(&at("/header"), "must be a string")),
        }
        match question.get("options") {
            Some(Value::Array(options)) if options.iter().all(Value::is_string) => {}
            None => {}
            Some(_) => wrong.push(problem(&at("/options"), "must be an array of strings")),
        }
        if question.get("multiple").is_some_and(|multiple| !multiple.is_boolean()) {
            wrong.push(problem(&at("/multiple"), "must be a boolean"));
        }
    }
}

/// Whether a key of a posted Request must be there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Presence {
    Required,
    Optional,
}

/// The string under `key`, noting its absence (when required) or another type; `null` is absent.
fn text(body: &Map<String, Value>, key: &str, presence: Presence, shape: &mut Vec<Violation>) -> Option<String> {
    match body.get(key).filter(|value| !value.is_null()) {
        Some(Value::String(text)) => Some(text.clone()),
        Some(_) => {
            shape.push(problem(&format!("/{key}"), "must be a string"));
            None
        }
        None if presence == Presence::Required => {
            shape.push(problem(&format!("/{key}"), "is required"));
            None
        }
        None => None,
    }
}

/// When an `expiresAt` falls, noting one that is not RFC 3339 or is not after `now`.
fn deadline(at: &str, now: Timestamp, wrong: &mut Vec<Violation>) -> Option<Timestamp> {
    let Some(when) = parse_rfc3339(at) else {
        let message = match before_1970(at) {
            true => "has passed",
            false => "must be an RFC 3339 instant, e.g. 2026-01-01T00:00:00Z",
        };
        wrong.push(problem("/expiresAt", message));
        return None;
    };
    let millis = when
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_millis();
    let when = Timestamp::from_millis(i64::try_from(millis).unwrap_or(i64::MAX));
    if when <= now {
        wrong.push(problem("/expiresAt", "has passed"));
        return None;
    }
    Some(when)
}

/// An RFC 3339 instant, in UTC (`Z`) or with an offset (`+02:00`).
fn parse_rfc3339(at: &str) -> Option<SystemTime> {
    let split = at.len().checked_sub(6)?;
    let (local, offset) = match at.get(split..).map(str::as_bytes) {
        Some([sign @ (b'+' | b'-'), _, _, b':', _, _]) => {
            let hours: u64 = at.get(split + 1..split + 3)?.parse().ok()?;
            let minutes: u64 = at.get(split + 4..)?.parse().ok()?;
            let offset = Duration::from_secs(hours * 3600 + minutes * 60);
            (format!("{}Z", &at[..split]), Some((*sign == b'+', offset)))
        }
        _ => (at.to_owned(), None),
    };
    let when = humantime::parse_rfc3339(&local).ok()?;
    match offset {
        // A local time ahead of UTC: the instant is earlier in UTC.
        Some((true, offset)) => when.checked_sub(offset),
        Some((false, offset)) => when.checked_add(offset),
        None => Some(when),
    }
}

/// Whether `at` is an RFC 3339 instant in a year before 1970, which [`parse_rfc3339`] does not take: the same
/// instant in 1972 (a leap year, so any day of the year is one) parses.
fn before_1970(at: &str) -> bool {
    let year = at
        .get(..4)
        .filter(|year| year.bytes().all(|digit| digit.is_ascii_digit()));
    year.and_then(|year| year.parse::<u16>().ok())
        .is_some_and(|year| year < 1970 && parse_rfc3339(&format!("1972{}", &at[4..])).is_some())
}

/// Whether `text`, lowercase and without separators, contains one of `words`.
fn looks_like(text: &str, words: &[&str]) -> bool {
    let folded: String = text
        .chars()
        .filter(|c| !matches!(c, '_' | '-' | '.' | ' '))
        .flat_map(char::to_lowercase)
        .collect();
    words.iter().any(|word| folded.contains(word))
}

/// Whether `url` is an absolute http or https URL with a host.
fn is_web_url(url: &str) -> bool {
    let lower = url.to_ascii_lowercase();
    let rest = lower.strip_prefix("https://").or_else(|| lower.strip_prefix("http://"));
    rest.is_some_and(|rest| {
        let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
        !host.is_empty() && !url.chars().any(char::is_whitespace)
    })
}

fn problem(path: &str, message: &str) -> Violation {
    Violation {
        path: path.to_owned(),
        message: message.to_owned(),
    }
}

fn pointer_segment(name: &str) -> String {
    name.replace('~', "~0").replace('/', "~1")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(body: Value) -> Result<Posted, Refusal> {
        Posted::parse(body.as_object().unwrap(), crate::time::Clock::default().now())
    }

    fn paths(refusal: Refusal) -> Vec<String> {
        let (Refusal::Malformed(problems) | Refusal::Unprocessable(problems)) = refusal;
        problems.into_iter().map(|problem| problem.path).collect()
    }

    #[test]
    fn every_shape_problem_is_listed() {
        let refused = parse(json!({"kind": 1, "data": [], "extra": true})).unwrap_err();
        assert!(matches!(refused, Refusal::Malformed(_)));
        assert_eq!(paths(refused), ["/extra", "/kind", "/prompt", "/data"]);
    }

    #[test]
    fn credential_looking_fields_are_refused() {
        let schema = json!({"type": "object", "properties": {
            "name": {"type": "string"},
            "API-Key": {"type": "string"},
            "pin": {"type": "string", "format": "password"},
        }});
        let refused = parse(json!({"kind": "input", "prompt": "p", "data": {"schema": schema}})).unwrap_err();
        assert_eq!(
            paths(refused),
            ["/data/schema/properties/API-Key", "/data/schema/properties/pin"]
        );
    }

    #[test]
    fn questions_are_checked_item_by_item() {
        let questions =
            json!([{"question": "Which?", "options": ["a", 1]}, {"header": "h"}, {"question": "Your password?"}]);
        let refused = parse(json!({"kind": "question", "prompt": "p", "data": {"questions": questions}})).unwrap_err();
        assert_eq!(
            paths(refused),
            [
                "/data/questions/0/options",
                "/data/questions/1/question",
                "/data/questions/2/question"
            ]
        );
    }

    #[test]
    fn each_kind_takes_what_it_requires() {
        let url = parse(json!({"kind": "authorization", "prompt": "Log in", "url": "https://x.example/login"}));
        assert!(url.is_ok());
        assert!(is_web_url("http://localhost:8080/a"));
        assert!(!is_web_url("ftp://x") && !is_web_url("https://") && !is_web_url("javascript:alert(1)"));
        let custom = parse(json!({"kind": "deploy.approve", "prompt": "Ship it?", "id": "run-7:step-2"})).unwrap();
        assert_eq!(custom.request.id, "run-7:step-2");
        let past = parse(json!({"kind": "x", "prompt": "p", "expiresAt": "2001-01-01T00:00:00Z"})).unwrap_err();
        assert_eq!(paths(past), ["/expiresAt"]);
        for (at, message) in [
            ("0137-03-07T05:00:33.432238Z", "has passed"),
            ("1968-02-29T12:00:00+17:04", "has passed"),
            (
                "1969-13-01T00:00:00Z",
                "must be an RFC 3339 instant, e.g. 2026-01-01T00:00:00Z",
            ),
            ("0137", "must be an RFC 3339 instant, e.g. 2026-01-01T00:00:00Z"),
        ] {
            let Err(Refusal::Unprocessable(problems)) = parse(json!({"kind": "x", "prompt": "p", "expiresAt": at}))
            else {
                panic!("{at} was taken");
            };
            assert_eq!(problems[0].message, message, "{at}");
        }
        let utc = parse_rfc3339("2030-01-01T00:00:00Z").unwrap();
        assert_eq!(parse_rfc3339("2030-01-01T02:30:00+02:30"), Some(utc));
        assert_eq!(parse_rfc3339("2029-12-31T23:00:00.000-01:00"), Some(utc));
        assert_eq!(parse_rfc3339("tomorrow"), None);
    }
}
