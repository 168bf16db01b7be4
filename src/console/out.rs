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

/// `text` without terminal control: escape sequences (CSI, OSC, DCS, SOS, PM, APC and
/// two-character ones) are dropped whole, as are C0 controls but newline and tab, DEL, C1
/// controls (the 8-bit CSI and OSC among them) and the bidirectional overrides that make a
/// line read differently from what it holds.
pub fn printable(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\n' | '\t' => out.push(c),
            '\u{1b}' => match chars.next() {
                // CSI: parameters and intermediates up to a final byte.
                Some('[') => {
                    for c in chars.by_ref() {
                        if ('\u{40}'..='\u{7e}').contains(&c) {
                            break;
                        }
                    }
                }
                // Strings ended by BEL or ST (ESC \\).
                Some(']' | 'P' | 'X' | '^' | '_') => skip_string(&mut chars),
                // A two-character sequence (or a lone ESC at the end).
                _ => {}
            },
            '\u{9b}' => {
                for c in chars.by_ref() {
                    if ('\u{40}'..='\u{7e}').contains(&c) {
                        break;
                    }
                }
            }
            '\u{9d}' | '\u{90}' | '\u{98}' | '\u{9e}' | '\u{9f}' => skip_string(&mut chars),
            c if c.is_control() => {}
            '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{200e}' | '\u{200f}' => {}
            c => out.push(c),
        }
    }
    out
}

/// Skips a control string up to its terminator: BEL, ST (`ESC \\`) or the 8-bit ST.
fn skip_string(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) {
    while let Some(c) = chars.next() {
        match c {
            '\u{7}' | '\u{9c}' => return,
            '\u{1b}' => {
                if chars.peek() == Some(&'\\') {
                    chars.next();
                }
                return;
            }
            _ => {}
        }
    }
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

#[cfg(test)]
mod tests {
    use super::printable;

    #[test]
    fn terminal_control_from_tools_and_the_model_is_removed() {
        let cases = [
            ("plain\ttext\nnext", "plain\ttext\nnext"),
            ("\u{1b}[2J\u{1b}[1;1Hcleared", "cleared"),
            ("red \u{1b}[31mword\u{1b}[0m", "red word"),
            ("\u{1b}]0;owned title\u{7}after", "after"),
            ("\u{1b}]52;c;cm0gLXJmIH4=\u{1b}\\clip", "clip"),
            ("\u{1b}P1$qm\u{1b}\\dcs", "dcs"),
            ("\u{9b}31mc1\u{9d}8;;x\u{9c}", "c1"),
            ("over\rwrite\u{8}\u{7f}", "overwrite"),
            ("a\u{202e}txt.exe", "atxt.exe"),
            ("\u{1b}7\u{1b}8esc", "esc"),
            ("end\u{1b}", "end"),
            ("\u{1b}]unterminated", ""),
            ("ünïcødé 中文", "ünïcødé 中文"),
        ];
        for (input, want) in cases {
            assert_eq!(printable(input), want, "{input:?}");
        }
    }
}
