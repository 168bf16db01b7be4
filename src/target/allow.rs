//! Which chats may use a target: an optional allow-list per target. A target without one is
//! usable in every chat. A target behind jump hosts is usable in a chat only where each of them
//! is too: [`Facts`] carry every hop's status and allow-list, and [`visible_in`] shows a chat no
//! target behind a jump host it may not use. Changes are audited in the same transaction.
//! Never: decides who may bind (that is `authz`); it only answers facts.

use serde_json::json;
use sqlx::{PgConnection, PgPool, Row};

use super::{COLUMNS, MAX_HOPS, Status, Target, TargetError, from_row};
use crate::audit;

/// Replaces the allow-list of `alias`: `Some(chats)` limits it to those chats, `None` opens it
/// to every chat. Audited as `target.allow`. A section already bound to `alias` in a chat
/// left off the list stays bound, and fails from its next tool call (`chat::binding`).
pub async fn set_allowed(
    db: &PgPool,
    alias: &str,
    chats: Option<&[String]>,
    actor: &str,
) -> Result<(), TargetError> {
    let mut tx = db.begin().await?;
    let exists: Option<String> =
        sqlx::query_scalar("SELECT alias FROM targets WHERE alias = $1 FOR UPDATE")
            .bind(alias)
            .fetch_optional(&mut *tx)
            .await?;
    if exists.is_none() {
        return Err(TargetError::NotFound(alias.to_string()));
    }
    if let Some(bad) = chats
        .unwrap_or(&[])
        .iter()
        .find(|c| c.is_empty() || c.len() > 128 || c.chars().any(|ch| ch.is_whitespace()))
    {
        return Err(TargetError::Invalid(format!("`{bad}` is not a chat id")));
    }
    sqlx::query("DELETE FROM target_chats WHERE alias = $1")
        .bind(alias)
        .execute(&mut *tx)
        .await?;
    if let Some(chats) = chats {
        sqlx::query(
            "INSERT INTO target_chats (alias, chat_id) SELECT $1, c FROM UNNEST($2::text[]) c
             ON CONFLICT DO NOTHING",
        )
        .bind(alias)
        .bind(chats)
        .execute(&mut *tx)
        .await?;
    }
    audit::record_chat(
        &mut tx,
        audit::ChatEntry {
            actor,
            action: "target.allow",
            section: None,
            target: Some(alias),
            outcome: "ok",
            detail: json!({ "chats": chats }),
        },
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

/// The allow-list of `alias`; empty means every chat.
pub async fn allowed_chats(db: &PgPool, alias: &str) -> Result<Vec<String>, TargetError> {
    Ok(
        sqlx::query_scalar("SELECT chat_id FROM target_chats WHERE alias = $1 ORDER BY chat_id")
            .bind(alias)
            .fetch_all(db)
            .await?,
    )
}

/// What authorisation needs to know of a target in one chat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Facts {
    pub alias: String,
    pub status: Status,
    /// The chat is on the allow-list, or there is none.
    pub allowed_here: bool,
    /// `user@host` (and ` via <jump>` behind a jump host), for answers.
    pub destination: String,
    /// The alias's current generation: a binding records it, and fails once it changes.
    pub generation: i64,
    /// The jump hosts it is reached through, nearest first (at most [`MAX_HOPS`]` + 1`: one
    /// more shows a chain the pool refuses).
    pub jumps: Vec<Hop>,
}

/// A jump host on the way to a target, as authorisation needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hop {
    pub alias: String,
    pub status: Status,
    /// The chat is on its allow-list, or it has none.
    pub allowed_here: bool,
}

/// Whether the chat `chat` (an SQL expression) may use the target whose alias is the SQL
/// expression `alias`: its allow-list has the chat, or it has none.
pub(crate) fn allowed_sql(alias: &str, chat: &str) -> String {
    format!(
        "(NOT EXISTS (SELECT 1 FROM target_chats c WHERE c.alias = {alias}) \
          OR EXISTS (SELECT 1 FROM target_chats c WHERE c.alias = {alias} AND c.chat_id = {chat}))"
    )
}

/// The jump hosts of `$1` outwards, as `chain (alias, next, depth)` (depth 0 is the target
/// itself; at most [`MAX_HOPS`]` + 2` rows, so a loop cannot run on).
const JUMP_CHAIN: &str = "chain (alias, next, depth) AS ( \
        SELECT alias, jump, 0 FROM targets WHERE alias = $1 \
        UNION ALL \
        SELECT t.alias, t.jump, c.depth + 1 FROM targets t JOIN chain c ON t.alias = c.next \
        WHERE c.depth <= $3)";

/// Facts of `alias` for `chat_id`, or `None` when no such target exists.
pub async fn facts(
    conn: &mut PgConnection,
    alias: &str,
    chat_id: &str,
) -> Result<Option<Facts>, TargetError> {
    let row = sqlx::query(&format!(
        "SELECT t.status, t.username, t.host, t.generation, t.jump, {} AS allowed
         FROM targets t WHERE t.alias = $1",
        allowed_sql("t.alias", "$2")
    ))
    .bind(alias)
    .bind(chat_id)
    .fetch_optional(&mut *conn)
    .await?;
    let jumps = match row {
        Some(_) => sqlx::query(&format!(
            "WITH RECURSIVE {JUMP_CHAIN}
             SELECT chain.alias, t.status, {} AS allowed
             FROM chain JOIN targets t USING (alias) WHERE chain.depth > 0 ORDER BY chain.depth",
            allowed_sql("chain.alias", "$2")
        ))
        .bind(alias)
        .bind(chat_id)
        .bind(MAX_HOPS as i32)
        .fetch_all(&mut *conn)
        .await?
        .iter()
        .map(|r| Hop {
            alias: r.get("alias"),
            status: Status::parse(r.get("status")),
            allowed_here: r.get("allowed"),
        })
        .collect(),
        None => Vec::new(),
    };
    Ok(row.map(|r| Facts {
        alias: alias.to_string(),
        status: Status::parse(r.get("status")),
        allowed_here: r.get("allowed"),
        destination: format!(
            "{}@{}{}",
            r.get::<String, _>("username"),
            r.get::<String, _>("host"),
            r.get::<Option<String>, _>("jump")
                .map(|j| format!(" via {j}"))
                .unwrap_or_default()
        ),
        generation: r.get("generation"),
        jumps,
    }))
}

/// Targets `chat_id` may see (the allow-lists of the target and of every jump host on its way
/// permit it), any status, by alias.
pub async fn visible_in(db: &PgPool, chat_id: &str) -> Result<Vec<Target>, TargetError> {
    let rows = sqlx::query(&format!(
        "WITH RECURSIVE chain (root, alias, next, depth) AS (
             SELECT alias, alias, jump, 0 FROM targets
             UNION ALL
             SELECT c.root, t.alias, t.jump, c.depth + 1 FROM targets t
             JOIN chain c ON t.alias = c.next WHERE c.depth <= $2)
         SELECT {COLUMNS} FROM targets
         WHERE NOT EXISTS (SELECT 1 FROM chain WHERE chain.root = targets.alias
                           AND NOT {})
         ORDER BY alias",
        allowed_sql("chain.alias", "$1")
    ))
    .bind(chat_id)
    .bind(MAX_HOPS as i32)
    .fetch_all(db)
    .await?;
    Ok(rows.iter().map(from_row).collect())
}
