//! The execution layer: one [`Backend`] interface with a local and an SSH implementation,
//! the command guard and output truncation, and [`ops`], where the task tools' file, search,
//! terminal and code operations are written once over any backend.
//!
//! A backend offers a handful of primitives (run a script, read bytes, write bytes atomically,
//! the user's home); everything a tool needs is built from them in [`ops`], so local and remote
//! behave alike. Paths handed to a backend are absolute and already resolved *on that backend's
//! host* — `~` is the backend user's home (locally: the section's workspace), never the
//! service's.
//!
//! Never: knows chats, models or bindings; falls back from a remote backend to the local one.
//! [`Executors::backend`] returns the backend a place names or an error — there is no path
//! from an SSH failure to local execution.

pub mod guard;
pub mod local;
pub mod ops;
pub mod ssh;
pub mod truncate;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde::Serialize;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::ExecConfig;
use crate::metrics::Metrics;
use crate::vault::Vault;

/// How a command ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "value")]
pub enum Exit {
    /// Exited with this status.
    Code(i32),
    /// Killed by this signal (name without `SIG`, e.g. `KILL`).
    Signal(String),
    /// Ran past its timeout and was killed with its process group.
    TimedOut,
    /// Cancelled by the caller and killed with its process group.
    Cancelled,
}

impl Exit {
    /// Whether the command ran to completion with status 0.
    pub fn success(&self) -> bool {
        *self == Exit::Code(0)
    }
}

/// One script to run through the backend's shell.
#[derive(Debug, Clone)]
pub struct Command<'a> {
    /// A POSIX shell script (interpreted by `sh -c` locally, by the login shell over SSH).
    pub script: &'a str,
    /// Bytes written to the script's standard input, then end of file.
    pub stdin: Option<&'a [u8]>,
    /// Wall-clock limit; past it the process group is killed and the partial output returned.
    pub timeout: Duration,
    /// Head + tail bytes kept of stdout.
    pub stdout_limit: usize,
    /// Head + tail bytes kept of stderr.
    pub stderr_limit: usize,
}

/// What a command produced: bounded output and how it ended.
#[derive(Debug, Clone)]
pub struct Output {
    /// Stdout, head and tail kept with an omission marker between them when it overflowed.
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// Bytes dropped from the middle of stdout (0 when it fitted).
    pub stdout_omitted: u64,
    pub stderr_omitted: u64,
    pub exit: Exit,
    /// Set when a timed-out or cancelled command's process group could not be ended: says,
    /// in words, what may still be running. `None` when it was ended (or ran to its end).
    pub stop_note: Option<String>,
}

/// A file's bytes (or a range of them) and its full size.
#[derive(Debug, Clone)]
pub struct FileBytes {
    pub data: Vec<u8>,
    /// The file's size on disk, which may exceed `data.len()`.
    pub size: u64,
}

/// Errors of the execution layer. Messages are short and meant for the user or the model;
/// they never carry secrets.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The command guard refused the command; the message says why and what to do instead.
    #[error("{0}")]
    Refused(guard::Refusal),
    /// The target cannot be used now (unknown, not approved, unreachable, authentication).
    #[error("target `{alias}` is unavailable: {reason}")]
    Unavailable { alias: String, reason: String },
    /// The host presented a key other than the recorded one: refused.
    #[error(
        "host key of `{alias}` changed: expected {expected}, got {presented}; refusing to connect. If the change is legitimate, an admin checks the new key on the host and runs `sshmode target rekey {alias} --host-key SHA256:…`"
    )]
    HostKeyMismatch {
        alias: String,
        expected: String,
        presented: String,
    },
    /// Every channel of every allowed connection stayed busy for the queue timeout.
    #[error("target `{alias}` is busy: no free SSH channel within {waited:?}; try again shortly")]
    Busy { alias: String, waited: Duration },
    /// The section's local workspace is no longer a plain directory below the workspace root
    /// (swapped for a symlink, removed): refused, never followed.
    #[error("{0}")]
    Workspace(String),
    /// No such file or directory.
    #[error("{0}: no such file or directory")]
    NotFound(String),
    /// A file operation failed; the message names the path and the reason.
    #[error("{0}")]
    File(String),
    /// The request itself is wrong (bad range, unsupported language, …).
    #[error("{0}")]
    Invalid(String),
    /// The connection broke while the operation ran.
    #[error("target `{alias}`: connection lost: {reason}")]
    Connection { alias: String, reason: String },
    /// A local failure to start or watch a process.
    #[error("{0}")]
    Local(String),
}

/// The primitives every backend offers. Dyn-compatible: used as `Arc<dyn Backend>`.
#[async_trait]
pub trait Backend: Send + Sync {
    /// `local` or the target alias; for logs and cwd bookkeeping.
    fn name(&self) -> &str;

    /// Where its commands run, for the head of a tool result: `local`, or a target's alias,
    /// user and host as its registry entry gave them.
    fn location(&self) -> String {
        self.name().to_string()
    }

    /// Whether this backend is the local one (for messages only; no behaviour hangs on it).
    fn is_local(&self) -> bool;

    /// The backend user's home directory, on the backend's host.
    async fn home(&self) -> Result<String, ExecError>;

    /// Where a section's shell starts when it has no working directory yet.
    async fn initial_dir(&self, section: &str) -> Result<String, ExecError>;

    /// Runs `cmd`; on timeout or cancellation kills it with its children and returns the
    /// partial output with [`Exit::TimedOut`] / [`Exit::Cancelled`].
    async fn exec(&self, cmd: Command<'_>, cancel: &CancellationToken)
    -> Result<Output, ExecError>;

    /// Reads at most `len` bytes of the file at absolute `path` from `offset`.
    async fn read(&self, path: &str, offset: u64, len: u64) -> Result<FileBytes, ExecError>;

    /// Replaces the file at absolute `path` atomically (temporary file + rename), creating
    /// missing parent directories and keeping an existing file's mode.
    async fn write(&self, path: &str, data: &[u8]) -> Result<(), ExecError>;
}

/// Where a section's task tools run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    Local,
    /// An SSH target, by alias.
    Target(String),
}

impl Place {
    /// `local`, or the target's alias: how a backend is named in stored rows and the audit.
    pub fn name(&self) -> &str {
        match self {
            Place::Local => "local",
            Place::Target(alias) => alias,
        }
    }

    /// The target's alias; `None` for the local backend.
    pub fn target(&self) -> Option<&str> {
        match self {
            Place::Local => None,
            Place::Target(alias) => Some(alias),
        }
    }
}

/// Most per-(backend, section) working directories remembered; beyond it the oldest entry
/// is forgotten (that section's shell starts again at its initial directory).
const MAX_CWDS: usize = 10_000;

/// The execution layer as the rest of the app sees it: the local backend, the SSH pool, the
/// guard, and each section's working directory per backend. One per app.
pub struct Executors {
    /// Tunables (timeouts, limits, workspace root).
    config: ExecConfig,
    /// Local execution: workspaces, the sandbox, the cap on concurrent commands.
    local: Arc<local::LocalHost>,
    /// Every SSH connection of the app, keyed by target alias, shared by all sections.
    pub ssh: Arc<ssh::SshPool>,
    /// The command guard applied by [`ops`] to every shell command a tool runs.
    guard: Arc<guard::Guard>,
    /// Working directory per (backend name, section): a `cd` holds for the next command.
    cwds: Arc<CwdStore>,
    /// The app's metrics: commands by backend and outcome, SSH connects by outcome.
    metrics: Arc<Metrics>,
}

impl Executors {
    /// Builds the layer with metrics of its own (benchmarks, tools); the app uses
    /// [`Executors::with_metrics`].
    pub fn new(config: &ExecConfig, db: PgPool, vault: Arc<Vault>) -> anyhow::Result<Self> {
        Self::with_metrics(
            config,
            db,
            vault,
            Arc::new(Metrics::new()),
            TaskTracker::new(),
        )
    }

    /// Builds the layer, counting into `metrics`; the guard's extra patterns come from
    /// `config.guard_extra_file`. Background work (the remote kill of a dropped command) runs
    /// on `tasks`, the app's tracker, so shutdown waits for it.
    pub fn with_metrics(
        config: &ExecConfig,
        db: PgPool,
        vault: Arc<Vault>,
        metrics: Arc<Metrics>,
        tasks: TaskTracker,
    ) -> anyhow::Result<Self> {
        let guard = guard::Guard::from_file(config.guard_extra_file.as_deref())
            .map_err(|e| anyhow::anyhow!("command guard: {e}"))?;
        Ok(Executors {
            config: config.clone(),
            local: Arc::new(local::LocalHost::new(
                config.workspace_root.clone(),
                &config.local,
            )?),
            ssh: Arc::new(ssh::SshPool::new(
                config.clone(),
                db,
                vault,
                metrics.clone(),
                tasks,
            )),
            guard: Arc::new(guard),
            cwds: Arc::new(CwdStore::default()),
            metrics,
        })
    }

    /// What isolates local tools here (`separate-uid+pidns+landlock-v7`, …, `none`).
    pub fn local_level(&self) -> &local::sandbox::Level {
        self.local.level()
    }

    /// Logs the local isolation level, with a warning when it is weak or absent.
    pub fn log_local_level(&self) {
        self.local.log_level();
    }

    /// Warns when local tools may connect to the service user's ssh-agent socket while
    /// targets authenticate through an agent (a non-root service below Landlock ABI 9).
    pub async fn warn_agent_targets(&self, db: &PgPool) {
        if !self.local_level().unix_sockets_open() {
            return;
        }
        let agents: i64 =
            match sqlx::query_scalar("SELECT count(*) FROM targets WHERE auth_kind = 'agent'")
                .fetch_one(db)
                .await
            {
                Ok(n) => n,
                Err(e) => {
                    tracing::warn!(error = %e, "could not count the targets that use an agent");
                    return;
                }
            };
        if let Some(w) = self.local_level().agent_warning(agents) {
            tracing::warn!("{w}");
        }
    }

    /// The backend a place names for `section` (a local backend is confined to the section's
    /// workspace). For a target this checks that it exists and is approved; the connection
    /// itself is made (or reused) when the first operation runs. An error here or later is
    /// the caller's answer: nothing falls back to local.
    pub async fn backend(
        &self,
        section: &str,
        place: &Place,
    ) -> Result<Arc<dyn Backend>, ExecError> {
        match place {
            Place::Local => Ok(Arc::new(self.local.for_section(section))),
            Place::Target(alias) => Ok(self.ssh.backend(alias).await?),
        }
    }

    /// The tool operations of `section` over `backend`, with the guard, limits and the
    /// section's working directory on that backend.
    pub fn ops(&self, section: &str, backend: Arc<dyn Backend>) -> ops::Ops {
        ops::Ops::new(
            backend,
            section.to_string(),
            self.guard.clone(),
            self.cwds.clone(),
            ops::Limits::from_config(&self.config),
            self.metrics.clone(),
        )
    }

    /// The local operations of `section` working in `workspace` (its own directory or a
    /// shared one below the workspace root, as `/workspace set` chooses); the sandbox grants
    /// that directory, for reading only unless `writable`.
    pub fn local_ops_in(
        &self,
        section: &str,
        workspace: &std::path::Path,
        writable: bool,
    ) -> Result<ops::Ops, ExecError> {
        let backend = self.local.for_section_in(section, workspace, writable)?;
        Ok(self.ops(section, Arc::new(backend)))
    }

    /// Both together: `ops(section, backend(place)?)`.
    pub async fn ops_for(&self, section: &str, place: &Place) -> Result<ops::Ops, ExecError> {
        let backend = self.backend(section, place).await?;
        Ok(self.ops(section, backend))
    }

    /// The per-(backend, section) working directories, for callers that persist them.
    pub fn cwds(&self) -> &CwdStore {
        &self.cwds
    }

    /// Closes idle SSH connections until `shutdown`; spawn it on the app's task tracker.
    pub async fn run_reaper(self: Arc<Self>, shutdown: CancellationToken) {
        self.ssh.clone().run_reaper(shutdown).await;
    }
}

type CwdMap = HashMap<(String, String), (String, u64)>;

/// Working directories per (backend, section), bounded by [`MAX_CWDS`].
#[derive(Default)]
pub struct CwdStore {
    /// (backend name, section) → (directory, insertion tick for eviction), and the tick.
    inner: Mutex<(CwdMap, u64)>,
}

impl CwdStore {
    pub fn get(&self, backend: &str, section: &str) -> Option<String> {
        let guard = self.inner.lock().expect("cwd store lock");
        guard
            .0
            .get(&(backend.to_string(), section.to_string()))
            .map(|(d, _)| d.clone())
    }

    pub fn set(&self, backend: &str, section: &str, dir: String) {
        let mut guard = self.inner.lock().expect("cwd store lock");
        let (map, tick) = &mut *guard;
        *tick += 1;
        let now = *tick;
        map.insert((backend.to_string(), section.to_string()), (dir, now));
        if map.len() > MAX_CWDS
            && let Some(oldest) = map
                .iter()
                .min_by_key(|(_, (_, t))| *t)
                .map(|(k, _)| k.clone())
        {
            map.remove(&oldest);
        }
    }
}

pub use crate::shell::quote as shell_quote;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_the_shell() {
        for s in ["plain", "it's", "a b\nc", "$(rm x) `y` \"z\"", ""] {
            let out = std::process::Command::new("sh")
                .arg("-c")
                .arg(format!("printf %s {}", shell_quote(s)))
                .output()
                .unwrap();
            assert_eq!(String::from_utf8(out.stdout).unwrap(), s);
        }
    }

    #[test]
    fn cwd_store_is_bounded_and_keyed_by_backend_and_section() {
        let store = CwdStore::default();
        store.set("local", "s1", "/a".into());
        store.set("web", "s1", "/b".into());
        assert_eq!(store.get("local", "s1").as_deref(), Some("/a"));
        assert_eq!(store.get("web", "s1").as_deref(), Some("/b"));
        for i in 0..MAX_CWDS + 5 {
            store.set("local", &format!("x{i}"), "/c".into());
        }
        assert!(store.inner.lock().unwrap().0.len() <= MAX_CWDS);
        assert_eq!(store.get("local", "s1"), None, "oldest entry evicted");
    }
}
