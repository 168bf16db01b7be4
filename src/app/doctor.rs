//! `sshmode doctor`: checks a deployment the way its first user would find it broken, one
//! [`Check`] per line with ✓ (fine), ! (works, with a caveat) or ✗ (broken) and one line of
//! advice — the config, the database and its migrations, the vault key (it opens the
//! vault's canary record), the local isolation level, Lark (a
//! tenant token, the bot's info, the scope to read quoted messages, the Encrypt Key, and with
//! `--url` a signed `url_verification` round trip through the public event URL), one
//! `max_tokens = 1` request per model entry, and
//! every approved target (reachable, host key, `true`, SFTP or the shell fallback).
//!
//! [`light`] is the start-up form `serve` logs: what it knows without calling Lark, a model or
//! a target.
//!
//! Never: prints a secret (errors from providers are scrubbed of their key; Lark and SSH
//! errors carry none); changes anything but what `serve` would also do at start (migrations,
//! the vault key, the tools account).

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde_json::{Value, json};
use tokio_util::task::TaskTracker;

use crate::config::{Config, LlmConfig};
use crate::exec::Executors;
use crate::exec::local::sandbox::Level;
use crate::lark::client::{self, LarkClient, LarkError};
use crate::llm::FailureClass;
use crate::metrics::Metrics;
use crate::store::Store;
use crate::target::Status as TargetStatus;
use crate::vault::Vault;

/// How long the database may take to answer before it counts as unreachable.
const DATABASE_WAIT: Duration = Duration::from_secs(20);
/// How long the event URL may take to answer.
const URL_WAIT: Duration = Duration::from_secs(10);
/// How long one target's check may take (connect, `true`, SFTP).
const TARGET_WAIT: Duration = Duration::from_secs(30);
/// Targets checked at once.
const TARGETS_AT_ONCE: usize = 8;
/// A message id no chat holds, read to check the scope: Lark checks the app's scopes before
/// it looks for the message.
const PROBE_MESSAGE: &str = "om_sshmode_doctor_scope_probe";

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    /// Works, with a caveat the advice names.
    Warn,
    Fail,
}

/// One line of the report.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// `config`, `database`, `isolation`, `lark.token`, `lark.bot`, `lark.scopes`,
    /// `lark.encrypt_key`, `lark.url`, `model <provider>/<model>`, `target <alias>`.
    pub name: String,
    pub status: Status,
    pub detail: String,
    /// What to do about it; `None` when there is nothing to do.
    pub advice: Option<String>,
}

impl Check {
    fn ok(name: impl Into<String>, detail: impl Into<String>) -> Check {
        Check {
            name: name.into(),
            status: Status::Ok,
            detail: detail.into(),
            advice: None,
        }
    }

    fn warn(
        name: impl Into<String>,
        detail: impl Into<String>,
        advice: impl Into<String>,
    ) -> Check {
        Check {
            name: name.into(),
            status: Status::Warn,
            detail: detail.into(),
            advice: Some(advice.into()),
        }
    }

    fn fail(
        name: impl Into<String>,
        detail: impl Into<String>,
        advice: impl Into<String>,
    ) -> Check {
        Check {
            name: name.into(),
            status: Status::Fail,
            detail: detail.into(),
            advice: Some(advice.into()),
        }
    }
}

/// What `doctor` was asked.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// The public event URL (`https://…/lark/events`) to send a signed `url_verification`.
    pub url: Option<String>,
    /// What was wrong with the configuration: the variable at fault (left out, so its
    /// default was used) and the error.
    pub config_errors: Vec<(Option<&'static str>, String)>,
}

/// Runs every check on the configuration that could be loaded (`None`: none could).
pub async fn run(config: Option<Config>, opts: &Options) -> Vec<Check> {
    crate::install_crypto_provider();
    let mut checks: Vec<Check> = opts
        .config_errors
        .iter()
        .map(|(var, e)| {
            Check::fail(
                match var {
                    Some(v) => format!("config {v}"),
                    None => "config".to_string(),
                },
                e.clone(),
                match var {
                    Some(v) => format!(
                        "fix {v} in the environment or .env (see .env.example); the other \
                         checks ran without it"
                    ),
                    None => "fix .env in the working directory (see .env.example)".to_string(),
                },
            )
        })
        .collect();
    let Some(config) = config else {
        return checks;
    };
    if opts.config_errors.is_empty() {
        checks.push(Check::ok(
            "config",
            format!(
                "loaded; data dir {}, database {}",
                config.data_dir.display(),
                if config.database_url.is_some() {
                    "DATABASE_URL"
                } else {
                    "embedded"
                }
            ),
        ));
    }
    checks.push(admins(&config));
    let (database, store) = database(&config).await;
    checks.push(database);
    let tasks = TaskTracker::new();
    checks.push(vault(&config, store.as_ref().map(|s| &s.pool)).await);
    checks.push(isolation(&config, &tasks, store.as_ref().map(|s| &s.pool)));
    checks.extend(lark(&config, opts).await);
    checks.extend(models(&config, store.as_ref().map(|s| &s.pool)).await);
    if let Some(store) = &store {
        checks.push(replicas(&store.pool).await);
    }
    match &store {
        Some(store) => checks.extend(targets(&config, &store.pool).await),
        None => checks.push(Check::fail(
            "targets",
            "not checked: the database is unreachable",
            "fix the database first",
        )),
    }
    tasks.close();
    if let Some(store) = store {
        store.close().await;
    }
    checks
}

/// The running replicas and what they run: more than one version is a rolling upgrade under
/// way (a warning: fine while it lasts, not once it is done).
async fn replicas(db: &sqlx::PgPool) -> Check {
    const NAME: &str = "replicas";
    let live = match crate::store::replicas::live(db).await {
        Ok(l) => l,
        Err(e) => {
            return Check::fail(
                NAME,
                format!("not read: {e}"),
                "check the database user's rights on the replicas table",
            );
        }
    };
    let mut versions: Vec<String> = live
        .iter()
        .map(|r| {
            r.version
                .clone()
                .unwrap_or_else(|| "an earlier version".into())
        })
        .collect();
    versions.sort();
    versions.dedup();
    let listed = live
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ");
    if versions.len() > 1 {
        return Check::warn(
            NAME,
            format!(
                "{} running, of {} versions: {listed}",
                live.len(),
                versions.len()
            ),
            "a rolling upgrade is under way: restart the remaining replicas of the older \
             version (README, Upgrading)",
        );
    }
    Check::ok(
        NAME,
        match live.len() {
            0 => "none running".to_string(),
            n => format!("{n} running: {listed}"),
        },
    )
}

/// `SSHMODE_ADMINS`: admins approve targets and allow what the guard asks about; nobody can
/// when it is empty, and a name that is no open_id never matches a sender.
fn admins(config: &Config) -> Check {
    const NAME: &str = "admins";
    if config.admins.is_empty() {
        return Check::warn(
            NAME,
            "SSHMODE_ADMINS is empty: nobody can approve targets or allow risky commands from a chat",
            "set SSHMODE_ADMINS to the open_ids (ou_…) of the people who administer the bot, \
             comma-separated (an admin's open_id is in the `sender` of any event they send)",
        );
    }
    let wrong: Vec<String> = config
        .admins
        .iter()
        .filter(|a| !is_open_id(a))
        .map(|a| crate::audit::cli::printable(&a.chars().take(40).collect::<String>()))
        .collect();
    match wrong.is_empty() {
        true => Check::ok(
            NAME,
            format!("{} admin(s), each an open_id", config.admins.len()),
        ),
        false => Check::fail(
            NAME,
            format!(
                "SSHMODE_ADMINS holds what is no open_id, so it matches nobody: {}",
                wrong.join(", ")
            ),
            "name admins by open_id (ou_ followed by letters and digits), not by user_id, \
             union_id (on_…), e-mail or name",
        ),
    }
}

/// A Lark open_id: `ou_` and letters and digits.
fn is_open_id(s: &str) -> bool {
    s.strip_prefix("ou_").is_some_and(|r| {
        !r.is_empty() && r.len() <= 64 && r.chars().all(|c| c.is_ascii_alphanumeric())
    })
}

/// How long the first connection to `DATABASE_URL` may take, so that a refusal is named
/// within seconds rather than after the pool's wait.
const FIRST_CONNECT_WAIT: Duration = Duration::from_secs(5);

/// The database: with `DATABASE_URL`, one plain connection first, so that what is wrong
/// (refused, unknown host, bad password, not PostgreSQL) is named as the server or the network
/// said it; then the store as `serve` opens it (migrations, the embedded cluster).
async fn database(config: &Config) -> (Check, Option<Store>) {
    if let Some(url) = &config.database_url {
        use secrecy::ExposeSecret;
        if let Err(e) = first_connection(url.expose_secret()).await {
            return (database_failure(config, &e), None);
        }
    }
    match tokio::time::timeout(DATABASE_WAIT, Store::open(config)).await {
        Ok(Ok(store)) => {
            let n: Result<i64, _> =
                sqlx::query_scalar("SELECT count(*) FROM _sqlx_migrations WHERE success")
                    .fetch_one(&store.pool)
                    .await;
            let check = match n {
                Ok(n) => Check::ok("database", format!("reachable; {n} migrations applied")),
                Err(e) => Check::fail(
                    "database",
                    format!("migrations unreadable: {e}"),
                    "run `sshmode migrate` and check the account may read _sqlx_migrations",
                ),
            };
            (check, Some(store))
        }
        // (Its advice to run doctor is no advice here.)
        Ok(Err(e)) => (
            database_failure(config, &format!("{e:#}").replace(" (`sshmode doctor`)", "")),
            None,
        ),
        Err(_) => (
            database_failure(
                config,
                &format!("no answer within {} s", DATABASE_WAIT.as_secs()),
            ),
            None,
        ),
    }
}

/// One connection to `url`, as the server or the network answers it (never the URL itself:
/// it may hold a password).
async fn first_connection(url: &str) -> Result<(), String> {
    use sqlx::Connection;
    use std::str::FromStr;
    let scheme = url.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
    match scheme.as_deref() {
        Some("postgres" | "postgresql") => {}
        Some(other) => {
            return Err(format!(
                "DATABASE_URL names a `{}` database; sshmode needs PostgreSQL \
                 (postgres://user:password@host:5432/database)",
                crate::audit::cli::printable(&other.chars().take(20).collect::<String>())
            ));
        }
        None => {
            return Err(
                "DATABASE_URL is not a URL (postgres://user:password@host:5432/database)".into(),
            );
        }
    }
    let opts = sqlx::postgres::PgConnectOptions::from_str(url)
        .map_err(|_| "DATABASE_URL is not a valid PostgreSQL URL".to_string())?;
    let (host, port) = (opts.get_host().to_string(), opts.get_port());
    match tokio::time::timeout(FIRST_CONNECT_WAIT, sqlx::PgConnection::connect_with(&opts)).await {
        Ok(Ok(conn)) => {
            let _ = conn.close().await;
            Ok(())
        }
        Ok(Err(e)) => Err(format!("{host}:{port}: {}", connection_cause(&e))),
        Err(_) => Err(format!(
            "{host}:{port}: no answer within {} s (a firewall dropping packets, or the wrong host)",
            FIRST_CONNECT_WAIT.as_secs()
        )),
    }
}

/// What a failed connection says, in the words of its deepest cause (`connection refused`,
/// `password authentication failed for user …`).
fn connection_cause(e: &sqlx::Error) -> String {
    match e {
        sqlx::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
            "connection refused (is PostgreSQL running and listening on this address?)".into()
        }
        sqlx::Error::Io(io) => io.to_string(),
        sqlx::Error::Database(db) => db.message().to_string(),
        sqlx::Error::Tls(t) => format!("TLS: {t}"),
        other => other.to_string(),
    }
}

fn database_failure(config: &Config, error: &str) -> Check {
    let advice = if config.database_url.is_some() {
        "check DATABASE_URL (host, port, user, password, database) and that PostgreSQL accepts \
         connections from here"
    } else {
        "the embedded cluster needs the PostgreSQL server binaries (initdb, pg_ctl, postgres) \
         and a writable SSHMODE_DATA_DIR; or set DATABASE_URL"
    };
    Check::fail("database", error.to_string(), advice)
}

/// The master key opens the vault (its canary record), as `serve` checks at start; on an
/// empty vault the key is created, as `serve` would.
async fn vault(config: &Config, db: Option<&sqlx::PgPool>) -> Check {
    let Some(db) = db else {
        return Check::fail(
            "vault",
            "not checked: the database is unreachable",
            "fix the database first",
        );
    };
    let path = &config.master_key_file;
    match crate::target::keyring::open(db, path).await {
        Ok(_) => Check::ok(
            "vault",
            format!("the master key {} opens the vault", path.display()),
        ),
        Err(e) => Check::fail(
            "vault",
            e.problem,
            e.advice.unwrap_or_else(|| {
                "check SSHMODE_MASTER_KEY_FILE: a 32-byte file readable by the service alone \
                 (mode 0600)"
                    .into()
            }),
        ),
    }
}

/// The local isolation level, found as `serve` finds it.
fn isolation(config: &Config, tasks: &TaskTracker, db: Option<&sqlx::PgPool>) -> Check {
    let Some(db) = db else {
        return Check::fail(
            "isolation",
            "not checked: the database is unreachable",
            "fix the database first",
        );
    };
    // The level does not depend on the key: a vault in memory (the `vault` check opens the
    // real one, and never creates one over sealed secrets).
    let vault = match Vault::ephemeral() {
        Ok(v) => Arc::new(v),
        Err(e) => {
            return Check::fail(
                "isolation",
                e.to_string(),
                "check the system's random source",
            );
        }
    };
    let exec = Executors::with_metrics(
        &config.exec,
        crate::target::registry(db.clone()),
        vault,
        Arc::new(Metrics::new()),
        tasks.clone(),
    );
    match exec {
        Ok(exec) => level_check(exec.local_level(), config.exec.local.unsandboxed),
        Err(e) => Check::fail(
            "isolation",
            format!("the local sandbox could not be prepared: {e:#}"),
            "check SSHMODE_WORKSPACE_ROOT and SSHMODE_DATA_DIR are writable by the service",
        ),
    }
}

/// ✓ at the strongest level, ! below it (naming what is open), ✗ when local tools are refused.
pub fn level_check(level: &Level, unsandboxed: bool) -> Check {
    let strongest = level.separate_uid && level.pidns && level.landlock_abi.is_some();
    if strongest {
        return Check::ok("isolation", format!("{level} (the strongest)"));
    }
    if !level.is_enforced() && !unsandboxed {
        return Check::fail(
            "isolation",
            format!("{level}: local tools are refused"),
            "run the service as root (a separate tools account) or on a kernel with Landlock; \
             or accept the risk with SSHMODE_LOCAL_UNSANDBOXED=true",
        );
    }
    let mut missing = Vec::new();
    if !level.separate_uid {
        missing.push("a separate tools account (run as root)");
    }
    if !level.pidns {
        missing.push("PID namespaces (root with CAP_SYS_ADMIN and the launcher, SSHMODE_LAUNCHER)");
    }
    if level.landlock_abi.is_none() {
        missing.push("Landlock (a kernel with it enabled)");
    }
    Check::warn(
        "isolation",
        format!(
            "{level}: local tools may reach {}",
            level.leaves_open().join("; ")
        ),
        format!("for the strongest level add {}", missing.join(", ")),
    )
}

/// Lark: the credentials, the bot, the Encrypt Key, and the event URL when given.
async fn lark(config: &Config, opts: &Options) -> Vec<Check> {
    let lark = match config.require_lark() {
        Ok(l) => l,
        Err(e) => {
            return vec![Check::fail(
                "lark",
                e.to_string(),
                "set LARK_APP_ID, LARK_APP_SECRET and LARK_VERIFICATION_TOKEN from the developer \
                 console (Credentials & Basic Info; Events & Callbacks)",
            )];
        }
    };
    let mut checks = Vec::new();
    let client = LarkClient::new(
        &config.lark_base_url,
        &lark.app_id,
        lark.app_secret.clone(),
        Arc::new(Metrics::new()),
    );
    match client {
        Err(e) => checks.push(Check::fail(
            "lark.token",
            format!("{e:#}"),
            "check LARK_BASE_URL",
        )),
        Ok(client) => match client.check_token().await {
            Err(e) => {
                checks.push(Check::fail(
                    "lark.token",
                    e.to_string(),
                    "check LARK_APP_ID and LARK_APP_SECRET (developer console → Credentials & \
                     Basic Info) and LARK_BASE_URL (open.feishu.cn or open.larksuite.com)",
                ));
            }
            Ok(()) => {
                checks.push(Check::ok("lark.token", "tenant access token obtained"));
                checks.push(match client.bot_open_id().await {
                    Ok(id) => Check::ok("lark.bot", format!("bot info readable (open_id {id})")),
                    Err(e) => Check::fail(
                        "lark.bot",
                        format!("bot info unreadable: {e}"),
                        "enable the Bot capability of the app and publish a version (developer \
                         console → Features → Bot)",
                    ),
                });
                checks.push(message_scope(&client).await);
            }
        },
    }
    use secrecy::ExposeSecret;
    if config.lark_mode.websocket() {
        checks.push(long_connection(config, lark).await);
    }
    match (&lark.encrypt_key, lark.allow_unsigned_events) {
        (None, _) if !config.lark_mode.webhook() => checks.push(Check::ok(
            "lark.encrypt_key",
            "not needed: events arrive over the long connection only (SSHMODE_LARK_MODE=websocket)",
        )),
        (Some(_), _) => checks.push(Check::ok("lark.encrypt_key", "set: callbacks are signed and encrypted")),
        (None, true) => checks.push(Check::warn(
            "lark.encrypt_key",
            "not set; SSHMODE_ALLOW_UNSIGNED_EVENTS=true accepts unsigned callbacks",
            "set LARK_ENCRYPT_KEY (Events & Callbacks → Encryption Strategy) for any real deployment",
        )),
        (None, false) => checks.push(Check::fail(
            "lark.encrypt_key",
            "not set: `serve` refuses to start",
            "set LARK_ENCRYPT_KEY (developer console → Events & Callbacks → Encryption Strategy)",
        )),
    }
    if let Some(url) = &opts.url {
        checks.push(
            url_round_trip(
                url,
                lark.verification_token.expose_secret(),
                lark.encrypt_key.as_ref().map(|k| k.expose_secret()),
            )
            .await,
        );
    }
    checks
}

/// Whether the app may read a message by id (a quoted message, `GET /im/v1/messages/{id}`):
/// that needs `im:message` or `im:message:readonly`; `im:message.history:readonly`, which is
/// enough to download files, is not enough here (99991672).
async fn message_scope(client: &LarkClient) -> Check {
    const NAME: &str = "lark.scopes";
    match client.get_message(PROBE_MESSAGE).await {
        Err(LarkError::Api {
            code: client::NO_SCOPE,
            ..
        }) => Check::fail(
            NAME,
            "reading a message is refused (99991672): the app has neither im:message nor \
             im:message:readonly, so quoted messages cannot be read",
            "add the scope im:message:readonly (or im:message) under Permissions & Scopes in the \
             developer console and publish a version; im:message.history:readonly only covers \
             downloading files",
        ),
        // Lark looked for the message (it is not there): the scope is granted.
        Ok(_)
        | Err(LarkError::Api {
            code: 230_000..=239_999,
            ..
        }) => Check::ok(
            NAME,
            "quoted messages are readable (im:message or im:message:readonly)",
        ),
        Err(e) => Check::warn(
            NAME,
            format!("whether quoted messages are readable is unknown: {e}"),
            "run doctor again; the scope needed is im:message:readonly (or im:message)",
        ),
    }
}

/// The long connection's endpoint call: the credentials open a connection URL.
async fn long_connection(config: &Config, lark: &crate::config::LarkConfig) -> Check {
    let client = match crate::lark::ws::LongConnection::new(
        &config.lark_base_url,
        &lark.app_id,
        lark.app_secret.clone(),
        Arc::new(Metrics::new()),
    ) {
        Ok(c) => c,
        Err(e) => {
            return Check::fail(
                "lark.long_connection",
                format!("{e:#}"),
                "check LARK_BASE_URL",
            );
        }
    };
    match client.endpoint().await {
        Ok((_, c)) => Check::ok(
            "lark.long_connection",
            format!(
                "the endpoint gave a connection URL (ping every {} s)",
                c.ping_interval
            ),
        ),
        Err(e) => Check::fail(
            "lark.long_connection",
            e,
            "the long connection needs a self-built (enterprise) app with its event and callback \
             subscriptions set to \"receive through a long connection\" (developer console → \
             Events & Callbacks), and outbound HTTPS to LARK_BASE_URL",
        ),
    }
}

/// Sends the event URL what the developer console sends when it checks it: a
/// `url_verification`, encrypted and signed when there is an Encrypt Key, and expects the
/// challenge back.
async fn url_round_trip(url: &str, token: &str, encrypt_key: Option<&str>) -> Check {
    let challenge = uuid::Uuid::new_v4().to_string();
    let plain = json!({"challenge": challenge, "token": token, "type": "url_verification"});
    let ts = chrono::Utc::now().timestamp().to_string();
    let nonce = uuid::Uuid::new_v4().simple().to_string();
    let client = match reqwest::Client::builder().timeout(URL_WAIT).build() {
        Ok(c) => c,
        Err(e) => return Check::fail("lark.url", e.to_string(), "retry"),
    };
    let mut req = client.post(url).header("content-type", "application/json");
    let body = match encrypt_key {
        Some(key) => {
            let mut iv = [0u8; 16];
            iv.copy_from_slice(&uuid::Uuid::new_v4().into_bytes());
            let sealed = crate::lark::webhook::encrypt(key, iv, plain.to_string().as_bytes());
            let body = json!({"encrypt": sealed}).to_string().into_bytes();
            let sig = crate::lark::webhook::signature(&ts, &nonce, key, &body);
            req = req
                .header("X-Lark-Request-Timestamp", &ts)
                .header("X-Lark-Request-Nonce", &nonce)
                .header("X-Lark-Signature", sig);
            body
        }
        None => plain.to_string().into_bytes(),
    };
    let answer = match req.body(body).send().await {
        Ok(r) => r,
        Err(e) => {
            return Check::fail(
                "lark.url",
                format!("{url} did not answer: {}", without_url(&e)),
                "check that `serve` runs and that the URL reaches it from outside (DNS, TLS, \
                 reverse proxy to SSHMODE_LISTEN, path /lark/events)",
            );
        }
    };
    let status = answer.status();
    let echoed = answer.json::<Value>().await.ok().and_then(|v| {
        v.get("challenge")
            .and_then(Value::as_str)
            .map(str::to_string)
    });
    match (status.as_u16(), echoed) {
        (200, Some(c)) if c == challenge => Check::ok(
            "lark.url",
            format!("{url} answered a signed url_verification with its challenge"),
        ),
        (401, _) => Check::fail(
            "lark.url",
            format!("{url} refused the signed request (401)"),
            "the service behind the URL has another LARK_ENCRYPT_KEY or LARK_VERIFICATION_TOKEN \
             than this configuration",
        ),
        (s, _) => Check::fail(
            "lark.url",
            format!("{url} answered HTTP {s} without the challenge"),
            "the URL does not reach sshmode's POST /lark/events (check the path and the proxy)",
        ),
    }
}

/// A request error without the URL (it is printed beside it already).
fn without_url(e: &reqwest::Error) -> String {
    let mut s = e.to_string();
    if let Some(u) = e.url() {
        s = s.replace(u.as_str(), "").replace(" ()", "");
    }
    let mut source = std::error::Error::source(e);
    while let Some(inner) = source {
        s = format!("{s}: {inner}");
        source = inner.source();
    }
    s
}

/// One `max_tokens = 1` request per router entry; with the database, each entry the router
/// disabled is named. Runs without the database too (on a pool that never connects).
async fn models(config: &Config, db: Option<&sqlx::PgPool>) -> Vec<Check> {
    if matches!(config.llm, LlmConfig::None) {
        return vec![no_model()];
    }
    let pool = match db {
        Some(db) => db.clone(),
        None => sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .connect_lazy_with(sqlx::postgres::PgConnectOptions::new().host("/nonexistent")),
    };
    let router = crate::llm::Router::from_config(
        config,
        pool,
        Arc::new(crate::clock::SystemClock),
        Arc::new(Metrics::new()),
    );
    let router = match router {
        Ok(Some(r)) => r,
        Ok(None) => return vec![no_model()],
        Err(e) => {
            return vec![Check::fail(
                "model",
                format!("{e:#}"),
                "check LLM_BASE_URL/LLM_MODEL or the router file (SSHMODE_ROUTER_CONFIG)",
            )];
        }
    };
    let disabled = match db {
        Some(_) => router.disabled().await,
        None => Vec::new(),
    };
    router
        .check_each()
        .await
        .into_iter()
        .map(|c| {
            let name = format!("model {}/{}", c.provider, c.model);
            let entry = format!("{}/{}", c.provider, c.model);
            let off = disabled.iter().find(|h| h.name() == entry);
            match (c.result, off) {
                (Ok(()), None) => Check::ok(name, "answered a max_tokens=1 request"),
                (Ok(()), Some(h)) => Check::fail(
                    name,
                    format!(
                        "answers now, but disabled{}: its key was rejected then, and no chat \
                         uses it",
                        since(h)
                    ),
                    format!("if its key is right now, `sshmode router enable {entry}`"),
                ),
                (Err((class, message)), None) => Check::fail(name, message, model_advice(class)),
                (Err((class, message)), Some(h)) => Check::fail(
                    name,
                    format!(
                        "disabled{} after its key was rejected; now: {message}",
                        since(h)
                    ),
                    format!(
                        "{}; then {}",
                        model_advice(class),
                        crate::llm::router::enable_advice(&entry)
                    ),
                ),
            }
        })
        .collect()
}

fn since(h: &crate::llm::router::EntryHealth) -> String {
    h.since
        .map(|t| format!(" since {}", t.format("%Y-%m-%d %H:%M:%S UTC")))
        .unwrap_or_default()
}

fn no_model() -> Check {
    Check::warn(
        "model",
        "none configured: chat commands work, the agent answers that it has no model",
        "set LLM_BASE_URL, LLM_MODEL and LLM_API_KEY, or SSHMODE_ROUTER_CONFIG",
    )
}

fn model_advice(class: FailureClass) -> &'static str {
    match class {
        FailureClass::Auth => {
            "the provider refused the key: check LLM_API_KEY (or the router file's api_key_env variable)"
        }
        FailureClass::Quota => {
            "the provider reports quota or billing exhausted: top it up, or add another entry to the chain"
        }
        FailureClass::RateLimited => {
            "rate limited right now: retry in a minute; add another entry to the chain for load"
        }
        FailureClass::Transient => {
            "no good answer: check the base URL (with its version path, e.g. /v1) and that the provider is reachable from here"
        }
        FailureClass::BadRequest => {
            "the provider refused the request: check the model name for this provider"
        }
    }
}

/// Every approved target through `target test`; pending ones are named.
async fn targets(config: &Config, db: &sqlx::PgPool) -> Vec<Check> {
    use futures_util::StreamExt;
    let list = match crate::target::list(db).await {
        Ok(l) => l,
        Err(e) => {
            return vec![Check::fail(
                "targets",
                e.to_string(),
                "run `sshmode migrate`",
            )];
        }
    };
    if list.is_empty() {
        return vec![Check::ok(
            "targets",
            "none registered (`sshmode target add`)",
        )];
    }
    let checks = list.into_iter().map(|t| async move {
        let name = format!("target {}", t.alias);
        match t.status {
            TargetStatus::Approved => {}
            TargetStatus::Pending => {
                return Check::warn(
                    name,
                    "pending approval: no chat may use it",
                    format!("`sshmode target approve {}` once the host key is checked", t.alias),
                );
            }
            _ => {
                return Check::ok(name, format!("{}: not checked", t.status.as_str()));
            }
        }
        let checked =
            tokio::time::timeout(TARGET_WAIT, crate::target::cli::check(&t.alias, config, db))
                .await;
        match checked {
            Ok(Ok((true, lines))) => Check::ok(name, lines.join("; ")),
            Ok(Ok((false, lines))) => {
                let failed = lines
                    .iter()
                    .find(|l| l.starts_with("FAILED"))
                    .cloned()
                    .unwrap_or_else(|| lines.join("; "));
                let advice = if failed.contains("host key") {
                    format!(
                        "the host presented another key: check it on the host (`ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub`), then `sshmode target rekey {} --host-key SHA256:…`",
                        t.alias
                    )
                } else if failed.contains("auth") {
                    format!(
                        "the target refused the credentials: remove and add `{}` again with the right key or password",
                        t.alias
                    )
                } else {
                    format!(
                        "check that {} is reachable from here (firewall, DNS, sshd running), then `sshmode target test {}`",
                        t.destination(),
                        t.alias
                    )
                };
                Check::fail(name, failed, advice)
            }
            Ok(Err(e)) => Check::fail(name, format!("{e:#}"), format!("`sshmode target show {}`", t.alias)),
            Err(_) => Check::fail(
                name,
                format!("no answer within {} s", TARGET_WAIT.as_secs()),
                format!("check that {} is reachable from here", t.destination()),
            ),
        }
    });
    futures_util::stream::iter(checks)
        .buffered(TARGETS_AT_ONCE)
        .collect()
        .await
}

/// The start-up form `serve` logs: no Lark, model or target calls.
pub fn light(config: &Config, level: &Level) -> Vec<Check> {
    let mut checks = vec![level_check(level, config.exec.local.unsandboxed)];
    if let Some(lark) = &config.lark
        && lark.encrypt_key.is_none()
    {
        checks.push(Check::warn(
            "lark.encrypt_key",
            "not set; unsigned callbacks are accepted",
            "set LARK_ENCRYPT_KEY for any real deployment",
        ));
    }
    if matches!(config.llm, LlmConfig::None) {
        checks.push(no_model());
    }
    checks
}

/// Logs [`light`]'s checks: a warning for each that is not fine.
pub fn log_light(config: &Config, level: &Level) {
    for c in light(config, level) {
        match c.status {
            Status::Ok => {
                tracing::info!(doctor.check = %c.name, "{}", c.detail);
            }
            _ => {
                tracing::warn!(doctor.check = %c.name, advice = c.advice.as_deref().unwrap_or(""), "{}", c.detail);
            }
        }
    }
}

/// Writes the report: one line per check, its advice on the next line when there is any.
pub fn print(checks: &[Check], json: bool, out: &mut dyn std::io::Write) -> std::io::Result<()> {
    if json {
        serde_json::to_writer_pretty(&mut *out, checks)?;
        return writeln!(out);
    }
    for c in checks {
        let mark = match c.status {
            Status::Ok => "✓",
            Status::Warn => "!",
            Status::Fail => "✗",
        };
        writeln!(out, "{mark} {}: {}", c.name, c.detail)?;
        if let Some(a) = &c.advice {
            writeln!(out, "    → {a}")?;
        }
    }
    Ok(())
}

/// The exit code: 1 when anything failed.
pub fn exit_code(checks: &[Check]) -> i32 {
    i32::from(checks.iter().any(|c| c.status == Status::Fail))
}
