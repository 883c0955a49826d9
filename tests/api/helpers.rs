//! `spawn_app`: a gateway on port 0 with a temp config, served in this process (its clock the test's to move),
//! or `spawn_process`: the gateway binary in a process of its own; and typed helpers to drive either.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderValue};
use serde_json::{Value, json};
use toolnexus_gateway::config::Config;
use toolnexus_gateway::time::Clock;
use toolnexus_gateway::{Gateway, Surroundings};

/// The gateway binary under test.
pub const BINARY: &str = env!("CARGO_BIN_EXE_toolnexus-gateway");

/// Two demo servers: `legacy` speaks 2025-11-25, `modern` 2026-07-28.
pub const BOTH_ERAS: &str = r#"
[[servers]]
name = "legacy"
builtin = "demo"
protocol = "2025-11-25"

[[servers]]
name = "modern"
builtin = "demo"
"#;

/// The protocol eras, by server name in `BOTH_ERAS`.
pub const ERAS: [&str; 2] = ["legacy", "modern"];

/// The response to an answer sent with [`TestApp::send_answer`]; `None` in its place when none came (the
/// connection failed).
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    /// Whether it says when to try again (`Retry-After`).
    pub retry_after: bool,
    /// Its JSON body; null when it had none or was cut off.
    pub body: Value,
}

/// Probes every 25 ms until `probe` gives a value, for what nothing signals (a counter updated after a
/// response, a process exiting, a back-off timed by the gateway); fails the test after 30 s naming `what`.
pub async fn poll_until<T, Fut>(what: &str, mut probe: impl FnMut() -> Fut) -> T
where
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// A running gateway: in this process, on a runtime of its own thread, unless it is a [`Process`]'s.
pub struct TestApp {
    pub address: String,
    pub client: reqwest::Client,
    /// `None` when the gateway runs in a process of its own.
    in_process: Option<InProcess>,
    /// The directory of its config and store, when the app owns it.
    _dir: Option<tempfile::TempDir>,
}

/// A gateway served in this process.
struct InProcess {
    clock: Clock,
    stop: tokio::sync::oneshot::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

/// The gateway binary in a process of its own, for what needs one: signals, its logs, its children, the CLI.
pub struct Process {
    app: TestApp,
    child: Child,
    stderr: Arc<Output>,
}

impl std::ops::Deref for Process {
    type Target = TestApp;

    fn deref(&self) -> &TestApp {
        &self.app
    }
}

/// Lines a child process wrote, with a signal for each new one.
#[derive(Default)]
pub struct Output {
    lines: Mutex<Vec<String>>,
    grew: Condvar,
}

impl Output {
    /// Collects the lines of a pipe on a thread of its own, bytes that are not UTF-8 replaced (a line of them
    /// does not end the collection); with `TEST_LOG` set they are echoed.
    pub fn collect(pipe: impl std::io::Read + Send + 'static, echo_prefix: &'static str) -> Arc<Self> {
        let output = Arc::new(Output::default());
        let sink = output.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).split(b'\n').map_while(Result::ok) {
                let line = String::from_utf8_lossy(&line).into_owned();
                if std::env::var_os("TEST_LOG").is_some() {
                    eprintln!("{echo_prefix}{line}");
                }
                sink.lines.lock().unwrap().push(line);
                sink.grew.notify_all();
            }
        });
        output
    }

    /// Waits until a line containing `needle` has been written, and returns it.
    pub fn wait_for(&self, needle: &str) -> String {
        self.wait_for_all(&[needle])
    }

    /// Waits until one line containing every needle has been written, and returns it.
    pub fn wait_for_all(&self, needles: &[&str]) -> String {
        let matches = |line: &String| needles.iter().all(|needle| line.contains(needle));
        let lines = self.lines.lock().unwrap();
        let (lines, timeout) = self
            .grew
            .wait_timeout_while(lines, Duration::from_secs(20), |lines| !lines.iter().any(matches))
            .unwrap();
        assert!(
            !timeout.timed_out(),
            "no line containing {needles:?} in:\n{}",
            lines.join("\n")
        );
        lines.iter().find(|l| matches(l)).unwrap().clone()
    }

    /// Every line so far.
    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }
}

/// Starts the gateway with `servers` (TOML) and `[requests]` settings, waits until it is ready.
pub async fn spawn_app(servers: &str) -> TestApp {
    spawn_app_with(servers, "").await
}

/// Like `spawn_app`, with extra `[requests]` keys (e.g. `ttl = "1s"`).
pub async fn spawn_app_with(servers: &str, requests: &str) -> TestApp {
    ready(start(servers, requests)).await
}

/// Starts the gateway without waiting for its upstreams.
pub fn start(servers: &str, requests: &str) -> TestApp {
    start_with("", servers, requests)
}

/// Like `start`, with extra top-level settings (e.g. `[limits]` keys).
pub fn start_with(settings: &str, servers: &str, requests: &str) -> TestApp {
    let dir = tempfile::tempdir().unwrap();
    let mut app = start_in(dir.path(), settings, servers, requests);
    app._dir = Some(dir);
    app
}

/// Starts the gateway with its config and its SQLite store in `dir`, which outlives it: a gateway started
/// there again finds what this one kept.
pub fn start_in(dir: &std::path::Path, settings: &str, servers: &str, requests: &str) -> TestApp {
    start_in_with(dir, settings, servers, requests, Clock::default())
}

/// Like `start_in`, waiting until every server is ready.
pub async fn spawn_in(dir: &std::path::Path, settings: &str, servers: &str, requests: &str) -> TestApp {
    ready(start_in(dir, settings, servers, requests)).await
}

/// Like `spawn_in`, reading `clock` (a gateway started again after another can go on from its clock).
pub async fn spawn_in_with(
    dir: &std::path::Path,
    settings: &str,
    servers: &str,
    requests: &str,
    clock: Clock,
) -> TestApp {
    ready(start_in_with(dir, settings, servers, requests, clock)).await
}

/// Serves the gateway of a temp config in `dir` on a runtime of its own thread, until the app is dropped or
/// shut down; its builtin demo servers are the binary's.
fn start_in_with(dir: &std::path::Path, settings: &str, servers: &str, requests: &str, clock: Clock) -> TestApp {
    log_if_asked();
    let path = dir.join("gateway.toml");
    std::fs::write(&path, config_text(dir, settings, servers, requests)).unwrap();
    let config = Config::load(&path).unwrap_or_else(|error| panic!("the test's config: {error}"));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    let surroundings = Surroundings {
        clock: clock.clone(),
        demo_program: Some(BINARY.into()),
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (built, build) = std::sync::mpsc::channel();
    let thread = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            let gateway = match Gateway::within(&config, listener, surroundings).await {
                Ok(gateway) => gateway,
                Err(error) => return built.send(Err(format!("{error:#}"))).unwrap(),
            };
            built.send(Ok(())).unwrap();
            let served = gateway.serve(async {
                let _ = stopped.await;
            });
            served.await.unwrap();
        });
    });
    if let Err(error) = build.recv().unwrap() {
        panic!("the gateway did not start: {error}");
    }
    TestApp {
        address,
        client: reqwest::Client::new(),
        in_process: Some(InProcess { clock, stop, thread }),
        _dir: None,
    }
}

/// Echoes the logs of gateways served in this process when `TEST_LOG` is set.
fn log_if_asked() {
    if std::env::var_os("TEST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter("info,rmcp=warn")
            .with_writer(std::io::stderr)
            .try_init();
    }
}

/// `app` once every server is ready.
async fn ready<App: AsRef<TestApp>>(app: App) -> App {
    let response = app.as_ref().get("/readyz?wait=30").await;
    assert_eq!(response.status(), 200, "not ready: {}", response.text().await.unwrap());
    app
}

impl AsRef<TestApp> for TestApp {
    fn as_ref(&self) -> &TestApp {
        self
    }
}

impl AsRef<TestApp> for Process {
    fn as_ref(&self) -> &TestApp {
        &self.app
    }
}

/// Starts the gateway binary in a process of its own, waiting until every server is ready.
pub async fn spawn_process(settings: &str, servers: &str, requests: &str) -> Process {
    ready(start_process(settings, servers, requests)).await
}

/// Starts the gateway binary in a process of its own, without waiting for its upstreams.
pub fn start_process(settings: &str, servers: &str, requests: &str) -> Process {
    launch(Command::new(BINARY), settings, servers, requests)
}

/// Like `start_process`, in a process whose open-file limit (soft and hard) is `files`.
pub fn start_under_file_limit(files: u32, settings: &str, servers: &str) -> Process {
    let mut command = Command::new("sh");
    command
        .arg("-c")
        .arg(format!(
            "ulimit -Sn {files} && ulimit -Hn {files} && exec \"$0\" \"$@\""
        ))
        .arg(BINARY);
    launch(command, settings, servers, "")
}

/// Like `spawn_process_in`, in a process whose umask is `umask` (octal, as `sh` takes it).
pub async fn spawn_process_under_umask(umask: &str, dir: &std::path::Path, settings: &str, servers: &str) -> Process {
    ready(launch_in(under_umask(umask), dir, settings, servers, "")).await
}

/// A command that runs the gateway binary, with the arguments given to it, under `umask`.
pub fn under_umask(umask: &str) -> Command {
    let mut command = Command::new("sh");
    command
        .arg("-c")
        .arg(format!("umask {umask} && exec \"$0\" \"$@\""))
        .arg(BINARY);
    command
}

/// Runs `command` (the gateway, or what execs it) with `--config` and a temp config, until it listens.
fn launch(command: Command, settings: &str, servers: &str, requests: &str) -> Process {
    let dir = tempfile::tempdir().unwrap();
    let mut process = launch_in(command, dir.path(), settings, servers, requests);
    process.app._dir = Some(dir);
    process
}

/// Like `start_in`, in a process of its own.
pub fn start_process_in(dir: &std::path::Path, settings: &str, servers: &str, requests: &str) -> Process {
    launch_in(Command::new(BINARY), dir, settings, servers, requests)
}

/// Like `spawn_in`, in a process of its own.
pub async fn spawn_process_in(dir: &std::path::Path, settings: &str, servers: &str, requests: &str) -> Process {
    ready(start_process_in(dir, settings, servers, requests)).await
}

/// The settings of a gateway that stores in the database at `url`.
pub fn stored_in(url: &str) -> String {
    format!("[store]\nurl = \"{url}\"\n")
}

/// Starts `tool` on server `modern` as the token entry `name` ([`token_entry`]), expecting it to wait: its call's
/// id and the first Request it waits on.
pub async fn held_as(app: &TestApp, name: &str, tool: &str, arguments: Value) -> (String, String) {
    let (status, call) = Caller::new(app, name)
        .post(
            "/calls?wait=20",
            json!({"server": "modern", "tool": tool, "arguments": arguments}),
        )
        .await;
    assert_eq!(
        (status, call["status"].as_str()),
        (201, Some("input_required")),
        "{call}"
    );
    (
        call["id"].as_str().unwrap().to_owned(),
        call["requests"][0].as_str().unwrap().to_owned(),
    )
}

/// Posts `form` to an answer link's page at `url`, as a browser does: the status and the page.
pub async fn submit(url: &str, form: &[(&str, &str)]) -> (u16, String) {
    let response = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(serde_urlencoded::to_string(form).unwrap())
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

/// An `[[auth.tokens]]` entry for `name` in `role`, whose token is `{name}-token`, given as its SHA-256.
pub fn token_entry(name: &str, role: &str) -> String {
    let digest = toolnexus_gateway::auth::digest_hex(&format!("{name}-token"));
    format!("[[auth.tokens]]\nname = \"{name}\"\nrole = \"{role}\"\nsha256 = \"{digest}\"\n")
}

/// The config of a test gateway: port 0, the settings, Requests and servers given, and a SQLite store in
/// `dir` unless the settings name one.
pub fn config_text(dir: &std::path::Path, settings: &str, servers: &str, requests: &str) -> String {
    let store = if settings.contains("[store]") {
        String::new()
    } else {
        format!("[store]\nurl = \"sqlite:{}\"\n", dir.join("gateway.sqlite3").display())
    };
    format!("listen = \"127.0.0.1:0\"\n{settings}\n[requests]\n{requests}\n{servers}\n{store}")
}

fn launch_in(mut command: Command, dir: &std::path::Path, settings: &str, servers: &str, requests: &str) -> Process {
    let config = dir.join("gateway.toml");
    std::fs::write(&config, config_text(dir, settings, servers, requests)).unwrap();
    let mut child = command
        .arg("--config")
        .arg(&config)
        .env("RUST_LOG", "info,rmcp=warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = Output::collect(child.stderr.take().unwrap(), "[gateway] ");
    let stdout = Output::collect(child.stdout.take().unwrap(), "[gateway stdout] ");
    let line = stdout.wait_for("listening on ");
    let address = line.trim_start_matches("listening on ").trim().to_owned();
    Process {
        app: TestApp {
            address,
            client: reqwest::Client::new(),
            in_process: None,
            _dir: None,
        },
        child,
        stderr,
    }
}

impl Process {
    /// The gateway's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The gateway's stderr: its logs, which carry what its stdio servers write to theirs.
    pub fn stderr(&self) -> &Output {
        &self.stderr
    }

    /// Sends SIGTERM and waits for the process to exit, returning its exit code.
    pub fn terminate(&mut self) -> Option<i32> {
        signal(self.child.id(), "TERM");
        self.exit_code()
    }

    /// Waits for a process that is ending on its own to exit, returning its exit code.
    pub fn exit_code(&mut self) -> Option<i32> {
        self.child.wait().unwrap().code()
    }

    /// Kills the process with SIGKILL, as a crash or an OOM kill would, and waits until it is gone.
    pub fn kill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            signal(self.child.id(), "TERM");
            let _ = self.child.wait();
        }
    }
}

impl TestApp {
    /// The clock of a gateway served in this process.
    pub fn clock(&self) -> &Clock {
        let in_process = self.in_process.as_ref();
        &in_process
            .expect("the clock of a gateway in a process of its own cannot be moved")
            .clock
    }

    /// Moves the gateway's clock on by `by`, as if that much time had passed: its Requests expire and its
    /// records age; timeouts of connections and calls run on as they do.
    pub fn advance(&self, by: Duration) {
        self.clock().advance(by);
    }

    /// Shuts the gateway down as SIGTERM would, and waits until it has stopped.
    pub fn shut_down(&mut self) {
        if let Some(in_process) = self.in_process.take() {
            let _ = in_process.stop.send(());
            in_process.thread.join().expect("the gateway's thread panicked");
        }
    }

    /// `GET path`.
    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.client.get(format!("{}{path}", self.address)).send().await.unwrap()
    }

    /// `GET path`, expecting `200`, as JSON.
    pub async fn get_json(&self, path: &str) -> Value {
        let response = self.get(path).await;
        assert_eq!(response.status(), 200, "GET {path}");
        response.json().await.unwrap()
    }

    /// `POST path` with a JSON body.
    pub async fn post(&self, path: &str, body: &Value) -> reqwest::Response {
        self.client
            .post(format!("{}{path}", self.address))
            .json(body)
            .send()
            .await
            .unwrap()
    }

    /// `DELETE path`.
    pub async fn delete(&self, path: &str) -> reqwest::Response {
        self.client
            .delete(format!("{}{path}", self.address))
            .send()
            .await
            .unwrap()
    }

    /// Starts a call on a server's shared session and waits until it stops running.
    pub async fn call(&self, server: &str, tool: &str, arguments: Value) -> Value {
        self.call_on(json!({"server": server, "tool": tool, "arguments": arguments}))
            .await
    }

    /// `POST /calls?wait=20` with a body, expecting `201`.
    pub async fn call_on(&self, body: Value) -> Value {
        let response = self.post("/calls?wait=20", &body).await;
        assert_eq!(response.status(), 201, "POST /calls {body}");
        response.json().await.unwrap()
    }

    /// `GET /calls/{id}?wait=20`: the call once it stops running.
    pub async fn settled(&self, call: &str) -> Value {
        self.get_json(&format!("/calls/{call}?wait=20")).await
    }

    /// The one pending Request of a call that waits on input.
    pub async fn request_of(&self, call: &Value) -> Value {
        assert_eq!(call["status"], "input_required", "{call}");
        let requests = self
            .get_json(&format!("/requests?call={}", call["id"].as_str().unwrap()))
            .await;
        assert_eq!(requests.as_array().unwrap().len(), 1, "{requests}");
        requests[0].clone()
    }

    /// `POST /requests/{id}/answer`.
    pub async fn answer(&self, request: &str, answer: Value) -> reqwest::Response {
        self.post(&format!("/requests/{request}/answer"), &answer).await
    }

    /// Answers and expects `200`.
    pub async fn answer_ok(&self, request: &str, answer: Value) -> Value {
        let response = self.answer(request, answer.clone()).await;
        let status = response.status();
        let body: Value = response.json().await.unwrap();
        assert_eq!(status, 200, "answer {answer} to {request}: {body}");
        body
    }

    /// Posts an answer on a task of its own, so that it can be in flight while the test does something else.
    pub fn send_answer(&self, request: &str, answer: Value) -> tokio::task::JoinHandle<Option<Reply>> {
        let post = self
            .client
            .post(format!("{}/requests/{request}/answer", self.address))
            .json(&answer);
        tokio::spawn(async move {
            let response = post.send().await.ok()?;
            let status = response.status().as_u16();
            let retry_after = response.headers().contains_key("retry-after");
            let body = response.json().await.unwrap_or(Value::Null);
            Some(Reply {
                status,
                retry_after,
                body,
            })
        })
    }

    /// Polls `GET /metrics` until it has the line `line` (counters updated after a response, and
    /// disconnects noticed in the background, have no other signal).
    pub async fn metric_reaches(&self, line: &str) {
        self.metric_line(&format!("/metrics showing {line:?}"), |l| l == line)
            .await;
    }

    /// Polls `GET /metrics` until one of its lines satisfies `wanted`, and returns it.
    pub async fn metric_line(&self, what: &str, wanted: impl Fn(&str) -> bool) -> String {
        poll_until(what, || async {
            let text = self.get("/metrics").await.text().await.unwrap();
            text.lines().find(|line| wanted(line)).map(str::to_owned)
        })
        .await
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        self.shut_down();
    }
}

/// Sends a signal by name to a process.
pub fn signal(pid: u32, name: &str) {
    let status = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()
        .unwrap();
    assert!(status.success(), "kill -{name} {pid}");
}

/// The ids of the live (non-zombie) children of a process.
pub fn children(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|child| {
            std::fs::read_to_string(format!("/proc/{child}/stat")).is_ok_and(|stat| {
                let fields: Vec<&str> = stat
                    .rsplit_once(')')
                    .map(|(_, rest)| rest)
                    .unwrap_or("")
                    .split_whitespace()
                    .collect();
                fields.first() != Some(&"Z") && fields.get(1) == Some(&pid.to_string().as_str())
            })
        })
        .collect()
}

/// Whether a process exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
    })
}

/// The id of the first Request a call raised, read from the call itself (for Requests that may end quickly,
/// even before the call's response was written).
pub fn first_request(call: &Value) -> String {
    let first = call["requests"][0].as_str();
    first
        .unwrap_or_else(|| panic!("the call raised no Request: {call}"))
        .to_owned()
}

/// An answer that confirms, with `note` to tell it from others.
pub fn confirming(note: &str) -> Value {
    json!({"ok": true, "data": {"confirm": true, "note": note}})
}

/// The `structuredContent.results` of a completed call.
pub fn results(call: &Value) -> Value {
    assert_eq!(call["status"], "completed", "{call}");
    call["result"]["structuredContent"]["results"].clone()
}

/// One Server-Sent Event.
#[derive(Debug, Clone)]
pub struct SseEvent {
    pub id: String,
    pub event: String,
    pub data: Value,
}

/// The event one block of a stream holds (its lines up to a blank one); `None` for keep-alive comments. Data
/// that is not JSON is null.
pub fn parse_event(block: &str) -> Option<SseEvent> {
    let (mut id, mut event, mut data) = (String::new(), String::new(), String::new());
    for line in block.lines() {
        if let Some(value) = line.strip_prefix("id:") {
            id = value.trim().to_owned();
        } else if let Some(value) = line.strip_prefix("event:") {
            event = value.trim().to_owned();
        } else if let Some(value) = line.strip_prefix("data:") {
            data.push_str(value.trim_start());
        }
    }
    let data = serde_json::from_str(&data).unwrap_or(Value::Null);
    (!event.is_empty()).then_some(SseEvent { id, event, data })
}

/// A `GET /events` stream read as a client would.
pub struct EventStream {
    response: reqwest::Response,
    buffer: String,
}

impl EventStream {
    /// Reads events from an already opened `GET /events` response.
    pub fn new(response: reqwest::Response) -> Self {
        Self {
            response,
            buffer: String::new(),
        }
    }

    /// The next event (keep-alive comments skipped); fails the test after 20 s.
    pub async fn next(&mut self) -> SseEvent {
        tokio::time::timeout(Duration::from_secs(20), self.read())
            .await
            .expect("no event within 20 s")
    }

    /// The next event of the given type, skipping others.
    pub async fn next_of(&mut self, event: &str) -> SseEvent {
        loop {
            let next = self.next().await;
            if next.event == event {
                return next;
            }
        }
    }

    /// Whether the stream ends (after any events still buffered) within 20 s.
    pub async fn ended(&mut self) -> bool {
        let drained = async { while let Ok(Some(_)) = self.response.chunk().await {} };
        tokio::time::timeout(Duration::from_secs(20), drained).await.is_ok()
    }

    async fn read(&mut self) -> SseEvent {
        // Where to look for the end of an event: what was searched already is not searched again.
        let mut from = 0;
        loop {
            if let Some(end) = self.buffer[from..].find("\n\n").map(|at| from + at) {
                from = 0;
                let block: String = self.buffer.drain(..end + 2).collect();
                if let Some(event) = parse_event(&block) {
                    return event;
                }
                continue;
            }
            from = self.buffer.len().saturating_sub(1);
            let chunk = self.response.chunk().await.unwrap().expect("the event stream ended");
            self.buffer.push_str(std::str::from_utf8(&chunk).unwrap());
        }
    }
}

impl TestApp {
    /// Opens `GET /events{query}`, optionally resuming after an event id.
    pub async fn events(&self, query: &str, last_event_id: Option<&str>) -> EventStream {
        let mut request = self.client.get(format!("{}/events{query}", self.address));
        if let Some(id) = last_event_id {
            request = request.header("Last-Event-ID", id);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["content-type"], "text/event-stream");
        EventStream {
            response,
            buffer: String::new(),
        }
    }
}

/// A client that sends one principal's token.
pub struct Caller {
    pub client: reqwest::Client,
    pub address: String,
}

impl Caller {
    /// The caller of the token entry `name` ([`token_entry`]).
    pub fn new(app: &TestApp, name: &str) -> Self {
        Self::bearing(app, &format!("{name}-token"))
    }

    /// The caller that sends `token`.
    pub fn bearing(app: &TestApp, token: &str) -> Self {
        let mut headers = HeaderMap::new();
        headers.insert(
            AUTHORIZATION,
            HeaderValue::from_str(&format!("Bearer {token}")).unwrap(),
        );
        let client = reqwest::Client::builder().default_headers(headers).build().unwrap();
        Self {
            client,
            address: app.address.clone(),
        }
    }

    pub async fn send(&self, request: reqwest::RequestBuilder) -> (u16, Value) {
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        self.send(self.client.get(format!("{}{path}", self.address))).await
    }

    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.send(self.client.post(format!("{}{path}", self.address)).json(&body))
            .await
    }

    pub async fn delete(&self, path: &str) -> (u16, Value) {
        self.send(self.client.delete(format!("{}{path}", self.address))).await
    }

    pub async fn call(&self, server: &str, tool: &str) -> Value {
        let (status, call) = self
            .post(
                "/calls?wait=20",
                json!({"server": server, "tool": tool, "arguments": {"action": "x"}}),
            )
            .await;
        assert_eq!(status, 201, "{call}");
        call
    }
}

/// The demo server over HTTP in a process of its own (which outlives any gateway), killed when dropped (a test
/// that fails included).
pub struct HttpDemo(Child);

impl HttpDemo {
    /// Another server process, killed when dropped as the demo is.
    pub fn of(child: Child) -> Self {
        Self(child)
    }

    /// Waits until it has exited by itself.
    pub fn exited(&mut self) {
        let _ = self.0.wait();
    }
}

impl Drop for HttpDemo {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The demo server over HTTP, and its `/mcp` URL.
pub fn http_demo() -> (HttpDemo, String) {
    http_demo_on("127.0.0.1:0")
}

/// The demo server over HTTP on `listen` (`127.0.0.1:PORT`), and its `/mcp` URL.
pub fn http_demo_on(listen: &str) -> (HttpDemo, String) {
    let mut demo = Command::new(BINARY)
        .args(["demo-server", "--http", listen])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let _ = Output::collect(demo.stderr.take().unwrap(), "[demo http] ");
    let stdout = Output::collect(demo.stdout.take().unwrap(), "[demo http stdout] ");
    let url = stdout
        .wait_for("listening on ")
        .trim_start_matches("listening on ")
        .trim()
        .to_owned();
    (HttpDemo(demo), url)
}
