//! The workspace permission judge: decides, before anything runs, whether a task tool call
//! is allowed at a workspace's permission — `read` (look, don't touch), `read-write` (edit
//! but don't delete, and don't write outside the workspace) or `full` — and when it is not,
//! says which permission blocked what, why, and how to ask for more.
//!
//! It owns the read-only allow-list (commands and their refused options, as tables), the
//! read-write rules (deleting commands, writers and their destinations) and the shell
//! preamble that disarms a repository's own configuration for `git` at `read`. It is a policy
//! over the shell core: `read` judges each simple command of [`crate::bash::parse`];
//! `read-write` judges the effects the one walk lists ([`crate::bash::effects`]: programs
//! unwrapped from wrappers and nested scripts, where they run, writes, sockets). It fails
//! closed: a script it cannot parse is refused, so is whatever the walk cannot see through,
//! and so is any word a rule depends on whose value is only known when it runs.
//!
//! It never runs anything, never touches the filesystem (paths are normalised lexically; the
//! caller resolves symlinks for the file tools) and never rewrites a command. It does not
//! replace the command guard, which applies separately at every permission.
//!
//! **`read-write` on a remote host is a guard, not a sandbox.** An interpreter, a build tool,
//! a script file or a symlink can write anywhere the account may, and no static judgement of
//! the command line sees it. `read` is strict because it allows only commands that cannot
//! write; on the local backend the sandbox makes the workspace limit hard.
//!
//! Neither `read` nor `read-write` lets a redirection open a socket (`/dev/tcp/…`,
//! `/dev/udp/…`, which bash opens itself); at `read-write` that is all it does about the
//! network, since programs that reach it (`curl`, interpreters) are allowed there.
//!
//! The levels, one file each: `read` (the allow-list, the `git` rules and the preamble) and
//! `read_write` (deleters and writers, over the effects); `env` judges the variables a call
//! gives its command (below `full`, an allow-list of inert names); this file holds the
//! permissions, the refusals, the entry points, and what both share (inside the workspace,
//! harmless devices). `hostile` tests the preamble against hostile repositories.

use std::fmt;

use crate::bash::effects::{normalise, resolve};

mod env;
#[cfg(test)]
mod hostile;
mod read;
mod read_write;

pub use env::{built_in_names as built_in_env_names, check_env};
pub use read::read_preamble;

use read::check_read;

// ---------------------------------------------------------------------------------------------
// Permissions and refusals
// ---------------------------------------------------------------------------------------------

/// A workspace's permission, ordered: Read < ReadWrite < Full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Permission {
    /// Look, don't touch: only commands from the read-only allow-list, no file writes.
    Read,
    /// Edit, but delete nothing and write nothing outside the workspace.
    ReadWrite,
    /// Whatever the command guard allows.
    Full,
}

impl Permission {
    /// Every permission, lowest first.
    pub const ALL: [Permission; 3] = [Permission::Read, Permission::ReadWrite, Permission::Full];

    /// `read`, `read-write` or `full`, ignoring case; `rw`, `readwrite` and `read_write` are
    /// accepted for `read-write`. Anything else is `None`.
    pub fn parse(s: &str) -> Option<Permission> {
        match s.trim().to_ascii_lowercase().as_str() {
            "read" => Some(Permission::Read),
            "read-write" | "rw" | "readwrite" | "read_write" => Some(Permission::ReadWrite),
            "full" => Some(Permission::Full),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Permission::Read => "read",
            Permission::ReadWrite => "read-write",
            Permission::Full => "full",
        }
    }

    /// The next permission up (`full` stays `full`).
    pub fn next(self) -> Permission {
        match self {
            Permission::Read => Permission::ReadWrite,
            Permission::ReadWrite | Permission::Full => Permission::Full,
        }
    }
}

impl fmt::Display for Permission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a command runs, on the backend's host (absolute, already known paths).
#[derive(Debug, Clone, Copy)]
pub struct Scope<'a> {
    /// The workspace directory.
    pub workspace: &'a str,
    /// The directory the command starts in.
    pub cwd: &'a str,
    /// The home directory of the account it runs as, for `~`; `None` when unknown.
    pub home: Option<&'a str>,
}

/// A refusal: which permission blocked what, why, and the lowest permission that would allow
/// it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denied {
    /// The workspace's permission that refused.
    pub permission: Permission,
    /// What was refused: a tool name, a command as written, or a path.
    pub what: String,
    /// Why, in a few words (`deletes files`, `writes outside the workspace to /etc/x`).
    pub why: String,
    /// The lowest permission that allows it.
    pub needed: Permission,
}

impl Denied {
    /// A refusal that the next permission up would allow.
    pub fn new(permission: Permission, what: impl Into<String>, why: impl Into<String>) -> Denied {
        Denied {
            permission,
            what: crate::bash::abbreviate(&what.into(), MAX_WHAT),
            why: why.into(),
            needed: permission.next(),
        }
    }

    fn needing(mut self, needed: Permission) -> Denied {
        self.needed = needed;
        self
    }
}

impl fmt::Display for Denied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the workspace permission `{}` does not allow `{}` ({}): ask someone in this chat \
             to run `/workspace set <dir> {}`, or an operator to raise the target's maximum \
             with `sshmode target set <alias> --permission {}`",
            self.permission, self.what, self.why, self.needed, self.needed
        )
    }
}

impl std::error::Error for Denied {}

/// Longest `what` quoted in a refusal.
const MAX_WHAT: usize = 200;

// ---------------------------------------------------------------------------------------------
// The entry points
// ---------------------------------------------------------------------------------------------

/// Task tools that write or run programs, refused at `read`, with the reason.
const WRITING_TOOLS: &[(&str, &str)] = &[
    ("write_file", "writes files"),
    ("patch", "edits files"),
    ("execute_code", "runs a program, which can do anything"),
];

/// Whether a task tool may run at all: at Read, `write_file`, `patch`, `execute_code` are
/// refused. Every other tool is allowed here; its commands and paths are judged by
/// [`check_command`] and [`check_write_path`].
pub fn check_tool(permission: Permission, tool: &str) -> Result<(), Denied> {
    if permission > Permission::Read {
        return Ok(());
    }
    match WRITING_TOOLS.iter().find(|(name, _)| *name == tool) {
        Some((name, why)) => Err(Denied::new(permission, *name, *why)),
        None => Ok(()),
    }
}

/// A shell script (terminal, or execute_code in bash/sh) at this permission.
pub fn check_command(permission: Permission, script: &str, scope: &Scope) -> Result<(), Denied> {
    match permission {
        Permission::Full => Ok(()),
        Permission::ReadWrite => {
            read_write::check(scope, script).map_err(|d| d.needing(Permission::Full))
        }
        Permission::Read => check_read(script).map_err(|d| {
            let needed = if check_command(Permission::ReadWrite, script, scope).is_ok() {
                Permission::ReadWrite
            } else {
                Permission::Full
            };
            d.needing(needed)
        }),
    }
}

/// A file tool's write to `path` (absolute, on the host; the caller has already resolved
/// symlinks on the host — `.` and `..` are normalised here, lexically): Read refuses all;
/// ReadWrite refuses anything not equal to or beneath the workspace; Full allows. A relative
/// path is taken against `scope.cwd`, `~` against `scope.home`.
pub fn check_write_path(permission: Permission, path: &str, scope: &Scope) -> Result<(), Denied> {
    match permission {
        Permission::Full => Ok(()),
        Permission::Read => Err(Denied::new(permission, path, "writes files")),
        Permission::ReadWrite => {
            let workspace = normalise("/", scope.workspace);
            match resolve(path, &[scope.cwd.to_owned()], scope.home) {
                Some(all) if all.iter().all(|p| inside(&workspace, p)) => Ok(()),
                Some(all) => Err(Denied::new(
                    permission,
                    path,
                    format!("{} is outside the workspace {workspace}", all.join(", ")),
                )),
                None => Err(Denied::new(
                    permission,
                    path,
                    "its place cannot be known before it is written",
                )),
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Paths (lexical only)
// ---------------------------------------------------------------------------------------------

/// Whether the normalised `path` is `workspace` or beneath it.
fn inside(workspace: &str, path: &str) -> bool {
    workspace == "/"
        || path == workspace
        || path
            .strip_prefix(workspace)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// Devices a write to is no write to a file.
fn harmless_device(path: &str) -> bool {
    matches!(path, "/dev/null" | "/dev/stdout" | "/dev/stderr")
        || path
            .strip_prefix("/dev/fd/")
            .is_some_and(|fd| !fd.is_empty() && fd.chars().all(|c| c.is_ascii_digit()))
}

/// Helpers shared by the tests of every level.
#[cfg(test)]
mod testing {
    use super::*;

    pub(super) const SCOPE: Scope<'static> = Scope {
        workspace: "/srv/ws",
        cwd: "/srv/ws",
        home: Some("/home/u"),
    };

    pub(super) fn at(permission: Permission, script: &str) -> Result<(), Denied> {
        check_command(permission, script, &SCOPE)
    }

    #[track_caller]
    pub(super) fn allowed(permission: Permission, scripts: &[&str]) {
        for script in scripts {
            if let Err(d) = at(permission, script) {
                panic!("{permission}: `{script}` was refused: {d}");
            }
        }
    }

    #[track_caller]
    pub(super) fn refused(permission: Permission, scripts: &[&str]) {
        for script in scripts {
            assert!(
                at(permission, script).is_err(),
                "{permission}: `{script}` was allowed"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{SCOPE, allowed, at};
    use super::*;

    #[test]
    fn permissions_parse_print_and_order() {
        for p in Permission::ALL {
            assert_eq!(Permission::parse(p.as_str()), Some(p));
            assert_eq!(p.to_string(), p.as_str());
        }
        for alias in ["rw", "readwrite", "read_write", "Read-Write"] {
            assert_eq!(Permission::parse(alias), Some(Permission::ReadWrite));
        }
        assert_eq!(Permission::parse("write"), None);
        assert!(Permission::Read < Permission::ReadWrite);
        assert!(Permission::ReadWrite < Permission::Full);
    }

    #[test]
    fn tools_that_write_are_refused_at_read_only() {
        for tool in ["write_file", "patch", "execute_code"] {
            let d = check_tool(Permission::Read, tool).unwrap_err();
            assert_eq!((d.permission, d.what.as_str()), (Permission::Read, tool));
            check_tool(Permission::ReadWrite, tool).unwrap();
            check_tool(Permission::Full, tool).unwrap();
        }
        check_tool(Permission::Read, "terminal").unwrap();
        check_tool(Permission::Read, "read_file").unwrap();
    }

    #[test]
    fn a_refusal_names_the_permission_what_why_and_how_to_ask() {
        let d = at(Permission::Read, "rm -rf d").unwrap_err();
        assert_eq!(
            d.to_string(),
            "the workspace permission `read` does not allow `rm -rf d` (`rm` is not on the \
             read-only list): ask someone in this chat to run `/workspace set <dir> full`, or \
             an operator to raise the target's maximum with `sshmode target set <alias> \
             --permission full`"
        );
        // What read-write allows, read asks for read-write.
        let d = at(Permission::Read, "cat x > y").unwrap_err();
        assert_eq!(d.needed, Permission::ReadWrite);
        assert!(
            d.to_string()
                .contains("`cat x > y` (it redirects output to `y`)"),
            "{d}"
        );
        let d = at(Permission::ReadWrite, "rm f").unwrap_err();
        assert_eq!(
            (d.permission, d.needed),
            (Permission::ReadWrite, Permission::Full)
        );
        assert_eq!(d.why, "deletes files");
        // Long commands are clipped.
        let long = format!("rm {}", "x".repeat(1000));
        assert!(
            at(Permission::ReadWrite, &long)
                .unwrap_err()
                .what
                .chars()
                .count()
                <= MAX_WHAT + 1
        );
    }

    #[test]
    fn full_allows_whatever_the_guard_allows() {
        allowed(
            Permission::Full,
            &[
                "rm -rf d",
                "echo x > /etc/x",
                "git clean -fdx",
                &"$(".repeat(40),
            ],
        );
    }

    #[test]
    fn write_paths() {
        let ok = |p: Permission, path: &str| check_write_path(p, path, &SCOPE);
        for path in [
            "/srv/ws",
            "/srv/ws/a",
            "/srv/ws/a/../b",
            "a/b",
            "./a",
            "/srv/ws/./x/",
        ] {
            ok(Permission::ReadWrite, path).unwrap();
            ok(Permission::Full, path).unwrap();
            assert!(ok(Permission::Read, path).is_err());
        }
        for path in [
            "/srv/wsx",
            "/srv/ws/../x",
            "../x",
            "/etc/passwd",
            "~/x",
            "~bob/x",
            "/",
        ] {
            let d = ok(Permission::ReadWrite, path).unwrap_err();
            assert_eq!(d.needed, Permission::Full, "{path}");
            ok(Permission::Full, path).unwrap();
        }
        let root = Scope {
            workspace: "/",
            ..SCOPE
        };
        check_write_path(Permission::ReadWrite, "/etc/x", &root).unwrap();
        let home = Scope {
            workspace: "/home/u",
            cwd: "/home/u",
            home: Some("/home/u/"),
        };
        check_write_path(Permission::ReadWrite, "~/x", &home).unwrap();
    }

    #[test]
    fn paths_are_normalised_lexically() {
        assert_eq!(normalise("/a/b", "../c/./d//e/.."), "/a/c/d");
        assert_eq!(normalise("/a", "/../../x"), "/x");
        assert_eq!(normalise("/", "."), "/");
        assert!(inside("/a", "/a") && inside("/a", "/a/b") && !inside("/a", "/ab"));
    }

    const PIECES: &[&str] = &[
        "rm ",
        "cp ",
        "tar ",
        "git ",
        "sudo ",
        "xargs ",
        "find ",
        "sed -i",
        "sh -c ",
        "cd ",
        "-",
        "--",
        "-t",
        "-C",
        "=",
        "/",
        "..",
        "~",
        "$X",
        "$(",
        ")",
        "`",
        "'",
        "\"",
        "{}",
        "{a,b}",
        "*",
        ";",
        "&&",
        "|",
        ">",
        ">>",
        "<",
        "<<E\n",
        "\nE\n",
        "é",
        "😀",
        " ",
        "\n",
        "-exec ",
        "\\;",
        "of=",
        "--target=",
        "-uo",
    ];

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(4096))]

        /// Arbitrary scripts and paths never panic: every answer is a yes or a refusal.
        #[test]
        fn arbitrary_input_never_panics(
            parts in proptest::collection::vec(proptest::sample::select(PIECES), 0..16)
        ) {
            let script = parts.concat();
            for p in Permission::ALL {
                let _ = check_command(p, &script, &SCOPE);
                let _ = check_write_path(p, &script, &SCOPE);
            }
        }

        /// The read-write policy fails closed over the one walk: whatever the walk cannot see
        /// through, a socket, or a program that deletes is refused.
        #[test]
        fn read_write_refuses_what_the_walk_cannot_see_through(
            parts in proptest::collection::vec(proptest::sample::select(PIECES), 0..16)
        ) {
            use crate::bash::effects::{self, Effect, Start};
            let script = parts.concat();
            let start = Start { cwd: Some(SCOPE.cwd), home: SCOPE.home, env: &[] };
            let blocked = effects::walk(&script, start).iter().any(|e| match e {
                Effect::Opaque { .. } | Effect::Bound { .. } | Effect::Network { .. } => true,
                Effect::Program { argv, .. } => {
                    argv[0].literal.as_deref().map(crate::bash::basename) == Some("rm")
                }
                _ => false,
            });
            if blocked {
                proptest::prop_assert!(
                    check_command(Permission::ReadWrite, &script, &SCOPE).is_err(),
                    "allowed: {script}"
                );
            }
        }
    }
}
