//! The embedded default: a private PostgreSQL cluster at `$SSHMODE_DATA_DIR/pg`, made from the
//! machine's PostgreSQL binaries and reached only over a unix socket inside that directory.
//!
//! Owns creating, starting, attaching to and stopping that cluster; never touches a cluster
//! named by `DATABASE_URL`, and never stops the cluster while another process is attached.
//!
//! The cluster belongs to no single process. Every command using it is *attached*: it holds
//! an exclusive file lock on its own file in `pg.attached/` for as long as it uses the
//! cluster. The first to come starts it; each one leaving removes its file and stops the
//! cluster only if no other attached file is still locked (the kernel drops the lock of a
//! killed process, so a stale file does not count). `pg.lock` beside the cluster serialises
//! these decisions, `initdb`, start and stop, so two commands at once never race. PostgreSQL
//! refuses to run as root, so under root the cluster runs as the unprivileged `postgres`
//! account.
//!
//! The cluster authenticates: scram-sha-256 on its socket, with a password generated on first
//! use and kept in `pg.password` (0600) in the data directory. A cluster made by an older
//! version with trust authentication is given the password and switched over on its next
//! start. Below Landlock V9 a sandboxed tool could still connect to the socket; the password is
//! what keeps it out.
//!
//! Hand-written rather than a crate: the embedded-PostgreSQL crates download binaries at run
//! time, which neither this machine nor a typical server may do.
//!
//! # In detail
//!
//! `store::embedded` runs a private cluster at `$SSHMODE_DATA_DIR/pg` from the machine's
//! PostgreSQL binaries (PATH, else the newest `/usr/lib/postgresql/*/bin`). It listens on no TCP
//! port: `listen_addresses=''` and a unix socket inside the cluster directory (mode 0700). A
//! command attaches by creating `pg.attached/<pid>.<n>` and holding an exclusive `flock` on it
//! until it ends; it starts the cluster when `pg_ctl status` says it is not running. On leaving
//! it removes its file, then tries to lock every other file there: one it can lock belongs to a
//! process that is gone (removed); one it cannot is a live attachment. With none left it stops
//! the cluster (`pg_ctl stop -m fast`). `pg.lock` in the data directory (an exclusive file lock)
//! is held over each of these decisions and over `initdb`, start and stop (a wait for it is
//! bounded: 120 s, then a clear error). A long-lived attached process (`serve`) also runs
//! [`keep_running`]: when the cluster goes away under it (stopped from outside, or crashed) it
//! starts it again, at most [`RESTART_ATTEMPTS`] times in a row. The cluster authenticates
//! with scram-sha-256 on its socket (`pg_hba.conf`: `local all all scram-sha-256`); the password
//! is generated on first use into `pg.password` (0600) and handed to `initdb --pwfile`; a cluster
//! found still trusting its socket gets the password and the new `pg_hba.conf` and is reloaded.
//! PostgreSQL refuses root, so under root the cluster runs as the `postgres` account;
//! before anything is created, every ancestor of the data directory is checked for search
//! permission by that account, and a clear error names the blocking directory. This is
//! hand-written: the crates that embed PostgreSQL download server binaries at run time.

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};
use sqlx::postgres::PgConnectOptions;
use tokio_util::sync::CancellationToken;

/// Database and role the service uses inside its cluster.
const DB_NAME: &str = "sshmode";
/// Port number used only to name the socket file; no TCP listener is opened.
const PORT: u16 = 5432;
/// Longest unix socket path the kernel accepts (`sun_path` is 108 bytes with the NUL).
const MAX_SOCKET_PATH: usize = 107;
/// `pg_ctl start/stop -t`.
const PG_CTL_WAIT_SECS: &str = "60";
/// Longest wait for `pg.lock` (another command starting or stopping the cluster).
const LOCK_WAIT: Duration = Duration::from_secs(120);
/// The file holding the service role's password, in the data directory.
const PASSWORD_FILE: &str = "pg.password";
/// The directory of attached processes' lock files, in the data directory.
const ATTACHED_DIR: &str = "pg.attached";
/// How often [`keep_running`] looks whether the cluster still runs.
const WATCH_EVERY: Duration = Duration::from_secs(1);
/// Failed starts in a row after which [`keep_running`] gives up.
pub const RESTART_ATTEMPTS: u32 = 5;

/// This process's attachment to the running cluster; on release it leaves, and stops the
/// cluster if it was the last attached process.
pub struct EmbeddedCluster {
    cluster: Arc<Cluster>,
    /// `None` once released.
    attachment: Option<Attachment>,
}

/// What running the cluster needs; shared with [`Keeper`].
struct Cluster {
    dir: PathBuf,
    bin: PathBuf,
    /// The service role's password (from `pg.password`).
    password: zeroize::Zeroizing<String>,
    run_as: Option<Account>,
    /// Set when this process is leaving: a [`Keeper`] then starts nothing.
    leaving: AtomicBool,
}

/// This process's file in `pg.attached/`, locked for as long as the process uses the cluster.
struct Attachment {
    path: PathBuf,
    /// Holds the lock; closing it releases the lock.
    _file: File,
}

impl std::fmt::Debug for EmbeddedCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedCluster")
            .field("dir", &self.cluster.dir)
            .field("attached", &self.attachment.is_some())
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Clone)]
struct Account {
    name: String,
    uid: u32,
    gid: u32,
}

impl EmbeddedCluster {
    /// Creates the cluster on first use, attaches to it, and starts it unless it runs. Blocking.
    pub fn ensure_running(dir: &Path) -> anyhow::Result<Self> {
        let parent = dir
            .parent()
            .context("the embedded cluster needs a parent directory")?;
        fs::create_dir_all(parent)
            .with_context(|| format!("cannot create the data directory {}", parent.display()))?;
        let socket = dir.join(format!(".s.PGSQL.{PORT}"));
        if socket.as_os_str().len() > MAX_SOCKET_PATH {
            bail!(
                "the embedded PostgreSQL socket path {} is longer than {MAX_SOCKET_PATH} bytes; \
                 choose a shorter SSHMODE_DATA_DIR or set DATABASE_URL",
                socket.display()
            );
        }
        let bin = find_binaries()?;
        let run_as = unprivileged_account()?;
        let control = lock(parent)?;

        if let Some(account) = &run_as {
            check_reachable(parent, account)?;
        }
        let password = password(parent)?;
        if !dir.join("PG_VERSION").exists() {
            init(dir, &bin, run_as.as_ref(), &password)?;
        }
        let mut this = EmbeddedCluster {
            cluster: Arc::new(Cluster {
                dir: dir.to_path_buf(),
                bin,
                password,
                run_as,
                leaving: AtomicBool::new(false),
            }),
            attachment: None,
        };
        // Attached before starting: should a later step fail, dropping `this` (once the
        // control lock is free again) stops a cluster nobody else uses.
        let ready = attach(parent).and_then(|a| {
            this.attachment = Some(a);
            if !this.cluster.is_running() {
                this.cluster.start()?;
            }
            this.cluster.require_password()?;
            this.cluster.ensure_database()
        });
        drop(control);
        ready?;
        Ok(this)
    }

    /// How sqlx reaches the cluster: the unix socket in the cluster directory.
    pub fn connect_options(&self) -> PgConnectOptions {
        PgConnectOptions::new()
            .socket(&self.cluster.dir)
            .port(PORT)
            .username(DB_NAME)
            .password(&self.cluster.password)
            .database(DB_NAME)
    }

    /// What [`keep_running`] needs to start the cluster again while this process is attached.
    pub fn keeper(&self) -> Keeper {
        Keeper {
            cluster: Arc::clone(&self.cluster),
        }
    }

    /// Leaves the cluster, stopping it if no other process is attached. Blocking.
    pub fn release(mut self) {
        self.leave();
    }

    fn leave(&mut self) {
        let Some(attachment) = self.attachment.take() else {
            return;
        };
        self.cluster.leaving.store(true, Ordering::SeqCst);
        let parent = self.cluster.parent();
        let _control = match lock(parent) {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, pg.dir = %self.cluster.dir.display(), "embedded PostgreSQL left running: cannot tell whether another command still uses it");
                return;
            }
        };
        let _ = fs::remove_file(&attachment.path);
        drop(attachment);
        let others = live_attachments(parent);
        if others > 0 {
            tracing::info!(pg.dir = %self.cluster.dir.display(), pg.attached = others, "embedded PostgreSQL left running for the other commands using it");
            return;
        }
        if !self.cluster.is_running() {
            return;
        }
        let status = self
            .cluster
            .pg_ctl()
            .args(["stop", "-D"])
            .arg(&self.cluster.dir)
            .args(["-m", "fast", "-w", "-t", PG_CTL_WAIT_SECS])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        match status {
            Ok(s) if s.success() => {
                tracing::info!(pg.dir = %self.cluster.dir.display(), "embedded PostgreSQL stopped")
            }
            _ => {
                tracing::warn!(pg.dir = %self.cluster.dir.display(), "embedded PostgreSQL did not stop cleanly")
            }
        }
    }
}

impl Drop for EmbeddedCluster {
    fn drop(&mut self) {
        self.leave();
    }
}

/// Starts the cluster again when it goes away while this process is attached.
pub struct Keeper {
    cluster: Arc<Cluster>,
}

impl Keeper {
    /// Cheap: `postmaster.pid` names a live process, not a zombie (else, when the file cannot
    /// be read, asks `pg_ctl status`).
    fn seems_running(&self) -> bool {
        match fs::read_to_string(self.cluster.dir.join("postmaster.pid")) {
            Ok(text) => text
                .lines()
                .next()
                .and_then(|l| l.trim().parse::<u32>().ok())
                .and_then(|pid| fs::read_to_string(format!("/proc/{pid}/stat")).ok())
                .and_then(|stat| {
                    let state = stat.rsplit_once(')')?.1.split_whitespace().next()?;
                    Some(state != "Z" && state != "X")
                })
                .unwrap_or(false),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(_) => self.cluster.is_running(),
        }
    }

    /// Under `pg.lock`: starts the cluster unless it runs or this process is leaving. `true`
    /// when it started it. Blocking.
    fn restart_if_gone(&self) -> anyhow::Result<bool> {
        let _control = lock(self.cluster.parent())?;
        if self.cluster.leaving.load(Ordering::SeqCst) || self.cluster.is_running() {
            return Ok(false);
        }
        self.cluster.start()?;
        Ok(true)
    }
}

/// Until `shutdown`: looks every [`WATCH_EVERY`] whether the cluster still runs, and starts it
/// again when it does not. After [`RESTART_ATTEMPTS`] failed starts in a row it gives up with
/// an error in the log (readiness then stays failed, so an orchestrator restarts the service).
pub async fn keep_running(keeper: Keeper, shutdown: CancellationToken) {
    let keeper = Arc::new(keeper);
    let mut failures = 0u32;
    let mut pause = WATCH_EVERY;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(pause) => {}
        }
        pause = WATCH_EVERY;
        if keeper.seems_running() {
            continue;
        }
        let k = Arc::clone(&keeper);
        let attempt = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = tokio::task::spawn_blocking(move || k.restart_if_gone()) => r,
        };
        match attempt {
            Ok(Ok(true)) => {
                failures = 0;
                tracing::warn!(pg.dir = %keeper.cluster.dir.display(), "embedded PostgreSQL had stopped under this service; started it again");
            }
            Ok(Ok(false)) => failures = 0,
            Ok(Err(e)) => {
                failures += 1;
                if failures >= RESTART_ATTEMPTS {
                    tracing::error!(error = %e, pg.dir = %keeper.cluster.dir.display(), "embedded PostgreSQL is gone and {RESTART_ATTEMPTS} starts failed; giving up: restart the service once the cause (see pg.log) is fixed");
                    return;
                }
                tracing::error!(error = %e, pg.dir = %keeper.cluster.dir.display(), attempt = failures, "embedded PostgreSQL is gone and could not be started again; retrying");
                pause = WATCH_EVERY * 2u32.pow(failures);
            }
            Err(e) => {
                tracing::error!(error = %e, "the embedded PostgreSQL keeper's start task failed");
                return;
            }
        }
    }
}

/// Creates and locks this process's file in `pg.attached/` (under `pg.lock`).
fn attach(parent: &Path) -> anyhow::Result<Attachment> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = parent.join(ATTACHED_DIR);
    fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o700))?;
    let path = dir.join(format!(
        "{}.{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    file.try_lock()
        .map_err(|e| anyhow::anyhow!("cannot lock {}: {e}", path.display()))?;
    Ok(Attachment { path, _file: file })
}

/// How many files in `pg.attached/` are locked by a live process (under `pg.lock`); the files
/// of processes that are gone are removed.
fn live_attachments(parent: &Path) -> usize {
    let Ok(entries) = fs::read_dir(parent.join(ATTACHED_DIR)) else {
        return 0;
    };
    let mut live = 0;
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(file) = File::open(&path) else {
            continue;
        };
        match file.try_lock() {
            // Nobody holds it: its process is gone.
            Ok(()) => {
                let _ = fs::remove_file(&path);
            }
            Err(fs::TryLockError::WouldBlock) => live += 1,
            Err(fs::TryLockError::Error(e)) => {
                tracing::warn!(error = %e, path = %path.display(), "cannot tell whether this attachment is live; counting it");
                live += 1;
            }
        }
    }
    live
}

impl Cluster {
    fn parent(&self) -> &Path {
        self.dir.parent().unwrap_or(&self.dir)
    }

    fn is_running(&self) -> bool {
        self.pg_ctl()
            .args(["status", "-D"])
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    }

    fn start(&self) -> anyhow::Result<()> {
        let log = self.dir.parent().unwrap_or(&self.dir).join("pg.log");
        if let Some(a) = &self.run_as {
            // The server (running as the account) appends to the log file.
            if !log.exists() {
                File::create(&log).with_context(|| format!("cannot create {}", log.display()))?;
            }
            chown(&log, a)?;
        }
        let opts = format!(
            "-c listen_addresses='' -c unix_socket_directories='{}' -c unix_socket_permissions=0700 -p {PORT}",
            self.dir.display()
        );
        let out = self
            .pg_ctl()
            .args(["start", "-D"])
            .arg(&self.dir)
            .arg("-l")
            .arg(&log)
            .args(["-w", "-t", PG_CTL_WAIT_SECS, "-o", &opts])
            .stdin(Stdio::null())
            .output()
            .context("cannot run pg_ctl")?;
        if !out.status.success() {
            let tail = fs::read_to_string(&log).unwrap_or_default();
            let tail: Vec<&str> = tail.lines().rev().take(5).collect();
            bail!(
                "the embedded PostgreSQL at {} did not start: {}{}",
                self.dir.display(),
                String::from_utf8_lossy(&out.stderr).trim(),
                if tail.is_empty() {
                    String::new()
                } else {
                    format!(
                        "; log: {}",
                        tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
                    )
                }
            );
        }
        tracing::info!(pg.dir = %self.dir.display(), "embedded PostgreSQL started");
        Ok(())
    }

    /// Creates the service's database on first start (initdb makes only `postgres`).
    fn ensure_database(&self) -> anyhow::Result<()> {
        let psql = self.bin.join("psql");
        let socket_dir = self.dir.display().to_string();
        let query = |sql: &str, db: &str| -> anyhow::Result<String> {
            let mut cmd = Command::new(&psql);
            cmd.args([
                "-X",
                "-A",
                "-t",
                "-q",
                "-h",
                &socket_dir,
                "-p",
                &PORT.to_string(),
                "-U",
                DB_NAME,
                "-d",
                db,
                "-c",
                sql,
            ]);
            let out = self
                .as_account(cmd)
                .env("PGPASSWORD", self.password.as_str())
                .output()
                .context("cannot run psql")?;
            if !out.status.success() {
                bail!(
                    "psql failed: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
        };
        let exists = query(
            &format!("SELECT 1 FROM pg_database WHERE datname = '{DB_NAME}'"),
            "postgres",
        )?;
        if exists != "1" {
            query(&format!("CREATE DATABASE {DB_NAME}"), "postgres")?;
        }
        Ok(())
    }

    /// Switches a cluster that still trusts its socket (made before authentication) to scram:
    /// sets the role's password over the trusted socket, rewrites `pg_hba.conf`, reloads.
    fn require_password(&self) -> anyhow::Result<()> {
        if !trusts_socket(&self.dir) {
            return Ok(());
        }
        let sql = format!(
            "SET password_encryption = 'scram-sha-256'; ALTER ROLE {DB_NAME} PASSWORD '{}'",
            self.password.as_str()
        );
        let mut cmd = Command::new(self.bin.join("psql"));
        cmd.args(["-X", "-q", "-h"])
            .arg(&self.dir)
            .args([
                "-p",
                &PORT.to_string(),
                "-U",
                DB_NAME,
                "-d",
                "postgres",
                "-f",
                "-",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        // The password goes on standard input, never on a command line.
        let mut child = self.as_account(cmd).spawn().context("cannot run psql")?;
        {
            use std::io::Write;
            let mut stdin = child.stdin.take().context("psql stdin")?;
            stdin.write_all(sql.as_bytes())?;
        }
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!(
                "could not set the embedded PostgreSQL password: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        write_hba(&self.dir, self.run_as.as_ref())?;
        let status = self
            .pg_ctl()
            .args(["reload", "-D"])
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .context("cannot run pg_ctl reload")?;
        if !status.success() {
            bail!("pg_ctl reload failed after switching the embedded PostgreSQL to scram");
        }
        tracing::info!(pg.dir = %self.dir.display(), "embedded PostgreSQL now requires its password (scram)");
        Ok(())
    }

    fn pg_ctl(&self) -> Command {
        self.as_account(Command::new(self.bin.join("pg_ctl")))
    }

    fn as_account(&self, mut cmd: Command) -> Command {
        if let Some(a) = &self.run_as {
            cmd.uid(a.uid)
                .gid(a.gid)
                .env("HOME", &self.dir)
                .env("USER", &a.name);
        }
        cmd.current_dir(self.dir.parent().unwrap_or(&self.dir));
        cmd
    }
}

fn init(dir: &Path, bin: &Path, run_as: Option<&Account>, password: &str) -> anyhow::Result<()> {
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
    if let Some(a) = run_as {
        chown(dir, a)?;
    }
    // initdb reads the password from a file; it lives in the data directory's parent only
    // for the call (0600, readable by the cluster's account).
    let pwfile = dir
        .parent()
        .unwrap_or(dir)
        .join(format!(".pg.pwfile-{}", uuid::Uuid::new_v4().simple()));
    {
        use std::io::Write;
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&pwfile)
            .with_context(|| format!("cannot create {}", pwfile.display()))?;
        f.write_all(password.as_bytes())?;
    }
    if let Some(a) = run_as {
        chown(&pwfile, a)?;
    }
    let mut cmd = Command::new(bin.join("initdb"));
    cmd.arg("-D")
        .arg(dir)
        .args([
            "-U",
            DB_NAME,
            "--auth=scram-sha-256",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-instructions",
        ])
        .arg(format!("--pwfile={}", pwfile.display()))
        .current_dir(dir);
    if let Some(a) = run_as {
        cmd.uid(a.uid).gid(a.gid).env("HOME", dir);
    }
    let out = cmd.output();
    let _ = fs::remove_file(&pwfile);
    let out = out.context("cannot run initdb")?;
    if !out.status.success() {
        bail!(
            "initdb failed for the embedded PostgreSQL at {}: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    tracing::info!(pg.dir = %dir.display(), "embedded PostgreSQL cluster created");
    Ok(())
}

/// Holds `pg.lock` in `parent` exclusively until dropped; waits at most [`LOCK_WAIT`].
fn lock(parent: &Path) -> anyhow::Result<File> {
    lock_within(parent, LOCK_WAIT)
}

fn lock_within(parent: &Path, wait: Duration) -> anyhow::Result<File> {
    let path = parent.join("pg.lock");
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    let deadline = std::time::Instant::now() + wait;
    let mut pause = Duration::from_millis(10);
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(file),
            Err(fs::TryLockError::WouldBlock) if std::time::Instant::now() < deadline => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(500));
            }
            Err(fs::TryLockError::WouldBlock) => bail!(
                "{} is held by another sshmode command for more than {wait:?} (starting or \
                 stopping the embedded PostgreSQL); if none is running, check for a stuck pg_ctl",
                path.display()
            ),
            Err(fs::TryLockError::Error(e)) => {
                return Err(e).with_context(|| format!("cannot lock {}", path.display()));
            }
        }
    }
}

/// The role's password from `pg.password` in `parent`, generated (0600) on first use.
fn password(parent: &Path) -> anyhow::Result<zeroize::Zeroizing<String>> {
    let path = parent.join(PASSWORD_FILE);
    match fs::read_to_string(&path) {
        Ok(p) if !p.trim().is_empty() => {
            let mode = fs::metadata(&path)?.permissions().mode();
            if mode & 0o077 != 0 {
                fs::set_permissions(&path, fs::Permissions::from_mode(0o600))?;
            }
            return Ok(zeroize::Zeroizing::new(p.trim().to_string()));
        }
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
    if parent.join("pg").join("PG_VERSION").exists() && !trusts_socket(&parent.join("pg")) {
        bail!(
            "{} is missing but the embedded PostgreSQL already requires a password; restore the \
             file, or remove {} to start a new cluster",
            path.display(),
            parent.join("pg").display()
        );
    }
    let mut bytes = [0u8; 24];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
        .map_err(|_| anyhow::anyhow!("no randomness for the embedded PostgreSQL password"))?;
    let pw = zeroize::Zeroizing::new(hex::encode(bytes));
    {
        use std::io::Write;
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        f.write_all(pw.as_bytes())?;
        f.sync_all()?;
    }
    Ok(pw)
}

fn trusts_socket(dir: &Path) -> bool {
    fs::read_to_string(dir.join("pg_hba.conf"))
        .map(|s| {
            s.lines()
                .map(str::trim)
                .filter(|l| !l.starts_with('#'))
                .any(|l| l.split_whitespace().any(|w| w == "trust"))
        })
        .unwrap_or(false)
}

/// `pg_hba.conf`: the socket only, scram only.
fn write_hba(dir: &Path, run_as: Option<&Account>) -> anyhow::Result<()> {
    let path = dir.join("pg_hba.conf");
    let tmp = dir.join("pg_hba.conf.sshmode-new");
    fs::write(
        &tmp,
        "# Written by sshmode: the unix socket only, with a password (scram).\n\
         local all all scram-sha-256\n",
    )?;
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o600))?;
    if let Some(a) = run_as {
        chown(&tmp, a)?;
    }
    fs::rename(&tmp, &path).with_context(|| format!("cannot replace {}", path.display()))?;
    Ok(())
}

/// The directory holding `pg_ctl`, `initdb`, `postgres` and `psql`: from PATH, else the newest
/// `/usr/lib/postgresql/*/bin`.
fn find_binaries() -> anyhow::Result<PathBuf> {
    let has_all = |d: &Path| {
        ["pg_ctl", "initdb", "postgres", "psql"]
            .iter()
            .all(|b| d.join(b).is_file())
    };
    if let Some(path) = std::env::var_os("PATH") {
        for d in std::env::split_paths(&path) {
            if d.join("pg_ctl").is_file() {
                // PATH entries are often symlinks into the real bin directory.
                let real = fs::canonicalize(d.join("pg_ctl"))
                    .ok()
                    .and_then(|p| p.parent().map(Path::to_path_buf));
                for cand in real.into_iter().chain(std::iter::once(d.clone())) {
                    if has_all(&cand) {
                        return Ok(cand);
                    }
                }
            }
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v: u32 = e.file_name().to_str()?.parse().ok()?;
            Some((v, e.path().join("bin")))
        })
        .filter(|(_, d)| has_all(d))
        .collect();
    versions.sort();
    versions.pop().map(|(_, d)| d).context(
        "no PostgreSQL server binaries found (looked for pg_ctl, initdb, postgres and psql on PATH \
         and in /usr/lib/postgresql/*/bin); install PostgreSQL or set DATABASE_URL",
    )
}

/// Under root, the account the cluster runs as (`postgres`); otherwise `None`.
fn unprivileged_account() -> anyhow::Result<Option<Account>> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    let name = "postgres";
    let cname = std::ffi::CString::new(name).expect("static name");
    // SAFETY: getpwnam returns a pointer into static storage or null; we copy out at once.
    let pw = unsafe { libc::getpwnam(cname.as_ptr()) };
    if pw.is_null() {
        bail!(
            "PostgreSQL refuses to run as root and there is no `postgres` account to run the embedded \
             cluster as; create one (useradd --system postgres), run sshmode as a normal user, or set DATABASE_URL"
        );
    }
    // SAFETY: pw is non-null and points to a valid passwd record.
    let (uid, gid) = unsafe { ((*pw).pw_uid, (*pw).pw_gid) };
    Ok(Some(Account {
        name: name.into(),
        uid,
        gid,
    }))
}

/// Fails clearly when the unprivileged account cannot traverse to the data directory.
fn check_reachable(data_dir: &Path, account: &Account) -> anyhow::Result<()> {
    let mut blocked = Vec::new();
    for dir in data_dir.ancestors() {
        let Ok(meta) = fs::metadata(dir) else {
            continue;
        };
        let mode = meta.mode();
        let ok = if meta.uid() == account.uid {
            mode & 0o100 != 0
        } else if meta.gid() == account.gid {
            mode & 0o010 != 0
        } else {
            mode & 0o001 != 0
        };
        if !ok {
            blocked.push(dir.display().to_string());
        }
    }
    if let Some(dir) = blocked.last() {
        bail!(
            "the embedded PostgreSQL runs as `{}` (PostgreSQL refuses root), but that account cannot \
             reach {} because {dir} is not searchable by it; put SSHMODE_DATA_DIR somewhere it can reach \
             (e.g. /var/lib/sshmode), allow it (chmod o+x {dir}), or set DATABASE_URL",
            account.name,
            data_dir.display()
        );
    }
    Ok(())
}

fn chown(path: &Path, a: &Account) -> anyhow::Result<()> {
    std::os::unix::fs::chown(path, Some(a.uid), Some(a.gid))
        .with_context(|| format!("cannot hand {} to the `{}` account", path.display(), a.name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_lock_is_waited_for_a_bounded_time() {
        let dir = tempfile::tempdir().unwrap();
        let held = lock_within(dir.path(), Duration::from_secs(1)).unwrap();
        let started = std::time::Instant::now();
        let e = lock_within(dir.path(), Duration::from_millis(300)).expect_err("the lock is held");
        assert!(e.to_string().contains("held by another"), "{e}");
        assert!(started.elapsed() >= Duration::from_millis(300));
        drop(held);
        lock_within(dir.path(), Duration::from_millis(300)).expect("free again");
    }

    #[test]
    fn the_password_file_is_private_and_stable() {
        let dir = tempfile::tempdir().unwrap();
        let first = password(dir.path()).unwrap();
        let mode = fs::metadata(dir.path().join(PASSWORD_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(first.len(), 48);
        assert_eq!(*password(dir.path()).unwrap(), *first);
    }

    #[test]
    fn a_lost_password_of_a_scram_cluster_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("pg")).unwrap();
        fs::write(dir.path().join("pg/PG_VERSION"), "15\n").unwrap();
        fs::write(
            dir.path().join("pg/pg_hba.conf"),
            "# trust is not used\nlocal all all scram-sha-256\n",
        )
        .unwrap();
        let e = password(dir.path()).expect_err("refused").to_string();
        assert!(e.contains("pg.password"), "{e}");
        fs::write(dir.path().join("pg/pg_hba.conf"), "local all all trust\n").unwrap();
        password(dir.path()).expect("an old trusting cluster gets a password");
    }
}
