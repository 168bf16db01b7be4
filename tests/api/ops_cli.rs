//! What an operator sees of the one-shot commands: quiet logs unless asked, the same events in
//! a log file, `target list|show` as text with a header or as JSON, errors on one line with
//! advice, a password typed at a terminal that is not echoed, and `--help` with examples and
//! `--json` only where the output is JSON.

use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::helpers::fresh_database;

/// The built binary with a clean environment on `db`, in `data`.
fn sshmode(db: &str, data: &std::path::Path, vars: &[(&str, &str)]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_sshmode"));
    c.current_dir(data)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("DATABASE_URL", db)
        .env("SSHMODE_DATA_DIR", data);
    for (k, v) in vars {
        c.env(k, v);
    }
    c
}

fn run(mut c: Command, args: &[&str], stdin: &str) -> (i32, String, String) {
    let mut child = c
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn one_shot_commands_are_quiet_unless_rust_log_asks_and_a_log_file_gets_the_same_events() {
    let db = fresh_database().await;
    let data = tempfile::tempdir().unwrap();
    let d = data.path();
    // Routine lines (here sqlx's notice at info) stay off a one-shot command's stderr...
    let (code, _, err) = run(sshmode(&db, d, &[]), &["target", "list"], "");
    assert_eq!((code, err.as_str()), (0, ""));
    // ... unless RUST_LOG asks for them.
    let (code, _, err) = run(
        sshmode(&db, d, &[("RUST_LOG", "info")]),
        &["target", "list"],
        "",
    );
    assert_eq!(code, 0);
    assert!(err.contains("INFO"), "{err}");
    // SSHMODE_LOG_FILE (relative: in the data dir) receives the same events, without colour.
    let vars = [
        ("RUST_LOG", "debug"),
        ("SSHMODE_LOG_FILE", "sshmode.log"),
        ("SSHMODE_LOG_FORMAT", "json"),
    ];
    let (code, _, err) = run(sshmode(&db, d, &vars), &["audit", "list"], "");
    assert_eq!(code, 0);
    let file = std::fs::read_to_string(d.join("sshmode.log")).unwrap();
    let messages = |text: &str| -> Vec<String> {
        text.lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .map(|v| v["message"].as_str().unwrap_or_default().to_string())
            .collect()
    };
    assert!(
        messages(&file).iter().any(|m| m == "paths resolved"),
        "{file}"
    );
    assert_eq!(messages(&file), messages(&err));
}

#[tokio::test]
async fn target_list_and_show_as_text_and_json_and_errors_on_one_line() {
    let db = fresh_database().await;
    let data = tempfile::tempdir().unwrap();
    let d = data.path();
    let add = [
        "target",
        "add",
        "box",
        "--host",
        "127.0.0.1",
        "--user",
        "u",
        "--password-stdin",
        "--offline",
        "--approve",
    ];
    let (code, _, err) = run(sshmode(&db, d, &[]), &add, "pw-secret-1\n");
    assert_eq!(code, 0, "{err}");
    let (_, out, _) = run(sshmode(&db, d, &[]), &["target", "list"], "");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0],
        "ALIAS\tDESTINATION\tSTATUS\tAUTH\tHOST KEY POLICY\tHOST KEY"
    );
    assert!(lines[1].starts_with("box\tu@127.0.0.1"), "{out}");
    let (code, out, _) = run(sshmode(&db, d, &[]), &["target", "list", "--json"], "");
    assert_eq!(code, 0);
    let list: Vec<Value> = serde_json::from_str(&out).unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0]["alias"], "box");
    assert_eq!(list[0]["status"], "approved");
    let (_, out, _) = run(
        sshmode(&db, d, &[]),
        &["target", "show", "box", "--json"],
        "",
    );
    let show: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(show["alias"], "box");
    assert_eq!(show["path"], serde_json::json!(["box"]));
    assert_eq!(show["chats"], serde_json::json!([]));
    assert!(!out.contains("pw-secret-1"));
    // Skills too.
    let (code, out, _) = run(sshmode(&db, d, &[]), &["skill", "list", "--json"], "");
    assert_eq!(code, 0);
    let skills: Vec<Value> = serde_json::from_str(&out).unwrap();
    assert_eq!(skills[0]["name"], "ssh-mode");
    assert_eq!(skills[0]["builtin"], true);
    let (_, out, _) = run(
        sshmode(&db, d, &[]),
        &["skill", "show", "ssh-mode", "--json"],
        "",
    );
    let skill: Value = serde_json::from_str(&out).unwrap();
    assert!(
        skill["body"].as_str().is_some_and(|b| !b.is_empty()),
        "{skill}"
    );
    // `--json` with another subcommand is a usage error, and nothing is done.
    let (code, _, err) = run(
        sshmode(&db, d, &[]),
        &["target", "disable", "box", "--json"],
        "",
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("unexpected argument '--json'"), "{err}");
    let (_, out, _) = run(sshmode(&db, d, &[]), &["target", "list", "--json"], "");
    let list: Vec<Value> = serde_json::from_str(&out).unwrap();
    assert_eq!(list[0]["status"], "approved");
    // An unreachable database: one line, with what to check.
    let closed = format!("postgres://u:pw@127.0.0.1:{}/x", crate::sshd::free_port());
    let (code, _, err) = run(sshmode(&closed, d, &[]), &["target", "list"], "");
    assert_ne!(code, 0);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("sshmode: cannot connect to PostgreSQL")
            && err.contains("check DATABASE_URL"),
        "{err}"
    );
    // A bad variable: one line, naming it and where the variables are described.
    let (code, _, err) = run(
        sshmode(&db, d, &[("SSHMODE_AUDIT_RETENTION_DAYS", "soon")]),
        &["target", "list"],
        "",
    );
    assert_eq!(code, 2);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("SSHMODE_AUDIT_RETENTION_DAYS") && err.contains(".env.example"),
        "{err}"
    );
}

/// Reads from `r` until `want` has been seen or `within` has passed; returns what was read.
#[test]
fn help_shows_examples_and_offers_json_only_where_it_works() {
    let help = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_sshmode"))
            .args(args)
            .arg("--help")
            .env_clear()
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let list = help(&["target", "list"]);
    assert!(list.contains("Examples:\n  sshmode target list"), "{list}");
    assert!(list.contains("--json"), "{list}");
    let add = help(&["target", "add"]);
    assert!(add.contains("Examples:\n  sshmode target add "), "{add}");
    assert!(!add.contains("--json"), "{add}");
    // Every option of `target add` says what it is for: no option line stands alone.
    let options: Vec<&str> = add
        .split("Options:")
        .nth(1)
        .unwrap()
        .split("Examples:")
        .next()
        .unwrap()
        .lines()
        .collect();
    for (i, line) in options.iter().enumerate() {
        let spec = line.trim_start();
        // `--long` or `-s, --long`; a possible value's line is `- value: what it means`.
        if spec.starts_with("--") || (spec.starts_with('-') && spec.get(2..3) == Some(",")) {
            let next = options.get(i + 1).copied().unwrap_or("").trim_start();
            let inline = spec.split_once("  ").is_some_and(|(_, h)| {
                let h = h.trim();
                !h.is_empty() && !h.starts_with("[default")
            });
            let below = !next.is_empty() && !next.starts_with("-") && !next.starts_with("[default");
            assert!(inline || below, "no help for {line}\n{add}");
        }
    }
    for args in [
        &["skill", "promote"][..],
        &["target", "approve"],
        &["vault"],
    ] {
        let h = help(args);
        assert!(!h.contains("--json"), "{args:?}: {h}");
        assert!(h.contains("Examples:"), "{args:?}: {h}");
    }
}

fn read_until(r: &mut impl Read, want: &str, within: Duration) -> String {
    let deadline = Instant::now() + within;
    let mut got = Vec::new();
    let mut buf = [0u8; 256];
    while !String::from_utf8_lossy(&got).contains(want) && Instant::now() < deadline {
        match r.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(_) => break,
        }
    }
    String::from_utf8_lossy(&got).into_owned()
}

#[tokio::test]
async fn a_password_typed_at_a_terminal_is_not_echoed() {
    let db = fresh_database().await;
    let data = tempfile::tempdir().unwrap();
    let (mut master, mut slave) = (0, 0);
    // SAFETY: openpty fills two new descriptors, owned below.
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(rc, 0, "openpty");
    // SAFETY: fresh descriptors from openpty, each owned once.
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    let mut master = std::fs::File::from(master);
    let mut cmd = sshmode(&db, data.path(), &[]);
    cmd.args([
        "target",
        "add",
        "tty",
        "--host",
        "127.0.0.1",
        "--user",
        "u",
        "--password-stdin",
        "--offline",
        "--approve",
    ])
    .stdin(Stdio::from(slave))
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    drop(cmd);
    let mut stderr = child.stderr.take().unwrap();
    // The prompt comes once echo is off; only then is the password typed.
    let prompt = read_until(&mut stderr, "password: ", Duration::from_secs(20));
    if !prompt.contains("password: ") {
        let _ = child.kill();
        let _ = child.wait();
    }
    assert!(
        prompt.contains("password: "),
        "no prompt on a terminal: {prompt:?}"
    );
    master.write_all(b"typed-secret-42\n").unwrap();
    let status = child.wait().unwrap();
    assert!(status.success());
    // What the terminal showed: nothing of the password.
    // SAFETY: fcntl on an open descriptor.
    unsafe {
        use std::os::fd::AsRawFd;
        let fd = master.as_raw_fd();
        libc::fcntl(
            fd,
            libc::F_SETFL,
            libc::fcntl(fd, libc::F_GETFL) | libc::O_NONBLOCK,
        );
    }
    let shown = read_until(&mut master, "\u{0}", Duration::from_millis(200));
    assert!(!shown.contains("typed-secret-42"), "echoed: {shown:?}");
}

#[tokio::test]
async fn rotating_the_master_key_reseals_every_record_and_the_old_key_no_longer_opens_them() {
    assert!(crate::sshd::available(), "needs root and /usr/sbin/sshd");
    let state = tempfile::tempdir().unwrap();
    let data = state.path().to_path_buf();
    let app = crate::helpers::TestApp::builder()
        .var("SSHMODE_DATA_DIR", &data.display().to_string())
        .spawn()
        .await;
    let dir = tempfile::tempdir().unwrap();
    let sshd = crate::sshd::Sshd::start_below(dir.path());
    crate::agent::add_target(&app, &sshd, dir.path(), "web").await;
    // Stopped first, as the command asks.
    let db = app.stop().await;
    let key = data.join("master.key");
    let before = std::fs::read(&key).unwrap();
    let sealed = |pool: sqlx::PgPool| async move {
        let v: Vec<u8> = sqlx::query_scalar("SELECT sealed_key FROM targets WHERE alias = 'web'")
            .fetch_one(&pool)
            .await
            .unwrap();
        pool.close().await;
        v
    };
    let record_before = sealed(sqlx::PgPool::connect(&db).await.unwrap()).await;

    let (code, out, err) = run(sshmode(&db, &data, &[]), &["vault", "rotate-key"], "");
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("re-sealed the secrets of 1 target(s)"),
        "{out}"
    );
    let after = std::fs::read(&key).unwrap();
    assert_ne!(after, before, "a new key");
    assert_eq!(std::fs::read(data.join("master.key.old")).unwrap(), before);
    assert!(!data.join("master.key.new").exists());
    assert_ne!(
        sealed(sqlx::PgPool::connect(&db).await.unwrap()).await,
        record_before
    );
    // The target still authenticates: its key opens with the new master key.
    let (code, out, err) = run(sshmode(&db, &data, &[]), &["target", "test", "web"], "");
    assert_eq!(code, 0, "{out}{err}");
    // With the old key it no longer does.
    let old_key = data.join("master.key.old").display().to_string();
    let (code, out, err) = run(
        sshmode(&db, &data, &[("SSHMODE_MASTER_KEY_FILE", &old_key)]),
        &["target", "test", "web"],
        "",
    );
    assert_ne!(code, 0, "{out}{err}");
    // Audited; and a second rotation refuses while the previous key is still beside it.
    let (_, out, _) = run(
        sshmode(&db, &data, &[]),
        &["audit", "export", "--kind", "vault"],
        "",
    );
    assert!(
        out.contains("\"vault.rotate\"") && out.contains("\"targets\":1"),
        "{out}"
    );
    let (code, _, err) = run(sshmode(&db, &data, &[]), &["vault", "rotate-key"], "");
    assert_ne!(code, 0);
    assert!(err.contains("master.key.old exists"), "{err}");
}
