//! The clients' HTTP: every exchange is recorded in the history, whatever came back (or did not).

use std::sync::Arc;
use std::time::Duration;

use reqwest::Method;
use serde_json::Value;

use crate::history::{History, Op};

/// How long past its `wait` an exchange may take before it counts as timed out.
const SLACK: Duration = Duration::from_secs(10);

/// What one exchange returned.
#[derive(Debug, Clone)]
pub struct Reply {
    /// `None` when no response came.
    pub status: Option<u16>,
    pub body: Value,
    /// The `Mcp-Session-Id` it carried, if any.
    pub session: Option<String>,
}

impl Reply {
    /// Whether the status is `code`.
    pub fn is(&self, code: u16) -> bool {
        self.status == Some(code)
    }
}

/// A recording HTTP client for one named client of the workload.
#[derive(Clone)]
pub struct Api {
    pub name: String,
    pub base: String,
    client: reqwest::Client,
    history: Arc<History>,
}

impl Api {
    /// Client `name` talking to the gateway at `base`.
    pub fn new(name: String, base: String, client: reqwest::Client, history: Arc<History>) -> Self {
        Self {
            name,
            base,
            client,
            history,
        }
    }

    /// `GET path`, allowed `wait` seconds of holding.
    pub async fn get(&self, path: &str, wait: u64) -> Reply {
        self.send(Method::GET, path, Value::Null, &[], wait).await
    }

    /// `POST path` with a JSON body.
    pub async fn post(&self, path: &str, body: Value, wait: u64) -> Reply {
        self.send(Method::POST, path, body, &[], wait).await
    }

    /// `DELETE path`.
    pub async fn delete(&self, path: &str) -> Reply {
        self.send(Method::DELETE, path, Value::Null, &[], 0).await
    }

    /// Sends one request and records it.
    pub async fn send(&self, method: Method, path: &str, body: Value, headers: &[(&str, &str)], wait: u64) -> Reply {
        let start = self.history.now();
        let mut request = self
            .client
            .request(method.clone(), format!("{}{path}", self.base))
            .timeout(Duration::from_secs(wait) + SLACK);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        if !body.is_null() {
            request = request.json(&body);
        }
        let mut op = Op {
            op: 0,
            client: self.name.clone(),
            method: method.to_string(),
            path: path.to_owned(),
            request: body,
            start,
            end: start,
            status: None,
            error: None,
            retry_after: false,
            content_type: String::new(),
            response: Value::Null,
        };
        let mut session = None;
        match request.send().await {
            Ok(response) => {
                op.status = Some(response.status().as_u16());
                session = response
                    .headers()
                    .get("mcp-session-id")
                    .and_then(|value| value.to_str().ok())
                    .map(str::to_owned);
                op.retry_after = response.headers().contains_key("retry-after");
                op.content_type = response
                    .headers()
                    .get("content-type")
                    .and_then(|value| value.to_str().ok())
                    .unwrap_or_default()
                    .to_owned();
                match response.text().await {
                    Ok(text) => op.response = parse_body(&op.content_type, &text),
                    Err(error) => op.error = Some(format!("the body was cut off: {error}")),
                }
            }
            Err(error) => op.error = Some(describe(&error)),
        }
        op.end = self.history.now();
        let reply = Reply {
            status: op.status,
            body: op.response.clone(),
            session,
        };
        self.history.op(op);
        reply
    }
}

/// A body as JSON: the JSON itself, the last `data:` of an event stream (an MCP response), else the text.
fn parse_body(content_type: &str, text: &str) -> Value {
    if content_type.starts_with("text/event-stream") {
        let last = text
            .lines()
            .rev()
            .filter_map(|line| line.strip_prefix("data:"))
            .find_map(|data| serde_json::from_str::<Value>(data.trim()).ok());
        return last.unwrap_or_else(|| Value::from(text));
    }
    serde_json::from_str(text).unwrap_or_else(|_| Value::from(text))
}

/// Why no response came, in a few words.
fn describe(error: &reqwest::Error) -> String {
    if error.is_timeout() {
        "timed out".to_owned()
    } else if error.is_connect() {
        "could not connect".to_owned()
    } else {
        format!("no response: {error}")
    }
}
