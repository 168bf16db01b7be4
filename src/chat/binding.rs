//! Bindings: which backend a section's task tools run on, and who owns a thread. Owns the
//! `bindings`, `pending_bindings` and `section_owners` tables. A sticky binding is a user's; a
//! model-made one lives no longer than the grant that allowed it, so reading a binding first
//! releases a model-made one whose grant has closed or expired (with its audit row, in the same
//! transaction).
//!
//! A binding records the chat it was made in and the target generation it was made for. The
//! read a tool call makes ([`resolve_use`]) checks, in the same query that finds the binding,
//! that the target still exists in that generation and that it and every jump host on its way
//! still allow that chat; a binding that
//! no longer passes stays bound and fails every call with the reason ([`BindingFails`]) until a user
//! releases or rebinds it.
//!
//! Read from Postgres on every use: another replica or a restart sees a change at once. Never:
//! decides who may bind (that is [`crate::authz`]), or falls back to local when a bound
//! target fails or no longer passes its checks (invariant 2).

use chrono::{DateTime, Utc};
use serde_json::json;
use sqlx::{PgConnection, PgExecutor, PgPool, Row};

use super::grant;
use crate::agent::failing::{BindingFails, Why};
use crate::audit;
use crate::authz::{Binding, Kind};
use crate::exec::Place;
use crate::target::allow::allowed_sql;

/// The binding's place and, when it no longer passes, why: one query, on the pool or in the
/// caller's transaction.
async fn checked(
    db: impl PgExecutor<'_>,
    section: &str,
) -> sqlx::Result<Option<(String, String, Option<BindingFails>)>> {
    // The target's jump hosts outwards (bounded: a loop cannot run on), for their allow-lists.
    let row = sqlx::query(&format!(
        "WITH RECURSIVE chain (alias, next, depth) AS (
             SELECT t.alias, t.jump, 0 FROM bindings b JOIN targets t ON t.alias = b.alias
             WHERE b.section = $1
             UNION ALL
             SELECT t.alias, t.jump, c.depth + 1 FROM targets t JOIN chain c ON t.alias = c.next
             WHERE c.depth <= $2)
         SELECT b.alias, b.kind, b.bound_at, b.chat_id, b.generation AS bound_generation,
                t.generation, {} AS allowed,
                (SELECT chain.alias FROM chain WHERE chain.depth > 0 AND NOT {}
                 ORDER BY chain.depth LIMIT 1) AS jump_refused
         FROM bindings b LEFT JOIN targets t ON t.alias = b.alias
         WHERE b.section = $1",
        allowed_sql("b.alias", "b.chat_id"),
        allowed_sql("chain.alias", "b.chat_id"),
    ))
    .bind(section)
    .bind(crate::target::MAX_HOPS as i32)
    .fetch_optional(db)
    .await?;
    let Some(r) = row else {
        return Ok(None);
    };
    let alias: String = r.get("alias");
    let bound: Option<i64> = r.get("bound_generation");
    let current: Option<i64> = r.get("generation");
    let jump: Option<String> = r.get("jump_refused");
    let why = match (bound, current) {
        (_, None) => Some(Why::Removed),
        (None, _) => Some(Why::Unchecked),
        (Some(b), Some(c)) if b != c => Some(Why::Replaced),
        _ if r.get::<Option<String>, _>("chat_id").is_none() => Some(Why::Unchecked),
        _ if !r.get::<bool, _>("allowed") => Some(Why::NotAllowed),
        _ if jump.is_some() => Some(Why::JumpNotAllowed),
        _ => None,
    };
    let failing = why.map(|why| BindingFails {
        alias: alias.clone(),
        jump: jump.filter(|_| why == Why::JumpNotAllowed),
        why,
        bound_at: r.get("bound_at"),
    });
    Ok(Some((alias, r.get("kind"), failing)))
}

/// What a task-tool call runs on: the section's backend at `now`, or why its binding fails.
/// An expired model-made binding is released first and counts as local; the target's
/// existence, generation and allow-list are checked in the read that finds the binding.
pub async fn resolve_use(
    db: &PgPool,
    section: &str,
    now: DateTime<Utc>,
) -> anyhow::Result<Result<Place, BindingFails>> {
    // The common case, a section never bound, costs one read and no transaction.
    let Some((alias, kind, failing)) = checked(db, section).await? else {
        return Ok(Ok(Place::Local));
    };
    if kind == Kind::Sticky.as_str() {
        return Ok(match failing {
            Some(f) => Err(f),
            None => Ok(Place::Target(alias)),
        });
    }
    let mut tx = db.begin().await?;
    let b = current(&mut tx, section, now).await?;
    let out = match b {
        None => Ok(Place::Local),
        Some(_) => match checked(&mut *tx, section).await? {
            None => Ok(Place::Local),
            Some((_, _, Some(f))) => Err(f),
            Some((alias, _, None)) => Ok(Place::Target(alias)),
        },
    };
    tx.commit().await?;
    Ok(out)
}

/// The section's backend at `now` as its binding names it (a failing binding still names its
/// target): for showing. Tool calls use [`resolve_use`].
pub async fn resolve_place(
    db: &PgPool,
    section: &str,
    now: DateTime<Utc>,
) -> anyhow::Result<Place> {
    Ok(match resolve_use(db, section, now).await? {
        Ok(p) => p,
        Err(f) => Place::Target(f.alias),
    })
}

/// A task-tool call refused because the binding fails: audited (actor `model`). Returns
/// whether the section is still to be told about this binding.
pub async fn refused_call(
    db: &PgPool,
    section: &str,
    failing: &BindingFails,
    tool: &str,
) -> anyhow::Result<bool> {
    let mut tx = db.begin().await?;
    audit::record_chat(
        &mut tx,
        audit::ChatEntry {
            actor: "model",
            action: "binding.use",
            section: Some(section),
            target: Some(&failing.alias),
            outcome: "refused",
            detail: match &failing.jump {
                Some(jump) => json!({ "reason": failing.why.code(), "tool": tool, "jump": jump }),
                None => json!({ "reason": failing.why.code(), "tool": tool }),
            },
        },
    )
    .await?;
    let untold: Option<bool> = sqlx::query_scalar(
        "SELECT told_at IS NULL FROM bindings WHERE section = $1 AND bound_at = $2",
    )
    .bind(section)
    .bind(failing.bound_at)
    .fetch_optional(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(untold == Some(true))
}

/// Records that the section was told why its binding fails (it is told once per binding).
pub async fn told(
    db: &PgPool,
    section: &str,
    failing: &BindingFails,
    now: DateTime<Utc>,
) -> sqlx::Result<()> {
    sqlx::query(
        "UPDATE bindings SET told_at = $3
         WHERE section = $1 AND bound_at = $2 AND told_at IS NULL",
    )
    .bind(section)
    .bind(failing.bound_at)
    .bind(now)
    .execute(db)
    .await?;
    Ok(())
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
        chat_id: r.get("chat_id"),
        generation: r.get("generation"),
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
        "SELECT section, alias, kind, owner, bound_at, grant_id, chat_id, generation
         FROM bindings WHERE section = $1",
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

/// Sets the section's binding (replacing any; a new binding has not been told anything).
pub async fn set(conn: &mut PgConnection, b: &Binding) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO bindings (section, alias, kind, owner, bound_at, grant_id, chat_id, generation)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
         ON CONFLICT (section) DO UPDATE SET alias = EXCLUDED.alias, kind = EXCLUDED.kind,
             owner = EXCLUDED.owner, bound_at = EXCLUDED.bound_at, grant_id = EXCLUDED.grant_id,
             chat_id = EXCLUDED.chat_id, generation = EXCLUDED.generation, told_at = NULL",
    )
    .bind(&b.section)
    .bind(&b.alias)
    .bind(b.kind.as_str())
    .bind(&b.owner)
    .bind(b.bound_at)
    .bind(b.grant_id)
    .bind(&b.chat_id)
    .bind(b.generation)
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
    /// The target generation the `/ssh use` was checked against.
    pub generation: Option<i64>,
}

/// Records a pending binding keyed by the user's message id (the new thread's root).
pub async fn put_pending(db: &PgPool, p: &Pending, now: DateTime<Utc>) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO pending_bindings (root_message_id, chat_id, alias, owner, created_at, generation)
         VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT (root_message_id) DO UPDATE SET alias = EXCLUDED.alias, owner = EXCLUDED.owner,
             generation = EXCLUDED.generation",
    )
    .bind(&p.root_message_id)
    .bind(&p.chat_id)
    .bind(&p.alias)
    .bind(&p.owner)
    .bind(now)
    .bind(p.generation)
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
         RETURNING root_message_id, chat_id, alias, owner,
             COALESCE(generation, (SELECT t.generation FROM targets t
                                   WHERE t.alias = pending_bindings.alias)) AS generation",
    )
    .bind(root_message_id)
    .fetch_optional(conn)
    .await?;
    Ok(row.map(|r| Pending {
        root_message_id: r.get("root_message_id"),
        chat_id: r.get("chat_id"),
        alias: r.get("alias"),
        owner: r.get("owner"),
        generation: r.get("generation"),
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
    /// Given a schedule first, by a user (`/cron add`).
    Scheduled,
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
        Owned::Scheduled => "scheduled",
    })
    .bind(now)
    .execute(conn)
    .await?
    .rows_affected()
        == 1)
}
