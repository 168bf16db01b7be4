//! A PTY on a target: a session channel of the target's pooled connection (one channel permit
//! of the pool, held while the shell lives) with `pty-req` (full terminal modes) and then an
//! `exec` of a wrapper that prints its pid behind a one-time marker and replaces itself with
//! the user's login shell (`$SHELL -l`, the same process: the session leader sshd made), each
//! confirmed by the server before the shell counts as open. The marker is read from the first
//! output, before anything can be typed (what a login script prints first is passed through);
//! the pid is never read from the output again. The shell's drain task (`exec::pty`) reads the
//! channel continuously.
//!
//! The terminal's state ([`crate::exec::pty::probe`]) is read by a short script on a second
//! channel of the same connection, as the remote kill is: the shell's `/proc/<pid>/stat` (its
//! group, its terminal, the foreground group), the foreground leader's `stat` and directory,
//! its own start (now), and `stty -a` on the shell's terminal — each hex-encoded, so nothing a
//! process names itself or a directory is called can pose as another field. Bounded by
//! [`PROBE_WAIT`]; whatever it cannot read is unknown.
//!
//! Never: opens outside the pool's channel budget; calls a shell open the server refused;
//! takes the shell's pid from anything but the wrapper's first line.

use std::sync::Arc;

use async_trait::async_trait;
use russh::client::Msg;
use russh::{ChannelMsg, ChannelReadHalf, ChannelWriteHalf, Pty};

use std::time::Duration;

use super::{Conn, Lease, SshBackend, TargetPool, beside};
use crate::exec::ExecError;
use crate::exec::pty::probe::{self, Leader, PtyProbe, Stat, TtyState};
use crate::exec::pty::{PtyHost, PtyInput, PtyIo, PtyOutput, Size};

/// Most shells per target: half the pool's channels, and never more than this.
const MAX_SHELLS: usize = 8;
/// Most output read before the shell's pid line (login scripts may print first).
const PID_SCAN_MAX: usize = 64 * 1024;
/// The longest a read of the terminal's state may take.
pub const PROBE_WAIT: Duration = Duration::from_secs(5);
/// Most bytes a probe prints (hex of a few short texts).
const PROBE_BYTES: usize = 64 * 1024;

/// Terminal modes for `pty-req`, as an interactive terminal has them: the usual control
/// characters, signals, canonical input with echo, CR→NL on input, NL→CRNL on output, 8 bits.
const MODES: &[(Pty, u32)] = &[
    (Pty::VINTR, 3),
    (Pty::VQUIT, 28),
    (Pty::VERASE, 127),
    (Pty::VKILL, 21),
    (Pty::VEOF, 4),
    (Pty::VSTART, 17),
    (Pty::VSTOP, 19),
    (Pty::VSUSP, 26),
    (Pty::VWERASE, 23),
    (Pty::VLNEXT, 22),
    (Pty::ICRNL, 1),
    (Pty::IXON, 0),
    (Pty::IUTF8, 1),
    (Pty::ISIG, 1),
    (Pty::ICANON, 1),
    (Pty::ECHO, 1),
    (Pty::ECHOE, 1),
    (Pty::ECHOK, 1),
    (Pty::ECHOCTL, 1),
    (Pty::ECHOKE, 1),
    (Pty::IEXTEN, 1),
    (Pty::OPOST, 1),
    (Pty::ONLCR, 1),
    (Pty::CS8, 1),
    (Pty::TTY_OP_ISPEED, 38400),
    (Pty::TTY_OP_OSPEED, 38400),
];

#[async_trait]
impl PtyHost for SshBackend {
    fn name(&self) -> &str {
        self.pool.alias()
    }

    fn location(&self) -> String {
        self.pool.target.location()
    }

    fn shell_budget(&self) -> usize {
        let c = &self.pool.config;
        (c.ssh_max_connections * c.ssh_channels_per_connection / 2).min(MAX_SHELLS)
    }

    async fn open_pty(&self, size: Size, term: &str) -> Result<PtyIo, ExecError> {
        open(&self.pool, size, term).await
    }
}

async fn open(pool: &Arc<TargetPool>, size: Size, term: &str) -> Result<PtyIo, ExecError> {
    let (lease, channel) = pool.channel().await?;
    let (mut rx, tx) = channel.split();
    let mut early = Vec::new();
    let marker = format!("__sshmode_shell_{}__", uuid::Uuid::new_v4().simple());
    let asked = async {
        tx.request_pty(true, term, size.cols as u32, size.rows as u32, 0, 0, MODES)
            .await
            .map_err(|e| pool.lost(e))?;
        confirmed(&mut rx, &mut early, "a terminal (pty-req)")
            .await
            .map_err(|why| pool.lost(why))?;
        tx.exec(true, login(&marker).into_bytes())
            .await
            .map_err(|e| pool.lost(e))?;
        confirmed(&mut rx, &mut early, "a shell")
            .await
            .map_err(|why| pool.lost(why))?;
        Ok::<_, ExecError>(shell_pid(&mut rx, &mut early, &marker).await)
    };
    let pid = match tokio::time::timeout(pool.config.ssh_connect_timeout, asked).await {
        Ok(Ok(pid)) => pid,
        Ok(Err(e)) => {
            let _ = tx.close().await;
            return Err(e);
        }
        Err(_) => {
            let _ = tx.close().await;
            return Err(pool.lost("the server did not answer the terminal request"));
        }
    };
    if pid.is_none() {
        tracing::debug!(ssh.target = %pool.alias(), "the shell did not report its pid: its terminal state cannot be read");
    }
    let probe: Arc<dyn PtyProbe> = match pid {
        Some(pid) => Arc::new(Probe {
            conn: lease.conn.clone(),
            pid,
        }),
        None => Arc::new(probe::Unknown),
    };
    Ok(PtyIo {
        output: Box::new(Output {
            early: Some(early).filter(|e| !e.is_empty()),
            rx,
        }),
        input: Arc::new(Input {
            tx,
            alias: pool.alias().to_string(),
            _lease: lease,
        }),
        probe,
    })
}

/// The command the channel runs: the pid line behind `marker`, then the user's login shell in
/// the same process.
fn login(marker: &str) -> String {
    format!("printf '%s%s\\n' {marker} \"$$\"; exec \"${{SHELL:-/bin/sh}}\" -l")
}

/// Reads the first output until the wrapper's pid line (bounded by [`PID_SCAN_MAX`]; the
/// caller bounds the time), keeping what came before it in `early` and what follows it too.
async fn shell_pid(rx: &mut ChannelReadHalf, early: &mut Vec<u8>, marker: &str) -> Option<u32> {
    let m = marker.as_bytes();
    loop {
        if let Some(at) = early.windows(m.len()).position(|w| w == m) {
            let after = at + m.len();
            if let Some(nl) = early[after..].iter().position(|b| *b == b'\n') {
                let digits = &early[after..after + nl];
                let digits = digits.strip_suffix(b"\r").unwrap_or(digits);
                let pid = std::str::from_utf8(digits)
                    .ok()
                    .filter(|d| {
                        !d.is_empty() && d.len() <= 10 && d.bytes().all(|b| b.is_ascii_digit())
                    })
                    .and_then(|d| d.parse::<u32>().ok())
                    .filter(|p| *p > 1);
                early.drain(at..after + nl + 1);
                return pid;
            }
        }
        if early.len() > PID_SCAN_MAX {
            return None;
        }
        match rx.wait().await? {
            ChannelMsg::Data { data } | ChannelMsg::ExtendedData { data, .. } => {
                early.extend_from_slice(&data);
            }
            ChannelMsg::Close | ChannelMsg::Eof => return None,
            _ => {}
        }
    }
}

/// Reads a target shell's terminal state through a second channel of its connection.
struct Probe {
    conn: Arc<Conn>,
    /// The shell's pid, from its wrapper's first line.
    pid: u32,
}

#[async_trait]
impl PtyProbe for Probe {
    async fn probe(&self) -> TtyState {
        let script = probe_script(self.pid);
        match tokio::time::timeout(PROBE_WAIT, beside(&self.conn, &script, PROBE_BYTES)).await {
            Ok(Ok(out)) => parse_probe(&String::from_utf8_lossy(&out)),
            _ => TtyState::default(),
        }
    }
}

/// The probe of shell `pid`: tagged lines, each value hex-encoded (`S` the shell's stat, `N`
/// the probe's own, `L` the foreground leader's, `C` its directory, `T` `stty -a` of the
/// shell's terminal when it is a pseudo-terminal).
fn probe_script(pid: u32) -> String {
    format!(
        "h() {{ od -An -v -tx1 | tr -d ' \\n'; echo; }}\n\
         p={pid}\n\
         read -r s < /proc/$p/stat || exit 0\n\
         printf 'S '; h < /proc/$p/stat\n\
         printf 'N '; h < /proc/self/stat\n\
         set -- ${{s##*) }}\n\
         t=$6; d=$5\n\
         if [ \"$t\" -gt 0 ] 2>/dev/null && [ -r /proc/$t/stat ]; then\n\
         printf 'L '; h < /proc/$t/stat\n\
         printf 'C '; (cd /proc/$t/cwd 2>/dev/null && pwd -P) | h\n\
         fi\n\
         M=$(( (d >> 8) & 4095 )); m=$(( (d & 255) | ((d >> 12) & 1048320) ))\n\
         if [ \"$M\" -ge 136 ] && [ \"$M\" -le 143 ]; then\n\
         printf 'T '; stty -a < /dev/pts/$(( (M - 136) * 256 + m )) 2>/dev/null | h\n\
         fi\n"
    )
}

/// The terminal state a probe's output says.
fn parse_probe(out: &str) -> TtyState {
    let field = |tag: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(tag)?.strip_prefix(' '))
            .and_then(unhex)
    };
    let shell = field("S").as_deref().and_then(Stat::parse);
    let leader = field("L").as_deref().and_then(Stat::parse);
    let (echo, canonical) = field("T")
        .as_deref()
        .map(probe::stty_flags)
        .unwrap_or_default();
    let cwd = field("C")
        .map(|c| c.strip_suffix('\n').unwrap_or(&c).to_string())
        .filter(|c| c.starts_with('/'));
    TtyState {
        shell: shell.as_ref().map(|s| s.pgrp),
        foreground: shell.as_ref().and_then(Stat::foreground),
        leader: leader.map(|l| Leader {
            pid: l.pid,
            ppid: l.ppid,
            start: l.start,
            name: l.name,
            cwd,
        }),
        echo,
        canonical,
        now: field("N").as_deref().and_then(Stat::parse).map(|s| s.start),
    }
}

/// Hex digits (as `od -tx1` prints them) as text; `None` when they are not hex.
fn unhex(hex: &str) -> Option<String> {
    let hex = hex.trim();
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect();
    Some(String::from_utf8_lossy(&bytes?).into_owned())
}

/// Waits for the server's answer to a request; output that arrives first is kept.
async fn confirmed(
    rx: &mut ChannelReadHalf,
    early: &mut Vec<u8>,
    what: &str,
) -> Result<(), String> {
    loop {
        match rx.wait().await {
            Some(ChannelMsg::Success) => return Ok(()),
            Some(ChannelMsg::Failure) => return Err(format!("the server refused {what}")),
            Some(ChannelMsg::Data { data }) | Some(ChannelMsg::ExtendedData { data, .. }) => {
                if early.len() < 64 * 1024 {
                    early.extend_from_slice(&data);
                }
            }
            Some(ChannelMsg::Close) | Some(ChannelMsg::Eof) | None => {
                return Err(format!(
                    "the channel closed before the server granted {what}"
                ));
            }
            Some(_) => {}
        }
    }
}

struct Output {
    /// Output read while the requests were confirmed.
    early: Option<Vec<u8>>,
    rx: ChannelReadHalf,
}

#[async_trait]
impl PtyOutput for Output {
    async fn next(&mut self) -> Option<Vec<u8>> {
        if let Some(e) = self.early.take() {
            return Some(e);
        }
        loop {
            match self.rx.wait().await? {
                ChannelMsg::Data { data } | ChannelMsg::ExtendedData { data, .. } => {
                    return Some(data.to_vec());
                }
                ChannelMsg::Close => return None,
                _ => {}
            }
        }
    }
}

/// The channel's writing half, holding the pool's channel permit while the shell lives.
struct Input {
    tx: ChannelWriteHalf<Msg>,
    alias: String,
    _lease: Lease,
}

#[async_trait]
impl PtyInput for Input {
    async fn send(&self, data: &[u8]) -> Result<(), ExecError> {
        self.tx
            .data_bytes(data.to_vec())
            .await
            .map_err(|e| ExecError::Connection {
                alias: self.alias.clone(),
                reason: e.to_string(),
            })
    }

    async fn close(&self) {
        let _ = self.tx.eof().await;
        let _ = self.tx.close().await;
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::os::unix::process::CommandExt;

    use super::*;

    #[test]
    fn hex_fields_are_read_and_nothing_else() {
        let hex = |s: &str| s.bytes().map(|b| format!("{b:02x}")).collect::<String>();
        let out = format!(
            "S {}\nN {}\nL {}\nC {}\nT {}\n",
            hex("77 (bash) S 70 77 77 34816 80 4194560 1 0 0 0 0 0 0 0 20 0 1 0 500 1"),
            hex("90 (sh) R 89 90 90 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 999 1"),
            hex("80 (vim\nC 2f) S 77 80 77 34816 80 4194560 1 0 0 0 0 0 0 0 20 0 1 0 700 1"),
            hex("/srv/a b\n"),
            hex("isig icanon -echo"),
        );
        let st = parse_probe(&out);
        assert_eq!(
            (st.shell, st.foreground, st.now),
            (Some(77), Some(80), Some(999))
        );
        let l = st.leader.unwrap();
        assert_eq!((l.pid, l.ppid, l.start), (80, 77, 700));
        assert_eq!(l.name, "vim\nC 2f");
        assert_eq!(l.cwd.as_deref(), Some("/srv/a b"));
        assert_eq!((st.echo, st.canonical), (Some(false), Some(true)));
        assert_eq!(parse_probe(""), TtyState::default());
        assert_eq!(parse_probe("S zz\n").shell, None);
    }

    /// The probe script, run by each POSIX shell here against a process that leads its own
    /// session on a fresh terminal, as sshd's child does.
    #[test]
    fn the_probe_reads_a_real_terminal() {
        let (mut m, mut s) = (-1, -1);
        // SAFETY: valid out-pointers; no name, termios or size.
        let r = unsafe {
            libc::openpty(
                &mut m,
                &mut s,
                std::ptr::null_mut(),
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        assert_eq!(r, 0);
        // SAFETY: descriptors openpty just returned.
        let (master, slave) = unsafe { (OwnedFd::from_raw_fd(m), OwnedFd::from_raw_fd(s)) };
        let mut cmd = std::process::Command::new("sleep");
        cmd.arg("30")
            .stdin(slave.try_clone().unwrap())
            .stdout(slave.try_clone().unwrap())
            .stderr(slave);
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().unwrap();
        let pid = child.id();
        let here = std::env::current_dir().unwrap().canonicalize().unwrap();
        for shell in ["/bin/sh", "/bin/bash", "/bin/dash"] {
            if !std::path::Path::new(shell).exists() {
                continue;
            }
            let out = std::process::Command::new(shell)
                .arg("-c")
                .arg(probe_script(pid))
                .output()
                .unwrap();
            let st = parse_probe(&String::from_utf8_lossy(&out.stdout));
            assert_eq!(st.shell, Some(pid), "{shell}: {out:?}");
            assert_eq!(st.foreground, Some(pid), "{shell}");
            let l = st.leader.clone().expect("the leader");
            assert_eq!((l.pid, l.name.as_str()), (pid, "sleep"), "{shell}");
            assert_eq!(l.cwd.as_deref(), here.to_str(), "{shell}");
            assert_eq!((st.echo, st.canonical), (Some(true), Some(true)), "{shell}");
            assert!(st.now.unwrap() >= l.start, "{shell}: {st:?}");
        }
        let _ = child.kill();
        let _ = child.wait();
        drop(master);
    }
}
