//! Entry state in Postgres: which provider/model entries are cooling, until when and why, and
//! which are disabled. Postgres rather than memory so that a restart or another replica sees
//! the same cooldowns. Times come from the caller (the app's [`crate::clock::Clock`]), never
//! from the database's `now()`, so tests can move time.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::{PgPool, Row};

use super::classify::FailureClass;

/// Transient failures in a row after which an entry cools briefly.
pub const TRANSIENT_STREAK: i32 = 3;

/// How long an entry cools after [`TRANSIENT_STREAK`] transient failures in a row.
pub const TRANSIENT_COOLDOWN: Duration = Duration::from_secs(60);

/// The stored condition of one entry.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EntryState {
    pub disabled: bool,
    /// When the entry was disabled, while it is.
    pub disabled_at: Option<DateTime<Utc>>,
    /// Cooling while this is in the future.
    pub cooling_until: Option<DateTime<Utc>>,
    /// The class that set the cooldown or disabled the entry.
    pub reason: Option<FailureClass>,
    pub consecutive_failures: i32,
    pub last_error: Option<LastError>,
}

/// The most recent failure of an entry, safe to show.
#[derive(Debug, Clone, PartialEq)]
pub struct LastError {
    pub class: FailureClass,
    pub message: String,
    pub at: DateTime<Utc>,
}

/// What an entry looks like right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Condition {
    Ok,
    Cooling(DateTime<Utc>),
    Disabled,
}

impl EntryState {
    pub fn condition(&self, now: DateTime<Utc>) -> Condition {
        if self.disabled {
            Condition::Disabled
        } else {
            match self.cooling_until {
                Some(t) if t > now => Condition::Cooling(t),
                _ => Condition::Ok,
            }
        }
    }

    /// Whether a success has something to clear.
    pub fn is_clean(&self) -> bool {
        !self.disabled && self.cooling_until.is_none() && self.consecutive_failures == 0
    }
}

/// Names stored with the row so the table reads on its own.
pub struct EntryLabel<'a> {
    pub key: &'a str,
    pub provider: &'a str,
    pub model: &'a str,
}

/// Loads the states of `keys`; entries without a row are absent from the map (clean).
pub async fn load(pool: &PgPool, keys: &[String]) -> sqlx::Result<HashMap<String, EntryState>> {
    let rows = sqlx::query(
        "SELECT entry_key, state, cooling_until, reason, consecutive_failures,
                last_error_class, last_error_message, last_error_at, disabled_at
           FROM llm_entry_state WHERE entry_key = ANY($1)",
    )
    .bind(keys)
    .fetch_all(pool)
    .await?;
    let mut out = HashMap::with_capacity(rows.len());
    for row in rows {
        let state: String = row.try_get("state")?;
        let class: Option<String> = row.try_get("last_error_class")?;
        let message: Option<String> = row.try_get("last_error_message")?;
        let at: Option<DateTime<Utc>> = row.try_get("last_error_at")?;
        let last_error = match (class.as_deref().and_then(FailureClass::parse), at) {
            (Some(class), Some(at)) => Some(LastError {
                class,
                message: message.unwrap_or_default(),
                at,
            }),
            _ => None,
        };
        let reason: Option<String> = row.try_get("reason")?;
        out.insert(
            row.try_get("entry_key")?,
            EntryState {
                disabled: state == "disabled",
                disabled_at: match state == "disabled" {
                    true => row.try_get("disabled_at")?,
                    false => None,
                },
                cooling_until: if state == "cooling" {
                    row.try_get("cooling_until")?
                } else {
                    None
                },
                reason: reason.as_deref().and_then(FailureClass::parse),
                consecutive_failures: row.try_get("consecutive_failures")?,
                last_error,
            },
        );
    }
    Ok(out)
}

/// Records a failure and applies its consequence:
/// - `cooldown = Some(d)`: cooling until `now + d` (never shortening a longer cooldown set by
///   another request or replica);
/// - `Auth`: disabled;
/// - `Transient`: counted; the [`TRANSIENT_STREAK`]th in a row cools for
///   [`TRANSIENT_COOLDOWN`];
/// - otherwise only the last error is recorded.
pub async fn record_failure(
    pool: &PgPool,
    entry: &EntryLabel<'_>,
    class: FailureClass,
    message: &str,
    cooldown: Option<Duration>,
    now: DateTime<Utc>,
) -> sqlx::Result<()> {
    let until =
        cooldown.map(|d| now + chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX));
    let transient_until =
        now + chrono::Duration::from_std(TRANSIENT_COOLDOWN).unwrap_or(chrono::Duration::MAX);
    // One statement, so that concurrent failures of one entry count correctly.
    sqlx::query(
        "INSERT INTO llm_entry_state AS s
            (entry_key, provider, model, state, cooling_until, reason, consecutive_failures,
             last_error_class, last_error_message, last_error_at, updated_at, disabled_at)
         VALUES ($1, $2, $3,
                 CASE WHEN $4 = 'auth' THEN 'disabled'
                      WHEN $6::timestamptz IS NOT NULL THEN 'cooling'
                      WHEN $4 = 'transient' AND 1 >= $8 THEN 'cooling'
                      ELSE 'ok' END,
                 CASE WHEN $6::timestamptz IS NOT NULL THEN $6
                      WHEN $4 = 'transient' AND 1 >= $8 THEN $9 END,
                 CASE WHEN $4 = 'auth' OR $6::timestamptz IS NOT NULL
                        OR ($4 = 'transient' AND 1 >= $8) THEN $4 END,
                 CASE WHEN $4 = 'transient' THEN 1 ELSE 0 END,
                 $4, $5, $7, $7,
                 CASE WHEN $4 = 'auth' THEN $7 END)
         ON CONFLICT (entry_key) DO UPDATE SET
            consecutive_failures = CASE WHEN $4 = 'transient'
                                        THEN s.consecutive_failures + 1 ELSE 0 END,
            state = CASE
                WHEN $4 = 'auth' THEN 'disabled'
                WHEN s.state = 'disabled' THEN 'disabled'
                WHEN $6::timestamptz IS NOT NULL THEN 'cooling'
                WHEN $4 = 'transient' AND s.consecutive_failures + 1 >= $8 THEN 'cooling'
                ELSE s.state END,
            cooling_until = CASE
                WHEN $4 = 'auth' OR s.state = 'disabled' THEN NULL
                WHEN $6::timestamptz IS NOT NULL THEN GREATEST(
                    CASE WHEN s.state = 'cooling' THEN s.cooling_until END, $6)
                WHEN $4 = 'transient' AND s.consecutive_failures + 1 >= $8 THEN GREATEST(
                    CASE WHEN s.state = 'cooling' THEN s.cooling_until END, $9)
                ELSE s.cooling_until END,
            reason = CASE
                WHEN s.state = 'disabled' AND $4 <> 'auth' THEN s.reason
                WHEN $4 = 'auth' OR $6::timestamptz IS NOT NULL
                  OR ($4 = 'transient' AND s.consecutive_failures + 1 >= $8) THEN $4
                ELSE s.reason END,
            disabled_at = CASE
                WHEN s.state = 'disabled' THEN s.disabled_at
                WHEN $4 = 'auth' THEN $7 END,
            provider = EXCLUDED.provider,
            model = EXCLUDED.model,
            last_error_class = $4,
            last_error_message = $5,
            last_error_at = $7,
            updated_at = $7",
    )
    .bind(entry.key)
    .bind(entry.provider)
    .bind(entry.model)
    .bind(class.as_str())
    .bind(message)
    .bind(until)
    .bind(now)
    .bind(TRANSIENT_STREAK)
    .bind(transient_until)
    .execute(pool)
    .await?;
    Ok(())
}

/// Clears a cooldown and the failure streak after a success (the last error stays for the
/// health page). A disabled entry stays disabled: only a configuration change revives it.
pub async fn record_success(pool: &PgPool, key: &str, now: DateTime<Utc>) -> sqlx::Result<()> {
    sqlx::query(
        "UPDATE llm_entry_state
            SET state = 'ok', cooling_until = NULL, reason = NULL, consecutive_failures = 0,
                updated_at = $2
          WHERE entry_key = $1 AND state <> 'disabled'",
    )
    .bind(key)
    .bind(now)
    .execute(pool)
    .await?;
    Ok(())
}

/// Records a failed probe: the last error only, the cooldown is left as it is (a probe that
/// finds the quota still empty must not push recovery further away). A probe rejected for
/// its key disables the entry.
pub async fn record_probe_failure(
    pool: &PgPool,
    key: &str,
    class: FailureClass,
    message: &str,
    now: DateTime<Utc>,
) -> sqlx::Result<()> {
    sqlx::query(
        "UPDATE llm_entry_state
            SET last_error_class = $2, last_error_message = $3, last_error_at = $4,
                updated_at = $4,
                state = CASE WHEN $2 = 'auth' THEN 'disabled' ELSE state END,
                cooling_until = CASE WHEN $2 = 'auth' THEN NULL ELSE cooling_until END,
                reason = CASE WHEN $2 = 'auth' THEN 'auth' ELSE reason END,
                disabled_at = CASE
                    WHEN state = 'disabled' THEN disabled_at
                    WHEN $2 = 'auth' THEN $4 END
          WHERE entry_key = $1",
    )
    .bind(key)
    .bind(class.as_str())
    .bind(message)
    .bind(now)
    .execute(pool)
    .await?;
    Ok(())
}

/// Re-enables a disabled entry: its state is clean again, its last error kept for the health
/// page. Returns whether it was disabled. Written in `conn` (the transaction of its audit row).
pub async fn enable(
    conn: &mut sqlx::PgConnection,
    key: &str,
    now: DateTime<Utc>,
) -> sqlx::Result<bool> {
    let done = sqlx::query(
        "UPDATE llm_entry_state
            SET state = 'ok', cooling_until = NULL, reason = NULL, consecutive_failures = 0,
                disabled_at = NULL, updated_at = $2
          WHERE entry_key = $1 AND state = 'disabled'",
    )
    .bind(key)
    .bind(now)
    .execute(conn)
    .await?;
    Ok(done.rows_affected() > 0)
}
