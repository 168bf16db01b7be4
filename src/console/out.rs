//! The terminal as a chat platform: the dispatcher's [`Reply`] and [`AdminChannel`], the
//! agent's [`ChatOut`] and its [`StepSink`], all writing plain lines to standard output.
//! Reactions become short status lines (or nothing); answers are printed once per idempotency
//! key; an approval card is printed with its inline question (the read loop takes the answer). Everything printed passes [`printable`]: what a tool or the model wrote cannot move
//! the cursor, set the title, write the clipboard (OSC 52) or reorder text on the operator's
//! terminal. Never: reads input or decides anything.

use std::collections::{HashSet, VecDeque};
use std::io::Write;
use std::sync::Mutex;

use async_trait::async_trait;

use crate::agent::{self, ChatOut, StepEvent, StepSink};
use crate::chat::{AdminChannel, ApprovalView, Reply, ThreadError};

/// Most idempotency keys remembered; older ones are forgotten (a resend that late is printed
/// again, which in a terminal is harmless).
const SEEN_MAX: usize = 4096;

/// Standard output, shared by every writer so lines never interleave mid-line.
#[derive(Default)]
pub struct Terminal {
    seen: Mutex<(HashSet<String>, VecDeque<String>)>,
}

impl Terminal {
    /// Prints `text` as whole lines, control and escape sequences removed.
    pub fn say(&self, text: &str) {
        let text = printable(text);
        let mut out = std::io::stdout().lock();
        let text = text.trim_end();
        // A closed stdout (a pipe whose reader left) must not take the session down.
        let _ = writeln!(out, "{text}");
        let _ = out.flush();
    }

    /// Prints `text` unless `key` was printed before.
    fn say_once(&self, key: &str, text: &str) {
        {
            let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
            if !seen.0.insert(key.to_string()) {
                return;
            }
            seen.1.push_back(key.to_string());
            if seen.1.len() > SEEN_MAX
                && let Some(old) = seen.1.pop_front()
            {
                seen.0.remove(&old);
            }
        }
        self.say(text);
    }
}

pub use crate::exec::live::printable;

/// The answer to one typed line.
pub struct LineReply<'a> {
    pub term: &'a Terminal,
    pub message_id: &'a str,
}

#[async_trait]
impl Reply for LineReply<'_> {
    async fn answer(&self, text: &str, purpose: &str) -> anyhow::Result<()> {
        self.term
            .say_once(&format!("{}:{purpose}", self.message_id), text);
        Ok(())
    }

    /// The console is one section already; there are no threads to open.
    async fn open_thread(&self, _: &str, _: &str) -> Result<Option<String>, ThreadError> {
        Err(ThreadError::NotAllowed)
    }
}

#[async_trait]
impl ChatOut for Terminal {
    async fn add_reaction(&self, message_id: &str, emoji: &str) -> anyhow::Result<String> {
        if emoji == agent::FAILURE {
            self.say_once(
                &format!("{message_id}:failed"),
                "[the request did not complete]",
            );
        }
        Ok(format!("{message_id}:{emoji}"))
    }

    async fn remove_reaction(&self, _: &str, _: &str) -> anyhow::Result<()> {
        Ok(())
    }

    async fn reply_markdown(
        &self,
        _chat_id: &str,
        _message_id: &str,
        markdown: &str,
        _in_thread: bool,
        uuid: &str,
    ) -> anyhow::Result<()> {
        self.say_once(uuid, markdown);
        Ok(())
    }

    fn can_ask(&self) -> bool {
        true
    }

    /// The card as lines, with the inline question; the read loop takes the answer.
    async fn show_approval(
        &self,
        card: &agent::approval::ApprovalCard,
    ) -> anyhow::Result<Option<String>> {
        let p = &card.parked;
        let key = format!("approval:{}:{}", p.turn_id, p.call_key);
        if p.card_message_id.is_some() {
            let state = p.state.as_str();
            self.say_once(&format!("{key}:{state}"), &format!("[approval {state}]"));
        } else {
            self.say_once(
                &key,
                &format!(
                    "[approval needed: {}]\n  where: {}  directory: {}\n  $ {}\nallow [o]nce / allow in [t]hread / [d]eny?",
                    p.ask.reason, p.ask.location, p.ask.cwd, p.ask.command
                ),
            );
        }
        Ok(Some(key))
    }
}

impl StepSink for Terminal {
    fn step(&self, _section: &str, _turn_id: i64, event: &StepEvent) {
        match event {
            StepEvent::Started { resumed: true, .. } => self.say("· resuming the interrupted task"),
            StepEvent::Earlier { steps } => self.say(&format!(
                "· {} step{} done before the interruption",
                steps.len(),
                if steps.len() == 1 { "" } else { "s" }
            )),
            StepEvent::ToolStarted { tool, short } => self.say(&format!("· {tool}: {short}")),
            StepEvent::ToolFinished {
                tool,
                ok: false,
                millis,
                ..
            } => self.say(&format!("· {tool} failed after {millis} ms")),
            _ => {}
        }
    }
}

/// Admins are reached in Lark; the console has no one-to-one channel. Approval cards sent
/// elsewhere stay as they are when a decision is taken here (the decision itself is stored
/// and audited all the same).
pub struct NoAdminChannel;

#[async_trait]
impl AdminChannel for NoAdminChannel {
    async fn send_approval(&self, _: &str, _: &ApprovalView, _: &str) -> anyhow::Result<String> {
        anyhow::bail!("the console cannot send approval cards")
    }

    async fn update_approval(&self, _: &str, _: &ApprovalView) -> anyhow::Result<()> {
        Ok(())
    }
}
