//! The tools the model sees: JSON schemas, argument checking, and dispatch.
//!
//! Task tools resolve the section's backend through [`Bindings::place`] at *each* call and
//! act through [`crate::exec::Executors::ops_for`]; a backend that cannot be reached, or a
//! binding that no longer passes its checks ([`BindingFails`]), fails the call with the reason. The section's working directory per backend is kept in Postgres
//! (`section_cwds`) and seeded into the execution layer before each call. `ssh_mode`,
//! `memory` and `skills` are control-plane tools: they never receive a backend.
//!
//! A call's backend and workspace are read by [`resolve`], which only reads; the runner starts
//! it for a call once the model has asked for that call, alongside the commit that must precede
//! the call, and hands the result to [`run`]. Either way they are read for that call alone.

mod shells;

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::conversation::clip;
use super::{AgentDeps, BindingFails, SshModeAction};
use crate::bash::Verdict;
use crate::bash::cover::Cover;
use crate::exec::live::LiveTail;
use crate::exec::ops::{Ops, ReadRange, SearchRequest, SearchTarget};
use crate::exec::truncate::HeadTail;
use crate::exec::{ExecError, Exit, Output, Place};
use crate::gate::{self, Caller, Done, Outcome};
use crate::llm::args::Args;
use crate::llm::{Tool, ToolCall};
use crate::turns::{Fence, Fenced};
use crate::workspace::{self, Permission, Workspace};

/// The tool definitions sent with every model call.
pub fn definitions() -> Vec<Tool> {
    let mut tools = vec![
        Tool::function(
            "terminal",
            "Run a shell command on this thread's backend, in the thread's working directory (a `cd` holds for the next command).",
            json!({"type": "object", "properties": {
                "command": {"type": "string", "description": "A POSIX shell command."},
                "timeout": {"type": "integer", "minimum": 1, "description": "Seconds before the command is killed."},
                "workdir": {"type": "string", "description": "Run in this directory for this call only (the thread's working directory is neither used nor changed)."},
                "env": {"type": "object", "maxProperties": MAX_CALL_ENV, "additionalProperties": {"type": "string"}, "description": env_description()}
            }, "required": ["command"], "additionalProperties": false}),
        ),
        Tool::function(
            "read_file",
            "Read a text file on the backend. `~` is the backend user's home.",
            json!({"type": "object", "properties": {
                "path": {"type": "string"},
                "offset": {"type": "integer", "minimum": 1, "description": "First line (1-based)."},
                "limit": {"type": "integer", "minimum": 1, "description": "Number of lines."}
            }, "required": ["path"], "additionalProperties": false}),
        ),
        Tool::function(
            "write_file",
            "Create or replace a file on the backend (atomically; parent directories are created).",
            json!({"type": "object", "properties": {
                "path": {"type": "string"},
                "content": {"type": "string"}
            }, "required": ["path", "content"], "additionalProperties": false}),
        ),
        Tool::function(
            "patch",
            "Replace an exact string in a file on the backend (once, unless replace_all).",
            json!({"type": "object", "properties": {
                "path": {"type": "string"},
                "old_string": {"type": "string"},
                "new_string": {"type": "string"},
                "replace_all": {"type": "boolean"}
            }, "required": ["path", "old_string", "new_string"], "additionalProperties": false}),
        ),
        Tool::function(
            "search_files",
            "Search file contents (regex) or file names (glob, with target=files) on the backend.",
            json!({"type": "object", "properties": {
                "pattern": {"type": "string"},
                "path": {"type": "string", "description": "Where to search; default the working directory."},
                "target": {"type": "string", "enum": ["content", "files"]},
                "file_glob": {"type": "string"},
                "max_results": {"type": "integer", "minimum": 1, "maximum": 1000}
            }, "required": ["pattern"], "additionalProperties": false}),
        ),
        Tool::function(
            "execute_code",
            "Run a program on the backend (python by default; bash, sh, node, ruby, perl where installed).",
            json!({"type": "object", "properties": {
                "code": {"type": "string"},
                "language": {"type": "string", "enum": ["python", "bash", "sh", "node", "ruby", "perl"]},
                "timeout": {"type": "integer", "minimum": 1}
            }, "required": ["code"], "additionalProperties": false}),
        ),
        Tool::function(
            "ssh_mode",
            "Ask chat control about this thread's backend: status, list_targets, request_use (with target), request_local.",
            json!({"type": "object", "properties": {
                "action": {"type": "string", "enum": ["status", "list_targets", "request_use", "request_local"]},
                "target": {"type": "string", "description": "The target alias, for request_use."}
            }, "required": ["action"], "additionalProperties": false}),
        ),
        Tool::function(
            "cron",
            "Schedules of this chat: `list` them, or `propose` one (a 5-field cron expression in the chat's time zone, or `every <n>s|m|h|d`, and the prompt to run as a turn in this thread at those times). A proposal is a card with Add and Cancel: it is scheduled only when a person who may (the thread's owner or an admin) presses Add.",
            json!({"type": "object", "properties": {
                "action": {"type": "string", "enum": ["list", "propose"]},
                "schedule": {"type": "string", "description": "For propose: e.g. `0 9 * * 1-5` or `every 10m`."},
                "prompt": {"type": "string", "description": "For propose: what to do at each run, written as a request to you."}
            }, "required": ["action"], "additionalProperties": false}),
        ),
    ];
    tools.extend(shells::definitions());
    tools.extend(crate::plane::ControlPlane::definitions());
    tools
}

/// What `terminal`'s `env` may hold, for its schema.
fn env_description() -> String {
    let names: Vec<&str> = crate::workspace::judge::built_in_env_names().collect();
    format!(
        "Environment variables for this call only (names: letters, digits, `_`). Below the \
         workspace permission `full` only {} and names the operator allows.",
        names.join(", ")
    )
}

/// What a tool call produced, for the model and for the event log.
#[derive(Debug, Clone)]
pub struct ToolResult {
    /// The text the model receives (already cut to the result limit).
    pub text: String,
    pub ok: bool,
    /// `local`, a target alias, or `control` for control-plane tools; `None` when it was
    /// never resolved.
    pub backend: Option<String>,
    /// How a command ended, when one ran.
    pub exit: Option<String>,
    pub millis: u64,
    /// Set when the call failed because the section's binding no longer passes its checks.
    pub binding_fails: Option<BindingFails>,
    /// Set when nothing ran because a person is asked about this call (a command the guard
    /// asks about, a shell on a target whose policy asks, a line typed into a shell).
    pub asked: Option<Asked>,
    /// The audit row of a shell call that acted, written with the result.
    pub shell_row: Option<ShellRow>,
    /// How many secret values of each kind the gate masked in it (its audit row says).
    pub masked: crate::mask::Counts,
}

/// The audit row of a shell call that acted — a shell opened, typed into or closed — written
/// in the commit of the call's result: its action (`shell.open`, `shell.input`, `shell.close`)
/// and detail (the shell, and for input the text typed, redacted, or `[input hidden]`).
#[derive(Debug, Clone)]
pub struct ShellRow {
    pub action: &'static str,
    pub detail: Value,
    /// When it happened, where the row's commit may come after what it caused (the input
    /// that ends a shell, whose close is audited on its own); `None`: the commit's time.
    pub at: Option<chrono::DateTime<chrono::Utc>>,
}

/// A command the guard asks a person about, as it would have run.
#[derive(Debug, Clone)]
pub struct Asked {
    pub command: String,
    pub reason: String,
    /// `local` or the target's location (`web · deploy@10.0.0.5`).
    pub location: String,
    /// The directory it would start in.
    pub cwd: String,
    /// The target's alias; `None` on the service's own machine.
    pub target: Option<String>,
    /// What "Allow in this thread" of it would cover.
    pub cover: Cover,
}

/// Whether `call` runs a command (`terminal`, `execute_code`) or acts in an interactive shell
/// (`shell_open`, `shell_write`): a person may be asked about it, so its start mark is written
/// only once the guard and the policy let it through ([`StartMark`]), never ahead.
pub fn runs_a_command(call: &ToolCall) -> bool {
    matches!(
        call.function.name.as_str(),
        "terminal" | "execute_code" | "shell_open" | "shell_write"
    )
}

/// The start mark of a command call, written by [`run`] after the guard's verdict let the
/// command through and right before it starts: a call that only waits for a person (or is
/// refused) never has one, so no resumed runner takes it for interrupted.
pub struct StartMark<'a> {
    fence: &'a Fence,
    turn_id: i64,
    key: &'a str,
    /// The mark's row once written, or why it could not be (the command then did not run).
    pub written: Option<Result<i64, Fenced>>,
}

impl<'a> StartMark<'a> {
    pub fn new(fence: &'a Fence, turn_id: i64, key: &'a str) -> StartMark<'a> {
        StartMark {
            fence,
            turn_id,
            key,
            written: None,
        }
    }

    /// Writes the mark once; `Err` (the text for the model) when it could not be written.
    async fn write(&mut self) -> Result<(), String> {
        if self.written.is_none() {
            let mark = super::conversation::start_mark();
            self.written = Some(
                super::conversation::append(
                    self.fence,
                    self.turn_id,
                    super::conversation::Kind::ToolStarted,
                    Some(self.key),
                    &mark,
                )
                .await,
            );
        }
        match &self.written {
            Some(Ok(_)) => Ok(()),
            _ => Err("not run: its start could not be recorded".into()),
        }
    }
}

/// A short, log-safe description of a call (the command or path, clipped).
pub fn short_form(call: &ToolCall) -> String {
    let args = call.parsed_arguments().unwrap_or_default();
    let key = match call.function.name.as_str() {
        "terminal" => "command",
        "execute_code" => "code",
        "search_files" => "pattern",
        "shell_write" | "shell_read" | "shell_close" => "shell_id",
        "ssh_mode" | "memory" | "skills" | "cron" => "action",
        _ => "path",
    };
    let s = args.get(key).and_then(Value::as_str).unwrap_or_default();
    let s = s.lines().next().unwrap_or_default();
    crate::llm::classify::scrub(&clip(s, 120), None)
}

/// The task tools: the ones that act on the section's backend.
const TASK_TOOLS: [&str; 6] = [
    "terminal",
    "read_file",
    "write_file",
    "patch",
    "search_files",
    "execute_code",
];

/// What a task-tool call acts on, read for that call: the section's backend (its binding at
/// the time of the read), the workspace on it with the stored working directory, and for a
/// target its registry entry; it becomes the gate's resolved place ([`gate::At`]) when the call
/// runs. Failures are kept and reported by [`run`] in its usual order.
pub struct ReadAhead(anyhow::Result<Box<Read>>);

struct Read {
    place: Place,
    workspace: anyhow::Result<Workspace>,
    /// A target's operations (the registry read: removed or disabled targets fail here).
    remote: Option<Result<Ops, ExecError>>,
}

/// Reads what the call needs from the section's state, without running anything; `None` for
/// calls that take no backend (control-plane tools, unknown tools). The workspace and a
/// target's registry entry are read at the same time.
pub async fn resolve(deps: &AgentDeps, section: &str, call: &ToolCall) -> Option<ReadAhead> {
    if !TASK_TOOLS.contains(&call.function.name.as_str()) {
        return None;
    }
    Some(resolve_task(deps, section).await)
}

async fn resolve_task(deps: &AgentDeps, section: &str) -> ReadAhead {
    let place = match deps.bindings.place(section).await {
        Ok(p) => p,
        Err(e) => return ReadAhead(Err(e)),
    };
    let read = workspace::current(&deps.db, &deps.workspaces, section, &place);
    let (workspace, remote) = match &place {
        Place::Local => (read.await, None),
        Place::Target(_) => {
            let (w, o) = tokio::join!(read, deps.exec.ops_for(section, &place));
            (w, Some(o))
        }
    };
    ReadAhead(Ok(Box::new(Read {
        place,
        workspace,
        remote,
    })))
}

/// Runs one call. Never panics on the model's input; every failure is a result for the model.
/// `resolved` is what [`resolve`] read for this very call, if the caller read it ahead; without
/// it the call resolves its backend itself. `live`: where a command's output also goes as it
/// runs. `mark`: the start mark a command writes once the guard let it through, before it
/// runs (`None`: nothing to write here).
#[allow(clippy::too_many_arguments)]
pub async fn run(
    deps: &AgentDeps,
    section: &str,
    chat_id: &str,
    call: &ToolCall,
    cancel: &CancellationToken,
    resolved: Option<ReadAhead>,
    approved: bool,
    live: Option<Arc<LiveTail>>,
    mark: Option<&mut StartMark<'_>>,
) -> ToolResult {
    let started = Instant::now();
    let o = dispatch(
        deps, section, chat_id, call, cancel, resolved, approved, live, mark,
    )
    .await;
    let (text, ok) = match o.result {
        Ok(t) => (t, true),
        Err(e) => (format!("error: {e}"), false),
    };
    // A task tool's result names where it ran, so a transcript never leaves the host in doubt.
    let text = match o.location {
        Some(l) => format!("[{l}] {text}"),
        None => text,
    };
    let text = if o.by_policy {
        format!("allowed by this backend's policy (risky: allow):\n{text}")
    } else {
        text
    };
    ToolResult {
        text: cut(&text, deps.config.tool_result_limit),
        ok,
        backend: o.backend,
        exit: o.exit,
        millis: started.elapsed().as_millis() as u64,
        binding_fails: o.binding_fails,
        asked: o.asked,
        shell_row: o.shell_row,
        masked: o.masked,
    }
}

/// What one call produced: its text (or the error the model reads), and what the event log
/// records beside it.
struct ToolOutcome {
    result: Result<String, String>,
    /// `control`, `local` or the target's alias, once known.
    backend: Option<String>,
    /// Where a task tool ran (`local`, or [`crate::target::Target::location`]), once known.
    location: Option<String>,
    /// How a command ended, when one ran.
    exit: Option<String>,
    /// Set when the call failed because the section's binding no longer passes its checks.
    binding_fails: Option<BindingFails>,
    asked: Option<Asked>,
    shell_row: Option<ShellRow>,
    /// The guard asked about it and the backend's policy (`risky: allow`) let it run.
    by_policy: bool,
    /// Secret values masked in it, by kind.
    masked: crate::mask::Counts,
}

impl ToolOutcome {
    /// A call that failed before any backend was known.
    fn failed(why: String) -> ToolOutcome {
        ToolOutcome {
            result: Err(why),
            backend: None,
            location: None,
            exit: None,
            binding_fails: None,
            asked: None,
            shell_row: None,
            by_policy: false,
            masked: Default::default(),
        }
    }

    /// A control-plane call's outcome (no backend involved).
    fn control(result: Result<String, String>) -> ToolOutcome {
        ToolOutcome {
            backend: Some("control".into()),
            ..ToolOutcome::failed(String::new())
        }
        .with(result)
    }

    fn with(mut self, result: Result<String, String>) -> ToolOutcome {
        self.result = result;
        self
    }
}

/// Routes one call: `ssh_mode` and the control plane's tools to theirs, a task tool to its
/// section's backend, resolved for this call.
#[allow(clippy::too_many_arguments)]
async fn dispatch(
    deps: &AgentDeps,
    section: &str,
    chat_id: &str,
    call: &ToolCall,
    cancel: &CancellationToken,
    resolved: Option<ReadAhead>,
    approved: bool,
    live: Option<Arc<LiveTail>>,
    mark: Option<&mut StartMark<'_>>,
) -> ToolOutcome {
    let tool = call.function.name.as_str();
    let map = match call.parsed_arguments() {
        Ok(m) => m,
        Err(e) => return ToolOutcome::failed(e.to_string()),
    };
    let args = Args::new(tool, &map);
    if tool == "ssh_mode" {
        return ToolOutcome::control(ssh_mode(deps, section, chat_id, &args).await);
    }
    if tool == "cron" {
        return ToolOutcome::control(cron(deps, section, chat_id, &args).await);
    }
    if crate::plane::ControlPlane::owns(tool) {
        let caller = crate::plane::Caller { section, chat_id };
        return ToolOutcome::control(deps.plane.call(tool, caller, &map).await);
    }
    if shells::TOOLS.contains(&tool) {
        return shells::call(deps, section, tool, &args, cancel, approved, mark).await;
    }
    if let Err(e) = check_task_args(tool, &args) {
        return ToolOutcome::failed(e);
    }
    // The backend, resolved for this call: a switch made since the last call holds from this one.
    let resolved = match resolved {
        Some(r) => r,
        None => resolve_task(deps, section).await,
    };
    let at = match resolved.0 {
        Ok(w) => *w,
        // Bound to a target it may no longer use: the call fails (never runs locally).
        Err(e) => {
            return match e.downcast::<BindingFails>() {
                Ok(fails) => ToolOutcome {
                    binding_fails: Some(fails.clone()),
                    ..ToolOutcome::failed(fails.to_string())
                },
                Err(e) => ToolOutcome::failed(format!(
                    "this thread's backend cannot be determined: {e:#}"
                )),
            };
        }
    };
    let backend = at.place.name().to_string();
    // Shells the section still has on another backend close now that its binding moved.
    deps.exec.shells.follow(section, &backend);
    let location = location_of(deps, &at).await;
    let target = match &at.place {
        Place::Local => None,
        Place::Target(alias) => Some(alias.clone()),
    };
    let t = task(
        deps, section, tool, &args, at, &location, cancel, approved, live, mark,
    )
    .await;
    ToolOutcome {
        result: t.result,
        asked: t.asked.map(|a| Asked {
            command: a.command,
            reason: a.reason,
            location: location.clone(),
            cwd: a.cwd,
            target,
            cover: a.cover,
        }),
        backend: Some(backend),
        location: Some(location),
        exit: t.exit,
        binding_fails: None,
        shell_row: None,
        by_policy: t.by_policy,
        masked: t.masked,
    }
}

/// `ssh_mode`: the model's side of SSH Mode, answered by chat control.
async fn ssh_mode(
    deps: &AgentDeps,
    section: &str,
    chat_id: &str,
    args: &Args<'_>,
) -> Result<String, String> {
    args.only(&["action", "target"])?;
    let action_text = args.str("action")?;
    let action = SshModeAction::parse(&action_text).ok_or_else(|| {
        args.bad("`action` must be one of status, list_targets, request_use, request_local".into())
    })?;
    let target = args.opt_str("target")?;
    if action == SshModeAction::RequestUse && target.is_none() {
        return Err(args.bad("`target` is required for request_use".into()));
    }
    deps.bindings
        .ssh_mode(section, chat_id, action, target.as_deref())
        .await
        .map_err(|e| format!("ssh_mode failed: {e:#}"))
}

/// `cron`: the chat's schedules, and proposals a person confirms on a card.
async fn cron(
    deps: &AgentDeps,
    section: &str,
    chat_id: &str,
    args: &Args<'_>,
) -> Result<String, String> {
    args.only(&["action", "schedule", "prompt"])?;
    let failed = |e: anyhow::Error| format!("cron failed: {e:#}");
    match args.str("action")?.as_str() {
        "list" => deps.bindings.cron_list(chat_id).await.map_err(failed),
        "propose" => {
            let (Some(schedule), Some(prompt)) =
                (args.opt_str("schedule")?, args.opt_str("prompt")?)
            else {
                return Err(args.bad("`schedule` and `prompt` are required for propose".into()));
            };
            let Some((message_id, sender, in_thread)) =
                crate::turns::live_latest_message(&deps.db, section)
                    .await
                    .map_err(|e| failed(e.into()))?
            else {
                return Err(
                    "cron propose needs a person's message to answer; none is live here".into(),
                );
            };
            let asked = super::ProposalAsk {
                section,
                chat_id,
                message_id: &message_id,
                sender: &sender,
                in_thread,
            };
            let view = match deps
                .bindings
                .cron_propose(&asked, &schedule, &prompt)
                .await
                .map_err(failed)?
            {
                Ok(v) => v,
                Err(refused) => return Err(refused),
            };
            let shown = deps
                .out
                .show_schedule_proposal(chat_id, &message_id, in_thread, &view)
                .await
                .map_err(failed)?;
            let Some(card) = shown else {
                return Ok(format!(
                    "No card can be shown here, so nothing was scheduled. Ask the person to send: /cron add \"{}\" {}",
                    view.spec, view.prompt
                ));
            };
            deps.bindings
                .cron_card(view.id, &card)
                .await
                .map_err(failed)?;
            Ok(format!(
                "Proposed (proposal {}): `{}` ({}), next runs {}. Nothing is scheduled until a person who may (the thread's owner or an admin) presses Add on the card; do not propose it again.",
                view.id,
                view.spec,
                view.tz,
                view.next.join(", ")
            ))
        }
        _ => Err(args.bad("`action` must be list or propose".into())),
    }
}

/// A task tool's arguments, checked before anything is resolved or run.
fn check_task_args(tool: &str, args: &Args<'_>) -> Result<(), String> {
    if !TASK_TOOLS.contains(&tool) {
        return Err(format!(
            "there is no tool called `{tool}`; use terminal, read_file, write_file, patch, search_files, execute_code, shell_open, shell_write, shell_read, shell_close, shell_list, ssh_mode, cron, memory or skills"
        ));
    }
    // Check the arguments before anything is resolved or run.
    let allowed: &[&str] = match tool {
        "terminal" => &["command", "timeout", "workdir", "env"],
        "read_file" => &["path", "offset", "limit"],
        "write_file" => &["path", "content"],
        "patch" => &["path", "old_string", "new_string", "replace_all"],
        "search_files" => &["pattern", "path", "target", "file_glob", "max_results"],
        _ => &["code", "language", "timeout"],
    };
    args.only(allowed)?;
    let required: &[&str] = match tool {
        "terminal" => &["command"],
        "write_file" => &["path", "content"],
        "patch" => &["path", "old_string", "new_string"],
        "search_files" => &["pattern"],
        "execute_code" => &["code"],
        _ => &["path"],
    };
    for r in required {
        args.str(r)?;
    }
    Ok(())
}

/// Where a task tool runs, for its result: `local`, or the target's location from the
/// registry entry the backend was made with (when there is none, because the target is
/// unavailable, from the registry all the same, so a failure names it in full).
async fn location_of(deps: &AgentDeps, at: &Read) -> String {
    match &at.place {
        Place::Local => "local".to_string(),
        Place::Target(alias) => match &at.remote {
            Some(Ok(ops)) => ops.backend().location(),
            _ => match crate::target::get(&deps.db, alias).await {
                Ok(t) => t.location(),
                Err(_) => alias.clone(),
            },
        },
    }
}

/// Runs a task tool where `at` says, through the gate: the permission, the judge, the guard,
/// the backend's policy, the audit of a refusal and the secret filter are the gate's
/// ([`crate::gate`]); here the arguments are read, the place made ready (the operations, the
/// workspace on the backend's host, the stored working directory seeded), and the outcome
/// written for the model. Returns the result, how a command ended when one ran, what a person
/// is asked about (the call then did not run), and whether the backend's policy let an asked
/// call through. `approved`: a person allowed this call. A command is judged before `mark`
/// (its start mark) is written, and runs only after.
#[allow(clippy::too_many_arguments)]
async fn task(
    deps: &AgentDeps,
    section: &str,
    tool: &str,
    args: &Args<'_>,
    at: Read,
    location: &str,
    cancel: &CancellationToken,
    approved: bool,
    live: Option<Arc<LiveTail>>,
    mark: Option<&mut StartMark<'_>>,
) -> TaskOutcome {
    let mut out = TaskOutcome {
        result: Ok(String::new()),
        exit: None,
        asked: None,
        by_policy: false,
        masked: Default::default(),
    };
    let gate = deps.gate();
    let caller = Caller {
        actor: "model",
        section,
        via: "chat",
        tool,
    };
    let result: Result<String, String> = async {
        let call = typed(tool, args, deps.config.tool_timeout)?;
        let Read {
            place,
            workspace: ws,
            remote,
        } = at;
        // The workspace and its permission, judged before anything runs.
        let ws = ws.map_err(|e| format!("this thread's workspace cannot be read: {e:#}"))?;
        gate.check_tool(&caller, &place, location, ws.permission)
            .await?;
        let ops = match (&place, remote) {
            (Place::Local, _) => deps.exec.local_ops_in(
                section,
                std::path::Path::new(&ws.dir),
                ws.permission > Permission::Read,
            ),
            (Place::Target(_), Some(ops)) => ops,
            (Place::Target(_), None) => deps.exec.ops_for(section, &place).await,
        }
        .map_err(|e| e.to_string())?
        .with_live(live);
        let backend_name = ops.backend().name().to_string();
        // The workspace on the backend's host (`~` is that user's home there).
        let workspace_dir = ops.resolve(&ws.dir).await.map_err(|e| e.to_string())?;
        // The stored working directory (read with the workspace) seeds this replica's; without
        // one (a new section, or a new workspace) the shell starts in the workspace.
        let seeded = ws.cwd.clone();
        let start = seeded.clone().unwrap_or_else(|| workspace_dir.clone());
        deps.exec.cwds().set(&backend_name, section, start);
        let at = gate::At {
            place,
            location: location.to_string(),
            ops,
            workspace: workspace_dir,
            permission: ws.permission,
        };
        let starting = mark.map(|m| m as &mut dyn gate::Starting);
        let outcome = gate
            .call(&caller, &at, call, approved, starting, cancel)
            .await;
        if let Ok(now) = at.ops.cwd().await
            && seeded.as_deref() != Some(now.as_str())
        {
            store_cwd(deps, section, &backend_name, &now).await;
        }
        match outcome {
            Outcome::Ran(ran) => {
                out.by_policy = ran.by_policy;
                out.masked = ran.masked;
                Ok(match ran.done {
                    Done::Command { output, cwd } => {
                        out.exit = Some(exit_text(&output.exit));
                        format_output(&output, cwd.as_deref())
                    }
                    Done::Read(r) => match r.text {
                        None => format!("{} is a binary file of {} bytes", r.path, r.size),
                        Some(t) => format!(
                            "{} ({} bytes{}):\n{t}",
                            r.path,
                            r.size,
                            if r.truncated {
                                ", more follows: read on with offset"
                            } else {
                                ""
                            }
                        ),
                    },
                    Done::Wrote { path, bytes } => format!("wrote {bytes} bytes to {path}"),
                    Done::Patched(r) => {
                        format!("patched {}: {} replacement(s)", r.path, r.replacements)
                    }
                    Done::Found(r) if r.matches.is_empty() => "no matches".to_string(),
                    Done::Found(r) => format!(
                        "{}{}",
                        r.matches.join("\n"),
                        if r.truncated {
                            "\n(more results exist; narrow the search)"
                        } else {
                            ""
                        }
                    ),
                })
            }
            Outcome::Asked(a) => {
                let text = a.text.clone();
                out.asked = Some(a);
                Err(text)
            }
            Outcome::Refused(text) | Outcome::Failed(text) => Err(text),
        }
    }
    .await;
    out.result = result;
    out
}

/// What [`task`] reports of a call.
struct TaskOutcome {
    result: Result<String, String>,
    exit: Option<String>,
    asked: Option<gate::Asked>,
    by_policy: bool,
    masked: crate::mask::Counts,
}

/// A task tool's call from its arguments (already checked by [`check_task_args`]).
fn typed(tool: &str, args: &Args<'_>, limit: Duration) -> Result<gate::Tool, String> {
    let secs = |v: Option<u64>| v.map(Duration::from_secs).map(|d| d.min(limit));
    Ok(match tool {
        "terminal" => gate::Tool::Terminal {
            command: args.str("command")?,
            workdir: args.opt_str("workdir")?,
            env: args.opt_string_map("env", MAX_CALL_ENV)?,
            timeout: secs(args.opt_u64("timeout")?),
        },
        "execute_code" => gate::Tool::Code {
            code: args.str("code")?,
            language: args.opt_str("language")?,
            timeout: secs(args.opt_u64("timeout")?),
        },
        "read_file" => gate::Tool::Read {
            path: args.str("path")?,
            range: match (args.opt_u64("offset")?, args.opt_u64("limit")?) {
                (None, None) => ReadRange::Whole,
                (start, count) => ReadRange::Lines {
                    start: start.unwrap_or(1),
                    count: count.unwrap_or(2000),
                },
            },
        },
        "write_file" => gate::Tool::Write {
            path: args.str("path")?,
            content: args.str("content")?,
        },
        "patch" => gate::Tool::Patch {
            path: args.str("path")?,
            old: args.str("old_string")?,
            new: args.str("new_string")?,
            all: args.opt_bool("replace_all")?,
        },
        _ => gate::Tool::Search(SearchRequest {
            pattern: args.str("pattern")?,
            path: args.opt_str("path")?,
            target: match args.opt_str("target")?.as_deref() {
                None | Some("content") => SearchTarget::Content,
                Some("files") => SearchTarget::Files,
                Some(_) => return Err(args.bad("`target` must be content or files".into())),
            },
            file_glob: args.opt_str("file_glob")?,
            max_results: args.opt_u64("max_results")?.unwrap_or(100) as usize,
        }),
    })
}

#[async_trait::async_trait]
impl gate::Starting for StartMark<'_> {
    async fn started(&mut self) -> Result<(), String> {
        self.write().await
    }
}

/// A refusal noted for the audit: by whom (`permission`, `guard`, `workspace`), the verdict
/// and the text the model gets.
struct Refused {
    by: &'static str,
    verdict: Verdict,
    reason: String,
}

/// Most variables one `terminal` call may set through its `env` argument.
const MAX_CALL_ENV: usize = 32;

/// Audits a refused shell call (by the workspace permission or the command guard) and returns
/// the text the model receives.
async fn refused(
    deps: &AgentDeps,
    section: &str,
    backend: &str,
    location: Option<&str>,
    tool: &str,
    r: &Refused,
) -> String {
    let caller = Caller {
        actor: "model",
        section,
        via: "chat",
        tool,
    };
    let place = match backend {
        "local" => Place::Local,
        alias => Place::Target(alias.to_string()),
    };
    deps.gate()
        .audit_refusal(
            &caller,
            &place,
            location.unwrap_or(backend),
            r.by,
            r.verdict,
            &r.reason,
        )
        .await;
    r.reason.clone()
}

fn exit_text(exit: &Exit) -> String {
    match exit {
        Exit::Code(c) => format!("exit {c}"),
        Exit::Signal(s) => format!("signal {s}"),
        Exit::TimedOut => "timed out".into(),
        Exit::Cancelled => "cancelled".into(),
    }
}

fn format_output(out: &Output, cwd: Option<&str>) -> String {
    let mut s = match &out.exit {
        Exit::Code(c) => format!("exit code: {c}\n"),
        Exit::Signal(sig) => format!("killed by signal {sig}\n"),
        Exit::TimedOut | Exit::Cancelled => {
            let how = if out.exit == Exit::TimedOut {
                "timed out"
            } else {
                "cancelled"
            };
            match &out.stop_note {
                None => format!("{how}: the command was killed with its process group\n"),
                Some(note) => format!("{how}: the command was NOT fully stopped: {note}\n"),
            }
        }
    };
    if let Some(d) = cwd {
        s.push_str(&format!("cwd: {d}\n"));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !stdout.is_empty() {
        s.push_str(&format!("stdout:\n{stdout}"));
        if !stdout.ends_with('\n') {
            s.push('\n');
        }
    }
    if !stderr.is_empty() {
        s.push_str(&format!("stderr:\n{stderr}"));
    }
    if stdout.is_empty() && stderr.is_empty() {
        s.push_str("(no output)\n");
    }
    s
}

/// Head + tail of `text` within `limit` bytes, with a note of what was cut.
pub fn cut(text: &str, limit: usize) -> String {
    if text.len() <= limit {
        return text.to_string();
    }
    let note = format!(
        "\n[result cut: {} bytes in all; the first and last parts are shown]",
        text.len()
    );
    let mut ht = HeadTail::new(limit.saturating_sub(note.len() + 48).max(64));
    ht.push(text.as_bytes());
    let mut s = String::from_utf8_lossy(&ht.into_bytes()).into_owned();
    s.push_str(&note);
    s
}

async fn store_cwd(deps: &AgentDeps, section: &str, backend: &str, dir: &str) {
    if let Err(e) = sqlx::query(
        "INSERT INTO section_cwds (section_id, backend, dir) VALUES ($1, $2, $3)
         ON CONFLICT (section_id, backend) DO UPDATE SET dir = $3, updated_at = now()",
    )
    .bind(section)
    .bind(backend)
    .bind(dir)
    .execute(&deps.db)
    .await
    {
        tracing::warn!(section.id = %section, error = %e, "storing the working directory failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cut_keeps_head_and_tail_with_a_note() {
        let text: String = (0..5000).map(|i| format!("{i}\n")).collect();
        let c = cut(&text, 1024);
        assert!(c.len() <= 1024 + 100, "{}", c.len());
        assert!(c.starts_with("0\n1\n"));
        assert!(c.contains("4999"));
        assert!(c.contains("result cut"));
        assert_eq!(cut("short", 1024), "short");
    }

    #[test]
    fn a_stop_that_ended_nothing_is_never_reported_as_a_kill() {
        let mut out = Output {
            stdout: Vec::new(),
            stderr: Vec::new(),
            stdout_omitted: 0,
            stderr_omitted: 0,
            exit: Exit::TimedOut,
            stop_note: None,
        };
        assert!(format_output(&out, None).starts_with("timed out: the command was killed"));
        out.stop_note = Some("no setsid on the target".into());
        let text = format_output(&out, None);
        assert!(
            text.starts_with("timed out: the command was NOT fully stopped: no setsid"),
            "{text}"
        );
        assert!(!text.contains("was killed"), "{text}");
    }

    #[test]
    fn schemas_name_the_contract_tools_and_required_arguments() {
        let defs = definitions();
        let find = |n: &str| {
            defs.iter()
                .find(|t| t.function.name == n)
                .unwrap_or_else(|| panic!("{n}"))
                .function
                .parameters["required"]
                .clone()
        };
        assert_eq!(find("terminal"), json!(["command"]));
        assert_eq!(find("write_file"), json!(["path", "content"]));
        assert_eq!(find("patch"), json!(["path", "old_string", "new_string"]));
        assert_eq!(find("search_files"), json!(["pattern"]));
        assert_eq!(find("execute_code"), json!(["code"]));
        assert_eq!(find("ssh_mode"), json!(["action"]));
        assert_eq!(find("read_file"), json!(["path"]));
        assert_eq!(find("memory"), json!(["action"]));
        assert_eq!(find("skills"), json!(["action"]));
        assert_eq!(find("shell_write"), json!(["shell_id", "data"]));
        assert_eq!(find("shell_read"), json!(["shell_id"]));
        assert_eq!(find("shell_close"), json!(["shell_id"]));
        for open in ["shell_open", "shell_list"] {
            assert_eq!(find(open), Value::Null, "{open} takes no required argument");
        }
    }
}
