//! `sshmode skill …`: the operator's view of skills. `list` shows every stored skill with its
//! scope, `show <name>` one in full (to read before promoting it), `promote <name>` makes one
//! visible in every chat (audited as `skill.promote`, actor `cli:<user>`).
//!
//! Never: changes a skill's text (that is the model's, in its own chat); prints a control
//! character from a skill (the model wrote it: it must not drive the operator's terminal).

use std::io::Write;

use clap::Subcommand;
use sqlx::PgPool;

use super::skills::{self, Viewer, Visibility};
use crate::config::Config;

/// `sshmode skill …`
#[derive(Debug, Subcommand)]
pub enum SkillCmd {
    /// List every stored skill with its scope: the chat that wrote it, all chats, or hidden.
    #[command(after_help = "Examples:\n  sshmode skill list\n  sshmode skill list --json")]
    List {
        /// A JSON array (name, scope, built-in, description) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show one skill in full, whatever its scope.
    #[command(
        after_help = "Examples:\n  sshmode skill show deploy-checklist\n  sshmode skill show deploy-checklist --json"
    )]
    Show {
        /// The skill's name, as `sshmode skill list` prints it.
        name: String,
        /// The whole skill as one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Make a chat's skill visible to every chat, read-only to the model (audited). Read it
    /// with `show` first: its text becomes guidance for the agent in every chat.
    #[command(
        after_help = "Examples:\n  sshmode skill show deploy-checklist      # read it first\n  sshmode skill promote deploy-checklist"
    )]
    Promote {
        /// The skill's name, as `sshmode skill list` prints it.
        name: String,
    },
}

impl SkillCmd {
    /// Whether the command asked for JSON (`list --json`, `show --json`).
    pub fn json(&self) -> bool {
        matches!(
            self,
            SkillCmd::List { json: true } | SkillCmd::Show { json: true, .. }
        )
    }
}

/// Runs a skill command; returns the process exit code.
pub async fn run(cmd: SkillCmd, config: &Config) -> anyhow::Result<i32> {
    let store = crate::store::Store::open(config).await?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let result = run_with(cmd, &store.pool, &config.operator, &mut out).await;
    store.close().await;
    result
}

/// `skill list --json` (name, scope, built-in, description of each) and `skill show <name>
/// --json` (the whole skill).
pub async fn run_json(cmd: SkillCmd, config: &Config) -> anyhow::Result<i32> {
    let store = crate::store::Store::open(config).await?;
    let stdout = std::io::stdout();
    let result = json_with(cmd, &store.pool, &mut stdout.lock()).await;
    store.close().await;
    result
}

/// [`run_json`] on a given database and output.
pub async fn json_with(cmd: SkillCmd, db: &PgPool, out: &mut dyn Write) -> anyhow::Result<i32> {
    let value = match cmd {
        SkillCmd::List { .. } => skills::list(db, Viewer::Operator)
            .await?
            .into_iter()
            .map(|k| {
                serde_json::json!({
                    "name": k.name,
                    "scope": k.scope.describe(),
                    "builtin": k.builtin,
                    "description": k.description,
                })
            })
            .collect(),
        SkillCmd::Show { name, .. } => {
            let Some(k) = skills::view(db, Viewer::Operator, &name).await? else {
                anyhow::bail!("{}", skills::SkillError::NotFound(clip(&name)));
            };
            serde_json::json!({
                "name": k.name,
                "scope": k.scope.describe(),
                "promoted_by": k.promoted_by,
                "updated_by": k.updated_by,
                "updated_at": k.updated_at,
                "description": k.description,
                "body": k.body,
            })
        }
        SkillCmd::Promote { .. } => anyhow::bail!("--json goes with `skill list` and `skill show`"),
    };
    serde_json::to_writer_pretty(&mut *out, &value)?;
    writeln!(out)?;
    Ok(0)
}

/// [`run`] on a given database and output, auditing as `actor` (tests call this directly).
pub async fn run_with(
    cmd: SkillCmd,
    db: &PgPool,
    actor: &str,
    out: &mut dyn Write,
) -> anyhow::Result<i32> {
    match cmd {
        SkillCmd::List { .. } => {
            let all = skills::list(db, Viewer::Operator).await?;
            for k in all {
                writeln!(
                    out,
                    "{}\t{}\t{}",
                    k.name,
                    if k.builtin {
                        "built-in".to_string()
                    } else {
                        k.scope.describe()
                    },
                    terminal_safe(&k.description)
                )?;
            }
            Ok(0)
        }
        SkillCmd::Show { name, .. } => {
            let Some(k) = skills::view(db, Viewer::Operator, &name).await? else {
                anyhow::bail!("{}", skills::SkillError::NotFound(clip(&name)));
            };
            writeln!(out, "name:        {}", k.name)?;
            writeln!(out, "scope:       {}", k.scope.describe())?;
            if let Some(by) = &k.promoted_by {
                writeln!(out, "promoted by: {by}")?;
            }
            writeln!(out, "updated by:  {}", k.updated_by)?;
            if let Some(at) = k.updated_at {
                writeln!(out, "updated at:  {}", at.to_rfc3339())?;
            }
            writeln!(out, "description: {}", terminal_safe(&k.description))?;
            writeln!(out, "\n{}", terminal_safe(&k.body))?;
            Ok(0)
        }
        SkillCmd::Promote { name } => match skills::promote(db, &name, actor).await? {
            Ok(p) => {
                match p.before {
                    Visibility::Shared => {
                        writeln!(out, "skill `{name}` is already visible to every chat")?
                    }
                    before => writeln!(
                        out,
                        "skill `{name}`: {} -> all chats (read-only to the model)",
                        before.describe()
                    )?,
                }
                Ok(0)
            }
            Err(e) => anyhow::bail!("{e}"),
        },
    }
}

/// A name as an error may echo it.
fn clip(name: &str) -> String {
    name.chars().take(skills::NAME_MAX).collect()
}

/// `s` without control characters other than newline and tab (each shown as `\u{…}`).
fn terminal_safe(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_control() && c != '\n' && c != '\t' {
            out.push_str(&c.escape_unicode().to_string());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_never_reach_the_terminal() {
        assert_eq!(
            terminal_safe("a\u{1b}]0;x\u{7}\tb\nc\u{9b}"),
            "a\\u{1b}]0;x\\u{7}\tb\nc\\u{9b}"
        );
    }
}
