//! The store in a SQLite database file: WAL, a sync to disk before a change counts as kept, one writer
//! thread that commits every change waiting in one transaction, and read-only connections for reads.

mod audit;
mod calls;
mod deferred;
mod files;
mod live;
mod maintenance;
mod requests;
mod rounds;
mod rows;
mod schema;
mod writer;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::Duration;

use nix::fcntl::{Flock, FlockArg};
use rusqlite::{Connection, OpenFlags};
use tokio::sync::oneshot;

use super::{OpenError, StoreError};
use crate::feed::Feed;
use crate::lock;
use crate::time::Clock;
use writer::{Applied, Job, Message, Tx};

/// How long a statement waits for a lock another process holds (a backup copying the file).
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// How many idle read connections are kept.
const MAX_IDLE_READERS: usize = 8;
/// How many prepared statements each connection keeps: more than the store has, so none is prepared twice.
const STATEMENT_CACHE: usize = 128;

/// The SQLite store; cheap to clone.
#[derive(Debug, Clone)]
pub struct Sqlite {
    shared: Arc<Shared>,
}

struct Shared {
    path: PathBuf,
    /// What the writer is sent; `None` once the store is closed.
    jobs: Mutex<Option<mpsc::Sender<Message>>>,
    writer: Mutex<Option<JoinHandle<()>>>,
    readers: Mutex<Vec<Connection>>,
    /// The status and owner of the live records, as last kept (the writer keeps it).
    live: Arc<Mutex<crate::store::live::Live>>,
    /// The calls recorded but not written yet.
    deferred: Arc<deferred::Deferred>,
    clock: Clock,
    /// Held while the store is open, so that a second gateway cannot open the same file.
    _lock: Flock<File>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl Sqlite {
    /// Opens (or creates) the database at `path`, brings its schema up to date and starts its writer.
    ///
    /// A file that another gateway holds, that cannot be written, that is not a SQLite database, whose schema is
    /// newer than this build, or that is a symbolic link is an error naming the cause; it is never replaced. The
    /// files are created owner-only, and made so when others may read them.
    pub fn open(path: &Path, feed: Feed, clock: Clock) -> Result<Self, OpenError> {
        let failed = |cause: String| OpenError {
            path: path.display().to_string(),
            cause,
        };
        if let Some(directory) = path.parent().filter(|directory| !directory.as_os_str().is_empty()) {
            files::create_directory(directory).map_err(failed)?;
        }
        let lock = lock_file(path).map_err(failed)?;
        files::prepare(path).map_err(failed)?;
        // Not SQLITE_OPEN_NOFOLLOW: it also refuses a symbolic link among the directories above the file.
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(path, flags).map_err(|error| failed(describe(&error)))?;
        configure(&conn).map_err(failed)?;
        migrate(&conn).map_err(failed)?;
        let live = live::load(&conn).map_err(|error| failed(describe(&error)))?;
        let live = Arc::new(Mutex::new(live));
        let (jobs, receiver) = mpsc::channel();
        let kept = live.clone();
        let deferred = Arc::new(deferred::Deferred::default());
        let to_write = deferred.clone();
        let writer_clock = clock.clone();
        let writer = std::thread::Builder::new()
            .name("store-writer".to_owned())
            .spawn(move || writer::run(conn, receiver, feed, kept, to_write, writer_clock))
            .map_err(|error| failed(format!("cannot start its writer thread: {error}")))?;
        Ok(Self {
            shared: Arc::new(Shared {
                path: path.to_owned(),
                jobs: Mutex::new(Some(jobs)),
                writer: Mutex::new(Some(writer)),
                readers: Mutex::default(),
                live,
                deferred,
                clock,
                _lock: lock,
            }),
        })
    }

    /// The clock this store stamps what it records by.
    pub fn clock(&self) -> &Clock {
        &self.shared.clock
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.shared.path
    }

    /// Lets the writer finish the changes it has, and stops it; later changes fail.
    pub fn close(&self) {
        drop(lock(&self.shared.jobs).take());
        if let Some(writer) = lock(&self.shared.writer).take() {
            let _ = writer.join();
        }
    }

    /// Applies a change in the writer; the future resolves once it is kept, with what `work` returned.
    pub(super) fn write<T: Send + 'static>(
        &self,
        work: impl FnOnce(&mut Tx<'_>) -> rusqlite::Result<T> + Send + 'static,
    ) -> impl Future<Output = Result<T, StoreError>> + Send + 'static {
        let (sender, receiver) = oneshot::channel();
        let job: Job = Box::new(move |tx| match work(tx) {
            Ok(value) => Ok(Applied {
                reply: Box::new(move |kept| {
                    let _ = sender.send(kept.map(|()| value));
                }),
            }),
            Err(error) => {
                tracing::error!(%error, "the store could not apply a change");
                let _ = sender.send(Err(unavailable(&error)));
                Err(())
            }
        });
        let submitted = self.submit(job);
        async move {
            submitted?;
            receiver.await.unwrap_or_else(|_| {
                Err(StoreError::Unavailable(
                    "the store could not apply the change".to_owned(),
                ))
            })
        }
    }

    /// Applies a change in the writer without waiting for it.
    fn write_behind(&self, work: impl FnOnce(&mut Tx<'_>) -> rusqlite::Result<()> + Send + 'static) {
        let job: Job = Box::new(move |tx| match work(tx) {
            Ok(()) => Ok(Applied {
                reply: Box::new(|_| {}),
            }),
            Err(error) => {
                tracing::warn!(%error, "the store could not apply a change");
                Err(())
            }
        });
        let _ = self.submit(job);
    }

    fn submit(&self, job: Job) -> Result<(), StoreError> {
        if self.send(Message::Change(job)) {
            Ok(())
        } else {
            Err(StoreError::Unavailable("the store is closed".to_owned()))
        }
    }

    /// Sends the writer `message`; whether it is running to take it.
    fn send(&self, message: Message) -> bool {
        let jobs = lock(&self.shared.jobs);
        jobs.as_ref().is_some_and(|jobs| jobs.send(message).is_ok())
    }

    /// Runs a read on a read-only connection; it sees every change kept so far.
    pub(super) fn read<T>(&self, read: impl FnOnce(&Connection) -> rusqlite::Result<T>) -> Result<T, StoreError> {
        let idle = lock(&self.shared.readers).pop();
        let conn = match idle {
            Some(conn) => conn,
            None => open_reader(&self.shared.path).map_err(|error| unavailable(&error))?,
        };
        let result = read(&conn).map_err(|error| {
            tracing::error!(%error, "the store could not be read");
            unavailable(&error)
        });
        let mut readers = lock(&self.shared.readers);
        if readers.len() < MAX_IDLE_READERS {
            readers.push(conn);
        }
        result
    }

    /// How many Requests are pending.
    pub async fn pending_count(&self) -> Result<usize, StoreError> {
        Ok(lock(&self.shared.live).pending())
    }

    /// How large the database is, in bytes.
    pub async fn size(&self) -> Option<u64> {
        self.read(|conn| {
            conn.query_row(
                "SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()",
                [],
                |row| row.get::<_, i64>(0),
            )
        })
        .ok()
        .and_then(|size| u64::try_from(size).ok())
    }
}

/// Copies the database at `path` to the new file `to`: a consistent snapshot, taken while a gateway may be
/// writing to it (it only reads). `to` is created owner-only; a file or a symbolic link there is refused.
pub fn backup(path: &Path, to: &Path) -> Result<(), OpenError> {
    let failed = |cause: String| OpenError {
        path: path.display().to_string(),
        cause,
    };
    let refused = |why: String| failed(format!("cannot copy it to {}: {why}", to.display()));
    if let Some(why) = files::occupied(to) {
        return Err(refused(format!("{why}; name a new file")));
    }
    if !path.exists() {
        return Err(failed("there is no such file".to_owned()));
    }
    let conn = open_reader(path).map_err(|error| failed(describe(&error)))?;
    migrate_check(&conn).map_err(failed)?;
    files::create_new(to).map_err(refused)?;
    conn.execute("VACUUM INTO ?1", [to.to_string_lossy()])
        .map_err(|error| failed(format!("cannot copy it to {}: {}", to.display(), describe(&error))))?;
    Ok(())
}

/// The first schema's statements, to build a database as the first release wrote it.
#[cfg(test)]
pub fn first_schema() -> &'static str {
    schema::MIGRATIONS[0]
}

/// Refuses a database this build cannot read: not SQLite, or a newer schema.
fn migrate_check(conn: &Connection) -> Result<(), String> {
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .map_err(|error| describe(&error))?;
    if version > schema::version() {
        return Err(format!(
            "its schema is version {version}, newer than this build knows ({})",
            schema::version()
        ));
    }
    Ok(())
}

/// Takes the lock that makes a database file one gateway's: an exclusive `flock` on `PATH.lock`.
fn lock_file(path: &Path) -> Result<Flock<File>, String> {
    let file = files::open_lock(path).map_err(|error| format!("its lock file: {error}"))?;
    Flock::lock(file, FlockArg::LockExclusiveNonblock).map_err(|(_, errno)| {
        if errno == nix::errno::Errno::EWOULDBLOCK {
            "another process is using it (its lock file is held): stop that gateway, or give this one another \
             store"
                .to_owned()
        } else {
            format!("cannot lock it: {errno}")
        }
    })
}

/// WAL, a sync to disk before a commit returns, a wait for locks other processes hold briefly, and no temp
/// files.
fn configure(conn: &Connection) -> Result<(), String> {
    conn.busy_timeout(BUSY_TIMEOUT).map_err(|error| describe(&error))?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
        .map_err(|error| describe(&error))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(format!("it cannot be put in WAL mode (it stays in {mode} mode)"));
    }
    conn.execute_batch("PRAGMA synchronous = FULL; PRAGMA temp_store = MEMORY;")
        .map_err(|error| describe(&error))
}

/// Brings the schema up to date, refusing a database written by a newer build.
fn migrate(conn: &Connection) -> Result<(), String> {
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .map_err(|error| describe(&error))?;
    for (to, migration) in super::migrations::pending(schema::MIGRATIONS, version, "store")? {
        conn.execute_batch(&format!(
            "BEGIN IMMEDIATE; {migration}; PRAGMA user_version = {to}; COMMIT;"
        ))
        .map_err(|error| {
            let _ = conn.execute_batch("ROLLBACK");
            format!("cannot bring its schema to version {to}: {}", describe(&error))
        })?;
    }
    Ok(())
}

fn open_reader(path: &Path) -> rusqlite::Result<Connection> {
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags)?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    conn.execute_batch("PRAGMA temp_store = MEMORY;")?;
    Ok(conn)
}

/// A SQLite error in words a person can act on.
fn describe(error: &rusqlite::Error) -> String {
    use rusqlite::ErrorCode;
    match error.sqlite_error_code() {
        Some(ErrorCode::NotADatabase) => "it is not a SQLite database (or it is corrupt)".to_owned(),
        Some(ErrorCode::DatabaseCorrupt) => format!("the database is corrupt: {error}"),
        Some(ErrorCode::ReadOnly | ErrorCode::PermissionDenied | ErrorCode::CannotOpen) => {
            format!("it cannot be written: {error} (check the permissions of the file and its directory)")
        }
        Some(ErrorCode::DiskFull) => format!("the disk is full: {error}"),
        _ => error.to_string(),
    }
}

/// A runtime failure of the database, for callers.
fn unavailable(error: &rusqlite::Error) -> StoreError {
    StoreError::Unavailable(describe(error))
}
