//! The audit trail an operator reads: every executed command is a row (locally and on a real
//! sshd), `sshmode audit list|export` filter them, and retention deletes only what is past it.

use std::time::Duration;

use serde_json::{Value, json};
use sshmode::exec::Place;

use crate::agent::{Env, MODEL, accept, call, say, unique, wait_turns_ended};
use crate::helpers::{TestApp, eventually};

/// Runs the built `sshmode` with `args` on `db_url`: (exit code, stdout, stderr).
fn sshmode(db_url: &str, args: &[&str]) -> (i32, String, String) {
    let data = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sshmode"))
        .args(args)
        .current_dir(data.path())
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("DATABASE_URL", db_url)
        .env("SSHMODE_DATA_DIR", data.path())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn jsonl(text: &str) -> Vec<Value> {
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test]
async fn commands_run_locally_and_on_a_target_are_audited_and_listed_with_filters() {
    let env = Env::builder().target("web").spawn().await;
    let local = unique("oc_audit_local");
    let remote = unique("omt_audit_remote");
    env.control.bind(&remote, Place::Target("web".into()));
    env.llm
        .push(
            MODEL,
            call("terminal", json!({"command": "echo audited-local"})),
        )
        .push(MODEL, call("terminal", json!({"command": "exit 3"})))
        .push(MODEL, call("read_file", json!({"path": "/etc/hostname"})))
        .push(MODEL, say("local done"));
    accept(&env.app, &local, &unique("om_l"), "run here").await;
    assert_eq!(wait_turns_ended(&env.app, &local, 1).await, vec!["done"]);
    env.llm
        .push(
            MODEL,
            call(
                "execute_code",
                json!({"code": "echo audited-remote; export TOKEN=abcdefabcdefabcdefabcdefabcdefabcdef", "language": "bash"}),
            ),
        )
        .push(MODEL, say("remote done"));
    accept(&env.app, &remote, &unique("om_r"), "run there").await;
    assert_eq!(wait_turns_ended(&env.app, &remote, 1).await, vec!["done"]);
    let db = env.app.db_url.clone();

    // Everything executed, as JSONL: the two local commands and the remote one; the file read
    // is not a command.
    let (code, out, err) = sshmode(&db, &["audit", "export", "--kind", "command"]);
    assert_eq!(code, 0, "{err}");
    let rows = jsonl(&out);
    assert_eq!(rows.len(), 3, "{rows:#?}");
    let (l1, l2, r1) = (&rows[0], &rows[1], &rows[2]);
    assert_eq!(l1["kind"], "command.run");
    assert_eq!(l1["actor"], "ou_user");
    assert_eq!(l1["section"], local.as_str());
    assert_eq!(l1["target"], Value::Null);
    assert_eq!(l1["subject"], "local");
    assert_eq!(l1["outcome"], "ok");
    assert_eq!(l1["detail"]["command"], "echo audited-local");
    assert_eq!(l1["detail"]["exit"], "exit 0");
    assert!(l1["detail"]["duration_ms"].is_u64(), "{l1}");
    assert_eq!(l2["detail"]["command"], "exit 3");
    assert_eq!(l2["outcome"], "exit 3");
    assert_eq!(r1["target"], "web");
    assert_eq!(r1["section"], remote.as_str());
    assert_eq!(r1["outcome"], "ok");
    assert_eq!(r1["detail"]["tool"], "execute_code");
    let cmd = r1["detail"]["command"].as_str().unwrap();
    assert!(cmd.starts_with("echo audited-remote; export"), "{cmd}");
    assert!(
        !cmd.contains("abcdefabcdef"),
        "a secret-like word is redacted: {cmd}"
    );

    // Filters: by target, by section, by actor, by age.
    let (_, out, _) = sshmode(&db, &["audit", "export", "--target", "web"]);
    let rows = jsonl(&out);
    assert!(
        !rows.is_empty() && rows.iter().all(|r| r["target"] == "web"),
        "{rows:#?}"
    );
    assert!(rows.iter().any(|r| r["detail"]["tool"] == "execute_code"));
    let (_, out, _) = sshmode(&db, &["audit", "export", "--section", &local]);
    assert_eq!(jsonl(&out).len(), 2);
    let (_, out, _) = sshmode(&db, &["audit", "export", "--actor", "ou_nobody"]);
    assert_eq!(out, "");
    let (_, out, _) = sshmode(
        &db,
        &["audit", "export", "--kind", "command.run", "--since", "1h"],
    );
    assert_eq!(jsonl(&out).len(), 3);

    // `list`: a table with a header, or JSON; the latest rows within --limit.
    let (code, out, _) = sshmode(
        &db,
        &["audit", "list", "--since", "24h", "--section", &local],
    );
    assert_eq!(code, 0);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert!(lines[0].starts_with("AT\tACTOR\tKIND\tTARGET"), "{out}");
    assert!(
        lines[1].contains("ou_user\tcommand.run\t-\t") && lines[1].contains("echo audited-local ("),
        "{out}"
    );
    let (_, out, _) = sshmode(
        &db,
        &[
            "audit", "list", "--json", "--kind", "command", "--limit", "1",
        ],
    );
    let listed: Vec<Value> = serde_json::from_str(&out).unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["target"], "web", "the latest row");
    let (code, _, err) = sshmode(&db, &["audit", "list", "--since", "3y"]);
    assert_ne!(code, 0);
    assert!(err.contains("unit"), "{err}");
}

async fn insert_aged(db: &sqlx::PgPool, action: &str, days: i32) {
    sqlx::query(
        "INSERT INTO audit_log (at, actor, action, subject)
         VALUES (now() - make_interval(days => $1), 'cli', $2, 'x')",
    )
    .bind(days)
    .bind(action)
    .execute(db)
    .await
    .unwrap();
}

async fn actions(db: &sqlx::PgPool) -> Vec<String> {
    sqlx::query_scalar("SELECT action FROM audit_log WHERE action LIKE 'test.%' ORDER BY id")
        .fetch_all(db)
        .await
        .unwrap()
}

#[tokio::test]
async fn only_the_retention_purge_deletes_audit_rows_and_only_past_retention() {
    // The service's own purge stays out of the way at first (a retention of 100 years).
    let app = TestApp::builder()
        .var("SSHMODE_AUDIT_RETENTION_DAYS", "36500")
        .spawn()
        .await;
    let db = app.state.db.clone();
    insert_aged(&db, "test.old", 200).await;
    insert_aged(&db, "test.recent", 2).await;
    // An ordinary DELETE is refused, of old rows too; an UPDATE as well.
    for sql in [
        "DELETE FROM audit_log",
        "DELETE FROM audit_log WHERE action = 'test.old'",
        "UPDATE audit_log SET actor = 'someone' WHERE action = 'test.old'",
    ] {
        let e = sqlx::query(sql).execute(&db).await.unwrap_err();
        assert!(e.to_string().contains("append-only"), "{sql}: {e}");
    }
    // Setting the purge's mark by hand still deletes nothing younger than the marked age.
    let mut tx = db.begin().await.unwrap();
    sqlx::query("SELECT set_config('sshmode.audit_purge_days', '30', true)")
        .execute(&mut *tx)
        .await
        .unwrap();
    let e = sqlx::query("DELETE FROM audit_log WHERE action = 'test.recent'")
        .execute(&mut *tx)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("append-only"), "{e}");
    drop(tx);
    // The purge itself: a retention of at least a day, rows past it only.
    assert!(sshmode::audit::purge(&db, 0).await.is_err());
    assert_eq!(sshmode::audit::purge(&db, 180).await.unwrap(), 1);
    assert_eq!(actions(&db).await, vec!["test.recent"]);
    assert_eq!(sshmode::audit::purge(&db, 180).await.unwrap(), 0);
    let url = app.stop().await;

    // `serve`'s workers purge at start with SSHMODE_AUDIT_RETENTION_DAYS.
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    insert_aged(&pool, "test.month_old", 31).await;
    pool.close().await;
    let app = TestApp::builder()
        .database(&url)
        .var("SSHMODE_AUDIT_RETENTION_DAYS", "30")
        .spawn()
        .await;
    let db = app.state.db.clone();
    eventually("the retention purge", Duration::from_secs(10), async || {
        actions(&db).await == vec!["test.recent"]
    })
    .await;
    app.stop().await;
}

/// `audit export | head -1`: the reader goes away after one line, and `export` ends quietly
/// with status 0 (the rows are many more than a pipe holds, so the write fails).
#[tokio::test]
async fn export_into_a_pipe_closed_early_ends_quietly() {
    use std::io::{BufRead, BufReader};
    let app = TestApp::builder().spawn().await;
    let section = unique("oc_pipe");
    let detail = json!({"note": "x".repeat(200)});
    let mut tx = app.state.db.begin().await.unwrap();
    for _ in 0..2000 {
        let entry = sshmode::audit::ChatEntry {
            actor: "system",
            action: "grant.expire",
            section: Some(&section),
            target: None,
            outcome: "ok",
            detail: detail.clone(),
        };
        sshmode::audit::record_chat(&mut tx, entry).await.unwrap();
    }
    tx.commit().await.unwrap();
    let data = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_sshmode"))
        .args(["audit", "export", "--section", &section])
        .current_dir(data.path())
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("DATABASE_URL", &app.db_url)
        .env("SSHMODE_DATA_DIR", data.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    let stdout = child.stdout.take().unwrap();
    BufReader::new(stdout).read_line(&mut first).unwrap();
    assert!(first.contains("grant.expire"), "{first}");
    // The reader is gone (its end of the pipe closed when it was dropped above).
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(!err.to_lowercase().contains("pipe"), "{err}");
}

/// Files the model writes are audited where they were written; a one-shot command's rows name
/// the OS account and carry the target's alias, so `--target` and `--actor cli` find them; a
/// password on a command line never reaches the trail; an unknown `--kind` is an error.
#[tokio::test]
async fn file_changes_cli_rows_and_passwords_on_command_lines_are_audited_right() {
    let env = Env::builder().target("web").spawn().await;
    let local = unique("oc_audit_files");
    let remote = unique("omt_audit_files");
    env.control.bind(&remote, Place::Target("web".into()));
    env.llm
        .push(
            MODEL,
            call("write_file", json!({"path": "notes.txt", "content": "hello"})),
        )
        .push(
            MODEL,
            call(
                "patch",
                json!({"path": "notes.txt", "old_string": "hello", "new_string": "bye"}),
            ),
        )
        .push(
            MODEL,
            call(
                "terminal",
                json!({"command": "mysql -u root -pHunter2pass -e 'select 1' || PGPASSWORD=Hunter2pass psql postgres://app:Hunter2pass@db/app || true"}),
            ),
        )
        .push(MODEL, say("local done"));
    accept(&env.app, &local, &unique("om_l"), "write here").await;
    assert_eq!(wait_turns_ended(&env.app, &local, 1).await, vec!["done"]);
    env.llm
        .push(
            MODEL,
            call(
                "write_file",
                json!({"path": "remote.txt", "content": "there"}),
            ),
        )
        .push(MODEL, say("remote done"));
    accept(&env.app, &remote, &unique("om_r"), "write there").await;
    assert_eq!(wait_turns_ended(&env.app, &remote, 1).await, vec!["done"]);
    let db = env.app.db_url.clone();

    let (code, out, err) = sshmode(&db, &["audit", "export", "--kind", "file"]);
    assert_eq!(code, 0, "{err}");
    let rows = jsonl(&out);
    assert_eq!(rows.len(), 3, "{rows:#?}");
    assert_eq!(rows[0]["kind"], "file.write");
    assert_eq!(rows[0]["actor"], "ou_user");
    assert_eq!(rows[0]["section"], local.as_str());
    assert_eq!(rows[0]["target"], Value::Null);
    assert!(
        rows[0]["detail"]["path"]
            .as_str()
            .unwrap()
            .ends_with("notes.txt")
    );
    assert_eq!(rows[0]["detail"]["bytes"], 5);
    assert_eq!(rows[1]["kind"], "file.patch");
    assert_eq!(rows[2]["kind"], "file.write");
    assert_eq!(rows[2]["target"], "web");
    assert!(
        rows[2]["detail"]["path"]
            .as_str()
            .unwrap()
            .ends_with("remote.txt")
    );

    let (_, out, _) = sshmode(&db, &["audit", "export", "--kind", "command"]);
    assert!(out.contains("mysql -u root -p"), "{out}");
    assert!(!out.contains("Hunter2pass"), "{out}");

    // A one-shot command: its actor is the OS account, and the row carries the alias.
    let (code, _, err) = sshmode(&db, &["target", "disable", "web"]);
    assert_eq!(code, 0, "{err}");
    let me = String::from_utf8(
        std::process::Command::new("id")
            .arg("-un")
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let (_, out, _) = sshmode(
        &db,
        &["audit", "export", "--target", "web", "--kind", "target"],
    );
    let rows = jsonl(&out);
    let kinds: Vec<&str> = rows.iter().map(|r| r["kind"].as_str().unwrap()).collect();
    assert!(
        kinds.contains(&"target.add") && kinds.contains(&"target.disable"),
        "{rows:#?}"
    );
    let disable = rows.iter().find(|r| r["kind"] == "target.disable").unwrap();
    assert_eq!(disable["actor"], format!("cli:{}", me.trim()));
    assert_eq!(disable["target"], "web");
    let fp = env.sshd().unwrap().fingerprint();
    let (code, _, err) = sshmode(&db, &["target", "rekey", "web", "--host-key", &fp]);
    assert_eq!(code, 0, "{err}");
    let (_, out, _) = sshmode(
        &db,
        &["audit", "export", "--target", "web", "--kind", "hostkey"],
    );
    let rows = jsonl(&out);
    assert_eq!(rows.len(), 1, "{rows:#?}");
    assert_eq!(rows[0]["kind"], "hostkey.rekey");
    assert_eq!(rows[0]["actor"], format!("cli:{}", me.trim()));
    let (_, out, _) = sshmode(
        &db,
        &[
            "audit",
            "export",
            "--actor",
            "cli",
            "--kind",
            "target.disable",
        ],
    );
    assert_eq!(jsonl(&out).len(), 1, "{out}");

    // A kind that no row can have is an error that lists the families.
    let (code, out, err) = sshmode(&db, &["audit", "list", "--kind", "comand"]);
    assert_ne!(code, 0);
    assert!(out.is_empty(), "{out}");
    assert!(
        err.contains("`comand` is no kind") && err.contains("command"),
        "{err}"
    );
}
