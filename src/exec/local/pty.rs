//! A PTY on the service's own machine: the service opens the pair (`openpty`), and the launch
//! server starts the section's shell with the slave end as its standard input, output and
//! error — under the same account, namespaces, limits and Landlock ruleset as a command — and
//! the shell makes it its controlling terminal (`setsid`, then `TIOCSCTTY`), so Ctrl-C and job
//! control work. The service keeps the master end; closing the call ends PID 1 and so every
//! process of the shell.
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
use crate::exec::pty::{PtyHost, PtyInput, PtyIo, PtyOutput, Size};

/// Most local shells at once: within the launch server's room beyond the command slots.
const LOCAL_SHELLS: usize = 8;

#[async_trait]
impl PtyHost for LocalBackend {
    fn name(&self) -> &str {
        "local"
    }

    fn location(&self) -> String {
        "local".into()
    }

    fn shell_budget(&self) -> usize {
        LOCAL_SHELLS
    }

    async fn open_pty(&self, size: Size, term: &str) -> Result<PtyIo, ExecError> {
        let Some(server) = self.host.sandbox.launcher() else {
            return Err(ExecError::Local(
                "interactive local shells need the launch server (SSHMODE_LAUNCHER), which is not running here".into(),
            ));
        };
        let dirs = self.open_dirs()?;
        let prepared = self.prepare(&dirs)?;
        let local = |what: &str, e: std::io::Error| {
            ExecError::Local(format!("cannot open a terminal ({what}): {e}"))
        };
        let (master, slave) = open_pair(size).map_err(|e| local("openpty", e))?;
        let shell = LocalHost::shell();
        let mut env = self
            .host
            .sandbox
            .environment(&self.workspace, &self.tmp, shell);
        env.retain(|(k, _)| k != "TERM");
        env.push(("TERM".into(), term.to_string()));
        let request = launch::Request {
            setup: prepared.launch_setup(),
            job: launch::Job::Run {
                argv: vec![shell.into(), "-i".into()],
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
            input: Arc::new(Input {
                master,
                call: Mutex::new(Some(call)),
            }),
        })
    }
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
