//! Notification channels: people are told of new Requests where they are (mail, Slack, Teams), with signed
//! links that answer them, and told again once a Request resolves, who answered it. Messages go through the
//! event log like webhooks do ([`crate::outbox`]): at least once, retried with back-off, across restarts, once
//! per fleet. A mail channel is one receiver per recipient, so that each gets links that answer as them and a
//! recipient whose server refuses holds up only their own messages.

mod message;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use lettre::message::Mailbox;
use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::{Tls, TlsParameters};
use lettre::{AsyncSmtpTransport, AsyncTransport, Tokio1Executor};
use reqwest::Url;
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::approvals::{Approvals, Escalation};
use crate::egress::{self, GuardedResolver};
use crate::feed::Feed;
use crate::links::{Holder, Link, Links};
use crate::metrics::{Metric, Metrics};
use crate::outbox::{self, Delivered, Receiver};
use crate::records::{Event, EventKind, Status};
use crate::store::Store;
use crate::time::Timestamp;
use crate::webhooks;

pub use message::Notice;

/// What the keys of channels' cursors and leases start with (webhooks may not take it).
pub const KEY_PREFIX: &str = "notify:";

/// A validated `[[notify]]` entry.
#[derive(Debug, Clone)]
pub struct Channel {
    pub name: String,
    pub destination: Destination,
    pub filter: Filter,
    pub timeout: Duration,
    pub attempts: u32,
    pub allow_link_local: bool,
}

/// Where a channel's messages go.
#[derive(Debug, Clone)]
pub enum Destination {
    Email(Box<Email>),
    /// A Slack incoming webhook: Block Kit messages.
    Slack(Url),
    /// A Teams Workflows webhook: Adaptive Cards.
    Teams(Url),
}

/// A mail channel's server and addresses.
#[derive(Debug, Clone)]
pub struct Email {
    pub to: Vec<Mailbox>,
    pub from: Mailbox,
    pub host: String,
    pub port: u16,
    pub security: Security,
    /// The user name and password, when the server wants them.
    pub credentials: Option<(String, String)>,
}

/// How the connection to the mail server is protected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Security {
    /// TLS from the start (`smtps://`).
    Tls,
    /// Upgraded with STARTTLS before anything is sent; a server that cannot is a failed delivery.
    StartTls,
    /// In the clear (`starttls = false`): for a relay on the same host or network.
    None,
}

/// The Requests a channel is told of.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Kinds; any when empty.
    pub kinds: Vec<String>,
    /// Servers; any when empty.
    pub servers: Vec<String>,
}

impl Filter {
    /// Whether a Request, as its event carries it, is one the channel is told of.
    pub fn admits(&self, request: &Value) -> bool {
        let text = |key| request.get(key).and_then(Value::as_str);
        let kind = text("kind").unwrap_or_default();
        let kind_fits = self.kinds.is_empty() || self.kinds.iter().any(|wanted| wanted == kind);
        let server_fits =
            self.servers.is_empty() || text("server").is_some_and(|server| self.servers.iter().any(|s| s == server));
        kind_fits && server_fits
    }
}

/// What every receiver of the channels shares: how to make links, read calls and find an approval's policy,
/// and the metrics.
#[derive(Debug, Clone)]
struct Context {
    links: Links,
    store: Store,
    approvals: Approvals,
    metrics: Metrics,
}

/// What a receiver is told of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Told {
    /// The Requests its channel admits, new and resolved.
    Requests,
    /// Approvals still pending this long after they were raised, whose policy escalates to its channel then.
    Escalated(Duration),
}

/// Starts the receivers of every channel, delivering as `holder`. A channel that an approval policy escalates
/// to is told only of those escalations, once for each wait that names it. Fails only when an HTTP client cannot
/// be built.
#[allow(clippy::too_many_arguments, reason = "what a gateway's background work needs, named")]
pub async fn start(
    channels: Vec<Channel>,
    approvals: &Approvals,
    links: &Links,
    holder: &str,
    store: &Store,
    feed: &Feed,
    metrics: &Metrics,
    shutdown: &CancellationToken,
    tracker: &TaskTracker,
) -> anyhow::Result<()> {
    if channels.is_empty() {
        return Ok(());
    }
    let context = Arc::new(Context {
        links: links.clone(),
        store: store.clone(),
        approvals: approvals.clone(),
        metrics: metrics.clone(),
    });
    let guarded = webhooks::delivery_client().dns_resolver(GuardedResolver).build()?;
    let open = webhooks::delivery_client().build()?;
    for channel in channels {
        let mut waits: Vec<Duration> = approvals
            .all()
            .iter()
            .flat_map(|policy| &policy.escalate)
            .filter(|step| step.notify.contains(&channel.name))
            .map(|step| step.after)
            .collect();
        waits.sort_unstable();
        waits.dedup();
        let told: Vec<Told> = if waits.is_empty() {
            vec![Told::Requests]
        } else {
            waits.into_iter().map(Told::Escalated).collect()
        };
        let channel = Arc::new(channel);
        for told in told {
            let suffix = match told {
                Told::Requests => String::new(),
                Told::Escalated(after) => format!(":after:{}s", after.as_secs()),
            };
            match &channel.destination {
                Destination::Email(email) => {
                    for to in &email.to {
                        let receiver = Recipient {
                            key: format!("{KEY_PREFIX}{}:{}{suffix}", channel.name, to.email),
                            via: Via::Mail { to: to.clone() },
                            told,
                            channel: channel.clone(),
                            context: context.clone(),
                        };
                        outbox::start(receiver, holder, store, feed, shutdown, tracker).await;
                    }
                }
                Destination::Slack(url) | Destination::Teams(url) => {
                    let receiver = Recipient {
                        key: format!("{KEY_PREFIX}{}{suffix}", channel.name),
                        via: Via::Chat {
                            url: url.clone(),
                            client: if channel.allow_link_local { &open } else { &guarded }.clone(),
                        },
                        told,
                        channel: channel.clone(),
                        context: context.clone(),
                    };
                    outbox::start(receiver, holder, store, feed, shutdown, tracker).await;
                }
            }
        }
    }
    Ok(())
}

/// The SMTP client of a mail channel, connecting to `address` (the host's, as resolved and checked) and checking
/// the server's certificate against the host's name.
fn transport(email: &Email, address: IpAddr, timeout: Duration) -> Result<AsyncSmtpTransport<Tokio1Executor>, String> {
    let tls = || TlsParameters::new(email.host.clone()).map_err(|error| format!("TLS for {}: {error}", email.host));
    let tls = match email.security {
        Security::Tls => Tls::Wrapper(tls()?),
        Security::StartTls => Tls::Required(tls()?),
        Security::None => Tls::None,
    };
    let mut builder = AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(address.to_string())
        .port(email.port)
        .tls(tls)
        .timeout(Some(timeout));
    if let Some((username, password)) = &email.credentials {
        builder = builder.credentials(Credentials::new(username.clone(), password.clone()));
    }
    Ok(builder.build())
}

impl Context {
    /// Whether a receiver of `channel` that is `told` so is given `event`: Requests created and resolved that
    /// the channel admits; or, for an escalation, approvals created whose policy escalates to it after that wait.
    fn wants(&self, channel: &Channel, told: Told, event: &Event) -> bool {
        let request = || serde_json::from_str::<Value>(&event.data).ok();
        match told {
            Told::Requests => {
                matches!(event.kind, EventKind::RequestCreated | EventKind::RequestResolved)
                    && request().is_some_and(|request| channel.filter.admits(&request))
            }
            Told::Escalated(after) => {
                event.kind == EventKind::RequestCreated
                    && request().is_some_and(|request| {
                        self.escalations(&request)
                            .any(|step| step.after == after && step.notify.contains(&channel.name))
                    })
            }
        }
    }

    /// The escalation steps of the policy an approval Request was raised by, by the call it holds.
    fn escalations<'a>(&'a self, request: &Value) -> impl Iterator<Item = &'a Escalation> {
        let call = message::held_call(request);
        let text = |key| call.and_then(|call| call.get(key)).and_then(Value::as_str);
        let policy = match (text("server"), text("tool")) {
            (Some(server), Some(tool)) => self.approvals.find(server, tool),
            _ => None,
        };
        policy.into_iter().flat_map(|policy| &policy.escalate)
    }

    /// Waits until an escalated Request's wait is over; whether it is still pending then (only then is the
    /// channel told).
    async fn still_pending_after(&self, request: &Value, told: Told) -> Result<bool, String> {
        let Told::Escalated(after) = told else { return Ok(true) };
        let created = request
            .get("createdAt")
            .and_then(Value::as_str)
            .and_then(Timestamp::parse)
            .ok_or("the Request has no createdAt")?;
        self.store.clock().sleep_until(created.after(after)).await;
        let id = request
            .get("id")
            .and_then(Value::as_str)
            .and_then(crate::ids::RequestId::parse)
            .ok_or("the Request has no id")?;
        match self.store.request_status(&id).await {
            Ok(status) => Ok(status.is_some_and(|(status, _)| status == Status::Pending)),
            Err(error) => Err(error.to_string()),
        }
    }

    /// What to tell of a `kind` event of `request`, with a link for `holder` when the Request is new and
    /// answerable by one.
    async fn notice(&self, kind: EventKind, request: &Value, told: Told, holder: Holder) -> Result<Notice, String> {
        let call = match request
            .get("call")
            .and_then(Value::as_str)
            .and_then(crate::ids::CallId::parse)
        {
            Some(call) if kind == EventKind::RequestCreated => {
                self.store.call(&call).await.map_err(|error| error.to_string())?
            }
            _ => None,
        };
        let link = match (kind, message::link_answers(request)) {
            (EventKind::RequestCreated, true) => self.link(request, holder),
            _ => None,
        };
        let mut notice = Notice::of(kind, request, call.as_ref(), link);
        if let Told::Escalated(after) = told {
            notice.waited = Some(after);
        }
        Ok(notice)
    }

    /// A link to the Request for `holder`, until the Request expires.
    fn link(&self, request: &Value, holder: Holder) -> Option<String> {
        let id = request.get("id").and_then(Value::as_str)?;
        let expires_at = request
            .get("expiresAt")
            .and_then(Value::as_str)
            .and_then(Timestamp::parse)?;
        let link = Link {
            request: crate::ids::RequestId::parse(id)?,
            holder,
            expires_at,
        };
        Some(self.links.url(&link))
    }

    fn count(&self, channel: &str, outcome: &str) {
        let labels = [("channel", channel), ("outcome", outcome)];
        self.metrics.inc(Metric::NotificationDeliveries, &labels);
    }
}

/// One destination of a channel, told of Requests or of escalations: a mail recipient, or the chat channel.
struct Recipient {
    key: String,
    via: Via,
    told: Told,
    channel: Arc<Channel>,
    context: Arc<Context>,
}

/// How a destination is reached.
enum Via {
    Mail {
        to: Mailbox,
    },
    /// A Slack or Teams webhook.
    Chat {
        url: Url,
        client: reqwest::Client,
    },
}

impl Receiver for Recipient {
    fn key(&self) -> &str {
        &self.key
    }

    fn wants(&self, event: &Event) -> bool {
        self.context.wants(&self.channel, self.told, event)
    }

    fn attempts(&self) -> u32 {
        self.channel.attempts
    }

    async fn deliver(&self, event: &Event) -> Result<Delivered, String> {
        let request: Value = serde_json::from_str(&event.data).map_err(|error| error.to_string())?;
        if !self.context.still_pending_after(&request, self.told).await? {
            return Ok(Delivered::Skipped);
        }
        let holder = Holder::Sent {
            channel: self.channel.name.clone(),
            to: match &self.via {
                Via::Mail { to, .. } => Some(to.email.to_string()),
                Via::Chat { .. } => None,
            },
        };
        let notice = self.context.notice(event.kind, &request, self.told, holder).await?;
        match (&self.via, &self.channel.destination) {
            (Via::Mail { to }, Destination::Email(email)) => {
                let address = resolve(&email.host, email.port, self.channel.allow_link_local).await?;
                let mail = notice
                    .mail(email.from.clone(), to.clone())
                    .map_err(|error| format!("the message could not be built: {error}"))?;
                transport(email, address, self.channel.timeout)?
                    .send(mail)
                    .await
                    .map(|_| Delivered::Sent)
                    .map_err(|error| format!("the mail server refused it: {}", outbox::causes(&error)))
            }
            (Via::Chat { url, client }, destination) => {
                let body = match destination {
                    Destination::Teams(_) => notice.teams(),
                    _ => notice.slack(),
                };
                let request = client.post(url.clone()).timeout(self.channel.timeout).json(&body);
                webhooks::posted(request.send().await).map(|()| Delivered::Sent)
            }
            (Via::Mail { .. }, _) => Err("a mail recipient of a channel that sends no mail".to_owned()),
        }
    }

    fn count(&self, outcome: &str) {
        self.context.count(&self.channel.name, outcome);
    }
}

/// The address of a mail server to connect to: the first its name resolves to. Unless `allow_link_local`, a
/// name that resolves to a link-local or metadata address is refused, as webhooks' are; the connection goes to
/// the address checked, so the name cannot resolve elsewhere in between.
async fn resolve(host: &str, port: u16, allow_link_local: bool) -> Result<IpAddr, String> {
    let resolved = if allow_link_local {
        tokio::net::lookup_host((host, port))
            .await
            .map(Iterator::collect)
            .map_err(egress::Lookup::Failed)
    } else {
        egress::guarded_lookup(host, port).await
    };
    let addresses: Vec<std::net::SocketAddr> = resolved.map_err(|error| match error {
        egress::Lookup::Refused(refused) => format!(
            "{}: notifications do not go there unless the channel sets allow_link_local = true",
            refused.reason()
        ),
        egress::Lookup::Failed(error) => format!("{host} could not be resolved: {error}"),
    })?;
    addresses
        .first()
        .map(std::net::SocketAddr::ip)
        .ok_or_else(|| format!("{host} resolves to no address"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_mail_server_at_a_link_local_or_metadata_address_is_refused_unless_allowed() {
        let refused = resolve("169.254.169.254", 25, false).await.unwrap_err();
        assert!(refused.contains("allow_link_local"), "{refused}");
        assert_eq!(
            resolve("169.254.169.254", 25, true).await,
            Ok("169.254.169.254".parse().unwrap())
        );
        assert_eq!(resolve("127.0.0.1", 25, false).await, Ok("127.0.0.1".parse().unwrap()));
        let named = resolve("metadata.google.internal", 25, false).await.unwrap_err();
        assert!(named.contains("cloud metadata service"), "{named}");
    }
}
