//! Bindings: which backend a section's task tools run on, and who owns a thread. Owns the
//! `bindings`, `pending_bindings` and `section_owners` tables. A sticky binding is a user's; a
//! model-made one lives no longer than the grant that allowed it, so reading a binding first releases a model-made one whose
//! grant has closed or expired (with its audit row, in the same transaction).
//!
//! Read from Postgres on every use: another replica or a restart sees a change at once. Never:
//! decides who may bind (that is [`super::authz`]), or falls back to local when a bound
//! target fails (invariant 2).

use chrono::{DateTime, Utc};
use serde_json::json;
use sqlx::{PgConnection, PgPool, Row};

use super::authz::{Binding, Kind};
use super::grant;
use crate::audit;
use crate::exec::Place;

/// The section's backend at `now`: its target, or local. An expired model-made binding is
/// released first and counts as local.
pub async fn resolve_place(
    db: &PgPool,
    section: &str,
    now: DateTime<Utc>,
) -> anyhow::Result<Place> {
    // The common case, a section never bound, costs one read and no transaction.
    let quick: Option<(String, String)> =
        sqlx::query_as("SELECT alias, kind FROM bindings WHERE section = $1")
            .bind(section)
            .fetch_optional(db)
            .await?;
    let Some((alias, kind)) = quick else {
        return Ok(Place::Local);
    };
    if kind == Kind::Sticky.as_str() {
        return Ok(Place::Target(alias));
    }
    let mut tx = db.begin().await?;
    let b = current(&mut tx, section, now).await?;
    tx.commit().await?;
    Ok(match b {
        Some(b) => Place::Target(b.alias),
        None => Place::Local,
    })
}

/// Serialises changes to one section across every replica, for the rest of the transaction.
pub async fn lock_section(conn: &mut PgConnection, section: &str) -> sqlx::Result<()> {
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 7))")
        .bind(section)
        .execute(conn)
        .await?;
    Ok(())
}

fn from_row(r: &sqlx::postgres::PgRow) -> Binding {
    Binding {
        section: r.get("section"),
        alias: r.get("alias"),
        kind: if r.get::<&str, _>("kind") == "model" {
            Kind::Model
        } else {
            Kind::Sticky
        },
        owner: r.get("owner"),
        bound_at: r.get("bound_at"),
        grant_id: r.get("grant_id"),
    }
}

/// The section's binding at `now`, inside the caller's transaction: closes expired grants and
/// releases a model-made binding whose grant is gone (both audited).
pub async fn current(
    conn: &mut PgConnection,
    section: &str,
    now: DateTime<Utc>,
) -> sqlx::Result<Option<Binding>> {
    lock_section(conn, section).await?;
    grant::close_expired(conn, section, now).await?;
    let row = sqlx::query(
        "SELECT section, alias, kind, owner, bound_at, grant_id FROM bindings WHERE section = $1",
    )
    .bind(section)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(b) = row.as_ref().map(from_row) else {
        return Ok(None);
    };
    if let (Kind::Model, Some(g)) = (b.kind, b.grant_id)
        && !grant::is_live(conn, g, now).await?
    {
        clear(conn, section).await?;
        audit::record_chat(
            conn,
            audit::ChatEntry {
                actor: "system",
                action: "binding.expire",
                section: Some(section),
                target: Some(&b.alias),
                outcome: "ok",
                detail: json!({ "grant": g }),
            },
        )
        .await?;
        return Ok(None);
    }
    Ok(Some(b))
}

/// Sets the section's binding (replacing any).
pub async fn set(conn: &mut PgConnection, b: &Binding) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO bindings (section, alias, kind, owner, bound_at, grant_id)
         VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT (section) DO UPDATE SET alias = EXCLUDED.alias, kind = EXCLUDED.kind,
             owner = EXCLUDED.owner, bound_at = EXCLUDED.bound_at, grant_id = EXCLUDED.grant_id",
    )
    .bind(&b.section)
    .bind(&b.alias)
    .bind(b.kind.as_str())
    .bind(&b.owner)
    .bind(b.bound_at)
    .bind(b.grant_id)
    .execute(conn)
    .await?;
    Ok(())
}

/// Removes the section's binding.
pub async fn clear(conn: &mut PgConnection, section: &str) -> sqlx::Result<()> {
    sqlx::query("DELETE FROM bindings WHERE section = $1")
        .bind(section)
        .execute(conn)
        .await?;
    Ok(())
}

/// A `/ssh use` in a parent chat between the reply request and its answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    pub root_message_id: String,
    pub chat_id: String,
    pub alias: String,
    pub owner: String,
}

/// Records a pending binding keyed by the user's message id (the new thread's root).
pub async fn put_pending(db: &PgPool, p: &Pending, now: DateTime<Utc>) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO pending_bindings (root_message_id, chat_id, alias, owner, created_at)
         VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (root_message_id) DO UPDATE SET alias = EXCLUDED.alias, owner = EXCLUDED.owner",
    )
    .bind(&p.root_message_id)
    .bind(&p.chat_id)
    .bind(&p.alias)
    .bind(&p.owner)
    .bind(now)
    .execute(db)
    .await?;
    Ok(())
}

/// Takes (removes and returns) the pending binding of a root message.
pub async fn take_pending(
    conn: &mut PgConnection,
    root_message_id: &str,
) -> sqlx::Result<Option<Pending>> {
    let row = sqlx::query(
        "DELETE FROM pending_bindings WHERE root_message_id = $1
         RETURNING root_message_id, chat_id, alias, owner",
    )
    .bind(root_message_id)
    .fetch_optional(conn)
    .await?;
    Ok(row.map(|r| Pending {
        root_message_id: r.get("root_message_id"),
        chat_id: r.get("chat_id"),
        alias: r.get("alias"),
        owner: r.get("owner"),
    }))
}

/// Drops a pending binding that will never complete (the thread was refused).
pub async fn drop_pending(db: &PgPool, root_message_id: &str) -> sqlx::Result<()> {
    sqlx::query("DELETE FROM pending_bindings WHERE root_message_id = $1")
        .bind(root_message_id)
        .execute(db)
        .await?;
    Ok(())
}

/// The owner of thread `section`: who opened it with `/ssh use`, else who bound it first.
pub async fn owner(conn: &mut PgConnection, section: &str) -> sqlx::Result<Option<String>> {
    sqlx::query_scalar("SELECT owner FROM section_owners WHERE section = $1")
        .bind(section)
        .fetch_optional(conn)
        .await
}

/// How a thread got its owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owned {
    /// Opened with `/ssh use` in its parent chat.
    Opened,
    /// Bound first, by a user.
    Bound,
}

/// Records `owner` as the owner of thread `section`, unless it has one. Returns whether it
/// was recorded.
pub async fn claim_owner(
    conn: &mut PgConnection,
    section: &str,
    owner: &str,
    how: Owned,
    now: DateTime<Utc>,
) -> sqlx::Result<bool> {
    Ok(sqlx::query(
        "INSERT INTO section_owners (section, owner, how, since) VALUES ($1, $2, $3, $4)
         ON CONFLICT (section) DO NOTHING",
    )
    .bind(section)
    .bind(owner)
    .bind(match how {
        Owned::Opened => "opened",
        Owned::Bound => "bound",
    })
    .bind(now)
    .execute(conn)
    .await?
    .rows_affected()
        == 1)
}
