//! The launcher: `sshmode __sshmode-launch …`, a re-exec of the service's own binary that
//! starts one local command (or one file operation) as the tools account, in a PID namespace
//! and mount namespace of its own, under the sandbox the service prepared.
//!
//! The service forks, and its `pre_exec` hook (raw system calls only) gives the child its own
//! session, the workspace as working directory and the descriptors of this call at fixed
//! numbers ([`RULESET_FD`], [`WORKSPACE_FD`], [`TMP_FD`]), then execs the launcher. Everything
//! else (account, groups, limits, flags) comes as arguments. The launcher is single-threaded
//! (it runs before anything else in `main`), so it may fork and mount, which a `pre_exec`
//! closure in the multi-threaded service may not.
//!
//! `run`: `unshare(CLONE_NEWPID)`, fork. The child is PID 1 of the new namespace: it asks for
//! `SIGKILL` when the launcher dies, enters a mount namespace of its own, makes every mount
//! private, mounts a fresh procfs over `/proc` and adds a rule for it to the ruleset (a
//! Landlock rule on the old `/proc` does not cover a mount on top of it: [`grant_new_proc`]),
//! then forks the command ([`init`]). The command calls `setsid`, applies limits, drops the
//! capability bounding set, switches to the tools account, sets `NO_NEW_PRIVS`, restricts
//! itself with the ruleset, closes every descriptor above 2 and execs the shell; it is not
//! PID 1, so signals act on it as anywhere (`kill $$` works). PID 1 stays root, does nothing
//! but reap, pass signals on to the command's group and, when the command ends, hand its wait
//! status to the launcher and exit. The launcher forwards TERM/INT/HUP/QUIT to PID 1, KILLs it
//! [`GRACE`] later, and exits with the command's status as soon as PID 1 passes it on (the
//! namespaces' teardown, RCU waits of a few milliseconds, is then PID 1's, not the caller's).
//! When PID 1 ends, the kernel kills everything else in the namespace: nothing a command
//! starts, `setsid` or not, outlives it. Killing the launcher (the backend kills its group,
//! PID 1 included) kills PID 1 through its death signal too.
//!
//! `file`: the same namespaces, account, limits and sandbox, then one read or write through
//! [`super::files`] beneath the pinned workspace and tmp descriptors, so the kernel decides
//! access exactly as for a command (and `/proc` shows no other process to the file tools
//! either). Answer on stdout, refusal on stderr.
//!
//! `probe`: the namespace steps only, at start-up, to learn whether this machine allows them.
//!
//! A step that fails ends the launcher with [`SETUP_FAILED`] and a line starting with
//! [`ERROR_PREFIX`] on stderr, which the backend turns into an error of the call: a command is
//! never run less isolated than the level says.
//!
//! Never: follows a path a tool could change (it only opens `/proc` and the shell, both the
//! system's); keeps a descriptor of the service open into the command; runs the command with a
//! capability, as root, or without the ruleset it was given.

use std::ffi::{CString, OsStr, OsString};
use std::io::{Read, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;
use std::time::Duration;

/// The hidden subcommand (`argv[1]`) that makes `sshmode` the launcher.
pub const SUBCOMMAND: &str = "__sshmode-launch";
/// Where the Landlock ruleset's descriptor is handed to the launcher.
pub const RULESET_FD: i32 = 3;
/// Where the workspace's descriptor is handed to the file helper.
pub const WORKSPACE_FD: i32 = 4;
/// Where the tmp directory's descriptor is handed to the file helper.
pub const TMP_FD: i32 = 5;
/// The exit status of a launcher that could not set up the command.
pub const SETUP_FAILED: i32 = 125;
/// How a launcher failure starts on stderr.
pub const ERROR_PREFIX: &str = "sshmode launcher: ";
/// Between a forwarded TERM and the KILL of the namespace.
pub const GRACE: Duration = Duration::from_millis(1500);

/// What the launcher applies before the command or file operation, as arguments.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Setup {
    /// uid, gid and supplementary groups of the tools account.
    pub identity: Option<(u32, u32, Vec<u32>)>,
    /// `(resource, value)` pairs, both soft and hard.
    pub limits: Vec<(libc::__rlimit_resource_t, u64)>,
    /// Empty the capability bounding set.
    pub drop_capabilities: bool,
    /// Restrict with the ruleset at [`RULESET_FD`].
    pub landlock: bool,
}

impl Setup {
    /// The arguments after the mode, up to (not including) `--`.
    pub fn to_args(&self) -> Vec<OsString> {
        let mut a: Vec<OsString> = Vec::new();
        if let Some((uid, gid, groups)) = &self.identity {
            a.push("--uid".into());
            a.push(uid.to_string().into());
            a.push("--gid".into());
            a.push(gid.to_string().into());
            a.push("--groups".into());
            let g: Vec<String> = groups.iter().map(|g| g.to_string()).collect();
            a.push(g.join(",").into());
        }
        for (res, value) in &self.limits {
            a.push("--limit".into());
            a.push(format!("{res}={value}").into());
        }
        if self.drop_capabilities {
            a.push("--drop-caps".into());
        }
        if self.landlock {
            a.push("--landlock".into());
        }
        a
    }

    fn parse(args: &mut std::slice::Iter<'_, OsString>) -> Result<Self, String> {
        let mut s = Setup::default();
        let (mut uid, mut gid, mut groups) = (None, None, Vec::new());
        let num = |v: Option<&OsString>, what: &str| -> Result<u64, String> {
            v.and_then(|v| v.to_str())
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("{what}: a number is expected"))
        };
        loop {
            let Some(arg) = args.next() else {
                return Err("`--` is missing".into());
            };
            match arg.to_str() {
                Some("--") => break,
                Some("--uid") => uid = Some(num(args.next(), "--uid")? as u32),
                Some("--gid") => gid = Some(num(args.next(), "--gid")? as u32),
                Some("--groups") => {
                    let v = args.next().and_then(|v| v.to_str()).unwrap_or("");
                    for g in v.split(',').filter(|g| !g.is_empty()) {
                        groups.push(g.parse().map_err(|_| format!("--groups: `{g}`"))?);
                    }
                }
                Some("--limit") => {
                    let v = args.next().and_then(|v| v.to_str()).unwrap_or("");
                    let (r, n) = v.split_once('=').ok_or("--limit: RES=VALUE")?;
                    let r = r.parse().map_err(|_| format!("--limit: `{v}`"))?;
                    let n = n.parse().map_err(|_| format!("--limit: `{v}`"))?;
                    s.limits.push((r, n));
                }
                Some("--drop-caps") => s.drop_capabilities = true,
                Some("--landlock") => s.landlock = true,
                _ => return Err(format!("unknown argument {arg:?}")),
            }
        }
        s.identity = match (uid, gid) {
            (Some(u), Some(g)) => Some((u, g, groups)),
            (None, None) => None,
            _ => return Err("--uid and --gid go together".into()),
        };
        Ok(s)
    }
}

/// A file operation of the helper (`file` mode), as its one JSON argument after `--`.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct FileRequest {
    /// `read` or `write` (the data on stdin).
    pub op: String,
    pub path: String,
    pub offset: u64,
    pub len: u64,
    /// The roots, as [`super::files::Roots`] has them; `workspace` and `tmp` are the paths of
    /// the descriptors at [`WORKSPACE_FD`] and [`TMP_FD`].
    pub writable: Vec<PathBuf>,
    pub readable: Vec<PathBuf>,
    pub excluded: Vec<PathBuf>,
    pub workspace: PathBuf,
    pub tmp: PathBuf,
}

/// When `argv[1]` is [`SUBCOMMAND`], runs the launcher and never returns; otherwise returns at
/// once. Call first thing in `main`, before any thread exists.
pub fn main_if_launcher() {
    let args: Vec<OsString> = std::env::args_os().collect();
    if args.get(1).map(|a| a.as_os_str()) != Some(OsStr::new(SUBCOMMAND)) {
        return;
    }
    let code = match launch(&args[2..]) {
        Ok(code) => code,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "{ERROR_PREFIX}{e}");
            SETUP_FAILED
        }
    };
    std::process::exit(code);
}

fn launch(args: &[OsString]) -> Result<i32, String> {
    let mut it = args.iter();
    let mode = it.next().and_then(|m| m.to_str()).unwrap_or("");
    match mode {
        "probe" => {
            let child = unshare_and_fork()?;
            if child == 0 {
                let r = enter_namespace().map(|()| {
                    // SAFETY: getpid has no preconditions.
                    if unsafe { libc::getpid() } == 1 { 0 } else { 1 }
                });
                child_exit(r);
            }
            supervise(child)
        }
        "run" => {
            let setup = Setup::parse(&mut it)?;
            let program: Vec<CString> = it
                .map(|a| CString::new(a.as_bytes()).map_err(|_| "NUL in an argument".to_string()))
                .collect::<Result<_, _>>()?;
            if program.is_empty() {
                return Err("no program to run".into());
            }
            let child = unshare_and_fork()?;
            if child == 0 {
                let r = enter_namespace()
                    .and_then(|()| grant_new_proc(&setup))
                    .and_then(|()| init(&setup, &program));
                child_exit(r);
            }
            supervise(child)
        }
        "file" => {
            let setup = Setup::parse(&mut it)?;
            let request = it.next().ok_or("no request")?;
            let request: FileRequest = serde_json::from_slice(request.as_bytes())
                .map_err(|e| format!("bad request: {e}"))?;
            let child = unshare_and_fork()?;
            if child == 0 {
                let r = enter_namespace()
                    .and_then(|()| grant_new_proc(&setup))
                    .and_then(|()| apply(&setup))
                    .map(|()| file_op(request));
                child_exit(r);
            }
            supervise(child)
        }
        other => Err(format!("unknown mode `{other}`")),
    }
}

/// Ends a forked child: its error on stderr, [`SETUP_FAILED`]; the status also goes to the
/// launcher through the status pipe.
fn child_exit(r: Result<i32, String>) -> ! {
    let code = match r {
        Ok(c) => c,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "{ERROR_PREFIX}{e}");
            SETUP_FAILED
        }
    };
    pass_status((code & 0xff) << 8, code);
}

/// Hands a wait status to the launcher and ends this process with `code`. Standard input,
/// output and error are closed first: a descriptor still open at exit is released only after
/// the namespaces' teardown, and the caller reads the output up to its end.
fn pass_status(status: i32, code: i32) -> ! {
    let bytes = status.to_ne_bytes();
    // SAFETY: closing our own standard descriptors, writing 4 bytes we own to our pipe (or
    // to -1, which fails harmlessly), then ending this process without running anything of
    // the parent's.
    unsafe {
        for fd in 0..3 {
            libc::close(fd);
        }
        libc::write(STATUS.load(Relaxed), bytes.as_ptr().cast(), 4);
        libc::_exit(code)
    }
}

fn os_err(what: &str) -> String {
    format!("{what}: {}", std::io::Error::last_os_error())
}

/// The signals the launcher forwards (and which stay blocked until the command's exec).
fn forwarded_set() -> libc::sigset_t {
    // SAFETY: a zeroed sigset is initialised by sigemptyset before use.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [
            libc::SIGTERM,
            libc::SIGINT,
            libc::SIGHUP,
            libc::SIGQUIT,
            libc::SIGCHLD,
        ] {
            libc::sigaddset(&mut set, s);
        }
        set
    }
}

/// New PID and mount namespaces, then fork: 0 in the child (PID 1), its pid in the parent.
/// The parent keeps the write end of a pipe open for its whole life: the child sees the
/// launcher is alive while that end is open ([`enter_namespace`]). A second pipe carries the
/// command's wait status from PID 1 to the launcher ([`init`], [`supervise`]).
fn unshare_and_fork() -> Result<libc::pid_t, String> {
    let set = forwarded_set();
    let mut pipe = [0; 2];
    let mut status = [0; 2];
    // SAFETY: plain system calls on valid arguments; the process has one thread.
    unsafe {
        if libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            return Err(os_err("sigprocmask"));
        }
        if libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) != 0
            || libc::pipe2(status.as_mut_ptr(), libc::O_CLOEXEC) != 0
        {
            return Err(os_err("pipe"));
        }
        // The mount namespace is PID 1's alone (enter_namespace): the launcher then never
        // pays for its teardown.
        if libc::unshare(libc::CLONE_NEWPID) != 0 {
            return Err(os_err("cannot create a PID namespace (unshare)"));
        }
        let pid = libc::fork();
        if pid < 0 {
            return Err(os_err("fork"));
        }
        if pid == 0 {
            libc::close(pipe[1]);
            libc::close(status[0]);
            LIVENESS.store(pipe[0], Relaxed);
            STATUS.store(status[1], Relaxed);
        } else {
            libc::close(pipe[0]);
            libc::close(status[1]);
            STATUS.store(status[0], Relaxed);
        }
        Ok(pid)
    }
}

use std::sync::atomic::Ordering::Relaxed;
/// In the child: the read end of the launcher's liveness pipe.
static LIVENESS: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);
/// The status pipe: its write end in PID 1, its read end in the launcher.
static STATUS: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

/// PID 1 of the namespace: forks the command (a process like any other, so signals it sends
/// itself act as usual), forwards to the command's group what the launcher forwards here,
/// reaps every orphan, and when the command ends hands its wait status to the launcher and
/// exits, which ends everything else in the namespace.
fn init(setup: &Setup, program: &[CString]) -> Result<i32, String> {
    // SAFETY: the process has one thread; the child only makes system calls and execs.
    let shell = unsafe { libc::fork() };
    if shell < 0 {
        return Err(os_err("fork"));
    }
    if shell == 0 {
        // SAFETY: a plain system call.
        let r = if unsafe { libc::setsid() } < 0 {
            Err(os_err("setsid"))
        } else {
            apply(setup).and_then(|()| exec(program))
        };
        child_exit(r.map(|()| 0));
    }
    // PID 1 writes nothing: the command's output ends when the command's processes end.
    // SAFETY: closing our own standard descriptors.
    unsafe {
        for fd in 0..3 {
            libc::close(fd);
        }
    }
    let set = forwarded_set();
    loop {
        // SAFETY: a valid set; no siginfo wanted.
        let sig = unsafe { libc::sigwaitinfo(&set, std::ptr::null_mut()) };
        match sig {
            libc::SIGCHLD => loop {
                let mut status = 0;
                // SAFETY: reaping our own children.
                let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
                if pid == shell {
                    pass_status(status, 0);
                }
                if pid <= 0 {
                    break;
                }
            },
            s if s > 0 => {
                // SAFETY: signalling the command's group (it leads it) and the command.
                unsafe {
                    libc::kill(-shell, s);
                    libc::kill(shell, s);
                }
            }
            _ => {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::EINTR) {
                    return Err(format!("sigwaitinfo: {e}"));
                }
            }
        }
    }
}

/// In PID 1 of the new namespace: dies with the launcher, private mounts, its own `/proc`.
fn enter_namespace() -> Result<(), String> {
    // SAFETY: plain system calls on valid, NUL-terminated arguments.
    unsafe {
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
            return Err(os_err("PR_SET_PDEATHSIG"));
        }
        // The launcher may have died before the death signal was armed (its pid reads as 0
        // from inside the namespace either way): its end of the pipe is then closed.
        let mut poll = libc::pollfd {
            fd: LIVENESS.load(std::sync::atomic::Ordering::Relaxed),
            events: libc::POLLIN,
            revents: 0,
        };
        if libc::poll(&mut poll, 1, 0) != 0 {
            return Err("the launcher is gone".into());
        }
        if libc::unshare(libc::CLONE_NEWNS) != 0 {
            return Err(os_err("cannot create a mount namespace (unshare)"));
        }
        let none = std::ptr::null::<libc::c_char>();
        let root = c"/";
        if libc::mount(
            none,
            root.as_ptr(),
            none,
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        ) != 0
        {
            return Err(os_err("cannot make the mounts private"));
        }
        let proc_ = c"/proc";
        if libc::mount(
            c"proc".as_ptr(),
            proc_.as_ptr(),
            c"proc".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            std::ptr::null(),
        ) != 0
        {
            return Err(os_err("cannot mount /proc for the namespace"));
        }
    }
    Ok(())
}

/// Landlock's `landlock_path_beneath_attr` (packed, as the kernel declares it).
#[repr(C, packed)]
struct PathBeneathAttr {
    allowed_access: u64,
    parent_fd: i32,
}

/// Read, execute and list (`LANDLOCK_ACCESS_FS_EXECUTE | READ_FILE | READ_DIR`, ABI 1): what
/// the ruleset grants on the system trees, `/proc` among them.
const READ_EXEC: u64 = 1 | (1 << 2) | (1 << 3);

/// Grants the namespace's own `/proc` in the ruleset. Landlock checks the rules of the
/// directories a path walks through, and a walk out of a mount skips the directory it is
/// mounted on: the rule the service put on the old `/proc` does not cover the new mount, so
/// the new mount's root gets the same rule here, before the restriction.
fn grant_new_proc(setup: &Setup) -> Result<(), String> {
    if !setup.landlock {
        return Ok(());
    }
    // SAFETY: a NUL-terminated path; the attribute outlives the call.
    unsafe {
        let fd = libc::open(
            c"/proc".as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        );
        if fd < 0 {
            return Err(os_err("cannot open the new /proc"));
        }
        let attr = PathBeneathAttr {
            allowed_access: READ_EXEC,
            parent_fd: fd,
        };
        let r = libc::syscall(
            libc::SYS_landlock_add_rule,
            RULESET_FD,
            1, // LANDLOCK_RULE_PATH_BENEATH
            &attr as *const PathBeneathAttr,
            0,
        );
        libc::close(fd);
        if r != 0 {
            return Err(os_err("cannot grant the new /proc in the ruleset"));
        }
    }
    Ok(())
}

/// Limits, capabilities, account, `NO_NEW_PRIVS`, Landlock: today's order.
fn apply(setup: &Setup) -> Result<(), String> {
    // SAFETY: plain system calls on values owned by this function.
    unsafe {
        for (res, value) in &setup.limits {
            let lim = libc::rlimit {
                rlim_cur: *value,
                rlim_max: *value,
            };
            if libc::setrlimit(*res, &lim) != 0 {
                return Err(os_err(&format!("setrlimit {res}")));
            }
        }
        if setup.drop_capabilities {
            for cap in 0..64 {
                // Past the last capability the kernel knows this fails: ignored.
                libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0);
            }
        }
        if let Some((uid, gid, groups)) = &setup.identity {
            if libc::setgroups(groups.len(), groups.as_ptr()) != 0 {
                return Err(os_err("setgroups"));
            }
            if libc::setgid(*gid) != 0 {
                return Err(os_err("setgid"));
            }
            if libc::setuid(*uid) != 0 {
                return Err(os_err("setuid"));
            }
            if libc::getuid() != *uid || libc::geteuid() != *uid || libc::getegid() != *gid {
                return Err("the account switch did not hold".into());
            }
        }
        if setup.landlock {
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return Err(os_err("PR_SET_NO_NEW_PRIVS"));
            }
            if libc::syscall(libc::SYS_landlock_restrict_self, RULESET_FD, 0) != 0 {
                return Err(os_err("landlock_restrict_self"));
            }
            libc::close(RULESET_FD);
        }
    }
    Ok(())
}

/// Closes every descriptor above stderr, restores the signal mask and `SIGPIPE`, execs.
fn exec(program: &[CString]) -> Result<(), String> {
    let mut argv: Vec<*const libc::c_char> = program.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let set = forwarded_set();
    // SAFETY: valid arguments; argv is NUL-terminated and outlives the call.
    unsafe {
        if libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) != 0 {
            return Err(os_err("close_range"));
        }
        // Rust ignores SIGPIPE in its programs; a shell must get the default back.
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::execv(argv[0], argv.as_ptr());
    }
    Err(os_err(&format!(
        "cannot run {}",
        program[0].to_string_lossy()
    )))
}

/// Waits for PID 1, forwarding signals; returns (or dies with) its status.
fn supervise(child: libc::pid_t) -> Result<i32, String> {
    let set = forwarded_set();
    // SAFETY: a valid set; the signals are blocked, so they queue on the descriptor.
    let sfd = unsafe { libc::signalfd(-1, &set, libc::SFD_CLOEXEC) };
    if sfd < 0 {
        return Err(os_err("signalfd"));
    }
    let status_fd = STATUS.load(Relaxed);
    let mut status_open = true;
    let mut kill_at: Option<std::time::Instant> = None;
    loop {
        let timeout = kill_at.map_or(-1, |at| {
            at.saturating_duration_since(std::time::Instant::now())
                .as_millis()
                .min(60_000) as i32
        });
        let mut fds = [
            libc::pollfd {
                fd: sfd,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: if status_open { status_fd } else { -1 },
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: two valid pollfds.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(format!("poll: {e}"));
        }
        if n == 0 {
            // The grace period is over: the namespace goes with its PID 1.
            // SAFETY: signalling our own child.
            unsafe { libc::kill(child, libc::SIGKILL) };
            kill_at = None;
            continue;
        }
        if fds[1].revents != 0 {
            let mut bytes = [0u8; 4];
            // SAFETY: reading at most 4 bytes into our buffer from our pipe.
            let r = unsafe { libc::read(status_fd, bytes.as_mut_ptr().cast(), 4) };
            if r == 4 {
                // PID 1 passed the status on and is ending (the kernel then ends the rest of
                // the namespace): answer now rather than wait for the namespaces' teardown.
                return Ok(status_to_exit(i32::from_ne_bytes(bytes)));
            }
            // PID 1 ended without a status (killed): its own is the answer.
            status_open = false;
        }
        if fds[0].revents != 0 {
            // SAFETY: a zeroed siginfo is a valid buffer of its own size.
            let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
            let size = std::mem::size_of::<libc::signalfd_siginfo>();
            // SAFETY: reading one siginfo into our buffer.
            let r =
                unsafe { libc::read(sfd, (&mut info as *mut libc::signalfd_siginfo).cast(), size) };
            let sig = info.ssi_signo as i32;
            if r == size as isize && sig != libc::SIGCHLD {
                // PID 1 has these blocked: it receives them and passes them on.
                // SAFETY: signalling our own child.
                unsafe { libc::kill(child, sig) };
                kill_at.get_or_insert_with(|| std::time::Instant::now() + GRACE);
            }
        }
        let mut status = 0;
        // SAFETY: a plain wait on our own child.
        let r = unsafe { libc::waitpid(child, &mut status, libc::WNOHANG) };
        if r == child {
            // Everything in the namespace is gone with it: a status it wrote is in the pipe.
            let mut bytes = [0u8; 4];
            // SAFETY: reading at most 4 bytes into our buffer from our pipe.
            let n = unsafe { libc::read(status_fd, bytes.as_mut_ptr().cast(), 4) };
            if status_open && n == 4 {
                status = i32::from_ne_bytes(bytes);
            }
            return Ok(status_to_exit(status));
        }
        if r < 0 {
            return Err(os_err("waitpid"));
        }
    }
}

/// An exit code for the child's status; a signal is raised on the launcher itself, so the
/// service sees the same status as from the shell.
fn status_to_exit(status: i32) -> i32 {
    if libc::WIFEXITED(status) {
        return libc::WEXITSTATUS(status);
    }
    if libc::WIFSIGNALED(status) {
        let sig = libc::WTERMSIG(status);
        // SAFETY: resetting our own signal state, then ending with the child's signal.
        unsafe {
            let none = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            libc::setrlimit(libc::RLIMIT_CORE, &none);
            libc::signal(sig, libc::SIG_DFL);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, sig);
            libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::kill(libc::getpid(), sig);
        }
        return 128 + sig;
    }
    SETUP_FAILED
}

/// One read or write as the account this process now is. Output: for a read, 8 bytes of the
/// file's size (big-endian) then the bytes; for a refusal, `KIND\tmessage` on stderr and 1.
fn file_op(req: FileRequest) -> i32 {
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::sync::Arc;
    // SAFETY: the service placed these descriptors here for this process alone.
    let (ws, tmp) = unsafe {
        (
            OwnedFd::from_raw_fd(WORKSPACE_FD),
            OwnedFd::from_raw_fd(TMP_FD),
        )
    };
    let roots = super::files::Roots {
        writable: req.writable,
        readable: req.readable,
        excluded: req.excluded,
        identity: None,
        pinned: vec![(req.workspace, Arc::new(ws)), (req.tmp, Arc::new(tmp))],
    };
    let result = match req.op.as_str() {
        "read" => super::files::read(&roots, &req.path, req.offset, req.len).map(|bytes| {
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(&bytes.size.to_be_bytes());
            let _ = out.write_all(&bytes.data);
            let _ = out.flush();
        }),
        "write" => {
            let mut data = Vec::new();
            match std::io::stdin().lock().read_to_end(&mut data) {
                Ok(_) => super::files::write(&roots, &req.path, &data),
                Err(e) => Err(crate::exec::ExecError::Local(format!(
                    "reading the data: {e}"
                ))),
            }
        }
        other => Err(crate::exec::ExecError::Invalid(format!(
            "unknown file operation `{other}`"
        ))),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            let _ = write!(std::io::stderr(), "{}", encode_error(&e));
            1
        }
    }
}

/// `KIND\tmessage`, read back by [`decode_error`].
pub fn encode_error(e: &crate::exec::ExecError) -> String {
    use crate::exec::ExecError as E;
    match e {
        E::NotFound(m) => format!("not-found\t{m}"),
        E::Invalid(m) => format!("invalid\t{m}"),
        E::File(m) => format!("file\t{m}"),
        other => format!("file\t{other}"),
    }
}

/// The error a file helper reported.
pub fn decode_error(text: &[u8]) -> crate::exec::ExecError {
    use crate::exec::ExecError as E;
    let text = String::from_utf8_lossy(text);
    match text.split_once('\t') {
        Some(("not-found", m)) => E::NotFound(m.to_string()),
        Some(("invalid", m)) => E::Invalid(m.to_string()),
        Some(("file", m)) => E::File(m.to_string()),
        _ => E::Local(format!(
            "the file helper failed: {}",
            text.trim().trim_start_matches(ERROR_PREFIX)
        )),
    }
}

/// `OsString`s of the launcher's command line for a JSON request.
pub fn json_arg(req: &FileRequest) -> OsString {
    OsString::from_vec(serde_json::to_vec(req).expect("a request serialises"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setup_round_trips_through_arguments() {
        let s = Setup {
            identity: Some((990, 991, vec![991, 5])),
            limits: vec![(libc::RLIMIT_CPU, 600), (libc::RLIMIT_NOFILE, 1024)],
            drop_capabilities: true,
            landlock: true,
        };
        let mut args = s.to_args();
        args.push("--".into());
        args.push("/bin/sh".into());
        let mut it = args.iter();
        assert_eq!(Setup::parse(&mut it).unwrap(), s);
        assert_eq!(it.next().unwrap(), "/bin/sh");
        let bad: Vec<OsString> = vec!["--uid".into(), "5".into(), "--".into()];
        assert!(Setup::parse(&mut bad.iter()).is_err());
        let none: Vec<OsString> = vec!["--bogus".into(), "--".into()];
        assert!(Setup::parse(&mut none.iter()).is_err());
    }

    #[test]
    fn file_errors_keep_their_kind() {
        use crate::exec::ExecError as E;
        for e in [
            E::NotFound("/x".into()),
            E::Invalid("bad".into()),
            E::File("/y: permission denied".into()),
        ] {
            let back = decode_error(encode_error(&e).as_bytes());
            assert_eq!(format!("{back:?}"), format!("{e:?}"));
        }
        let e = decode_error(format!("{ERROR_PREFIX}setuid: EPERM\n").as_bytes());
        assert!(
            matches!(e, E::Local(ref m) if m.contains("setuid")),
            "{e:?}"
        );
    }
}
