//! Interactive shells through the gate: whether a shell may be had on a place now
//! ([`Gate::shell_allowed`]), and the lines a write would submit, judged where they are read
//! ([`Gate::typed`]). What is typed into a program that runs what it reads anyway is not
//! judged; a local shell opened above `read` takes nothing once the permission is `read`; a
//! line typed with echo off is never shown, and never asked about.

use crate::bash::Verdict;
use crate::config::Risky;
use crate::exec::Place;
use crate::exec::pty::{Entering, Reader};
use crate::workspace::Permission;
use crate::workspace::verdict::{Judgement, TypedAt, judge_typed};

use super::{Caller, Gate};

/// Where the lines of a write are judged: the permission now, the workspace and the account's
/// home on the shell's host.
pub struct JudgedIn {
    pub permission: Permission,
    pub workspace: String,
    pub home: Option<String>,
}

/// Lines of a write a person is asked about (the write was not sent).
#[derive(Debug, Clone)]
pub struct TypedAsk {
    /// Every line asked about, one per line: an approval covers what it showed.
    pub lines: String,
    /// The first line's reason.
    pub reason: String,
    /// The text the caller gets while nobody has allowed it.
    pub text: String,
}

/// What a write's lines need.
pub enum Typed {
    /// Send it.
    Send,
    /// A person must allow it first.
    Ask(TypedAsk),
}

/// Whether a write needs its lines judged (and so a [`JudgedIn`]): lines a shell reads, or a
/// local shell opened above `read`.
pub fn needs_judging(place: &Place, entering: &Entering) -> bool {
    lines_judged(entering) || above_read(place, entering)
}

fn lines_judged(entering: &Entering) -> bool {
    !matches!(entering.reader, Reader::Program(_)) && !entering.lines.is_empty()
}

fn above_read(place: &Place, entering: &Entering) -> bool {
    *place == Place::Local && !entering.read_only
}

impl Gate<'_> {
    /// Whether a shell may be opened, typed into or read on `place` now, at `permission`:
    /// locally always; on a target only at `full` (what is typed cannot be judged line by line)
    /// and where the target's policy does not refuse risky commands. The policy's `risky` when
    /// allowed; a refusal is audited. `raise`: how the caller's permission can be raised.
    pub async fn shell_allowed(
        &self,
        caller: &Caller<'_>,
        place: &Place,
        location: &str,
        permission: Permission,
        raise: &str,
    ) -> Result<Risky, String> {
        let (risky, _) = super::policy(self.db, place, self.local_risky).await;
        let Place::Target(alias) = place else {
            return Ok(risky);
        };
        let why = if permission < Permission::Full {
            Some(format!(
                "interactive shells on a target need the workspace permission `full` (what is typed into a shell cannot be judged line by line), and {raise}"
            ))
        } else if risky == Risky::Refuse {
            Some(format!(
                "interactive shells are disabled on `{alias}`: its policy refuses risky commands, and what is typed into a shell cannot be judged"
            ))
        } else {
            None
        };
        match why {
            None => Ok(risky),
            Some(reason) => {
                self.audit_refusal(
                    caller,
                    place,
                    location,
                    "permission",
                    Verdict::Refuse,
                    &reason,
                )
                .await;
                Err(reason)
            }
        }
    }

    /// Judges the lines a write to shell `id` would submit, at `judged_in`'s permission in the
    /// directory of the program that reads them. A refused line refuses the write; lines a
    /// person is asked about (where neither `approved` nor the shell's policy lets them
    /// through) go on one question. Either way nothing is sent, and it is audited.
    pub async fn typed(
        &self,
        caller: &Caller<'_>,
        (place, location, id): (&Place, &str, &str),
        entering: &Entering,
        judged_in: Option<&JudgedIn>,
        approved: bool,
    ) -> Result<Typed, String> {
        let Some(w) = judged_in.filter(|_| needs_judging(place, entering)) else {
            return Ok(Typed::Send);
        };
        if above_read(place, entering) && w.permission == Permission::Read {
            let why = format!(
                "nothing was sent to {id}: it was opened when the workspace allowed more than `read`, its permission now; close it and open another"
            );
            self.audit_refusal(caller, place, location, "permission", Verdict::Refuse, &why)
                .await;
            return Err(why);
        }
        let at = TypedAt {
            workspace: &w.workspace,
            home: w.home.as_deref(),
            cwd: entering.cwd.as_deref(),
        };
        let judged = lines_judged(entering);
        let mut asks: Vec<(&str, Judgement)> = Vec::new();
        for line in entering.lines.iter().filter(|_| judged) {
            let text = line.text.trim();
            let j = judge_typed(self.exec.guard(), w.permission, line, &at);
            let ask_ok = (approved || entering.risky_allowed) && !entering.hidden;
            if j.verdict == Verdict::Allow || (j.verdict == Verdict::Ask && ask_ok) {
                continue;
            }
            // A person can be asked only about what they may see; a refused line refuses the
            // write.
            if j.verdict == Verdict::Ask && !entering.hidden {
                asks.push((text, j));
                continue;
            }
            let text = self
                .typed_refused(caller, (place, location, id), text, entering.hidden, &j)
                .await;
            return Err(text);
        }
        let Some((text, j)) = asks.first() else {
            return Ok(Typed::Send);
        };
        let lines = asks.iter().map(|(t, _)| *t).collect::<Vec<_>>().join("\n");
        let refusal = self
            .typed_refused(caller, (place, location, id), text, false, j)
            .await;
        Ok(Typed::Ask(TypedAsk {
            lines,
            reason: j.reason.clone(),
            text: refusal,
        }))
    }

    /// Audits a line of a write that was refused or is asked about, and returns the text: a
    /// line typed with echo off is never shown.
    async fn typed_refused(
        &self,
        caller: &Caller<'_>,
        (place, location, id): (&Place, &str, &str),
        text: &str,
        hidden: bool,
        j: &Judgement,
    ) -> String {
        let (shown, why) = if hidden {
            (
                "a line typed with echo off (not shown)".to_string(),
                format!("is refused by the {} (rule `{}`)", j.by, j.rule),
            )
        } else {
            (
                format!("the line `{}`", super::clip(text, 200)),
                match j.verdict {
                    Verdict::Ask => format!("needs a person's approval: {}", j.reason),
                    _ => j.reason.clone(),
                },
            )
        };
        let reason = format!("nothing was sent to {id}: {shown} it would submit {why}");
        self.audit_refusal(caller, place, location, j.by, j.verdict, &reason)
            .await;
        reason
    }
}
