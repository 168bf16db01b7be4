//! The service's side of the launch server ([`super::launch`]): starts it (once, and again
//! when it died), sends it one request per command or file operation, and gives the backend a
//! [`Call`] to learn the command's status and to stop it.
//!
//! The server is started from a thread of its own that waits for it, so its death signal
//! (`PR_SET_PDEATHSIG`, which follows the thread that started it) fires exactly when the
//! service dies; it also ends when its request socket closes. Its environment is empty.
//!
//! A call owns one end of a socket pair; PID 1 of the call's namespace holds the other. Closing
//! the call (dropping it) ends PID 1 and so every process of the command.
//!
//! Never: falls back to running a command without the server (a call fails instead); passes
//! the service's environment to the server; waits unboundedly for the server.

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use super::launch::{self, Job, Request};

/// Longest wait for a new server to start, and for a request to fit into its queue.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// The launch server of one `LocalHost`.
pub struct LaunchServer {
    /// The `sshmode` binary that serves (`SSHMODE_LAUNCHER`).
    exe: PathBuf,
    /// Calls the server runs at once; it refuses more.
    max_calls: usize,
    /// The running server; `None` until started or after it died.
    socket: Mutex<Option<Running>>,
}

/// A started server: its request socket, and whether it has ended (set by the thread that
/// waits for it). A server that ended is replaced before a request is sent: its socket may
/// still take one while a process of a call it started holds the other end, and nobody would
/// read it.
struct Running {
    sock: Arc<OwnedFd>,
    ended: Arc<AtomicBool>,
}

impl std::fmt::Debug for LaunchServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LaunchServer")
            .field("exe", &self.exe)
            .field("max_calls", &self.max_calls)
            .finish_non_exhaustive()
    }
}

/// How a call ended, as its socket says.
#[derive(Debug)]
pub enum Reply {
    /// The command's (or file operation's) wait status.
    Status(i32),
    /// Refused, or its set-up failed: nothing ran.
    Refused(String),
    /// The call's namespace ended without a status: the server or PID 1 was killed.
    Gone,
}

impl LaunchServer {
    /// Starts the server and checks that it can create the namespaces and show `view` in them
    /// (blocking, bounded).
    pub fn start(exe: &Path, max_calls: usize, view: launch::View) -> Result<Self, String> {
        let server = LaunchServer {
            exe: exe.to_path_buf(),
            max_calls,
            socket: Mutex::new(None),
        };
        let sock = server.socket()?;
        let (mine, theirs) = call_pair()?;
        let probe = Request {
            setup: launch::Setup {
                view,
                ..launch::Setup::default()
            },
            job: Job::Probe,
        };
        let msg = serde_json::to_vec(&probe).expect("a request serialises");
        launch::send_with_fds(sock.as_raw_fd(), &msg, &[theirs.as_raw_fd()], 0)
            .map_err(|e| format!("sending the probe: {e}"))?;
        drop(theirs);
        let mut poll = libc::pollfd {
            fd: mine.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let ready = unsafe { libc::poll(&mut poll, 1, START_TIMEOUT.as_millis() as i32) };
        if ready <= 0 {
            return Err("the namespace probe did not answer".into());
        }
        match read_reply(mine.as_raw_fd()) {
            Some(Reply::Status(0)) => Ok(server),
            Some(Reply::Refused(why)) => Err(why),
            other => Err(format!("the namespace probe failed: {other:?}")),
        }
    }

    /// The request socket of a running server, starting one when there is none (or the
    /// last one ended).
    fn socket(&self) -> Result<Arc<OwnedFd>, String> {
        let mut current = self.socket.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(r) = &*current
            && !r.ended.load(Ordering::Acquire)
        {
            return Ok(r.sock.clone());
        }
        let (sock, ended) = spawn(&self.exe, self.max_calls)?;
        let sock = Arc::new(sock);
        *current = Some(Running {
            sock: sock.clone(),
            ended,
        });
        Ok(sock)
    }

    /// Forgets `dead` (a server that no longer answers), so the next call starts a new one.
    fn forget(&self, dead: &Arc<OwnedFd>) {
        let mut current = self.socket.lock().unwrap_or_else(|p| p.into_inner());
        if current.as_ref().is_some_and(|r| Arc::ptr_eq(&r.sock, dead)) {
            *current = None;
        }
    }

    /// Sends `request` with `fds` (as [`Job`] lists them, without the call's socket, which is
    /// made here). A server that died is replaced once; a request that cannot be sent fails.
    pub async fn call(&self, request: &Request, fds: &[BorrowedFd<'_>]) -> Result<Call, String> {
        let msg = serde_json::to_vec(request).expect("a request serialises");
        if msg.len() > launch::MAX_REQUEST {
            return Err(format!(
                "the command is too long for the launcher ({} bytes; at most {})",
                msg.len(),
                launch::MAX_REQUEST
            ));
        }
        let (mine, theirs) = call_pair()?;
        let mut raw = vec![theirs.as_raw_fd()];
        raw.extend(fds.iter().map(|f| f.as_raw_fd()));
        let mut restarted = false;
        let deadline = tokio::time::Instant::now() + START_TIMEOUT;
        loop {
            let sock = self.socket()?;
            match launch::send_with_fds(sock.as_raw_fd(), &msg, &raw, libc::MSG_DONTWAIT) {
                Ok(()) => break,
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {
                    if tokio::time::Instant::now() >= deadline {
                        return Err("the launch server does not take requests".into());
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                Err(e) if !restarted => {
                    tracing::warn!(error = %e, "the launch server is gone; starting a new one");
                    self.forget(&sock);
                    restarted = true;
                }
                Err(e) => return Err(format!("the launch server cannot be reached: {e}")),
            }
        }
        drop(theirs);
        // SAFETY: the call owns this descriptor and never replaces or closes it while
        // registered (it is closed when the `AsyncFd` drops).
        let sock = unsafe { AsyncFd::register_with_interest(mine, Interest::READABLE) }
            .map_err(|e| format!("watching the call: {e}"))?;
        Ok(Call { sock })
    }
}

/// One running call. Dropping it ends the command's namespace.
pub struct Call {
    sock: AsyncFd<OwnedFd>,
}

impl Call {
    /// Waits for how the call ended.
    pub async fn wait(&self) -> Reply {
        loop {
            let Ok(mut guard) = self.sock.readable().await else {
                return Reply::Gone;
            };
            match read_reply(self.sock.get_ref().as_raw_fd()) {
                None => guard.clear_ready(),
                Some(r) => return r,
            }
        }
    }

    /// Asks PID 1 to pass `TERM` to the command's group.
    pub fn terminate(&self) {
        // SAFETY: sending one byte of ours on our socket.
        unsafe {
            libc::send(
                self.sock.get_ref().as_raw_fd(),
                [launch::TERMINATE].as_ptr().cast(),
                1,
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
    }
}

/// The next reply on a call's socket; `None` when none is there yet.
fn read_reply(fd: i32) -> Option<Reply> {
    let mut buf = [0u8; 4096];
    // SAFETY: reading into our buffer (non-blocking).
    let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EINTR) => None,
            _ => Some(Reply::Gone),
        };
    }
    let msg = &buf[..n as usize];
    Some(match msg.split_first() {
        Some((&launch::STATUS, s)) if s.len() == 4 => {
            Reply::Status(i32::from_ne_bytes(s.try_into().expect("4 bytes")))
        }
        Some((&launch::REFUSED, why)) => Reply::Refused(String::from_utf8_lossy(why).into()),
        _ => Reply::Gone,
    })
}

/// A call's socket pair: `(the service's end, non-blocking; PID 1's end)`.
fn call_pair() -> Result<(OwnedFd, OwnedFd), String> {
    let mut fds = [0; 2];
    // SAFETY: a valid out-array of two.
    if unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    } != 0
    {
        return Err(format!("socketpair: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: fresh descriptors we own.
    let (mine, theirs) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: setting a flag on our own descriptor.
    unsafe { libc::fcntl(mine.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) };
    Ok((mine, theirs))
}

/// Starts `exe __sshmode-launch serve` from a thread that waits for it (its death signal
/// follows that thread), with an empty environment, in a session of its own; returns the
/// service's end of its request socket.
fn spawn(exe: &Path, max_calls: usize) -> Result<(OwnedFd, Arc<AtomicBool>), String> {
    let (mine, theirs) = call_pair()?;
    let ended = Arc::new(AtomicBool::new(false));
    let ended_here = ended.clone();
    let shown = exe.display().to_string();
    let exe = exe.to_path_buf();
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name("sshmode-launch".into())
        .spawn(move || {
            use std::os::unix::process::CommandExt;
            let mut cmd = std::process::Command::new(&exe);
            cmd.args([launch::SUBCOMMAND, "serve", "--parent"])
                .arg(std::process::id().to_string())
                .arg("--max")
                .arg(max_calls.to_string())
                .env_clear()
                .stdin(std::process::Stdio::from(theirs))
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::inherit());
            // SAFETY: setsid is async-signal-safe and touches no memory.
            unsafe {
                cmd.pre_exec(|| {
                    if libc::setsid() < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
            match cmd.spawn() {
                Ok(mut child) => {
                    let _ = tx.send(Ok(child.id()));
                    // Waits as long as the server lives (it ends with its request socket).
                    let status = child.wait();
                    ended_here.store(true, Ordering::Release);
                    tracing::debug!(launcher.status = ?status, "the launch server ended");
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                }
            }
        })
        .map_err(|e| format!("cannot start a thread for the launch server: {e}"))?;
    match rx.recv_timeout(START_TIMEOUT) {
        Ok(Ok(pid)) => {
            tracing::debug!(launcher.pid = pid, "launch server started");
            Ok((mine, ended))
        }
        Ok(Err(e)) => Err(format!("cannot start the launch server {shown}: {e}")),
        Err(_) => Err("the launch server did not start in time".into()),
    }
}
