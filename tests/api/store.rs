//! The SQLite store under faults: files it must refuse at start, a disk that fills up and frees again,
//! webhook deliveries that outlive a crash, and pruning that keeps the file bounded.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::helpers::{
    BINARY, BOTH_ERAS, Process, TestApp, config_text, first_request, poll_until, results, spawn_app_with, spawn_in,
    spawn_process, spawn_process_in, spawn_process_under_umask, stored_in, under_umask,
};

/// Runs the gateway on `dir` and expects it to refuse to start; returns what it wrote to stderr.
fn refused_start(dir: &std::path::Path, settings: &str) -> String {
    let config = dir.join("gateway.toml");
    std::fs::write(&config, config_text(dir, settings, BOTH_ERAS, "")).unwrap();
    let output = Command::new(BINARY)
        .arg("--config")
        .arg(&config)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(!output.status.success(), "it started: {stderr}");
    stderr
}

#[tokio::test]
async fn a_store_it_cannot_use_is_a_start_up_error_naming_the_file_and_the_cause() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("gateway.sqlite3");
    let path = file.display().to_string();

    std::fs::write(&file, b"this is not a database, and it must stay as it is").unwrap();
    let stderr = refused_start(dir.path(), "");
    assert!(
        stderr.contains(&path) && stderr.contains("not a SQLite database"),
        "{stderr}"
    );
    assert!(std::fs::read(&file).unwrap().starts_with(b"this is not a database"));

    std::fs::remove_file(&file).unwrap();
    let newer = rusqlite::Connection::open(&file).unwrap();
    newer.execute_batch("PRAGMA user_version = 99").unwrap();
    drop(newer);
    let stderr = refused_start(dir.path(), "");
    assert!(stderr.contains(&path) && stderr.contains("newer"), "{stderr}");

    std::fs::remove_file(&file).unwrap();
    let holder = spawn_in(dir.path(), "", BOTH_ERAS, "").await;
    let stderr = refused_start(dir.path(), "");
    assert!(stderr.contains(&path) && stderr.contains("another process"), "{stderr}");
    drop(holder);

    let unwritable = "[store]\nurl = \"sqlite:/proc/toolnexus-gateway/gateway.sqlite3\"\n";
    let stderr = refused_start(dir.path(), unwritable);
    assert!(stderr.contains("/proc/toolnexus-gateway/gateway.sqlite3"), "{stderr}");
}

/// Sets the gateway's soft limit on the size of a file it writes (`unlimited`, or bytes).
fn limit_file_size(app: &Process, soft: &str) {
    let status = Command::new("prlimit")
        .arg("--pid")
        .arg(app.pid().to_string())
        .arg(format!("--fsize={soft}:unlimited"))
        .status()
        .expect("prlimit (util-linux) runs");
    assert!(status.success());
}

#[tokio::test]
async fn a_write_the_disk_refuses_is_503_and_the_gateway_recovers_when_there_is_room() {
    let app = spawn_process("", BOTH_ERAS, "").await;
    let call = app.call("modern", "confirm_action", json!({"action": "full"})).await;
    let request = first_request(&call);

    // No file of the gateway may grow past 1 KiB: every write to the store's log fails, as on a full disk.
    limit_file_size(&app, "1024");
    let refused = app
        .answer(&request, json!({"ok": true, "data": {"confirm": true}}))
        .await;
    assert_eq!(refused.status(), 503);
    assert!(refused.headers().contains_key("retry-after"));
    assert_eq!(app.get_json(&format!("/requests/{request}")).await["status"], "pending");

    limit_file_size(&app, "unlimited");
    app.answer_ok(&request, json!({"ok": true, "data": {"confirm": true}}))
        .await;
    let done = app.settled(call["id"].as_str().unwrap()).await;
    assert_eq!(
        results(&done),
        json!([{"action": "accept", "content": {"confirm": true, "note": ""}}])
    );
}

#[tokio::test]
async fn a_call_the_full_disk_could_not_keep_as_it_started_is_ended_not_left_running() {
    let policy = "[[approvals]]\nserver = \"modern\"\ntools = [\"echo\"]\n";
    let app = spawn_process("", &format!("{BOTH_ERAS}\n{policy}"), "").await;

    limit_file_size(&app, "1024");
    // One call held for approval, one sent upstream at once (which the gateway cancels): neither can be kept.
    for (tool, arguments) in [("echo", json!({"text": "held"})), ("slow", json!({"seconds": 60}))] {
        let refused = app
            .post(
                "/calls",
                &json!({"server": "modern", "tool": tool, "arguments": arguments}),
            )
            .await;
        assert_eq!(refused.status(), 503, "{tool}");
        assert!(refused.headers().contains_key("retry-after"));
    }
    limit_file_size(&app, "unlimited");

    // Once there is room, each is recorded as failed: a call left running would hold its owner's place for
    // ever, and be sent again after a restart.
    let ended = poll_until("both calls ended", || async {
        let calls = app.get_json("/calls").await;
        let calls = calls.as_array().unwrap().clone();
        (calls.len() == 2 && calls.iter().all(|call| call["status"] != "running")).then_some(calls)
    })
    .await;
    for call in &ended {
        assert_eq!(call["status"], "failed", "{call}");
        assert!(
            call["error"]["message"].as_str().unwrap().contains("could not keep"),
            "{call}"
        );
    }
}

/// One delivery a receiver got: its headers, its body, and whether the receiver took it.
type Delivery = (HeaderMap, Value, bool);

/// A webhook receiver that refuses every delivery until `accepting` is set.
async fn receiver(accepting: Arc<AtomicBool>) -> (String, mpsc::UnboundedReceiver<Delivery>) {
    let (record, deliveries) = mpsc::unbounded_channel();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |headers: HeaderMap, body: Bytes| {
            let (record, accepting) = (record.clone(), accepting.clone());
            async move {
                let taken = accepting.load(Ordering::SeqCst);
                let _ = record.send((headers, serde_json::from_slice(&body).unwrap(), taken));
                if taken {
                    StatusCode::OK
                } else {
                    StatusCode::SERVICE_UNAVAILABLE
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, deliveries)
}

#[tokio::test]
async fn a_delivery_not_acknowledged_before_a_crash_is_made_after_the_restart() {
    let accepting = Arc::new(AtomicBool::new(false));
    let (url, mut deliveries) = receiver(accepting.clone()).await;
    let webhook =
        format!("[[webhooks]]\nname = \"audit\"\nurl = \"{url}\"\nevents = [\"request.created\"]\nattempts = 100\n");
    let servers = format!("{BOTH_ERAS}\n{webhook}");
    let dir = tempfile::tempdir().unwrap();
    let mut app = spawn_process_in(dir.path(), "", &servers, "").await;
    let call = app.call("modern", "confirm_action", json!({"action": "audit"})).await;
    let request = first_request(&call);
    let refused = tokio::time::timeout(Duration::from_secs(20), deliveries.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(refused.1["data"]["id"], request.as_str());

    app.kill();
    accepting.store(true, Ordering::SeqCst);
    let _app = spawn_process_in(dir.path(), "", &servers, "").await;
    let delivered = loop {
        let delivery = tokio::time::timeout(Duration::from_secs(20), deliveries.recv())
            .await
            .expect("the delivery is made again after the restart")
            .unwrap();
        if delivery.1["data"]["id"] == request.as_str() && delivery.2 {
            break delivery;
        }
    };
    assert_eq!(
        delivered.0["x-toolnexus-delivery"], refused.0["x-toolnexus-delivery"],
        "the same delivery id, for the receiver to deduplicate"
    );
    assert_eq!(delivered.1, refused.1);
}

#[tokio::test]
async fn ended_records_are_pruned_after_the_retention_and_the_file_stays_bounded() {
    let servers = format!("{BOTH_ERAS}\n[audit]\nretention = \"1h\"\n");
    let app = spawn_app_with(&servers, "retention = \"1h\"").await;
    let mut first = None;
    let mut sizes = Vec::new();
    for _ in 0..6 {
        let mut wave = Vec::new();
        for _ in 0..20 {
            let call = app.call("modern", "echo", json!({"text": "x".repeat(2000)})).await;
            wave.push(call["id"].as_str().unwrap().to_owned());
        }
        // The wave's hour passes; pruning, which that wakes, is signalled by nothing.
        app.advance(Duration::from_secs(3601));
        let last = wave.last().unwrap();
        poll_until("the wave pruned", || async {
            (app.get(&format!("/calls/{last}")).await.status() == 404).then_some(())
        })
        .await;
        first.get_or_insert(wave[0].clone());
        sizes.push(store_bytes(&app).await);
    }

    assert_eq!(app.get(&format!("/calls/{}", first.unwrap())).await.status(), 404);
    assert!(app.get_json("/calls?limit=1000").await.as_array().unwrap().len() < 20);
    let mut events = app.events("", Some("1")).await;
    assert_eq!(events.next().await.event, "resync", "the first events were pruned");
    let after = app.call("modern", "echo", json!({"text": "after the resync"})).await;
    let next = events.next().await;
    assert_eq!(
        next.data["id"], after["id"],
        "the stream goes on from now, not from the oldest event kept"
    );
    assert!(sizes[5] <= sizes[1] * 2, "the file grew wave after wave: {sizes:?}");
}

/// `toolnexus_store_bytes` from `/metrics`.
async fn store_bytes(app: &TestApp) -> u64 {
    let text = app.get("/metrics").await.text().await.unwrap();
    text.lines()
        .find_map(|line| line.strip_prefix("toolnexus_store_bytes "))
        .expect("the store's size is exported")
        .parse::<f64>()
        .unwrap() as u64
}

#[tokio::test]
async fn the_store_is_its_owners_alone_and_a_backup_taken_while_it_runs_holds_what_was_kept() {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_in(dir.path(), "", BOTH_ERAS, "").await;
    let call = app.call("modern", "confirm_action", json!({"action": "backup"})).await;
    let request = first_request(&call);
    for file in ["gateway.sqlite3", "gateway.sqlite3-wal"] {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join(file)).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{file} holds every answer: its owner's alone");
    }

    let copy = tempfile::tempdir().unwrap();
    let to = copy.path().join("copy.sqlite3");
    let output = Command::new(BINARY)
        .arg("backup")
        .arg("--config")
        .arg(dir.path().join("gateway.toml"))
        .arg(&to)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&to).unwrap().permissions().mode() & 0o777, 0o600);
    }
    let again = Command::new(BINARY)
        .arg("backup")
        .arg("--config")
        .arg(dir.path().join("gateway.toml"))
        .arg(&to)
        .output()
        .unwrap();
    assert!(!again.status.success(), "a backup does not overwrite a file");

    std::fs::rename(&to, copy.path().join("gateway.sqlite3")).unwrap();
    let restored = spawn_in(copy.path(), "", BOTH_ERAS, "").await;
    let kept = restored.get_json(&format!("/requests/{request}")).await;
    assert_eq!(kept["status"], "pending", "{kept}");
    drop(app);
}

/// The permission bits of `path` (not following a symbolic link there).
fn mode(path: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::symlink_metadata(path).unwrap().permissions().mode() & 0o7777
}

/// The file named `path` with `suffix` appended (`gateway.sqlite3-wal`).
fn beside(path: &std::path::Path, suffix: &str) -> std::path::PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    name.into()
}

/// Runs `backup` of the store configured in `dir` to `to`, under `umask`; its exit status and stderr.
fn backup_under_umask(umask: &str, dir: &std::path::Path, to: &std::path::Path) -> (bool, String) {
    let output = under_umask(umask)
        .arg("backup")
        .arg("--config")
        .arg(dir.join("gateway.toml"))
        .arg(to)
        .output()
        .unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test]
async fn the_store_its_directory_and_its_backups_are_owner_only_even_under_umask_0() {
    let dir = tempfile::tempdir().unwrap();
    let created = dir.path().join("state");
    let file = created.join("gateway/gateway.sqlite3");
    let settings = stored_in(&format!("sqlite:{}", file.display()));
    let app = spawn_process_under_umask("000", dir.path(), &settings, BOTH_ERAS).await;
    // A pending Request: the WAL and its index hold answers-to-be.
    let call = app.call("modern", "confirm_action", json!({"action": "umask"})).await;
    first_request(&call);

    for directory in [created.clone(), created.join("gateway")] {
        assert_eq!(mode(&directory), 0o700, "{}", directory.display());
    }
    for suffix in ["", "-wal", "-shm", ".lock"] {
        let path = beside(&file, suffix);
        assert_eq!(
            mode(&path),
            0o600,
            "{} holds answers: its owner's alone",
            path.display()
        );
    }
    let to = dir.path().join("copy.sqlite3");
    let (copied, stderr) = backup_under_umask("000", dir.path(), &to);
    assert!(copied, "{stderr}");
    assert_eq!(mode(&to), 0o600);
    drop(app);
}

#[test]
fn a_symbolic_link_at_the_store_s_files_or_a_backup_is_refused_and_nothing_is_written_through_it() {
    for suffix in ["", "-wal", "-shm", "-journal", ".lock"] {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        let target = elsewhere.path().join("target");
        let link = beside(&dir.path().join("gateway.sqlite3"), suffix);
        std::os::unix::fs::symlink(&target, &link).unwrap();

        let stderr = refused_start(dir.path(), "");
        assert!(
            stderr.contains(&format!("{} is a symbolic link", link.display())),
            "{suffix}: {stderr}"
        );
        assert!(!target.exists(), "{suffix}: a dangling link was followed");
    }

    // A link to a database that exists, for the store and for a backup: refused, and the file is untouched.
    let dir = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let target = elsewhere.path().join("target.sqlite3");
    rusqlite::Connection::open(&target)
        .unwrap()
        .execute_batch("CREATE TABLE kept (x); PRAGMA user_version = 1;")
        .unwrap();
    let before = std::fs::read(&target).unwrap();
    let link = dir.path().join("gateway.sqlite3");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let stderr = refused_start(dir.path(), "");
    assert!(stderr.contains("is a symbolic link"), "{stderr}");

    std::fs::remove_file(&link).unwrap();
    let config = dir.path().join("gateway.toml");
    std::fs::write(&config, config_text(dir.path(), "", "", "")).unwrap();
    rusqlite::Connection::open(&link)
        .unwrap()
        .execute_batch("CREATE TABLE t (x)")
        .unwrap();
    let dangling = elsewhere.path().join("nothing-yet.sqlite3");
    for (to, pointing_at) in [
        (dir.path().join("to-existing"), &target),
        (dir.path().join("to-nothing"), &dangling),
    ] {
        std::os::unix::fs::symlink(pointing_at, &to).unwrap();
        let (copied, stderr) = backup_under_umask("022", dir.path(), &to);
        assert!(
            !copied && stderr.contains(&format!("cannot copy it to {}: it is a symbolic link", to.display())),
            "{stderr}"
        );
    }
    assert_eq!(std::fs::read(&target).unwrap(), before);
    assert!(!dangling.exists(), "a backup was written through a dangling link");
}

#[tokio::test]
async fn store_files_others_may_read_are_made_owner_only_at_start_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("gateway.sqlite3");
    let mut app = spawn_process_in(dir.path(), "", BOTH_ERAS, "").await;
    let call = app.call("modern", "confirm_action", json!({"action": "chmod"})).await;
    let request = first_request(&call);
    // Killed, the gateway leaves its WAL and its index as they were.
    app.kill();
    let files: Vec<_> = ["", "-wal", "-shm", ".lock"].map(|suffix| beside(&file, suffix)).into();
    for path in &files {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).unwrap();
    }

    let again = spawn_process_in(dir.path(), "", BOTH_ERAS, "").await;
    for path in &files {
        assert_eq!(mode(path), 0o600, "{}", path.display());
        let line = again
            .stderr()
            .wait_for_all(&["open to others", &format!("file={} ", path.display())]);
        assert!(line.contains("WARN") && line.contains("was=644"), "{line}");
    }
    let kept = again.get_json(&format!("/requests/{request}")).await;
    assert_eq!(kept["status"], "pending", "{kept}");
}
