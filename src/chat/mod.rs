//! The domain of SSH Mode in chats: sections, the typed chat commands (whose doc comments are
//! the help text), bindings and grants (one authorisation function), target approval. Talks to
//! the network only through the Lark client.
//!
//! For now the router answers `/help` and `/ssh help`, says which other commands are not
//! available yet, and answers agent requests with the model's absence or the agent's.

pub mod command;

use anyhow::Context;
use serde_json::json;

use crate::app::AppState;
use crate::config::LlmConfig;
use crate::inbox::InboxEvent;
use crate::lark::client::{Content, idempotency_key};
use crate::lark::event::{self, Message, MessageReceive};
use command::{Command, HELP};

/// The answer to an agent request while no model is configured (CONTRACT).
pub const NO_MODEL: &str = "No model is configured for this service, so I cannot take requests yet. \
Chat commands still work: send /help to see them.";
/// The answer to an agent request until the agent exists.
pub const AGENT_NOT_READY: &str = "The agent is not available yet. Send /help to see the commands.";

/// Handles one inbox event. An error means "retry later"; events that can never be handled
/// (other types, unreadable bodies, bot senders) succeed without doing anything.
pub async fn handle_event(state: &AppState, ev: &InboxEvent) -> anyhow::Result<()> {
    if ev.event_type != event::MESSAGE_RECEIVE {
        tracing::debug!(lark.event_id = %ev.event_id, lark.event_type = %ev.event_type, "event type not handled; skipped");
        return Ok(());
    }
    let received = match MessageReceive::from_envelope(&ev.payload) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(lark.event_id = %ev.event_id, error = %e, "unreadable message event; skipped");
            return Ok(());
        }
    };
    if received.from_bot() {
        return Ok(());
    }
    let bot = state
        .lark
        .bot_open_id()
        .await
        .context("looking up the bot's open_id")?;
    let msg = received.into_message(&ev.event_id, &bot);
    handle_message(state, &msg, ev.attempts > 1).await
}

/// Decides what a received message asks for and answers it. `retry` is set when an earlier
/// attempt may already have logged part of the exchange.
pub async fn handle_message(state: &AppState, msg: &Message, retry: bool) -> anyhow::Result<()> {
    log(
        state,
        msg,
        retry,
        "message.received",
        json!({
            "event_id": msg.event_id,
            "message_id": msg.message_id,
            "chat_id": msg.chat_id,
            "thread_id": msg.thread_id,
            "sender": msg.sender_open_id,
            "text": msg.text,
            "mentions_bot": msg.mentions_bot,
        }),
    )
    .await?;

    let answer = match command::parse(&msg.addressed_text) {
        Some(Ok(Command::Help)) => command::help_text(),
        Some(Ok(cmd)) => format!("`{}` is not available yet.", usage_of(&cmd)),
        Some(Err(usage)) => usage.to_string(),
        None if msg.mentions_bot || msg.is_p2p() => match state.config.llm {
            LlmConfig::None => NO_MODEL.to_string(),
            _ => AGENT_NOT_READY.to_string(),
        },
        // A group message not addressed to the bot.
        None => return Ok(()),
    };
    reply(state, msg, &answer, "reply", retry).await
}

/// Replies to `msg` (inside its thread when it is in one); idempotent per (event, purpose).
async fn reply(
    state: &AppState,
    msg: &Message,
    text: &str,
    purpose: &str,
    retry: bool,
) -> anyhow::Result<()> {
    let uuid = idempotency_key(&msg.event_id, purpose);
    let sent = state
        .lark
        .reply(
            &msg.message_id,
            &Content::Text(text.to_string()),
            msg.thread_id.is_some(),
            &uuid,
            Some(&msg.chat_id),
        )
        .await
        .context("replying in Lark")?;
    log(
        state,
        msg,
        retry,
        "bot.reply",
        json!({
            "event_id": msg.event_id,
            "purpose": purpose,
            "message_id": sent.message_id,
            "in_reply_to": msg.message_id,
            "text": text,
        }),
    )
    .await
}

/// Appends to the message's section log. On a retry, an entry of the same kind for the same
/// event is not written twice (the check scans one section, so it is done only on retries).
async fn log(
    state: &AppState,
    msg: &Message,
    retry: bool,
    kind: &str,
    payload: serde_json::Value,
) -> anyhow::Result<()> {
    if retry {
        let seen: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM session_events
             WHERE section_id = $1 AND kind = $2 AND payload->>'event_id' = $3)",
        )
        .bind(msg.section())
        .bind(kind)
        .bind(&msg.event_id)
        .fetch_one(&state.db)
        .await
        .context("reading the event log")?;
        if seen {
            return Ok(());
        }
    }
    crate::eventlog::append(&state.db, msg.section(), kind, payload)
        .await
        .context("appending to the event log")?;
    Ok(())
}

/// The usage line of a command, from the help table.
fn usage_of(cmd: &Command) -> &'static str {
    let i = match cmd {
        Command::Use { .. } => 0,
        Command::Local => 1,
        Command::Status => 2,
        Command::List => 3,
        Command::YoloOn { .. } => 4,
        Command::YoloOff => 5,
        Command::Approve { .. } => 6,
        Command::Help => 7,
        Command::Stop => 8,
    };
    HELP[i].0
}
