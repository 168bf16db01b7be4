//! The environment a call gives its command (the `env` of `terminal` and of MCP `exec`). The
//! judge reads the command, never the environment, and a variable can make any program run
//! code: the loader's (`LD_PRELOAD`, `LD_AUDIT`), a shell's start-up files (`BASH_ENV`,
//! `ENV`, `PROMPT_COMMAND`), an interpreter's (`PYTHONSTARTUP`, `PERL5OPT`, `RUBYOPT`,
//! `NODE_OPTIONS`), git's (`GIT_CONFIG_*`, `GIT_EXTERNAL_DIFF`), or where a name is found
//! (`PATH`, `IFS`). So below `full` a call may set only the plain, inert variables of
//! [`BUILT_IN`] and the names the operator adds (`SSHMODE_TOOL_ENV_ALLOW`). It is an
//! allow-list: a list of the variables that load code is always one name short.
//!
//! `read-write` allows no more than `read` here: what a variable makes a program do cannot be
//! judged from the command, and the judge allows only what it can judge. A variable written
//! in the command itself (`NAME=value cmd`, `export`) is judged with the command — refused at
//! `read`. At `full` any name passes (the execution layer checks its syntax).
//!
//! A refusal names the variable, never its value.

use super::{Denied, Permission};

/// What the value of an allowed built-in variable may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Value {
    /// Anything: the variable names no file anything is loaded from (a time zone's file is
    /// data).
    Any,
    /// A locale name, without `/`: a locale named by a path is read from that path.
    Locale,
    /// A terminal type's name ([`crate::exec::pty::valid_term`]), never a path.
    Term,
    /// A count of columns or lines: 1 to 5 digits.
    Count,
}

impl Value {
    /// Why `value` is refused, if it is.
    fn refuses(self, value: &str) -> Option<&'static str> {
        match self {
            Value::Any => None,
            Value::Locale => value
                .contains('/')
                .then_some("its value names a path; a locale is named without `/`"),
            Value::Term => (!crate::exec::pty::valid_term(value))
                .then_some("its value is not a terminal type such as xterm"),
            Value::Count => {
                (value.is_empty() || value.len() > 5 || !value.bytes().all(|b| b.is_ascii_digit()))
                    .then_some("its value is not a number")
            }
        }
    }
}

/// The variables a call may set below `full` whatever the configuration: `NAME`, or `PREFIX*`
/// for every name that starts so, with what their values may hold. Each only changes how text
/// is shown (language, time zone, terminal type and size, colour).
const BUILT_IN: &[(&str, Value)] = &[
    ("LANG", Value::Locale),
    ("LANGUAGE", Value::Locale),
    ("LC_*", Value::Locale),
    ("TZ", Value::Any),
    ("TERM", Value::Term),
    ("COLORTERM", Value::Any),
    ("COLUMNS", Value::Count),
    ("LINES", Value::Count),
    ("NO_COLOR", Value::Any),
];

/// The built-in names, as [`BUILT_IN`] spells them (for documentation and tests).
pub fn built_in_names() -> impl Iterator<Item = &'static str> {
    BUILT_IN.iter().map(|(name, _)| *name)
}

/// Whether `name` is `pattern`, or starts with its stem when `pattern` ends with `*`.
fn matches(pattern: &str, name: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(stem) => name.starts_with(stem),
        None => name == pattern,
    }
}

/// Whether a call at `permission` may give its command the variables `env`; `operator`: the
/// names the operator allows besides [`BUILT_IN`] (`SSHMODE_TOOL_ENV_ALLOW`, any value).
pub fn check_env(
    permission: Permission,
    env: &[(String, String)],
    operator: &[String],
) -> Result<(), Denied> {
    if permission == Permission::Full {
        return Ok(());
    }
    for (name, value) in env {
        let why = match BUILT_IN.iter().find(|(p, _)| matches(p, name)) {
            Some((_, rule)) => rule.refuses(value).map(str::to_owned),
            None if operator.iter().any(|p| matches(p, name)) => None,
            None => Some(not_allowed(operator)),
        };
        if let Some(why) = why {
            return Err(Denied::new(permission, format!("{name}=…"), why).needing(Permission::Full));
        }
    }
    Ok(())
}

/// Why a name off the list is refused: the list, and the operator's additions.
fn not_allowed(operator: &[String]) -> String {
    let built_in: Vec<&str> = built_in_names().collect();
    let added = match operator {
        [] => "none yet".to_owned(),
        names => names.join(", "),
    };
    format!(
        "below `full` a call's `env` may set only {} and the names an operator adds to \
         SSHMODE_TOOL_ENV_ALLOW ({added}); put anything else in the command, where it is judged",
        built_in.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[track_caller]
    fn allowed(permission: Permission, pairs: &[(&str, &str)], operator: &[&str]) {
        let operator: Vec<String> = operator.iter().map(|s| s.to_string()).collect();
        if let Err(d) = check_env(permission, &env(pairs), &operator) {
            panic!("{permission}: {pairs:?} was refused: {d}");
        }
    }

    #[track_caller]
    fn refused(permission: Permission, pairs: &[(&str, &str)], operator: &[&str]) -> Denied {
        let operator: Vec<String> = operator.iter().map(|s| s.to_string()).collect();
        check_env(permission, &env(pairs), &operator)
            .expect_err(&format!("{permission}: {pairs:?} was allowed"))
    }

    /// Variables that run code, find programs or change how the shell reads a line.
    const CODE: &[&str] = &[
        "LD_PRELOAD",
        "LD_AUDIT",
        "LD_LIBRARY_PATH",
        "BASH_ENV",
        "ENV",
        "PROMPT_COMMAND",
        "PYTHONSTARTUP",
        "PYTHONPATH",
        "PERL5OPT",
        "PERL5LIB",
        "RUBYOPT",
        "NODE_OPTIONS",
        "GIT_CONFIG_COUNT",
        "GIT_CONFIG_KEY_0",
        "GIT_EXTERNAL_DIFF",
        "GIT_SSH_COMMAND",
        "PATH",
        "IFS",
        "SHELLOPTS",
        "BASHOPTS",
        "PS4",
        "HOME",
        "CDPATH",
        "GCONV_PATH",
        "PAGER",
        "LESSOPEN",
        "BASH_FUNC_ls%%",
        "lang",
        "BAD-NAME",
    ];

    #[test]
    fn below_full_only_inert_names_pass() {
        for p in [Permission::Read, Permission::ReadWrite] {
            allowed(
                p,
                &[
                    ("LANG", "C.UTF-8"),
                    ("LC_ALL", "de_DE.UTF-8"),
                    ("LC_TIME", "en_GB.UTF-8@euro"),
                    ("LANGUAGE", "de:en"),
                    ("TZ", "Europe/Berlin"),
                    ("TERM", "xterm-256color"),
                    ("COLORTERM", "truecolor"),
                    ("COLUMNS", "200"),
                    ("LINES", "50"),
                    ("NO_COLOR", "1"),
                ],
                &[],
            );
            allowed(p, &[], &[]);
            for name in CODE {
                let d = refused(p, &[("LC_ALL", "C"), (name, "/home/u/x.so")], &[]);
                assert_eq!((d.permission, d.needed), (p, Permission::Full), "{name}");
                assert_eq!(d.what, format!("{name}=…"));
            }
        }
    }

    #[test]
    fn lc_all_is_allowed_and_ld_audit_refused() {
        allowed(Permission::Read, &[("LC_ALL", "C.UTF-8")], &[]);
        refused(Permission::Read, &[("LD_AUDIT", "/home/u/a.so")], &[]);
    }

    #[test]
    fn values_that_name_a_file_to_load_are_refused() {
        for (name, value) in [
            ("LANG", "/home/u/locale"),
            ("LC_CTYPE", "../../home/u/l"),
            ("LANGUAGE", "de:/tmp/x"),
            ("TERM", "../../home/u/.terminfo/x"),
            ("TERM", ""),
            ("COLUMNS", "80; rm x"),
            ("LINES", ""),
        ] {
            let d = refused(Permission::Read, &[(name, value)], &[]);
            assert!(!d.to_string().contains(value) || value.is_empty(), "{d}");
        }
    }

    #[test]
    fn the_operator_adds_names_and_prefixes() {
        let operator = ["RUST_BACKTRACE", "MYAPP_*"];
        for p in [Permission::Read, Permission::ReadWrite] {
            allowed(
                p,
                &[
                    ("RUST_BACKTRACE", "1"),
                    ("MYAPP_MODE", "any value / at all"),
                ],
                &operator,
            );
            refused(p, &[("RUST_LOG", "debug")], &operator);
            refused(p, &[("MYAPP", "x")], &operator);
        }
        // An added name does not loosen a built-in one's value.
        refused(Permission::Read, &[("LANG", "/x")], &["LANG"]);
    }

    #[test]
    fn full_permits_every_name() {
        let all: Vec<(&str, &str)> = CODE.iter().map(|n| (*n, "/home/u/x.so")).collect();
        allowed(Permission::Full, &all, &[]);
        allowed(Permission::Full, &[("LANG", "/x"), ("TERM", "../x")], &[]);
    }

    #[test]
    fn a_refusal_names_the_variable_and_what_is_allowed_never_the_value() {
        let d = refused(
            Permission::Read,
            &[("LD_PRELOAD", "/home/u/secret-lib.so")],
            &["RUST_BACKTRACE"],
        );
        let text = d.to_string();
        assert!(
            text.contains("`read`") && text.contains("LD_PRELOAD"),
            "{text}"
        );
        for name in built_in_names().chain(["RUST_BACKTRACE", "SSHMODE_TOOL_ENV_ALLOW"]) {
            assert!(text.contains(name), "{name}: {text}");
        }
        assert!(!text.contains("secret-lib"), "{text}");
        assert!(not_allowed(&[]).contains("(none yet)"));
    }

    /// README's paragraph under the permission table lists every built-in name.
    #[test]
    fn the_readme_lists_the_built_in_names() {
        let readme = include_str!("../../../README.md");
        let start = readme
            .find("- **The environment a call sets.**")
            .expect("README says what a call's `env` may set");
        let rest = &readme[start + 2..];
        let paragraph = &rest[..rest.find("\n- ").unwrap_or(rest.len())];
        for name in built_in_names().chain(["SSHMODE_TOOL_ENV_ALLOW"]) {
            assert!(paragraph.contains(&format!("`{name}`")), "README: {name}");
        }
    }
}
