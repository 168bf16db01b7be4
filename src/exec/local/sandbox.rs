//! What keeps a local tool away from the service: the tools account (when the service runs as
//! root), a Landlock sandbox built per command, resource limits, a clean environment, and the
//! file permissions of the data directory. [`Sandbox::probe`] finds out, once at start-up, what
//! this machine can enforce and reports it as a [`Level`].
//!
//! The ruleset is built in the parent, its rules on the descriptors the backend opened for
//! this call (never on a path resolved again); the `pre_exec` hook that runs in the forked
//! child only makes raw system calls on values prepared before the fork (`setsid`, `fchdir` to
//! the workspace's descriptor, `setrlimit`, `setgroups`, `setgid`, `setuid`,
//! `PR_SET_NO_NEW_PRIVS`, `landlock_restrict_self`): no allocation, no lock. `setsid` gives
//! every command a session of its own, without a controlling terminal, so it can neither type
//! into the terminal of `sshmode chat` (`TIOCSTI`) nor open it as `/dev/tty`; it is still the
//! leader of its own process group, which is what the backend kills.
//!
//! With a launch server (root, its start-up probe passed: the level has `pidns`) there is no
//! hook: the backend hands this call's descriptors and [`Prepared::launch_setup`] to the server
//! ([`super::server`]), which applies the same steps in a PID namespace ([`launch`]), in a mount
//! namespace where the data directory and the workspace root are an empty stand-in holding only
//! the call's own workspace and tmp directory (the [`launch::View`] built here: the directories
//! as found at start-up, canonical, with their device and inode). Without one, the level says
//! so and what that leaves open ([`Level::leaves_open`]): a tool may then `stat` what it may not
//! open (Landlock does not cover metadata).
//!
//! Never: passes a variable of the service's environment that is not on the allow-list; grants
//! a tool anything in the data directory but its own workspace and temporary directory; runs a
//! local command when nothing is enforced unless the operator opted in.

use std::ffi::{CString, OsStr};
use std::fmt;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use landlock::{
    ABI, Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, LandlockStatus, NetPort,
    PathBeneath, PathFd, Ruleset, RulesetAttr, RulesetCreated, RulesetCreatedAttr, RulesetStatus,
    Scope,
};

use super::launch;
use super::server::LaunchServer;
use crate::config::LocalConfig;

/// The highest Landlock ABI whose rights this module asks for. Best effort: an older kernel
/// enforces what it knows (V9 adds connects to pathname unix sockets).
const ABI_REQUESTED: ABI = ABI::V9;
/// PATH of every local command (the service's own PATH is not passed on).
pub const TOOL_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Trees a tool may read and execute.
const SYSTEM_TREES: &[&str] = &[
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc",
    "/opt",
    "/nix/store",
    "/proc",
    "/sys",
    "/run/systemd/resolve",
];
/// Device files a tool may read and write (and use ioctls on).
const DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
    "/dev/ptmx",
    "/dev/pts",
];
/// Most rules of one ruleset (a system tree holding a protected path is granted child by child).
const MAX_RULES: usize = 4096;

/// What the service enforces on local tools, as found at start-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Level {
    /// Local commands run as the tools account, not as the service.
    pub separate_uid: bool,
    /// Each command runs through the launcher in a PID namespace with its own `/proc`, and
    /// the file tools through its helper as the tools account (the start-up probe passed).
    pub pidns: bool,
    /// The Landlock ABI a restriction was actually enforced at (`None`: not enforced).
    pub landlock_abi: Option<i32>,
}

/// The Landlock ABI that stops connects to pathname unix sockets.
const ABI_UNIX_SOCKETS: i32 = 9;

impl Level {
    /// Whether anything separates a tool from the service.
    pub fn is_enforced(&self) -> bool {
        self.separate_uid || self.landlock_abi.is_some()
    }

    /// A tool shares the service's uid and Landlock does not filter unix socket connects: it
    /// may connect to every pathname socket of that user (ssh-agent, D-Bus, `systemd --user`).
    pub fn unix_sockets_open(&self) -> bool {
        !self.separate_uid && self.landlock_abi.is_some_and(|v| v < ABI_UNIX_SOCKETS)
    }

    /// The start-up warning when `agent_targets` targets authenticate through an agent whose
    /// socket a local tool may connect to at this level.
    pub fn agent_warning(&self, agent_targets: i64) -> Option<String> {
        (self.unix_sockets_open() && agent_targets > 0).then(|| {
            format!(
                "{agent_targets} SSH target(s) authenticate through an agent (--agent), and local \
                 tools, which share the service's account below Landlock ABI 9, may connect to \
                 its socket (SSH_AUTH_SOCK) and sign with its keys; run the service as root or \
                 on a kernel with Landlock ABI 9, or use keys stored by the service"
            )
        })
    }

    /// What a local tool can still see or reach at this level, one phrase each.
    pub fn leaves_open(&self) -> Vec<&'static str> {
        let mut open = Vec::new();
        if !self.is_enforced() {
            open.push("everything the service's account can reach: nothing is enforced");
            return open;
        }
        if !self.separate_uid {
            open.push("the service's own uid (files and processes of that user that Landlock does not cover)");
        }
        if self.unix_sockets_open() {
            open.push("every pathname unix socket of the service's user (ssh-agent, D-Bus, systemd --user)");
        } else if self.landlock_abi.is_some_and(|v| v < ABI_UNIX_SOCKETS) {
            open.push("pathname unix sockets the tools account may write to");
        }
        if !self.pidns {
            open.push("every process of the machine in /proc (command lines, working directories)");
            open.push("a process that calls setsid outlives its command");
            open.push(
                "the names, sizes, times and link targets of files in the data directory and in \
                 other sections' workspaces (stat and readlink: Landlock does not cover them)",
            );
        }
        if self.landlock_abi.is_none() {
            open.push("every file the tools account may read by its permissions");
        }
        open.push(
            "the paths of listening unix sockets in /proc/net/unix (the embedded cluster's among \
             them; the network namespace is the machine's)",
        );
        open.push("the network, unless SSHMODE_LOCAL_TCP_PORTS is set (Landlock V4+)");
        open
    }
}

impl fmt::Display for Level {
    /// `separate-uid+pidns+landlock-v7`, `separate-uid+landlock-v7`, `separate-uid`,
    /// `landlock-v9`, `landlock-v7+open-unix-sockets` (a non-root service below ABI 9) or
    /// `none`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if self.separate_uid {
            parts.push("separate-uid".to_string());
        }
        if self.pidns {
            parts.push("pidns".to_string());
        }
        if let Some(v) = self.landlock_abi {
            parts.push(format!("landlock-v{v}"));
        }
        if parts.is_empty() {
            return f.write_str("none");
        }
        if self.unix_sockets_open() {
            parts.push("open-unix-sockets".to_string());
        }
        f.write_str(&parts.join("+"))
    }
}

/// The unprivileged account local commands run as.
#[derive(Debug, Clone)]
pub struct Identity {
    pub name: String,
    pub uid: libc::uid_t,
    pub gid: libc::gid_t,
    /// Supplementary groups, set before exec.
    pub groups: Vec<libc::gid_t>,
}

/// The isolation of local commands: identity, Landlock, limits. One per app.
#[derive(Debug)]
pub struct Sandbox {
    config: LocalConfig,
    identity: Option<Identity>,
    /// Landlock is enforced on every command (the probe saw it enforced).
    landlock: bool,
    level: Level,
    /// Paths no rule may cover: the data directory and the protected files.
    excluded: Vec<PathBuf>,
    /// What a command's mount namespace replaces by an empty stand-in: the data directory and
    /// the workspace root (canonical, as found at start-up).
    hidden: Vec<launch::Hidden>,
    /// The launch server every command and file operation goes through (root, probe passed).
    launcher: Option<std::sync::Arc<LaunchServer>>,
}

/// Why a local command cannot run.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error(
        "local tools are disabled: this service can neither run them as a separate account \
         (it does not run as root) nor sandbox them (Landlock is not available on this kernel). \
         Run the service as root (tools then run as SSHMODE_LOCAL_USER), use a kernel with \
         Landlock, bind this thread to an SSH target, or set SSHMODE_LOCAL_UNSANDBOXED=true \
         to accept the risk"
    )]
    Disabled,
    #[error("the local sandbox could not be prepared: {0}")]
    Setup(String),
}

impl Sandbox {
    /// Finds out what can be enforced here, creates the tools account if needed (under root)
    /// and tightens the data directory. `workspace_root` and `tmp_root` are where tools may
    /// write. Blocking (may run `useradd`).
    pub fn probe(
        config: &LocalConfig,
        workspace_root: &Path,
        tmp_root: &Path,
    ) -> anyhow::Result<Self> {
        let excluded: Vec<PathBuf> = std::iter::once(config.data_dir.clone())
            .chain(config.protected.iter().cloned())
            .collect();
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        let identity = if root && !config.simulate_no_sandbox && !config.simulate_non_root {
            Some(ensure_account(&config.user)?)
        } else {
            None
        };
        let mut sandbox = Sandbox {
            config: config.clone(),
            identity,
            landlock: false,
            level: Level {
                separate_uid: false,
                pidns: false,
                landlock_abi: None,
            },
            excluded,
            hidden: Vec::new(),
            launcher: None,
        };
        sandbox.prepare_dirs(workspace_root, tmp_root)?;
        // The excluded paths also as the kernel resolves them (a data directory reached
        // through a link), now that they exist.
        let resolved: Vec<PathBuf> = sandbox
            .excluded
            .iter()
            .filter_map(|p| std::fs::canonicalize(p).ok())
            .filter(|p| !sandbox.excluded.contains(p))
            .collect();
        sandbox.excluded.extend(resolved);
        sandbox.hidden = hidden_dirs(&config.data_dir, workspace_root)?;
        if sandbox.identity.is_none() && !config.simulate_no_sandbox {
            // Tools share the service's uid: make its /proc entries (environ, mem, fds) root's,
            // reachable only with CAP_SYS_PTRACE, which a tool never has. Landlock does not
            // stop a sandboxed process from reading its parent's /proc/<pid>/environ.
            // SAFETY: a plain prctl on this process.
            unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
        }
        let abi = if config.simulate_no_sandbox {
            None
        } else {
            sandbox.probe_landlock(workspace_root)
        };
        sandbox.landlock = abi.is_some();
        if sandbox.identity.is_some() {
            sandbox.launcher = start_launcher(
                config.launcher.as_deref(),
                config.max_concurrent,
                sandbox.view(None),
            );
        }
        sandbox.level = Level {
            separate_uid: sandbox.identity.is_some(),
            pidns: sandbox.launcher.is_some(),
            landlock_abi: abi,
        };
        Ok(sandbox)
    }

    /// The launch server commands and file operations go through, when the level has `pidns`.
    pub fn launcher(&self) -> Option<&LaunchServer> {
        self.launcher.as_deref()
    }

    /// What is enforced on every local command.
    pub fn level(&self) -> &Level {
        &self.level
    }

    /// The tools account, when commands run as one.
    pub fn identity(&self) -> Option<&Identity> {
        self.identity.as_ref()
    }

    /// Paths no rule covers: the data directory and the protected files.
    pub fn excluded(&self) -> &[PathBuf] {
        &self.excluded
    }

    /// Whether `dir` holds (or is) a path no tool may reach: the data directory, a protected
    /// file, the workspace root.
    pub fn holds_excluded(&self, dir: &Path) -> bool {
        self.excluded
            .iter()
            .chain(self.hidden.iter().map(|h| &h.path))
            .any(|x| x.starts_with(dir))
    }

    /// Whether local tools may run: something is enforced, or the operator opted out.
    pub fn check_allowed(&self) -> Result<(), SandboxError> {
        if self.level.is_enforced() || self.config.unsandboxed {
            Ok(())
        } else {
            Err(SandboxError::Disabled)
        }
    }

    /// Logs the level once (start-up); warns when the operator runs tools unsandboxed.
    pub fn log(&self) {
        tracing::info!(local.isolation = %self.level, local.user = self.identity.as_ref().map(|i| i.name.as_str()).unwrap_or("-"), local.leaves_open = %self.level.leaves_open().join("; "), "local tool isolation");
        if self.identity.is_some() && self.launcher.is_none() {
            tracing::warn!(
                launcher = %self.config.launcher.as_deref().map(|p| p.display().to_string()).unwrap_or_else(|| "-".into()),
                "local commands run without a PID namespace (the launcher is not configured \
                 or could not create one): a tool sees every process of the machine, `stat` \
                 shows it the names and sizes of the data directory's files and other \
                 sections', and a `setsid` process outlives its command; set SSHMODE_LAUNCHER \
                 to the sshmode binary, on a kernel and in a container that allow new PID and \
                 mount namespaces"
            );
        }
        if self.level.unix_sockets_open() {
            tracing::warn!(
                "Landlock below ABI 9 does not filter unix socket connects, and local tools \
                 share the service's account: a tool may connect to every pathname socket of \
                 that user (ssh-agent, D-Bus, systemd --user)"
            );
        }
        if !self.level.is_enforced() {
            if self.config.unsandboxed {
                tracing::warn!(
                    "SSHMODE_LOCAL_UNSANDBOXED=true: local tools run as the service itself, \
                     unsandboxed, and can read its secrets"
                );
            } else {
                tracing::warn!("{}", SandboxError::Disabled);
            }
        }
        if self.config.tcp_ports.is_some() && self.level.landlock_abi.is_none_or(|v| v < 4) {
            tracing::warn!(
                "SSHMODE_LOCAL_TCP_PORTS needs Landlock V4 (Linux 6.7); this kernel does not \
                 filter ports, so local commands may connect anywhere"
            );
        }
        if self.level.is_enforced() && !self.level.separate_uid {
            tracing::warn!(
                "local tools share the service's account (it does not run as root): Landlock \
                 alone is a weaker boundary; see README, \"Local tool isolation\""
            );
        }
    }

    /// The data directory's layout and modes: the directory itself 0711, everything in it
    /// but the tools' parts closed to others. The workspace root and the tmp root belong to
    /// the service (0711): a tool can create nothing directly in them, so `sections/` and the
    /// tmp directories cannot be swapped for links. These paths are the operator's (their
    /// parents are not the tools'), so they are used by name here, at start-up only.
    fn prepare_dirs(&self, workspace_root: &Path, tmp_root: &Path) -> anyhow::Result<()> {
        use anyhow::Context;
        let data = &self.config.data_dir;
        std::fs::create_dir_all(data)
            .with_context(|| format!("cannot create {}", data.display()))?;
        // A path the service may not chmod (someone else's) is reported, not fatal: the
        // sandbox does not rely on modes, the tools account does.
        let warn = |r: anyhow::Result<()>| {
            if let Err(e) = r {
                tracing::warn!(error = %format!("{e:#}"), "could not tighten a permission");
            }
        };
        warn(set_mode(data, 0o711));
        for entry in std::fs::read_dir(data)?.flatten() {
            let path = entry.path();
            if path == workspace_root || path == tmp_root {
                continue;
            }
            warn(tighten(&path));
        }
        for file in &self.config.protected {
            if file.exists() {
                warn(tighten(file));
            }
        }
        for dir in [workspace_root, tmp_root] {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        set_mode(tmp_root, 0o711)?;
        set_mode(workspace_root, 0o711)?;
        if self.identity.is_some() {
            // Earlier versions handed the workspace root to the tools account.
            std::os::unix::fs::lchown(workspace_root, Some(0), Some(0)).with_context(|| {
                format!("cannot give {} back to root", workspace_root.display())
            })?;
        }
        Ok(())
    }

    /// Restricts a throwaway thread with a ruleset like the commands' and reads the status
    /// the kernel gave: the Landlock ABI actually enforced, or `None`.
    fn probe_landlock(&self, writable: &Path) -> Option<i32> {
        let dir = match super::files::open_root(writable) {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(error = %e, "the workspace root could not be opened for the Landlock probe");
                return None;
            }
        };
        use std::os::fd::AsFd;
        let ruleset = match self.ruleset(dir.as_fd(), dir.as_fd(), true) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "Landlock ruleset could not be built");
                return None;
            }
        };
        let status = std::thread::spawn(move || ruleset.restrict_self())
            .join()
            .ok()?;
        match status {
            Ok(s) if s.ruleset != RulesetStatus::NotEnforced => match s.landlock {
                LandlockStatus::Available { effective_abi, .. } => Some(effective_abi as i32),
                _ => None,
            },
            Ok(_) => None,
            Err(e) => {
                tracing::warn!(error = %e, "Landlock restriction failed");
                None
            }
        }
    }

    /// The ruleset of one command: read and execute on the system trees, everything on the
    /// section's tmp and on its workspace (read and execute only when `workspace_writable` is
    /// false: a `read` workspace), chosen TCP ports, no signals or abstract sockets outside.
    fn ruleset(
        &self,
        workspace: BorrowedFd<'_>,
        tmp: BorrowedFd<'_>,
        workspace_writable: bool,
    ) -> Result<RulesetCreated, String> {
        let abi = ABI_REQUESTED;
        let e = |e: landlock::RulesetError| e.to_string();
        let mut rs = Ruleset::default()
            .set_compatibility(CompatLevel::BestEffort)
            .handle_access(AccessFs::from_all(abi))
            .map_err(e)?
            .scope(Scope::from_all(abi))
            .map_err(e)?;
        if self.config.tcp_ports.is_some() {
            rs = rs.handle_access(AccessNet::from_all(abi)).map_err(e)?;
        }
        let mut created = rs.create().map_err(e)?;
        let read_exec = AccessFs::from_read(abi);
        let mut rules = 0usize;
        for tree in SYSTEM_TREES {
            self.grant(&mut created, Path::new(tree), read_exec, &mut rules)?;
        }
        // Listing /dev is harmless; the devices themselves are granted one by one.
        if let Ok(fd) = PathFd::new("/dev") {
            created = created
                .add_rule(PathBeneath::new(fd, AccessFs::ReadDir))
                .map_err(e)?;
        }
        let device = AccessFs::from_read(abi)
            | AccessFs::WriteFile
            | AccessFs::IoctlDev
            | AccessFs::Truncate;
        for dev in DEVICES {
            if let Ok(fd) = PathFd::new(dev) {
                created = created.add_rule(PathBeneath::new(fd, device)).map_err(e)?;
            }
        }
        let workspace_access = if workspace_writable {
            AccessFs::from_all(abi)
        } else {
            read_exec
        };
        for (fd, access) in [
            (workspace, workspace_access),
            (tmp, AccessFs::from_all(abi)),
        ] {
            created = created.add_rule(PathBeneath::new(fd, access)).map_err(e)?;
        }
        if let Some(ports) = &self.config.tcp_ports {
            for port in ports {
                created = created
                    .add_rule(NetPort::new(*port, AccessNet::ConnectTcp))
                    .map_err(e)?;
            }
        }
        Ok(created)
    }

    /// Grants `access` beneath `path`, except on the excluded paths: a tree holding one is
    /// granted entry by entry around it.
    fn grant(
        &self,
        created: &mut RulesetCreated,
        path: &Path,
        access: BitFlags<AccessFs>,
        rules: &mut usize,
    ) -> Result<(), String> {
        if self.excluded.iter().any(|x| x == path) {
            return Ok(());
        }
        let Ok(meta) = std::fs::metadata(path) else {
            return Ok(());
        };
        let holds_excluded = self.excluded.iter().any(|x| x.starts_with(path));
        if *rules >= MAX_RULES {
            // Denying the rest is the safe side of a bound.
            return Ok(());
        }
        if !holds_excluded || !meta.is_dir() {
            let Ok(fd) = PathFd::new(path) else {
                return Ok(());
            };
            let access = if meta.is_dir() {
                access
            } else {
                access & AccessFs::from_file(ABI_REQUESTED)
            };
            created
                .add_rule(PathBeneath::new(fd, access))
                .map_err(|e| e.to_string())?;
            *rules += 1;
            return Ok(());
        }
        let entries = std::fs::read_dir(path).map_err(|e| format!("{}: {e}", path.display()))?;
        for entry in entries.flatten() {
            self.grant(created, &entry.path(), access, rules)?;
        }
        Ok(())
    }

    /// Everything one command needs, prepared in the parent: the ruleset's descriptor, the
    /// workspace's descriptor (the command's working directory), the values the child sets and
    /// what its mount namespace shows. `dirs` are the descriptors the backend opened for this
    /// call and the paths the command knows them by.
    pub fn prepare(
        &self,
        dirs: CallDirs<'_>,
        workspace_writable: bool,
    ) -> Result<Prepared, SandboxError> {
        use std::os::fd::AsFd;
        let CallDirs {
            workspace,
            workspace_path,
            tmp,
            tmp_path,
        } = dirs;
        self.check_allowed()?;
        let cwd = workspace
            .try_clone()
            .map_err(|e| SandboxError::Setup(format!("the workspace descriptor: {e}")))?;
        let ruleset = if self.landlock {
            let created = self
                .ruleset(workspace.as_fd(), tmp.as_fd(), workspace_writable)
                .map_err(SandboxError::Setup)?;
            let fd: Option<OwnedFd> = created.into();
            Some(fd.ok_or_else(|| SandboxError::Setup("Landlock gave no ruleset".into()))?)
        } else {
            None
        };
        let c = &self.config;
        let mut limits = vec![
            (libc::RLIMIT_CPU, c.cpu_secs),
            (libc::RLIMIT_NOFILE, c.open_files),
        ];
        if c.address_space_mb > 0 {
            limits.push((libc::RLIMIT_AS, c.address_space_mb.saturating_mul(1 << 20)));
        }
        // Counted per account: only meaningful when tools have an account of their own (the
        // service's threads would count against it otherwise).
        if self.identity.is_some() {
            limits.push((libc::RLIMIT_NPROC, c.max_processes));
        }
        let tmp = tmp
            .try_clone()
            .map_err(|e| SandboxError::Setup(format!("the tmp descriptor: {e}")))?;
        Ok(Prepared {
            ruleset,
            cwd,
            tmp,
            identity: self.identity.clone(),
            limits,
            // SAFETY: geteuid has no preconditions.
            drop_capabilities: unsafe { libc::geteuid() } == 0,
            view: self.view(Some((workspace_path, tmp_path))),
        })
    }

    /// What a command's mount namespace hides, and where it shows the call's workspace and tmp
    /// directory (`None`: a probe, which places none).
    fn view(&self, dirs: Option<(&Path, &Path)>) -> launch::View {
        launch::View {
            hidden: self.hidden.clone(),
            workspace: dirs.map(|(w, _)| w.to_path_buf()),
            tmp: dirs.map(|(_, t)| t.to_path_buf()),
        }
    }

    /// The environment of a local command: the allow-list, nothing else.
    pub fn environment(&self, home: &Path, tmp: &Path, shell: &str) -> Vec<(String, String)> {
        let user = match &self.identity {
            Some(id) => id.name.clone(),
            None => current_user_name(),
        };
        let mut env = vec![
            ("PATH".to_string(), TOOL_PATH.to_string()),
            ("HOME".to_string(), home.display().to_string()),
            ("USER".to_string(), user.clone()),
            ("LOGNAME".to_string(), user),
            ("SHELL".to_string(), shell.to_string()),
            ("TMPDIR".to_string(), tmp.display().to_string()),
        ];
        env.extend(self.config.passthrough_env.iter().cloned());
        if !env.iter().any(|(k, _)| k == "LANG") {
            env.push(("LANG".into(), "C.UTF-8".into()));
        }
        env
    }
}

/// The workspace and tmp directory of one call: the descriptors the backend opened, and the
/// paths the command knows them by (`HOME`, `TMPDIR`).
pub struct CallDirs<'a> {
    pub workspace: &'a OwnedFd,
    pub workspace_path: &'a Path,
    pub tmp: &'a OwnedFd,
    pub tmp_path: &'a Path,
}

/// What the child applies between fork and exec.
pub struct Prepared {
    /// The Landlock ruleset (closed on exec: the kernel opens it `O_CLOEXEC`).
    ruleset: Option<OwnedFd>,
    /// The workspace, opened by the backend for this call: the child's working directory
    /// (`fchdir`; closed on exec).
    cwd: OwnedFd,
    /// The tmp directory, opened by the backend for this call (for the launch server).
    tmp: OwnedFd,
    identity: Option<Identity>,
    limits: Vec<(libc::__rlimit_resource_t, u64)>,
    /// Empty the capability bounding set (the service runs as root): a command never regains
    /// a capability, not even by running as uid 0.
    drop_capabilities: bool,
    /// What the launch server's mount namespace hides, and where it shows the workspace and
    /// the tmp directory.
    view: launch::View,
}

impl Prepared {
    /// The command that runs `program args…` under this sandbox, forked with
    /// [`Prepared::apply`]'s hook (the path without a launch server). `program` must be
    /// absolute. `self` must outlive the spawn.
    pub fn command(&self, program: &str, args: &[&OsStr]) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(args);
        self.apply(&mut cmd);
        cmd
    }

    /// What the launch server applies.
    pub fn launch_setup(&self) -> launch::Setup {
        launch::Setup {
            identity: self
                .identity
                .as_ref()
                .map(|i| (i.uid, i.gid, i.groups.clone())),
            limits: self.limits.clone(),
            drop_capabilities: self.drop_capabilities,
            landlock: self.ruleset.is_some(),
            view: self.view.clone(),
        }
    }

    /// The workspace, the tmp directory and (when Landlock is enforced) the ruleset: the
    /// descriptors a launch request carries after standard input, output and error.
    pub fn launch_fds(&self) -> Vec<BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        let mut fds = vec![self.cwd.as_fd(), self.tmp.as_fd()];
        fds.extend(self.ruleset.as_ref().map(|r| r.as_fd()));
        fds
    }

    /// Installs the child's side on `cmd`: its own session, the workspace as its working
    /// directory, then limits, identity and the sandbox. `self` must outlive the spawn.
    fn apply(&self, cmd: &mut tokio::process::Command) {
        let fd = self.ruleset.as_ref().map(|f| f.as_raw_fd());
        let cwd = self.cwd.as_raw_fd();
        let identity = self
            .identity
            .as_ref()
            .map(|i| (i.uid, i.gid, i.groups.clone()));
        let limits = self.limits.clone();
        let drop_capabilities = self.drop_capabilities;
        // SAFETY: the closure only makes system calls on values moved into it before the
        // fork; it neither allocates nor takes a lock.
        unsafe {
            cmd.pre_exec(move || {
                // A session of its own: no controlling terminal (so not the console's), and
                // the leader of a new process group whose id is its pid.
                if libc::setsid() < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::fchdir(cwd) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                super::launch::default_signals();
                for (res, value) in &limits {
                    let lim = libc::rlimit {
                        rlim_cur: *value,
                        rlim_max: *value,
                    };
                    if libc::setrlimit(*res, &lim) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                if drop_capabilities {
                    for cap in 0..64 {
                        // Past the last capability the kernel knows this fails: ignored.
                        libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0);
                    }
                }
                if let Some((uid, gid, groups)) = &identity
                    && (libc::setgroups(groups.len(), groups.as_ptr()) != 0
                        || libc::setgid(*gid) != 0
                        || libc::setuid(*uid) != 0)
                {
                    return Err(std::io::Error::last_os_error());
                }
                if let Some(fd) = fd {
                    if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    if libc::syscall(libc::SYS_landlock_restrict_self, fd, 0) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
    }
}

/// Starts the launch server of `launcher` and probes that it can create the namespaces a
/// command runs in and show `view` there (bounded). `None` when there is no launcher or it
/// cannot. It may run `max_concurrent` commands and some file operations at once.
fn start_launcher(
    launcher: Option<&Path>,
    max_concurrent: usize,
    view: launch::View,
) -> Option<std::sync::Arc<LaunchServer>> {
    let launcher = launcher?;
    match LaunchServer::start(launcher, max_concurrent + 32, view) {
        Ok(s) => Some(std::sync::Arc::new(s)),
        Err(e) => {
            tracing::warn!(launcher = %launcher.display(), error = %e, "the launch server could not start, or not set up a PID and mount namespace that hides the data directory");
            None
        }
    }
}

/// The Landlock ABI this kernel offers (0 when it has none).
pub fn kernel_landlock_abi() -> i32 {
    // SAFETY: the version query takes no pointer (NULL, size 0) and only returns a number.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            1u32, // LANDLOCK_CREATE_RULESET_VERSION
        )
    };
    if v < 0 { 0 } else { v as i32 }
}

/// The directories a command's mount namespace hides: the data directory and the workspace
/// root, canonical, with the device and inode they have now; one of them alone when it holds
/// the other. These are the operator's paths, resolved at start-up only.
fn hidden_dirs(data_dir: &Path, workspace_root: &Path) -> anyhow::Result<Vec<launch::Hidden>> {
    use anyhow::Context;
    use std::os::unix::fs::MetadataExt;
    let mut found: Vec<launch::Hidden> = Vec::new();
    for dir in [data_dir, workspace_root] {
        let path = std::fs::canonicalize(dir)
            .with_context(|| format!("cannot resolve {}", dir.display()))?;
        let meta =
            std::fs::metadata(&path).with_context(|| format!("cannot read {}", path.display()))?;
        if found.iter().any(|h| path.starts_with(&h.path)) {
            continue;
        }
        found.retain(|h| !h.path.starts_with(&path));
        found.push(launch::Hidden {
            path,
            dev: meta.dev(),
            ino: meta.ino(),
        });
    }
    Ok(found)
}

fn set_mode(path: &Path, mode: u32) -> anyhow::Result<()> {
    use anyhow::Context;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot set the mode of {}", path.display()))
}

/// Takes group and other permissions off a path of the service (not following symlinks).
fn tighten(path: &Path) -> anyhow::Result<()> {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return Ok(());
    };
    if meta.file_type().is_symlink() {
        return Ok(());
    }
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        set_mode(path, mode & !0o077)?;
    }
    Ok(())
}

/// Serialises `useradd` within the process.
static ACCOUNT_LOCK: Mutex<()> = Mutex::new(());

/// Looks up `name`, creating it as a system account without login when missing.
pub fn ensure_account(name: &str) -> anyhow::Result<Identity> {
    let _held = ACCOUNT_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(id) = lookup_account(name)? {
        return Ok(id);
    }
    let shell = ["/usr/sbin/nologin", "/sbin/nologin", "/bin/false"]
        .into_iter()
        .find(|s| Path::new(s).exists())
        .unwrap_or("/bin/false");
    let mut last = String::new();
    // Another process may hold the passwd lock for a moment: retry a few times.
    for attempt in 0..10 {
        let out = std::process::Command::new("useradd")
            .args([
                "--system",
                "--user-group",
                "--no-create-home",
                "--home-dir",
                "/nonexistent",
                "--shell",
                shell,
                name,
            ])
            .env("PATH", TOOL_PATH)
            .output();
        match out {
            Ok(o) if o.status.success() => {
                tracing::info!(
                    local.user = name,
                    "created the system account local tools run as"
                );
                break;
            }
            Ok(o) => last = String::from_utf8_lossy(&o.stderr).trim().to_string(),
            Err(e) => last = e.to_string(),
        }
        if lookup_account(name)?.is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100 * (attempt + 1)));
    }
    lookup_account(name)?.ok_or_else(|| {
        anyhow::anyhow!(
            "the account `{name}` (SSHMODE_LOCAL_USER) does not exist and could not be created \
             ({last}); create it with `useradd --system --user-group --shell /usr/sbin/nologin {name}`"
        )
    })
}

fn lookup_account(name: &str) -> anyhow::Result<Option<Identity>> {
    let cname = CString::new(name)?;
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut buf = vec![0u8; 16 * 1024];
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: all pointers are valid for the call; the record points into `buf`.
    let rc = unsafe {
        libc::getpwnam_r(
            cname.as_ptr(),
            &mut pw,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut result,
        )
    };
    if rc != 0 || result.is_null() {
        return Ok(None);
    }
    let (uid, gid) = (pw.pw_uid, pw.pw_gid);
    if uid == 0 {
        anyhow::bail!("SSHMODE_LOCAL_USER `{name}` is root; choose an unprivileged account");
    }
    let mut groups = vec![0 as libc::gid_t; 64];
    let mut n = groups.len() as libc::c_int;
    // SAFETY: `groups` holds `n` entries; getgrouplist writes at most that many.
    let rc = unsafe { libc::getgrouplist(cname.as_ptr(), gid, groups.as_mut_ptr(), &mut n) };
    if rc < 0 {
        groups.clear();
        groups.push(gid);
    } else {
        groups.truncate(n.max(0) as usize);
    }
    Ok(Some(Identity {
        name: name.to_string(),
        uid,
        gid,
        groups,
    }))
}

fn current_user_name() -> String {
    // SAFETY: geteuid has no preconditions; getpwuid returns static storage or null, copied
    // out at once.
    unsafe {
        let pw = libc::getpwuid(libc::geteuid());
        if pw.is_null() {
            return "sshmode".into();
        }
        std::ffi::CStr::from_ptr((*pw).pw_name)
            .to_string_lossy()
            .into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn level_names() {
        let l = |separate_uid, pidns, landlock_abi| Level {
            separate_uid,
            pidns,
            landlock_abi,
        };
        assert_eq!(
            l(true, true, Some(7)).to_string(),
            "separate-uid+pidns+landlock-v7"
        );
        assert_eq!(
            l(true, false, Some(7)).to_string(),
            "separate-uid+landlock-v7"
        );
        assert_eq!(l(false, false, Some(9)).to_string(), "landlock-v9");
        assert_eq!(
            l(false, false, Some(3)).to_string(),
            "landlock-v3+open-unix-sockets"
        );
        assert_eq!(l(true, false, None).to_string(), "separate-uid");
        assert_eq!(l(false, false, None).to_string(), "none");
        assert!(!l(false, false, None).is_enforced());
        assert!(l(false, false, Some(1)).is_enforced());
        // What is left open is named, and what is enforced is not.
        let open = l(false, false, Some(7)).leaves_open().join("\n");
        assert!(
            open.contains("ssh-agent") && open.contains("setsid"),
            "{open}"
        );
        assert!(open.contains("data directory"), "{open}");
        let open = l(true, true, Some(9)).leaves_open().join("\n");
        assert!(
            !open.contains("setsid") && !open.contains("pathname unix"),
            "{open}"
        );
        // With the launcher, the data directory and other sections are hidden.
        assert!(!open.contains("data directory"), "{open}");
        // Agent targets are warned about only where their socket is reachable.
        assert!(l(false, false, Some(7)).agent_warning(2).is_some());
        assert!(l(false, false, Some(7)).agent_warning(0).is_none());
        assert!(l(false, false, Some(9)).agent_warning(2).is_none());
        assert!(l(true, true, Some(7)).agent_warning(2).is_none());
    }
}
