//! The terminal as a chat platform: the dispatcher's [`Reply`] and [`AdminChannel`], the
//! agent's [`ChatOut`] and its [`StepSink`], all writing plain lines to standard output.
//! Reactions become short status lines (or nothing); answers are printed once per idempotency
//! key; an approval card is printed with its inline question (the read loop takes the answer). Everything printed passes [`printable`]: what a tool or the model wrote cannot move
//! the cursor, set the title, write the clipboard (OSC 52) or reorder text on the operator's
//! terminal. A running command's output tail is shown under its step: on a terminal it is
//! redrawn in place (the only control the console itself writes: cursor up and clear below, over
//! the lines it drew last), when piped only its new lines are appended. Never: reads input or
//! decides anything.

use std::collections::{HashSet, VecDeque};
use std::io::Write;
use std::sync::Mutex;

use async_trait::async_trait;

use crate::agent::{self, ChatOut, StepEvent, StepSink};
use crate::chat::{AdminChannel, AnchorPlace, Anchors, Reply, TargetApprovalView, ThreadError};

/// Most idempotency keys remembered; older ones are forgotten (a resend that late is printed
/// again, which in a terminal is harmless).
const SEEN_MAX: usize = 4096;

/// Standard output, shared by every writer so lines never interleave mid-line.
#[derive(Default)]
pub struct Terminal {
    seen: Mutex<(HashSet<String>, VecDeque<String>)>,
    /// Standard output is a terminal: a running step's output is redrawn in place.
    tty: bool,
    /// The running step's output as last printed, and the lines it takes on a terminal.
    tail: Mutex<(Vec<String>, usize)>,
}

/// What a line of a running step's output starts with.
const TAIL_PREFIX: &str = "  │ ";
/// Longest output line redrawn in place (so that it takes one row of an 80-column terminal).
const TTY_LINE_CHARS: usize = 76;

impl Terminal {
    /// `tty`: standard output is a terminal (tails are redrawn in place, not appended).
    pub fn new(tty: bool) -> Terminal {
        Terminal {
            tty,
            ..Terminal::default()
        }
    }

    /// Prints `text` as whole lines, control and escape sequences removed.
    pub fn say(&self, text: &str) {
        let text = printable(text);
        // Anything printed ends the running step's output region: it is not redrawn over.
        let mut tail = self.tail.lock().unwrap_or_else(|p| p.into_inner());
        *tail = (Vec::new(), 0);
        let mut out = std::io::stdout().lock();
        let text = text.trim_end();
        // A closed stdout (a pipe whose reader left) must not take the session down.
        let _ = writeln!(out, "{text}");
        let _ = out.flush();
    }

    /// Shows the running step's latest output: on a terminal in place of the one before, else
    /// as the lines not printed yet, appended.
    fn show_tail(&self, tail: &str) {
        let lines: Vec<String> = printable(tail).lines().map(str::to_string).collect();
        let mut shown = self.tail.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = std::io::stdout().lock();
        if self.tty {
            if shown.1 > 0 {
                // Up to the first line of the last tail, and clear from there down.
                let _ = write!(out, "\u{1b}[{}A\u{1b}[J", shown.1);
            }
            for l in &lines {
                let _ = writeln!(out, "{TAIL_PREFIX}{}", clip(l, TTY_LINE_CHARS));
            }
            shown.1 = lines.len();
        } else {
            for l in new_lines(&shown.0, &lines) {
                let _ = writeln!(out, "{TAIL_PREFIX}{l}");
            }
        }
        let _ = out.flush();
        shown.0 = lines;
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

/// The lines of `now` after those it shares with the end of `before` (a tail that moved on by
/// a few lines shows only those).
fn new_lines<'a>(before: &[String], now: &'a [String]) -> &'a [String] {
    let most = before.len().min(now.len());
    let shared = (1..=most)
        .rev()
        .find(|k| before[before.len() - k..] == now[..*k])
        .unwrap_or(0);
    &now[shared..]
}

/// `s` cut to `chars` characters, with `…` when cut.
fn clip(s: &str, chars: usize) -> String {
    if s.chars().count() <= chars {
        return s.to_string();
    }
    let mut out: String = s.chars().take(chars - 1).collect();
    out.push('…');
    out
}

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

/// A schedule's firing in the console: its anchor printed once, named by its key (the turn's
/// message id).
#[async_trait]
impl Anchors for Terminal {
    async fn post(&self, place: &AnchorPlace, text: &str, key: &str) -> anyhow::Result<String> {
        let id = format!("{}:{key}", place.section);
        self.say_once(&id, text);
        Ok(id)
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
    async fn show_call_approval(
        &self,
        card: &agent::call_approval::CallApprovalCard,
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
                    "[approval needed: {}]\n  where: {}  directory: {}\n  $ {}\n  allow in thread covers: {}\nallow [o]nce / allow in [t]hread / [d]eny?",
                    p.ask.reason,
                    p.ask.location,
                    p.ask.cwd,
                    p.ask.command,
                    p.ask.covers.replace('\n', "\n    ")
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
                "· {} step{} done earlier in this task",
                steps.len(),
                if steps.len() == 1 { "" } else { "s" }
            )),
            StepEvent::ToolStarted { tool, short } => self.say(&format!("· {tool}: {short}")),
            StepEvent::ToolOutput { tail } => self.show_tail(tail),
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
    async fn send_target_approval(
        &self,
        _: &str,
        _: &TargetApprovalView,
        _: &str,
    ) -> anyhow::Result<String> {
        anyhow::bail!("the console cannot send approval cards")
    }

    async fn update_target_approval(&self, _: &str, _: &TargetApprovalView) -> anyhow::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::new_lines;

    fn v(s: &[&str]) -> Vec<String> {
        s.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn an_appended_tail_prints_only_its_new_lines() {
        assert_eq!(new_lines(&[], &v(&["a", "b"])), v(&["a", "b"]));
        assert_eq!(new_lines(&v(&["a", "b"]), &v(&["a", "b", "c"])), v(&["c"]));
        assert_eq!(
            new_lines(&v(&["a", "b", "c"]), &v(&["b", "c", "d", "e"])),
            v(&["d", "e"])
        );
        assert_eq!(new_lines(&v(&["a", "b"]), &v(&["x", "y"])), v(&["x", "y"]));
        assert!(new_lines(&v(&["a", "b"]), &v(&["a", "b"])).is_empty());
    }
}
