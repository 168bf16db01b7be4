//! A binding that no longer passes its checks, as the agent sees it: every task-tool call of
//! the section fails with [`BindingFails::message`]. Chat control decides when a binding fails
//! (`chat::binding`); this is only the type both sides speak.

use chrono::{DateTime, Utc};

/// Why a bound section may no longer use its target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// The alias no longer exists.
    Removed,
    /// The alias was removed and added again: another target, perhaps another host.
    Replaced,
    /// The target's allow-list no longer has the chat.
    NotAllowed,
    /// The allow-list of a jump host on the way to the target no longer has the chat.
    JumpNotAllowed,
    /// A binding from before chats and generations were recorded, which cannot be checked.
    Unchecked,
}

impl Why {
    /// A short word for the audit log.
    pub fn code(self) -> &'static str {
        match self {
            Why::Removed => "removed",
            Why::Replaced => "replaced",
            Why::NotAllowed => "not_allowed_here",
            Why::JumpNotAllowed => "jump_not_allowed_here",
            Why::Unchecked => "unchecked",
        }
    }
}

/// A binding that no longer passes its checks: it stays, and every task-tool call fails.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindingFails {
    pub alias: String,
    /// The jump host the reason is about ([`Why::JumpNotAllowed`]).
    pub jump: Option<String>,
    pub why: Why,
    /// When the binding was made: names this binding (a new one is checked afresh).
    pub bound_at: DateTime<Utc>,
}

impl BindingFails {
    /// What the model and the thread are told: why, and what a user can do.
    pub fn message(&self) -> String {
        let a = &self.alias;
        let what = match self.why {
            Why::Removed => format!("This thread is bound to `{a}`, which has been removed"),
            Why::Replaced => format!(
                "This thread is bound to `{a}`, which has been removed and added again since (it may be another host now)"
            ),
            Why::NotAllowed => {
                format!("This thread is bound to `{a}`, which is no longer allowed in this chat")
            }
            Why::JumpNotAllowed => format!(
                "This thread is bound to `{a}`, which is reached through the jump host `{}`, and that is no longer allowed in this chat",
                self.jump.as_deref().unwrap_or("?")
            ),
            Why::Unchecked => format!(
                "This thread was bound to `{a}` before bindings recorded their chat and target, so the binding cannot be checked"
            ),
        };
        format!(
            "{what}. Nothing runs, there or locally, until a user sends `/ssh local` (or `/ssh use <alias>` to bind a target that is available here)."
        )
    }
}

impl std::fmt::Display for BindingFails {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message())
    }
}

impl std::error::Error for BindingFails {}
