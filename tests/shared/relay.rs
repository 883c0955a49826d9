//! A loopback TCP relay in front of the database that counts round trips — a connection's client starts one
//! each time it sends after having received something (or sends first); statements sent together, or sent
//! before the replies to earlier ones arrive (pipelined), share one — and that can cut its client off from the
//! database and heal. The benchmark (`benches/gateway`) counts with it; the fault-schedule runner
//! (`tests/chaos`) cuts a replica off with it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use anyhow::Context;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A relay accepting connections until dropped.
pub struct Relay {
    /// The database's URL with the relay's port in place of the server's.
    pub url: String,
    round_trips: Arc<AtomicU64>,
    /// True while the relay is cut: every connection it relays is closed, and new ones are closed at once.
    cut: watch::Sender<bool>,
    accepting: tokio::task::JoinHandle<()>,
}

impl Relay {
    /// Relays each connection to the server of `url` (a `postgres://…@127.0.0.1:PORT/…` URL).
    pub async fn in_front_of(url: &str) -> anyhow::Result<Self> {
        let (head, tail) = url.split_once("@127.0.0.1:").context("a loopback database URL")?;
        let (target, database) = tail.split_once('/').context("a database in the URL")?;
        let target: u16 = target.parse().context("the URL's port")?;
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let round_trips = Arc::new(AtomicU64::new(0));
        let counted = round_trips.clone();
        let (cut, _) = watch::channel(false);
        let cutting = cut.clone();
        let accepting = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let mut cut = cutting.subscribe();
                if *cut.borrow_and_update() {
                    continue;
                }
                let counted = counted.clone();
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(("127.0.0.1", target)).await {
                        tokio::select! {
                            () = relay(client, server, counted) => {}
                            _ = cut.wait_for(|cut| *cut) => {}
                        }
                    }
                });
            }
        });
        Ok(Self {
            url: format!("{head}@127.0.0.1:{port}/{database}"),
            round_trips,
            cut,
            accepting,
        })
    }

    /// Cuts the client off from the database: every connection is closed, and new ones are closed at once.
    pub fn cut(&self) {
        self.cut.send_replace(true);
    }

    /// Relays connections again.
    pub fn heal(&self) {
        self.cut.send_replace(false);
    }

    /// Round trips started so far, over every connection.
    pub fn round_trips(&self) -> u64 {
        self.round_trips.load(Ordering::Relaxed)
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

/// Copies both ways until either side closes, counting the client's turns.
async fn relay(client: TcpStream, server: TcpStream, round_trips: Arc<AtomicU64>) {
    let _ = (client.set_nodelay(true), server.set_nodelay(true));
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_server, mut to_server) = server.into_split();
    // Whether the server has sent something since the client last did.
    let replied = Arc::new(AtomicBool::new(true));
    let heard = replied.clone();
    let upstream = async move {
        let mut buffer = vec![0; 64 * 1024];
        while let Ok(read) = from_client.read(&mut buffer).await
            && read > 0
        {
            if heard.swap(false, Ordering::AcqRel) {
                round_trips.fetch_add(1, Ordering::Relaxed);
            }
            if to_server.write_all(&buffer[..read]).await.is_err() {
                break;
            }
        }
    };
    let downstream = async move {
        let mut buffer = vec![0; 64 * 1024];
        while let Ok(read) = from_server.read(&mut buffer).await
            && read > 0
        {
            replied.store(true, Ordering::Release);
            if to_client.write_all(&buffer[..read]).await.is_err() {
                break;
            }
        }
    };
    tokio::select! {
        () = upstream => {}
        () = downstream => {}
    }
}
