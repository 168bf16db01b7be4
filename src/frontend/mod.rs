//! The Lark front-end of the chat domain: the inbox [`Handler`] that turns Lark events into
//! the domain's messages and clicks (a target's approval card: [`target_approval_card`]; a parked
//! call's: [`call_approval_card`]), the [`Reply`], [`AdminChannel`] and the agent's
//! [`ChatOut`] that answer through the Open API, the [`Source`] a message's quoted messages and
//! files are read from (in the worker), and the [`LarkTriage`] the callback path asks
//! (an event's lane: express, inert or ordered; card toasts) without I/O — but for a progress
//! card's Stop click, whose toast reads its turn's state (one row by key, bounded) — and the
//! [`busy_answer`] both callback paths give a click they could not record.
//! Never: decides what a message means (that is [`crate::chat`]).

pub mod call_approval_card;
pub mod long_connection;
pub mod schedule_card;
pub mod target_approval_card;

use std::sync::Arc;

use anyhow::Context;
use async_trait::async_trait;
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::agent::ChatOut;
use crate::authz::{self, Actor};
use crate::chat::target_approval;
use crate::chat::{
    self, AdminChannel, Deps, FileRef, Incoming, Quoted, Reply, Source, TargetApprovalView,
    ThreadError, Unavailable,
};
use crate::config::Config;
use crate::inbox::{Handler, InboxEvent};
use crate::lark::client::{
    self as lark_client, Content, DownloadError, LarkClient, LarkError, Sent, idempotency_key,
};
use crate::lark::event::{self, CardAction, Message, MessageReceive};
use crate::lark::markup;
use crate::lark::webhook::Envelope;

/// Lark refuses thread replies in this chat.
const THREADS_NOT_ALLOWED: i64 = 230071;
/// A resource inside a forwarded bundle's messages or a card: never downloadable.
const IN_BUNDLE_OR_CARD: i64 = 234043;
/// The app lacks a scope the API needs.
const NO_SCOPE: i64 = 99991672;
/// The message was deleted / recalled.
const DELETED: i64 = 230110;
const RECALLED: i64 = 230011;
/// The bot is not in the message's chat.
const NOT_IN_CHAT: i64 = 230002;

/// The inbox handler for Lark events.
pub struct LarkHandler {
    pub lark: Arc<LarkClient>,
    pub deps: Deps,
    /// The agent and its progress cards, for the cards' Stop button.
    pub agent: Arc<crate::agent::Agent>,
    pub progress: crate::progress::Progress,
}

#[async_trait]
impl Handler for LarkHandler {
    async fn handle(&self, ev: &InboxEvent) -> anyhow::Result<()> {
        match ev.event_type.as_str() {
            event::MESSAGE_RECEIVE => {
                let Some(msg) = self.message(ev).await? else {
                    return Ok(());
                };
                // Recalled before it was handled: not handled, nothing of it stored.
                if crate::lifecycle::is_recalled(&self.deps.db, &msg.message_id)
                    .await
                    .context("reading recalls")?
                {
                    tracing::info!(lark.message_id = %msg.message_id, "message recalled before it was handled; skipped");
                    // The inbox's copy of it, stored before the recall was known, goes too.
                    return self.agent.recall(&msg.message_id, Some(&msg.chat_id)).await;
                }
                let retry = ev.attempts > 1;
                // The agent reads the message as written in this turn; the event log (and so
                // exports) keeps it masked.
                log(
                    &self.deps.db,
                    &msg,
                    retry,
                    "message.received",
                    json!({
                        "event_id": msg.event_id, "message_id": msg.message_id,
                        "chat_id": msg.chat_id, "thread_id": msg.thread_id,
                        "sender": msg.sender_open_id, "text": self.deps.masked(&msg.text).await,
                        "mentions_bot": msg.mentions_bot,
                    }),
                )
                .await?;
                let reply = LarkReply {
                    lark: self.lark.clone(),
                    db: self.deps.db.clone(),
                    msg: msg.clone(),
                    retry,
                    deps: self.deps.clone(),
                };
                chat::dispatch(&self.deps, &incoming(&msg), &reply).await?;
                // Recalled while it was being handled: what was stored meanwhile goes too.
                if crate::lifecycle::is_recalled(&self.deps.db, &msg.message_id)
                    .await
                    .context("reading recalls")?
                {
                    self.agent
                        .recall(&msg.message_id, Some(&msg.chat_id))
                        .await?;
                }
                Ok(())
            }
            event::MESSAGE_RECALLED => {
                let r = match event::MessageRecalled::from_envelope(&ev.payload) {
                    Ok(r) => r,
                    Err(e) => {
                        tracing::warn!(lark.event_id = %ev.event_id, error = %e, "unreadable recall event; skipped");
                        return Ok(());
                    }
                };
                tracing::info!(lark.message_id = %r.message_id, lark.recall_type = %r.recall_type, "message recalled");
                let chat = (!r.chat_id.is_empty()).then_some(r.chat_id.as_str());
                self.agent.recall(&r.message_id, chat).await
            }
            event::CARD_ACTION => {
                let a = match CardAction::from_envelope(&ev.payload) {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(lark.event_id = %ev.event_id, error = %e, "unreadable card action; skipped");
                        return Ok(());
                    }
                };
                if crate::progress::is_stop_click(&a.action.value) {
                    return self.stop_click(&a).await;
                }
                if call_approval_card::read(&a.action.value).is_some() {
                    return self.call_click(&a).await;
                }
                if let Some((proposal, add)) = schedule_card::read(&a.action.value) {
                    let decided = chat::cron::decide_proposal(
                        &self.deps,
                        proposal,
                        &a.operator.open_id,
                        &a.context.open_chat_id,
                        add,
                    )
                    .await?;
                    if let Some((view, Some(card))) = decided
                        && let Err(e) = self
                            .lark
                            .edit(&card, &Content::Card(schedule_card::card(&view)))
                            .await
                    {
                        tracing::warn!(lark.message_id = %card, error = %e, "updating a schedule card failed");
                    }
                    return Ok(());
                }
                target_approval::apply_click(
                    &self.deps,
                    &target_approval::Click {
                        message_id: a.context.open_message_id,
                        operator: a.operator.open_id,
                        value: a.action.value,
                    },
                )
                .await
            }
            event::BOT_REMOVED | event::CHAT_DISBANDED => {
                let m = match event::ChatMembers::from_envelope(&ev.payload, event::BOT_REMOVED) {
                    Ok(m) => m,
                    Err(e) => {
                        tracing::warn!(lark.event_id = %ev.event_id, error = %e, "unreadable chat event; skipped");
                        return Ok(());
                    }
                };
                let gone = if ev.event_type == event::CHAT_DISBANDED {
                    chat::leave::Gone::Disbanded
                } else {
                    chat::leave::Gone::Removed
                };
                let operator = m.operator_id.as_ref().and_then(|o| o.open_id.as_deref());
                chat::leave::bot_left(&self.deps, &m.chat_id, gone, operator).await?;
                Ok(())
            }
            event::BOT_ADDED => {
                let m = match event::ChatMembers::from_envelope(&ev.payload, event::BOT_ADDED) {
                    Ok(m) => m,
                    Err(e) => {
                        tracing::warn!(lark.event_id = %ev.event_id, error = %e, "unreadable chat event; skipped");
                        return Ok(());
                    }
                };
                chat::leave::bot_added(&self.deps, &m.chat_id).await
            }
            event::USERS_REMOVED => {
                let m = match event::ChatMembers::from_envelope(&ev.payload, event::USERS_REMOVED) {
                    Ok(m) => m,
                    Err(e) => {
                        tracing::warn!(lark.event_id = %ev.event_id, error = %e, "unreadable chat event; skipped");
                        return Ok(());
                    }
                };
                chat::leave::people_left(&self.deps, &m.chat_id, &m.open_ids()).await?;
                Ok(())
            }
            // A schedule's firing, written by the scheduler in the thread's order.
            crate::schedule::FIRED => {
                let firing = match ev
                    .payload
                    .get("firing")
                    .cloned()
                    .map(serde_json::from_value::<crate::schedule::Firing>)
                {
                    Some(Ok(f)) => f,
                    _ => {
                        tracing::warn!(inbox.event_id = %ev.event_id, "unreadable schedule firing; skipped");
                        return Ok(());
                    }
                };
                let state = chat::cron::fire(&self.deps, &firing).await?;
                tracing::info!(schedule.id = firing.schedule_id, schedule.due = %firing.due_at, schedule.result = state.as_str(), "schedule fired");
                Ok(())
            }
            // `LarkTriage::lane` records these inert, so only an event recorded before it did
            // reaches this arm; an event type handled above must have its lane there too.
            other => {
                tracing::debug!(lark.event_id = %ev.event_id, lark.event_type = %other, "event type not handled; skipped");
                Ok(())
            }
        }
    }

    async fn dead_lettered(&self, ev: &InboxEvent, _error: &str) {
        if ev.event_type != event::MESSAGE_RECEIVE {
            return;
        }
        let told = async {
            let Some(msg) = self.message(ev).await? else {
                return anyhow::Ok(());
            };
            let reply = LarkReply {
                lark: self.lark.clone(),
                db: self.deps.db.clone(),
                msg,
                retry: true,
                deps: self.deps.clone(),
            };
            reply
                .answer(
                    "Sorry, I could not handle this message after several tries; it was set aside. Please send it again.",
                    "dead-letter",
                )
                .await
        }
        .await;
        if let Err(e) = told {
            tracing::warn!(lark.event_id = %ev.event_id, error = format!("{e:#}"), "telling the user about a dead-lettered event failed");
        }
    }
}

impl LarkHandler {
    /// A progress card's Stop button. The click was already answered with a toast (by
    /// [`LarkTriage`], from the same rule); here it takes effect, or its refusal is audited.
    async fn stop_click(&self, a: &CardAction) -> anyhow::Result<()> {
        let value = &a.action.value;
        let operator = a.operator.open_id.as_str();
        let card_chat = crate::progress::stop_card_chat(value);
        if authz::press_stop(card_chat, &a.context.open_chat_id).is_err() {
            let mut conn = self
                .deps
                .db
                .acquire()
                .await
                .context("auditing a stop click")?;
            crate::audit::record_chat(
                &mut conn,
                crate::audit::ChatEntry {
                    actor: operator,
                    action: "turn.stop",
                    section: value.get("section").and_then(Value::as_str),
                    target: None,
                    outcome: "refused",
                    detail: json!({
                        "reason": "the Stop button was clicked outside the card's chat",
                        "chat": a.context.open_chat_id,
                    }),
                },
            )
            .await
            .context("auditing a stop click")?;
            return Ok(());
        }
        match crate::progress::on_stop_click(&self.progress, &self.agent, value, operator, true)
            .await
        {
            Some(Ok(said)) => {
                tracing::info!(lark.operator = %operator, answer = %said, "stop requested from a progress card");
                Ok(())
            }
            Some(Err(e)) => Err(e.context("stopping a turn from its progress card")),
            None => Ok(()),
        }
    }

    /// A click on a parked call's approval card: recorded (or refused) and audited, then the
    /// card rewritten to show who decided and when.
    async fn call_click(&self, a: &CardAction) -> anyhow::Result<()> {
        let operator = a.operator.open_id.as_str();
        let actor = Actor::User {
            open_id: operator,
            admin: self.deps.config.is_admin(operator),
        };
        let applied = call_approval_card::apply(
            &self.deps.db,
            &a.action.value,
            actor,
            &a.context.open_message_id,
            self.deps.config.chat.yolo_ttl,
        )
        .await?;
        if let Some((message_id, card)) = applied.rewrite
            && let Err(e) = self.lark.edit(&message_id, &Content::Card(card)).await
        {
            // The decision stands; only the card shows it late.
            tracing::warn!(lark.message_id = %message_id, error = %e, "updating an approval card failed");
        }
        Ok(())
    }

    /// The domain message of a message event; `None` for bots and unreadable bodies.
    async fn message(&self, ev: &InboxEvent) -> anyhow::Result<Option<Message>> {
        let received = match MessageReceive::from_envelope(&ev.payload) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(lark.event_id = %ev.event_id, error = %e, "unreadable message event; skipped");
                return Ok(None);
            }
        };
        if received.from_bot() {
            return Ok(None);
        }
        let bot = self
            .lark
            .bot_open_id()
            .await
            .context("looking up the bot's open_id")?;
        Ok(Some(received.into_message(&ev.event_id, &bot)))
    }
}

fn incoming(m: &Message) -> Incoming {
    Incoming {
        event_id: m.event_id.clone(),
        message_id: m.message_id.clone(),
        chat_id: m.chat_id.clone(),
        thread_id: m.thread_id.clone(),
        root_id: m.root_id.clone(),
        sender: m.sender_open_id.clone(),
        text: m.addressed_text.clone(),
        addressed: m.mentions_bot || m.is_p2p(),
        direct: m.is_p2p(),
        parent_id: m.parent_id.clone(),
        files: m.resources.iter().map(file_ref).collect(),
        forwarded: m.forwarded,
        sticker: m.sticker,
    }
}

fn file_ref(r: &event::Resource) -> FileRef {
    FileRef {
        key: r.key.clone(),
        kind: r.kind.clone(),
        name: r.name.clone(),
    }
}

/// Lark's refusals of a message read or a download, in words for the model and the user.
fn unavailable(e: &LarkError) -> String {
    match e {
        LarkError::Api { code, .. } => match *code {
            IN_BUNDLE_OR_CARD => "Lark does not let bots download files inside forwarded messages or cards (234043)".into(),
            NO_SCOPE => "the bot lacks the permission (reading a message needs the scope im:message or im:message:readonly; downloading its files also takes im:message.history:readonly)".into(),
            DELETED | RECALLED => "it was deleted or recalled".into(),
            NOT_IN_CHAT => "the bot is not in the chat it was sent in".into(),
            code => format!("Lark refused it (code {code})"),
        },
        LarkError::Http { status: 404, .. } => "it does not exist (or no longer)".into(),
        other => format!("Lark could not be asked: {other}"),
    }
}

/// A fetched message as the chat layer reads it.
fn quoted(f: lark_client::Fetched, app_id_hint: &str) -> Quoted {
    let mentions: Vec<event::Mention> = f
        .mentions
        .iter()
        .map(|(key, name)| event::Mention {
            key: key.clone(),
            id: Default::default(),
            name: name.clone(),
        })
        .collect();
    let body = event::readable(&f.msg_type, &f.content, &mentions);
    let sender = if f.sender_type == "app" {
        if f.sender_id == app_id_hint {
            "this bot".to_string()
        } else {
            format!("a bot ({})", f.sender_id)
        }
    } else {
        f.sender_id.clone()
    };
    let text = if f.deleted {
        "[deleted]".to_string()
    } else if f.msg_type == "merge_forward" {
        "[forwarded messages]".to_string()
    } else {
        body.text
    };
    Quoted {
        message_id: f.message_id,
        sender,
        text,
        files: body.resources.iter().map(file_ref).collect(),
        in_bundle: f.upper_message_id.is_some(),
    }
}

#[async_trait]
impl Source for LarkReply {
    async fn messages(&self, message_id: &str) -> Result<Vec<Quoted>, Unavailable> {
        match self.lark.get_message(message_id).await {
            Ok(list) => Ok(list
                .into_iter()
                .map(|f| quoted(f, self.lark.app_id()))
                .collect()),
            Err(e) => Err(Unavailable::Refused(unavailable(&e))),
        }
    }

    async fn download(
        &self,
        message_id: &str,
        file: &FileRef,
        max: u64,
    ) -> Result<Vec<u8>, Unavailable> {
        let kind = if file.kind == "image" {
            "image"
        } else {
            "file"
        };
        match self.lark.download(message_id, &file.key, kind, max).await {
            Ok(b) => Ok(b),
            Err(DownloadError::TooLarge { limit }) => Err(Unavailable::TooLarge {
                limit_mb: limit / (1024 * 1024),
            }),
            Err(DownloadError::Lark(e)) => Err(Unavailable::Refused(unavailable(&e))),
        }
    }
}

/// Answers one message through the Open API, and logs the answer in its section.
pub struct LarkReply {
    pub lark: Arc<LarkClient>,
    pub db: PgPool,
    pub msg: Message,
    pub retry: bool,
    /// For what the event log keeps of a reply (masked).
    pub deps: Deps,
}

impl LarkReply {
    async fn send(&self, text: &str, purpose: &str, in_thread: bool) -> Result<Sent, LarkError> {
        let uuid = idempotency_key(&self.msg.event_id, purpose);
        self.lark
            .reply(
                &self.msg.message_id,
                &Content::Post(post_content(text)),
                in_thread,
                &uuid,
                Some(&self.msg.chat_id),
            )
            .await
    }

    async fn logged(&self, text: &str, purpose: &str, sent: &Sent) -> anyhow::Result<()> {
        log(
            &self.db,
            &self.msg,
            self.retry,
            "bot.reply",
            json!({
                "event_id": self.msg.event_id, "purpose": purpose,
                "message_id": sent.message_id, "in_reply_to": self.msg.message_id,
                "thread_id": sent.thread_id, "text": self.deps.masked(text).await,
            }),
        )
        .await
    }
}

#[async_trait]
impl Reply for LarkReply {
    /// A command's reply, as posts that each fit Lark's 30 KB request limit as sent (a long
    /// `/memory list` does not fit one), in order; each part has its own idempotency key.
    async fn answer(&self, text: &str, purpose: &str) -> anyhow::Result<()> {
        let parts = crate::agent::markdown_chunks(
            text,
            answer_request_bytes,
            lark_client::MAX_POST_REQUEST,
        );
        for (i, part) in parts.iter().enumerate() {
            let purpose = match i {
                0 => purpose.to_string(),
                _ => format!("{purpose}:{i}"),
            };
            let sent = self
                .send(part, &purpose, self.msg.thread_id.is_some())
                .await
                .context("replying in Lark")?;
            self.logged(part, &purpose, &sent).await?;
        }
        Ok(())
    }

    async fn open_thread(&self, text: &str, purpose: &str) -> Result<Option<String>, ThreadError> {
        match self.send(text, purpose, true).await {
            Ok(sent) => {
                self.logged(text, purpose, &sent).await?;
                Ok(sent.thread_id)
            }
            Err(LarkError::Api { code, .. }) if code == THREADS_NOT_ALLOWED => {
                Err(ThreadError::NotAllowed)
            }
            Err(e) => Err(ThreadError::Other(
                anyhow::Error::new(e).context("opening a thread in Lark"),
            )),
        }
    }

    fn source(&self) -> Option<&dyn Source> {
        Some(self)
    }
}

/// Where schedules' firings post: a reply in the thread to its root, or a message to the chat.
pub struct LarkAnchors {
    pub lark: Arc<LarkClient>,
}

#[async_trait]
impl chat::Anchors for LarkAnchors {
    async fn post(
        &self,
        place: &chat::AnchorPlace,
        text: &str,
        key: &str,
    ) -> anyhow::Result<String> {
        let content = Content::Post(post_content(text));
        let uuid = idempotency_key(key, "schedule");
        let sent = match &place.root_message_id {
            Some(root) => {
                self.lark
                    .reply(root, &content, true, &uuid, Some(&place.chat_id))
                    .await
            }
            None => self.lark.send(&place.chat_id, &content, &uuid).await,
        }
        .context("posting a schedule's message in Lark")?;
        Ok(sent.message_id)
    }
}

/// Approval cards to admins, one-to-one.
pub struct LarkAdmins {
    pub lark: Arc<LarkClient>,
}

#[async_trait]
impl AdminChannel for LarkAdmins {
    async fn send_target_approval(
        &self,
        admin_open_id: &str,
        view: &TargetApprovalView,
        key: &str,
    ) -> anyhow::Result<String> {
        let sent = self
            .lark
            .send_to_user(
                admin_open_id,
                &Content::Card(target_approval_card::card(view)),
                &idempotency_key(key, "approval"),
            )
            .await
            .context("sending an approval card")?;
        Ok(sent.message_id)
    }

    async fn update_target_approval(
        &self,
        message_id: &str,
        view: &TargetApprovalView,
    ) -> anyhow::Result<()> {
        self.lark
            .edit(message_id, &Content::Card(target_approval_card::card(view)))
            .await
            .context("updating an approval card")?;
        Ok(())
    }
}

/// How the inbox treats an event ([`LarkTriage::lane`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// Handled in its section's order.
    Ordered,
    /// Handled at once, never behind its section (`/stop`, card actions).
    Express,
    /// Needs no handling: recorded as done, never claimed.
    Inert,
}

/// The callback path's questions, answered from the envelope and the config alone (a Stop
/// click's toast also reads its turn's state).
pub struct LarkTriage {
    pub config: Arc<Config>,
    /// Where a Stop click's turn is read.
    pub db: PgPool,
}

impl LarkTriage {
    /// How the inbox treats the event: [`Lane::Express`] when it must never wait behind other
    /// events of its section (`/stop`, card actions), [`Lane::Inert`] when the handler would do
    /// nothing with it (a message another app or this bot sent, an event type nothing handles),
    /// else [`Lane::Ordered`]. One parse of the body, and only of a message's.
    pub fn lane(&self, env: &Envelope) -> Lane {
        match env.event_type.as_str() {
            event::CARD_ACTION => Lane::Express,
            // A recall must catch its message before or while it is handled, and names no
            // thread: it waits for no section.
            event::MESSAGE_RECALLED => Lane::Express,
            // What a chat's end stops must not wait behind the chat's own messages.
            event::BOT_REMOVED
            | event::CHAT_DISBANDED
            | event::BOT_ADDED
            | event::USERS_REMOVED => Lane::Express,
            event::MESSAGE_RECEIVE => match MessageReceive::from_envelope_text(&env.payload) {
                // The handler skips these; the same rule (`from_bot`) decides here.
                Ok(m) if m.from_bot() => Lane::Inert,
                Ok(m) if chat::command::is_stop(&m.text_after_mentions()) => Lane::Express,
                // An unreadable body goes to the handler, which says so in the log.
                _ => Lane::Ordered,
            },
            _ => Lane::Inert,
        }
    }

    /// The inbox's event for a verified envelope.
    pub fn inbox_event(&self, env: Envelope) -> crate::inbox::NewEvent {
        let lane = self.lane(&env);
        crate::inbox::NewEvent {
            express: lane == Lane::Express,
            inert: lane == Lane::Inert,
            event_id: env.event_id,
            event_type: env.event_type,
            payload: env.payload,
            section: env.section,
            message_id: env.message_id,
        }
    }

    /// The synchronous answer to a card action (`{}` or a toast). Without I/O, but for a
    /// progress card's Stop click: one read of its turn's row, bounded, so a click on a
    /// finished task's card says so ([`crate::progress::stop_click_toast`]).
    pub async fn card_answer(&self, env: &Envelope) -> Value {
        let Ok(a) = CardAction::from_envelope_text(&env.payload) else {
            return json!({});
        };
        if crate::progress::is_stop_click(&a.action.value) {
            let (kind, text) = crate::progress::stop_click_toast(
                &self.db,
                &a.action.value,
                &a.context.open_chat_id,
            )
            .await;
            return json!({ "toast": { "type": kind, "content": text } });
        }
        let actor = Actor::User {
            open_id: &a.operator.open_id,
            admin: self.config.is_admin(&a.operator.open_id),
        };
        if let Some(t) = call_approval_card::toast(&a.action.value, actor) {
            return json!({ "toast": { "type": t.kind, "content": t.text } });
        }
        if let Some(t) = schedule_card::toast(&a.action.value) {
            return json!({ "toast": { "type": t.kind, "content": t.text } });
        }
        match target_approval::click_toast(actor, &a.action.value) {
            Some(t) => json!({ "toast": { "type": t.kind, "content": t.text } }),
            None => json!({}),
        }
    }
}

/// The `events_rejected` reason of a card click answered with [`busy_answer`].
pub const CLICK_BUSY: &str = "click_busy";

/// The answer to a card click that could not be recorded (the inbox saturated, the database
/// unreachable): HTTP 200 (or an acknowledgement with code 200) carrying an error toast. Lark
/// does not deliver a click again, and shows an error status to the user as error 200671, so
/// the click is never answered with one: the toast asks for another click.
pub fn busy_answer() -> Value {
    json!({ "toast": { "type": "error", "content": "Busy right now: this click was not taken. Please try again in a moment." } })
}

/// A `post` body with one `md` element holding `markdown` as a post renders it (tables as code
/// blocks, headings bold, code spans bare: [`markup::for_post`]) and made inert (no mentions, no
/// Lark tags).
pub fn post_content(markdown: &str) -> Value {
    let text = markup::for_post(markdown);
    json!({ "zh_cn": { "title": "", "content": [[{ "tag": "md", "text": text }]] } })
}

/// The bytes of the reply request that carries `markdown` as an answer chunk, serialized as
/// sent: what Lark's 30 KB limit measures.
pub fn answer_request_bytes(markdown: &str) -> usize {
    lark_client::reply_request_bytes(&Content::Post(post_content(markdown)))
}

#[async_trait]
impl ChatOut for LarkClient {
    async fn add_reaction(&self, message_id: &str, emoji: &str) -> anyhow::Result<String> {
        Ok(LarkClient::add_reaction(self, message_id, emoji).await?)
    }

    async fn add_receipt(&self, message_id: &str, emoji: &str) -> anyhow::Result<String> {
        Ok(LarkClient::add_receipt(self, message_id, emoji).await?)
    }

    async fn remove_reaction(&self, message_id: &str, reaction_id: &str) -> anyhow::Result<()> {
        Ok(LarkClient::remove_reaction(self, message_id, reaction_id).await?)
    }

    fn answer_size(&self, markdown: &str) -> usize {
        answer_request_bytes(markdown)
    }

    fn answer_limit(&self) -> usize {
        lark_client::MAX_POST_REQUEST
    }

    async fn reply_markdown(
        &self,
        chat_id: &str,
        message_id: &str,
        markdown: &str,
        in_thread: bool,
        uuid: &str,
    ) -> anyhow::Result<()> {
        let content = Content::Post(post_content(markdown));
        match self
            .reply(message_id, &content, in_thread, uuid, Some(chat_id))
            .await
        {
            Ok(_) => Ok(()),
            Err(
                e @ LarkError::Api {
                    code: lark_client::TOO_LARGE,
                    ..
                },
            ) => Err(anyhow::Error::new(e).context(crate::agent::TooLarge)),
            Err(e) => Err(e.into()),
        }
    }

    fn can_ask(&self) -> bool {
        true
    }

    async fn show_schedule_proposal(
        &self,
        chat_id: &str,
        reply_to: &str,
        in_thread: bool,
        view: &crate::schedule::ProposalView,
    ) -> anyhow::Result<Option<String>> {
        let sent = self
            .reply(
                reply_to,
                &Content::Card(schedule_card::card(view)),
                in_thread,
                &idempotency_key(&format!("schedule-proposal:{}", view.id), "card"),
                Some(chat_id),
            )
            .await?;
        Ok(Some(sent.message_id))
    }

    async fn show_call_approval(
        &self,
        c: &crate::agent::call_approval::CallApprovalCard,
    ) -> anyhow::Result<Option<String>> {
        let content = Content::Card(call_approval_card::card(&c.parked));
        if let Some(id) = &c.parked.card_message_id {
            self.edit(id, &content).await?;
            return Ok(Some(id.clone()));
        }
        // The uuid makes the post idempotent per (turn, call): a resumed runner posts nothing new.
        let key = format!("turn:{}:{}", c.parked.turn_id, c.parked.call_key);
        let sent = self
            .reply(
                &c.reply_to,
                &content,
                c.in_thread,
                &idempotency_key(&key, "approval"),
                Some(&c.chat_id),
            )
            .await?;
        Ok(Some(sent.message_id))
    }
}

/// Appends to the message's section log. On a retry, an entry of the same kind for the same
/// event is not written twice (the check scans one section, so it is done only on retries).
async fn log(
    db: &PgPool,
    msg: &Message,
    retry: bool,
    kind: &str,
    payload: Value,
) -> anyhow::Result<()> {
    if retry {
        let seen: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM session_events
             WHERE section_id = $1 AND kind = $2 AND payload->>'event_id' = $3
               AND payload->>'purpose' IS NOT DISTINCT FROM $4)",
        )
        .bind(msg.section())
        .bind(kind)
        .bind(&msg.event_id)
        .bind(payload.get("purpose").and_then(Value::as_str))
        .fetch_one(db)
        .await
        .context("reading the event log")?;
        if seen {
            return Ok(());
        }
    }
    crate::eventlog::append(db, msg.section(), kind, payload)
        .await
        .context("appending to the event log")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::markdown_chunks;

    fn envelope(event_type: &str, event: Value) -> Envelope {
        Envelope {
            event_id: "ev_1".into(),
            event_type: event_type.into(),
            payload: json!({"schema": "2.0", "event": event}).to_string(),
            section: None,
            message_id: None,
        }
    }

    fn message(sender_type: &str, text: &str) -> Value {
        json!({
            "sender": {"sender_id": {"open_id": "ou_1"}, "sender_type": sender_type},
            "message": {"message_id": "om_1", "chat_id": "oc_1", "chat_type": "group",
                "message_type": "text", "content": json!({"text": text}).to_string(),
                "mentions": []}
        })
    }

    /// Each event's lane: a person's message waits its turn, `/stop` and clicks go express,
    /// what a bot sent or no handler takes needs no handling (even a bot's `/stop`), and an
    /// unreadable message goes to the handler, which reports it.
    #[tokio::test]
    async fn the_triage_sends_each_event_down_its_lane() {
        let config = Config::from_vars(&|_| None, std::path::Path::new("/")).unwrap();
        let triage = LarkTriage {
            config: Arc::new(config),
            db: PgPool::connect_lazy("postgres://localhost/unused").unwrap(),
        };
        let lane = |t: &str, e: Value| triage.lane(&envelope(t, e));
        assert_eq!(
            lane(event::MESSAGE_RECEIVE, message("user", "hello")),
            Lane::Ordered
        );
        assert_eq!(
            lane(event::MESSAGE_RECEIVE, message("user", "/stop")),
            Lane::Express
        );
        assert_eq!(
            lane(event::MESSAGE_RECEIVE, message("app", "hello")),
            Lane::Inert
        );
        assert_eq!(
            lane(event::MESSAGE_RECEIVE, message("app", "/stop")),
            Lane::Inert
        );
        assert_eq!(
            lane(event::MESSAGE_RECEIVE, json!({"sender": 1})),
            Lane::Ordered
        );
        assert_eq!(lane(event::CARD_ACTION, json!({})), Lane::Express);
        assert_eq!(lane("im.chat.updated_v1", json!({})), Lane::Inert);
        for handled in [
            event::MESSAGE_RECALLED,
            event::BOT_REMOVED,
            event::BOT_ADDED,
            event::CHAT_DISBANDED,
            event::USERS_REMOVED,
        ] {
            assert_eq!(lane(handled, json!({})), Lane::Express, "{handled}");
        }
        let event = triage.inbox_event(envelope(event::MESSAGE_RECEIVE, message("app", "x")));
        assert!(event.inert && !event.express);
    }

    /// Chunks rejoined: a code block closed at a chunk's end (`\n` + fence, no newline after)
    /// and reopened with `reopen` at the next one's start is one block again.
    fn rejoin(chunks: &[String], reopen: &str) -> String {
        let mut out = String::new();
        for c in chunks {
            let c = match out.strip_suffix("\n```") {
                Some(kept) => {
                    out = format!("{kept}\n");
                    c.strip_prefix(reopen).expect("the block reopened")
                }
                None => c,
            };
            out.push_str(c);
        }
        out
    }

    #[test]
    fn chunks_fit_the_reply_request_as_sent_and_keep_code_fences() {
        let limit = lark_client::MAX_POST_REQUEST;
        let fits = |c: &String| {
            let bytes = answer_request_bytes(c);
            assert!(bytes <= limit, "{bytes} > {limit}: {c:.80}");
        };
        // Escaped JSON in a code block: every `\` and `"` is escaped again in the post's
        // JSON and once more in the request's, so the request is well over twice the text.
        let inner = json!({"cmd": "echo \"hi\" \\ there", "env": {"A": "\"b\""}}).to_string();
        let line = json!({"payload": inner, "n": "\\\\"}).to_string();
        let mut text = String::from("The payload:\n```json\n");
        let mut n = 0;
        while text.len() < 40_000 {
            text.push_str(&format!("{line} {n}\n"));
            n += 1;
        }
        text.push_str("```\nend\n");
        let request = answer_request_bytes(&text);
        assert!(request > 2 * text.len(), "{request} for {}", text.len());
        let chunks = markdown_chunks(&text, answer_request_bytes, limit);
        assert!(chunks.len() > request / limit, "{}", chunks.len());
        for c in &chunks {
            fits(c);
            assert_eq!(c.matches("```").count() % 2, 0, "fences balanced: {c:.80}");
        }
        // Whole lines, in order, nothing lost or doubled.
        assert!(chunks[1].starts_with("```json\n{"), "{:.80}", chunks[1]);
        assert_eq!(rejoin(&chunks, "```json\n"), text);
        // Close to the limit: no chunk is less than half full but the last.
        for c in &chunks[..chunks.len() - 1] {
            assert!(answer_request_bytes(c) > limit / 2);
        }

        // One line longer than a chunk is cut at character boundaries.
        let huge = "é\"".repeat(20_000);
        let chunks = markdown_chunks(&huge, answer_request_bytes, limit);
        assert!(chunks.len() > 1);
        chunks.iter().for_each(fits);
        assert_eq!(chunks.concat(), huge);
        assert_eq!(
            markdown_chunks("  ", answer_request_bytes, limit),
            vec!["(no answer)".to_string()]
        );
        // The worst case for the inert form: every `<` opens a tag. Each chunk is made inert
        // on its own, so a cut between `<` and `a` leaves no tag either.
        let tags = "<a".repeat(20_000);
        let chunks = markdown_chunks(&tags, answer_request_bytes, limit);
        for c in &chunks {
            fits(c);
            assert!(!post_content(c).to_string().contains("<a"));
        }
        assert_eq!(chunks.concat(), tags);
    }
}
