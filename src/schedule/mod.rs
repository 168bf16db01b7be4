//! Schedules: turns a thread asked for at set times (`/cron add`, or the model's proposal a
//! person confirmed). This module owns the tables — `schedules`, `schedule_firings`,
//! `chat_timezones`, `schedule_proposals` — and what a schedule says ([`spec`]); chat control
//! (`chat::cron`) decides who may change one and what a firing does, and `scheduler` claims due
//! rows.
//!
//! **Exactly once.** A due row is claimed `FOR UPDATE SKIP LOCKED` ([`claim_due`]); in the same
//! transaction its next due time is written ([`advance`]) and its firing recorded
//! ([`record_firing`], keyed by schedule and due time) with the inbox event that carries it, so
//! two replicas never fire one due time twice and a crash between claim and post loses none.
//! Due times are judged on the service's clock, never the database's `now()`.
//!
//! Never: runs a turn or posts a message; decides who may.

pub mod cli;
pub mod spec;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgExecutor, PgPool, Row};

pub use spec::{Spec, SpecError};

/// The inbox event type of a firing.
pub const FIRED: &str = "sshmode.schedule.fired";

/// A schedule as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    pub id: i64,
    pub chat_id: String,
    pub section_id: String,
    /// The thread's root message (`None` for a chat's own section).
    pub root_message_id: Option<String>,
    pub in_thread: bool,
    /// A one-to-one chat's own section (its person manages it).
    pub direct: bool,
    pub spec: String,
    pub tz: String,
    pub prompt: String,
    pub creator: String,
    pub created_at: DateTime<Utc>,
    pub next_due: DateTime<Utc>,
    pub paused_at: Option<DateTime<Utc>>,
    pub paused_reason: Option<String>,
    pub removed: bool,
    pub skip_told: bool,
}

/// A schedule to add.
#[derive(Debug, Clone)]
pub struct NewSchedule {
    pub chat_id: String,
    pub section_id: String,
    pub root_message_id: Option<String>,
    pub in_thread: bool,
    pub direct: bool,
    pub spec: String,
    pub tz: String,
    pub prompt: String,
    pub creator: String,
}

/// What an inbox event of type [`FIRED`] carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Firing {
    pub schedule_id: i64,
    pub due_at: DateTime<Utc>,
    /// How late the claim was (downtime collapses missed due times into one late firing).
    pub late_ms: i64,
    /// Who asked for it now (`/cron run`), else `None`.
    #[serde(default)]
    pub run_by: Option<String>,
}

impl Firing {
    /// The inbox event id: one per schedule and due time.
    pub fn event_id(&self) -> String {
        format!(
            "schedule:{}:{}",
            self.schedule_id,
            self.due_at.timestamp_millis()
        )
    }

    /// The key of what the firing posts (its anchor's uuid derives from it).
    pub fn key(&self) -> String {
        self.event_id()
    }
}

const COLUMNS: &str = "id, chat_id, section_id, root_message_id, in_thread, spec, tz, prompt, \
     creator, created_at, next_due, paused_at, paused_reason, removed_at IS NOT NULL, skip_told, \
     direct";

fn row(r: sqlx::postgres::PgRow) -> sqlx::Result<Schedule> {
    Ok(Schedule {
        id: r.try_get(0)?,
        chat_id: r.try_get(1)?,
        section_id: r.try_get(2)?,
        root_message_id: r.try_get(3)?,
        in_thread: r.try_get(4)?,
        spec: r.try_get(5)?,
        tz: r.try_get(6)?,
        prompt: r.try_get(7)?,
        creator: r.try_get(8)?,
        created_at: r.try_get(9)?,
        next_due: r.try_get(10)?,
        paused_at: r.try_get(11)?,
        paused_reason: r.try_get(12)?,
        removed: r.try_get(13)?,
        skip_told: r.try_get(14)?,
        direct: r.try_get(15)?,
    })
}

/// The schedule chat message `message_id` added, if it added one.
pub async fn by_message(db: &PgPool, message_id: &str) -> sqlx::Result<Option<Schedule>> {
    sqlx::query(&format!(
        "SELECT {COLUMNS} FROM schedules WHERE added_by_message = $1"
    ))
    .bind(message_id)
    .fetch_optional(db)
    .await?
    .map(row)
    .transpose()
}

/// Records the chat message that added schedule `id`.
pub async fn added_by(conn: &mut PgConnection, id: i64, message_id: &str) -> sqlx::Result<()> {
    sqlx::query("UPDATE schedules SET added_by_message = $2 WHERE id = $1")
        .bind(id)
        .bind(message_id)
        .execute(conn)
        .await?;
    Ok(())
}

/// A new schedule's id, taken before it is added (its confirmation names it).
pub async fn reserve_id(db: &PgPool) -> sqlx::Result<i64> {
    sqlx::query_scalar("SELECT nextval(pg_get_serial_sequence('schedules', 'id'))")
        .fetch_one(db)
        .await
}

/// Serialises adds in one chat until the transaction ends (the per-chat bound).
pub async fn lock_chat(conn: &mut PgConnection, chat_id: &str) -> sqlx::Result<()> {
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('schedules:' || $1, 0))")
        .bind(chat_id)
        .execute(conn)
        .await?;
    Ok(())
}

/// Adds schedule `id` (from [`reserve_id`]), due first at `next_due`.
pub async fn add(
    conn: &mut PgConnection,
    id: i64,
    new: &NewSchedule,
    now: DateTime<Utc>,
    next_due: DateTime<Utc>,
) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO schedules (id, chat_id, section_id, root_message_id, in_thread, direct, spec,
             tz, prompt, creator, created_at, next_due)
         VALUES ($11, $1, $2, $3, $4, $12, $5, $6, $7, $8, $9, $10)",
    )
    .bind(&new.chat_id)
    .bind(&new.section_id)
    .bind(&new.root_message_id)
    .bind(new.in_thread)
    .bind(&new.spec)
    .bind(&new.tz)
    .bind(&new.prompt)
    .bind(&new.creator)
    .bind(now)
    .bind(next_due)
    .bind(id)
    .bind(new.direct)
    .execute(conn)
    .await?;
    Ok(())
}

/// The schedules a chat holds (not removed).
pub async fn count_in_chat(conn: &mut PgConnection, chat_id: &str) -> sqlx::Result<i64> {
    sqlx::query_scalar("SELECT count(*) FROM schedules WHERE chat_id = $1 AND removed_at IS NULL")
        .bind(chat_id)
        .fetch_one(conn)
        .await
}

/// One schedule, locked for a change when `lock`.
pub async fn get(conn: &mut PgConnection, id: i64, lock: bool) -> sqlx::Result<Option<Schedule>> {
    let sql = format!(
        "SELECT {COLUMNS} FROM schedules WHERE id = $1{}",
        if lock { " FOR UPDATE" } else { "" }
    );
    sqlx::query(&sql)
        .bind(id)
        .fetch_optional(conn)
        .await?
        .map(row)
        .transpose()
}

/// A schedule with what became of its latest firing, as `/cron list` and the CLI show it.
#[derive(Debug, Clone)]
pub struct Listed {
    pub schedule: Schedule,
    /// The latest firing's due time and result (`running`, `done`, `failed`, `skipped`, …).
    pub last: Option<(DateTime<Utc>, String)>,
}

/// The schedules of `chat` (every chat when `None`), not removed, oldest first (at most 200).
pub async fn list(db: &PgPool, chat: Option<&str>) -> sqlx::Result<Vec<Listed>> {
    let sql = format!(
        "SELECT {COLUMNS}, l.due_at, l.result FROM schedules s
         LEFT JOIN LATERAL (
             SELECT f.due_at, CASE
                 WHEN f.state <> 'fired' THEN f.state
                 WHEN t.state IS NULL THEN 'queued'
                 WHEN t.state IN ('running', 'awaiting_approval') THEN 'running'
                 ELSE t.state END AS result
             FROM schedule_firings f
             LEFT JOIN turn_requests r ON r.message_id = f.anchor_message_id
             LEFT JOIN turns t ON t.id = r.turn_id
             WHERE f.schedule_id = s.id ORDER BY f.claimed_at DESC, f.due_at DESC LIMIT 1) l ON true
         WHERE s.removed_at IS NULL AND ($1::text IS NULL OR s.chat_id = $1)
         ORDER BY s.id LIMIT 200"
    );
    sqlx::query(&sql)
        .bind(chat)
        .fetch_all(db)
        .await?
        .into_iter()
        .map(|r| {
            let due: Option<DateTime<Utc>> = r.try_get(16)?;
            let result: Option<String> = r.try_get(17)?;
            Ok(Listed {
                schedule: row(r)?,
                last: due.zip(result),
            })
        })
        .collect()
}

/// The live (neither paused nor removed) schedules of `chat_id`, of `creator` only when given:
/// (id, section, the thread's root message).
pub async fn live_in_chat(
    db: &sqlx::PgPool,
    chat_id: &str,
    creator: Option<&str>,
) -> sqlx::Result<Vec<(i64, String, Option<String>)>> {
    sqlx::query_as(
        "SELECT id, section_id, root_message_id FROM schedules
          WHERE chat_id = $1 AND removed_at IS NULL AND paused_at IS NULL
            AND ($2::text IS NULL OR creator = $2)
          ORDER BY id",
    )
    .bind(chat_id)
    .bind(creator)
    .fetch_all(db)
    .await
}

/// Pauses a schedule (`reason`: why, when the service paused it).
pub async fn pause(
    conn: &mut PgConnection,
    id: i64,
    by: &str,
    reason: Option<&str>,
    now: DateTime<Utc>,
) -> sqlx::Result<()> {
    sqlx::query(
        "UPDATE schedules SET paused_at = $2, paused_by = $3, paused_reason = $4 WHERE id = $1",
    )
    .bind(id)
    .bind(now)
    .bind(by)
    .bind(reason)
    .execute(conn)
    .await?;
    Ok(())
}

/// Resumes a paused schedule, next due at `next_due` (what it missed while paused is not fired).
pub async fn resume(conn: &mut PgConnection, id: i64, next_due: DateTime<Utc>) -> sqlx::Result<()> {
    sqlx::query(
        "UPDATE schedules SET paused_at = NULL, paused_by = NULL, paused_reason = NULL,
             next_due = $2, skip_told = false WHERE id = $1",
    )
    .bind(id)
    .bind(next_due)
    .execute(conn)
    .await?;
    Ok(())
}

/// Removes a schedule (the row stays, for its firings and the audit).
pub async fn remove(conn: &mut PgConnection, id: i64, now: DateTime<Utc>) -> sqlx::Result<()> {
    sqlx::query("UPDATE schedules SET removed_at = $2 WHERE id = $1")
        .bind(id)
        .bind(now)
        .execute(conn)
        .await?;
    Ok(())
}

/// The chat's zone for new schedules, if one was set.
pub async fn chat_zone(db: impl PgExecutor<'_>, chat_id: &str) -> sqlx::Result<Option<String>> {
    sqlx::query_scalar("SELECT tz FROM chat_timezones WHERE chat_id = $1")
        .bind(chat_id)
        .fetch_optional(db)
        .await
}

/// Sets the chat's zone for new schedules.
pub async fn set_chat_zone(
    conn: &mut PgConnection,
    chat_id: &str,
    tz: &str,
    by: &str,
    now: DateTime<Utc>,
) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO chat_timezones (chat_id, tz, set_by, set_at) VALUES ($1, $2, $3, $4)
         ON CONFLICT (chat_id) DO UPDATE SET tz = $2, set_by = $3, set_at = $4",
    )
    .bind(chat_id)
    .bind(tz)
    .bind(by)
    .bind(now)
    .execute(conn)
    .await?;
    Ok(())
}

/// Claims up to `limit` schedules due at `now` (paused and removed ones never are), locked
/// until the transaction ends; rows another transaction holds are skipped. Sections starting
/// with `except` are left to their own front-end (a console's).
pub async fn claim_due(
    conn: &mut PgConnection,
    now: DateTime<Utc>,
    limit: i64,
    only: Option<&str>,
    except: Option<&str>,
) -> sqlx::Result<Vec<Schedule>> {
    let sql = format!(
        "SELECT {COLUMNS} FROM schedules
         WHERE next_due <= $1 AND paused_at IS NULL AND removed_at IS NULL
           AND ($3::text IS NULL OR section_id = $3)
           AND ($4::text IS NULL OR NOT starts_with(section_id, $4))
         ORDER BY next_due LIMIT $2 FOR UPDATE SKIP LOCKED"
    );
    sqlx::query(&sql)
        .bind(now)
        .bind(limit)
        .bind(only)
        .bind(except)
        .fetch_all(conn)
        .await?
        .into_iter()
        .map(row)
        .collect()
}

/// Sets a claimed schedule's next due time.
pub async fn advance(
    conn: &mut PgConnection,
    id: i64,
    next_due: DateTime<Utc>,
) -> sqlx::Result<()> {
    sqlx::query("UPDATE schedules SET next_due = $2 WHERE id = $1")
        .bind(id)
        .bind(next_due)
        .execute(conn)
        .await?;
    Ok(())
}

/// Records a firing; `false` when this due time was recorded before (nothing to do).
pub async fn record_firing(
    conn: &mut PgConnection,
    f: &Firing,
    now: DateTime<Utc>,
) -> sqlx::Result<bool> {
    Ok(sqlx::query(
        "INSERT INTO schedule_firings (schedule_id, due_at, claimed_at, late_ms, run_by)
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
    )
    .bind(f.schedule_id)
    .bind(f.due_at)
    .bind(now)
    .bind(f.late_ms)
    .bind(&f.run_by)
    .execute(conn)
    .await?
    .rows_affected()
        == 1)
}

/// What a firing came to, and the anchor its turn answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FiringState {
    Queued,
    Fired,
    Skipped,
    Paused,
    Gone,
}

impl FiringState {
    pub fn as_str(self) -> &'static str {
        match self {
            FiringState::Queued => "queued",
            FiringState::Fired => "fired",
            FiringState::Skipped => "skipped",
            FiringState::Paused => "paused",
            FiringState::Gone => "gone",
        }
    }
}

/// The state and anchor of a recorded firing.
pub async fn firing(
    db: impl PgExecutor<'_>,
    f: &Firing,
) -> sqlx::Result<Option<(String, Option<String>)>> {
    sqlx::query_as(
        "SELECT state, anchor_message_id FROM schedule_firings WHERE schedule_id = $1 AND due_at = $2",
    )
    .bind(f.schedule_id)
    .bind(f.due_at)
    .fetch_optional(db)
    .await
}

/// Settles a firing (with its anchor, once posted).
pub async fn settle_firing(
    db: impl PgExecutor<'_>,
    f: &Firing,
    state: FiringState,
    anchor: Option<&str>,
) -> sqlx::Result<()> {
    sqlx::query(
        "UPDATE schedule_firings SET state = $3, anchor_message_id = COALESCE($4, anchor_message_id)
         WHERE schedule_id = $1 AND due_at = $2",
    )
    .bind(f.schedule_id)
    .bind(f.due_at)
    .bind(state.as_str())
    .bind(anchor)
    .execute(db)
    .await?;
    Ok(())
}

/// Firings of `section`'s schedules still queued well after they were claimed (their
/// deliverer stopped before handling them), oldest first, at most 16.
pub async fn left_queued(
    db: &PgPool,
    section: &str,
    now: DateTime<Utc>,
) -> sqlx::Result<Vec<Firing>> {
    let rows: Vec<(i64, DateTime<Utc>, i64, Option<String>)> = sqlx::query_as(
        "SELECT f.schedule_id, f.due_at, f.late_ms, f.run_by FROM schedule_firings f
           JOIN schedules s ON s.id = f.schedule_id
          WHERE s.section_id = $1 AND f.state = 'queued' AND f.claimed_at < $2
          ORDER BY f.claimed_at LIMIT 16",
    )
    .bind(section)
    .bind(now - chrono::Duration::seconds(30))
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(schedule_id, due_at, late_ms, run_by)| Firing {
            schedule_id,
            due_at,
            late_ms,
            run_by,
        })
        .collect())
}

/// Whether the schedule's previous run (a turn request it made) is still waiting or running.
pub async fn previous_run_live(db: impl PgExecutor<'_>, id: i64) -> sqlx::Result<bool> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM turn_requests r LEFT JOIN turns t ON t.id = r.turn_id
          WHERE r.schedule_id = $1 AND r.dropped_at IS NULL
            AND (r.turn_id IS NULL OR t.state IN ('running', 'awaiting_approval')))",
    )
    .bind(id)
    .fetch_one(db)
    .await
}

/// Marks (or clears) that the thread was told a firing was skipped.
pub async fn set_skip_told(db: impl PgExecutor<'_>, id: i64, told: bool) -> sqlx::Result<()> {
    sqlx::query("UPDATE schedules SET skip_told = $2 WHERE id = $1")
        .bind(id)
        .bind(told)
        .execute(db)
        .await?;
    Ok(())
}

/// The next three due times from `now`, for a confirmation.
pub fn upcoming(
    spec: &Spec,
    tz: chrono_tz::Tz,
    anchor: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Vec<DateTime<Utc>> {
    let mut out = Vec::with_capacity(3);
    let mut at = now;
    while out.len() < 3 {
        match spec.next_after(at, tz, anchor) {
            Some(n) => {
                out.push(n);
                at = n;
            }
            None => break,
        }
    }
    out
}

/// A stored zone name as a zone (a name that no longer reads falls back to UTC).
pub fn zone_or_utc(name: &str) -> chrono_tz::Tz {
    spec::zone(name).unwrap_or(chrono_tz::Tz::UTC)
}

/// A time in `tz` as lists show it: `Fri 12-04 09:00 CET`.
pub fn local(at: DateTime<Utc>, tz: chrono_tz::Tz) -> String {
    at.with_timezone(&tz)
        .format("%a %m-%d %H:%M %Z")
        .to_string()
}

/// `text` on one line, cut at `max` characters with `…`.
pub fn short(text: &str, max: usize) -> String {
    let one: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if one.chars().count() <= max {
        return one;
    }
    let mut s: String = one.chars().take(max).collect();
    s.push('…');
    s
}

/// One schedule as `/cron list` and `sshmode schedule list` show it.
pub fn line(l: &Listed, now: DateTime<Utc>) -> String {
    let s = &l.schedule;
    let tz = zone_or_utc(&s.tz);
    let next = match &s.paused_at {
        Some(_) => format!(
            "paused{}",
            s.paused_reason
                .as_ref()
                .map(|r| format!(" ({r})"))
                .unwrap_or_default()
        ),
        None if s.next_due <= now => "next: due now".into(),
        None => format!("next: {}", local(s.next_due, tz)),
    };
    let last = match &l.last {
        Some((due, result)) => format!("last: {result} ({})", local(*due, tz)),
        None => "last: never".into(),
    };
    format!(
        "#{} `{}` ({}) · {next} · {last} · by {} · {}",
        s.id,
        s.spec,
        s.tz,
        s.creator,
        short(&s.prompt, 80)
    )
}

/// The next due time of `s` after `now` (`None`: it has none).
pub fn next_due(s: &Schedule, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let spec = Spec::parse(&s.spec, std::time::Duration::ZERO).ok()?;
    spec.next_after(now, spec::zone(&s.tz).ok()?, s.created_at)
}

/// A proposal as its card shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProposalView {
    pub id: i64,
    pub spec: String,
    pub tz: String,
    pub prompt: String,
    /// The next runs, in the schedule's zone.
    pub next: Vec<String>,
    pub asked_by: String,
    pub state: ProposalState,
}

/// Where a proposal stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProposalState {
    /// Waiting for Add or Cancel.
    Open,
    /// Added as schedule `schedule` by `by`.
    Added {
        by: String,
        schedule: i64,
    },
    Cancelled {
        by: String,
    },
    /// It could not be added (the chat is full, the schedule no longer reads).
    Failed(String),
}

/// A proposal of the model's, waiting for a click: the schedule it would add (its `creator`
/// is who asked; the person who adds it becomes the schedule's) and its decision.
#[derive(Debug, Clone)]
pub struct Proposal {
    pub id: i64,
    pub schedule: NewSchedule,
    pub decision: Option<String>,
    pub decided_by: Option<String>,
    pub schedule_id: Option<i64>,
}

/// Stores the model's proposal; returns its id.
pub async fn propose(
    db: impl PgExecutor<'_>,
    new: &NewSchedule,
    now: DateTime<Utc>,
) -> sqlx::Result<i64> {
    sqlx::query_scalar(
        "INSERT INTO schedule_proposals (chat_id, section_id, root_message_id, in_thread, spec, tz,
             prompt, asked_by, proposed_at, direct)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) RETURNING id",
    )
    .bind(&new.chat_id)
    .bind(&new.section_id)
    .bind(&new.root_message_id)
    .bind(new.in_thread)
    .bind(&new.spec)
    .bind(&new.tz)
    .bind(&new.prompt)
    .bind(&new.creator)
    .bind(now)
    .bind(new.direct)
    .fetch_one(db)
    .await
}

/// A proposal, locked for its decision.
pub async fn proposal(conn: &mut PgConnection, id: i64) -> sqlx::Result<Option<Proposal>> {
    sqlx::query(
        "SELECT id, chat_id, section_id, root_message_id, in_thread, spec, tz, prompt, asked_by,
                decision, decided_by, schedule_id, direct
         FROM schedule_proposals WHERE id = $1 FOR UPDATE",
    )
    .bind(id)
    .fetch_optional(conn)
    .await?
    .map(|r| {
        Ok(Proposal {
            id: r.try_get(0)?,
            schedule: NewSchedule {
                chat_id: r.try_get(1)?,
                section_id: r.try_get(2)?,
                root_message_id: r.try_get(3)?,
                in_thread: r.try_get(4)?,
                direct: r.try_get(12)?,
                spec: r.try_get(5)?,
                tz: r.try_get(6)?,
                prompt: r.try_get(7)?,
                creator: r.try_get(8)?,
            },
            decision: r.try_get(9)?,
            decided_by: r.try_get(10)?,
            schedule_id: r.try_get(11)?,
        })
    })
    .transpose()
}

/// Records a proposal's decision.
pub async fn decide_proposal(
    conn: &mut PgConnection,
    id: i64,
    decision: &str,
    by: &str,
    now: DateTime<Utc>,
    schedule_id: Option<i64>,
) -> sqlx::Result<()> {
    sqlx::query(
        "UPDATE schedule_proposals SET decision = $2, decided_by = $3, decided_at = $4,
             schedule_id = $5 WHERE id = $1",
    )
    .bind(id)
    .bind(decision)
    .bind(by)
    .bind(now)
    .bind(schedule_id)
    .execute(conn)
    .await?;
    Ok(())
}

/// The card a proposal was shown on.
pub async fn proposal_card(db: impl PgExecutor<'_>, id: i64) -> sqlx::Result<Option<String>> {
    Ok(sqlx::query_scalar::<_, Option<String>>(
        "SELECT card_message_id FROM schedule_proposals WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(db)
    .await?
    .flatten())
}

/// Records the card a proposal was shown on.
pub async fn set_proposal_card(db: &PgPool, id: i64, message_id: &str) -> sqlx::Result<()> {
    sqlx::query("UPDATE schedule_proposals SET card_message_id = $2 WHERE id = $1")
        .bind(id)
        .bind(message_id)
        .execute(db)
        .await?;
    Ok(())
}
