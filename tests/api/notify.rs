//! Notification channels: a new Request is told to a real mail server (aiosmtpd) and to local Slack and Teams
//! receivers, whose messages are checked against Slack's published Block Kit types and the published Adaptive
//! Card schema; the links they carry answer the Request; its end is told again; a message held up by a mail
//! server that is down outlives a `kill -9` and arrives once.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::helpers::{BOTH_ERAS, Caller, held_as, poll_until, spawn_app, spawn_process_in, submit, token_entry};

/// `modern` `echo` needs an approval; an agent and an approver.
fn gated(channels: &str) -> String {
    format!(
        "{BOTH_ERAS}{}{}[[approvals]]\nserver = \"modern\"\ntools = [\"echo\"]\n{channels}",
        token_entry("agent", "agent"),
        token_entry("lead", "approver"),
    )
}

/// The cache the test entry point installs the checkers into (scripts/notify-checkers.sh).
fn cache() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME is set")).join(".cache"))
        .join("toolnexus-gateway")
}

const INSTALL: &str = "run scripts/notify-checkers.sh (scripts/test.sh does) to install what the notification tests \
                       check messages with";

/// A real SMTP server on loopback that keeps each message it receives in a maildir; killed when dropped.
struct MailServer {
    child: Child,
    port: u16,
    maildir: tempfile::TempDir,
}

impl MailServer {
    /// Starts aiosmtpd on `port` (a free one when `None`), and waits until it takes connections.
    async fn start(port: Option<u16>) -> Self {
        let port = port.unwrap_or_else(|| {
            std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port()
        });
        let maildir = tempfile::tempdir().unwrap();
        let venv = std::env::var_os("AIOSMTPD_VENV").map_or_else(|| cache().join("aiosmtpd"), PathBuf::from);
        let child = Command::new(venv.join("bin/python"))
            .args([
                "-m",
                "aiosmtpd",
                "-n",
                "-l",
                &format!("127.0.0.1:{port}"),
                "-c",
                "aiosmtpd.handlers.Mailbox",
            ])
            .arg(maildir.path().join("mail"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|error| panic!("{INSTALL}: {error}"));
        poll_until("the mail server to listen", || async move {
            tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok().map(drop)
        })
        .await;
        Self { child, port, maildir }
    }

    /// The messages received so far, each as its text (quoted-printable undone).
    fn messages(&self) -> Vec<String> {
        let dir = self.maildir.path().join("mail/new");
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return Vec::new();
        };
        let mut files: Vec<PathBuf> = entries.map(|entry| entry.unwrap().path()).collect();
        files.sort();
        files
            .iter()
            .map(|file| unquote(&std::fs::read_to_string(file).unwrap()))
            .collect()
    }

    /// Waits until `count` messages have arrived, and returns them.
    async fn received(&self, count: usize) -> Vec<String> {
        poll_until(&format!("{count} messages"), || async {
            let messages = self.messages();
            (messages.len() >= count).then_some(messages)
        })
        .await
    }
}

impl Drop for MailServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `text` with quoted-printable's soft line breaks and `=XX` escapes undone.
fn unquote(text: &str) -> String {
    let joined = text.replace("=\r\n", "").replace("=\n", "");
    let bytes = joined.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        let hex = (bytes[at] == b'=' && at + 2 < bytes.len())
            .then(|| std::str::from_utf8(&bytes[at + 1..at + 3]).ok())
            .flatten()
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match hex {
            Some(byte) => {
                out.push(byte);
                at += 3;
            }
            None => {
                out.push(bytes[at]);
                at += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The first answer link in `text`.
fn link_in(text: &str) -> String {
    let start = text.find("http://").expect("a link in the message");
    let rest = &text[start..];
    let end = rest.find(|c: char| c.is_whitespace() || c == '"').unwrap_or(rest.len());
    let link = rest[..end].to_owned();
    assert!(link.contains("/r/"), "{link}");
    link
}

fn mail_channel(port: u16, to: &[&str]) -> String {
    let to: Vec<String> = to.iter().map(|to| format!("\"{to}\"")).collect();
    format!(
        "[[notify]]\nname = \"sre-mail\"\nrequests = {{ kinds = [\"approval\"] }}\nattempts = 8\n\
         email = {{ to = [{}], from = \"gateway@example.com\", smtp = \"smtp://127.0.0.1:{port}\", starttls = false }}\n",
        to.join(", ")
    )
}

#[tokio::test]
async fn each_recipient_is_mailed_a_link_that_answers_as_them_and_then_who_answered() {
    let mail = MailServer::start(None).await;
    let app = spawn_app(&gated(&mail_channel(
        mail.port,
        &["alice@example.com", "bob@example.com"],
    )))
    .await;
    let (call, approval) = held_as(&app, "agent", "echo", json!({"text": "mailed"})).await;
    let asked = mail.received(2).await;
    let to_alice = asked
        .iter()
        .find(|message| message.contains("To: alice@example.com"))
        .unwrap();
    let to_bob = asked
        .iter()
        .find(|message| message.contains("To: bob@example.com"))
        .unwrap();
    for message in [to_alice, to_bob] {
        assert!(
            message.contains("Subject: Approval needed: Allow echo on modern?"),
            "{message}"
        );
        assert!(
            message.contains("Tool: echo") && message.contains("\"text\":\"mailed\""),
            "{message}"
        );
        assert!(message.contains("Asked by: agent"), "{message}");
    }
    assert_ne!(link_in(to_alice), link_in(to_bob), "each recipient's link is their own");

    // Opened, nothing is answered; posted, Bob's link answers as Bob.
    assert_eq!(reqwest::get(link_in(to_bob)).await.unwrap().status(), 200);
    let (status, page) = submit(&link_in(to_bob), &[("decision", "approve")]).await;
    assert_eq!(status, 200, "{page}");
    let answered = Caller::new(&app, "lead").get(&format!("/requests/{approval}")).await.1;
    assert_eq!(answered["answeredBy"], "bob@example.com");
    assert_eq!(answered["answerer"]["via"], "link");
    let done = Caller::new(&app, "agent")
        .get(&format!("/calls/{call}?wait=20"))
        .await
        .1;
    assert_eq!(done["status"], "completed", "{done}");
    // Alice's link answers nothing more.
    assert_eq!(submit(&link_in(to_alice), &[("decision", "approve")]).await.0, 410);

    // Each is told who answered.
    let all = mail.received(4).await;
    let told: Vec<&String> = all
        .iter()
        .filter(|message| message.contains("Subject: Answered:"))
        .collect();
    assert_eq!(told.len(), 2, "{all:?}");
    assert!(
        told.iter()
            .all(|message| message.contains("Answered by bob@example.com")),
        "{told:?}"
    );
}

#[tokio::test]
async fn a_message_held_up_by_a_mail_server_that_is_down_outlives_a_kill_and_arrives_once() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let servers = gated(&mail_channel(port, &["sre@example.com"]));
    let settings = "[auth]\npublic_metrics = true\n";
    let mut gateway = spawn_process_in(dir.path(), settings, &servers, "").await;
    let (_, approval) = held_as(&gateway, "agent", "echo", json!({"text": "queued"})).await;
    // Nothing listens yet: the gateway tries, and is killed while the message waits.
    gateway
        .metric_reaches("toolnexus_notification_deliveries_total{channel=\"sre-mail\",outcome=\"failed\"} 1")
        .await;
    gateway.kill();
    let mail = MailServer::start(Some(port)).await;
    let restarted = spawn_process_in(dir.path(), settings, &servers, "").await;
    let messages = mail.received(1).await;
    assert!(messages[0].contains(&approval), "{messages:?}");
    // Once: the restarted gateway's deliveries are done when its metric says so, and no second one came.
    restarted
        .metric_reaches("toolnexus_notification_deliveries_total{channel=\"sre-mail\",outcome=\"delivered\"} 1")
        .await;
    assert_eq!(mail.messages().len(), 1, "{:?}", mail.messages());
}

/// A local Slack and Teams: each receives POSTs at its path and passes on their bodies.
pub async fn chat_receiver() -> (String, mpsc::UnboundedReceiver<(String, Value)>) {
    let (record, messages) = mpsc::unbounded_channel();
    let app = axum::Router::new().route(
        "/{service}",
        axum::routing::post(
            move |axum::extract::Path(service): axum::extract::Path<String>, body: axum::body::Bytes| {
                let record = record.clone();
                async move {
                    let _ = record.send((service, serde_json::from_slice(&body).unwrap()));
                    axum::http::StatusCode::OK
                }
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, messages)
}

async fn next(messages: &mut mpsc::UnboundedReceiver<(String, Value)>) -> (String, Value) {
    tokio::time::timeout(Duration::from_secs(20), messages.recv())
        .await
        .expect("no message within 20 s")
        .unwrap()
}

/// What Slack's published Block Kit types say of `messages`: empty when each type-checks.
fn slack_type_errors(messages: &[Value]) -> String {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/notify");
    assert!(dir.join("node_modules/@slack/types").is_dir(), "{INSTALL}");
    let mut child = Command::new("node")
        .arg(dir.join("slack.mjs"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(Value::from(messages.to_vec()).to_string().as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    let errors = String::from_utf8(output.stdout).unwrap();
    assert_eq!(output.status.success(), errors.is_empty(), "{errors}");
    errors
}

/// The violations of the published Adaptive Card schema in `card`, as text: empty when it fits.
fn adaptive_card_violations(card: &Value) -> String {
    let path = std::env::var_os("ADAPTIVE_CARD_SCHEMA")
        .map_or_else(|| cache().join("adaptive-card-2.4.4.json"), PathBuf::from);
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{INSTALL}: {}: {error}", path.display())),
    )
    .unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();
    validator
        .iter_errors(card)
        .map(|error| format!("{} at {}\n", error, error.instance_path()))
        .collect()
}

/// The link of a Slack message's button.
fn button_link(message: &Value) -> String {
    message["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|block| block["type"] == "actions")
        .map(|block| block["elements"][0]["url"].as_str().unwrap().to_owned())
        .unwrap_or_else(|| panic!("no button in {message}"))
}

/// The next message to each of Slack and Teams, in that order.
async fn both(messages: &mut mpsc::UnboundedReceiver<(String, Value)>) -> (Value, Value) {
    let mut two = [next(messages).await, next(messages).await];
    two.sort_by(|a, b| a.0.cmp(&b.0));
    let [(_, slack), (_, teams)] = two;
    (slack, teams)
}

#[tokio::test]
async fn slack_and_teams_get_messages_their_schemas_take_with_links_that_answer_what_a_channel_may() {
    let (url, mut messages) = chat_receiver().await;
    let channels = format!(
        "[[notify]]\nname = \"sre-slack\"\nslack = {{ webhook = \"{url}/slack\" }}\n\
         [[notify]]\nname = \"sre-teams\"\nteams = {{ webhook = \"{url}/teams\" }}\nrequests = {{ servers = [\"modern\"] }}\n"
    );
    let app = spawn_app(&gated(&channels)).await;
    let (status, asking) = Caller::new(&app, "agent")
        .post(
            "/calls?wait=20",
            json!({"server": "modern", "tool": "confirm_action", "arguments": {"action": "<chat> & \"friends\""}}),
        )
        .await;
    assert_eq!(
        (status, asking["status"].as_str()),
        (201, Some("input_required")),
        "{asking}"
    );
    let (slack, teams) = both(&mut messages).await;
    assert_eq!(slack_type_errors(std::slice::from_ref(&slack)), "");
    let text = slack.to_string();
    assert!(
        text.contains("Input needed") && text.contains("&lt;chat&gt; &amp;"),
        "{text}"
    );
    let card = &teams["attachments"][0]["content"];
    assert_eq!(
        teams["attachments"][0]["contentType"],
        "application/vnd.microsoft.card.adaptive"
    );
    assert_eq!(adaptive_card_violations(card), "");
    // A broken card is caught: the check can fail.
    let mut broken = card.clone();
    broken["body"][0]["type"] = json!(17);
    assert_ne!(adaptive_card_violations(&broken), "");

    // The Teams card's link answers the form, as the channel.
    let teams_link = card["actions"][0]["url"].as_str().unwrap().to_owned();
    assert_ne!(button_link(&slack), teams_link);
    let (status, page) = submit(
        &teams_link,
        &[("decision", "accept"), ("f.confirm", "true"), ("f.note", "from teams")],
    )
    .await;
    assert_eq!(status, 200, "{page}");
    let request = asking["requests"][0].as_str().unwrap();
    let answered = Caller::new(&app, "lead").get(&format!("/requests/{request}")).await.1;
    assert_eq!(answered["answeredBy"], "sre-teams");
    assert_eq!(
        answered["answer"]["data"],
        json!({"confirm": true, "note": "from teams"})
    );
    let (slack, teams) = both(&mut messages).await;
    assert!(slack.to_string().contains("Answered by sre-teams"), "{slack}");
    assert_eq!(adaptive_card_violations(&teams["attachments"][0]["content"]), "");

    // An approval needs a person: a channel's link names nobody, and is refused.
    let (call, approval) = held_as(&app, "agent", "echo", json!({"text": "approve me"})).await;
    let (slack, _) = both(&mut messages).await;
    assert!(slack.to_string().contains("Approval needed"), "{slack}");
    let (status, page) = submit(&button_link(&slack), &[("decision", "approve")]).await;
    assert_eq!(status, 403, "{page}");
    assert!(page.contains("does not say who answers"), "{page}");
    let (status, _) = Caller::new(&app, "lead")
        .post(&format!("/requests/{approval}/answer"), json!({"ok": true}))
        .await;
    assert_eq!(status, 200);
    let done = Caller::new(&app, "agent")
        .get(&format!("/calls/{call}?wait=20"))
        .await
        .1;
    assert_eq!(done["status"], "completed", "{done}");
    let (slack, teams) = both(&mut messages).await;
    assert_eq!(slack_type_errors(std::slice::from_ref(&slack)), "");
    assert!(slack.to_string().contains("Answered by lead"), "{slack}");
    assert!(teams.to_string().contains("Answered by lead"), "{teams}");
}

#[tokio::test]
async fn an_approval_nobody_answered_in_time_is_escalated_on_the_gateways_clock_and_one_answered_is_not() {
    let (url, mut messages) = chat_receiver().await;
    let channels = format!(
        "[[notify]]\nname = \"sre-lead\"\nslack = {{ webhook = \"{url}/lead\" }}\n\
         [[approvals]]\nserver = \"modern\"\ntools = [\"confirm_*\"]\nttl = \"1h\"\n\
         escalate = [{{ after = \"15m\", notify = [\"sre-lead\"] }}]\n"
    );
    let app = spawn_app(&gated(&channels)).await;
    let start = |action: &str| json!({"server": "modern", "tool": "confirm_action", "arguments": {"action": action}});
    let (_, answered) = Caller::new(&app, "agent")
        .post("/calls?wait=20", start("answered"))
        .await;
    let (_, waiting) = Caller::new(&app, "agent")
        .post("/calls?wait=20", start("waiting"))
        .await;
    let answered = answered["requests"][0].as_str().unwrap().to_owned();
    let waiting = waiting["requests"][0].as_str().unwrap().to_owned();
    let (status, _) = Caller::new(&app, "lead")
        .post(&format!("/requests/{answered}/answer"), json!({"ok": true}))
        .await;
    assert_eq!(status, 200);
    // The channel an escalation names is told of nothing else.
    assert!(messages.try_recv().is_err());

    app.advance(Duration::from_secs(15 * 60 + 1));
    // The answered approval's turn comes first; only the waiting one is told.
    let (service, message) = next(&mut messages).await;
    assert_eq!(service, "lead");
    let text = message.to_string();
    assert!(
        text.contains("Still waiting after 15m") && text.contains(&waiting),
        "{text}"
    );
    assert!(!text.contains(&answered), "{text}");
    assert_eq!(slack_type_errors(std::slice::from_ref(&message)), "");
    // Its link shows the approval; being a channel's, it does not approve it.
    let link = button_link(&message);
    assert_eq!(reqwest::get(&link).await.unwrap().status(), 200);
    assert_eq!(submit(&link, &[("decision", "approve")]).await.0, 403);
    assert_eq!(
        Caller::new(&app, "lead").get(&format!("/requests/{waiting}")).await.1["status"],
        "pending"
    );
}
