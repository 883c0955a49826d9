//! The store in a PostgreSQL database: one writer connection that commits every change waiting in one
//! transaction, side by side with the other replicas' writers, and shared connections for reads.

mod audit;
mod calls;
mod caps;
mod connection;
mod heartbeat;
mod maintenance;
mod raising;
mod recovery;
mod requests;
mod rounds;
mod rows;
mod schema;
mod statistics;
mod tail;
mod tx;
mod writer;
mod written;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_postgres::error::SqlState;

use super::{Kept, OpenError, StoreError};
use crate::feed::Feed;
use crate::ids::CallId;
use crate::lock;
use crate::time::Clock;
use connection::ReadSlot;
pub use connection::{Borrowed, Conn, Connector, Reader, Statements};
use heartbeat::Heartbeats;
pub use heartbeat::LEASE;
use tx::Tx;
use tx::{Raised, Turn};
use writer::{Applied, Change, Failed, Fate, Job};

/// The advisory lock a transaction that raises Requests holds until it commits: shared while it raises a few
/// far from the caps, alone otherwise (see [`Turn`]).
const RAISE_LOCK: i64 = 0x746e_6777_7261_6973;
/// The most that one transaction raising alongside others may raise, in all (see [`Postgres::raise`]).
const RAISED_ALONGSIDE: super::shares::Held = super::shares::Held {
    count: 16,
    bytes: 256 * 1024,
};
/// The class of the principals' advisory locks (two-key locks, which never meet the one-key ones above).
const PRINCIPAL_LOCKS: i32 = 0x746e_7072;
/// How many events one transaction may record: 2^20, the ids a transaction's id leaves room for. (JavaScript
/// reads event ids exactly while transaction ids stay below 2^33.)
const EVENTS_PER_TRANSACTION: i64 = 1 << 20;
/// The SQLSTATE of the error `toolnexus_expect(holds)` raises when `holds` is not true: a statement that checks
/// what its change expected of it with that function fails, with its transaction, when that does not hold.
const MISSED: &str = "TNX01";
/// How many calls or Requests one transaction ends or resolves, where a change may take on any number of them:
/// every transaction is short, as this replica's writer runs one at a time, and every replica publishes an event
/// only once each transaction that began before it has ended (BENCHMARKS.md, "Recovery: a replica, or its
/// upstream, dies holding waiting calls").
const PER_TRANSACTION: i64 = 256;
/// How many connections serve reads; each carries many reads at once.
pub const READERS: usize = 4;
/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The database's clock, in milliseconds since the Unix epoch: replicas' clocks never decide.
const DB_NOW: &str = "(extract(epoch from clock_timestamp()) * 1000)::BIGINT";

/// The PostgreSQL store; cheap to clone.
#[derive(Debug, Clone)]
pub struct Postgres {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    connector: Connector,
    /// Changes for the writer; `None` once the store is closed.
    jobs: Mutex<Option<mpsc::UnboundedSender<Job>>>,
    writer: Mutex<Option<JoinHandle<()>>>,
    readers: Vec<ReadSlot>,
    next_reader: AtomicUsize,
    /// This replica's id.
    replica: String,
    /// Stops the heartbeat and the tail of the event log.
    background: tokio_util::sync::CancellationToken,
    heartbeats: Heartbeats,
    clock: Clock,
    /// The calls this replica started whose change is not kept yet: a read of one waits until it is.
    starting: Mutex<HashMap<CallId, Starting>>,
    /// The running calls as this replica last wrote them, and the Requests it raised (see [`written`]).
    written: Arc<Mutex<written::LastWritten>>,
    statistics: Mutex<statistics::Statistics>,
    /// How many answers this replica is deciding and writing.
    answering: AtomicUsize,
}

/// Whether a call's start is kept, for every read of the call that waits for it.
type Starting = futures::future::Shared<Kept>;

impl Postgres {
    /// The clock this store stamps what it records by.
    pub fn clock(&self) -> &Clock {
        &self.shared.clock
    }

    /// Connects to the database at `url` as a replica with a new id; see [`Postgres::open_as`].
    pub async fn open(url: &str, feed: Feed, clock: Clock) -> Result<Self, OpenError> {
        Self::open_as(url, feed, &crate::ids::mint("replica-"), clock).await
    }

    /// Connects to the database at `url` as replica `replica`, brings its schema up to date, and starts its
    /// writer, its heartbeat and its tail of the event log.
    ///
    /// A database that cannot be reached, or whose schema is newer than this build, is an error naming the
    /// cause.
    pub async fn open_as(url: &str, feed: Feed, replica: &str, clock: Clock) -> Result<Self, OpenError> {
        let shown = crate::redact::url(url);
        let failed = |cause: String| OpenError {
            path: shown.clone(),
            cause,
        };
        let mut config: tokio_postgres::Config = url
            .parse()
            .map_err(|error: tokio_postgres::Error| failed(format!("it is not a PostgreSQL URL: {error}")))?;
        if config.get_password().is_none()
            && let Some(password) = std::env::var_os("PGPASSWORD")
        {
            config.password(password.as_encoded_bytes());
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        if config.get_application_name().is_none() {
            config.application_name(env!("CARGO_PKG_NAME"));
        }
        let connector = Connector { config };
        let admin = connector
            .connect()
            .await
            .map_err(|error| failed(format!("cannot connect: {}", describe(&error))))?;
        schema::migrate(&admin).await.map_err(failed)?;
        let started: Result<i64, tokio_postgres::Error> = async {
            admin.execute(&heartbeat::register_sql(), &[&replica]).await?;
            admin.query_one(maintenance::LAST_EVENT.as_str(), &[]).await?.try_get(0)
        }
        .await;
        let last_event = started.map_err(|error| failed(describe(&error)))?;
        let publisher = Arc::new(tail::Publisher::new(feed, u64::try_from(last_event).unwrap_or(0)));
        let (jobs, receiver) = mpsc::unbounded_channel();
        let written = Arc::default();
        let writer = tokio::spawn(writer::run(
            connector.clone(),
            receiver,
            Arc::clone(&written),
            publisher.clone(),
            replica.to_owned(),
            clock.clone(),
        ));
        let background = tokio_util::sync::CancellationToken::new();
        let store = Self {
            shared: Arc::new(Shared {
                connector,
                jobs: Mutex::new(Some(jobs)),
                writer: Mutex::new(Some(writer)),
                readers: (0..READERS).map(|_| ReadSlot::default()).collect(),
                next_reader: AtomicUsize::new(0),
                replica: replica.to_owned(),
                background: background.clone(),
                heartbeats: Heartbeats::registered(),
                clock,
                starting: Mutex::default(),
                written,
                statistics: Mutex::default(),
                answering: AtomicUsize::new(0),
            }),
        };
        tokio::spawn(tail::run(store.clone(), publisher, background.clone()));
        tokio::spawn(store.clone().beat(background));
        Ok(store)
    }

    /// This replica's id.
    pub fn replica(&self) -> &str {
        &self.shared.replica
    }

    /// Closes the store and says this replica is gone: the next replica to look ends what it leaves and
    /// takes its webhooks.
    pub async fn retire(&self) {
        self.close().await;
        let replica = self.shared.replica.clone();
        let retired = self
            .read(async |conn| {
                conn.query("UPDATE replicas SET heartbeat_at = 0 WHERE id = $1", &[&replica])
                    .await?;
                // Its webhooks go to another replica at once.
                conn.query(
                    "UPDATE webhook_cursors SET held_until = 0 WHERE holder = $1",
                    &[&replica],
                )
                .await
            })
            .await;
        if let Err(error) = retired {
            tracing::warn!(%error, "this replica could not say it is gone; others will end what it leaves after the lease");
        }
    }

    /// Lets the writer finish the changes it has and stops the heartbeat; later changes fail.
    pub async fn close(&self) {
        self.shared.background.cancel();
        drop(lock(&self.shared.jobs).take());
        let writer = lock(&self.shared.writer).take();
        if let Some(writer) = writer {
            let _ = writer.await;
        }
    }

    /// Applies a change in the writer, in a group of its own ([`Turn::Apart`]); the future resolves once it is
    /// kept, with what `work` returned.
    fn write<T: Send + 'static>(
        &self,
        work: impl for<'t, 'c> Fn(&'t mut Tx<'c>) -> tx::Work<'t, T> + Send + 'static,
    ) -> impl Future<Output = Result<T, StoreError>> + Send + 'static {
        let (sender, kept) = oneshot::channel();
        self.applied(
            again_if_undone(work, sender, Turn::Apart, Vec::new(), Raised::default(), true),
            kept,
        )
    }

    /// Applies a change that raises Requests in the writer, in `turn` ([`Turn::RaisingAlongside`] or
    /// [`Turn::RaisingAlone`]); the future resolves once it is kept, with what `work` returned.
    fn write_raising<T: Send + 'static>(
        &self,
        turn: Turn,
        raised: Raised,
        work: impl for<'t, 'c> Fn(&'t mut Tx<'c>) -> tx::Work<'t, T> + Send + 'static,
    ) -> impl Future<Output = Result<T, StoreError>> + Send + 'static {
        let (sender, kept) = oneshot::channel();
        self.applied(again_if_undone(work, sender, turn, Vec::new(), raised, true), kept)
    }

    /// Applies a change in the writer alongside the changes of its kind at the front of its queue (see
    /// [`Turn::Alongside`]); the future resolves once it is kept, with what `work` returned.
    pub(super) fn write_alongside<T: Send + 'static>(
        &self,
        work: impl for<'t, 'c> Fn(&'t mut Tx<'c>) -> tx::Work<'t, T> + Send + 'static,
    ) -> impl Future<Output = Result<T, StoreError>> + Send + 'static {
        self.write_holding(Vec::new(), work)
    }

    /// [`Self::write_alongside`], in a transaction holding the locks of `principals` (see
    /// [`Job::principals`]).
    fn write_holding<T: Send + 'static>(
        &self,
        principals: Vec<String>,
        work: impl for<'t, 'c> Fn(&'t mut Tx<'c>) -> tx::Work<'t, T> + Send + 'static,
    ) -> impl Future<Output = Result<T, StoreError>> + Send + 'static {
        let (sender, kept) = oneshot::channel();
        self.applied(
            again_if_undone(work, sender, Turn::Alongside, principals, Raised::default(), true),
            kept,
        )
    }

    /// Submits `job`; the future resolves with what `kept` receives once the writer has kept it, or why not.
    fn applied<T: Send + 'static>(
        &self,
        job: Job,
        kept: oneshot::Receiver<Result<T, StoreError>>,
    ) -> impl Future<Output = Result<T, StoreError>> + Send + 'static {
        let submitted = self.submit(job);
        async move {
            submitted?;
            kept.await.unwrap_or_else(|_| {
                Err(StoreError::Unavailable(
                    "the store could not apply the change".to_owned(),
                ))
            })
        }
    }

    /// Applies a change in the writer without waiting for it.
    fn write_behind(&self, work: impl for<'t, 'c> FnOnce(&'t mut Tx<'c>) -> tx::Work<'t, ()> + Send + 'static) {
        let change: Change = Box::new(move |tx| {
            Box::pin(async move {
                match work(tx).await {
                    Ok(()) => Ok(Applied {
                        reply: Box::new(|_| None),
                    }),
                    Err(error) => {
                        tracing::warn!(%error, "the store could not apply a change");
                        Err(Failed::Told)
                    }
                }
            })
        });
        let _ = self.submit(Job {
            change,
            turn: Turn::Apart,
            principals: Vec::new(),
            raised: Raised::default(),
            may_end: true,
        });
    }

    fn submit(&self, job: Job) -> Result<(), StoreError> {
        let jobs = lock(&self.shared.jobs);
        let sent = jobs.as_ref().is_some_and(|jobs| jobs.send(job).is_ok());
        if sent {
            Ok(())
        } else {
            Err(StoreError::Unavailable("the store is closed".to_owned()))
        }
    }

    /// A connection for reads; it sees every change kept so far.
    async fn reader(&self) -> Result<Arc<Conn>, StoreError> {
        let slot = &self.shared.readers[self.shared.next_reader.fetch_add(1, Ordering::Relaxed) % READERS];
        slot.conn(&self.shared.connector).await.map_err(|error| match error {
            Some(error) => {
                tracing::error!(%error, "the store cannot be reached");
                unavailable(&error)
            }
            None => StoreError::Unavailable("the store cannot be reached".to_owned()),
        })
    }

    /// Runs a read on a read connection.
    pub(super) async fn read<T>(
        &self,
        read: impl AsyncFnOnce(&Conn) -> Result<T, tokio_postgres::Error>,
    ) -> Result<T, StoreError> {
        let conn = self.reader().await?;
        read(&conn).await.map_err(|error| {
            tracing::error!(%error, "the store could not be read");
            unavailable(&error)
        })
    }

    /// Whether the database answers a query within [`CONNECT_TIMEOUT`].
    pub async fn reachable(&self) -> bool {
        let probe = self.read(async |conn| conn.query("SELECT 1", &[]).await);
        matches!(tokio::time::timeout(CONNECT_TIMEOUT, probe).await, Ok(Ok(_)))
    }

    /// How many Requests are pending.
    pub async fn pending_count(&self) -> Result<usize, StoreError> {
        self.read(async |conn| requests::pending_count(conn).await).await
    }

    /// How large the database is, in bytes.
    pub async fn size(&self) -> Option<u64> {
        self.read(async |conn| {
            let row = conn
                .query_opt("SELECT pg_database_size(current_database())", &[])
                .await?;
            Ok(row.map(|row| row.get::<_, i64>(0)))
        })
        .await
        .ok()
        .flatten()
        .and_then(|size| u64::try_from(size).ok())
    }
}

/// The job running `work` in `turn`, whose value goes to `sender` once the change is kept (or why it was not).
/// When another change's failure aborted or rolled back the transaction, or it lost a deadlock, the job comes
/// back to run again in the next one; so it does, not ending its transaction itself (`may_end`, see
/// [`Tx::closing`]), when a statement found that what the change expected did not hold ([`MISSED`]). A change
/// that moved to run alone ([`Tx::run_alone`]) comes back in the turn [`Turn::alone`] gives, to run in a later
/// transaction while this one goes on.
fn again_if_undone<T, W>(
    work: W,
    sender: oneshot::Sender<Result<T, StoreError>>,
    turn: Turn,
    principals: Vec<String>,
    raised: Raised,
    may_end: bool,
) -> Job
where
    T: Send + 'static,
    W: for<'t, 'c> Fn(&'t mut Tx<'c>) -> tx::Work<'t, T> + Send + 'static,
{
    let again = (principals.clone(), raised.clone());
    let change: Change = Box::new(move |tx| {
        Box::pin(async move {
            let ran = work(&mut *tx).await;
            if ran.is_ok() && tx.moved_alone.load(Ordering::Relaxed) {
                let again = again_if_undone(work, sender, turn.alone(), again.0, again.1, may_end);
                return Err(Failed::Alone(again));
            }
            match ran {
                Ok(value) => Ok(Applied {
                    reply: Box::new(move |fate| {
                        let kept = match fate {
                            Fate::Kept => Ok(value),
                            // Nothing of it was kept: it runs again.
                            Fate::RolledBack => {
                                return Some(again_if_undone(work, sender, turn, again.0, again.1, may_end));
                            }
                            Fate::Lost(error) => Err(error),
                        };
                        let _ = sender.send(kept);
                        None
                    }),
                }),
                Err(error) if error.code() == Some(&SqlState::IN_FAILED_SQL_TRANSACTION) => Err(Failed::Again(
                    again_if_undone(work, sender, turn, again.0, again.1, may_end),
                )),
                Err(error) if error.code() == Some(&SqlState::T_R_DEADLOCK_DETECTED) => {
                    tracing::info!(%error, "a change lost a conflict with another transaction; it runs again");
                    Err(Failed::Conflict(again_if_undone(
                        work, sender, turn, again.0, again.1, may_end,
                    )))
                }
                Err(error) if error.code().is_some_and(|code| code.code() == MISSED) => Err(Failed::Conflict(
                    again_if_undone(work, sender, turn, again.0, again.1, false),
                )),
                Err(error) => Err(told(&error, sender)),
            }
        })
    });
    Job {
        change,
        turn,
        principals,
        raised,
        may_end,
    }
}

/// Tells `sender` that its change failed with `error`.
fn told<T>(error: &tokio_postgres::Error, sender: oneshot::Sender<Result<T, StoreError>>) -> Failed {
    tracing::error!(%error, "the store could not apply a change");
    let _ = sender.send(Err(unavailable(error)));
    Failed::Told
}

/// The statement that takes the raising lock shared for the rest of the transaction, as a change raising
/// alongside others does.
#[cfg(test)]
pub fn raising_lock_shared() -> String {
    format!("SELECT pg_advisory_xact_lock_shared({RAISE_LOCK})")
}

/// The statement that takes `principal`'s lock for the rest of the transaction, as a change checking its
/// counts against a cap does.
#[cfg(test)]
pub fn principal_lock(principal: &str) -> String {
    writer::principal_lock(writer::principal_key(principal))
}

/// The first schema's statements, to build a database as the first release wrote it.
#[cfg(test)]
pub fn first_schema() -> &'static str {
    schema::MIGRATIONS[0]
}

/// A PostgreSQL error in words a person can act on.
fn describe(error: &tokio_postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => format!("{}: {}", db.severity(), db.message()),
        None => error.to_string(),
    }
}

/// A runtime failure of the database, for callers.
fn unavailable(error: &tokio_postgres::Error) -> StoreError {
    StoreError::Unavailable(describe(error))
}
