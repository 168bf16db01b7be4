//! The one gate every task-tool call passes, whichever front-end made it (the chat agent or
//! MCP): given where the call runs ([`At`]: the resolved place, its operations, workspace and
//! permission), who made it ([`Caller`]) and the call itself ([`Tool`], typed), it runs, in
//! order, the workspace judge (the tool, the variables a call sets, a command and its
//! `workdir`, a file write's real path), the command guard, the backend's `risky` policy
//! ([`policy`]), the request for a person's approval, the execution (within the tool timeout),
//! the audit of a refusal, and the secret scanner on what comes back (every secret value
//! masked, [`crate::mask`]); and returns one [`Outcome`]: what ran, what a person is asked
//! about, a refusal, or a failure.
//!
//! Interactive shells pass the same gate ([`shells`]): whether a shell may be opened, the lines
//! a write would submit judged where they are read, and the audit of each refusal.
//!
//! The front-ends keep only their wire adapters: argument schemas, how the place is resolved
//! for them (a thread's binding, a token's targets), how a person's approval is waited for, and
//! how a result is written back. Only this module calls the workspace judge, the guard's
//! verdicts and the secret scanner on a tool's result; the audit row of a command that ran is
//! built here ([`command_row`]) and written by the front-end in its own commit.
//!
//! Never: resolves a binding or a token; waits for a person; runs anything the judge or the
//! guard refused.

pub mod shells;

use std::time::Duration;

use serde_json::json;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::authz::Approvers;
use crate::bash::Verdict;
use crate::bash::cover::Cover;
use crate::config::Risky;
use crate::exec::ops::{
    Ops, PatchResult, ReadRange, ReadResult, RunOptions, SearchRequest, SearchResult,
};
use crate::exec::{ExecError, Executors, Output, Place};
use crate::plane::secrets::SecretFilter;
use crate::workspace::Permission;
use crate::workspace::judge::{self, Scope};

/// The gate's handles: borrowed from the front-end's own dependencies for one call.
pub struct Gate<'a> {
    pub db: &'a PgPool,
    pub exec: &'a Executors,
    /// What never goes back to a caller.
    pub secrets: &'a SecretFilter,
    /// The longest a tool may run.
    pub tool_timeout: Duration,
    /// What a command the guard asks about does locally (`SSHMODE_LOCAL_RISKY`).
    pub local_risky: Risky,
}

/// Who makes a call, for its audit rows.
#[derive(Debug, Clone, Copy)]
pub struct Caller<'a> {
    /// `model` for the chat agent, the token's name for MCP.
    pub actor: &'a str,
    /// The section whose workspace and working directory the call uses.
    pub section: &'a str,
    /// The front-end: `chat` or `mcp`.
    pub via: &'a str,
    /// The tool's name on that front-end's wire (`terminal`, `exec`, …), as audit rows name it.
    pub tool: &'a str,
}

/// Where a call runs, resolved for it: the place, its operations, the workspace on the
/// backend's host (absolute) and the permission enforced there.
pub struct At {
    pub place: Place,
    /// `local`, or the target's location (`web · deploy@10.0.0.5 via bastion`).
    pub location: String,
    pub ops: Ops,
    pub workspace: String,
    pub permission: Permission,
}

/// A task tool's call, typed.
#[derive(Debug, Clone)]
pub enum Tool {
    Terminal {
        command: String,
        workdir: Option<String>,
        env: Vec<(String, String)>,
        timeout: Option<Duration>,
    },
    Code {
        code: String,
        language: Option<String>,
        timeout: Option<Duration>,
    },
    Read {
        path: String,
        range: ReadRange,
    },
    Write {
        path: String,
        content: String,
    },
    Patch {
        path: String,
        old: String,
        new: String,
        all: bool,
    },
    Search(SearchRequest),
}

impl Tool {
    /// The tool's name in the permission's table.
    fn kind(&self) -> &'static str {
        match self {
            Tool::Terminal { .. } => "terminal",
            Tool::Code { .. } => "execute_code",
            Tool::Read { .. } => "read_file",
            Tool::Write { .. } => "write_file",
            Tool::Patch { .. } => "patch",
            Tool::Search(_) => "search_files",
        }
    }

    /// Whether the call runs a command; an abandoned file operation is dropped on
    /// cancellation, a command is killed by it.
    fn runs(&self) -> bool {
        matches!(
            self,
            Tool::Terminal { .. } | Tool::Code { .. } | Tool::Search(_)
        )
    }
}

/// What the gate did with a call.
#[derive(Debug)]
pub enum Outcome {
    /// It ran.
    Ran(Ran),
    /// A person must allow it first (the backend's policy asks); it did not run.
    Asked(Asked),
    /// Refused (by the permission, the guard, the policy, an unsafe workspace or the secret
    /// filter), and audited: the text for the caller.
    Refused(String),
    /// It failed: the text for the caller.
    Failed(String),
}

/// A call that ran.
#[derive(Debug)]
pub struct Ran {
    pub done: Done,
    /// The guard asked about it and the backend's policy (`risky: allow`) let it through.
    pub by_policy: bool,
    /// How many secret values of each kind were masked in what it handed back.
    pub masked: crate::mask::Counts,
}

/// What a call that ran produced.
#[derive(Debug)]
pub enum Done {
    /// A command (`terminal`, `execute_code`): its output, and for `terminal` the directory
    /// its shell ended in.
    Command {
        output: Output,
        cwd: Option<String>,
    },
    Read(ReadResult),
    Wrote {
        path: String,
        bytes: usize,
    },
    Patched(PatchResult),
    Found(SearchResult),
}

/// A call the guard asks a person about, as the front-end shows and covers it.
#[derive(Debug, Clone)]
pub struct Asked {
    pub command: String,
    pub reason: String,
    /// The directory it would run in.
    pub cwd: String,
    /// What allowing it in a thread would cover.
    pub cover: Cover,
    /// The refusal the caller gets while nobody has allowed it.
    pub text: String,
}

/// The backend's policy for what the guard asks about: what happens (`risky`) and who may
/// allow it. Targets carry theirs (`sshmode target set --risky --approvers`); locally
/// `SSHMODE_LOCAL_RISKY`, answered by the requester. An unreadable policy asks admins (the
/// strictest that still lets work go on).
pub async fn policy(db: &PgPool, place: &Place, local_risky: Risky) -> (Risky, Approvers) {
    match place {
        Place::Local => (local_risky, Approvers::Requester),
        Place::Target(alias) => match crate::target::policy::get(db, alias).await {
            Ok(p) => (
                p.risky,
                Approvers::parse(&p.approvers).unwrap_or(Approvers::Admins),
            ),
            Err(e) => {
                tracing::warn!(target.alias = %alias, error = %e, "reading a target's approval policy failed");
                (Risky::Ask, Approvers::Admins)
            }
        },
    }
}

/// The longest command text an audit row keeps.
pub const AUDIT_COMMAND_CHARS: usize = 4096;

/// The audit row of a command that ran (or was cut short): actor, target, how it ended, and
/// the command redacted of secret-like words and clipped. The front-end adds what only it
/// knows (the turn) and writes it.
pub fn command_row(
    caller: &Caller<'_>,
    target: Option<&str>,
    command: &str,
    outcome: &str,
    detail: serde_json::Value,
) -> crate::audit::CommandRun {
    let text: String = crate::mask::redact(command)
        .chars()
        .take(AUDIT_COMMAND_CHARS)
        .collect();
    let mut d = json!({ "tool": caller.tool, "via": caller.via, "command": text });
    if let (Some(d), serde_json::Value::Object(more)) = (d.as_object_mut(), detail) {
        d.extend(more);
    }
    crate::audit::CommandRun {
        action: crate::audit::COMMAND_RUN,
        actor: caller.actor.to_string(),
        target: target.map(str::to_string),
        outcome: outcome.to_string(),
        detail: d,
        at: None,
    }
}

/// The audit row of a file a call changed (`write_file`: `file.write`, `patch`:
/// `file.patch`): actor, target, the path and what the front-end adds (bytes, replacements).
/// `None` for other tools. Written by the front-end, like [`command_row`]'s.
pub fn file_row(
    caller: &Caller<'_>,
    target: Option<&str>,
    path: &str,
    detail: serde_json::Value,
) -> Option<crate::audit::CommandRun> {
    let action = match caller.tool {
        "write_file" => crate::audit::FILE_WRITE,
        "patch" => crate::audit::FILE_PATCH,
        _ => return None,
    };
    let path: String = crate::mask::redact(path)
        .chars()
        .take(AUDIT_COMMAND_CHARS)
        .collect();
    let mut d = json!({ "tool": caller.tool, "via": caller.via, "path": path });
    if let (Some(d), serde_json::Value::Object(more)) = (d.as_object_mut(), detail) {
        d.extend(more);
    }
    Some(crate::audit::CommandRun {
        action,
        actor: caller.actor.to_string(),
        target: target.map(str::to_string),
        outcome: "ok".to_string(),
        detail: d,
        at: None,
    })
}

/// A refusal on its way to the audit: by whom (`permission`, `guard`, `workspace`, `policy`,
/// `secrets`), the verdict and the text the caller gets.
struct Refusal {
    by: &'static str,
    verdict: Verdict,
    text: String,
}

impl Refusal {
    fn permission(d: impl std::fmt::Display) -> Refusal {
        Refusal {
            by: "permission",
            verdict: Verdict::Refuse,
            text: d.to_string(),
        }
    }
}

/// An execution error: a refusal (by the guard, or of an unsafe local workspace), or a failure.
fn exec_failure(e: ExecError) -> Stop {
    match e {
        ExecError::Refused(o) => Stop::Refused(Refusal {
            by: "guard",
            verdict: o.verdict,
            text: o.to_string(),
        }),
        ExecError::Workspace(why) => Stop::Refused(Refusal {
            by: "workspace",
            verdict: Verdict::Refuse,
            text: why,
        }),
        e => Stop::Failed(e.to_string()),
    }
}

/// Why a call stopped short of a result.
enum Stop {
    Refused(Refusal),
    /// The guard asked and the backend's policy refuses: the refusal audited, and the text.
    Policy(Refusal, String),
    Asked(Asked, Refusal),
    Failed(String),
}

impl From<String> for Stop {
    fn from(s: String) -> Stop {
        Stop::Failed(s)
    }
}

/// What the front-end writes once a call is let through, before it runs (the chat agent's
/// start mark); an error ends the call unrun.
#[async_trait::async_trait]
pub trait Starting: Send {
    async fn started(&mut self) -> Result<(), String>;
}

impl Gate<'_> {
    /// The permission's first word on a call: whether `tool` may be used at all at
    /// `permission`. Front-ends ask it before they reach the backend; a refusal is audited.
    pub async fn check_tool(
        &self,
        caller: &Caller<'_>,
        place: &Place,
        location: &str,
        permission: Permission,
    ) -> Result<(), String> {
        match judge::check_tool(permission, caller.tool_kind()) {
            Ok(()) => Ok(()),
            Err(d) => Err(self
                .refused(caller, place, location, &Refusal::permission(d))
                .await),
        }
    }

    /// Runs one call through the gate. `approved`: a person allowed this very call, so the
    /// guard's `ask` does not stop it (its refusals still do). `starting`: written once the
    /// call is let through, before it acts.
    pub async fn call(
        &self,
        caller: &Caller<'_>,
        at: &At,
        tool: Tool,
        approved: bool,
        starting: Option<&mut (dyn Starting + '_)>,
        cancel: &CancellationToken,
    ) -> Outcome {
        if let Err(d) = judge::check_tool(at.permission, tool.kind()) {
            let text = self
                .refused(caller, &at.place, &at.location, &Refusal::permission(d))
                .await;
            return Outcome::Refused(text);
        }
        let runs = tool.runs();
        // A little beyond the command's own timeout, so a command is killed by its own timeout
        // first; this catches file operations that hang.
        let outer = self.tool_timeout + Duration::from_secs(15);
        let work = self.act(at, tool, approved, starting, cancel);
        let stop = tokio::select! {
            r = tokio::time::timeout(outer, work) => match r {
                Ok(r) => r,
                Err(_) => Err(Stop::Failed(format!(
                    "the tool did not finish within {} s and was abandoned",
                    outer.as_secs()
                ))),
            },
            _ = cancel.cancelled(), if !runs => Err(Stop::Failed("cancelled".into())),
        };
        match stop {
            Ok(mut ran) => match self.mask_done(&mut ran.done).await {
                Ok(counts) => {
                    self.secrets.count(&counts);
                    ran.masked = counts;
                    Outcome::Ran(ran)
                }
                Err(why) => Outcome::Refused(
                    self.refused(
                        caller,
                        &at.place,
                        &at.location,
                        &Refusal {
                            by: "secrets",
                            verdict: Verdict::Refuse,
                            text: why,
                        },
                    )
                    .await,
                ),
            },
            Err(Stop::Failed(e)) => Outcome::Failed(e),
            Err(Stop::Refused(r)) => {
                Outcome::Refused(self.refused(caller, &at.place, &at.location, &r).await)
            }
            Err(Stop::Policy(r, text)) => {
                self.refused(caller, &at.place, &at.location, &r).await;
                Outcome::Refused(text)
            }
            Err(Stop::Asked(mut a, r)) => {
                a.text = self.refused(caller, &at.place, &at.location, &r).await;
                Outcome::Asked(a)
            }
        }
    }

    async fn act(
        &self,
        at: &At,
        tool: Tool,
        approved: bool,
        starting: Option<&mut (dyn Starting + '_)>,
        cancel: &CancellationToken,
    ) -> Result<Ran, Stop> {
        let ops = &at.ops;
        // What the judge needs below `full`: the workspace and the working directory on the
        // backend's host.
        let cwd = ops.cwd().await.map_err(|e| e.to_string())?;
        let home = if at.permission < Permission::Full {
            ops.backend().home().await.ok()
        } else {
            None
        };
        let scope = (at.permission < Permission::Full).then(|| Scope {
            workspace: &at.workspace,
            cwd: &cwd,
            home: home.as_deref(),
        });
        let limit = self.tool_timeout;
        let timeout = |asked: Option<Duration>| asked.unwrap_or(limit).min(limit);
        match tool {
            Tool::Terminal {
                command,
                workdir,
                env,
                timeout: t,
            } => {
                if let Err(d) = judge::check_env(at.permission, &env, self.exec.tool_env_allow()) {
                    return Err(Stop::Refused(Refusal::permission(d)));
                }
                // The workdir is judged as the `cd` into it would be, and the command from
                // there. Variables given in `env` are not substituted by the judge: a `$NAME`
                // stays a word it cannot read, never a literal it trusts.
                let cwd_here = match &workdir {
                    Some(w) => ops.resolve(w).await.unwrap_or_else(|_| w.clone()),
                    None => cwd.clone(),
                };
                if let Some(scope) = &scope {
                    if let Some(w) = &workdir {
                        let enter = format!("cd -- {}", crate::exec::shell_quote(w));
                        if let Err(d) = judge::check_command(at.permission, &enter, scope) {
                            return Err(Stop::Refused(Refusal::permission(d)));
                        }
                        let resolved = ops.resolve(w).await.map_err(|e| e.to_string())?;
                        let here = Scope {
                            cwd: &resolved,
                            ..*scope
                        };
                        if let Err(d) = judge::check_command(at.permission, &command, &here) {
                            return Err(Stop::Refused(Refusal::permission(d)));
                        }
                    } else if let Err(d) = judge::check_command(at.permission, &command, scope) {
                        return Err(Stop::Refused(Refusal::permission(d)));
                    }
                }
                let opts = RunOptions {
                    timeout: Some(timeout(t)),
                    env,
                    workdir,
                    prelude: if at.permission == Permission::Read {
                        judge::read_preamble()
                    } else {
                        ""
                    },
                    workspace: Some(at.workspace.clone()),
                };
                // The verdict first: an `ask` stops the call before any start is recorded.
                let objection = ops
                    .judge_terminal(&command, &opts)
                    .await
                    .map_err(exec_failure)?;
                let by_policy = self
                    .settle(at, objection, approved, (&command, &cwd_here, &opts.env))
                    .await?;
                if let Some(s) = starting {
                    s.started().await?;
                }
                let r = if approved || by_policy {
                    ops.terminal_approved(&command, opts, cancel).await
                } else {
                    ops.terminal(&command, opts, cancel).await
                }
                .map_err(exec_failure)?;
                Ok(Ran {
                    done: Done::Command {
                        output: r.output,
                        cwd: Some(r.cwd),
                    },
                    by_policy,
                    masked: Default::default(),
                })
            }
            Tool::Code {
                code,
                language,
                timeout: t,
            } => {
                // Shell code can be judged like a terminal command; other languages cannot
                // (locally the sandbox holds the workspace limit).
                let shell = matches!(
                    language.as_deref().map(str::to_ascii_lowercase).as_deref(),
                    Some("bash" | "sh" | "shell")
                );
                if shell
                    && let Some(scope) = &scope
                    && let Err(d) = judge::check_command(at.permission, &code, scope)
                {
                    return Err(Stop::Refused(Refusal::permission(d)));
                }
                let objection = ops
                    .judge_code(&code, language.as_deref(), Some(at.workspace.as_str()))
                    .await
                    .map_err(exec_failure)?;
                let by_policy = self
                    .settle(at, objection, approved, (&code, &cwd, &[]))
                    .await?;
                if let Some(s) = starting {
                    s.started().await?;
                }
                let output = ops
                    .execute_code_as(
                        &code,
                        language.as_deref(),
                        Some(timeout(t)),
                        Some(at.workspace.as_str()),
                        cancel,
                        approved || by_policy,
                    )
                    .await
                    .map_err(exec_failure)?;
                Ok(Ran {
                    done: Done::Command { output, cwd: None },
                    by_policy,
                    masked: Default::default(),
                })
            }
            Tool::Read { path, range } => {
                let r = ops.read_file(&path, range).await.map_err(exec_failure)?;
                Ok(ran(Done::Read(r)))
            }
            Tool::Write { path, content } => {
                if let Some(scope) = &scope {
                    self.check_write(at, &path, scope, cancel).await?;
                }
                let p = ops
                    .write_file(&path, content.as_bytes())
                    .await
                    .map_err(exec_failure)?;
                Ok(ran(Done::Wrote {
                    path: p,
                    bytes: content.len(),
                }))
            }
            Tool::Patch {
                path,
                old,
                new,
                all,
            } => {
                if let Some(scope) = &scope {
                    self.check_write(at, &path, scope, cancel).await?;
                }
                let r = ops
                    .patch(&path, &old, &new, all)
                    .await
                    .map_err(exec_failure)?;
                Ok(ran(Done::Patched(r)))
            }
            Tool::Search(req) => {
                let r = ops.search(&req, cancel).await.map_err(exec_failure)?;
                Ok(ran(Done::Found(r)))
            }
        }
    }

    /// What the guard's objection (if any) means for a call: none, or a person already
    /// allowed it — it goes on; an `ask` goes to the backend's policy (`allow`: it goes on,
    /// `by_policy`; `refuse`: refused; `ask`: a person is asked); a refusal stays one.
    /// `asked`: the command, the directory it would run in and the variables the call sets.
    async fn settle(
        &self,
        at: &At,
        objection: Option<crate::exec::guard::Objection>,
        approved: bool,
        (command, cwd, env): (&str, &str, &[(String, String)]),
    ) -> Result<bool, Stop> {
        let Some(o) = objection else {
            return Ok(false);
        };
        if o.verdict != Verdict::Ask {
            return Err(exec_failure(ExecError::Refused(o)));
        }
        if approved {
            return Ok(false);
        }
        let (risky, _) = policy(self.db, &at.place, self.local_risky).await;
        match risky {
            Risky::Allow => Ok(true),
            // Audited as what the guard did (it asked); the caller reads the policy's answer.
            Risky::Refuse => Err(Stop::Policy(
                Refusal {
                    by: "guard",
                    verdict: Verdict::Ask,
                    text: o.to_string(),
                },
                format!(
                    "refused: this needs a person's approval ({}), and this backend's policy refuses such commands instead of asking. Do it another way.",
                    o.reason
                ),
            )),
            Risky::Ask => {
                let asked = Asked {
                    command: command.to_string(),
                    reason: o.reason.clone(),
                    cwd: cwd.to_string(),
                    cover: cover_at(&at.ops, command, cwd, &at.workspace, env).await,
                    text: String::new(),
                };
                Err(Stop::Asked(
                    asked,
                    Refusal {
                        by: "guard",
                        verdict: Verdict::Ask,
                        text: o.to_string(),
                    },
                ))
            }
        }
    }

    /// Judges a file tool's write: where the path really leads on the backend's host
    /// (symlinks resolved there), against the workspace resolved the same way.
    async fn check_write(
        &self,
        at: &At,
        path: &str,
        scope: &Scope<'_>,
        cancel: &CancellationToken,
    ) -> Result<(), Stop> {
        let permission = at.permission;
        let resolved = at.ops.resolve(path).await.map_err(|e| e.to_string())?;
        let real = at
            .ops
            .real_paths(&[scope.workspace, &resolved], cancel)
            .await
            .map_err(|e| {
                Stop::Refused(Refusal::permission(format!(
                    "the workspace permission `{permission}` allows writes only inside the workspace, and {e}"
                )))
            })?;
        let real_scope = Scope {
            workspace: &real[0],
            cwd: scope.cwd,
            home: scope.home,
        };
        judge::check_write_path(permission, &real[1], &real_scope)
            .map_err(|d| Stop::Refused(Refusal::permission(d)))
    }

    /// The secret scanner on what a call hands back: every secret value in its output, the
    /// file it read or the lines it found is masked (`[secret: KIND #TAG]`); returns how many
    /// of each kind. `Err` (the result withheld) only when the secrets could not be looked for.
    async fn mask_done(&self, done: &mut Done) -> Result<crate::mask::Counts, String> {
        let mut counts = crate::mask::Counts::new();
        match done {
            Done::Command { output, .. } => {
                for bytes in [&mut output.stdout, &mut output.stderr] {
                    if bytes.is_empty() {
                        continue;
                    }
                    let m = self.mask_text(&String::from_utf8_lossy(bytes)).await?;
                    if m.total() > 0 {
                        // Only a masked output is re-encoded; an untouched one keeps its bytes.
                        *bytes = m.text.into_bytes();
                        crate::mask::add_counts(&mut counts, &m.counts);
                    }
                }
            }
            Done::Read(r) => {
                if let Some(text) = r.text.as_mut() {
                    let m = self.mask_text(text).await?;
                    if m.total() > 0 {
                        *text = m.text;
                        crate::mask::add_counts(&mut counts, &m.counts);
                    }
                }
            }
            Done::Found(r) => {
                // One look at all the lines; each is masked apart only when something was found.
                let m = self.mask_text(&r.matches.join("\n")).await?;
                if m.total() > 0 {
                    for line in r.matches.iter_mut() {
                        let m = self.mask_text(line).await?;
                        *line = m.text;
                        crate::mask::add_counts(&mut counts, &m.counts);
                    }
                }
            }
            Done::Wrote { .. } | Done::Patched(_) => {}
        }
        Ok(counts)
    }

    /// A text a shell call hands back (its screen, what it read), masked, and its masks
    /// counted; `Err` with the refusal when it could not be checked.
    pub async fn masked(&self, text: &str) -> Result<String, String> {
        let m = self.mask_text(text).await?;
        self.secrets.count(&m.counts);
        Ok(m.text)
    }

    /// The secret scanner on a text handed back (a tool's output, a shell's screen, what a
    /// shell read, a live tail): the text with every secret masked, or `Err` with the refusal
    /// when the secrets could not be looked for now (the text is then withheld).
    pub async fn mask_text(&self, text: &str) -> Result<crate::mask::Masked, String> {
        match self.secrets.mask(self.db, text).await {
            Ok(m) => Ok(m),
            Err(e) => {
                tracing::warn!(error = %e, "the secret scanner failed; withholding a tool result");
                Err("the result is withheld: it could not be checked for secrets now".into())
            }
        }
    }

    /// Audits a refused call and returns the text the caller gets.
    async fn refused(
        &self,
        caller: &Caller<'_>,
        place: &Place,
        location: &str,
        r: &Refusal,
    ) -> String {
        self.audit_refusal(caller, place, location, r.by, r.verdict, &r.text)
            .await;
        r.text.clone()
    }

    /// Writes the audit row of a refused call (`tool.refused`).
    pub async fn audit_refusal(
        &self,
        caller: &Caller<'_>,
        place: &Place,
        location: &str,
        by: &str,
        verdict: Verdict,
        reason: &str,
    ) {
        let entry = crate::audit::ChatEntry {
            actor: caller.actor,
            action: "tool.refused",
            section: Some(caller.section),
            target: place.target(),
            outcome: "refused",
            detail: json!({
                "tool": caller.tool,
                "via": caller.via,
                "by": by,
                "verdict": verdict.as_str(),
                "reason": reason.chars().take(500).collect::<String>(),
                // Where it would have run, with the path (`web · deploy@10.0.0.5 via bastion`).
                "location": location,
            }),
        };
        let audited = async {
            let mut conn = self.db.acquire().await?;
            crate::audit::record_chat(&mut conn, entry).await
        };
        if let Err(e) = audited.await {
            tracing::warn!(section.id = %caller.section, error = %e, "auditing a refused tool call failed");
        }
    }
}

impl Caller<'_> {
    /// The tool's name in the permission's table (MCP's `exec` is the `terminal`).
    fn tool_kind(&self) -> &str {
        match self.tool {
            "exec" => "terminal",
            t => t,
        }
    }
}

fn ran(done: Done) -> Ran {
    Ran {
        done,
        by_policy: false,
        masked: Default::default(),
    }
}

/// The cover of a command the guard asks about, where it would run (`env`: the call's own
/// environment variables).
async fn cover_at(
    ops: &Ops,
    command: &str,
    cwd: &str,
    workspace: &str,
    env: &[(String, String)],
) -> Cover {
    let home = ops.backend().home().await.ok();
    crate::bash::cover::cover(
        command,
        &crate::bash::cover::Places {
            cwd,
            workspace,
            home: home.as_deref(),
            env,
        },
    )
}

/// `s` cut to `max` bytes at a character boundary, with an ellipsis when cut.
pub fn clip(s: &str, max: usize) -> String {
    let s = s.trim();
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}
