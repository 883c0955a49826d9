//! The API's connections: at most `max_connections` open, each request's headers due within
//! `header_timeout` (which also bounds how long a connection may sit idle between requests) and its body
//! within `body_timeout` after them, and room made for a new client by closing the connection that has been
//! idle longest, so clients that never send a whole request cannot crowd out those that do.

use std::collections::HashMap;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

use crate::metrics::{Metric, Metrics};

/// How long accepting pauses after the process ran out of file descriptors (or another accept error).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// How long a connection may take, once the gateway is shutting down, to finish the response in progress.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// How many connections may be open, and how long a request's headers may take.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    pub header_timeout: Duration,
    pub body_timeout: Duration,
}

/// The open connections; cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Connections {
    table: Arc<Mutex<Table>>,
}

#[derive(Debug, Default)]
struct Table {
    next_id: u64,
    open: HashMap<u64, Connection>,
}

#[derive(Debug)]
struct Connection {
    /// Requests in progress: the handler has not finished writing its response.
    busy: usize,
    /// Since when nothing has been in progress.
    idle_since: Instant,
    /// Fired to close the connection at once.
    close: CancellationToken,
}

impl Connections {
    /// How many connections are open.
    pub fn open(&self) -> usize {
        self.lock().open.len()
    }

    /// Serves `router` on every connection `listener` accepts until `shutdown` fires, then lets each
    /// connection finish its requests in progress and waits for all of them.
    pub async fn serve(
        &self,
        listener: TcpListener,
        router: Router,
        limits: Limits,
        metrics: Metrics,
        shutdown: CancellationToken,
    ) {
        let tracker = TaskTracker::new();
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                () = shutdown.cancelled() => break,
            };
            let stream = match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    tracing::warn!(%error, "accepting a connection failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            };
            let Some((id, close)) = self.admit(limits.max_connections, &metrics) else {
                continue;
            };
            let serving = self
                .clone()
                .run(id, stream, close, router.clone(), limits, metrics.clone());
            tracker.spawn(serving.until_drained(shutdown.clone()));
        }
        drop(listener);
        tracker.close();
        tracker.wait().await;
    }

    /// Records a new connection, closing the longest-idle one first when all places are taken; `None` (the
    /// connection is refused) when every open connection has a request in progress.
    fn admit(&self, max: usize, metrics: &Metrics) -> Option<(u64, CancellationToken)> {
        let mut table = self.lock();
        if table.open.len() >= max {
            let idlest = table
                .open
                .iter()
                .filter(|(_, connection)| connection.busy == 0)
                .min_by_key(|(_, connection)| connection.idle_since)
                .map(|(id, _)| *id);
            let Some(idlest) = idlest else {
                metrics.inc(Metric::ConnectionsRefused, &[]);
                return None;
            };
            if let Some(evicted) = table.open.remove(&idlest) {
                evicted.close.cancel();
            }
            metrics.inc(Metric::ConnectionsEvicted, &[]);
        }
        let id = table.next_id;
        table.next_id += 1;
        let close = CancellationToken::new();
        let connection = Connection {
            busy: 0,
            idle_since: Instant::now(),
            close: close.clone(),
        };
        table.open.insert(id, connection);
        Some((id, close))
    }

    /// Serves one connection until it ends or is closed to make room.
    fn run(
        self,
        id: u64,
        stream: TcpStream,
        close: CancellationToken,
        router: Router,
        limits: Limits,
        metrics: Metrics,
    ) -> Serving<impl Future<Output = hyper::Result<()>> + Send + GracefulShutdown> {
        let _ = stream.set_nodelay(true);
        let connections = self.clone();
        let (closer, counter) = (close.clone(), metrics.clone());
        let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
            let busy = Busy::start(&connections, id);
            let request = request.map(|body| {
                if hyper::body::Body::is_end_stream(&body) {
                    return Body::new(body);
                }
                Body::new(Due {
                    body,
                    by: Instant::now() + limits.body_timeout,
                    sleep: None,
                    close: closer.clone(),
                    metrics: counter.clone(),
                })
            });
            let response = router.clone().oneshot(request);
            async move {
                let response = response.await?;
                Ok::<_, Infallible>(response.map(|body| Guarded::body(body, busy)))
            }
        });
        let mut builder = http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_timeout);
        Serving {
            connection: builder.serve_connection(TokioIo::new(stream), service),
            close,
            connections: self,
            id,
            metrics,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A connection being served.
struct Serving<C> {
    connection: C,
    close: CancellationToken,
    connections: Connections,
    id: u64,
    metrics: Metrics,
}

/// A connection that can be told to finish its current request and take no more.
trait GracefulShutdown {
    fn graceful_shutdown(self: Pin<&mut Self>);
}

impl<S, B> GracefulShutdown for http1::Connection<TokioIo<TcpStream>, S>
where
    S: hyper::service::HttpService<Incoming, ResBody = B>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: hyper::body::Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    fn graceful_shutdown(self: Pin<&mut Self>) {
        http1::Connection::graceful_shutdown(self);
    }
}

impl<C: Future<Output = hyper::Result<()>> + Send + GracefulShutdown> Serving<C> {
    /// Drives the connection; once `shutdown` fires it takes no new request and ends after the current one, or
    /// after `DRAIN_TIMEOUT`.
    async fn until_drained(self, shutdown: CancellationToken) {
        let Serving {
            connection,
            close,
            connections,
            id,
            metrics,
        } = self;
        let mut connection = std::pin::pin!(connection);
        let mut drained_by = None;
        let result = loop {
            let deadline = async {
                match drained_by {
                    Some(deadline) => tokio::time::sleep_until(deadline).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                result = connection.as_mut() => break Some(result),
                () = close.cancelled() => break None,
                () = shutdown.cancelled(), if drained_by.is_none() => {
                    drained_by = Some(tokio::time::Instant::now() + DRAIN_TIMEOUT);
                    connection.as_mut().graceful_shutdown();
                }
                // A client that does not read what it is sent does not hold the shutdown up.
                () = deadline => break None,
            }
        };
        if let Some(Err(error)) = result
            && error.is_timeout()
        {
            metrics.inc(Metric::ConnectionsTimedOut, &[]);
        }
        connections.lock().open.remove(&id);
    }
}

/// Marks a connection busy while one of its requests is in progress.
struct Busy {
    connections: Connections,
    id: u64,
}

impl Busy {
    fn start(connections: &Connections, id: u64) -> Self {
        if let Some(connection) = connections.lock().open.get_mut(&id) {
            connection.busy += 1;
        }
        Self {
            connections: connections.clone(),
            id,
        }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        if let Some(connection) = self.connections.lock().open.get_mut(&self.id) {
            connection.busy -= 1;
            if connection.busy == 0 {
                connection.idle_since = Instant::now();
            }
        }
    }
}

/// A response body that keeps a guard (its connection busy, a hold counted) until it is written or dropped.
pub struct Guarded<G> {
    body: Body,
    _guard: G,
}

impl<G: Send + Unpin + 'static> Guarded<G> {
    /// `body`, keeping `guard` until it is written or dropped.
    pub fn body(body: Body, guard: G) -> Body {
        Body::new(Self { body, _guard: guard })
    }
}

impl<G: Unpin> hyper::body::Body for Guarded<G> {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A request body due whole by a deadline: past it the connection is closed at once, so that a client that
/// sends its body a byte at a time holds nothing for longer than `body_timeout`.
struct Due {
    body: Incoming,
    by: Instant,
    /// Set the first time the body is not ready, so that a body that arrives whole arms no timer.
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    close: CancellationToken,
    metrics: Metrics,
}

impl hyper::body::Body for Due {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        match Pin::new(&mut self.body).poll_frame(cx) {
            Poll::Pending => {
                let by = self.by;
                let sleep = self.sleep.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(by)));
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.metrics.inc(Metric::ConnectionsTimedOut, &[]);
                self.close.cancel();
                Poll::Ready(Some(Err(axum::Error::new(
                    "the request body took longer than http.body_timeout",
                ))))
            }
            Poll::Ready(frame) => Poll::Ready(frame.map(|frame| frame.map_err(axum::Error::new))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// Raises the soft limit on open files to the hard limit where the system allows, and returns the soft
/// limit in effect.
pub fn raise_file_limit() -> Option<u64> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).ok()?;
    if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
        return Some(hard);
    }
    Some(soft)
}

/// The connection cap when the config sets none: half the open-file limit, leaving the rest for upstream
/// sessions, child processes' pipes, the store and webhooks.
pub fn default_max_connections(file_limit: Option<u64>) -> usize {
    let limit = file_limit.unwrap_or(1024).min(1 << 20);
    usize::try_from(limit / 2).unwrap_or(512).max(16)
}
