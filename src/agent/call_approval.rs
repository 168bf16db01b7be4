//! A call the guard asks about, in a turn: parked for a person ([`park`]), and settled when
//! the turn resumes ([`resumed`]): allowed (it runs, once, after its start is recorded),
//! denied, unanswered past its deadline, or ended by `/stop`. The model reads one clear
//! result for each ("allowed by …" and the output, "denied by …", "no answer in …"), naming
//! who answered by role and open_id ([`who`]): the service knows no display names (a card
//! click carries only the clicker's open_id), while the card mentions them by name.
//!
//! The card goes out through [`super::ChatOut::show_call_approval`] (idempotent per turn and
//! call); a card that was not recorded — its post failed, or the runner died first — is posted
//! by the turn resumed to do so. Where nobody can be asked (no card channel) or the command is
//! too long to show whole, the call stays refused.

use serde_json::json;

use super::tools::Asked;
use super::{AgentDeps, StepApproval};
use crate::authz::Approvers;
use crate::config::Risky;
use crate::turns::call_approval::{self as parked, Ask, CallApprovalState, Parked, Scope};
use crate::turns::{ActiveTurn, Fenced};

/// The longest command an approval card shows (bytes); a longer one is refused, not asked:
/// nobody approves what they cannot read.
pub const MAX_SHOWN_COMMAND: usize = 2000;

/// What a card for a parked call needs: where to post it and what it shows.
#[derive(Debug, Clone)]
pub struct CallApprovalCard {
    pub chat_id: String,
    /// The turn's latest message, which the card answers in its thread.
    pub reply_to: String,
    pub in_thread: bool,
    pub parked: Parked,
}

/// What a parked call's resume comes to.
pub(super) enum Resumed {
    /// Never parked: a start mark without a result is an interrupted call; without a mark
    /// the call never started (a command's mark follows the guard's verdict).
    NotParked,
    /// Allowed and started before, with no result: its outcome is unknown.
    Interrupted,
    /// Still waiting (its card had to be posted again, or a claim raced the decision): the
    /// turn awaits the `approvers` again; leave it.
    Wait(Approvers),
    /// Allowed: run it now (its start is recorded); its result starts with `said`.
    Run { said: String, step: StepApproval },
    /// Not run: the model receives the text; the step shows the note, at `place`.
    Result(String, StepApproval, String),
    /// `/stop` ended the wait; the model receives this and the turn stops.
    Stopped(String, String),
    /// Nobody answered in a scheduled run (nobody watches it): the model receives the text,
    /// the step shows the note, at `place`, and the run ends with the text.
    Ended(String, StepApproval, String),
}

/// Who answered, for the model: by role and open_id. An answer from anyone but the requester
/// came from an admin (nobody else may answer).
pub(super) fn who(by: &str, requester: &str) -> String {
    if by == requester {
        format!("the requester ({by})")
    } else {
        format!("an admin ({by})")
    }
}

/// Where the call would have run, as a step names it: `local` or the target's alias.
fn place(p: &Parked) -> String {
    p.ask
        .location
        .split(" · ")
        .next()
        .unwrap_or_default()
        .to_string()
}

/// The step note of a wait that ended without a person's answer.
fn unanswered(outcome: String) -> StepApproval {
    StepApproval { outcome, by: None }
}

/// Settles the parked call `key` of a resumed turn, if it was parked.
pub(super) async fn resumed(
    deps: &AgentDeps,
    turn: &ActiveTurn,
    key: &str,
) -> Result<Resumed, Fenced> {
    let Some(p) = parked::get(turn.fence.db(), turn.id, key).await? else {
        return Ok(Resumed::NotParked);
    };
    Ok(match p.state {
        CallApprovalState::Waiting if p.stop_requested => {
            parked::settle(&turn.fence, turn.id, key, CallApprovalState::Stopped).await?;
            show(deps, turn, key).await;
            Resumed::Stopped(STOPPED.into(), place(&p))
        }
        CallApprovalState::Waiting if p.overdue => {
            if !parked::settle(&turn.fence, turn.id, key, CallApprovalState::Expired).await? {
                // A decision landed between the read and the settle: read it again.
                return Box::pin(resumed(deps, turn, key)).await;
            }
            show(deps, turn, key).await;
            expired(deps, turn, &p)
        }
        CallApprovalState::Waiting => {
            let approvers = p.ask.approvers;
            parked::keep_waiting(&turn.fence, turn.id).await?;
            if p.card_message_id.is_none() {
                // Never recorded: post it (again; the post is idempotent per turn and call).
                post(deps, turn, p).await;
            }
            Resumed::Wait(approvers)
        }
        CallApprovalState::Allowed if p.started => Resumed::Interrupted,
        CallApprovalState::Allowed => {
            parked::mark_started(&turn.fence, turn.id, key).await?;
            let by = p.decided_by.unwrap_or_default();
            Resumed::Run {
                said: format!("allowed by {}", who(&by, &p.ask.requester)),
                step: StepApproval {
                    outcome: match p.scope {
                        Some(Scope::Thread) => "allowed in this thread",
                        _ => "allowed once",
                    }
                    .into(),
                    by: Some(by),
                },
            }
        }
        CallApprovalState::Denied => {
            let by = p.decided_by.clone().unwrap_or_default();
            Resumed::Result(
                format!(
                    "denied by {}: the command was not run. Do not retry it; do it another way or ask the user.",
                    who(&by, &p.ask.requester)
                ),
                StepApproval {
                    outcome: "denied".into(),
                    by: Some(by),
                },
                place(&p),
            )
        }
        CallApprovalState::Expired => expired(deps, turn, &p),
        CallApprovalState::Stopped => Resumed::Stopped(STOPPED.into(), place(&p)),
    })
}

/// What an unanswered wait comes to: in a scheduled run the run ends (nobody watches it);
/// otherwise the model reads that nobody answered and goes on.
fn expired(deps: &AgentDeps, turn: &ActiveTurn, p: &Parked) -> Resumed {
    let note = unanswered(waited(deps));
    match turn.messages.iter().find_map(|m| m.schedule_id) {
        Some(id) => Resumed::Ended(
            format!(
                "Scheduled run #{id} ended: nobody answered the approval of `{}` in {}, so it was not run.",
                p.ask.command.replace('`', "'"),
                wait(deps)
            ),
            note,
            place(p),
        ),
        None => Resumed::Result(no_answer(deps), note, place(p)),
    }
}

const STOPPED: &str = "not run: /stop ended the wait for a person's approval.";

/// `no answer in 10 min`: the step note of an expired wait.
fn waited(deps: &AgentDeps) -> String {
    format!("no answer in {}", wait(deps))
}

fn wait(deps: &AgentDeps) -> String {
    let secs = deps.config.approval_timeout.as_secs();
    if secs >= 60 && secs.is_multiple_of(60) {
        format!("{} min", secs / 60)
    } else {
        format!("{secs} s")
    }
}

fn no_answer(deps: &AgentDeps) -> String {
    let wait = wait(deps);
    format!(
        "denied: no answer in {wait} to the approval card, so the command was not run. \
         Do it another way or ask the user."
    )
}

/// What [`park`] did.
pub(super) enum Park {
    /// The call waits for the `approvers`; leave the turn.
    Waiting(Approvers),
    /// The backend's policy allows it without asking: run it.
    Allowed,
    /// Nobody can be asked: the call stays refused, with this text.
    Refused(String),
}

/// Parks a call the guard asks about: the row first (fenced), then its card (idempotent per
/// turn and call). `refused` is the text the call would get without anyone to ask.
pub(super) async fn park(
    deps: &AgentDeps,
    turn: &ActiveTurn,
    key: &str,
    asked: &Asked,
    refused: &str,
) -> Result<Park, Fenced> {
    // The backend's policy: local sections answer to their requester, targets to theirs.
    let place = match &asked.target {
        None => crate::exec::Place::Local,
        Some(alias) => crate::exec::Place::Target(alias.clone()),
    };
    let (risky, approvers) = crate::gate::policy(&deps.db, &place, deps.config.local_risky).await;
    // Headed like every task tool's error, with where it would have run.
    let refuse = |why: String| Park::Refused(format!("[{}] error: {why}", asked.location));
    match risky {
        Risky::Allow => return Ok(Park::Allowed),
        Risky::Refuse => {
            return Ok(refuse(format!(
                "refused: this needs a person's approval ({}), and this backend's policy                  refuses such commands instead of asking. Do it another way.",
                asked.reason
            )));
        }
        Risky::Ask => {}
    }
    if !deps.out.can_ask() {
        return Ok(Park::Refused(refused.to_string()));
    }
    if asked.command.len() > MAX_SHOWN_COMMAND {
        return Ok(refuse(format!(
            "refused: this needs a person's approval ({}), and the command is too long \
             ({} bytes, at most {MAX_SHOWN_COMMAND}) to show whole on an approval card. \
             Split it into shorter commands.",
            asked.reason,
            asked.command.len()
        )));
    }
    let Some(last) = turn.messages.last() else {
        return Ok(Park::Refused(refused.to_string()));
    };
    let ask = Ask {
        command: asked.command.clone(),
        reason: asked.reason.clone(),
        location: asked.location.clone(),
        cwd: asked.cwd.clone(),
        requester: last.sender.clone(),
        approvers,
        covers: asked.cover.says(),
    };
    let p = parked::park(
        &turn.fence,
        turn.id,
        key,
        &ask,
        &asked.cover.key,
        deps.config.approval_timeout,
    )
    .await?;
    if let Err(e) = crate::eventlog::append(
        &deps.db,
        &turn.section,
        "agent.approval",
        json!({"turn": turn.id, "call": key, "state": "waiting",
               "reason": ask.reason, "approvers": ask.approvers.as_str()}),
    )
    .await
    {
        tracing::warn!(turn.section = %turn.section, error = %e, "event log append failed");
    }
    let approvers = p.ask.approvers;
    if p.card_message_id.is_none() {
        post(deps, turn, p).await;
    }
    Ok(Park::Waiting(approvers))
}

fn card(turn: &ActiveTurn, parked: Parked) -> Option<CallApprovalCard> {
    let last = turn.messages.last()?;
    Some(CallApprovalCard {
        chat_id: turn.chat_id.clone(),
        reply_to: last.message_id.clone(),
        in_thread: last.in_thread,
        parked,
    })
}

/// Posts (or rewrites) the card of a parked call and records it. A card of a waiting call
/// that could not be posted is tried again later by a resumed turn ([`parked::card_failed`]).
async fn post(deps: &AgentDeps, turn: &ActiveTurn, p: Parked) {
    let Some(c) = card(turn, p) else { return };
    let key = &c.parked.call_key;
    match deps.out.show_call_approval(&c).await {
        Ok(Some(id)) => {
            if let Err(e) = parked::set_card(&deps.db, turn.id, key, &id).await {
                tracing::warn!(turn.section = %turn.section, error = %e, "recording an approval card failed");
            }
            return;
        }
        Ok(None) => {
            tracing::warn!(turn.section = %turn.section, "the approval card was not shown");
        }
        Err(e) => {
            tracing::warn!(turn.section = %turn.section, error = %format!("{e:#}"), "posting an approval card failed; it is tried again");
        }
    }
    if c.parked.card_message_id.is_none()
        && let Err(e) = parked::card_failed(&deps.db, turn.id, key).await
    {
        tracing::warn!(turn.section = %turn.section, error = %e, "recording a failed approval card failed");
    }
}

/// Shows a settled wait on its card (expired, stopped).
async fn show(deps: &AgentDeps, turn: &ActiveTurn, key: &str) {
    match parked::get(&deps.db, turn.id, key).await {
        Ok(Some(p)) if p.card_message_id.is_some() => post(deps, turn, p).await,
        Ok(_) => {}
        Err(e) => {
            tracing::warn!(turn.section = %turn.section, error = %e, "reading an approval failed")
        }
    }
}

/// Who allowed, in this thread, calls this one's cover takes in
/// ([`crate::bash::cover`]), if an allowance covers it: (open_id, as [`who`] says it).
pub(super) async fn covered(
    deps: &AgentDeps,
    turn: &ActiveTurn,
    asked: &Asked,
) -> Option<(String, String)> {
    let call = parked::Covered {
        location: &asked.location,
        cover: &asked.cover.key,
        command: &asked.command,
        cwd: &asked.cwd,
        with_env: asked.cover.same_env,
    };
    match parked::allowed_in_thread(&deps.db, &turn.section, call).await {
        Ok(by) => by.map(|(by, requester)| {
            let said = who(&by, &requester);
            (by, said)
        }),
        Err(e) => {
            // Not covered: the call is asked about, the safe way.
            tracing::warn!(turn.section = %turn.section, error = %e, "reading thread allowances failed");
            None
        }
    }
}
