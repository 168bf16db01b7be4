//! The per-section event log (event sourcing): every conversation is an ordered, append-only
//! series of events in Postgres, exportable as JSONL. Control plane: always the local store.
//! Entries leave or change only through [`crate::lifecycle`]'s functions (retention, a recalled
//! message's redaction, an erasure).

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
///
/// One statement, one round trip, usually: it takes the lock, then inserts after the largest
/// `seq`. Its snapshot is taken before the lock, so when another append committed in between
/// the `seq` it computes is taken and the key refuses it; it is then written the slow way, which
/// cannot collide: a transaction that takes the lock first and inserts in a statement after it,
/// whose snapshot sees every earlier entry.
pub async fn append(pool: &PgPool, section: &str, kind: &str, payload: Value) -> sqlx::Result<i64> {
    let one = sqlx::query_scalar(APPEND)
        .bind(section)
        .bind(kind)
        .bind(&payload)
        .fetch_one(pool)
        .await;
    match one {
        Err(e) if seq_taken(&e) => {}
        r => return r,
    }
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
        .bind(section)
        .execute(&mut *tx)
        .await?;
    let seq: i64 = sqlx::query_scalar(APPEND)
        .bind(section)
        .bind(kind)
        .bind(payload)
        .fetch_one(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(seq)
}

/// The statement of [`append`]: the section's lock (re-entrant), then the entry after the
/// largest `seq` its snapshot sees.
const APPEND: &str = "WITH l AS (SELECT pg_advisory_xact_lock(hashtextextended($1, 0)))
     INSERT INTO session_events (section_id, seq, kind, payload)
     SELECT $1, (SELECT COALESCE(MAX(seq), 0) + 1 FROM session_events WHERE section_id = $1), $2, $3
       FROM l
     RETURNING seq";

/// The event log's `(section_id, seq)` key refused an entry: another append took its `seq`.
pub fn seq_taken(e: &sqlx::Error) -> bool {
    e.as_database_error().is_some_and(|d| {
        d.code().as_deref() == Some("23505")
            && d.constraint() == Some("session_events_section_id_seq_key")
    })
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
