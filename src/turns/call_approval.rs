//! Parked calls: a tool call the guard asks about waits in `call_approvals` for a person's
//! decision. Owns that table. Parking writes the row (fenced) and moves the turn to
//! [`AWAITING`]; while a row of an awaiting turn is `waiting`, before its deadline and without
//! a stop, no runner claims the section ([`PARKED`] in the claim), so the turn holds no lease
//! and no worker and its wait is not charged to its budget, while the section stays occupied
//! (an awaiting turn counts as the section's one live turn). The claim that resumes it makes
//! it `running` again, without counting another attempt.
//! A decision ([`decide`]) re-queues the section and wakes the runners; a passed deadline or
//! a `/stop` makes the section claimable again, and the resumed turn settles the wait. So does
//! a waiting call whose card is not recorded (its post failed, or its runner died first), at
//! its next try ([`card_failed`]): the resumed turn posts the card and parks again.
//! "Allow in this thread" also covers later commands whose cover key
//! ([`crate::bash::cover`], stored as its SHA-256) is the allowed call's — operands that are
//! data of the same class may differ, code never — at the same location in the section,
//! until the thread's yolo TTL or `/ssh yolo off` ([`allowed_in_thread`],
//! [`end_thread_allowances`]). A row written before cover keys (no `cover`) covers only its
//! own command, in its directory, for a call without environment variables of its own.
//!
//! Never: knows cards, chats or who is allowed to decide (the caller checks that first).

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::{PgPool, Row};

use super::store::{CHANNEL, Fence, Fenced};
use crate::authz::Approvers;

/// The state of a turn whose call waits for a person (`turns.state`).
pub const AWAITING: &str = "awaiting_approval";

/// The SQL condition, on a `turn_sections` row aliased `c`, that its section has a parked
/// call still waiting: such a section is not claimed. A waiting call whose card is not
/// recorded is parked only until its next try ([`card_failed`]): the resumed turn posts it.
pub(crate) const PARKED: &str =
    "EXISTS (SELECT 1 FROM call_approvals a JOIN turns t ON t.id = a.turn_id
     WHERE a.section_id = c.section_id AND a.state = 'waiting'
       AND t.state = 'awaiting_approval' AND a.deadline > now() AND t.stop_requested_at IS NULL
       AND (a.card_message_id IS NOT NULL OR a.card_retry_at > now()))";

/// The first wait before posting a card again after a failed post; it doubles with each
/// failure, up to [`CARD_RETRY_MAX`].
const CARD_RETRY_FIRST: Duration = Duration::from_secs(2);
const CARD_RETRY_MAX: Duration = Duration::from_secs(120);

/// Where a parked call stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallApprovalState {
    Waiting,
    Allowed,
    Denied,
    /// Nobody answered before the deadline.
    Expired,
    /// `/stop` ended the wait.
    Stopped,
}

impl CallApprovalState {
    fn parse(s: &str) -> CallApprovalState {
        match s {
            "allowed" => CallApprovalState::Allowed,
            "denied" => CallApprovalState::Denied,
            "expired" => CallApprovalState::Expired,
            "stopped" => CallApprovalState::Stopped,
            _ => CallApprovalState::Waiting,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            CallApprovalState::Waiting => "waiting",
            CallApprovalState::Allowed => "allowed",
            CallApprovalState::Denied => "denied",
            CallApprovalState::Expired => "expired",
            CallApprovalState::Stopped => "stopped",
        }
    }
}

/// How far an allowance reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Once,
    /// Commands of the same cover in this thread, until its yolo TTL.
    Thread,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Once => "once",
            Scope::Thread => "thread",
        }
    }
}

/// What a parked call shows a person.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ask {
    pub command: String,
    pub reason: String,
    pub location: String,
    pub cwd: String,
    pub requester: String,
    pub approvers: Approvers,
    /// What "Allow in this thread" would cover ([`crate::bash::cover::Cover::says`]).
    pub covers: String,
}

/// One parked call, as stored.
#[derive(Debug, Clone)]
pub struct Parked {
    pub turn_id: i64,
    pub call_key: String,
    pub section: String,
    pub state: CallApprovalState,
    pub scope: Option<Scope>,
    pub ask: Ask,
    pub deadline: DateTime<Utc>,
    pub decided_by: Option<String>,
    pub decided_at: Option<DateTime<Utc>>,
    pub started: bool,
    pub card_message_id: Option<String>,
    /// Whether the deadline has passed (read with the row, by the database's clock).
    pub overdue: bool,
    /// Whether a `/stop` is pending on the turn.
    pub stop_requested: bool,
}

const COLUMNS: &str = "a.turn_id, a.call_key, a.section_id, a.state, a.scope, a.command, a.reason,
    a.location, a.cwd, a.requester, a.approvers, a.deadline, a.decided_by, a.decided_at,
    a.started_at IS NOT NULL, a.card_message_id, a.deadline <= now(),
    t.stop_requested_at IS NOT NULL, a.covers";

fn row(r: &sqlx::postgres::PgRow) -> sqlx::Result<Parked> {
    let scope: Option<String> = r.try_get(4)?;
    let approvers: String = r.try_get(10)?;
    Ok(Parked {
        turn_id: r.try_get(0)?,
        call_key: r.try_get(1)?,
        section: r.try_get(2)?,
        state: CallApprovalState::parse(r.try_get::<&str, _>(3)?),
        scope: scope.map(|s| {
            if s == "thread" {
                Scope::Thread
            } else {
                Scope::Once
            }
        }),
        ask: Ask {
            command: r.try_get(5)?,
            reason: r.try_get(6)?,
            location: r.try_get(7)?,
            cwd: r.try_get(8)?,
            requester: r.try_get(9)?,
            approvers: Approvers::parse(&approvers).unwrap_or(Approvers::Admins),
            // A row from before cover keys covers its own command only.
            covers: r
                .try_get::<Option<String>, _>(18)?
                .unwrap_or_else(|| crate::bash::cover::exact("", "").says()),
        },
        deadline: r.try_get(11)?,
        decided_by: r.try_get(12)?,
        decided_at: r.try_get(13)?,
        started: r.try_get(14)?,
        card_message_id: r.try_get(15)?,
        overdue: r.try_get(16)?,
        stop_requested: r.try_get(17)?,
    })
}

/// The parked call `key` of `turn_id`, if it was ever parked.
pub async fn get(db: &PgPool, turn_id: i64, key: &str) -> sqlx::Result<Option<Parked>> {
    sqlx::query(&format!(
        "SELECT {COLUMNS} FROM call_approvals a JOIN turns t ON t.id = a.turn_id
          WHERE a.turn_id = $1 AND a.call_key = $2"
    ))
    .bind(turn_id)
    .bind(key)
    .fetch_optional(db)
    .await?
    .as_ref()
    .map(row)
    .transpose()
}

/// The stored form of a cover key: its SHA-256, in hex (a key is as long as its command).
fn digest(cover: &str) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(cover.as_bytes()))
}

/// Parks call `key` of `turn_id` (idempotent: a second park of the same call changes
/// nothing) and moves the turn to [`AWAITING`]. `cover` is the call's cover key
/// ([`crate::bash::cover::Cover::key`]). Returns the stored row.
pub async fn park(
    fence: &Fence,
    turn_id: i64,
    key: &str,
    ask: &Ask,
    cover: &str,
    timeout: Duration,
) -> Result<Parked, Fenced> {
    let mut tx = fence.begin().await?;
    // `shape` (what the previous version compared) stays empty: that version never takes
    // this row for an allowance of a whole shape.
    sqlx::query(
        "INSERT INTO call_approvals (turn_id, call_key, section_id, command, reason, location,
                                     cwd, requester, approvers, deadline, cover, covers)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, now() + make_interval(secs => $10), $11, $12)
         ON CONFLICT (turn_id, call_key) DO NOTHING",
    )
    .bind(turn_id)
    .bind(key)
    .bind(fence.section())
    .bind(&ask.command)
    .bind(&ask.reason)
    .bind(&ask.location)
    .bind(&ask.cwd)
    .bind(&ask.requester)
    .bind(ask.approvers.as_str())
    .bind(timeout.as_secs_f64())
    .bind(digest(cover))
    .bind(&ask.covers)
    .execute(&mut *tx)
    .await?;
    await_approval(&mut tx, turn_id).await?;
    let parked = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM call_approvals a JOIN turns t ON t.id = a.turn_id
          WHERE a.turn_id = $1 AND a.call_key = $2"
    ))
    .bind(turn_id)
    .bind(key)
    .fetch_one(&mut *tx)
    .await?;
    let parked = row(&parked)?;
    tx.commit().await?;
    Ok(parked)
}

async fn await_approval(conn: &mut sqlx::PgConnection, turn_id: i64) -> sqlx::Result<()> {
    sqlx::query("UPDATE turns SET state = 'awaiting_approval' WHERE id = $1 AND state = 'running'")
        .bind(turn_id)
        .execute(conn)
        .await?;
    Ok(())
}

/// Moves a resumed turn whose call still waits back to [`AWAITING`] (a claim that raced
/// nothing but found the wait not over), so the section is left alone again.
pub async fn keep_waiting(fence: &Fence, turn_id: i64) -> Result<(), Fenced> {
    let mut tx = fence.begin().await?;
    await_approval(&mut tx, turn_id).await?;
    tx.commit().await?;
    Ok(())
}

/// Records the card posted for a parked call.
pub async fn set_card(db: &PgPool, turn_id: i64, key: &str, message_id: &str) -> sqlx::Result<()> {
    sqlx::query(
        "UPDATE call_approvals SET card_message_id = $3
          WHERE turn_id = $1 AND call_key = $2 AND card_message_id IS NULL",
    )
    .bind(turn_id)
    .bind(key)
    .bind(message_id)
    .execute(db)
    .await?;
    Ok(())
}

/// Records that posting the card of a waiting call failed: the section stays parked until the
/// next try, [`CARD_RETRY_FIRST`] doubling with each failure up to [`CARD_RETRY_MAX`].
pub async fn card_failed(db: &PgPool, turn_id: i64, key: &str) -> sqlx::Result<()> {
    sqlx::query(
        "UPDATE call_approvals SET card_tries = card_tries + 1,
                card_retry_at = now() + make_interval(secs => least($3 * power(2, least(card_tries, 16)), $4))
          WHERE turn_id = $1 AND call_key = $2 AND card_message_id IS NULL",
    )
    .bind(turn_id)
    .bind(key)
    .bind(CARD_RETRY_FIRST.as_secs_f64())
    .bind(CARD_RETRY_MAX.as_secs_f64())
    .execute(db)
    .await?;
    Ok(())
}

/// Ends a wait that nobody answered: `state` is [`CallApprovalState::Expired`] or
/// [`CallApprovalState::Stopped`]. Returns false when a decision got there first.
pub async fn settle(
    fence: &Fence,
    turn_id: i64,
    key: &str,
    state: CallApprovalState,
) -> Result<bool, Fenced> {
    let mut tx = fence.begin().await?;
    let n = sqlx::query(
        "UPDATE call_approvals SET state = $3, decided_at = now()
          WHERE turn_id = $1 AND call_key = $2 AND state = 'waiting'",
    )
    .bind(turn_id)
    .bind(key)
    .bind(state.as_str())
    .execute(&mut *tx)
    .await?
    .rows_affected();
    tx.commit().await?;
    Ok(n == 1)
}

/// Marks an allowed call started, before it runs: from here its outcome is unknown until
/// its result is stored.
pub async fn mark_started(fence: &Fence, turn_id: i64, key: &str) -> Result<(), Fenced> {
    let mut tx = fence.begin().await?;
    sqlx::query(
        "UPDATE call_approvals SET started_at = now()
          WHERE turn_id = $1 AND call_key = $2 AND state = 'allowed' AND started_at IS NULL",
    )
    .bind(turn_id)
    .bind(key)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}

/// What [`decide`] did.
#[derive(Debug, Clone)]
pub enum Decided {
    /// The decision was recorded; the section is re-queued.
    Applied(Parked),
    /// The call was decided (or its wait ended) before: nothing changed.
    Already(Parked),
    /// No such parked call.
    Unknown,
}

/// Records a person's decision on a waiting call (`scope` `None` = deny), re-queues the
/// section and wakes the runners. An allowance in the thread holds for `thread_for` (the
/// yolo TTL). The caller has checked that `by` may decide.
pub async fn decide(
    db: &PgPool,
    turn_id: i64,
    key: &str,
    scope: Option<Scope>,
    by: &str,
    thread_for: Duration,
) -> sqlx::Result<Decided> {
    let mut tx = db.begin().await?;
    let updated = sqlx::query(
        "UPDATE call_approvals SET state = $3, scope = $4, decided_by = $5, decided_at = now(),
                thread_until = CASE WHEN $4 = 'thread' THEN now() + make_interval(secs => $6) END
          WHERE turn_id = $1 AND call_key = $2 AND state = 'waiting' AND deadline > now()
          RETURNING section_id",
    )
    .bind(turn_id)
    .bind(key)
    .bind(if scope.is_some() { "allowed" } else { "denied" })
    .bind(scope.map(Scope::as_str))
    .bind(by)
    .bind(thread_for.as_secs_f64())
    .fetch_optional(&mut *tx)
    .await?;
    if let Some(r) = &updated {
        let section: String = r.try_get(0)?;
        sqlx::query("UPDATE turn_sections SET pending = true WHERE section_id = $1")
            .bind(&section)
            .execute(&mut *tx)
            .await?;
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(CHANNEL)
            .bind(&section)
            .execute(&mut *tx)
            .await?;
    }
    let now = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM call_approvals a JOIN turns t ON t.id = a.turn_id
          WHERE a.turn_id = $1 AND a.call_key = $2"
    ))
    .bind(turn_id)
    .bind(key)
    .fetch_optional(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(match (now.as_ref().map(row).transpose()?, updated) {
        (None, _) => Decided::Unknown,
        (Some(p), Some(_)) => Decided::Applied(p),
        (Some(p), None) => Decided::Already(p),
    })
}

/// A call that an allowance in the thread may cover.
#[derive(Debug, Clone, Copy)]
pub struct Covered<'a> {
    /// Where it runs (`local`, `web · deploy@10.0.0.5`).
    pub location: &'a str,
    /// Its cover key ([`crate::bash::cover::Cover::key`]).
    pub cover: &'a str,
    /// The command, its directory, and whether the call sets environment variables: what
    /// a row from before cover keys is matched by.
    pub command: &'a str,
    pub cwd: &'a str,
    pub with_env: bool,
}

/// Who allowed, in this section's thread and at this location, calls with this cover key,
/// while that allowance holds, and who had asked then, as (decided_by, requester); `None`
/// when nothing covers it. A row from before cover keys covers only its own command, in its
/// directory, for a call without environment variables of its own.
pub async fn allowed_in_thread(
    db: &PgPool,
    section: &str,
    call: Covered<'_>,
) -> sqlx::Result<Option<(String, String)>> {
    sqlx::query_as(
        "SELECT decided_by, requester FROM call_approvals
          WHERE section_id = $1 AND location = $3 AND scope = 'thread'
            AND state = 'allowed' AND thread_until > now()
            AND (cover = $2 OR (cover IS NULL AND command = $4 AND cwd = $5 AND NOT $6))
          ORDER BY decided_at DESC LIMIT 1",
    )
    .bind(section)
    .bind(digest(call.cover))
    .bind(call.location)
    .bind(call.command)
    .bind(call.cwd)
    .bind(call.with_env)
    .fetch_optional(db)
    .await
}

/// Ends every allowance in `section`'s thread (`/ssh yolo off`), in the caller's transaction.
pub async fn end_thread_allowances(
    conn: &mut sqlx::PgConnection,
    section: &str,
) -> sqlx::Result<u64> {
    Ok(sqlx::query(
        "UPDATE call_approvals SET thread_until = now()
          WHERE section_id = $1 AND scope = 'thread' AND thread_until > now()",
    )
    .bind(section)
    .execute(conn)
    .await?
    .rows_affected())
}

/// Ends the allowances `person` gave in these sections' threads, in the caller's transaction.
pub async fn end_allowances_by(
    conn: &mut sqlx::PgConnection,
    sections: &[String],
    person: &str,
) -> sqlx::Result<u64> {
    Ok(sqlx::query(
        "UPDATE call_approvals SET thread_until = now()
          WHERE section_id = ANY($1) AND decided_by = $2 AND scope = 'thread'
            AND thread_until > now()",
    )
    .bind(sections)
    .bind(person)
    .execute(conn)
    .await?
    .rows_affected())
}

/// Lets the waiting calls of `section` (only those `requester` asked for, when given) lapse
/// now: their deadline passes, and the turn settles them as a wait that timed out.
pub async fn lapse_waiting(
    conn: &mut sqlx::PgConnection,
    section: &str,
    requester: Option<&str>,
) -> sqlx::Result<u64> {
    Ok(sqlx::query(
        "UPDATE call_approvals SET deadline = now()
          WHERE section_id = $1 AND state = 'waiting' AND deadline > now()
            AND ($2::text IS NULL OR requester = $2)",
    )
    .bind(section)
    .bind(requester)
    .execute(conn)
    .await?
    .rows_affected())
}

/// The call of `section` waiting for a person now, as (turn, call key), if any.
pub async fn waiting_in(db: &PgPool, section: &str) -> sqlx::Result<Option<(i64, String)>> {
    sqlx::query_as(
        "SELECT turn_id, call_key FROM call_approvals
          WHERE section_id = $1 AND state = 'waiting' AND deadline > now() LIMIT 1",
    )
    .bind(section)
    .fetch_optional(db)
    .await
}
