//! How long stored content lives, and how it is taken back: retention (`serve` deletes what is
//! older than each kind's `SSHMODE_*_RETENTION_DAYS`, in small batches), erasure (`sshmode
//! erase`, [`cli`]) and a recalled message's redaction. The event log and the conversation are
//! append-only tables: they change only through the three SQL functions of migration
//! `20261214010000_content_lifecycle.sql` that this module calls — a purge, a message's
//! redaction and an erasure, the last two writing their own audit row (that it happened, never
//! what the content said). The files a message brought are recorded where they were placed
//! (`message_files`), so a recall, an erasure or retention finds them.
//!
//! Never: deletes or changes an audit row (the audit trail has its own purge); removes a file
//! outside the local workspace and temporary roots; reaches a target (a file placed on one is
//! overwritten by the chat layer on a recall, and otherwise left to the target's owner).

pub mod cli;

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::Deserialize;
use serde_json::Value;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::config::RetentionConfig;

/// What a recalled message's text becomes wherever it was stored.
pub const RECALLED: &str = "[recalled]";
/// What an erased message's text becomes where its row stays (a turn request, another
/// person's thread).
pub const ERASED: &str = "[erased]";

/// Rows of each table deleted by one purge statement.
const PURGE_BATCH: i32 = 1_000;
/// Purge statements of one run; the rest waits for the next run.
const PURGE_BATCHES: usize = 50;
/// File records handled by one run.
const FILES_PER_RUN: i64 = 500;
/// Workspace directories looked at by one run.
const WORKSPACES_PER_RUN: usize = 200;
/// Entries of one workspace looked at to find its newest change; a larger tree counts as busy.
const WORKSPACE_WALK_MAX: usize = 20_000;
/// How often `serve` enforces retention (and once at start).
const RETENTION_EVERY: Duration = Duration::from_secs(3600);

/// Where local files may be removed: the workspace root and the sections' temporary root.
#[derive(Debug, Clone)]
pub struct Roots {
    pub workspace_root: PathBuf,
    pub tmp_root: PathBuf,
}

impl Roots {
    /// The roots of a configuration (`SSHMODE_WORKSPACE_ROOT`, `$SSHMODE_DATA_DIR/tmp`).
    pub fn of(config: &crate::config::Config) -> Roots {
        let canon = |p: PathBuf| std::fs::canonicalize(&p).unwrap_or(p);
        Roots {
            workspace_root: canon(config.exec.workspace_root.clone()),
            tmp_root: canon(config.data_dir.join("tmp")),
        }
    }

    /// A section's own local workspace and temporary directory.
    pub fn of_section(&self, section: &str) -> [PathBuf; 2] {
        let name = crate::exec::local::workspace_dir_name(section);
        [
            self.workspace_root.join("sections").join(&name),
            self.tmp_root.join(name),
        ]
    }

    /// The root `path` lies below and its path relative to it (never a root itself, never
    /// through `..`).
    fn split<'a>(&'a self, path: &'a Path) -> Option<(&'a Path, &'a Path)> {
        if !self.holds(path) {
            return None;
        }
        [&self.workspace_root, &self.tmp_root]
            .into_iter()
            .find_map(|r| Some((r.as_path(), path.strip_prefix(r).ok()?)))
    }

    /// Whether `path` is a file below one of the roots (never a root itself, never through
    /// `..`).
    fn holds(&self, path: &Path) -> bool {
        path.is_absolute()
            && !path
                .components()
                .any(|c| matches!(c, std::path::Component::ParentDir))
            && [&self.workspace_root, &self.tmp_root]
                .iter()
                .any(|r| path.starts_with(r) && path != r.as_path())
    }
}

/// A file a message brought, where it was placed.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, sqlx::FromRow)]
pub struct PlacedFile {
    /// `local` or a target's alias.
    pub backend: String,
    pub path: String,
}

/// Records that a file of `message_id` was placed at `path` on `backend` for `section`.
pub async fn record_file(
    db: &PgPool,
    message_id: &str,
    section: &str,
    backend: &str,
    path: &str,
) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO message_files (message_id, section_id, backend, path) VALUES ($1, $2, $3, $4)
         ON CONFLICT (message_id, path) DO UPDATE SET placed_at = now(), backend = $3",
    )
    .bind(message_id)
    .bind(section)
    .bind(backend)
    .bind(path)
    .execute(db)
    .await?;
    Ok(())
}

/// The files `message_id` brought.
pub async fn files_of(db: &PgPool, message_id: &str) -> sqlx::Result<Vec<PlacedFile>> {
    sqlx::query_as("SELECT backend, path FROM message_files WHERE message_id = $1 ORDER BY path")
        .bind(message_id)
        .fetch_all(db)
        .await
}

/// Notes that `message_id` was recalled; `false` when it was already.
pub async fn mark_recalled(
    db: &PgPool,
    message_id: &str,
    chat_id: Option<&str>,
) -> sqlx::Result<bool> {
    let done = sqlx::query(
        "INSERT INTO recalled_messages (message_id, chat_id) VALUES ($1, $2)
         ON CONFLICT DO NOTHING",
    )
    .bind(message_id)
    .bind(chat_id)
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Whether `message_id` was recalled (its event, arriving later, is not acted on).
pub async fn is_recalled(db: &PgPool, message_id: &str) -> sqlx::Result<bool> {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM recalled_messages WHERE message_id = $1)")
        .bind(message_id)
        .fetch_one(db)
        .await
}

/// Marks `chat_id` departed (`reason`: `removed` or `disbanded`, by `operator`): nothing is
/// posted there until [`clear_departed`].
pub async fn mark_departed(
    db: &PgPool,
    chat_id: &str,
    reason: &str,
    operator: Option<&str>,
    at: chrono::DateTime<chrono::Utc>,
) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO departed_chats (chat_id, reason, operator, at) VALUES ($1, $2, $3, $4)
         ON CONFLICT (chat_id) DO UPDATE
            SET reason = $2, operator = $3, at = $4, seq = nextval('departed_chats_seq')",
    )
    .bind(chat_id)
    .bind(reason)
    .bind(operator)
    .bind(at)
    .execute(db)
    .await?;
    Ok(())
}

/// The bot is in `chat_id` again.
pub async fn clear_departed(db: &PgPool, chat_id: &str) -> sqlx::Result<()> {
    sqlx::query("DELETE FROM departed_chats WHERE chat_id = $1")
        .bind(chat_id)
        .execute(db)
        .await?;
    Ok(())
}

/// Adds `aliases` to the targets whose bindings `chat_id`'s departure released, and makes the
/// departure new again, so every replica closes their pooled connections.
pub async fn released(db: &PgPool, chat_id: &str, aliases: &[String]) -> sqlx::Result<()> {
    sqlx::query(
        "UPDATE departed_chats
            SET released = ARRAY(SELECT DISTINCT a FROM unnest(released || $2::text[]) a),
                seq = nextval('departed_chats_seq')
          WHERE chat_id = $1",
    )
    .bind(chat_id)
    .bind(aliases)
    .execute(db)
    .await?;
    Ok(())
}

/// A departure as the replicas follow it.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Departure {
    pub seq: i64,
    pub chat_id: String,
    pub reason: String,
    pub released: Vec<String>,
}

/// The departures after `seq` (a bounded number, oldest first).
pub async fn departures_since(db: &PgPool, seq: i64, limit: i64) -> sqlx::Result<Vec<Departure>> {
    sqlx::query_as(
        "SELECT seq, chat_id, reason, released FROM departed_chats
          WHERE seq > $1 ORDER BY seq LIMIT $2",
    )
    .bind(seq)
    .bind(limit)
    .fetch_all(db)
    .await
}

/// The newest departure's number (0 when none).
pub async fn last_departure(db: &PgPool) -> sqlx::Result<i64> {
    sqlx::query_scalar("SELECT COALESCE(max(seq), 0) FROM departed_chats")
        .fetch_one(db)
        .await
}

/// Whether the bot left `chat_id` (and was not added back): nothing is posted there.
pub async fn is_departed(db: &PgPool, chat_id: &str) -> sqlx::Result<bool> {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM departed_chats WHERE chat_id = $1)")
        .bind(chat_id)
        .fetch_one(db)
        .await
}

/// What a redaction touched (rows per place), as `sshmode_redact_message` returns it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Redacted {
    pub section: Option<String>,
    pub events: i64,
    pub transcript: i64,
    pub summaries: i64,
    pub requests: i64,
    pub inbox: i64,
    pub images: i64,
}

/// Replaces `message_id`'s content by `mark` wherever it was stored (event log, turn request,
/// conversation, summaries, the inbox's copy) and deletes its images, in one audited statement
/// (`content.redact`, actor `actor`).
pub async fn redact_message(
    db: &PgPool,
    message_id: &str,
    actor: &str,
    mark: &str,
) -> anyhow::Result<Redacted> {
    let v: Value = sqlx::query_scalar("SELECT sshmode_redact_message($1, $2, $3)")
        .bind(message_id)
        .bind(actor)
        .bind(mark)
        .fetch_one(db)
        .await?;
    Ok(serde_json::from_value(v)?)
}

/// Whose content an erasure takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Whom {
    /// A chat: every section of it.
    Chat(String),
    /// A person (open_id): what they sent anywhere, and their direct chats with the bot whole.
    Person(String),
}

/// What an erasure removed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Erased {
    pub events: i64,
    pub transcript: i64,
    pub requests: i64,
    pub inbox: i64,
    pub images: i64,
    pub notes: i64,
    /// Sections erased whole (their local workspaces go too).
    pub sections: Vec<String>,
    /// Files the erased messages brought.
    pub files: Vec<PlacedFile>,
    /// Local files and directories removed (filled in by [`erase`]).
    #[serde(default)]
    pub removed: Vec<String>,
    /// Files left on targets (filled in by [`erase`]).
    #[serde(default)]
    pub left: Vec<PlacedFile>,
}

/// Erases `whom`'s content (audited, `content.erase`, actor `actor`): the database's in one
/// statement, then the local files and the sections' own local workspaces.
pub async fn erase(db: &PgPool, whom: &Whom, actor: &str, roots: &Roots) -> anyhow::Result<Erased> {
    let (chat, person) = match whom {
        Whom::Chat(c) => (Some(c.as_str()), None),
        Whom::Person(p) => (None, Some(p.as_str())),
    };
    let v: Value = sqlx::query_scalar("SELECT sshmode_erase_content($1, $2, $3, $4)")
        .bind(chat)
        .bind(person)
        .bind(actor)
        .bind(ERASED)
        .fetch_one(db)
        .await?;
    let mut erased: Erased = serde_json::from_value(v)?;
    let roots = roots.clone();
    let (files, sections) = (erased.files.clone(), erased.sections.clone());
    let (removed, left) = tokio::task::spawn_blocking(move || {
        let mut removed = Vec::new();
        let mut left = Vec::new();
        for f in files {
            if f.backend != "local" {
                left.push(f);
            } else if remove_file(&roots, Path::new(&f.path)) {
                removed.push(f.path);
            }
        }
        for s in &sections {
            for dir in roots.of_section(s) {
                if dir.is_dir() && std::fs::remove_dir_all(&dir).is_ok() {
                    removed.push(dir.display().to_string());
                }
            }
        }
        (removed, left)
    })
    .await?;
    erased.removed = removed;
    erased.left = left;
    Ok(erased)
}

/// Removes a local regular file below the roots; whether it was there to remove. Works on
/// descriptors: the root is opened as itself, the file's directory beneath it without
/// following any symlink (a tool may have swapped a directory on the way for a link), and the
/// name is unlinked in that directory only when it is a regular file there, never followed.
fn remove_file(roots: &Roots, path: &Path) -> bool {
    use crate::exec::local::files;
    use std::os::fd::AsRawFd;
    use std::os::unix::ffi::OsStrExt;
    let Some((root, rel)) = roots.split(path) else {
        return false;
    };
    let (Some(parent), Some(name)) = (rel.parent(), rel.file_name()) else {
        return false;
    };
    let Ok(name) = std::ffi::CString::new(name.as_bytes()) else {
        return false;
    };
    let Ok(root) = files::open_root(root) else {
        return false;
    };
    let Ok(dir) = files::open_dir_beneath(&root, parent) else {
        return false;
    };
    // SAFETY: a zeroed stat is a valid out-parameter; valid descriptor, NUL-terminated name.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let found = unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            name.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    } == 0;
    if !found || st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return false;
    }
    // SAFETY: valid descriptor and NUL-terminated name; unlinkat never follows the name.
    unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), 0) == 0 }
}

/// Deletes the event log, conversation, turn-request and recall rows older than `keep_days`,
/// in bounded batches, through the one function the append-only guard lets delete. Returns the
/// rows deleted.
pub async fn purge_content(db: &PgPool, keep_days: u32) -> sqlx::Result<u64> {
    let mut total = 0u64;
    for _ in 0..PURGE_BATCHES {
        let n: i64 = sqlx::query_scalar("SELECT sshmode_content_purge($1, $2)")
            .bind(i32::try_from(keep_days).unwrap_or(i32::MAX))
            .bind(PURGE_BATCH)
            .fetch_one(db)
            .await?;
        total += n.max(0) as u64;
        if n == 0 {
            break;
        }
    }
    Ok(total)
}

/// Deletes the records of files placed more than `keep_days` ago (a bounded number), removing
/// the local ones, and the kept images as old. Returns the local files removed.
pub async fn purge_attachments(db: &PgPool, keep_days: u32, roots: &Roots) -> sqlx::Result<u64> {
    sqlx::query("DELETE FROM message_images WHERE created_at < now() - make_interval(days => $1)")
        .bind(i32::try_from(keep_days).unwrap_or(i32::MAX))
        .execute(db)
        .await?;
    let gone: Vec<PlacedFile> = sqlx::query_as(
        "DELETE FROM message_files WHERE (message_id, path) IN (
             SELECT message_id, path FROM message_files
              WHERE placed_at < now() - make_interval(days => $1)
              ORDER BY placed_at LIMIT $2)
         RETURNING backend, path",
    )
    .bind(i32::try_from(keep_days).unwrap_or(i32::MAX))
    .bind(FILES_PER_RUN)
    .fetch_all(db)
    .await?;
    let roots = roots.clone();
    let removed = tokio::task::spawn_blocking(move || {
        gone.iter()
            .filter(|f| f.backend == "local" && remove_file(&roots, Path::new(&f.path)))
            .count() as u64
    })
    .await
    .unwrap_or(0);
    Ok(removed)
}

/// Removes the sections' own local workspaces (and temporary directories) untouched for
/// `idle_days` whose sections ran no turn in that time; a bounded number of directories a run.
/// Returns the directories removed.
pub async fn purge_idle_workspaces(
    db: &PgPool,
    idle_days: u32,
    roots: &Roots,
) -> anyhow::Result<Vec<PathBuf>> {
    let idle = Duration::from_secs(u64::from(idle_days) * 24 * 3600);
    let busy: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT section_id FROM turns
          WHERE started_at >= now() - make_interval(days => $1) OR state = 'running'",
    )
    .bind(i32::try_from(idle_days).unwrap_or(i32::MAX))
    .fetch_all(db)
    .await?;
    let roots = roots.clone();
    let removed = tokio::task::spawn_blocking(move || {
        let busy: std::collections::HashSet<String> = busy
            .iter()
            .map(|s| crate::exec::local::workspace_dir_name(s))
            .collect();
        let mut removed = Vec::new();
        let Ok(entries) = std::fs::read_dir(roots.workspace_root.join("sections")) else {
            return removed;
        };
        let now = SystemTime::now();
        for e in entries.flatten().take(WORKSPACES_PER_RUN) {
            let name = e.file_name().to_string_lossy().into_owned();
            let dir = e.path();
            if busy.contains(&name) || !dir.is_dir() {
                continue;
            }
            let Some(newest) = newest_change(&dir) else {
                continue;
            };
            if now.duration_since(newest).unwrap_or_default() < idle {
                continue;
            }
            if std::fs::remove_dir_all(&dir).is_ok() {
                let tmp = roots.tmp_root.join(&name);
                if tmp.is_dir() {
                    let _ = std::fs::remove_dir_all(&tmp);
                }
                removed.push(dir);
            }
        }
        removed
    })
    .await?;
    Ok(removed)
}

/// The newest modification time in a tree (the directories' own included), or `None` when it
/// holds more than [`WORKSPACE_WALK_MAX`] entries (such a tree is left alone).
fn newest_change(dir: &Path) -> Option<SystemTime> {
    let mut newest = std::fs::symlink_metadata(dir).ok()?.modified().ok()?;
    let mut stack = vec![dir.to_path_buf()];
    let mut seen = 0usize;
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).ok()?.flatten() {
            seen += 1;
            if seen > WORKSPACE_WALK_MAX {
                return None;
            }
            let Ok(meta) = e.path().symlink_metadata() else {
                continue;
            };
            if let Ok(m) = meta.modified() {
                newest = newest.max(m);
            }
            if meta.is_dir() {
                stack.push(e.path());
            }
        }
    }
    Some(newest)
}

/// One retention run: every kind past its setting, each in bounded batches. Failures are
/// logged and the other kinds still run.
pub async fn enforce(db: &PgPool, retention: &RetentionConfig, roots: &Roots) {
    match purge_content(db, retention.eventlog_days).await {
        Ok(0) => {}
        Ok(n) => tracing::info!(
            retention.rows = n,
            retention.days = retention.eventlog_days,
            "event log and transcripts past retention deleted"
        ),
        Err(e) => tracing::warn!(error = %e, "event log retention failed; retrying in an hour"),
    }
    match purge_attachments(db, retention.attachment_days, roots).await {
        Ok(0) => {}
        Ok(n) => tracing::info!(
            retention.files = n,
            retention.days = retention.attachment_days,
            "attachments past retention deleted"
        ),
        Err(e) => tracing::warn!(error = %e, "attachment retention failed; retrying in an hour"),
    }
    match purge_idle_workspaces(db, retention.workspace_idle_days, roots).await {
        Ok(dirs) if dirs.is_empty() => {}
        Ok(dirs) => tracing::info!(
            retention.workspaces = dirs.len(),
            retention.days = retention.workspace_idle_days,
            "idle workspaces removed"
        ),
        Err(e) => tracing::warn!(error = %e, "workspace retention failed; retrying in an hour"),
    }
}

/// The retention worker of `serve`: [`enforce`] at start and then hourly, until `shutdown`.
/// (The inbox's handled rows are deleted by the inbox's own cleanup, at the shorter of
/// `SSHMODE_INBOX_RETENTION_DAYS` and the de-duplication window; audit rows by
/// `audit::run_retention`.)
pub async fn run_retention(
    db: PgPool,
    retention: RetentionConfig,
    roots: Roots,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = enforce(&db, &retention, &roots) => {}
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(RETENTION_EVERY) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_files_below_the_roots_are_removable() {
        let roots = Roots {
            workspace_root: "/srv/ws".into(),
            tmp_root: "/srv/data/tmp".into(),
        };
        assert!(roots.holds(Path::new("/srv/ws/sections/omt_1/attachments/a.png")));
        assert!(roots.holds(Path::new("/srv/data/tmp/omt_1/attachments/a.png")));
        assert!(!roots.holds(Path::new("/srv/ws")));
        assert!(!roots.holds(Path::new("/srv/ws/../etc/passwd")));
        assert!(!roots.holds(Path::new("/etc/passwd")));
        assert!(!roots.holds(Path::new("attachments/a.png")));
    }

    /// A directory on the way swapped for a symlink (as a tool in the workspace could) is not
    /// followed: the file it points at stays, and so does a symlink named as the file's target.
    #[test]
    fn removal_follows_no_symlink_on_the_way_or_at_the_end() {
        let base = std::env::temp_dir().join(format!("sshmode-rm-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let (ws, outside) = (base.join("ws"), base.join("outside"));
        std::fs::create_dir_all(ws.join("sections/s1/attachments")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("precious"), "keep").unwrap();
        let roots = Roots {
            workspace_root: ws.clone(),
            tmp_root: base.join("tmp"),
        };
        // A plain file below the root is removed.
        let plain = ws.join("sections/s1/attachments/a.txt");
        std::fs::write(&plain, "x").unwrap();
        assert!(remove_file(&roots, &plain));
        assert!(!plain.exists());
        // The attachments directory swapped for a link to the outside.
        std::fs::remove_dir(ws.join("sections/s1/attachments")).unwrap();
        std::os::unix::fs::symlink(&outside, ws.join("sections/s1/attachments")).unwrap();
        assert!(!remove_file(
            &roots,
            &ws.join("sections/s1/attachments/precious")
        ));
        assert!(outside.join("precious").exists());
        // The file itself a link: not followed, not a regular file, left.
        std::os::unix::fs::symlink(outside.join("precious"), ws.join("sections/s1/b.txt")).unwrap();
        assert!(!remove_file(&roots, &ws.join("sections/s1/b.txt")));
        assert!(outside.join("precious").exists());
        std::fs::remove_dir_all(&base).unwrap();
    }
}
