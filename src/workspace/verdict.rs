//! The verdict on one shell command at a workspace permission: the two policies over the
//! shell core, the permission judge first and the command guard second, the strictest
//! answer winning. A permission refusal is final — never softened to `ask` — so strictness
//! only grows from `full` to `read-write` to `read`.
//!
//! It is what `sshmode guard check` prints, and the same order the task tools apply before a
//! command runs (`agent::tools`). It never runs anything.

use super::judge::{self, Permission, Scope};
use crate::exec::guard::{Context, Guard};
use crate::shell::Verdict;

/// One command's verdict and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Judgement {
    pub verdict: Verdict,
    /// `permission` or `guard`; empty when allowed.
    pub by: &'static str,
    /// The guard's rule id (`recursive-delete`, `pipe-to-shell`, …) or `permission`.
    pub rule: String,
    /// Why, in a sentence; empty when allowed.
    pub reason: String,
}

/// The verdict on `command` at `permission`, starting in `scope.cwd`.
pub fn judge_command(
    guard: &Guard,
    permission: Permission,
    command: &str,
    scope: &Scope<'_>,
) -> Judgement {
    if let Err(d) = judge::check_command(permission, command, scope) {
        return Judgement {
            verdict: Verdict::Refuse,
            by: "permission",
            rule: "permission".into(),
            reason: d.to_string(),
        };
    }
    let context = Context {
        cwd: Some(scope.cwd),
        home: scope.home,
        env: &[],
    };
    match guard.assess(command, &context).refusal {
        None => Judgement {
            verdict: Verdict::Allow,
            by: "",
            rule: String::new(),
            reason: String::new(),
        },
        Some(r) => Judgement {
            verdict: r.verdict,
            by: "guard",
            rule: r.rule,
            reason: r.reason,
        },
    }
}
