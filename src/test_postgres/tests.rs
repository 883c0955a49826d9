//! The throwaway server's life: it starts, serves fresh databases, and never outlives its holder.

use super::*;

fn local(cluster: &Cluster) -> &Local {
    cluster.local("inspect")
}

/// The pid of the server's postmaster, from its pid file.
fn postmaster(cluster: &Cluster) -> u32 {
    let pid_file = fs::read_to_string(local(cluster).dir.path().join("data/postmaster.pid")).unwrap();
    pid_file.lines().next().unwrap().parse().unwrap()
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

#[test]
fn databases_are_new_empty_and_apart() {
    let cluster = shared();

    let first = cluster.database();
    let second = cluster.database();

    assert_ne!(first, second);
    assert_eq!(psql(&first, "SELECT 1").unwrap(), "1");
    assert_eq!(psql(&second, "SELECT 1").unwrap(), "1");
    psql(&first, "CREATE TABLE t (id int)").unwrap();
    let tables = "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'";
    assert_eq!(psql(&first, tables).unwrap(), "1");
    assert_eq!(psql(&second, tables).unwrap(), "0");
    assert!(std::ptr::eq(cluster, shared()), "one cluster per test process");
}

#[test]
fn a_stopped_server_refuses_connections_and_a_restarted_one_keeps_its_data() {
    let cluster = Cluster::start();
    let url = cluster.database();
    psql(&url, "CREATE TABLE t (id int); INSERT INTO t VALUES (7)").unwrap();

    cluster.stop();
    let refused = psql(&url, "SELECT 1");
    cluster.restart();

    let error = refused.expect_err("a stopped server refuses connections");
    assert!(error.contains("Connection refused"), "{error}");
    assert_eq!(psql(&url, "SELECT id FROM t").unwrap(), "7");
    cluster.restart();
    assert_eq!(
        psql(&url, "SELECT id FROM t").unwrap(),
        "7",
        "a restart of a running server"
    );
}

#[test]
fn a_halted_durable_server_recovers_every_commit_it_acknowledged() {
    let cluster = Cluster::start_durable();
    let url = cluster.database();
    psql(&url, "CREATE TABLE t (id int); INSERT INTO t VALUES (7)").unwrap();

    cluster.halt();
    let refused = psql(&url, "SELECT 1");
    cluster.restart();

    assert!(refused.is_err(), "a halted server refuses connections");
    assert_eq!(psql(&url, "SELECT id FROM t").unwrap(), "7");
}

#[test]
fn dropping_a_cluster_ends_its_server_and_removes_its_dir() {
    let cluster = Cluster::start();
    let dir = local(&cluster).dir.path().to_owned();
    let pid = postmaster(&cluster);
    let url = cluster.url("postgres");
    assert!(alive(pid));

    drop(cluster);

    assert!(!alive(pid), "postmaster {pid} outlived its cluster");
    assert!(!dir.exists(), "{} outlived its cluster", dir.display());
    assert!(psql(&url, "SELECT 1").is_err());
}

/// Set for the child process that `a_killed_test_process_leaves_no_server` runs.
const HOLDER_ENV: &str = "TOOLNEXUS_TEST_CLUSTER_HOLDER";
/// Marks the holder's line, which follows libtest's "test NAME ... " on the same line.
const HOLDING: &str = "holding cluster:";

/// In the child process of `a_killed_test_process_leaves_no_server`: prints its cluster and waits.
#[test]
#[ignore = "a helper that a_killed_test_process_leaves_no_server runs and kills"]
fn holds_a_cluster_until_killed() {
    if env::var_os(HOLDER_ENV).is_none() {
        return;
    }
    let cluster = Cluster::start();
    let dir = local(&cluster).dir.path().display().to_string();
    println!("{HOLDING} {} {} {dir}", postmaster(&cluster), cluster.url("postgres"));
    // Until killed, or until the test that started it ends without killing it.
    std::io::copy(&mut std::io::stdin(), &mut std::io::sink()).unwrap();
}

#[test]
fn a_killed_test_process_leaves_no_server() {
    let (_, module) = module_path!().split_once("::").unwrap();
    let mut holder = Command::new(env::current_exe().unwrap())
        .args(["--exact", &format!("{module}::holds_a_cluster_until_killed")])
        .args(["--ignored", "--nocapture", "--test-threads=1"])
        .env(HOLDER_ENV, "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let line = BufReader::new(holder.stdout.take().unwrap())
        .lines()
        .map(Result::unwrap)
        .find_map(|line| line.split_once(HOLDING).map(|(_, cluster)| cluster.to_owned()))
        .expect("the holder prints its cluster");
    let [pid, url, dir] = line.split_whitespace().collect::<Vec<_>>()[..] else {
        panic!("{line}")
    };
    let pid: u32 = pid.parse().unwrap();
    assert_eq!(psql(url, "SELECT 1").unwrap(), "1");

    holder.kill().unwrap();
    holder.wait().unwrap();

    let deadline = Instant::now() + Duration::from_secs(15);
    while (alive(pid) || Path::new(dir).exists()) && Instant::now() < deadline {
        sleep(Duration::from_millis(50));
    }
    assert!(!alive(pid), "postmaster {pid} outlived the killed test process");
    assert!(!Path::new(dir).exists(), "{dir} outlived the killed test process");
    assert!(psql(url, "SELECT 1").is_err());
}

#[test]
#[should_panic(expected = "cannot stop the server that TOOLNEXUS_TEST_POSTGRES names")]
fn an_existing_server_cannot_be_stopped() {
    let cluster = Cluster {
        server: Server::External {
            url: "postgres://u@db.test/app".to_owned(),
        },
    };

    cluster.stop();
}

#[test]
fn a_database_url_keeps_the_server_and_its_options() {
    let cases = [
        ("postgres://u:pw@db.test:5433/app", "postgres://u:pw@db.test:5433/x"),
        (
            "postgres://u:pw@db.test:5433/app?sslmode=disable",
            "postgres://u:pw@db.test:5433/x?sslmode=disable",
        ),
        ("postgres://u@db.test", "postgres://u@db.test/x"),
        (
            "postgresql://db.test?sslmode=require",
            "postgresql://db.test/x?sslmode=require",
        ),
    ];
    for (url, expected) in cases {
        assert_eq!(with_database(url, "x"), expected, "{url}");
    }
}
