//! The history of a run: every operation with its start, its end and what it returned, every event each
//! consumer saw, every webhook delivery and every fault, kept in memory for the checker and appended to a
//! JSON Lines file as it happens (so that a run killed halfway leaves what it did).

use std::io::Write;
use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;

use serde::Serialize;
use serde_json::Value;

/// One HTTP exchange a client made.
#[derive(Debug, Clone, Serialize)]
pub struct Op {
    /// Its number in the run, which a violation names.
    pub op: u64,
    /// The client that made it (`checker` for the reads after healing).
    pub client: String,
    pub method: String,
    pub path: String,
    #[serde(skip_serializing_if = "Value::is_null")]
    pub request: Value,
    /// Milliseconds since the run began.
    pub start: u64,
    pub end: u64,
    /// `None` when no response came (the connection failed or timed out): see `error`.
    pub status: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(rename = "retryAfter")]
    pub retry_after: bool,
    #[serde(rename = "contentType")]
    pub content_type: String,
    /// The body: its JSON, else its text.
    pub response: Value,
}

/// One Server-Sent Event a consumer read.
#[derive(Debug, Clone, Serialize)]
pub struct Seen {
    pub consumer: usize,
    /// Which of the consumer's connections read it, from 0.
    pub connection: u64,
    /// The `Last-Event-ID` that connection resumed after, if any.
    pub resumed: Option<u64>,
    pub id: u64,
    pub event: String,
    /// `data.id`: the Request, call or session it is about.
    pub subject: Value,
    pub at: u64,
}

/// One delivery the webhook receiver got.
#[derive(Debug, Clone, Serialize)]
pub struct Delivery {
    /// The `webhook-id` header.
    #[serde(rename = "webhookId")]
    pub webhook_id: String,
    pub body: Value,
    /// Whether the receiver took it (`2xx`) or refused it to have it made again.
    pub accepted: bool,
    pub at: u64,
}

/// One fault a nemesis caused.
#[derive(Debug, Clone, Serialize)]
pub struct Fault {
    pub fault: String,
    pub start: u64,
    pub end: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// Everything recorded so far.
#[derive(Debug, Default)]
pub struct Record {
    pub ops: Vec<Op>,
    pub seen: Vec<Seen>,
    pub deliveries: Vec<Delivery>,
    pub faults: Vec<Fault>,
}

impl Record {
    /// The `webhook-id`s of the deliveries the receiver took.
    pub fn accepted(&self) -> std::collections::BTreeSet<&str> {
        self.deliveries
            .iter()
            .filter(|delivery| delivery.accepted)
            .map(|delivery| delivery.webhook_id.as_str())
            .collect()
    }
}

/// The history of one run.
pub struct History {
    began: Instant,
    record: Mutex<Record>,
    file: Mutex<std::io::BufWriter<std::fs::File>>,
}

impl History {
    /// A history written to `path`, its clock starting now.
    pub fn create(path: &Path) -> std::io::Result<Self> {
        Ok(Self {
            began: Instant::now(),
            record: Mutex::default(),
            file: Mutex::new(std::io::BufWriter::new(std::fs::File::create(path)?)),
        })
    }

    /// Milliseconds since the run began.
    pub fn now(&self) -> u64 {
        self.began.elapsed().as_millis() as u64
    }

    /// Records an operation, numbering it; returns its number.
    pub fn op(&self, mut op: Op) -> u64 {
        let mut record = self.record.lock().unwrap();
        op.op = record.ops.len() as u64;
        self.write("op", &op);
        record.ops.push(op);
        record.ops.len() as u64 - 1
    }

    /// Records an event a consumer read.
    pub fn seen(&self, seen: Seen) {
        self.write("event", &seen);
        self.record.lock().unwrap().seen.push(seen);
    }

    /// Records a webhook delivery.
    pub fn delivery(&self, delivery: Delivery) {
        self.write("delivery", &delivery);
        self.record.lock().unwrap().deliveries.push(delivery);
    }

    /// Records a fault once it has ended.
    pub fn fault(&self, fault: Fault) {
        self.write("fault", &fault);
        self.record.lock().unwrap().faults.push(fault);
    }

    /// Records a free-form line (the schedule, the verdict).
    pub fn note(&self, kind: &str, value: &Value) {
        self.write(kind, value);
    }

    /// Runs `read` over what was recorded.
    pub fn read<T>(&self, read: impl FnOnce(&Record) -> T) -> T {
        read(&self.record.lock().unwrap())
    }

    /// Writes what is buffered to the file.
    pub fn flush(&self) {
        let _ = self.file.lock().unwrap().flush();
    }

    fn write(&self, kind: &str, value: &impl Serialize) {
        let mut line = serde_json::to_value(value).unwrap_or(Value::Null);
        if let Value::Object(fields) = &mut line {
            fields.insert("kind".to_owned(), Value::from(kind));
        }
        let mut file = self.file.lock().unwrap();
        let _ = writeln!(file, "{line}");
    }
}
