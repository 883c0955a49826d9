//! The page of an answer link: the Request as HTML, with a form that posts back to the same URL, and what such
//! a form posts read back into an Answer. Plain HTML with no script, so that it works in any browser a mail or
//! chat message opens; every value shown is escaped.

use std::fmt::Write as _;

use serde_json::{Map, Value, json};

use crate::links::visible;
use crate::records::{CallView, RequestView, Status};
use crate::suspension::RequestKind;
use crate::validation::Violation;

/// The field that says what the person decided: `approve` (or `accept`) or `decline`.
pub const DECISION: &str = "decision";
/// What a form field of a schema's property is named: this and the property's name.
const FIELD: &str = "f.";
/// What the field of a question is named: this and the question's index.
const QUESTION: &str = "q.";

/// `text` with the characters HTML gives meaning to escaped, for an element's text or a quoted attribute.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A whole page: `title` and `body` (HTML already escaped).
pub fn document(title: &str, body: &str) -> String {
    format!(
        "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <meta name=\"robots\" content=\"noindex\">\n<title>{} · toolnexus-gateway</title>\n\
         <link rel=\"icon\" href=\"/ui/favicon.svg\" type=\"image/svg+xml\">\n\
         <link rel=\"stylesheet\" href=\"/ui/link.css\">\n</head>\n<body>\n<main>\n{body}</main>\n</body>\n</html>\n",
        escape(&visible(title))
    )
}

/// A page that only says something: `heading` and a paragraph.
pub fn notice(heading: &str, text: &str) -> String {
    document(
        heading,
        &format!(
            "<h1>{}</h1>\n<p class=\"notice\">{}</p>\n",
            escape(heading),
            escape(&visible(text))
        ),
    )
}

/// What a form posted, as it was entered: kept to show again beside the errors of an answer that was refused.
pub type Entered = [(String, String)];

/// Whether a link's page asks its person to sign in before it answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Signing {
    /// Links answer as their holder.
    Off,
    /// Nobody has signed in for this link yet: the page offers `url`, which starts it.
    Needed { url: String },
    /// Signed in as `name`, whose answer it takes.
    SignedIn { name: String },
}

/// The page of a Request: what it asks and for which call, and, while it is pending, a form to answer it (or,
/// when `signing` says so, the way to sign in first). `problem` and `violations` say why the last answer was
/// refused, `entered` what it held.
pub fn request(
    view: &RequestView,
    call: Option<&CallView>,
    signing: &Signing,
    problem: Option<&str>,
    violations: &[Violation],
    entered: &Entered,
) -> String {
    let request = &view.request;
    let heading = match (&request.url, request.prompt.is_empty()) {
        (_, false) => request.prompt.clone(),
        (Some(_), true) => "Visit a link".to_owned(),
        (None, true) => "A request".to_owned(),
    };
    let mut body = format!("<h1><bdi>{}</bdi></h1>\n<dl>\n", escape(&visible(&heading)));
    let mut fact = |name: &str, value: &str, class: &str| {
        let _ = writeln!(
            body,
            "<div><dt>{name}</dt><dd{class}><bdi>{}</bdi></dd></div>",
            escape(&visible(value))
        );
    };
    let data = request.data.as_deref();
    let approval = data
        .and_then(|data| data.get("call"))
        .filter(|_| request.kind == RequestKind::Approval && !view.is_posted());
    let text = |value: Option<&Value>| value.and_then(Value::as_str).unwrap_or_default().to_owned();
    if let Some(approved) = approval {
        fact("Server", &text(approved.get("server")), "");
        fact("Tool", &text(approved.get("tool")), "");
        fact("Asked by", &text(approved.get("caller")), "");
        let arguments = approved.get("arguments").cloned().unwrap_or(Value::Null);
        fact("Arguments", &pretty(&arguments), " class=\"json\"");
        fact(
            "Digest (SHA-256)",
            &text(data.and_then(|data| data.get("digest"))),
            " class=\"id\"",
        );
    } else if let Some(call) = call {
        fact("Server", &call.server, "");
        fact("Tool", &call.tool, "");
        fact("Asked by", &call.owner, "");
        let arguments = serde_json::to_value(&call.arguments).unwrap_or(Value::Null);
        fact("Arguments", &pretty(&arguments), " class=\"json\"");
    } else {
        if let Some(server) = &view.server {
            fact("Server", server, "");
        }
        if let Some(owner) = &view.owner {
            fact(if view.is_posted() { "Posted by" } else { "Asked by" }, owner, "");
        }
    }
    fact("Kind", request.kind.as_str(), "");
    let expires = request.expires_at.clone().unwrap_or_default();
    if view.status == Status::Pending && !expires.is_empty() {
        fact("Expires", &expires, "");
    }
    if let Some(quorum) = data
        .and_then(|data| data.get("quorum"))
        .and_then(Value::as_u64)
        .filter(|_| approval.is_some())
    {
        let given: Vec<&str> = view
            .decisions
            .iter()
            .filter(|signoff| signoff.ok)
            .map(|signoff| signoff.by.as_str())
            .collect();
        let mut count = format!("{} of {quorum} approvals", given.len());
        if !given.is_empty() {
            let _ = write!(count, " (by {})", given.join(", "));
        }
        fact("Approvals", &count, "");
    }
    body.push_str("</dl>\n");
    if view.status != Status::Pending {
        let by = view
            .answered_by
            .as_deref()
            .map(|by| format!(" by {by}"))
            .unwrap_or_default();
        let _ = writeln!(
            body,
            "<p class=\"notice\">This Request is {}<bdi>{}</bdi>: nothing is left to answer.</p>",
            escape(view.status.as_str()),
            escape(&visible(&by))
        );
        return document(&heading, &body);
    }
    if let Some(problem) = problem {
        let _ = writeln!(
            body,
            "<p class=\"problem\" role=\"alert\">{}</p>",
            escape(&visible(problem))
        );
        if !violations.is_empty() {
            body.push_str("<ul class=\"problem\">\n");
            for violation in violations {
                let _ = writeln!(
                    body,
                    "<li><code>{}</code>: {}</li>",
                    escape(&visible(&violation.path)),
                    escape(&visible(&violation.message))
                );
            }
            body.push_str("</ul>\n");
        }
    }
    match signing {
        Signing::Off => {}
        Signing::Needed { url } => {
            let _ = writeln!(
                body,
                "<p class=\"hint\">This link answers once you have signed in, as you.</p>\n\
                 <p class=\"actions\"><a class=\"button primary\" href=\"{}\">Sign in to answer</a></p>",
                escape(url)
            );
            return document(&heading, &body);
        }
        Signing::SignedIn { name } => {
            let _ = writeln!(
                body,
                "<p class=\"hint\">Signed in as <bdi>{}</bdi>: you answer as yourself.</p>",
                escape(&visible(name))
            );
        }
    }
    body.push_str("<form method=\"post\">\n");
    let accept = match request.kind {
        _ if approval.is_some() => {
            body.push_str(
                "<p class=\"hint\">Approving lets the gateway send this call, with exactly these arguments, to its \
                 server.</p>\n",
            );
            buttons(&mut body, "approve", "Approve");
            return finish(&heading, body);
        }
        RequestKind::Sampling => {
            body.push_str(
                "<p class=\"hint\">A server asks for a reply to a conversation: answer it in the \
                 <a href=\"/ui/\">inbox</a>.</p>\n</form>\n",
            );
            return document(&heading, &body);
        }
        _ => "Accept",
    };
    if let Some(url) = &request.url {
        let _ = writeln!(
            body,
            "<p class=\"hint\">The server asks you to visit this address. Check its host, open it yourself, then \
             answer:</p>\n<p class=\"url\" dir=\"ltr\">{}</p>",
            escape(&visible(url))
        );
        buttons(&mut body, "accept", "Done");
        return finish(&heading, body);
    }
    let entered_value = |name: &str| -> Vec<&str> {
        entered
            .iter()
            .filter(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
            .collect()
    };
    if let Some(properties) = data
        .and_then(|data| data.get("schema"))
        .and_then(|schema| schema.get("properties"))
        .and_then(Value::as_object)
    {
        let required: Vec<&str> = data
            .and_then(|data| data.get("schema"))
            .and_then(|schema| schema.get("required"))
            .and_then(Value::as_array)
            .map(|names| names.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        for (name, schema) in properties {
            let field = format!("{FIELD}{name}");
            let entered = entered_value(&field);
            property(
                &mut body,
                &field,
                name,
                schema,
                required.contains(&name.as_str()),
                &entered,
            );
        }
    } else if let Some(questions) = data.and_then(|data| data.get("questions")).and_then(Value::as_array) {
        for (index, question) in questions.iter().enumerate() {
            let field = format!("{QUESTION}{index}");
            let options: Vec<Value> = question
                .get("options")
                .and_then(Value::as_array)
                .map(|options| {
                    options
                        .iter()
                        .map(|option| Value::String(option_text(option)))
                        .collect()
                })
                .unwrap_or_default();
            let multiple = question.get("multiple").and_then(Value::as_bool) == Some(true);
            let schema = match (options.is_empty(), multiple) {
                (true, _) => json!({"type": "string"}),
                (false, true) => json!({"type": "array", "items": {"enum": options}}),
                (false, false) => json!({"type": "string", "enum": options}),
            };
            let mut schema = schema;
            schema["title"] = question.get("question").cloned().unwrap_or(Value::Null);
            if let Some(header) = question.get("header") {
                schema["description"] = header.clone();
            }
            let entered = entered_value(&field);
            property(&mut body, &field, &index.to_string(), &schema, !multiple, &entered);
        }
    } else if let Some(data) = data.filter(|data| !data.is_empty()) {
        let _ = writeln!(
            body,
            "<p class=\"hint\">Data</p>\n<pre class=\"json\">{}</pre>",
            escape(&visible(&pretty(&Value::Object(data.clone()))))
        );
    }
    buttons(&mut body, "accept", accept);
    finish(&heading, body)
}

fn finish(heading: &str, mut body: String) -> String {
    body.push_str("</form>\n");
    document(heading, &body)
}

/// The two buttons of a form: `value` with its `label`, and Decline.
fn buttons(body: &mut String, value: &str, label: &str) {
    let _ = writeln!(
        body,
        "<div class=\"actions\"><button type=\"submit\" name=\"{DECISION}\" value=\"{value}\" class=\"primary\">{label}</button> \
         <button type=\"submit\" name=\"{DECISION}\" value=\"decline\" formnovalidate>Decline</button></div>"
    );
}

/// A question's option as its text.
fn option_text(option: &Value) -> String {
    match option {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// A form's choices of a property: each value and its title, from `enum` or titled `oneOf` / `anyOf`.
fn choices(schema: &Value) -> Option<Vec<(String, String)>> {
    let schema = schema.get("items").unwrap_or(schema);
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        let titles = schema.get("enumNames").and_then(Value::as_array);
        return Some(
            values
                .iter()
                .enumerate()
                .map(|(index, value)| {
                    let value = option_text(value);
                    let title = titles
                        .and_then(|titles| titles.get(index))
                        .and_then(Value::as_str)
                        .map_or_else(|| value.clone(), str::to_owned);
                    (value, title)
                })
                .collect(),
        );
    }
    let titled = schema
        .get("oneOf")
        .or_else(|| schema.get("anyOf"))
        .and_then(Value::as_array)?;
    Some(
        titled
            .iter()
            .filter_map(|choice| {
                let value = option_text(choice.get("const")?);
                let title = choice
                    .get("title")
                    .and_then(Value::as_str)
                    .map_or_else(|| value.clone(), str::to_owned);
                Some((value, title))
            })
            .collect(),
    )
}

/// One property of a form as a labelled control named `field`, holding what was `entered` (else its default).
fn property(body: &mut String, field: &str, name: &str, schema: &Value, required: bool, entered: &[&str]) {
    let title = schema.get("title").and_then(Value::as_str).unwrap_or(name);
    let kind = schema.get("type").and_then(Value::as_str).unwrap_or("string");
    let default = schema.get("default").map(option_text);
    let current: Vec<String> = if entered.is_empty() {
        match schema.get("default") {
            Some(Value::Array(items)) => items.iter().map(option_text).collect(),
            _ => default.into_iter().collect(),
        }
    } else {
        entered.iter().map(|value| (*value).to_owned()).collect()
    };
    let id = escape(field);
    let field = escape(field);
    let marker = if required {
        " <span class=\"required\">(required)</span>"
    } else {
        ""
    };
    let _ = write!(body, "<div class=\"field\">");
    let described = schema
        .get("description")
        .and_then(Value::as_str)
        .map(|text| format!("<p class=\"hint\">{}</p>", escape(&visible(text))))
        .unwrap_or_default();
    match (kind, choices(schema)) {
        ("array", Some(choices)) => {
            let _ = write!(
                body,
                "<fieldset><legend>{}{marker}</legend>{described}",
                escape(&visible(title))
            );
            for (index, (value, label)) in choices.iter().enumerate() {
                let checked = if current.contains(value) { " checked" } else { "" };
                let _ = write!(
                    body,
                    "<label><input type=\"checkbox\" id=\"{id}.{index}\" name=\"{field}\" value=\"{}\"{checked}> {}</label>",
                    escape(value),
                    escape(&visible(label))
                );
            }
            body.push_str("</fieldset>");
        }
        (_, Some(choices)) => {
            let _ = write!(
                body,
                "<label for=\"{id}\">{}{marker}</label>{described}",
                escape(&visible(title))
            );
            let _ = write!(
                body,
                "<select id=\"{id}\" name=\"{field}\"><option value=\"\"></option>"
            );
            for (value, label) in &choices {
                let selected = if current.first() == Some(value) {
                    " selected"
                } else {
                    ""
                };
                let _ = write!(
                    body,
                    "<option value=\"{}\"{selected}>{}</option>",
                    escape(value),
                    escape(&visible(label))
                );
            }
            body.push_str("</select>");
        }
        ("boolean", None) => {
            let checked = if current.first().map(String::as_str) == Some("true") {
                " checked"
            } else {
                ""
            };
            let _ = write!(
                body,
                "<label><input type=\"checkbox\" id=\"{id}\" name=\"{field}\" value=\"true\"{checked}> {}</label>{described}",
                escape(&visible(title))
            );
        }
        (kind, None) => {
            let input = match (kind, schema.get("format").and_then(Value::as_str)) {
                ("integer" | "number", _) => "number\" step=\"any",
                (_, Some("email")) => "email",
                (_, Some("uri")) => "url",
                (_, Some("date")) => "date",
                _ => "text",
            };
            let value = current.first().map(|value| escape(value)).unwrap_or_default();
            let _ = write!(
                body,
                "<label for=\"{id}\">{}{marker}</label>{described}<input type=\"{input}\" id=\"{id}\" name=\"{field}\" value=\"{value}\">",
                escape(&visible(title))
            );
        }
    }
    body.push_str("</div>\n");
}

fn pretty(value: &Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_default()
}

/// Whether a posted form accepts (`approve`, `accept`) or declines, or why it says no decision.
pub fn accepts(form: &Entered) -> Result<bool, String> {
    let decision = form
        .iter()
        .find(|(key, _)| key == DECISION)
        .map(|(_, value)| value.as_str());
    match decision {
        Some("decline") => Ok(false),
        Some("approve" | "accept") => Ok(true),
        Some(other) => Err(format!("{other:?} is not a decision: approve, accept or decline")),
        None => Err("the form says no decision: approve, accept or decline".to_owned()),
    }
}

/// What a posted form that `accepts` (see [`accepts`]) or declines means for `view`: the Answer's JSON. A
/// property's value is typed by its schema (a number that does not parse is passed on as text, for the validator
/// to name).
pub fn answer(view: &RequestView, form: &Entered, accepts: bool) -> Value {
    if !accepts {
        return json!({"ok": false, "reason": "declined"});
    }
    let data = view.request.data.as_deref();
    let values = |field: String| {
        form.iter()
            .filter(move |(key, _)| *key == field)
            .map(|(_, value)| value)
    };
    if let Some(properties) = data
        .filter(|_| view.request.url.is_none() && view.request.kind != RequestKind::Approval)
        .and_then(|data| data.get("schema"))
        .and_then(|schema| schema.get("properties"))
        .and_then(Value::as_object)
    {
        let mut answered = Map::new();
        for (name, schema) in properties {
            let field = format!("{FIELD}{name}");
            let entered: Vec<&String> = values(field).collect();
            let kind = schema.get("type").and_then(Value::as_str).unwrap_or("string");
            let value = match kind {
                "array" => Some(Value::from(entered.into_iter().cloned().collect::<Vec<_>>())),
                "boolean" => Some(Value::Bool(entered.first().is_some_and(|value| *value == "true"))),
                _ => match entered.first().map(|value| value.trim()) {
                    None | Some("") => None,
                    Some(text) => Some(typed(kind, text)),
                },
            };
            if let Some(value) = value {
                answered.insert(name.clone(), value);
            }
        }
        return json!({"ok": true, "data": answered});
    }
    if let Some(questions) = data
        .filter(|_| view.request.kind == RequestKind::Question)
        .and_then(|data| data.get("questions"))
        .and_then(Value::as_array)
    {
        let answers: Vec<Value> = (0..questions.len())
            .map(|index| {
                let entered: Vec<String> = values(format!("{QUESTION}{index}")).cloned().collect();
                let multiple = questions[index].get("multiple").and_then(Value::as_bool) == Some(true);
                if multiple {
                    Value::from(entered)
                } else {
                    Value::String(entered.into_iter().next().unwrap_or_default())
                }
            })
            .collect();
        return json!({"ok": true, "data": {"answers": answers}});
    }
    json!({"ok": true})
}

/// `text` as a value of a property of type `kind`: a number parsed, else the text.
fn typed(kind: &str, text: &str) -> Value {
    let number = match kind {
        "integer" => text.parse::<i64>().ok().map(Value::from),
        "number" => text
            .parse::<f64>()
            .ok()
            .filter(|number| number.is_finite())
            .map(|number| {
                if number.fract() == 0.0 && number.abs() < 9.0e15 {
                    Value::from(number as i64)
                } else {
                    Value::from(number)
                }
            }),
        _ => None,
    };
    number.unwrap_or_else(|| Value::String(text.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_html_gives_meaning_to_is_escaped() {
        assert_eq!(
            escape(r#"<script>alert("x")</script> & 'y'"#),
            "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &#39;y&#39;"
        );
    }

    #[test]
    fn numbers_are_typed_by_their_schema_and_anything_else_passes_as_text() {
        assert_eq!(typed("integer", "42"), json!(42));
        assert_eq!(typed("integer", "4.5"), json!("4.5"));
        assert_eq!(typed("number", "4.5"), json!(4.5));
        assert_eq!(typed("number", "3"), json!(3));
        assert_eq!(typed("number", "NaN"), json!("NaN"));
        assert_eq!(typed("string", "42"), json!("42"));
    }
}
