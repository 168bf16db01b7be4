//! Live progress in chat: one card per turn, fed by the agent's [`StepSink`] events and written
//! only by the task of the replica that runs the turn. It owns the card's lifecycle (create,
//! send as a reply to the turn's message, coalesced updates, streaming renewal, close with a
//! summary), the card's `sequence` (reserved in blocks in the `turns` row, so a resumed turn
//! continues the same card above every number used before) and the fallbacks: CardKit
//! streaming → a card message updated by PATCH at most every 1.5 s → nothing (the final
//! answer only). It also answers the card's Stop button ([`on_stop_click`]).
//!
//! Never: edits text messages (Lark caps those at 20 edits); retries a refused card operation
//! blindly (each error code has its one remedy); blocks the agent (events go through a bounded
//! queue and are dropped when it is full); stands in for the final answer, which stays a
//! separate reply.
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
//! the previous call; stretched to `live cards / 45` s so that all cards of a replica together stay
//! under Lark's ~50 requests/s per app), once a second while a step runs (the elapsed time), and re-enables streaming
//! at 4/5 of `SSHMODE_PROGRESS_STREAMING_TTL_SECS`. At the end it writes the summary (outcome, step
//! counts, the first lines of the stored answer) and closes streaming with it.
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
//! → re-enable streaming and try once more, or if that is refused rotate to a new card (≤ 50 per
//! turn); 230020 (or the client's rate-limit error) → back off (0.5 s doubling to 8 s) and write the
//! then-current view later; anything else (no `cardkit:card:write` scope, CardKit down) → the PATCH
//! fallback: the full card as a card message, PATCHed at most every 1.5 s (230020 backs off there
//! too); a refused card message → `none`. Each fallback is counted and logged once per chat.
//!
//! **Stop button.** Its callback value is `{"act":"progress_stop","turn":id,"section":…,"chat":…}`.
//! `progress::on_stop_click(&progress, &agent, value, operator, authorised)` returns `None` for
//! other buttons, a refusal toast when not authorised, "already ended"/"already stopping" when the
//! turn is over or stopping (a second click never drops waiting messages the way a second `/stop`
//! does), and otherwise calls `Agent::stop` (the `/stop` path) and tells the local writer, which
//! pauses streaming and shows "Stopped by @…"; on another replica the writer reads
//! `stop_requested_by` when the turn ends. The click travels like any card action: the callback
//! path answers at once, without I/O, from `progress::stop_click_authorised` (the click must come
//! from the chat the card was sent to — Lark shows the card only to its members, and a forwarded
//! card carries no right to stop), and the inbox worker (`frontend::LarkHandler`) then calls
//! `on_stop_click`, or writes a `turn.stop` / `refused` audit row.

pub mod card;
mod writer;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use serde_json::Value;
use sqlx::PgPool;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use crate::agent::{Agent, StepEvent, StepSink};
use crate::config::ProgressConfig;
use crate::lark::client::LarkClient;
use crate::metrics::Metrics;

/// Events queued per turn before new ones are dropped.
const QUEUE: usize = 512;
/// Turns with a live card on one replica; beyond it a turn runs without one.
const MAX_LIVE: usize = 4096;
/// Chats remembered for "fallback logged once"; the set is cleared past it.
const MAX_LOGGED_CHATS: usize = 10_000;

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
                    },
                );
            }
            let _ = tx.try_send(Msg::Step(event.clone(), now));
            let shared = self.shared.clone();
            let section = section.to_string();
            self.tasks.spawn(async move {
                writer::run(&shared, &section, turn_id, rx, tail_rx).await;
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

/// Whether a Stop click may stop the task: it must come from the chat the card was sent to.
/// Lark delivers a click only from someone who sees the card, so a click from that chat is a
/// member's; a card forwarded into another chat does not carry the right to stop. Pure, so the
/// callback path can answer with it at once.
pub fn stop_click_authorised(value: &Value, open_chat_id: &str) -> bool {
    value
        .get("chat")
        .and_then(Value::as_str)
        .is_some_and(|chat| !chat.is_empty() && chat == open_chat_id)
}

/// The Stop button of a progress card was clicked. `value` is the button's callback value
/// (`{"act":"progress_stop","turn":…,"section":…}`), `operator` the clicker's open_id, and
/// `authorised` whether chat control found them allowed (a member of the section, or the
/// configured role). Requests the stop as `/stop` does, pauses the card's streaming (Lark cannot
/// update a streaming card from a callback) and makes it show "stopped by …". Returns the toast
/// text; `None` when `value` is not a progress Stop button.
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
        return Some(Ok("This button is not valid any more.".into()));
    };
    if !authorised {
        return Some(Ok(
            "Only members of this conversation can stop its task.".into()
        ));
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
    let running: Option<bool> = sqlx::query_scalar(
        "SELECT stop_requested_at IS NULL FROM turns
         WHERE id = $1 AND section_id = $2 AND state IN ('running', 'awaiting_approval')",
    )
    .bind(turn_id)
    .bind(section)
    .fetch_optional(&progress.shared.db)
    .await?;
    match running {
        None => return Ok("This task has already ended.".into()),
        // A second click must not drop waiting messages as a second `/stop` would.
        Some(false) => return Ok("This task is already stopping.".into()),
        Some(true) => {}
    }
    let said = agent.stop(section, operator).await?;
    if let Some(tx) = progress.sender(turn_id) {
        let _ = tx.try_send(Msg::StoppedBy(operator.to_string()));
    }
    Ok(said)
}
