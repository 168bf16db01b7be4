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
