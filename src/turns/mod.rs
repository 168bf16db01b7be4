//! Durable agent turns: turn requests in Postgres (idempotent on the chat message id), one
//! running turn per section across every replica, leases with a heartbeat and a generation for
//! fencing, the `/stop` flag, and the wall-clock budget counted across resumes.
//!
//! The path of a request: [`enqueue`] stores it and marks its section pending; a [`Runner`] on
//! any replica claims a pending section whose lease is free or expired (bumping the section's
//! generation), resumes the section's running turn or opens a new one that takes *all* waiting
//! requests in order, and hands it to a [`TurnWork`] (the agent). While the work runs, the
//! heartbeat renews the lease, adds the time spent to the turn and reads the stop flag about
//! twice a second; a lost lease, a stop or a shutdown cancels the work's token with a
//! [`CancelReason`]. Every write the work makes goes through its [`Fence`], which refuses it
//! once the section has been claimed by someone else.
//!
//! A call waiting for a person's approval parks its turn ([`call_approval`]): the turn reads
//! `awaiting_approval` and the runner lets go of the section, which no runner claims until the
//! decision, the deadline or a `/stop`; the claim after that makes the turn `running` again.
//!
//! What a request brought besides its text — the messages it quoted, its images — is kept in
//! [`inputs`].
//!
//! Never: knows models, tools or chats (the work is injected); keeps a process-global registry
//! of who runs what (replicas share only the database).

pub mod call_approval;
pub mod inputs;
mod runner;
mod store;

pub use runner::{Runner, RunnerConfig};
pub use store::{Fence, Fenced};

use async_trait::async_trait;
use sqlx::PgPool;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// A chat message for the agent, as chat control hands it over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnRequest {
    /// `omt_…` (a thread) or `oc_…` (a chat's parent section).
    pub section: String,
    pub chat_id: String,
    /// The message's `om_…` id: the idempotency key, and what the answer replies to.
    pub message_id: String,
    /// The sender's open_id.
    pub sender: String,
    /// The message text with the leading @mention removed.
    pub text: String,
    /// Whether the message is in a thread (the answer then stays in it).
    pub in_thread: bool,
}

/// Which sections a [`Runner`] claims. Front-ends whose answers only they can deliver (the
/// terminal console) run their own runner for their sections, and the others leave them alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SectionFilter {
    All,
    /// Exactly this section.
    Only(String),
    /// Every section whose id does not start with this prefix.
    Except(String),
}

/// What [`enqueue`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Enqueued {
    /// The request's row id.
    pub id: i64,
    /// False when the message had been queued before (a redelivery).
    pub new: bool,
}

/// Stores `req` and marks its section pending; a second call for the same message id changes
/// nothing. Wakes runners on every replica with a notification (they poll anyway).
pub async fn enqueue(db: &PgPool, req: &TurnRequest) -> sqlx::Result<Enqueued> {
    store::enqueue(db, req, None).await
}

/// Queues a schedule's firing like [`enqueue`]; it runs as a turn of its own, never together
/// with people's messages.
pub async fn enqueue_scheduled(
    db: &PgPool,
    req: &TurnRequest,
    schedule_id: i64,
) -> sqlx::Result<Enqueued> {
    store::enqueue(db, req, Some(schedule_id)).await
}

/// What [`request_stop`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopOutcome {
    /// The running turn was asked to stop; its runner cancels it within about a second.
    /// `waiting` requests stay queued (a second `/stop` drops them).
    Stopping { turn_id: i64, waiting: i64 },
    /// A stop was already requested (or no turn ran): the waiting requests were dropped.
    DroppedWaiting { dropped: Vec<DroppedRequest> },
    /// Nothing ran and nothing waited.
    Idle,
}

/// A waiting request a second `/stop` dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DroppedRequest {
    pub message_id: String,
    /// Its receipt reaction, to take off.
    pub receipt_reaction: Option<String>,
}

/// `/stop` for `section`, by `by` (an open_id): the first stop cancels the running turn and
/// leaves waiting requests queued; a stop while a stop is pending, or when no turn runs, drops
/// the waiting requests. The flag lives in Postgres, so whichever replica runs the turn sees it.
pub async fn request_stop(db: &PgPool, section: &str, by: &str) -> sqlx::Result<StopOutcome> {
    store::request_stop(db, section, by).await
}

/// What a recall did to its message's request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecallOutcome {
    /// It was waiting: dropped, never to run (its receipt reaction, to take off).
    Dropped { receipt_reaction: Option<String> },
    /// Its turn was live: stopped as by `/stop`.
    Stopping { turn_id: i64 },
    /// No request, or its turn had ended.
    Settled,
}

/// A recalled message's request: dropped while it waits, its turn stopped while it runs (a
/// stop flag like `/stop`'s, by `by`), else nothing.
pub async fn recall_request(
    db: &PgPool,
    message_id: &str,
    by: &str,
) -> sqlx::Result<RecallOutcome> {
    store::recall_request(db, message_id, by).await
}

/// The state of `section`'s live turn — `running`, or [`call_approval::AWAITING`] while a call
/// waits for a person — if one is live.
pub async fn live_state(db: &PgPool, section: &str) -> sqlx::Result<Option<String>> {
    store::live_state(db, section).await
}

/// Why a turn's token was cancelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelReason {
    /// `/stop` in the chat.
    Stop,
    /// The turn's wall-clock budget ran out.
    Budget,
    /// This replica is shutting down; the turn resumes elsewhere.
    Shutdown,
    /// The lease was lost (another runner claimed the section, or renewals failed): stop at
    /// once, write nothing more.
    LeaseLost,
}

/// A turn's cancellation: a token and the first reason it was cancelled for.
#[derive(Clone, Default)]
pub struct TurnCancel {
    token: CancellationToken,
    reason: Arc<Mutex<Option<CancelReason>>>,
}

impl TurnCancel {
    pub fn new() -> Self {
        Self::default()
    }

    /// Cancels with `reason` unless already cancelled (the first reason wins).
    pub fn cancel(&self, reason: CancelReason) {
        let mut r = self.reason.lock().unwrap_or_else(|p| p.into_inner());
        if r.is_none() {
            *r = Some(reason);
        }
        drop(r);
        self.token.cancel();
    }

    pub fn reason(&self) -> Option<CancelReason> {
        *self.reason.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The token to hand to model calls and commands.
    pub fn token(&self) -> &CancellationToken {
        &self.token
    }
}

/// One message a turn answers, in the order it arrived.
#[derive(Debug, Clone)]
pub struct TurnMessage {
    pub request_id: i64,
    pub message_id: String,
    pub sender: String,
    pub text: String,
    pub in_thread: bool,
    /// The schedule whose firing this is (the turn has no other message then).
    pub schedule_id: Option<i64>,
}

/// A turn as the work sees it.
#[derive(Clone)]
pub struct ActiveTurn {
    pub id: i64,
    pub section: String,
    pub chat_id: String,
    /// The requests this turn answers, in order.
    pub messages: Vec<TurnMessage>,
    /// How many times the turn has been claimed (1 = first run, more = resumed); the claim
    /// after an approval wait is not counted.
    pub attempt: i32,
    /// Whether this claim resumes the turn after it awaited a person's approval.
    pub awaited: bool,
    /// Budget left when this runner took the turn.
    pub budget_left: Duration,
    /// Whether the final answer went out already (a resume after it only finishes up).
    pub answered: bool,
    /// Fenced writes for this turn's section.
    pub fence: Fence,
    pub cancel: TurnCancel,
}

/// How a turn ended, as the work reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TurnEnd {
    Done,
    Failed,
    Stopped,
    /// A bound hit (iterations, budget, repetition).
    Bounded,
}

impl TurnEnd {
    pub fn as_str(self) -> &'static str {
        match self {
            TurnEnd::Done => "done",
            TurnEnd::Failed => "failed",
            TurnEnd::Stopped => "stopped",
            TurnEnd::Bounded => "bounded",
        }
    }
}

/// The work a turn runner runs: the agent. It must store each step through the turn's fence
/// before starting the next, and end the turn with [`Fence::finish_turn`].
/// Returning without finishing (cancelled for shutdown or a lost lease, or an error) leaves the
/// turn running, to be resumed by whichever runner claims the section next.
#[async_trait]
pub trait TurnWork: Send + Sync + 'static {
    async fn run_turn(&self, turn: &ActiveTurn) -> anyhow::Result<()>;
}

/// Whether the request for `message_id` is settled: `None` when no such request exists,
/// `Some(true)` once it was dropped or the turn that took it has ended, `Some(false)` while it
/// waits or runs. (The terminal console waits on it to run piped lines in order.)
pub async fn request_settled(db: &PgPool, message_id: &str) -> sqlx::Result<Option<bool>> {
    sqlx::query_scalar(
        "SELECT r.dropped_at IS NOT NULL
                OR COALESCE(t.state NOT IN ('running', 'awaiting_approval'), false)
           FROM turn_requests r LEFT JOIN turns t ON t.id = r.turn_id
          WHERE r.message_id = $1",
    )
    .bind(message_id)
    .fetch_optional(db)
    .await
}

/// The latest message of `section`'s live turn: `(message_id, sender, in_thread)`.
pub async fn live_latest_message(
    db: &PgPool,
    section: &str,
) -> sqlx::Result<Option<(String, String, bool)>> {
    sqlx::query_as(
        "SELECT r.message_id, r.sender, r.in_thread FROM turns t
           JOIN turn_requests r ON r.turn_id = t.id
          WHERE t.section_id = $1 AND t.state IN ('running', 'awaiting_approval')
          ORDER BY r.id DESC LIMIT 1",
    )
    .bind(section)
    .fetch_optional(db)
    .await
}
