//! Grants (`/ssh yolo on <alias>|all`): the model's right to enter a target by itself, in one
//! section, until it expires or is revoked. Owns the `grants` table. At most one open grant per
//! section and scope (a unique index); expired grants are closed, with their audit row, the
//! next time the section is touched. Never: decides who may grant (that is [`crate::authz`]).

use chrono::{DateTime, Utc};
use serde_json::json;
use sqlx::{PgConnection, Row};

use crate::audit;
use crate::authz::Grant;

/// The stored scope meaning "every target".
const ALL: &str = "*";

fn from_row(r: &sqlx::postgres::PgRow) -> Grant {
    let scope: String = r.get("scope");
    Grant {
        id: r.get("id"),
        section: r.get("section"),
        alias: (scope != ALL).then_some(scope),
        granted_by: r.get("granted_by"),
        granted_at: r.get("granted_at"),
        expires_at: r.get("expires_at"),
    }
}

/// The section's live grants (open and not expired at `now`).
pub async fn live(
    conn: &mut PgConnection,
    section: &str,
    now: DateTime<Utc>,
) -> sqlx::Result<Vec<Grant>> {
    let rows = sqlx::query(
        "SELECT id, section, scope, granted_by, granted_at, expires_at FROM grants
         WHERE section = $1 AND closed_at IS NULL AND expires_at > $2 ORDER BY scope",
    )
    .bind(section)
    .bind(now)
    .fetch_all(conn)
    .await?;
    Ok(rows.iter().map(from_row).collect())
}

/// Whether grant `id` is live at `now`.
pub async fn is_live(conn: &mut PgConnection, id: i64, now: DateTime<Utc>) -> sqlx::Result<bool> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM grants WHERE id = $1 AND closed_at IS NULL AND expires_at > $2)",
    )
    .bind(id)
    .bind(now)
    .fetch_one(conn)
    .await
}

/// Closes the section's grants that expired by `now`, each with a `grant.expire` audit row.
pub async fn close_expired(
    conn: &mut PgConnection,
    section: &str,
    now: DateTime<Utc>,
) -> sqlx::Result<()> {
    let closed: Vec<(i64, String)> = sqlx::query_as(
        "UPDATE grants SET closed_at = $2, closed_by = 'expiry'
         WHERE section = $1 AND closed_at IS NULL AND expires_at <= $2 RETURNING id, scope",
    )
    .bind(section)
    .bind(now)
    .fetch_all(&mut *conn)
    .await?;
    for (id, scope) in closed {
        audit::record_chat(
            conn,
            audit::ChatEntry {
                actor: "system",
                action: "grant.expire",
                section: Some(section),
                target: Some(&scope),
                outcome: "ok",
                detail: json!({ "grant": id }),
            },
        )
        .await?;
    }
    Ok(())
}

/// Opens a grant, or renews the open one of the same scope (there is never a second).
pub async fn open(
    conn: &mut PgConnection,
    section: &str,
    alias: Option<&str>,
    by: &str,
    now: DateTime<Utc>,
    ttl: chrono::Duration,
) -> sqlx::Result<Grant> {
    let row = sqlx::query(
        "INSERT INTO grants (section, scope, granted_by, granted_at, expires_at)
         VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (section, scope) WHERE closed_at IS NULL
         DO UPDATE SET granted_by = EXCLUDED.granted_by, granted_at = EXCLUDED.granted_at,
                       expires_at = EXCLUDED.expires_at
         RETURNING id, section, scope, granted_by, granted_at, expires_at",
    )
    .bind(section)
    .bind(alias.unwrap_or(ALL))
    .bind(by)
    .bind(now)
    .bind(now + ttl)
    .fetch_one(conn)
    .await?;
    Ok(from_row(&row))
}

/// Closes every open grant of the section; returns them.
pub async fn revoke_all(
    conn: &mut PgConnection,
    section: &str,
    by: &str,
    now: DateTime<Utc>,
) -> sqlx::Result<Vec<i64>> {
    sqlx::query_scalar(
        "UPDATE grants SET closed_at = $3, closed_by = $2
         WHERE section = $1 AND closed_at IS NULL RETURNING id",
    )
    .bind(section)
    .bind(by)
    .bind(now)
    .fetch_all(conn)
    .await
}

/// Closes every open grant `grantor` opened in these sections; returns them with their section.
pub async fn revoke_by(
    conn: &mut PgConnection,
    sections: &[String],
    grantor: &str,
    by: &str,
    now: DateTime<Utc>,
) -> sqlx::Result<Vec<(i64, String)>> {
    sqlx::query_as(
        "UPDATE grants SET closed_at = $4, closed_by = $3
         WHERE section = ANY($1) AND granted_by = $2 AND closed_at IS NULL
         RETURNING id, section",
    )
    .bind(sections)
    .bind(grantor)
    .bind(by)
    .bind(now)
    .fetch_all(conn)
    .await
}
