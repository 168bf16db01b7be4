//! The local backend: scripts run on the service's own machine, each in its own session and
//! process group, starting in the section's workspace (`$SSHMODE_WORKSPACE_ROOT/sections/<section>`),
//! with a clean environment, as the tools account when the service runs as root, inside a
//! Landlock sandbox and under resource limits ([`sandbox`]). File operations open paths
//! beneath the section's workspace, its private tmp directory or (read-only) the system trees,
//! never by a path checked first and opened later ([`files`]). On timeout, cancellation or the
//! command's end the whole group is killed, so nothing it started outlives it. Under root both
//! go through the launch server ([`server`], [`launch`]): each command in a PID namespace of its
//! own (which ends with it, `setsid` processes included), each file operation as the tools
//! account.
//!
//! At every call the workspace and the tmp directory are opened afresh beneath their roots
//! without following any symlink ([`LocalBackend::open_dirs`]); that one pair of descriptors
//! is the sandbox's rule, the file tools' roots and the command's working directory, so a
//! directory a tool swapped for a link is refused (audited as a `workspace` refusal), never
//! followed. Only directories the service creates get an owner and mode, on their new
//! descriptor.
//!
//! Never: runs a local command or file operation when nothing isolates it and the operator did
//! not opt in; passes the service's environment; reads another section's workspace; waits
//! unboundedly for output after a kill (a process that left the group may hold the pipe).
//!
//! # In detail
//!
//! | path | owns | never |
//! |---|---|---|
//! | `exec/local/mod.rs` | `LocalHost` (workspace root, tmp root, sandbox, concurrency semaphore) and the per-section `LocalBackend`: spawn with a clean environment, `pre_exec`, pipes, group kill; file reads/writes on the blocking pool under a 30 s timeout | passing the service's environment |
//! | `exec/local/sandbox.rs` | `Sandbox::probe` (tools account, data-directory modes, Landlock and launcher probes → `Level` and what it leaves open), the per-command Landlock ruleset, rlimits, the allow-listed environment, `Prepared::command` (through the launcher, or the `pre_exec` hook that does it all) | allocating or locking after fork |
//! | `exec/local/launch.rs` | the launch server, `sshmode __sshmode-launch serve` (started once, empty environment): per request a clone into new PID and mount namespaces, a fresh `/proc` (`hidepid=2`, granted in the ruleset), the data directory and workspace root replaced by an empty tmpfs holding only the call's workspace and tmp, a small PID 1 that runs the command and passes `TERM` and its status on over the call's socket, the account/limits/Landlock steps, the file helper | running anything less isolated than asked; keeping a descriptor of the service or of another call open into a command; showing a command the data directory or another section |
//! | `exec/local/server.rs` | the service's side: starts (and restarts) the server, sends a request with its descriptors (`SCM_RIGHTS`), a `Call` to wait for or stop | falling back to running without the server |
//! | `exec/local/files.rs` | file reads and writes beneath a root descriptor with `openat2(RESOLVE_BENEATH \| RESOLVE_NO_MAGICLINKS)`; regular files only, opened non-blocking; DAC check for the tools account under root | opening by a path checked earlier |
//!
//! **Start-up.** `Executors::with_metrics` builds the `LocalHost`: under root it looks up (or
//! `useradd --system`s) `SSHMODE_LOCAL_USER`; it sets the data directory to 0711 and takes group
//! and other bits off everything in it but the workspace root and `tmp/` (and off the master key,
//! `.env`, router and guard files wherever they are), keeps the workspace root and `sections/`
//! the service's own (0711), then restricts a throwaway thread with a ruleset like a command's and reads back
//! the status the kernel gave; under root it runs the launcher's `probe` (namespaces only). The
//! result is the `Level` (`separate-uid+pidns+landlock-v7`, `separate-uid+landlock-v7` without a
//! working launcher, `landlock-v9`, `landlock-v7+open-unix-sockets`, `none`, …) and the list of
//! what it leaves open, logged by `App::build` and shown by `/readyz`. With
//! `none` and no `SSHMODE_LOCAL_UNSANDBOXED`, every local operation (commands, file tools) fails
//! with a message saying how to fix it.
//!
//! **A command.** In the parent: a slot of the semaphore (waiting at most the command's
//! timeout), the section's workspace and tmp opened beneath their roots with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` (missing ones created with `mkdirat` and
//! given to the tools account, 0700, through their new descriptor; an existing directory is never
//! re-owned; a link is refused as `ExecError::Workspace`), a Landlock ruleset built from scratch
//! on those descriptors (`landlock` crate, best effort up to ABI V9: read+execute on the
//! system trees, everything on the workspace and tmp, ioctl/read/write on a few devices,
//! signal and abstract-socket scoping, TCP connect ports if configured), the rlimits and the
//! identity. After fork the `pre_exec` hook only calls `setrlimit`, `setgroups`, `setgid`,
//! `setuid`, `prctl(PR_SET_NO_NEW_PRIVS)` and `landlock_restrict_self` on values prepared before
//! the fork, after `setsid()` (a session of its own: no controlling terminal) and `fchdir` to the
//! workspace's descriptor. A system tree that holds a protected path (e.g. a data directory under `/opt`) is
//! granted entry by entry around it, so a rule never covers the data directory.
//!
//! **The launcher** (root, level with `pidns`). No hook: the backend sends the ruleset,
//! workspace, tmp and stdio descriptors and the setup to the launch server, a single-threaded
//! re-exec started once that may fork and mount; it clones PID 1 of a new namespace per call. PID 1
//! mounts `/proc` afresh (`hidepid=2`: no process of another account, itself included) and adds a
//! rule for it (a Landlock rule on the old `/proc` does not cover a mount on top), replaces the
//! data directory and the workspace root by an empty tmpfs that holds only this call's workspace
//! and tmp directory at their usual paths (so `stat` and `readlink`, which Landlock does not
//! cover, find neither the master key nor another section), then forks the command, which
//! applies the steps above and execs the shell.
//! The backend stops a command through the call's socket (`TERM`, then closing it ends PID 1);
//! PID 1 dies with the server (`PR_SET_PDEATHSIG`), and the whole namespace with PID 1. File reads and writes run
//! `files::read`/`write` in a PID 1 of the server, as the tools account in the same sandbox
//! and namespaces. Details: `src/exec/local/launch.rs`.
//!
//! **Capabilities and `/proc`.** When the service is root the hook also empties the capability
//! bounding set, so nothing a command runs regains a capability. Landlock does not stop a
//! sandboxed process from reading its parent's `/proc/<pid>/environ`; with a tools account the
//! file permissions do, and without one the service makes itself undumpable
//! (`PR_SET_DUMPABLE 0`) at start-up, which puts its `/proc` entries behind `CAP_SYS_PTRACE` (so no
//! core dumps, and a debugger needs root).
//!
//! **Shared workspaces.** `Executors::local_ops_in(section, dir)` gives a section a backend whose
//! workspace is `dir` (below the workspace root, not the root itself, not `sections/`, not another
//! section's own, not one holding the data directory); the ruleset then grants that directory
//! instead of `sections/<section>`, and the launcher shows it in place of that.
//!
//! **Why both an account and Landlock.** Landlock below V9 does not cover connecting to a
//! pathname unix socket, and below V6 does not scope signals; an account of its own (root
//! service) closes both by permissions, and the cluster's scram password closes the socket for
//! a non-root service. The process-count limit is `RLIMIT_NPROC`, which counts per account: it is
//! only set when tools have their own. cgroup v2 `pids.max` is not used yet (this machine's
//! cgroups are v1); it would bound each command rather than the account.
//!
//! **File tools.** `files::read`/`write` pick the root a path lies beneath (the section's
//! workspace or tmp; for reads also `/usr`, `/etc`, `/opt`, `/bin`, `/sbin`, `/lib*`, never beneath
//! the data directory), use the section's own roots by the descriptors the backend opened for
//! the call (a system tree is opened with `O_PATH|O_NOFOLLOW`), and resolve the rest with
//! `openat2` beneath it. A read opens `O_NONBLOCK` and refuses anything but a regular file, so a
//! FIFO cannot pin a blocking thread; a write creates a temporary file in the parent
//! (`O_EXCL|O_NOFOLLOW`), `fchown`s it to the tools account, and `renameat`s it over the name —
//! a symlink at that name is replaced, never written through, and an existing file is replaced
//! only if the caller may write it (`faccessat`). Under root this runs in the launcher's helper, so
//! the kernel checks the tools account's rights; without it the service checks a file's own mode.

pub mod files;
pub mod launch;
mod pty;
pub mod sandbox;
pub mod server;

use std::ffi::OsStr;
use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::truncate::HeadTail;
use super::{Backend, Command, ExecError, Exit, FileBytes, Output};
use crate::config::LocalConfig;
use sandbox::{Level, Sandbox};
use server::LaunchServer;

/// Time between TERM and KILL of a timed-out process group.
const KILL_GRACE: Duration = Duration::from_secs(2);
/// How long output is still drained after the group was killed.
const DRAIN_AFTER_KILL: Duration = Duration::from_secs(2);
/// Longest a local file read or write may take (a slow or stuck file system).
const FILE_TIMEOUT: Duration = Duration::from_secs(30);

/// The machine's side of local execution, shared by every section: where workspaces live,
/// the sandbox, and the cap on concurrent commands. One per app.
pub struct LocalHost {
    /// Parent of `sections/<section>` (and of shared workspaces).
    workspace_root: PathBuf,
    /// Parent of each section's private temporary directory (`$SSHMODE_DATA_DIR/tmp`).
    tmp_root: PathBuf,
    /// Identity, Landlock and limits, as probed at start-up.
    sandbox: Sandbox,
    /// Local commands running at once (`SSHMODE_LOCAL_MAX_CONCURRENT`).
    slots: Semaphore,
}

impl LocalHost {
    /// Probes the isolation this machine offers and prepares the data directory. Blocking.
    pub fn new(workspace_root: PathBuf, config: &LocalConfig) -> anyhow::Result<Self> {
        use anyhow::Context;
        let tmp_root = config.data_dir.join("tmp");
        let sandbox = Sandbox::probe(config, &workspace_root, &tmp_root)?;
        // Compared with canonical paths (a workspace a section chooses is resolved), and a
        // command's namespace shows both at their canonical paths.
        let workspace_root = std::fs::canonicalize(&workspace_root).unwrap_or(workspace_root);
        let tmp_root = std::fs::canonicalize(&tmp_root).unwrap_or(tmp_root);
        // `sections/` is the service's; an existing one is used as it is (never re-moded), and
        // one that is a link is refused.
        let root = files::open_root(&workspace_root)
            .with_context(|| format!("cannot open {}", workspace_root.display()))?;
        files::ensure_dir(&root, "sections".as_ref(), 0o711, None).with_context(|| {
            format!(
                "{}/sections must be a directory (not a link)",
                workspace_root.display()
            )
        })?;
        Ok(LocalHost {
            workspace_root,
            tmp_root,
            sandbox,
            slots: Semaphore::new(config.max_concurrent),
        })
    }

    /// What is enforced on every local command (for the start-up log and `/readyz`).
    pub fn level(&self) -> &Level {
        self.sandbox.level()
    }

    /// Logs the isolation level (and warnings) once.
    pub fn log_level(&self) {
        self.sandbox.log();
    }

    /// The backend of one section: its workspace, its tmp.
    pub fn for_section(self: &Arc<Self>, section: &str) -> LocalBackend {
        let name = workspace_dir_name(section);
        LocalBackend {
            host: self.clone(),
            workspace: self.workspace_root.join("sections").join(&name),
            chosen: None,
            tmp: self.tmp_root.join(&name),
            name,
            workspace_writable: true,
        }
    }

    /// The section's private temporary directory.
    pub fn tmp_of(self: &Arc<Self>, section: &str) -> PathBuf {
        self.for_section(section).tmp
    }

    /// The backend of a section that works in `workspace`, a directory beneath the workspace
    /// root (its own, or a shared one); the sandbox then grants that directory, not the
    /// section's own, and only for reading unless `writable`.
    pub fn for_section_in(
        self: &Arc<Self>,
        section: &str,
        workspace: &Path,
        writable: bool,
    ) -> Result<LocalBackend, ExecError> {
        let beneath = workspace.is_absolute()
            && workspace.starts_with(&self.workspace_root)
            && workspace != self.workspace_root
            && workspace != self.workspace_root.join("sections")
            && workspace.components().all(|c| {
                matches!(
                    c,
                    std::path::Component::Normal(_) | std::path::Component::RootDir
                )
            });
        let mut backend = self.for_section(section);
        // Another section's own workspace is never shared, and no workspace holds what no tool
        // may see (the data directory, when it lies below the workspace root).
        let foreign = workspace.starts_with(self.workspace_root.join("sections"))
            && !workspace.starts_with(&backend.workspace);
        if !beneath || foreign || self.sandbox.holds_excluded(workspace) {
            return Err(ExecError::Invalid(format!(
                "{}: a local workspace must be a directory below {}, outside other sections' own and the data directory",
                workspace.display(),
                self.workspace_root.display()
            )));
        }
        let rel = workspace
            .strip_prefix(&self.workspace_root)
            .expect("checked beneath")
            .to_path_buf();
        backend.workspace = workspace.to_path_buf();
        backend.chosen = Some(rel);
        backend.workspace_writable = writable;
        Ok(backend)
    }

    /// The shell scripts run under: bash where present (as on most SSH targets), else sh.
    fn shell() -> &'static str {
        if Path::new("/bin/bash").exists() {
            "/bin/bash"
        } else {
            "/bin/sh"
        }
    }
}

/// One section's local backend: commands and files confined to its workspace and tmp.
pub struct LocalBackend {
    host: Arc<LocalHost>,
    /// The section's workspace: `HOME`, the initial directory, writable. Shown, never
    /// opened by this path: see [`LocalBackend::open_dirs`].
    workspace: PathBuf,
    /// A chosen workspace, relative to the workspace root (`None`: the section's own,
    /// `sections/<name>`). Either is created on first use when missing.
    chosen: Option<PathBuf>,
    /// The section's private temporary directory (`TMPDIR`), writable.
    tmp: PathBuf,
    /// The section as a directory name (of its own workspace and of its tmp).
    name: String,
    /// False for a `read` workspace: commands and file tools may only read it.
    workspace_writable: bool,
}

impl LocalBackend {
    /// Refuses when nothing isolates local tools; opens (creating what is missing) the
    /// workspace and the tmp directory beneath their roots, following no symlink. A workspace
    /// reached through a link or a non-directory is refused with [`ExecError::Workspace`].
    fn open_dirs(&self) -> Result<Dirs, ExecError> {
        let host = &self.host;
        let sandbox = &host.sandbox;
        sandbox
            .check_allowed()
            .map_err(|e| ExecError::Local(e.to_string()))?;
        let identity = sandbox.identity();
        let local = |what: &Path, e: std::io::Error| {
            ExecError::Local(format!("cannot prepare {}: {e}", what.display()))
        };
        let root =
            files::open_root(&host.workspace_root).map_err(|e| local(&host.workspace_root, e))?;
        // Each step beneath the root: opened without following links, or created (the last
        // for the tools account, 0700; those above it the service's, 0755).
        let rel = self.relative();
        let mut workspace = root;
        let steps: Vec<_> = rel.components().collect();
        for (i, step) in steps.iter().enumerate() {
            let std::path::Component::Normal(name) = step else {
                return Err(self.unsafe_workspace(std::io::Error::from_raw_os_error(libc::EXDEV)));
            };
            let last = i + 1 == steps.len();
            let (mode, owner) = if last {
                (0o700, identity)
            } else {
                (0o755, None)
            };
            workspace = files::ensure_dir(&workspace, name, mode, owner)
                .map_err(|e| self.unsafe_workspace(e))?;
        }
        let tmp_root = files::open_root(&host.tmp_root).map_err(|e| local(&host.tmp_root, e))?;
        let tmp = files::ensure_dir(&tmp_root, self.name.as_ref(), 0o700, identity)
            .map_err(|e| local(&self.tmp, e))?;
        Ok(Dirs {
            workspace: Arc::new(workspace),
            tmp: Arc::new(tmp),
        })
    }

    /// The sandbox of one call on its directories, shown at the workspace's and tmp's paths.
    fn prepare(&self, dirs: &Dirs) -> Result<sandbox::Prepared, ExecError> {
        self.host
            .sandbox
            .prepare(
                sandbox::CallDirs {
                    workspace: &dirs.workspace,
                    workspace_path: &self.workspace,
                    tmp: &dirs.tmp,
                    tmp_path: &self.tmp,
                },
                self.workspace_writable,
            )
            .map_err(|e| ExecError::Local(e.to_string()))
    }

    /// The workspace relative to the workspace root.
    fn relative(&self) -> PathBuf {
        match &self.chosen {
            Some(rel) => rel.clone(),
            None => Path::new("sections").join(&self.name),
        }
    }

    fn unsafe_workspace(&self, e: std::io::Error) -> ExecError {
        let why = match e.raw_os_error() {
            Some(libc::ELOOP) | Some(libc::EXDEV) => {
                "it is reached through a symlink, which the service never follows".to_string()
            }
            Some(libc::ENOTDIR) => "it is no longer a directory".to_string(),
            _ => e.to_string(),
        };
        ExecError::Workspace(format!(
            "the workspace {} cannot be used: {why}; choose another with /workspace set",
            self.workspace.display()
        ))
    }

    /// The roots a file tool may write beneath, then those it may only read beneath.
    fn file_roots(&self, dirs: &Dirs) -> files::Roots {
        let (writable, mut readable) = if self.workspace_writable {
            (vec![self.workspace.clone(), self.tmp.clone()], Vec::new())
        } else {
            (vec![self.tmp.clone()], vec![self.workspace.clone()])
        };
        readable.extend(files::system_read_roots());
        files::Roots {
            writable,
            readable,
            excluded: self.host.sandbox.excluded().to_vec(),
            identity: self.host.sandbox.identity().cloned(),
            pinned: vec![
                (self.workspace.clone(), dirs.workspace.clone()),
                (self.tmp.clone(), dirs.tmp.clone()),
            ],
        }
    }
}

/// The two directories of one call, opened safely: everything of the call uses these.
struct Dirs {
    workspace: Arc<OwnedFd>,
    tmp: Arc<OwnedFd>,
}

/// A section id as a single safe directory name, one name per section (the mapping is
/// injective: two sections never share a workspace). An id of `A-Z a-z 0-9 _ -` that does not
/// start with `-` is its own name (every Lark chat and thread id); any other is `%` and the id
/// with each byte outside that set as `%XX` (`mcp:a.b` → `%mcp%3Aa%2Eb`, never the name of
/// `mcp:a_b`); a name that would be longer than [`MAX_DIR_NAME`] is `%h` and the id's SHA-256.
/// No plain name holds a `%`, an escaped one holds two or more (or is `%` alone: the empty id),
/// and a hashed one exactly one, followed by 65 characters: the three forms never meet.
pub fn workspace_dir_name(section: &str) -> String {
    let plain = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b'-';
    let name = if !section.is_empty() && !section.starts_with('-') && section.bytes().all(plain) {
        section.to_string()
    } else {
        let mut s = String::from("%");
        for b in section.bytes() {
            if plain(b) && !(s.len() == 1 && b == b'-') {
                s.push(b as char);
            } else {
                s.push_str(&format!("%{b:02X}"));
            }
        }
        s
    };
    if name.len() <= MAX_DIR_NAME {
        name
    } else {
        use sha2::Digest;
        format!(
            "%h{}",
            hex::encode(sha2::Sha256::digest(section.as_bytes()))
        )
    }
}

/// The longest workspace directory name (file systems take 255 bytes).
pub const MAX_DIR_NAME: usize = 200;

#[async_trait]
impl Backend for LocalBackend {
    fn name(&self) -> &str {
        "local"
    }

    fn is_local(&self) -> bool {
        true
    }

    async fn home(&self) -> Result<String, ExecError> {
        Ok(self.workspace.display().to_string())
    }

    async fn initial_dir(&self, _section: &str) -> Result<String, ExecError> {
        self.open_dirs()?;
        Ok(self.workspace.display().to_string())
    }

    async fn exec(
        &self,
        cmd: Command<'_>,
        cancel: &CancellationToken,
    ) -> Result<Output, ExecError> {
        let dirs = self.open_dirs()?;
        let sandbox = &self.host.sandbox;
        // A bounded wait for a slot: the command's own timeout.
        let _slot = tokio::select! {
            permit = self.host.slots.acquire() => permit.map_err(|_| ExecError::Local("local execution is shut down".into()))?,
            _ = tokio::time::sleep(cmd.timeout) => return Err(ExecError::Local(
                "too many local commands are running; try again shortly".into())),
            _ = cancel.cancelled() => return Ok(Output {
                stdout: Vec::new(), stderr: Vec::new(), stdout_omitted: 0, stderr_omitted: 0, stop_note: None,
                exit: Exit::Cancelled,
            }),
        };
        let prepared = self.prepare(&dirs)?;
        let shell = LocalHost::shell();
        if let Some(server) = sandbox.launcher() {
            return self
                .exec_launched(server, &prepared, &cmd, cancel, shell)
                .await;
        }
        let mut command = prepared.command(shell, &[OsStr::new("-c"), OsStr::new(cmd.script)]);
        command
            .env_clear()
            .envs(sandbox.environment(&self.workspace, &self.tmp, shell))
            .stdin(if cmd.stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let spawned = command.spawn();
        drop(prepared);
        let mut child =
            spawned.map_err(|e| ExecError::Local(format!("cannot start a shell: {e}")))?;
        let pgid = child.id().map(|p| p as i32);
        // If the caller drops this future instead of cancelling, the group dies with it.
        let mut group = GroupGuard(pgid);

        let stdin_task = match (cmd.stdin, child.stdin.take()) {
            (Some(data), Some(mut pipe)) => {
                let data = data.to_vec();
                Some(tokio::spawn(async move {
                    // A script that does not read its input closes the pipe: not an error.
                    let _ = pipe.write_all(&data).await;
                    let _ = pipe.shutdown().await;
                }))
            }
            _ => None,
        };
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr = child.stderr.take().expect("piped stderr");
        let mut drains = Drains::start(stdout, stderr, &cmd);

        let ended = tokio::select! {
            status = child.wait() => Ok(status),
            _ = tokio::time::sleep(cmd.timeout) => Err(Exit::TimedOut),
            _ = cancel.cancelled() => Err(Exit::Cancelled),
        };
        let exit = match ended {
            Ok(status) => {
                let status =
                    status.map_err(|e| ExecError::Local(format!("waiting for the shell: {e}")))?;
                // The command ended: what it left running in its group goes with it (and lets
                // go of the pipes at once).
                if let Some(pgid) = pgid {
                    // SAFETY: signalling a process group id we created; no memory involved.
                    unsafe { libc::killpg(pgid, libc::SIGKILL) };
                }
                exit_of(status)
            }
            Err(why) => {
                if let Some(pgid) = pgid {
                    kill_group(pgid, &mut child).await;
                }
                why
            }
        };
        // A process that left the group (setsid) may still hold the pipes: bounded wait.
        if !drains.finished().await {
            if let Some(pgid) = pgid {
                // SAFETY: signalling a process group id we created; no memory involved.
                unsafe { libc::killpg(pgid, libc::SIGKILL) };
            }
            // A process that left the group may hold a pipe open for ever: stop reading
            // (keeping what was read) rather than leave the readers behind.
            drains.stop();
        }
        if let Some(t) = stdin_task {
            t.abort();
        }
        // The command finished: nothing it started in its group outlives it.
        if let Some(pgid) = pgid {
            // SAFETY: signalling a process group id we created; no memory involved.
            unsafe { libc::killpg(pgid, libc::SIGKILL) };
        }
        group.0 = None;
        let (stdout, stdout_omitted) = take(&drains.out, cmd.stdout_limit);
        let (stderr, stderr_omitted) = take(&drains.err, cmd.stderr_limit);
        Ok(Output {
            stdout,
            stderr,
            stdout_omitted,
            stderr_omitted,
            stop_note: None,
            exit,
        })
    }

    async fn read(&self, path: &str, offset: u64, len: u64) -> Result<FileBytes, ExecError> {
        let dirs = self.open_dirs()?;
        if self.host.sandbox.launcher().is_some() {
            let out = self
                .file_helper(&dirs, "read", path, offset, len, None)
                .await?;
            if out.len() < 8 {
                return Err(ExecError::Local(format!(
                    "{path}: the file helper answered too little"
                )));
            }
            let (size, data) = out.split_at(8);
            return Ok(FileBytes {
                data: data.to_vec(),
                size: u64::from_be_bytes(size.try_into().expect("8 bytes")),
            });
        }
        let roots = self.file_roots(&dirs);
        let path = path.to_string();
        blocking_file_op(&path.clone(), move || {
            files::read(&roots, &path, offset, len)
        })
        .await
    }

    async fn write(&self, path: &str, data: &[u8]) -> Result<(), ExecError> {
        let dirs = self.open_dirs()?;
        if self.host.sandbox.launcher().is_some() {
            self.file_helper(&dirs, "write", path, 0, 0, Some(data))
                .await?;
            return Ok(());
        }
        let roots = self.file_roots(&dirs);
        let path = path.to_string();
        let data = data.to_vec();
        blocking_file_op(&path.clone(), move || files::write(&roots, &path, &data)).await
    }
}

impl LocalBackend {
    /// One command through the launch server, in a PID namespace of its own: the same pipes,
    /// limits and bounds as the direct spawn. On timeout or cancellation PID 1 passes `TERM` to
    /// the command's group, and after [`KILL_GRACE`] the call is closed, which ends the whole
    /// namespace; dropping this future closes it too.
    async fn exec_launched(
        &self,
        server: &LaunchServer,
        prepared: &sandbox::Prepared,
        cmd: &Command<'_>,
        cancel: &CancellationToken,
        shell: &str,
    ) -> Result<Output, ExecError> {
        let CallStdio {
            stdin_r,
            stdin_w,
            stdout_r,
            stdout_w,
            stderr_r,
            stderr_w,
        } = CallStdio::open(cmd.stdin.is_some(), "a shell")?;
        let local = |e: std::io::Error| ExecError::Local(format!("cannot start a shell: {e}"));
        let request = launch::Request {
            setup: prepared.launch_setup(),
            job: launch::Job::Run {
                argv: vec![shell.into(), "-c".into(), cmd.script.into()],
                env: self
                    .host
                    .sandbox
                    .environment(&self.workspace, &self.tmp, shell),
                tty: false,
            },
        };
        let call = {
            let mut fds = vec![stdin_r.as_fd(), stdout_w.as_fd(), stderr_w.as_fd()];
            fds.extend(prepared.launch_fds());
            server.call(&request, &fds).await
        }
        .map_err(|e| ExecError::Local(format!("the command was not started: {e}")))?;
        // Only the command holds these ends now: its output ends when its processes do.
        drop((stdin_r, stdout_w, stderr_w));
        let stdin_task = match (cmd.stdin, stdin_w) {
            (Some(data), Some(w)) => {
                let mut pipe = tokio::net::unix::pipe::Sender::from_owned_fd(w).map_err(local)?;
                let data = data.to_vec();
                Some(tokio::spawn(async move {
                    // A script that does not read its input closes the pipe: not an error.
                    let _ = pipe.write_all(&data).await;
                    let _ = pipe.shutdown().await;
                }))
            }
            _ => None,
        };
        let stdout = tokio::net::unix::pipe::Receiver::from_owned_fd(stdout_r).map_err(local)?;
        let stderr = tokio::net::unix::pipe::Receiver::from_owned_fd(stderr_r).map_err(local)?;
        let mut drains = Drains::start(stdout, stderr, cmd);
        let ended = tokio::select! {
            reply = call.wait() => Ok(reply),
            _ = tokio::time::sleep(cmd.timeout) => Err(Exit::TimedOut),
            _ = cancel.cancelled() => Err(Exit::Cancelled),
        };
        let reply = match ended {
            Ok(reply) => Ok(reply),
            Err(why) => {
                call.terminate();
                let _ = tokio::time::timeout(KILL_GRACE, call.wait()).await;
                Err(why)
            }
        };
        // The namespace ends with the call (if it has not already).
        drop(call);
        if !drains.finished().await {
            drains.stop();
        }
        if let Some(t) = stdin_task {
            t.abort();
        }
        let exit = match reply {
            Err(why) => why,
            Ok(server::Reply::Status(status)) => {
                use std::os::unix::process::ExitStatusExt;
                exit_of(std::process::ExitStatus::from_raw(status))
            }
            Ok(server::Reply::Refused(why)) => {
                // The command could not be isolated and therefore never ran.
                return Err(ExecError::Local(format!(
                    "the command was not started: {}",
                    why.trim()
                )));
            }
            Ok(server::Reply::Gone) => {
                return Err(ExecError::Local(
                    "the local launcher was stopped (killed?) while the command ran; the command \
                     was ended with it"
                        .into(),
                ));
            }
        };
        let (stdout, stdout_omitted) = take(&drains.out, cmd.stdout_limit);
        let (stderr, stderr_omitted) = take(&drains.err, cmd.stderr_limit);
        Ok(Output {
            stdout,
            stderr,
            stdout_omitted,
            stderr_omitted,
            stop_note: None,
            exit,
        })
    }

    /// One file operation through the launch server, as the tools account under this call's
    /// sandbox: the kernel decides what it may read and write. Bounded by [`FILE_TIMEOUT`];
    /// the answer by `len` (plus its 8-byte size), its error by 64 KiB.
    async fn file_helper(
        &self,
        dirs: &Dirs,
        op: &str,
        path: &str,
        offset: u64,
        len: u64,
        data: Option<&[u8]>,
    ) -> Result<Vec<u8>, ExecError> {
        let server = self
            .host
            .sandbox
            .launcher()
            .ok_or_else(|| ExecError::Local("no launcher for the file helper".into()))?;
        let roots = self.file_roots(dirs);
        let request = launch::Request {
            setup: launch::Setup::default(),
            job: launch::Job::File(launch::FileRequest {
                op: op.to_string(),
                path: path.to_string(),
                offset,
                len,
                writable: roots.writable,
                readable: roots.readable,
                excluded: roots.excluded,
                workspace: self.workspace.clone(),
                tmp: self.tmp.clone(),
            }),
        };
        let prepared = self.prepare(dirs)?;
        let request = launch::Request {
            setup: prepared.launch_setup(),
            ..request
        };
        let CallStdio {
            stdin_r,
            stdin_w,
            stdout_r,
            stdout_w,
            stderr_r,
            stderr_w,
        } = CallStdio::open(data.is_some(), "the file helper")?;
        let local =
            |e: std::io::Error| ExecError::Local(format!("cannot start the file helper: {e}"));
        let call = {
            let mut fds = vec![stdin_r.as_fd(), stdout_w.as_fd(), stderr_w.as_fd()];
            fds.extend(prepared.launch_fds());
            server.call(&request, &fds).await
        }
        .map_err(|e| ExecError::Local(format!("{path}: the file helper was not started: {e}")))?;
        drop((stdin_r, stdout_w, stderr_w, prepared));
        let stdin = match stdin_w {
            Some(w) => Some(tokio::net::unix::pipe::Sender::from_owned_fd(w).map_err(local)?),
            None => None,
        };
        let stdout = tokio::net::unix::pipe::Receiver::from_owned_fd(stdout_r).map_err(local)?;
        let stderr = tokio::net::unix::pipe::Receiver::from_owned_fd(stderr_r).map_err(local)?;
        let data = data.map(<[u8]>::to_vec);
        let work = async {
            let feed = async {
                if let (Some(mut pipe), Some(data)) = (stdin, data) {
                    // A helper that failed before reading closes the pipe: its error says why.
                    let _ = pipe.write_all(&data).await;
                    let _ = pipe.shutdown().await;
                }
            };
            let mut out = Vec::new();
            let mut err = Vec::new();
            let mut stdout = stdout.take(len.saturating_add(8));
            let mut stderr = stderr.take(64 * 1024);
            let read_out = stdout.read_to_end(&mut out);
            let read_err = stderr.read_to_end(&mut err);
            let (_, o, e, reply) = tokio::join!(feed, read_out, read_err, call.wait());
            o.and(e)
                .map_err(|e| ExecError::Local(format!("{path}: reading the file helper: {e}")))?;
            Ok::<_, ExecError>((reply, out, err))
        };
        let (reply, out, err) = match tokio::time::timeout(FILE_TIMEOUT, work).await {
            Ok(r) => r?,
            Err(_) => {
                return Err(ExecError::File(format!(
                    "{path}: the file operation did not finish within {FILE_TIMEOUT:?}"
                )));
            }
        };
        match reply {
            server::Reply::Status(s) if libc::WIFEXITED(s) && libc::WEXITSTATUS(s) == 0 => Ok(out),
            server::Reply::Status(s) if libc::WIFEXITED(s) && libc::WEXITSTATUS(s) == 1 => {
                Err(launch::decode_error(&err))
            }
            server::Reply::Refused(why) => Err(ExecError::Local(format!(
                "{path}: the file helper was not started: {}",
                why.trim()
            ))),
            other => Err(ExecError::Local(format!(
                "{path}: the file helper failed ({other:?}): {}",
                String::from_utf8_lossy(&err).trim()
            ))),
        }
    }
}

/// A pipe, both ends closed on exec: `(read, write)`.
/// A launched call's standard descriptors: its ends and ours.
struct CallStdio {
    stdin_r: OwnedFd,
    /// Ours, when the call reads input; else its stdin is `/dev/null`.
    stdin_w: Option<OwnedFd>,
    stdout_r: OwnedFd,
    stdout_w: OwnedFd,
    stderr_r: OwnedFd,
    stderr_w: OwnedFd,
}

impl CallStdio {
    fn open(input: bool, what: &str) -> Result<CallStdio, ExecError> {
        let local = |e: std::io::Error| ExecError::Local(format!("cannot start {what}: {e}"));
        let (stdin_r, stdin_w) = if input {
            let (r, w) = pipe().map_err(local)?;
            (r, Some(w))
        } else {
            (
                OwnedFd::from(std::fs::File::open("/dev/null").map_err(local)?),
                None,
            )
        };
        let (stdout_r, stdout_w) = pipe().map_err(local)?;
        let (stderr_r, stderr_w) = pipe().map_err(local)?;
        Ok(CallStdio {
            stdin_r,
            stdin_w,
            stdout_r,
            stdout_w,
            stderr_r,
            stderr_w,
        })
    }
}

fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: a valid out-array of two.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fresh descriptors we own.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Runs a file operation on the blocking pool, bounded by [`FILE_TIMEOUT`]: a stuck file
/// system costs the caller at most that long.
async fn blocking_file_op<T: Send + 'static>(
    path: &str,
    op: impl FnOnce() -> Result<T, ExecError> + Send + 'static,
) -> Result<T, ExecError> {
    match tokio::time::timeout(FILE_TIMEOUT, tokio::task::spawn_blocking(op)).await {
        Ok(joined) => joined.map_err(|e| ExecError::Local(format!("file task failed: {e}")))?,
        Err(_) => Err(ExecError::File(format!(
            "{path}: the file operation did not finish within {FILE_TIMEOUT:?}"
        ))),
    }
}

/// A command's two output readers. What they read is shared with them, so it survives if
/// they must be stopped.
struct Drains {
    out: Arc<Mutex<HeadTail>>,
    err: Arc<Mutex<HeadTail>>,
    out_task: tokio::task::JoinHandle<()>,
    err_task: tokio::task::JoinHandle<()>,
}

impl Drains {
    fn start<O, E>(stdout: O, stderr: E, cmd: &Command<'_>) -> Drains
    where
        O: AsyncRead + Unpin + Send + 'static,
        E: AsyncRead + Unpin + Send + 'static,
    {
        let out = Arc::new(Mutex::new(
            HeadTail::new(cmd.stdout_limit).observed(cmd.live.clone()),
        ));
        let err = Arc::new(Mutex::new(
            HeadTail::new(cmd.stderr_limit).observed(cmd.live.clone()),
        ));
        Drains {
            out_task: tokio::spawn(drain(stdout, out.clone())),
            err_task: tokio::spawn(drain(stderr, err.clone())),
            out,
            err,
        }
    }

    /// Waits, at most [`DRAIN_AFTER_KILL`], for both outputs to end; false if they did not.
    async fn finished(&mut self) -> bool {
        let both = async { ((&mut self.out_task).await, (&mut self.err_task).await) };
        tokio::time::timeout(DRAIN_AFTER_KILL, both).await.is_ok()
    }

    /// Stops reading, keeping what was read.
    fn stop(&self) {
        self.out_task.abort();
        self.err_task.abort();
    }
}

async fn drain<R: AsyncRead + Unpin>(mut r: R, acc: Arc<Mutex<HeadTail>>) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => acc.lock().expect("output lock").push(&buf[..n]),
        }
    }
}

/// What a reader collected, and how many bytes it left out.
fn take(acc: &Mutex<HeadTail>, limit: usize) -> (Vec<u8>, u64) {
    let acc = std::mem::replace(&mut *acc.lock().expect("output lock"), HeadTail::new(limit));
    let omitted = acc.omitted();
    (acc.into_bytes(), omitted)
}

/// Kills a process group when dropped while still armed.
struct GroupGuard(Option<i32>);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(pgid) = self.0 {
            // SAFETY: signalling a process group id we created; no memory involved.
            unsafe { libc::killpg(pgid, libc::SIGKILL) };
        }
    }
}

/// TERM to the group, KILL after a grace period, then reap the shell.
async fn kill_group(pgid: i32, child: &mut tokio::process::Child) {
    // SAFETY: signalling a process group id we created; no memory involved.
    unsafe { libc::killpg(pgid, libc::SIGTERM) };
    if tokio::time::timeout(KILL_GRACE, child.wait())
        .await
        .is_err()
    {
        // SAFETY: as above.
        unsafe { libc::killpg(pgid, libc::SIGKILL) };
        let _ = child.wait().await;
    } else {
        // The shell is gone; make sure nothing it started survives in its group.
        // SAFETY: as above.
        unsafe { libc::killpg(pgid, libc::SIGKILL) };
    }
}

fn exit_of(status: std::process::ExitStatus) -> Exit {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => Exit::Code(c),
        (None, Some(s)) => Exit::Signal(signal_name(s)),
        (None, None) => Exit::Code(-1),
    }
}

/// `SIGTERM` → `TERM`, as SSH names signals.
pub fn signal_name(sig: i32) -> String {
    match sig {
        libc::SIGHUP => "HUP",
        libc::SIGINT => "INT",
        libc::SIGQUIT => "QUIT",
        libc::SIGILL => "ILL",
        libc::SIGABRT => "ABRT",
        libc::SIGFPE => "FPE",
        libc::SIGKILL => "KILL",
        libc::SIGSEGV => "SEGV",
        libc::SIGPIPE => "PIPE",
        libc::SIGALRM => "ALRM",
        libc::SIGTERM => "TERM",
        libc::SIGUSR1 => "USR1",
        libc::SIGUSR2 => "USR2",
        other => return format!("{other}"),
    }
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::{MAX_DIR_NAME, workspace_dir_name};

    /// Two sections never share a workspace directory: ids that differ only in `.` and `_`
    /// (MCP token names), in characters outside the plain set, in a leading `-`, or only past
    /// the length a name may have, each get their own; Lark's ids keep their names.
    #[test]
    fn every_section_has_a_directory_of_its_own() {
        let long = "x".repeat(300);
        let sections = [
            "mcp:a.b".to_string(),
            "mcp:a_b".to_string(),
            "mcp:a-b".to_string(),
            "mcp_a_b".to_string(),
            "mcp_a.b".to_string(),
            "mcp:a%2Eb".to_string(),
            "%mcp%3Aa%2Eb".to_string(),
            "console:ops".to_string(),
            "console_ops".to_string(),
            String::new(),
            "-x".to_string(),
            "_-x".to_string(),
            "%2Dx".to_string(),
            "..".to_string(),
            "a/b".to_string(),
            "a/../b".to_string(),
            "é".to_string(),
            format!("{long}1"),
            format!("{long}2"),
            format!("h{}", "a".repeat(64)),
        ];
        let mut seen = std::collections::HashMap::new();
        for s in &sections {
            let name = workspace_dir_name(s);
            assert!(
                !name.is_empty() && name.len() <= MAX_DIR_NAME,
                "{s:?} -> {name:?}"
            );
            assert!(
                !name.starts_with('-') && !name.contains('/'),
                "{s:?} -> {name:?}"
            );
            assert!(name != "." && name != "..", "{s:?} -> {name:?}");
            if let Some(other) = seen.insert(name.clone(), s) {
                panic!("{s:?} and {other:?} share {name:?}");
            }
        }
        for id in ["oc_0123abcd", "omt_1a2b3c", "ou_x-y"] {
            assert_eq!(workspace_dir_name(id), id);
        }
        assert_eq!(workspace_dir_name("mcp:a.b"), "%mcp%3Aa%2Eb");
    }
}
