//! Typed configuration, read once from the environment (and a `.env` file in the working
//! directory) at start-up. Nothing else in the crate reads environment variables.
//!
//! Every failure names the variable at fault. Secrets are [`SecretString`]s, so a `Debug` of
//! the config prints `[REDACTED]` in their place. Relative paths are made absolute here, once.

pub mod router_file;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use secrecy::SecretString;

/// A configuration error: always names the variable and what was wrong with it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{name} is required{why}")]
    Missing {
        name: &'static str,
        why: &'static str,
    },
    #[error("{name} is invalid: {reason}")]
    Invalid { name: &'static str, reason: String },
    /// `serve` without an Encrypt Key and without the explicit opt-out.
    #[error(
        "LARK_ENCRYPT_KEY is required by `sshmode serve`. Without an Encrypt Key Lark signs \
         nothing: the verification token inside every callback body is then the only proof \
         that an event comes from Lark, so anyone who sees one callback body can forge events, \
         admin commands included. Set one in the Lark/Feishu developer console (your app → \
         Events & Callbacks → Encryption Strategy → Encrypt Key) and put the same value in \
         LARK_ENCRYPT_KEY. To accept unsigned events anyway (a local test setup only), set \
         SSHMODE_ALLOW_UNSIGNED_EVENTS=true."
    )]
    UnsignedEvents,
    /// `.env` in the working directory is unreadable or malformed.
    #[error("{reason}")]
    Dotenv { reason: String },
}

impl ConfigError {
    /// The variable at fault, when one is.
    pub fn variable(&self) -> Option<&'static str> {
        match self {
            ConfigError::Missing { name, .. } | ConfigError::Invalid { name, .. } => Some(name),
            ConfigError::UnsignedEvents => Some("LARK_ENCRYPT_KEY"),
            ConfigError::Dotenv { .. } => None,
        }
    }
}

/// How Lark's events reach the service (`SSHMODE_LARK_MODE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LarkMode {
    /// `POST /lark/events` on a public URL (the default).
    Webhook,
    /// The long connection the service dials out; `POST /lark/events` is off.
    Websocket,
    /// Both at once (while moving from one to the other); each event is handled once.
    Both,
}

impl LarkMode {
    /// Whether `POST /lark/events` is served.
    pub fn webhook(self) -> bool {
        matches!(self, LarkMode::Webhook | LarkMode::Both)
    }

    /// Whether the long connection is held.
    pub fn websocket(self) -> bool {
        matches!(self, LarkMode::Websocket | LarkMode::Both)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            LarkMode::Webhook => "webhook",
            LarkMode::Websocket => "websocket",
            LarkMode::Both => "both",
        }
    }
}

impl FromStr for LarkMode {
    type Err = String;
    fn from_str(s: &str) -> Result<LarkMode, String> {
        match s.to_ascii_lowercase().as_str() {
            "webhook" => Ok(LarkMode::Webhook),
            "websocket" => Ok(LarkMode::Websocket),
            "both" => Ok(LarkMode::Both),
            _ => Err("expected webhook, websocket or both".into()),
        }
    }
}

/// Log output format (`SSHMODE_LOG_FORMAT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Pretty,
    Json,
}

/// `SSHMODE_LOG_FILE`: the same log events also go to this file, rotated by size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogFileConfig {
    /// Absolute; a relative `SSHMODE_LOG_FILE` is taken inside the data dir.
    pub path: PathBuf,
    /// `SSHMODE_LOG_MAX_MB` (default 50), in bytes: past it the file is rotated.
    pub max_bytes: u64,
    /// `SSHMODE_LOG_KEEP` (default 5): rotated files kept (`name.1` newest … `name.N`).
    pub keep: usize,
}

/// The whole configuration. Built by [`Config::load`] (process environment + `.env`) or by
/// [`Config::from_vars`] (any variable source; used by tests).
#[derive(Debug, Clone)]
pub struct Config {
    /// `DATABASE_URL`; `None` selects the embedded cluster under `data_dir/pg`.
    pub database_url: Option<SecretString>,
    /// `SSHMODE_DATA_DIR`, absolute.
    pub data_dir: PathBuf,
    /// `SSHMODE_LISTEN`.
    pub listen: SocketAddr,
    /// Lark app settings. Optional here so that non-serving commands work without them (or
    /// with an incomplete set, as a copied `.env.example` has); `serve` calls
    /// [`Config::require_serve`].
    pub lark: Option<LarkConfig>,
    /// The first `LARK_*` credential missing when only some are set; reported by `serve`.
    pub lark_missing: Option<&'static str>,
    /// `LARK_BASE_URL`, without a trailing slash. Kept apart from [`LarkConfig`] so that the
    /// base is known even to commands that do not need credentials.
    pub lark_base_url: String,
    /// `SSHMODE_LARK_MODE`: the webhook, the long connection, or both.
    pub lark_mode: LarkMode,
    /// `SSHMODE_ADMINS`: open_ids of admins.
    pub admins: Vec<String>,
    /// Model access: a single provider, a router file, or nothing.
    pub llm: LlmConfig,
    /// The router file named by `SSHMODE_ROUTER_CONFIG`, read and validated at load, with the
    /// keys named by its `api_key_env` entries resolved through the same variable source (so
    /// this stays the only reader of the environment, and a broken file fails at start-up).
    pub router_file: Option<router_file::RouterFile>,
    /// `SSHMODE_MODEL`: the abstract model name the agent asks the router for.
    pub model: Option<String>,
    /// `SSHMODE_API_TOKEN`: bearer token of `POST /v1/chat/completions`; unset = endpoint off.
    pub api_token: Option<SecretString>,
    /// `SSHMODE_MASTER_KEY_FILE`, absolute.
    pub master_key_file: PathBuf,
    /// `SSHMODE_LOG_FORMAT`.
    pub log_format: LogFormat,
    /// `NO_COLOR` set (to anything): no colour codes in logs, even on a terminal.
    pub no_color: bool,
    /// Who runs a one-shot command, as its audit rows name them: `cli:<user>` — `sudo`'s
    /// caller where `sudo` set `SUDO_USER` (honoured under root only), else the account this
    /// process runs as.
    pub operator: String,
    /// `RUST_LOG`: the tracing filter directives.
    pub log_filter: String,
    /// Whether `RUST_LOG` was set (one-shot commands log at `warn` unless it was).
    pub log_filter_set: bool,
    /// `SSHMODE_LOG_FILE` and its rotation; `None` = standard error only.
    pub log_file: Option<LogFileConfig>,
    /// `SSHMODE_AUDIT_RETENTION_DAYS` (default 180): `serve` deletes older audit rows.
    pub audit_retention_days: u32,
    /// How long the rest of what is stored is kept (`SSHMODE_*_RETENTION_DAYS`,
    /// `SSHMODE_WORKSPACE_IDLE_DAYS`): `serve` enforces it in small batches.
    pub retention: RetentionConfig,
    /// Inbox (durable event queue) tunables.
    pub inbox: InboxConfig,
    /// Execution-layer tunables.
    pub exec: ExecConfig,
    /// Chat control.
    pub chat: ChatConfig,
    /// Model-router tunables.
    pub router: RouterTunables,
    /// Agent turn tunables.
    pub agent: AgentConfig,
    /// Live progress card tunables.
    pub progress: ProgressConfig,
    /// HTTP server bounds.
    pub http: HttpConfig,
    /// The MCP endpoint's own listener; `None` (the default) = off.
    pub mcp: Option<McpConfig>,
}

/// The MCP endpoint (`SSHMODE_MCP_*`): its own address, never the public listener's.
#[derive(Debug, Clone)]
pub struct McpConfig {
    /// `SSHMODE_MCP_LISTEN`.
    pub listen: SocketAddr,
    /// `SSHMODE_MCP_ALLOWED_HOSTS` (comma-separated): `Host` values accepted (the DNS-rebinding
    /// guard); default the loopback names and the listen address's IP.
    pub allowed_hosts: Vec<String>,
    /// `SSHMODE_MCP_ALLOWED_ORIGINS` (comma-separated, with scheme): browser origins
    /// accepted; default none, so a request carrying any `Origin` is refused.
    pub allowed_origins: Vec<String>,
    /// `SSHMODE_MCP_MAX_SESSIONS` (default 64): 2025-era sessions held at once.
    pub max_sessions: usize,
    /// `SSHMODE_MCP_MAX_CALLS` (default 32): tool calls running at once.
    pub max_calls: usize,
    /// `SSHMODE_MCP_MAX_SESSIONS_PER_TOKEN` (default 16): sessions one token holds at once.
    pub max_sessions_per_token: usize,
    /// `SSHMODE_MCP_MAX_CALLS_PER_TOKEN` (default 8): tool calls one token runs at once.
    pub max_calls_per_token: usize,
    /// Connection bounds of the MCP listener (the same variables as the public one's).
    pub http: HttpConfig,
}

/// Bounds of the HTTP server: how long a client may take to send a request, and how many
/// connections are served at once.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    /// `SSHMODE_HTTP_HEADER_TIMEOUT_SECS`: a request's head (line and headers) must arrive
    /// within this; it is also how long an idle keep-alive connection stays open.
    pub header_timeout: Duration,
    /// `SSHMODE_HTTP_BODY_TIMEOUT_SECS`: a request's whole body must arrive within this,
    /// counted from its head.
    pub body_timeout: Duration,
    /// `SSHMODE_HTTP_MAX_CONNECTIONS`: connections served at once; past it, new ones wait in
    /// the listen backlog.
    pub max_connections: usize,
}

/// Lark app credentials (`LARK_*`).
#[derive(Debug, Clone)]
pub struct LarkConfig {
    pub app_id: String,
    pub app_secret: SecretString,
    pub verification_token: SecretString,
    /// `LARK_ENCRYPT_KEY`: when set, bodies are decrypted and signatures checked.
    pub encrypt_key: Option<SecretString>,
    /// `SSHMODE_ALLOW_UNSIGNED_EVENTS`: accept events without an Encrypt Key (checked by the
    /// verification token alone). Off by default: `serve` refuses to start, and the callback
    /// refuses every request, while there is no key and this is false.
    pub allow_unsigned_events: bool,
}

/// How the model is reached.
#[derive(Debug, Clone)]
pub enum LlmConfig {
    /// No model configured: chat commands work, agent requests get a clear answer.
    None,
    /// `LLM_BASE_URL` / `LLM_API_KEY` / `LLM_MODEL`.
    Single {
        base_url: String,
        api_key: Option<SecretString>,
        model: String,
    },
    /// `SSHMODE_ROUTER_CONFIG`: path (absolute) to the TOML router file.
    RouterFile(PathBuf),
}

/// How long each kind of stored content is kept, in days (each at least 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetentionConfig {
    /// `SSHMODE_EVENTLOG_RETENTION_DAYS` (default 90): section event logs and the stored
    /// conversations (transcripts, turn requests' text, summaries).
    pub eventlog_days: u32,
    /// `SSHMODE_INBOX_RETENTION_DAYS` (default 14): handled inbox rows (the events as they
    /// came). Never longer than the de-duplication window needs: rows go at the shorter of this
    /// and `SSHMODE_DEDUP_RETENTION_HOURS`.
    pub inbox_days: u32,
    /// `SSHMODE_ATTACHMENT_RETENTION_DAYS` (default 30): files people sent, as placed in local
    /// workspaces, and kept images (which also never outlive their two days).
    pub attachment_days: u32,
    /// `SSHMODE_WORKSPACE_IDLE_DAYS` (default 90): a local section's own workspace is removed
    /// once its section has been idle this long.
    pub workspace_idle_days: u32,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        RetentionConfig {
            eventlog_days: 90,
            inbox_days: 14,
            attachment_days: 30,
            workspace_idle_days: 90,
        }
    }
}

/// Inbox tunables.
#[derive(Debug, Clone)]
pub struct InboxConfig {
    /// `SSHMODE_DEDUP_RETENTION_HOURS`: how long event ids are remembered, and the age past
    /// which a request is refused as a replay. Longer than Lark's ≈ 7 h retry window.
    pub dedup_retention: Duration,
    /// How long a handled row is kept: the shorter of [`Self::dedup_retention`] and
    /// `SSHMODE_INBOX_RETENTION_DAYS`.
    pub handled_retention: Duration,
    /// `SSHMODE_INBOX_WORKERS`: concurrent event handlers.
    pub workers: usize,
    /// `SSHMODE_INBOX_MAX_ATTEMPTS`: attempts before an event is dead-lettered.
    pub max_attempts: i32,
    /// `SSHMODE_INBOX_LEASE_SECS`: how long a claim holds before another worker may retake it.
    pub lease: Duration,
    /// `SSHMODE_WORKERS_ENABLED` (`true`/`false`): run the inbox workers in `serve`. Off only
    /// to prove recovery after a restart.
    pub workers_enabled: bool,
}

/// Chat control (SSH Mode in chats).
#[derive(Debug, Clone)]
pub struct ChatConfig {
    /// `SSHMODE_YOLO_TTL_HOURS`: lifetime of a `/ssh yolo on` grant (default 12 h).
    pub yolo_ttl: Duration,
    /// `SSHMODE_ATTACHMENT_MAX_MB` in bytes: the largest file or image a person may send the
    /// bot (default 20 MB, at most Lark's own 100 MB); a larger one is refused with a message.
    pub attachment_max_bytes: u64,
    /// `SSHMODE_TIMEZONE`: the zone of new schedules in a chat without `/cron tz` (`Area/City`,
    /// default `UTC`).
    pub timezone: String,
    /// `SSHMODE_SCHEDULE_MIN_SECS`: the shortest interval a schedule may have (default 60).
    pub schedule_min: Duration,
    /// `SSHMODE_SCHEDULE_MAX_PER_CHAT`: schedules a chat may hold (default 20).
    pub schedule_max_per_chat: usize,
}

/// Execution tunables.
#[derive(Debug, Clone)]
pub struct ExecConfig {
    /// `SSHMODE_SSH_CONNECT_TIMEOUT_SECS`.
    pub ssh_connect_timeout: Duration,
    /// `SSHMODE_SSH_MAX_CONNECTIONS`: connections per target.
    pub ssh_max_connections: usize,
    /// `SSHMODE_SSH_CHANNELS_PER_CONNECTION`: sshd's `MaxSessions` defaults to 10.
    pub ssh_channels_per_connection: usize,
    /// `SSHMODE_SSH_QUEUE_TIMEOUT_SECS`: how long a command waits for a free channel.
    pub ssh_queue_timeout: Duration,
    /// `SSHMODE_SSH_IDLE_SECS`: an idle connection is closed after this.
    pub ssh_idle: Duration,
    /// `SSHMODE_SSH_KEEPALIVE_SECS`.
    pub ssh_keepalive: Duration,
    /// `SSHMODE_COMMAND_TIMEOUT_SECS`: default timeout of a tool command.
    pub command_timeout: Duration,
    /// `SSHMODE_OUTPUT_LIMIT_BYTES`: head + tail kept of a command's output.
    pub output_limit: usize,
    /// `SSHMODE_GUARD_EXTRA_FILE`: operator additions to the command guard (one regex a line).
    pub guard_extra_file: Option<PathBuf>,
    /// `SSHMODE_WORKSPACE_ROOT`: parent of the local per-thread working directories.
    pub workspace_root: PathBuf,
    /// `SSH_AUTH_SOCK`: the ssh-agent used by targets added with `--agent`.
    pub ssh_auth_sock: Option<PathBuf>,
    /// `SSHMODE_TOOL_ENV_ALLOW`: names (`NAME`, or `PREFIX*` for every name that starts so) a
    /// tool call's `env` may set below `full`, besides the workspace judge's own list.
    pub tool_env_allow: Vec<String>,
    /// How local tools are isolated from the service (see [`LocalConfig`]).
    pub local: LocalConfig,
}

/// Router tunables.
#[derive(Debug, Clone)]
pub struct RouterTunables {
    /// `SSHMODE_LLM_TIMEOUT_SECS`: per request to a provider.
    pub request_timeout: Duration,
    /// `SSHMODE_QUOTA_COOLDOWN_SECS`: cooldown after a quota/billing error (default 5 h).
    pub quota_cooldown: Duration,
    /// `SSHMODE_RATE_COOLDOWN_SECS`: cooldown after a 429 without `Retry-After`.
    pub rate_cooldown: Duration,
    /// `SSHMODE_PROBE_INTERVAL_SECS`: how often cooling entries are probed.
    pub probe_interval: Duration,
}

// --- Local tool isolation (`exec::local`) ---------------------------------------------------------

/// How local tools are kept away from the service: the account they run as, the sandbox, and
/// the limits of each command.
#[derive(Debug, Clone)]
pub struct LocalConfig {
    /// `SSHMODE_LOCAL_USER`: the account local commands run as when the service runs as root.
    pub user: String,
    /// `SSHMODE_LOCAL_UNSANDBOXED`: allow local tools with neither a separate identity nor an
    /// enforced Landlock sandbox (warned at every start).
    pub unsandboxed: bool,
    /// `SSHMODE_LOCAL_TCP_PORTS`: when set (Landlock V4+), the only TCP ports a local command
    /// may connect to; binding is then refused. Unset: the network is not filtered.
    pub tcp_ports: Option<Vec<u16>>,
    /// `SSHMODE_LOCAL_MAX_CONCURRENT`: local commands running at once; more wait.
    pub max_concurrent: usize,
    /// `SSHMODE_LOCAL_MAX_PROCS`: processes of the tools account (`RLIMIT_NPROC`).
    pub max_processes: u64,
    /// `SSHMODE_LOCAL_CPU_SECS`: CPU seconds per process (`RLIMIT_CPU`).
    pub cpu_secs: u64,
    /// `SSHMODE_LOCAL_MEMORY_MB`: address space per process (`RLIMIT_AS`); 0 = unlimited.
    pub address_space_mb: u64,
    /// `SSHMODE_LOCAL_OPEN_FILES`: open files per process (`RLIMIT_NOFILE`).
    pub open_files: u64,
    /// The data directory: never reachable by a tool (only its workspace and tmp parts).
    pub data_dir: PathBuf,
    /// Files of the service a tool must never read: the master key, `.env` (when present in
    /// the working directory), the router file, the guard file.
    pub protected: Vec<PathBuf>,
    /// `LANG`, `LC_*`, `TZ`, `TERM` as the service has them: the only variables passed on.
    pub passthrough_env: Vec<(String, String)>,
    /// `SSHMODE_LAUNCHER`: the `sshmode` binary that starts each local command in its own
    /// PID namespace and does the file tools' I/O as the tools account (a root service only).
    /// Default: the running executable when it is `sshmode`; `None` otherwise (a library
    /// user), and then commands run without the namespace, which the level says.
    pub launcher: Option<PathBuf>,
    /// Tests only: behave as if neither a separate identity nor Landlock were available.
    #[doc(hidden)]
    pub simulate_no_sandbox: bool,
    /// Tests and benchmarks only: behave as a service not running as root (no tools account).
    #[doc(hidden)]
    pub simulate_non_root: bool,
}

/// `SSHMODE_TOOL_ENV_ALLOW`: comma-separated variable names, each a name of letters, digits
/// and `_` not starting with a digit, or such a name followed by `*` (every name starting so).
fn tool_env_allow(value: Option<String>) -> Result<Vec<String>, ConfigError> {
    let Some(value) = value else {
        return Ok(Vec::new());
    };
    value
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(|n| {
            let stem = n.strip_suffix('*').unwrap_or(n);
            let mut chars = stem.chars();
            let valid = matches!(chars.next(), Some(c) if c == '_' || c.is_ascii_alphabetic())
                && chars.all(|c| c == '_' || c.is_ascii_alphanumeric());
            if valid {
                Ok(n.to_string())
            } else {
                Err(ConfigError::Invalid {
                    name: "SSHMODE_TOOL_ENV_ALLOW",
                    reason: format!(
                        "`{n}` is not a variable name (letters, digits and `_`, not starting \
                         with a digit), nor one followed by `*`"
                    ),
                })
            }
        })
        .collect()
}

/// `/proc/self/exe` when the running executable is `sshmode` (still so after an upgrade
/// replaced the file: the launcher is then the same version as the service).
fn running_sshmode() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let name = exe.file_name()?.to_str()?;
    (name == "sshmode" || name == "sshmode (deleted)").then(|| PathBuf::from("/proc/self/exe"))
}

impl LocalConfig {
    fn from_vars(
        get: &dyn Fn(&str) -> Option<String>,
        cwd: &Path,
        data_dir: &Path,
        master_key_file: &Path,
    ) -> Result<Self, ConfigError> {
        let var = |name: &'static str| get(name).filter(|v| !v.trim().is_empty());
        let tcp_ports = match var("SSHMODE_LOCAL_TCP_PORTS") {
            None => None,
            Some(list) => Some(
                list.split(',')
                    .map(str::trim)
                    .filter(|p| !p.is_empty())
                    .map(|p| {
                        p.parse::<u16>().map_err(|e| ConfigError::Invalid {
                            name: "SSHMODE_LOCAL_TCP_PORTS",
                            reason: format!("`{p}`: {e}"),
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?,
            ),
        };
        let user = var("SSHMODE_LOCAL_USER").unwrap_or_else(|| "sshmode-tools".into());
        if !user
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            || user.starts_with('-')
            || user.len() > 32
        {
            return Err(ConfigError::Invalid {
                name: "SSHMODE_LOCAL_USER",
                reason: format!("`{user}` is not a valid account name"),
            });
        }
        let positive = |name: &'static str, default: u64| -> Result<u64, ConfigError> {
            let n: u64 = parse_or(name, var(name), default)?;
            if n == 0 {
                return Err(ConfigError::Invalid {
                    name,
                    reason: "must be greater than 0".into(),
                });
            }
            Ok(n)
        };
        let abs = |p: String| {
            let p = PathBuf::from(p);
            normalize(&if p.is_absolute() { p } else { cwd.join(p) })
        };
        let mut protected = vec![master_key_file.to_path_buf()];
        if cwd.join(".env").is_file() {
            protected.push(cwd.join(".env"));
        }
        protected.extend(var("SSHMODE_ROUTER_CONFIG").map(abs));
        protected.extend(var("SSHMODE_GUARD_EXTRA_FILE").map(abs));
        let mut passthrough_env = Vec::new();
        for name in ["LANG", "LANGUAGE", "TZ", "TERM"] {
            if let Some(v) = get(name) {
                passthrough_env.push((name.to_string(), v));
            }
        }
        for name in [
            "LC_ALL",
            "LC_CTYPE",
            "LC_COLLATE",
            "LC_MESSAGES",
            "LC_MONETARY",
            "LC_NUMERIC",
            "LC_TIME",
        ] {
            if let Some(v) = get(name) {
                passthrough_env.push((name.to_string(), v));
            }
        }
        Ok(LocalConfig {
            user,
            unsandboxed: parse_or(
                "SSHMODE_LOCAL_UNSANDBOXED",
                var("SSHMODE_LOCAL_UNSANDBOXED"),
                false,
            )?,
            tcp_ports,
            max_concurrent: positive("SSHMODE_LOCAL_MAX_CONCURRENT", 8)? as usize,
            max_processes: positive("SSHMODE_LOCAL_MAX_PROCS", 256)?,
            cpu_secs: positive("SSHMODE_LOCAL_CPU_SECS", 600)?,
            address_space_mb: parse_or(
                "SSHMODE_LOCAL_MEMORY_MB",
                var("SSHMODE_LOCAL_MEMORY_MB"),
                4096,
            )?,
            open_files: positive("SSHMODE_LOCAL_OPEN_FILES", 1024)?,
            data_dir: data_dir.to_path_buf(),
            protected,
            passthrough_env,
            launcher: match var("SSHMODE_LAUNCHER") {
                Some(p) if Path::new(&p).is_absolute() => Some(PathBuf::from(p)),
                Some(p) => {
                    return Err(ConfigError::Invalid {
                        name: "SSHMODE_LAUNCHER",
                        reason: format!("`{p}` is not an absolute path"),
                    });
                }
                None => running_sshmode(),
            },
            simulate_no_sandbox: false,
            simulate_non_root: false,
        })
    }
}

// ---- Agent turns ------------------------------------------------------------------------------

/// Agent turn tunables.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// `SSHMODE_TURN_BUDGET_SECS`: wall-clock budget of one turn, counted across resumes.
    /// Default 900 s (15 min): room for a build or a test run, short enough that a runaway
    /// turn costs little.
    pub turn_budget: Duration,
    /// `SSHMODE_TURN_LEASE_SECS`: how long a turn runner's claim holds without a heartbeat;
    /// another replica resumes a turn this long after its runner died.
    pub turn_lease: Duration,
    /// `SSHMODE_TURN_WORKERS`: sections whose turns one replica runs at once.
    pub turn_workers: usize,
    /// `SSHMODE_MAX_ITERATIONS`: model calls per turn.
    pub max_iterations: u32,
    /// `SSHMODE_TOOL_TIMEOUT_SECS`: the longest one tool call may run.
    pub tool_timeout: Duration,
    /// `SSHMODE_TOOL_RESULT_LIMIT`: bytes of one tool result sent to the model (head + tail).
    pub tool_result_limit: usize,
    /// `SSHMODE_CONTEXT_TOKENS`: the context budget of a section's conversation.
    pub context_tokens: usize,
    /// `SSHMODE_APPROVAL_TIMEOUT_SECS`: how long a call the guard asks about waits for a
    /// person before it is denied (default 600 s).
    pub approval_timeout: Duration,
    /// `SSHMODE_LOCAL_RISKY`: what a command the guard asks about does in a local section:
    /// `ask` (default), `refuse` or `allow`. (Targets: `sshmode target set --risky`.)
    pub local_risky: Risky,
}

/// What a command the guard asks about does on a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Risky {
    /// A person decides (an approval card).
    #[default]
    Ask,
    Refuse,
    /// It runs without asking (catastrophic commands and permission refusals still stop it).
    Allow,
}

impl Risky {
    pub fn as_str(self) -> &'static str {
        match self {
            Risky::Ask => "ask",
            Risky::Refuse => "refuse",
            Risky::Allow => "allow",
        }
    }
}

impl FromStr for Risky {
    type Err = String;

    fn from_str(s: &str) -> Result<Risky, String> {
        match s {
            "ask" => Ok(Risky::Ask),
            "refuse" => Ok(Risky::Refuse),
            "allow" => Ok(Risky::Allow),
            other => Err(format!("`{other}` is not one of ask, refuse, allow")),
        }
    }
}

/// Live progress card tunables (`src/progress/`).
#[derive(Debug, Clone)]
pub struct ProgressConfig {
    /// `SSHMODE_PROGRESS`: `true` shows a live card per turn; `false` sends the answer only.
    pub enabled: bool,
    /// `SSHMODE_PROGRESS_INTERVAL_MS`: least time between two updates of one card (default
    /// 200 ms: at most 5 per second; Lark allows 10).
    pub interval: Duration,
    /// `SSHMODE_PROGRESS_PATCH_INTERVAL_MS`: least time between two PATCHes of the fallback
    /// card message (default 1500 ms).
    pub patch_interval: Duration,
    /// `SSHMODE_PROGRESS_STREAMING_TTL_SECS`: how long Lark keeps a card streaming after it was
    /// last enabled (600 s); streaming is re-enabled at four fifths of it.
    pub streaming_ttl: Duration,
    /// `SSHMODE_PROGRESS_ANSWER_WAIT_MS`: longest a turn's answer waits for its card while
    /// the card is being made (30 s); past it the answer goes out and that card never does.
    pub answer_wait: Duration,
}

/// The name of the account this process runs as (`uid<N>` when it has none).
fn os_user() -> String {
    // SAFETY: getuid cannot fail; getpwuid_r writes only into the buffers given, and the
    // name it points at lives in `buf`, read before `buf` is dropped.
    let uid = unsafe { libc::getuid() };
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut buf = vec![0 as libc::c_char; 4096];
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    let rc = unsafe { libc::getpwuid_r(uid, &mut pwd, buf.as_mut_ptr(), buf.len(), &mut found) };
    if rc == 0 && !found.is_null() && !pwd.pw_name.is_null() {
        let name = unsafe { std::ffi::CStr::from_ptr(pwd.pw_name) };
        if let Ok(name) = name.to_str()
            && is_account_name(name)
        {
            return name.to_string();
        }
    }
    format!("uid{uid}")
}

/// A plausible login name: what `useradd` accepts, so an audit actor cannot carry anything
/// else.
fn is_account_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '$'))
}

impl Config {
    /// Reads `.env` from the working directory (if present; it never overrides the real
    /// environment) and then the process environment.
    pub fn load() -> Result<Self, ConfigError> {
        let (vars, cwd) = Self::variables()?;
        Self::from_vars(&|name| vars.get(name).cloned(), &cwd)
    }

    /// [`Config::load`] for `doctor`, which reports every problem it can: a variable that is
    /// invalid is reported and left out (its default is used), and loading goes on, so the
    /// other checks still run. `None` when no configuration could be made at all.
    pub fn load_lenient() -> (Option<Self>, Vec<ConfigError>) {
        let (mut vars, cwd) = match Self::variables() {
            Ok(v) => v,
            Err(e) => return (None, vec![e]),
        };
        let mut errors = Vec::new();
        // Each round leaves one variable out: bounded by how many there are.
        for _ in 0..=vars.len() {
            match Self::from_vars(&|name| vars.get(name).cloned(), &cwd) {
                Ok(c) => return (Some(c), errors),
                Err(e) => {
                    let dropped = e.variable().is_some_and(|n| vars.remove(n).is_some());
                    errors.push(e);
                    if !dropped {
                        break;
                    }
                }
            }
        }
        (None, errors)
    }

    /// `.env` from the working directory (never overriding the real environment), then the
    /// process environment; and the working directory.
    fn variables() -> Result<(HashMap<String, String>, PathBuf), ConfigError> {
        let cwd = std::env::current_dir().map_err(|e| ConfigError::Invalid {
            name: "SSHMODE_DATA_DIR",
            reason: format!("cannot read the working directory: {e}"),
        })?;
        let mut vars: HashMap<String, String> = HashMap::new();
        let dotenv = cwd.join(".env");
        if dotenv.is_file() {
            let iter = dotenvy::from_path_iter(&dotenv).map_err(|e| ConfigError::Dotenv {
                reason: format!(".env could not be read: {e}"),
            })?;
            for item in iter {
                let (k, v) = item.map_err(|e| ConfigError::Dotenv {
                    reason: dotenv_parse_error(&e),
                })?;
                vars.insert(k, v);
            }
        }
        for (k, v) in std::env::vars() {
            vars.insert(k, v);
        }
        Ok((vars, cwd))
    }

    /// Builds the config from any variable source; relative paths are resolved against `cwd`.
    pub fn from_vars(
        get: &dyn Fn(&str) -> Option<String>,
        cwd: &Path,
    ) -> Result<Self, ConfigError> {
        let var = |name: &'static str| get(name).filter(|v| !v.trim().is_empty());
        let abs = |p: String| {
            let p = PathBuf::from(p);
            if p.is_absolute() { p } else { cwd.join(p) }
        };

        let data_dir = abs(var("SSHMODE_DATA_DIR").unwrap_or_else(|| "./data".into()));
        let data_dir = normalize(&data_dir);
        let listen = parse_or(
            "SSHMODE_LISTEN",
            var("SSHMODE_LISTEN"),
            "127.0.0.1:8080".parse().unwrap(),
        )?;

        // An incomplete set is no error here: only `serve` needs the credentials, and it
        // names the missing one (`require_serve`).
        let allow_unsigned_events: bool = parse_or(
            "SSHMODE_ALLOW_UNSIGNED_EVENTS",
            var("SSHMODE_ALLOW_UNSIGNED_EVENTS"),
            false,
        )?;
        let (lark, lark_missing) = match (
            var("LARK_APP_ID"),
            var("LARK_APP_SECRET"),
            var("LARK_VERIFICATION_TOKEN"),
        ) {
            (Some(app_id), Some(secret), Some(token)) => (
                Some(LarkConfig {
                    app_id,
                    app_secret: SecretString::from(secret),
                    verification_token: SecretString::from(token),
                    encrypt_key: var("LARK_ENCRYPT_KEY").map(SecretString::from),
                    allow_unsigned_events,
                }),
                None,
            ),
            (a, s, _) => {
                let name = if a.is_none() {
                    "LARK_APP_ID"
                } else if s.is_none() {
                    "LARK_APP_SECRET"
                } else {
                    "LARK_VERIFICATION_TOKEN"
                };
                (None, Some(name))
            }
        };
        let lark_base_url = var("LARK_BASE_URL").unwrap_or_else(|| "https://open.feishu.cn".into());
        check_url("LARK_BASE_URL", &lark_base_url)?;
        let lark_base_url = lark_base_url.trim_end_matches('/').to_string();

        let admins = var("SSHMODE_ADMINS")
            .map(|s| {
                s.split(',')
                    .map(|a| a.trim().to_string())
                    .filter(|a| !a.is_empty())
                    .collect()
            })
            .unwrap_or_default();

        let llm = if let Some(path) = var("SSHMODE_ROUTER_CONFIG") {
            LlmConfig::RouterFile(normalize(&abs(path)))
        } else {
            match (var("LLM_BASE_URL"), var("LLM_MODEL")) {
                (None, None) => LlmConfig::None,
                (Some(base_url), Some(model)) => {
                    check_url("LLM_BASE_URL", &base_url)?;
                    LlmConfig::Single {
                        base_url: base_url.trim_end_matches('/').to_string(),
                        api_key: var("LLM_API_KEY").map(SecretString::from),
                        model,
                    }
                }
                (None, Some(_)) => {
                    return Err(ConfigError::Missing {
                        name: "LLM_BASE_URL",
                        why: " when LLM_MODEL is set",
                    });
                }
                (Some(_), None) => {
                    return Err(ConfigError::Missing {
                        name: "LLM_MODEL",
                        why: " when LLM_BASE_URL is set",
                    });
                }
            }
        };

        let router_file = match &llm {
            LlmConfig::RouterFile(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Invalid {
                    name: "SSHMODE_ROUTER_CONFIG",
                    reason: format!("cannot read {}: {e}", path.display()),
                })?;
                let file = router_file::RouterFile::parse(&text, &|name| var_any(get, name))
                    .map_err(|reason| ConfigError::Invalid {
                        name: "SSHMODE_ROUTER_CONFIG",
                        reason: format!("{}: {reason}", path.display()),
                    })?;
                Some(file)
            }
            _ => None,
        };

        let master_key_file = var("SSHMODE_MASTER_KEY_FILE")
            .map(|p| normalize(&abs(p)))
            .unwrap_or_else(|| data_dir.join("master.key"));

        // `SUDO_USER` only counts under root: anyone else could set it to anything.
        // SAFETY: getuid cannot fail.
        let root = unsafe { libc::getuid() } == 0;
        let operator = format!(
            "cli:{}",
            var("SUDO_USER")
                .filter(|u| root && is_account_name(u))
                .unwrap_or_else(os_user)
        );
        // no-color.org: set to a non-empty value.
        let no_color = get("NO_COLOR").is_some_and(|v| !v.is_empty());
        let log_format = match var("SSHMODE_LOG_FORMAT").as_deref() {
            None | Some("pretty") => LogFormat::Pretty,
            Some("json") => LogFormat::Json,
            Some(other) => {
                return Err(ConfigError::Invalid {
                    name: "SSHMODE_LOG_FORMAT",
                    reason: format!("expected `pretty` or `json`, got `{other}`"),
                });
            }
        };

        let secs = |name: &'static str, default: u64| -> Result<Duration, ConfigError> {
            let n: u64 = parse_or(name, var(name), default)?;
            if n == 0 {
                return Err(ConfigError::Invalid {
                    name,
                    reason: "must be greater than 0".into(),
                });
            }
            Ok(Duration::from_secs(n))
        };
        let count = |name: &'static str, default: usize| -> Result<usize, ConfigError> {
            let n: usize = parse_or(name, var(name), default)?;
            if n == 0 {
                return Err(ConfigError::Invalid {
                    name,
                    reason: "must be greater than 0".into(),
                });
            }
            Ok(n)
        };

        let days = |name: &'static str, default: usize| -> Result<u32, ConfigError> {
            Ok(count(name, default)?.min(100 * 365) as u32)
        };
        let retention = RetentionConfig {
            eventlog_days: days("SSHMODE_EVENTLOG_RETENTION_DAYS", 90)?,
            inbox_days: days("SSHMODE_INBOX_RETENTION_DAYS", 14)?,
            attachment_days: days("SSHMODE_ATTACHMENT_RETENTION_DAYS", 30)?,
            workspace_idle_days: days("SSHMODE_WORKSPACE_IDLE_DAYS", 90)?,
        };
        let dedup_retention = secs("SSHMODE_DEDUP_RETENTION_HOURS", 7 * 24)?.saturating_mul(3600);
        let inbox = InboxConfig {
            dedup_retention,
            handled_retention: dedup_retention.min(Duration::from_secs(
                u64::from(retention.inbox_days) * 24 * 3600,
            )),
            workers: count("SSHMODE_INBOX_WORKERS", 4)?,
            max_attempts: count("SSHMODE_INBOX_MAX_ATTEMPTS", 5)?.min(1000) as i32,
            lease: secs("SSHMODE_INBOX_LEASE_SECS", 300)?,
            workers_enabled: parse_or(
                "SSHMODE_WORKERS_ENABLED",
                var("SSHMODE_WORKERS_ENABLED"),
                true,
            )?,
        };
        let exec = ExecConfig {
            ssh_connect_timeout: secs("SSHMODE_SSH_CONNECT_TIMEOUT_SECS", 10)?,
            ssh_max_connections: count("SSHMODE_SSH_MAX_CONNECTIONS", 4)?,
            ssh_channels_per_connection: count("SSHMODE_SSH_CHANNELS_PER_CONNECTION", 8)?,
            ssh_queue_timeout: secs("SSHMODE_SSH_QUEUE_TIMEOUT_SECS", 30)?,
            ssh_idle: secs("SSHMODE_SSH_IDLE_SECS", 600)?,
            ssh_keepalive: secs("SSHMODE_SSH_KEEPALIVE_SECS", 30)?,
            command_timeout: secs("SSHMODE_COMMAND_TIMEOUT_SECS", 120)?,
            output_limit: count("SSHMODE_OUTPUT_LIMIT_BYTES", 64 * 1024)?,
            guard_extra_file: var("SSHMODE_GUARD_EXTRA_FILE").map(|p| normalize(&abs(p))),
            workspace_root: var("SSHMODE_WORKSPACE_ROOT")
                .map(|p| normalize(&abs(p)))
                .unwrap_or_else(|| data_dir.join("workspaces")),
            ssh_auth_sock: var("SSH_AUTH_SOCK").map(|p| normalize(&abs(p))),
            tool_env_allow: tool_env_allow(var("SSHMODE_TOOL_ENV_ALLOW"))?,
            local: LocalConfig::from_vars(get, cwd, &data_dir, &master_key_file)?,
        };
        let router = RouterTunables {
            request_timeout: secs("SSHMODE_LLM_TIMEOUT_SECS", 120)?,
            quota_cooldown: secs("SSHMODE_QUOTA_COOLDOWN_SECS", 5 * 3600)?,
            rate_cooldown: secs("SSHMODE_RATE_COOLDOWN_SECS", 30)?,
            probe_interval: secs("SSHMODE_PROBE_INTERVAL_SECS", 300)?,
        };

        let http = HttpConfig {
            header_timeout: secs("SSHMODE_HTTP_HEADER_TIMEOUT_SECS", 10)?,
            body_timeout: secs("SSHMODE_HTTP_BODY_TIMEOUT_SECS", 10)?,
            max_connections: count("SSHMODE_HTTP_MAX_CONNECTIONS", 1024)?,
        };
        let chat = ChatConfig {
            yolo_ttl: secs("SSHMODE_YOLO_TTL_HOURS", 12)?.saturating_mul(3600),
            attachment_max_bytes: {
                let mb = count("SSHMODE_ATTACHMENT_MAX_MB", 20)?;
                if mb > 100 {
                    return Err(ConfigError::Invalid {
                        name: "SSHMODE_ATTACHMENT_MAX_MB",
                        reason: "at most 100: Lark serves no larger resource".into(),
                    });
                }
                mb as u64 * 1024 * 1024
            },
            timezone: {
                let tz = var("SSHMODE_TIMEZONE").unwrap_or_else(|| "UTC".into());
                let tz = tz.trim().to_string();
                if tz.parse::<chrono_tz::Tz>().is_err() {
                    return Err(ConfigError::Invalid {
                        name: "SSHMODE_TIMEZONE",
                        reason: format!(
                            "`{tz}` is not a time zone; write one as `Area/City`, e.g. `Europe/Berlin`"
                        ),
                    });
                }
                tz
            },
            schedule_min: secs("SSHMODE_SCHEDULE_MIN_SECS", 60)?,
            schedule_max_per_chat: count("SSHMODE_SCHEDULE_MAX_PER_CHAT", 20)?,
        };
        let agent = AgentConfig {
            turn_budget: secs("SSHMODE_TURN_BUDGET_SECS", 900)?,
            turn_lease: secs("SSHMODE_TURN_LEASE_SECS", 30)?,
            turn_workers: count("SSHMODE_TURN_WORKERS", 16)?,
            max_iterations: count("SSHMODE_MAX_ITERATIONS", 40)?.min(10_000) as u32,
            tool_timeout: secs("SSHMODE_TOOL_TIMEOUT_SECS", 600)?,
            tool_result_limit: count("SSHMODE_TOOL_RESULT_LIMIT", 16 * 1024)?.max(256),
            context_tokens: count("SSHMODE_CONTEXT_TOKENS", 64_000)?.max(1000),
            approval_timeout: secs("SSHMODE_APPROVAL_TIMEOUT_SECS", 600)?
                .max(Duration::from_secs(1)),
            local_risky: parse_or(
                "SSHMODE_LOCAL_RISKY",
                var("SSHMODE_LOCAL_RISKY"),
                Risky::Ask,
            )?,
        };

        let log_file = match var("SSHMODE_LOG_FILE") {
            None => None,
            Some(p) => {
                let p = PathBuf::from(p);
                let path = if p.is_absolute() { p } else { data_dir.join(p) };
                let mb = count("SSHMODE_LOG_MAX_MB", 50)? as u64;
                Some(LogFileConfig {
                    path: normalize(&path),
                    max_bytes: mb.saturating_mul(1024 * 1024),
                    keep: count("SSHMODE_LOG_KEEP", 5)?.min(100),
                })
            }
        };
        let audit_retention_days =
            count("SSHMODE_AUDIT_RETENTION_DAYS", 180)?.min(100 * 365) as u32;

        let progress = ProgressConfig {
            enabled: parse_or("SSHMODE_PROGRESS", var("SSHMODE_PROGRESS"), true)?,
            interval: Duration::from_millis(count("SSHMODE_PROGRESS_INTERVAL_MS", 200)? as u64),
            patch_interval: Duration::from_millis(
                count("SSHMODE_PROGRESS_PATCH_INTERVAL_MS", 1500)? as u64,
            ),
            streaming_ttl: secs("SSHMODE_PROGRESS_STREAMING_TTL_SECS", 600)?,
            answer_wait: Duration::from_millis(
                count("SSHMODE_PROGRESS_ANSWER_WAIT_MS", 30_000)? as u64
            ),
        };

        Ok(Config {
            database_url: var("DATABASE_URL").map(SecretString::from),
            data_dir,
            listen,
            lark,
            lark_missing,
            lark_base_url,
            lark_mode: parse_or(
                "SSHMODE_LARK_MODE",
                var("SSHMODE_LARK_MODE"),
                LarkMode::Webhook,
            )?,
            admins,
            llm,
            router_file,
            model: var("SSHMODE_MODEL"),
            api_token: var("SSHMODE_API_TOKEN").map(SecretString::from),
            master_key_file,
            log_format,
            no_color,
            operator,
            log_filter: var("RUST_LOG").unwrap_or_else(|| "info".into()),
            log_filter_set: var("RUST_LOG").is_some(),
            log_file,
            audit_retention_days,
            retention,
            inbox,
            exec,
            chat,
            router,
            mcp: match var("SSHMODE_MCP_LISTEN") {
                None => None,
                Some(addr) => {
                    let listen: SocketAddr = parse_or("SSHMODE_MCP_LISTEN", Some(addr), listen)?;
                    let csv = |v: Option<String>| -> Vec<String> {
                        v.map(|l| {
                            l.split(',')
                                .map(|s| s.trim().to_string())
                                .filter(|s| !s.is_empty())
                                .collect()
                        })
                        .unwrap_or_default()
                    };
                    let mut allowed_hosts = csv(var("SSHMODE_MCP_ALLOWED_HOSTS"));
                    if allowed_hosts.is_empty() {
                        allowed_hosts = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
                        let ip = listen.ip();
                        if !ip.is_unspecified() && !ip.is_loopback() {
                            allowed_hosts.push(ip.to_string());
                        }
                    }
                    Some(McpConfig {
                        listen,
                        allowed_hosts,
                        allowed_origins: csv(var("SSHMODE_MCP_ALLOWED_ORIGINS")),
                        max_sessions: parse_or(
                            "SSHMODE_MCP_MAX_SESSIONS",
                            var("SSHMODE_MCP_MAX_SESSIONS"),
                            64,
                        )?,
                        max_calls: parse_or(
                            "SSHMODE_MCP_MAX_CALLS",
                            var("SSHMODE_MCP_MAX_CALLS"),
                            32,
                        )?,
                        max_sessions_per_token: parse_or(
                            "SSHMODE_MCP_MAX_SESSIONS_PER_TOKEN",
                            var("SSHMODE_MCP_MAX_SESSIONS_PER_TOKEN"),
                            16,
                        )?,
                        max_calls_per_token: parse_or(
                            "SSHMODE_MCP_MAX_CALLS_PER_TOKEN",
                            var("SSHMODE_MCP_MAX_CALLS_PER_TOKEN"),
                            8,
                        )?,
                        http: http.clone(),
                    })
                }
            },
            http,
            agent,
            progress,
        })
    }

    /// The Lark credentials, or an error naming the first missing variable.
    pub fn require_lark(&self) -> Result<&LarkConfig, ConfigError> {
        self.lark.as_ref().ok_or(ConfigError::Missing {
            name: self.lark_missing.unwrap_or("LARK_APP_ID"),
            why: " by `sshmode serve`",
        })
    }

    /// What `serve` needs: the Lark credentials, and — when it serves the webhook — an
    /// Encrypt Key unless unsigned events are explicitly allowed
    /// (`SSHMODE_ALLOW_UNSIGNED_EVENTS=true`). The long connection needs no key: nothing on it
    /// is signed or encrypted, and the connection is opened with the app's secret.
    pub fn require_serve(&self) -> Result<&LarkConfig, ConfigError> {
        let lark = self.require_lark()?;
        if self.lark_mode.webhook() && lark.encrypt_key.is_none() && !lark.allow_unsigned_events {
            return Err(ConfigError::UnsignedEvents);
        }
        Ok(lark)
    }

    /// Whether `open_id` is listed in `SSHMODE_ADMINS`.
    pub fn is_admin(&self, open_id: &str) -> bool {
        self.admins.iter().any(|a| a == open_id)
    }
}

/// A variable whose name is not a literal (the router file names it); blank counts as unset.
fn var_any(get: &dyn Fn(&str) -> Option<String>, name: &str) -> Option<String> {
    get(name).filter(|v| !v.trim().is_empty())
}

fn parse_or<T: FromStr>(
    name: &'static str,
    value: Option<String>,
    default: T,
) -> Result<T, ConfigError>
where
    T::Err: std::fmt::Display,
{
    match value {
        None => Ok(default),
        Some(v) => v.trim().parse().map_err(|e: T::Err| ConfigError::Invalid {
            name,
            reason: format!("`{v}`: {e}"),
        }),
    }
}

/// Why `.env` could not be parsed, without the offending line: dotenvy's message quotes it,
/// and it may well be the line holding a secret.
fn dotenv_parse_error(e: &dotenvy::Error) -> String {
    match e {
        dotenvy::Error::LineParse(line, at) => {
            // Named only when it looks like a variable name, never a bare value.
            let name = match line.split_once('=') {
                Some((n, _)) => n.trim().trim_start_matches("export ").trim(),
                None => "",
            };
            let name = if !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
            {
                format!(" (the line of {name})")
            } else {
                String::new()
            };
            format!(".env could not be parsed: a line is malformed at character {at}{name}")
        }
        other => format!(".env could not be parsed: {other}"),
    }
}

fn check_url(name: &'static str, url: &str) -> Result<(), ConfigError> {
    if url.starts_with("http://") || url.starts_with("https://") {
        Ok(())
    } else {
        Err(ConfigError::Invalid {
            name,
            reason: format!("`{url}` is not an http(s) URL"),
        })
    }
}

/// Removes `.` and `..` components lexically (the path need not exist yet).
fn normalize(path: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use secrecy::ExposeSecret;

    fn load(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_vars(&|k| map.get(k).cloned(), Path::new("/srv/app"))
    }

    #[test]
    fn the_operator_is_the_os_account_or_sudos_caller_under_root() {
        let me = load(&[]).unwrap().operator;
        assert!(me.starts_with("cli:") && me.len() > 4, "{me}");
        assert_eq!(me, format!("cli:{}", os_user()));
        let root = unsafe { libc::getuid() } == 0;
        let sudo = load(&[("SUDO_USER", "alice")]).unwrap().operator;
        assert_eq!(
            sudo,
            if root {
                "cli:alice".to_string()
            } else {
                me.clone()
            }
        );
        // Nothing but a login name ever reaches the audit actor.
        let odd = load(&[("SUDO_USER", "bob\nforged row")]).unwrap().operator;
        assert_eq!(odd, me);
    }

    #[test]
    fn the_log_file_is_in_the_data_dir_and_the_audit_retention_is_read() {
        let c = load(&[
            ("SSHMODE_DATA_DIR", "/var/lib/sshmode"),
            ("SSHMODE_LOG_FILE", "sshmode.log"),
            ("SSHMODE_LOG_MAX_MB", "2"),
            ("SSHMODE_AUDIT_RETENTION_DAYS", "30"),
        ])
        .unwrap();
        assert_eq!(
            c.log_file,
            Some(LogFileConfig {
                path: PathBuf::from("/var/lib/sshmode/sshmode.log"),
                max_bytes: 2 * 1024 * 1024,
                keep: 5,
            })
        );
        assert_eq!(c.audit_retention_days, 30);
        let c = load(&[
            ("SSHMODE_EVENTLOG_RETENTION_DAYS", "7"),
            ("SSHMODE_INBOX_RETENTION_DAYS", "2"),
            ("SSHMODE_ATTACHMENT_RETENTION_DAYS", "3"),
            ("SSHMODE_WORKSPACE_IDLE_DAYS", "4"),
        ])
        .unwrap();
        assert_eq!(
            c.retention,
            RetentionConfig {
                eventlog_days: 7,
                inbox_days: 2,
                attachment_days: 3,
                workspace_idle_days: 4
            }
        );
        assert_eq!(
            c.inbox.handled_retention,
            Duration::from_secs(2 * 24 * 3600)
        );
        assert!(load(&[("SSHMODE_INBOX_RETENTION_DAYS", "0")]).is_err());
        let e = load(&[("SSHMODE_AUDIT_RETENTION_DAYS", "0")]).unwrap_err();
        assert!(
            e.to_string().contains("SSHMODE_AUDIT_RETENTION_DAYS"),
            "{e}"
        );
    }

    #[test]
    fn the_tool_env_allow_list_holds_names_and_prefixes() {
        assert!(load(&[]).unwrap().exec.tool_env_allow.is_empty());
        let c = load(&[("SSHMODE_TOOL_ENV_ALLOW", " RUST_BACKTRACE, MYAPP_* ,,")]).unwrap();
        assert_eq!(c.exec.tool_env_allow, ["RUST_BACKTRACE", "MYAPP_*"]);
        for bad in ["*", "1X", "A-B", "A*B", "LD PRELOAD"] {
            let e = load(&[("SSHMODE_TOOL_ENV_ALLOW", bad)]).unwrap_err();
            assert!(
                e.to_string().contains("SSHMODE_TOOL_ENV_ALLOW"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn the_launcher_is_an_absolute_path_or_the_running_sshmode() {
        let c = load(&[("SSHMODE_LAUNCHER", "/usr/local/bin/sshmode")]).unwrap();
        assert_eq!(
            c.exec.local.launcher.as_deref(),
            Some(Path::new("/usr/local/bin/sshmode"))
        );
        let e = load(&[("SSHMODE_LAUNCHER", "bin/sshmode")]).unwrap_err();
        assert!(e.to_string().contains("SSHMODE_LAUNCHER"), "{e}");
        // This test binary is not `sshmode`: no launcher unless one is named.
        assert_eq!(load(&[]).unwrap().exec.local.launcher, None);
    }

    #[test]
    fn defaults_and_relative_paths() {
        let c = load(&[]).unwrap();
        assert_eq!(c.data_dir, PathBuf::from("/srv/app/data"));
        assert_eq!(c.master_key_file, PathBuf::from("/srv/app/data/master.key"));
        assert_eq!(c.listen, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(c.lark_base_url, "https://open.feishu.cn");
        assert!(c.lark.is_none() && c.database_url.is_none());
        assert!(matches!(c.llm, LlmConfig::None));
        assert_eq!(c.inbox.dedup_retention, Duration::from_secs(7 * 24 * 3600));
        assert_eq!(c.audit_retention_days, 180);
        assert_eq!(c.retention, RetentionConfig::default());
        assert_eq!(
            c.inbox.handled_retention,
            Duration::from_secs(7 * 24 * 3600),
            "de-duplication's week is shorter than the inbox's two"
        );
        assert_eq!(c.log_file, None);
        let c = load(&[("SSHMODE_DATA_DIR", "../state/./x")]).unwrap();
        assert_eq!(c.data_dir, PathBuf::from("/srv/state/x"));
    }

    #[test]
    fn the_mcp_endpoint_is_off_until_its_address_is_set() {
        assert!(load(&[]).unwrap().mcp.is_none());
        let m = load(&[("SSHMODE_MCP_LISTEN", "127.0.0.1:8090")])
            .unwrap()
            .mcp
            .unwrap();
        assert_eq!(m.listen, "127.0.0.1:8090".parse().unwrap());
        assert_eq!(m.allowed_hosts, ["localhost", "127.0.0.1", "::1"]);
        assert!(m.allowed_origins.is_empty());
        assert_eq!((m.max_sessions, m.max_calls), (64, 32));
        assert_eq!((m.max_sessions_per_token, m.max_calls_per_token), (16, 8));
        // A non-loopback address is a host clients may name; an explicit list replaces all.
        let m = load(&[("SSHMODE_MCP_LISTEN", "10.0.0.5:8090")])
            .unwrap()
            .mcp
            .unwrap();
        assert!(m.allowed_hosts.contains(&"10.0.0.5".to_string()));
        let m = load(&[
            ("SSHMODE_MCP_LISTEN", "0.0.0.0:8090"),
            (
                "SSHMODE_MCP_ALLOWED_HOSTS",
                "mcp.example.com, mcp.example.com:8090",
            ),
            ("SSHMODE_MCP_ALLOWED_ORIGINS", "https://app.example.com:443"),
        ])
        .unwrap()
        .mcp
        .unwrap();
        assert_eq!(m.allowed_hosts, ["mcp.example.com", "mcp.example.com:8090"]);
        assert_eq!(m.allowed_origins, ["https://app.example.com:443"]);
        let e = load(&[("SSHMODE_MCP_LISTEN", "nope")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("SSHMODE_MCP_LISTEN"), "{e}");
    }

    #[test]
    fn errors_name_the_variable() {
        // An incomplete LARK_* set loads (other commands need none of it); `serve` names the
        // missing variable.
        let c = load(&[("LARK_APP_ID", "cli_x")]).unwrap();
        let e = c.require_serve().unwrap_err().to_string();
        assert!(e.contains("LARK_APP_SECRET"), "{e}");
        let e = load(&[("SSHMODE_LISTEN", "nope")]).unwrap_err().to_string();
        assert!(e.contains("SSHMODE_LISTEN"), "{e}");
        let e = load(&[("LLM_MODEL", "m")]).unwrap_err().to_string();
        assert!(e.contains("LLM_BASE_URL"), "{e}");
        // NO_COLOR: any non-empty value (no-color.org).
        assert!(load(&[("NO_COLOR", "1")]).unwrap().no_color);
        assert!(!load(&[("NO_COLOR", "")]).unwrap().no_color);
        assert!(!load(&[]).unwrap().no_color);
        let e = load(&[("SSHMODE_LOG_FORMAT", "xml")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("SSHMODE_LOG_FORMAT"), "{e}");
        let e = load(&[("SSHMODE_INBOX_WORKERS", "0")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("SSHMODE_INBOX_WORKERS"), "{e}");
        assert!(
            load(&[])
                .unwrap()
                .require_lark()
                .unwrap_err()
                .to_string()
                .contains("LARK_APP_ID")
        );
    }

    /// `.env.example` copied unchanged: `migrate` and `target` load it; `serve` says what to
    /// fill in.
    #[test]
    fn the_example_env_file_loads_unchanged() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(".env.example");
        let mut map = HashMap::new();
        for item in dotenvy::from_path_iter(&path).expect(".env.example") {
            let (k, v) = item.expect("a well-formed line");
            map.insert(k, v);
        }
        let c = Config::from_vars(&|k| map.get(k).cloned(), Path::new("/srv/app"))
            .expect(".env.example loads");
        let e = c.require_serve().unwrap_err().to_string();
        assert!(e.contains("LARK_"), "{e}");
    }

    #[test]
    fn serve_requires_an_encrypt_key_or_the_explicit_opt_out() {
        let creds = [
            ("LARK_APP_ID", "cli_x"),
            ("LARK_APP_SECRET", "s"),
            ("LARK_VERIFICATION_TOKEN", "t"),
        ];
        let e = load(&creds)
            .unwrap()
            .require_serve()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("LARK_ENCRYPT_KEY")
                && e.contains("Encrypt Key")
                && e.contains("SSHMODE_ALLOW_UNSIGNED_EVENTS=true"),
            "{e}"
        );
        let mut with_key = creds.to_vec();
        with_key.push(("LARK_ENCRYPT_KEY", "k"));
        assert!(load(&with_key).unwrap().require_serve().is_ok());
        let mut opt_out = creds.to_vec();
        opt_out.push(("SSHMODE_ALLOW_UNSIGNED_EVENTS", "true"));
        let c = load(&opt_out).unwrap();
        assert!(c.require_serve().unwrap().allow_unsigned_events);
        // The long connection alone needs no key; with the webhook too, it does.
        let mut ws = creds.to_vec();
        ws.push(("SSHMODE_LARK_MODE", "websocket"));
        let c = load(&ws).unwrap();
        assert_eq!(c.lark_mode, LarkMode::Websocket);
        c.require_serve().unwrap();
        let mut both = creds.to_vec();
        both.push(("SSHMODE_LARK_MODE", "both"));
        assert!(load(&both).unwrap().require_serve().is_err());
        let mut bad = creds.to_vec();
        bad.push(("SSHMODE_LARK_MODE", "carrier-pigeon"));
        let e = load(&bad).unwrap_err().to_string();
        assert!(e.contains("SSHMODE_LARK_MODE"), "{e}");
        let mut bad = creds.to_vec();
        bad.push(("SSHMODE_ALLOW_UNSIGNED_EVENTS", "yes please"));
        let e = load(&bad).unwrap_err().to_string();
        assert!(e.contains("SSHMODE_ALLOW_UNSIGNED_EVENTS"), "{e}");
    }

    #[test]
    fn progress_settings_have_documented_defaults_and_name_the_variable() {
        let p = load(&[]).unwrap().progress;
        assert!(p.enabled);
        assert_eq!(p.interval, Duration::from_millis(200));
        assert_eq!(p.patch_interval, Duration::from_millis(1500));
        assert_eq!(p.streaming_ttl, Duration::from_secs(600));
        let p = load(&[
            ("SSHMODE_PROGRESS", "false"),
            ("SSHMODE_PROGRESS_STREAMING_TTL_SECS", "2"),
        ])
        .unwrap()
        .progress;
        assert!(!p.enabled);
        assert_eq!(p.streaming_ttl, Duration::from_secs(2));
        for (name, bad) in [
            ("SSHMODE_PROGRESS", "maybe"),
            ("SSHMODE_PROGRESS_INTERVAL_MS", "0"),
            ("SSHMODE_PROGRESS_STREAMING_TTL_SECS", "soon"),
        ] {
            let e = load(&[(name, bad)]).unwrap_err().to_string();
            assert!(e.contains(name), "{e}");
        }
    }

    #[test]
    fn agent_settings_have_documented_defaults_and_name_the_variable() {
        let a = load(&[]).unwrap().agent;
        assert_eq!(a.turn_budget, Duration::from_secs(900));
        assert_eq!(a.tool_result_limit, 16 * 1024);
        assert_eq!(a.turn_lease, Duration::from_secs(30));
        let a = load(&[
            ("SSHMODE_TURN_BUDGET_SECS", "60"),
            ("SSHMODE_TOOL_RESULT_LIMIT", "4096"),
            ("SSHMODE_CONTEXT_TOKENS", "8000"),
        ])
        .unwrap()
        .agent;
        assert_eq!(a.turn_budget, Duration::from_secs(60));
        assert_eq!(a.tool_result_limit, 4096);
        assert_eq!(a.context_tokens, 8000);
        let e = load(&[("SSHMODE_TURN_BUDGET_SECS", "0")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("SSHMODE_TURN_BUDGET_SECS"), "{e}");
    }

    #[test]
    fn a_malformed_env_line_is_not_quoted() {
        let e = dotenvy::Error::LineParse("LLM_API_KEY=sk-live-secret 'open".into(), 28);
        let msg = dotenv_parse_error(&e);
        assert!(!msg.contains("sk-live-secret"), "{msg}");
        assert!(msg.contains("LLM_API_KEY") && msg.contains("28"), "{msg}");
        let e = dotenvy::Error::LineParse("abcdefsecret0123 'x".into(), 3);
        assert!(!dotenv_parse_error(&e).contains("abcdefsecret0123"));
    }

    #[test]
    fn secrets_are_redacted_in_debug() {
        let c = load(&[
            ("LARK_APP_ID", "cli_x"),
            ("LARK_APP_SECRET", "app-secret-value"),
            ("LARK_VERIFICATION_TOKEN", "verif-token-value"),
            ("LARK_ENCRYPT_KEY", "encrypt-key-value"),
            ("LLM_BASE_URL", "http://127.0.0.1:1/v1"),
            ("LLM_MODEL", "m"),
            ("LLM_API_KEY", "sk-llm-key-value"),
            ("SSHMODE_API_TOKEN", "api-token-value"),
            ("DATABASE_URL", "postgres://u:dbpass-value@h/db"),
        ])
        .unwrap();
        let dbg = format!("{c:?}");
        for s in [
            "app-secret-value",
            "verif-token-value",
            "encrypt-key-value",
            "sk-llm-key-value",
            "api-token-value",
            "dbpass-value",
        ] {
            assert!(!dbg.contains(s), "{s} leaked in Debug");
        }
        assert_eq!(
            c.require_lark().unwrap().app_secret.expose_secret(),
            "app-secret-value"
        );
    }
}
