//! toolnexus-gateway holds MCP sessions to upstream servers and turns every elicitation they raise into a
//! Request that can be listed and answered over REST.
#![forbid(unsafe_code)]
#![warn(clippy::await_holding_lock)]

pub mod api;
pub mod auth;
pub mod calls;
pub mod changes;
pub mod config;
pub mod connections;
pub mod demo;
pub mod elicitation;
pub mod events;
pub mod ids;
pub mod metrics;
pub mod registry;
pub mod retained;
pub mod sessions;
pub mod suspension;
pub mod time;
pub mod upstream;
pub mod validation;
pub mod webhooks;

use std::net::SocketAddr;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::api::{AppState, AuthPolicy, HttpPolicy, Services};
use crate::auth::Authenticator;
use crate::calls::Calls;
use crate::changes::Changes;
use crate::config::Config;
use crate::connections::{Connections, Limits};
use crate::events::Events;
use crate::metrics::Metrics;
use crate::registry::{Policy, Registry};
use crate::sessions::Sessions;
use crate::upstream::Upstreams;

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
    limits: Limits,
    tracker: TaskTracker,
}

impl Gateway {
    /// Builds the gateway's services from the config, serving on an already bound listener.
    pub fn new(config: &Config, listener: TcpListener) -> anyhow::Result<Self> {
        let servers = config.servers().map_err(anyhow::Error::msg)?;
        let webhooks = config.webhooks().map_err(anyhow::Error::msg)?;
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
        let auth = AuthPolicy {
            authenticator: Authenticator::new(config.tokens().map_err(anyhow::Error::msg)?),
            public_metrics: config.auth.public_metrics,
            public_openapi: config.auth.public_openapi,
        };
        let file_limit = connections::raise_file_limit();
        let limits = Limits {
            max_connections: config
                .http
                .max_connections
                .unwrap_or_else(|| connections::default_max_connections(file_limit)),
            header_timeout: config.http.header_timeout,
        };
        let changes = Changes::default();
        let events = Events::default();
        let metrics = Metrics::default();
        let policy = Policy {
            ttl: config.requests.ttl,
            retention: config.requests.retention,
            apply_defaults: config.requests.apply_defaults,
            max_pending: config.requests.max_pending,
        };
        let registry = Registry::new(policy, changes.clone(), events.clone(), metrics.clone());
        let retention = config.requests.retention;
        let calls = Calls::new(
            registry.clone(),
            changes.clone(),
            events.clone(),
            metrics.clone(),
            retention,
        );
        let sessions = Sessions::new(changes.clone(), events.clone(), config.requests.retention);
        let shutdown = CancellationToken::new();
        let tracker = TaskTracker::new();
        webhooks::start(webhooks, &events, &metrics, &shutdown, &tracker);
        let upstreams = Upstreams::new(
            servers,
            sessions.clone(),
            registry.clone(),
            calls.clone(),
            changes.clone(),
            config.limits.clone(),
            Background {
                shutdown: shutdown.clone(),
                tracker: tracker.clone(),
            },
        );
        let state = AppState::new(Services {
            registry,
            calls,
            sessions,
            upstreams,
            changes,
            events,
            metrics,
            connections: Connections::default(),
            auth,
            http,
            shutdown,
        });
        Ok(Self {
            listener,
            state,
            limits,
            tracker,
        })
    }

    /// The address the API listens on.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `signal` resolves, then drains: long-polls end, pending Requests are answered `cancel`
    /// upstream, calls are cancelled, sessions closed and child processes reaped.
    pub async fn serve(self, signal: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
        let Gateway {
            listener,
            state,
            limits,
            tracker,
        } = self;
        tracker.spawn(state.registry.clone().reap(state.shutdown.clone()));
        state.upstreams.start();
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
        connections
            .serve(listener, api::router(state), limits, metrics, shutdown)
            .await;
        upstreams.shut_down().await;
        tracker.close();
        tracker.wait().await;
        tracing::info!("stopped");
        Ok(())
    }
}
