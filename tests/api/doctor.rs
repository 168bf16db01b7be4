//! `sshmode doctor` against a healthy deployment — the service running behind its event URL,
//! the fake Lark, the fake model provider and a real sshd — and against each part broken in
//! turn: the broken check is ✗ with the advice that fixes it, and the exit code says so.

use std::collections::HashMap;

use serde_json::{Value, json};

use crate::agent::{MODEL, add_target};
use crate::fake_lark::{APP_ID, APP_SECRET, Failure, FakeLark};
use crate::fake_llm::{FakeProvider, error};
use crate::helpers::TestApp;
use crate::lark_support::{ENCRYPT_KEY, TOKEN, app_with};
use crate::sshd::{self, Sshd};

/// The healthy deployment: the service (its data dir holds the vault key the target's
/// secrets are sealed with), Lark, the model and one approved target.
struct Setup {
    app: TestApp,
    lark: FakeLark,
    llm: FakeProvider,
    sshd: Sshd,
    _dir: tempfile::TempDir,
}

impl Setup {
    async fn start() -> Setup {
        assert!(
            sshd::available(),
            "these tests need root and /usr/sbin/sshd"
        );
        let lark = FakeLark::start().await;
        let llm = FakeProvider::start().await;
        let app = app_with(&lark)
            .var("LLM_BASE_URL", &llm.base)
            .var("LLM_MODEL", MODEL)
            .spawn()
            .await;
        let dir = tempfile::tempdir().unwrap();
        let sshd = Sshd::start_below(dir.path());
        add_target(&app, &sshd, dir.path(), "web").await;
        Setup {
            app,
            lark,
            llm,
            sshd,
            _dir: dir,
        }
    }

    /// The doctor's environment for this deployment.
    fn vars(&self) -> HashMap<&'static str, String> {
        HashMap::from([
            ("DATABASE_URL", self.app.db_url.clone()),
            (
                "SSHMODE_DATA_DIR",
                self.app.data_dir.path().display().to_string(),
            ),
            ("LARK_APP_ID", APP_ID.to_string()),
            ("LARK_APP_SECRET", APP_SECRET.to_string()),
            ("LARK_VERIFICATION_TOKEN", TOKEN.to_string()),
            ("LARK_ENCRYPT_KEY", ENCRYPT_KEY.to_string()),
            ("LARK_BASE_URL", self.lark.base.clone()),
            ("LLM_BASE_URL", self.llm.base.clone()),
            ("LLM_MODEL", MODEL.to_string()),
            ("SSHMODE_SSH_CONNECT_TIMEOUT_SECS", "3".to_string()),
        ])
    }

    fn url(&self) -> String {
        self.app.url("/lark/events")
    }
}

/// Runs `sshmode doctor --json [args]` with `vars`: the exit code and the checks by name.
/// (Asynchronously: the fakes it calls run on this test's runtime.)
async fn doctor(
    vars: &HashMap<&'static str, String>,
    args: &[&str],
) -> (i32, HashMap<String, Value>) {
    let dir = tempfile::tempdir().unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_sshmode"))
        .arg("doctor")
        .arg("--json")
        .args(args)
        .current_dir(dir.path())
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(vars.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let checks: Vec<Value> = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("{e}: {stdout}\n{}", String::from_utf8_lossy(&out.stderr)));
    let by_name = checks
        .into_iter()
        .map(|c| (c["name"].as_str().unwrap().to_string(), c))
        .collect();
    (out.status.code().unwrap_or(-1), by_name)
}

fn status(checks: &HashMap<String, Value>, name: &str) -> String {
    checks
        .get(name)
        .unwrap_or_else(|| panic!("no `{name}` check: {checks:#?}"))["status"]
        .as_str()
        .unwrap()
        .to_string()
}

fn advice(checks: &HashMap<String, Value>, name: &str) -> String {
    checks[name]["advice"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test]
async fn a_healthy_deployment_is_all_checked_and_passes() {
    let s = Setup::start().await;
    let (code, checks) = doctor(&s.vars(), &["--url", &s.url()]).await;
    for name in [
        "config",
        "database",
        "vault",
        "lark.token",
        "lark.bot",
        "lark.encrypt_key",
        "lark.url",
        "model default/m",
        "target web",
    ] {
        assert_eq!(
            status(&checks, name),
            "ok",
            "{name}: {:#?}",
            checks.get(name)
        );
    }
    // The isolation level is the one the service found (the strongest under root).
    let level = s.app.state.exec.local_level();
    let strongest = level.separate_uid && level.pidns && level.landlock_abi.is_some();
    assert_eq!(
        status(&checks, "isolation"),
        if strongest { "ok" } else { "warn" },
        "{:#?}",
        checks["isolation"]
    );
    assert_eq!(code, 0, "{checks:#?}");
    let web = checks["target web"]["detail"].as_str().unwrap();
    assert!(
        web.contains("SHA256:") && web.contains("ran `true`") && web.contains("files: over SFTP"),
        "{web}"
    );
    // The model got exactly one max_tokens=1 request.
    let asked: Vec<_> = s
        .llm
        .requests()
        .into_iter()
        .filter(|r| r.body["max_tokens"] == json!(1))
        .collect();
    assert_eq!(asked.len(), 1);
    // The human form: one ✓ line per check.
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_sshmode"))
        .arg("doctor")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(s.vars().iter().map(|(k, v)| (*k, v.as_str())))
        .current_dir(s.app.data_dir.path())
        .output()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines().any(|l| l.starts_with("✓ database: reachable")),
        "{text}"
    );
    assert!(
        text.lines().any(|l| l.starts_with("✓ target web: ")),
        "{text}"
    );
    s.app.stop().await;
}

#[tokio::test]
async fn each_broken_part_is_a_cross_with_its_advice_and_a_failing_exit() {
    let mut s = Setup::start().await;

    // Lark: a wrong secret, then a bot without its capability, then no Encrypt Key.
    let mut v = s.vars();
    v.insert("LARK_APP_SECRET", "wrong".into());
    let (code, c) = doctor(&v, &[]).await;
    assert_eq!((code, status(&c, "lark.token").as_str()), (1, "fail"));
    assert!(
        advice(&c, "lark.token").contains("LARK_APP_SECRET"),
        "{c:#?}"
    );
    s.lark
        .fail_next("/bot/v3/info", vec![Failure::Code(10003); 4]);
    let (code, c) = doctor(&s.vars(), &[]).await;
    assert_eq!((code, status(&c, "lark.bot").as_str()), (1, "fail"));
    assert!(advice(&c, "lark.bot").contains("Bot capability"), "{c:#?}");
    let mut v = s.vars();
    v.remove("LARK_ENCRYPT_KEY");
    let (code, c) = doctor(&v, &[]).await;
    assert_eq!((code, status(&c, "lark.encrypt_key").as_str()), (1, "fail"));
    assert!(advice(&c, "lark.encrypt_key").contains("LARK_ENCRYPT_KEY"));

    // The event URL: behind it a service with another key; nothing behind it.
    let mut v = s.vars();
    v.insert("LARK_ENCRYPT_KEY", "another-key".into());
    let (code, c) = doctor(&v, &["--url", &s.url()]).await;
    assert_eq!((code, status(&c, "lark.url").as_str()), (1, "fail"));
    assert!(
        advice(&c, "lark.url").contains("another LARK_ENCRYPT_KEY"),
        "{c:#?}"
    );
    let closed = format!("http://127.0.0.1:{}/lark/events", sshd::free_port());
    let (code, c) = doctor(&s.vars(), &["--url", &closed]).await;
    assert_eq!((code, status(&c, "lark.url").as_str()), (1, "fail"));
    assert!(advice(&c, "lark.url").contains("`serve` runs"), "{c:#?}");

    // The model refuses the key.
    s.llm.always(
        MODEL,
        error(401, json!({"error": {"message": "Incorrect API key provided", "type": "invalid_request_error", "code": "invalid_api_key"}})),
    );
    let (code, c) = doctor(&s.vars(), &[]).await;
    assert_eq!((code, status(&c, "model default/m").as_str()), (1, "fail"));
    assert!(
        advice(&c, "model default/m").contains("LLM_API_KEY"),
        "{c:#?}"
    );
    s.llm.heal(MODEL);

    // No model at all is a warning, not a failure.
    let mut v = s.vars();
    v.remove("LLM_BASE_URL");
    v.remove("LLM_MODEL");
    let (code, c) = doctor(&v, &[]).await;
    assert_eq!((code, status(&c, "model").as_str()), (0, "warn"), "{c:#?}");

    // The target: its host key changed, then its sshd is down.
    let other = s._dir.path().join("other_host_key");
    sshd::new_key(&other, "ed25519", "");
    let line = std::fs::read_to_string(format!("{}.pub", other.display())).unwrap();
    let rekey = tokio::process::Command::new(env!("CARGO_BIN_EXE_sshmode"))
        .args(["target", "rekey", "web", "--host-key", line.trim()])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(s.vars().iter().map(|(k, v)| (*k, v.as_str())))
        .current_dir(s.app.data_dir.path())
        .output()
        .await
        .unwrap();
    assert!(
        rekey.status.success(),
        "{}",
        String::from_utf8_lossy(&rekey.stderr)
    );
    let (code, c) = doctor(&s.vars(), &[]).await;
    assert_eq!(
        (code, status(&c, "target web").as_str()),
        (1, "fail"),
        "{c:#?}"
    );
    assert!(
        advice(&c, "target web").contains("target rekey web"),
        "{c:#?}"
    );
    s.sshd.stop();
    let (code, c) = doctor(&s.vars(), &[]).await;
    assert_eq!((code, status(&c, "target web").as_str()), (1, "fail"));
    assert!(advice(&c, "target web").contains("reachable"), "{c:#?}");

    // The database is unreachable: ✗, and the checks that need it say so.
    let mut v = s.vars();
    v.insert(
        "DATABASE_URL",
        format!(
            "postgres://sshmode:pw@127.0.0.1:{}/sshmode",
            sshd::free_port()
        ),
    );
    let (code, c) = doctor(&v, &[]).await;
    assert_eq!((code, status(&c, "database").as_str()), (1, "fail"));
    assert!(advice(&c, "database").contains("DATABASE_URL"), "{c:#?}");
    assert!(
        !format!("{c:?}").contains(":pw@"),
        "the password never shows"
    );
    s.app.stop().await;
}

/// In websocket mode the doctor checks the long connection's endpoint instead of asking for an
/// Encrypt Key; an endpoint that refuses the app is a cross with advice.
#[tokio::test]
async fn the_long_connection_endpoint_is_checked_in_websocket_mode() {
    let s = Setup::start().await;
    let mut v = s.vars();
    v.remove("LARK_ENCRYPT_KEY");
    v.insert("SSHMODE_LARK_MODE", "websocket".into());
    // No endpoint yet: the fake answers "system busy".
    let (code, c) = doctor(&v, &[]).await;
    assert_eq!(
        (code, status(&c, "lark.long_connection").as_str()),
        (1, "fail"),
        "{c:#?}"
    );
    assert!(
        advice(&c, "lark.long_connection").contains("long connection"),
        "{c:#?}"
    );
    assert_eq!(status(&c, "lark.encrypt_key"), "ok", "{c:#?}");
    s.lark.set_ws_endpoint(
        "wss://example.invalid/ws/v2?device_id=1&service_id=2&ticket=t",
        serde_json::json!({"PingInterval": 90}),
    );
    let (_, c) = doctor(&v, &[]).await;
    assert_eq!(status(&c, "lark.long_connection"), "ok", "{c:#?}");
    assert!(
        c["lark.long_connection"]["detail"]
            .as_str()
            .unwrap()
            .contains("90 s"),
        "{c:#?}"
    );
}

/// Reading a quoted message needs `im:message` or `im:message:readonly`; an app with only
/// `im:message.history:readonly` (enough to download files) is told which scope is missing.
#[tokio::test]
async fn a_missing_scope_to_read_messages_is_named() {
    let s = Setup::start().await;
    let (_, c) = doctor(&s.vars(), &[]).await;
    assert_eq!(status(&c, "lark.scopes"), "ok", "{c:#?}");
    s.lark.grant_history_scope_only();
    let (code, c) = doctor(&s.vars(), &[]).await;
    assert_eq!(
        (code, status(&c, "lark.scopes").as_str()),
        (1, "fail"),
        "{c:#?}"
    );
    let detail = c["lark.scopes"]["detail"].as_str().unwrap();
    assert!(
        detail.contains("99991672") && detail.contains("im:message:readonly"),
        "{detail}"
    );
    let advice = advice(&c, "lark.scopes");
    assert!(
        advice.contains("add the scope im:message:readonly (or im:message)")
            && advice.contains("im:message.history:readonly only covers downloading files"),
        "{advice}"
    );
    assert_eq!(status(&c, "lark.bot"), "ok", "{c:#?}");
    s.app.stop().await;
}

/// Runs `sshmode <args>` with `vars` (no `SUDO_USER`: the actor is the account running it):
/// the exit code, standard output and standard error.
async fn sshmode(vars: &HashMap<&'static str, String>, args: &[&str]) -> (i32, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_sshmode"))
        .args(args)
        .current_dir(dir.path())
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(vars.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .await
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A key the provider rejected once disables the entry for good: `/readyz` stays 200 but names
/// it, doctor fails on it even while the provider answers again, and `sshmode router enable`
/// (audited, as the OS account) brings it back.
#[tokio::test]
async fn a_disabled_model_entry_is_reported_until_an_operator_enables_it() {
    let s = Setup::start().await;
    s.llm.always(
        MODEL,
        error(401, json!({"error": {"message": "Incorrect API key provided", "type": "invalid_request_error", "code": "invalid_api_key"}})),
    );
    let router = s.app.state.llm.clone().expect("a model is configured");
    let ask = sshmode::llm::ChatRequest {
        messages: vec![sshmode::llm::Message::user("hello")],
        ..Default::default()
    };
    let e = router.chat(None, ask.clone()).await.unwrap_err();
    assert!(e.needs_operator(), "{e}");
    assert!(e.to_string().contains("sshmode router enable"), "{e}");
    s.llm.heal(MODEL);

    // Degraded, not failed: a load balancer keeps the replica.
    let r = s.app.http.get(s.app.url("/readyz")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let body = r.text().await.unwrap();
    let line = body
        .lines()
        .find(|l| l.starts_with("degraded: model default/m disabled since "))
        .unwrap_or_else(|| panic!("{body}"));
    assert!(line.contains("sshmode router enable default/m"), "{line}");

    // The provider answers again, but no chat uses the entry: doctor says so, and how to fix it.
    let (code, c) = doctor(&s.vars(), &[]).await;
    assert_eq!(
        (code, status(&c, "model default/m").as_str()),
        (1, "fail"),
        "{c:#?}"
    );
    assert!(
        c["model default/m"]["detail"]
            .as_str()
            .unwrap()
            .contains("disabled since")
    );
    assert!(advice(&c, "model default/m").contains("sshmode router enable default/m"));
    let (code, out, _) = sshmode(&s.vars(), &["router", "status"]).await;
    assert_eq!(code, 0);
    assert!(out.contains(" default/m: disabled since"), "{out}");

    // A name that is no entry is an error that lists the entries.
    let (code, _, err) = sshmode(&s.vars(), &["router", "enable", "default/nope"]).await;
    assert_eq!(code, 2);
    assert!(err.contains("default/m"), "{err}");

    let (code, out, err) = sshmode(&s.vars(), &["router", "enable", "default/m"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("default/m enabled"), "{out}");
    router
        .chat(None, ask)
        .await
        .expect("the entry answers again");
    let body = s
        .app
        .http
        .get(s.app.url("/readyz"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(!body.contains("degraded"), "{body}");
    let (_, c) = doctor(&s.vars(), &[]).await;
    assert_eq!(status(&c, "model default/m"), "ok", "{c:#?}");

    let (actor, detail): (String, Value) = sqlx::query_as(
        "SELECT actor, detail FROM audit_log WHERE action = 'router.enable' AND subject = 'default/m'",
    )
    .fetch_one(&s.app.state.db)
    .await
    .unwrap();
    let me = String::from_utf8(
        std::process::Command::new("id")
            .arg("-un")
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    assert_eq!(actor, format!("cli:{}", me.trim()));
    assert_eq!(detail["was_disabled"], true);
    assert_eq!(detail["reason"], "auth");
    s.app.stop().await;
}

/// Doctor names what is wrong in the words of its cause, and one broken part never hides the
/// others: a refused database, a URL of another database, an unreachable model, admins that
/// are no open_ids, an invalid variable.
#[tokio::test]
async fn doctor_names_each_cause_and_runs_the_other_checks() {
    let s = Setup::start().await;
    let closed = sshd::free_port();

    // A refused database: said so, not "pool timed out", no advice to run doctor; the model
    // is still checked.
    let mut v = s.vars();
    v.insert(
        "DATABASE_URL",
        format!("postgres://sshmode:pw@127.0.0.1:{closed}/sshmode"),
    );
    let (code, c) = doctor(&v, &[]).await;
    assert_eq!((code, status(&c, "database").as_str()), (1, "fail"));
    let detail = c["database"]["detail"].as_str().unwrap();
    assert!(detail.contains("connection refused"), "{detail}");
    assert!(!detail.contains("timed out"), "{detail}");
    assert!(!format!("{c:?}").contains("sshmode doctor"), "{c:#?}");
    assert!(!format!("{c:?}").contains(":pw@"), "{c:#?}");
    assert_eq!(status(&c, "model default/m"), "ok", "{c:#?}");

    // Another database's URL is named as such.
    v.insert("DATABASE_URL", "mysql://app:pw@127.0.0.1/app".into());
    let (_, c) = doctor(&v, &[]).await;
    let detail = c["database"]["detail"].as_str().unwrap();
    assert!(
        detail.contains("`mysql`") && detail.contains("PostgreSQL"),
        "{detail}"
    );

    // An unreachable model: the HTTP client's cause, whatever the database does.
    let mut v = s.vars();
    v.insert("LLM_BASE_URL", format!("http://127.0.0.1:{closed}/v1"));
    let (code, c) = doctor(&v, &[]).await;
    assert_eq!((code, status(&c, "model default/m").as_str()), (1, "fail"));
    let detail = c["model default/m"]["detail"]
        .as_str()
        .unwrap()
        .to_lowercase();
    assert!(detail.contains("connection refused"), "{detail}");

    // Admins: none is a caveat; a name that is no open_id a failure.
    let (_, c) = doctor(&s.vars(), &[]).await;
    assert_eq!(status(&c, "admins"), "warn", "{c:#?}");
    let mut v = s.vars();
    v.insert("SSHMODE_ADMINS", "ou_a1b2c3,alice@example.com".into());
    let (code, c) = doctor(&v, &[]).await;
    assert_eq!((code, status(&c, "admins").as_str()), (1, "fail"));
    assert!(
        c["admins"]["detail"]
            .as_str()
            .unwrap()
            .contains("alice@example.com")
    );
    v.insert("SSHMODE_ADMINS", "ou_a1b2c3".into());
    let (_, c) = doctor(&v, &[]).await;
    assert_eq!(status(&c, "admins"), "ok", "{c:#?}");

    // An invalid variable is a cross of its own, and every other check still runs.
    let mut v = s.vars();
    v.insert("SSHMODE_LOG_FORMAT", "xml".into());
    let (code, c) = doctor(&v, &[]).await;
    assert_eq!(code, 1);
    assert_eq!(status(&c, "config SSHMODE_LOG_FORMAT"), "fail", "{c:#?}");
    assert!(advice(&c, "config SSHMODE_LOG_FORMAT").contains("other checks ran"));
    for name in ["database", "lark.token", "model default/m", "target web"] {
        assert_eq!(status(&c, name), "ok", "{name}: {c:#?}");
    }
    s.app.stop().await;
}
