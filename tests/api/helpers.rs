//! Shared test fixtures: a fresh database per test, and `TestApp`, the service built by the
//! same constructor as `main`, on a random port.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use sshmode::app::{App, AppState, Overrides};
use sshmode::clock::{Clock, SystemClock};
use sshmode::config::Config;
use tokio_util::sync::CancellationToken;

pub use crate::database::fresh_database;

/// Polls `check` every 20 ms until it holds; panics naming `what` once `within` has passed.
/// The one way a test waits for something to happen.
pub async fn eventually(
    what: &str,
    within: std::time::Duration,
    mut check: impl AsyncFnMut() -> bool,
) {
    let deadline = tokio::time::Instant::now() + within;
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {within:?} waiting for {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Builds a [`Config`] from explicit variables (the process environment is not read). The
/// service runs inside this test binary, so the launcher of local commands is the built
/// `sshmode` (unless `vars` names one).
pub fn config_from(vars: &HashMap<String, String>, cwd: &Path) -> Config {
    let get = |k: &str| match (vars.get(k), k) {
        (None, "SSHMODE_LAUNCHER") => Some(env!("CARGO_BIN_EXE_sshmode").to_string()),
        (v, _) => v.cloned(),
    };
    Config::from_vars(&get, cwd).expect("test config")
}

/// A running service for one test.
pub struct TestApp {
    pub addr: SocketAddr,
    /// `http://127.0.0.1:PORT`
    pub base: String,
    pub http: reqwest::Client,
    pub state: AppState,
    pub db_url: String,
    pub shutdown: CancellationToken,
    pub data_dir: tempfile::TempDir,
    handle: tokio::task::JoinHandle<anyhow::Result<()>>,
}

/// Configures a [`TestApp`] before it starts.
pub struct TestAppBuilder {
    vars: HashMap<String, String>,
    clock: Arc<dyn Clock>,
    db_url: Option<String>,
    ssh_mode: Option<Arc<dyn sshmode::agent::Bindings>>,
}

impl TestApp {
    pub fn builder() -> TestAppBuilder {
        let mut vars = HashMap::new();
        for (k, v) in [
            ("LARK_APP_ID", "cli_test_app"),
            ("LARK_APP_SECRET", "test-app-secret"),
            ("LARK_VERIFICATION_TOKEN", "test-verification-token"),
            ("LARK_BASE_URL", "http://127.0.0.1:9"),
            ("SSHMODE_ADMINS", "ou_admin"),
        ] {
            vars.insert(k.to_string(), v.to_string());
        }
        TestAppBuilder {
            vars,
            clock: Arc::new(SystemClock),
            db_url: None,
            ssh_mode: None,
        }
    }

    pub async fn spawn() -> TestApp {
        Self::builder().spawn().await
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// The Prometheus text `GET /metrics` serves now.
    pub async fn metrics(&self) -> String {
        let r = self.http.get(self.url("/metrics")).send().await.unwrap();
        assert_eq!(r.status(), 200);
        r.text().await.unwrap()
    }

    /// Stops the service gracefully and waits for it.
    pub async fn stop(self) -> String {
        self.shutdown.cancel();
        self.handle.await.expect("app task").expect("app run");
        self.db_url
    }
}

impl TestAppBuilder {
    /// Sets (or with an empty value, clears) a configuration variable.
    pub fn var(mut self, key: &str, value: &str) -> Self {
        if value.is_empty() {
            self.vars.remove(key);
        } else {
            self.vars.insert(key.to_string(), value.to_string());
        }
        self
    }

    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The agent's view of chat control (bindings, `ssh_mode`).
    pub fn ssh_mode(mut self, c: Arc<dyn sshmode::agent::Bindings>) -> Self {
        self.ssh_mode = Some(c);
        self
    }

    /// Reuses an existing database (e.g. to restart the service on the same state).
    pub fn database(mut self, url: &str) -> Self {
        self.db_url = Some(url.to_string());
        self
    }

    pub async fn spawn(self) -> TestApp {
        let db_url = match self.db_url {
            Some(u) => u,
            None => fresh_database().await,
        };
        let data_dir = tempfile::tempdir().expect("temp dir");
        let mut vars = self.vars;
        vars.insert("DATABASE_URL".into(), db_url.clone());
        vars.entry("SSHMODE_DATA_DIR".into())
            .or_insert_with(|| data_dir.path().display().to_string());
        let config = config_from(&vars, data_dir.path());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let shutdown = CancellationToken::new();
        let app = App::build_with(
            config,
            listener,
            shutdown.clone(),
            Overrides {
                clock: self.clock,
                ssh_mode: self.ssh_mode,
            },
        )
        .await
        .expect("build app");
        let addr = app.local_addr();
        let state = app.state().clone();
        let handle = tokio::spawn(app.run());
        TestApp {
            addr,
            base: format!("http://{addr}"),
            http: reqwest::Client::new(),
            state,
            db_url,
            shutdown,
            data_dir,
            handle,
        }
    }
}

/// How many audit rows hold `text` anywhere in their detail.
pub async fn audit_rows_mentioning(db: &sqlx::PgPool, text: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM audit_log WHERE strpos(detail::text, $1) > 0")
        .bind(text)
        .fetch_one(db)
        .await
        .unwrap()
}

/// `sshmode serve` run as a child process: `command` (the binary and `serve`, or a wrapper
/// such as `setpriv` before them), with `launcher` as its local launcher, on database `db`,
/// data in `data` (also its working directory), listening on `port`, and `vars` — nothing
/// else of this process's environment but `PATH`. Its output is discarded; it is killed when
/// dropped.
pub fn serve_child(
    command: &[&str],
    launcher: &str,
    db: &str,
    data: &Path,
    port: u16,
    vars: &[(&str, &str)],
) -> tokio::process::Child {
    let (program, args) = command.split_first().expect("a command");
    let mut c = tokio::process::Command::new(program);
    c.args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("DATABASE_URL", db)
        .env("SSHMODE_DATA_DIR", data)
        .env("SSHMODE_LISTEN", format!("127.0.0.1:{port}"))
        .env("SSHMODE_LAUNCHER", launcher)
        .envs(vars.iter().copied())
        .current_dir(data)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true);
    c.spawn().expect("sshmode serve starts")
}
