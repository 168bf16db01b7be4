//! Workspaces: per section and backend, a directory on that backend's host, a permission the
//! task tools enforce, and a mode that shapes the prompt. This module owns what a section may
//! choose ([`set`], for `/workspace set`), what it has now ([`current`], read at every tool
//! call), and — in [`judge`] — the permission check made before anything runs; [`verdict`]
//! puts it together with the command guard, and [`cli`] is `sshmode guard check`.
//!
//! A target's maximum permission (`sshmode target set --permission`, default `read-write`) caps
//! every section on it, at the moment of choosing and again at every call, so an operator who
//! lowers it needs no chat's cooperation. The local backend's maximum is `full`. A local
//! workspace is a directory below `SSHMODE_WORKSPACE_ROOT` after `..` and symlinks are
//! resolved: the section's own (`sections/<section>`, the default) or a shared one, never the
//! root itself, another section's own directory, or the service's files.
//!
//! Never: runs a command or touches a backend (a remote directory is checked on its host by
//! the tools, at the call); lets a chat raise a permission above its target's maximum.
//!
//! # In detail
//!
//! A workspace is a row of `workspaces` per (section, backend): `dir`, `permission`, `mode`, who set
//! it; a target's row carries the target's `generation`, so a removed and re-added alias starts
//! afresh. `targets.max_permission` (default `read-write`) and `targets.workspace` are the
//! operator's (`sshmode target set`, audited `target.set`).
//!
//! - `workspace::current(section, place)` is one query: the section's row and its stored working
//!   directory on that backend, joined with the target's maximum, or the default (locally the section's own directory and `full`; on a
//!   target `targets.workspace` or `~`, and `min(read-write, max)`). The permission enforced is
//!   always `min(chosen, max)`, computed at the call: an operator who lowers a maximum needs no
//!   chat to act.
//! - `workspace::set` (for `/workspace set`) resolves a local directory on this machine
//!   (`LocalRules`, built once with the root canonicalised; `LocalRules::check`: canonicalised, below the root, not the root or `sections/`, not
//!   another section's own, not the data directory or a protected file) and a remote one
//!   lexically (absolute or `~/…`); it refuses a permission above the maximum; the row, the reset
//!   of `section_cwds` for that backend, and the audit row (`workspace.set`, refusals too) are one
//!   transaction.
//! - `workspace::judge` is pure: `check_tool` (at `read`: no `write_file`, `patch`,
//!   `execute_code`), `check_command` (the read-only allow-list over `bash::parse::simple_commands`;
//!   the read-write deletion and destination rules over `bash::effects::walk`; what cannot be
//!   parsed or seen through refuses), `check_write_path` (component-wise inside the
//!   workspace), `check_env` (below `full`, the variables a call gives its command only from
//!   an allow-list of inert names and the operator's `SSHMODE_TOOL_ENV_ALLOW`) and
//!   `read_preamble` (the `git` function a `read` terminal runs behind).
//!
//! Enforcement lives in `agent::tools` (and, for MCP clients, `mcp::server`), once for both
//! backends, after the backend is resolved and before anything runs: `check_tool`; `check_env`
//! on a `terminal` call's `env`; then for a section below `full`, `check_command` on the
//! terminal command or shell code with the workspace, the working directory and the home as
//! they are on the backend's host; and for a file write the path and the workspace resolved on
//! the host (`Ops::real_paths`, `realpath -m`), so `..` and symlinks are judged where they lead.
//! Locally the same choice also shapes the sandbox: `Executors::local_ops_in(section, dir,
//! writable)` grants the chosen directory to Landlock and the file tools — read and execute only
//! at `read` — so the local limit holds for code nobody can judge. A refusal, by the judge or the
//! command guard, is audited as `tool.refused` (`by: permission|guard`) and returned to the model
//! with the permission that blocked it and how to ask for more. The system prompt carries the
//! workspace, what its permission allows, and the mode's guidance.

pub mod cli;
pub mod judge;
pub mod verdict;

use std::path::{Component, Path, PathBuf};

use chrono::{DateTime, Utc};
use serde_json::json;
use sqlx::{PgPool, Row};

pub use judge::{Denied, Permission, Scope};

use crate::audit;
use crate::config::ExecConfig;
use crate::exec::Place;

/// What kind of work a section does; it shapes the system prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Code, tests and git.
    Dev,
    /// Documents and data.
    Office,
    /// Assets: images, layouts, styles.
    Design,
}

impl Mode {
    pub fn parse(s: &str) -> Option<Mode> {
        Some(match s {
            "dev" => Mode::Dev,
            "office" => Mode::Office,
            "design" => Mode::Design,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Dev => "dev",
            Mode::Office => "office",
            Mode::Design => "design",
        }
    }

    /// The mode's paragraph of the system prompt.
    pub fn guidance(self) -> &'static str {
        match self {
            Mode::Dev => {
                "Mode: dev. This is code work: read the code before changing it, keep changes \
small and in the project's style, run the tests or the build that cover a change, and use git \
to show what changed (status, diff). Do not commit or push unless asked."
            }
            Mode::Office => {
                "Mode: office. This is document and data work: keep the original files intact \
and write results as new files unless asked to edit in place, say which files you produced, \
and check figures you report against the data."
            }
            Mode::Design => {
                "Mode: design. This is work on assets (images, layouts, styles, fonts): keep \
originals, name outputs clearly, mention dimensions and formats of what you produce, and \
describe visual changes in words since the chat may not show them."
            }
        }
    }
}

/// Serialises a permission as its name (`read`, `read-write`, `full`).
pub fn serialize_permission<S: serde::Serializer>(p: &Permission, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(p.as_str())
}

/// A section's workspace on one backend, as the tools enforce it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workspace {
    /// `local` or the target alias.
    pub backend: String,
    /// The directory on the backend's host: absolute, or `~` / `~/…` for the remote user's
    /// home.
    pub dir: String,
    /// What the tools enforce: the chosen permission, capped by the maximum.
    pub permission: Permission,
    /// What the section chose (or the default); above `permission` only when the maximum
    /// was lowered since.
    pub chosen: Permission,
    /// The backend's maximum.
    pub max: Permission,
    pub mode: Mode,
    /// Who chose it and when; `None` for the default.
    pub set: Option<(String, DateTime<Utc>)>,
    /// The section's stored working directory on this backend (`section_cwds`), read in the
    /// same query; `None` until a command ran, or since the workspace changed.
    pub cwd: Option<String>,
}

impl Workspace {
    /// The lines of `/workspace show` (and of `/ssh status`).
    pub fn describe(&self) -> String {
        let mut s = format!(
            "Workspace on {}: `{}`\nPermission: {}",
            if self.backend == "local" {
                "local".to_string()
            } else {
                format!("`{}`", self.backend)
            },
            self.dir,
            self.permission
        );
        if self.chosen != self.permission {
            s.push_str(&format!(
                " (chosen {}, capped by the target's maximum {})",
                self.chosen, self.max
            ));
        } else {
            s.push_str(&format!(" (maximum here: {})", self.max));
        }
        s.push_str(&format!("\nMode: {}", self.mode.as_str()));
        match &self.set {
            Some((by, at)) => {
                s.push_str(&format!("\nSet by {by}, {}", at.format("%Y-%m-%d %H:%M UTC")))
            }
            None => s.push_str("\n(the default; `/workspace set <dir> [read|read-write|full] [office|dev|design]` changes it)"),
        }
        s
    }

    /// What the permission means, for the system prompt.
    pub fn permission_guidance(&self) -> &'static str {
        match self.permission {
            Permission::Read => {
                "read: you may look but not change anything. write_file, patch and \
execute_code are refused; terminal runs only read-only commands (ls, cat, head, tail, wc, grep, \
rg, find without -delete/-exec, stat, du, df, ps, sort without -o, git status/log/diff/show), \
with no output redirection; terminal's env sets only inert variables (LANG, LC_*, TZ, TERM, \
COLUMNS, LINES, …)."
            }
            Permission::ReadWrite => {
                "read-write: you may create and edit files inside the workspace, but not delete \
(rm, rmdir, find -delete, git clean, shred, truncate are refused) or write outside it; \
terminal's env sets only inert variables (LANG, LC_*, TZ, TERM, COLUMNS, LINES, …)."
            }
            Permission::Full => "full: no workspace limit beyond the command guard.",
        }
    }
}

/// Where local workspaces may be: below the workspace root, never the service's own files.
#[derive(Debug, Clone)]
pub struct LocalRules {
    /// The workspace root with symlinks resolved (as configured when it did not exist yet).
    root: PathBuf,
    data_dir: PathBuf,
    protected: Vec<PathBuf>,
}

impl LocalRules {
    /// Built once the execution layer has created the workspace root.
    pub fn from_config(c: &ExecConfig) -> LocalRules {
        LocalRules {
            root: std::fs::canonicalize(&c.workspace_root)
                .unwrap_or_else(|_| c.workspace_root.clone()),
            data_dir: c.local.data_dir.clone(),
            protected: c.local.protected.clone(),
        }
    }

    /// A section's own directory: `<root>/sections/<section>`.
    pub fn own_dir(&self, section: &str) -> PathBuf {
        self.root
            .join("sections")
            .join(crate::exec::local::workspace_dir_name(section))
    }

    /// Resolves the directory `asked` (absolute, or relative to the workspace root) for
    /// `section`, after `..` and symlinks, and checks that the section may work there.
    pub fn check(&self, section: &str, asked: &str) -> Result<PathBuf, String> {
        let asked = asked.trim();
        if asked.is_empty() || asked.len() > 4096 || asked.chars().any(char::is_control) {
            return Err("the directory is empty, too long, or holds control characters".into());
        }
        let root = &self.root;
        let own = self.own_dir(section);
        let given = Path::new(asked);
        let joined = if given.is_absolute() {
            given.to_path_buf()
        } else {
            root.join(given)
        };
        let dir = match std::fs::canonicalize(&joined) {
            Ok(d) => d,
            // The section's own directory is created on first use.
            Err(_) if lexical(&joined).is_some_and(|l| l.starts_with(&own)) => {
                lexical(&joined).expect("checked")
            }
            Err(_) => {
                return Err(format!(
                    "`{asked}`: no such directory below {}; an operator creates shared ones",
                    root.display()
                ));
            }
        };
        if dir.exists() && !dir.is_dir() {
            return Err(format!("`{asked}` is not a directory"));
        }
        let sections = root.join("sections");
        let below_root = dir.starts_with(root) && dir != *root && dir != sections;
        let foreign = dir.starts_with(&sections) && !dir.starts_with(&own);
        let service = self
            .protected
            .iter()
            .chain([&self.data_dir])
            .any(|p| p.starts_with(&dir))
            || (dir.starts_with(&self.data_dir) && !root.starts_with(&self.data_dir));
        if !below_root || foreign || service {
            return Err(format!(
                "`{asked}` cannot be a local workspace: choose a directory below {} (your own is {}), not another section's own directory or the service's files",
                root.display(),
                own.display()
            ));
        }
        Ok(dir)
    }
}

/// `path` with `.` and `..` removed lexically; `None` if `..` climbs above the root.
fn lexical(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::RootDir => out.push("/"),
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() || out.as_os_str().is_empty() {
                    return None;
                }
            }
            Component::Normal(n) => out.push(n),
            Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

/// Checks a remote directory as written: absolute or `~`-based, normalised lexically. Its
/// existence and symlinks are the host's business, checked by the tools when they run.
pub fn remote_dir(asked: &str) -> Result<String, String> {
    let asked = asked.trim();
    if asked.is_empty() || asked.len() > 4096 || asked.chars().any(char::is_control) {
        return Err("the directory is empty, too long, or holds control characters".into());
    }
    let (prefix, rest) = if asked == "~" {
        return Ok("~".into());
    } else if let Some(rest) = asked.strip_prefix("~/") {
        ("~/", rest)
    } else if asked.starts_with('/') {
        ("/", asked)
    } else {
        return Err(format!(
            "`{asked}`: a directory on a target is absolute (`/srv/app`) or in the remote home (`~/app`)"
        ));
    };
    let normal = lexical(&Path::new("/").join(rest))
        .ok_or_else(|| format!("`{asked}` climbs above its start with `..`"))?;
    let tail = normal.to_string_lossy();
    let tail = tail.trim_start_matches('/');
    Ok(match (prefix, tail.is_empty()) {
        ("~/", true) => "~".into(),
        ("~/", false) => format!("~/{tail}"),
        _ => format!("/{tail}"),
    })
}

/// The section's workspace on `place` now: its choice capped by the maximum, or the default.
pub async fn current(
    db: &PgPool,
    rules: &LocalRules,
    section: &str,
    place: &Place,
) -> anyhow::Result<Workspace> {
    current_in(&mut *db.acquire().await?, rules, section, place).await
}

async fn current_in(
    conn: &mut sqlx::PgConnection,
    rules: &LocalRules,
    section: &str,
    place: &Place,
) -> anyhow::Result<Workspace> {
    let row =
        match place {
            Place::Local => sqlx::query(
                "SELECT 'full' AS max_permission, NULL::text AS default_dir, w.dir, w.permission, \
             w.mode, w.set_by, w.set_at, c.dir AS cwd FROM (SELECT 1) one \
             LEFT JOIN workspaces w ON w.section_id = $1 AND w.backend = 'local' \
             LEFT JOIN section_cwds c ON c.section_id = $1 AND c.backend = 'local'",
            )
            .bind(section)
            .fetch_one(&mut *conn)
            .await?,
            Place::Target(alias) => sqlx::query(
                "SELECT t.max_permission, t.workspace AS default_dir, w.dir, w.permission, w.mode, \
             w.set_by, w.set_at, c.dir AS cwd FROM targets t LEFT JOIN workspaces w \
             ON w.section_id = $1 AND w.backend = t.alias AND w.generation = t.generation \
             LEFT JOIN section_cwds c ON c.section_id = $1 AND c.backend = t.alias \
             WHERE t.alias = $2",
            )
            .bind(section)
            .bind(alias)
            .fetch_optional(&mut *conn)
            .await?
            .ok_or_else(|| anyhow::anyhow!("target `{alias}` is not registered"))?,
        };
    let max = Permission::parse(row.get("max_permission")).unwrap_or(Permission::Read);
    let chosen_dir: Option<String> = row.get("dir");
    let (dir, chosen, set) = match chosen_dir {
        Some(dir) => (
            dir,
            Permission::parse(row.get("permission")).unwrap_or(Permission::Read),
            Some((row.get::<String, _>("set_by"), row.get("set_at"))),
        ),
        None => match place {
            Place::Local => (
                rules.own_dir(section).display().to_string(),
                // The local backend's maximum.
                Permission::Full,
                None,
            ),
            Place::Target(_) => (
                row.get::<Option<String>, _>("default_dir")
                    .unwrap_or_else(|| "~".into()),
                Permission::ReadWrite.min(max),
                None,
            ),
        },
    };
    let mode = row
        .get::<Option<String>, _>("mode")
        .and_then(|m| Mode::parse(&m))
        .unwrap_or(Mode::Dev);
    Ok(Workspace {
        backend: place.name().to_string(),
        dir,
        permission: chosen.min(max),
        chosen,
        max,
        mode,
        set,
        cwd: row.get("cwd"),
    })
}

/// What `/workspace set` asks for; omitted parts keep their current value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    pub dir: String,
    pub permission: Option<Permission>,
    pub mode: Option<Mode>,
}

/// `/workspace set` by `actor` in `section` on `place`. The change (or the refusal, with its
/// reason) is audited in the same transaction; the section's working directory on that
/// backend starts again at the new workspace. `Ok(Err(text))` is a refusal to show.
pub async fn set(
    db: &PgPool,
    rules: &LocalRules,
    actor: &str,
    section: &str,
    place: &Place,
    choice: &Choice,
) -> anyhow::Result<Result<Workspace, String>> {
    // The local directory is resolved on this machine before the transaction.
    let dir = match place {
        Place::Local => {
            let (rules, section, asked) = (rules.clone(), section.to_string(), choice.dir.clone());
            tokio::task::spawn_blocking(move || rules.check(&section, &asked))
                .await?
                .map(|d| d.display().to_string())
        }
        Place::Target(_) => remote_dir(&choice.dir),
    };
    let mut tx = db.begin().await?;
    let before = current_in(&mut tx, rules, section, place).await?;
    let permission = choice.permission.unwrap_or(before.chosen);
    let mode = choice.mode.unwrap_or(before.mode);
    let backend = place.name();
    let refusal = match &dir {
        Err(why) => Some(why.clone()),
        Ok(_) if permission > before.max => Some(format!(
            "`{permission}` is above the maximum of {} here ({}); an operator can raise it with `sshmode target set {backend} --permission {permission}`",
            match place {
                Place::Local => "the local backend".to_string(),
                Place::Target(_) => format!("target `{backend}`"),
            },
            before.max,
        )),
        Ok(_) => None,
    };
    let target = place.target();
    let entry = |outcome, detail| audit::ChatEntry {
        actor,
        action: "workspace.set",
        section: Some(section),
        target,
        outcome,
        detail,
    };
    if let Some(why) = refusal {
        let detail = json!({ "dir": choice.dir, "permission": permission.as_str(), "reason": why });
        audit::record_chat(&mut tx, entry("refused", detail)).await?;
        tx.commit().await?;
        return Ok(Err(why));
    }
    let dir = dir.expect("checked");
    let set_at: DateTime<Utc> = sqlx::query_scalar(
        "INSERT INTO workspaces (section_id, backend, generation, dir, permission, mode, set_by) \
         VALUES ($1, $2, (SELECT generation FROM targets WHERE alias = $2 AND $2 <> 'local'), \
                 $3, $4, $5, $6) \
         ON CONFLICT (section_id, backend) DO UPDATE SET generation = EXCLUDED.generation, \
             dir = EXCLUDED.dir, permission = EXCLUDED.permission, mode = EXCLUDED.mode, \
             set_by = EXCLUDED.set_by, set_at = now() \
         RETURNING set_at",
    )
    .bind(section)
    .bind(backend)
    .bind(&dir)
    .bind(permission.as_str())
    .bind(mode.as_str())
    .bind(actor)
    .fetch_one(&mut *tx)
    .await?;
    // The shell starts again in the new workspace.
    sqlx::query("DELETE FROM section_cwds WHERE section_id = $1 AND backend = $2")
        .bind(section)
        .bind(backend)
        .execute(&mut *tx)
        .await?;
    let detail = json!({
        "dir": dir, "permission": permission.as_str(), "mode": mode.as_str(),
        "from": { "dir": before.dir, "permission": before.chosen.as_str(), "mode": before.mode.as_str() },
    });
    audit::record_chat(&mut tx, entry("ok", detail)).await?;
    tx.commit().await?;
    Ok(Ok(Workspace {
        backend: backend.to_string(),
        dir,
        permission,
        chosen: permission,
        max: before.max,
        mode,
        set: Some((actor.to_string(), set_at)),
        cwd: None,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_directories_are_absolute_or_in_the_home_and_normalised() {
        assert_eq!(remote_dir("~").unwrap(), "~");
        assert_eq!(remote_dir("~/").unwrap(), "~");
        assert_eq!(remote_dir("~/app/./src/..").unwrap(), "~/app");
        assert_eq!(remote_dir("/srv//app/").unwrap(), "/srv/app");
        assert_eq!(remote_dir("/").unwrap(), "/");
        assert!(remote_dir("app").is_err());
        assert!(remote_dir("~bob/app").is_err());
        assert!(remote_dir("/srv/../..").is_err());
        assert!(remote_dir("/srv/a\nb").is_err());
    }

    fn rules(root: &Path, data: &Path) -> LocalRules {
        LocalRules {
            root: root.to_path_buf(),
            data_dir: data.to_path_buf(),
            protected: vec![data.join("master.key")],
        }
    }

    #[test]
    fn local_workspaces_stay_below_the_root_and_out_of_other_sections() {
        let tmp = tempfile::tempdir().unwrap();
        let data = std::fs::canonicalize(tmp.path()).unwrap();
        let root = data.join("workspaces");
        for d in ["sections/a", "sections/b", "projects/app"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        std::fs::create_dir_all(data.join("pg")).unwrap();
        std::os::unix::fs::symlink(data.join("pg"), root.join("projects/pg")).unwrap();
        std::os::unix::fs::symlink(root.join("sections/b"), root.join("projects/b")).unwrap();
        std::fs::write(root.join("projects/file"), b"x").unwrap();
        let r = rules(&root, &data);

        assert_eq!(
            r.check("a", "projects/app").unwrap(),
            root.join("projects/app")
        );
        assert_eq!(
            r.check("a", &root.join("projects/app").display().to_string())
                .unwrap(),
            root.join("projects/app")
        );
        assert_eq!(r.check("a", "sections/a").unwrap(), root.join("sections/a"));
        // The own directory need not exist yet.
        assert_eq!(r.check("c", "sections/c").unwrap(), root.join("sections/c"));
        for bad in [
            ".",
            "sections",
            "sections/b",
            "projects/b",
            "projects/pg",
            "projects/../..",
            "/etc",
            "../pg",
            "projects/missing",
            "projects/file",
        ] {
            assert!(r.check("a", bad).is_err(), "{bad} was accepted");
        }
    }

    #[test]
    fn a_root_that_holds_the_data_directory_does_not_open_it() {
        let tmp = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(tmp.path()).unwrap();
        let data = root.join("data");
        std::fs::create_dir_all(data.join("pg")).unwrap();
        std::fs::create_dir_all(root.join("shared")).unwrap();
        let r = rules(&root, &data);
        assert!(r.check("a", "shared").is_ok());
        assert!(r.check("a", "data").is_err());
        assert!(r.check("a", "data/pg").is_err());
    }

    #[test]
    fn the_effective_permission_is_capped_by_the_maximum() {
        assert_eq!(Permission::Full.min(Permission::Read), Permission::Read);
        assert!(Permission::Read < Permission::ReadWrite);
        assert!(Permission::ReadWrite < Permission::Full);
    }
}
