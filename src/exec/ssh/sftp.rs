//! Files over SFTP, one SFTP session per operation on a pooled channel. Reads and writes are
//! pipelined (many requests in flight) so throughput is not bound by round trips. An atomic
//! replace writes a temporary file beside the target and renames it over with OpenSSH's
//! `posix-rename@openssh.com` (a plain SFTP rename onto an existing file fails); a server
//! without that extension gets a clear error, never a non-atomic fallback.
//!
//! Whether a server has SFTP at all is learned here, once per connection ([`open`]); without
//! it the backend moves files through the shell ([`super::shellfs`]).
//!
//! Hand-written on `RawSftpSession` because the high-level session of russh-sftp offers no
//! posix-rename and no way to reach the raw session it wraps.

use futures_util::StreamExt;
use russh::client::Msg;
use russh::{Channel, ChannelMsg};
use russh_sftp::client::RawSftpSession;
use russh_sftp::client::error::Error as SftpError;
use russh_sftp::protocol::{FileAttributes, OpenFlags, Packet, StatusCode};

use super::{Lease, TargetPool};
use crate::exec::{ExecError, FileBytes};

/// Bytes per read or write request (OpenSSH's sftp-server allows up to 256 KiB reads).
const CHUNK: usize = 64 * 1024;
/// Requests in flight at once.
const IN_FLIGHT: usize = 32;
/// Seconds one SFTP request may take.
const REQUEST_TIMEOUT_SECS: u64 = 30;
const POSIX_RENAME: &str = "posix-rename@openssh.com";
const S_IFMT: u32 = 0o170000;
const S_IFDIR: u32 = 0o040000;
const S_IFLNK: u32 = 0o120000;

pub(super) struct Session {
    raw: RawSftpSession,
    posix_rename: bool,
}

/// Starts SFTP on `channel`: `None` when the server has no SFTP subsystem — it refuses the
/// request (OpenSSH without a `Subsystem sftp` line), or accepts it and closes the channel
/// without an SFTP version (Dropbear with no `sftp-server` binary) while the connection
/// itself stays up. A connection that dies meanwhile is an error, never "no SFTP".
pub(super) async fn open(
    pool: &TargetPool,
    lease: &Lease,
    mut channel: Channel<Msg>,
) -> Result<Option<Session>, ExecError> {
    let no_sftp = || {
        if lease.conn.handle.is_closed() {
            Err(pool.lost("the connection closed while starting SFTP"))
        } else {
            Ok(None)
        }
    };
    channel
        .request_subsystem(true, "sftp")
        .await
        .map_err(|e| pool.lost(e))?;
    let answer = async {
        loop {
            match channel.wait().await {
                Some(ChannelMsg::Success) => return Some(true),
                Some(ChannelMsg::Failure) => return Some(false),
                Some(ChannelMsg::Close) | Some(ChannelMsg::Eof) | None => return None,
                Some(_) => {}
            }
        }
    };
    let answer = tokio::time::timeout(pool.config.ssh_connect_timeout, answer)
        .await
        .map_err(|_| pool.lost("the server did not answer the SFTP request"))?;
    match answer {
        Some(true) => {}
        Some(false) => {
            let _ = channel.close().await;
            return Ok(None);
        }
        None => return no_sftp(),
    }
    let raw = RawSftpSession::new(channel.into_stream());
    raw.set_timeout(REQUEST_TIMEOUT_SECS);
    match raw.init().await {
        Ok(version) => Ok(Some(Session {
            raw,
            posix_rename: version.extensions.contains_key(POSIX_RENAME),
        })),
        Err(_) => no_sftp(),
    }
}

fn file_err(path: &str, e: SftpError) -> ExecError {
    match &e {
        SftpError::Status(s) if s.status_code == StatusCode::NoSuchFile => {
            ExecError::NotFound(path.to_string())
        }
        SftpError::Status(s) if s.status_code == StatusCode::PermissionDenied => {
            ExecError::File(format!("{path}: permission denied"))
        }
        _ => ExecError::File(format!("{path}: {e}")),
    }
}

pub(super) async fn read(
    s: Session,
    path: &str,
    offset: u64,
    len: u64,
) -> Result<FileBytes, ExecError> {
    let result = read_in(&s, path, offset, len).await;
    let _ = s.raw.close_session();
    result
}

async fn read_in(s: &Session, path: &str, offset: u64, len: u64) -> Result<FileBytes, ExecError> {
    let attrs = s.raw.stat(path).await.map_err(|e| file_err(path, e))?.attrs;
    if attrs.permissions.is_some_and(|p| p & S_IFMT == S_IFDIR) {
        return Err(ExecError::File(format!("{path}: is a directory")));
    }
    let size = attrs.size.unwrap_or(0);
    let handle = s
        .raw
        .open(path, OpenFlags::READ, FileAttributes::empty())
        .await
        .map_err(|e| file_err(path, e))?
        .handle;
    if size == 0 {
        // procfs and other files that report no size: read on until end of file.
        let data = read_sequential(s, &handle, offset, len).await;
        let _ = s.raw.close(handle).await;
        let data = data.map_err(|e| file_err(path, e))?;
        let size = offset + data.len() as u64;
        return Ok(FileBytes { data, size });
    }
    let end = offset.saturating_add(len).min(size);
    let starts: Vec<u64> = (offset..end).step_by(CHUNK).collect();
    let chunks = futures_util::stream::iter(starts.into_iter().map(|at| {
        let n = (end - at).min(CHUNK as u64) as usize;
        read_exact_at(&s.raw, &handle, at, n)
    }))
    .buffered(IN_FLIGHT)
    .collect::<Vec<_>>()
    .await;
    let mut data = Vec::with_capacity((end.saturating_sub(offset)) as usize);
    let mut failure = None;
    for c in chunks {
        match c {
            Ok(bytes) => {
                let short = bytes.len() < CHUNK;
                data.extend_from_slice(&bytes);
                if short {
                    break;
                }
            }
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    let _ = s.raw.close(handle).await;
    if let Some(e) = failure {
        return Err(file_err(path, e));
    }
    Ok(FileBytes { data, size })
}

/// Reads up to `len` bytes from `offset`, one chunk at a time, stopping at end of file.
async fn read_sequential(
    s: &Session,
    handle: &str,
    offset: u64,
    len: u64,
) -> Result<Vec<u8>, SftpError> {
    let mut data = Vec::new();
    while (data.len() as u64) < len {
        let want = (len - data.len() as u64).min(CHUNK as u64) as usize;
        let chunk = read_exact_at(&s.raw, handle, offset + data.len() as u64, want).await?;
        let short = chunk.len() < want;
        data.extend_from_slice(&chunk);
        if short {
            break;
        }
    }
    Ok(data)
}

/// Reads `n` bytes at `at`, looping over short reads, stopping at end of file.
async fn read_exact_at(
    raw: &RawSftpSession,
    handle: &str,
    at: u64,
    n: usize,
) -> Result<Vec<u8>, SftpError> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let want = (n - out.len()) as u32;
        match raw.read(handle, at + out.len() as u64, want).await {
            Ok(d) if d.data.is_empty() => break,
            Ok(d) => out.extend_from_slice(&d.data),
            Err(SftpError::Status(s)) if s.status_code == StatusCode::Eof => break,
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

pub(super) async fn write(s: Session, path: &str, data: &[u8]) -> Result<(), ExecError> {
    let result = write_in(&s, path, data).await;
    let _ = s.raw.close_session();
    result
}

async fn write_in(s: &Session, path: &str, data: &[u8]) -> Result<(), ExecError> {
    if !s.posix_rename {
        return Err(ExecError::File(format!(
            "{path}: the server's SFTP lacks {POSIX_RENAME}, so the file cannot be replaced atomically"
        )));
    }
    // Writing through a symlink replaces the file it points to.
    let mut target = path.to_string();
    let mut mode = None;
    match s.raw.lstat(path).await {
        Ok(a) => {
            let p = a.attrs.permissions.unwrap_or(0);
            if p & S_IFMT == S_IFLNK {
                if let Ok(name) = s.raw.realpath(path).await
                    && let Some(f) = name.files.first()
                {
                    target = f.filename.clone();
                }
                if let Ok(a) = s.raw.stat(&target).await {
                    mode = a.attrs.permissions;
                }
            } else {
                mode = Some(p);
            }
        }
        Err(SftpError::Status(st)) if st.status_code == StatusCode::NoSuchFile => {}
        Err(e) => return Err(file_err(path, e)),
    }
    if mode.is_some_and(|p| p & S_IFMT == S_IFDIR) {
        return Err(ExecError::File(format!("{path}: is a directory")));
    }
    let (parent, name) = match target.rsplit_once('/') {
        Some(("", n)) => ("/".to_string(), n.to_string()),
        Some((p, n)) => (p.to_string(), n.to_string()),
        None => return Err(ExecError::Invalid(format!("{path}: not an absolute path"))),
    };
    if name.is_empty() {
        return Err(ExecError::Invalid(format!("{path}: not a file path")));
    }
    mkdir_p(&s.raw, &parent).await?;
    let tmp = format!(
        "{}/.{name}.sshmode-{}",
        parent.trim_end_matches('/'),
        uuid::Uuid::new_v4().simple()
    );
    let written = write_tmp(s, &tmp, data, mode).await;
    let renamed = match written {
        Ok(()) => posix_rename(&s.raw, &tmp, &target).await,
        Err(e) => Err(e),
    };
    if let Err(e) = renamed {
        let _ = s.raw.remove(tmp.as_str()).await;
        return Err(file_err(path, e));
    }
    Ok(())
}

async fn write_tmp(
    s: &Session,
    tmp: &str,
    data: &[u8],
    mode: Option<u32>,
) -> Result<(), SftpError> {
    let handle = s
        .raw
        .open(
            tmp,
            OpenFlags::WRITE | OpenFlags::CREATE | OpenFlags::EXCLUDE,
            FileAttributes::empty(),
        )
        .await?
        .handle;
    let handle_ref = handle.as_str();
    let writes = futures_util::stream::iter((0..data.len()).step_by(CHUNK).map(|at| {
        let chunk = data[at..(at + CHUNK).min(data.len())].to_vec();
        s.raw.write(handle_ref, at as u64, chunk)
    }))
    .buffered(IN_FLIGHT)
    .collect::<Vec<_>>()
    .await;
    let mut result: Result<(), SftpError> = writes.into_iter().try_for_each(|w| w.map(drop));
    if result.is_ok()
        && let Some(mode) = mode
    {
        let attrs = FileAttributes {
            permissions: Some(mode & 0o7777),
            ..FileAttributes::empty()
        };
        result = s.raw.fsetstat(handle.as_str(), attrs).await.map(drop);
    }
    if result.is_ok() {
        // Durable before it becomes visible; ignored where the server lacks fsync@openssh.com.
        let _ = s.raw.fsync(handle.as_str()).await;
    }
    let closed = s.raw.close(handle).await.map(drop);
    result.and(closed)
}

/// `posix-rename@openssh.com`: replaces `new` atomically.
async fn posix_rename(raw: &RawSftpSession, old: &str, new: &str) -> Result<(), SftpError> {
    let mut data = Vec::with_capacity(old.len() + new.len() + 8);
    for s in [old, new] {
        data.extend_from_slice(&(s.len() as u32).to_be_bytes());
        data.extend_from_slice(s.as_bytes());
    }
    match raw.extended(POSIX_RENAME, data).await? {
        Packet::Status(st) if st.status_code == StatusCode::Ok => Ok(()),
        Packet::Status(st) => Err(SftpError::Status(st)),
        _ => Err(SftpError::UnexpectedPacket),
    }
}

/// Creates `dir` and its missing parents.
async fn mkdir_p(raw: &RawSftpSession, dir: &str) -> Result<(), ExecError> {
    if dir == "/" || raw.stat(dir).await.is_ok() {
        return Ok(());
    }
    // Walk up to the deepest existing ancestor (bounded by the path's depth), then create.
    let mut missing = vec![dir.to_string()];
    let mut cur = dir.to_string();
    while let Some((parent, _)) = cur.rsplit_once('/') {
        if parent.is_empty() || raw.stat(parent).await.is_ok() {
            break;
        }
        missing.push(parent.to_string());
        cur = parent.to_string();
    }
    for d in missing.iter().rev() {
        if let Err(e) = raw.mkdir(d.as_str(), FileAttributes::empty()).await {
            // Another writer may have created it meanwhile.
            if raw.stat(d.as_str()).await.is_err() {
                return Err(file_err(d, e));
            }
        }
    }
    Ok(())
}
