//! The SSH backend against real OpenSSH servers the tests start themselves: the shared
//! behavioural suite, every authentication method, host-key trust and refusal, the pool
//! under 50 concurrent commands, reconnection, unreachable targets, the target CLI, and
//! secrets that never surface.

use std::io::Cursor;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sshmode::exec::ops::RunOptions;
use sshmode::exec::{ExecError, Place};
use sshmode::target::cli::{AddArgs, HostKeyPolicyArg, TargetCmd, run_with};
use tokio_util::sync::CancellationToken;

use crate::helpers::TestApp;
use crate::sshd::{self, Sshd};

pub struct Env {
    pub app: TestApp,
    pub sshd: Sshd,
    /// Keys and the sshd fixture live here.
    pub dir: tempfile::TempDir,
}

pub async fn env() -> Option<Env> {
    env_with(&[
        ("SSHMODE_SSH_CONNECT_TIMEOUT_SECS", "3"),
        ("SSHMODE_SSH_QUEUE_TIMEOUT_SECS", "60"),
    ])
    .await
}

/// A fresh sshd and an app configured with `vars`; `None` where sshd cannot run.
pub async fn env_with(vars: &[(&str, &str)]) -> Option<Env> {
    env_with_sshd(vars, "").await
}

/// [`env_with`], with `sshd_extra` appended to the sshd configuration.
pub async fn env_with_sshd(vars: &[(&str, &str)], sshd_extra: &str) -> Option<Env> {
    if !sshd::available() {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let sshd_dir = dir.path().join("sshd");
    std::fs::create_dir_all(&sshd_dir).unwrap();
    let sshd = Sshd::start_with(&sshd_dir, sshd::free_port(), sshd_extra);
    let app = vars
        .iter()
        .fold(TestApp::builder(), |b, (k, v)| b.var(k, v))
        .spawn()
        .await;
    Some(Env { app, sshd, dir })
}

pub fn add_args(alias: &str, port: u16) -> AddArgs {
    AddArgs {
        alias: alias.into(),
        host: "127.0.0.1".into(),
        port,
        user: sshd::USER.into(),
        key: None,
        passphrase_stdin: false,
        password_stdin: false,
        agent: false,
        cert: None,
        description: Some("test target".into()),
        host_key_policy: HostKeyPolicyArg::Tofu,
        host_key: None,
        approve: true,
        offline: false,
        jump: None,
    }
}

/// Runs a `sshmode target …` command in-process: (exit code or error text, stdout).
fn add_args_pw(alias: &str, port: u16) -> AddArgs {
    let mut a = add_args(alias, port);
    a.password_stdin = true;
    a
}

/// `sshmode target set <alias>` with nothing set yet (fill in what the test sets).
pub fn set_args(alias: &str) -> sshmode::target::cli::SetArgs {
    sshmode::target::cli::SetArgs {
        alias: alias.into(),
        workspace: None,
        permission: None,
        jump: None,
        no_jump: false,
        approvers: None,
        risky: None,
    }
}

/// Runs `cmd` with no input, asserts it succeeded, and returns what it printed.
pub async fn cli_ok(app: &TestApp, cmd: TargetCmd) -> String {
    let (r, out) = cli(app, cmd, "").await;
    assert_eq!(r, Ok(0), "{out}");
    out
}

pub async fn cli(app: &TestApp, cmd: TargetCmd, stdin: &str) -> (Result<i32, String>, String) {
    let mut out = Vec::new();
    let mut input = Cursor::new(stdin.as_bytes().to_vec());
    let r = run_with(cmd, &app.state.config, &app.state.db, &mut input, &mut out)
        .await
        .map_err(|e| format!("{e:#}"));
    (r, String::from_utf8(out).unwrap())
}

impl Env {
    /// A fresh authorized key pair of `kind`.
    pub fn key(&self, name: &str, kind: &str, passphrase: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        sshd::new_key(&p, kind, passphrase);
        self.sshd
            .authorize(&PathBuf::from(format!("{}.pub", p.display())));
        p
    }

    pub async fn add_key_target(&self, alias: &str) {
        let key = self.key(&format!("{alias}_key"), "ed25519", "");
        let mut a = add_args(alias, self.sshd.port);
        a.key = Some(key);
        let (r, out) = cli(&self.app, TargetCmd::Add(a), "").await;
        assert_eq!(r, Ok(0), "{out}");
    }

    pub async fn run(
        &self,
        alias: &str,
        cmd: &str,
    ) -> Result<sshmode::exec::ops::TerminalResult, ExecError> {
        let ops = self
            .app
            .state
            .exec
            .ops_for("omt_ssh", &Place::Target(alias.into()))
            .await?;
        ops.terminal(cmd, RunOptions::default(), &CancellationToken::new())
            .await
    }

    /// `sshmode target test <alias> [--trust [FP]]` (`Some("")` is `--trust` alone): (exit
    /// code or error text, stdout).
    pub async fn test_target(
        &self,
        alias: &str,
        trust: Option<&str>,
    ) -> (Result<i32, String>, String) {
        let cmd = TargetCmd::Test {
            alias: alias.into(),
            trust: trust.map(str::to_string),
        };
        cli(&self.app, cmd, "").await
    }

    pub async fn audit_actions(&self, alias: &str) -> Vec<String> {
        sqlx::query_scalar("SELECT action FROM audit_log WHERE subject = $1 ORDER BY id")
            .bind(alias)
            .fetch_all(&self.app.state.db)
            .await
            .unwrap()
    }
}

#[tokio::test]
async fn ssh_backend_behaves_like_local() {
    let Some(env) = env().await else { return };
    env.add_key_target("web").await;
    let section = format!("omt_ssh_suite_{}", uuid::Uuid::new_v4().simple());
    // Start in a fresh directory so the suite's relative paths do not collide.
    let ops = env
        .app
        .state
        .exec
        .ops_for(&section, &Place::Target("web".into()))
        .await
        .unwrap();
    let home = ops.backend().home().await.unwrap();
    assert_eq!(
        home,
        format!("/home/{}", sshd::USER),
        "`~` is the remote user's"
    );
    let dir = format!("{home}/suite-{}", uuid::Uuid::new_v4().simple());
    let r = ops
        .terminal(
            &format!("mkdir -p {dir} && cd {dir}"),
            RunOptions::default(),
            &CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(r.cwd, dir);
    crate::exec::behaviour(&env.app, Place::Target("web".into()), &section).await;

    // `target add` saw the server's key, as ssh-keygen -l prints it, and `--approve` pinned
    // it: the first connection had nothing left to trust on first use.
    let t = sshmode::target::get(&env.app.state.db, "web")
        .await
        .unwrap();
    let key = t.host_key.unwrap();
    assert_eq!(key.fingerprint, env.sshd.fingerprint());
    assert_eq!(key.source, "pinned");
    let metrics = env.app.metrics().await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("sshmode_ssh_connects_total{reason=\"ok\"}")),
        "{metrics}"
    );
    let actions = env.audit_actions("web").await;
    assert!(actions.contains(&"target.add".to_string()));
    assert_eq!(actions.iter().filter(|a| *a == "hostkey.record").count(), 0);
}

#[tokio::test]
async fn every_authentication_method_works() {
    let Some(env) = env().await else { return };
    let port = env.sshd.port;
    // rsa with a passphrase, ecdsa.
    let rsa = env.key("rsa_pp", "rsa", "open sesame");
    let mut a = add_args("rsa-pp", port);
    a.key = Some(rsa.clone());
    a.passphrase_stdin = true;
    assert_eq!(
        cli(&env.app, TargetCmd::Add(a), "open sesame\n").await.0,
        Ok(0)
    );
    let mut a = add_args("rsa-nopp", port);
    a.key = Some(rsa);
    let (r, _) = cli(&env.app, TargetCmd::Add(a), "").await;
    assert!(
        r.unwrap_err().contains("encrypted"),
        "an encrypted key needs its passphrase"
    );
    let ecdsa = env.key("ecdsa", "ecdsa", "");
    let mut a = add_args("ecdsa", port);
    a.key = Some(ecdsa);
    assert_eq!(cli(&env.app, TargetCmd::Add(a), "").await.0, Ok(0));
    // Password.
    let mut a = add_args("pw", port);
    a.password_stdin = true;
    assert_eq!(
        cli(
            &env.app,
            TargetCmd::Add(a),
            &format!("{}\n", sshd::PASSWORD)
        )
        .await
        .0,
        Ok(0)
    );
    let mut a = add_args("pw-wrong", port);
    a.password_stdin = true;
    assert_eq!(cli(&env.app, TargetCmd::Add(a), "not it\n").await.0, Ok(0));
    // A user certificate: the key itself is NOT authorized, only the CA is trusted.
    let ck = env.dir.path().join("cert_key");
    sshd::new_key(&ck, "ed25519", "");
    let cert = env.sshd.certify(&ck);
    let mut a = add_args("cert", port);
    a.key = Some(ck.clone());
    a.cert = Some(cert);
    assert_eq!(cli(&env.app, TargetCmd::Add(a), "").await.0, Ok(0));
    let mut a = add_args("cert-missing", port);
    a.key = Some(ck);
    assert_eq!(cli(&env.app, TargetCmd::Add(a), "").await.0, Ok(0));

    for alias in ["rsa-pp", "ecdsa", "pw", "cert"] {
        let (r, out) = env.test_target(alias, None).await;
        assert_eq!(r, Ok(0), "{alias}: {out}");
        assert!(out.contains(&env.sshd.fingerprint()), "{alias}: {out}");
        let r = env.run(alias, "whoami").await.unwrap();
        assert_eq!(
            String::from_utf8_lossy(&r.output.stdout),
            format!("{}\n", sshd::USER)
        );
    }
    for alias in ["pw-wrong", "cert-missing"] {
        let (r, out) = env.test_target(alias, None).await;
        assert_eq!(r, Ok(1), "{alias} must fail: {out}");
        assert!(out.contains("refused"), "{alias}: {out}");
    }

    // The agent, reached through SSH_AUTH_SOCK.
    let sock = env.dir.path().join("agent.sock");
    let mut agent = std::process::Command::new("ssh-agent")
        .args(["-D", "-a"])
        .arg(&sock)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    for _ in 0..500 {
        if sock.exists() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let ak = env.key("agent_key", "ed25519", "");
    let added = std::process::Command::new("ssh-add")
        .arg(&ak)
        .env("SSH_AUTH_SOCK", &sock)
        .output()
        .unwrap();
    assert!(added.status.success(), "{added:?}");
    std::fs::remove_file(&ak).unwrap();
    // A second replica on the same database shares its master key.
    let app2 = TestApp::builder()
        .database(&env.app.db_url)
        .var(
            "SSHMODE_MASTER_KEY_FILE",
            &env.app.state.config.master_key_file.display().to_string(),
        )
        .var("SSH_AUTH_SOCK", sock.to_str().unwrap())
        .spawn()
        .await;
    let mut a = add_args("agent", port);
    a.agent = true;
    assert_eq!(cli(&app2, TargetCmd::Add(a), "").await.0, Ok(0));
    let ops = app2
        .state
        .exec
        .ops_for("omt_agent", &Place::Target("agent".into()))
        .await
        .unwrap();
    let r = ops
        .terminal("whoami", RunOptions::default(), &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&r.output.stdout),
        format!("{}\n", sshd::USER)
    );
    let _ = agent.kill();
    let _ = agent.wait();
}

#[tokio::test]
async fn fifty_concurrent_commands_share_the_pool() {
    let Some(env) = env().await else { return };
    env.add_key_target("busy").await;
    let exec = env.app.state.exec.clone();
    let mut tasks = Vec::new();
    for i in 0..50 {
        let exec = exec.clone();
        tasks.push(tokio::spawn(async move {
            let ops = exec
                .ops_for(&format!("omt_c{i}"), &Place::Target("busy".into()))
                .await
                .unwrap();
            let r = ops
                .terminal(
                    &format!("sleep 0.2; echo {i}"),
                    RunOptions::default(),
                    &CancellationToken::new(),
                )
                .await
                .unwrap();
            assert_eq!(String::from_utf8_lossy(&r.output.stdout), format!("{i}\n"));
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let counts = exec.ssh.connection_counts().await;
    let n = counts["busy"];
    assert!((1..=4).contains(&n), "{n} connections");
}

#[tokio::test]
async fn a_restarted_sshd_is_reconnected() {
    let Some(mut env) = env().await else { return };
    env.add_key_target("bounce").await;
    assert!(
        env.run("bounce", "true")
            .await
            .unwrap()
            .output
            .exit
            .success()
    );
    env.sshd.stop();
    let dir = env.sshd.dir.clone();
    env.sshd = Sshd::start(&dir, env.sshd.port);
    let r = env.run("bounce", "echo back").await.unwrap();
    assert_eq!(String::from_utf8_lossy(&r.output.stdout), "back\n");
}

#[tokio::test]
async fn a_changed_host_key_is_refused_and_audited() {
    let Some(mut env) = env().await else { return };
    env.add_key_target("swap").await;
    assert!(env.run("swap", "true").await.unwrap().output.exit.success());
    let first = env.sshd.fingerprint();
    env.sshd.stop();
    let dir = env.sshd.dir.clone();
    std::fs::remove_file(dir.join("host_key")).unwrap();
    std::fs::remove_file(dir.join("host_key.pub")).unwrap();
    env.sshd = Sshd::start(&dir, env.sshd.port);
    let second = env.sshd.fingerprint();
    assert_ne!(first, second);
    match env.run("swap", "true").await {
        Err(ExecError::HostKeyMismatch {
            expected,
            presented,
            ..
        }) => {
            assert_eq!(
                (expected.as_str(), presented.as_str()),
                (first.as_str(), second.as_str())
            );
        }
        Err(e) => panic!("expected a host-key mismatch, got {e}"),
        Ok(_) => panic!("a changed host key must be refused"),
    }
    assert!(
        env.audit_actions("swap")
            .await
            .contains(&"hostkey.mismatch".to_string())
    );
    // `target test` fails too, naming both, and says how to accept a legitimate change.
    let (r, out) = env.test_target("swap", Some("")).await;
    assert_eq!(r, Ok(1), "{out}");
    assert!(out.contains(&first) && out.contains(&second), "{out}");
    assert!(
        out.contains("sshmode target rekey swap --host-key"),
        "{out}"
    );
    // Even `--trust` with the new fingerprint does not override a recorded key.
    let (r, out) = env.test_target("swap", Some(&second)).await;
    assert_eq!(r, Ok(1), "{out}");
    // The admin checked the new key: `target rekey` replaces it, audited.
    let (r, out) = cli(
        &env.app,
        TargetCmd::Rekey {
            alias: "swap".into(),
            host_key: second.clone(),
        },
        "",
    )
    .await;
    assert_eq!(r, Ok(0), "{out}");
    assert!(out.contains(&first) && out.contains(&second), "{out}");
    assert!(env.run("swap", "true").await.unwrap().output.exit.success());
    let t = sshmode::target::get(&env.app.state.db, "swap")
        .await
        .unwrap();
    let key = t.host_key.unwrap();
    assert_eq!(
        (key.fingerprint.as_str(), key.source.as_str()),
        (second.as_str(), "pinned")
    );
    let rekeyed: serde_json::Value = sqlx::query_scalar(
        "SELECT detail FROM audit_log WHERE subject = 'swap' AND action = 'hostkey.rekey'",
    )
    .fetch_one(&env.app.state.db)
    .await
    .unwrap();
    assert_eq!(rekeyed["from"], first.as_str());
    assert_eq!(rekeyed["to"], second.as_str());
}

#[tokio::test]
async fn unreachable_targets_fail_clearly_within_the_connect_timeout() {
    let Some(env) = env().await else { return };
    // A port nobody listens on.
    let closed = sshd::free_port();
    let mut a = add_args("closed", closed);
    a.password_stdin = true;
    // Without --offline, `add` itself refuses: it could not see the host key.
    let (r, _) = cli(
        &env.app,
        TargetCmd::Add(add_args_pw("closed", closed)),
        "x\n",
    )
    .await;
    let e = r.unwrap_err();
    assert!(e.contains("cannot reach") && e.contains("--offline"), "{e}");
    a.offline = true;
    assert_eq!(cli(&env.app, TargetCmd::Add(a), "x\n").await.0, Ok(0));
    let e = env.run("closed", "true").await.expect_err("must fail");
    assert!(e.to_string().contains("cannot reach"), "{e}");
    // A listener that never speaks SSH: the connect timeout (3 s) ends the wait.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut a = add_args("silent", silent.local_addr().unwrap().port());
    a.password_stdin = true;
    a.offline = true;
    assert_eq!(cli(&env.app, TargetCmd::Add(a), "x\n").await.0, Ok(0));
    let e = env.run("silent", "true").await.expect_err("must fail");
    assert!(e.to_string().contains("within 3s"), "{e}");
    // Never local: the error names the target.
    assert!(e.to_string().contains("silent"), "{e}");
}

#[tokio::test]
async fn strict_targets_need_a_pinned_key() {
    let Some(env) = env().await else { return };
    let key = env.key("strict_key", "ed25519", "");
    let mut a = add_args("strict", env.sshd.port);
    a.key = Some(key.clone());
    a.host_key_policy = HostKeyPolicyArg::Strict;
    assert_eq!(cli(&env.app, TargetCmd::Add(a), "").await.0, Ok(0));
    // `add` saw the key, but a strict target accepts only a pinned one.
    let t = sshmode::target::get(&env.app.state.db, "strict")
        .await
        .unwrap();
    assert_eq!(t.host_key.as_ref().unwrap().source, "seen");
    let e = env
        .run("strict", "true")
        .await
        .expect_err("unpinned strict must fail");
    assert!(e.to_string().contains("not pinned"), "{e}");
    let (r, out) = env.test_target("strict", None).await;
    assert_eq!(r, Ok(1));
    assert!(
        out.contains(&env.sshd.fingerprint()),
        "the fingerprint is shown: {out}"
    );
    // `--trust` with a fingerprint the server does not present pins nothing.
    let wrong = "SHA256:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
    let (r, out) = env.test_target("strict", Some(wrong)).await;
    assert_eq!(r, Ok(1), "{out}");
    assert!(
        out.contains(wrong) && out.contains("nothing was pinned"),
        "{out}"
    );
    let t = sshmode::target::get(&env.app.state.db, "strict")
        .await
        .unwrap();
    assert_eq!(t.host_key.as_ref().unwrap().source, "seen");
    assert!(
        env.audit_actions("strict")
            .await
            .contains(&"hostkey.trust_mismatch".to_string())
    );
    // The fingerprint the operator checked: pinned.
    let (r, out) = env
        .test_target("strict", Some(&env.sshd.fingerprint()))
        .await;
    assert_eq!(r, Ok(0), "{out}");
    assert!(out.contains("pinned"), "{out}");
    assert!(
        env.audit_actions("strict")
            .await
            .contains(&"hostkey.pin".to_string())
    );
    assert!(
        env.run("strict", "true")
            .await
            .unwrap()
            .output
            .exit
            .success()
    );

    // Pinned at add time, by fingerprint or by key line.
    let mut a = add_args("strict-fp", env.sshd.port);
    a.key = Some(key.clone());
    a.host_key_policy = HostKeyPolicyArg::Strict;
    a.host_key = Some(env.sshd.fingerprint());
    assert_eq!(cli(&env.app, TargetCmd::Add(a), "").await.0, Ok(0));
    assert!(
        env.run("strict-fp", "true")
            .await
            .unwrap()
            .output
            .exit
            .success()
    );
    let mut a = add_args("strict-wrong", env.sshd.port);
    a.key = Some(key);
    a.host_key_policy = HostKeyPolicyArg::Strict;
    a.host_key = Some(std::fs::read_to_string(env.dir.path().join("strict_key.pub")).unwrap());
    // `add` sees that the server presents another key, and adds nothing.
    let (r, _) = cli(&env.app, TargetCmd::Add(clone_args(&a)), "").await;
    let e = r.unwrap_err();
    assert!(
        e.contains(&env.sshd.fingerprint()) && e.contains("nothing was added"),
        "{e}"
    );
    // Added offline, the first connection finds the mismatch.
    a.offline = true;
    assert_eq!(cli(&env.app, TargetCmd::Add(a), "").await.0, Ok(0));
    assert!(matches!(
        env.run("strict-wrong", "true").await,
        Err(ExecError::HostKeyMismatch { .. })
    ));
}

fn clone_args(a: &AddArgs) -> AddArgs {
    AddArgs {
        alias: a.alias.clone(),
        host: a.host.clone(),
        user: a.user.clone(),
        key: a.key.clone(),
        cert: a.cert.clone(),
        description: a.description.clone(),
        host_key: a.host_key.clone(),
        jump: a.jump.clone(),
        ..*a
    }
}

#[tokio::test]
async fn target_lifecycle_through_the_cli() {
    let Some(env) = env().await else { return };
    let key = env.key("life_key", "ed25519", "");
    let mut a = add_args("life", env.sshd.port);
    a.key = Some(key.clone());
    a.approve = false;
    let (r, out) = cli(&env.app, TargetCmd::Add(a), "").await;
    assert_eq!(r, Ok(0));
    assert!(out.contains("pending"), "{out}");
    let mut dup = add_args("life", env.sshd.port);
    dup.key = Some(key.clone());
    assert!(
        cli(&env.app, TargetCmd::Add(dup), "")
            .await
            .0
            .unwrap_err()
            .contains("already exists")
    );
    let e = env.run("life", "true").await.err().unwrap();
    assert!(e.to_string().contains("pending"), "{e}");
    assert_eq!(
        cli(
            &env.app,
            TargetCmd::Approve {
                alias: "life".into()
            },
            ""
        )
        .await
        .0,
        Ok(0)
    );
    assert!(env.run("life", "true").await.is_ok());
    let counts = env.app.state.exec.ssh.connection_counts().await;
    assert_eq!(counts.get("life"), Some(&1), "{counts:?}");
    assert_eq!(
        cli(
            &env.app,
            TargetCmd::Disable {
                alias: "life".into()
            },
            ""
        )
        .await
        .0,
        Ok(0)
    );
    let e = env.run("life", "true").await.err().unwrap();
    assert!(e.to_string().contains("disabled"), "{e}");
    // A disabled target's connections are dropped with its pool, not kept until idle.
    let counts = env.app.state.exec.ssh.connection_counts().await;
    assert!(!counts.contains_key("life"), "{counts:?}");
    let (_, list) = cli(&env.app, TargetCmd::List { json: false }, "").await;
    assert!(list.contains("life") && list.contains("disabled"), "{list}");
    let (_, show) = cli(
        &env.app,
        TargetCmd::Show {
            alias: "life".into(),
            json: false,
        },
        "",
    )
    .await;
    assert!(show.contains("auth:            key"), "{show}");
    for out in [&list, &show] {
        assert!(
            !out.contains(key.to_str().unwrap()),
            "key path leaked: {out}"
        );
        assert!(!out.contains("PRIVATE KEY"), "{out}");
    }
    assert_eq!(
        cli(
            &env.app,
            TargetCmd::Remove {
                alias: "life".into()
            },
            ""
        )
        .await
        .0,
        Ok(0)
    );
    assert!(
        cli(
            &env.app,
            TargetCmd::Show {
                alias: "life".into(),
                json: false,
            },
            ""
        )
        .await
        .0
        .is_err()
    );
    // The key seen at add was pinned by the approval: nothing was trusted on first use.
    assert_eq!(
        env.audit_actions("life").await,
        [
            "target.add",
            "target.approve",
            "hostkey.pin",
            "target.disable",
            "target.remove"
        ]
    );
}

/// A `tracing` writer that keeps every line, to search logs for secrets.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn secrets_never_surface_in_logs_output_or_storage() {
    let Some(env) = env().await else { return };
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    // A key target too: no piece of the private key may surface either.
    let key = env.key("secret_key", "ed25519", "");
    let key_text = std::fs::read_to_string(&key).unwrap();
    let body: String = key_text
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .collect();
    let key_piece = body[body.len() / 2..body.len() / 2 + 24].to_string();
    let mut a = add_args("secret-key", env.sshd.port);
    a.key = Some(key);
    assert_eq!(cli(&env.app, TargetCmd::Add(a), "").await.0, Ok(0));
    let key_run = env.run("secret-key", "env").await.unwrap();
    let stored_key: Vec<u8> =
        sqlx::query_scalar("SELECT sealed_key FROM targets WHERE alias = 'secret-key'")
            .fetch_one(&env.app.state.db)
            .await
            .unwrap();

    let mut a = add_args("secret", env.sshd.port);
    a.password_stdin = true;
    let (r, add_out) = cli(
        &env.app,
        TargetCmd::Add(a),
        &format!("{}\n", sshd::PASSWORD),
    )
    .await;
    assert_eq!(r, Ok(0));
    let (_, test_out) = env.test_target("secret", None).await;
    let (_, list) = cli(&env.app, TargetCmd::List { json: false }, "").await;
    let (_, show) = cli(
        &env.app,
        TargetCmd::Show {
            alias: "secret".into(),
            json: false,
        },
        "",
    )
    .await;
    let r = env.run("secret", "env; set").await.unwrap();
    let stored: Vec<u8> =
        sqlx::query_scalar("SELECT sealed_password FROM targets WHERE alias = 'secret'")
            .fetch_one(&env.app.state.db)
            .await
            .unwrap();
    let logs = captured.0.lock().unwrap().clone();
    assert!(!logs.is_empty(), "the log capture saw nothing");
    let pw = sshd::PASSWORD.as_bytes();
    for (what, hay) in [
        ("logs", logs.as_slice()),
        ("add", add_out.as_bytes()),
        ("test", test_out.as_bytes()),
        ("list", list.as_bytes()),
        ("show", show.as_bytes()),
        ("stdout", &r.output.stdout[..]),
        ("stderr", &r.output.stderr[..]),
        ("storage", &stored[..]),
    ] {
        assert!(
            !hay.windows(pw.len()).any(|w| w == pw),
            "the password appears in {what}"
        );
    }
    let kp = key_piece.as_bytes();
    for (what, hay) in [
        ("logs", logs.as_slice()),
        ("stdout", &key_run.output.stdout[..]),
        ("storage", &stored_key[..]),
        ("list", list.as_bytes()),
    ] {
        assert!(
            !hay.windows(kp.len()).any(|w| w == kp),
            "the private key appears in {what}"
        );
    }
}

/// An env whose pool has a single channel and short idle and queue timeouts.
async fn tight_env() -> Option<Env> {
    env_with(&[
        ("SSHMODE_SSH_MAX_CONNECTIONS", "1"),
        ("SSHMODE_SSH_CHANNELS_PER_CONNECTION", "1"),
        ("SSHMODE_SSH_QUEUE_TIMEOUT_SECS", "1"),
        ("SSHMODE_SSH_IDLE_SECS", "1"),
    ])
    .await
}

#[tokio::test]
async fn a_full_pool_queues_then_reports_busy_and_idle_connections_close() {
    let Some(env) = tight_env().await else { return };
    env.add_key_target("tight").await;
    let exec = env.app.state.exec.clone();
    let ops = exec
        .ops_for("omt_tight", &Place::Target("tight".into()))
        .await
        .unwrap();
    ops.cwd().await.unwrap();
    // The only channel is taken by a long command; the next one waits its queue time, then
    // gets a clear "busy" error instead of a second connection.
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let long = tokio::spawn(async move {
        let ops = exec
            .ops_for("omt_tight_long", &Place::Target("tight".into()))
            .await
            .unwrap();
        ops.cwd().await.unwrap();
        let _ = started_tx.send(());
        ops.terminal("sleep 4", RunOptions::default(), &CancellationToken::new())
            .await
    });
    started_rx.await.unwrap();
    // Give the long command's start a moment to take the channel: poll until it holds it.
    let mut err = None;
    for _ in 0..50 {
        match env.run("tight", "true").await {
            Err(e) => {
                err = Some(e);
                break;
            }
            Ok(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    let err = err.expect("a full pool must report busy");
    assert!(matches!(err, ExecError::Busy { .. }), "{err}");
    assert!(err.to_string().contains("busy"), "{err}");
    assert!(long.await.unwrap().unwrap().output.exit.success());
    let counts = env.app.state.exec.ssh.connection_counts().await;
    assert_eq!(counts["tight"], 1);
    // Idle for longer than SSHMODE_SSH_IDLE_SECS: the reaper closes it (bounded poll).
    let mut closed = false;
    for _ in 0..100 {
        if env.app.state.exec.ssh.connection_counts().await["tight"] == 0 {
            closed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(closed, "the idle connection was not closed");
    // And the next command simply connects again.
    assert!(
        env.run("tight", "true")
            .await
            .unwrap()
            .output
            .exit
            .success()
    );
}

/// Runs the real `sshmode` binary with `args` and `stdin`: (exit code, stdout, stderr).
fn sshmode_bin(
    db_url: &str,
    data: &std::path::Path,
    args: &[&str],
    stdin: &str,
) -> (i32, String, String) {
    use std::io::Write;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_sshmode"))
        .args(args)
        .current_dir(data)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("DATABASE_URL", db_url)
        .env("SSHMODE_DATA_DIR", data)
        .env("SSHMODE_SSH_CONNECT_TIMEOUT_SECS", "3")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
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
async fn the_target_commands_of_the_binary() {
    let db = crate::helpers::fresh_database().await;
    let data = tempfile::tempdir().unwrap();
    let closed = sshd::free_port().to_string();
    let (code, out, err) = sshmode_bin(
        &db,
        data.path(),
        &[
            "target",
            "add",
            "box",
            "--host",
            "127.0.0.1",
            "--port",
            &closed,
            "--user",
            "u",
            "--password-stdin",
            "--approve",
            "--offline",
        ],
        "hunter2-secret\n",
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("target `box` added (approved)"), "{out}");
    let key_file = data.path().join("master.key");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&key_file).unwrap().permissions().mode() & 0o777,
        0o600,
        "the vault key is created 0600"
    );
    let (code, list, _) = sshmode_bin(&db, data.path(), &["target", "list"], "");
    assert_eq!(code, 0);
    assert!(
        list.contains("box") && list.contains("u@127.0.0.1"),
        "{list}"
    );
    let (code, show, _) = sshmode_bin(&db, data.path(), &["target", "show", "box"], "");
    assert_eq!(code, 0);
    for o in [&list, &show] {
        assert!(!o.contains("hunter2-secret"), "{o}");
    }
    // `test` fails with the reason and a non-zero status.
    let (code, out, _) = sshmode_bin(&db, data.path(), &["target", "test", "box"], "");
    assert_ne!(code, 0);
    assert!(
        out.contains("FAILED") && out.contains("cannot reach"),
        "{out}"
    );
    // Unknown alias: a short error, non-zero.
    let (code, _, err) = sshmode_bin(&db, data.path(), &["target", "show", "nope"], "");
    assert_ne!(code, 0);
    assert!(err.contains("no target named `nope`"), "{err}");
    let (code, out, _) = sshmode_bin(&db, data.path(), &["target", "remove", "box"], "");
    assert_eq!(code, 0, "{out}");
}

#[tokio::test]
async fn bad_target_input_gets_a_short_clear_error() {
    let app = TestApp::spawn().await;
    let add = |f: &dyn Fn(&mut AddArgs)| {
        let mut a = add_args("bad", 22);
        f(&mut a);
        TargetCmd::Add(a)
    };
    // A wrong path that never ends is refused instead of read into memory.
    let (r, _) = cli(&app, add(&|a| a.key = Some("/dev/zero".into())), "").await;
    let e = r.unwrap_err();
    assert!(e.contains("larger than") && e.len() < 200, "{e}");
    let (r, _) = cli(
        &app,
        add(&|a| a.password_stdin = true),
        &"p".repeat(100_000),
    )
    .await;
    let e = r.unwrap_err();
    assert!(e.contains("longer than") && !e.contains("ppp"), "{e}");
    let (r, _) = cli(
        &app,
        add(&|a| {
            a.agent = true;
            a.port = 0;
        }),
        "",
    )
    .await;
    assert!(r.unwrap_err().contains("port"));
    let (r, _) = cli(
        &app,
        add(&|a| {
            a.agent = true;
            a.host = "example.com -oProxyCommand=x".into();
        }),
        "",
    )
    .await;
    assert!(r.unwrap_err().contains("spaces"));
    let (_, list) = cli(&app, TargetCmd::List { json: false }, "").await;
    assert!(!list.contains("bad"), "nothing was added: {list}");
}
