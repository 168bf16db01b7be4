//! Host-key trust and vault binding against real sshd: `target add` sees the key once and
//! approval pins *that* key (not whatever the first connection meets); vault records open only
//! in their own row and field; records of the first format are re-sealed at start, once.

use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use sshmode::exec::ExecError;
use sshmode::target::cli::TargetCmd;

use crate::exec_ssh::{Env, add_args, cli, env};
use crate::sshd::{self, Sshd};

impl Env {
    /// Restarts sshd on the same port with a new host key; returns its fingerprint.
    fn new_host_key(&mut self) -> String {
        self.sshd.stop();
        let dir = self.sshd.dir.clone();
        std::fs::remove_file(dir.join("host_key")).unwrap();
        std::fs::remove_file(dir.join("host_key.pub")).unwrap();
        self.sshd = Sshd::start(&dir, self.sshd.port);
        self.sshd.fingerprint()
    }

    async fn add_password_target(&self, alias: &str, password: &str) {
        let mut a = add_args(alias, self.sshd.port);
        a.password_stdin = true;
        let (r, out) = cli(&self.app, TargetCmd::Add(a), &format!("{password}\n")).await;
        assert_eq!(r, Ok(0), "{out}");
    }

    async fn column(&self, alias: &str, column: &str) -> Option<Vec<u8>> {
        sqlx::query_scalar(&format!("SELECT {column} FROM targets WHERE alias = $1"))
            .bind(alias)
            .fetch_one(&self.app.state.db)
            .await
            .unwrap()
    }
}

#[tokio::test]
async fn approval_pins_the_key_the_admin_was_shown() {
    let Some(mut env) = env().await else { return };
    let shown = env.sshd.fingerprint();
    let key = env.key("pend_key", "ed25519", "");
    let mut a = add_args("pend", env.sshd.port);
    a.key = Some(key);
    a.approve = false;
    let (r, out) = cli(&env.app, TargetCmd::Add(a), "").await;
    assert_eq!(r, Ok(0), "{out}");
    assert!(out.contains(&shown) && out.contains("approving"), "{out}");
    let (_, show) = cli(
        &env.app,
        TargetCmd::Show {
            alias: "pend".into(),
            json: false,
        },
        "",
    )
    .await;
    assert!(show.contains(&shown) && show.contains("seen"), "{show}");

    // Before approval, someone else answers on that address (a man in the middle, or a
    // host reinstalled). Approval pins what the admin saw, not what answers next.
    let other = env.new_host_key();
    let approval = sshmode::target::approve(&env.app.state.db, "pend", "ou_admin")
        .await
        .unwrap();
    assert_eq!(approval.previous, sshmode::target::Status::Pending);
    assert_eq!(approval.pinned.unwrap().fingerprint, shown);
    match env.run("pend", "true").await {
        Err(ExecError::HostKeyMismatch {
            expected,
            presented,
            ..
        }) => assert_eq!((expected, presented), (shown.clone(), other.clone())),
        Err(e) => panic!("expected a host-key mismatch, got {e}"),
        Ok(_) => panic!("a key other than the one approved was accepted"),
    }
    let detail: serde_json::Value = sqlx::query_scalar(
        "SELECT detail FROM audit_log WHERE subject = 'pend' AND action = 'target.approve'",
    )
    .fetch_one(&env.app.state.db)
    .await
    .unwrap();
    assert_eq!(detail["host_key"], shown.as_str());
    let actions = env.audit_actions("pend").await;
    assert!(actions.contains(&"hostkey.pin".to_string()), "{actions:?}");
    assert!(
        !actions.contains(&"hostkey.record".to_string()),
        "{actions:?}"
    );
}

#[tokio::test]
async fn a_vault_record_opens_only_in_its_own_row_and_field() {
    let Some(env) = env().await else { return };
    // A removed target's sealed password, put on a new target with the same alias.
    env.add_password_target("reuse", sshd::PASSWORD).await;
    let old = env.column("reuse", "sealed_password").await.unwrap();
    let (r, _) = cli(
        &env.app,
        TargetCmd::Remove {
            alias: "reuse".into(),
        },
        "",
    )
    .await;
    assert_eq!(r, Ok(0));
    env.add_password_target("reuse", "not the password").await;
    sqlx::query("UPDATE targets SET sealed_password = $1 WHERE alias = 'reuse'")
        .bind(&old)
        .execute(&env.app.state.db)
        .await
        .unwrap();
    let (r, out) = env.test_target("reuse", None).await;
    assert_eq!(r, Ok(1), "an old record authenticated a new target: {out}");
    assert!(out.contains("could not be opened"), "{out}");

    // The key and certificate of one row swapped.
    let ck = env.dir.path().join("swap_cert_key");
    sshd::new_key(&ck, "ed25519", "");
    let cert = env.sshd.certify(&ck);
    let mut a = add_args("kc", env.sshd.port);
    a.key = Some(ck);
    a.cert = Some(cert);
    assert_eq!(cli(&env.app, TargetCmd::Add(a), "").await.0, Ok(0));
    assert_eq!(env.test_target("kc", None).await.0, Ok(0));
    sqlx::query(
        "UPDATE targets SET sealed_key = sealed_cert, sealed_cert = sealed_key WHERE alias = 'kc'",
    )
    .execute(&env.app.state.db)
    .await
    .unwrap();
    let (r, out) = env.test_target("kc", None).await;
    assert_eq!(r, Ok(1), "{out}");
    assert!(out.contains("could not be opened"), "{out}");
}

/// A record in the first vault format: the alias alone as associated data.
fn seal_v1(key_file: &std::path::Path, alias: &str, plaintext: &[u8]) -> Vec<u8> {
    let raw = std::fs::read(key_file).unwrap();
    let key = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &raw).unwrap());
    let nonce = [7u8; NONCE_LEN];
    let mut out = vec![1u8];
    out.extend_from_slice(&nonce);
    let mut body = plaintext.to_vec();
    key.seal_in_place_append_tag(
        Nonce::assume_unique_for_key(nonce),
        Aad::from(alias.as_bytes()),
        &mut body,
    )
    .unwrap();
    out.extend_from_slice(&body);
    out
}

#[tokio::test]
async fn first_format_records_are_resealed_at_start_once() {
    let Some(env) = env().await else { return };
    env.add_password_target("legacy", sshd::PASSWORD).await;
    let key_file = env.app.state.config.master_key_file.clone();
    let db = &env.app.state.db;
    sqlx::query("UPDATE targets SET sealed_password = $1, seal_version = 1 WHERE alias = 'legacy'")
        .bind(seal_v1(&key_file, "legacy", sshd::PASSWORD.as_bytes()))
        .execute(db)
        .await
        .unwrap();
    // Not opened the old way when used.
    let e = env.run("legacy", "true").await.expect_err("v1 row used");
    assert!(e.to_string().contains("old vault format"), "{e}");

    // The service re-seals at start.
    let again = crate::helpers::TestApp::builder()
        .database(&env.app.db_url)
        .var("SSHMODE_MASTER_KEY_FILE", key_file.to_str().unwrap())
        .spawn()
        .await;
    let version: i16 =
        sqlx::query_scalar("SELECT seal_version FROM targets WHERE alias = 'legacy'")
            .fetch_one(db)
            .await
            .unwrap();
    assert_eq!(version, 2);
    let (r, out) = env.test_target("legacy", None).await;
    assert_eq!(r, Ok(0), "the re-sealed password authenticates: {out}");
    // Idempotent: nothing left to do, nothing done twice.
    let vault = sshmode::vault::Vault::open_or_create(&key_file).unwrap();
    assert_eq!(sshmode::target::reseal_legacy(db, &vault).await.unwrap(), 0);
    let resealed = env
        .audit_actions("legacy")
        .await
        .iter()
        .filter(|a| *a == "target.reseal")
        .count();
    assert_eq!(resealed, 1);
    again.stop().await;
}
