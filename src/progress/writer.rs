//! One turn's card writer: applies step events to the [`View`], and writes the card at most
//! once per interval (CardKit) or patch interval (fallback), with a live elapsed time while a
//! step runs. Each CardKit error is handled by its meaning: 300317 moves the sequence past the
//! card's, 200850/300309 re-enable streaming (or rotate to a new card), 230020 backs off, any
//! other error falls back to a PATCHed card message, and a refused card leaves the final
//! answer alone.

use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::card::{STEPS_ELEMENT, Step, View};
use super::{Msg, Shared};
use crate::agent::StepEvent;
use crate::exec::Place;
use crate::lark::client::{Content, LarkError, idempotency_key};

/// Card writes per second all live cards of one replica share (Lark allows an app about 50
/// requests/s; the rest is left to replies and reactions).
const APP_UPDATES_PER_SEC: u32 = 45;
/// Sequence numbers reserved per write of the `turns` row.
const SEQ_BLOCK: i32 = 100;
/// How often a running step's elapsed time is refreshed.
const TICK: Duration = Duration::from_secs(1);
/// Longest back-off after 230020.
const MAX_BACKOFF: Duration = Duration::from_secs(8);
/// New cards one turn may rotate to.
const MAX_ROTATIONS: u32 = 50;
/// How long a writer waits for events after the turn went quiet (a lost lease, a shutdown)
/// before it stops; the turn resumes elsewhere with its own writer.
const IDLE_LIMIT: Duration = Duration::from_secs(3600);

/// `progress_mode`, `progress_card_id`, `progress_message_id`, `progress_sequence`.
type StoredCard = (Option<String>, Option<String>, Option<String>, i32);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    CardKit,
    Patch,
    None,
}

impl Mode {
    fn as_str(self) -> &'static str {
        match self {
            Mode::CardKit => "cardkit",
            Mode::Patch => "patch",
            Mode::None => "none",
        }
    }
    fn parse(s: &str) -> Mode {
        match s {
            "cardkit" => Mode::CardKit,
            "patch" => Mode::Patch,
            _ => Mode::None,
        }
    }
}

struct Writer<'a> {
    shared: &'a Shared,
    turn_id: i64,
    chat_id: String,
    reply_to: String,
    in_thread: bool,
    mode: Mode,
    card_id: Option<String>,
    message_id: Option<String>,
    /// The last sequence used and the highest reserved in the database.
    seq: i32,
    reserved: i32,
    /// When streaming was last enabled (CardKit).
    enabled_at: Instant,
    rotations: u32,
    view: View,
    started: Instant,
    running_since: Option<Instant>,
    dirty: bool,
    last_write: Option<Instant>,
    not_before: Instant,
    backoff: Duration,
    /// The runner let go of the turn: whoever resumes it writes the card from then on.
    left: bool,
    /// Lark calls this writer made, and those of the chat side once the turn ended.
    calls: u32,
    chat_calls: Option<u32>,
    /// `ToolStarted` events applied: the number of the step a tail must carry to be shown.
    steps_started: u64,
}

pub(super) async fn run(
    shared: &Shared,
    section: &str,
    turn_id: i64,
    mut rx: mpsc::Receiver<Msg>,
    mut tails: watch::Receiver<(u64, String)>,
) {
    let Some(Msg::Step(
        StepEvent::Started {
            resumed,
            chat_id,
            reply_to,
            in_thread,
            place,
        },
        at,
    )) = rx.recv().await
    else {
        return;
    };
    let backend = backend_label(shared, place.as_ref()).await;
    let now = Instant::now();
    let w_chat = chat_id.clone();
    let mut w = Writer {
        shared,
        turn_id,
        chat_id,
        reply_to,
        in_thread,
        mode: Mode::None,
        card_id: None,
        message_id: None,
        seq: 0,
        reserved: 0,
        enabled_at: now,
        rotations: 0,
        view: View {
            turn_id,
            section: section.to_string(),
            chat_id: w_chat.clone(),
            backend,
            resumed,
            ..View::default()
        },
        started: at,
        running_since: None,
        dirty: false,
        last_write: None,
        not_before: now,
        backoff: Duration::ZERO,
        left: false,
        calls: 0,
        chat_calls: None,
        steps_started: 0,
    };
    if !w.has_card().await {
        // No card until the first tool call: an answer without tools costs none. The events
        // before it only shape the view the card is created from.
        loop {
            let Some(m) = rx.recv().await else { return };
            let first_call = match &m {
                Msg::Step(StepEvent::ToolStarted { .. } | StepEvent::Earlier { .. }, _) => true,
                Msg::Step(StepEvent::Ended { lark_calls, .. }, _) => {
                    shared.turn_calls(*lark_calls);
                    return;
                }
                Msg::Step(StepEvent::Left, _) => return,
                _ => false,
            };
            w.apply(m).await;
            if first_call {
                break;
            }
        }
    }
    if let Err(e) = w.open().await {
        tracing::warn!(turn_id, error = %e, "progress card state could not be stored");
        return;
    }
    if w.mode == Mode::None {
        // Drain so the agent's events never wait on a full queue, until the turn ends here.
        while let Some(m) = rx.recv().await {
            match m {
                Msg::Step(StepEvent::Ended { lark_calls, .. }, _) => {
                    w.chat_calls = Some(lark_calls);
                    break;
                }
                Msg::Step(StepEvent::Left, _) => break,
                _ => {}
            }
        }
    } else {
        w.serve(&mut rx, &mut tails).await;
    }
    if let Some(chat) = w.chat_calls {
        shared.turn_calls(chat + w.calls);
    }
}

/// `local`, or `alias (user@host:port)`.
async fn backend_label(shared: &Shared, place: Option<&Place>) -> String {
    match place {
        None => "?".into(),
        Some(Place::Local) => "local".into(),
        Some(Place::Target(alias)) => {
            let row: Option<(String, String, i32)> =
                sqlx::query_as("SELECT username, host, port FROM targets WHERE alias = $1")
                    .bind(alias)
                    .fetch_optional(&shared.db)
                    .await
                    .ok()
                    .flatten();
            match row {
                Some((user, host, port)) => format!("{alias} ({user}@{host}:{port})"),
                None => alias.clone(),
            }
        }
    }
}

fn code_of(e: &LarkError) -> Option<i64> {
    match e {
        LarkError::Api { code, .. } => Some(*code),
        LarkError::RateLimited { .. } => Some(230020),
        _ => None,
    }
}

impl Writer<'_> {
    /// Counts one card operation, in the metrics and in this turn's calls.
    fn count(&mut self, op: &'static str, outcome: String) {
        self.calls += 1;
        self.shared.count(op, outcome);
    }

    /// Whether the turn has a card (or a decision for none) stored: a resumed turn.
    async fn has_card(&self) -> bool {
        sqlx::query_scalar::<_, bool>("SELECT progress_mode IS NOT NULL FROM turns WHERE id = $1")
            .bind(self.turn_id)
            .fetch_optional(&self.shared.db)
            .await
            .ok()
            .flatten()
            .unwrap_or(false)
    }

    /// Continues the card stored with the turn, or creates and sends a new one.
    async fn open(&mut self) -> sqlx::Result<()> {
        let row: Option<StoredCard> = sqlx::query_as(
            "SELECT progress_mode, progress_card_id, progress_message_id, progress_sequence
             FROM turns WHERE id = $1",
        )
        .bind(self.turn_id)
        .fetch_optional(&self.shared.db)
        .await?;
        let Some((mode, card_id, message_id, seq)) = row else {
            return Ok(());
        };
        self.seq = seq;
        self.reserved = seq;
        if let Some(mode) = mode {
            self.mode = Mode::parse(&mode);
            self.card_id = card_id;
            self.message_id = message_id;
            // A resumed turn's card may have stopped streaming meanwhile: re-enable first.
            if self.mode == Mode::CardKit && !self.enable_streaming().await {
                self.rotate_or_fall_back("re-enabling streaming on resume failed")
                    .await?;
            }
            self.dirty = true;
            return Ok(());
        }
        self.create_cardkit().await?;
        self.dirty = false;
        Ok(())
    }

    async fn store(&self) -> sqlx::Result<()> {
        sqlx::query(
            "UPDATE turns SET progress_mode = $2, progress_card_id = $3,
                    progress_message_id = $4, progress_sequence = GREATEST(progress_sequence, $5)
             WHERE id = $1",
        )
        .bind(self.turn_id)
        .bind(self.mode.as_str())
        .bind(&self.card_id)
        .bind(&self.message_id)
        .bind(self.reserved)
        .execute(&self.shared.db)
        .await?;
        Ok(())
    }

    /// The next sequence number; reserves a new block in the database first when needed.
    async fn next_seq(&mut self) -> sqlx::Result<i32> {
        if self.seq >= self.reserved {
            self.reserved = self.seq.saturating_add(SEQ_BLOCK);
            self.store().await?;
        }
        self.seq += 1;
        Ok(self.seq)
    }

    fn uuid(&self, what: &str) -> String {
        idempotency_key(
            &format!("progress:{}", self.turn_id),
            &format!(
                "{what}:{}:{}",
                self.card_id.as_deref().unwrap_or(""),
                self.seq
            ),
        )
    }

    /// Creates a streaming CardKit card and sends it; falls back when either is refused.
    async fn create_cardkit(&mut self) -> sqlx::Result<()> {
        let card = self.view.card(true, true);
        let created = self.shared.lark.cardkit_create(&card).await;
        self.count("create", outcome(&created));
        let card_id = match created {
            Ok(id) => id,
            Err(e) => return self.fall_back_to_patch(&e.to_string()).await,
        };
        let content = Content::Card(json!({"type": "card", "data": {"card_id": card_id}}));
        let uuid = idempotency_key(
            &format!("progress:{}", self.turn_id),
            &format!("card:{}", self.rotations),
        );
        let sent = self
            .shared
            .lark
            .reply(&self.reply_to, &content, self.in_thread, &uuid, None)
            .await;
        self.count("send", outcome(&sent));
        match sent {
            Ok(s) => {
                self.mode = Mode::CardKit;
                self.card_id = Some(card_id);
                self.message_id = Some(s.message_id);
                self.seq = 0.max(self.seq);
                self.enabled_at = Instant::now();
                self.store().await
            }
            Err(e) => self.fall_back_to_patch(&e.to_string()).await,
        }
    }

    async fn fall_back_to_patch(&mut self, reason: &str) -> sqlx::Result<()> {
        let card = self.view.card(false, true);
        let uuid = idempotency_key(&format!("progress:{}", self.turn_id), "patch-card");
        let sent = self
            .shared
            .lark
            .reply(
                &self.reply_to,
                &Content::Card(card),
                self.in_thread,
                &uuid,
                None,
            )
            .await;
        self.count("send", outcome(&sent));
        match sent {
            Ok(s) => {
                self.shared.fallback(&self.chat_id, "patch", reason);
                self.mode = Mode::Patch;
                self.card_id = None;
                self.message_id = Some(s.message_id);
                self.last_write = Some(Instant::now());
            }
            Err(e) => {
                self.shared
                    .fallback(&self.chat_id, "none", &format!("{reason}; then {e}"));
                self.mode = Mode::None;
            }
        }
        self.store().await
    }

    /// Rotates to a new CardKit card (bounded), or falls back to PATCH.
    async fn rotate_or_fall_back(&mut self, reason: &str) -> sqlx::Result<()> {
        if self.rotations < MAX_ROTATIONS {
            self.rotations += 1;
            self.seq = 0;
            self.reserved = 0;
            // The stored sequence belongs to the old card; a new card restarts above zero,
            // so the stored maximum is reset with it.
            sqlx::query("UPDATE turns SET progress_sequence = 0 WHERE id = $1")
                .bind(self.turn_id)
                .execute(&self.shared.db)
                .await?;
            tracing::info!(turn_id = self.turn_id, reason, "progress card rotated");
            self.create_cardkit().await
        } else {
            self.fall_back_to_patch(reason).await
        }
    }

    /// Turns streaming on (again). False when Lark refused.
    async fn enable_streaming(&mut self) -> bool {
        self.settings(json!({"streaming_mode": true})).await
    }

    /// A settings change with the sequence discipline; true when applied.
    async fn settings(&mut self, config: Value) -> bool {
        let Some(card_id) = self.card_id.clone() else {
            return false;
        };
        for _ in 0..2 {
            let Ok(seq) = self.next_seq().await else {
                return false;
            };
            let uuid = self.uuid("settings");
            let r = self
                .shared
                .lark
                .cardkit_settings(&card_id, &config, seq, &uuid)
                .await;
            self.count("settings", outcome(&r));
            match r {
                Ok(()) => {
                    if config.get("streaming_mode") == Some(&json!(true)) {
                        self.enabled_at = Instant::now();
                    }
                    return true;
                }
                Err(e) if code_of(&e) == Some(300317) => self.resync().await,
                Err(_) => return false,
            }
        }
        false
    }

    /// 300317: the card has seen a higher sequence (another writer, or a lost reservation):
    /// move past it by a whole block.
    async fn resync(&mut self) {
        self.seq = self.seq.saturating_add(SEQ_BLOCK);
        self.reserved = self.seq;
        let _ = self.store().await;
    }

    async fn serve(
        &mut self,
        rx: &mut mpsc::Receiver<Msg>,
        tails: &mut watch::Receiver<(u64, String)>,
    ) {
        let mut ended = false;
        let mut tails_open = true;
        loop {
            let wake = self.next_wake(ended);
            tokio::select! {
                m = rx.recv() => match m {
                    Some(m) => ended |= self.apply(m).await,
                    None => ended = true,
                },
                // Only the latest tail is read: those that came while a write was under way
                // (or refused, or backing off) are dropped, never queued.
                r = tails.changed(), if tails_open => match r {
                    Ok(()) => {
                        let (step, tail) = tails.borrow_and_update().clone();
                        self.show_tail(step, tail);
                    }
                    Err(_) => tails_open = false,
                },
                _ = tokio::time::sleep_until(wake) => {}
            }
            let now = Instant::now();
            if !ended && (self.left || self.last_event_idle(now)) {
                if self.left && self.dirty && self.view.waiting.is_some() {
                    // Parked: the card shows what it waits for while nobody writes it.
                    tokio::time::sleep_until(self.write_at()).await;
                    self.write().await;
                }
                return;
            }
            if self.running_since.is_some() && self.last_write.is_none_or(|t| now >= t + TICK) {
                self.dirty = true;
            }
            if self.mode == Mode::CardKit
                && !ended
                && now >= self.enabled_at + renew_after(self.shared.config.streaming_ttl)
                && now >= self.not_before
            {
                if !self.enable_streaming().await {
                    let _ = self
                        .rotate_or_fall_back("re-enabling streaming failed")
                        .await;
                }
                self.last_write = Some(Instant::now());
            }
            if self.dirty && now >= self.write_at() {
                self.write().await;
            }
            if ended && !self.dirty {
                self.close().await;
                return;
            }
            if self.mode == Mode::None {
                return;
            }
        }
    }

    /// Shows `tail` under step number `step` (1-based) if that is still the latest step,
    /// running or just finished.
    fn show_tail(&mut self, step: u64, tail: String) {
        if step == 0 || step != self.steps_started || self.view.tail.as_deref() == Some(&tail) {
            return;
        }
        self.view.tail = Some(tail);
        self.dirty = true;
    }

    fn last_event_idle(&self, now: Instant) -> bool {
        now >= self.started + IDLE_LIMIT && self.running_since.is_none()
    }

    /// The least time between two writes of this card: the configured one, stretched so that
    /// all live cards of this replica together stay within [`APP_UPDATES_PER_SEC`] (the app's
    /// Open API limit is shared by every card and every reply).
    fn interval(&self) -> Duration {
        let base = match self.mode {
            Mode::Patch => self.shared.config.patch_interval,
            _ => self.shared.config.interval,
        };
        let live = self
            .shared
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
            .max(1) as u32;
        base.max(Duration::from_secs(1) * live / APP_UPDATES_PER_SEC)
    }

    fn write_at(&self) -> Instant {
        match self.last_write {
            Some(t) => (t + self.interval()).max(self.not_before),
            None => self.not_before,
        }
    }

    fn next_wake(&self, ended: bool) -> Instant {
        let now = Instant::now();
        let mut wake = now + Duration::from_secs(60);
        if self.dirty || ended {
            wake = wake.min(self.write_at());
        }
        if self.running_since.is_some() {
            wake = wake.min(
                self.last_write
                    .map(|t| t + TICK)
                    .unwrap_or(now)
                    .max(self.write_at()),
            );
        }
        if self.mode == Mode::CardKit {
            wake = wake.min(
                (self.enabled_at + renew_after(self.shared.config.streaming_ttl))
                    .max(self.not_before),
            );
        }
        wake.max(now)
    }

    /// Applies one message; true when the turn ended.
    async fn apply(&mut self, m: Msg) -> bool {
        let now = Instant::now();
        self.dirty = true;
        match m {
            Msg::StoppedBy(by) => {
                self.view.stopped_by = Some(by);
                if self.mode == Mode::CardKit {
                    // A streaming card cannot be updated from a callback: pause streaming; the
                    // next update re-enables it.
                    self.settings(json!({"streaming_mode": false})).await;
                    self.enabled_at = now - self.shared.config.streaming_ttl;
                }
                false
            }
            Msg::Step(ev, at) => match ev {
                StepEvent::Started { .. } | StepEvent::Model { .. } => false,
                StepEvent::Earlier { steps } => {
                    for s in steps {
                        self.view.push(s.into());
                    }
                    false
                }
                StepEvent::Left => {
                    self.left = true;
                    false
                }
                StepEvent::ToolStarted { tool, short } => {
                    self.running_since = Some(at);
                    self.view.running = Some((tool, short, Duration::ZERO));
                    self.view.waiting = None;
                    self.view.tail = None;
                    self.steps_started += 1;
                    false
                }
                // Tails come through their own slot (`show_tail`), never the queue.
                StepEvent::ToolOutput { .. } => false,
                // The step stops counting time; `Left` follows, and the card is written once
                // more before this writer lets go.
                StepEvent::Awaiting { approvers } => {
                    self.running_since = None;
                    self.view.waiting = Some(approvers);
                    false
                }
                StepEvent::ToolFinished {
                    tool,
                    ok,
                    millis,
                    backend,
                    exit,
                    approval,
                } => {
                    let short = self
                        .view
                        .running
                        .take()
                        .map(|(_, s, _)| s)
                        .unwrap_or_default();
                    self.running_since = None;
                    self.view.push(Step {
                        tool,
                        place: backend.unwrap_or_else(|| "?".into()),
                        short,
                        ok,
                        exit,
                        millis,
                        approval,
                    });
                    false
                }
                StepEvent::Ended {
                    outcome,
                    lark_calls,
                } => {
                    self.chat_calls = Some(lark_calls);
                    self.running_since = None;
                    self.view.running = None;
                    self.view.summary = Some(self.summary(&outcome).await);
                    true
                }
            },
        }
    }

    async fn summary(&mut self, outcome: &str) -> String {
        let row: Option<(Option<String>, Option<String>)> =
            sqlx::query_as("SELECT outcome, stop_requested_by FROM turns WHERE id = $1")
                .bind(self.turn_id)
                .fetch_optional(&self.shared.db)
                .await
                .ok()
                .flatten();
        let (answer, stopped_by) = row.unwrap_or_default();
        if outcome == "stopped"
            && self.view.stopped_by.is_none()
            && let Some(by) = stopped_by
        {
            self.view.stopped_by = Some(by);
        }
        let total = self.view.total_steps();
        let failed = self.view.earlier_failed
            + self.view.steps.iter().filter(|s| !s.succeeded()).count() as u64;
        let mut s = format!(
            "**{}** · {total} step{} ({failed} failed) · {}",
            match outcome {
                "done" => "Done",
                "stopped" => "Stopped",
                "bounded" => "Stopped at a limit",
                _ => "Failed",
            },
            if total == 1 { "" } else { "s" },
            super::card::human(self.started.elapsed())
        );
        if let Some(a) = answer.filter(|a| !a.trim().is_empty()) {
            let first: String = a.lines().take(3).collect::<Vec<_>>().join(" ");
            s.push_str(&format!(
                "\nAnswer (full text in the reply below): {}",
                crate::lark::markup::inert(&super::card::clip(&first, 200))
            ));
        }
        s
    }

    /// Writes the current view once, handling the answer by its meaning.
    async fn write(&mut self) {
        if let Some(since) = self.running_since
            && let Some(r) = self.view.running.as_mut()
        {
            r.2 = since.elapsed();
        }
        self.view.elapsed = self.started.elapsed();
        let now = Instant::now();
        self.last_write = Some(now);
        match self.mode {
            Mode::None => self.dirty = false,
            Mode::Patch => {
                let Some(message_id) = self.message_id.clone() else {
                    self.mode = Mode::None;
                    return;
                };
                let ended = self.view.summary.is_some();
                let r = self
                    .shared
                    .lark
                    .edit(&message_id, &Content::Card(self.view.card(false, !ended)))
                    .await;
                self.count("patch", outcome(&r));
                self.last_write = Some(Instant::now());
                match r {
                    Ok(()) => {
                        self.shared.metrics.progress_updates.inc();
                        self.dirty = false;
                        self.backoff = Duration::ZERO;
                    }
                    Err(e) if code_of(&e) == Some(230020) => self.back_off(),
                    Err(e) => {
                        self.shared.fallback(
                            &self.chat_id,
                            "none",
                            &format!("card PATCH failed: {e}"),
                        );
                        self.mode = Mode::None;
                        let _ = self.store().await;
                    }
                }
            }
            Mode::CardKit => {
                let text = self.view.markdown();
                for attempt in 0..2 {
                    let Some(card_id) = self.card_id.clone() else {
                        return;
                    };
                    let Ok(seq) = self.next_seq().await else {
                        return;
                    };
                    let uuid = self.uuid("content");
                    let r = self
                        .shared
                        .lark
                        .cardkit_content(&card_id, STEPS_ELEMENT, &text, seq, &uuid)
                        .await;
                    self.count("update", outcome(&r));
                    self.last_write = Some(Instant::now());
                    match r {
                        Ok(()) => {
                            self.shared.metrics.progress_updates.inc();
                            self.dirty = false;
                            self.backoff = Duration::ZERO;
                            return;
                        }
                        Err(e) => match code_of(&e) {
                            Some(300317) if attempt == 0 => self.resync().await,
                            Some(200850 | 300309) if attempt == 0 => {
                                if !self.enable_streaming().await {
                                    let _ = self
                                        .rotate_or_fall_back("streaming closed and not re-enabled")
                                        .await;
                                    // The new card (or the fallback) was made from the current
                                    // view.
                                    self.dirty = self.mode == Mode::Patch;
                                    return;
                                }
                            }
                            Some(230020) => {
                                self.back_off();
                                return;
                            }
                            _ => {
                                let _ = self
                                    .fall_back_to_patch(&format!("CardKit update failed: {e}"))
                                    .await;
                                self.dirty = false;
                                return;
                            }
                        },
                    }
                }
            }
        }
    }

    fn back_off(&mut self) {
        self.backoff = (self.backoff * 2).clamp(Duration::from_millis(500), MAX_BACKOFF);
        self.not_before = Instant::now() + self.backoff;
    }

    /// The end: closes streaming with the summary.
    async fn close(&mut self) {
        if self.mode == Mode::CardKit {
            let wait = self.write_at();
            tokio::time::sleep_until(wait).await;
            let summary = self.view.preview();
            self.settings(json!({"streaming_mode": false, "summary": {"content": summary}}))
                .await;
        }
    }
}

/// Streaming is re-enabled at four fifths of its lifetime.
fn renew_after(ttl: Duration) -> Duration {
    ttl.mul_f64(0.8)
}

fn outcome<T>(r: &Result<T, LarkError>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err(e) => match code_of(e) {
            Some(c) => c.to_string(),
            None => "error".into(),
        },
    }
}
