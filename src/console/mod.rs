//! `sshmode chat`: the terminal as a second chat front-end. One console session is one local
//! section, `console:NAME`, driven by the same dispatcher ([`crate::chat::dispatch`]) and the
//! same agent and turn runner as Lark; only the edges differ ([`out`]: lines on standard output
//! instead of messages and reactions).
//!
//! The section behaves like a thread: `/ssh use <alias>` binds it in place. The actor is
//! `console:<os user>`, and it counts as an operator (admin) for chat control, since whoever
//! can run the binary against the database owns the deployment anyway. Each line is one
//! message; a line for the agent waits until its turn has ended (Ctrl-C during a turn sends
//! `/stop`), so piped input runs in order and the command exits 0 at end of input.
//!
//! Never: needs Lark settings, binds a network port, or runs work outside the turn runner
//! (turns are durable: a section resumed with `--section` continues where it stopped).
//!
//! # In detail
//!
//! `sshmode chat` is a second front-end on the same core. It builds only what a section needs —
//! store, model router, vault, executors, the agent with `ChatBindings`, and a turn runner spawned
//! in-process — and no HTTP listener, inbox or Lark client, so it needs no Lark settings. Each
//! input line becomes an `Incoming` for the section `console:NAME` (used as chat id and thread id,
//! so the section behaves like a thread and `/ssh use` binds in place) and goes through
//! `chat::dispatch`; requests for the agent are queued as durable turns like any other, and the
//! console waits on `turns::request_settled` (a bounded poll) before reading the next line.
//! While a call of the turn waits for approval, the next line answers it inline (`o`, `t`,
//! `d`); any other line denies it and is then handled as the next message.
//!
//! | path | owns | never |
//! |---|---|---|
//! | `mod.rs` | section names, the actor `console:<os user>` (added to the admins for this process), wiring, the read loop, waiting for turns, Ctrl-C as `/stop` | reading the environment (config does), binding a port |
//! | `out.rs` | `Terminal`: the dispatcher's `Reply` (no threads: `open_thread` says so), the agent's `ChatOut` (answers printed once per idempotency key; reactions ignored except the failure one) and `StepSink` (tool calls as `· tool: what`; a running command's tail as `  │ ` lines, redrawn in place when standard output is a terminal, only the new lines appended when it is piped); `NoAdminChannel` | deciding anything |
//!
//! Because turns are rows in Postgres, a console section is resumable (`--section NAME`): an
//! interrupted turn resumes when the section is opened again. Runners are scoped
//! (`turns::SectionFilter`): the console's claims only its own section, and the service's
//! (`app::App`) every section except `console:*`, whose answers only a console can print — so a
//! console and `serve` may share one database.

mod out;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use std::io::{BufRead, Read, Write};

use crate::chat::{self, Deps, Incoming};
use crate::clock::Clock;
use crate::config::Config;
use crate::turns::call_approval;
use out::LineReply;
pub use out::{NoAdminChannel, Terminal};

/// The prefix of every console section id.
pub const SECTION_PREFIX: &str = "console:";
/// Longest accepted input line, in bytes; longer lines are refused, not cut.
const LINE_MAX: u64 = 64 * 1024;
/// Longest section name.
const NAME_MAX: usize = 64;
/// How often a waiting console looks whether its turn has ended.
const POLL: Duration = Duration::from_millis(100);

/// Checks a `--section` name: letters, digits, `-`, `_` and `.`, at most 64 characters. A full
/// `console:NAME` id is accepted too.
pub fn section_name(name: &str) -> anyhow::Result<String> {
    let name = name.strip_prefix(SECTION_PREFIX).unwrap_or(name);
    if name.is_empty()
        || name.len() > NAME_MAX
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        anyhow::bail!(
            "a section name is 1 to {NAME_MAX} letters, digits, '-', '_' or '.' (got {name:?})"
        );
    }
    Ok(name.to_string())
}

/// A fresh section name: the UTC time it was started, `YYYYMMDD-HHMMSS`, plus four
/// random hex digits so two consoles started in the same second stay apart.
fn generated_name(clock: &dyn Clock) -> String {
    let suffix = &uuid::Uuid::new_v4().simple().to_string()[..4];
    format!("{}-{suffix}", clock.now().format("%Y%m%d-%H%M%S"))
}

/// The operating-system user running the console.
fn os_user() -> String {
    // SAFETY: geteuid has no preconditions; getpwuid returns static storage or null, copied
    // out at once.
    unsafe {
        let pw = libc::getpwuid(libc::geteuid());
        if pw.is_null() {
            return format!("uid{}", libc::geteuid());
        }
        std::ffi::CStr::from_ptr((*pw).pw_name)
            .to_string_lossy()
            .into_owned()
    }
}

/// The pieces a console session runs on.
pub struct Session {
    pub deps: Deps,
    pub term: Arc<Terminal>,
    /// How long one turn may take, at most, before the console stops waiting for it.
    pub turn_wait: Duration,
}

/// The section and actor of a console session: `--section NAME` or a fresh name, and the OS
/// user, who counts as an operator of this deployment (added to the config's admins).
pub fn identify(
    config: &mut Config,
    section: Option<String>,
    clock: &dyn Clock,
) -> anyhow::Result<(String, String, String)> {
    let name = match section {
        Some(s) => section_name(&s)?,
        None => generated_name(clock),
    };
    let section = format!("{SECTION_PREFIX}{name}");
    let actor = format!("{SECTION_PREFIX}{}", os_user());
    if !config.is_admin(&actor) {
        config.admins.push(actor.clone());
    }
    Ok((name, section, actor))
}

impl Session {
    /// Reads lines until end of input; each is one message of the section.
    pub async fn repl(&self, section: &str, actor: &str, interactive: bool) -> anyhow::Result<i32> {
        let mut lines = read_lines();
        // A line read as the answer to an approval that was not one: the next message.
        let mut carried: Option<String> = None;
        loop {
            if let Some(text) = carried.take() {
                carried = self.handle(section, actor, &text, &mut lines).await?;
                continue;
            }
            if interactive {
                let mut err = std::io::stderr().lock();
                let _ = err.write_all(b"> ");
                let _ = err.flush();
            }
            let next = tokio::select! {
                l = lines.recv() => l,
                _ = tokio::signal::ctrl_c(), if interactive => {
                    eprintln!();
                    return Ok(0);
                }
            };
            let line = match next {
                None | Some(Line::End) => return Ok(0),
                Some(Line::Failed(e)) => return Err(e).context("reading standard input"),
                Some(Line::TooLong) => {
                    self.term
                        .say(&format!("[line longer than {LINE_MAX} bytes; ignored]"));
                    continue;
                }
                Some(Line::Text(t)) => t,
            };
            let text = line.trim();
            if text.is_empty() {
                continue;
            }
            carried = self.handle(section, actor, text, &mut lines).await?;
        }
    }

    /// One message: dispatches it, then waits for the turn it queued (if any) to end. Returns
    /// a line read as an approval's answer that was not one (to be handled next).
    async fn handle(
        &self,
        section: &str,
        actor: &str,
        text: &str,
        lines: &mut tokio::sync::mpsc::Receiver<Line>,
    ) -> anyhow::Result<Option<String>> {
        let message_id = format!("{section}:{}", uuid::Uuid::new_v4().simple());
        let msg = Incoming {
            event_id: message_id.clone(),
            message_id: message_id.clone(),
            chat_id: section.to_string(),
            thread_id: Some(section.to_string()),
            root_id: None,
            sender: actor.to_string(),
            text: text.to_string(),
            addressed: true,
            direct: false,
            parent_id: None,
            files: Vec::new(),
            forwarded: false,
            sticker: false,
        };
        let reply = LineReply {
            term: &self.term,
            message_id: &message_id,
        };
        chat::dispatch(&self.deps, &msg, &reply).await?;
        self.wait_turn(section, actor, &message_id, lines).await
    }

    /// Answers the call waiting in `section` from the next line: `o`, `t` or `d` (or `once`,
    /// `thread`, `deny`). Any other line denies it and is returned, to be the next message.
    async fn answer(
        &self,
        section: &str,
        actor: &str,
        lines: &mut tokio::sync::mpsc::Receiver<Line>,
    ) -> anyhow::Result<Option<String>> {
        let Some((turn_id, key)) = call_approval::waiting_in(&self.deps.db, section).await? else {
            return Ok(None);
        };
        let line = match lines.recv().await {
            Some(Line::Text(t)) => Some(t.trim().to_string()),
            _ => None,
        };
        let (scope, carried) = match line.as_deref().map(str::to_ascii_lowercase).as_deref() {
            Some("o" | "once" | "allow once") => (Some(call_approval::Scope::Once), None),
            Some("t" | "thread" | "allow in thread") => (Some(call_approval::Scope::Thread), None),
            Some("d" | "deny") => (None, None),
            // Not an answer (or the end of input): denied, and the line is the next message.
            _ => (None, line.filter(|l| !l.is_empty())),
        };
        call_approval::decide(
            &self.deps.db,
            turn_id,
            &key,
            scope,
            actor,
            self.deps.config.chat.yolo_ttl,
        )
        .await?;
        Ok(carried)
    }

    /// Waits until the turn that took `message_id` has ended (or the request was dropped).
    /// Ctrl-C meanwhile asks the turn to stop, as `/stop` does.
    async fn wait_turn(
        &self,
        section: &str,
        actor: &str,
        message_id: &str,
        lines: &mut tokio::sync::mpsc::Receiver<Line>,
    ) -> anyhow::Result<Option<String>> {
        let deadline = tokio::time::Instant::now() + self.turn_wait;
        let mut carried: Option<String> = None;
        loop {
            match crate::turns::request_settled(&self.deps.db, message_id).await? {
                None | Some(true) => return Ok(carried),
                Some(false) => {}
            }
            if tokio::time::Instant::now() >= deadline {
                self.term.say(
                    "[the task is still running past its budget; going on with the next line]",
                );
                return Ok(carried);
            }
            if carried.is_none() {
                carried = self.answer(section, actor, lines).await?;
            }
            tokio::select! {
                _ = tokio::time::sleep(POLL) => {}
                _ = tokio::signal::ctrl_c() => {
                    let said = self.deps.agent.stop(section, actor).await?;
                    self.term.say(&said);
                }
            }
        }
    }
}

/// One read from standard input.
enum Line {
    Text(String),
    /// Longer than [`LINE_MAX`]; the rest of it was skipped.
    TooLong,
    End,
    Failed(std::io::Error),
}

/// Reads standard input on a thread of its own (a blocking read would hold a runtime worker),
/// one line ahead at most.
fn read_lines() -> tokio::sync::mpsc::Receiver<Line> {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        loop {
            let mut buf = Vec::new();
            let line = match (&mut stdin).take(LINE_MAX + 1).read_until(b'\n', &mut buf) {
                Ok(0) => Line::End,
                Ok(_) if buf.len() as u64 > LINE_MAX => {
                    // Skip the rest of the over-long line.
                    let mut rest = buf;
                    while !rest.ends_with(b"\n") {
                        rest.clear();
                        match (&mut stdin).take(LINE_MAX).read_until(b'\n', &mut rest) {
                            Ok(0) | Err(_) => break,
                            Ok(_) => {}
                        }
                    }
                    Line::TooLong
                }
                Ok(_) => Line::Text(String::from_utf8_lossy(&buf).into_owned()),
                Err(e) => Line::Failed(e),
            };
            let last = matches!(line, Line::End | Line::Failed(_));
            if tx.blocking_send(line).is_err() || last {
                return;
            }
        }
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn section_names() {
        assert_eq!(section_name("work").unwrap(), "work");
        assert_eq!(section_name("console:a-b_c.1").unwrap(), "a-b_c.1");
        for bad in ["", "a b", "a/b", "console:", "../x", &"x".repeat(65)] {
            assert!(section_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn generated_names_are_valid_and_distinct() {
        let a = generated_name(&crate::clock::SystemClock);
        let b = generated_name(&crate::clock::SystemClock);
        assert_ne!(a, b);
        assert_eq!(section_name(&a).unwrap(), a);
    }
}
