//! The master key and its database: a missing key file over sealed secrets is refused and no
//! key is created; a wrong key is a ✗ in `doctor` and `serve` refuses to start; `vault
//! rotate-key` refuses while a replica has a live heartbeat (unless `--force`) and moves every
//! sealed record, the canary with them, to the new key.

use std::collections::HashMap;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::Value;
use sshmode::vault::{Field, Slot, Vault};

use crate::helpers::{TestApp, config_from, fresh_database};

/// The built binary with a clean environment on `db`, data in `data`, plus `vars`.
fn sshmode(db: &str, data: &Path, vars: &[(&str, &str)]) -> Command {
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

/// Adds target `alias` with password `password` (offline, approved): its password is sealed.
fn add_password_target(db: &str, data: &Path, vars: &[(&str, &str)], alias: &str, password: &str) {
    let args = [
        "target",
        "add",
        alias,
        "--host",
        "127.0.0.1",
        "--user",
        "u",
        "--password-stdin",
        "--offline",
        "--approve",
    ];
    let (code, out, err) = run(sshmode(db, data, vars), &args, &format!("{password}\n"));
    assert_eq!(code, 0, "{out}{err}");
}

/// `sshmode doctor --json`'s `vault` check and the exit code.
fn doctor_vault(db: &str, data: &Path, vars: &[(&str, &str)]) -> (i32, Value) {
    let (code, out, err) = run(sshmode(db, data, vars), &["doctor", "--json"], "");
    let checks: Vec<Value> =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}\n{err}"));
    let vault = checks
        .into_iter()
        .find(|c| c["name"] == "vault")
        .unwrap_or_else(|| panic!("no vault check: {out}"));
    (code, vault)
}

/// Builds the service as `serve` does on `db` with data in `data` and `vars`; its error.
async fn serve_refusal(db: &str, data: &Path, vars: &[(&str, &str)]) -> String {
    let mut all: HashMap<String, String> = HashMap::from([
        ("LARK_APP_ID".into(), "cli_test_app".into()),
        ("LARK_APP_SECRET".into(), "test-app-secret".into()),
        (
            "LARK_VERIFICATION_TOKEN".into(),
            "test-verification-token".into(),
        ),
        ("LARK_BASE_URL".into(), "http://127.0.0.1:9".into()),
        ("SSHMODE_ADMINS".into(), "ou_admin".into()),
        ("DATABASE_URL".into(), db.into()),
        ("SSHMODE_DATA_DIR".into(), data.display().to_string()),
    ]);
    for (k, v) in vars {
        all.insert(k.to_string(), v.to_string());
    }
    let config = config_from(&all, data);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let built = sshmode::app::App::build_with(
        config,
        listener,
        tokio_util::sync::CancellationToken::new(),
        Default::default(),
    )
    .await;
    match built {
        Ok(_) => panic!("serve started"),
        Err(e) => format!("{e:#}"),
    }
}

/// Target `alias`'s sealed password opened with the key at `key`, if it opens.
async fn password_under(db: &str, alias: &str, key: &Path) -> Option<String> {
    let pool = sqlx::PgPool::connect(db).await.unwrap();
    let (generation, sealed): (i64, Vec<u8>) =
        sqlx::query_as("SELECT generation, sealed_password FROM targets WHERE alias = $1")
            .bind(alias)
            .fetch_one(&pool)
            .await
            .unwrap();
    let vault = Vault::open_existing(key).unwrap();
    let opened = vault
        .open(
            &Slot {
                alias,
                generation,
                field: Field::Password,
            },
            &sealed,
        )
        .ok()
        .map(|p| String::from_utf8(p.to_vec()).unwrap());
    pool.close().await;
    opened
}

/// Whether the key at `key` opens the database's canary (`None`: there is none).
async fn canary_under(db: &str, key: &Path) -> Option<bool> {
    let pool = sqlx::PgPool::connect(db).await.unwrap();
    let vault = Vault::open_existing(key).unwrap();
    let opens = sshmode::target::keyring::opens_canary(&pool, &vault)
        .await
        .unwrap();
    pool.close().await;
    opens
}

/// A valid key file that is not the database's.
fn another_key(path: &Path) {
    let bytes: Vec<u8> = (0..32).map(|_| rand_byte()).collect();
    std::fs::write(path, bytes).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

fn rand_byte() -> u8 {
    uuid::Uuid::new_v4().as_bytes()[0]
}

#[tokio::test]
async fn a_missing_key_file_over_sealed_secrets_is_refused_by_name_and_no_key_is_created() {
    let db = fresh_database().await;
    let data = tempfile::tempdir().unwrap();
    let d = data.path();
    add_password_target(&db, d, &[], "box", "pw-secret-1");
    let mistyped = d.join("mastr.key");
    let m = mistyped.display().to_string();
    let vars = [("SSHMODE_MASTER_KEY_FILE", m.as_str())];

    // A command that opens the vault.
    let args = [
        "target",
        "add",
        "other",
        "--host",
        "127.0.0.1",
        "--user",
        "u",
        "--password-stdin",
        "--offline",
    ];
    let (code, _, err) = run(sshmode(&db, d, &vars), &args, "pw-2\n");
    assert_ne!(code, 0);
    assert!(err.contains(&m), "names the path: {err}");
    assert!(
        err.contains("SSHMODE_MASTER_KEY_FILE") && err.contains("backup"),
        "says what to do: {err}"
    );
    assert!(!mistyped.exists(), "a key was created");

    // doctor: a ✗ with the same advice, and still no key.
    let (code, vault) = doctor_vault(&db, d, &vars);
    assert_eq!(
        (code, vault["status"].as_str()),
        (1, Some("fail")),
        "{vault}"
    );
    assert!(vault["detail"].as_str().unwrap().contains(&m), "{vault}");
    assert!(
        vault["advice"]
            .as_str()
            .unwrap()
            .contains("point SSHMODE_MASTER_KEY_FILE at the key that sealed them"),
        "{vault}"
    );
    assert!(!mistyped.exists(), "doctor created a key");

    // serve refuses too, and creates nothing.
    let err = serve_refusal(&db, d, &vars).await;
    assert!(
        err.contains(&m) && err.contains("none was created"),
        "{err}"
    );
    assert!(!mistyped.exists(), "serve created a key");

    // The right key still works, and doctor says so.
    let (code, vault) = doctor_vault(&db, d, &[]);
    assert_eq!(vault["status"], "ok", "{code} {vault}");
    assert_eq!(
        password_under(&db, "box", &d.join("master.key"))
            .await
            .as_deref(),
        Some("pw-secret-1")
    );
}

#[tokio::test]
async fn a_wrong_key_is_a_doctor_cross_and_serve_refuses_to_start() {
    let db = fresh_database().await;
    let data = tempfile::tempdir().unwrap();
    let d = data.path();
    add_password_target(&db, d, &[], "box", "pw-secret-1");
    assert_eq!(canary_under(&db, &d.join("master.key")).await, Some(true));
    let wrong = d.join("wrong.key");
    another_key(&wrong);
    let w = wrong.display().to_string();
    let vars = [("SSHMODE_MASTER_KEY_FILE", w.as_str())];

    let (code, vault) = doctor_vault(&db, d, &vars);
    assert_eq!(
        (code, vault["status"].as_str()),
        (1, Some("fail")),
        "{vault}"
    );
    let detail = vault["detail"].as_str().unwrap();
    assert!(
        detail.contains(&w) && detail.contains("does not open"),
        "{vault}"
    );
    assert!(
        vault["advice"]
            .as_str()
            .unwrap()
            .contains("restore that key from your backup"),
        "{vault}"
    );
    let err = serve_refusal(&db, d, &vars).await;
    assert!(err.contains(&w) && err.contains("does not open"), "{err}");

    // A database sealed before it had a canary: the wrong key is still refused (it opens no
    // record), and the right one is accepted and writes the canary.
    let pool = sqlx::PgPool::connect(&db).await.unwrap();
    sqlx::query("DELETE FROM vault_canary")
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
    let err = serve_refusal(&db, d, &vars).await;
    assert!(err.contains("does not open"), "{err}");
    assert_eq!(
        canary_under(&db, &wrong).await,
        None,
        "no canary under a wrong key"
    );
    let (_, vault) = doctor_vault(&db, d, &[]);
    assert_eq!(vault["status"], "ok", "{vault}");
    assert_eq!(canary_under(&db, &d.join("master.key")).await, Some(true));
}

#[tokio::test]
async fn rotation_is_refused_beside_a_live_replica_and_forced_or_alone_moves_every_sealed_record() {
    let db = fresh_database().await;
    let data = tempfile::tempdir().unwrap();
    let d = data.path().to_path_buf();
    add_password_target(&db, &d, &[], "box", "pw-secret-1");
    let key = d.join("master.key");
    let (old, new) = (d.join("master.key.old"), d.join("master.key.new"));
    let first = std::fs::read(&key).unwrap();

    // A running service on the same database and key.
    let app = TestApp::builder()
        .database(&db)
        .var("SSHMODE_DATA_DIR", &d.display().to_string())
        .spawn()
        .await;
    let (code, out, err) = run(sshmode(&db, &d, &[]), &["vault", "rotate-key"], "");
    assert_ne!(code, 0, "{out}");
    assert!(
        err.contains("running") && err.contains("sshmode serve") && err.contains("--force"),
        "{err}"
    );
    assert_eq!(std::fs::read(&key).unwrap(), first, "the key changed");
    assert!(!old.exists() && !new.exists());
    assert_eq!(canary_under(&db, &key).await, Some(true));

    // --force rotates, and warns that the running service must restart.
    let (code, out, err) = run(
        sshmode(&db, &d, &[]),
        &["vault", "rotate-key", "--force"],
        "",
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("re-sealed the secrets of 1 target(s)"),
        "{out}"
    );
    assert!(err.contains("restart"), "{err}");
    assert_eq!(std::fs::read(&old).unwrap(), first);
    assert!(!new.exists());
    // Every sealed record opens with the new key, none with the old one.
    assert_eq!(
        password_under(&db, "box", &key).await.as_deref(),
        Some("pw-secret-1")
    );
    assert_eq!(canary_under(&db, &key).await, Some(true));
    assert_eq!(password_under(&db, "box", &old).await, None);
    assert_eq!(canary_under(&db, &old).await, Some(false));
    app.stop().await;

    // The previous key still beside it: the message names that file, and no `.new`.
    let (code, _, err) = run(sshmode(&db, &d, &[]), &["vault", "rotate-key"], "");
    assert_ne!(code, 0);
    assert!(err.contains("master.key.old exists"), "{err}");
    assert!(
        !err.contains(".new"),
        "names a file that does not exist: {err}"
    );
    std::fs::remove_file(&old).unwrap();
    // A `.new` left by a rotation that changed nothing is named as such.
    another_key(&new);
    let (code, _, err) = run(sshmode(&db, &d, &[]), &["vault", "rotate-key"], "");
    assert_ne!(code, 0);
    assert!(
        err.contains("master.key.new") && err.contains("changed nothing"),
        "{err}"
    );
    std::fs::remove_file(&new).unwrap();

    // No live heartbeat (the service stopped; a dead replica's row is old): it rotates.
    let pool = sqlx::PgPool::connect(&db).await.unwrap();
    sqlx::query(
        "INSERT INTO replicas (id, host, pid, seen_at) VALUES ('dead', 'h', 1, now() - interval '1 minute')",
    )
    .execute(&pool)
    .await
    .unwrap();
    pool.close().await;
    let second = std::fs::read(&key).unwrap();
    let (code, out, err) = run(sshmode(&db, &d, &[]), &["vault", "rotate-key"], "");
    assert_eq!(code, 0, "{out}{err}");
    assert!(!err.contains("restart"), "{err}");
    assert_ne!(std::fs::read(&key).unwrap(), second);
    assert_eq!(
        password_under(&db, "box", &key).await.as_deref(),
        Some("pw-secret-1")
    );
    assert_eq!(canary_under(&db, &key).await, Some(true));
    assert_eq!(canary_under(&db, &old).await, Some(false));
}
