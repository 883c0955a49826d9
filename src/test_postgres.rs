//! A throwaway PostgreSQL server for tests: initdb into a temp dir, `postgres` on a free loopback port, and
//! a fresh database per test. The library's unit tests, the black-box tests in `tests/api`, the fault-schedule
//! runner and the bench each compile this file, so it uses std, `tempfile` and `nix` only, and no async runtime.
//!
//! The server never outlives the test process: a `sh` watchdog runs initdb and the server, and its standard
//! input is a pipe only the test process holds. When that pipe closes (the [`Cluster`] is dropped, or the
//! process ends in any way, SIGKILL included) the watchdog stops the server at once and removes the
//! cluster's directory.

use std::env;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::os::unix::fs::chown;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread::sleep;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tempfile::TempDir;

/// The URL of an existing server for [`shared`] to use instead of starting one.
pub const EXTERNAL_ENV: &str = "TOOLNEXUS_TEST_POSTGRES";

/// Where Debian's `postgresql-15` package puts the server's programs; searched before `pg_config --bindir`
/// and `PATH`.
const DEBIAN_BINDIR: &str = "/usr/lib/postgresql/15/bin";
/// How long a starting server may take to accept connections before the test fails with its log.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How often a starting server is asked whether it is ready.
const READY_POLL: Duration = Duration::from_millis(50);
/// How many free ports are tried when another process takes the one just picked.
const PORT_ATTEMPTS: usize = 5;
/// Settings for speed over durability: a cluster lives only as long as its tests.
const FAST: [&str; 5] = [
    "listen_addresses=127.0.0.1",
    "fsync=off",
    "synchronous_commit=off",
    "full_page_writes=off",
    "max_connections=300",
];
/// Settings for measurements: a commit is on disk before the server acknowledges it, as in production.
const DURABLE: [&str; 5] = [
    "listen_addresses=127.0.0.1",
    "fsync=on",
    "synchronous_commit=on",
    "full_page_writes=on",
    "max_connections=300",
];
/// The extension that counts statements, loaded by a durable cluster when the server has it.
const STATEMENT_STATS: &str = "pg_stat_statements";
/// The file in the cluster's dir that initdb and the server write their output to (the watchdog's `$log`).
const LOG: &str = "server.log";
/// What the server logs as it exits, whether it was stopped or failed to start.
const EXITED: &str = "database system is shut down";
/// What the server logs when another process holds its port.
const PORT_TAKEN: &str = "could not create any TCP/IP sockets";

/// The watchdog, run as `sh -c WATCHDOG watchdog DIR INITDB POSTGRES SETTINGS..`. It runs initdb into DIR/data
/// and says `initialized` or `failed`, then reads `start PORT` and `stop` from its standard input and
/// acknowledges each (`halt` stops the server the way a crash would: immediate shutdown). At end of input (its test process is gone or done) it stops the server, immediate
/// shutdown, and removes DIR, the cluster's own temp dir. SIGPIPE is ignored so that an answer to a test
/// process that is gone does not kill it before that.
const WATCHDOG: &str = r#"
trap '' PIPE
dir=$1 initdb=$2 postgres=$3
shift 3
log=$dir/server.log
pid=
if "$initdb" -D "$dir/data" -A trust -U postgres --no-sync -E UTF8 --locale=C </dev/null >>"$log" 2>&1; then
    echo initialized
else
    echo failed
fi
while read -r command port; do
    case $command in
    start)
        "$postgres" -D "$dir/data" -k "$dir" -p "$port" "$@" </dev/null >>"$log" 2>&1 &
        pid=$!
        echo started ;;
    stop)
        [ -n "$pid" ] && kill -INT "$pid" 2>/dev/null && wait "$pid"
        pid=
        echo stopped ;;
    halt)
        [ -n "$pid" ] && kill -QUIT "$pid" 2>/dev/null && wait "$pid"
        pid=
        echo stopped ;;
    esac
done
[ -n "$pid" ] && kill -QUIT "$pid" 2>/dev/null && wait "$pid"
rm -rf -- "$dir"
"#;

/// A PostgreSQL server for tests: one this process started, or an existing one named by [`EXTERNAL_ENV`].
pub struct Cluster {
    server: Server,
}

enum Server {
    Local(Local),
    /// An existing server: databases are made on it, but it cannot be stopped.
    External {
        url: String,
    },
}

/// A server this process started, with its data in a temp dir.
struct Local {
    /// Locked for a whole start or stop, so concurrent callers see one state. Dropped before `dir`: the
    /// server stops before its files go.
    watchdog: Mutex<Watchdog>,
    dir: TempDir,
    port: u16,
}

/// The watchdog process and the two ends of its pipes; dropping it stops the server and removes its dir.
struct Watchdog {
    child: Child,
    /// Its standard input: closing it stops the server. Taken on drop.
    commands: Option<ChildStdin>,
    replies: BufReader<ChildStdout>,
    running: bool,
}

/// The cluster of this test process, started on first use, or the server that [`EXTERNAL_ENV`] names.
pub fn shared() -> &'static Cluster {
    static SHARED: OnceLock<Cluster> = OnceLock::new();
    SHARED.get_or_init(|| match env::var(EXTERNAL_ENV) {
        Ok(url) if !url.is_empty() => Cluster {
            server: Server::External { url },
        },
        _ => Cluster::start(),
    })
}

impl Cluster {
    /// Starts a new server in a fresh temp dir, tuned for speed over durability, and waits until it accepts
    /// connections.
    pub fn start() -> Cluster {
        Cluster::start_with(FAST.iter().map(|setting| (*setting).to_owned()).collect())
    }

    /// Starts a new server that keeps every commit on disk before acknowledging it (`fsync`,
    /// `synchronous_commit` and `full_page_writes` on), for measurements; it loads `pg_stat_statements` when
    /// the server has it, so that [`Cluster::counts_statements`] can be true.
    pub fn start_durable() -> Cluster {
        let mut settings: Vec<String> = DURABLE.iter().map(|setting| (*setting).to_owned()).collect();
        if has_library(STATEMENT_STATS) {
            settings.push(format!("shared_preload_libraries={STATEMENT_STATS}"));
        }
        Cluster::start_with(settings)
    }

    /// Creates `pg_stat_statements` in database `url`; false when the server did not load it.
    pub fn counts_statements(&self, url: &str) -> bool {
        psql(url, &format!("CREATE EXTENSION IF NOT EXISTS {STATEMENT_STATS}")).is_ok()
            && psql(url, "SELECT count(*) FROM pg_stat_statements").is_ok()
    }

    /// Runs one SQL statement in database `url`; what it printed (unaligned, tuples only), or its error.
    pub fn query(&self, url: &str, sql: &str) -> Result<String, String> {
        psql(url, sql)
    }

    fn start_with(settings: Vec<String>) -> Cluster {
        let dir = tempfile::Builder::new()
            .prefix("toolnexus-postgres-")
            .tempdir()
            .expect("a temp dir for the cluster");
        let mut watchdog = Watchdog::spawn(dir.path(), &settings);
        if watchdog.reply() != "initialized" {
            panic!("initdb failed; its output:\n{}", read_log(dir.path(), 0));
        }
        for attempt in 1..=PORT_ATTEMPTS {
            let port = free_port();
            let log_start = log_len(dir.path());
            watchdog.send(&format!("start {port}"), "started");
            match wait_ready(dir.path(), port, log_start) {
                Ok(()) => {
                    watchdog.running = true;
                    let watchdog = Mutex::new(watchdog);
                    return Cluster {
                        server: Server::Local(Local { watchdog, dir, port }),
                    };
                }
                Err(log) if log.contains(PORT_TAKEN) && attempt < PORT_ATTEMPTS => continue,
                Err(log) => panic!("PostgreSQL did not start on port {port}; its log:\n{log}"),
            }
        }
        unreachable!("the last attempt returns or panics")
    }

    /// Creates a new empty database with a name of its own and returns its URL.
    pub fn database(&self) -> String {
        static COUNT: AtomicU64 = AtomicU64::new(0);
        let since_epoch = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        // The time and the process id keep names apart across runs and test binaries sharing a server.
        let name = format!(
            "toolnexus_{}_{}_{}",
            since_epoch.as_secs(),
            std::process::id(),
            COUNT.fetch_add(1, Ordering::Relaxed)
        );
        let admin = self.url("postgres");
        psql(&admin, &format!("CREATE DATABASE {name} TEMPLATE template0"))
            .unwrap_or_else(|error| panic!("cannot create database {name}: {error}"));
        self.url(&name)
    }

    /// Stops the server (fast shutdown): connections fail until [`Cluster::restart`].
    pub fn stop(&self) {
        self.local("stop").watchdog().stop();
    }

    /// Stops the server with immediate shutdown, as a crash would (it recovers from its WAL at the next start):
    /// connections fail until [`Cluster::restart`].
    pub fn halt(&self) {
        self.local("halt").watchdog().halt();
    }

    /// Starts the server again on the same port with the same data, stopping it first if it runs.
    pub fn restart(&self) {
        let local = self.local("restart");
        let mut watchdog = local.watchdog();
        watchdog.stop();
        let log_start = log_len(local.dir.path());
        watchdog.send(&format!("start {}", local.port), "started");
        if let Err(log) = wait_ready(local.dir.path(), local.port, log_start) {
            panic!("PostgreSQL did not restart on port {}; its log:\n{log}", local.port);
        }
        watchdog.running = true;
    }

    /// The URL of database `name` on this server.
    fn url(&self, name: &str) -> String {
        match &self.server {
            Server::Local(local) => format!("postgres://postgres@127.0.0.1:{}/{name}", local.port),
            Server::External { url } => with_database(url, name),
        }
    }

    fn local(&self, verb: &str) -> &Local {
        match &self.server {
            Server::Local(local) => local,
            Server::External { .. } => panic!(
                "cannot {verb} the server that {EXTERNAL_ENV} names: use Cluster::start() for a test that \
                 takes the database away"
            ),
        }
    }
}

impl Local {
    fn watchdog(&self) -> MutexGuard<'_, Watchdog> {
        self.watchdog.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Watchdog {
    /// Starts the watchdog on `dir`, as the `postgres` user when this process is root (PostgreSQL refuses
    /// to run as root); it begins with initdb.
    fn spawn(dir: &Path, settings: &[String]) -> Watchdog {
        let mut command = Command::new("sh");
        command
            .args(["-c", WATCHDOG, "watchdog"])
            .arg(dir)
            .arg(program("initdb"))
            .arg(program("postgres"));
        for setting in settings {
            command.arg("-c").arg(setting);
        }
        if nix::unistd::geteuid().is_root() {
            let user = nix::unistd::User::from_name("postgres")
                .expect("the user database can be read")
                .expect("a `postgres` user to run PostgreSQL as, which refuses to run as root");
            chown(dir, Some(user.uid.as_raw()), Some(user.gid.as_raw())).expect("the cluster's dir for postgres");
            command.uid(user.uid.as_raw()).gid(user.gid.as_raw());
        }
        // A group of its own: a Ctrl-C at the terminal ends the test process, whose pipe then stops the server.
        command.process_group(0).current_dir(dir).env("LC_ALL", "C");
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("sh runs the cluster's watchdog");
        let commands = child.stdin.take();
        let replies = BufReader::new(child.stdout.take().expect("the watchdog's stdout is piped"));
        Watchdog {
            child,
            commands,
            replies,
            running: false,
        }
    }

    /// Stops the server if it runs.
    fn stop(&mut self) {
        if self.running {
            self.send("stop", "stopped");
            self.running = false;
        }
    }

    /// Stops the server at once if it runs.
    fn halt(&mut self) {
        if self.running {
            self.send("halt", "stopped");
            self.running = false;
        }
    }

    /// Sends one command and waits for its acknowledgement.
    fn send(&mut self, command: &str, ack: &str) {
        let commands = self.commands.as_mut().expect("the watchdog's stdin is open until drop");
        writeln!(commands, "{command}").expect("the watchdog reads its commands");
        let reply = self.reply();
        assert_eq!(reply, ack, "the cluster's watchdog answered {command:?} with {reply:?}");
    }

    /// The watchdog's next line, empty if it has exited.
    fn reply(&mut self) -> String {
        let mut reply = String::new();
        self.replies.read_line(&mut reply).expect("the watchdog's reply");
        reply.trim_end().to_owned()
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        drop(self.commands.take());
        let _ = self.child.wait();
    }
}

/// Waits until the server on `port` accepts connections, or returns its log written since `log_start`
/// once it has exited or [`READY_TIMEOUT`] has passed.
fn wait_ready(dir: &Path, port: u16, log_start: u64) -> Result<(), String> {
    let deadline = Instant::now() + READY_TIMEOUT;
    let port = port.to_string();
    loop {
        let ready = Command::new(program("pg_isready"))
            .args([
                "-q",
                "-t",
                "1",
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-U",
                "postgres",
                "-d",
                "postgres",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("pg_isready runs");
        if ready.success() {
            return Ok(());
        }
        let log = read_log(dir, log_start);
        if log.contains(EXITED) {
            return Err(log);
        }
        if Instant::now() > deadline {
            return Err(format!("{log}(not ready after {READY_TIMEOUT:?})"));
        }
        sleep(READY_POLL);
    }
}

/// What initdb and the server have logged from byte `start` on.
fn read_log(dir: &Path, start: u64) -> String {
    let log = fs::read(dir.join(LOG)).unwrap_or_default();
    String::from_utf8_lossy(log.get(start as usize..).unwrap_or_default()).into_owned()
}

fn log_len(dir: &Path) -> u64 {
    fs::metadata(dir.join(LOG)).map(|meta| meta.len()).unwrap_or(0)
}

/// A loopback port that was free a moment ago.
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a free loopback port");
    listener.local_addr().expect("the port's address").port()
}

/// Runs one SQL statement with psql and returns what it printed (unaligned, tuples only), or its error.
fn psql(url: &str, sql: &str) -> Result<String, String> {
    let output = Command::new(program("psql"))
        .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", url, "-c", sql])
        .env("PGCONNECT_TIMEOUT", "5")
        .output()
        .map_err(|error| format!("psql: {error}"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).trim_end().to_owned())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).trim_end().to_owned())
    }
}

/// `url` with its database (the path) replaced by `name`; user, password, host and options are kept.
fn with_database(url: &str, name: &str) -> String {
    let authority = url.find("://").map_or(0, |scheme| scheme + 3);
    let rest = &url[authority..];
    let path = rest.find(['/', '?']).map_or(url.len(), |at| authority + at);
    let query = url[path..].find('?').map_or("", |at| &url[path + at..]);
    format!("{}/{name}{query}", &url[..path])
}

/// Whether the server's library directory (`pg_config --pkglibdir`, or `lib` beside the programs) has `name`.
fn has_library(name: &str) -> bool {
    let file = format!("{name}.so");
    let beside = program("postgres")
        .parent()
        .and_then(Path::parent)
        .map(|root| root.join("lib").join(&file));
    let configured = Command::new("pg_config")
        .arg("--pkglibdir")
        .output()
        .ok()
        .filter(|output| output.status.success())
        .map(|output| PathBuf::from(String::from_utf8_lossy(&output.stdout).trim()).join(&file));
    [beside, configured].into_iter().flatten().any(|path| path.is_file())
}

/// The path of a PostgreSQL program: in [`DEBIAN_BINDIR`], `pg_config --bindir`, or `PATH`.
/// Whether the PostgreSQL programs a cluster needs are installed; else what is missing and how to install it.
pub fn installed() -> Result<(), String> {
    ["initdb", "postgres", "pg_isready", "psql"]
        .iter()
        .try_for_each(|name| program_path(name).map(drop))
}

fn program(name: &str) -> PathBuf {
    program_path(name).unwrap_or_else(|missing| panic!("{missing}"))
}

/// Where PostgreSQL program `name` is, or what is missing.
fn program_path(name: &str) -> Result<PathBuf, String> {
    static DIRS: OnceLock<Vec<PathBuf>> = OnceLock::new();
    let dirs = DIRS.get_or_init(|| {
        let mut dirs = vec![PathBuf::from(DEBIAN_BINDIR)];
        if let Ok(output) = Command::new("pg_config").arg("--bindir").output()
            && output.status.success()
        {
            dirs.push(PathBuf::from(String::from_utf8_lossy(&output.stdout).trim()));
        }
        dirs.extend(env::split_paths(&env::var_os("PATH").unwrap_or_default()));
        dirs
    });
    dirs.iter()
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
        .ok_or_else(|| {
            format!(
                "no PostgreSQL program {name} in {DEBIAN_BINDIR}, `pg_config --bindir` or PATH: install the \
             `postgresql` package (apt-get install postgresql), or set {EXTERNAL_ENV} to an existing server's URL"
            )
        })
}

#[cfg(test)]
#[path = "test_postgres/tests.rs"]
mod tests;
