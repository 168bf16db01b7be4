//! The command guard: refuses clearly destructive shell commands (recursive deletion of `/`,
//! the home directory or system directories, formatting or overwriting disks, overwriting
//! system files, fork bombs, shutting the machine down, signalling every process, recursive
//! permission changes of system trees) before a task tool hands them to a backend, with a
//! message a model can act on.
//!
//! **This is defence in depth, not the security boundary.** A determined caller can always
//! obfuscate past a static check (`base64 -d | sh`, a script file, `python -c`, …). What keeps
//! a host safe is the account a command runs as, the admin's approval of SSH targets and who
//! may bind them. The guard's job is to catch the honest mistake and the obvious trick, and
//! to keep its own promises: **every bound fails closed** — past a limit on size, nesting,
//! expanded text, brace words, wrappers or CPU time the command is refused, never judged in
//! part.
//!
//! The guard is one of the two policies over the shell-analysis core ([`crate::bash`]):
//! the core's walk lists what a command does — programs with their expanded arguments and
//! the places they run in, writes, nested scripts, what it cannot see through — and the
//! guard judges each effect. Its parts, one file each:
//! - `policy`: from effects to verdicts (bounds and fork bombs refused, what cannot be seen
//!   through asked, every program judged where it may run, operator patterns).
//! - `rules`: what is refused, on one normalised command or write target.
//! - `host`: the host's identity and boot files (refused whatever writes, moves, removes,
//!   links or re-permissions them) and its storage and system state (refused or asked).
//! - `code`: code given to a program as data (awk, sed, vim, ed, gdb, interpreters fed on
//!   their input), asked when it can run commands.
//! - `ask`: what a person should decide (risky or opaque, not catastrophic).
//!
//! Its answer is a [`Verdict`] ([`Guard::assess`]): `refuse`, `ask` or `allow`; a refusal
//! anywhere in a command outweighs every ask. [`Guard::check`], for callers that cannot ask a
//! person (the agent's approvals park the call instead: `agent::call_approval`), refuses an `ask`
//! too, with a message naming the reason.
//!
//! Operators can add their own regexes (`SSHMODE_GUARD_EXTRA_FILE`, one per line); each is
//! matched against the raw text and against every normalised simple command.
//!
//! The guard never executes anything, never touches the filesystem when checking, and never
//! rewrites a command: it only answers yes or no.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use regex::{Regex, RegexBuilder};

use crate::bash::Verdict;

mod ask;
#[cfg(test)]
mod cases;
mod code;
mod host;
mod policy;
mod rules;

pub(crate) use crate::bash::abbreviate;
pub use crate::bash::{MAX_DEPTH, MAX_INPUT, MAX_WRAPPERS};

/// CPU time one check may take; past it the command is refused. Ordinary commands take
/// microseconds.
pub const CPU_BUDGET: Duration = Duration::from_millis(250);
/// Compiled size limit of one operator regex, so a pathological pattern cannot eat memory.
const REGEX_SIZE_LIMIT: usize = 1 << 20;

/// Where and how a command will run, as far as the caller knows: the guard judges relative
/// paths, `~` and variables with it. Everything is optional; what is missing is unknown.
#[derive(Debug, Clone, Default)]
pub struct Context<'a> {
    /// The working directory the command starts in (absolute).
    pub cwd: Option<&'a str>,
    /// The home directory of the account it runs as (absolute).
    pub home: Option<&'a str>,
    /// Variables the call sets for the command.
    pub env: &'a [(String, String)],
    /// The workspace (absolute): a recursive delete outside it asks a person. `None`: not
    /// judged.
    pub workspace: Option<&'a str>,
}

/// Why a command may not run now: refused outright, or (`verdict` [`Verdict::Ask`]) risky
/// enough that a person should decide (the agent parks the call for an approval where it
/// can) — written for the model that asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Objection {
    /// Stable rule id (`recursive-delete`, `device-write`, `operator`, …) for metrics and logs.
    pub rule: String,
    /// [`Verdict::Refuse`] or [`Verdict::Ask`]; never [`Verdict::Allow`].
    pub verdict: Verdict,
    /// Why, in a sentence: what an approval card shows (for a refusal, the message itself).
    pub reason: String,
    /// What was refused and why, phrased so the caller can act on it.
    pub message: String,
}

impl Objection {
    pub(super) fn new(rule: &str, message: String) -> Objection {
        Objection {
            rule: rule.to_owned(),
            verdict: Verdict::Refuse,
            reason: message.clone(),
            message,
        }
    }

    /// A command a person should decide on. Where nobody can be asked (no approval card
    /// here, or a command too long to show) it is refused, with a message naming the reason.
    pub(super) fn ask(rule: &str, reason: String) -> Objection {
        Objection {
            rule: rule.to_owned(),
            verdict: Verdict::Ask,
            message: format!(
                "refused: this needs a person's approval, and nobody could be asked here: \
                 {reason}; do it another way or ask the user to run it"
            ),
            reason,
        }
    }
}

/// The guard's answer for one command: its verdict, and why when it is not `allow`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assessment {
    pub verdict: Verdict,
    /// Present unless the verdict is `allow`.
    pub refusal: Option<Objection>,
}

/// Problems building a guard from operator configuration.
#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    #[error("guard pattern {line} of {origin} is not a valid regular expression: {reason}")]
    BadPattern {
        origin: String,
        line: usize,
        reason: String,
    },
    #[error("could not read guard patterns from {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// One operator-configured pattern.
#[derive(Debug)]
struct OperatorRule {
    pub(super) regex: Regex,
}

/// The command guard. Cloning is cheap (the compiled operator rules are shared).
#[derive(Debug, Clone, Default)]
pub struct Guard {
    /// Operator-added patterns, compiled once at start-up; empty means built-ins only.
    extra: Arc<[OperatorRule]>,
}

impl Guard {
    /// A guard with the built-in rules plus `extra_patterns` (regex crate syntax), each
    /// matched against the raw command and every normalised simple command.
    pub fn new(extra_patterns: &[String]) -> Result<Guard, GuardError> {
        let lines = extra_patterns
            .iter()
            .enumerate()
            .map(|(i, p)| (i + 1, p.as_str()));
        Self::build(lines, "the configured patterns")
    }

    /// A guard with the built-in rules plus the patterns in `path`: one regex per line, blank
    /// lines and lines starting with `#` ignored, surrounding whitespace trimmed. `None` means
    /// built-ins only.
    pub fn from_file(path: Option<&Path>) -> Result<Guard, GuardError> {
        let Some(path) = path else {
            return Ok(Guard::default());
        };
        let text = std::fs::read_to_string(path).map_err(|source| GuardError::Read {
            path: path.to_owned(),
            source,
        })?;
        let lines = text
            .lines()
            .enumerate()
            .map(|(i, l)| (i + 1, l.trim()))
            .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'));
        Self::build(lines, &path.display().to_string())
    }

    fn build<'a>(
        lines: impl Iterator<Item = (usize, &'a str)>,
        origin: &str,
    ) -> Result<Guard, GuardError> {
        let mut rules = Vec::new();
        for (line, pattern) in lines {
            let bad = |reason: String| GuardError::BadPattern {
                origin: origin.to_owned(),
                line,
                reason,
            };
            if pattern.is_empty() {
                return Err(bad("an empty pattern would refuse every command".into()));
            }
            let regex = RegexBuilder::new(pattern)
                .size_limit(REGEX_SIZE_LIMIT)
                .build()
                .map_err(|e| bad(e.to_string()))?;
            rules.push(OperatorRule { regex });
        }
        Ok(Guard {
            extra: rules.into(),
        })
    }

    /// Checks one command line as a shell would run it, knowing nothing of where it runs.
    /// `Err` says what was refused and why.
    pub fn check(&self, command: &str) -> Result<(), Objection> {
        self.check_in(command, &Context::default())
    }

    /// Checks one command line as a shell would run it in `context`: starting in its
    /// working directory, with its home directory and variables.
    pub fn check_in(&self, command: &str, context: &Context<'_>) -> Result<(), Objection> {
        self.check_with(command, context, CPU_BUDGET)
    }

    /// The verdict on one command in `context`: `refuse` (catastrophic, or past a bound),
    /// `ask` (risky or opaque: a person should decide) or `allow`. A refusal anywhere in the
    /// command outweighs any number of asks.
    pub fn assess(&self, command: &str, context: &Context<'_>) -> Assessment {
        match self.assess_with(command, context, CPU_BUDGET) {
            Ok(None) => Assessment {
                verdict: Verdict::Allow,
                refusal: None,
            },
            Ok(Some(r)) | Err(r) => Assessment {
                verdict: r.verdict,
                refusal: Some(r),
            },
        }
    }

    fn check_with(
        &self,
        command: &str,
        context: &Context<'_>,
        cpu: Duration,
    ) -> Result<(), Objection> {
        match self.assess_with(command, context, cpu)? {
            Some(ask) => Err(ask),
            None => Ok(()),
        }
    }

    /// `Err`: refused; `Ok(Some)`: the first reason to ask; `Ok(None)`: allowed.
    fn assess_with(
        &self,
        command: &str,
        context: &Context<'_>,
        cpu: Duration,
    ) -> Result<Option<Objection>, Objection> {
        if command.len() > MAX_INPUT {
            return Err(Objection::new(
                "too-long",
                format!(
                    "refused: the command is {} bytes, over the guard's limit of {MAX_INPUT}; \
                     write long scripts to a file and run the file",
                    command.len()
                ),
            ));
        }
        policy::judge(self, command, context, cpu)
    }
}

#[cfg(test)]
pub(super) mod testing {
    use super::Guard;

    pub(crate) const DELETE: &str = "recursive-delete";

    #[track_caller]
    pub(crate) fn assert_refused(cmd: &str, rule: &str) {
        match Guard::default().check(cmd) {
            Ok(()) => panic!("allowed, expected `{rule}`: {cmd}"),
            Err(r) => assert_eq!(r.rule, rule, "wrong rule for {cmd}: {}", r.message),
        }
    }

    #[track_caller]
    pub(crate) fn assert_asked(cmd: &str, rule: &str) {
        let a = Guard::default().assess(cmd, &super::Context::default());
        let r = a
            .refusal
            .unwrap_or_else(|| panic!("allowed, expected to ask (`{rule}`): {cmd}"));
        assert_eq!(a.verdict, super::Verdict::Ask, "{cmd}: {}", r.message);
        assert_eq!(r.rule, rule, "wrong rule for {cmd}: {}", r.message);
        // Where nobody can be asked, `check` refuses it, naming the reason.
        let refused = Guard::default().check(cmd).unwrap_err();
        assert!(refused.message.contains(&r.reason), "{}", refused.message);
        assert!(refused.message.contains("approval"), "{}", refused.message);
    }

    #[track_caller]
    pub(crate) fn assert_allowed(cmd: &str) {
        if let Err(r) = Guard::default().check(cmd) {
            panic!("refused ({}): {cmd}: {}", r.rule, r.message);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{DELETE, assert_allowed};
    use super::*;

    #[test]
    fn messages_name_the_command_and_what_to_do() {
        let r = Guard::default().check("rm -rf /").unwrap_err();
        assert_eq!(r.rule, DELETE);
        assert!(
            r.message.starts_with("refused: `rm -rf /`"),
            "{}",
            r.message
        );
        assert!(r.message.contains("root filesystem"), "{}", r.message);
        assert!(
            r.message.contains("name the exact directory"),
            "{}",
            r.message
        );
        assert_eq!(r.to_string(), r.message);

        let r = Guard::default()
            .check("sudo /bin/rm -rf /usr/*")
            .unwrap_err();
        assert!(r.message.contains("`rm -rf /usr/*`"), "{}", r.message);
        assert!(r.message.contains("everything under /usr"), "{}", r.message);

        let r = Guard::default().check("echo x > /dev/sda").unwrap_err();
        assert!(r.message.contains("`echo x > /dev/sda`"), "{}", r.message);

        let r = Guard::default().check("$X -rf /").unwrap_err();
        assert!(r.message.contains("`${X}`"), "{}", r.message);
        assert!(r.message.contains("literally"), "{}", r.message);
    }

    #[test]
    fn oversized_input_is_refused_with_a_clear_message() {
        let long = format!("echo {}", "a".repeat(MAX_INPUT));
        let r = Guard::default().check(&long).unwrap_err();
        assert_eq!(r.rule, "too-long");
        assert!(r.message.contains(&MAX_INPUT.to_string()), "{}", r.message);
        let fits = format!("echo {}", "a".repeat(MAX_INPUT - 5));
        assert_allowed(&fits);
    }

    #[test]
    fn operator_patterns_apply_to_raw_text_and_normalised_commands() {
        let g = Guard::new(&[r"^docker\s+system\s+prune".into(), r"DROP\s+TABLE".into()]).unwrap();
        for cmd in [
            "docker system prune -af",
            "sudo docker system prune",
            "sh -c 'docker system prune'",
            "X=docker; $X system prune",
            "psql -c 'DROP TABLE users'",
        ] {
            let r = g.check(cmd).unwrap_err();
            assert_eq!(r.rule, "operator", "{cmd}");
            assert!(r.message.contains("operator"), "{}", r.message);
        }
        g.check("docker ps").unwrap();
        g.check("echo docker system prune").unwrap();
        // Built-ins still apply.
        assert_eq!(g.check("rm -rf /").unwrap_err().rule, DELETE);
    }

    #[test]
    fn operator_pattern_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("guard.txt");
        std::fs::write(&path, "# comment\n\n  ^terraform\\s+destroy  \n").unwrap();
        let g = Guard::from_file(Some(&path)).unwrap();
        assert_eq!(g.check("terraform destroy").unwrap_err().rule, "operator");
        g.check("terraform plan").unwrap();
        // A comment is not a command, and the pattern is anchored.
        g.check("# terraform destroy").unwrap();
    }

    #[test]
    fn bad_operator_patterns_name_their_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("guard.txt");
        std::fs::write(&path, "# ok\nfine\n\n(unclosed\n").unwrap();
        let err = Guard::from_file(Some(&path)).unwrap_err();
        match &err {
            GuardError::BadPattern { line, .. } => assert_eq!(*line, 4),
            other => panic!("{other:?}"),
        }
        assert!(err.to_string().contains("guard.txt"), "{err}");
        let err = Guard::new(&["ok".into(), "[".into()]).unwrap_err();
        assert!(
            matches!(err, GuardError::BadPattern { line: 2, .. }),
            "{err:?}"
        );
        assert!(Guard::new(&[String::new()]).is_err());
        let missing = Guard::from_file(Some(&dir.path().join("nope"))).unwrap_err();
        assert!(matches!(missing, GuardError::Read { .. }));
        assert!(Guard::from_file(None).unwrap().check("ls").is_ok());
    }

    /// Text fragments that stress the nesting paths, glued at random.
    const PIECES: &[&str] = &[
        "$(",
        ")",
        "`",
        "'",
        "\"",
        "${",
        "}",
        "<<E\n",
        "\nE\n",
        "sh -c ",
        "eval ",
        "<(",
        "for x in / a; do ",
        "; done",
        "f(){ ",
        " f|f& }",
        "cd / ; ",
        "rm -rf ",
        "X=rm; $X ",
        "${Y:-/}",
        "{a,b}",
        "((",
        "))",
        "$((",
        "$[",
        "]",
        "x<<2",
        "coproc ",
        "su -lc ",
        "IFS=, ",
        "X+=/",
        "/bin/r? ",
        "find / -delete ",
        "xargs -I{} ",
        "env -S '",
        "$'\\x72'",
        " | sh",
    ];

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(4096))]

        /// Arbitrary input never panics or hangs: every answer is a verdict.
        #[test]
        fn arbitrary_input_never_panics(
            chars in proptest::collection::vec(
                proptest::sample::select("rm -f/~$(){}[]<>|&;'\"\\`\n\t=*?#!:.0123456789aEOFé€😀-_%".chars().collect::<Vec<_>>()),
                0..48,
            )
        ) {
            let s: String = chars.into_iter().collect();
            let _ = Guard::default().assess(&s, &Context::default());
        }

        /// Structured fragments glued at random never panic either, and `check` refuses
        /// exactly what is not allowed.
        #[test]
        fn glued_fragments_never_panic(
            parts in proptest::collection::vec(proptest::sample::select(PIECES), 0..12)
        ) {
            let s = parts.concat();
            let g = Guard::default();
            let a = g.assess(&s, &Context::default());
            proptest::prop_assert_eq!(a.verdict == Verdict::Allow, g.check(&s).is_ok());
            proptest::prop_assert_eq!(a.refusal.is_none(), a.verdict == Verdict::Allow);
        }
    }
}
