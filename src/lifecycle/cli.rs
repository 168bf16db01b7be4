//! `sshmode erase --chat <chat_id> | --person <open_id>`: a chat's or a person's content
//! removed — messages' text, attachments, transcripts, event logs, notes, the chat's sections'
//! own local workspaces — keeping the audit facts, and what was removed printed. Audited
//! (`content.erase`) with the operator as the actor.
//!
//! Never: deletes an audit row; touches a file on a target (those it names, for their owner).

use std::io::Write;

use clap::Args;
use sqlx::PgPool;

use super::{Erased, Roots, Whom};
use crate::config::Config;

/// `sshmode erase …`
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub struct EraseArgs {
    /// The chat whose content goes: every section (the chat and its threads), its notes, its
    /// files and its sections' own local workspaces.
    #[arg(long, value_name = "CHAT_ID")]
    pub chat: Option<String>,
    /// The person (open_id) whose content goes: the text and files of what they sent in any
    /// chat, and their direct chats with the bot whole.
    #[arg(long, value_name = "OPEN_ID")]
    pub person: Option<String>,
}

impl EraseArgs {
    fn whom(self) -> anyhow::Result<Whom> {
        match (self.chat, self.person) {
            (Some(c), None) if !c.trim().is_empty() => Ok(Whom::Chat(c)),
            (None, Some(p)) if !p.trim().is_empty() => Ok(Whom::Person(p)),
            _ => anyhow::bail!("give one of --chat <chat_id> or --person <open_id>"),
        }
    }
}

/// Runs `sshmode erase`; returns the process exit code.
pub async fn run(args: EraseArgs, config: &Config) -> anyhow::Result<i32> {
    let store = crate::store::Store::open(config).await?;
    let stdout = std::io::stdout();
    let r = run_with(
        args,
        &store.pool,
        &config.operator,
        &Roots::of(config),
        &mut stdout.lock(),
    )
    .await;
    store.close().await;
    r
}

/// [`run`] on a given pool, roots and output, auditing as `actor`.
pub async fn run_with(
    args: EraseArgs,
    db: &PgPool,
    actor: &str,
    roots: &Roots,
    out: &mut dyn Write,
) -> anyhow::Result<i32> {
    let whom = args.whom()?;
    let erased = super::erase(db, &whom, actor, roots).await?;
    print(&whom, &erased, out)?;
    Ok(0)
}

fn print(whom: &Whom, e: &Erased, out: &mut dyn Write) -> std::io::Result<()> {
    match whom {
        Whom::Chat(c) => writeln!(out, "erased chat {c}")?,
        Whom::Person(p) => writeln!(out, "erased person {p}")?,
    }
    writeln!(out, "  event log entries: {}", e.events)?;
    writeln!(out, "  transcript messages: {}", e.transcript)?;
    writeln!(out, "  turn requests' text: {}", e.requests)?;
    writeln!(out, "  inbox events: {}", e.inbox)?;
    writeln!(out, "  images: {}", e.images)?;
    writeln!(out, "  notes: {}", e.notes)?;
    if !e.sections.is_empty() {
        writeln!(out, "  sections: {}", e.sections.join(", "))?;
    }
    for r in &e.removed {
        writeln!(out, "  removed {r}")?;
    }
    for f in &e.left {
        writeln!(
            out,
            "  left on target {}: {} (remove it there if it must go)",
            f.backend, f.path
        )?;
    }
    writeln!(out, "audit rows are kept (who ran what, where, when)")?;
    out.flush()
}
