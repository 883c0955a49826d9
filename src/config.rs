//! The gateway's configuration: one TOML file, or the built-in default (listen on 127.0.0.1:8080 with the demo server).

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use reqwest::Url;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::approvals::{self, ApprovalPolicy, Escalation, Glob};
use crate::auth::{self, Role, Token};
use crate::egress;
use crate::records::EventKind;
use crate::redact;
use crate::signature::{PREFIX, Secret};
use crate::store::{Location, PendingCaps};
use crate::suspension::Lasting;

/// Where the built-in default listens.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
/// The most threads `workers` may ask for.
pub const MAX_WORKERS: usize = 64;

/// How long a server's start-up and MCP handshake may take unless its `startup_timeout` says otherwise.
pub const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a configuration cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}")]
    Read { path: PathBuf, source: std::io::Error },
    /// The file is not valid TOML or has a key or value the gateway does not know.
    #[error("config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    /// The file parses but says something the gateway cannot do.
    #[error("config file {path}{}: {message}", line.map(|line| format!(", line {line}")).unwrap_or_default())]
    Invalid {
        path: PathBuf,
        line: Option<usize>,
        message: String,
    },
}

/// What makes a configuration unusable: a message that names the key, and the entry of an array of tables
/// (`[[servers]]` …) it is about, when it is about one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Problem {
    pub message: String,
    pub entry: Option<Entry>,
}

impl Problem {
    fn in_entry(table: &'static str, index: usize, message: String) -> Self {
        Self {
            message,
            entry: Some(Entry { table, index }),
        }
    }
}

impl From<String> for Problem {
    fn from(message: String) -> Self {
        Self { message, entry: None }
    }
}

/// One entry of an array of tables: `table` is its dotted key (`servers`, `auth.tokens`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub table: &'static str,
    pub index: usize,
}

impl Entry {
    /// The line of the config file `text` the entry starts on, as the TOML parser saw it.
    fn line_in(self, text: &str) -> Option<usize> {
        let document = toml::de::DeTable::parse(text).ok()?;
        let mut table = document.get_ref();
        let mut keys = self.table.split('.').peekable();
        while let Some(key) = keys.next() {
            let value = table.get(key)?.get_ref();
            match value {
                toml::de::DeValue::Table(inner) if keys.peek().is_some() => table = inner,
                toml::de::DeValue::Array(entries) if keys.peek().is_none() => {
                    let start = entries.get(self.index)?.span().start;
                    return Some(text[..start].matches('\n').count() + 1);
                }
                _ => return None,
            }
        }
        None
    }
}

/// The whole configuration, built once at start-up.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The address the REST API listens on.
    #[serde(default = "default_listen", deserialize_with = "socket_address")]
    pub listen: SocketAddr,
    /// The threads that run the gateway: 1 runs everything on one thread, which on a small machine shared
    /// with its upstreams uses the least CPU and memory; more spread the work over that many threads.
    #[serde(default = "default_workers", deserialize_with = "worker_count")]
    pub workers: usize,
    /// How Requests live and resolve.
    #[serde(default)]
    pub requests: RequestsConfig,
    /// How long the audit trail (the event log) is kept.
    #[serde(default)]
    pub audit: AuditConfig,
    /// The upstream MCP servers, each with a shared session opened at start-up.
    #[serde(default)]
    pub servers: Vec<ServerConfig>,
    /// What the gateway logs and how.
    #[serde(default)]
    pub log: LogConfig,
    /// Where to POST events as they happen.
    #[serde(default)]
    pub webhooks: Vec<WebhookConfig>,
    /// Who may use the API.
    #[serde(default)]
    pub auth: AuthConfig,
    /// Per-principal caps and the upstream call timeout.
    #[serde(default)]
    pub limits: LimitsConfig,
    /// What the REST API accepts, and from where.
    #[serde(default)]
    pub http: HttpConfig,
    /// Where the gateway keeps its state.
    #[serde(default)]
    pub store: StoreConfig,
    /// The gateway's own MCP endpoint, `/mcp`.
    #[serde(default)]
    pub front_door: FrontDoorConfig,
    /// This gateway's name among the replicas sharing a store; unset, the host name and a random suffix.
    #[serde(default, deserialize_with = "replica_name")]
    pub replica: Option<String>,
    /// Tool calls that wait for a person's approval before they are forwarded.
    #[serde(default)]
    pub approvals: Vec<ApprovalConfig>,
    /// The address people reach the gateway at (behind a proxy, the proxy's), which answer links start with;
    /// unset, `http://` and `listen`.
    #[serde(default, deserialize_with = "expanded_option")]
    pub public_url: Option<String>,
    /// How answer links are signed.
    #[serde(default)]
    pub links: LinksConfig,
    /// Where people are told of Requests: mail, Slack, Teams.
    #[serde(default)]
    pub notify: Vec<NotifyConfig>,
}

/// One `[[notify]]` entry: a channel, the Requests it is told of, and how it is delivered to.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NotifyConfig {
    /// Its name in logs, metrics and escalations (letters, digits, `-`, `_`, `.`).
    pub name: String,
    /// Mail through an SMTP server, one message per recipient.
    pub email: Option<EmailConfig>,
    /// A Slack incoming webhook.
    pub slack: Option<ChatConfig>,
    /// A Microsoft Teams Workflows webhook.
    pub teams: Option<ChatConfig>,
    /// Which Requests it is told of; all of them when unset.
    #[serde(default)]
    pub requests: NotifyRequests,
    /// How long one delivery attempt may take.
    #[serde(
        default = "default_notify_timeout",
        deserialize_with = "duration",
        serialize_with = "as_humantime"
    )]
    pub timeout: Duration,
    /// How many times a message is tried before it is given up.
    #[serde(default = "default_webhook_attempts")]
    pub attempts: u32,
    /// Deliver to link-local addresses and cloud metadata endpoints too, which are refused by default.
    #[serde(default)]
    pub allow_link_local: bool,
}

/// `[[notify]] email`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EmailConfig {
    /// The recipients: each gets a message of their own, with links that answer as them.
    pub to: Vec<String>,
    /// The sender.
    pub from: String,
    /// `smtp://host[:port]` (port 587 by default) or `smtps://host[:port]` (TLS from the start, 465).
    #[serde(deserialize_with = "expanded", serialize_with = "redacted_url")]
    pub smtp: String,
    /// Whether an `smtp://` connection must be upgraded with STARTTLS before anything is sent.
    #[serde(default = "default_true")]
    pub starttls: bool,
    #[serde(default, deserialize_with = "expanded_option")]
    pub username: Option<String>,
    #[serde(default, deserialize_with = "expanded_option", serialize_with = "masked")]
    pub password: Option<String>,
}

/// `[[notify]] slack` and `teams`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ChatConfig {
    /// The webhook URL messages are POSTed to (`${VAR}` expands; it is a secret, shown masked).
    #[serde(deserialize_with = "expanded", serialize_with = "masked_string")]
    pub webhook: String,
}

/// `[[notify]] requests`: the Requests a channel is told of.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NotifyRequests {
    /// Only Requests of these kinds (`approval`, `input`, …); all when empty.
    #[serde(default)]
    pub kinds: Vec<String>,
    /// Only Requests of these servers; all when empty (a posted Request has no server).
    #[serde(default)]
    pub servers: Vec<String>,
}

fn default_notify_timeout() -> Duration {
    Duration::from_secs(10)
}

fn default_true() -> bool {
    true
}

/// The `[links]` table.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LinksConfig {
    /// The keys that sign answer links (`whsec_<base64>`, as `toolnexus-gateway webhook-secret` prints): the
    /// first signs, and links signed by any of them are taken, so a new key goes first and the one before stays
    /// until its links have expired. Unset, a key the gateway makes once and keeps in its store.
    #[serde(default, deserialize_with = "expanded_list", serialize_with = "masked_list")]
    pub keys: Vec<String>,
    /// Whether a link answers only once its person has signed in at the OpenID provider (`[auth.oidc]` with
    /// `ui_client_id`), and then as the person who did.
    #[serde(default)]
    pub sign_in: bool,
}

/// One `[[approvals]]` entry.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalConfig {
    /// A server's name, or `"*"` for every server.
    pub server: String,
    /// Glob patterns (`*`, `?`) of the upstream tool names that need approval.
    pub tools: Vec<String>,
    /// The approval Request's prompt; `{tool}`, `{server}` and `{caller}` expand.
    pub prompt: Option<String>,
    /// How long the approval stays answerable; `requests.ttl` when unset.
    #[serde(
        default,
        deserialize_with = "optional_duration",
        serialize_with = "as_optional_humantime"
    )]
    pub ttl: Option<Duration>,
    /// Who may answer: token names, `group:<group>` and `user:<name>` of the OpenID provider; any approver or
    /// admin when unset.
    #[serde(default)]
    pub approvers: Vec<String>,
    /// Whether the principal that started the call may approve it (for one-person set-ups).
    #[serde(default)]
    pub self_approval: bool,
    /// How many different people must approve before the call is forwarded.
    #[serde(default = "default_quorum")]
    pub quorum: usize,
    /// Channels told of an approval nobody has answered after a while.
    #[serde(default)]
    pub escalate: Vec<EscalationConfig>,
    /// Whether an approver may approve the call with changed arguments, checked against the tool's
    /// `inputSchema`.
    #[serde(default)]
    pub editable: bool,
    /// The standing grants an approver may give with an approval: `"session"` and durations (`"1h"`); none
    /// by default.
    #[serde(default)]
    pub grants: Vec<String>,
}

/// One step of `[[approvals]] escalate`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EscalationConfig {
    /// How long after the approval was raised.
    #[serde(deserialize_with = "duration", serialize_with = "as_humantime")]
    pub after: Duration,
    /// The `[[notify]]` channels told then, if it is still pending.
    pub notify: Vec<String>,
}

fn default_quorum() -> usize {
    1
}

/// The `[store]` table.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct StoreConfig {
    /// `"sqlite:PATH"`, `"postgres://…"` or `"memory"`; unset, a SQLite file in the user's state directory.
    #[serde(default, deserialize_with = "store_url", serialize_with = "redacted_optional_url")]
    pub url: Option<String>,
}

/// The `[front_door]` table: how `/mcp` names upstream tools and how long it holds a call that waits on a human.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FrontDoorConfig {
    /// Whether tool names carry their server's name.
    #[serde(default)]
    pub prefix: Prefix,
    /// Who is asked what an upstream asks during a front-door call.
    #[serde(default)]
    pub elicitation: Elicitations,
    /// How long a `tools/call` is held while its call waits on a human before it answers that the call is
    /// waiting (shorter than the 60 s many MCP clients give a request).
    #[serde(
        default = "default_max_hold",
        deserialize_with = "duration",
        serialize_with = "as_humantime"
    )]
    pub max_hold: Duration,
}

impl Default for FrontDoorConfig {
    fn default() -> Self {
        Self {
            prefix: Prefix::default(),
            elicitation: Elicitations::default(),
            max_hold: default_max_hold(),
        }
    }
}

/// Who is asked what an upstream asks during a front-door call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Elicitations {
    /// A Request, answered over REST or in the inbox.
    #[default]
    Rest,
    /// The MCP client, when it declared elicitation in that mode; else a Request as with `rest`.
    Relay,
}

impl Elicitations {
    /// The name as the config spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Elicitations::Rest => "rest",
            Elicitations::Relay => "relay",
        }
    }
}

/// Whether the front door's tool names carry their server's name.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Prefix {
    /// `{server}__{tool}` for every tool.
    #[default]
    Always,
    /// The upstream's names while only one server is configured, `{server}__{tool}` otherwise.
    WhenNeeded,
}

impl Prefix {
    /// The name as the config spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Prefix::Always => "always",
            Prefix::WhenNeeded => "when-needed",
        }
    }
}

/// The `[auth]` table.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    /// The bearer tokens; with none the gateway serves without authentication (on loopback only, by default).
    #[serde(default)]
    pub tokens: Vec<TokenConfig>,
    /// Serve `/metrics` without a token.
    #[serde(default)]
    pub public_metrics: bool,
    /// Serve `/openapi.json` without a token.
    #[serde(default = "default_true")]
    pub public_openapi: bool,
    /// An OpenID Connect provider whose JWTs are bearer tokens too.
    pub oidc: Option<OidcConfig>,
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            tokens: Vec::new(),
            public_metrics: false,
            public_openapi: default_true(),
            oidc: None,
        }
    }
}

/// The `[auth.oidc]` table.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OidcConfig {
    /// The issuer URL: `https://`, or `http://` on a loopback address.
    pub issuer: String,
    /// What a token's `aud` must contain.
    pub audience: String,
    /// The claim `answeredBy` shows; `preferred_username`, then `email`, then `sub` when unset.
    pub name_claim: Option<String>,
    /// The claim that lists a token's groups.
    #[serde(default = "default_groups_claim")]
    pub groups_claim: String,
    /// The groups that give each role; the highest role a token's groups give wins.
    #[serde(default)]
    pub roles: OidcRoles,
    /// The URL of `/mcp` that protected resource metadata names; taken from each request's `Host` when unset.
    pub resource: Option<String>,
    /// The provider's client id of the inbox: with it `/ui` signs in at the provider by itself.
    pub ui_client_id: Option<String>,
    /// The scopes the inbox asks for, space-separated.
    #[serde(default = "default_ui_scope")]
    pub ui_scope: String,
}

fn default_ui_scope() -> String {
    "openid profile email".to_owned()
}

/// `[auth.oidc] roles`: the groups that give each role.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OidcRoles {
    #[serde(default)]
    pub admin: Vec<String>,
    #[serde(default)]
    pub approver: Vec<String>,
    #[serde(default)]
    pub agent: Vec<String>,
}

fn default_groups_claim() -> String {
    "groups".to_owned()
}

/// One `[[auth.tokens]]` entry: a name, a role, and the token as its SHA-256 or from the environment.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TokenConfig {
    /// The principal's name: it owns what the token starts and signs the answers it gives.
    pub name: String,
    /// `agent`, `approver` or `admin`.
    pub role: Role,
    /// The lowercase hex SHA-256 of the token.
    #[serde(serialize_with = "masked")]
    pub sha256: Option<String>,
    /// The environment variable that holds the token itself.
    pub env: Option<String>,
}

/// One `[[webhooks]]` entry.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookConfig {
    /// Its name in logs and metrics (default `webhook-<n>`, counting from 1).
    pub name: Option<String>,
    /// Where events are POSTed.
    #[serde(deserialize_with = "expanded", serialize_with = "redacted_url")]
    pub url: String,
    /// The event types to send; all of them when empty.
    #[serde(default)]
    pub events: Vec<EventKind>,
    /// The Standard Webhooks secret (`whsec_<base64>`) that signs each delivery in `webhook-signature`.
    #[serde(default, deserialize_with = "expanded_option", serialize_with = "masked")]
    pub secret: Option<String>,
    /// How long one delivery attempt may take.
    #[serde(
        default = "default_webhook_timeout",
        deserialize_with = "duration",
        serialize_with = "as_humantime"
    )]
    pub timeout: Duration,
    /// How many times an event is tried before it is given up.
    #[serde(default = "default_webhook_attempts")]
    pub attempts: u32,
    /// Post to link-local addresses and cloud metadata endpoints too, which are refused by default.
    #[serde(default)]
    pub allow_link_local: bool,
}

impl WebhookConfig {
    /// Its name: the configured one, else `webhook-<n>` for the entry at `index`.
    fn name_at(&self, index: usize) -> String {
        self.name.clone().unwrap_or_else(|| format!("webhook-{}", index + 1))
    }
}

/// A validated webhook, with `${VAR}` expanded.
#[derive(Debug, Clone)]
pub struct Webhook {
    pub name: String,
    /// An http or https URL; unless `allow_link_local`, its host is no link-local or metadata address.
    pub url: Url,
    pub events: Vec<EventKind>,
    pub secret: Option<Secret>,
    pub timeout: Duration,
    pub attempts: u32,
    /// Whether deliveries may reach link-local and metadata addresses, also through DNS.
    pub allow_link_local: bool,
}

/// The `[log]` table.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LogConfig {
    /// A `tracing` filter such as `info` or `info,toolnexus_gateway=debug`; `RUST_LOG` overrides it.
    #[serde(default = "default_log_level", deserialize_with = "log_filter")]
    pub level: String,
    /// `text` for people, `json` for log pipelines; `--log-format` overrides it.
    #[serde(default)]
    pub format: LogFormat,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            level: default_log_level(),
            format: LogFormat::default(),
        }
    }
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// The `[requests]` table.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RequestsConfig {
    /// How long a Request stays answerable; on expiry the upstream gets `cancel`.
    #[serde(
        default = "default_ttl",
        deserialize_with = "duration",
        serialize_with = "as_humantime"
    )]
    pub ttl: Duration,
    /// Whether schema defaults fill properties a form answer leaves out.
    #[serde(default = "default_true")]
    pub apply_defaults: bool,
    /// How long resolved Requests, finished Calls, closed Sessions and events stay readable; unset, 7 days
    /// with a SQLite store and 1 hour in memory.
    #[serde(
        default,
        deserialize_with = "optional_duration",
        serialize_with = "as_optional_humantime"
    )]
    pub retention: Option<Duration>,
    /// The most Requests pending at once; past it a new elicitation is answered `cancel` at once.
    #[serde(default = "default_max_pending")]
    pub max_pending: usize,
    /// The most Requests one principal's calls may have pending; unset, a quarter of `max_pending`.
    pub max_pending_per_principal: Option<usize>,
    /// The most Requests one server may have pending; unset, half of `max_pending` (all of it while one server
    /// is configured).
    pub max_pending_per_server: Option<usize>,
    /// The largest elicitation (message and schema, as JSON) one Request may hold.
    #[serde(default = "default_max_request_bytes")]
    pub max_request_bytes: usize,
    /// The most bytes pending Requests may hold together.
    #[serde(default = "default_max_pending_bytes")]
    pub max_pending_bytes: usize,
}

/// The `[audit]` table: the event log with its hashes, which `GET /audit` exports.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AuditConfig {
    /// How long events stay in the log; unset, 90 days, or `requests.retention` if that is longer. It may not
    /// be shorter than `requests.retention`: the trail outlives the records it tells the history of.
    #[serde(
        default,
        deserialize_with = "optional_duration",
        serialize_with = "as_optional_humantime"
    )]
    pub retention: Option<Duration>,
}

/// The `[limits]` table: what one principal may hold at once, and how long upstream work may take.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// Calls one principal may have running (or waiting on input) at once.
    #[serde(default = "default_calls_per_principal")]
    pub calls_per_principal: usize,
    /// Private sessions one principal may have open at once.
    #[serde(default = "default_sessions_per_principal")]
    pub sessions_per_principal: usize,
    /// How long the upstream may work on a call, not counting time spent waiting on a human; none by default.
    #[serde(
        default,
        deserialize_with = "optional_duration",
        serialize_with = "as_optional_humantime"
    )]
    pub call_timeout: Option<Duration>,
    /// Responses one principal may have held by `wait` at once.
    #[serde(default = "default_long_polls_per_principal")]
    pub long_polls_per_principal: usize,
    /// `GET /events` streams and `/mcp` GET streams one principal may have open at once.
    #[serde(default = "default_streams_per_principal")]
    pub streams_per_principal: usize,
    /// 2025-11-25 `/mcp` sessions one principal may have open at once.
    #[serde(default = "default_mcp_sessions_per_principal")]
    pub mcp_sessions_per_principal: usize,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            calls_per_principal: default_calls_per_principal(),
            sessions_per_principal: default_sessions_per_principal(),
            call_timeout: None,
            long_polls_per_principal: default_long_polls_per_principal(),
            streams_per_principal: default_streams_per_principal(),
            mcp_sessions_per_principal: default_mcp_sessions_per_principal(),
        }
    }
}

/// The `[http]` table: what the REST API accepts, and from where.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HttpConfig {
    /// The largest request body, in bytes.
    #[serde(default = "default_max_body_bytes")]
    pub max_body_bytes: usize,
    /// Origins whose browser pages may call the API (CORS); none by default.
    #[serde(default)]
    pub cors_origins: Vec<String>,
    /// `Host` header values the API answers (DNS-rebinding protection). Unset: the loopback names when
    /// listening on loopback, anything otherwise; an empty list turns the check off.
    pub allowed_hosts: Option<Vec<String>>,
    /// The most connections open at once; unset, half the open-file limit (raised to its hard limit at start).
    pub max_connections: Option<usize>,
    /// How long a client may take to send a request's headers, and to start the next request on a kept-alive
    /// connection; then the connection is closed.
    #[serde(
        default = "default_header_timeout",
        deserialize_with = "duration",
        serialize_with = "as_humantime"
    )]
    pub header_timeout: Duration,
    /// How long a client may take to send a request's body once its headers are in; then the connection is
    /// closed, so that nobody holds one by sending a body a byte at a time.
    #[serde(
        default = "default_body_timeout",
        deserialize_with = "duration",
        serialize_with = "as_humantime"
    )]
    pub body_timeout: Duration,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            max_body_bytes: default_max_body_bytes(),
            cors_origins: Vec::new(),
            allowed_hosts: None,
            max_connections: None,
            header_timeout: default_header_timeout(),
            body_timeout: default_body_timeout(),
        }
    }
}

impl Default for RequestsConfig {
    fn default() -> Self {
        Self {
            ttl: default_ttl(),
            apply_defaults: true,
            retention: None,
            max_pending: default_max_pending(),
            max_pending_per_principal: None,
            max_pending_per_server: None,
            max_request_bytes: default_max_request_bytes(),
            max_pending_bytes: default_max_pending_bytes(),
        }
    }
}

/// One `[[servers]]` entry as written in the file.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// The server's name in the REST API.
    pub name: String,
    /// The program to start for a stdio server.
    #[serde(default, deserialize_with = "expanded_option")]
    pub command: Option<String>,
    /// Its arguments as written (for `builtin = "demo"`, flags of `demo-server` such as `--seal-state`);
    /// `${VAR}` is expanded when the transport is built, so that `check-config` can show them unexpanded.
    #[serde(default)]
    pub args: Vec<String>,
    /// Extra environment for the child process.
    #[serde(
        default,
        deserialize_with = "expanded_map",
        serialize_with = "masked_values",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub env: BTreeMap<String, String>,
    /// The endpoint of a streamable-HTTP server.
    #[serde(default, deserialize_with = "server_url", serialize_with = "redacted_optional_url")]
    pub url: Option<String>,
    /// Headers sent with every HTTP request.
    #[serde(
        default,
        deserialize_with = "expanded_map",
        serialize_with = "masked_values",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub headers: BTreeMap<String, String>,
    /// A server built into this binary.
    pub builtin: Option<Builtin>,
    /// Which protocol era to speak.
    #[serde(default)]
    pub protocol: ProtocolChoice,
    /// How long starting the server and its MCP handshake may take (default 30 s).
    #[serde(
        default,
        deserialize_with = "optional_duration",
        serialize_with = "as_optional_humantime"
    )]
    pub startup_timeout: Option<Duration>,
    /// The `file://` URIs the server is told are the roots it may work in (2025-11-25 `roots/list`).
    #[serde(default)]
    pub roots: Vec<String>,
    /// Whether its sampling requests (2025-11-25) are asked of a person, or refused.
    #[serde(default)]
    pub sampling: Sampling,
    /// Whether the server is told the gateway follows tasks (MCP Tasks), so that it may make a long call one.
    #[serde(default)]
    pub tasks: Tasks,
}

/// `[[servers]] tasks`: whether a server may answer a `tools/call` with a task.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Tasks {
    /// Declared: a server that supports tasks may make a call one, which the gateway follows.
    #[default]
    Auto,
    /// Not declared: every call is answered in one response or in rounds.
    Never,
}

/// `[[servers]] sampling`: what becomes of a server's `sampling/createMessage`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Sampling {
    /// A Request of kind `sampling`, answered with the reply's text.
    #[default]
    Ask,
    /// Not offered: the capability is not declared, and a request is refused.
    Refuse,
}

/// Servers built into this binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Builtin {
    /// The demo server (`toolnexus-gateway demo-server`) over stdio.
    Demo,
}

/// The protocol era a server is spoken to in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
pub enum ProtocolChoice {
    /// 2026-07-28 where the upstream supports it, else 2025-11-25.
    #[default]
    #[serde(rename = "auto")]
    Auto,
    /// Always `initialize` with 2025-11-25.
    #[serde(rename = "2025-11-25")]
    Legacy,
    /// Always `server/discover` with 2026-07-28; a server that does not speak it fails.
    #[serde(rename = "2026-07-28")]
    Modern,
}

/// How the gateway reaches a server, after validation and `${VAR}` expansion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    /// A child process spoken to over stdin/stdout.
    Stdio {
        command: PathBuf,
        args: Vec<String>,
        env: BTreeMap<String, String>,
    },
    /// A streamable-HTTP endpoint.
    Http {
        url: String,
        headers: BTreeMap<String, String>,
    },
}

impl Transport {
    /// `stdio` or `http`, as shown by `GET /servers`.
    pub fn kind(&self) -> &'static str {
        match self {
            Transport::Stdio { .. } => "stdio",
            Transport::Http { .. } => "http",
        }
    }
}

/// A validated server: its name, transport and protocol choice.
#[derive(Debug, Clone)]
pub struct Server {
    /// The server's name in the REST API.
    pub name: String,
    /// How to reach it.
    pub transport: Transport,
    /// Which protocol era to speak.
    pub protocol: ProtocolChoice,
    /// How long starting the server and its MCP handshake may take before it counts as failed.
    pub startup_timeout: Duration,
    /// The roots it is told of; none declared when empty.
    pub roots: Vec<String>,
    /// What becomes of its sampling requests.
    pub sampling: Sampling,
    /// Whether it is told the gateway follows tasks.
    pub tasks: Tasks,
}

impl Config {
    /// The built-in default: listen on 127.0.0.1:8080 with the demo server.
    pub fn builtin() -> Self {
        Self {
            listen: default_listen(),
            workers: default_workers(),
            requests: RequestsConfig::default(),
            audit: AuditConfig::default(),
            servers: vec![ServerConfig {
                name: "demo".to_owned(),
                builtin: Some(Builtin::Demo),
                ..ServerConfig::default()
            }],
            log: LogConfig::default(),
            webhooks: Vec::new(),
            auth: AuthConfig::default(),
            limits: LimitsConfig::default(),
            http: HttpConfig::default(),
            store: StoreConfig::default(),
            front_door: FrontDoorConfig::default(),
            replica: None,
            approvals: Vec::new(),
            public_url: None,
            links: LinksConfig::default(),
            notify: Vec::new(),
        }
    }

    /// Where the store keeps its state: `store.url`, else `toolnexus-gateway/gateway.sqlite3` in the state
    /// directory (`$XDG_STATE_HOME`, else `~/.local/state`; the working directory without a home).
    pub fn store_location(&self) -> Result<Location, String> {
        match &self.store.url {
            Some(url) => Location::parse(url).map_err(|error| format!("store.url: {error}")),
            None => Ok(Location::Sqlite(default_store_path())),
        }
    }

    /// This gateway's name among the replicas sharing a store: the configured one, or the host name with a
    /// random suffix, new at each start.
    pub fn replica(&self) -> String {
        self.replica.clone().unwrap_or_else(|| {
            let host = nix::unistd::gethostname()
                .ok()
                .and_then(|name| name.into_string().ok())
                .filter(|name| !name.is_empty())
                .unwrap_or_else(|| "gateway".to_owned());
            // The last digits of a v7 UUID are random.
            let random = uuid::Uuid::now_v7().simple().to_string();
            format!("{host}-{}", &random[random.len() - 8..])
        })
    }

    /// The caps on pending Requests, with each principal's and each server's share.
    pub fn pending_caps(&self) -> PendingCaps {
        let requests = &self.requests;
        let server_share = if self.servers.len() > 1 {
            requests.max_pending / 2
        } else {
            requests.max_pending
        };
        // Without tokens everyone is one principal, whose share is the whole.
        let principal_share = if !self.authenticates() {
            requests.max_pending
        } else {
            requests.max_pending / 4
        };
        let per_principal = requests.max_pending_per_principal.unwrap_or(principal_share).max(1);
        let share_of_bytes = (requests.max_pending_bytes as u128 * per_principal.min(requests.max_pending) as u128)
            / requests.max_pending.max(1) as u128;
        PendingCaps {
            total: requests.max_pending,
            per_principal,
            per_server: requests.max_pending_per_server.unwrap_or(server_share).max(1),
            bytes: requests.max_pending_bytes,
            bytes_per_principal: usize::try_from(share_of_bytes).unwrap_or(usize::MAX),
        }
    }

    /// How long ended records stay readable: `requests.retention`, else 7 days in a SQLite store (an audit
    /// trail on disk) and 1 hour in memory.
    pub fn retention(&self) -> Duration {
        self.requests.retention.unwrap_or(match self.store_location() {
            Ok(Location::Memory) => MEMORY_RETENTION,
            _ => DURABLE_RETENTION,
        })
    }

    /// How long events (the audit trail) stay in the log: `audit.retention`, else 90 days or `retention()`,
    /// whichever is longer.
    pub fn audit_retention(&self) -> Duration {
        self.audit.retention.unwrap_or(AUDIT_RETENTION.max(self.retention()))
    }

    /// Reads and validates a config file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        let config: Config = toml::from_str(&text).map_err(|error| ConfigError::Parse {
            path: path.to_owned(),
            message: error.to_string(),
        })?;
        config.validate().map_err(|problem| ConfigError::Invalid {
            path: path.to_owned(),
            line: problem.entry.and_then(|entry| entry.line_in(&text)),
            message: problem.message,
        })?;
        Ok(config)
    }

    /// The effective configuration as TOML: the file's keys with every default the gateway resolves filled
    /// in, and secrets masked (header and environment values, webhook secrets, token digests, and the
    /// passwords and query values of URLs). Arguments are shown as written, before `${VAR}` expansion.
    pub fn masked_toml(&self) -> Result<String, String> {
        let effective = self.effective().map_err(|problem| problem.message)?;
        toml::to_string(&effective).map_err(|error| error.to_string())
    }

    /// This configuration with the defaults the gateway resolves at start written in.
    fn effective(&self) -> Result<Config, Problem> {
        let mut effective = self.clone();
        let caps = self.pending_caps();
        let requests = &mut effective.requests;
        requests.retention = Some(self.retention());
        effective.audit.retention = Some(self.audit_retention());
        requests.max_pending_per_principal = Some(caps.per_principal);
        requests.max_pending_per_server = Some(caps.per_server);
        for (entry, server) in effective.servers.iter_mut().zip(self.servers()?) {
            entry.startup_timeout = Some(server.startup_timeout);
        }
        // Named without checking the rest: a masked secret (`***`) is no Standard Webhooks secret.
        for (index, entry) in effective.webhooks.iter_mut().enumerate() {
            entry.name = Some(entry.name_at(index));
        }
        for (entry, policy) in effective.approvals.iter_mut().zip(self.approvals()?) {
            entry.prompt = Some(policy.prompt);
        }
        effective.store.url = Some(self.store_location()?.url());
        effective
            .replica
            .get_or_insert_with(|| "(the host name and a random suffix)".to_owned());
        Ok(effective)
    }

    /// The configured tokens, each reduced to its digest.
    pub fn tokens(&self) -> Result<Vec<Token>, Problem> {
        let tokens = each_entry("auth.tokens", &self.auth.tokens, |index, token| {
            let key = format!("auth.tokens[{index}]");
            if token.name.trim().is_empty() {
                return Err(format!("{key}.name must not be empty"));
            }
            if auth::oidc::is_identity_form(&token.name) {
                return Err(format!(
                    "{key}.name = {:?} has the form of an OpenID subject's identity (a URL); choose another",
                    token.name
                ));
            }
            if token.name == auth::ANONYMOUS {
                return Err(format!(
                    "{key}.name = {:?} is the name of everyone when there are no tokens; choose another",
                    token.name
                ));
            }
            let digest = match (&token.sha256, &token.env) {
                (Some(hex), None) => auth::parse_digest(hex)
                    .ok_or_else(|| format!("{key}.sha256 must be 64 hex digits: the SHA-256 of the token"))?,
                (None, Some(variable)) => match std::env::var(variable) {
                    Ok(value) if !value.trim().is_empty() => {
                        auth::parse_digest(&auth::digest_hex(value.trim())).expect("a digest's hex parses")
                    }
                    _ => {
                        return Err(format!(
                            "{key}.env: environment variable {variable} is not set or empty"
                        ));
                    }
                },
                _ => {
                    return Err(format!(
                        "{key} ({:?}) needs exactly one of `sha256` and `env`",
                        token.name
                    ));
                }
            };
            Ok(Token {
                name: token.name.clone(),
                role: token.role,
                digest,
            })
        })?;
        if let Some(name) = auth::duplicate_names(&tokens) {
            return Err(Problem::from(format!(
                "auth.tokens: the name {name:?} is used twice; give each token its own name"
            )));
        }
        Ok(tokens)
    }

    /// Whether requests are authenticated: tokens or an OpenID provider are configured.
    pub fn authenticates(&self) -> bool {
        !self.auth.tokens.is_empty() || self.auth.oidc.is_some()
    }

    /// The OpenID provider's settings, checked, when `[auth.oidc]` is configured.
    pub fn oidc(&self) -> Result<Option<auth::oidc::OidcSettings>, Problem> {
        let Some(oidc) = &self.auth.oidc else {
            return Ok(None);
        };
        let issuer = Url::parse(&oidc.issuer)
            .map_err(|error| format!("auth.oidc.issuer = {:?} is not a URL: {error}", oidc.issuer))?;
        if !auth::oidc::is_safe_url(issuer.as_str()) {
            return Err(Problem::from(format!(
                "auth.oidc.issuer = {:?} must be an https:// URL (http:// only on a loopback address)",
                oidc.issuer
            )));
        }
        if oidc.audience.trim().is_empty() {
            return Err(Problem::from(
                "auth.oidc.audience must name what the provider's tokens for this gateway carry in `aud`".to_owned(),
            ));
        }
        let roles = &oidc.roles;
        if roles.admin.is_empty() && roles.approver.is_empty() && roles.agent.is_empty() {
            return Err(Problem::from(
                "auth.oidc.roles maps no group to a role, so no token could do anything: e.g. roles = { approver \
                 = [\"sre\"], agent = [\"agents\"] }"
                    .to_owned(),
            ));
        }
        if let Some(resource) = &oidc.resource {
            Url::parse(resource).map_err(|error| format!("auth.oidc.resource = {resource:?} is not a URL: {error}"))?;
        }
        if oidc.ui_client_id.as_deref().is_some_and(|id| id.trim().is_empty()) {
            return Err(Problem::from("auth.oidc.ui_client_id must not be empty".to_owned()));
        }
        Ok(Some(auth::oidc::OidcSettings {
            ui: oidc.ui_client_id.clone().map(|client_id| auth::oidc::InboxClient {
                client_id,
                scope: oidc.ui_scope.clone(),
            }),
            issuer: oidc.issuer.clone(),
            audience: oidc.audience.clone(),
            name_claim: oidc.name_claim.clone(),
            groups_claim: oidc.groups_claim.clone(),
            roles: auth::oidc::RoleGroups {
                admin: roles.admin.clone(),
                approver: roles.approver.clone(),
                agent: roles.agent.clone(),
            },
        }))
    }

    /// The secrets of the configured URLs (servers', webhooks' and the store's), to keep out of the logs.
    pub fn secrets(&self) -> redact::Secrets {
        let servers = self.servers.iter().filter_map(|server| server.url.as_deref());
        let webhooks = self.webhooks.iter().map(|hook| hook.url.as_str());
        let store = self.store.url.as_deref().map(redact::Secrets::of_database_url);
        redact::Secrets::of_urls(servers.chain(webhooks)).and(store.unwrap_or_default())
    }

    /// Checks everything serde cannot: servers, webhooks, tokens, the store, the log filter.
    pub fn validate(&self) -> Result<(), Problem> {
        let servers = self.servers()?;
        for (index, server) in servers.iter().enumerate() {
            let prefix = server.name.replace('.', "_");
            if let Some(other) = servers[..index]
                .iter()
                .find(|other| other.name.replace('.', "_") == prefix)
            {
                return Err(Problem::in_entry(
                    "servers",
                    index,
                    format!(
                        "servers[{index}].name = {:?}: its tools would be named {prefix}__… on /mcp, as those of \
                         server {:?} are; rename one",
                        server.name, other.name
                    ),
                ));
            }
        }
        self.store_location()?;
        if let Some(replica) = &self.replica {
            check_replica(replica).map_err(|why| format!("replica: {why}"))?;
        }
        self.webhooks()?;
        self.tokens()?;
        self.oidc()?;
        self.approvals()?;
        self.links()?;
        self.notify()?;
        if self.http.max_connections == Some(0) {
            return Err(Problem::from("http.max_connections must be at least 1".to_owned()));
        }
        if self.http.header_timeout.is_zero() {
            return Err(Problem::from("http.header_timeout must be longer than zero".to_owned()));
        }
        if self.http.body_timeout.is_zero() {
            return Err(Problem::from("http.body_timeout must be longer than zero".to_owned()));
        }
        if self.front_door.max_hold.is_zero() {
            return Err(Problem::from("front_door.max_hold must be longer than zero".to_owned()));
        }
        for origin in &self.http.cors_origins {
            check_origin(origin).map_err(|problem| format!("http.cors_origins: {origin:?} {problem}"))?;
        }
        check_log_filter(&self.log.level).map_err(|_| format!("log.level: {NOT_A_LOG_FILTER}"))?;
        if self.audit_retention() < self.retention() {
            return Err(Problem::from(format!(
                "audit.retention = \"{}\" is shorter than requests.retention (\"{}\"): the audit trail must outlive \
                 the records whose history it tells; lengthen audit.retention, or leave it out for the longer of 90 \
                 days and requests.retention",
                shown(self.audit_retention()),
                shown(self.retention())
            )));
        }
        Ok(())
    }

    /// The validated webhooks.
    pub fn webhooks(&self) -> Result<Vec<Webhook>, Problem> {
        each_entry("webhooks", &self.webhooks, |index, hook| {
            let key = format!("webhooks[{index}]");
            let name = hook.name_at(index);
            let url = Url::parse(&hook.url)
                .ok()
                .filter(|url| matches!(url.scheme(), "http" | "https") && url.host_str().is_some())
                .ok_or_else(|| format!("{key}.url: the URL must start with http:// or https:// and name a host"))?;
            if !hook.allow_link_local
                && let Some(why) = egress::host_refusal(&url)
            {
                return Err(format!(
                    "{key}.url of webhook {name:?}: {why}; webhooks do not post to link-local or cloud metadata \
                         addresses unless the webhook sets allow_link_local = true"
                ));
            }
            if hook.attempts == 0 {
                return Err(format!("{key}.attempts must be at least 1"));
            }
            let reserved = [
                (crate::notify::KEY_PREFIX, "the notification channels'"),
                (crate::audit::KEY_PREFIX, "the audit trail's"),
            ];
            if let Some((prefix, whose)) = reserved.into_iter().find(|(prefix, _)| name.starts_with(prefix)) {
                return Err(format!(
                    "{key}.name = {name:?}: names starting with {prefix:?} are {whose}"
                ));
            }
            let secret = hook.secret.as_deref().map(Secret::parse).transpose().map_err(|why| {
                format!(
                    "{key}.secret of webhook {name:?} is not a Standard Webhooks secret ({why}): one is {PREFIX} and \
                     the base64 of 24 to 64 random bytes, as receivers' libraries read it. Make one with \
                     `toolnexus-gateway webhook-secret` and give the receiver the same"
                )
            })?;
            Ok(Webhook {
                name,
                url,
                events: hook.events.clone(),
                secret,
                timeout: hook.timeout,
                attempts: hook.attempts,
                allow_link_local: hook.allow_link_local,
            })
        })
    }

    /// How answer links are made: the address they start with (unset: the one the gateway listens at), and the
    /// configured keys (none: the store's).
    pub fn links(&self) -> Result<crate::links::Settings, Problem> {
        let public_url = match &self.public_url {
            Some(written) => {
                let url = Url::parse(written)
                    .ok()
                    .filter(|url| {
                        matches!(url.scheme(), "http" | "https")
                            && url.host_str().is_some()
                            && url.path() == "/"
                            && url.query().is_none()
                            && url.fragment().is_none()
                    })
                    .ok_or_else(|| {
                        "public_url must be an http:// or https:// URL of a host and nothing after it (the gateway \
                         serves its pages at the root), such as \"https://gateway.example.com\""
                            .to_owned()
                    })?;
                Some(url.as_str().trim_end_matches('/').to_owned())
            }
            None => None,
        };
        let keys = self
            .links
            .keys
            .iter()
            .enumerate()
            .map(|(index, key)| {
                Secret::parse(key).map_err(|why| {
                    format!(
                        "links.keys[{index}] is not a key ({why}): one is {PREFIX} and the base64 of 24 to 64 \
                         random bytes; make one with `toolnexus-gateway webhook-secret`"
                    )
                })
            })
            .collect::<Result<_, _>>()?;
        let sign_in = self.links.sign_in;
        if sign_in && self.auth.oidc.as_ref().is_none_or(|oidc| oidc.ui_client_id.is_none()) {
            return Err(Problem::from(
                "links.sign_in needs [auth.oidc] with ui_client_id: people sign in there, with that client, before a \
                 link answers"
                    .to_owned(),
            ));
        }
        Ok(crate::links::Settings {
            public_url,
            keys,
            sign_in,
        })
    }

    /// The validated notification channels; the error names the entry.
    pub fn notify(&self) -> Result<Vec<crate::notify::Channel>, Problem> {
        use crate::notify::{Channel, Destination, Email, Filter, Security};
        let servers = self.servers()?;
        let mut names = HashSet::new();
        each_entry("notify", &self.notify, |index, entry| {
            let key = format!("notify[{index}]");
            let name = &entry.name;
            if name.is_empty()
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            {
                return Err(format!("{key}.name = {name:?}: use letters, digits, '-', '_' and '.'"));
            }
            if !names.insert(name.clone()) {
                return Err(format!("{key}.name = {name:?}: another [[notify]] entry has that name"));
            }
            let refused = |url: &Url, what: &str| match egress::host_refusal(url) {
                Some(why) if !entry.allow_link_local => Err(format!(
                    "{key}.{what} of channel {name:?}: {why}; notifications do not go to link-local or cloud \
                     metadata addresses unless the entry sets allow_link_local = true"
                )),
                _ => Ok(()),
            };
            let web = |written: &str, what: &str| -> Result<Url, String> {
                let url = Url::parse(written)
                    .ok()
                    .filter(|url| matches!(url.scheme(), "http" | "https") && url.host_str().is_some())
                    .ok_or_else(|| {
                        format!("{key}.{what}: the URL must start with http:// or https:// and name a host")
                    })?;
                refused(&url, what)?;
                Ok(url)
            };
            let destination = match (&entry.email, &entry.slack, &entry.teams) {
                (Some(email), None, None) => {
                    let smtp = Url::parse(&email.smtp)
                        .ok()
                        .filter(|url| matches!(url.scheme(), "smtp" | "smtps") && url.host_str().is_some())
                        .ok_or_else(|| {
                            format!("{key}.email.smtp: the URL must be smtp://host[:port] or smtps://host[:port]")
                        })?;
                    refused(&smtp, "email.smtp")?;
                    let security = match (smtp.scheme(), email.starttls) {
                        ("smtps", _) => Security::Tls,
                        (_, true) => Security::StartTls,
                        (_, false) => Security::None,
                    };
                    let port = smtp.port().unwrap_or(match security {
                        Security::Tls => 465,
                        _ => 587,
                    });
                    if email.to.is_empty() {
                        return Err(format!("{key}.email.to: name at least one recipient"));
                    }
                    let mailbox = |address: &str, what: &str| {
                        address
                            .parse::<lettre::message::Mailbox>()
                            .map_err(|error| format!("{key}.email.{what} = {address:?} is not an address: {error}"))
                    };
                    let to = email
                        .to
                        .iter()
                        .map(|address| mailbox(address, "to"))
                        .collect::<Result<Vec<_>, _>>()?;
                    if let Some((index, twice)) = to
                        .iter()
                        .enumerate()
                        .find(|(index, mailbox)| to[..*index].iter().any(|before| before.email == mailbox.email))
                    {
                        return Err(format!("{key}.email.to[{index}]: {} is listed twice", twice.email));
                    }
                    let credentials = match (&email.username, &email.password) {
                        (Some(username), Some(password)) => Some((username.clone(), password.clone())),
                        (None, None) => None,
                        _ => return Err(format!("{key}.email: give both username and password, or neither")),
                    };
                    Destination::Email(Box::new(Email {
                        to,
                        from: mailbox(&email.from, "from")?,
                        host: smtp.host_str().unwrap_or_default().trim_matches(['[', ']']).to_owned(),
                        port,
                        security,
                        credentials,
                    }))
                }
                (None, Some(slack), None) => Destination::Slack(web(&slack.webhook, "slack.webhook")?),
                (None, None, Some(teams)) => Destination::Teams(web(&teams.webhook, "teams.webhook")?),
                _ => return Err(format!("{key}: give exactly one of email, slack and teams")),
            };
            for server in &entry.requests.servers {
                if !servers.iter().any(|known| &known.name == server) {
                    return Err(format!("{key}.requests.servers: no server is named {server:?}"));
                }
            }
            if entry.attempts == 0 {
                return Err(format!("{key}.attempts must be at least 1"));
            }
            Ok(Channel {
                name: name.clone(),
                destination,
                filter: Filter {
                    kinds: entry.requests.kinds.clone(),
                    servers: entry.requests.servers.clone(),
                },
                timeout: entry.timeout,
                attempts: entry.attempts,
                allow_link_local: entry.allow_link_local,
            })
        })
    }

    /// The validated approval policies; the error names the entry.
    pub fn approvals(&self) -> Result<Vec<ApprovalPolicy>, Problem> {
        let servers = self.servers()?;
        each_entry("approvals", &self.approvals, |index, entry| {
            let key = format!("approvals[{index}]");
            if entry.server != approvals::ANY_SERVER && !servers.iter().any(|server| server.name == entry.server) {
                return Err(format!(
                    "{key}.server = {:?}: no server has that name; name one of [[servers]], or \"*\" for all",
                    entry.server
                ));
            }
            if entry.tools.is_empty() {
                return Err(format!("{key}.tools must list at least one pattern, such as \"*\""));
            }
            let tools = entry
                .tools
                .iter()
                .map(|pattern| Glob::parse(pattern).map_err(|why| format!("{key}.tools: {why}")))
                .collect::<Result<Vec<_>, _>>()?;
            if entry.ttl.is_some_and(|ttl| ttl.is_zero()) {
                return Err(format!("{key}.ttl must be longer than zero"));
            }
            for name in &entry.approvers {
                self.check_approver(name)
                    .map_err(|why| format!("{key}.approvers (server {:?}): {why}", entry.server))?;
            }
            self.check_quorum(&entry.approvers, entry.quorum)
                .map_err(|why| format!("{key}.quorum = {} (server {:?}): {why}", entry.quorum, entry.server))?;
            let grants = entry
                .grants
                .iter()
                .map(|text| Lasting::parse(text).map_err(|why| format!("{key}.grants: {why}")))
                .collect::<Result<Vec<_>, _>>()?;
            if !grants.is_empty() && entry.quorum > 1 {
                return Err(format!(
                    "{key}: grants with quorum = {} (server {:?}): a grant one person gives would let later calls \
                     skip the people the quorum asks for",
                    entry.quorum, entry.server
                ));
            }
            if entry.editable && entry.quorum > 1 {
                return Err(format!(
                    "{key}: editable with quorum = {} (server {:?}): the approvers before an edit would have \
                     approved other arguments than those forwarded; make it one or the other",
                    entry.quorum, entry.server
                ));
            }
            let ttl = entry.ttl.unwrap_or(self.requests.ttl);
            for (step, escalation) in entry.escalate.iter().enumerate() {
                let at = format!("{key}.escalate[{step}]");
                if escalation.after.is_zero() || escalation.after >= ttl {
                    return Err(format!(
                        "{at}.after must be longer than zero and shorter than the approval's ttl ({}), or it never \
                         comes",
                        humantime::format_duration(ttl)
                    ));
                }
                if escalation.notify.is_empty() {
                    return Err(format!("{at}.notify must name at least one [[notify]] channel"));
                }
                if let Some(unknown) = escalation
                    .notify
                    .iter()
                    .find(|name| !self.notify.iter().any(|channel| &channel.name == *name))
                {
                    return Err(format!("{at}.notify: no [[notify]] channel is named {unknown:?}"));
                }
            }
            Ok(ApprovalPolicy {
                server: entry.server.clone(),
                tools,
                prompt: entry
                    .prompt
                    .clone()
                    .unwrap_or_else(|| approvals::DEFAULT_PROMPT.to_owned()),
                ttl: entry.ttl,
                approvers: entry.approvers.clone(),
                self_approval: entry.self_approval,
                quorum: entry.quorum,
                editable: entry.editable,
                grants,
                escalate: entry
                    .escalate
                    .iter()
                    .map(|step| Escalation {
                        after: step.after,
                        notify: step.notify.clone(),
                    })
                    .collect(),
            })
        })
    }

    /// Whether `quorum` different people could approve: without tokens or a provider there is one person
    /// (`anonymous`), and tokens alone (as bare `approvers`, or as every approver and admin token) are that many.
    fn check_quorum(&self, approvers: &[String], quorum: usize) -> Result<(), String> {
        if quorum == 0 {
            return Err("a quorum must be at least 1".to_owned());
        }
        if quorum == 1 {
            return Ok(());
        }
        if !self.authenticates() {
            return Err(format!(
                "without tokens or an OpenID provider everyone is {:?}, one person, so no {quorum} could approve",
                auth::ANONYMOUS
            ));
        }
        let by_token = |name: &str| matches!(auth::Approver::parse(name), auth::Approver::Token(_));
        let people = if !approvers.is_empty() && approvers.iter().all(|name| by_token(name)) {
            approvers.iter().collect::<std::collections::BTreeSet<_>>().len()
        } else if approvers.is_empty() && self.auth.oidc.is_none() {
            self.auth
                .tokens
                .iter()
                .filter(|token| token.role != Role::Agent)
                .count()
        } else {
            return Ok(());
        };
        if people < quorum {
            return Err(format!(
                "only {people} token(s) could approve, so no {quorum} different people ever would: lower the \
                 quorum, or name more approvers"
            ));
        }
        Ok(())
    }

    /// Whether an `approvers` entry can name anyone: `group:` and `user:` entries need an OpenID provider, and a
    /// bare name must be an approver's or an admin's among `[[auth.tokens]]`. Without tokens nobody can, since
    /// everyone is `anonymous`.
    fn check_approver(&self, name: &str) -> Result<(), String> {
        let of_provider = match auth::Approver::parse(name) {
            auth::Approver::Group(rest) => Some(("group", rest)),
            auth::Approver::User(rest) => Some(("user", rest)),
            auth::Approver::Token(_) => None,
        };
        if let Some((kind, rest)) = of_provider {
            if rest.trim().is_empty() {
                return Err(format!("{name:?} names no one: write {kind}:<name>"));
            }
            if self.auth.oidc.is_none() {
                return Err(format!(
                    "{name:?} names a {kind} of the OpenID provider, but no [auth.oidc] is configured"
                ));
            }
            return Ok(());
        }
        let tokens = &self.auth.tokens;
        if tokens.is_empty() {
            return Err(format!(
                "{name:?} names a token, but no [[auth.tokens]] are configured: without tokens everyone is {:?} and \
                 answers every approval; add the tokens, or remove approvers",
                auth::ANONYMOUS
            ));
        }
        let answering: Vec<String> = tokens
            .iter()
            .filter(|token| token.role != Role::Agent)
            .map(|token| format!("{:?}", token.name))
            .collect();
        let which = match answering.as_slice() {
            [] => "add an approver or admin token".to_owned(),
            names => format!("name one of {}", names.join(", ")),
        };
        match tokens.iter().find(|token| token.name == name) {
            None => Err(format!(
                "{name:?} is the name of no [[auth.tokens]] entry, so nobody could answer as it; {which}"
            )),
            Some(token) if token.role == Role::Agent => Err(format!(
                "{name:?} is an agent's token, and agents never answer approvals; {which}"
            )),
            Some(_) => Ok(()),
        }
    }

    /// The validated servers; the error names the offending key and the fix.
    pub fn servers(&self) -> Result<Vec<Server>, Problem> {
        self.servers_with_demo(None)
    }

    /// [`Config::servers`], with `builtin = "demo"` served by `demo_program demo-server` (unset, this
    /// executable's).
    pub fn servers_with_demo(&self, demo_program: Option<&Path>) -> Result<Vec<Server>, Problem> {
        let mut seen = std::collections::HashSet::new();
        each_entry("servers", &self.servers, |index, server| {
            let key = format!("servers[{index}]");
            if server.name.is_empty()
                || !server
                    .name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
            {
                return Err(format!(
                    "{key}.name = {:?}: a server name must be non-empty and use only letters, digits, '-', '_' and '.'",
                    server.name
                ));
            }
            if !seen.insert(server.name.as_str()) {
                return Err(format!(
                    "{key}.name = {:?}: duplicate server name; give each [[servers]] entry its own name",
                    server.name
                ));
            }
            if server.startup_timeout.is_some_and(|timeout| timeout.is_zero()) {
                return Err(format!("{key}.startup_timeout must be longer than zero"));
            }
            for root in &server.roots {
                if !Url::parse(root).is_ok_and(|url| url.scheme() == "file") {
                    return Err(format!(
                        "{key}.roots: {root:?} is not a file:// URI (e.g. \"file:///workspace\"), as MCP roots are"
                    ));
                }
            }
            Ok(Server {
                name: server.name.clone(),
                transport: server.transport(&key, demo_program)?,
                protocol: server.protocol,
                startup_timeout: server.startup_timeout.unwrap_or(DEFAULT_STARTUP_TIMEOUT),
                roots: server.roots.clone(),
                sampling: server.sampling,
                tasks: server.tasks,
            })
        })
    }
}

impl ServerConfig {
    fn expanded_args(&self, key: &str) -> Result<Vec<String>, String> {
        self.args
            .iter()
            .map(|arg| expand_env(arg).map_err(|error| format!("{key}.args: {error}")))
            .collect()
    }

    fn transport(&self, key: &str, demo_program: Option<&Path>) -> Result<Transport, String> {
        match (&self.command, &self.url, self.builtin) {
            (Some(command), None, None) => Ok(Transport::Stdio {
                command: PathBuf::from(command),
                args: self.expanded_args(key)?,
                env: self.env.clone(),
            }),
            (None, Some(url), None) => {
                check_http_url(url).map_err(|why| format!("{key}.url: {why}"))?;
                Ok(Transport::Http {
                    url: url.clone(),
                    headers: self.headers.clone(),
                })
            }
            (None, None, Some(Builtin::Demo)) => {
                let command = match demo_program {
                    Some(program) => program.to_owned(),
                    None => std::env::current_exe()
                        .map_err(|error| format!("{key}.builtin: cannot locate this executable: {error}"))?,
                };
                let mut args = vec!["demo-server".to_owned()];
                args.extend(self.expanded_args(key)?);
                Ok(Transport::Stdio {
                    command,
                    args,
                    env: self.env.clone(),
                })
            }
            (None, None, None) => Err(format!(
                "{key} ({:?}) has neither `command`, `url` nor `builtin`: set `command` for a stdio server, `url` for a streamable-HTTP server, or `builtin = \"demo\"`",
                self.name
            )),
            _ => Err(format!(
                "{key} ({:?}) sets more than one of `command`, `url` and `builtin`: keep exactly one",
                self.name
            )),
        }
    }
}

/// Whether `url` can reach a streamable-HTTP server; the reason does not quote it.
fn check_http_url(url: &str) -> Result<(), String> {
    if url.starts_with("http://") || url.starts_with("https://") {
        Ok(())
    } else {
        Err("the URL must start with http:// or https://".to_owned())
    }
}

/// Whether `replica` is a replica's name; the reason does not quote it.
fn check_replica(replica: &str) -> Result<(), String> {
    let fits = (1..=64).contains(&replica.len())
        && replica
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || b"._-".contains(&byte));
    if fits {
        Ok(())
    } else {
        Err("1 to 64 letters, digits, '.', '_' or '-'".to_owned())
    }
}

/// What a `log.level` that is no log filter is told.
const NOT_A_LOG_FILTER: &str = "not a log filter like \"info\" or \"warn,toolnexus_gateway=debug\"";

/// Whether `level` is a log filter; the parser's reason, which may quote part of it.
fn check_log_filter(level: &str) -> Result<(), String> {
    tracing_subscriber::EnvFilter::try_new(level)
        .map(drop)
        .map_err(|error| error.to_string())
}

/// Whether `origin` is one a browser sends: `scheme://host[:port]`, nothing after it, and no wildcard.
fn check_origin(origin: &str) -> Result<(), &'static str> {
    if origin.contains('*') {
        return Err("is a wildcard; name each origin whose pages may call the API");
    }
    let Some((scheme, authority)) = origin.split_once("://") else {
        return Err("is not an origin like \"https://app.example.com\"");
    };
    if !(scheme == "http" || scheme == "https") {
        return Err("must start with http:// or https://");
    }
    if authority.is_empty()
        || authority.contains(['/', '?', '#', '@'])
        || authority.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return Err("must be scheme://host[:port] with nothing after it, as browsers send it");
    }
    Ok(())
}

/// Checks each entry of the array of tables `table` with `check`; a problem names the entry it is in.
fn each_entry<'a, T, U: 'a>(
    table: &'static str,
    entries: impl IntoIterator<Item = &'a U>,
    mut check: impl FnMut(usize, &'a U) -> Result<T, String>,
) -> Result<Vec<T>, Problem> {
    entries
        .into_iter()
        .enumerate()
        .map(|(index, entry)| check(index, entry).map_err(|message| Problem::in_entry(table, index, message)))
        .collect()
}

/// Expands `${VAR}` from the environment; `$${` is a literal `${`.
pub fn expand_env(text: &str) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        if rest[..start].ends_with('$') {
            out.push_str(&rest[..start - 1]);
            out.push_str("${");
            rest = &rest[start + 2..];
            continue;
        }
        out.push_str(&rest[..start]);
        let end = rest[start..]
            .find('}')
            .ok_or_else(|| format!("unterminated `${{` in {text:?}"))?;
        let name = &rest[start + 2..start + end];
        let value = std::env::var(name)
            .map_err(|_| format!("environment variable {name} is not set (referenced as ${{{name}}})"))?;
        out.push_str(&value);
        rest = &rest[start + end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The `${VAR}`s that `text` expands, as written there.
fn references(text: &str) -> Vec<&str> {
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        if rest[..start].ends_with('$') {
            rest = &rest[start + 2..];
            continue;
        }
        let Some(end) = rest[start..].find('}') else {
            break;
        };
        found.push(&rest[start..=start + end]);
        rest = &rest[start + end + 1..];
    }
    found
}

/// How an error names a value written as `written`: quoted (by `quote`), or, when `${VAR}`s expand into it, by
/// those variables alone: what they hold may be a secret, and errors reach terminals and CI logs.
fn named(written: &str, quote: fn(&str) -> String) -> String {
    let references = references(written);
    if references.is_empty() {
        format!("{:?}", quote(written))
    } else {
        format!("the value of {}", references.join(" and "))
    }
}

/// A string with `${VAR}` expanded; an error carries the key and line of the value.
fn expanded<'de, D: Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    expand_env(&String::deserialize(deserializer)?).map_err(serde::de::Error::custom)
}

/// A string with `${VAR}` expanded that `check` accepts; the error names the value as [`named`] does (quoted
/// by `quote`), with `check`'s reason, which never quotes it.
fn expanded_checked<'de, D: Deserializer<'de>>(
    deserializer: D,
    check: fn(&str) -> Result<(), String>,
    quote: fn(&str) -> String,
) -> Result<String, D::Error> {
    let written = String::deserialize(deserializer)?;
    let text = expand_env(&written).map_err(serde::de::Error::custom)?;
    check(&text).map_err(|why| serde::de::Error::custom(format!("{}: {why}", named(&written, quote))))?;
    Ok(text)
}

fn server_url<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<String>, D::Error> {
    expanded_checked(deserializer, check_http_url, redact::url).map(Some)
}

fn store_url<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<String>, D::Error> {
    expanded_checked(deserializer, |url| Location::parse(url).map(drop), redact::url).map(Some)
}

fn replica_name<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<String>, D::Error> {
    expanded_checked(deserializer, check_replica, str::to_owned).map(Some)
}

fn expanded_list<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<String>, D::Error> {
    let written = Vec::<String>::deserialize(deserializer)?;
    written
        .iter()
        .map(|text| expand_env(text).map_err(serde::de::Error::custom))
        .collect()
}

fn expanded_option<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<String>, D::Error> {
    Option::<String>::deserialize(deserializer)?
        .map(|text| expand_env(&text))
        .transpose()
        .map_err(serde::de::Error::custom)
}

fn expanded_map<'de, D: Deserializer<'de>>(deserializer: D) -> Result<BTreeMap<String, String>, D::Error> {
    BTreeMap::<String, String>::deserialize(deserializer)?
        .into_iter()
        .map(|(name, text)| Ok((name, expand_env(&text)?)))
        .collect::<Result<_, String>>()
        .map_err(serde::de::Error::custom)
}

/// A log filter with `${VAR}` expanded.
fn log_filter<'de, D: Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    let written = String::deserialize(deserializer)?;
    let level = expand_env(&written).map_err(serde::de::Error::custom)?;
    check_log_filter(&level)
        .map_err(|error| serde::de::Error::custom(refusal(&written, &format!(": {NOT_A_LOG_FILTER}"), error)))?;
    Ok(level)
}

/// An error about the value written as `written`: named as [`named`] does, then `rule`, then `detail` (a parser's
/// reason, which may quote the value) only when no `${VAR}` expanded into it.
fn refusal(written: &str, rule: &str, detail: impl std::fmt::Display) -> String {
    let named = named(written, str::to_owned);
    if references(written).is_empty() {
        format!("{named}{rule}: {detail}")
    } else {
        format!("{named}{rule}")
    }
}

/// An address to listen on, after `${VAR}` expansion.
fn socket_address<'de, D: Deserializer<'de>>(deserializer: D) -> Result<SocketAddr, D::Error> {
    let written = String::deserialize(deserializer)?;
    let text = expand_env(&written).map_err(serde::de::Error::custom)?;
    text.parse().map_err(|error| {
        serde::de::Error::custom(refusal(&written, " is not an address like \"127.0.0.1:8080\"", error))
    })
}

fn duration<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    let written = String::deserialize(deserializer)?;
    let text = expand_env(&written).map_err(serde::de::Error::custom)?;
    humantime::parse_duration(&text).map_err(|error| {
        serde::de::Error::custom(refusal(&written, " is not a duration like \"10m\" or \"90s\"", error))
    })
}

fn optional_duration<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Duration>, D::Error> {
    duration(deserializer).map(Some)
}

/// Writes a duration as `check-config` shows it, such as `30s` or `1h 30m`.
fn as_humantime<S: Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_str(&shown(*duration))
}

/// A duration as `check-config` and errors show it, such as `30s`, `1h 30m` or `90days`: in days past a
/// month, rather than in humantime's months and years, which are averages (`2months 29days 2h 52m 48s`).
fn shown(duration: Duration) -> String {
    const DAY: u64 = 24 * 3600;
    let days = duration.as_secs() / DAY;
    if days < 30 {
        return humantime::format_duration(duration).to_string();
    }
    let rest = duration - Duration::from_secs(days * DAY);
    if rest.is_zero() {
        format!("{days}days")
    } else {
        format!("{days}days {}", humantime::format_duration(rest))
    }
}

fn as_optional_humantime<S: Serializer>(duration: &Option<Duration>, serializer: S) -> Result<S::Ok, S::Error> {
    match duration {
        Some(duration) => as_humantime(duration, serializer),
        None => serializer.serialize_none(),
    }
}

/// What a secret shows as.
const MASK: &str = "***";

fn masked<S: Serializer>(secret: &Option<String>, serializer: S) -> Result<S::Ok, S::Error> {
    match secret {
        Some(_) => serializer.serialize_str(MASK),
        None => serializer.serialize_none(),
    }
}

fn masked_string<S: Serializer>(_: &str, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(MASK)
}

fn masked_list<S: Serializer>(secrets: &[String], serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_seq(secrets.iter().map(|_| MASK))
}

/// A map whose keys are shown and whose values are masked (headers, environment variables).
fn masked_values<S: Serializer>(map: &BTreeMap<String, String>, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_map(map.keys().map(|key| (key, MASK)))
}

/// A URL with its user information and query values masked.
fn redacted_url<S: Serializer>(url: &str, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&redact::url(url))
}

fn redacted_optional_url<S: Serializer>(url: &Option<String>, serializer: S) -> Result<S::Ok, S::Error> {
    match url {
        Some(url) => redacted_url(url, serializer),
        None => serializer.serialize_none(),
    }
}

fn default_max_pending() -> usize {
    10_000
}

fn default_long_polls_per_principal() -> usize {
    100
}

fn default_streams_per_principal() -> usize {
    32
}

fn default_mcp_sessions_per_principal() -> usize {
    16
}

fn default_max_request_bytes() -> usize {
    64 * 1024
}

fn default_max_pending_bytes() -> usize {
    64 * 1024 * 1024
}

fn default_calls_per_principal() -> usize {
    64
}

fn default_sessions_per_principal() -> usize {
    16
}

fn default_max_body_bytes() -> usize {
    1024 * 1024
}

fn default_max_hold() -> Duration {
    Duration::from_secs(50)
}

fn default_header_timeout() -> Duration {
    Duration::from_secs(10)
}

fn default_body_timeout() -> Duration {
    Duration::from_secs(30)
}

fn default_webhook_timeout() -> Duration {
    Duration::from_secs(5)
}

fn default_webhook_attempts() -> u32 {
    5
}

fn default_log_level() -> String {
    "info".to_owned()
}

fn default_workers() -> usize {
    1
}

fn worker_count<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<usize, D::Error> {
    let workers = usize::deserialize(deserializer)?;
    if (1..=MAX_WORKERS).contains(&workers) {
        Ok(workers)
    } else {
        Err(serde::de::Error::custom(format!(
            "workers must be between 1 and {MAX_WORKERS}, not {workers}"
        )))
    }
}

fn default_listen() -> SocketAddr {
    DEFAULT_LISTEN.parse().expect("the default listen address parses")
}

fn default_ttl() -> Duration {
    Duration::from_secs(600)
}

/// How long ended records stay readable in a SQLite store unless `requests.retention` says otherwise.
pub const DURABLE_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);
/// How long ended records stay readable in memory unless `requests.retention` says otherwise.
pub const MEMORY_RETENTION: Duration = Duration::from_secs(3600);
/// How long events stay in the log unless `audit.retention` (or a longer `requests.retention`) says otherwise.
pub const AUDIT_RETENTION: Duration = Duration::from_secs(90 * 24 * 3600);

/// `toolnexus-gateway/gateway.sqlite3` in `$XDG_STATE_HOME`, else in `~/.local/state`, else in the working
/// directory.
fn default_store_path() -> PathBuf {
    let state = std::env::var_os("XDG_STATE_HOME")
        .filter(|dir| !dir.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|dir| !dir.is_empty())
                .map(|home| PathBuf::from(home).join(".local/state"))
        });
    match state {
        Some(state) => state.join("toolnexus-gateway/gateway.sqlite3"),
        None => PathBuf::from("toolnexus-gateway.sqlite3"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, String> {
        let config: Config = toml::from_str(text).map_err(|e| e.to_string())?;
        config.validate().map_err(|problem| problem.message)?;
        Ok(config)
    }

    #[test]
    fn the_printed_config_is_a_config_that_prints_the_same() {
        let text = "replica = \"r1\"\n[requests]\nttl = \"5m\"\n\
            [[servers]]\nname = \"remote\"\nurl = \"https://ada:pw@mcp.example.com/mcp?key=k\"\n\
            headers = { Authorization = \"Bearer x\" }\n\
            [[servers]]\nname = \"demo\"\nbuiltin = \"demo\"\nargs = [\"--seal-state\"]\nenv = { A = \"a\" }\n\
            [[webhooks]]\nurl = \"http://127.0.0.1:9/hook?token=t\"\nsecret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\n\
            [[approvals]]\nserver = \"demo\"\ntools = [\"confirm_*\"]\nttl = \"1h\"\n\
            [limits]\ncall_timeout = \"2m\"\n[http]\nallowed_hosts = [\"gw.example.com\"]\nmax_connections = 10\n\
            [front_door]\nprefix = \"when-needed\"\n[store]\nurl = \"memory\"\n";
        let printed = parse(text).unwrap().masked_toml().unwrap();
        // Every key printed is one the file may set (unknown keys are refused), with the defaults written in.
        let reread: Config = toml::from_str(&printed).unwrap_or_else(|error| panic!("{error}\n{printed}"));
        assert_eq!(reread.masked_toml().unwrap(), printed);
        for shown in [
            "ttl = \"5m\"",
            "retention = \"1h\"",
            "call_timeout = \"2m\"",
            "max_connections = 10",
            "prefix = \"when-needed\"",
            "startup_timeout = \"30s\"",
            "name = \"webhook-1\"",
            "prompt = \"Allow {tool} on {server}?\"",
            "Authorization = \"***\"",
            "A = \"***\"",
            "secret = \"***\"",
        ] {
            assert!(printed.contains(shown), "{shown} missing from\n{printed}");
        }
        for secret in [
            "Bearer x",
            "pw",
            "key=k",
            "token=t",
            "= \"a\"",
            "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        ] {
            assert!(!printed.contains(secret), "{secret} shown in\n{printed}");
        }
    }

    #[test]
    fn builtin_default_serves_the_demo_on_loopback() {
        let config = Config::builtin();
        assert_eq!(config.listen.to_string(), "127.0.0.1:8080");
        let servers = config.servers().unwrap();
        assert_eq!(servers[0].name, "demo");
        assert!(matches!(&servers[0].transport, Transport::Stdio { args, .. } if args == &["demo-server"]));
    }

    #[test]
    fn the_audit_trail_outlives_the_records_it_tells_the_history_of() {
        let default = parse("").unwrap();
        assert_eq!(default.audit_retention(), AUDIT_RETENTION);
        let long = parse("[requests]\nretention = \"180d\"\n").unwrap();
        assert_eq!(long.audit_retention(), Duration::from_secs(180 * 24 * 3600));
        let set = parse("[requests]\nretention = \"1h\"\n[audit]\nretention = \"2h\"\n").unwrap();
        assert_eq!(set.audit_retention(), Duration::from_secs(7200));
        let error = parse("[audit]\nretention = \"1d\"\n").unwrap_err();
        assert!(
            error.contains("audit.retention = \"1day\" is shorter than requests.retention (\"7days\")"),
            "{error}"
        );
        let printed = default.masked_toml().unwrap();
        assert!(printed.contains("[audit]\nretention = \"90days\""), "{printed}");
        assert_eq!(shown(Duration::from_secs(400 * 24 * 3600 + 90)), "400days 1m 30s");
        let again = parse("[audit]\nretention = \"400days 1m 30s\"\n").unwrap();
        assert_eq!(
            again.audit_retention(),
            Duration::from_secs(400 * 24 * 3600 + 90),
            "what is shown parses back"
        );
    }

    #[test]
    fn the_documented_example_parses() {
        let config = parse(
            r#"
            listen = "127.0.0.1:9000"
            [requests]
            ttl = "90s"
            apply_defaults = false
            retention = "2h"
            [[servers]]
            name = "files"
            command = "npx"
            args = ["-y", "server"]
            env = { LOG_LEVEL = "info" }
            [[servers]]
            name = "remote"
            url = "https://mcp.example.com/mcp"
            headers = { "X-Team" = "a" }
            protocol = "2026-07-28"
            "#,
        )
        .unwrap();
        assert_eq!(config.requests.ttl, Duration::from_secs(90));
        assert!(!config.requests.apply_defaults);
        assert_eq!(config.retention(), Duration::from_secs(7200));
        let servers = config.servers().unwrap();
        assert_eq!(servers[1].protocol, ProtocolChoice::Modern);
        assert_eq!(servers[1].transport.kind(), "http");
    }

    #[test]
    fn each_principal_gets_a_quarter_of_the_pending_cap_and_without_tokens_all_of_it() {
        let open = parse("[requests]\nmax_pending = 100\nmax_pending_bytes = 1000\n").unwrap();
        let caps = open.pending_caps();
        assert_eq!((caps.per_principal, caps.bytes_per_principal), (100, 1000));
        let digest = "0".repeat(64);
        let with_tokens = parse(&format!(
            "[requests]\nmax_pending = 100\nmax_pending_bytes = 1000\n\
             [[auth.tokens]]\nname = \"a\"\nrole = \"agent\"\nsha256 = \"{digest}\"\n"
        ))
        .unwrap();
        let caps = with_tokens.pending_caps();
        assert_eq!((caps.per_principal, caps.bytes_per_principal), (25, 250));
    }

    #[test]
    fn unknown_keys_are_named() {
        let error = parse("listen = \"127.0.0.1:1\"\nlisten_port = 1\n").unwrap_err();
        assert!(error.contains("listen_port"), "{error}");
    }

    #[test]
    fn a_server_without_a_transport_says_how_to_fix_it() {
        let error = parse("[[servers]]\nname = \"x\"\n").unwrap_err();
        assert!(error.contains("servers[0]") && error.contains("`command`"), "{error}");
    }

    #[test]
    fn validation_errors_name_the_line_of_the_entry() {
        // The line is the parser's, however the entry is written.
        for (text, line) in [
            (
                "listen = \"127.0.0.1:1\"\n\n[[servers]]\nname = \"a\"\nbuiltin = \"demo\"\n\n[[servers]]\nname = \"b\"\n",
                7,
            ),
            (
                "[[auth.tokens]]\nname = \"a\"\nrole = \"admin\"\nenv = \"TOOLNEXUS_SURELY_UNSET\"\n",
                1,
            ),
            (
                "servers = [\n  {name = \"a\", builtin = \"demo\"},\n  {name = \"b\"},\n]\n",
                3,
            ),
        ] {
            let problem = toml::from_str::<Config>(text).unwrap().validate().unwrap_err();
            assert_eq!(
                problem.entry.and_then(|entry| entry.line_in(text)),
                Some(line),
                "{text}: {problem}"
            );
        }
    }

    #[test]
    fn duplicate_names_are_rejected() {
        let error =
            parse("[[servers]]\nname = \"a\"\nbuiltin = \"demo\"\n[[servers]]\nname = \"a\"\nbuiltin = \"demo\"\n")
                .unwrap_err();
        assert!(
            error.contains("servers[1].name") && error.contains("duplicate"),
            "{error}"
        );
    }

    #[test]
    fn servers_whose_tools_would_share_a_prefix_are_rejected() {
        let error =
            parse("[[servers]]\nname = \"a.b\"\nbuiltin = \"demo\"\n[[servers]]\nname = \"a_b\"\nbuiltin = \"demo\"\n")
                .unwrap_err();
        assert!(
            error.contains("servers[1].name") && error.contains("a_b__") && error.contains("\"a.b\""),
            "{error}"
        );
    }

    #[test]
    fn front_door_settings_parse_and_are_checked() {
        let config =
            parse("[front_door]\nprefix = \"when-needed\"\nmax_hold = \"20s\"\nelicitation = \"relay\"\n").unwrap();
        assert_eq!(config.front_door.prefix, Prefix::WhenNeeded);
        assert_eq!(config.front_door.elicitation, Elicitations::Relay);
        assert_eq!(Config::builtin().front_door.elicitation, Elicitations::Rest);
        assert_eq!(config.front_door.max_hold, Duration::from_secs(20));
        assert_eq!(Config::builtin().front_door.max_hold, Duration::from_secs(50));
        assert!(parse("[front_door]\nprefix = \"never\"\n").is_err());
        assert!(
            parse("[front_door]\nmax_hold = \"0s\"\n")
                .unwrap_err()
                .contains("max_hold")
        );
    }

    #[test]
    fn bad_durations_and_protocols_are_rejected() {
        assert!(parse("[requests]\nttl = \"soon\"\n").unwrap_err().contains("soon"));
        assert!(parse("[[servers]]\nname = \"a\"\nbuiltin = \"demo\"\nprotocol = \"2024\"\n").is_err());
        assert!(parse("[[servers]]\nname = \"a\"\nbuiltin = \"demo\"\nstartup_timeout = \"0s\"\n").is_err());
    }

    #[test]
    fn startup_timeout_defaults_to_thirty_seconds() {
        let config = parse("[[servers]]\nname = \"a\"\nbuiltin = \"demo\"\n[[servers]]\nname = \"b\"\nbuiltin = \"demo\"\nstartup_timeout = \"1s\"\n").unwrap();
        let servers = config.servers().unwrap();
        assert_eq!(servers[0].startup_timeout, DEFAULT_STARTUP_TIMEOUT);
        assert_eq!(servers[1].startup_timeout, Duration::from_secs(1));
    }

    #[test]
    fn approvals_are_validated_and_printed() {
        let demo = format!(
            "[[servers]]\nname = \"demo\"\nbuiltin = \"demo\"\n\
             [[auth.tokens]]\nname = \"on-call\"\nrole = \"approver\"\nsha256 = \"{}\"\n",
            "0".repeat(64)
        );
        let config = parse(&format!(
            "{demo}[[approvals]]\nserver = \"demo\"\ntools = [\"confirm_*\", \"echo\"]\nttl = \"30m\"\n\
             approvers = [\"on-call\"]\n[[approvals]]\nserver = \"*\"\ntools = [\"*\"]\nprompt = \"{{tool}}?\"\n"
        ))
        .unwrap();
        let policies = config.approvals().unwrap();
        assert_eq!(policies.len(), 2);
        assert_eq!(policies[0].prompt, crate::approvals::DEFAULT_PROMPT);
        assert_eq!(policies[0].ttl, Some(Duration::from_secs(1800)));
        assert!(policies[0].applies("demo", "confirm_action") && !policies[0].applies("demo", "add"));
        assert!(policies[1].applies("other", "add"));
        let printed = config.masked_toml().unwrap();
        assert!(printed.contains("[[approvals]]") && printed.contains("confirm_*") && printed.contains("30m"));
        for (entry, named) in [
            ("server = \"nope\"\ntools = [\"*\"]", "approvals[0].server"),
            ("server = \"demo\"\ntools = []", "approvals[0].tools"),
            ("server = \"demo\"\ntools = [\"a b\"]", "approvals[0].tools"),
            ("server = \"demo\"\ntools = [\"*\"]\nttl = \"0s\"", "approvals[0].ttl"),
            (
                "server = \"demo\"\ntools = [\"*\"]\napprovers = [\"on-cal\"]",
                "approvals[0].approvers",
            ),
        ] {
            let error = parse(&format!("{demo}[[approvals]]\n{entry}\n")).unwrap_err();
            assert!(error.starts_with(named), "{entry}: {error}");
        }
        assert!(
            parse(&format!(
                "{demo}[[approvals]]\nserver = \"demo\"\ntools = [\"*\"]\nwho = 1\n"
            ))
            .is_err()
        );
    }

    #[test]
    fn a_server_s_roots_are_file_uris() {
        let server = |roots: &str| format!("[[servers]]\nname = \"s\"\ncommand = \"true\"\nroots = [{roots}]\n");
        let config = parse(&server("\"file:///workspace\"")).unwrap();
        assert_eq!(config.servers().unwrap()[0].roots, ["file:///workspace"]);
        for root in ["\"/workspace\"", "\"https://example.com/x\""] {
            let error = parse(&server(root)).unwrap_err();
            assert!(
                error.contains("servers[0].roots") && error.contains("is not a file:// URI"),
                "{error}"
            );
        }
    }

    #[test]
    fn an_openid_provider_must_be_reached_safely_and_map_some_group() {
        let oidc =
            |issuer: &str, roles: &str| format!("[auth.oidc]\nissuer = \"{issuer}\"\naudience = \"gw\"\n{roles}");
        let roles = "roles = { approver = [\"sre\"] }\n";
        for issuer in [
            "https://idp.example.com/realms/acme",
            "http://127.0.0.1:8080",
            "http://[::1]:9",
            "http://localhost",
        ] {
            let config = parse(&oidc(issuer, roles)).unwrap_or_else(|error| panic!("{issuer}: {error}"));
            assert!(config.authenticates(), "{issuer}");
        }
        for (text, wanted) in [
            (oidc("http://idp.example.com", roles), "must be an https:// URL"),
            (oidc("idp.example.com", roles), "is not a URL"),
            (oidc("https://idp.example.com", ""), "maps no group to a role"),
            (
                format!(
                    "{}{}",
                    oidc("https://idp.example.com", roles),
                    "[[auth.tokens]]\nname = \"https://idp.example.com#x\"\nrole = \"agent\"\nsha256 = \"{}\"\n"
                        .replace("{}", &"0".repeat(64))
                ),
                "has the form of an OpenID subject's identity",
            ),
            (
                format!("{}ui_client_id = \"\"\n", oidc("https://idp.example.com", roles)),
                "must not be empty",
            ),
        ] {
            let error = parse(&text).unwrap_err();
            assert!(error.contains(wanted), "{text}\n{error}");
        }
    }

    #[test]
    fn approvers_must_be_tokens_that_answer_approvals() {
        let token = |name: &str, role: &str| {
            format!(
                "[[auth.tokens]]\nname = \"{name}\"\nrole = \"{role}\"\nsha256 = \"{}\"\n",
                "0".repeat(64)
            )
        };
        let policy = |approvers: &str| {
            format!("[[approvals]]\nserver = \"*\"\ntools = [\"confirm_*\"]\napprovers = [{approvers}]\n")
        };
        let tokens = format!(
            "{}{}{}",
            token("bot", "agent"),
            token("on-call", "approver"),
            token("root", "admin")
        );
        assert!(parse(&format!("{tokens}{}", policy("\"on-call\", \"root\""))).is_ok());
        for (text, wanted) in [
            (
                format!("{tokens}{}", policy("\"on-call\", \"on-cal\"")),
                "approvals[0].approvers (server \"*\"): \"on-cal\" is the name of no [[auth.tokens]] entry, so nobody \
                 could answer as it; name one of \"on-call\", \"root\"",
            ),
            (
                format!("{tokens}{}", policy("\"bot\"")),
                "approvals[0].approvers (server \"*\"): \"bot\" is an agent's token, and agents never answer approvals",
            ),
            (
                format!("{}{}", token("bot", "agent"), policy("\"bot\"")),
                "agents never answer approvals; add an approver or admin token",
            ),
            (
                policy("\"on-call\""),
                "approvals[0].approvers (server \"*\"): \"on-call\" names a token, but no [[auth.tokens]] are \
                 configured",
            ),
            (
                format!("{tokens}{}", policy("\"group:sre\"")),
                "\"group:sre\" names a group of the OpenID provider, but no [auth.oidc] is configured",
            ),
            (
                format!("{tokens}{}", policy("\"user:\"")),
                "\"user:\" names no one: write user:<name>",
            ),
            (
                format!("{tokens}{}quorum = 2\n", policy("\"on-call\"")),
                "approvals[0].quorum = 2 (server \"*\"): only 1 token(s) could approve",
            ),
            (format!("{}quorum = 2\n", policy("")), "no 2 could approve"),
            (
                format!("{tokens}{}quorum = 0\n", policy("")),
                "a quorum must be at least 1",
            ),
            (
                format!("{tokens}{}quorum = 2\neditable = true\n", policy("")),
                "approvals[0]: editable with quorum = 2",
            ),
            (
                format!("{tokens}{}quorum = 2\ngrants = [\"1h\"]\n", policy("")),
                "approvals[0]: grants with quorum = 2",
            ),
            (
                format!("{tokens}{}grants = [\"forever\"]\n", policy("")),
                "approvals[0].grants: \"forever\" is neither \"session\" nor a duration",
            ),
        ] {
            let error = parse(&text).unwrap_err();
            assert!(error.contains(wanted), "{text}\n{error}");
        }
        assert!(
            parse(&policy("")).is_ok(),
            "no approvers: any approver or admin, or anyone without tokens"
        );
    }

    #[test]
    fn an_error_names_the_variables_a_value_came_from_and_never_what_they_hold() {
        let path = std::env::var("PATH").unwrap();
        assert!(
            path.len() > 3 && path.contains('/'),
            "the test needs a PATH with a '/': {path:?}"
        );
        for text in [
            "[[servers]]\nname = \"r\"\nurl = \"${PATH}\"\n",
            "[store]\nurl = \"${PATH}\"\n",
            "replica = \"${PATH}\"\n",
            "[log]\nlevel = \"${PATH}=x=y\"\n",
            "listen = \"${PATH}\"\n",
            "[requests]\nttl = \"${PATH}\"\n",
            "[[servers]]\nname = \"r\"\nbuiltin = \"demo\"\nstartup_timeout = \"1${PATH}\"\n",
        ] {
            let error = toml::from_str::<Config>(text).unwrap_err().to_string();
            assert!(error.contains("the value of ${PATH}"), "{text}\n{error}");
            assert!(!error.contains(&path), "{text}\n{error}");
        }
        assert_eq!(references("a ${A} $${B} ${C}x ${D"), ["${A}", "${C}"]);
        let literal = toml::from_str::<Config>("[requests]\nttl = \"soon\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            literal.contains("\"soon\" is not a duration") && literal.contains("expected number"),
            "{literal}"
        );
    }

    #[test]
    fn values_set_outside_the_file_are_not_quoted_in_errors_either() {
        let secret = "hunter2-in-the-environment";
        let mut store = Config::builtin();
        store.store.url = Some(format!("host=db password={secret}"));
        let mut server = Config::builtin();
        server.servers[0] = ServerConfig {
            name: "remote".to_owned(),
            url: Some(format!("mcp.example.com/?key={secret}")),
            ..ServerConfig::default()
        };
        let mut replica = Config::builtin();
        replica.replica = Some(format!("{secret}!"));
        let mut level = Config::builtin();
        level.log.level = format!("{secret}=x=y");
        for (config, key) in [
            (store, "store.url"),
            (server, "servers[0].url"),
            (replica, "replica"),
            (level, "log.level"),
        ] {
            let error = config.validate().unwrap_err().message;
            assert!(error.starts_with(key) && !error.contains(secret), "{error}");
        }
    }

    #[test]
    fn links_sign_in_needs_a_provider_with_the_inbox_s_client() {
        let error = parse("[links]\nsign_in = true\n").unwrap_err();
        assert!(error.contains("ui_client_id"), "{error}");
        let keys = parse("[links]\nkeys = [\"s3cr3t\"]\n").unwrap_err();
        assert!(keys.contains("links.keys[0]") && !keys.contains("s3cr3t"), "{keys}");
        for public in [
            "ftp://gateway",
            "https://gateway.example.com/gw",
            "https://gateway.example.com/?a=1",
        ] {
            let error = parse(&format!("public_url = \"{public}\"\n")).unwrap_err();
            assert!(error.contains("public_url"), "{error}");
        }
        assert!(parse("public_url = \"https://gateway.example.com/\"\n").is_ok());
    }

    #[test]
    fn notification_channels_are_validated() {
        let mail = "[[notify]]\nname = \"sre-mail\"\nemail = { to = [\"sre@example.com\"], from = \"gateway@example.com\", \
                    smtp = \"smtp://mail.example.com\", username = \"u\", password = \"p4ss\" }\n";
        let config = parse(mail).unwrap();
        let channels = config.notify().unwrap();
        let crate::notify::Destination::Email(email) = &channels[0].destination else {
            panic!()
        };
        assert_eq!((email.host.as_str(), email.port), ("mail.example.com", 587));
        assert_eq!(email.security, crate::notify::Security::StartTls);
        let printed = config.masked_toml().unwrap();
        assert!(
            !printed.contains("p4ss") && printed.contains("sre@example.com"),
            "{printed}"
        );
        let smtps = parse(&mail.replace("smtp://mail", "smtps://mail"))
            .unwrap()
            .notify()
            .unwrap();
        let crate::notify::Destination::Email(email) = &smtps[0].destination else {
            panic!()
        };
        assert_eq!((email.port, email.security), (465, crate::notify::Security::Tls));
        let escalating = "[[servers]]\nname = \"demo\"\nbuiltin = \"demo\"\n[[approvals]]\nserver = \"demo\"\n\
                          tools = [\"*\"]\nescalate = [{ after = \"5m\", notify = [";
        let slack =
            "[[notify]]\nname = \"chat\"\nslack = { webhook = \"https://hooks.slack.com/services/T/B/s3cr3t\" }\n";
        assert!(parse(&format!("{slack}{escalating}\"chat\"] }}]\n")).is_ok());
        let printed = parse(slack).unwrap().masked_toml().unwrap();
        assert!(!printed.contains("s3cr3t"), "{printed}");
        for (broken, named) in [
            (mail.replace("smtp://mail.example.com", "http://mail"), "email.smtp"),
            (mail.replace("sre@example.com", "not an address"), "email.to"),
            (mail.replace(", password = \"p4ss\"", ""), "both username and password"),
            (mail.replace("sre-mail", "sre mail"), "name"),
            (
                format!(
                    "{mail}{}",
                    mail.replace("email = {", "slack = { webhook = \"http://x\" }\n#")
                ),
                "another",
            ),
            (format!("{slack}teams = {{ webhook = \"http://x\" }}\n"), "exactly one"),
            (
                slack.replace("https://hooks.slack.com", "http://169.254.169.254"),
                "link-local",
            ),
            (format!("{slack}requests = {{ servers = [\"nowhere\"] }}\n"), "nowhere"),
            (
                format!("{slack}{escalating}\"mail\"] }}]\n"),
                "no [[notify]] channel is named \"mail\"",
            ),
            (format!("{slack}{escalating}] }}]\n"), "at least one"),
            (
                format!("{slack}{escalating}\"chat\"] }}]\nttl = \"5m\"\n"),
                "shorter than the approval's ttl",
            ),
            (
                mail.replace("[\"sre@example.com\"]", "[\"a@x.org\", \"A <a@x.org>\"]"),
                "listed twice",
            ),
            (
                "[[webhooks]]\nname = \"notify:x\"\nurl = \"http://x\"\n".to_owned(),
                "notification channels'",
            ),
            (
                "[[webhooks]]\nname = \"audit:chain\"\nurl = \"http://x\"\n".to_owned(),
                "audit trail's",
            ),
        ] {
            let error = parse(&broken).unwrap_err();
            assert!(error.contains(named), "{named}: {error}");
        }
    }

    #[test]
    fn webhooks_are_validated() {
        let config =
            parse("[[webhooks]]\nurl = \"http://127.0.0.1:9/hook\"\nevents = [\"request.created\"]\n").unwrap();
        let hooks = config.webhooks().unwrap();
        assert_eq!((hooks[0].name.as_str(), hooks[0].attempts), ("webhook-1", 5));
        assert_eq!(hooks[0].events, [EventKind::RequestCreated]);
        assert!(parse("[[webhooks]]\nurl = \"http://x\"\nevents = [\"request.made\"]\n").is_err());
        assert!(
            parse("[[webhooks]]\nurl = \"ftp://x\"\n")
                .unwrap_err()
                .contains("webhooks[0].url")
        );
        assert!(
            parse("[[webhooks]]\nurl = \"http://x\"\nattempts = 0\n")
                .unwrap_err()
                .contains("attempts")
        );
    }

    #[test]
    fn webhooks_to_link_local_or_metadata_addresses_need_allow_link_local() {
        let text = "[[webhooks]]\nname = \"meta\"\nurl = \"http://[fe80::1]:8080/hook\"\n";
        let error = parse(text).unwrap_err();
        assert!(
            error.starts_with("webhooks[0].url of webhook \"meta\": fe80::1 is a link-local address")
                && error.contains("allow_link_local = true"),
            "{error}"
        );
        let allowed = parse(&format!("{text}allow_link_local = true\n")).unwrap();
        assert!(allowed.webhooks().unwrap()[0].allow_link_local);
    }

    #[test]
    fn env_references_expand_and_missing_ones_are_named() {
        assert_eq!(
            expand_env("Bearer ${PATH}").unwrap(),
            format!("Bearer {}", std::env::var("PATH").unwrap())
        );
        assert_eq!(expand_env("a $${PATH} b").unwrap(), "a ${PATH} b");
        let error = parse(
            "[[servers]]\nname = \"r\"\nurl = \"http://x\"\nheaders = { A = \"${TOOLNEXUS_SURELY_UNSET_VAR}\" }\n",
        )
        .unwrap_err();
        assert!(
            error.contains("TOOLNEXUS_SURELY_UNSET_VAR") && error.contains("line 4"),
            "{error}"
        );
        let listen = parse("listen = \"${TOOLNEXUS_TEST_LISTEN_UNSET}\"\n").unwrap_err();
        assert!(listen.contains("line 1"), "{listen}");
    }
}
