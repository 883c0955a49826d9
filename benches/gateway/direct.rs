//! The direct path: an in-process rmcp client of the same demo server, whose handler answers every
//! elicitation at once with what the gateway path sends.

use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use anyhow::{Context, ensure};
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientConfig, ElicitRequestParams, ElicitResult, ElicitationAction,
    ErrorData, Implementation, JsonObject, ProtocolVersion,
};
use rmcp::service::{RequestContext, RunningService};
use rmcp::transport::TokioChildProcess;
use rmcp::{ClientHandler, ClientLifecycleMode, ClientServiceExt, RoleClient, ServiceExt};
use serde_json::{Value, json};

use crate::Era;
use crate::rest::{check_confirmed, since_stamp};

/// Answers every elicitation at once: accept, `confirm: true` and the schema's default `note`.
#[derive(Debug, Clone)]
struct Answerer {
    protocol: ProtocolVersion,
    /// For prompts with a send time (`stamp`): how long after it the handler got the elicitation.
    discovered: Arc<Mutex<Option<Duration>>>,
}

impl ClientHandler for Answerer {
    fn get_info(&self) -> ClientConfig {
        // The same declaration as the gateway's, so both paths ask the upstream for the same thing.
        ClientConfig::new(
            toolnexus_gateway::upstream::capabilities(false),
            Implementation::new("bench-direct", "0.1.0"),
        )
        .with_protocol_version(self.protocol.clone())
    }

    async fn create_elicitation(
        &self,
        params: ElicitRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        let arrived = SystemTime::now();
        let params = serde_json::to_value(&params).unwrap_or_default();
        if let Some(prompt) = params["message"].as_str().filter(|prompt| prompt.contains(" @")) {
            *self.discovered.lock().unwrap_or_else(|p| p.into_inner()) = since_stamp(prompt, arrived).ok();
        }
        Ok(ElicitResult::new(ElicitationAction::Accept).with_content(json!({"confirm": true, "note": ""})))
    }
}

/// A direct MCP client session to a demo server it spawned.
pub struct Direct {
    service: RunningService<RoleClient, Answerer>,
    discovered: Arc<Mutex<Option<Duration>>>,
}

impl Direct {
    /// Spawns `binary demo-server` and completes the handshake in `era`.
    pub async fn connect(binary: &Path, era: Era) -> anyhow::Result<Self> {
        let mut command = tokio::process::Command::new(binary);
        command.arg("demo-server");
        let (transport, _) = TokioChildProcess::builder(command)
            .stderr(Stdio::null())
            .spawn()
            .context("cannot start the demo server")?;
        let discovered = Arc::new(Mutex::new(None));
        let service = match era {
            Era::Legacy => {
                Answerer {
                    protocol: ProtocolVersion::V_2025_11_25,
                    discovered: discovered.clone(),
                }
                .serve(transport)
                .await?
            }
            Era::Modern => {
                let lifecycle = ClientLifecycleMode::Discover {
                    preferred_versions: vec![ProtocolVersion::V_2026_07_28],
                };
                Answerer {
                    protocol: ProtocolVersion::V_2026_07_28,
                    discovered: discovered.clone(),
                }
                .serve_with_lifecycle(transport, lifecycle)
                .await?
            }
        };
        Ok(Self { service, discovered })
    }

    async fn call(&self, tool: &'static str, arguments: Value) -> anyhow::Result<CallToolResult> {
        let arguments: JsonObject = serde_json::from_value(arguments)?;
        let params = CallToolRequestParams::new(tool).with_arguments(arguments);
        Ok(self.service.call_tool(params).await?)
    }

    /// One elicitation round trip: `confirm_action`, answered by the handler.
    pub async fn confirm(&self) -> anyhow::Result<()> {
        let result = self.call("confirm_action", json!({"action": "bench"})).await?;
        check_confirmed(result.structured_content.as_ref())
    }

    /// The discovery time of one elicitation: `confirm_action` with `stamp`, from the upstream's send time to
    /// the handler receiving it.
    pub async fn discover(&self) -> anyhow::Result<Duration> {
        let result = self
            .call("confirm_action", json!({"action": "bench", "stamp": true}))
            .await?;
        check_confirmed(result.structured_content.as_ref())?;
        let discovered = self.discovered.lock().unwrap_or_else(|p| p.into_inner()).take();
        discovered.context("the elicitation carried no send time")
    }

    /// One plain tool call: `echo`.
    pub async fn echo(&self) -> anyhow::Result<()> {
        check_echoed(&self.call("echo", json!({"text": "bench"})).await?)
    }

    /// Calls per second of `echo` from `concurrency` concurrent callers on this one session.
    pub async fn echo_rate(self: &Arc<Self>, concurrency: usize, window: Duration) -> anyhow::Result<f64> {
        let direct = self.clone();
        crate::rate(concurrency, window, move || {
            let direct = direct.clone();
            async move { direct.echo().await }
        })
        .await
    }

    /// Closes the session; the demo server exits.
    pub async fn close(mut self) {
        let _ = self.service.close().await;
    }
}

/// Checks that `echo` returned the text it was given, `bench`.
pub fn check_echoed(result: &CallToolResult) -> anyhow::Result<()> {
    let text = result
        .content
        .first()
        .and_then(|c| c.as_text())
        .map(|t| t.text.as_str());
    ensure!(text == Some("bench"), "echo returned {result:?}");
    Ok(())
}
