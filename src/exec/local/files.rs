//! Local file reads and writes for the file tools, confined the way the sandbox confines a
//! command: writes beneath the section's workspace or its tmp directory, reads there or beneath
//! the system trees. Every path is opened with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_MAGICLINKS)` from a descriptor of its root, so a symlink (even one swapped in
//! while we work) cannot lead outside; only regular files are opened, without blocking (a FIFO
//! is refused, not waited on). An existing file is replaced only if the caller may write it.
//! Under root these functions run in the launcher's helper ([`super::launch`]) as the tools
//! account, so the kernel decides; without the launcher they run in the service, which then
//! refuses a file the tools account could not read by its own mode, and gives what it writes
//! to that account.
//!
//! A write replaces the named entry atomically (temporary file beside it, then rename): a
//! symlink at that name is replaced by the file, never written through.
//!
//! The section's own roots (its workspace and tmp) are not opened by path at all: the backend
//! opens them once per call, beneath the workspace root without following any symlink
//! ([`open_dir_beneath`], [`ensure_dir`]), and hands the descriptors in as [`Roots::pinned`];
//! the sandbox's rule and the command's working directory use the same descriptors.
//!
//! Never: opens a path by name after checking it; follows a symlink out of its root; changes
//! the owner or mode of a directory it did not just create; reads beneath the data directory
//! other than through a section's own roots.

use std::ffi::{CString, OsStr};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use super::sandbox::Identity;
use crate::exec::{ExecError, FileBytes};

/// Where the file tools of one section may act.
#[derive(Debug, Clone)]
pub struct Roots {
    /// Read and write beneath these (the workspace, the tmp directory).
    pub writable: Vec<PathBuf>,
    /// Read only beneath these (system trees).
    pub readable: Vec<PathBuf>,
    /// Never read beneath these, whatever root holds them.
    pub excluded: Vec<PathBuf>,
    /// The tools account: files it could not read are refused, written files are its own.
    pub identity: Option<Identity>,
    /// Roots already opened safely (the section's workspace and tmp): these descriptors are
    /// used instead of opening the path again.
    pub pinned: Vec<(PathBuf, Arc<OwnedFd>)>,
}

impl Roots {
    /// A descriptor of `root`: its pinned one, else the path opened (a system tree).
    fn open(&self, root: &Path) -> std::io::Result<OwnedFd> {
        match self.pinned.iter().find(|(p, _)| p == root) {
            Some((_, fd)) => fd.try_clone(),
            None => open_root(root),
        }
    }
}

/// System trees the file tools may read. Beneath [`PROCESS_TREES`] only files everyone may
/// read are (`/proc/version` is, the service's `/proc/<pid>/environ` is not).
pub fn system_read_roots() -> Vec<PathBuf> {
    [
        "/usr", "/etc", "/opt", "/bin", "/sbin", "/lib", "/lib64", "/proc", "/sys",
    ]
    .iter()
    .map(PathBuf::from)
    .collect()
}

/// Trees whose files describe processes and the kernel: what may be read there depends on who
/// asks, which the service cannot fully tell on a tool's behalf.
const PROCESS_TREES: &[&str] = &["/proc", "/sys"];

/// Reads at most `len` bytes from `offset` of the regular file at `path`.
pub fn read(roots: &Roots, path: &str, offset: u64, len: u64) -> Result<FileBytes, ExecError> {
    let (root, rel) = locate(roots, path, false)?;
    if rel.as_os_str().is_empty() {
        return Err(ExecError::File(format!("{path}: is a directory")));
    }
    let root_fd = roots.open(&root).map_err(|e| io_err(path, e))?;
    let fd = openat2(
        &root_fd,
        &rel,
        libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY,
        0,
        IN_ROOT,
    )
    .map_err(|e| io_err(path, e))?;
    let st = fstat(&fd).map_err(|e| io_err(path, e))?;
    match st.st_mode & libc::S_IFMT {
        libc::S_IFREG => {}
        libc::S_IFDIR => return Err(ExecError::File(format!("{path}: is a directory"))),
        _ => {
            return Err(ExecError::File(format!(
                "{path}: not a regular file (devices, FIFOs and sockets are not read)"
            )));
        }
    }
    let process_tree = PROCESS_TREES.iter().any(|t| root == Path::new(t));
    if process_tree && st.st_mode & 0o004 == 0 {
        return Err(ExecError::File(format!("{path}: permission denied")));
    }
    if let Some(id) = &roots.identity
        && !readable_by(&st, id)
    {
        return Err(ExecError::File(format!("{path}: permission denied")));
    }
    // SAFETY: fd is an open descriptor we own; clearing O_NONBLOCK on a regular file.
    unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, 0) };
    let file = std::fs::File::from(fd);
    let mut data = Vec::new();
    let mut reader = std::io::BufReader::new(&file);
    std::io::Seek::seek(&mut reader, std::io::SeekFrom::Start(offset))
        .map_err(|e| io_err(path, e))?;
    reader
        .take(len)
        .read_to_end(&mut data)
        .map_err(|e| io_err(path, e))?;
    Ok(FileBytes {
        data,
        size: st.st_size as u64,
    })
}

/// Replaces the file at `path` atomically, creating missing parent directories and keeping
/// an existing file's mode.
pub fn write(roots: &Roots, path: &str, data: &[u8]) -> Result<(), ExecError> {
    let (root, rel) = locate(roots, path, true)?;
    let name = match rel.components().next_back() {
        Some(Component::Normal(n)) => n.to_os_string(),
        _ => return Err(ExecError::Invalid(format!("{path}: not a file path"))),
    };
    let root_fd = roots.open(&root).map_err(|e| io_err(path, e))?;
    let parent_rel = rel.parent().unwrap_or(Path::new(""));
    let parent = open_dir_creating(&root_fd, parent_rel, roots.identity.as_ref())
        .map_err(|e| io_err(path, e))?;
    let cname = CString::new(name.as_bytes())
        .map_err(|_| ExecError::Invalid(format!("{path}: not a file path")))?;
    // The entry as it is (not followed): keep a regular file's mode.
    // SAFETY: a zeroed stat is a valid out-parameter.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid descriptor, NUL-terminated name, valid out-pointer.
    let existing = unsafe {
        libc::fstatat(
            parent.as_raw_fd(),
            cname.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    } == 0;
    let mode = if existing {
        match st.st_mode & libc::S_IFMT {
            libc::S_IFDIR => return Err(ExecError::File(format!("{path}: is a directory"))),
            libc::S_IFREG => st.st_mode & 0o7777,
            _ => 0o644,
        }
    } else {
        0o644
    };
    // Replacing a file is writing it: the caller must be allowed to write the file itself,
    // not only the directory (which lets anyone who may write it rename over any file).
    // SAFETY: valid descriptor and NUL-terminated name.
    if existing
        && st.st_mode & libc::S_IFMT == libc::S_IFREG
        && unsafe {
            libc::faccessat(
                parent.as_raw_fd(),
                cname.as_ptr(),
                libc::W_OK,
                libc::AT_EACCESS | libc::AT_SYMLINK_NOFOLLOW,
            )
        } != 0
    {
        return Err(io_err(path, std::io::Error::last_os_error()));
    }
    let tmp = CString::new(format!(
        ".{}.sshmode-{}",
        name.to_string_lossy(),
        uuid::Uuid::new_v4().simple()
    ))
    .map_err(|_| ExecError::Invalid(format!("{path}: not a file path")))?;
    let result = (|| -> std::io::Result<()> {
        // SAFETY: valid descriptor and NUL-terminated name.
        let raw = unsafe {
            libc::openat(
                parent.as_raw_fd(),
                tmp.as_ptr(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                0o600 as libc::c_uint,
            )
        };
        if raw < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor we own.
        let mut file = unsafe { std::fs::File::from_raw_fd(raw) };
        file.write_all(data)?;
        if let Some(id) = &roots.identity {
            // SAFETY: valid descriptor.
            if unsafe { libc::fchown(raw, id.uid, id.gid) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        // SAFETY: valid descriptor.
        if unsafe { libc::fchmod(raw, mode) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        file.sync_all()?;
        // SAFETY: valid descriptors and NUL-terminated names.
        if unsafe {
            libc::renameat(
                parent.as_raw_fd(),
                tmp.as_ptr(),
                parent.as_raw_fd(),
                cname.as_ptr(),
            )
        } != 0
        {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    })();
    if let Err(e) = result {
        // SAFETY: valid descriptor and NUL-terminated name.
        unsafe { libc::unlinkat(parent.as_raw_fd(), tmp.as_ptr(), 0) };
        return Err(io_err(path, e));
    }
    Ok(())
}

/// The root `path` lies beneath and the rest of it, or a refusal naming what is allowed.
fn locate(roots: &Roots, path: &str, for_write: bool) -> Result<(PathBuf, PathBuf), ExecError> {
    let p = Path::new(path);
    if !p.is_absolute() {
        return Err(ExecError::Invalid(format!("{path}: not an absolute path")));
    }
    for root in &roots.writable {
        if let Ok(rel) = p.strip_prefix(root) {
            return Ok((root.clone(), rel.to_path_buf()));
        }
    }
    if !for_write
        && !roots.excluded.iter().any(|x| p.starts_with(x))
        && !p.components().any(|c| matches!(c, Component::ParentDir))
    {
        for root in &roots.readable {
            if let Ok(rel) = p.strip_prefix(root) {
                return Ok((root.clone(), rel.to_path_buf()));
            }
        }
    }
    Err(ExecError::File(format!(
        "{path}: outside this section's workspace; local file tools {} only beneath {}{}",
        if for_write { "write" } else { "read" },
        roots
            .writable
            .iter()
            .map(|r| r.display().to_string())
            .collect::<Vec<_>>()
            .join(" and "),
        if for_write {
            ""
        } else {
            " (and read system files under /usr, /etc, /opt, /proc, /sys)"
        }
    )))
}

/// Opens a directory by path, not following a final symlink: only for paths no tool can
/// change (the system trees, the configured roots).
pub fn open_root(root: &Path) -> std::io::Result<OwnedFd> {
    let c = CString::new(root.as_os_str().as_bytes())?;
    // SAFETY: NUL-terminated path.
    let raw = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// Resolution inside a root: symlinks that stay beneath it are followed, nothing leaves it.
const IN_ROOT: u64 = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;
/// Resolution of a directory the service itself works on: no symlink at all.
const NO_LINKS: u64 =
    libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;

/// The directory `rel` beneath `root`, opened `O_RDONLY | O_DIRECTORY` without following any
/// symlink on the way (`ELOOP`) or leaving `root` (`EXDEV`): what the service works on as
/// root is the directory that is there now, never where a link points.
pub fn open_dir_beneath(root: &OwnedFd, rel: &Path) -> std::io::Result<OwnedFd> {
    openat2(root, rel, libc::O_RDONLY | libc::O_DIRECTORY, 0, NO_LINKS)
}

/// The directory `name` in `parent`, created when missing. Only a directory this call
/// created is given `mode` and (when `owner`) that owner, through its own descriptor, and only
/// while it is still the empty directory the service made (a directory swapped in by someone
/// else in the meantime is left as it is). An existing one is opened as it is, never changed.
pub fn ensure_dir(
    parent: &OwnedFd,
    name: &OsStr,
    mode: u32,
    owner: Option<&Identity>,
) -> std::io::Result<OwnedFd> {
    let c = CString::new(name.as_bytes())?;
    if c.as_bytes().is_empty() || c.as_bytes().contains(&b'/') || name == ".." || name == "." {
        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: valid descriptor and NUL-terminated name.
    let created = unsafe { libc::mkdirat(parent.as_raw_fd(), c.as_ptr(), 0o700) } == 0;
    if !created {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EEXIST) {
            return Err(e);
        }
    }
    let fd = open_dir_beneath(parent, Path::new(name))?;
    if created {
        let st = fstat(&fd)?;
        // SAFETY: geteuid has no preconditions.
        // (No tool can make a directory of the service's; btrfs counts a directory's links as 1.)
        let ours = st.st_uid == unsafe { libc::geteuid() } && st.st_nlink <= 2;
        if ours {
            if let Some(id) = owner {
                // SAFETY: valid descriptor.
                if unsafe { libc::fchown(fd.as_raw_fd(), id.uid, id.gid) } != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            // SAFETY: valid descriptor.
            if unsafe { libc::fchmod(fd.as_raw_fd(), mode) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
    }
    Ok(fd)
}

/// `openat2(dir, rel, flags, resolve)`: `RESOLVE_BENEATH` always, [`IN_ROOT`] or [`NO_LINKS`].
fn openat2(
    dir: &OwnedFd,
    rel: &Path,
    flags: i32,
    mode: u64,
    resolve: u64,
) -> std::io::Result<OwnedFd> {
    openat2_at(
        dir.as_raw_fd(),
        rel,
        flags,
        mode,
        resolve | libc::RESOLVE_BENEATH,
    )
}

/// The `openat2` system call (`O_CLOEXEC` always; an empty `rel` is `dir` itself): `dir` a descriptor or `AT_FDCWD`.
pub(super) fn openat2_at(
    dir: i32,
    rel: &Path,
    flags: i32,
    mode: u64,
    resolve: u64,
) -> std::io::Result<OwnedFd> {
    let rel = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    let c = CString::new(rel.as_os_str().as_bytes())?;
    // SAFETY: a zeroed open_how is valid; its fields are set below.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (flags | libc::O_CLOEXEC) as u64;
    how.mode = mode;
    how.resolve = resolve;
    // SAFETY: a descriptor (or AT_FDCWD), a NUL-terminated path, `how` valid for its size.
    let raw = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir,
            c.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(raw as i32) })
}

/// Opens the directory `rel` beneath `root`, creating missing components (owned by the tools
/// account when there is one).
fn open_dir_creating(
    root: &OwnedFd,
    rel: &Path,
    owner: Option<&Identity>,
) -> std::io::Result<OwnedFd> {
    let dir_flags = libc::O_PATH | libc::O_DIRECTORY;
    match openat2(root, rel, dir_flags, 0, IN_ROOT) {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
        other => return other,
    }
    let mut current = openat2(root, Path::new(""), dir_flags, 0, IN_ROOT)?;
    let mut so_far = PathBuf::new();
    for comp in rel.components() {
        let Component::Normal(name) = comp else {
            return Err(std::io::Error::from_raw_os_error(libc::EXDEV));
        };
        so_far.push(name);
        match openat2(root, &so_far, dir_flags, 0, IN_ROOT) {
            Ok(fd) => current = fd,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                // Owner and mode only if this call made it (a racing creator's is kept).
                ensure_dir(&current, name, 0o755, owner)?;
                current = openat2(root, &so_far, dir_flags, 0, IN_ROOT)?;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(current)
}

fn fstat(fd: &OwnedFd) -> std::io::Result<libc::stat> {
    // SAFETY: a zeroed stat is a valid out-parameter.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid descriptor and out-pointer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(st)
}

/// Whether the tools account could read a file with this owner and mode.
fn readable_by(st: &libc::stat, id: &Identity) -> bool {
    if st.st_uid == id.uid {
        st.st_mode & 0o400 != 0
    } else if id.groups.contains(&st.st_gid) || st.st_gid == id.gid {
        st.st_mode & 0o040 != 0
    } else {
        st.st_mode & 0o004 != 0
    }
}

fn io_err(path: &str, e: std::io::Error) -> ExecError {
    match e.raw_os_error() {
        Some(libc::ENOENT) => ExecError::NotFound(path.to_string()),
        Some(libc::EXDEV) | Some(libc::ELOOP) => ExecError::File(format!(
            "{path}: leads outside this section's workspace (through `..` or a symlink); refused"
        )),
        _ => ExecError::File(format!("{path}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roots(dir: &Path) -> Roots {
        Roots {
            writable: vec![dir.join("ws")],
            readable: system_read_roots(),
            excluded: vec![dir.join("secret")],
            identity: None,
            pinned: Vec::new(),
        }
    }

    #[test]
    fn symlinks_and_dots_cannot_leave_the_workspace() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("ws/sub")).unwrap();
        std::fs::write(dir.path().join("secret"), b"key").unwrap();
        std::os::unix::fs::symlink(dir.path().join("secret"), dir.path().join("ws/abs")).unwrap();
        std::os::unix::fs::symlink("../secret", dir.path().join("ws/rel")).unwrap();
        std::os::unix::fs::symlink("sub", dir.path().join("ws/inside")).unwrap();
        let r = roots(dir.path());
        let ws = dir.path().join("ws").display().to_string();
        for p in ["abs", "rel", "../secret", "sub/../../secret"] {
            let e = read(&r, &format!("{ws}/{p}"), 0, 100).unwrap_err();
            assert!(matches!(e, ExecError::File(_)), "{p}: {e}");
        }
        write(&r, &format!("{ws}/sub/f"), b"hello").unwrap();
        let got = read(&r, &format!("{ws}/inside/f"), 0, 100).unwrap();
        assert_eq!(got.data, b"hello");
        // Writing at a symlink's name replaces the link, never the file behind it.
        write(&r, &format!("{ws}/abs"), b"new").unwrap();
        assert_eq!(std::fs::read(dir.path().join("secret")).unwrap(), b"key");
        assert!(write(&r, &format!("{ws}/rel/x"), b"x").is_err());
        // Outside every root, or in an excluded place.
        assert!(read(&r, &dir.path().join("secret").display().to_string(), 0, 9).is_err());
        assert!(read(&r, "/etc/hostname", 0, 9).is_ok() || !Path::new("/etc/hostname").exists());
        assert!(write(&r, "/etc/sshmode-test", b"x").is_err());
    }

    fn mode(p: &Path) -> u32 {
        use std::os::unix::fs::PermissionsExt;
        std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn directories_are_created_or_opened_never_followed_or_changed() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let root = open_root(dir.path()).unwrap();
        let set = |p: &Path, m: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
        };
        // An existing directory is opened as it is.
        std::fs::create_dir(dir.path().join("old")).unwrap();
        set(&dir.path().join("old"), 0o755);
        ensure_dir(&root, "old".as_ref(), 0o700, None).unwrap();
        assert_eq!(mode(&dir.path().join("old")), 0o755);
        // A new one is given its mode.
        ensure_dir(&root, "new".as_ref(), 0o711, None).unwrap();
        assert_eq!(mode(&dir.path().join("new")), 0o711);
        // A link in its place is refused and what it points to is left alone.
        std::fs::create_dir(dir.path().join("decoy")).unwrap();
        set(&dir.path().join("decoy"), 0o750);
        std::os::unix::fs::symlink(dir.path().join("decoy"), dir.path().join("link")).unwrap();
        let e = ensure_dir(&root, "link".as_ref(), 0o700, None).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ELOOP), "{e}");
        assert_eq!(mode(&dir.path().join("decoy")), 0o750);
        for bad in ["..", ".", "a/b", ""] {
            assert!(
                ensure_dir(&root, bad.as_ref(), 0o700, None).is_err(),
                "{bad}"
            );
        }
        // No link anywhere on the way, even one that stays beneath the root.
        std::fs::create_dir_all(dir.path().join("real/sub")).unwrap();
        std::os::unix::fs::symlink("real", dir.path().join("alias")).unwrap();
        assert!(open_dir_beneath(&root, Path::new("real/sub")).is_ok());
        let e = open_dir_beneath(&root, Path::new("alias/sub")).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ELOOP), "{e}");
        let e = open_dir_beneath(&root, Path::new("../")).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EXDEV), "{e}");
    }

    #[test]
    fn a_fifo_is_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("ws")).unwrap();
        let fifo = dir.path().join("ws/pipe");
        let c = CString::new(fifo.as_os_str().as_bytes()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = read(&roots(dir.path()), &fifo.display().to_string(), 0, 10).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
    }

    #[test]
    fn dac_is_checked_for_the_tools_account() {
        let id = Identity {
            name: "t".into(),
            uid: 4242,
            gid: 4242,
            groups: vec![4242],
        };
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        st.st_uid = 0;
        st.st_gid = 0;
        st.st_mode = libc::S_IFREG | 0o600;
        assert!(!readable_by(&st, &id));
        st.st_mode = libc::S_IFREG | 0o644;
        assert!(readable_by(&st, &id));
        st.st_uid = 4242;
        st.st_mode = libc::S_IFREG | 0o400;
        assert!(readable_by(&st, &id));
    }
}
