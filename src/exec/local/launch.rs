//! The launch server: `sshmode __sshmode-launch serve`, a re-exec of the service's own binary,
//! started once by the service ([`super::server`]), that forks each local command (or file
//! operation) into a PID namespace and mount namespace of its own, as the tools account, under
//! the sandbox the service prepared. Exec'ing the large binary per command cost about as much as
//! the rest of the launch together; a fork of this small single-threaded process does not.
//!
//! The server runs as root with an empty environment, in a session of its own, and holds
//! nothing but its request socket (a `SOCK_SEQPACKET` pair whose other end only the service
//! has). It dies with the service: `PR_SET_PDEATHSIG` (the service starts it from a thread that
//! lives as long as the server) and the end of its request socket. Each request is one message:
//! a JSON [`Request`] and the call's descriptors (`SCM_RIGHTS`): first the call's own socket,
//! then standard input, output and error, the workspace, the tmp directory and the Landlock
//! ruleset. The server clones a child with `CLONE_NEWPID` (PID 1 of a new namespace), closes
//! its copies of the call's descriptors at once (so no call's descriptor is ever open in
//! another call's command), reaps, and refuses a request when `--max` calls are running,
//! answering on the call's socket.
//!
//! PID 1 asks for `SIGKILL` when the server dies, places the call's descriptors at fixed
//! numbers and closes every other one, copies the workspace and the tmp directory as detached
//! mounts (`open_tree`), enters a mount namespace of its own, makes every mount private, mounts a
//! fresh procfs over `/proc` with `hidepid=2` (a tool sees no process of another account, PID 1
//! included) and adds a rule for it to the ruleset (a Landlock rule on the old `/proc` does not
//! cover a mount on top of it: [`grant_new_proc`]). Then it hides the service's directories
//! ([`View`], [`hide`]): the data directory and the workspace root are each replaced by an empty
//! tmpfs that holds nothing but the call's own workspace and tmp directory, attached at the paths
//! the command knows them by (`HOME`, `TMPDIR`), and a command starts in that copy of its
//! workspace. `stat`, `ls`, `readlink`, `find` or `du` on the master key, `pg.password`, the
//! cluster, the logs or another section's workspace find nothing there: no name, size, time or
//! link target (Landlock governs what a tool may open, not what it may `stat`). For a
//! command it then forks the shell ([`init`]), which calls `setsid` (and for an interactive shell
//! takes its standard input, a PTY's slave end, as controlling terminal), applies limits, drops the
//! capability bounding set, switches to the tools account, sets `NO_NEW_PRIVS`, restricts
//! itself with the ruleset, closes every descriptor above 2 and execs with the environment the
//! backend built; it is not PID 1, so signals act on it as anywhere (`kill $$` works). PID 1
//! stays root and does nothing but reap, pass a `TERM` the service asks for (a byte on the
//! call's socket) to the command's group, and when the command ends send its wait status on the
//! call's socket and exit. When the service closes the call's socket (a kill after the grace
//! period, a dropped call) PID 1 exits at once. When PID 1 ends, the kernel kills everything
//! else in the namespace: nothing a command starts, `setsid` or not, outlives it.
//!
//! A file operation: the same namespaces, account, limits and sandbox, then one read or write
//! through [`super::files`] beneath the pinned workspace and tmp descriptors, so the kernel
//! decides access exactly as for a command (and `/proc` shows no other process to the file tools
//! either). Answer on stdout, refusal on stderr. A probe (at start-up): the namespace steps only.
//!
//! A step that fails is reported on the call's socket ([`REFUSED`]) and the command is never
//! started: a command is never run less isolated than the level says.
//!
//! Never: follows a path a tool could change (it opens by path only `/proc`, the shell and the
//! hidden directories, the operator's, found again without following a symlink and only if
//! they are the directories the service saw at start-up; every mount is made on descriptors);
//! keeps a descriptor of the service or of another call open into a command; runs a command
//! with a capability, as root, or without the ruleset it was given, or shows it the data
//! directory or another section's workspace; holds a secret.

use std::ffi::{CString, OsStr, OsString};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicI32;
use std::sync::atomic::Ordering::Relaxed;

/// The hidden subcommand (`argv[1]`) that makes `sshmode` the launch server.
pub const SUBCOMMAND: &str = "__sshmode-launch";
/// Where the Landlock ruleset's descriptor is placed in PID 1 and the command.
const RULESET_FD: i32 = 3;
/// Where the workspace's descriptor is placed (the command's working directory).
const WORKSPACE_FD: i32 = 4;
/// Where the tmp directory's descriptor is placed.
const TMP_FD: i32 = 5;
/// Where the call's socket is placed.
const CALL_FD: i32 = 6;
/// Where the read end of the server's liveness pipe is placed.
const LIVENESS_FD: i32 = 7;
/// The exit status of a child that could not set up the command.
pub const SETUP_FAILED: i32 = 125;
/// The largest request message (the script is in it).
pub const MAX_REQUEST: usize = 160 * 1024;
/// Most descriptors one request carries.
const MAX_FDS: usize = 7;

/// First byte of a message on a call's socket, to the service: the wait status follows (4
/// bytes, native order).
pub const STATUS: u8 = b'S';
/// … the call was refused or its set-up failed; the reason follows. Nothing was started.
pub const REFUSED: u8 = b'E';
/// First byte of a message on a call's socket, from the service: pass `TERM` to the command.
pub const TERMINATE: u8 = b'T';

/// What PID 1 and the command apply.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Setup {
    /// uid, gid and supplementary groups of the tools account.
    pub identity: Option<(u32, u32, Vec<u32>)>,
    /// `(resource, value)` pairs, both soft and hard.
    pub limits: Vec<(libc::__rlimit_resource_t, u64)>,
    /// Empty the capability bounding set.
    pub drop_capabilities: bool,
    /// Restrict with the ruleset (the last descriptor of the request).
    pub landlock: bool,
    /// What the call's mount namespace shows of the service's directories.
    #[serde(default)]
    pub view: View,
}

/// What a call's mount namespace shows of the service's directories: each hidden directory is
/// replaced by an empty tmpfs that holds nothing but the call's own workspace and tmp directory
/// (its descriptors, attached at the paths the command knows them by).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct View {
    /// The data directory and the workspace root (one of them when it holds the other).
    pub hidden: Vec<Hidden>,
    /// Where the workspace appears (`HOME`); `None` for a probe.
    pub workspace: Option<PathBuf>,
    /// Where the tmp directory appears (`TMPDIR`); `None` for a probe.
    pub tmp: Option<PathBuf>,
}

/// A directory of the service no tool may see, as the service found it at start-up.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Hidden {
    /// Absolute and without symlinks: found again in the call's namespace following none.
    pub path: PathBuf,
    /// The directory found again must be this one (device and inode).
    pub dev: u64,
    pub ino: u64,
}

/// One request to the server.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Request {
    pub setup: Setup,
    pub job: Job,
}

/// What a request asks for. Descriptors after the call's socket: none for a probe; standard
/// input, output, error, the workspace, the tmp directory (and the ruleset) otherwise.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub enum Job {
    /// The namespace steps only: does this machine allow them?
    Probe,
    /// `argv[0]` (absolute) with `argv`, in the workspace, with exactly `env`. With `tty`
    /// its standard input is a terminal (a PTY's slave end) that the command makes its
    /// controlling terminal, after `setsid` (an interactive shell).
    Run {
        argv: Vec<String>,
        env: Vec<(String, String)>,
        #[serde(default)]
        tty: bool,
    },
    /// One file operation.
    File(FileRequest),
}

impl Job {
    /// How many descriptors the request must carry.
    fn fds(&self, setup: &Setup) -> usize {
        match self {
            Job::Probe => 1,
            _ => 6 + usize::from(setup.landlock),
        }
    }
}

/// A file operation of the helper.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct FileRequest {
    /// `read` or `write` (the data on stdin).
    pub op: String,
    pub path: String,
    pub offset: u64,
    pub len: u64,
    /// The roots, as [`super::files::Roots`] has them; `workspace` and `tmp` are the paths of
    /// the workspace and tmp descriptors.
    pub writable: Vec<PathBuf>,
    pub readable: Vec<PathBuf>,
    pub excluded: Vec<PathBuf>,
    pub workspace: PathBuf,
    pub tmp: PathBuf,
}

/// When `argv[1]` is [`SUBCOMMAND`], runs the launch server and never returns; otherwise
/// returns at once. Call first thing in `main`, before any thread exists.
pub fn main_if_launcher() {
    let args: Vec<OsString> = std::env::args_os().collect();
    if args.get(1).map(|a| a.as_os_str()) != Some(OsStr::new(SUBCOMMAND)) {
        return;
    }
    let code = match serve(&args[2..]) {
        Ok(()) => 0,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "sshmode launch server: {e}");
            SETUP_FAILED
        }
    };
    std::process::exit(code);
}

fn os_err(what: &str) -> String {
    format!("{what}: {}", std::io::Error::last_os_error())
}

/// The signals PID 1 passes on (and which stay blocked until the command's exec), with
/// `SIGCHLD`. Blocked in the server too: a Ctrl-C or a stray `TERM` does not end it.
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

/// In the server: the write end of the liveness pipe (closed first thing in every child).
static LIVENESS_WRITE: AtomicI32 = AtomicI32::new(-1);

/// The server: `serve --parent PID --max N`, its request socket on standard input.
fn serve(args: &[OsString]) -> Result<(), String> {
    let (mut parent, mut max) = (None, None);
    let mut it = args.iter().map(|a| a.to_str().unwrap_or(""));
    if it.next() != Some("serve") {
        return Err("unknown mode".into());
    }
    while let Some(a) = it.next() {
        let v = it.next().and_then(|v| v.parse::<u32>().ok());
        match a {
            "--parent" => parent = v,
            "--max" => max = v,
            _ => return Err(format!("unknown argument `{a}`")),
        }
    }
    let (Some(parent), Some(max)) = (parent, max) else {
        return Err("--parent and --max are required".into());
    };
    let set = forwarded_set();
    let mut only_chld: libc::sigset_t;
    let sock;
    let sfd;
    // SAFETY: plain system calls on values owned here; the process has one thread.
    unsafe {
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
            return Err(os_err("PR_SET_PDEATHSIG"));
        }
        if libc::getppid() as u32 != parent {
            return Err("the service is gone".into());
        }
        if libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            return Err(os_err("sigprocmask"));
        }
        only_chld = std::mem::zeroed();
        libc::sigemptyset(&mut only_chld);
        libc::sigaddset(&mut only_chld, libc::SIGCHLD);
        sfd = libc::signalfd(-1, &only_chld, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK);
        if sfd < 0 {
            return Err(os_err("signalfd"));
        }
        let mut pipe = [0; 2];
        if libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
            return Err(os_err("pipe"));
        }
        LIVENESS_WRITE.store(pipe[1], Relaxed);
        // The request socket, moved off standard input.
        sock = libc::fcntl(0, libc::F_DUPFD_CLOEXEC, 16);
        if sock < 0 {
            return Err(os_err("the request socket"));
        }
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
        if null < 0 || libc::dup2(null, 0) < 0 {
            return Err(os_err("/dev/null"));
        }
        libc::close(null);
        serve_loop(sock, sfd, pipe[0], max as usize)
    }
}

/// Waits until one of `fds` can be read (or was closed): which ones, or `None` when a signal
/// interrupted the wait.
fn poll_in(fds: [i32; 2]) -> Result<Option<[bool; 2]>, String> {
    let mut p = fds.map(|fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    });
    // SAFETY: two valid pollfds.
    if unsafe { libc::poll(p.as_mut_ptr(), 2, -1) } < 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EINTR) {
            return Ok(None);
        }
        return Err(format!("poll: {e}"));
    }
    Ok(Some(p.map(|p| p.revents != 0)))
}

/// Receives requests until the service closes its end; forks each into its namespace.
fn serve_loop(sock: i32, sfd: i32, liveness: i32, max: usize) -> Result<(), String> {
    let mut buf = vec![0u8; MAX_REQUEST];
    let mut live = 0usize;
    loop {
        let Some(ready) = poll_in([sock, sfd])? else {
            continue;
        };
        if ready[1] {
            live = live.saturating_sub(reap(sfd));
        }
        if !ready[0] {
            continue;
        }
        let (n, flags, received) = match recv_with_fds(sock, &mut buf) {
            Ok(r) => r,
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => continue,
            Err(e) => return Err(format!("recvmsg: {e}")),
        };
        if n == 0 && received.is_empty() {
            // The service closed its end: it is gone or done. PID 1 of every call follows.
            return Ok(());
        }
        let Some(&call) = received.first() else {
            continue;
        };
        let refuse = |why: &str| {
            send_message(call, REFUSED, why.as_bytes());
            close_all(&received);
        };
        if flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0 {
            refuse("the request is too large");
            continue;
        }
        let request: Request = match serde_json::from_slice(&buf[..n]) {
            Ok(r) => r,
            Err(e) => {
                refuse(&format!("bad request: {e}"));
                continue;
            }
        };
        if received.len() != request.job.fds(&request.setup) {
            refuse("the request carries the wrong descriptors");
            continue;
        }
        if live >= max {
            refuse("too many local operations are running at once; try again shortly");
            continue;
        }
        match clone_pid1() {
            Ok(0) => child_main(&request, &received, liveness),
            Ok(_) => {
                live += 1;
                close_all(&received);
            }
            Err(e) => refuse(&e),
        }
    }
}

/// Reaps every ended child; how many. At once: a PID 1 that did a file operation runs as the
/// tools account, and until it is reaped its zombie counts against that account's
/// `RLIMIT_NPROC` (a launcher that exits without reaping leaves it to the machine's init, and
/// enough of them make every tool's `execve` fail with `EAGAIN`).
fn reap(sfd: i32) -> usize {
    let mut info = [0u8; 128];
    // SAFETY: draining the signalfd into our buffer (non-blocking).
    while unsafe { libc::read(sfd, info.as_mut_ptr().cast(), info.len()) } > 0 {}
    let mut n = 0;
    loop {
        let mut status = 0;
        // SAFETY: reaping our own children.
        if unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) } <= 0 {
            return n;
        }
        n += 1;
    }
}

fn close_all(fds: &[i32]) {
    for fd in fds {
        // SAFETY: descriptors received for this request, ours to close.
        unsafe { libc::close(*fd) };
    }
}

/// `clone3(CLONE_NEWPID)`: 0 in the child, PID 1 of a new PID namespace; its pid here.
fn clone_pid1() -> Result<libc::pid_t, String> {
    /// `struct clone_args` up to `tls` (`CLONE_ARGS_SIZE_VER0`).
    #[repr(C)]
    struct CloneArgs {
        flags: u64,
        pidfd: u64,
        child_tid: u64,
        parent_tid: u64,
        exit_signal: u64,
        stack: u64,
        stack_size: u64,
        tls: u64,
    }
    let args = CloneArgs {
        flags: libc::CLONE_NEWPID as u64,
        pidfd: 0,
        child_tid: 0,
        parent_tid: 0,
        exit_signal: libc::SIGCHLD as u64,
        stack: 0,
        stack_size: 0,
        tls: 0,
    };
    // SAFETY: like fork (no new stack, no shared memory); the process has one thread, and the
    // child only runs this module's code and system calls before it execs or exits.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &args as *const CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    if pid < 0 {
        return Err(os_err("cannot create a PID namespace (clone3)"));
    }
    Ok(pid as libc::pid_t)
}

/// Sends `[kind] + data` on a call's socket (never blocks, never raises `SIGPIPE`).
fn send_message(fd: i32, kind: u8, data: &[u8]) {
    let mut msg = Vec::with_capacity(1 + data.len().min(4096));
    msg.push(kind);
    msg.extend_from_slice(&data[..data.len().min(4095)]);
    // SAFETY: sending our own buffer.
    unsafe {
        libc::send(
            fd,
            msg.as_ptr().cast(),
            msg.len(),
            libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
        )
    };
}

/// One message and the descriptors it carries (closed on exec). `(bytes, flags, fds)`.
pub fn recv_with_fds(sock: i32, buf: &mut [u8]) -> std::io::Result<(usize, i32, Vec<i32>)> {
    let space = unsafe { libc::CMSG_SPACE((MAX_FDS * 4) as u32) } as usize;
    let mut cbuf = vec![0u64; space.div_ceil(8)];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: a zeroed msghdr is valid; every pointer set below outlives the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: a valid socket and msghdr.
    let n = unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC | libc::MSG_DONTWAIT) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut fds = Vec::new();
    // SAFETY: walking the control messages the kernel wrote into `cbuf`.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c) as *const i32;
                let count = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / 4;
                for i in 0..count {
                    fds.push(std::ptr::read_unaligned(data.add(i)));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok((n as usize, msg.msg_flags, fds))
}

/// Sends one message with descriptors. `flags`: e.g. `MSG_DONTWAIT`.
pub fn send_with_fds(sock: i32, data: &[u8], fds: &[i32], flags: i32) -> std::io::Result<()> {
    assert!(fds.len() <= MAX_FDS, "too many descriptors");
    let space = unsafe { libc::CMSG_SPACE((fds.len() * 4) as u32) } as usize;
    let mut cbuf = vec![0u64; space.div_ceil(8).max(1)];
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    // SAFETY: a zeroed msghdr is valid; every pointer set below outlives the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        // SAFETY: the control buffer holds one header and `fds.len()` descriptors.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN((fds.len() * 4) as u32) as _;
            let p = libc::CMSG_DATA(c) as *mut i32;
            for (i, fd) in fds.iter().enumerate() {
                std::ptr::write_unaligned(p.add(i), *fd);
            }
        }
    }
    // SAFETY: a valid socket and msghdr.
    let n = unsafe { libc::sendmsg(sock, &msg, flags | libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// PID 1 of a call: its descriptors at their numbers, nothing else open, then the job.
fn child_main(request: &Request, received: &[i32], liveness: i32) -> ! {
    // SAFETY: closing the server's end of the liveness pipe, which only the server may hold.
    unsafe { libc::close(LIVENESS_WRITE.load(Relaxed)) };
    let targets: &[i32] = match request.job {
        Job::Probe => &[CALL_FD],
        _ => &[CALL_FD, 0, 1, 2, WORKSPACE_FD, TMP_FD, RULESET_FD],
    };
    let mut sources: Vec<(i32, i32)> = received
        .iter()
        .copied()
        .zip(targets.iter().copied())
        .collect();
    sources.push((liveness, LIVENESS_FD));
    if let Err(e) = place(&sources) {
        // The call's socket is where it was received.
        send_message(received[0], REFUSED, e.as_bytes());
        // SAFETY: ending this child without running anything of the server's.
        unsafe { libc::_exit(SETUP_FAILED) };
    }
    let view = &request.setup.view;
    let r = match &request.job {
        Job::Probe => enter_namespace(view, false).map(|_| {
            // SAFETY: getpid has no preconditions.
            if unsafe { libc::getpid() } == 1 { 0 } else { 1 }
        }),
        Job::Run { argv, env, tty } => {
            // SAFETY: a plain system call on a descriptor placed above (the working directory
            // follows into the new namespace; the workspace's place there replaces it).
            if unsafe { libc::fchdir(WORKSPACE_FD) } != 0 {
                Err(os_err("cannot enter the workspace"))
            } else {
                enter_namespace(view, true)
                    .and_then(|workspace| match workspace {
                        // SAFETY: a plain system call on a descriptor we hold.
                        Some(w) if unsafe { libc::fchdir(w.as_raw_fd()) } != 0 => {
                            Err(os_err("cannot enter the workspace in the namespace"))
                        }
                        _ => Ok(()),
                    })
                    .and_then(|()| grant_new_proc(&request.setup))
                    .and_then(|()| init(&request.setup, argv, env, *tty))
            }
        }
        Job::File(req) => enter_namespace(view, true)
            .and_then(|_| grant_new_proc(&request.setup))
            .and_then(|()| apply(&request.setup))
            .map(|()| file_op(req)),
    };
    child_exit(r)
}

/// Moves each `(source, target)` to its target (through copies above every target, so no
/// placement overwrites a source still to be placed) and closes everything else above 2.
/// Targets 0–2 not given keep what is there (the server's `/dev/null` and standard error;
/// only a probe, which runs nothing, has them).
fn place(fds: &[(i32, i32)]) -> Result<(), String> {
    let mut high = Vec::with_capacity(fds.len());
    // SAFETY: plain system calls on descriptors this process holds.
    unsafe {
        for (src, target) in fds {
            let h = libc::fcntl(*src, libc::F_DUPFD_CLOEXEC, 64);
            if h < 0 {
                return Err(os_err("placing the call's descriptors"));
            }
            high.push((h, *target));
        }
        for (h, target) in &high {
            if libc::dup2(*h, *target) < 0 {
                return Err(os_err("placing the call's descriptors"));
            }
        }
        let top = fds
            .iter()
            .map(|(_, t)| *t)
            .max()
            .unwrap_or(2)
            .max(LIVENESS_FD);
        if libc::syscall(libc::SYS_close_range, (top + 1) as u32, u32::MAX, 0u32) != 0 {
            return Err(os_err("close_range"));
        }
        for fd in 3..=top {
            if !fds.iter().any(|(_, t)| *t == fd) {
                libc::close(fd);
            }
        }
    }
    Ok(())
}

/// Ends a child: its error on the call's socket, [`SETUP_FAILED`]; otherwise its code, also
/// sent as a wait status.
fn child_exit(r: Result<i32, String>) -> ! {
    match r {
        Ok(code) => pass_status((code & 0xff) << 8, code),
        Err(e) => {
            send_message(CALL_FD, REFUSED, e.as_bytes());
            // SAFETY: ending this process without running anything of the server's.
            unsafe { libc::_exit(SETUP_FAILED) }
        }
    }
}

/// Sends a wait status to the service and ends this process with `code`. Standard input,
/// output and error are closed first: a descriptor still open at exit is released only after
/// the namespaces' teardown, and the service reads the output up to its end.
fn pass_status(status: i32, code: i32) -> ! {
    // SAFETY: closing our own standard descriptors, then ending this process without running
    // anything of the server's.
    unsafe {
        for fd in 0..3 {
            libc::close(fd);
        }
        send_message(CALL_FD, STATUS, &status.to_ne_bytes());
        libc::_exit(code)
    }
}

/// PID 1 of the namespace: forks the command (a process like any other, so signals it sends
/// itself act as usual), passes on to the command's group a `TERM` the service asks for, reaps
/// every orphan, and when the command ends sends its wait status and exits, which ends
/// everything else in the namespace. When the service closes the call's socket it exits at
/// once.
fn init(
    setup: &Setup,
    argv: &[String],
    env: &[(String, String)],
    tty: bool,
) -> Result<i32, String> {
    let program: Vec<CString> = argv
        .iter()
        .map(|a| CString::new(a.as_bytes()).map_err(|_| "NUL in an argument".to_string()))
        .collect::<Result<_, _>>()?;
    let env: Vec<CString> = env
        .iter()
        .map(|(k, v)| {
            CString::new(format!("{k}={v}")).map_err(|_| "NUL in the environment".to_string())
        })
        .collect::<Result<_, _>>()?;
    if program.is_empty() {
        return Err("no program to run".into());
    }
    let set = forwarded_set();
    // SAFETY: a valid set, blocked since the server.
    let sfd = unsafe { libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK) };
    if sfd < 0 {
        return Err(os_err("signalfd"));
    }
    // SAFETY: the process has one thread; the child only makes system calls and execs.
    let shell = unsafe { libc::fork() };
    if shell < 0 {
        return Err(os_err("fork"));
    }
    if shell == 0 {
        // SAFETY: a plain system call.
        let r = if unsafe { libc::setsid() } < 0 {
            Err(os_err("setsid"))
        } else if tty && unsafe { libc::ioctl(0, libc::TIOCSCTTY, 0) } < 0 {
            // SAFETY (above): a plain system call on standard input, the PTY's slave end.
            Err(os_err("cannot take the terminal (TIOCSCTTY)"))
        } else {
            apply(setup).and_then(|()| exec(&program, &env))
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
    loop {
        let Some(ready) = poll_in([sfd, CALL_FD])? else {
            continue;
        };
        if ready[0] {
            // SAFETY: a zeroed siginfo is a valid buffer of its own size.
            let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
            let size = std::mem::size_of::<libc::signalfd_siginfo>();
            // SAFETY: reading siginfos into our buffer (non-blocking).
            while unsafe {
                libc::read(sfd, (&mut info as *mut libc::signalfd_siginfo).cast(), size)
            } == size as isize
            {
                let sig = info.ssi_signo as i32;
                if sig != libc::SIGCHLD {
                    // SAFETY: signalling the command's group (it leads it) and the command.
                    unsafe {
                        libc::kill(-shell, sig);
                        libc::kill(shell, sig);
                    }
                }
            }
            loop {
                let mut status = 0;
                // SAFETY: reaping our own children.
                let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
                if pid == shell {
                    pass_status(status, 0);
                }
                if pid <= 0 {
                    break;
                }
            }
        }
        if ready[1] {
            let mut byte = [0u8; 16];
            // SAFETY: reading into our buffer (non-blocking).
            let n = unsafe {
                libc::recv(
                    CALL_FD,
                    byte.as_mut_ptr().cast(),
                    byte.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n > 0 && byte[0] == TERMINATE {
                // SAFETY: signalling the command's group (it leads it) and the command.
                unsafe {
                    libc::kill(-shell, libc::SIGTERM);
                    libc::kill(shell, libc::SIGTERM);
                }
            } else if n == 0
                || (n < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EAGAIN))
            {
                // The service let go of the call: the namespace ends with PID 1.
                // SAFETY: ending this process.
                unsafe { libc::_exit(SETUP_FAILED) };
            }
        }
    }
}

/// In PID 1 of the new namespace: dies with the server, private mounts, its own `/proc` (in
/// which processes of another account, PID 1 among them, do not exist: `hidepid=2`), and the
/// service's directories hidden ([`hide`]). With `dirs` (a command or a file operation) the
/// call's workspace and tmp directory are attached where the view places them; the workspace as
/// the namespace shows it is returned, when it was placed.
fn enter_namespace(view: &View, dirs: bool) -> Result<Option<OwnedFd>, String> {
    // SAFETY: plain system calls on valid, NUL-terminated arguments.
    unsafe {
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
            return Err(os_err("PR_SET_PDEATHSIG"));
        }
        // The server may have died before the death signal was armed (its pid reads as 0
        // from inside the namespace either way): its end of the pipe is then closed.
        let mut poll = libc::pollfd {
            fd: LIVENESS_FD,
            events: libc::POLLIN,
            revents: 0,
        };
        if libc::poll(&mut poll, 1, 0) != 0 {
            return Err("the launch server is gone".into());
        }
    }
    // Copies of the workspace and the tmp directory, made before the new namespace: a
    // directory of another namespace cannot be copied from inside it, but a detached copy can
    // be attached there.
    let trees = if dirs {
        [
            view.workspace
                .as_ref()
                .map(|_| clone_tree(WORKSPACE_FD))
                .transpose()?,
            view.tmp.as_ref().map(|_| clone_tree(TMP_FD)).transpose()?,
        ]
    } else {
        [None, None]
    };
    // SAFETY: plain system calls on valid, NUL-terminated arguments.
    unsafe {
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
            c"hidepid=2".as_ptr().cast(),
        ) != 0
        {
            return Err(os_err("cannot mount /proc for the namespace"));
        }
    }
    hide(view, trees)
}

/// `open_tree(OPEN_TREE_CLONE)`: a detached copy of the directory `fd` (not of the mounts
/// beneath it).
fn clone_tree(fd: i32) -> Result<OwnedFd, String> {
    // SAFETY: an empty, NUL-terminated path on a descriptor this process holds.
    let raw = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            fd,
            c"".as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as u32 | libc::AT_EMPTY_PATH as u32,
        )
    };
    if raw < 0 {
        return Err(os_err("cannot copy a call's directory (open_tree)"));
    }
    // SAFETY: a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(raw as i32) })
}

/// `open_tree` flag: a detached copy rather than the mount itself.
const OPEN_TREE_CLONE: u32 = 1;
/// `move_mount` flags: the source, and the target, is the descriptor itself.
const MOVE_MOUNT_F_EMPTY_PATH: u32 = 0x04;
const MOVE_MOUNT_T_EMPTY_PATH: u32 = 0x40;
/// `fsconfig` commands.
const FSCONFIG_SET_STRING: u32 = 1;
const FSCONFIG_CMD_CREATE: u32 = 6;
/// `fsmount` attributes of the stand-ins: nothing on them runs or is a device.
const MOUNT_ATTR_NOSUID: u32 = 0x2;
const MOUNT_ATTR_NODEV: u32 = 0x4;
const MOUNT_ATTR_NOEXEC: u32 = 0x8;

/// One stand-in of a call's namespace: the hidden directory it replaces, and the call's
/// directories attached inside it.
#[derive(Debug)]
pub struct StandIn<'a> {
    pub hidden: &'a Hidden,
    /// Which kept directory (its index), at which path relative to the stand-in.
    pub places: Vec<(usize, PathBuf)>,
}

/// Where the call's directories go: a stand-in for each hidden directory that no other one
/// holds (in the order given), with the kept directories beneath it. A kept directory beneath
/// no hidden one stays where it is; one that holds a hidden directory (it would show it) is
/// refused, as is a path that is not absolute or holds `..`.
pub fn plan<'a>(hidden: &'a [Hidden], kept: &[Option<&Path>]) -> Result<Vec<StandIn<'a>>, String> {
    let plain = |p: &Path| {
        p.is_absolute()
            && p.components().all(|c| {
                matches!(
                    c,
                    std::path::Component::RootDir | std::path::Component::Normal(_)
                )
            })
    };
    for p in hidden
        .iter()
        .map(|h| h.path.as_path())
        .chain(kept.iter().flatten().copied())
    {
        if !plain(p) {
            return Err(format!(
                "{}: not an absolute path without `..`",
                p.display()
            ));
        }
    }
    for k in kept.iter().flatten() {
        if let Some(h) = hidden.iter().find(|h| h.path.starts_with(k)) {
            return Err(format!(
                "{} holds {}, which no tool may see",
                k.display(),
                h.path.display()
            ));
        }
    }
    let outer: Vec<&Hidden> = hidden
        .iter()
        .enumerate()
        .filter(|(i, h)| {
            !hidden.iter().enumerate().any(|(j, o)| {
                j != *i && h.path.starts_with(&o.path) && (o.path != h.path || j < *i)
            })
        })
        .map(|(_, h)| h)
        .collect();
    Ok(outer
        .into_iter()
        .map(|h| {
            let places = kept
                .iter()
                .enumerate()
                .filter_map(|(i, k)| {
                    let rel = k.and_then(|k| k.strip_prefix(&h.path).ok())?;
                    Some((i, rel.to_path_buf()))
                })
                .collect();
            StandIn { hidden: h, places }
        })
        .collect())
}

/// Replaces each hidden directory of `view` by an empty tmpfs (after finding it again by its
/// path, following no symlink, and checking it is the directory the service saw), and attaches
/// the detached copies `trees` (the workspace, the tmp directory) at their places inside. Every
/// mount is made on a descriptor. Returns the workspace's copy when it was attached.
fn hide(view: &View, trees: [Option<OwnedFd>; 2]) -> Result<Option<OwnedFd>, String> {
    let kept = [view.workspace.as_deref(), view.tmp.as_deref()];
    let plan = plan(&view.hidden, &kept)?;
    let mut placed = [false, false];
    for StandIn { hidden, places } in plan {
        let at = find_again(hidden)?;
        let stand_in = empty_tmpfs()?;
        for (_, rel) in &places {
            make_dirs(&stand_in, rel)?;
        }
        move_mount(&stand_in, &at)
            .map_err(|e| format!("cannot hide {}: {e}", hidden.path.display()))?;
        for (i, rel) in &places {
            let Some(tree) = &trees[*i] else { continue };
            let target = open_beneath(&stand_in, rel)
                .map_err(|e| format!("the place of a call's directory: {e}"))?;
            move_mount(tree, &target)
                .map_err(|e| format!("cannot attach a call's directory: {e}"))?;
            placed[*i] = true;
        }
    }
    let [workspace, _] = trees;
    Ok(workspace.filter(|_| placed[0]))
}

/// The hidden directory, found again in this namespace by its path without following any
/// symlink, and only if it is the directory the service saw.
fn find_again(hidden: &Hidden) -> Result<OwnedFd, String> {
    let root = open_absolute(&hidden.path)
        .map_err(|e| format!("cannot find {} to hide it: {e}", hidden.path.display()))?;
    // SAFETY: a zeroed stat is a valid out-parameter; a descriptor we hold.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(root.as_raw_fd(), &mut st) } != 0 {
        return Err(os_err("fstat"));
    }
    if st.st_dev != hidden.dev || st.st_ino != hidden.ino {
        return Err(format!(
            "{} is no longer the directory the service started with (restart it)",
            hidden.path.display()
        ));
    }
    Ok(root)
}

/// A new, empty, detached tmpfs (0755, root's; nothing on it runs or is a device).
fn empty_tmpfs() -> Result<OwnedFd, String> {
    // SAFETY: NUL-terminated strings; descriptors checked before use and owned once made.
    unsafe {
        let fs = libc::syscall(
            libc::SYS_fsopen,
            c"tmpfs".as_ptr(),
            1u32, /* FSOPEN_CLOEXEC */
        );
        if fs < 0 {
            return Err(os_err("cannot create a tmpfs (fsopen)"));
        }
        let fs = OwnedFd::from_raw_fd(fs as i32);
        let config = |cmd: u32, key: *const libc::c_char, value: *const libc::c_char| {
            libc::syscall(libc::SYS_fsconfig, fs.as_raw_fd(), cmd, key, value, 0)
        };
        if config(FSCONFIG_SET_STRING, c"mode".as_ptr(), c"0755".as_ptr()) != 0
            || config(FSCONFIG_CMD_CREATE, std::ptr::null(), std::ptr::null()) != 0
        {
            return Err(os_err("cannot create a tmpfs (fsconfig)"));
        }
        let mnt = libc::syscall(
            libc::SYS_fsmount,
            fs.as_raw_fd(),
            1u32, // FSMOUNT_CLOEXEC
            MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC,
        );
        if mnt < 0 {
            return Err(os_err("cannot mount a tmpfs (fsmount)"));
        }
        Ok(OwnedFd::from_raw_fd(mnt as i32))
    }
}

/// Creates each directory of `rel` beneath `root` (0755) that is not there yet.
fn make_dirs(root: &OwnedFd, rel: &Path) -> Result<(), String> {
    let mut dir = open_beneath(root, Path::new("")).map_err(|e| format!("the stand-in: {e}"))?;
    for part in rel.components() {
        let name = CString::new(part.as_os_str().as_encoded_bytes())
            .map_err(|_| "NUL in a path".to_string())?;
        // SAFETY: a descriptor we hold and a NUL-terminated name.
        if unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), 0o755) } != 0
            && std::io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST)
        {
            return Err(os_err("cannot make a place in the stand-in"));
        }
        dir = open_beneath(&dir, Path::new(part.as_os_str()))
            .map_err(|e| format!("the stand-in: {e}"))?;
    }
    Ok(())
}

/// Path resolution of the mount steps: no symlink anywhere on the way.
const NO_LINKS: u64 = libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;

/// `openat2(dir, rel, O_PATH | O_DIRECTORY)` beneath `dir`, following no symlink.
fn open_beneath(dir: &OwnedFd, rel: &Path) -> std::io::Result<OwnedFd> {
    openat2(
        dir.as_raw_fd(),
        rel,
        libc::O_PATH | libc::O_DIRECTORY,
        libc::RESOLVE_BENEATH | NO_LINKS,
    )
}

/// `openat2(AT_FDCWD, path, O_PATH | O_DIRECTORY)` of an absolute path, following no symlink.
fn open_absolute(path: &Path) -> std::io::Result<OwnedFd> {
    openat2(
        libc::AT_FDCWD,
        path,
        libc::O_PATH | libc::O_DIRECTORY,
        NO_LINKS,
    )
}

fn openat2(dir: i32, rel: &Path, flags: i32, resolve: u64) -> std::io::Result<OwnedFd> {
    super::files::openat2_at(dir, rel, flags, 0, resolve)
}

/// `move_mount` of the detached (or attached) mount `from` onto the directory `onto`.
fn move_mount(from: &OwnedFd, onto: &OwnedFd) -> std::io::Result<()> {
    // SAFETY: two descriptors we hold and empty, NUL-terminated paths.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            from.as_raw_fd(),
            c"".as_ptr(),
            onto.as_raw_fd(),
            c"".as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
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

/// Every signal back to its default action, as a command started from a terminal has it: Rust
/// ignores `SIGPIPE` in its programs, and whatever started the service may have ignored
/// `SIGINT`, `SIGQUIT` (a shell's background job) or `SIGHUP` (`nohup`) — dispositions an
/// `exec` keeps, so without this a Ctrl-C typed into a tool's terminal would not stop its
/// command. Async-signal-safe: only `signal` calls.
pub(super) fn default_signals() {
    for sig in 1..32 {
        if sig != libc::SIGKILL && sig != libc::SIGSTOP {
            // SAFETY: setting a disposition to its default; a number the kernel does not
            // know fails harmlessly.
            unsafe { libc::signal(sig, libc::SIG_DFL) };
        }
    }
}

/// Closes every descriptor above stderr, restores the signal mask and every signal's default
/// action ([`default_signals`]), execs with exactly `env`.
fn exec(program: &[CString], env: &[CString]) -> Result<(), String> {
    let mut argv: Vec<*const libc::c_char> = program.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let mut envp: Vec<*const libc::c_char> = env.iter().map(|a| a.as_ptr()).collect();
    envp.push(std::ptr::null());
    let set = forwarded_set();
    // SAFETY: valid arguments; argv and envp are NULL-terminated and outlive the call.
    unsafe {
        // The call's socket stays open until the exec (an exec that fails reports on it).
        if libc::fcntl(CALL_FD, libc::F_SETFD, libc::FD_CLOEXEC) != 0 {
            return Err(os_err("the call's socket"));
        }
        if libc::syscall(libc::SYS_close_range, 3u32, (CALL_FD - 1) as u32, 0u32) != 0
            || libc::syscall(libc::SYS_close_range, (CALL_FD + 1) as u32, u32::MAX, 0u32) != 0
        {
            return Err(os_err("close_range"));
        }
        default_signals();
        libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::execve(argv[0], argv.as_ptr(), envp.as_ptr());
    }
    Err(os_err(&format!(
        "cannot run {}",
        program[0].to_string_lossy()
    )))
}

/// One read or write as the account this process now is. Output: for a read, 8 bytes of the
/// file's size (big-endian) then the bytes; for a refusal, `KIND\tmessage` on stderr and 1.
fn file_op(req: &FileRequest) -> i32 {
    use std::sync::Arc;
    // SAFETY: the service placed these descriptors here for this process alone.
    let (ws, tmp) = unsafe {
        (
            OwnedFd::from_raw_fd(WORKSPACE_FD),
            OwnedFd::from_raw_fd(TMP_FD),
        )
    };
    let roots = super::files::Roots {
        writable: req.writable.clone(),
        readable: req.readable.clone(),
        excluded: req.excluded.clone(),
        identity: None,
        pinned: vec![
            (req.workspace.clone(), Arc::new(ws)),
            (req.tmp.clone(), Arc::new(tmp)),
        ],
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
        _ => E::Local(format!("the file helper failed: {}", text.trim())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip() {
        let r = Request {
            setup: Setup {
                identity: Some((990, 991, vec![991, 5])),
                limits: vec![(libc::RLIMIT_CPU, 600), (libc::RLIMIT_NOFILE, 1024)],
                drop_capabilities: true,
                landlock: true,
                view: View {
                    hidden: vec![Hidden {
                        path: "/var/lib/sshmode".into(),
                        dev: 2049,
                        ino: 7,
                    }],
                    workspace: Some("/var/lib/sshmode/workspaces/sections/oc_1".into()),
                    tmp: Some("/var/lib/sshmode/tmp/oc_1".into()),
                },
            },
            job: Job::Run {
                argv: vec!["/bin/sh".into(), "-c".into(), "true".into()],
                env: vec![("PATH".into(), "/bin".into())],
                tty: false,
            },
        };
        let back: Request = serde_json::from_slice(&serde_json::to_vec(&r).unwrap()).unwrap();
        assert_eq!(back.setup, r.setup);
        assert_eq!(back.job.fds(&back.setup), 7);
        assert_eq!(Job::Probe.fds(&back.setup), 1);
    }

    #[test]
    fn the_call_s_directories_are_placed_in_the_stand_in_that_holds_them() {
        let hidden = |p: &str| Hidden {
            path: p.into(),
            dev: 1,
            ino: 2,
        };
        let paths = |plan: Vec<StandIn>| -> Vec<(String, Vec<(usize, String)>)> {
            plan.into_iter()
                .map(|StandIn { hidden, places }| {
                    (
                        hidden.path.display().to_string(),
                        places
                            .into_iter()
                            .map(|(i, rel)| (i, rel.display().to_string()))
                            .collect(),
                    )
                })
                .collect()
        };
        let (ws, tmp) = (Path::new("/d/workspaces/sections/a"), Path::new("/d/tmp/a"));
        // The default layout: the workspace root inside the data directory.
        let one = [hidden("/d")];
        assert_eq!(
            paths(plan(&one, &[Some(ws), Some(tmp)]).unwrap()),
            vec![(
                "/d".into(),
                vec![(0, "workspaces/sections/a".into()), (1, "tmp/a".into())]
            )]
        );
        // A probe places nothing; a directory held by another hidden one is hidden with it.
        let nested = [hidden("/d"), hidden("/d/workspaces"), hidden("/d")];
        assert_eq!(
            paths(plan(&nested, &[None, None]).unwrap()),
            vec![("/d".into(), vec![])]
        );
        // A workspace root elsewhere has a stand-in of its own.
        let two = [hidden("/d"), hidden("/w")];
        assert_eq!(
            paths(plan(&two, &[Some(Path::new("/w/sections/a")), Some(tmp)]).unwrap()),
            vec![
                ("/d".into(), vec![(1, "tmp/a".into())]),
                ("/w".into(), vec![(0, "sections/a".into())])
            ]
        );
        // A directory beneath no hidden one stays where it is.
        assert_eq!(
            paths(plan(&one, &[Some(Path::new("/srv/a")), Some(tmp)]).unwrap()),
            vec![("/d".into(), vec![(1, "tmp/a".into())])]
        );
        // A call's directory that would show a hidden one, and paths that are not plain.
        for kept in ["/d", "/", "/w"] {
            let e = plan(&two, &[Some(Path::new(kept)), None]).unwrap_err();
            assert!(e.contains("holds"), "{e}");
        }
        for bad in ["d/tmp", "/d/../etc", "/d/tmp/.."] {
            assert!(plan(&one, &[None, Some(Path::new(bad))]).is_err(), "{bad}");
            assert!(plan(&[hidden(bad)], &[None, None]).is_err(), "{bad}");
        }
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
        let e = decode_error(b"setuid: EPERM\n");
        assert!(
            matches!(e, E::Local(ref m) if m.contains("setuid")),
            "{e:?}"
        );
    }
}
