//! The per-section event log (event sourcing): every conversation is an ordered, append-only
//! series of events in Postgres, exportable as JSONL. Control plane: always the local store.

use std::io::Write;

use chrono::{DateTime, Utc};
use futures_util::TryStreamExt;
use serde::Serialize;
use serde_json::Value;
use sqlx::{PgPool, Row};

/// One exported event line.
#[derive(Debug, Serialize)]
pub struct ExportedEvent {
    pub section: String,
    pub seq: i64,
    pub at: DateTime<Utc>,
    pub kind: String,
    pub payload: Value,
}

/// Appends an event to `section`'s log and returns its sequence number. Concurrent appends to
/// one section are serialised by a transaction-scoped advisory lock on the section.
pub async fn append(pool: &PgPool, section: &str, kind: &str, payload: Value) -> sqlx::Result<i64> {
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
        .bind(section)
        .execute(&mut *tx)
        .await?;
    let seq: i64 = sqlx::query_scalar(
        "INSERT INTO session_events (section_id, seq, kind, payload)
         SELECT $1, COALESCE(MAX(seq), 0) + 1, $2, $3 FROM session_events WHERE section_id = $1
         RETURNING seq",
    )
    .bind(section)
    .bind(kind)
    .bind(payload)
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(seq)
}

/// Writes `section`'s log as JSONL, oldest first, streaming (memory stays bounded). Returns the
/// number of lines written.
pub async fn export_jsonl(
    pool: &PgPool,
    section: &str,
    out: &mut dyn Write,
) -> anyhow::Result<u64> {
    let mut rows = sqlx::query(
        "SELECT section_id, seq, at, kind, payload FROM session_events WHERE section_id = $1 ORDER BY seq",
    )
    .bind(section)
    .fetch(pool);
    let mut n = 0;
    while let Some(row) = rows.try_next().await? {
        let ev = ExportedEvent {
            section: row.try_get("section_id")?,
            seq: row.try_get("seq")?,
            at: row.try_get("at")?,
            kind: row.try_get("kind")?,
            payload: row.try_get("payload")?,
        };
        serde_json::to_writer(&mut *out, &ev)?;
        out.write_all(b"\n")?;
        n += 1;
    }
    out.flush()?;
    Ok(n)
}
