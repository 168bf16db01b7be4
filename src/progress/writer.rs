//! One turn's card writer: applies step events to the [`View`], and writes the card at most
//! once per interval (CardKit) or patch interval (fallback), with a live elapsed time while a
//! step runs. Each refused CardKit operation is handled by its meaning ([`Remedy`]): 300317
//! moves the sequence past the card's; 200850/300309 re-enable streaming (or move to a new
//! card, the old one retired without its Stop button); a rate limit, 200810 (the card is in an
//! interaction), 300120 (internal), 5xx or no answer is tried again on the same card with a
//! fresh sequence after a back-off (at most [`MAX_FAILURES`] in a row); anything else turns the
//! same message into a PATCHed card. A card message is posted only under the turn's
//! [`Posting`], so never after the answer went out; a refused card leaves the final answer
//! alone. The turn's end closes streaming and replaces the card by its final form: a header
//! saying how the turn ended, no Stop button.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::card::{STEPS_ELEMENT, STOP_ELEMENT, Step, View};
use super::{Gate, Msg, Posting, Shared};
use crate::agent::StepEvent;
use crate::exec::Place;
use crate::lark::client::{Content, LarkError, idempotency_key};

/// Card-message PATCHes per second all fallback cards of one replica share (the platform allows
/// about 50 a second for that API; streamed CardKit updates are exempt from API limits and keep
/// only each card's own interval).
const APP_PATCHES_PER_SEC: u32 = 45;
/// The least time between two writes of one streamed card: the platform allows 10 operations
/// a second per card.
const CARD_INTERVAL: Duration = Duration::from_millis(100);
/// Sequence numbers reserved per write of the `turns` row.
const SEQ_BLOCK: i32 = 100;
/// How often a running step's elapsed time is refreshed.
const TICK: Duration = Duration::from_secs(1);
/// Longest back-off after a transient refusal.
const MAX_BACKOFF: Duration = Duration::from_secs(8);
/// Transient refusals in a row after which the card is given up as if refused for good
/// (0.5 + 1 + 2 + 4 + 8 × 4 s ≈ 40 s of trying).
const MAX_FAILURES: u32 = 8;
/// Why a turn shows no card: its answer went out first.
const ANSWER_FIRST: &str = "the answer went out first";
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
    /// Orders the turn's card before its answer.
    gate: Arc<Gate>,
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
    /// Transient refusals in a row (reset by any accepted write).
    failures: u32,
    /// The runner let go of the turn: whoever resumes it writes the card from then on.
    left: bool,
    /// Lark calls this writer made, and those of the chat side once the turn ended.
    calls: u32,
    chat_calls: Option<u32>,
    /// `ToolStarted` events applied: the number of the step a tail must carry to be shown.
    steps_started: u64,
    /// When the writer last looked whether the bot left the chat.
    looked_at: Option<Instant>,
}

/// How often a card being written looks whether the bot left its chat.
const DEPARTED_EVERY: Duration = Duration::from_secs(1);

pub(super) async fn run(
    shared: &Shared,
    section: &str,
    turn_id: i64,
    mut rx: mpsc::Receiver<Msg>,
    mut tails: watch::Receiver<(u64, String)>,
    gate: Arc<Gate>,
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
        gate,
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
        failures: 0,
        left: false,
        calls: 0,
        chat_calls: None,
        steps_started: 0,
        looked_at: None,
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

/// What a refused card operation calls for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Remedy {
    /// 300317: the card has seen a higher sequence: jump a block ahead and try once more.
    Resync,
    /// 200850/300309: streaming was closed: turn it on again, or move to a new card.
    Reenable,
    /// A rate limit (230020, 11232, the client's own), the card busy in an interaction
    /// (200810), an internal error (300120), 5xx, no answer: the same write later, on the same
    /// card, with a fresh sequence.
    Later,
    /// Anything else (no scope, a card CardKit will not take): this card is done with.
    GiveUp,
}

fn remedy(e: &LarkError) -> Remedy {
    match e {
        LarkError::Api { code: 300317, .. } => Remedy::Resync,
        LarkError::Api {
            code: 200850 | 300309,
            ..
        } => Remedy::Reenable,
        LarkError::Api {
            code: 230020 | 11232 | 200810 | 300120,
            ..
        }
        | LarkError::RateLimited { .. }
        | LarkError::Overloaded { .. }
        | LarkError::Transport { .. }
        | LarkError::Token(_) => Remedy::Later,
        LarkError::Http { status, .. } if *status >= 500 => Remedy::Later,
        _ => Remedy::GiveUp,
    }
}

/// A card operation that did not land: what to do about it, and why (for the log).
struct Refused {
    remedy: Remedy,
    reason: String,
}

/// One CardKit operation on the turn's card.
#[derive(Clone, Copy)]
enum CardOp<'a> {
    /// Rewrites the `steps` element's text.
    Content(&'a str),
    /// Changes the card's settings (streaming mode, summary).
    Settings(&'a Value),
    /// Replaces the whole card.
    Replace(&'a Value),
    /// Removes an element.
    Remove(&'a str),
}

impl CardOp<'_> {
    fn name(self) -> &'static str {
        match self {
            CardOp::Content(_) => "update",
            CardOp::Settings(_) => "settings",
            CardOp::Replace(_) => "replace",
            CardOp::Remove(_) => "remove",
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
            if self.mode == Mode::CardKit
                && let Err(r) = self.enable_streaming().await
            {
                if r.remedy == Remedy::Later {
                    // The renewal tries again once the back-off allows.
                    self.enabled_at = Instant::now() - self.shared.config.streaming_ttl;
                }
                self.refused(r, "re-enabling streaming on resume").await;
            }
            self.dirty = true;
            return Ok(());
        }
        self.create_cardkit().await?;
        // The card (or the fallback's) was made from the current view.
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

    /// Creates a streaming CardKit card and posts it. When either is refused, the turn's card
    /// message (a card moved from) is PATCHed from then on, or, when it has none yet, the card
    /// is posted as a card message. Nothing is made or posted once the answer is on its way
    /// (unless the answer waits for it): a card then would land below the answer.
    async fn create_cardkit(&mut self) -> sqlx::Result<()> {
        let Some(posting) = Posting::begin(&self.gate) else {
            return self.fall_back(ANSWER_FIRST, None).await;
        };
        let card = self.view.card(true);
        let created = self.shared.lark.cardkit_create(&card).await;
        self.count("create", outcome(&created));
        let card_id = match created {
            Ok(id) => id,
            Err(e) => {
                return self
                    .fall_back(
                        &format!("creating a CardKit card failed: {e}"),
                        Some(posting),
                    )
                    .await;
            }
        };
        if !posting.post() {
            drop(posting);
            return self.fall_back(ANSWER_FIRST, None).await;
        }
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
                self.enabled_at = Instant::now();
                // Recorded before the answer may go out (`posting` dropped after it).
                let stored = self.store().await;
                drop(posting);
                stored
            }
            Err(e) => {
                drop(posting);
                self.fall_back(&format!("sending the CardKit card failed: {e}"), None)
                    .await
            }
        }
    }

    /// The turn's card message stays its one card: PATCHed from now on when there is one,
    /// else the card is posted as a card message (under `posting` when the caller holds it).
    async fn fall_back(&mut self, reason: &str, posting: Option<Posting>) -> sqlx::Result<()> {
        if self.message_id.is_some() {
            drop(posting);
            self.fall_back_in_place(reason).await;
            return Ok(());
        }
        let posting = posting
            .or_else(|| Posting::begin(&self.gate))
            .filter(Posting::post);
        match posting {
            Some(p) => self.fall_back_to_patch(reason, p).await,
            None => {
                // A card posted now would land below the answer: this turn shows none.
                tracing::debug!(
                    turn_id = self.turn_id,
                    reason,
                    "the answer went out before the progress card; the turn has none"
                );
                self.mode = Mode::None;
                self.store().await
            }
        }
    }

    /// Posts the card as a card message (the turn has none yet), to be PATCHed from then on;
    /// `none` when that is refused too.
    async fn fall_back_to_patch(&mut self, reason: &str, posting: Posting) -> sqlx::Result<()> {
        let card = self.view.card(false);
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
        let stored = self.store().await;
        drop(posting);
        stored
    }

    /// CardKit is done with this card: its streaming is closed (one try) and the same message
    /// is PATCHed with the whole card from now on. No second card is posted, so the chat never
    /// shows two Stop buttons for one turn.
    async fn fall_back_in_place(&mut self, reason: &str) {
        if self.card_id.is_some() {
            let off = json!({"streaming_mode": false});
            let _ = self.cardkit(CardOp::Settings(&off)).await;
        }
        self.shared.fallback(&self.chat_id, "patch", reason);
        self.mode = Mode::Patch;
        self.card_id = None;
        self.dirty = true;
        self.failures = 0;
        self.backoff = Duration::ZERO;
        if let Err(e) = self.store().await {
            tracing::warn!(turn_id = self.turn_id, error = %e, "progress card state could not be stored");
        }
    }

    /// The card's streaming cannot be turned on again: moves to a new card (bounded), the old
    /// one retired first — its Stop button gone, so two never show at once. Falls back in
    /// place instead when the rotations ran out, when the answer is on its way (a new card
    /// would land below it), or when the old card cannot be retired.
    async fn replace_card(&mut self, reason: &str) {
        if self.rotations >= MAX_ROTATIONS || self.gate.answer_started() {
            return self.fall_back_in_place(reason).await;
        }
        let retired = self.view.retired_card();
        if self.settle(CardOp::Replace(&retired)).await.is_err()
            && self.settle(CardOp::Remove(STOP_ELEMENT)).await.is_err()
        {
            return self.fall_back_in_place(reason).await;
        }
        self.rotations += 1;
        tracing::info!(turn_id = self.turn_id, reason, "progress card rotated");
        // The sequence keeps counting up: any start is good for a new card.
        if let Err(e) = self.create_cardkit().await {
            tracing::warn!(turn_id = self.turn_id, error = %e, "progress card state could not be stored");
        }
        // The new card (or the fallback) was made from the current view.
        self.dirty = self.mode == Mode::Patch;
    }

    /// Turns streaming on (again).
    async fn enable_streaming(&mut self) -> Result<(), Refused> {
        self.cardkit(CardOp::Settings(&json!({"streaming_mode": true})))
            .await?;
        self.enabled_at = Instant::now();
        Ok(())
    }

    /// Sends `op` to the card with the sequence discipline: a fresh sequence for each attempt,
    /// and one more attempt after 300317 (the sequence moved a block ahead first).
    async fn cardkit(&mut self, op: CardOp<'_>) -> Result<(), Refused> {
        for attempt in 0..2 {
            let Some(card_id) = self.card_id.clone() else {
                break;
            };
            let seq = match self.next_seq().await {
                Ok(seq) => seq,
                Err(e) => {
                    return Err(Refused {
                        remedy: Remedy::Later,
                        reason: format!("reserving sequence numbers failed: {e}"),
                    });
                }
            };
            let uuid = self.uuid(op.name());
            let lark = &self.shared.lark;
            let r = match op {
                CardOp::Content(text) => {
                    lark.cardkit_content(&card_id, STEPS_ELEMENT, text, seq, &uuid)
                        .await
                }
                CardOp::Settings(config) => {
                    lark.cardkit_settings(&card_id, config, seq, &uuid).await
                }
                CardOp::Replace(card) => lark.cardkit_update(&card_id, card, seq, &uuid).await,
                CardOp::Remove(element) => {
                    lark.cardkit_delete_element(&card_id, element, seq, &uuid)
                        .await
                }
            };
            self.count(op.name(), outcome(&r));
            self.last_write = Some(Instant::now());
            match r {
                Ok(()) => {
                    self.failures = 0;
                    self.backoff = Duration::ZERO;
                    return Ok(());
                }
                Err(e) => match remedy(&e) {
                    Remedy::Resync if attempt == 0 => self.resync().await,
                    // Out of sequence even after the jump: something else writes this card.
                    Remedy::Resync => {
                        return Err(Refused {
                            remedy: Remedy::GiveUp,
                            reason: e.to_string(),
                        });
                    }
                    remedy => {
                        return Err(Refused {
                            remedy,
                            reason: e.to_string(),
                        });
                    }
                },
            }
        }
        Err(Refused {
            remedy: Remedy::GiveUp,
            reason: "no card".into(),
        })
    }

    /// `op`, tried again on the same card after each transient refusal, paced by the card's
    /// interval and the back-off (at most [`MAX_FAILURES`] in a row): for the writes that must
    /// land before the writer moves on.
    async fn settle(&mut self, op: CardOp<'_>) -> Result<(), Refused> {
        loop {
            tokio::time::sleep_until(self.write_at()).await;
            match self.cardkit(op).await {
                Err(r) if r.remedy == Remedy::Later && self.back_off() => continue,
                other => return other,
            }
        }
    }

    /// Handles a refused write by its remedy: later (backed off; given up after
    /// [`MAX_FAILURES`] in a row), a new card, or the same message PATCHed.
    async fn refused(&mut self, r: Refused, what: &str) {
        match r.remedy {
            Remedy::Later if self.back_off() => {}
            Remedy::Later => {
                self.fall_back_in_place(&format!("{what} kept failing: {}", r.reason))
                    .await;
            }
            Remedy::Reenable => {
                self.replace_card(&format!("{what}: streaming closed and not re-enabled"))
                    .await;
            }
            Remedy::Resync | Remedy::GiveUp => {
                self.fall_back_in_place(&format!("{what} failed: {}", r.reason))
                    .await;
            }
        }
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
        // Whether the bot's leaving the chat was looked for since the turn ended.
        let mut looked = false;
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
            if ended && !looked {
                looked = true;
                if self.departed().await {
                    return;
                }
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
                && let Err(r) = self.enable_streaming().await
            {
                self.refused(r, "re-enabling streaming").await;
            }
            if ended && self.mode == Mode::CardKit {
                // The final card carries everything: no last content update before it.
                self.close().await;
                if self.mode == Mode::CardKit {
                    return;
                }
                // Fell back: the final card goes out as a PATCH below.
                continue;
            }
            if self.dirty && now >= self.write_at() {
                // The bot may have left the chat (on any replica): looked for at most every
                // few seconds while the card is written.
                if self.looked_at.is_none_or(|t| now >= t + DEPARTED_EVERY) {
                    self.looked_at = Some(now);
                    if self.departed().await {
                        return;
                    }
                }
                self.write().await;
            }
            if ended && !self.dirty {
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

    /// The least time between two writes of this card: the configured one (≥ 100 ms, so a card
    /// stays under its 10 operations a second). Streamed CardKit updates are exempt from the
    /// platform's API limits; a PATCHed fallback card is not, so that interval is stretched
    /// until all live cards of this replica together stay within [`APP_PATCHES_PER_SEC`].
    fn interval(&self) -> Duration {
        let base = match self.mode {
            Mode::Patch => self.shared.config.patch_interval,
            _ => return self.shared.config.interval.max(CARD_INTERVAL),
        };
        let live = self
            .shared
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
            .max(1) as u32;
        base.max(Duration::from_secs(1) * live / APP_PATCHES_PER_SEC)
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
                if self.mode == Mode::CardKit && !self.departed().await {
                    // A streaming card cannot be updated from a callback: pause streaming
                    // (best effort); the next renewal turns it on again.
                    let pause = json!({"streaming_mode": false});
                    let _ = self.cardkit(CardOp::Settings(&pause)).await;
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
                    self.view.outcome = Some(outcome);
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
            super::card::ended(outcome).0,
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

    /// Brings the times the card shows up to now.
    fn stamp(&mut self) {
        if let Some(since) = self.running_since
            && let Some(r) = self.view.running.as_mut()
        {
            r.2 = since.elapsed();
        }
        self.view.elapsed = self.started.elapsed();
    }

    /// Writes the current view once, handling a refusal by its meaning.
    async fn write(&mut self) {
        self.stamp();
        self.last_write = Some(Instant::now());
        match self.mode {
            Mode::None => self.dirty = false,
            Mode::Patch => {
                let Some(message_id) = self.message_id.clone() else {
                    self.mode = Mode::None;
                    return;
                };
                // A finished turn's card has its final header and no Stop button.
                let r = self
                    .shared
                    .lark
                    .edit(&message_id, &Content::Card(self.view.card(false)))
                    .await;
                self.count("patch", outcome(&r));
                self.last_write = Some(Instant::now());
                match r {
                    Ok(()) => {
                        self.shared.metrics.progress_updates.inc();
                        self.dirty = false;
                        self.failures = 0;
                        self.backoff = Duration::ZERO;
                    }
                    Err(e) if remedy(&e) == Remedy::Later && self.back_off() => {}
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
                let mut reenabled = false;
                loop {
                    let r = match self.cardkit(CardOp::Content(&text)).await {
                        Ok(()) => {
                            self.shared.metrics.progress_updates.inc();
                            self.dirty = false;
                            return;
                        }
                        Err(r) => r,
                    };
                    if r.remedy == Remedy::Reenable && !reenabled {
                        reenabled = true;
                        match self.enable_streaming().await {
                            Ok(()) => continue,
                            Err(r) => return self.refused(r, "re-enabling streaming").await,
                        }
                    }
                    return self.refused(r, "a CardKit update").await;
                }
            }
        }
    }

    /// Waits before the next write after a transient refusal (0.5 s doubling to
    /// [`MAX_BACKOFF`]); false once [`MAX_FAILURES`] came in a row.
    fn back_off(&mut self) -> bool {
        self.failures += 1;
        if self.failures > MAX_FAILURES {
            return false;
        }
        self.backoff = (self.backoff * 2).clamp(Duration::from_millis(500), MAX_BACKOFF);
        self.not_before = Instant::now() + self.backoff;
        true
    }

    /// Whether the bot left the turn's chat (removed, or the chat disbanded): then nothing is
    /// written there again, and the card stays as it was. One read, at a stop and at the end.
    async fn departed(&mut self) -> bool {
        if self.mode == Mode::None {
            return true;
        }
        match crate::lifecycle::is_departed(&self.shared.db, &self.chat_id).await {
            Ok(false) => false,
            Ok(true) => {
                tracing::info!(turn_id = self.turn_id, lark.chat_id = %self.chat_id, "the bot left this chat; its progress card is not written again");
                self.mode = Mode::None;
                self.dirty = false;
                true
            }
            Err(e) => {
                tracing::debug!(turn_id = self.turn_id, error = %e, "could not read whether the bot left the chat");
                false
            }
        }
    }

    /// The end of the turn on a CardKit card: streaming closed with the summary, then the
    /// whole card replaced by its final form (a header saying how the turn ended, no Stop
    /// button). A card that will not take it loses its Stop button at least; one that will not
    /// take that either is left to the PATCH fallback, which sends the final card.
    async fn close(&mut self) {
        let summary = self.view.preview();
        let settings = json!({"streaming_mode": false, "summary": {"content": summary}});
        if let Err(r) = self.settle(CardOp::Settings(&settings)).await {
            tracing::debug!(turn_id = self.turn_id, reason = %r.reason, "closing streaming failed");
        }
        self.stamp();
        let card = self.view.card(false);
        let Err(r) = self.settle(CardOp::Replace(&card)).await else {
            self.shared.metrics.progress_updates.inc();
            self.dirty = false;
            return;
        };
        if self.settle(CardOp::Remove(STOP_ELEMENT)).await.is_err() {
            self.fall_back_in_place(&format!("the final card was refused: {}", r.reason))
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
