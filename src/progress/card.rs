//! What a progress card shows: the turn's steps as one markdown text, and the card JSON 2.0
//! around it. Pure functions of a [`View`]; no I/O. A long turn collapses its older steps into
//! one counting line, so the card stays far below Lark's 30 KB and ~200 element limits however
//! many steps run. Every text from the model (a tool name, a command's short form, the answer's
//! lines in the summary) is made inert by [`crate::lark::markup`] before it is shown: a card
//! mentions no one but the person who pressed Stop and the person who answered an approval.

use std::time::Duration;

use serde_json::{Value, json};

use crate::agent::StepApproval;
use crate::lark::markup;

/// The markdown element every update rewrites.
pub const STEPS_ELEMENT: &str = "steps";
/// The Stop button's element, removed when the turn ends.
pub const STOP_ELEMENT: &str = "stop";
/// What a Stop button's callback value carries in `act`.
pub const STOP_ACT: &str = "progress_stop";
/// Steps shown one per line; earlier ones are counted in one line.
pub const SHOWN_STEPS: usize = 30;
/// Longest short form of a command or path on a line, in characters.
const SHORT_CHARS: usize = 80;
/// Most characters of a step's output shown (the sender cuts tails to this already).
const TAIL_CHARS: usize = 500;

/// One finished step.
#[derive(Debug, Clone)]
pub struct Step {
    pub tool: String,
    /// Where it ran: `local`, a target alias, `control`, or `?`.
    pub place: String,
    pub short: String,
    pub ok: bool,
    pub exit: Option<String>,
    pub millis: u64,
    /// How a person answered the call, when it waited for one.
    pub approval: Option<StepApproval>,
}

impl From<crate::agent::EarlierStep> for Step {
    fn from(s: crate::agent::EarlierStep) -> Step {
        Step {
            tool: s.tool,
            place: s.backend.unwrap_or_else(|| "?".into()),
            short: s.short,
            ok: s.ok,
            exit: s.exit,
            millis: s.millis,
            approval: s.approval,
        }
    }
}

impl Step {
    /// The tool worked and, when a command ran, it exited 0.
    pub fn succeeded(&self) -> bool {
        self.ok && self.exit.as_deref().is_none_or(|e| e == "exit 0")
    }
}

/// The state a card shows.
#[derive(Debug, Clone, Default)]
pub struct View {
    pub turn_id: i64,
    pub section: String,
    /// The chat the card is in: a Stop click from anywhere else (a forwarded card) is refused.
    pub chat_id: String,
    /// `local`, or `alias (user@host:port)`.
    pub backend: String,
    /// The last [`SHOWN_STEPS`] steps.
    pub steps: Vec<Step>,
    /// Steps no longer shown one by one.
    pub earlier_ok: u64,
    pub earlier_failed: u64,
    /// The running step: tool, short form, elapsed.
    pub running: Option<(String, String, Duration)>,
    /// Set while the running step's call waits for a person's approval: who may give it
    /// (`an admin`, `the requester`).
    pub waiting: Option<String>,
    /// The latest lines of the running step's output, or of the last step once it finished
    /// (printable, its secrets masked; made inert here).
    pub tail: Option<String>,
    /// Whether a previous runner started this turn (its finished steps are listed again).
    pub resumed: bool,
    /// Who pressed Stop (an open_id).
    pub stopped_by: Option<String>,
    /// Set when the turn ended: how, and the answer's first lines (already made inert).
    pub summary: Option<String>,
    /// Set when the turn ended: its outcome (`done`, `stopped`, `bounded`, `failed`). A card
    /// with an outcome has its final header and no Stop button.
    pub outcome: Option<String>,
    /// The whole turn's elapsed time.
    pub elapsed: Duration,
}

impl View {
    /// Adds a finished step, collapsing the oldest shown one when the list is full.
    pub fn push(&mut self, step: Step) {
        if self.steps.len() >= SHOWN_STEPS {
            let old = self.steps.remove(0);
            if old.succeeded() {
                self.earlier_ok += 1;
            } else {
                self.earlier_failed += 1;
            }
        }
        self.steps.push(step);
    }

    pub fn total_steps(&self) -> u64 {
        self.earlier_ok + self.earlier_failed + self.steps.len() as u64
    }

    /// The steps element's markdown.
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        if self.resumed {
            out.push_str("_Resumed after an interruption._\n");
        }
        let earlier = self.earlier_ok + self.earlier_failed;
        if earlier > 0 {
            out.push_str(&format!(
                "… {earlier} earlier step{} ({} ok, {} failed)\n",
                if earlier == 1 { "" } else { "s" },
                self.earlier_ok,
                self.earlier_failed
            ));
        }
        for s in &self.steps {
            let mark = if s.succeeded() { "✅" } else { "❌" };
            let exit = s
                .exit
                .as_deref()
                .map(|e| format!(" · {e}"))
                .unwrap_or_default();
            let approval = s
                .approval
                .as_ref()
                .map(|a| format!(" · {}", approval(a)))
                .unwrap_or_default();
            out.push_str(&format!(
                "{mark} **{}** · {} · {}{exit} · {}{approval}\n",
                escape(&s.tool),
                escape(&s.place),
                code(&s.short),
                human(Duration::from_millis(s.millis)),
            ));
        }
        if self.running.is_none()
            && !self.steps.is_empty()
            && let Some(tail) = &self.tail
        {
            out.push_str(&output(tail));
        }
        if let Some((tool, short, elapsed)) = &self.running {
            let state = match &self.waiting {
                Some(who) => format!("waiting for approval by {}", escape(who)),
                None => format!("running {}", human(*elapsed)),
            };
            out.push_str(&format!(
                "{} **{}** · {} · {} · {state}\n",
                if self.waiting.is_some() { "✋" } else { "⏳" },
                escape(tool),
                escape(&self.backend),
                code(short),
            ));
            if let Some(tail) = &self.tail {
                out.push_str(&output(tail));
            }
        }
        if self.total_steps() == 0 && self.running.is_none() && self.summary.is_none() {
            out.push_str("Thinking…\n");
        }
        if let Some(by) = &self.stopped_by {
            if is_id(by) {
                out.push_str(&format!("🛑 Stopped by <at id={by}></at>\n"));
            } else {
                out.push_str("🛑 Stopped\n");
            }
        }
        if let Some(summary) = &self.summary {
            out.push_str("\n---\n");
            out.push_str(summary);
            out.push('\n');
        }
        out
    }

    /// The one-line summary Lark shows in the chat list.
    pub fn preview(&self) -> String {
        match &self.summary {
            Some(s) => clip(s.lines().next().unwrap_or_default(), 100),
            None => format!("Working · {} steps", self.total_steps()),
        }
    }

    /// The whole card. `streaming` sets CardKit streaming mode. A running turn's card has the
    /// Stop button and a "Working" header; a finished one says how it ended (title and colour)
    /// and has no button.
    pub fn card(&self, streaming: bool) -> Value {
        let (word, template) = match self.outcome.as_deref() {
            None => ("Working", "blue"),
            Some(outcome) => ended(outcome),
        };
        self.render(streaming, word, template, self.outcome.is_none())
    }

    /// The card a turn leaves behind when it moves to a new card (its streaming could not be
    /// turned on again): what it showed so far, no Stop button.
    pub fn retired_card(&self) -> Value {
        self.render(false, "Continued in a new card", "grey", false)
    }

    fn render(&self, streaming: bool, word: &str, template: &str, stop_button: bool) -> Value {
        let mut config = json!({
            "update_multi": true,
            "summary": {"content": self.preview()},
        });
        if streaming {
            config["streaming_mode"] = json!(true);
            config["streaming_config"] =
                json!({"print_frequency_ms": {"default": 30}, "print_step": {"default": 2}});
        }
        let mut elements = vec![json!({
            "tag": "markdown",
            "element_id": STEPS_ELEMENT,
            "content": self.markdown(),
        })];
        if stop_button {
            elements.push(json!({
                "tag": "button",
                "element_id": STOP_ELEMENT,
                "text": {"tag": "plain_text", "content": "Stop"},
                "type": "danger",
                "behaviors": [{"type": "callback", "value": {
                    "act": STOP_ACT, "turn": self.turn_id, "section": self.section,
                    "chat": self.chat_id,
                }}],
            }));
        }
        json!({
            "schema": "2.0",
            "config": config,
            "header": {
                "title": {"tag": "plain_text", "content": clip(&format!("{word} · {}", self.backend), 120)},
                "template": template,
            },
            "body": {"elements": elements},
        })
    }
}

/// How a turn's end is named (the final header and the summary's first word) and the header's
/// colour.
pub fn ended(outcome: &str) -> (&'static str, &'static str) {
    match outcome {
        "done" => ("Done", "green"),
        "stopped" => ("Stopped", "grey"),
        "bounded" => ("Stopped at a limit", "orange"),
        _ => ("Failed", "red"),
    }
}

/// `1.2s`, `42s`, `3m05s`.
pub fn human(d: Duration) -> String {
    let ms = d.as_millis() as u64;
    if ms < 10_000 {
        format!("{:.1}s", ms as f64 / 1000.0)
    } else if ms < 60_000 {
        format!("{}s", ms / 1000)
    } else {
        format!("{}m{:02}s", ms / 60_000, (ms / 1000) % 60)
    }
}

pub fn clip(s: &str, chars: usize) -> String {
    if s.chars().count() <= chars {
        return s.to_string();
    }
    let mut out: String = s.chars().take(chars.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// Inline code that cannot be broken out of (backticks become quotes) and mentions no one.
fn code(s: &str) -> String {
    let s = clip(&s.replace('`', "'").replace(['\n', '\r'], " "), SHORT_CHARS);
    if s.is_empty() {
        String::new()
    } else {
        markup::inert(&format!("`{s}`"))
    }
}

/// A command's output lines as a code block that cannot be closed from inside (backticks become
/// quotes) and mentions no one.
fn output(tail: &str) -> String {
    let body = clip_chars(tail, TAIL_CHARS).replace('`', "'");
    markup::inert(&format!("```\n{}\n```\n", body.trim_end()))
}

/// The last `chars` characters of `s`, behind `…` when cut.
fn clip_chars(s: &str, chars: usize) -> String {
    let n = s.chars().count();
    if n <= chars {
        return s.to_string();
    }
    let mut out = String::from("…");
    out.extend(s.chars().skip(n - (chars - 1)));
    out
}

/// Whether `s` can be an open_id (and so be mentioned).
fn is_id(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// How a wait for approval ended, with who answered mentioned (Lark shows the name).
fn approval(a: &StepApproval) -> String {
    match &a.by {
        Some(by) if is_id(by) => format!("{} by <at id={by}></at>", escape(&a.outcome)),
        _ => escape(&a.outcome),
    }
}

/// Markdown-inert text (no emphasis, links or tags from a tool name or alias).
fn escape(s: &str) -> String {
    markup::plain(s, 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(i: usize) -> Step {
        Step {
            tool: "terminal".into(),
            place: "web".into(),
            short: format!("{} {}", "x".repeat(200), i),
            ok: !i.is_multiple_of(7),
            exit: Some("exit 0".into()),
            millis: 1234,
            approval: None,
        }
    }

    #[test]
    fn three_hundred_steps_stay_far_under_the_limits() {
        let mut v = View {
            turn_id: 1,
            section: "omt_x".into(),
            backend: "web (ops@10.0.0.7:22)".into(),
            ..View::default()
        };
        for i in 0..300 {
            v.push(step(i));
        }
        v.running = Some(("terminal".into(), "y".repeat(500), Duration::from_secs(75)));
        v.summary = Some("Done. ".repeat(50));
        assert_eq!(v.total_steps(), 300);
        assert_eq!(v.earlier_ok + v.earlier_failed, 270);
        let card = v.card(true).to_string();
        assert!(card.len() < 15 * 1024, "{} bytes", card.len());
        let md = v.markdown();
        assert!(md.contains("… 270 earlier steps"), "{md}");
        assert!(md.contains("running 1m15s"), "{md}");
        assert!(md.matches('\n').count() < 40);
    }

    #[test]
    fn a_finished_card_says_how_the_turn_ended_and_has_no_stop_button() {
        let mut v = View {
            turn_id: 7,
            backend: "local".into(),
            ..View::default()
        };
        let running = v.card(true);
        assert_eq!(running["header"]["title"]["content"], "Working · local");
        assert_eq!(running["config"]["streaming_mode"], true);
        assert!(running.to_string().contains(STOP_ACT));
        for (outcome, title, template) in [
            ("done", "Done · local", "green"),
            ("stopped", "Stopped · local", "grey"),
            ("bounded", "Stopped at a limit · local", "orange"),
            ("failed", "Failed · local", "red"),
        ] {
            v.outcome = Some(outcome.into());
            let card = v.card(false);
            assert_eq!(card["header"]["title"]["content"], title);
            assert_eq!(card["header"]["template"], template);
            assert!(!card.to_string().contains(STOP_ACT), "{card}");
            assert!(card["config"].get("streaming_mode").is_none());
        }
        v.outcome = None;
        let retired = v.retired_card();
        assert!(!retired.to_string().contains(STOP_ACT), "{retired}");
        assert_eq!(
            retired["header"]["title"]["content"],
            "Continued in a new card · local"
        );
    }

    #[test]
    fn names_cannot_inject_markup() {
        let mut v = View::default();
        v.push(Step {
            tool: "t**<at id=all>".into(),
            place: "[x](y)".into(),
            short: "a`b\nc".into(),
            ok: false,
            exit: None,
            millis: 61_000,
            approval: None,
        });
        let md = v.markdown();
        assert!(!md.contains("<at id=all>"), "{md}");
        assert!(md.contains("`a'b c`"), "{md}");
        assert!(md.contains("1m01s"), "{md}");
        assert!(md.starts_with("❌"), "{md}");
    }

    #[test]
    fn the_running_step_shows_its_output_and_the_finished_step_keeps_it() {
        let mut v = View {
            backend: "local".into(),
            ..View::default()
        };
        v.push(step(1));
        v.running = Some(("terminal".into(), "make".into(), Duration::from_secs(3)));
        v.tail = Some("step-1\nstep-2 ```\n<at id=all></at> [x](y)".into());
        let md = v.markdown();
        let (before, after) = md.split_once("running 3.0s\n").expect("the running line");
        assert!(!before.contains("step-1"), "{md}");
        assert!(after.starts_with("```\nstep-1\nstep-2 '''\n"), "{md}");
        assert_eq!(after.matches("```").count(), 2, "{md}");
        assert!(!md.contains("<at"), "{md}");
        // Finished: the output stays under the last step.
        v.running = None;
        v.push(step(2));
        let md = v.markdown();
        assert!(md.trim_end().ends_with("```"), "{md}");
        assert!(md.contains("step-2"), "{md}");
        // A very long tail is cut to its end.
        v.tail = Some("z".repeat(5000));
        assert!(v.markdown().chars().filter(|c| *c == 'z').count() < TAIL_CHARS);
    }

    #[test]
    fn a_waiting_step_says_who_may_approve_and_the_finished_step_who_answered() {
        let mut v = View {
            backend: "local".into(),
            ..View::default()
        };
        v.running = Some(("terminal".into(), "rm -rf x".into(), Duration::from_secs(3)));
        v.waiting = Some("an admin".into());
        let md = v.markdown();
        assert!(
            md.contains("✋ **terminal** · local · `rm -rf x` · waiting for approval by an admin"),
            "{md}"
        );
        assert!(!md.contains("running"), "{md}");
        v.running = None;
        v.waiting = None;
        for (outcome, by) in [("denied", Some("ou_admin")), ("no answer in 10 min", None)] {
            v.push(Step {
                approval: Some(StepApproval {
                    outcome: outcome.into(),
                    by: by.map(Into::into),
                }),
                ..step(1)
            });
        }
        let md = v.markdown();
        assert!(md.contains("· denied by <at id=ou_admin></at>\n"), "{md}");
        assert!(md.contains("· no answer in 10 min\n"), "{md}");
        // Only an id is mentioned.
        v.push(Step {
            approval: Some(StepApproval {
                outcome: "denied".into(),
                by: Some("<at id=all>".into()),
            }),
            ..step(2)
        });
        assert!(!v.markdown().contains("<at id=all>"));
    }
}
