//! The agent: one turn of a section's conversation. It builds the context (stored conversation
//! within a token budget, a system prompt from the section's state), calls the model through
//! the router, runs the tools the model asks for on the section's backend *resolved at each
//! call*, stores every model reply and tool result before the next step, enforces the bounds,
//! and answers in the chat.
//!
//! It reaches the rest of the system through small seams: [`Bindings`] (the section's
//! backend and the `ssh_mode` domain API, owned by chat control), [`ChatOut`] (reactions and
//! replies; implemented for the Lark client), and [`StepSink`] (step events for a live progress
//! view). Durability, leases and cancellation come from [`crate::turns`], which calls
//! [`Agent`] as its [`TurnWork`].
//!
//! Never: picks a backend itself or falls back to local when the bound target fails or the
//! binding no longer passes its checks (a tool fails with the reason, and the thread is told
//! once); hands a backend to a control-plane tool; re-runs a tool call whose outcome is
//! unknown.
//!
//! # In detail
//!
//! | path | owns | never |
//! |---|---|---|
//! | `src/turns/` | turn requests (idempotent on the message id), section leases with heartbeat and generation fencing, the `/stop` flag, the budget across resumes, the runner | models, tools or chats (the work is injected as `TurnWork`); a process-global registry |
//! | `src/agent/` | one turn: context within a token budget, system prompt, the model loop, bounds, tools (schemas, argument checks, dispatch; every task tool result headed `[where]`, `terminal`'s per-call `workdir`/`env`/`timeout`), answers and reactions; a command the guard asks about parked for a person (`call_approval`) | picking a backend (it asks `Bindings::place` at each call); falling back to local; re-running a call with an unknown outcome |
//!
//! **A turn's path.**
//! ```
//! chat control ──▶ Agent::accept(TurnRequest) ──▶ turns::enqueue (INSERT … ON CONFLICT (message_id) DO NOTHING,
//!                  │                                turn_sections.pending = true, NOTIFY sshmode_turns)
//!                  └─▶ receipt reaction `OnIt` (its id stored; once per message; the Lark client's urgent lane; it stays)
//! (a turn: not a command, and an @mention, a p2p message, or any message in a `bot_threads` thread)
//! Runner (every replica) ── claim: a pending section whose lease is free or expired,
//!                           oldest waiting request first (FOR UPDATE SKIP LOCKED; generation += 1)
//!    └─ hold(section): open_turn = resume the running turn, or a new turn taking ALL waiting requests in order
//!         └─ drive: Agent::run_turn  ∥  heartbeat every 0.5 s (renew lease, add spent time, read stop flag)
//!               system prompt (Bindings::place, target user@host, stored cwd, workspace,
//!                              ssh_mode status, notes; reused while the place and one fingerprint
//!                              read — binding, live grants, cwds, workspaces, targets, notes, the
//!                              minute — are unchanged)
//!               context (summary + messages after it, masked/summarised to SSHMODE_CONTEXT_TOKENS;
//!                        loaded once per run, then extended with the rows this runner stores)
//!               llm::Router::chat (dropped on cancel) ── store assistant reply + event log agent.step
//!                                                        + `tool_started` of its first call (one commit)
//!                                                     ∥ tools::resolve(first call)
//!               per tool call: tools::resolve = place = Bindings::place(section), then
//!                              workspace::current ∥ (a target) Executors::ops_for — reads only
//!                              (a binding that fails its checks fails the call: refusal
//!                              audited, the thread told once)
//!                              ── judge (permission) ── local_ops_in(section, workspace, writable)
//!                              ── run ── store result + agent.tool + `tool_started` of the reply's next
//!                                 call, if any (one commit; without a mark it does not wait for its
//!                                 WAL flush, see Resume)
//!                                 ∥ tools::resolve(next call), or after the last call the next
//!                                   step's system prompt
//!               final answer stored ── reply (post/md, < 30 KB chunks, uuid = f(turn, chunk)) ── answered_at
//!               ── CrossMark added unless done ── turn state done|stopped|bounded|failed
//!    └─ release: holder = NULL; pending recomputed under the row lock
//! ```
//!
//! **Reads overlap writes.** Each write of a step runs alongside the read that must follow it:
//! while the model's reply commits, the backend and workspace of its first call are read
//! (`tools::resolve`); while a result commits, those of the reply's next call, or after the last
//! call the next step's system prompt. A call's reads still come after the model asked for it and
//! after the call before it ended — so a switch by `ssh_mode`, a `cd` or a `/ssh use` holds from
//! the next call — and the call starts only once its mark is committed. A read ahead is used for
//! that one call and dropped if the write fails.
//!
//! **Lease and fencing.** `turn_sections` has one row per section: `generation`, `holder`,
//! `lease_until`, `pending`. A claim bumps the generation under the row's update lock. Every write
//! of a turn (conversation rows, summaries, reactions bookkeeping, answered/finished marks) runs in
//! a transaction that first takes a *share* lock on the row and checks the generation it was
//! claimed with (`turns::Fence`); after another runner's claim no write of the old one can land.
//! The heartbeat runs concurrently with the turn (never paused by it: its renewal can wait on the
//! turn's share lock). A renewal that finds the generation changed, or renewals failing for two
//! thirds of the lease, cancels the turn's token (`LeaseLost`): the model call is dropped and the
//! running command killed with its process group; the turn is not released. Leases use the
//! database's clock, so replicas need no clock agreement. One running turn per section is also a
//! unique index (`turns_one_running`).
//!
//! **Resume.** Every step is stored before the next one starts: the user messages, each model
//! reply, a `tool_started` mark before a call runs, and the call's result. A mark shares the commit
//! of the row before it — the reply for a reply's first call, the previous call's result for the
//! next — so a tool step costs two commits, not three; a call marked this way but not yet started
//! when the runner lets go on shutdown gets the result "not run: the service stopped before this
//! call started"; after a crash in that instant it reads as interrupted (wrong only in the safe
//! direction). A result that carries no mark commits with `synchronous_commit = off` (that
//! transaction only): a PostgreSQL crash may lose it, which leaves the call marked without a result,
//! i.e. interrupted — never re-run; and it is durable before anything depends on it, because the
//! next write is the model's next reply (or the turn's end), a flushed commit, and WAL is flushed in
//! order. Every commit that carries a mark, a reply, a final answer or the turn's end waits for its
//! flush. A runner that claims a
//! section with a running turn replays it: a stored final answer is sent again (same uuids, so Lark
//! drops a duplicate; `answered_at` skips it entirely once recorded); a call with a start mark but
//! no result gets the result "interrupted, outcome unknown: check before repeating" and is never run
//! again; calls without a mark run; then the loop continues. A graceful shutdown cancels the turn
//! (`Shutdown`): the running command is killed, its result is that same note, the section is
//! released and another replica continues at once. A turn claimed more than 5 times ends as failed.
//!
//! **Cancel.** `/stop` (`Agent::stop` → `turns::request_stop`) sets `turns.stop_requested_at` on
//! the running turn — the authoritative flag, read by the holder's heartbeat every 0.5 s, on
//! whichever replica. The token's cancellation reaches the router call (its future is dropped) and
//! the command (`exec` kills the local or remote process group). The user gets "Stopped by /stop"
//! with the steps done so far. Waiting requests stay queued and form the next turn; a `/stop` while
//! a stop is pending, or with nothing running, drops them.
//!
//! **Bounds.** `SSHMODE_MAX_ITERATIONS` model calls per turn (stored replies count, so resumes
//! count); `SSHMODE_TURN_BUDGET_SECS` wall clock, summed in `turns.spent_ms` by the heartbeat across
//! runners (default 900 s: a build or a test run fits, a runaway turn costs little);
//! `SSHMODE_TOOL_TIMEOUT_SECS` per call (a command's own timeout, and an outer limit for file
//! operations); the same call with the same result three times ends the turn. Each ends the turn
//! with a message naming the bound and listing what was done.
//!
//! **Context.** The log (`agent_messages`) is append-only. The context is the latest summary plus
//! the messages after it; over `SSHMODE_CONTEXT_TOKENS` (bytes/4, scaled up when the provider
//! reports more prompt tokens) old tool outputs are masked first (the latest two are kept), then
//! the oldest whole turns are replaced by an extractive summary (requests, tools used, answers),
//! stored in `agent_summaries` before they leave the context.
//!
//! **Seams for chat control and progress.** `agent::Bindings` (the section's place and the
//! `ssh_mode` domain API) is `chat::ChatBindings` (tests may pass their own through
//! `app::Overrides::ssh_mode`). `agent::ChatOut` is implemented by the front-ends
//! (`frontend` for `LarkClient`, the console's `Terminal`). `agent::StepSink` receives
//! `StepEvent`s (started, model, tool started/finished, ended, left) for the live progress
//! card; `serve` installs `progress::Progress`. While a `terminal` or `execute_code` call runs,
//! `agent::live` forwards its output's latest lines as `ToolOutput` (its secrets masked by the
//! gate's scanner, sampled at most every 200 ms, and once at its end).

mod answer;
pub mod call_approval;
mod conversation;
pub mod failing;
mod live;
pub mod prompt;
mod run;
mod tools;

use std::sync::Arc;

use async_trait::async_trait;
use sqlx::PgPool;

use crate::config::AgentConfig;
use crate::exec::{Executors, Place};
use crate::llm::Router;
use crate::turns::{self, ActiveTurn, Enqueued, StopOutcome, TurnRequest, TurnWork};

/// The actor of a recall's audit row: the platform told the service, nobody here decided it.
const RECALL_ACTOR: &str = "system";

pub use answer::markdown_chunks;
pub use tools::definitions as tool_definitions;

/// The most bytes of markdown in one answer chunk on a channel that sets no limit of its own.
pub const CHUNK_BYTES: usize = 14_000;

/// A channel refused an answer chunk as too large (Lark: 230025); the chunk is cut further.
#[derive(Debug, thiserror::Error)]
#[error("the channel refused the answer chunk as too large")]
pub struct TooLarge;

/// The answer to an agent request while no model is configured (CONTRACT).
pub const NO_MODEL: &str = "No model is configured for this service, so I cannot take requests yet. \
Chat commands still work: send /help to see them.";
/// The answer to `/stop` when no turn runs.
pub const NOTHING_RUNNING: &str = "Nothing is running here.";

/// The receipt reaction put on a message when its turn is queued. It stays: "taken on", not
/// "still working"; the answer itself says the work is done.
pub const RECEIPT: &str = "OnIt";
/// The reaction added beside the receipt when the turn failed, stopped or hit a bound.
pub const FAILURE: &str = "CrossMark";
/// What `turn_requests.final_reaction` records for a message whose turn answered: no
/// reaction is added, the receipt stays.
pub const ANSWERED: &str = "answered";

/// A binding that no longer passes its checks (chat control's): the section stays bound to
/// its target and every task-tool call fails with this, never running locally instead.
pub use failing::BindingFails;

/// What the model may ask of `ssh_mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SshModeAction {
    Status,
    ListTargets,
    RequestUse,
    RequestLocal,
}

impl SshModeAction {
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "status" => SshModeAction::Status,
            "list_targets" => SshModeAction::ListTargets,
            "request_use" => SshModeAction::RequestUse,
            "request_local" => SshModeAction::RequestLocal,
            _ => return None,
        })
    }
}

/// Chat control as the agent needs it (implemented by chat control; tests use their own).
#[async_trait]
pub trait Bindings: Send + Sync + 'static {
    /// The section's backend now (its binding). Called at every task-tool call. A binding that
    /// no longer passes its checks is an error carrying a [`BindingFails`]: the call fails.
    async fn place(&self, section: &str) -> anyhow::Result<Place>;

    /// A task-tool call `tool` failed because the section's binding no longer passes: records
    /// the refusal, and answers whether the section is still to be told.
    async fn refused_call(
        &self,
        _section: &str,
        _fails: &BindingFails,
        _tool: &str,
    ) -> anyhow::Result<bool> {
        Ok(false)
    }

    /// The section has been told why its binding fails.
    async fn told(&self, _section: &str, _fails: &BindingFails) -> anyhow::Result<()> {
        Ok(())
    }

    /// The model's `ssh_mode` tool: a short, actionable answer (a refusal is an answer too;
    /// an `Err` is a failure to decide at all).
    async fn ssh_mode(
        &self,
        section: &str,
        chat_id: &str,
        action: SshModeAction,
        target: Option<&str>,
    ) -> anyhow::Result<String>;

    /// The model's `cron list`: this chat's schedules, as text.
    async fn cron_list(&self, _chat_id: &str) -> anyhow::Result<String> {
        Ok("Schedules are not available here.".into())
    }

    /// The model's `cron propose`: stores a proposal for a person to confirm, or says why not
    /// (`Ok(Err(text))`). `asked` is the turn's latest message (who asked, and where the card
    /// answers).
    async fn cron_propose(
        &self,
        _asked: &ProposalAsk<'_>,
        _schedule: &str,
        _prompt: &str,
    ) -> anyhow::Result<Result<crate::schedule::ProposalView, String>> {
        Ok(Err("Schedules are not available here.".into()))
    }

    /// Records the card a proposal was shown on.
    async fn cron_card(&self, _proposal: i64, _message_id: &str) -> anyhow::Result<()> {
        Ok(())
    }
}

/// Where a proposal of the model's comes from: the section, its chat, and the turn's latest
/// message (its sender asked; the card answers it).
#[derive(Debug, Clone)]
pub struct ProposalAsk<'a> {
    pub section: &'a str,
    pub chat_id: &'a str,
    pub message_id: &'a str,
    pub sender: &'a str,
    pub in_thread: bool,
}

/// Where answers go: reactions and markdown replies. Every reply carries a deterministic `uuid`
/// so a retried or resumed turn never posts twice.
#[async_trait]
pub trait ChatOut: Send + Sync + 'static {
    /// Adds a reaction; returns its id.
    async fn add_reaction(&self, message_id: &str, emoji: &str) -> anyhow::Result<String>;
    /// Adds the receipt reaction of a queued message: the one a user waits to see, so an
    /// implementation with a shared call budget sends it ahead of other traffic.
    async fn add_receipt(&self, message_id: &str, emoji: &str) -> anyhow::Result<String> {
        self.add_reaction(message_id, emoji).await
    }
    async fn remove_reaction(&self, message_id: &str, reaction_id: &str) -> anyhow::Result<()>;
    /// What one markdown chunk of an answer costs as [`ChatOut::reply_markdown`] sends it, in
    /// the unit of [`ChatOut::answer_limit`]; at least its bytes. By default its bytes.
    fn answer_size(&self, markdown: &str) -> usize {
        markdown.len()
    }
    /// The most one chunk of an answer may cost: answers are cut into chunks within it.
    fn answer_limit(&self) -> usize {
        CHUNK_BYTES
    }
    /// Replies to `message_id` with one markdown chunk (for Lark a `post` with an `md`
    /// element). `in_thread` keeps the answer in the message's thread; false answers in place.
    /// A chunk the channel refuses as too large is an error carrying [`TooLarge`]: it is cut
    /// further and sent in parts.
    async fn reply_markdown(
        &self,
        chat_id: &str,
        message_id: &str,
        markdown: &str,
        in_thread: bool,
        uuid: &str,
    ) -> anyhow::Result<()>;
    /// Whether this channel can show an approval card and take its answer. Without it a call
    /// the guard asks about is refused.
    /// Shows a schedule the model proposed on a card with Add and Cancel, answering
    /// `reply_to`; returns the card's message id, or `None` where no card can be shown.
    async fn show_schedule_proposal(
        &self,
        _chat_id: &str,
        _reply_to: &str,
        _in_thread: bool,
        _view: &crate::schedule::ProposalView,
    ) -> anyhow::Result<Option<String>> {
        Ok(None)
    }

    fn can_ask(&self) -> bool {
        false
    }
    /// Posts the approval card of a parked call (idempotent per turn and call), or rewrites
    /// it when `card.parked.card_message_id` is set; returns the card's message id.
    async fn show_call_approval(
        &self,
        _card: &call_approval::CallApprovalCard,
    ) -> anyhow::Result<Option<String>> {
        Ok(None)
    }
}

/// A step of a turn, for a live progress view.
#[derive(Debug, Clone)]
pub enum StepEvent {
    Started {
        resumed: bool,
        chat_id: String,
        /// The message the answer (and a progress view) replies to.
        reply_to: String,
        in_thread: bool,
        /// The section's backend as the turn starts (`None` when it could not be read).
        place: Option<Place>,
    },
    /// The calls earlier runners of this turn finished, oldest first: sent once, right after
    /// `Started`, by a runner that resumes a turn in which calls ran.
    Earlier {
        steps: Vec<EarlierStep>,
    },
    /// The model answered; `tools` are the calls it asked for (empty for the final answer).
    Model {
        tools: Vec<String>,
    },
    ToolStarted {
        tool: String,
        short: String,
    },
    /// The running step's call waits for a person's approval; `approvers` says who may give
    /// it (`an admin`, `the requester`). `Left` follows: the turn is parked.
    Awaiting {
        approvers: String,
    },
    /// The latest lines the running step's command printed (a `terminal` or `execute_code`
    /// call): printable, its secrets masked, at most a few hundred characters. Sent at most
    /// every few hundred milliseconds while output changes, and once when the call ends, before
    /// `ToolFinished`; each replaces the one before.
    ToolOutput {
        tail: String,
    },
    ToolFinished {
        tool: String,
        ok: bool,
        millis: u64,
        /// `local`, a target alias or `control`; `None` when never resolved.
        backend: Option<String>,
        /// How a command ended, when one ran.
        exit: Option<String>,
        /// How a person answered the call, when it waited for one.
        approval: Option<StepApproval>,
    },
    Ended {
        outcome: String,
        /// Lark calls the turn's chat side cost on this runner: the receipts of its messages,
        /// its replies and the reactions added (a progress view adds its own).
        lark_calls: u32,
    },
    /// This runner let go of the turn without ending it (a shutdown, a lost lease, an error);
    /// whoever resumes it starts again with `Started { resumed: true, .. }`. Also sent after
    /// `Ended`, where it means nothing.
    Left,
}

/// How a person answered a call that waited for approval, as its step shows it (and its
/// `agent.tool` event-log entry keeps it, under `approval`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StepApproval {
    /// `allowed once`, `allowed in this thread`, `denied`, `no answer in 10 min`,
    /// `ended by /stop`.
    pub outcome: String,
    /// Who answered (an open_id), when a person did.
    pub by: Option<String>,
}

/// A call an earlier runner of the turn finished, as its `agent.tool` event-log entry has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EarlierStep {
    pub tool: String,
    pub short: String,
    pub ok: bool,
    pub millis: u64,
    /// `local`, a target alias or `control`; `None` when never resolved.
    pub backend: Option<String>,
    /// How a command ended; `interrupted` or `not run` for a call a runner left unsettled.
    pub exit: Option<String>,
    /// How a person answered it, when it waited for one.
    pub approval: Option<StepApproval>,
}

impl EarlierStep {
    /// Reads an `agent.tool` entry's payload.
    pub fn from_entry(payload: &serde_json::Value) -> EarlierStep {
        let text = |k: &str| payload.get(k).and_then(|v| v.as_str()).map(str::to_string);
        let exit = if payload.get("interrupted").is_some_and(|v| v == true) {
            Some("interrupted".to_string())
        } else if payload.get("not_started").is_some_and(|v| v == true) {
            Some("not run".to_string())
        } else {
            text("exit")
        };
        let backend = match text("backend").as_deref() {
            Some("ssh") => text("target"),
            Some("unresolved") | None => None,
            Some(b) => Some(b.to_string()),
        };
        EarlierStep {
            tool: text("tool").unwrap_or_else(|| "?".into()),
            short: text("short").unwrap_or_default(),
            ok: payload.get("ok").is_some_and(|v| v == true),
            millis: payload
                .get("duration_ms")
                .and_then(|v| v.as_u64())
                .unwrap_or(0),
            backend,
            exit,
            approval: payload
                .get("approval")
                .and_then(|a| serde_json::from_value(a.clone()).ok()),
        }
    }
}

/// Receives step events. Must not block: a slow consumer drops events (bounded).
pub trait StepSink: Send + Sync + 'static {
    fn step(&self, section: &str, turn_id: i64, event: &StepEvent);

    /// The turn's answer is about to be sent. A view that posts its own message in the chat
    /// (the progress card) resolves once the answer may go out below it: a post already under
    /// way is recorded first (bounded wait), and none is made after. Others resolve at once.
    fn answering(&self, _turn_id: i64) -> futures_util::future::BoxFuture<'static, ()> {
        Box::pin(std::future::ready(()))
    }
}

/// What the agent is built from.
pub struct AgentDeps {
    pub db: PgPool,
    pub exec: Arc<Executors>,
    /// `None` when no model is configured: turns then answer with that.
    pub llm: Option<Arc<Router>>,
    /// The abstract model name (`SSHMODE_MODEL`); `None` = the router's default chain.
    pub model: Option<String>,
    pub bindings: Arc<dyn Bindings>,
    /// The local control plane behind `memory` and `skills` (never a backend).
    pub plane: Arc<crate::plane::ControlPlane>,
    pub out: Arc<dyn ChatOut>,
    pub steps: Arc<dyn StepSink>,
    pub config: AgentConfig,
    /// The last system prompt per section, reused while nothing it shows changed.
    pub prompts: prompt::Cache,
    /// Where local workspaces may be (the root resolved once, at start-up).
    pub workspaces: crate::workspace::LocalRules,
}

impl AgentDeps {
    /// The gate every task-tool call of this agent passes.
    pub fn gate(&self) -> crate::gate::Gate<'_> {
        crate::gate::Gate {
            db: &self.db,
            exec: &self.exec,
            secrets: self.plane.filter(),
            tool_timeout: self.config.tool_timeout,
            local_risky: self.config.local_risky,
        }
    }
}

/// The most characters of a waiting command a `/ssh status` line shows.
const STATUS_COMMAND: usize = 80;

/// The agent. One per app; cheap to share.
pub struct Agent {
    deps: AgentDeps,
}

impl Agent {
    pub fn new(deps: AgentDeps) -> Arc<Agent> {
        Arc::new(Agent { deps })
    }

    /// Whether a model is configured (without one, a request is answered with [`NO_MODEL`]).
    pub fn has_model(&self) -> bool {
        self.deps.llm.is_some()
    }

    /// Queues a chat message for a turn (idempotent on its message id) and puts the receipt
    /// reaction on it. A redelivered message gets no second reaction.
    pub async fn accept(&self, req: &TurnRequest) -> anyhow::Result<Enqueued> {
        let queued = turns::enqueue(&self.deps.db, req).await?;
        answer::receipt(&self.deps, &req.message_id).await;
        Ok(queued)
    }

    /// Queues a schedule's firing (its anchor message is the request's message) as a turn of
    /// its own, and puts the receipt reaction on the anchor.
    pub async fn accept_scheduled(
        &self,
        req: &TurnRequest,
        schedule_id: i64,
    ) -> anyhow::Result<Enqueued> {
        let queued = turns::enqueue_scheduled(&self.deps.db, req, schedule_id).await?;
        if queued.new {
            answer::receipt(&self.deps, &req.message_id).await;
        }
        Ok(queued)
    }

    /// The `/ssh status` line on `section`'s task: running, or waiting for a person's approval
    /// (of what, who may answer, until when). `None` when no task is live.
    pub async fn status_line(&self, section: &str) -> anyhow::Result<Option<String>> {
        let db = &self.deps.db;
        let Some(state) = turns::live_state(db, section).await? else {
            return Ok(None);
        };
        if state != turns::call_approval::AWAITING {
            return Ok(Some("Task: running.".into()));
        }
        let waiting = match turns::call_approval::waiting_in(db, section).await? {
            Some((turn, key)) => turns::call_approval::get(db, turn, &key).await?,
            None => None,
        };
        Ok(Some(match waiting {
            Some(p) => {
                let mut command: String = p.ask.command.chars().take(STATUS_COMMAND).collect();
                if command.len() < p.ask.command.len() {
                    command.push('…');
                }
                format!(
                    "Task: waiting for approval by {} until {}: `{}`",
                    p.ask.approvers.who(),
                    p.deadline.format("%H:%M UTC"),
                    command.replace('`', "'")
                )
            }
            // The deadline passed or a stop came: the turn resumes to settle it.
            None => "Task: waiting for approval; the wait is ending.".into(),
        }))
    }

    /// A recalled message: its request dropped while it waits (its receipt reaction taken off)
    /// or its turn stopped as by `/stop` while it runs, and its content replaced by
    /// [`crate::lifecycle::RECALLED`] wherever it was stored — the event log, the turn request,
    /// the conversation, the inbox, its kept images, and the files it brought on the backend
    /// they were placed on. Idempotent: a second call finds nothing more to do.
    pub async fn recall(&self, message_id: &str, chat_id: Option<&str>) -> anyhow::Result<()> {
        use crate::lifecycle::{self, RECALLED};
        let db = &self.deps.db;
        lifecycle::mark_recalled(db, message_id, chat_id).await?;
        match turns::recall_request(db, message_id, RECALL_ACTOR).await? {
            turns::RecallOutcome::Dropped {
                receipt_reaction: Some(r),
            } => {
                if let Err(e) = self.deps.out.remove_reaction(message_id, &r).await {
                    tracing::warn!(lark.message_id = %message_id, error = %format!("{e:#}"), "removing a recalled message's receipt failed");
                }
            }
            turns::RecallOutcome::Stopping { turn_id } => {
                tracing::info!(turn.id = turn_id, lark.message_id = %message_id, "a recalled message's turn is stopping");
            }
            _ => {}
        }
        let redacted = lifecycle::redact_message(db, message_id, RECALL_ACTOR, RECALLED).await?;
        let section = redacted
            .section
            .clone()
            .or(chat_id.map(str::to_string))
            .unwrap_or_default();
        for f in lifecycle::files_of(db, message_id).await? {
            // Through the backend's own file operations, as the file was placed: locally
            // beneath the workspace's descriptor (a link a tool put in its place is not
            // followed out of it), on a target as its user.
            let place = if f.backend == "local" {
                Place::Local
            } else {
                Place::Target(f.backend.clone())
            };
            let written = match self.deps.exec.ops_for(&section, &place).await {
                Ok(ops) => ops
                    .write_file(&f.path, RECALLED.as_bytes())
                    .await
                    .map(|_| ())
                    .map_err(anyhow::Error::from),
                Err(e) => Err(anyhow::Error::from(e)),
            };
            if let Err(e) = written {
                tracing::warn!(lark.message_id = %message_id, file.backend = %f.backend, error = %format!("{e:#}"), "replacing a recalled message's file failed");
            }
        }
        tracing::info!(lark.message_id = %message_id, section.id = %section, recall.events = redacted.events, recall.transcript = redacted.transcript, recall.inbox = redacted.inbox, "recalled message erased");
        Ok(())
    }

    /// `/stop` in `section` by `by`: asks the running turn to stop (it says itself what it had
    /// done) or, on a second stop, drops the waiting messages. Returns what to tell the user.
    pub async fn stop(&self, section: &str, by: &str) -> anyhow::Result<String> {
        Ok(
            match turns::request_stop(&self.deps.db, section, by).await? {
                StopOutcome::Stopping { waiting, .. } => {
                    let mut s = "Stopping the running task.".to_string();
                    if waiting > 0 {
                        s.push_str(&format!(
                        " {waiting} waiting message{} will run next; send /stop again to drop {}.",
                        if waiting == 1 { "" } else { "s" },
                        if waiting == 1 { "it" } else { "them" }
                    ));
                    }
                    s
                }
                StopOutcome::DroppedWaiting { dropped } => {
                    for d in &dropped {
                        answer::dropped(&self.deps, d).await;
                    }
                    format!(
                        "Dropped {} waiting message{}.",
                        dropped.len(),
                        if dropped.len() == 1 { "" } else { "s" }
                    )
                }
                StopOutcome::Idle => NOTHING_RUNNING.into(),
            },
        )
    }
}

#[async_trait]
impl TurnWork for Agent {
    async fn run_turn(&self, turn: &ActiveTurn) -> anyhow::Result<()> {
        let r = run::run_turn(&self.deps, turn).await;
        self.deps
            .steps
            .step(&turn.section, turn.id, &StepEvent::Left);
        r
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::EarlierStep;

    #[test]
    fn earlier_steps_read_the_event_log_entries_a_runner_writes() {
        let remote = EarlierStep::from_entry(&json!({"turn": 1, "tool": "terminal",
            "backend": "ssh", "target": "web", "duration_ms": 12, "exit": "exit 0",
            "ok": true, "short": "id -un"}));
        assert_eq!(
            remote,
            EarlierStep {
                tool: "terminal".into(),
                short: "id -un".into(),
                ok: true,
                millis: 12,
                backend: Some("web".into()),
                exit: Some("exit 0".into()),
                approval: None,
            }
        );
        let local = EarlierStep::from_entry(&json!({"turn": 1, "tool": "read_file",
            "backend": "local", "target": null, "duration_ms": 3, "exit": null, "ok": false,
            "short": "a.txt"}));
        assert_eq!(local.backend.as_deref(), Some("local"));
        assert!(!local.ok);
        assert_eq!(local.exit, None);
        let unresolved = EarlierStep::from_entry(&json!({"turn": 1, "tool": "terminal",
            "backend": "unresolved", "ok": false, "short": "ls"}));
        assert_eq!(unresolved.backend, None);
        let interrupted = EarlierStep::from_entry(&json!({"turn": 1, "tool": "terminal",
            "short": "sleep 60", "interrupted": true}));
        assert_eq!(
            (
                interrupted.ok,
                interrupted.exit.as_deref(),
                interrupted.short.as_str()
            ),
            (false, Some("interrupted"), "sleep 60")
        );
        let not_started = EarlierStep::from_entry(&json!({"turn": 1, "tool": "patch",
            "short": "f", "not_started": true}));
        assert_eq!(not_started.exit.as_deref(), Some("not run"));
        let denied = EarlierStep::from_entry(&json!({"turn": 1, "tool": "terminal",
            "short": "rm -rf x", "exit": "not run",
            "approval": {"outcome": "denied", "by": "ou_admin"}}));
        assert_eq!(
            denied.approval,
            Some(super::StepApproval {
                outcome: "denied".into(),
                by: Some("ou_admin".into())
            })
        );
    }
}
