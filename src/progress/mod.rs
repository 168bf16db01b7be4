//! Live progress in chat: one card per turn, fed by the agent's [`StepSink`] events and written
//! only by the task of the replica that runs the turn. It owns the card's lifecycle (create,
//! send as a reply to the turn's message — above the answer, or not at all —, coalesced
//! updates, streaming renewal, the final card with the summary and no Stop button), the card's
//! `sequence` (reserved in blocks in the `turns` row, so a resumed turn
//! continues the same card above every number used before) and the fallbacks: CardKit
//! streaming → a card message updated by PATCH at most every 1.5 s → nothing (the final
//! answer only). It also answers the card's Stop button ([`on_stop_click`]).
//!
//! Never: edits text messages (Lark caps those at 20 edits); retries a refused card operation
//! blindly (each error code has its one remedy); posts a second card for a turn while its
//! first keeps a live Stop button; posts a card below the turn's answer; blocks the agent
//! (events go through a bounded queue and are dropped when it is full; only the answer waits,
//! bounded, for a card under way); stands in for the final answer, which stays a separate
//! reply.
//!
//! # In detail
//!
//! `progress::Progress` is the agent's `StepSink`. `step()` never blocks: `Started` spawns one writer
//! task per turn (at most 4096 live per replica) fed by a bounded queue (512 events; a full queue
//! drops events). The card itself is created at the turn's first tool call (or at once when
//! a resumed turn has one stored, or earlier calls to show): an answer without tools costs no
//! card at all. At `Ended` the turn's Lark calls — the chat side's, which `Ended` carries,
//! plus the card's — go to the `sshmode_lark_calls_per_turn` histogram. Only the replica running the turn has a writer, so only the turn's runner writes
//! its card; `Left` (the runner let go without ending: shutdown, lost lease, error, a call parked for
//! approval) ends the writer without closing the card — after `Awaiting`, once the card shows
//! the step waiting and by whom — and whoever resumes the turn opens a new writer on the same
//! card (a turn resumed after an approval lists its earlier steps again too).
//! A runner that resumes a turn reads the calls earlier runners finished from the turn's
//! `agent.tool` event-log entries (before it writes anything) and sends them once as
//! `StepEvent::Earlier`, so the card lists them again, interrupted calls included.
//!
//! **State with the turn.** `turns.progress_mode` (`cardkit` | `patch` | `none`),
//! `progress_card_id`, `progress_message_id`, `progress_sequence` (migration
//! `20261201060000_progress_cards.sql`). `progress_sequence` is the highest *reserved* CardKit
//! sequence: the writer reserves blocks of 100 before using them, so a resumed writer starts above
//! every number any earlier writer could have sent, and one DB write covers 100 operations.
//!
//! **Writing.** `card::View` is the pure model: finished steps (the last 30; older ones counted by
//! outcome), the running step, "stopped by", the summary; `markdown()` renders the `steps` element
//! and `card()` the whole JSON 2.0 card. The writer marks the view dirty on each event and writes at
//! most once per `SSHMODE_PROGRESS_INTERVAL_MS` (200 ms ⇒ ≤ 5 updates/s, measured from the end of
//! the previous call, never under 100 ms: a card takes 10 operations a second; streamed CardKit
//! updates are exempt from the platform's API limits, while a PATCHed fallback card's interval is
//! stretched to `live cards / 45` s so that all of a replica's PATCHes stay under that API's ~50
//! requests/s), once a second while a step runs (the elapsed time), and re-enables streaming
//! at 4/5 of `SSHMODE_PROGRESS_STREAMING_TTL_SECS`. At the end it closes streaming with the
//! summary (outcome, step counts, the first lines of the stored answer) and replaces the whole
//! card (`PUT /cardkit/v1/cards/{id}`) by its final form: the header says how the turn ended
//! (Done green, Stopped grey, Stopped at a limit orange, Failed red) and the Stop button is
//! gone. A card that refuses the replacement at least loses its Stop element (`DELETE
//! …/elements/stop`); one that refuses that too goes to the PATCH fallback, whose final PATCH
//! has the same header and no button.
//!
//! **Above the answer.** The agent calls `StepSink::answering` before it sends the answer. A
//! turn's writer makes and posts a card only under the turn's `Gate`: once the answer is on
//! its way no card is made, a card being made holds the answer at most
//! `SSHMODE_PROGRESS_ANSWER_WAIT_MS` (30 s; past it that card is never posted), and a card
//! whose post was sent holds the answer until the post is answered and its id stored (the
//! client bounds that call). So the card lands before the answer or not at all; a turn whose
//! answer came first stores `progress_mode = none`.
//!
//! **Live output.** `StepEvent::ToolOutput` (a running command's tail, from `agent::live`) does
//! not go through the queue: `step()` puts it in the turn's one `watch` slot with the number of
//! the step it belongs to (the `ToolStarted` events queued so far), so only the latest tail
//! waits, whatever the card's pace. The writer shows it if that step is still its latest
//! (running, or just finished: the finished step keeps its last lines) and writes it with the
//! next update the interval allows; tails that came while a write was under way, refused or
//! backing off are never seen. `card` renders it as a code block under its step (backticks made
//! quotes, markup inert, at most 500 characters).
//!
//! **Errors by meaning.** 300317 → jump the sequence a block ahead and try once more; 200850/300309
//! → re-enable streaming and try once more, or if that is refused move to a new card (≤ 50 per
//! turn), the old one first replaced by a copy without its Stop button ("Continued in a new
//! card"; a card that cannot be retired is not rotated from but PATCHed in place); transient
//! refusals — 230020 or the client's rate-limit error, 200810 (the card is in an interaction),
//! 300120 (internal), 5xx, no answer — → back off (0.5 s doubling to 8 s) and write the
//! then-current view later on the same card, with a fresh sequence, at most 8 in a row;
//! anything else (no `cardkit:card:write` scope, CardKit down, transient refusals that do not
//! stop) → the PATCH fallback. When the turn has a card message already, that same message is
//! PATCHed with the full card from then on (its CardKit streaming closed first, one try): a turn
//! never gets a second card. Before any card message was posted, the full card is posted as a
//! card message. PATCHes go at most every 1.5 s and back off on transient refusals too; a
//! refused card message → `none`. Each fallback is counted and logged once per chat.
//!
//! **Stop button.** Its callback value is `{"act":"progress_stop","turn":id,"section":…,"chat":…}`.
//! `progress::on_stop_click(&progress, &agent, value, operator, authorised)` returns `None` for
//! other buttons, a refusal toast when not authorised, "already finished"/"already stopping" when the
//! turn is over or stopping (a second click never drops waiting messages the way a second `/stop`
//! does), and otherwise calls `Agent::stop` (the `/stop` path) and tells the local writer, which
//! pauses streaming and shows "Stopped by @…"; on another replica the writer reads
//! `stop_requested_by` when the turn ends. The click travels like any card action: the callback
//! path answers at once from `progress::stop_click_toast` — a refusal unless
//! `authz::press_stop` allows it (the click must come from the chat the card was sent to, which
//! `stop_card_chat` reads from the button — Lark shows the card only to its members, and a
//! forwarded card carries no right to stop), else one read of the turn's row by key (≤ 1 s)
//! for "This task has already finished." (a client still showing an old card's Stop) or
//! "already stopping", else "Stopping the task…" — and the inbox worker
//! (`frontend::LarkHandler`) then calls `on_stop_click`, or writes a `turn.stop` / `refused`
//! audit row.

pub mod card;
mod writer;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use serde_json::Value;
use sqlx::PgPool;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use crate::agent::{Agent, StepEvent, StepSink};
use crate::authz;
use crate::config::ProgressConfig;
use crate::lark::client::LarkClient;
use crate::metrics::Metrics;

/// Events queued per turn before new ones are dropped.
const QUEUE: usize = 512;
/// Turns with a live card on one replica; beyond it a turn runs without one.
const MAX_LIVE: usize = 4096;
/// Chats remembered for "fallback logged once"; the set is cleared past it.
const MAX_LOGGED_CHATS: usize = 10_000;
/// Longest the callback path reads a turn's state to answer a Stop click.
const STOP_READ: Duration = Duration::from_secs(1);

/// What a turn's writer receives.
#[derive(Debug)]
enum Msg {
    Step(StepEvent, Instant),
    /// The Stop button was pressed by this open_id.
    StoppedBy(String),
}

/// A turn's writer, as `step()` reaches it.
struct Live {
    tx: mpsc::Sender<Msg>,
    /// The running step's latest output tail, with the number of the step it belongs to:
    /// one slot, each tail replacing the last (never queued).
    tail: watch::Sender<(u64, String)>,
    /// `ToolStarted` events queued to the writer so far (the writer counts the same).
    started: u64,
    /// Orders the card before the answer.
    gate: Arc<Gate>,
}

/// Keeps a turn's card above its answer in the chat. The writer makes and posts a card
/// message only under a [`Posting`], which is refused once the answer is on its way; the
/// answer path ([`StepSink::answering`]) says so, then waits for a card under way: while it is
/// being made at most `SSHMODE_PROGRESS_ANSWER_WAIT_MS` (then that card is never posted), and
/// once its post is sent until the post is answered and recorded (the client bounds that
/// call). So a card lands before the answer, or not at all.
struct Gate(watch::Sender<Order>);

#[derive(Debug, Default, Clone, Copy)]
struct Order {
    /// A card is being made (a CardKit entity created) to be posted.
    making: bool,
    /// A card message is being posted, until its id is stored.
    posting: bool,
    /// The answer is on its way: no card is made or posted from now on.
    answering: bool,
    /// The answer stopped waiting for the card being made: that card is not posted.
    gave_up: bool,
}

impl Gate {
    fn new() -> Gate {
        Gate(watch::channel(Order::default()).0)
    }

    fn answer_started(&self) -> bool {
        self.0.borrow().answering
    }

    /// The answer is about to be sent: no card is made from now on, and one under way is
    /// waited for (`wait` while it is being made).
    async fn answering(&self, wait: Duration) {
        let mut rx = self.0.subscribe();
        self.0.send_modify(|o| o.answering = true);
        let idle = |o: &Order| !o.making && !o.posting;
        if tokio::time::timeout(wait, rx.wait_for(idle)).await.is_ok() {
            return;
        }
        // Under the same lock as the writer's step from making to posting: either its post
        // is sent (and waited for here) or it is never sent.
        self.0.send_modify(|o| o.gave_up = true);
        let _ = rx.wait_for(|o| !o.posting).await;
        tracing::warn!(
            "the answer did not wait any longer for its progress card; the turn shows none"
        );
    }
}

/// The writer's leave to make and post one card message; dropping it marks that done (the
/// post answered and recorded, or given up).
struct Posting(Arc<Gate>);

impl Posting {
    /// `None` once the answer is on its way.
    fn begin(gate: &Arc<Gate>) -> Option<Posting> {
        gate.0
            .send_if_modified(|o| {
                if o.answering {
                    false
                } else {
                    o.making = true;
                    true
                }
            })
            .then(|| Posting(gate.clone()))
    }

    /// The card is made: may its post be sent now? False when the answer stopped waiting for
    /// it.
    fn post(&self) -> bool {
        self.0.0.send_if_modified(|o| {
            if o.gave_up {
                false
            } else {
                o.making = false;
                o.posting = true;
                true
            }
        })
    }
}

impl Drop for Posting {
    fn drop(&mut self) {
        self.0.0.send_modify(|o| {
            o.making = false;
            o.posting = false;
        });
    }
}

struct Shared {
    lark: Arc<LarkClient>,
    db: PgPool,
    metrics: Arc<Metrics>,
    config: ProgressConfig,
    live: Mutex<HashMap<i64, Live>>,
    logged: Mutex<HashSet<String>>,
}

/// The progress view: install it as the agent's step sink. Cheap to clone.
#[derive(Clone)]
pub struct Progress {
    shared: Arc<Shared>,
    /// The app's tracker: card writers are waited for at shutdown (within its grace).
    tasks: TaskTracker,
}

impl Progress {
    pub fn new(
        lark: Arc<LarkClient>,
        db: PgPool,
        metrics: Arc<Metrics>,
        config: ProgressConfig,
        tasks: TaskTracker,
    ) -> Progress {
        Progress {
            tasks,
            shared: Arc::new(Shared {
                lark,
                db,
                metrics,
                config,
                live: Mutex::new(HashMap::new()),
                logged: Mutex::new(HashSet::new()),
            }),
        }
    }

    fn sender(&self, turn_id: i64) -> Option<mpsc::Sender<Msg>> {
        self.shared
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&turn_id)
            .map(|l| l.tx.clone())
    }
}

impl StepSink for Progress {
    fn step(&self, section: &str, turn_id: i64, event: &StepEvent) {
        if !self.shared.config.enabled {
            if let StepEvent::Ended { lark_calls, .. } = event {
                self.shared.turn_calls(*lark_calls);
            }
            return;
        }
        let now = Instant::now();
        if let StepEvent::Started { .. } = event {
            let (tx, rx) = mpsc::channel(QUEUE);
            let (tail, tail_rx) = watch::channel((0, String::new()));
            let gate = Arc::new(Gate::new());
            {
                let mut live = self.shared.live.lock().unwrap_or_else(|p| p.into_inner());
                if live.len() >= MAX_LIVE && !live.contains_key(&turn_id) {
                    tracing::warn!(turn_id, "too many live progress cards; this turn has none");
                    return;
                }
                live.insert(
                    turn_id,
                    Live {
                        tx: tx.clone(),
                        tail,
                        started: 0,
                        gate: gate.clone(),
                    },
                );
            }
            let _ = tx.try_send(Msg::Step(event.clone(), now));
            let shared = self.shared.clone();
            let section = section.to_string();
            self.tasks.spawn(async move {
                writer::run(&shared, &section, turn_id, rx, tail_rx, gate).await;
                let mut live = shared.live.lock().unwrap_or_else(|p| p.into_inner());
                if live.get(&turn_id).is_some_and(|s| s.tx.same_channel(&tx)) {
                    live.remove(&turn_id);
                }
            });
            return;
        }
        if let StepEvent::ToolOutput { tail } = event {
            // The latest tail replaces the one before; nothing queues behind a slow card.
            let live = self.shared.live.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(l) = live.get(&turn_id) {
                l.tail.send_replace((l.started, tail.clone()));
            }
            return;
        }
        if let StepEvent::ToolStarted { .. } = event {
            let mut live = self.shared.live.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(l) = live.get_mut(&turn_id) {
                if l.tx.try_send(Msg::Step(event.clone(), now)).is_ok() {
                    l.started += 1;
                } else {
                    tracing::debug!(turn_id, "progress queue full; a step event was dropped");
                }
            }
            return;
        }
        match self.sender(turn_id) {
            Some(tx) => {
                if tx.try_send(Msg::Step(event.clone(), now)).is_err() {
                    tracing::debug!(turn_id, "progress queue full; a step event was dropped");
                    if let StepEvent::Ended { lark_calls, .. } = event {
                        self.shared.turn_calls(*lark_calls);
                    }
                }
            }
            None => {
                if let StepEvent::Ended { lark_calls, .. } = event {
                    self.shared.turn_calls(*lark_calls);
                }
            }
        }
    }

    fn answering(&self, turn_id: i64) -> BoxFuture<'static, ()> {
        let gate = self
            .shared
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&turn_id)
            .map(|l| l.gate.clone());
        let wait = self.shared.config.answer_wait;
        Box::pin(async move {
            if let Some(gate) = gate {
                gate.answering(wait).await;
            }
        })
    }
}

impl Shared {
    /// Records the Lark calls of one ended turn (`sshmode_lark_calls_per_turn`).
    fn turn_calls(&self, calls: u32) {
        self.metrics.lark_calls_per_turn.observe(f64::from(calls));
    }

    /// Logs the fallback in use once per chat, with the reason, and counts it.
    fn fallback(&self, chat_id: &str, to: &'static str, reason: &str) {
        self.metrics
            .progress_fallbacks
            .get_or_create(&crate::metrics::ReasonLabel { reason: to.into() })
            .inc();
        let mut logged = self.logged.lock().unwrap_or_else(|p| p.into_inner());
        if logged.len() >= MAX_LOGGED_CHATS {
            logged.clear();
        }
        if logged.insert(format!("{chat_id}/{to}")) {
            tracing::warn!(
                chat_id,
                fallback = to,
                reason,
                "progress cards fall back (grant the app the cardkit:card:write scope for streamed cards)"
            );
        }
    }

    fn count(&self, op: &'static str, outcome: String) {
        self.metrics
            .progress_card_ops
            .get_or_create(&crate::metrics::CardOpLabels {
                op: op.into(),
                outcome,
            })
            .inc();
    }
}

/// Whether `value` is a progress card's Stop button.
pub fn is_stop_click(value: &Value) -> bool {
    value.get("act").and_then(Value::as_str) == Some(card::STOP_ACT)
}

/// The chat a Stop button's card was sent to, as the button's value names it: what
/// [`authz::press_stop`] decides a click by, without I/O, so the callback path can answer with
/// it at once.
pub fn stop_card_chat(value: &Value) -> Option<&str> {
    value.get("chat").and_then(Value::as_str)
}

/// What a Stop click is told when its turn is over.
const FINISHED: &str = "This task has already finished.";
/// … when its turn is stopping already.
const STOPPING: &str = "This task is already stopping.";
/// … when its value is not a Stop button's.
const NOT_VALID: &str = "This button is not valid any more.";

/// The toast a Stop click is answered with at once, on the callback path, as (type, text): a
/// refusal when it comes from outside the card's chat ([`authz::press_stop`]); else one read of
/// the turn's row by key (at most [`STOP_READ`]) says whether the task already finished or is
/// stopping. Unread, the click is taken for a live one; the worker decides either way.
pub async fn stop_click_toast(
    db: &PgPool,
    value: &Value,
    open_chat_id: &str,
) -> (&'static str, String) {
    if let Err(refused) = authz::press_stop(stop_card_chat(value), open_chat_id) {
        return ("error", refused.to_string());
    }
    let (Some(turn_id), Some(section)) = (
        value.get("turn").and_then(Value::as_i64),
        value.get("section").and_then(Value::as_str),
    ) else {
        return ("error", NOT_VALID.into());
    };
    let said = match tokio::time::timeout(STOP_READ, stoppable(db, turn_id, section)).await {
        Ok(Ok(None)) => FINISHED,
        Ok(Ok(Some(false))) => STOPPING,
        _ => "Stopping the task…",
    };
    ("info", said.into())
}

/// Whether the turn still runs (or waits for an approval) and no stop was asked for yet;
/// `None` when it is over.
async fn stoppable(db: &PgPool, turn_id: i64, section: &str) -> sqlx::Result<Option<bool>> {
    sqlx::query_scalar(
        "SELECT stop_requested_at IS NULL FROM turns
         WHERE id = $1 AND section_id = $2 AND state IN ('running', 'awaiting_approval')",
    )
    .bind(turn_id)
    .bind(section)
    .fetch_optional(db)
    .await
}

/// The Stop button of a progress card was clicked. `value` is the button's callback value
/// (`{"act":"progress_stop","turn":…,"section":…}`), `operator` the clicker's open_id, and
/// `authorised` whether [`authz::press_stop`] allowed the click. Requests the stop as `/stop`
/// does, pauses the card's streaming (Lark cannot update a streaming card from a callback) and
/// makes it show "stopped by …". Returns the toast text; `None` when `value` is not a progress
/// Stop button.
pub async fn on_stop_click(
    progress: &Progress,
    agent: &Agent,
    value: &Value,
    operator: &str,
    authorised: bool,
) -> Option<anyhow::Result<String>> {
    if value.get("act").and_then(Value::as_str) != Some(card::STOP_ACT) {
        return None;
    }
    let (Some(turn_id), Some(section)) = (
        value.get("turn").and_then(Value::as_i64),
        value.get("section").and_then(Value::as_str),
    ) else {
        return Some(Ok(NOT_VALID.into()));
    };
    if !authorised {
        return Some(Ok(authz::Denial::NotMember.to_string()));
    }
    Some(stop_turn(progress, agent, turn_id, section, operator).await)
}

async fn stop_turn(
    progress: &Progress,
    agent: &Agent,
    turn_id: i64,
    section: &str,
    operator: &str,
) -> anyhow::Result<String> {
    match stoppable(&progress.shared.db, turn_id, section).await? {
        None => return Ok(FINISHED.into()),
        // A second click must not drop waiting messages as a second `/stop` would.
        Some(false) => return Ok(STOPPING.into()),
        Some(true) => {}
    }
    let said = agent.stop(section, operator).await?;
    if let Some(tx) = progress.sender(turn_id) {
        let _ = tx.try_send(Msg::StoppedBy(operator.to_string()));
    }
    Ok(said)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_card_is_posted_before_the_answer_or_not_at_all() {
        const WAIT: Duration = Duration::from_secs(3600);
        let started = |gate: &Gate| gate.answer_started();
        // A card being made and posted holds the answer until it is recorded.
        let gate = Arc::new(Gate::new());
        let posting = Posting::begin(&gate).expect("no answer yet");
        let answer = tokio::spawn({
            let gate = gate.clone();
            async move { gate.answering(WAIT).await }
        });
        for _ in 0..100 {
            if started(&gate) {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert!(started(&gate));
        assert!(posting.post());
        assert!(!answer.is_finished());
        drop(posting);
        answer.await.unwrap();
        // Once the answer is on its way, no card is made.
        assert!(Posting::begin(&gate).is_none());
        // With nothing under way, the answer does not wait.
        let gate = Arc::new(Gate::new());
        gate.answering(WAIT).await;
        assert!(Posting::begin(&gate).is_none());
        // An answer that stopped waiting for a card being made: that card is never posted.
        let gate = Arc::new(Gate::new());
        let posting = Posting::begin(&gate).expect("no answer yet");
        gate.answering(Duration::ZERO).await;
        assert!(!posting.post());
    }
}
