//! toolnexus-gateway holds MCP sessions to upstream servers and turns every elicitation they raise into a
//! Request that can be listed and answered over REST.
#![forbid(unsafe_code)]
#![warn(clippy::await_holding_lock)]

pub mod api;
pub mod approvals;
pub mod audit;
pub mod auth;
pub mod calls;
pub mod config;
pub mod connections;
pub mod decision;
pub mod demo;
pub mod egress;
pub mod elicitation;
pub mod feed;
pub mod forms;
pub mod grants;
pub mod ids;
pub mod lease;
pub mod links;
pub mod logs;
pub mod metrics;
pub mod notify;
pub mod outbox;
pub mod posted;
pub mod records;
pub mod redact;
pub mod registry;
pub mod retained;
pub mod sampling;
pub mod sessions;
pub mod signature;
pub mod store;
pub mod suspension;
#[cfg(test)]
pub mod test_postgres;
pub mod time;
pub mod upstream;
pub mod validation;
pub mod webhooks;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::api::{AppState, AuthPolicy, HttpPolicy, Services};
use crate::approvals::Approvals;
use crate::auth::Authenticator;
use crate::auth::oidc::Oidc;
use crate::calls::Calls;
use crate::config::Config;
use crate::connections::{Connections, Limits};
use crate::feed::Feed;
use crate::grants::Grants;
use crate::ids::CallId;
use crate::links::Links;
use crate::metrics::Metrics;
use crate::registry::{Policy, Registry};
use crate::sessions::Sessions;
use crate::store::Store;
use crate::time::Clock;
use crate::upstream::{Domain, Upstreams};

/// Locks `mutex`, whether or not a thread panicked holding it: every lock here guards state that each change
/// leaves whole before it can panic.
pub(crate) fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The most time between two prunings of ended records.
const PRUNE_EVERY: Duration = Duration::from_secs(60);

/// What background work needs: the token that says shut down, and the tracker that waits for it to end.
#[derive(Debug, Clone)]
pub struct Background {
    pub shutdown: CancellationToken,
    pub tracker: TaskTracker,
}

/// A gateway bound to its listener, ready to serve.
#[derive(Debug)]
pub struct Gateway {
    listener: TcpListener,
    state: AppState,
    store: Store,
    limits: Limits,
    retention: Retention,
    resumes: mpsc::UnboundedReceiver<registry::Resume>,
    tracker: TaskTracker,
}

/// What a gateway takes from the program that runs it, beyond its config.
#[derive(Debug, Clone, Default)]
pub struct Surroundings {
    /// The clock it reads.
    pub clock: Clock,
    /// The program whose `demo-server` command serves `builtin = "demo"`; unset, this executable.
    pub demo_program: Option<PathBuf>,
}

impl Gateway {
    /// Builds the gateway's services from the config, serving on an already bound listener; opens the store
    /// (a start-up error names the store and the cause).
    pub async fn new(config: &Config, listener: TcpListener) -> anyhow::Result<Self> {
        Self::within(config, listener, Surroundings::default()).await
    }

    /// [`Gateway::new`], with its clock and demo program from `surroundings`.
    pub async fn within(config: &Config, listener: TcpListener, surroundings: Surroundings) -> anyhow::Result<Self> {
        let Surroundings { clock, demo_program } = surroundings;
        let servers = config
            .servers_with_demo(demo_program.as_deref())
            .map_err(anyhow::Error::msg)?;
        let webhooks = config.webhooks().map_err(anyhow::Error::msg)?;
        let approvals = Approvals::new(config.approvals().map_err(anyhow::Error::msg)?);
        let location = config.store_location().map_err(anyhow::Error::msg)?;
        let allowed_hosts = match &config.http.allowed_hosts {
            Some(hosts) if hosts.is_empty() => None,
            Some(hosts) => Some(hosts.clone()),
            None if config.listen.ip().is_loopback() => {
                Some(api::LOOPBACK_HOSTS.iter().map(|host| (*host).to_owned()).collect())
            }
            None => None,
        };
        let http = HttpPolicy {
            max_body_bytes: config.http.max_body_bytes,
            allowed_hosts,
            cors_origins: config.http.cors_origins.clone(),
        };
        let oidc = match config.oidc().map_err(anyhow::Error::msg)? {
            Some(settings) => {
                let oidc = Oidc::discover(settings).await.map_err(anyhow::Error::msg)?;
                tracing::info!(issuer = oidc.issuer(), "auth: OpenID provider's keys read");
                Some(oidc)
            }
            None => None,
        };
        let auth = AuthPolicy {
            authenticator: Authenticator::new(config.tokens().map_err(anyhow::Error::msg)?, oidc),
            public_metrics: config.auth.public_metrics,
            public_openapi: config.auth.public_openapi,
            resource: config.auth.oidc.as_ref().and_then(|oidc| oidc.resource.clone()),
        };
        let file_limit = connections::raise_file_limit();
        let limits = Limits {
            max_connections: config
                .http
                .max_connections
                .unwrap_or_else(|| connections::default_max_connections(file_limit)),
            header_timeout: config.http.header_timeout,
            body_timeout: config.http.body_timeout,
        };
        let feed = Feed::default();
        let metrics = Metrics::default();
        let retention = Retention {
            records: config.retention(),
            events: config.audit_retention(),
        };
        let replica = config.replica();
        let store = Store::open(&location, feed.clone(), retention.records, &replica, clock).await?;
        match &location {
            store::Location::Memory => tracing::info!("store: in memory (nothing is kept across restarts)"),
            store::Location::Sqlite(path) => tracing::info!(path = %path.display(), "store: SQLite file"),
            store::Location::Postgres(url) => {
                tracing::info!(url = %crate::redact::url(url), %replica, "store: PostgreSQL")
            }
        }
        let policy = Policy {
            ttl: config.requests.ttl,
            apply_defaults: config.requests.apply_defaults,
            caps: config.pending_caps(),
            max_request_bytes: config.requests.max_request_bytes,
        };
        let (resume, resumes) = mpsc::unbounded_channel();
        let listening = listener.local_addr()?;
        let channels = config.notify().map_err(anyhow::Error::msg)?;
        let links = Links::open(config.links().map_err(anyhow::Error::msg)?, listening, &store).await?;
        let registry = Registry::new(store.clone(), feed.clone(), policy, metrics.clone(), resume);
        let calls = Calls::new(store.clone(), registry.clone(), metrics.clone());
        let grants = Grants::new(store.clone());
        let sessions = Sessions::new(store.clone(), replica.clone());
        let shutdown = CancellationToken::new();
        let tracker = TaskTracker::new();
        webhooks::start(webhooks, &replica, &store, &feed, &metrics, &shutdown, &tracker)
            .await
            .map_err(|error| anyhow::anyhow!("cannot build the webhooks' HTTP client: {error}"))?;
        audit::chainer::start(&replica, &store, &feed, &shutdown, &tracker).await;
        notify::start(
            channels, &approvals, &links, &replica, &store, &feed, &metrics, &shutdown, &tracker,
        )
        .await
        .map_err(|error| anyhow::anyhow!("cannot set up the notification channels: {error}"))?;
        let domain = Domain {
            replica: replica.clone(),
            sessions: sessions.clone(),
            registry: registry.clone(),
            calls: calls.clone(),
            grants: grants.clone(),
            feed: feed.clone(),
        };
        let background = Background {
            shutdown: shutdown.clone(),
            tracker: tracker.clone(),
        };
        let upstreams = Upstreams::new(
            servers,
            domain,
            config.limits.clone(),
            approvals.clone(),
            store.is_durable(),
            background,
        );
        let state = AppState::new(Services {
            registry,
            calls,
            grants,
            sessions,
            upstreams,
            approvals,
            feed,
            store: store.clone(),
            metrics,
            connections: Connections::default(),
            auth,
            http,
            shutdown,
            holds: api::HoldLimits {
                long_polls: config.limits.long_polls_per_principal,
                streams: config.limits.streams_per_principal,
                mcp_sessions: config.limits.mcp_sessions_per_principal,
            },
            front_door: api::FrontDoorPolicy {
                prefix: config.front_door.prefix,
                relay: config.front_door.elicitation == config::Elicitations::Relay,
                max_hold: config.front_door.max_hold,
            },
            links,
        });
        Ok(Self {
            listener,
            state,
            store,
            limits,
            retention,
            resumes,
            tracker,
        })
    }

    /// The address the API listens on.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `signal` resolves, then drains: long-polls end, calls that cannot outlive the process are
    /// cancelled (their upstreams told), 2025-11-25 Requests answered `cancel`, sessions closed and child
    /// processes reaped. With a durable store, 2026-07-28 Requests stay pending for the next start.
    pub async fn serve(self, signal: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
        let Gateway {
            listener,
            state,
            store,
            limits,
            retention,
            resumes,
            tracker,
        } = self;
        let recovered = store
            .recover("the gateway restarted")
            .await
            .map_err(|error| anyhow::anyhow!("cannot recover the previous run's state: {error}"))?;
        let carried = recovered.resumes.len() + recovered.approvals.len();
        if recovered.ended_requests + recovered.ended_calls + carried + recovered.pending > 0 {
            tracing::info!(
                pending = recovered.pending,
                retried = recovered.resumes.len(),
                awaiting_approval = recovered.approvals.len(),
                ended_requests = recovered.ended_requests,
                ended_calls = recovered.ended_calls,
                "recovered the previous run's state"
            );
        }
        tracker.spawn(state.registry.clone().reap(state.shutdown.clone()));
        tracker.spawn(prune(store.clone(), retention, state.shutdown.clone()));
        if matches!(store, Store::Postgres(_)) {
            let (upstreams, shutdown) = (state.upstreams.clone(), state.shutdown.clone());
            tracker.spawn(reap_replicas(
                store.clone(),
                state.registry.clone(),
                upstreams,
                shutdown,
            ));
            let feed = state.feed.clone();
            tracker.spawn(state.registry.clone().follow_replicas(feed, state.shutdown.clone()));
        }
        state.upstreams.start(resumes);
        resume(&store, &state.registry, recovered.resumes).await;
        state.upstreams.adopt_approvals(recovered.approvals);
        let shutdown = state.shutdown.clone();
        let upstreams = state.upstreams.clone();
        tokio::spawn(async move {
            signal.await;
            tracing::info!("shutting down");
            shutdown.cancel();
        });
        tracing::info!(
            max_connections = limits.max_connections,
            header_timeout = ?limits.header_timeout,
            "serving"
        );
        let (connections, metrics, shutdown) =
            (state.connections.clone(), state.metrics.clone(), state.shutdown.clone());
        let serving = connections.serve(listener, api::router(state), limits, metrics, shutdown);
        tokio::select! {
            () = serving => {}
            () = store.taken_for_gone() => {
                // What it holds was ended or carried on by another replica: nothing of it is drained or
                // written as ended again.
                anyhow::bail!(
                    "another replica took this one for gone; start it again (as a supervisor does) to serve as a new run"
                );
            }
        }
        upstreams.shut_down().await;
        tracker.close();
        tracker.wait().await;
        store.close().await;
        tracing::info!("stopped");
        Ok(())
    }
}

/// Ends what replicas that are gone left, every third of the lease, and retries or waits on the approval of
/// the calls that fall to this one.
async fn reap_replicas(store: Store, registry: Registry, upstreams: Arc<Upstreams>, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(store::postgres::LEASE / 3) => {}
            () = shutdown.cancelled() => return,
        }
        if !store.holds_its_lease() {
            // Its own heartbeats failed lately: others' may have failed as its did, the database away from all.
            continue;
        }
        let reaped = match store.reap().await {
            Ok(reaped) => reaped,
            Err(error) => {
                tracing::warn!(%error, "what replicas that are gone left could not be ended");
                continue;
            }
        };
        if reaped.ended_requests + reaped.ended_calls + reaped.resumes.len() + reaped.approvals.len() > 0 {
            tracing::info!(
                retried = reaped.resumes.len(),
                awaiting_approval = reaped.approvals.len(),
                ended_requests = reaped.ended_requests,
                ended_calls = reaped.ended_calls,
                "ended what replicas that are gone left"
            );
        }
        resume(&store, &registry, reaped.resumes).await;
        upstreams.adopt_approvals(reaped.approvals);
    }
}

/// Hands the calls whose round is answered on to be retried, with what retrying each takes.
async fn resume(store: &Store, registry: &Registry, calls: Vec<CallId>) {
    for call in calls {
        match store.retry(&call).await {
            Ok(Some(retry)) => registry.resume(retry, None),
            Ok(None) => {}
            Err(error) => tracing::error!(%call, %error, "a call to retry could not be read"),
        }
    }
}

/// How long what the store keeps stays there.
#[derive(Debug, Clone, Copy)]
struct Retention {
    /// Ended records: `requests.retention`.
    records: Duration,
    /// Events, the audit trail: `audit.retention`, never shorter.
    events: Duration,
}

/// Forgets ended records and events past their retention, every minute (or sooner with a short retention).
async fn prune(store: Store, retention: Retention, shutdown: CancellationToken) {
    let every = (retention.records / 4).clamp(Duration::from_secs(1), PRUNE_EVERY);
    let clock = store.clock().clone();
    loop {
        tokio::select! {
            () = clock.sleep(every) => {}
            () = shutdown.cancelled() => return,
        }
        let now = clock.now();
        let horizons = store::Horizons {
            records: now.before(retention.records),
            events: now.before(retention.events),
        };
        if let Err(error) = store.prune(horizons).await {
            tracing::warn!(%error, "pruning ended records failed");
        }
    }
}
