//! Opening the MCP connection of a session: the transport, the protocol era, and prompt end-of-stream detection.

use std::collections::HashMap;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::http::header::{InvalidHeaderName, InvalidHeaderValue};
use axum::http::{HeaderName, HeaderValue};
use rmcp::model::ProtocolVersion;
use rmcp::service::{RunningService, RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::common::client_side_sse::SseRetryPolicy;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, Transport};
use rmcp::{ClientLifecycleMode, ClientServiceExt, RoleClient, ServiceExt};
use tokio::sync::oneshot;

use super::client::GatewayClient;
use super::inbound_ids::InboundIds;
use super::stdio::{self, ChildTransport};
use crate::config::{ProtocolChoice, Server, Transport as ServerTransport};
use crate::redact::Secrets;

/// A live MCP client connection.
pub type Connection = RunningService<RoleClient, GatewayClient>;

/// Why a session's connection could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error(
        "the server did not finish starting and its MCP handshake within {} (startup_timeout)",
        humantime::format_duration(*.0)
    )]
    StartupTimeout(Duration),
    /// `auto` failed in both eras.
    #[error("{legacy} (and with 2026-07-28: {modern})")]
    NoEra {
        legacy: Box<ConnectError>,
        modern: Box<ConnectError>,
    },
    #[error("cannot start {}: {error}", program.display())]
    Spawn { program: PathBuf, error: io::Error },
    #[error("header name {name:?}: {error}")]
    HeaderName { name: String, error: InvalidHeaderName },
    #[error("header {name}: {error}")]
    HeaderValue { name: String, error: InvalidHeaderValue },
    #[error("cannot build an HTTP client: {0}")]
    HttpClient(reqwest::Error),
    /// The config pins 2026-07-28 and the server refused it.
    #[error("the server does not speak protocol 2026-07-28, which its config pins: {0}")]
    NotModern(ScrubbedError),
    #[error("the MCP handshake failed: {0}")]
    Handshake(ScrubbedError),
}

/// Connects to a server and completes the handshake in the era its config asks for, within its `startup_timeout`.
///
/// `auto` tries 2026-07-28 first; when that handshake fails it connects afresh with 2025-11-25.
/// The receiver fires with the reason when the upstream's stream ends (a stdio child's EOF), well before rmcp
/// gives up on in-flight handlers.
pub async fn connect(
    server: &Server,
    handler: impl Fn(ProtocolVersion) -> GatewayClient,
) -> Result<(Connection, oneshot::Receiver<String>), ConnectError> {
    let timeout = server.startup_timeout;
    tokio::time::timeout(timeout, connect_in_era(server, handler))
        .await
        .unwrap_or(Err(ConnectError::StartupTimeout(timeout)))
}

async fn connect_in_era(
    server: &Server,
    handler: impl Fn(ProtocolVersion) -> GatewayClient,
) -> Result<(Connection, oneshot::Receiver<String>), ConnectError> {
    match server.protocol {
        ProtocolChoice::Auto => match attempt(server, &handler, ProtocolChoice::Auto).await {
            Ok(connected) => Ok(connected),
            Err(modern) => attempt(server, &handler, ProtocolChoice::Legacy)
                .await
                .map_err(|legacy| ConnectError::NoEra {
                    legacy: Box::new(legacy),
                    modern: Box::new(modern),
                }),
        },
        protocol => attempt(server, &handler, protocol).await,
    }
}

async fn attempt(
    server: &Server,
    handler: &impl Fn(ProtocolVersion) -> GatewayClient,
    protocol: ProtocolChoice,
) -> Result<(Connection, oneshot::Receiver<String>), ConnectError> {
    let (eof, ended) = oneshot::channel();
    let handler = handler(match protocol {
        ProtocolChoice::Legacy | ProtocolChoice::Auto => ProtocolVersion::V_2025_11_25,
        ProtocolChoice::Modern => ProtocolVersion::V_2026_07_28,
    });
    let connection = match &server.transport {
        ServerTransport::Stdio { command, args, env } => {
            let child = ChildTransport::spawn(&server.name, command, args, env, eof)
                .map_err(|error| ConnectError::Spawn {
                    program: command.clone(),
                    error,
                })?
                .answering(handler.core().clone());
            handshake(child, handler, protocol, &Secrets::default()).await?
        }
        ServerTransport::Http { url, headers } => {
            let headers = headers
                .iter()
                .map(|(name, value)| {
                    let header = HeaderName::try_from(name.as_str()).map_err(|error| ConnectError::HeaderName {
                        name: name.clone(),
                        error,
                    })?;
                    let value = HeaderValue::try_from(value.as_str()).map_err(|error| ConnectError::HeaderValue {
                        name: name.clone(),
                        error,
                    })?;
                    Ok((header, value))
                })
                .collect::<Result<HashMap<_, _>, ConnectError>>()?;
            let mut config = StreamableHttpClientTransportConfig::with_uri(url.as_str()).custom_headers(headers);
            config.retry_config = Arc::new(Resumption);
            let transport = StreamableHttpClientTransport::with_client(http_client()?, config);
            let secrets = Secrets::of_url(url);
            let watched = EofWatch {
                inner: transport,
                eof: Some(eof),
                secrets: secrets.clone(),
                inbound: InboundIds::default(),
            };
            handshake(watched, handler, protocol, &secrets).await?
        }
    };
    Ok((connection, ended))
}

/// The HTTP client of an upstream's session: it follows no redirect, so that a server cannot send the
/// session's headers (its credentials) on to another address.
fn http_client() -> Result<reqwest::Client, ConnectError> {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(ConnectError::HttpClient)
}

/// How a broken event stream of an HTTP upstream is resumed (a `GET` with `Last-Event-ID`): at once, then after
/// 2, 4, 8 and 8 s. When the fifth attempt in a row fails the stream ends, and with it the request it answers,
/// so a call whose upstream died fails within about 25 s (rmcp's default tries for ever). A stream the server
/// ends in order is resumed after 1 s, or the `retry` it asked for.
#[derive(Debug)]
struct Resumption;

impl SseRetryPolicy for Resumption {
    fn retry(&self, failures: usize) -> Option<Duration> {
        (failures < 5).then(|| Duration::from_secs(1 << failures.min(3)))
    }
}

/// Completes the MCP handshake in an era; its error never quotes `secrets`.
async fn handshake<T>(
    transport: T,
    handler: GatewayClient,
    protocol: ProtocolChoice,
    secrets: &Secrets,
) -> Result<Connection, ConnectError>
where
    T: Transport<RoleClient> + 'static,
{
    let serving = async {
        match protocol {
            ProtocolChoice::Legacy => handler.serve(transport).await,
            ProtocolChoice::Modern => {
                let lifecycle = ClientLifecycleMode::Discover {
                    preferred_versions: vec![ProtocolVersion::V_2026_07_28],
                };
                handler.serve_with_lifecycle(transport, lifecycle).await
            }
            ProtocolChoice::Auto => {
                let lifecycle = ClientLifecycleMode::Auto {
                    preferred_versions: vec![ProtocolVersion::V_2026_07_28],
                    legacy_version: Some(ProtocolVersion::V_2025_11_25),
                };
                handler.serve_with_lifecycle(transport, lifecycle).await
            }
        }
    };
    serving.await.map_err(|error| {
        let error = ScrubbedError(secrets.scrub(&error.to_string()));
        match protocol {
            ProtocolChoice::Modern => ConnectError::NotModern(error),
            ProtocolChoice::Legacy | ProtocolChoice::Auto => ConnectError::Handshake(error),
        }
    })
}

/// An HTTP transport that reports the end of the upstream's stream the moment it is read, whose errors never
/// quote the secrets of the server's URL (they reach calls' errors, `GET /servers` and the logs), and that gives
/// the upstream's requests ids of the gateway's own (`inbound_ids`).
struct EofWatch<T> {
    inner: T,
    eof: Option<oneshot::Sender<String>>,
    secrets: Secrets,
    inbound: InboundIds,
}

/// An error's message with the URL's secrets taken out.
#[derive(Debug)]
pub struct ScrubbedError(String);

impl std::fmt::Display for ScrubbedError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ScrubbedError {}

impl<T: Transport<RoleClient>> Transport<RoleClient> for EofWatch<T> {
    type Error = ScrubbedError;

    fn send(
        &mut self,
        mut message: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let sent = self.inbound.send(&mut message).then(|| self.inner.send(message));
        let secrets = self.secrets.clone();
        async move {
            let Some(sent) = sent else { return Ok(()) };
            sent.await
                .map_err(|error| ScrubbedError(secrets.scrub(&error.to_string())))
        }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        let mut message = self.inner.receive().await;
        match &mut message {
            Some(message) => self.inbound.receive(message),
            None => {
                if let Some(eof) = self.eof.take() {
                    let _ = eof.send(stdio::ENDED.to_owned());
                }
            }
        }
        message
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.inner
            .close()
            .await
            .map_err(|error| ScrubbedError(self.secrets.scrub(&error.to_string())))
    }
}
