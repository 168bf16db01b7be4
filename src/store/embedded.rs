//! The embedded default: a private PostgreSQL cluster at `$SSHMODE_DATA_DIR/pg`, made from the
//! machine's PostgreSQL binaries and reached only over a unix socket inside that directory.
//!
//! A command attaches to the cluster when it is already running, or starts it and then owns
//! it: only the owner stops it. `pg.lock` beside the cluster serialises start and stop, so two
//! commands at once never race on `initdb` or `pg_ctl`. PostgreSQL refuses to run as root, so
//! under root the cluster runs as the unprivileged `postgres` account.
//!
//! Hand-written rather than a crate: the embedded-PostgreSQL crates download binaries at run
//! time, which neither this machine nor a typical server may do.

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, bail};
use sqlx::postgres::PgConnectOptions;

/// Database and role the service uses inside its cluster.
const DB_NAME: &str = "sshmode";
/// Port number used only to name the socket file; no TCP listener is opened.
const PORT: u16 = 5432;
/// Longest unix socket path the kernel accepts (`sun_path` is 108 bytes with the NUL).
const MAX_SOCKET_PATH: usize = 107;
/// `pg_ctl start/stop -t`.
const PG_CTL_WAIT_SECS: &str = "60";

/// A running cluster this process uses; stops it on release only if this process started it.
#[derive(Debug)]
pub struct EmbeddedCluster {
    dir: PathBuf,
    bin: PathBuf,
    run_as: Option<Account>,
    started_here: bool,
}

#[derive(Debug, Clone)]
struct Account {
    name: String,
    uid: u32,
    gid: u32,
}

impl EmbeddedCluster {
    /// Creates the cluster on first use, then starts it or attaches to it. Blocking.
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
        let _lock = lock(parent)?;

        if let Some(account) = &run_as {
            check_reachable(parent, account)?;
        }
        if !dir.join("PG_VERSION").exists() {
            init(dir, &bin, run_as.as_ref())?;
        }
        let mut cluster = EmbeddedCluster {
            dir: dir.to_path_buf(),
            bin,
            run_as,
            started_here: false,
        };
        if !cluster.is_running() {
            cluster.start()?;
            cluster.started_here = true;
        }
        cluster.ensure_database()?;
        Ok(cluster)
    }

    /// How sqlx reaches the cluster: the unix socket in the cluster directory.
    pub fn connect_options(&self) -> PgConnectOptions {
        PgConnectOptions::new()
            .socket(&self.dir)
            .port(PORT)
            .username(DB_NAME)
            .database(DB_NAME)
    }

    /// Stops the cluster if this process started it. Blocking.
    pub fn release(mut self) {
        self.stop_if_owner();
    }

    fn stop_if_owner(&mut self) {
        if !self.started_here {
            return;
        }
        self.started_here = false;
        let Ok(_lock) = lock(self.dir.parent().unwrap_or(&self.dir)) else {
            return;
        };
        let status = self
            .pg_ctl()
            .args(["stop", "-D"])
            .arg(&self.dir)
            .args(["-m", "fast", "-w", "-t", PG_CTL_WAIT_SECS])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        match status {
            Ok(s) if s.success() => {
                tracing::info!(pg.dir = %self.dir.display(), "embedded PostgreSQL stopped")
            }
            _ => {
                tracing::warn!(pg.dir = %self.dir.display(), "embedded PostgreSQL did not stop cleanly")
            }
        }
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
            let out = self.as_account(cmd).output().context("cannot run psql")?;
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

impl Drop for EmbeddedCluster {
    fn drop(&mut self) {
        self.stop_if_owner();
    }
}

fn init(dir: &Path, bin: &Path, run_as: Option<&Account>) -> anyhow::Result<()> {
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
    if let Some(a) = run_as {
        chown(dir, a)?;
    }
    let mut cmd = Command::new(bin.join("initdb"));
    cmd.arg("-D")
        .arg(dir)
        .args([
            "-U",
            DB_NAME,
            "--auth=trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-instructions",
        ])
        .current_dir(dir);
    if let Some(a) = run_as {
        cmd.uid(a.uid).gid(a.gid).env("HOME", dir);
    }
    let out = cmd.output().context("cannot run initdb")?;
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

/// Holds `pg.lock` in `parent` exclusively until dropped.
fn lock(parent: &Path) -> anyhow::Result<File> {
    let path = parent.join("pg.lock");
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    file.lock()
        .with_context(|| format!("cannot lock {}", path.display()))?;
    Ok(file)
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
