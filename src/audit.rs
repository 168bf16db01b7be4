//! The audit trail: append-only rows of who did what to which subject. Written in the same
//! transaction as the change it records; never updated, and deleted only by the retention purge
//! (a trigger enforces both: see migration `20261206010000_audit_retention.sql`).
//!
//! **Executed commands are audit rows** (action [`COMMAND_RUN`]: target, section, the sender of
//! the turn's latest message as actor, the command, its exit and duration), and so is every
//! interactive shell opened, typed into or closed (`shell.open`, `shell.input` with the text
//! typed, or `[input hidden]` for input typed with echo off, `shell.close`). They are written by
//! the agent's step statement (`agent::conversation::append_logged`) in the same commit as the
//! call's result and its `agent.tool` event-log entry — no extra commit per step — rather than
//! read back from the event log: the event log is per section and kept forever, while the audit
//! trail is one table an operator filters across sections and that retention shortens
//! (`SSHMODE_AUDIT_RETENTION_DAYS`, purged by [`run_retention`] in `serve`).
//!
//! Reading: [`list`] and [`export_jsonl`] with a [`Filter`]; `sshmode audit …` is [`cli`].
//!
//! Never: updates or deletes a row outside [`purge`]; records a secret (command text is
//! redacted of secret-like words before it gets here).

pub mod cli;

use std::io::Write;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::TryStreamExt;
use serde::Serialize;
use serde_json::Value;
use sqlx::{PgConnection, PgPool, Row as _};
use tokio_util::sync::CancellationToken;

/// The action of an executed command's row.
pub const COMMAND_RUN: &str = "command.run";
/// The action of a file written by `write_file`.
pub const FILE_WRITE: &str = "file.write";
/// The action of a file changed by `patch`.
pub const FILE_PATCH: &str = "file.patch";

/// Every action an audit row may carry, by family: `--kind` takes one of them or a family.
pub const KINDS: &[&str] = &[
    "binding.expire",
    "binding.release",
    "binding.set",
    "binding.switch",
    "binding.use",
    COMMAND_RUN,
    "content.erase",
    "content.redact",
    FILE_PATCH,
    FILE_WRITE,
    "grant.add",
    "grant.expire",
    "grant.revoke",
    "hostkey.mismatch",
    "hostkey.pin",
    "hostkey.record",
    "hostkey.rekey",
    "hostkey.trust_mismatch",
    "mcp.token.create",
    "mcp.token.revoke",
    "memory.add",
    "memory.remove",
    "router.enable",
    "schedule.add",
    "schedule.cancel",
    "schedule.fire",
    "schedule.pause",
    "schedule.remove",
    "schedule.resume",
    "schedule.run",
    "schedule.tz",
    "shell.close",
    "shell.input",
    "shell.open",
    "skill.create",
    "skill.delete",
    "skill.promote",
    "skill.update",
    "target.add",
    "target.allow",
    "target.approve",
    "target.decide",
    "target.disable",
    "target.pending",
    "target.remove",
    "target.reseal",
    "target.set",
    "tool.approval",
    "tool.refused",
    "turn.stop",
    "vault.rotate",
    "workspace.set",
];

/// Whether `kind` names an action of [`KINDS`] or a family of them (`binding`, `mcp.token`).
pub fn is_kind(kind: &str) -> bool {
    KINDS
        .iter()
        .any(|k| *k == kind || k.strip_prefix(kind).is_some_and(|r| r.starts_with('.')))
}

/// The families of [`KINDS`] (`binding`, `command`, …), for an error that lists them.
pub fn families() -> Vec<&'static str> {
    let mut f: Vec<&str> = KINDS
        .iter()
        .map(|k| k.split('.').next().unwrap_or(k))
        .collect();
    f.dedup();
    f
}

/// One audit entry to write.
#[derive(Debug, Clone)]
pub struct Entry<'a> {
    /// `open_id`, `cli:<user>` (a one-shot command), `model:<section>`, `system`, an MCP
    /// token's name.
    pub actor: &'a str,
    /// Dotted action name, e.g. `target.add`, `hostkey.mismatch`.
    pub action: &'a str,
    /// What was acted on: a target alias, a section id, …
    pub subject: &'a str,
    /// Structured detail; never a secret.
    pub detail: Value,
}

/// Appends `entry` using `conn` (pass the transaction of the change being recorded). A row
/// about a target (`target.*`, `hostkey.*`) carries its alias as its target too, so
/// `audit list --target` finds it.
pub async fn record(conn: &mut PgConnection, entry: Entry<'_>) -> sqlx::Result<()> {
    let target = about_a_target(entry.action).then_some(entry.subject);
    sqlx::query(
        "INSERT INTO audit_log (actor, action, subject, detail, target) VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(entry.actor)
    .bind(entry.action)
    .bind(entry.subject)
    .bind(entry.detail)
    .bind(target)
    .execute(conn)
    .await
    .inspect_err(count_failure)?;
    Ok(())
}

/// Counts an audit row that could not be written (`sshmode_audit_write_failures_total`).
fn count_failure(_: &sqlx::Error) {
    crate::metrics::AUDIT_WRITE_FAILURES.inc();
}

/// Actions whose subject is a target's alias.
fn about_a_target(action: &str) -> bool {
    action.starts_with("target.") || action.starts_with("hostkey.")
}

/// One audit entry of a chat-side change or refusal: who, in which section, on which target,
/// what, and how it ended.
#[derive(Debug, Clone)]
pub struct ChatEntry<'a> {
    /// A user's open_id, `model`, `system` (expiry) or `cli:<user>` (a one-shot command).
    pub actor: &'a str,
    /// Dotted action name: `binding.set`, `binding.switch`, `binding.release`,
    /// `binding.expire`, `grant.add`, `grant.revoke`, `grant.expire`, `target.decide`, …
    pub action: &'a str,
    pub section: Option<&'a str>,
    pub target: Option<&'a str>,
    /// `ok`, `refused`, or a short word for the result (`approved`, `disabled`, …).
    pub outcome: &'a str,
    /// Structured detail (a refusal's reason); never a secret.
    pub detail: Value,
}

/// Appends a chat-side entry using `conn` (pass the transaction of the change being recorded).
pub async fn record_chat(conn: &mut PgConnection, e: ChatEntry<'_>) -> sqlx::Result<()> {
    record_chat_at(conn, e, None).await
}

/// [`record_chat`] of something that happened at `at` (`None`: the commit's time), for rows
/// written after what they record (a shell found closed).
pub async fn record_chat_at(
    conn: &mut PgConnection,
    e: ChatEntry<'_>,
    at: Option<DateTime<Utc>>,
) -> sqlx::Result<()> {
    let subject = e.section.or(e.target).unwrap_or("-");
    sqlx::query(
        "INSERT INTO audit_log (actor, action, subject, detail, section, target, outcome, at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, COALESCE($8::timestamptz, now()))",
    )
    .bind(e.actor)
    .bind(e.action)
    .bind(subject)
    .bind(e.detail)
    .bind(e.section)
    .bind(e.target)
    .bind(e.outcome)
    .bind(at)
    .execute(conn)
    .await
    .inspect_err(count_failure)?;
    Ok(())
}

/// An executed command's row, written by the agent's step statement in the commit of the
/// call's result (section: the turn's; action: [`COMMAND_RUN`], or for what an interactive
/// shell was given, `shell.open`, `shell.input` or `shell.close`).
#[derive(Debug, Clone)]
pub struct CommandRun {
    /// [`COMMAND_RUN`], `shell.open`, `shell.input` or `shell.close`.
    pub action: &'static str,
    /// The sender of the turn's latest message (an open_id, or the console's user).
    pub actor: String,
    /// The target alias; `None` for the service's own machine (subject `local`), or for a
    /// call interrupted by a runner's end, whose backend is not known any more (subject
    /// `unknown`).
    pub target: Option<String>,
    /// `ok` (exit 0), or how it ended: `exit 2`, `signal 9`, `timed out`, `cancelled`,
    /// `interrupted`.
    pub outcome: String,
    /// `tool`, `command` (redacted, clipped), `exit`, `duration_ms`, `turn`.
    pub detail: Value,
    /// When it happened, where that differs from when its row commits (a shell's input,
    /// which may end the shell before the row commits); `None`: the commit's time.
    pub at: Option<DateTime<Utc>>,
}

/// Appends an executed command's row outside a turn (the MCP endpoint's calls): subject and
/// target as the agent's rows have them (`local` for the service's own machine). Its commit
/// does not wait for the WAL flush (`synchronous_commit = off` for this statement only), as an
/// agent step's result without a mark does: only a crash of PostgreSQL itself within about half
/// a second of it may lose the row.
pub async fn record_command(
    conn: &mut PgConnection,
    section: &str,
    run: &CommandRun,
) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO audit_log (actor, action, subject, detail, section, target, outcome, at)
         SELECT $1, $2, COALESCE($3, 'local'), $4, $5, $3, $6, COALESCE($7::timestamptz, now())
         FROM (SELECT set_config('synchronous_commit', 'off', true)) AS later",
    )
    .bind(&run.actor)
    .bind(run.action)
    .bind(run.target.as_deref())
    .bind(&run.detail)
    .bind(section)
    .bind(&run.outcome)
    .bind(run.at)
    .execute(conn)
    .await
    .inspect_err(count_failure)?;
    Ok(())
}

/// Which rows to read. Every field narrows; `None` leaves it open.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Rows at or after this time.
    pub since: Option<DateTime<Utc>>,
    pub target: Option<String>,
    pub section: Option<String>,
    pub actor: Option<String>,
    /// An action (`command.run`) or a family of them (`binding` = `binding.*`).
    pub kind: Option<String>,
}

/// One audit row as it is listed and exported.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Row {
    pub id: i64,
    pub at: DateTime<Utc>,
    pub actor: String,
    /// The action (`command.run`, `binding.set`, `target.add`, …).
    pub kind: String,
    pub subject: String,
    pub section: Option<String>,
    pub target: Option<String>,
    pub outcome: Option<String>,
    pub detail: Value,
}

const COLUMNS: &str = "id, at, actor, action, subject, section, target, outcome, detail";
/// The filter: `$1` since, `$2` target (rows written before target rows carried their alias
/// match by subject), `$3` section, `$4` actor (`cli` also matches `cli:<user>`, `model`
/// `model:<section>`), `$5` kind.
const MATCHING: &str = "FROM audit_log
     WHERE ($1::timestamptz IS NULL OR at >= $1)
       AND ($2::text IS NULL OR target = $2
            OR (target IS NULL AND subject = $2
                AND (action LIKE 'target.%' OR action LIKE 'hostkey.%')))
       AND ($3::text IS NULL OR section = $3)
       AND ($4::text IS NULL OR actor = $4 OR left(actor, length($4) + 1) = $4 || ':')
       AND ($5::text IS NULL OR action = $5 OR action LIKE $5 || '.%')";

fn query<'q>(
    f: &Filter,
    sql: &'q str,
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    sqlx::query(sql)
        .bind(f.since)
        .bind(f.target.clone())
        .bind(f.section.clone())
        .bind(f.actor.clone())
        .bind(f.kind.clone())
}

fn row(r: sqlx::postgres::PgRow) -> sqlx::Result<Row> {
    Ok(Row {
        id: r.try_get("id")?,
        at: r.try_get("at")?,
        actor: r.try_get("actor")?,
        kind: r.try_get("action")?,
        subject: r.try_get("subject")?,
        section: r.try_get("section")?,
        target: r.try_get("target")?,
        outcome: r.try_get("outcome")?,
        detail: r.try_get("detail")?,
    })
}

/// The latest `limit` rows matching `filter`, oldest first.
pub async fn list(db: &PgPool, filter: &Filter, limit: i64) -> sqlx::Result<Vec<Row>> {
    let sql = format!(
        "SELECT * FROM (SELECT {COLUMNS} {MATCHING} ORDER BY at DESC, id DESC LIMIT $6) latest
          ORDER BY at, id"
    );
    let rows = query(filter, &sql).bind(limit).fetch_all(db).await?;
    rows.into_iter().map(row).collect()
}

/// Writes every row matching `filter` as JSONL, oldest first, streaming (memory stays
/// bounded). Returns the number of lines written.
pub async fn export_jsonl(
    db: &PgPool,
    filter: &Filter,
    out: &mut dyn Write,
) -> anyhow::Result<u64> {
    let sql = format!("SELECT {COLUMNS} {MATCHING} ORDER BY at, id");
    let mut rows = query(filter, &sql).fetch(db);
    let mut n = 0;
    while let Some(r) = rows.try_next().await? {
        serde_json::to_writer(&mut *out, &row(r)?)?;
        out.write_all(b"\n")?;
        n += 1;
    }
    out.flush()?;
    Ok(n)
}

/// Rows deleted by one purge statement: a large backlog is cleared over several, each short.
const PURGE_BATCH: i32 = 10_000;
/// Statements of one purge run; the rest waits for the next run.
const PURGE_BATCHES: usize = 100;

/// Deletes rows older than `keep_days` days (at least 1), in bounded batches, through the one
/// DELETE the audit trigger allows. Returns the number of rows deleted.
pub async fn purge(db: &PgPool, keep_days: u32) -> sqlx::Result<u64> {
    let mut total = 0u64;
    for _ in 0..PURGE_BATCHES {
        let n: i64 = sqlx::query_scalar("SELECT sshmode_audit_purge($1, $2)")
            .bind(i32::try_from(keep_days).unwrap_or(i32::MAX))
            .bind(PURGE_BATCH)
            .fetch_one(db)
            .await?;
        total += n.max(0) as u64;
        if n < i64::from(PURGE_BATCH) {
            break;
        }
    }
    Ok(total)
}

/// How often `serve` purges the audit trail (and once at start).
const RETENTION_EVERY: Duration = Duration::from_secs(3600);

/// The retention worker of `serve`: purges rows older than `keep_days` at start and then
/// hourly, until `shutdown`. A failed purge is logged here and retried at the next run.
pub async fn run_retention(db: PgPool, keep_days: u32, shutdown: CancellationToken) {
    loop {
        match purge(&db, keep_days).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                audit.purged = n,
                audit.retention_days = keep_days,
                "audit rows past retention deleted"
            ),
            Err(e) => {
                tracing::warn!(error = %e, "audit retention purge failed; retrying in an hour")
            }
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

    /// Every dotted action literal of a known family in the sources is one of [`KINDS`], so
    /// `--kind` never refuses a kind the service writes.
    #[test]
    fn every_action_the_sources_write_is_a_kind() {
        let families = families().join("|").replace('.', "\\.");
        let literal =
            regex::Regex::new(&format!(r#""((?:{families})\.[a-z_]+(?:\.[a-z_]+)?)""#)).unwrap();
        // Literals of those shapes that are no action.
        let not_actions = ["mcp.example.com"];
        let mut dirs = vec![std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src")];
        let mut seen = 0;
        while let Some(dir) = dirs.pop() {
            for e in std::fs::read_dir(&dir).unwrap() {
                let path = e.unwrap().path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.extension().is_some_and(|x| x == "rs")
                    && !path.ends_with("src/audit.rs")
                {
                    let text = std::fs::read_to_string(&path).unwrap();
                    for c in literal.captures_iter(&text) {
                        let a = &c[1];
                        if not_actions.contains(&a) {
                            continue;
                        }
                        seen += 1;
                        assert!(
                            KINDS.contains(&a),
                            "{}: `{a}` is not in audit::KINDS",
                            path.display()
                        );
                    }
                }
            }
        }
        assert!(seen > 30, "only {seen} action literals found");
    }

    #[test]
    fn kinds_are_actions_or_their_families() {
        for k in [
            "command.run",
            "binding",
            "hostkey",
            "mcp.token",
            "mcp",
            "file.write",
        ] {
            assert!(is_kind(k), "{k}");
        }
        for k in ["bind", "command.ru", "commands", "", ".", "binding.", "x.y"] {
            assert!(!is_kind(k), "{k}");
        }
    }
}
