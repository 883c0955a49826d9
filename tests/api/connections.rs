//! Clients that open connections and never finish a request: they are timed out, and they cannot crowd
//! out clients that do finish theirs.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::helpers::{TestApp, start_under_file_limit, start_with};

/// Opens a connection and sends half a request head, as a slow-header attacker does.
async fn half_a_request(app: &TestApp) -> TcpStream {
    let address = app.address.trim_start_matches("http://");
    let mut stream = TcpStream::connect(address).await.unwrap();
    let head = format!("GET /healthz HTTP/1.1\r\nHost: {address}\r\nX-Slow: ");
    stream.write_all(head.as_bytes()).await.unwrap();
    stream
}

/// A metric's value in the `/metrics` text (0 when the series is absent).
async fn metric(app: &TestApp, name: &str) -> f64 {
    let text = app.get("/metrics").await.text().await.unwrap();
    text.lines()
        .find_map(|line| line.strip_prefix(&format!("{name} ")))
        .map_or(0.0, |value| value.parse().unwrap())
}

#[tokio::test]
async fn headers_that_do_not_arrive_in_time_close_the_connection() {
    let app = start_with("[http]\nheader_timeout = \"1s\"\n", "", "");
    let mut stream = half_a_request(&app).await;

    let mut buffer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut buffer)).await;

    assert!(read.is_ok(), "the connection is still open after 20 s");
    app.metric_reaches("toolnexus_connections_timed_out_total 1").await;
}

#[tokio::test]
async fn connections_that_never_finish_a_request_cannot_starve_health_checks() {
    // The gateway may hold at most 128 files, so its connection cap is 64.
    let app = start_under_file_limit(128, "[http]\nheader_timeout = \"5m\"\n", "");
    let mut attackers = Vec::new();
    for _ in 0..300 {
        attackers.push(half_a_request(&app).await);
    }

    let fresh = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
    for _ in 0..5 {
        let health = fresh
            .get(format!("{}/healthz", app.address))
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .expect("/healthz answers while connections are held open");
        assert_eq!(health.status(), 200);
    }

    assert!(metric(&app, "toolnexus_connections_evicted_total").await >= 236.0);
    assert!(metric(&app, "toolnexus_connections").await <= 64.0);
    drop(attackers);
}

#[tokio::test]
async fn a_slow_body_without_a_token_is_answered_401_and_closed_at_once() {
    let digest = toolnexus_gateway::auth::digest_hex("secret");
    let tokens = format!("[[auth.tokens]]\nname = \"ops\"\nrole = \"admin\"\nsha256 = \"{digest}\"\n");
    let app = start_with("", &tokens, "");
    let address = app.address.trim_start_matches("http://");
    let mut stream = TcpStream::connect(address).await.unwrap();
    let head = format!(
        "POST /calls HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{{"
    );
    stream.write_all(head.as_bytes()).await.unwrap();

    let mut response = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut response)).await;

    assert!(read.is_ok(), "the connection is still open after 20 s");
    let response = String::from_utf8_lossy(&response);
    assert!(response.starts_with("HTTP/1.1 401"), "{response}");
}

/// Sends a request head with a valid token, then its body a byte every 100 ms, until the gateway closes the
/// connection (after answering, or not) or the whole body is sent; says whether the gateway closed it first.
async fn trickle(app: &TestApp, path: &str) -> bool {
    let address = app.address.trim_start_matches("http://");
    let mut stream = TcpStream::connect(address).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer ops-token\r\n\
         Accept: application/json, text/event-stream\r\nContent-Type: application/json\r\nContent-Length: 2000\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let (mut reader, mut writer) = stream.split();
    let mut interval = tokio::time::interval(Duration::from_millis(100));
    let mut seen = [0u8; 1];
    for _ in 0..2000 {
        tokio::select! {
            read = reader.read(&mut seen) => if matches!(read, Ok(0) | Err(_)) { return true },
            _ = interval.tick() => if writer.write_all(b" ").await.is_err() { return true },
        }
    }
    false
}

#[tokio::test]
async fn a_body_sent_a_byte_at_a_time_with_a_valid_token_is_cut_off_at_the_body_timeout() {
    let settings = format!(
        "[http]\nbody_timeout = \"1s\"\n[auth]\npublic_metrics = true\n{}",
        crate::helpers::token_entry("ops", "admin")
    );
    let app = start_with(&settings, crate::helpers::BOTH_ERAS, "");
    for path in ["/calls", "/mcp"] {
        assert!(
            trickle(&app, path).await,
            "{path}: the connection outlived the body's 200 s"
        );
    }
    app.metric_reaches("toolnexus_connections_timed_out_total 2").await;
    let health = app.get("/healthz").await;
    assert_eq!(health.status(), 200);
}
