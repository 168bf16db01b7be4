//! The local backend: scripts run on the service's own machine, each in its own process
//! group, starting in the section's workspace directory under `workspace_root`; on timeout or
//! cancellation the whole group is signalled (TERM, then KILL) so children die too.
//!
//! Never: reads another section's workspace on its own initiative, or waits unboundedly for
//! output after a kill (a process that left the group may hold the pipe; we stop draining).

use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use super::truncate::HeadTail;
use super::{Backend, Command, ExecError, Exit, FileBytes, Output};

/// Time between TERM and KILL of a timed-out process group.
const KILL_GRACE: Duration = Duration::from_secs(2);
/// How long output is still drained after the group was killed.
const DRAIN_AFTER_KILL: Duration = Duration::from_secs(2);

/// Runs on this machine. Cheap; one per app.
pub struct LocalBackend {
    /// Parent of the per-section working directories.
    workspace_root: PathBuf,
}

impl LocalBackend {
    pub fn new(workspace_root: PathBuf) -> Self {
        LocalBackend { workspace_root }
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

/// A section id as a single safe directory name.
pub fn workspace_dir_name(section: &str) -> String {
    let s: String = section
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(128)
        .collect();
    if s.is_empty() { "_".into() } else { s }
}

#[async_trait]
impl Backend for LocalBackend {
    fn name(&self) -> &str {
        "local"
    }

    fn is_local(&self) -> bool {
        true
    }

    async fn home(&self) -> Result<String, ExecError> {
        std::env::home_dir()
            .map(|p| p.display().to_string())
            .ok_or_else(|| ExecError::Local("the service user has no home directory".into()))
    }

    async fn initial_dir(&self, section: &str) -> Result<String, ExecError> {
        let dir = self.workspace_root.join(workspace_dir_name(section));
        tokio::fs::create_dir_all(&dir).await.map_err(|e| {
            ExecError::Local(format!("cannot create workspace {}: {e}", dir.display()))
        })?;
        Ok(dir.display().to_string())
    }

    async fn exec(
        &self,
        cmd: Command<'_>,
        cancel: &CancellationToken,
    ) -> Result<Output, ExecError> {
        let mut child = tokio::process::Command::new(Self::shell())
            .arg("-c")
            .arg(cmd.script)
            .stdin(if cmd.stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| ExecError::Local(format!("cannot start a shell: {e}")))?;
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
        // Shared with the readers, so what was read survives if they must be stopped.
        let out_acc = Arc::new(Mutex::new(HeadTail::new(cmd.stdout_limit)));
        let err_acc = Arc::new(Mutex::new(HeadTail::new(cmd.stderr_limit)));
        let mut out_task = tokio::spawn(drain(stdout, out_acc.clone()));
        let mut err_task = tokio::spawn(drain(stderr, err_acc.clone()));

        let ended = tokio::select! {
            status = child.wait() => Ok(status),
            _ = tokio::time::sleep(cmd.timeout) => Err(Exit::TimedOut),
            _ = cancel.cancelled() => Err(Exit::Cancelled),
        };
        let exit = match ended {
            Ok(status) => {
                let status =
                    status.map_err(|e| ExecError::Local(format!("waiting for the shell: {e}")))?;
                exit_of(status)
            }
            Err(why) => {
                if let Some(pgid) = pgid {
                    kill_group(pgid, &mut child).await;
                }
                why
            }
        };
        // Children that outlive the shell inside its group keep the pipes open: bounded wait,
        // then they are killed too.
        let collect = async { ((&mut out_task).await, (&mut err_task).await) };
        if tokio::time::timeout(DRAIN_AFTER_KILL, collect)
            .await
            .is_err()
        {
            if let Some(pgid) = pgid {
                // SAFETY: signalling a process group id we created; no memory involved.
                unsafe { libc::killpg(pgid, libc::SIGKILL) };
            }
            // A process that left the group may hold a pipe open for ever: stop reading
            // (keeping what was read) rather than leave the readers behind.
            out_task.abort();
            err_task.abort();
        }
        if let Some(t) = stdin_task {
            t.abort();
        }
        // The command finished: what it left running in the background on purpose (output
        // redirected away) is its own business.
        group.0 = None;
        let (stdout, stdout_omitted) = take(&out_acc, cmd.stdout_limit);
        let (stderr, stderr_omitted) = take(&err_acc, cmd.stderr_limit);
        Ok(Output {
            stdout,
            stderr,
            stdout_omitted,
            stderr_omitted,
            exit,
        })
    }

    async fn read(&self, path: &str, offset: u64, len: u64) -> Result<FileBytes, ExecError> {
        let path = path.to_string();
        tokio::task::spawn_blocking(move || {
            let mut file = std::fs::File::open(&path).map_err(|e| io_err(&path, e))?;
            let meta = file.metadata().map_err(|e| io_err(&path, e))?;
            if meta.is_dir() {
                return Err(ExecError::File(format!("{path}: is a directory")));
            }
            file.seek(SeekFrom::Start(offset))
                .map_err(|e| io_err(&path, e))?;
            let mut data = Vec::new();
            file.take(len)
                .read_to_end(&mut data)
                .map_err(|e| io_err(&path, e))?;
            Ok(FileBytes {
                data,
                size: meta.len(),
            })
        })
        .await
        .map_err(|e| ExecError::Local(format!("file task failed: {e}")))?
    }

    async fn write(&self, path: &str, data: &[u8]) -> Result<(), ExecError> {
        let path = path.to_string();
        let data = data.to_vec();
        tokio::task::spawn_blocking(move || write_atomic(&path, &data))
            .await
            .map_err(|e| ExecError::Local(format!("file task failed: {e}")))?
    }
}

/// Temp file in the target's directory, fsync, keep the old mode, rename over.
fn write_atomic(path: &str, data: &[u8]) -> Result<(), ExecError> {
    // Writing through a symlink replaces the file it points to, as an editor would.
    let target = std::fs::canonicalize(path).unwrap_or_else(|_| PathBuf::from(path));
    let parent = target
        .parent()
        .ok_or_else(|| ExecError::Invalid(format!("{path}: not a file path")))?;
    std::fs::create_dir_all(parent).map_err(|e| io_err(&parent.display().to_string(), e))?;
    let mode = std::fs::metadata(&target).ok().map(|m| {
        if m.is_dir() {
            Err(ExecError::File(format!("{path}: is a directory")))
        } else {
            Ok(m.permissions().mode())
        }
    });
    let mode = mode.transpose()?;
    let file_name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = parent.join(format!(
        ".{file_name}.sshmode-{}",
        uuid::Uuid::new_v4().simple()
    ));
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)?;
        f.write_all(data)?;
        if let Some(mode) = mode {
            f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        }
        f.sync_all()?;
        std::fs::rename(&tmp, &target)
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(io_err(path, e));
    }
    Ok(())
}

fn io_err(path: &str, e: std::io::Error) -> ExecError {
    match e.kind() {
        std::io::ErrorKind::NotFound => ExecError::NotFound(path.to_string()),
        _ => ExecError::File(format!("{path}: {e}")),
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
