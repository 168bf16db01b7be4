//! Files through the shell, for targets without an SFTP subsystem (Dropbear or BusyBox boxes
//! with no `sftp-server`): the bytes travel on an exec channel, which carries them unchanged
//! (no PTY), as the command's standard output (reads) or standard input (writes). A read is
//! `head -c`/`tail -c` bounded to the range asked; a write is `cat` into a temporary file
//! beside the target, then `mv` over it in the same directory — a rename, so a reader sees the
//! old file or the new one, never half of one, as over SFTP. Same limits, same errors (a
//! missing file, a directory, a permission refused) as the SFTP path.
//!
//! Only POSIX sh and tools BusyBox has too (`ls -lnLd`, `head -c`, `tail -c`, `readlink -f`,
//! `mkdir -p`, `mv -f`, `chmod`); paths are always single-quoted into the script.
//!
//! Never: writes the target in place, leaves its temporary file behind after a failure it
//! saw, or reads past the range asked.

use tokio_util::sync::CancellationToken;

use super::TargetPool;
use crate::exec::{Command, ExecError, Exit, FileBytes, shell_quote};

/// Exit codes of the scripts below, each one failure the caller names in words.
const NOT_FOUND: i32 = 71;
const IS_DIR: i32 = 72;
const DENIED: i32 = 73;
/// Most stderr kept from a file script (it carries the size line and any tool's complaint).
const ERR_LIMIT: usize = 4096;

fn file_error(path: &str, out: &crate::exec::Output, what: &str) -> ExecError {
    match out.exit {
        Exit::Code(NOT_FOUND) => ExecError::NotFound(path.to_string()),
        Exit::Code(IS_DIR) => ExecError::File(format!("{path}: is a directory")),
        Exit::Code(DENIED) => ExecError::File(format!("{path}: permission denied")),
        _ => {
            let err = String::from_utf8_lossy(&out.stderr);
            let err = err
                .lines()
                .filter(|l| !l.starts_with("sshmode-size "))
                .collect::<Vec<_>>()
                .join("; ");
            ExecError::File(format!(
                "{path}: {what} through the shell failed ({}){}",
                exit_text(&out.exit),
                if err.is_empty() {
                    String::new()
                } else {
                    format!(": {}", err.chars().take(300).collect::<String>())
                }
            ))
        }
    }
}

fn exit_text(exit: &Exit) -> String {
    match exit {
        Exit::Code(c) => format!("exit {c}"),
        Exit::Signal(s) => format!("signal {s}"),
        Exit::TimedOut => "timed out".into(),
        Exit::Cancelled => "cancelled".into(),
    }
}

/// The script that reads `len` bytes of `path` from `offset`, printing `sshmode-size N` on
/// stderr first.
fn read_script(path: &str, offset: u64, len: u64) -> String {
    let range = if offset == 0 {
        format!("head -c {len} < \"$f\"")
    } else {
        format!("tail -c +{} < \"$f\" | head -c {len}", offset + 1)
    };
    format!(
        "f={p}\n\
         [ -e \"$f\" ] || exit {NOT_FOUND}\n\
         [ -d \"$f\" ] && exit {IS_DIR}\n\
         [ -r \"$f\" ] || exit {DENIED}\n\
         set -- $(ls -lnLd -- \"$f\")\n\
         printf 'sshmode-size %s\\n' \"$5\" >&2\n\
         {range}\n",
        p = shell_quote(path),
    )
}

/// The script that replaces `path` with its standard input: through a symlink to the file it
/// names, parents created, an existing file's mode kept.
fn write_script(path: &str) -> String {
    let tmp_tag = uuid::Uuid::new_v4().simple();
    format!(
        "f={p}\n\
         if [ -L \"$f\" ]; then t=$(readlink -f -- \"$f\") || t=$f; else t=$f; fi\n\
         [ -d \"$t\" ] && exit {IS_DIR}\n\
         d=${{t%/*}}; [ -n \"$d\" ] || d=/\n\
         mkdir -p -- \"$d\" || exit 74\n\
         [ -w \"$d\" ] || exit {DENIED}\n\
         tmp=\"$d/.${{t##*/}}.sshmode-{tmp_tag}\"\n\
         set -C\n\
         if ! cat > \"$tmp\"; then rm -f -- \"$tmp\"; exit 75; fi\n\
         if [ -e \"$t\" ]; then\n\
         m=$(ls -lnLd -- \"$t\" | cut -c2-10)\n\
         o=0; i=0; for b in u g o; do v=0\n\
         c=$(printf '%s' \"$m\" | cut -c$((i*3+1))); [ \"$c\" = r ] && v=$((v+4))\n\
         c=$(printf '%s' \"$m\" | cut -c$((i*3+2))); [ \"$c\" = w ] && v=$((v+2))\n\
         c=$(printf '%s' \"$m\" | cut -c$((i*3+3))); case $c in x|s|t) v=$((v+1));; esac\n\
         o=$o$v; i=$((i+1)); done\n\
         chmod \"$o\" \"$tmp\" 2>/dev/null\n\
         fi\n\
         mv -f -- \"$tmp\" \"$t\" || {{ rm -f -- \"$tmp\"; exit 76; }}\n",
        p = shell_quote(path),
    )
}

/// Reads at most `len` bytes of `path` from `offset`; see [`crate::exec::Backend::read`].
pub(super) async fn read(
    pool: &TargetPool,
    path: &str,
    offset: u64,
    len: u64,
) -> Result<FileBytes, ExecError> {
    let script = read_script(path, offset, len);
    let out = pool
        .exec(
            Command {
                script: &script,
                stdin: None,
                timeout: pool.config.command_timeout,
                // Exactly the range asked, and no more is read.
                stdout_limit: usize::try_from(len).unwrap_or(usize::MAX),
                stderr_limit: ERR_LIMIT,
                live: None,
            },
            &CancellationToken::new(),
        )
        .await?;
    if !out.exit.success() {
        return Err(file_error(path, &out, "reading"));
    }
    let err = String::from_utf8_lossy(&out.stderr);
    let size = err
        .lines()
        .find_map(|l| l.strip_prefix("sshmode-size "))
        .and_then(|n| n.trim().parse::<u64>().ok())
        .ok_or_else(|| ExecError::File(format!("{path}: the shell did not report its size")))?;
    let data = out.stdout;
    // Files that report no size (procfs): what was there is the size seen.
    let size = size.max(offset + data.len() as u64);
    Ok(FileBytes { data, size })
}

/// Replaces `path` atomically with `data`; see [`crate::exec::Backend::write`].
pub(super) async fn write(pool: &TargetPool, path: &str, data: &[u8]) -> Result<(), ExecError> {
    if !path.starts_with('/') {
        return Err(ExecError::Invalid(format!("{path}: not an absolute path")));
    }
    if path.ends_with('/') {
        return Err(ExecError::Invalid(format!("{path}: not a file path")));
    }
    let script = write_script(path);
    let out = pool
        .exec(
            Command {
                script: &script,
                stdin: Some(data),
                timeout: pool.config.command_timeout,
                stdout_limit: ERR_LIMIT,
                live: None,
                stderr_limit: ERR_LIMIT,
            },
            &CancellationToken::new(),
        )
        .await?;
    if out.exit.success() {
        Ok(())
    } else {
        Err(file_error(path, &out, "writing"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str, input: &[u8]) -> std::process::Output {
        use std::io::Write;
        let mut c = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(script)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // A script that refuses (a directory, say) may end before reading its input.
        match c.stdin.take().unwrap().write_all(input) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
            r => r.unwrap(),
        }
        c.wait_with_output().unwrap()
    }

    #[test]
    fn the_shell_scripts_read_ranges_and_replace_files_keeping_their_mode() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("it's a file");
        let p = f.to_str().unwrap();
        let data: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
        assert!(sh(&write_script(p), &data).status.success());
        assert_eq!(std::fs::read(&f).unwrap(), data);
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o751)).unwrap();
        assert!(sh(&write_script(p), b"new\0bytes").status.success());
        assert_eq!(std::fs::read(&f).unwrap(), b"new\0bytes");
        let mode = std::fs::metadata(&f).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o751, "the mode of the file replaced is kept");
        // No temporary file is left beside it.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        // Through a symlink: the file it names is replaced, the link stays.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&f, &link).unwrap();
        assert!(
            sh(&write_script(link.to_str().unwrap()), b"via link")
                .status
                .success()
        );
        assert_eq!(std::fs::read(&f).unwrap(), b"via link");
        assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
        // Missing parents are created.
        let deep = dir.path().join("a/b/c.txt");
        assert!(
            sh(&write_script(deep.to_str().unwrap()), b"deep")
                .status
                .success()
        );
        assert_eq!(std::fs::read(&deep).unwrap(), b"deep");

        std::fs::write(&f, &data).unwrap();
        let out = sh(&read_script(p, 0, 100), b"");
        assert!(out.status.success());
        assert_eq!(out.stdout, &data[..100]);
        assert_eq!(String::from_utf8_lossy(&out.stderr), "sshmode-size 70000\n");
        let out = sh(&read_script(p, 69_990, 100), b"");
        assert_eq!(out.stdout, &data[69_990..]);
        let missing = dir.path().join("nope");
        let out = sh(&read_script(missing.to_str().unwrap(), 0, 10), b"");
        assert_eq!(out.status.code(), Some(NOT_FOUND));
        let out = sh(&read_script(dir.path().to_str().unwrap(), 0, 10), b"");
        assert_eq!(out.status.code(), Some(IS_DIR));
        let out = sh(&write_script(dir.path().to_str().unwrap()), b"x");
        assert_eq!(out.status.code(), Some(IS_DIR));
    }
}
