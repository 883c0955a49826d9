//! The gateway path: a keep-alive HTTP client doing exactly what a REST client of the gateway does.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail, ensure};
use serde_json::{Value, json};

/// The answer every benchmark gives to a `confirm` form.
pub fn confirm_answer() -> Value {
    json!({"ok": true, "data": {"confirm": true}})
}

/// A REST client of one gateway; cheap to clone.
#[derive(Debug, Clone)]
pub struct Rest {
    base: String,
    client: reqwest::Client,
}

impl Rest {
    /// A client of the gateway at `base` (`http://host:port`), keeping connections alive.
    pub fn new(base: &str) -> Self {
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(usize::MAX)
            .tcp_nodelay(true)
            .build()
            .expect("a plain HTTP client builds");
        Self {
            base: base.to_owned(),
            client,
        }
    }

    /// The gateway's address, `http://host:port`.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// `GET path` → status and JSON body.
    pub async fn get(&self, path: &str) -> anyhow::Result<(u16, Value)> {
        let response = self.client.get(format!("{}{path}", self.base)).send().await?;
        let status = response.status().as_u16();
        Ok((status, response.json().await?))
    }

    /// `GET path`, expecting `200` → the body as text (`/metrics`).
    pub async fn text(&self, path: &str) -> anyhow::Result<String> {
        let response = self.client.get(format!("{}{path}", self.base)).send().await?;
        ensure!(response.status() == 200, "GET {path} → {}", response.status());
        Ok(response.text().await?)
    }

    /// `GET path` of a paged list, expecting `200` → the page and the path of the next one (its `Link` header).
    pub async fn page(&self, path: &str) -> anyhow::Result<(Value, Option<String>)> {
        let response = self.client.get(format!("{}{path}", self.base)).send().await?;
        ensure!(response.status() == 200, "GET {path} → {}", response.status());
        let next = response
            .headers()
            .get(reqwest::header::LINK)
            .and_then(|link| link.to_str().ok())
            .and_then(|link| link.strip_prefix('<')?.split_once(">; rel=\"next\""))
            .map(|(next, _)| next.to_owned());
        Ok((response.json().await?, next))
    }

    /// `POST path` with a JSON body → status and JSON body.
    pub async fn post(&self, path: &str, body: &Value) -> anyhow::Result<(u16, Value)> {
        let response = self
            .client
            .post(format!("{}{path}", self.base))
            .json(body)
            .send()
            .await?;
        let status = response.status().as_u16();
        Ok((status, response.json().await?))
    }

    /// `POST /calls?wait=30`, expecting `201`; returns the Call.
    pub async fn start_call(&self, server: &str, tool: &str, arguments: Value) -> anyhow::Result<Value> {
        let body = json!({"server": server, "tool": tool, "arguments": arguments});
        let (status, call) = self.post("/calls?wait=30", &body).await?;
        ensure!(status == 201, "POST /calls {body} → {status}: {call}");
        Ok(call)
    }

    /// `GET /calls/{id}?wait=30`, expecting `200`.
    pub async fn settled(&self, call: &str) -> anyhow::Result<Value> {
        let (status, call) = self.get(&format!("/calls/{call}?wait=30")).await?;
        ensure!(status == 200, "GET /calls → {status}: {call}");
        Ok(call)
    }

    /// `POST /requests/{id}/answer` with the confirm answer, expecting `200` and `answered`.
    pub async fn answer(&self, request: &str) -> anyhow::Result<()> {
        let (status, view) = self
            .post(&format!("/requests/{request}/answer"), &confirm_answer())
            .await?;
        ensure!(
            status == 200 && view["status"] == "answered",
            "answer {request} → {status}: {view}"
        );
        Ok(())
    }

    /// One elicitation round trip: `POST /calls?wait` → the Request id → answer → `GET /calls/{id}?wait` → completed.
    pub async fn confirm(&self, server: &str) -> anyhow::Result<()> {
        let call = self
            .start_call(server, "confirm_action", json!({"action": "bench"}))
            .await?;
        ensure!(call["status"] == "input_required", "not waiting on a Request: {call}");
        let request = call["requests"][0].as_str().context("no Request id")?;
        self.answer(request).await?;
        let done = self.settled(call["id"].as_str().context("no call id")?).await?;
        check_confirmed(done.pointer("/result/structuredContent"))
    }

    /// One elicitation round trip in two exchanges: `POST /calls?wait` → the Request id →
    /// `POST /requests/{id}/answer?wait`, whose `resumedCall` is completed.
    pub async fn confirm_in_two(&self, server: &str) -> anyhow::Result<()> {
        let call = self
            .start_call(server, "confirm_action", json!({"action": "bench"}))
            .await?;
        ensure!(call["status"] == "input_required", "not waiting on a Request: {call}");
        let request = call["requests"][0].as_str().context("no Request id")?;
        let (status, answered) = self
            .post(&format!("/requests/{request}/answer?wait=30"), &confirm_answer())
            .await?;
        ensure!(status == 200, "answer {request} → {status}: {answered}");
        check_confirmed(answered.pointer("/resumedCall/result/structuredContent"))
    }

    /// The discovery time of one elicitation: `confirm_action` with `stamp` started without waiting, then from the
    /// upstream's send time to the `request.created` event on `events`; then it is answered and settled.
    pub async fn discover(&self, server: &str, events: &mut EventStream) -> anyhow::Result<Duration> {
        let body = json!({"server": server, "tool": "confirm_action", "arguments": {"action": "bench", "stamp": true}});
        let (status, call) = self.post("/calls?wait=0", &body).await?;
        ensure!(status == 201, "POST /calls {body} → {status}: {call}");
        let call = call["id"].as_str().context("no call id")?;
        let (request, discovered) = loop {
            let event = events.next().await?;
            if event.event != "request.created" {
                continue;
            }
            let request: Value = serde_json::from_str(&event.data)?;
            if request["call"] == call {
                let prompt = request["prompt"].as_str().context("no prompt")?;
                break (
                    request["id"].as_str().context("no id")?.to_owned(),
                    since_stamp(prompt, event.arrived)?,
                );
            }
        };
        self.answer(&request).await?;
        let done = self.settled(call).await?;
        check_confirmed(done.pointer("/result/structuredContent"))?;
        Ok(discovered)
    }

    /// `GET /healthz`, expecting `200`: an exchange with the gateway that does no work.
    pub async fn healthz(&self) -> anyhow::Result<()> {
        let (status, body) = self.get("/healthz").await?;
        ensure!(status == 200, "GET /healthz → {status}: {body}");
        Ok(())
    }

    /// One plain tool call: `POST /calls?wait` on `echo` → completed.
    pub async fn echo(&self, server: &str) -> anyhow::Result<()> {
        let call = self.start_call(server, "echo", json!({"text": "bench"})).await?;
        ensure!(
            call["status"] == "completed" && call["result"]["content"][0]["text"] == "bench",
            "echo did not complete: {call}"
        );
        Ok(())
    }
}

/// Checks a `confirm_action` result: one accepted elicitation with the defaults filled in.
pub fn check_confirmed(structured: Option<&Value>) -> anyhow::Result<()> {
    let expected = json!({"results": [{"action": "accept", "content": {"confirm": true, "note": ""}}]});
    if structured != Some(&expected) {
        bail!("unexpected result {structured:?}");
    }
    Ok(())
}

/// A subscribed `GET /events` stream, read event by event.
pub struct EventStream {
    response: reqwest::Response,
    buffer: String,
    /// When the chunk holding the start of `buffer`'s first unread event arrived.
    arrived: SystemTime,
}

/// One Server-Sent Event and the wall-clock time its bytes reached the client.
pub struct SseEvent {
    pub event: String,
    pub data: String,
    pub arrived: SystemTime,
}

impl EventStream {
    /// Opens `GET /events{query}`, expecting `200`.
    pub async fn open(rest: &Rest, query: &str) -> anyhow::Result<Self> {
        let response = rest.client.get(format!("{}/events{query}", rest.base)).send().await?;
        ensure!(response.status() == 200, "GET /events → {}", response.status());
        Ok(Self {
            response,
            buffer: String::new(),
            arrived: SystemTime::now(),
        })
    }

    /// The next event (keep-alive comments skipped).
    pub async fn next(&mut self) -> anyhow::Result<SseEvent> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let (mut event, mut data) = (String::new(), String::new());
                for line in block.lines() {
                    if let Some(name) = line.strip_prefix("event:") {
                        event = name.trim_start().to_owned();
                    } else if let Some(text) = line.strip_prefix("data:") {
                        data.push_str(text.strip_prefix(' ').unwrap_or(text));
                    }
                }
                if !event.is_empty() {
                    return Ok(SseEvent {
                        event,
                        data,
                        arrived: self.arrived,
                    });
                }
                continue;
            }
            let chunk = self.response.chunk().await?.context("the event stream ended")?;
            if self.buffer.is_empty() {
                self.arrived = SystemTime::now();
            }
            self.buffer.push_str(std::str::from_utf8(&chunk)?);
        }
    }
}

/// How long ago a `confirm_action` with `stamp` sent its elicitation, from the ` @<ns>` ending of its prompt.
pub fn since_stamp(prompt: &str, at: SystemTime) -> anyhow::Result<Duration> {
    let nanos: u64 = prompt
        .rsplit_once(" @")
        .and_then(|(_, nanos)| nanos.parse().ok())
        .with_context(|| format!("no send time in {prompt:?}"))?;
    let sent = UNIX_EPOCH + Duration::from_nanos(nanos);
    Ok(at.duration_since(sent).unwrap_or_default())
}
