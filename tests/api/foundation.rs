//! The service skeleton: health, readiness, metrics, migrations, the embedded cluster, the
//! event-log export.

use std::os::unix::fs::PermissionsExt;

use sshmode::store::Store;

use crate::helpers::{TestApp, config_from, fresh_database};

#[tokio::test]
async fn health_ready_and_metrics() {
    let app = TestApp::spawn().await;
    let r = app.http.get(app.url("/healthz")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let r = app.http.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let body = app.metrics().await;
    let samples: Vec<&str> = body
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .collect();
    assert!(!samples.is_empty());
    assert!(samples.iter().all(|l| l.starts_with("sshmode_")), "{body}");
    // What the alert rules read at scrape time: ready, the database up.
    assert!(samples.contains(&"sshmode_ready 1"), "{body}");
    assert!(samples.contains(&"sshmode_database_up 1"), "{body}");
    assert!(
        samples.contains(&"sshmode_llm_entries_disabled 0"),
        "{body}"
    );
    app.stop().await;
}

#[tokio::test]
async fn readyz_fails_when_migrations_are_missing() {
    let app = TestApp::spawn().await;
    sqlx::query(
        "DELETE FROM _sqlx_migrations WHERE version = (SELECT max(version) FROM _sqlx_migrations)",
    )
    .execute(&app.state.db)
    .await
    .unwrap();
    let r = app.http.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(r.status(), 503);
    // The replica is not ready (an alert reads it), though its database answers.
    let body = app.metrics().await;
    assert!(body.lines().any(|l| l == "sshmode_ready 0"), "{body}");
    assert!(body.lines().any(|l| l == "sshmode_database_up 1"), "{body}");
    app.stop().await;
}

#[tokio::test]
async fn migrations_apply_once_and_are_idempotent() {
    let url = fresh_database().await;
    let dir = tempfile::tempdir().unwrap();
    let vars = [("DATABASE_URL".to_string(), url)].into_iter().collect();
    let config = config_from(&vars, dir.path());
    let a = Store::open(&config).await.unwrap();
    let n1: i64 = sqlx::query_scalar("SELECT count(*) FROM _sqlx_migrations")
        .fetch_one(&a.pool)
        .await
        .unwrap();
    a.close().await;
    let b = Store::open(&config).await.unwrap();
    let n2: i64 = sqlx::query_scalar("SELECT count(*) FROM _sqlx_migrations")
        .fetch_one(&b.pool)
        .await
        .unwrap();
    assert!(sshmode::store::is_ready(&b.pool).await);
    b.close().await;
    assert_eq!(n1, n2);
    assert_eq!(n1 as usize, sshmode::store::MIGRATOR.iter().count());
}

/// A schema a newer version migrated further (as in a rolling upgrade, where this version
/// keeps running beside it) is accepted: this version starts and is ready; one of its own
/// migrations missing still makes it apply it.
#[tokio::test]
async fn a_schema_a_newer_version_migrated_is_accepted() {
    let url = fresh_database().await;
    let dir = tempfile::tempdir().unwrap();
    let vars = [("DATABASE_URL".to_string(), url)].into_iter().collect();
    let config = config_from(&vars, dir.path());
    let a = Store::open(&config).await.unwrap();
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time)
         VALUES (29991231000000, 'from a newer version', true, '\\x00', 1)",
    )
    .execute(&a.pool)
    .await
    .unwrap();
    a.close().await;
    let b = Store::open(&config)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert!(sshmode::store::is_ready(&b.pool).await);
    b.close().await;
}

#[tokio::test]
async fn audit_and_event_log_are_append_only() {
    let app = TestApp::spawn().await;
    let db = &app.state.db;
    let mut conn = db.acquire().await.unwrap();
    sshmode::audit::record(
        &mut conn,
        sshmode::audit::Entry {
            actor: "cli",
            action: "test.write",
            subject: "x",
            detail: serde_json::json!({}),
        },
    )
    .await
    .unwrap();
    drop(conn);
    assert!(
        sqlx::query("UPDATE audit_log SET actor = 'someone'")
            .execute(db)
            .await
            .is_err()
    );
    assert!(
        sqlx::query("DELETE FROM audit_log")
            .execute(db)
            .await
            .is_err()
    );
    sshmode::eventlog::append(db, "oc_1", "message", serde_json::json!({"text": "hi"}))
        .await
        .unwrap();
    assert!(
        sqlx::query("DELETE FROM session_events")
            .execute(db)
            .await
            .is_err()
    );
    app.stop().await;
}

/// Appends to one section's log from many writers at once: each is written (the one-statement
/// append that lost the race to a `seq` is written again the slow way), and the log is one
/// gap-free sequence holding every entry.
#[tokio::test]
async fn concurrent_appends_to_one_log_are_all_kept_in_one_sequence() {
    let app = TestApp::spawn().await;
    let mut writers = Vec::new();
    for w in 0..8 {
        let db = app.state.db.clone();
        writers.push(tokio::spawn(async move {
            for i in 0..40 {
                sshmode::eventlog::append(
                    &db,
                    "omt_busy",
                    "message",
                    serde_json::json!({ "w": w, "i": i }),
                )
                .await
                .expect("an append is never refused");
            }
        }));
    }
    for w in writers {
        w.await.unwrap();
    }
    let seqs: Vec<i64> = sqlx::query_scalar(
        "SELECT seq FROM session_events WHERE section_id = 'omt_busy' ORDER BY seq",
    )
    .fetch_all(&app.state.db)
    .await
    .unwrap();
    assert_eq!(seqs, (1..=320).collect::<Vec<i64>>());
    let distinct: i64 = sqlx::query_scalar(
        "SELECT count(DISTINCT payload) FROM session_events WHERE section_id = 'omt_busy'",
    )
    .fetch_one(&app.state.db)
    .await
    .unwrap();
    assert_eq!(distinct, 320);
    app.stop().await;
}

#[tokio::test]
async fn session_log_export_writes_jsonl_in_order() {
    let app = TestApp::spawn().await;
    let db = &app.state.db;
    for i in 0..5 {
        sshmode::eventlog::append(db, "omt_thread", "message", serde_json::json!({ "n": i }))
            .await
            .unwrap();
    }
    sshmode::eventlog::append(db, "oc_other", "message", serde_json::json!({ "n": 99 }))
        .await
        .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sshmode"))
        .args(["session-log", "export", "omt_thread"])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("DATABASE_URL", &app.db_url)
        .env("SSHMODE_DATA_DIR", app.data_dir.path())
        .current_dir(app.data_dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 5);
    for (i, l) in lines.iter().enumerate() {
        assert_eq!(l["section"], "omt_thread");
        assert_eq!(l["seq"], i as i64 + 1);
        assert_eq!(l["payload"]["n"], i as i64);
    }
    app.stop().await;
}

/// With no DATABASE_URL: a private cluster is created, a second opener attaches to it, and
/// the last one to close stops it, whichever started it.
#[tokio::test]
async fn embedded_cluster_starts_attaches_and_stops() {
    let dir = tempfile::tempdir().unwrap();
    // Under root the cluster runs as `postgres`, which must be able to reach the data dir.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let vars = [(
        "SSHMODE_DATA_DIR".to_string(),
        dir.path().join("d").display().to_string(),
    )]
    .into_iter()
    .collect();
    let config = config_from(&vars, dir.path());
    let pid_file = dir.path().join("d/pg/postmaster.pid");

    let starter = Store::open(&config).await.expect("embedded cluster starts");
    assert!(pid_file.exists());
    let guest = Store::open(&config).await.expect("second command attaches");
    sqlx::query("CREATE TABLE t (x int)")
        .execute(&guest.pool)
        .await
        .unwrap();
    starter.close().await;
    assert!(
        pid_file.exists(),
        "the starting command must not stop the cluster another still uses"
    );
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM t")
        .fetch_one(&guest.pool)
        .await
        .unwrap();
    assert_eq!(n, 0);
    guest.close().await;
    assert!(!pid_file.exists(), "the last command out stops the cluster");

    // Restart on the existing cluster keeps the data.
    let again = Store::open(&config).await.unwrap();
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM t")
        .fetch_one(&again.pool)
        .await
        .unwrap();
    assert_eq!(n, 0);
    again.close().await;
}

/// Under root, a data directory the `postgres` account cannot reach fails with a message
/// saying so.
#[tokio::test]
async fn embedded_cluster_unreachable_dir_is_a_clear_error() {
    if unsafe { libc::geteuid() } != 0 {
        return; // only meaningful when the cluster must run as another account
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let vars = [(
        "SSHMODE_DATA_DIR".to_string(),
        dir.path().join("d").display().to_string(),
    )]
    .into_iter()
    .collect();
    let config = config_from(&vars, dir.path());
    let err = Store::open(&config)
        .await
        .err()
        .expect("must fail")
        .to_string();
    assert!(
        err.contains("cannot reach") && err.contains("postgres"),
        "{err}"
    );
}

/// Logs written to standard error that is not a terminal (a pipe, a file, journald) carry no
/// colour codes.
#[test]
fn logs_to_a_pipe_carry_no_colour_codes() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_sshmode"))
        .args(["guard", "check"])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("SSHMODE_DATA_DIR", dir.path())
        .env("RUST_LOG", "debug")
        .current_dir(dir.path())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"ls\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        log.contains("paths resolved"),
        "no log line to look at: {log}"
    );
    assert!(
        !log.contains('\u{1b}'),
        "colour codes in a piped log: {log:?}"
    );
}
