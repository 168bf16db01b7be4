//! A PTY on the service's own machine: the service opens the pair (`openpty`), and the launch
//! server starts the section's shell with the slave end as its standard input, output and
//! error — under the same account, namespaces, limits and Landlock ruleset as a command — and
//! the shell makes it its controlling terminal (`setsid`, then `TIOCSCTTY`), so Ctrl-C and job
//! control work. The service keeps the master end; closing the call ends PID 1 and so every
//! process of the shell.
//!
//! The shell starts without start-up files (`--noprofile --norc`, no `.inputrc`): a file in
//! the workspace (its `HOME`) would otherwise run before any line is judged, or rebind keys so
//! that the line run differs from the line typed. It starts with the caller's prelude defined
//! (a `read` workspace's read-only `git`, as a terminal command runs behind it), given to bash
//! as an exported function: a shell with a prelude needs bash.
//!
//! The terminal's state ([`crate::exec::pty::probe`]) is read from the master end: the session
//! (`TIOCGSID`: the shell's pid, which leads it), the foreground group (`TIOCGPGRP`) and the
//! slave's modes (`tcgetattr`), then the group leader's `/proc/<pid>/stat` and `cwd`.
//!
//! Never: starts a shell without the launch server (nothing else isolates it as a command is);
//! keeps the slave end once the shell has it.

use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use super::{LocalBackend, LocalHost, launch, server};
use crate::exec::ExecError;
use crate::exec::pty::probe::{Leader, PtyProbe, Stat, TtyState};
use crate::exec::pty::{PtyHost, PtyInput, PtyIo, PtyOutput, Size};

/// Most local shells at once: within the launch server's room beyond the command slots.
const LOCAL_SHELLS: usize = 8;

/// Where a local shell opens: the section's backend, and the prelude its shell starts with.
pub struct ShellHost {
    backend: LocalBackend,
    /// One shell function definition (`name() { … }`), or empty.
    prelude: &'static str,
}

impl LocalBackend {
    /// This backend as a shell's host whose shell starts with `prelude` (one shell function
    /// definition, or empty) defined.
    pub fn shell_host(self, prelude: &'static str) -> ShellHost {
        ShellHost {
            backend: self,
            prelude,
        }
    }
}

#[async_trait]
impl PtyHost for ShellHost {
    fn name(&self) -> &str {
        "local"
    }

    fn location(&self) -> String {
        "local".into()
    }

    fn shell_budget(&self) -> usize {
        LOCAL_SHELLS
    }

    fn read_only(&self) -> bool {
        !self.backend.workspace_writable
    }

    async fn open_pty(&self, size: Size, term: &str) -> Result<PtyIo, ExecError> {
        let this = &self.backend;
        let Some(server) = this.host.sandbox.launcher() else {
            return Err(ExecError::Local(
                "interactive local shells need the launch server (SSHMODE_LAUNCHER), which is not running here".into(),
            ));
        };
        let dirs = this.open_dirs()?;
        let prepared = this.prepare(&dirs)?;
        let local = |what: &str, e: std::io::Error| {
            ExecError::Local(format!("cannot open a terminal ({what}): {e}"))
        };
        let shell = LocalHost::shell();
        let bash = shell.ends_with("/bash");
        let prelude = match (self.prelude.trim(), bash) {
            ("", _) => None,
            (text, true) => Some(exported(text).ok_or_else(|| {
                ExecError::Local("the shell's prelude is not one function definition".into())
            })?),
            (_, false) => {
                return Err(ExecError::Local(
                    "an interactive shell in this workspace needs bash (it defines the read-only git), which is not installed here".into(),
                ));
            }
        };
        let (master, slave) = open_pair(size).map_err(|e| local("openpty", e))?;
        let mut env = this
            .host
            .sandbox
            .environment(&this.workspace, &this.tmp, shell);
        env.retain(|(k, _)| k != "TERM");
        env.push(("TERM".into(), term.to_string()));
        env.push(("INPUTRC".into(), "/dev/null".into()));
        let mut argv = vec![shell.to_string()];
        if bash {
            argv.extend(["--noprofile".into(), "--norc".into()]);
        }
        argv.push("-i".into());
        env.extend(prelude);
        let request = launch::Request {
            setup: prepared.launch_setup(),
            job: launch::Job::Run {
                argv,
                env,
                tty: true,
            },
        };
        let call = {
            let mut fds = vec![slave.as_fd(), slave.as_fd(), slave.as_fd()];
            fds.extend(prepared.launch_fds());
            server.call(&request, &fds).await
        }
        .map_err(|e| ExecError::Local(format!("the shell was not started: {e}")))?;
        // Only the shell holds the slave end now: the master reads end of file (EIO) once
        // every process of the shell has let go of it.
        drop(slave);
        // SAFETY: the shell's terminal owns this descriptor and never replaces or closes it
        // while registered (it is closed when the `AsyncFd` drops).
        let master = unsafe {
            AsyncFd::register_with_interest(master, Interest::READABLE | Interest::WRITABLE)
        }
        .map_err(|e| local("the master end", e.into()))?;
        let master = Arc::new(master);
        let call = Arc::new(call);
        Ok(PtyIo {
            output: Box::new(Output {
                master: master.clone(),
                call: call.clone(),
            }),
            probe: Arc::new(Probe {
                master: master.clone(),
            }),
            input: Arc::new(Input {
                master,
                call: Mutex::new(Some(call)),
            }),
        })
    }
}

/// One function definition (`name() { … }`) as bash imports an exported function:
/// `BASH_FUNC_name%%=() { … }`.
fn exported(definition: &str) -> Option<(String, String)> {
    let (name, body) = definition.split_once("()")?;
    let name = name.trim();
    let ok = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    let body = body.trim_start();
    (ok && body.starts_with('{')).then(|| (format!("BASH_FUNC_{name}%%"), format!("() {body}")))
}

/// `openpty` with the size set; the master non-blocking, both closed on exec.
fn open_pair(size: Size) -> std::io::Result<(OwnedFd, OwnedFd)> {
    let (mut m, mut s) = (-1, -1);
    let ws = libc::winsize {
        ws_row: size.rows,
        ws_col: size.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: valid out-pointers and a winsize that outlives the call.
    let r = unsafe { libc::openpty(&mut m, &mut s, std::ptr::null_mut(), std::ptr::null(), &ws) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: descriptors openpty just returned, owned from here on.
    let (m, s) = unsafe { (OwnedFd::from_raw_fd(m), OwnedFd::from_raw_fd(s)) };
    for fd in [m.as_raw_fd(), s.as_raw_fd()] {
        // SAFETY: plain fcntl calls on descriptors we own.
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    }
    // SAFETY: as above.
    unsafe {
        let flags = libc::fcntl(m.as_raw_fd(), libc::F_GETFL);
        libc::fcntl(m.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK);
    }
    Ok((m, s))
}

/// Reads the terminal's state from the master end and `/proc`.
struct Probe {
    master: Arc<AsyncFd<OwnedFd>>,
}

#[async_trait]
impl PtyProbe for Probe {
    async fn probe(&self) -> TtyState {
        let master = self.master.clone();
        tokio::task::spawn_blocking(move || probe(master.get_ref().as_raw_fd()))
            .await
            .unwrap_or_default()
    }
}

/// The state of the terminal whose master end is `fd`.
fn probe(fd: i32) -> TtyState {
    let mut sid: libc::pid_t = 0;
    let mut pgrp: libc::pid_t = 0;
    // SAFETY: TIOCGSID and TIOCGPGRP write one pid_t each; on a master end they answer for the
    // slave (its session and foreground group).
    let shell = (unsafe { libc::ioctl(fd, libc::TIOCGSID, &mut sid) } == 0 && sid > 0)
        .then_some(sid as u32);
    let foreground = (unsafe { libc::ioctl(fd, libc::TIOCGPGRP, &mut pgrp) } == 0 && pgrp > 0)
        .then_some(pgrp as u32);
    // SAFETY: a zeroed termios is a valid buffer for tcgetattr, which on a master end reads
    // the slave's modes.
    let mut t: libc::termios = unsafe { std::mem::zeroed() };
    let modes = (unsafe { libc::tcgetattr(fd, &mut t) } == 0).then_some(t.c_lflag);
    TtyState {
        shell,
        foreground,
        leader: foreground.and_then(leader),
        echo: modes.map(|f| f & libc::ECHO != 0),
        canonical: modes.map(|f| f & libc::ICANON != 0),
        now: boot_ticks(),
    }
}

/// The process `pid` as a group leader: from its `/proc` entry.
fn leader(pid: u32) -> Option<Leader> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let stat = Stat::parse(&stat)?;
    let cwd = std::fs::read_link(format!("/proc/{pid}/cwd"))
        .ok()
        .and_then(|p| p.to_str().map(str::to_owned));
    Some(Leader {
        pid: stat.pid,
        ppid: stat.ppid,
        start: stat.start,
        name: stat.name,
        cwd,
    })
}

/// Now in clock ticks since boot, the clock of `/proc/<pid>/stat`'s start times.
fn boot_ticks() -> Option<u64> {
    // SAFETY: sysconf has no preconditions.
    let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).ok()?;
    // SAFETY: a zeroed timespec is a valid buffer for clock_gettime.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    if unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) } != 0 {
        return None;
    }
    let nanos =
        u128::try_from(ts.tv_sec).ok()? * 1_000_000_000 + u128::try_from(ts.tv_nsec).ok()?;
    u64::try_from(nanos * u128::from(hz) / 1_000_000_000).ok()
}

struct Output {
    master: Arc<AsyncFd<OwnedFd>>,
    /// Held so the shell's namespace lives while its output is read.
    call: Arc<server::Call>,
}

#[async_trait]
impl PtyOutput for Output {
    async fn next(&mut self) -> Option<Vec<u8>> {
        let _ = &self.call;
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let mut guard = self.master.readable().await.ok()?;
            // SAFETY: reading into our own buffer from a descriptor we own.
            let n = unsafe {
                libc::read(
                    self.master.get_ref().as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                )
            };
            if n > 0 {
                buf.truncate(n as usize);
                return Some(buf);
            }
            let e = std::io::Error::last_os_error();
            if n < 0 && e.kind() == std::io::ErrorKind::WouldBlock {
                guard.clear_ready();
                continue;
            }
            // End of file, or EIO once the shell and its children closed the slave end.
            return None;
        }
    }
}

struct Input {
    master: Arc<AsyncFd<OwnedFd>>,
    /// Dropping the call ends PID 1 of the shell's namespace, and every process in it.
    call: Mutex<Option<Arc<server::Call>>>,
}

#[async_trait]
impl PtyInput for Input {
    async fn send(&self, mut data: &[u8]) -> Result<(), ExecError> {
        while !data.is_empty() {
            let mut guard = self
                .master
                .writable()
                .await
                .map_err(|e| ExecError::Local(format!("the terminal: {e}")))?;
            // SAFETY: writing our own bytes to a descriptor we own.
            let n = unsafe {
                libc::write(
                    self.master.get_ref().as_raw_fd(),
                    data.as_ptr().cast(),
                    data.len(),
                )
            };
            if n >= 0 {
                data = &data[n as usize..];
                continue;
            }
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::WouldBlock {
                guard.clear_ready();
                continue;
            }
            return Err(ExecError::Local(format!("the terminal: {e}")));
        }
        Ok(())
    }

    async fn close(&self) {
        let call = self.call.lock().expect("pty lock").take();
        if let Some(call) = call {
            call.terminate();
        }
    }
}
