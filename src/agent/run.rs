//! One turn: resume from the last stored step, then model call → tool calls → model call …
//! until a final answer or a bound, storing every step before the next.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::time::Instant;

use serde_json::json;

use super::call_approval::{self, Park, Resumed};
use super::conversation::{self, Flush, Kind, Mark, Stored};
use super::{
    AgentDeps, BindingFails, EarlierStep, NO_MODEL, StepApproval, StepEvent, answer, live, prompt,
    tools,
};
use crate::lark::client::idempotency_key;
use crate::llm::{ChatRequest, Message, ToolCall};
use crate::turns::{ActiveTurn, CancelReason, Fenced, TurnEnd};

/// Claims of one turn after which it is given up (a turn that keeps killing its runner).
const MAX_ATTEMPTS: i32 = 5;
/// The same call returning the same result this many times ends the turn.
const MAX_REPEATS: u32 = 3;
/// What the model receives for a call that was started but whose result was never stored.
pub const INTERRUPTED: &str = "interrupted, outcome unknown: check before repeating. \
The service stopped while this call ran; it may or may not have taken effect, and it was not run again.";
/// The result of a call that was marked but never started, because the runner let go of the
/// turn first (a shutdown): known not to have run, so it is not "interrupted".
const NOT_STARTED: &str = "not run: the service stopped before this call started. \
Run it again if it is still needed.";

/// The call this runner takes next, named in its last commit, with what was resolved for it
/// while that commit was in flight: `marked` when that commit also marked it started (a call
/// that runs no command; a command's mark waits for the guard's verdict, [`tools::StartMark`]).
struct Next {
    key: String,
    resolved: Option<tools::ReadAhead>,
    marked: bool,
}

/// What was read while a result committed.
enum Ahead {
    /// The next call's backend and workspace.
    Call(Option<tools::ReadAhead>),
    /// The next step's system prompt.
    Prompt(String),
    Nothing,
}

/// Why the loop stopped early.
enum Halt {
    /// Leave the turn running for another runner (shutdown, lost lease).
    Leave,
    /// End the turn with this state and message.
    End(TurnEnd, String),
}

/// Where a turn is: the steps of [`run_turn`], one at a time.
enum Step {
    /// Check the bounds and ask the model for its next reply.
    Ask,
    /// Run the tool calls of a stored reply; `marked` is its first call, already marked
    /// started, with what was read for it.
    Calls {
        reply: Box<Stored>,
        marked: Option<Next>,
    },
    /// Send this answer and end the turn.
    Deliver(String),
    /// Stop here: leave the turn to another runner, or end it with a message.
    Halt(Halt),
}

/// Runs (or resumes) one turn to its end. Each [`Step`] is taken by one method of [`Turn`];
/// every step stores what it did before the next one starts.
pub async fn run_turn(deps: &AgentDeps, turn: &ActiveTurn) -> anyhow::Result<()> {
    announce(deps, turn).await;
    if turn.answered {
        // The answer went out before the last runner died; only the ending is left.
        return finish(deps, turn, TurnEnd::Done, "answered", 0).await;
    }
    let mut t = match Turn::open(deps, turn).await? {
        Ok(t) => t,
        Err((stored, end, text)) => return conclude(deps, turn, &stored, end, &text).await,
    };
    let mut step = t.resume();
    loop {
        step = match step {
            Step::Ask => t.ask().await?,
            Step::Calls { reply, marked } => t.calls(&reply, marked).await?,
            Step::Deliver(text) => return deliver(deps, turn, TurnEnd::Done, &text).await,
            Step::Halt(Halt::Leave) => return Ok(()),
            Step::Halt(Halt::End(end, text)) => {
                return conclude(deps, turn, &t.stored, end, &text).await;
            }
        };
    }
}

/// Tells the progress view the turn (re)started, with the steps of earlier attempts.
async fn announce(deps: &AgentDeps, turn: &ActiveTurn) {
    let place = deps.bindings.place(&turn.section).await.ok();
    deps.steps.step(
        &turn.section,
        turn.id,
        &StepEvent::Started {
            resumed: turn.attempt > 1,
            chat_id: turn.chat_id.clone(),
            reply_to: turn
                .messages
                .last()
                .map(|m| m.message_id.clone())
                .unwrap_or_default(),
            in_thread: turn.messages.last().is_some_and(|m| m.in_thread),
            place,
        },
    );
    // A turn that awaited an approval is no retry, but its card lists its steps again too.
    if turn.attempt > 1 || turn.awaited {
        let steps = earlier_steps(deps, turn).await;
        if !steps.is_empty() {
            deps.steps
                .step(&turn.section, turn.id, &StepEvent::Earlier { steps });
        }
    }
}

/// A turn in progress: what is stored of it, and what the loop carries from step to step.
struct Turn<'a> {
    deps: &'a AgentDeps,
    turn: &'a ActiveTurn,
    router: std::sync::Arc<crate::llm::Router>,
    stored: Vec<Stored>,
    repeats: Repeats,
    /// The provider's token count over the bytes/4 estimate, only ever raised.
    scale: f64,
    loaded: conversation::Loaded,
    /// The next step's system prompt, when it was read while the last result committed.
    prompt_ahead: Option<String>,
    /// The images this turn's messages carried, read once at the first model call.
    images: Option<Vec<crate::turns::inputs::Image>>,
}

impl<'a> Turn<'a> {
    /// Loads what is stored of the turn and stores its user messages if that was not done
    /// yet. `Err` ends the turn at once (given up after too many attempts, or no model).
    async fn open(
        deps: &'a AgentDeps,
        turn: &'a ActiveTurn,
    ) -> anyhow::Result<Result<Turn<'a>, (Vec<Stored>, TurnEnd, String)>> {
        let mut stored = conversation::of_turn(turn.fence.db(), turn.id).await?;
        if turn.attempt > MAX_ATTEMPTS {
            let text = format!(
                "I could not finish this: the task was interrupted {} times. {}",
                turn.attempt - 1,
                done_so_far(&stored)
            );
            return Ok(Err((stored, TurnEnd::Failed, text)));
        }
        let Some(router) = deps.llm.clone() else {
            return Ok(Err((stored, TurnEnd::Failed, NO_MODEL.to_string())));
        };
        if !stored.iter().any(|s| s.kind == Kind::User) {
            for m in &turn.messages {
                // The person chose to share what they wrote: this turn reads it as written;
                // the stored transcript (later turns, a resumed turn) keeps it masked.
                let msg = Message::user(m.text.clone());
                let kept = Message::user(kept_text(deps, &m.text).await);
                let id =
                    conversation::append(&turn.fence, turn.id, Kind::User, None, &kept).await?;
                stored.push(Stored {
                    id,
                    turn_id: turn.id,
                    kind: Kind::User,
                    call_id: None,
                    message: msg,
                });
            }
        }
        let mut repeats = Repeats::default();
        repeats.replay(&stored);
        Ok(Ok(Turn {
            deps,
            turn,
            router,
            stored,
            repeats,
            scale: 1.0,
            loaded: conversation::Loaded::default(),
            prompt_ahead: None,
            images: None,
        }))
    }

    /// Where a resumed turn picks up: a stored final answer is delivered, a reply's open tool
    /// calls are settled, else the model is asked.
    fn resume(&self) -> Step {
        let stored = &self.stored;
        let Some(last) = stored
            .iter()
            .rev()
            .find(|s| s.kind == Kind::Assistant)
            .cloned()
        else {
            return Step::Ask;
        };
        let answered_after = stored
            .iter()
            .any(|s| s.id > last.id && s.kind == Kind::User);
        if !answered_after
            && last.message.tool_calls.is_empty()
            && stored.last().map(|s| s.id) == Some(last.id)
        {
            return Step::Deliver(last.message.text_content());
        }
        if !last.message.tool_calls.is_empty() {
            return Step::Calls {
                reply: Box::new(last),
                marked: None,
            };
        }
        Step::Ask
    }

    /// Gives each image of this turn's messages to the user message that names its path, as
    /// image content (a route without `vision` gets the text alone: see `llm::Router`). An
    /// image that cannot be read leaves its message as text, which names the path.
    async fn with_images(&mut self, messages: &mut [Message]) {
        let images = match &self.images {
            Some(i) => i,
            None => {
                let ids: Vec<String> = self
                    .turn
                    .messages
                    .iter()
                    .map(|m| m.message_id.clone())
                    .collect();
                let read = crate::turns::inputs::images_of(self.turn.fence.db(), &ids).await;
                self.images.insert(read.unwrap_or_else(|e| {
                    tracing::warn!(section.id = %self.turn.section, error = %e, "reading a turn's images failed; they go as paths");
                    Vec::new()
                }))
            }
        };
        for image in images {
            if let Some(m) = messages
                .iter_mut()
                .find(|m| m.role == "user" && m.text_content().contains(&image.path))
            {
                m.add_image(&image.mime, &image.data);
            }
        }
    }

    /// Checks the bounds, asks the model, and stores its reply with the start mark of its
    /// first call.
    async fn ask(&mut self) -> anyhow::Result<Step> {
        let (deps, turn) = (self.deps, self.turn);
        if let Some(h) = halted(turn, &self.stored) {
            return Ok(Step::Halt(h));
        }
        let iterations = self
            .stored
            .iter()
            .filter(|s| s.kind == Kind::Assistant)
            .count() as u32;
        if iterations >= deps.config.max_iterations {
            let text = format!(
                "Stopped: this task reached the limit of {} model steps per turn. {}",
                deps.config.max_iterations,
                done_so_far(&self.stored)
            );
            return Ok(Step::Halt(Halt::End(TurnEnd::Bounded, text)));
        }
        let system = match self.prompt_ahead.take() {
            Some(p) => p,
            None => prompt::system_prompt(deps, &turn.section, &turn.chat_id).await,
        };
        let context = match conversation::context(
            &turn.fence,
            &mut self.loaded,
            &self.stored,
            &system,
            deps.config.context_tokens,
            self.scale,
            turn.id,
        )
        .await
        {
            Ok(m) => m,
            Err(Fenced::Lost) => return Ok(Step::Halt(Halt::Leave)),
            Err(e) => return Err(e.into()),
        };
        let estimate = context.bytes / 4;
        let mut messages = context.messages;
        self.with_images(&mut messages).await;
        let request = ChatRequest {
            messages,
            tools: Some(tools::definitions()),
            tool_choice: Some(json!("auto")),
            ..Default::default()
        };
        let started = Instant::now();
        let routed = tokio::select! {
            r = self.router.chat(deps.model.as_deref(), request) => r,
            // `halted`, at the next step, decides what the cancel means.
            _ = turn.cancel.token().cancelled() => return Ok(Step::Ask),
        };
        let routed = match routed {
            Ok(r) => r,
            Err(e) => {
                let text = crate::llm::classify::scrub(&e.to_string(), None);
                log(
                    deps,
                    turn,
                    "agent.error",
                    json!({"turn": turn.id, "stage": "model", "error": text}),
                )
                .await;
                let next = match e.needs_operator() {
                    true => {
                        "an operator of this service must act before I can answer (ask whoever runs it to fix the model's API key); sending the request again will not help until then"
                    }
                    false => "send the request again later",
                };
                let answer = format!(
                    "I could not reach the model: {text}. Nothing more was done; {next}. {}",
                    done_so_far(&self.stored)
                );
                return Ok(Step::Halt(Halt::End(TurnEnd::Failed, answer)));
            }
        };
        let usage = routed.served.usage;
        if usage.prompt_tokens > 0 && estimate > 0 {
            // Only ever up: the bytes/4 estimate is kept unless the provider counts more.
            self.scale = (usage.prompt_tokens as f64 / estimate as f64).clamp(1.0, 4.0);
        }
        let mut reply = routed.response.message().cloned().unwrap_or_default();
        reply.role = "assistant".into();
        let event = json!({
            "turn": turn.id,
            "route": format!("{}/{}", routed.served.provider, routed.served.model),
            "chain": routed.served.chain,
            "latency_ms": started.elapsed().as_millis() as u64,
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "tool_calls": reply.tool_calls.iter().map(|c| c.function.name.clone()).collect::<Vec<_>>(),
        });
        // The reply, its event-log entry and the start mark of its first call commit together:
        // the mark must be durable before the call runs, and the reply is what names the call.
        // (A crash right after this commit leaves the first call marked though it never ran; the
        // resumed turn then calls it interrupted — wrong in the safe direction.) A command's
        // mark is not written here: the guard may ask a person about it, and a call that only
        // waited must never look started, so its mark follows the guard's verdict.
        // While it commits, the first call's backend and workspace are read: after the model
        // asked for the call, and before the call starts, which waits for the commit.
        let first = reply.tool_calls.first();
        let first_call = first.map(|c| c.id.as_str());
        let first_mark = first
            .filter(|c| !tools::runs_a_command(c))
            .map(|c| c.id.as_str());
        let (appended, resolved) = tokio::join!(
            conversation::append_logged(
                &turn.fence,
                turn.id,
                Kind::Assistant,
                None,
                &reply,
                ("agent.step", event),
                first_mark.map(Mark::InThisRow),
                Flush::Wait,
                None,
            ),
            async {
                match first {
                    Some(call) => tools::resolve(deps, &turn.section, call).await,
                    None => None,
                }
            }
        );
        let appended = match appended {
            Ok(a) => a,
            Err(Fenced::Lost) => return Ok(Step::Halt(Halt::Leave)),
            Err(e) => return Err(e.into()),
        };
        let row = Stored {
            id: appended.id,
            turn_id: turn.id,
            kind: Kind::Assistant,
            call_id: None,
            message: reply.clone(),
        };
        self.stored.push(row.clone());
        let marked = first_call.map(|call| {
            let key = format!("{}:{call}", appended.id);
            if let Some(mark) = appended.mark {
                self.stored.push(Stored {
                    id: mark,
                    turn_id: turn.id,
                    kind: Kind::ToolStarted,
                    call_id: Some(key.clone()),
                    message: conversation::start_mark(),
                });
            }
            Next {
                key,
                resolved,
                marked: appended.mark.is_some(),
            }
        });
        deps.steps.step(
            &turn.section,
            turn.id,
            &StepEvent::Model {
                tools: reply
                    .tool_calls
                    .iter()
                    .map(|c| c.function.name.clone())
                    .collect(),
            },
        );
        if reply.tool_calls.is_empty() {
            return Ok(Step::Deliver(reply.text_content()));
        }
        Ok(Step::Calls {
            reply: Box::new(row),
            marked,
        })
    }

    /// Runs a reply's tool calls, each stored before the next; then the model is asked again.
    async fn calls(&mut self, reply: &Stored, marked: Option<Next>) -> anyhow::Result<Step> {
        Ok(
            match run_calls(
                self.deps,
                self.turn,
                &mut self.stored,
                reply,
                &mut self.repeats,
                marked,
                &mut self.prompt_ahead,
            )
            .await?
            {
                None => Step::Ask,
                Some(h) => Step::Halt(h),
            },
        )
    }
}

async fn binding_fails(deps: &AgentDeps, turn: &ActiveTurn, fails: &BindingFails, tool: &str) {
    let tell = match deps.bindings.refused_call(&turn.section, fails, tool).await {
        Ok(tell) => tell,
        Err(e) => {
            tracing::warn!(section.id = %turn.section, error = %format!("{e:#}"), "recording a refused call failed");
            return;
        }
    };
    let Some(last) = turn.messages.last().filter(|_| tell) else {
        return;
    };
    let key = format!(
        "binding:{}:{}",
        turn.section,
        fails.bound_at.timestamp_micros()
    );
    let sent = deps
        .out
        .reply_markdown(
            &turn.chat_id,
            &last.message_id,
            &fails.to_string(),
            last.in_thread,
            &idempotency_key(&key, "binding-fails"),
        )
        .await;
    let marked = match sent {
        Ok(()) => deps.bindings.told(&turn.section, fails).await,
        Err(e) => Err(e),
    };
    if let Err(e) = marked {
        tracing::warn!(section.id = %turn.section, error = %format!("{e:#}"), "telling the thread its binding fails went wrong");
    }
}

/// Most earlier calls read back for a resumed turn's progress view.
const MAX_EARLIER: i64 = 1000;

/// The calls earlier runners of this turn finished (the latest [`MAX_EARLIER`]), from the
/// event log, read before this runner writes anything. A read that fails only costs the view.
async fn earlier_steps(deps: &AgentDeps, turn: &ActiveTurn) -> Vec<EarlierStep> {
    let rows: Result<Vec<serde_json::Value>, _> = sqlx::query_scalar(
        "SELECT payload FROM (SELECT seq, payload FROM session_events \
          WHERE section_id = $1 AND kind = 'agent.tool' AND payload->>'turn' = $2 \
          ORDER BY seq DESC LIMIT $3) latest ORDER BY seq",
    )
    .bind(&turn.section)
    .bind(turn.id.to_string())
    .bind(MAX_EARLIER)
    .fetch_all(&deps.db)
    .await;
    match rows {
        Ok(rows) => rows.iter().map(EarlierStep::from_entry).collect(),
        Err(e) => {
            tracing::warn!(section.id = %turn.section, error = %e, "reading the turn's earlier steps failed");
            Vec::new()
        }
    }
}

/// What a cancellation means now, if the turn was cancelled.
fn halted(turn: &ActiveTurn, stored: &[Stored]) -> Option<Halt> {
    Some(match turn.cancel.reason()? {
        CancelReason::Shutdown | CancelReason::LeaseLost => Halt::Leave,
        CancelReason::Stop => Halt::End(
            TurnEnd::Stopped,
            format!("Stopped by /stop. {}", done_so_far(stored)),
        ),
        CancelReason::Budget => Halt::End(
            TurnEnd::Bounded,
            format!(
                "Stopped: this task used up its time budget. {}",
                done_so_far(stored)
            ),
        ),
    })
}

/// Whether `stored` has a row of `kind` for the call `key`.
fn has(stored: &[Stored], kind: Kind, key: &str) -> bool {
    stored
        .iter()
        .any(|s| s.kind == kind && s.call_id.as_deref() == Some(key))
}

/// Runs the calls of `assistant` that have no stored result, in order. A call with a start
/// mark but no result is not run again: the model gets [`INTERRUPTED`] — unless this runner
/// wrote that mark itself (`marked`, in the commit of the reply or of the previous result) and
/// has not started the call yet. A command call that this runner did not name in its last
/// commit (a resumed turn's) may be parked: its wait is settled first ([`call_approval::resumed`]);
/// without a mark or a wait it never started, and runs now.
///
/// Each result's commit overlaps the read that follows it: the next call's backend and
/// workspace, or after the last call the next step's system prompt (`prompt_ahead`).
async fn run_calls(
    deps: &AgentDeps,
    turn: &ActiveTurn,
    stored: &mut Vec<Stored>,
    assistant: &Stored,
    repeats: &mut Repeats,
    mut marked: Option<Next>,
    prompt_ahead: &mut Option<String>,
) -> anyhow::Result<Option<Halt>> {
    let calls = &assistant.message.tool_calls;
    for (i, call) in calls.iter().enumerate() {
        let key = format!("{}:{}", assistant.id, call.id);
        if has(stored, Kind::Tool, &key) {
            continue;
        }
        // `fresh`: named in this runner's last commit, so never parked nor started before.
        let (fresh, ours, resolved) = match marked.take() {
            Some(m) if m.key == key => (true, m.marked, m.resolved),
            _ => (false, false, None),
        };
        let command = tools::runs_a_command(call);
        let started = has(stored, Kind::ToolStarted, &key);
        // Who allowed this call, when it waited for a person and was allowed: as the model
        // reads it, and as its step shows it.
        let mut allowed_by: Option<String> = None;
        let mut approval_step: Option<StepApproval> = None;
        if !fresh && (started || command) {
            let short = tools::short_form(call);
            let settled = match call_approval::resumed(deps, turn, &key).await {
                Ok(r) => r,
                Err(Fenced::Lost) => return Ok(Some(Halt::Leave)),
                Err(e) => return Err(e.into()),
            };
            match settled {
                Resumed::Run { said, step } => {
                    allowed_by = Some(said);
                    approval_step = Some(step);
                }
                Resumed::Wait(approvers) => {
                    // The card shows the call waiting again.
                    for ev in [
                        StepEvent::ToolStarted {
                            tool: call.function.name.clone(),
                            short,
                        },
                        StepEvent::Awaiting {
                            approvers: approvers.who().into(),
                        },
                    ] {
                        deps.steps.step(&turn.section, turn.id, &ev);
                    }
                    return Ok(Some(Halt::Leave));
                }
                Resumed::Result(text, step, place) => {
                    not_run(deps, turn, stored, (&key, call, short), &text, step, place).await?;
                    continue;
                }
                Resumed::Stopped(text, place) => {
                    let step = StepApproval {
                        outcome: "ended by /stop".into(),
                        by: None,
                    };
                    not_run(deps, turn, stored, (&key, call, short), &text, step, place).await?;
                    turn.cancel.cancel(CancelReason::Stop);
                    return Ok(halted(turn, stored));
                }
                Resumed::Ended(text, step, place) => {
                    not_run(deps, turn, stored, (&key, call, short), &text, step, place).await?;
                    return Ok(Some(Halt::End(
                        TurnEnd::Stopped,
                        format!("{text} {}", done_so_far(stored)),
                    )));
                }
                // Neither marked nor parked: it never started (its verdict was not known yet).
                Resumed::NotParked if !started => {}
                Resumed::NotParked | Resumed::Interrupted => {
                    let event = json!({"turn": turn.id, "tool": call.function.name, "short": short, "interrupted": true});
                    // A command that was running when its runner went away ran, with an
                    // unknown end.
                    let audit = command_run(turn, call, None, "interrupted", None, None)
                        .or_else(|| interrupted_shell_call(turn, call));
                    store_result(
                        turn,
                        stored,
                        &key,
                        call,
                        INTERRUPTED,
                        (event, audit.as_ref()),
                        None,
                    )
                    .await?;
                    continue;
                }
            }
        }
        if let Some(h) = halted(turn, stored) {
            if ours && matches!(h, Halt::Leave) {
                // Marked, but known not to have started: say so rather than leave it looking
                // interrupted. (After a lost lease this write is refused, and it does look so.)
                let event = json!({"turn": turn.id, "tool": call.function.name, "short": tools::short_form(call), "not_started": true});
                match store_result(turn, stored, &key, call, NOT_STARTED, (event, None), None).await
                {
                    Ok(()) | Err(Fenced::Lost) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            // An ending writes "not run" for every call without a result (`conclude`).
            return Ok(Some(h));
        }
        if !ours && allowed_by.is_none() && !command {
            let mark = conversation::start_mark();
            match conversation::append(&turn.fence, turn.id, Kind::ToolStarted, Some(&key), &mark)
                .await
            {
                Ok(id) => stored.push(Stored {
                    id,
                    turn_id: turn.id,
                    kind: Kind::ToolStarted,
                    call_id: Some(key.clone()),
                    message: mark,
                }),
                Err(Fenced::Lost) => return Ok(Some(Halt::Leave)),
                Err(e) => return Err(e.into()),
            }
        }
        let short = tools::short_form(call);
        deps.steps.step(
            &turn.section,
            turn.id,
            &StepEvent::ToolStarted {
                tool: call.function.name.clone(),
                short: short.clone(),
            },
        );
        // A command's start mark, written once the guard let it through (an allowed call's
        // start is on its approval row, [`call_approval::resumed`]).
        let mut start = (command && !ours && allowed_by.is_none())
            .then(|| tools::StartMark::new(&turn.fence, turn.id, &key));
        let mut result = run_call(
            deps,
            turn,
            call,
            resolved,
            allowed_by.is_some(),
            start.as_mut(),
        )
        .await;
        // Allowed in this thread: a call of the same cover runs without asking (it did not
        // run above).
        let mut in_thread_by: Option<String> = None;
        if let Some(asked) = &result.asked
            && allowed_by.is_none()
            && turn.cancel.reason().is_none()
            && let Some(by) = call_approval::covered(deps, turn, asked).await
        {
            result = run_call(deps, turn, call, None, true, start.as_mut()).await;
            result.text = format!("allowed in this thread by {}:\n{}", by.1, result.text);
            approval_step = Some(StepApproval {
                outcome: "allowed in this thread".into(),
                by: Some(by.0.clone()),
            });
            in_thread_by = Some(by.0);
        }
        if let Some(asked) = &result.asked
            && allowed_by.is_none()
            && in_thread_by.is_none()
            && turn.cancel.reason().is_none()
        {
            match call_approval::park(deps, turn, &key, asked, &result.text).await {
                Ok(Park::Waiting(approvers)) => {
                    deps.steps.step(
                        &turn.section,
                        turn.id,
                        &StepEvent::Awaiting {
                            approvers: approvers.who().into(),
                        },
                    );
                    return Ok(Some(Halt::Leave));
                }
                Ok(Park::Allowed) => {
                    result = run_call(deps, turn, call, None, true, start.as_mut()).await;
                    result.text = format!(
                        "allowed by this backend's policy (risky: allow):\n{}",
                        result.text
                    );
                }
                Ok(Park::Refused(text)) => result.text = text,
                Err(Fenced::Lost) => return Ok(Some(Halt::Leave)),
                Err(e) => return Err(e.into()),
            }
        }
        match start.and_then(|m| m.written) {
            Some(Ok(id)) => stored.push(Stored {
                id,
                turn_id: turn.id,
                kind: Kind::ToolStarted,
                call_id: Some(key.clone()),
                message: conversation::start_mark(),
            }),
            Some(Err(Fenced::Lost)) => return Ok(Some(Halt::Leave)),
            Some(Err(e)) => return Err(e.into()),
            None => {}
        }
        if let Some(said) = &allowed_by {
            result.text = format!("{said}:\n{}", result.text);
        }
        if let Some(fails) = &result.binding_fails {
            binding_fails(deps, turn, fails, &call.function.name).await;
        }
        let reason = turn.cancel.reason();
        let text = match reason {
            Some(CancelReason::LeaseLost) => return Ok(Some(Halt::Leave)),
            // The call was cut short by a shutdown: its effect is unknown to the next runner.
            Some(CancelReason::Shutdown) => INTERRUPTED.to_string(),
            Some(CancelReason::Stop) => format!("{}\n(stopped by the user's /stop)", result.text),
            Some(CancelReason::Budget) => {
                format!("{}\n(stopped: the turn's time budget ran out)", result.text)
            }
            None => result.text.clone(),
        };
        let target = result
            .backend
            .as_deref()
            .filter(|b| *b != "local" && *b != "control");
        let event = json!({
            "turn": turn.id,
            "tool": call.function.name,
            "backend": match result.backend.as_deref() {
                Some("local") => "local", Some("control") => "control", Some(_) => "ssh", None => "unresolved",
            },
            "target": target,
            "duration_ms": result.millis,
            "exit": result.exit,
            "ok": result.ok,
            "short": short,
            "approval": approval_step,
        });
        // A command that ran, or a shell that was opened, typed into or closed, is audited in
        // the same commit as its result.
        let audit = match &result.shell_row {
            Some(row) => Some(shell_call(turn, call, target, row, "ok")),
            None => match result.exit.as_deref() {
                Some(exit) => {
                    let outcome = if exit == "exit 0" { "ok" } else { exit };
                    command_run(turn, call, target, outcome, Some(exit), Some(&result))
                }
                None if result.ok => file_change(turn, call, target, result.millis),
                None => None,
            },
        };
        // The result and its event-log entry commit together, with the start mark of the next
        // call of this reply when there is one (so a step costs one commit, not two) — unless
        // that call runs a command, whose mark follows the guard's verdict.
        let next = calls[i + 1..]
            .iter()
            .map(|c| (format!("{}:{}", assistant.id, c.id), c))
            .find(|(k, _)| !has(stored, Kind::Tool, k) && !has(stored, Kind::ToolStarted, k))
            .filter(|_| reason.is_none());
        let next_key = next
            .as_ref()
            .filter(|(_, c)| !tools::runs_a_command(c))
            .map(|(k, _)| k.as_str());
        let next_marked = next_key.is_some();
        let (written, ahead) = tokio::join!(
            store_result(
                turn,
                stored,
                &key,
                call,
                &text,
                (event, audit.as_ref()),
                next_key
            ),
            async {
                match (&next, reason) {
                    (Some((_, c)), _) => Ahead::Call(tools::resolve(deps, &turn.section, c).await),
                    (None, None) => Ahead::Prompt(
                        prompt::system_prompt(deps, &turn.section, &turn.chat_id).await,
                    ),
                    (None, Some(_)) => Ahead::Nothing,
                }
            }
        );
        match written {
            Ok(()) => {}
            Err(Fenced::Lost) => return Ok(Some(Halt::Leave)),
            Err(e) => return Err(e.into()),
        }
        marked = match ahead {
            Ahead::Call(resolved) => next.map(|(key, _)| Next {
                key,
                resolved,
                marked: next_marked,
            }),
            Ahead::Prompt(p) => {
                *prompt_ahead = Some(p);
                None
            }
            Ahead::Nothing => None,
        };
        if !result.ok {
            log(
                deps,
                turn,
                "agent.error",
                json!({"turn": turn.id, "stage": "tool", "tool": call.function.name,
                "error": crate::llm::classify::scrub(&result.text, None)}),
            )
            .await;
        }
        deps.steps.step(
            &turn.section,
            turn.id,
            &StepEvent::ToolFinished {
                tool: call.function.name.clone(),
                ok: result.ok,
                millis: result.millis,
                backend: result.backend.clone(),
                exit: result.exit.clone(),
                approval: approval_step,
            },
        );
        if reason.is_some() {
            return Ok(halted(turn, stored));
        }
        if repeats.record(call, &text) >= MAX_REPEATS {
            let msg = format!(
                "Stopped: the same `{}` call returned the same result {MAX_REPEATS} times, so I was not making progress. {}",
                call.function.name,
                done_so_far(stored)
            );
            return Ok(Some(Halt::End(TurnEnd::Bounded, msg)));
        }
    }
    Ok(None)
}

/// Runs one call with the turn's cancellation; a call that runs a command has its output
/// forwarded to the progress view while it runs ([`live`]).
async fn run_call(
    deps: &AgentDeps,
    turn: &ActiveTurn,
    call: &ToolCall,
    resolved: Option<tools::ReadAhead>,
    approved: bool,
    mark: Option<&mut tools::StartMark<'_>>,
) -> tools::ToolResult {
    let tail = live::for_tool(&call.function.name);
    let run = tools::run(
        deps,
        &turn.section,
        &turn.chat_id,
        call,
        turn.cancel.token(),
        resolved,
        approved,
        tail.clone(),
        mark,
    );
    live::watched(deps, &turn.section, turn.id, tail.as_deref(), run).await
}

/// A person's message as the transcript keeps it: every secret masked (by the detectors alone
/// when the targets' secrets cannot be searched now).
async fn kept_text(deps: &AgentDeps, text: &str) -> String {
    match deps.plane.filter().mask(&deps.db, text).await {
        Ok(m) => m.text,
        Err(e) => {
            tracing::warn!(error = %e, "the secret scanner failed; the detectors alone masked a stored message");
            crate::mask::redact(text)
        }
    }
}

/// The audit row of a command-running call (`terminal`, `execute_code`); `None` for other
/// tools. The actor is the sender of the turn's latest message; the row is the gate's
/// ([`crate::gate::command_row`]), with the turn.
fn command_run(
    turn: &ActiveTurn,
    call: &ToolCall,
    target: Option<&str>,
    outcome: &str,
    exit: Option<&str>,
    result: Option<&tools::ToolResult>,
) -> Option<crate::audit::CommandRun> {
    let key = match call.function.name.as_str() {
        "terminal" => "command",
        "execute_code" => "code",
        _ => return None,
    };
    let args = call.parsed_arguments().unwrap_or_default();
    let text = args.get(key).and_then(|v| v.as_str()).unwrap_or_default();
    let actor = sender(turn);
    let caller = crate::gate::Caller {
        actor: &actor,
        section: &turn.section,
        via: "chat",
        tool: &call.function.name,
    };
    Some(crate::gate::command_row(
        &caller,
        target,
        text,
        outcome,
        json!({
            "language": args.get("language"),
            "exit": exit,
            "duration_ms": result.map_or(0, |r| r.millis),
            "turn": turn.id,
            "masked": result.map(|r| &r.masked).filter(|m| !m.is_empty()),
        }),
    ))
}

/// The audit row of a file a call changed (`write_file`, `patch`); `None` for other tools.
fn file_change(
    turn: &ActiveTurn,
    call: &ToolCall,
    target: Option<&str>,
    millis: u64,
) -> Option<crate::audit::CommandRun> {
    let args = call.parsed_arguments().unwrap_or_default();
    let path = args
        .get("path")
        .and_then(|v| v.as_str())
        .unwrap_or_default();
    let actor = sender(turn);
    let caller = crate::gate::Caller {
        actor: &actor,
        section: &turn.section,
        via: "chat",
        tool: &call.function.name,
    };
    let detail = match call.function.name.as_str() {
        "write_file" => json!({
            "bytes": args.get("content").and_then(|v| v.as_str()).map(str::len),
            "duration_ms": millis,
            "turn": turn.id,
        }),
        _ => json!({ "duration_ms": millis, "turn": turn.id }),
    };
    crate::gate::file_row(&caller, target, path, detail)
}

/// Who a turn's audit rows name: the sender of its latest message.
fn sender(turn: &ActiveTurn) -> String {
    turn.messages
        .last()
        .map(|m| m.sender.clone())
        .unwrap_or_else(|| "unknown".into())
}

/// The audit row of a shell call that acted (`row`, from the call), as the turn's.
fn shell_call(
    turn: &ActiveTurn,
    call: &ToolCall,
    target: Option<&str>,
    row: &tools::ShellRow,
    outcome: &str,
) -> crate::audit::CommandRun {
    let mut detail = row.detail.clone();
    detail["tool"] = json!(call.function.name);
    detail["turn"] = json!(turn.id);
    crate::audit::CommandRun {
        action: row.action,
        actor: sender(turn),
        target: target.map(str::to_string),
        outcome: outcome.to_string(),
        detail,
        at: row.at,
    }
}

/// The audit row of a shell call that was under way when its runner went away: it may have
/// opened the shell or typed (whether with echo off is not known any more, so the text is not
/// recorded).
fn interrupted_shell_call(turn: &ActiveTurn, call: &ToolCall) -> Option<crate::audit::CommandRun> {
    let args = call.parsed_arguments().unwrap_or_default();
    let row = match call.function.name.as_str() {
        "shell_open" => tools::ShellRow {
            action: "shell.open",
            detail: json!({}),
            at: None,
        },
        "shell_write" => tools::ShellRow {
            action: "shell.input",
            detail: json!({
                "shell_id": args.get("shell_id"),
                "text": crate::exec::pty::HIDDEN_INPUT,
            }),
            at: None,
        },
        _ => return None,
    };
    Some(shell_call(turn, call, None, &row, "interrupted"))
}

/// Stores a call's result and its event-log entry, with `next_mark` (the start mark of the
/// next call to run) in the same commit.
///
/// A result that carries no mark is committed without waiting for its WAL flush
/// ([`Flush::Later`]). That is safe: if a crash of PostgreSQL itself loses it, the call is left
/// marked without a result, which a resumed turn reports as interrupted and never re-runs.
/// And it cannot be lost once anything depends on it: the next thing written is the model's
/// next reply (or the turn's end), a flushed commit, and WAL is flushed in order, so the result
/// is durable before any further call runs or any answer is sent. A result that carries a mark
/// waits for its flush: the marked call runs next, and its mark must survive any crash.
async fn store_result(
    turn: &ActiveTurn,
    stored: &mut Vec<Stored>,
    key: &str,
    call: &ToolCall,
    text: &str,
    (event, audit): (serde_json::Value, Option<&crate::audit::CommandRun>),
    next_mark: Option<&str>,
) -> Result<(), Fenced> {
    let msg = Message::tool(call.id.clone(), text);
    let appended = conversation::append_logged(
        &turn.fence,
        turn.id,
        Kind::Tool,
        Some(key),
        &msg,
        ("agent.tool", event),
        next_mark.map(Mark::Key),
        if next_mark.is_some() {
            Flush::Wait
        } else {
            Flush::Later
        },
        audit,
    )
    .await?;
    stored.push(Stored {
        id: appended.id,
        turn_id: turn.id,
        kind: Kind::Tool,
        call_id: Some(key.to_string()),
        message: msg,
    });
    if let (Some(id), Some(next)) = (appended.mark, next_mark) {
        stored.push(Stored {
            id,
            turn_id: turn.id,
            kind: Kind::ToolStarted,
            call_id: Some(next.to_string()),
            message: conversation::start_mark(),
        });
    }
    Ok(())
}

/// Stores the result of a call that waited for a person and was not run, and shows it as a
/// step with how the wait ended.
async fn not_run(
    deps: &AgentDeps,
    turn: &ActiveTurn,
    stored: &mut Vec<Stored>,
    (key, call, short): (&str, &ToolCall, String),
    text: &str,
    step: StepApproval,
    place: String,
) -> Result<(), Fenced> {
    let event = json!({"turn": turn.id, "tool": call.function.name, "short": short,
        "backend": if place == "local" { "local" } else { "ssh" },
        "target": (place != "local").then_some(&place),
        "ok": false, "exit": "not run", "approval": step});
    store_result(turn, stored, key, call, text, (event, None), None).await?;
    let tool = call.function.name.clone();
    for ev in [
        StepEvent::ToolStarted {
            tool: tool.clone(),
            short,
        },
        StepEvent::ToolFinished {
            tool,
            ok: false,
            millis: 0,
            backend: Some(place),
            exit: Some("not run".into()),
            approval: Some(step),
        },
    ] {
        deps.steps.step(&turn.section, turn.id, &ev);
    }
    Ok(())
}

/// Ends the turn with `text`: every open call gets a "not run" result (so the stored
/// conversation stays well-formed), the text is stored as the model's answer and sent.
async fn conclude(
    deps: &AgentDeps,
    turn: &ActiveTurn,
    stored: &[Stored],
    end: TurnEnd,
    text: &str,
) -> anyhow::Result<()> {
    if let Some(last) = stored.iter().rev().find(|s| s.kind == Kind::Assistant) {
        for call in &last.message.tool_calls {
            let key = format!("{}:{}", last.id, call.id);
            let answered = stored
                .iter()
                .any(|s| s.kind == Kind::Tool && s.call_id.as_deref() == Some(key.as_str()));
            if !answered {
                let msg =
                    Message::tool(call.id.clone(), "not run: the turn ended before this call");
                match conversation::append(&turn.fence, turn.id, Kind::Tool, Some(&key), &msg).await
                {
                    Ok(_) => {}
                    Err(Fenced::Lost) => return Ok(()),
                    Err(e) => return Err(e.into()),
                }
            }
        }
    }
    let msg = Message {
        role: "assistant".into(),
        content: Some(crate::llm::wire::Content::Text(text.to_string())),
        ..Default::default()
    };
    match conversation::append(&turn.fence, turn.id, Kind::Assistant, None, &msg).await {
        Ok(_) => {}
        Err(Fenced::Lost) => return Ok(()),
        Err(e) => return Err(e.into()),
    }
    deliver(deps, turn, end, text).await
}

/// Sends the answer (below the progress card, if the turn has one), sets the final reactions,
/// ends the turn.
async fn deliver(
    deps: &AgentDeps,
    turn: &ActiveTurn,
    end: TurnEnd,
    text: &str,
) -> anyhow::Result<()> {
    deps.steps.answering(turn.id).await;
    let sent = match answer::send(deps, turn, text).await {
        Ok(n) => n,
        Err(e)
            if e.downcast_ref::<Fenced>()
                .is_some_and(|f| matches!(f, Fenced::Lost)) =>
        {
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    finish(deps, turn, end, &conversation::clip(text, 200), sent).await
}

/// Ends the turn: reactions, the stored end, the log, and `Ended` with the Lark calls the
/// turn's answer cost here (`replies` sent, receipts, reactions added).
async fn finish(
    deps: &AgentDeps,
    turn: &ActiveTurn,
    end: TurnEnd,
    outcome: &str,
    replies: u32,
) -> anyhow::Result<()> {
    let reactions = match answer::finish_reactions(deps, turn, end == TurnEnd::Done).await {
        Ok(n) => n,
        Err(Fenced::Lost) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    match turn.fence.finish_turn(turn.id, end, outcome).await {
        Ok(()) => {}
        Err(Fenced::Lost) => return Ok(()),
        Err(e) => return Err(e.into()),
    }
    log(
        deps,
        turn,
        "agent.turn",
        json!({"turn": turn.id, "end": end.as_str(), "attempt": turn.attempt}),
    )
    .await;
    deps.steps.step(
        &turn.section,
        turn.id,
        &StepEvent::Ended {
            outcome: end.as_str().into(),
            lark_calls: replies + reactions,
        },
    );
    Ok(())
}

/// "Done so far: …" from the turn's stored calls and results.
fn done_so_far(stored: &[Stored]) -> String {
    let mut lines = Vec::new();
    for s in stored.iter().filter(|s| s.kind == Kind::Assistant) {
        for call in &s.message.tool_calls {
            let key = format!("{}:{}", s.id, call.id);
            let result = stored
                .iter()
                .find(|r| r.kind == Kind::Tool && r.call_id.as_deref() == Some(key.as_str()))
                .map(|r| r.message.text_content());
            let status = match result {
                None => "did not finish".to_string(),
                Some(t) => conversation::clip(t.lines().next().unwrap_or_default(), 80),
            };
            lines.push(format!(
                "- `{}` {}: {status}",
                call.function.name,
                tools::short_form(call)
            ));
        }
    }
    if lines.is_empty() {
        "Nothing had been done yet.".into()
    } else {
        let n = lines.len();
        if n > 20 {
            lines.drain(..n - 20);
            lines.insert(0, format!("- … {} earlier steps", n - 20));
        }
        format!("Done so far:\n{}", lines.join("\n"))
    }
}

/// Counts identical (call, result) pairs within the turn.
#[derive(Default)]
struct Repeats(HashMap<u64, u32>);

impl Repeats {
    fn key(call: &ToolCall, result: &str) -> u64 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        call.function.name.hash(&mut h);
        let args = call
            .parsed_arguments()
            .map(|m| serde_json::Value::Object(m).to_string())
            .unwrap_or_else(|_| call.function.arguments.clone());
        args.hash(&mut h);
        result.hash(&mut h);
        h.finish()
    }

    fn record(&mut self, call: &ToolCall, result: &str) -> u32 {
        let n = self.0.entry(Self::key(call, result)).or_default();
        *n += 1;
        *n
    }

    /// Counts the pairs already stored (on resume).
    fn replay(&mut self, stored: &[Stored]) {
        for s in stored.iter().filter(|s| s.kind == Kind::Assistant) {
            for call in &s.message.tool_calls {
                let key = format!("{}:{}", s.id, call.id);
                if let Some(r) = stored
                    .iter()
                    .find(|r| r.kind == Kind::Tool && r.call_id.as_deref() == Some(key.as_str()))
                {
                    self.record(call, &r.message.text_content());
                }
            }
        }
    }
}

async fn log(deps: &AgentDeps, turn: &ActiveTurn, kind: &str, payload: serde_json::Value) {
    if let Err(e) = crate::eventlog::append(&deps.db, &turn.section, kind, payload).await {
        tracing::warn!(section.id = %turn.section, error = %e, "event log append failed");
    }
}
