//! The turn tables: requests, section leases, turns. Every query on them lives here.
//!
//! Lock order, the same everywhere so nothing deadlocks: the section's `turn_sections` row
//! first, then its `turns` row, then `turn_requests` rows.

use std::time::Duration;

use sqlx::{PgPool, Postgres, Row, Transaction};

use super::{
    ActiveTurn, DroppedRequest, Enqueued, RecallOutcome, StopOutcome, TurnCancel, TurnEnd,
    TurnMessage, TurnRequest,
};

/// The notification channel runners listen on (a wake-up only; the tables are the truth).
pub(crate) const CHANNEL: &str = "sshmode_turns";
/// Most requests one turn takes; the rest wait for the next turn.
const MAX_MESSAGES_PER_TURN: i64 = 100;

pub(super) async fn enqueue(
    db: &PgPool,
    req: &TurnRequest,
    schedule: Option<i64>,
) -> sqlx::Result<Enqueued> {
    let mut tx = db.begin().await?;
    sqlx::query(
        "INSERT INTO turn_sections (section_id, pending) VALUES ($1, true)
         ON CONFLICT (section_id) DO UPDATE SET pending = true",
    )
    .bind(&req.section)
    .execute(&mut *tx)
    .await?;
    let inserted: Option<i64> = sqlx::query_scalar(
        "INSERT INTO turn_requests (section_id, message_id, chat_id, sender, text, in_thread,
             schedule_id)
         VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (message_id) DO NOTHING RETURNING id",
    )
    .bind(&req.section)
    .bind(&req.message_id)
    .bind(&req.chat_id)
    .bind(&req.sender)
    .bind(&req.text)
    .bind(req.in_thread)
    .bind(schedule)
    .fetch_optional(&mut *tx)
    .await?;
    let out = match inserted {
        Some(id) => Enqueued { id, new: true },
        None => Enqueued {
            id: sqlx::query_scalar("SELECT id FROM turn_requests WHERE message_id = $1")
                .bind(&req.message_id)
                .fetch_one(&mut *tx)
                .await?,
            new: false,
        },
    };
    sqlx::query("SELECT pg_notify($1, $2)")
        .bind(CHANNEL)
        .bind(&req.section)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(out)
}

pub(super) async fn request_stop(
    db: &PgPool,
    section: &str,
    by: &str,
) -> sqlx::Result<StopOutcome> {
    let mut tx = db.begin().await?;
    let running: Option<(i64, bool)> = sqlx::query_as(
        "SELECT id, stop_requested_at IS NOT NULL FROM turns
         WHERE section_id = $1 AND state IN ('running', 'awaiting_approval') FOR UPDATE",
    )
    .bind(section)
    .fetch_optional(&mut *tx)
    .await?;
    let out = match running {
        Some((turn_id, false)) => {
            sqlx::query(
                "UPDATE turns SET stop_requested_at = now(), stop_requested_by = $2 WHERE id = $1",
            )
            .bind(turn_id)
            .bind(by)
            .execute(&mut *tx)
            .await?;
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM turn_requests
                 WHERE section_id = $1 AND turn_id IS NULL AND dropped_at IS NULL",
            )
            .bind(section)
            .fetch_one(&mut *tx)
            .await?;
            StopOutcome::Stopping { turn_id, waiting }
        }
        _ => {
            let dropped: Vec<DroppedRequest> = sqlx::query_as::<_, (String, Option<String>)>(
                "UPDATE turn_requests SET dropped_at = now(), final_reaction = 'dropped'
                 WHERE section_id = $1 AND turn_id IS NULL AND dropped_at IS NULL
                 RETURNING message_id, receipt_reaction",
            )
            .bind(section)
            .fetch_all(&mut *tx)
            .await?
            .into_iter()
            .map(|(message_id, receipt_reaction)| DroppedRequest {
                message_id,
                receipt_reaction,
            })
            .collect();
            if dropped.is_empty() && running.is_none() {
                StopOutcome::Idle
            } else {
                StopOutcome::DroppedWaiting { dropped }
            }
        }
    };
    tx.commit().await?;
    Ok(out)
}

pub(super) async fn recall_request(
    db: &PgPool,
    message_id: &str,
    by: &str,
) -> sqlx::Result<RecallOutcome> {
    let mut tx = db.begin().await?;
    let dropped: Option<Option<String>> = sqlx::query_scalar(
        "UPDATE turn_requests SET dropped_at = now(), final_reaction = 'recalled'
          WHERE message_id = $1 AND turn_id IS NULL AND dropped_at IS NULL
         RETURNING receipt_reaction",
    )
    .bind(message_id)
    .fetch_optional(&mut *tx)
    .await?;
    let out = match dropped {
        Some(receipt_reaction) => RecallOutcome::Dropped { receipt_reaction },
        None => {
            let live: Option<i64> = sqlx::query_scalar(
                "SELECT t.id FROM turn_requests r JOIN turns t ON t.id = r.turn_id
                  WHERE r.message_id = $1 AND t.state IN ('running', 'awaiting_approval')
                  FOR UPDATE OF t",
            )
            .bind(message_id)
            .fetch_optional(&mut *tx)
            .await?;
            match live {
                Some(turn_id) => {
                    sqlx::query(
                        "UPDATE turns SET stop_requested_at = COALESCE(stop_requested_at, now()),
                                stop_requested_by = COALESCE(stop_requested_by, $2)
                          WHERE id = $1",
                    )
                    .bind(turn_id)
                    .bind(by)
                    .execute(&mut *tx)
                    .await?;
                    RecallOutcome::Stopping { turn_id }
                }
                None => RecallOutcome::Settled,
            }
        }
    };
    tx.commit().await?;
    Ok(out)
}

pub(super) async fn live_state(db: &PgPool, section: &str) -> sqlx::Result<Option<String>> {
    sqlx::query_scalar(
        "SELECT state FROM turns WHERE section_id = $1 AND state IN ('running', 'awaiting_approval')",
    )
    .bind(section)
    .fetch_optional(db)
    .await
}

/// A held claim on a section.
#[derive(Debug, Clone)]
pub(super) struct Lease {
    pub section: String,
    pub generation: i64,
}

/// Claims the pending section with the oldest work whose lease is free or expired, among the
/// sections `scope` covers, leaving alone a section whose call waits for approval
/// ([`super::call_approval::PARKED`]).
pub(super) async fn claim(
    db: &PgPool,
    holder: &str,
    lease: Duration,
    scope: &super::SectionFilter,
) -> sqlx::Result<Option<Lease>> {
    let (only, except) = match scope {
        super::SectionFilter::All => (None, None),
        super::SectionFilter::Only(s) => (Some(s.as_str()), None),
        super::SectionFilter::Except(prefix) => (None, Some(prefix.as_str())),
    };
    let row = sqlx::query(&format!(
        "UPDATE turn_sections s
            SET generation = s.generation + 1, holder = $1,
                lease_until = now() + make_interval(secs => $2)
          WHERE s.section_id = (
                SELECT c.section_id FROM turn_sections c
                 WHERE c.pending AND (c.holder IS NULL OR c.lease_until < now())
                   AND ($3::text IS NULL OR c.section_id = $3)
                   AND ($4::text IS NULL OR NOT starts_with(c.section_id, $4))
                   AND NOT {parked}
                 ORDER BY (SELECT min(r.id) FROM turn_requests r
                            WHERE r.section_id = c.section_id AND r.turn_id IS NULL
                              AND r.dropped_at IS NULL) NULLS FIRST
                 LIMIT 1 FOR UPDATE SKIP LOCKED)
         RETURNING s.section_id, s.generation",
        parked = super::call_approval::PARKED
    ))
    .bind(holder)
    .bind(lease.as_secs_f64())
    .bind(only)
    .bind(except)
    .fetch_optional(db)
    .await?;
    row.map(|r| {
        Ok(Lease {
            section: r.try_get(0)?,
            generation: r.try_get(1)?,
        })
    })
    .transpose()
}

/// What a heartbeat learnt.
#[derive(Debug, Clone, Copy)]
pub(super) struct Beat {
    /// False: the lease is gone (claimed by another runner).
    pub held: bool,
    pub stop_requested: bool,
}

/// Renews the lease and adds `spent` to the turn's budget use, in one statement.
pub(super) async fn heartbeat(
    db: &PgPool,
    lease: &Lease,
    ttl: Duration,
    turn_id: i64,
    spent: Duration,
) -> sqlx::Result<Beat> {
    let row = sqlx::query(
        "WITH held AS (
             UPDATE turn_sections SET lease_until = now() + make_interval(secs => $3)
              WHERE section_id = $1 AND generation = $2 RETURNING section_id),
         t AS (
             UPDATE turns SET spent_ms = spent_ms + $5
              WHERE id = $4 AND EXISTS (SELECT 1 FROM held)
              RETURNING stop_requested_at IS NOT NULL AS stop)
         SELECT EXISTS (SELECT 1 FROM held), COALESCE((SELECT stop FROM t), false)",
    )
    .bind(&lease.section)
    .bind(lease.generation)
    .bind(ttl.as_secs_f64())
    .bind(turn_id)
    .bind(spent.as_millis() as i64)
    .fetch_one(db)
    .await?;
    Ok(Beat {
        held: row.try_get(0)?,
        stop_requested: row.try_get(1)?,
    })
}

/// Gives the section back: free for any runner at once, still pending while work remains.
/// The pending flag is computed after the row lock is taken, in a statement of its own, so it
/// sees an enqueue that committed while we waited for the lock.
pub(super) async fn release(db: &PgPool, lease: &Lease) -> sqlx::Result<()> {
    let mut tx = db.begin().await?;
    let held: Option<i64> = sqlx::query_scalar(
        "SELECT generation FROM turn_sections WHERE section_id = $1 AND generation = $2 FOR UPDATE",
    )
    .bind(&lease.section)
    .bind(lease.generation)
    .fetch_optional(&mut *tx)
    .await?;
    if held.is_some() {
        // Claimable at once (pending, not parked): tell the runners now rather than at their
        // next poll — a decision on a parked call that arrived while this runner still held
        // the section found nothing to claim then.
        let claimable: bool = sqlx::query_scalar(&format!(
            "UPDATE turn_sections c SET holder = NULL, lease_until = NULL,
                    pending = EXISTS (SELECT 1 FROM turn_requests r WHERE r.section_id = $1
                                       AND r.turn_id IS NULL AND r.dropped_at IS NULL)
                           OR EXISTS (SELECT 1 FROM turns t WHERE t.section_id = $1
                                       AND t.state IN ('running', 'awaiting_approval'))
              WHERE c.section_id = $1 AND c.generation = $2
              RETURNING c.pending AND NOT {parked}",
            parked = super::call_approval::PARKED
        ))
        .bind(&lease.section)
        .bind(lease.generation)
        .fetch_one(&mut *tx)
        .await?;
        if claimable {
            sqlx::query("SELECT pg_notify($1, $2)")
                .bind(CHANNEL)
                .bind(&lease.section)
                .execute(&mut *tx)
                .await?;
        }
    }
    tx.commit().await
}

/// Resumes the section's running turn, or opens a new one with every waiting request (in
/// order, at most [`MAX_MESSAGES_PER_TURN`]). `None` when there is nothing to do.
pub(super) async fn open_turn(
    fence: &Fence,
    budget: Duration,
) -> Result<Option<ActiveTurn>, Fenced> {
    let mut tx = fence.begin().await?;
    // A turn whose call waits for a person is left alone (the section stays occupied).
    let parked: bool = sqlx::query_scalar(&format!(
        "SELECT {} FROM (SELECT $1::text AS section_id) c",
        super::call_approval::PARKED
    ))
    .bind(&fence.section)
    .fetch_one(&mut *tx)
    .await?;
    if parked {
        tx.commit().await?;
        return Ok(None);
    }
    // Resuming a turn that awaited an approval is not another attempt; one that was left
    // running (its runner went away) is.
    // (`RETURNING` sees the new row; the old state is read in a subquery.)
    let running = sqlx::query(
        "UPDATE turns t SET attempts = t.attempts + CASE WHEN t.state = 'running' THEN 1 ELSE 0 END,
                            state = 'running'
           FROM (SELECT id, state FROM turns WHERE section_id = $1
                    AND state IN ('running', 'awaiting_approval') FOR UPDATE) old
          WHERE t.id = old.id
         RETURNING t.id, t.chat_id, t.attempts, t.spent_ms, t.answered_at IS NOT NULL,
                   old.state = 'awaiting_approval'",
    )
    .bind(&fence.section)
    .fetch_optional(&mut *tx)
    .await?;
    let (id, chat_id, attempt, spent_ms, answered, awaited) = match running {
        Some(r) => (
            r.try_get::<i64, _>(0)?,
            r.try_get::<String, _>(1)?,
            r.try_get::<i32, _>(2)?,
            r.try_get::<i64, _>(3)?,
            r.try_get::<bool, _>(4)?,
            r.try_get::<bool, _>(5)?,
        ),
        None => {
            let mut waiting: Vec<(i64, String, Option<i64>)> = sqlx::query_as(
                "SELECT id, chat_id, schedule_id FROM turn_requests
                  WHERE section_id = $1 AND turn_id IS NULL AND dropped_at IS NULL
                  ORDER BY id LIMIT $2 FOR UPDATE",
            )
            .bind(&fence.section)
            .bind(MAX_MESSAGES_PER_TURN)
            .fetch_all(&mut *tx)
            .await?;
            // A schedule's firing is a turn of its own (its actor is the schedule's creator):
            // alone when it comes first, else the messages before it.
            let cut = match waiting.first() {
                Some((_, _, Some(_))) => 1,
                _ => waiting
                    .iter()
                    .position(|(_, _, s)| s.is_some())
                    .unwrap_or(waiting.len()),
            };
            waiting.truncate(cut);
            let Some((_, chat_id, _)) = waiting.last().cloned() else {
                tx.commit().await?;
                return Ok(None);
            };
            let id: i64 = sqlx::query_scalar(
                "INSERT INTO turns (section_id, chat_id, attempts) VALUES ($1, $2, 1) RETURNING id",
            )
            .bind(&fence.section)
            .bind(&chat_id)
            .fetch_one(&mut *tx)
            .await?;
            let ids: Vec<i64> = waiting.iter().map(|(id, _, _)| *id).collect();
            sqlx::query("UPDATE turn_requests SET turn_id = $1 WHERE id = ANY($2)")
                .bind(id)
                .bind(&ids)
                .execute(&mut *tx)
                .await?;
            (id, chat_id, 1, 0, false, false)
        }
    };
    let messages = sqlx::query(
        "SELECT id, message_id, sender, text, in_thread, schedule_id FROM turn_requests
          WHERE turn_id = $1 ORDER BY id",
    )
    .bind(id)
    .fetch_all(&mut *tx)
    .await?
    .into_iter()
    .map(|r| {
        Ok(TurnMessage {
            request_id: r.try_get(0)?,
            message_id: r.try_get(1)?,
            sender: r.try_get(2)?,
            text: r.try_get(3)?,
            in_thread: r.try_get(4)?,
            schedule_id: r.try_get(5)?,
        })
    })
    .collect::<sqlx::Result<Vec<_>>>()?;
    tx.commit().await?;
    let spent = Duration::from_millis(spent_ms.max(0) as u64);
    Ok(Some(ActiveTurn {
        id,
        section: fence.section.clone(),
        chat_id,
        messages,
        attempt,
        awaited,
        budget_left: budget.saturating_sub(spent),
        answered,
        fence: fence.clone(),
        cancel: TurnCancel::new(),
    }))
}

/// A write was refused: the section belongs to a newer claim, or the database failed.
#[derive(Debug, thiserror::Error)]
pub enum Fenced {
    #[error("this runner no longer holds the section (another runner claimed it)")]
    Lost,
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
}

/// Writes of one claim of a section: each transaction first checks, holding a share lock on
/// the section's row, that the section is still at the claim's generation. A claim by another
/// runner bumps the generation under an update lock, so after it no write of ours lands.
#[derive(Clone)]
pub struct Fence {
    db: PgPool,
    section: String,
    generation: i64,
}

impl Fence {
    pub(super) fn new(db: PgPool, lease: &Lease) -> Self {
        Self::at(db, &lease.section, lease.generation)
    }

    /// The fence of `section` as claimed at `generation` (writes pass only while it is current).
    pub fn at(db: PgPool, section: &str, generation: i64) -> Self {
        Fence {
            db,
            section: section.to_string(),
            generation,
        }
    }

    pub fn db(&self) -> &PgPool {
        &self.db
    }

    pub fn section(&self) -> &str {
        &self.section
    }

    pub fn generation(&self) -> i64 {
        self.generation
    }

    /// A transaction in which the claim is still valid (and stays so until it ends).
    pub async fn begin(&self) -> Result<Transaction<'static, Postgres>, Fenced> {
        let mut tx = self.db.begin().await?;
        let current: Option<i64> = sqlx::query_scalar(
            "SELECT generation FROM turn_sections WHERE section_id = $1 FOR SHARE",
        )
        .bind(&self.section)
        .fetch_optional(&mut *tx)
        .await?;
        if current != Some(self.generation) {
            return Err(Fenced::Lost);
        }
        Ok(tx)
    }

    /// Records that the final answer went out.
    pub async fn mark_answered(&self, turn_id: i64) -> Result<(), Fenced> {
        let mut tx = self.begin().await?;
        sqlx::query("UPDATE turns SET answered_at = now() WHERE id = $1 AND answered_at IS NULL")
            .bind(turn_id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Ends the turn; its section's next waiting requests may start.
    pub async fn finish_turn(
        &self,
        turn_id: i64,
        end: TurnEnd,
        outcome: &str,
    ) -> Result<(), Fenced> {
        let mut tx = self.begin().await?;
        sqlx::query(
            "UPDATE turns SET state = $2, outcome = $3, ended_at = now()
              WHERE id = $1 AND state IN ('running', 'awaiting_approval')",
        )
        .bind(turn_id)
        .bind(end.as_str())
        .bind(outcome)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }
}
