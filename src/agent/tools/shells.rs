//! The interactive-shell tools (`shell_open`, `shell_write`, `shell_read`, `shell_close`,
//! `shell_list`): schemas, argument checks, the rules of where a shell may run, and the text
//! the model reads. The shells themselves are `exec::pty::Shells`, keyed by section.
//!
//! A call resolves the section's backend like any task tool; shells the section has on another
//! backend (its binding changed) are closed first, with a note in the result. On a target a
//! shell needs the workspace permission `full` (what is typed into a REPL or an editor cannot
//! be judged line by line) and is refused where the target's `risky` policy is `refuse`; where
//! it is `ask`, opening one is asked of a person like a risky command (the card shows
//! `shell_open`). The target and every jump host on its way must still be approved at every
//! open, write, read and listing (a binding whose chat lost a hop's allow-list fails before),
//! so a target disabled since stops the next of them; `shell_close` needs only the binding.
//!
//! Every line a `shell_write` submits is judged first as a shell line
//! (`workspace::verdict::judge_typed`: the workspace permission, then the command guard, in the
//! directory of the program that reads it), unless the terminal's state shows a program the
//! shell started from a judged line that runs what is typed into it anyway (`exec::pty`:
//! never the screen). A line refused is never sent; a line asked about is asked of a person,
//! unless a person (or the backend's policy) allowed the shell itself — every such line of one
//! write on the one card, which an allowance in the thread then covers only as written, in that
//! shell. Below `full` (a local shell) a line starting such a program (an editor, a pager, a
//! prompt) is asked too. Both are refusals nothing was sent for, audited. A local shell is held
//! to the workspace permission line by line — at `read` only the read-only list runs, with the
//! read-only `git` defined — and one opened at a higher permission than the section's now takes
//! no more lines. A shell is a stateful interpreter, so this reads each line on its own —
//! defence in depth behind the permission, the sandbox and the policy.
//!
//! Opening, typing into and closing a shell are audit rows (`shell.open`, `shell.input`,
//! `shell.close`), written with the call's result: the text typed is redacted as commands are,
//! and input typed with echo off (a password prompt) is recorded as `[input hidden]`.

use std::time::Duration;

use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::{Asked, Refused, ShellRow, StartMark, ToolOutcome, refused};
use crate::agent::{AgentDeps, BindingFails};
use crate::bash::Verdict;
use crate::config::Risky;
use crate::exec::Place;
use crate::exec::pty::{OpenOpts, ReadMode, ReadOpts, ScreenView, ShellRead};
use crate::gate::Caller;
use crate::gate::shells::{JudgedIn, Typed, needs_judging};
use crate::llm::Tool;
use crate::llm::args::Args;
use crate::workspace::verdict::shell_prelude;
use crate::workspace::{self, Permission};

/// The tool names.
pub const TOOLS: [&str; 5] = [
    "shell_open",
    "shell_write",
    "shell_read",
    "shell_close",
    "shell_list",
];

/// Longest `expect` pattern.
const MAX_EXPECT: usize = 1024;

/// Typed text kept in an audit row.
const AUDIT_INPUT_CHARS: usize = 1024;

/// Why opening a shell on a target whose policy is `ask` is asked of a person.
const OPEN_ASKED: &str = "an interactive shell: lines typed at its prompt are judged one by one, but what is typed into a program it runs (a REPL, an editor) cannot be";

pub fn definitions() -> Vec<Tool> {
    vec![
        Tool::function(
            "shell_open",
            "Open an interactive shell (a terminal) on this thread's backend; it keeps its directory and variables across calls until closed. Returns its shell_id and first screen.",
            json!({"type": "object", "properties": {
                "rows": {"type": "integer", "minimum": 2, "maximum": 200},
                "cols": {"type": "integer", "minimum": 10, "maximum": 500},
                "term": {"type": "string", "description": "TERM, default xterm."}
            }, "additionalProperties": false}),
        ),
        Tool::function(
            "shell_write",
            "Type into a shell: raw input, `\\r` for Enter, `\\x03` for Ctrl-C, `\\x04` for Ctrl-D. Never type a password: at a password prompt only Enter, Ctrl-C or Ctrl-D are sent.",
            json!({"type": "object", "properties": {
                "shell_id": {"type": "string"},
                "data": {"type": "string"}
            }, "required": ["shell_id", "data"], "additionalProperties": false}),
        ),
        Tool::function(
            "shell_read",
            "Read a shell: mode `screen` (default) shows the visible screen, the cursor and whether a full-screen program is on; `raw` the output since a cursor (`since`, default where the last raw read stopped), escapes stripped. With `wait_ms` it waits until `expect` (a regex) matches, or without one until new output settles.",
            json!({"type": "object", "properties": {
                "shell_id": {"type": "string"},
                "mode": {"type": "string", "enum": ["screen", "raw"]},
                "since": {"type": "integer", "minimum": 0},
                "wait_ms": {"type": "integer", "minimum": 0, "maximum": 120000},
                "expect": {"type": "string"}
            }, "required": ["shell_id"], "additionalProperties": false}),
        ),
        Tool::function(
            "shell_close",
            "Close a shell (its programs get a hangup).",
            json!({"type": "object", "properties": {
                "shell_id": {"type": "string"}
            }, "required": ["shell_id"], "additionalProperties": false}),
        ),
        Tool::function(
            "shell_list",
            "List this thread's open shells.",
            json!({"type": "object", "properties": {}, "additionalProperties": false}),
        ),
    ]
}

/// Runs one shell tool call for `section`. `approved`: a person allowed this call (what the
/// guard or the policy would ask about goes ahead). `mark`: the start mark `shell_open` and
/// `shell_write` write once they are let through, before they act.
pub(super) async fn call(
    deps: &AgentDeps,
    section: &str,
    tool: &str,
    args: &Args<'_>,
    cancel: &CancellationToken,
    approved: bool,
    mark: Option<&mut StartMark<'_>>,
) -> ToolOutcome {
    let allowed: &[&str] = match tool {
        "shell_open" => &["rows", "cols", "term"],
        "shell_write" => &["shell_id", "data"],
        "shell_read" => &["shell_id", "mode", "since", "wait_ms", "expect"],
        "shell_close" => &["shell_id"],
        _ => &[],
    };
    if let Err(e) = args.only(allowed) {
        return ToolOutcome::failed(e);
    }
    let place = match deps.bindings.place(section).await {
        Ok(p) => p,
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
    let shells = &deps.exec.shells;
    shells.follow(section, place.name());
    let note = shells.take_note(section);
    let location = match &place {
        Place::Local => "local".to_string(),
        Place::Target(alias) => match crate::target::get(&deps.db, alias).await {
            Ok(t) => t.location(),
            Err(_) => alias.clone(),
        },
    };
    let mut asked = None;
    let mut row = None;
    let at = ShellCall {
        section,
        place: &place,
        location: &location,
    };
    let result = run(
        deps,
        &at,
        tool,
        args,
        cancel,
        (approved, mark),
        (&mut asked, &mut row),
    )
    .await;
    let result = match note {
        Some(n) => result
            .map(|t| format!("note: {n}\n{t}"))
            .map_err(|e| format!("{e}\n(note: {n})")),
        None => result,
    };
    ToolOutcome {
        result,
        backend: Some(place.name().to_string()),
        location: Some(location),
        exit: None,
        binding_fails: None,
        asked,
        shell_row: row,
        by_policy: false,
        masked: Default::default(),
    }
}

/// Where a shell call acts.
struct ShellCall<'a> {
    section: &'a str,
    place: &'a Place,
    location: &'a str,
}

async fn run(
    deps: &AgentDeps,
    at: &ShellCall<'_>,
    tool: &str,
    args: &Args<'_>,
    cancel: &CancellationToken,
    (approved, mark): (bool, Option<&mut StartMark<'_>>),
    (asked, row): (&mut Option<Asked>, &mut Option<ShellRow>),
) -> Result<String, String> {
    let ShellCall {
        section,
        place,
        location,
    } = *at;
    let shells = &deps.exec.shells;
    if tool == "shell_list" {
        reachable(deps, section, tool, place, location).await?;
        let list = shells.list(section);
        if list.is_empty() {
            return Ok("no shells open in this thread".into());
        }
        return Ok(list
            .iter()
            .map(|s| {
                format!(
                    "{} · {} · {}x{} · idle {} s · at: {}",
                    s.shell_id,
                    s.location,
                    s.size.0,
                    s.size.1,
                    s.idle.as_secs(),
                    s.prompt.trim_end()
                )
            })
            .collect::<Vec<_>>()
            .join("\n"));
    }
    if tool == "shell_close" {
        let id = args.str("shell_id")?;
        shells.close(section, &id).map_err(|e| e.to_string())?;
        *row = Some(ShellRow {
            action: "shell.close",
            detail: json!({"shell_id": id}),
            at: None,
        });
        return Ok(format!("closed shell {id}"));
    }
    // Opening, typing and reading: allowed where the rules allow a shell now.
    let risky = allowed(deps, section, tool, place, location).await?;
    match tool {
        "shell_open" => {
            let d = OpenOpts::default();
            let opts = OpenOpts {
                rows: small(args.opt_u64("rows")?, d.rows),
                cols: small(args.opt_u64("cols")?, d.cols),
                term: args.opt_str("term")?.unwrap_or(d.term),
                risky_allowed: approved || risky == Risky::Allow,
            };
            // On a target whose policy asks, a person allows the shell first.
            if let Place::Target(alias) = place
                && !opts.risky_allowed
            {
                *asked = Some(Asked {
                    command: "shell_open".into(),
                    reason: OPEN_ASKED.into(),
                    location: location.to_string(),
                    cwd: "~".into(),
                    target: Some(alias.clone()),
                    cover: crate::bash::cover::exact("shell_open", "~"),
                });
                return Err(format!(
                    "not opened: a shell on `{alias}` needs a person's approval ({OPEN_ASKED})"
                ));
            }
            if let Some(m) = mark {
                m.write().await?;
            }
            let host = match place {
                // Locally the shell works in the section's workspace, as commands do.
                Place::Local => {
                    let ws = workspace::current(&deps.db, &deps.workspaces, section, place)
                        .await
                        .map_err(|e| format!("this thread's workspace cannot be read: {e:#}"))?;
                    deps.exec.local_pty_host_in(
                        section,
                        std::path::Path::new(&ws.dir),
                        ws.permission > Permission::Read,
                        shell_prelude(ws.permission),
                    )
                }
                Place::Target(_) => deps.exec.pty_host(section, place).await,
            }
            .map_err(|e| e.to_string())?;
            let info = shells
                .open(host, section, opts)
                .await
                .map_err(|e| e.to_string())?;
            *row = Some(ShellRow {
                action: "shell.open",
                detail: json!({"shell_id": info.shell_id}),
                at: None,
            });
            let screen = deps.gate().masked(&screen_text(&info.screen)).await?;
            Ok(format!(
                "opened shell {} on {}\nraw output ends at {} (since for a raw read)\n{screen}",
                info.shell_id, info.location, info.end,
            ))
        }
        "shell_write" => {
            let id = args.str("shell_id")?;
            let data = args.str("data")?;
            let entering = shells
                .entering(section, &id, data.as_bytes())
                .await
                .map_err(|e| e.to_string())?;
            let judged_in = if needs_judging(place, &entering) {
                let (permission, workspace, home) = judged_in(deps, section, place).await?;
                Some(JudgedIn {
                    permission,
                    workspace,
                    home,
                })
            } else {
                None
            };
            let caller = caller(section, tool);
            let typed = deps
                .gate()
                .typed(
                    &caller,
                    (place, location, &id),
                    &entering,
                    judged_in.as_ref(),
                    approved,
                )
                .await?;
            if let Typed::Ask(a) = typed {
                // What else a shell holds (its functions, variables) is unknown: only these
                // lines, in this shell, are covered.
                let shell_dir = format!("(the directory of shell {id})");
                *asked = Some(Asked {
                    cover: crate::bash::cover::exact(&a.lines, &shell_dir),
                    command: a.lines,
                    reason: a.reason,
                    location: location.to_string(),
                    cwd: entering.cwd.clone().unwrap_or(shell_dir),
                    target: match place {
                        Place::Target(alias) => Some(alias.clone()),
                        Place::Local => None,
                    },
                });
                return Err(a.text);
            }
            if let Some(m) = mark {
                m.write().await?;
            }
            let at = chrono::Utc::now();
            shells
                .write_entered(section, &id, data.as_bytes(), &entering)
                .await
                .map_err(|e| e.to_string())?;
            *row = Some(ShellRow {
                action: "shell.input",
                detail: json!({
                    "shell_id": id,
                    "bytes": data.len(),
                    "text": entering.recorded(&data, AUDIT_INPUT_CHARS),
                }),
                at: Some(at),
            });
            Ok(format!(
                "sent {} bytes to {id}; read it with shell_read",
                data.len()
            ))
        }
        _ => {
            let id = args.str("shell_id")?;
            let mode = match args.opt_str("mode")?.as_deref() {
                None | Some("screen") => ReadMode::Screen,
                Some("raw") => ReadMode::Raw,
                Some(_) => return Err(args.bad("`mode` must be screen or raw".into())),
            };
            let expect = match args.opt_str("expect")? {
                None => None,
                Some(p) if p.len() > MAX_EXPECT => {
                    return Err(args.bad(format!("`expect` is longer than {MAX_EXPECT} bytes")));
                }
                Some(p) => Some(
                    regex::RegexBuilder::new(&p)
                        .size_limit(1 << 20)
                        .build()
                        .map_err(|e| args.bad(format!("`expect` is not a valid regex: {e}")))?,
                ),
            };
            let wait = Duration::from_millis(args.opt_u64("wait_ms")?.unwrap_or(0))
                .min(deps.config.tool_timeout);
            let opts = ReadOpts {
                mode,
                since: args.opt_u64("since")?,
                wait,
                expect,
            };
            let r = shells
                .read(section, &id, opts, cancel)
                .await
                .map_err(|e| e.to_string())?;
            if r.cancelled {
                return Err("cancelled: the wait ended by /stop".into());
            }
            deps.gate().masked(&read_text(&id, &r)).await
        }
    }
}

/// Whether `section` may open, type into or read a shell on `place` now, and if so the
/// backend's `risky` policy; a refusal is audited.
async fn allowed(
    deps: &AgentDeps,
    section: &str,
    tool: &str,
    place: &Place,
    location: &str,
) -> Result<Risky, String> {
    if *place == Place::Local {
        return Ok(deps.config.local_risky);
    }
    reachable(deps, section, tool, place, location).await?;
    let ws = workspace::current(&deps.db, &deps.workspaces, section, place)
        .await
        .map_err(|e| format!("this thread's workspace cannot be read: {e:#}"))?;
    let raise = format!(
        "this thread's is `{}`; a user can raise it with `/workspace set {} full`",
        ws.permission, ws.dir
    );
    deps.gate()
        .shell_allowed(
            &caller(section, tool),
            place,
            location,
            ws.permission,
            &raise,
        )
        .await
}

/// The gate's view of a shell call of the model in `section`.
fn caller<'a>(section: &'a str, tool: &'a str) -> Caller<'a> {
    Caller {
        actor: "model",
        section,
        via: "chat",
        tool,
    }
}

/// Whether `place` is usable now: a target and every jump host on its way still approved, read
/// afresh at every call as a command's backend is (the binding's read checked the chat's
/// allow-lists). A target disabled since an open refuses the next write, read or listing; a
/// refusal is audited.
async fn reachable(
    deps: &AgentDeps,
    section: &str,
    tool: &str,
    place: &Place,
    location: &str,
) -> Result<(), String> {
    if *place == Place::Local {
        return Ok(());
    }
    match deps.exec.backend(section, place).await {
        Ok(_) => Ok(()),
        Err(e) => {
            let r = Refused {
                by: "target",
                verdict: Verdict::Refuse,
                reason: e.to_string(),
            };
            Err(refused(deps, section, place.name(), Some(location), tool, &r).await)
        }
    }
}

/// The workspace a line typed in `section`'s shell on `place` is judged in: its permission
/// now, and its directory and the account's home on the shell's host.
async fn judged_in(
    deps: &AgentDeps,
    section: &str,
    place: &Place,
) -> Result<(Permission, String, Option<String>), String> {
    let ws = workspace::current(&deps.db, &deps.workspaces, section, place)
        .await
        .map_err(|e| format!("this thread's workspace cannot be read: {e:#}"))?;
    let ops = match place {
        Place::Local => deps.exec.local_ops_in(
            section,
            std::path::Path::new(&ws.dir),
            ws.permission > Permission::Read,
        ),
        Place::Target(_) => deps.exec.ops_for(section, place).await,
    }
    .map_err(|e| e.to_string())?;
    let dir = ops.resolve(&ws.dir).await.map_err(|e| e.to_string())?;
    let home = ops.backend().home().await.ok();
    Ok((ws.permission, dir, home))
}

fn small(v: Option<u64>, default: u16) -> u16 {
    v.map(|n| n.min(u16::MAX as u64) as u16).unwrap_or(default)
}

fn screen_text(v: &ScreenView) -> String {
    format!(
        "screen {}x{}, cursor at row {} col {}, alternate screen {}:\n{}",
        v.size.0,
        v.size.1,
        v.cursor.0 + 1,
        v.cursor.1 + 1,
        if v.alternate { "on" } else { "off" },
        v.text()
    )
}

fn read_text(id: &str, r: &ShellRead) -> String {
    let mut s = String::new();
    if let Some(m) = r.matched {
        s.push_str(if m {
            "expect: matched\n"
        } else {
            "expect: not matched within the wait\n"
        });
    }
    if let Some(v) = &r.screen {
        s.push_str(&screen_text(v));
        s.push('\n');
    }
    if let Some(raw) = &r.raw {
        if raw.dropped > 0 {
            s.push_str(&format!(
                "({} earlier bytes are no longer kept)\n",
                raw.dropped
            ));
        }
        s.push_str(&format!(
            "output up to {}{}:\n{}",
            raw.next,
            if raw.more {
                " (more follows: read again)"
            } else {
                ""
            },
            raw.text
        ));
        if !raw.text.ends_with('\n') {
            s.push('\n');
        }
    } else {
        s.push_str(&format!("raw output ends at {}\n", r.end));
    }
    if let Some(why) = &r.ended {
        s.push_str(&format!("shell {id} has ended: {why}\n"));
    }
    s
}
