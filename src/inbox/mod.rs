//! The durable inbox: verified Lark events recorded in Postgres before they are acknowledged,
//! then claimed by workers (`FOR UPDATE SKIP LOCKED` plus a lease), retried with exponential
//! backoff and dead-lettered after too many failures. Knows nothing of event bodies beyond
//! their id, type, section and message id: what an event means is the [`Handler`]'s business,
//! which the app hands to [`spawn_workers`].
//!
//! **Order.** Events of one section are handled one at a time in recording order (`seq`, which
//! the INSERT assigns), across workers and replicas: a claim takes an event only when no older
//! unfinished event of its section exists, i.e. when it is its section's head (invariant 9).
//! With the head it takes the events queued behind it (a **run**, at most [`RUN_MAX`]), which
//! the same worker handles in order: only the head and its section are leased, and while the
//! section is held no one else can take the events behind it. Express events (`/stop`, card
//! actions) neither wait nor hold others. An event of a section is retried on a short schedule
//! only ([`SECTION_ATTEMPTS`]), then dead-lettered and the handler told, so a failing message
//! holds its section for about a minute, not hours. A message redelivered under a new event id
//! is recorded once (unique `message_id`).
//!
//! **Claimable heads.** `inbox_sections` holds one row per section with an unfinished ordered
//! event: where its head is (`floor`) and when it may next be claimed (`available_at`: the
//! head's time, or a lease's end while a worker holds the section). A write that records a
//! section's first unfinished event inserts the row and wakes a worker; a claim takes up to
//! [`SECTIONS_MAX`] due rows (`SKIP LOCKED`), each with its head and the run behind it, and
//! leases them; the worker handles the runs side by side (each in order) and lets go of the
//! sections with one statement ([`finish`]) that marks the runs done and moves each row to its
//! next head, or deletes it. A write in flight holds its sections' rows `FOR KEY SHARE`, and
//! letting go takes `FOR UPDATE` before it looks for the next head, so a row is never deleted
//! while an event it must lead is being recorded; batches commit in any order, so a write
//! lowers a floor that has passed its events.
//!
//! **Cost.** A claim reads the express and unsectioned events due now and the due rows of
//! `inbox_sections`, never a held (busy) section nor the events queued behind a head, so
//! neither a backlog in one chat nor many busy chats slow the claims of the others; a backlog
//! is handled a run per section per claim, with one statement leasing the runs of several
//! sections and one marking them done. A write wakes a worker only for an event a claim could
//! take at once (express, unsectioned, or a section's new head); an event queued behind a head
//! is taken by the worker that finishes the head, and the one-second poll covers the rest
//! (retries, leases). An inert event (one no handler acts on, [`NewEvent::inert`]) is written
//! done: no claim, no wake-up, no section row — only its INSERT, which still de-duplicates.
//!
//! **Durability.** A recorded event is durable before it is acknowledged. The workers' own
//! writes (claims, done and retry marks, hand-backs) commit without waiting for the WAL flush
//! (`synchronous_commit = off` on the workers' connections): a crash can lose only their last
//! fraction of a second, and each such loss is one the inbox already survives — a lost claim is
//! a lease that ran out, a lost done mark an event handled again (handlers are at-least-once,
//! as when marking it done fails). So a worker's commit costs no disk flush, and the workers do
//! not compete with acknowledgements for them.
//!
//! A claim moves the head's and its section's `available_at` to the end of its lease; if the
//! process dies, the
//! lease runs out and the run is claimed again from its head after restart (a run's events are
//! marked done together, after the last of them: the ones already handled are handled again,
//! told that they may be retries). On shutdown a worker hands back the event it is handling
//! and marks done what it finished before it.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::{PgPool, Row};
use tokio::sync::{Notify, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::clock::Clock;
use crate::config::InboxConfig;
use crate::metrics::Metrics;

/// How often an idle worker looks for due events (retries, expired leases) without a wake-up.
const POLL: Duration = Duration::from_secs(1);
/// Pause after a database error before the next claim.
const ERROR_PAUSE: Duration = Duration::from_secs(2);
/// First retry delay; doubles per attempt up to [`MAX_BACKOFF`].
const BASE_BACKOFF: Duration = Duration::from_secs(2);
const MAX_BACKOFF: Duration = Duration::from_secs(3600);
/// How often finished rows past the retention are deleted, and how many per statement / pass.
const CLEANUP_EVERY: Duration = Duration::from_secs(600);
const CLEANUP_BATCH: i64 = 1000;
const CLEANUP_MAX_BATCHES: usize = 50;
/// Attempts of an event that holds its section (it has one and is not express) before it is
/// dead-lettered: with [`backoff`] that is 2 + 4 + 8 + 16 s of retries, about half a minute.
pub const SECTION_ATTEMPTS: i32 = 5;
/// Longest `last_error` kept.
const ERROR_TEXT_MAX: usize = 500;
/// Most events written by one INSERT.
const MAX_BATCH: usize = 256;
/// Batched INSERTs in flight at once: while one waits for its commit, the next batch forms and
/// is written without waiting for it. Two, not more: each further one makes the batches
/// smaller and the commits more, and on two cores 2 acknowledged more than 4, and 4 more than
/// 8 (BENCHMARKS.md, "Events no one acts on, recorded done; two flush tasks").
const FLUSHERS: usize = 2;
/// Most callback requests admitted at once (see [`Inbox::admit`]), counted once their body is
/// in. At ten thousand events a second and a few milliseconds each, a few dozen are in
/// flight; this leaves room for a stall of a fraction of a second before the platform is told
/// to retry.
pub const ADMITTED_MAX: usize = 512;

/// An event to record, in the inbox's own terms: whoever receives events (the webhook, a
/// long connection) converts into it.
#[derive(Debug, Clone)]
pub struct NewEvent {
    /// The de-duplication key.
    pub event_id: String,
    pub event_type: String,
    /// The event as JSON text, stored as it is (secrets already removed).
    pub payload: String,
    /// The section (thread, else chat) the event belongs to, when it names one.
    pub section: Option<String>,
    /// The chat message it carries, if any: a redelivery under a new event id acts once.
    pub message_id: Option<String>,
    /// Handled without waiting for its section (`/stop`, card actions).
    pub express: bool,
    /// Needs no handling (a message a bot sent, an event type nothing handles): recorded as
    /// done — it de-duplicates its redeliveries and is kept as long as any done event — and
    /// never claimed, so it costs no worker anything and wakes none.
    pub inert: bool,
}

/// What the inbox runs on.
#[derive(Clone)]
pub struct InboxDeps {
    pub db: PgPool,
    pub clock: Arc<dyn Clock>,
    pub metrics: Arc<Metrics>,
    pub config: InboxConfig,
    /// Cancelled when the service begins shutting down: workers stop and hand back.
    pub shutdown: CancellationToken,
}

/// A claimed event.
#[derive(Debug, Clone)]
pub struct InboxEvent {
    pub event_id: String,
    pub event_type: String,
    /// The stored envelope (verification token already removed).
    pub payload: Value,
    /// Attempts including this one.
    pub attempts: i32,
    /// The section (thread or chat) it belongs to, when it names one.
    pub section: Option<String>,
    /// Handled without waiting for its section.
    pub express: bool,
    /// Recording order (assigned by the INSERT).
    pub seq: i64,
}

/// What the inbox hands its events to.
#[async_trait::async_trait]
pub trait Handler: Send + Sync {
    /// Handles one claimed event. An error means "retry later".
    async fn handle(&self, event: &InboxEvent) -> anyhow::Result<()>;
    /// Told once an event is dead-lettered (to let the user know); best effort.
    async fn dead_lettered(&self, event: &InboxEvent, error: &str);
}

/// The inbox's in-process side: admits callback requests up to a bound, wakes workers, and
/// coalesces concurrent [`record`] calls into multi-row INSERTs (one transaction, one WAL flush
/// each), so an acknowledgement costs a fraction of a commit under load and nothing extra when
/// idle.
///
/// Hand-written group commit: a request queues its event and, if fewer than [`FLUSHERS`] flush
/// tasks are running, starts one. A flush task writes whatever is queued, batch after batch,
/// until the queue is empty, then ends. No crate coalesces requests into one statement like
/// this.
/// The `reason` label counted when an event is refused because [`ADMITTED_MAX`] events are
/// already being recorded (the platform retries).
pub const SATURATED: &str = "saturated";

pub struct Inbox {
    deps: InboxDeps,
    /// The workers' connections: the same database with `synchronous_commit = off` (see
    /// the module's Durability).
    worker_db: PgPool,
    /// Wakes an idle worker when a new event is recorded (polling covers retries and leases).
    wake: Notify,
    /// Admission of callback requests: bounds the requests (queued events, waiting tasks)
    /// held at once; past it the callback answers 503 and the platform retries.
    admitted: tokio::sync::Semaphore,
    /// The app's task tracker: flush tasks run on it, so shutdown waits for a write in
    /// progress before the store is closed.
    tasks: TaskTracker,
    /// Events waiting for the next INSERT and the number of flush tasks running. One lock, so
    /// that "queue is empty, the flush task ends" and "event queued, a flush task is running"
    /// cannot interleave and strand an event.
    queue: std::sync::Mutex<Queue>,
}

struct Queue {
    /// Bounded by the admitted requests: one entry per admitted request at most.
    pending: Vec<Pending>,
    /// Flush tasks running, at most [`FLUSHERS`].
    flushers: usize,
}

struct Pending {
    env: NewEvent,
    at: DateTime<Utc>,
    done: oneshot::Sender<Result<bool, String>>,
}

impl Inbox {
    /// An inbox admitting at most `admitted` callback requests at once, running its flush
    /// tasks (and, once [`Inbox::spawn_workers`] is called, its workers) on `tasks`.
    pub fn new(deps: InboxDeps, admitted: usize, tasks: TaskTracker) -> Arc<Inbox> {
        let options = (*deps.db.connect_options())
            .clone()
            .options([("synchronous_commit", "off")]);
        let worker_db = sqlx::postgres::PgPoolOptions::new()
            .max_connections(deps.config.workers.clamp(1, 64) as u32 + 1)
            .connect_lazy_with(options);
        Arc::new(Inbox {
            worker_db,
            deps,
            wake: Notify::new(),
            admitted: tokio::sync::Semaphore::new(admitted),
            tasks,
            queue: std::sync::Mutex::new(Queue {
                pending: Vec::new(),
                flushers: 0,
            }),
        })
    }

    /// Admits one callback request, or `None` when the bound is reached. Hold the permit until
    /// the request is answered.
    pub fn admit(&self) -> Option<tokio::sync::SemaphorePermit<'_>> {
        self.admitted.try_acquire().ok()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Inbox {
    /// Records a verified event, durably, before returning. Returns `false` when the event id
    /// was already recorded (a redelivery), which must not be processed again.
    pub async fn record(self: &Arc<Self>, mut env: NewEvent) -> anyhow::Result<bool> {
        storable(&mut env);
        let (tx, rx) = oneshot::channel();
        let start_flusher = {
            let mut q = self.lock();
            q.pending.push(Pending {
                env,
                at: self.deps.clock.now(),
                done: tx,
            });
            let start = q.flushers < FLUSHERS;
            if start {
                q.flushers += 1;
            }
            start
        };
        if start_flusher {
            // A task of its own, so that a caller that goes away mid-write cannot abandon the
            // others' events; on the app's tracker, so that shutdown waits for it.
            self.tasks.spawn(flush(self.clone(), self.deps.db.clone()));
        }
        settle(rx.await)
    }

    /// The workers' pool (commits without waiting for the WAL flush).
    #[doc(hidden)]
    pub fn worker_pool(&self) -> &PgPool {
        &self.worker_db
    }

    /// Refreshes the inbox-depth gauge (called when metrics are scraped).
    pub async fn refresh_depth(&self) {
        let depth: Result<i64, _> =
            sqlx::query_scalar("SELECT count(*) FROM inbox_events WHERE state = 'pending'")
                .fetch_one(&self.deps.db)
                .await;
        if let Ok(d) = depth {
            self.deps.metrics.inbox_depth.set(d);
        }
    }

    /// Starts the workers and the retention cleanup on the inbox's tasks; they stop when the
    /// shutdown token is cancelled. Does nothing when workers are disabled
    /// (`SSHMODE_WORKERS_ENABLED=false`).
    pub fn spawn_workers(self: &Arc<Self>, handler: Arc<dyn Handler>) {
        if !self.deps.config.workers_enabled {
            tracing::warn!("inbox workers are disabled; events are recorded but not processed");
            return;
        }
        for n in 0..self.deps.config.workers {
            self.tasks.spawn(worker(self.clone(), handler.clone(), n));
        }
        self.tasks.spawn(cleanup_loop(self.clone()));
    }
}

/// One flush task: writes queued events, batch after batch, until the queue is empty.
async fn flush(inbox: Arc<Inbox>, db: PgPool) {
    let mut slot = FlusherSlot {
        inbox: &inbox,
        released: false,
    };
    loop {
        let batch: Vec<Pending> = {
            let mut q = slot.inbox.lock();
            if q.pending.is_empty() {
                q.flushers -= 1;
                slot.released = true;
                return;
            }
            let n = q.pending.len().min(MAX_BATCH);
            q.pending.drain(..n).collect()
        };
        write_batch(slot.inbox, &db, batch).await;
    }
}

/// Gives a flush task's slot back if the task ends without doing so itself (it was dropped),
/// so that the next [`record`] starts a new one for whatever is still queued.
struct FlusherSlot<'a> {
    inbox: &'a Inbox,
    released: bool,
}

impl Drop for FlusherSlot<'_> {
    fn drop(&mut self) {
        if !self.released {
            self.inbox.lock().flushers -= 1;
        }
    }
}

/// Turns a flush result into `record`'s answer.
fn settle(r: Result<Result<bool, String>, oneshot::error::RecvError>) -> anyhow::Result<bool> {
    r.map_err(|_| anyhow::anyhow!("the inbox write was abandoned"))?
        .map_err(|e| anyhow::anyhow!("inserting into the inbox: {e}"))
}

impl Inbox {
    /// Wakes one idle worker per event a write made claimable (at most one per section), and
    /// none for an event queued behind its section's head: that one is claimed after the head
    /// is done, by the worker that finishes it.
    fn woken(&self, claimable: usize) {
        self.wake_n(claimable);
    }

    /// Wakes an idle worker: an event was recorded outside [`Inbox::record`] ([`record_in`]).
    pub fn wake(&self) {
        self.wake_n(1);
    }

    fn wake_n(&self, claimable: usize) {
        for _ in 0..claimable {
            self.deps.metrics.inbox_wakeups.inc();
            self.wake.notify_one();
        }
    }
}

/// PostgreSQL's `text` and `jsonb` cannot hold U+0000, which JSON may carry (`\u0000`), and
/// one such value would fail the whole multi-row INSERT. It is stored as U+FFFD instead.
fn storable(env: &mut NewEvent) {
    fn clean(s: &mut String) {
        if s.contains('\0') {
            *s = s.replace('\0', "\u{FFFD}");
        }
    }
    clean(&mut env.event_id);
    clean(&mut env.event_type);
    if let Some(s) = env.section.as_mut() {
        clean(s);
    }
    if let Some(m) = env.message_id.as_mut() {
        clean(m);
    }
    storable_json(&mut env.payload);
}

/// Rewrites the escapes in JSON text that `jsonb` refuses as `\uFFFD`: `\u0000`, and a
/// `\uD800`–`\uDFFF` that is not half of a surrogate pair (a JSON parser that only skips
/// strings lets both through). Raw control characters cannot occur in valid JSON, so nothing
/// else in the text can hold U+0000.
fn storable_json(text: &mut String) {
    if !text.contains("\\u") {
        return;
    }
    fn hex4(b: &[u8]) -> Option<u16> {
        let digits = b.get(..4)?;
        digits.iter().try_fold(0u16, |n, d| {
            Some(n << 4 | (*d as char).to_digit(16)? as u16)
        })
    }
    let mut b = std::mem::take(text).into_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'\\' {
            i += 1;
            continue;
        }
        // An escape: `\\`, `\"` … are two bytes, `\uXXXX` six.
        if b.get(i + 1) != Some(&b'u') {
            i += 2;
            continue;
        }
        let Some(code) = hex4(&b[i + 2..]) else {
            i += 2;
            continue;
        };
        let low_follows = || {
            b.get(i + 6) == Some(&b'\\')
                && b.get(i + 7) == Some(&b'u')
                && hex4(&b[i + 8..]).is_some_and(|c| (0xDC00..=0xDFFF).contains(&c))
        };
        match code {
            0xD800..=0xDBFF if low_follows() => i += 12,
            0 | 0xD800..=0xDFFF => {
                b[i + 2..i + 6].copy_from_slice(b"FFFD");
                i += 6;
            }
            _ => i += 6,
        }
    }
    // Only ASCII hex digits were replaced by ASCII hex digits.
    *text = String::from_utf8(b).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into());
}

/// Writes a batch with one INSERT; if the database refuses it, row by row, so that one row it
/// refuses fails only its own request. (A batch that fails for want of a connection fails
/// whole: one row at a time would not fare better, only slower.)
async fn write_batch(inbox: &Inbox, db: &PgPool, batch: Vec<Pending>) {
    if batch.len() == 1 {
        return insert(inbox, db, batch).await;
    }
    match try_insert(db, &batch).await {
        Ok(rows) => answer(inbox, batch, rows),
        Err(e @ sqlx::Error::Database(_)) => {
            tracing::warn!(error = %e, rows = batch.len(), "a batched inbox write was refused; writing its rows one by one");
            for p in batch {
                insert(inbox, db, vec![p]).await;
            }
        }
        Err(e) => refuse(batch, &e),
    }
}

/// One INSERT for `batch`, each request answered with its outcome.
async fn insert(inbox: &Inbox, db: &PgPool, batch: Vec<Pending>) {
    match try_insert(db, &batch).await {
        Ok(rows) => answer(inbox, batch, rows),
        Err(e) => refuse(batch, &e),
    }
}

fn refuse(batch: Vec<Pending>, e: &sqlx::Error) {
    let msg = e.to_string();
    for p in batch {
        let _ = p.done.send(Err(msg.clone()));
    }
}

/// A row an INSERT wrote, and whether a claim could take it at once: express or without a
/// section, or the head of a section the write made claimable (it inserted the section's row
/// in `inbox_sections`). Of a section's rows in one batch only the first can be its head.
#[derive(sqlx::FromRow)]
struct Inserted {
    event_id: String,
    /// Recorded as done (inert).
    inert: bool,
    /// The section, for an ordered event (not express).
    ordered_in: Option<String>,
    claimable: bool,
}

/// Wakes a worker for each event of the batch a claim could take at once — each claimable free
/// event, and each section whose head the batch wrote — then answers each request of `batch`.
fn answer(inbox: &Inbox, batch: Vec<Pending>, inserted: Vec<Inserted>) {
    let mut sections = HashSet::new();
    let mut claimable = 0;
    // The first of several equal ids in one batch is the fresh one.
    let mut fresh = HashSet::new();
    for row in inserted {
        if row.inert {
            inbox.deps.metrics.events_inert.inc();
        }
        if row.claimable && row.ordered_in.is_none_or(|s| sections.insert(s)) {
            claimable += 1;
        }
        fresh.insert(row.event_id);
    }
    inbox.woken(claimable);
    for p in batch {
        let f = fresh.remove(&p.env.event_id);
        let _ = p.done.send(Ok(f));
    }
}

/// A batch's rows, inserted (`$1`…`$8`: ids, types, payloads, times, sections, message ids,
/// express, inert). The payloads go as the JSON text the callback verified, which PostgreSQL
/// parses once, into `jsonb`. `seq` follows the order of the rows (WITH ORDINALITY), so
/// recording order is the order the requests were queued. Any unique conflict (event id, or a
/// message id seen before) is a redelivery. An inert event is written done (finished when
/// received): it never needs a head, a claim or a wake-up.
macro_rules! insert_batch {
    () => {
        "INSERT INTO inbox_events
             (event_id, event_type, payload, received_at, available_at, section, message_id, express,
              state, finished_at)
         SELECT i, t, p::jsonb, a, a, s, m, x, CASE WHEN d THEN 'done' ELSE 'pending' END,
             CASE WHEN d THEN a END
         FROM UNNEST($1::text[], $2::text[], $3::text[], $4::timestamptz[], $5::text[],
             $6::text[], $7::bool[], $8::bool[])
             WITH ORDINALITY AS u(i, t, p, a, s, m, x, d, n)
         ORDER BY n
         ON CONFLICT DO NOTHING"
    };
}

/// Records a batch with ordered events. Each section the batch writes ordered events to gets
/// its row in `inbox_sections` (the claimable heads): held `FOR KEY SHARE` if it is there, so
/// that `inbox_finish` waits for this write before it looks for the section's next head;
/// inserted, with the batch's first event as the head, if not — which makes the section
/// claimable and wakes a worker. (Two writes creating one section's row meet in the
/// `ON CONFLICT` branch, which keeps the lower floor and wakes no one.) Batches commit in any
/// order, so a row's floor may already have passed this batch's events (a hand-over that could
/// not see them yet, even one that ran between this statement's INSERT and its lock): it is
/// lowered to them, or they would never be found. The floor compared is the one `kept` locked
/// (the row's latest version), not the one of this statement's snapshot.
const RECORD: &str = concat!(
    "WITH n AS (",
    insert_batch!(),
    " RETURNING event_id, section, seq, express, available_at, state = 'done' AS inert),
         firsts AS (SELECT DISTINCT ON (section) section, seq, available_at FROM n
             WHERE NOT express AND NOT inert AND section IS NOT NULL ORDER BY section, seq),
         kept AS MATERIALIZED (SELECT s.section, s.floor FROM inbox_sections s
             WHERE s.section IN (SELECT section FROM firsts) ORDER BY s.section FOR KEY SHARE),
         lowered AS (UPDATE inbox_sections s SET floor = LEAST(s.floor, f.seq)
             FROM kept k JOIN firsts f ON f.section = k.section
             WHERE s.section = k.section AND k.floor > f.seq),
         made AS (INSERT INTO inbox_sections (section, floor, available_at)
             SELECT f.section, f.seq, f.available_at FROM firsts f
             WHERE f.section NOT IN (SELECT section FROM kept) ORDER BY f.section
             ON CONFLICT (section) DO UPDATE SET floor = LEAST(inbox_sections.floor, EXCLUDED.floor)
             RETURNING section, xmax = 0 AS fresh)
         SELECT n.event_id, n.inert, CASE WHEN NOT n.express THEN n.section END AS ordered_in,
             NOT n.inert AND (n.express OR n.section IS NULL
                 OR EXISTS (SELECT 1 FROM made m JOIN firsts f ON f.section = m.section
                            WHERE m.section = n.section AND m.fresh AND f.seq = n.seq)) AS claimable
         FROM n"
);

/// Records a batch without ordered events: every row it writes that is not inert (express or
/// unsectioned) is claimable at once.
const RECORD_FREE: &str = concat!(
    insert_batch!(),
    " RETURNING event_id, state = 'done' AS inert, NULL::text AS ordered_in,
         state = 'pending' AS claimable"
);

async fn try_insert(db: &PgPool, batch: &[Pending]) -> Result<Vec<Inserted>, sqlx::Error> {
    let ids: Vec<&str> = batch.iter().map(|p| p.env.event_id.as_str()).collect();
    let types: Vec<&str> = batch.iter().map(|p| p.env.event_type.as_str()).collect();
    let payloads: Vec<&str> = batch.iter().map(|p| p.env.payload.as_str()).collect();
    let ats: Vec<DateTime<Utc>> = batch.iter().map(|p| p.at).collect();
    let sections: Vec<Option<&str>> = batch.iter().map(|p| p.env.section.as_deref()).collect();
    let messages: Vec<Option<&str>> = batch.iter().map(|p| p.env.message_id.as_deref()).collect();
    let express: Vec<bool> = batch.iter().map(|p| p.env.express).collect();
    let inert: Vec<bool> = batch.iter().map(|p| p.env.inert).collect();
    // A batch that writes no ordered event (each is inert, express or unsectioned) touches no
    // section's row: it is the INSERT alone.
    let ordered = batch
        .iter()
        .any(|p| !p.env.inert && !p.env.express && p.env.section.is_some());
    sqlx::query_as(if ordered { RECORD } else { RECORD_FREE })
        .bind(&ids)
        .bind(&types)
        .bind(&payloads)
        .bind(&ats)
        .bind(&sections)
        .bind(&messages)
        .bind(&express)
        .bind(&inert)
        .fetch_all(db)
        .await
}

/// Records one event in the caller's transaction (a schedule's firing, written with the
/// schedule's next due time), ordered in its section like any other. Returns `false` when its
/// id (or its message id) was recorded before. Call [`Inbox::wake`] after the commit, or the
/// workers' poll finds it.
pub async fn record_in(
    conn: &mut sqlx::PgConnection,
    ev: &NewEvent,
    at: DateTime<Utc>,
) -> sqlx::Result<bool> {
    let mut ev = ev.clone();
    storable(&mut ev);
    let ordered = !ev.inert && !ev.express && ev.section.is_some();
    let rows: Vec<Inserted> = sqlx::query_as(if ordered { RECORD } else { RECORD_FREE })
        .bind([ev.event_id.as_str()])
        .bind([ev.event_type.as_str()])
        .bind([ev.payload.as_str()])
        .bind([at])
        .bind([ev.section.as_deref()])
        .bind([ev.message_id.as_deref()])
        .bind([ev.express])
        .bind([ev.inert])
        .fetch_all(conn)
        .await?;
    Ok(!rows.is_empty())
}

/// The claim: an express or unsectioned due event (oldest first) if there is one, else up to
/// `$4` due sections from `inbox_sections` (the claimable heads, oldest first, `SKIP LOCKED`)
/// and, for each, its head (its first unfinished ordered event from the row's `floor` on) and
/// the events queued behind it (a **run**: at most `$3` behind it, in `seq` order, stopping
/// before the first one not due). The section's row and its head are leased (until `$2`, the
/// head's `attempts` bumped): the events behind it cannot be claimed by anyone while the
/// section is held, so they need no write of their own — the worker that holds it handles
/// them in order and lets go of the section with `inbox_finish`, which marks the run done and
/// moves the row to the next head. A follower's `attempts` is reported as one more than the
/// larger of its own and its head's count: when the head is being retried (a lease that ran
/// out, a hand-back), the events behind it may have been handled already, and the handler is
/// told so.
///
/// A section whose head is not due (a retry's backoff) is not taken: its row moves to the
/// head's time. A row without an unfinished event (its events finished by other means) is
/// taken with no events, so that the worker's `inbox_finish` deletes it.
///
/// Each branch reads only its own candidates: the free events through `inbox_events_free`,
/// the due sections through `inbox_sections_due` (a held section's row has its lease's end
/// there, so busy sections are not read at all), each head and run through `(section, seq)`
/// from the row's floor (a `LATERAL` limit, so the scan stops after the run). None passes the
/// events queued behind another section's head. The sections branch runs only when the first
/// found nothing.
const CLAIM: &str = "WITH free AS (SELECT f.event_id FROM inbox_events f
        WHERE f.state = 'pending' AND (f.express OR f.section IS NULL) AND f.available_at <= $1
        ORDER BY f.available_at LIMIT 1 FOR UPDATE SKIP LOCKED),
    cand AS MATERIALIZED (SELECT s.section, s.floor FROM inbox_sections s
        WHERE NOT EXISTS (SELECT 1 FROM free) AND s.available_at <= $1
        ORDER BY s.available_at LIMIT $4 FOR NO KEY UPDATE SKIP LOCKED),
    heads AS MATERIALIZED (SELECT c.section, h.event_id, h.seq, h.attempts, h.available_at
        FROM cand c LEFT JOIN LATERAL (
            SELECT e.event_id, e.seq, e.attempts, e.available_at FROM inbox_events e
            WHERE e.section = c.section AND e.seq >= c.floor AND e.state = 'pending' AND NOT e.express
            ORDER BY e.seq LIMIT 1) h ON true),
    held AS (UPDATE inbox_sections s
        SET available_at = CASE WHEN h.available_at > $1 THEN h.available_at ELSE $2 END
        FROM heads h WHERE s.section = h.section),
    leased AS (UPDATE inbox_events e SET attempts = e.attempts + 1, available_at = $2
        WHERE e.event_id = ANY (ARRAY(SELECT event_id FROM free
                                      UNION ALL SELECT event_id FROM heads WHERE available_at <= $1))
        RETURNING e.event_id, e.event_type, e.payload, e.attempts, e.section, e.express, e.seq)
    SELECT event_id, event_type, payload, attempts, section, express, seq FROM leased
    UNION ALL
    SELECT q.event_id, q.event_type, q.payload, q.attempts, q.section, q.express, q.seq FROM (
        SELECT r.event_id, r.event_type, r.payload, GREATEST(r.attempts, h.attempts) + 1 AS attempts,
               r.section, r.express, r.seq,
               bool_and(r.available_at <= $1) OVER (PARTITION BY r.section ORDER BY r.seq) AS due
        FROM heads h CROSS JOIN LATERAL (
            SELECT * FROM inbox_events b
            WHERE b.section = h.section AND b.seq > h.seq AND b.state = 'pending' AND NOT b.express
            ORDER BY b.seq LIMIT $3) r
        WHERE h.available_at <= $1) q
    WHERE q.due
    UNION ALL
    SELECT NULL, NULL, NULL, NULL, section, false, NULL FROM heads WHERE event_id IS NULL
    ORDER BY seq";

/// Most events one claim takes per section: a section's head and up to this many minus one
/// queued behind it. Bounds the rows a claim returns and the done marks one statement writes.
pub const RUN_MAX: usize = 64;
/// Most sections one claim takes (their runs are handled side by side, each in order).
pub const SECTIONS_MAX: usize = 16;
/// A run starts no further event once it has lasted this long (nor once the head's lease could
/// run out within a handler's budget), so the done marks it holds wait no longer than this
/// plus one handler.
const RUN_TIME: Duration = Duration::from_millis(500);

/// What one claim took: the events (a free event alone, or the runs of several sections, each
/// in `seq` order) and the sections it holds, which [`finish`] must let go of.
#[derive(Debug, Default)]
pub struct Claimed {
    pub events: Vec<InboxEvent>,
    pub sections: Vec<String>,
}

/// Claims the oldest due event whose section has no older unfinished event (express events
/// never wait), leasing it until `now + lease`: [`CLAIM`], for one event.
pub async fn claim(
    pool: &PgPool,
    now: DateTime<Utc>,
    lease: Duration,
) -> sqlx::Result<Option<InboxEvent>> {
    Ok(claim_run(pool, now, lease, 1).await?.into_iter().next())
}

/// Claims a run: a free event alone, or one due section's head (leased until `now + lease`)
/// and up to `max - 1` events queued behind it, in order ([`CLAIM`]). Empty when nothing is
/// due.
pub async fn claim_run(
    pool: &PgPool,
    now: DateTime<Utc>,
    lease: Duration,
    max: usize,
) -> sqlx::Result<Vec<InboxEvent>> {
    Ok(claim_batch(pool, now, lease, max, 1).await?.events)
}

/// Claims a free event, or the runs (at most `max` events each) of up to `sections` due
/// sections ([`CLAIM`]). Its cost grows with the sections it takes and their runs, not with
/// the busy sections nor the events queued behind their heads; `SKIP LOCKED` lets workers and
/// replicas claim side by side.
pub async fn claim_batch(
    pool: &PgPool,
    now: DateTime<Utc>,
    lease: Duration,
    max: usize,
    sections: usize,
) -> sqlx::Result<Claimed> {
    let until = now + chrono::Duration::from_std(lease).unwrap_or(chrono::Duration::hours(1));
    let behind = max.clamp(1, RUN_MAX) as i64 - 1;
    let rows = sqlx::query(CLAIM)
        .bind(now)
        .bind(until)
        .bind(behind)
        .bind(sections.clamp(1, SECTIONS_MAX) as i64)
        .fetch_all(pool)
        .await?;
    let mut out = Claimed::default();
    for r in rows {
        let section: Option<String> = r.try_get("section")?;
        let express: bool = r.try_get("express")?;
        if let Some(s) = section.as_ref().filter(|_| !express)
            && !out.sections.contains(s)
        {
            out.sections.push(s.clone());
        }
        let Some(event_id) = r.try_get::<Option<String>, _>("event_id")? else {
            continue;
        };
        out.events.push(InboxEvent {
            event_id,
            event_type: r.try_get("event_type")?,
            payload: r.try_get("payload")?,
            attempts: r.try_get("attempts")?,
            section,
            express,
            seq: r.try_get("seq")?,
        });
    }
    Ok(out)
}

/// The text of the claim's statement (`$1` now, `$2` the lease's end, `$3` the most events
/// taken behind a head, `$4` the most sections), for plans and benchmarks.
#[doc(hidden)]
pub fn claim_sql() -> &'static str {
    CLAIM
}

/// Writes the `inbox_sections` rows (claimable heads) of the sections with unfinished ordered
/// events that have none: for events written into `inbox_events` directly, by tests and
/// benchmarks, as the migration that made the table did. The service's own writes keep the
/// rows themselves.
#[doc(hidden)]
pub async fn index_sections(pool: &PgPool) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO inbox_sections (section, floor, available_at)
         SELECT DISTINCT ON (section) section, seq, available_at FROM inbox_events
         WHERE state = 'pending' AND NOT express AND section IS NOT NULL
         ORDER BY section, seq
         ON CONFLICT (section) DO UPDATE SET floor = LEAST(inbox_sections.floor, EXCLUDED.floor)",
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// The same ordered claim written as `NOT EXISTS (an older unfinished event of the same
/// section)`, probed per candidate: kept for the claim benchmark, which compares the two.
#[doc(hidden)]
pub async fn claim_not_exists(
    pool: &PgPool,
    now: DateTime<Utc>,
    lease: Duration,
) -> sqlx::Result<Option<String>> {
    let until = now + chrono::Duration::from_std(lease).unwrap_or(chrono::Duration::hours(1));
    sqlx::query_scalar(
        "UPDATE inbox_events e SET attempts = e.attempts + 1, available_at = $2
         FROM (SELECT c.event_id FROM inbox_events c
               WHERE c.state = 'pending' AND c.available_at <= $1
                 AND (c.express OR c.section IS NULL OR NOT EXISTS (
                     SELECT 1 FROM inbox_events o
                     WHERE o.section = c.section AND o.seq < c.seq
                       AND o.state = 'pending' AND NOT o.express))
               ORDER BY c.available_at LIMIT 1 FOR UPDATE SKIP LOCKED) c
         WHERE e.event_id = c.event_id RETURNING e.event_id",
    )
    .bind(now)
    .bind(until)
    .fetch_optional(pool)
    .await
}

/// The claim before events had sections: the oldest due event, in no order per section. Kept
/// for the claim benchmark only.
#[doc(hidden)]
pub async fn claim_unordered(
    pool: &PgPool,
    now: DateTime<Utc>,
    lease: Duration,
) -> sqlx::Result<Option<String>> {
    let until = now + chrono::Duration::from_std(lease).unwrap_or(chrono::Duration::hours(1));
    sqlx::query_scalar(
        "UPDATE inbox_events e SET attempts = e.attempts + 1, available_at = $2
         FROM (SELECT event_id FROM inbox_events
               WHERE state = 'pending' AND available_at <= $1
               ORDER BY available_at LIMIT 1 FOR UPDATE SKIP LOCKED) c
         WHERE e.event_id = c.event_id RETURNING e.event_id",
    )
    .bind(now)
    .bind(until)
    .fetch_optional(pool)
    .await
}

/// Marks a claimed event done and, if it holds a section, lets go of the section
/// ([`finish`]).
pub async fn complete(pool: &PgPool, event_id: &str, now: DateTime<Utc>) -> sqlx::Result<()> {
    complete_run(pool, &[(event_id.to_string(), 0)], now).await
}

/// Marks the handled events of a run done in one statement, each with the attempts it was
/// handled as (a follower's count is written here: its claim wrote nothing), and lets go of
/// their sections ([`finish`]).
pub async fn complete_run(
    pool: &PgPool,
    handled: &[(String, i32)],
    now: DateTime<Utc>,
) -> sqlx::Result<()> {
    let ids: Vec<&str> = handled.iter().map(|(id, _)| id.as_str()).collect();
    let sections: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT section FROM inbox_events
         WHERE event_id = ANY ($1) AND NOT express AND section IS NOT NULL",
    )
    .bind(&ids)
    .fetch_all(pool)
    .await?;
    finish(pool, handled, &sections, now).await
}

/// Marks `handled` done (each with the attempts it was handled as) and lets go of the
/// `sections` a claim took, in one statement (`inbox_finish`): each section's row moves to its
/// next unfinished event, or is deleted when it has none. Only the worker holding a section
/// may let go of it.
pub async fn finish(
    pool: &PgPool,
    handled: &[(String, i32)],
    sections: &[String],
    now: DateTime<Utc>,
) -> sqlx::Result<()> {
    if handled.is_empty() && sections.is_empty() {
        return Ok(());
    }
    let ids: Vec<&str> = handled.iter().map(|(id, _)| id.as_str()).collect();
    let attempts: Vec<i32> = handled.iter().map(|(_, n)| *n).collect();
    sqlx::query("SELECT inbox_finish($1, $2, $3, $4)")
        .bind(&ids)
        .bind(&attempts)
        .bind(sections)
        .bind(now)
        .execute(pool)
        .await?;
    Ok(())
}

/// What became of a failed event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failed {
    /// Will be retried at the given time.
    Retry(DateTime<Utc>),
    /// Out of attempts: dead-lettered.
    Dead,
}

/// Records a failed attempt: schedules a retry with exponential backoff, or dead-letters the
/// event once `max_attempts` are used up. The event's attempts are counted as it was handled
/// (a run's follower was not counted when it was claimed).
pub async fn fail(
    pool: &PgPool,
    event: &InboxEvent,
    error: &str,
    now: DateTime<Utc>,
    max_attempts: i32,
) -> sqlx::Result<Failed> {
    let retry_at = now + chrono::Duration::from_std(backoff(event.attempts)).unwrap_or_default();
    let error: String = error.chars().take(ERROR_TEXT_MAX).collect();
    let dead: bool = sqlx::query_scalar(
        "UPDATE inbox_events SET last_error = $2,
                attempts = GREATEST(attempts, $6),
                state = CASE WHEN GREATEST(attempts, $6) >= $3 THEN 'dead' ELSE 'pending' END,
                finished_at = CASE WHEN GREATEST(attempts, $6) >= $3 THEN $5 ELSE NULL END,
                available_at = $4
         WHERE event_id = $1 RETURNING state = 'dead'",
    )
    .bind(&event.event_id)
    .bind(error)
    .bind(max_attempts)
    .bind(retry_at)
    .bind(now)
    .bind(event.attempts)
    .fetch_optional(pool)
    .await?
    .unwrap_or(false);
    Ok(if dead {
        Failed::Dead
    } else {
        Failed::Retry(retry_at)
    })
}

/// Returns a claimed event unprocessed (shutdown): due at once. The attempt stays counted:
/// the handler may have done part of its work, so the next run must know it is a retry.
pub async fn hand_back(pool: &PgPool, event_id: &str, now: DateTime<Utc>) -> sqlx::Result<()> {
    hand_back_counted(pool, event_id, 0, now).await
}

/// [`hand_back`], writing the attempts the event was handled as (a run's follower was not
/// counted when it was claimed).
async fn hand_back_counted(
    pool: &PgPool,
    event_id: &str,
    attempts: i32,
    now: DateTime<Utc>,
) -> sqlx::Result<()> {
    sqlx::query(
        "UPDATE inbox_events SET available_at = $2, attempts = GREATEST(attempts, $3)
         WHERE event_id = $1 AND state = 'pending'",
    )
    .bind(event_id)
    .bind(now)
    .bind(attempts)
    .execute(pool)
    .await?;
    Ok(())
}

/// Deletes up to `limit` finished rows (done or dead) finished before `before`. Returns how
/// many.
pub async fn cleanup(pool: &PgPool, before: DateTime<Utc>, limit: i64) -> sqlx::Result<u64> {
    Ok(sqlx::query(
        "DELETE FROM inbox_events WHERE event_id IN (
             SELECT event_id FROM inbox_events
             WHERE state IN ('done', 'dead') AND finished_at < $1 LIMIT $2)",
    )
    .bind(before)
    .bind(limit)
    .execute(pool)
    .await?
    .rows_affected())
}

/// Retry delay after `attempts` failed attempts: 2 s, 4 s, 8 s … capped at an hour.
pub fn backoff(attempts: i32) -> Duration {
    let exp = attempts.saturating_sub(1).clamp(0, 20) as u32;
    BASE_BACKOFF
        .saturating_mul(2u32.saturating_pow(exp))
        .min(MAX_BACKOFF)
}

async fn worker(inbox: Arc<Inbox>, handler: Arc<dyn Handler>, n: usize) {
    let d = &inbox.deps;
    let shutdown = d.shutdown.clone();
    tracing::debug!(inbox.worker = n, "inbox worker started");
    while !shutdown.is_cancelled() {
        let lease = d.config.lease;
        let claimed = claim_batch(
            &inbox.worker_db,
            d.clock.now(),
            lease,
            RUN_MAX,
            SECTIONS_MAX,
        )
        .await;
        match claimed {
            Ok(c) if !(c.events.is_empty() && c.sections.is_empty()) => {
                handle_claimed(&inbox, handler.as_ref(), c).await
            }
            Ok(_) => {
                tokio::select! {
                    _ = inbox.wake.notified() => {}
                    _ = tokio::time::sleep(POLL) => {}
                    _ = shutdown.cancelled() => {}
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "claiming from the inbox failed");
                tokio::select! {
                    _ = tokio::time::sleep(ERROR_PAUSE) => {}
                    _ = shutdown.cancelled() => {}
                }
            }
        }
    }
    tracing::debug!(inbox.worker = n, "inbox worker stopped");
}

/// Handles what one claim took: each section's run (or the free event) in order, the runs of
/// different sections side by side; then marks every handled event done and lets go of the
/// sections in one statement ([`finish`]). A section whose run could not record a failure or
/// hand-back is not let go of: its lease runs out and the run is handled again from its head.
async fn handle_claimed(inbox: &Inbox, handler: &dyn Handler, claimed: Claimed) {
    let d = &inbox.deps;
    let mut runs: Vec<Vec<InboxEvent>> = Vec::new();
    for event in claimed.events {
        let same = |r: &&mut Vec<InboxEvent>| {
            !event.express && event.section.is_some() && r[0].section == event.section
        };
        match runs.iter_mut().find(same) {
            Some(run) => run.push(event),
            None => runs.push(vec![event]),
        }
    }
    let outcomes =
        futures_util::future::join_all(runs.iter().map(|run| handle_run(inbox, handler, run)))
            .await;
    let mut handled = Vec::new();
    let mut abandoned = HashSet::new();
    for (run, outcome) in runs.iter().zip(outcomes) {
        match outcome {
            Some(done) => handled.extend(done),
            None => {
                abandoned.extend(run[0].section.clone());
            }
        }
    }
    let release: Vec<String> = claimed
        .sections
        .into_iter()
        .filter(|s| !abandoned.contains(s))
        .collect();
    if let Err(e) = finish(&inbox.worker_db, &handled, &release, d.clock.now()).await {
        // The sections' leases run out and their runs are handled again; nothing is lost.
        tracing::error!(events = handled.len(), error = %e, "marking events done failed");
    }
}

/// Handles a claimed run in order, one event after another, and returns the events it handled
/// (with the attempts each was handled as), or `None` when recording a failure or hand-back
/// failed. It stops early at a failure (that event is retried or dead-lettered, and the events
/// behind it wait for it, as their section's head), at shutdown (that event is handed back), or
/// when [`RUN_TIME`] has passed or the head's lease could run out within a handler's budget
/// (the rest stay queued, for the next claim). A failed or handed-back event is written before
/// the done marks, so the section's head stays unfinished until then; if the process dies
/// first, the lease runs out and the run is handled again from its head, in order.
async fn handle_run(
    inbox: &Inbox,
    handler: &dyn Handler,
    run: &[InboxEvent],
) -> Option<Vec<(String, i32)>> {
    let d = &inbox.deps;
    let db = &inbox.worker_db;
    let lease = d.config.lease;
    // A handler must finish well inside its lease, or another worker could take the event.
    let budget = lease.mul_f64(0.9);
    let last_start = RUN_TIME.min(lease.saturating_sub(budget));
    let started = tokio::time::Instant::now();
    let mut handled: Vec<(String, i32)> = Vec::with_capacity(run.len());
    for (i, event) in run.iter().enumerate() {
        if i > 0 && (started.elapsed() >= last_start || d.shutdown.is_cancelled()) {
            break;
        }
        let outcome = tokio::select! {
            r = tokio::time::timeout(budget, handler.handle(event)) => {
                Some(r.unwrap_or_else(|_| Err(anyhow::anyhow!("handler ran out of time"))))
            }
            _ = d.shutdown.cancelled() => None,
        };
        let now = d.clock.now();
        let stored = match outcome {
            Some(Ok(())) => {
                d.metrics.events_processed.inc();
                handled.push((event.event_id.clone(), event.attempts));
                continue;
            }
            None => hand_back_counted(db, &event.event_id, event.attempts, now).await,
            Some(Err(e)) => failed(inbox, handler, event, &format!("{e:#}"), now).await,
        };
        if let Err(e) = stored {
            // The head's lease runs out and the run is retried; nothing is lost.
            tracing::error!(lark.event_id = %event.event_id, error = %e, "updating the inbox failed");
            return None;
        }
        break;
    }
    Some(handled)
}

/// Records a failed attempt of `event`: a retry, or the dead letter (the handler told).
async fn failed(
    inbox: &Inbox,
    handler: &dyn Handler,
    event: &InboxEvent,
    text: &str,
    now: DateTime<Utc>,
) -> sqlx::Result<()> {
    let d = &inbox.deps;
    d.metrics.events_failed.inc();
    let max = if event.section.is_some() && !event.express {
        d.config.max_attempts.min(SECTION_ATTEMPTS)
    } else {
        d.config.max_attempts
    };
    let r = fail(&inbox.worker_db, event, text, now, max).await;
    match r {
        Ok(Failed::Dead) => {
            d.metrics.events_dead.inc();
            tracing::error!(lark.event_id = %event.event_id, error = %text, attempts = event.attempts, "event dead-lettered");
            handler.dead_lettered(event, text).await;
        }
        Ok(Failed::Retry(at)) => {
            tracing::warn!(lark.event_id = %event.event_id, error = %text, attempts = event.attempts, retry_at = %at, "event failed; will retry");
        }
        Err(_) => {}
    }
    r.map(|_| ())
}

async fn cleanup_loop(inbox: Arc<Inbox>) {
    let d = &inbox.deps;
    let retention =
        chrono::Duration::from_std(d.config.handled_retention).unwrap_or(chrono::Duration::days(7));
    loop {
        tokio::select! {
            _ = tokio::time::sleep(CLEANUP_EVERY) => {}
            _ = d.shutdown.cancelled() => return,
        }
        let before = d.clock.now() - retention;
        for _ in 0..CLEANUP_MAX_BATCHES {
            match cleanup(&d.db, before, CLEANUP_BATCH).await {
                Ok(n) if n == CLEANUP_BATCH as u64 => continue,
                Ok(_) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "inbox cleanup failed");
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_caps() {
        assert_eq!(backoff(1), Duration::from_secs(2));
        assert_eq!(backoff(2), Duration::from_secs(4));
        assert_eq!(backoff(3), Duration::from_secs(8));
        assert_eq!(backoff(1000), MAX_BACKOFF);
    }

    #[test]
    fn escapes_jsonb_refuses_are_replaced_and_nothing_else() {
        let cases = [
            (r#"{"a":"x\u0000y"}"#, r#"{"a":"x\uFFFDy"}"#),
            (
                r#"{"k\u0000":["\ud800","\uDFFF",1]}"#,
                r#"{"k\uFFFD":["\uFFFD","\uFFFD",1]}"#,
            ),
            // A pair, an escaped backslash before `u0000`, other escapes: unchanged.
            (
                r#"["\ud83d\ude00","\\u0000","\"\u00e9\n"]"#,
                r#"["\ud83d\ude00","\\u0000","\"\u00e9\n"]"#,
            ),
            // A high surrogate followed by another high one: the first is lone.
            (r#"["\ud800\ud83d\ude00"]"#, r#"["\uFFFD\ud83d\ude00"]"#),
            (
                r#"{"plain":"no escapes at all"}"#,
                r#"{"plain":"no escapes at all"}"#,
            ),
        ];
        for (given, expected) in cases {
            let mut text = given.to_string();
            storable_json(&mut text);
            assert_eq!(text, expected, "{given}");
        }
    }

    #[tokio::test]
    async fn admission_is_bounded_and_released() {
        let deps = InboxDeps {
            db: sqlx::postgres::PgPoolOptions::new()
                .connect_lazy("postgres://unused@127.0.0.1:9/unused")
                .expect("a lazy pool"),
            clock: Arc::new(crate::clock::SystemClock),
            metrics: Arc::new(Metrics::new()),
            config: crate::config::Config::from_vars(&|_| None, std::path::Path::new("/"))
                .expect("defaults")
                .inbox,
            shutdown: CancellationToken::new(),
        };
        let inbox = Inbox::new(deps, 2, TaskTracker::new());
        let a = inbox.admit().expect("first");
        let _b = inbox.admit().expect("second");
        assert!(inbox.admit().is_none());
        drop(a);
        assert!(inbox.admit().is_some());
    }
}
