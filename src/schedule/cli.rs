//! `sshmode schedule …`: the operator's view of every chat's schedules — `list` (all chats,
//! or one with `--chat`), `pause`, `resume` and `remove` by id, each audited with the
//! operator as the actor.
//!
//! Never: adds a schedule (a schedule belongs to a thread, and is added there).

use std::io::Write;

use chrono::{DateTime, Utc};
use clap::Subcommand;
use serde_json::json;
use sqlx::PgPool;

use super::{Listed, line};
use crate::config::Config;

/// `sshmode schedule …`
#[derive(Debug, Subcommand)]
pub enum ScheduleCmd {
    /// Every chat's schedules (or one chat's): id, schedule, zone, next run, last result,
    /// creator, prompt.
    #[command(
        after_help = "Examples:\n  sshmode schedule list\n  sshmode schedule list --chat oc_xxx\n  sshmode schedule list --json"
    )]
    List {
        /// Only this chat's.
        #[arg(long, value_name = "CHAT_ID")]
        chat: Option<String>,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Pause a schedule (its thread is not told; `/cron list` shows it paused).
    #[command(after_help = "Examples:\n  sshmode schedule pause 12")]
    Pause {
        /// The schedule's id, as `sshmode schedule list` shows it (`#3` is 3).
        id: i64,
    },
    /// Resume a paused schedule; what it missed while paused is not run.
    #[command(after_help = "Examples:\n  sshmode schedule resume 12")]
    Resume {
        /// The schedule's id, as `sshmode schedule list` shows it (`#3` is 3).
        id: i64,
    },
    /// Remove a schedule.
    #[command(after_help = "Examples:\n  sshmode schedule remove 12")]
    Remove {
        /// The schedule's id, as `sshmode schedule list` shows it (`#3` is 3).
        id: i64,
    },
}

/// Runs a schedule command; returns the process exit code.
pub async fn run(cmd: ScheduleCmd, config: &Config) -> anyhow::Result<i32> {
    let store = crate::store::Store::open(config).await?;
    let stdout = std::io::stdout();
    let r = run_with(
        cmd,
        &store.pool,
        &config.operator,
        Utc::now(),
        &mut stdout.lock(),
    )
    .await;
    store.close().await;
    r
}

/// [`run`] on a given pool, time and output, auditing as `actor`.
pub async fn run_with(
    cmd: ScheduleCmd,
    db: &PgPool,
    actor: &str,
    now: DateTime<Utc>,
    out: &mut dyn Write,
) -> anyhow::Result<i32> {
    let (id, action) = match cmd {
        ScheduleCmd::List { chat, json } => {
            let rows = super::list(db, chat.as_deref()).await?;
            if json {
                for l in &rows {
                    writeln!(out, "{}", as_json(l))?;
                }
            } else if rows.is_empty() {
                writeln!(out, "no schedules")?;
            } else {
                for l in &rows {
                    writeln!(
                        out,
                        "{} · chat {}",
                        crate::audit::cli::printable(&line(l, now)),
                        l.schedule.chat_id
                    )?;
                }
            }
            return Ok(0);
        }
        ScheduleCmd::Pause { id } => (id, "schedule.pause"),
        ScheduleCmd::Resume { id } => (id, "schedule.resume"),
        ScheduleCmd::Remove { id } => (id, "schedule.remove"),
    };
    let mut tx = db.begin().await?;
    let Some(s) = super::get(&mut tx, id, true).await?.filter(|s| !s.removed) else {
        eprintln!("sshmode: there is no schedule #{id}");
        return Ok(2);
    };
    let said = match action {
        "schedule.pause" if s.paused_at.is_some() => {
            writeln!(out, "schedule #{id} is already paused")?;
            return Ok(0);
        }
        "schedule.pause" => {
            super::pause(&mut tx, id, actor, None, now).await?;
            format!("paused schedule #{id}")
        }
        "schedule.resume" if s.paused_at.is_none() => {
            writeln!(out, "schedule #{id} is not paused")?;
            return Ok(0);
        }
        "schedule.resume" => {
            let Some(next) = super::next_due(&s, now) else {
                eprintln!("sshmode: schedule #{id} has no further due time");
                return Ok(2);
            };
            super::resume(&mut tx, id, next).await?;
            format!(
                "resumed schedule #{id}; next run {}",
                super::local(next, super::zone_or_utc(&s.tz))
            )
        }
        _ => {
            super::remove(&mut tx, id, now).await?;
            format!("removed schedule #{id}")
        }
    };
    crate::audit::record_chat(
        &mut tx,
        crate::audit::ChatEntry {
            actor,
            action,
            section: Some(&s.section_id),
            target: None,
            outcome: "ok",
            detail: json!({"schedule": id, "chat": s.chat_id}),
        },
    )
    .await?;
    tx.commit().await?;
    writeln!(out, "{said}")?;
    Ok(0)
}

fn as_json(l: &Listed) -> serde_json::Value {
    let s = &l.schedule;
    json!({
        "id": s.id, "chat": s.chat_id, "section": s.section_id, "schedule": s.spec,
        "tz": s.tz, "prompt": s.prompt, "creator": s.creator, "created_at": s.created_at,
        "next_due": (s.paused_at.is_none()).then_some(s.next_due),
        "paused_at": s.paused_at, "paused_reason": s.paused_reason,
        "last": l.last.as_ref().map(|(due, result)| json!({"due": due, "result": result})),
    })
}
