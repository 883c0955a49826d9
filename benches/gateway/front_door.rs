//! Section `front_door`: a plain tool call through the gateway's MCP endpoint, `/mcp`, against the same call
//! by a direct rmcp client of the demo server; both in 2026-07-28.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;

use rmcp::model::{CallToolRequestParams, ProtocolVersion};
use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientLifecycleMode, ClientServiceExt, RoleClient, ServiceExt};
use serde_json::json;

use crate::direct::{Direct, check_echoed};
use crate::process::{GatewayProcess, MODERN_ONLY};
use crate::stats::{Samples, overhead, p50_p99};
use crate::{Era, Plan, rate, record, verdict};

/// An MCP client over Streamable HTTP: an agent's of the gateway's `/mcp`, or one of the demo server's own
/// HTTP endpoint.
struct Agent {
    service: RunningService<RoleClient, ()>,
    echo: &'static str,
}

impl Agent {
    /// A client in 2026-07-28 (stateless requests), or with `Era::Legacy` in 2025-11-25 (a session).
    async fn connect(url: &str, echo: &'static str, era: Era) -> anyhow::Result<Self> {
        let config = StreamableHttpClientTransportConfig::with_uri(url);
        let client = reqwest::Client::builder().tcp_nodelay(true).build()?;
        let transport = StreamableHttpClientTransport::with_client(client, config);
        let service = match era {
            Era::Modern => {
                let lifecycle = ClientLifecycleMode::Discover {
                    preferred_versions: vec![ProtocolVersion::V_2026_07_28],
                };
                ().serve_with_lifecycle(transport, lifecycle).await?
            }
            Era::Legacy => ().serve(transport).await?,
        };
        Ok(Self { service, echo })
    }

    /// One plain tool call: `echo`.
    async fn echo(&self) -> anyhow::Result<()> {
        let arguments = json!({"text": "bench"}).as_object().cloned().unwrap_or_default();
        let params = CallToolRequestParams::new(self.echo).with_arguments(arguments);
        check_echoed(&self.service.call_tool(params).await?)
    }
}

/// The front door's name of the modern server's `echo`.
const ECHO: &str = "modern__echo";

/// Echo calls per second from `concurrency` 2026-07-28 clients of `url`, each calling in turn.
async fn agents_rate(url: &str, echo: &'static str, concurrency: usize, plan: &Plan) -> anyhow::Result<f64> {
    let mut agents = Vec::with_capacity(concurrency);
    for _ in 0..concurrency {
        agents.push(Arc::new(Agent::connect(url, echo, Era::Modern).await?));
    }
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    rate(concurrency, plan.window, move || {
        let index = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % agents.len();
        let agent = agents[index].clone();
        async move { agent.echo().await }
    })
    .await
}

/// `demo-server --http` on a free port: the process, and its endpoint's URL.
async fn demo_over_http(binary: &Path) -> anyhow::Result<(tokio::process::Child, String)> {
    use tokio::io::AsyncBufReadExt;
    let mut child = tokio::process::Command::new(binary)
        .args(["demo-server", "--http", "127.0.0.1:0"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let stdout = child.stdout.take().ok_or_else(|| anyhow::anyhow!("no stdout"))?;
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    while let Some(line) = lines.next_line().await? {
        if let Some(url) = line.strip_prefix("listening on ") {
            return Ok((child, url.trim().to_owned()));
        }
    }
    anyhow::bail!("the demo server exited before it listened")
}

/// Latency of one call at a time, then calls per second with each caller an agent of its own.
pub async fn table(binary: &Path, plan: &Plan) -> anyhow::Result<String> {
    let gateway = GatewayProcess::spawn(binary, MODERN_ONLY).await?;
    gateway.ready().await?;
    let door = format!("{}/mcp", gateway.rest.base());
    let direct = Arc::new(Direct::connect(binary, Era::Modern).await?);
    let agent = Agent::connect(&door, ECHO, Era::Modern).await?;
    let in_session = Agent::connect(&door, ECHO, Era::Legacy).await?;
    let (_demo, demo_url) = demo_over_http(binary).await?;
    let over_http = Agent::connect(&demo_url, "echo", Era::Modern).await?;
    let over_http_in_session = Agent::connect(&demo_url, "echo", Era::Legacy).await?;
    eprintln!("front door: latency");
    let (mut direct_echo, mut door_echo) = (Samples::default(), Samples::default());
    let (mut http_echo, mut session_echo, mut http_session_echo) =
        (Samples::default(), Samples::default(), Samples::default());
    for round in 0..plan.warmup + plan.iterations {
        let measured = round >= plan.warmup;
        record(measured, &mut direct_echo, direct.echo()).await?;
        record(measured, &mut door_echo, agent.echo()).await?;
        record(measured, &mut http_echo, over_http.echo()).await?;
        record(measured, &mut session_echo, in_session.echo()).await?;
        record(measured, &mut http_session_echo, over_http_in_session.echo()).await?;
    }
    let (added, ratio) = overhead(&direct_echo, &door_echo);
    let met = verdict(door_echo.p50().saturating_sub(direct_echo.p50()) <= std::time::Duration::from_micros(150));
    let mut table = String::from(
        "\n### MCP front door: echo through `/mcp` vs a direct rmcp client, 2026-07-28\n\n\
         | measurement | direct | front door | added / ratio | target |\n|---|---|---|---|---|\n",
    );
    let _ = writeln!(
        table,
        "| echo p50 / p99 (µs), one call at a time | {} | {} | {added} / {ratio} | ≤ +150 at p50: {met} |",
        p50_p99(&direct_echo),
        p50_p99(&door_echo),
    );
    let (added, ratio) = overhead(&direct_echo, &http_echo);
    let _ = writeln!(
        table,
        "| reference: the demo server's own Streamable HTTP endpoint, rmcp on both sides, p50 / p99 (µs) | {} | {} | {added} / {ratio} | |",
        p50_p99(&direct_echo),
        p50_p99(&http_echo),
    );
    let (added, ratio) = overhead(&direct_echo, &session_echo);
    let _ = writeln!(
        table,
        "| echo from a 2025-11-25 client (a session), p50 / p99 (µs) | {} | {} | {added} / {ratio} | |",
        p50_p99(&direct_echo),
        p50_p99(&session_echo),
    );
    let (added, ratio) = overhead(&direct_echo, &http_session_echo);
    let _ = writeln!(
        table,
        "| reference: the demo's own endpoint, 2025-11-25 session, p50 / p99 (µs) | {} | {} | {added} / {ratio} | |",
        p50_p99(&direct_echo),
        p50_p99(&http_session_echo),
    );
    for &concurrency in plan.concurrencies {
        eprintln!("front door: concurrency {concurrency}");
        let direct_rate = direct.echo_rate(concurrency, plan.window).await?;
        let door_rate = agents_rate(&door, ECHO, concurrency, plan).await?;
        let http_rate = agents_rate(&demo_url, "echo", concurrency, plan).await?;
        let ratio = door_rate / direct_rate;
        let target = if concurrency == 64 {
            format!("≥ 0.8: {}", verdict(ratio >= 0.8))
        } else {
            String::new()
        };
        let _ = writeln!(
            table,
            "| echo calls/s, {concurrency} concurrent | {direct_rate:.0} | {door_rate:.0} | {ratio:.2} | {target} |"
        );
        let _ = writeln!(
            table,
            "| reference: the demo's own endpoint, {concurrency} concurrent | {direct_rate:.0} | {http_rate:.0} | {:.2} | |",
            http_rate / direct_rate
        );
    }
    let _ = writeln!(
        table,
        "\n{} measured calls per latency cell after {} warm-up ones, direct and front door alternating; for \
         throughput the direct client runs its concurrent calls on its one session, and each front-door caller \
         is an MCP client of its own.",
        plan.iterations, plan.warmup
    );
    if let Ok(direct) = Arc::try_unwrap(direct) {
        direct.close().await;
    }
    Ok(table)
}
