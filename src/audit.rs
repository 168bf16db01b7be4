//! The audit trail: append-only rows of who did what to which subject. Written in the same
//! transaction as the change it records; never updated or deleted (a trigger enforces it).

use serde_json::Value;
use sqlx::PgConnection;

/// One audit entry to write.
#[derive(Debug, Clone)]
pub struct Entry<'a> {
    /// `open_id`, `cli`, `model:<section>` or `system`.
    pub actor: &'a str,
    /// Dotted action name, e.g. `target.add`, `hostkey.mismatch`.
    pub action: &'a str,
    /// What was acted on: a target alias, a section id, …
    pub subject: &'a str,
    /// Structured detail; never a secret.
    pub detail: Value,
}

/// Appends `entry` using `conn` (pass the transaction of the change being recorded).
pub async fn record(conn: &mut PgConnection, entry: Entry<'_>) -> sqlx::Result<()> {
    sqlx::query("INSERT INTO audit_log (actor, action, subject, detail) VALUES ($1, $2, $3, $4)")
        .bind(entry.actor)
        .bind(entry.action)
        .bind(entry.subject)
        .bind(entry.detail)
        .execute(conn)
        .await?;
    Ok(())
}

/// One audit entry of a chat-side change or refusal: who, in which section, on which target,
/// what, and how it ended.
#[derive(Debug, Clone)]
pub struct ChatEntry<'a> {
    /// A user's open_id, `model`, `system` (expiry) or `operator` (the CLI).
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
    let subject = e.section.or(e.target).unwrap_or("-");
    sqlx::query(
        "INSERT INTO audit_log (actor, action, subject, detail, section, target, outcome)
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(e.actor)
    .bind(e.action)
    .bind(subject)
    .bind(e.detail)
    .bind(e.section)
    .bind(e.target)
    .bind(e.outcome)
    .execute(conn)
    .await?;
    Ok(())
}
