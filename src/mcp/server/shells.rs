//! The MCP shell tools (`shell_open`, `shell_write`, `shell_read`, `shell_close`,
//! `shell_list`) over the process's one [`crate::exec::pty::Shells`], keyed by the token itself
//! ([`Token::key`]: its id, not only its name): a `shell_id` of another token — a token issued
//! again under a revoked one's name among them —, or of another process (a restart, another
//! replica), is reported "shell closed". A revoked or expired token's shells are closed by
//! [`run_sweeper`] within [`SWEEP_EVERY`] (audited, actor `system`).
//!
//! The chat path's rules hold (`agent::tools::shells`): on a target a shell needs the
//! workspace permission `full` — the token's permission caps it — and is refused where the
//! target's `risky` policy is `refuse`; they are checked again before each write and read, with
//! the token's way there (the target and every jump host on its way approved and among its
//! targets: a target disabled since stops the next write, read or listing), and a refusal is
//! audited. Closing is always allowed. Each line a write would submit is judged first as `exec`
//! judges a command, at the token's permission, in the directory of the program that reads it
//! (`workspace::verdict::judge_typed`), unless the terminal's state shows a program the shell
//! started from a judged line that runs what is typed into it anyway (`exec::pty`); a refusal,
//! or an `ask` where the policy does not allow it, sends nothing. A local shell is held to the
//! permission line by line, as on the chat path. At a password prompt only Enter, Ctrl-C or
//! Ctrl-D are typed (the registry's rule). Opening, typing and closing are audit rows with the
//! token's name as actor (`shell.open`, `shell.input` with the text redacted — `[input hidden]`
//! when typed with echo off — and `shell.close`); what a read returns passes the secret
//! filter.

use std::collections::HashMap;
use std::time::Duration;

use rmcp::model::CallToolResult;
use rmcp::service::RequestContext;
use rmcp::{RoleServer, schemars};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::{Fail, Tools, place_of};
use crate::config::Risky;
use crate::exec::Place;
use crate::exec::pty::{Entering, OpenOpts, ReadMode, ReadOpts, ScreenView, ShellError, ShellRead};
use crate::gate::shells::{JudgedIn, Typed, needs_judging};
use crate::mcp::token::Token;
use crate::workspace::Permission;
use crate::workspace::verdict::shell_prelude;

/// Longest `expect` pattern.
const MAX_EXPECT: usize = 1024;
/// Typed text kept in an audit row.
const AUDIT_INPUT_CHARS: usize = 1024;

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct OpenArgs {
    /// A target alias from host_list (`local` only where the token allows it).
    pub target: String,
    /// Terminal rows, 2 to 200 (default 24).
    #[serde(default)]
    pub rows: Option<u16>,
    /// Terminal columns, 10 to 500 (default 80).
    #[serde(default)]
    pub cols: Option<u16>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct WriteArgs {
    /// The shell_id shell_open returned.
    pub shell_id: String,
    /// Raw input: `\r` is Enter, `\u0003` Ctrl-C, `\u0004` Ctrl-D.
    pub data: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct ReadArgs {
    pub shell_id: String,
    /// `screen` (default): the visible screen and cursor; `raw`: the output since `since`
    /// (default where the last raw read stopped), escapes stripped.
    #[serde(default)]
    pub mode: Option<String>,
    /// For `raw`: the output offset to read from.
    #[serde(default)]
    pub since: Option<u64>,
    /// Wait up to this long (at most 120000) for `expect` to match, or without it for new
    /// output to settle.
    #[serde(default)]
    pub wait_ms: Option<u64>,
    /// A regex to wait for on the screen (`screen`) or in the output (`raw`).
    #[serde(default)]
    pub expect: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct CloseArgs {
    pub shell_id: String,
}

/// A registry error as the client reads it; an unknown id is "shell closed".
fn shell_error(e: ShellError) -> Fail {
    match e {
        ShellError::Closed(why) => format!(
            "shell closed: {}",
            why.replace("in this thread", "for this token")
        ),
        e => e.to_string(),
    }
}

fn screen_json(v: &ScreenView) -> Value {
    json!({
        "rows": v.size.0,
        "cols": v.size.1,
        "cursor": {"row": v.cursor.0 + 1, "col": v.cursor.1 + 1},
        "alternate": v.alternate,
        "text": v.text(),
    })
}

impl Tools {
    pub(super) async fn shell_open(
        &self,
        ctx: &RequestContext<RoleServer>,
        args: OpenArgs,
    ) -> Result<CallToolResult, Fail> {
        let token = Self::caller(ctx)?;
        let _slot = self.slot(&token)?;
        let place = place_of(&args.target);
        self.route(&token, &place, "shell_open").await?;
        let (ws, risky) = self.shell_allowed(&token, &place, "shell_open").await?;
        let section = token.section();
        let deps = &self.deps;
        let host = match &place {
            // Locally the shell works in the section's workspace, as commands do.
            Place::Local => deps.exec.local_pty_host_in(
                &section,
                std::path::Path::new(&ws.dir),
                ws.permission > Permission::Read,
                shell_prelude(ws.permission),
            ),
            Place::Target(_) => deps.exec.pty_host(&section, &place).await,
        }
        .map_err(|e| e.to_string())?;
        let d = OpenOpts::default();
        let opts = OpenOpts {
            rows: args.rows.unwrap_or(d.rows),
            cols: args.cols.unwrap_or(d.cols),
            term: d.term,
            risky_allowed: risky == Risky::Allow,
        };
        let info = self
            .bounded(ctx, deps.exec.shells.open(host, &token.key(), opts))
            .await?
            .map_err(shell_error)?;
        self.shell_audit(
            &token,
            &place,
            "shell.open",
            json!({"shell_id": info.shell_id}),
        )
        .await;
        let mut screen = screen_json(&info.screen);
        screen["text"] = json!(self.masked(&info.screen.text()).await?);
        Ok(CallToolResult::structured(json!({
            "shell_id": info.shell_id,
            "host": info.location,
            "end": info.end,
            "screen": screen,
        })))
    }

    pub(super) async fn shell_write(
        &self,
        ctx: &RequestContext<RoleServer>,
        args: WriteArgs,
    ) -> Result<CallToolResult, Fail> {
        let token = Self::caller(ctx)?;
        let _slot = self.slot(&token)?;
        let place = self
            .shell_place(&token, &args.shell_id, "shell_write")
            .await?;
        let entering = self.judge_lines(&token, &place, &args).await?;
        // The row's time is the input's: a shell the input ends is audited closed after it.
        let at = chrono::Utc::now();
        self.deps
            .exec
            .shells
            .write_entered(
                &token.key(),
                &args.shell_id,
                args.data.as_bytes(),
                &entering,
            )
            .await
            .map_err(shell_error)?;
        let typed = entering.recorded(&args.data, AUDIT_INPUT_CHARS);
        self.shell_audit_at(
            &token,
            &place,
            "shell.input",
            json!({"shell_id": args.shell_id, "bytes": args.data.len(), "text": typed}),
            Some(at),
        )
        .await;
        Ok(CallToolResult::structured(json!({
            "shell_id": args.shell_id,
            "bytes": args.data.len(),
        })))
    }

    pub(super) async fn shell_read(
        &self,
        ctx: &RequestContext<RoleServer>,
        args: ReadArgs,
    ) -> Result<CallToolResult, Fail> {
        let token = Self::caller(ctx)?;
        let _slot = self.slot(&token)?;
        let mode = match args.mode.as_deref() {
            None | Some("screen") => ReadMode::Screen,
            Some("raw") => ReadMode::Raw,
            Some(_) => return Err("`mode` is screen or raw".into()),
        };
        let expect = match args.expect {
            None => None,
            Some(p) if p.len() > MAX_EXPECT => {
                return Err(format!("`expect` is longer than {MAX_EXPECT} bytes"));
            }
            Some(p) => Some(
                regex::RegexBuilder::new(&p)
                    .size_limit(1 << 20)
                    .build()
                    .map_err(|e| format!("`expect` is not a valid regex: {e}"))?,
            ),
        };
        self.shell_place(&token, &args.shell_id, "shell_read")
            .await?;
        let opts = ReadOpts {
            mode,
            since: args.since,
            wait: Duration::from_millis(args.wait_ms.unwrap_or(0)).min(self.deps.tool_timeout),
            expect,
        };
        let cancel = ctx.ct.child_token();
        let r: ShellRead = self
            .deps
            .exec
            .shells
            .read(&token.key(), &args.shell_id, opts, &cancel)
            .await
            .map_err(shell_error)?;
        if r.cancelled {
            return Err("cancelled".into());
        }
        let mut out = json!({
            "shell_id": args.shell_id,
            "host": r.location,
            "end": r.end,
            "matched": r.matched,
            "ended": r.ended,
        });
        if let Some(v) = &r.screen {
            let mut screen = screen_json(v);
            screen["text"] = json!(self.masked(&v.text()).await?);
            out["screen"] = screen;
        }
        if let Some(raw) = &r.raw {
            out["raw"] = json!({
                "text": self.masked(&raw.text).await?,
                "next": raw.next,
                "more": raw.more,
                "dropped": raw.dropped,
            });
        }
        Ok(CallToolResult::structured(out))
    }

    pub(super) async fn shell_close(
        &self,
        ctx: &RequestContext<RoleServer>,
        args: CloseArgs,
    ) -> Result<CallToolResult, Fail> {
        let token = Self::caller(ctx)?;
        let key = token.key();
        let shells = &self.deps.exec.shells;
        // Closing only takes access away: it needs nothing of the target but that the shell
        // is this token's.
        let host = shells.host(&key, &args.shell_id).map_err(shell_error)?;
        shells.close(&key, &args.shell_id).map_err(shell_error)?;
        self.shell_audit(
            &token,
            &place_of(&host),
            "shell.close",
            json!({"shell_id": args.shell_id}),
        )
        .await;
        Ok(CallToolResult::structured(
            json!({"shell_id": args.shell_id, "closed": true}),
        ))
    }

    pub(super) async fn shell_list(
        &self,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, Fail> {
        let token = Self::caller(ctx)?;
        let open = self.deps.exec.shells.list(&token.key());
        // Each host is checked once (a token holds a few shells, `pty::PER_SECTION`); a shell on
        // a host it may not reach now is listed without what its screen shows.
        let mut refused: HashMap<String, Option<String>> = HashMap::new();
        for s in &open {
            if !refused.contains_key(&s.host) {
                let why = self
                    .route(&token, &place_of(&s.host), "shell_list")
                    .await
                    .err();
                refused.insert(s.host.clone(), why);
            }
        }
        let shells: Vec<Value> = open
            .into_iter()
            .map(|s| match refused.get(&s.host).cloned().flatten() {
                None => json!({
                    "shell_id": s.shell_id,
                    "host": s.location,
                    "rows": s.size.0,
                    "cols": s.size.1,
                    "idle_s": s.idle.as_secs(),
                    "prompt": s.prompt.trim_end(),
                }),
                Some(why) => json!({
                    "shell_id": s.shell_id,
                    "host": s.location,
                    "refused": why,
                }),
            })
            .collect();
        Ok(CallToolResult::structured(json!({ "shells": shells })))
    }

    /// Where an open shell of the token runs, once the rules still allow a shell there: the
    /// token may still reach it (every hop approved and among its targets) and still have a
    /// shell there — read afresh at every call, so a target disabled since stops the next one.
    async fn shell_place(&self, token: &Token, shell_id: &str, tool: &str) -> Result<Place, Fail> {
        let host = self
            .deps
            .exec
            .shells
            .host(&token.key(), shell_id)
            .map_err(shell_error)?;
        let place = place_of(&host);
        self.route(token, &place, tool).await?;
        self.shell_allowed(token, &place, tool).await?;
        Ok(place)
    }

    /// Whether the token may have a shell on `place` now (its workspace there, read for the
    /// caller); a refusal is audited.
    async fn shell_allowed(
        &self,
        token: &Token,
        place: &Place,
        tool: &str,
    ) -> Result<(crate::workspace::Workspace, Risky), Fail> {
        let deps = &self.deps;
        let section = token.section();
        let mut ws = crate::workspace::current(&deps.db, &deps.workspaces, &section, place)
            .await
            .map_err(|e| format!("{e:#}"))?;
        ws.permission = super::permission(&ws, token);
        let raise = format!(
            "this token's on `{}` is `{}`; an operator can issue a token with `--permission full` where the target's maximum is `full`",
            place.name(),
            ws.permission
        );
        let risky = deps
            .gate()
            .shell_allowed(
                &super::caller(token, &section, tool),
                place,
                place.name(),
                ws.permission,
                &raise,
            )
            .await?;
        Ok((ws, risky))
    }

    /// Judges the lines a write would submit, as `exec` judges a command, at the token's
    /// permission in the directory of the program that reads them: one refused, or asked about
    /// where the policy does not allow that, stops the write before anything is sent (audited).
    /// Returns what the write is to be sent with.
    async fn judge_lines(
        &self,
        token: &Token,
        place: &Place,
        args: &WriteArgs,
    ) -> Result<Entering, Fail> {
        let entering = self
            .deps
            .exec
            .shells
            .entering(&token.key(), &args.shell_id, args.data.as_bytes())
            .await
            .map_err(shell_error)?;
        let judged_in = if needs_judging(place, &entering) {
            let here = self.here(token, place.name(), "shell_write").await?;
            Some(JudgedIn {
                permission: here.at.permission,
                workspace: here.at.workspace.clone(),
                home: here.at.ops.backend().home().await.ok(),
            })
        } else {
            None
        };
        let section = token.section();
        let typed = self
            .deps
            .gate()
            .typed(
                &super::caller(token, &section, "shell_write"),
                (place, place.name(), &args.shell_id),
                &entering,
                judged_in.as_ref(),
                false,
            )
            .await?;
        match typed {
            Typed::Send => Ok(entering),
            // An MCP call does not wait for a person.
            Typed::Ask(a) => Err(format!(
                "nothing was sent to {}: the line `{}` it would submit: {}",
                args.shell_id,
                crate::gate::clip(a.lines.lines().next().unwrap_or_default(), 200),
                super::approval_needed(place, &a.reason)
            )),
        }
    }

    async fn shell_audit(&self, token: &Token, place: &Place, action: &str, detail: Value) {
        self.shell_audit_at(token, place, action, detail, None)
            .await
    }

    /// [`Self::shell_audit`] of what happened at `at` (`None`: the commit's time).
    async fn shell_audit_at(
        &self,
        token: &Token,
        place: &Place,
        action: &str,
        detail: Value,
        at: Option<chrono::DateTime<chrono::Utc>>,
    ) {
        let section = token.section();
        let mut detail = detail;
        detail["via"] = json!("mcp");
        let entry = crate::audit::ChatEntry {
            actor: &token.name,
            action,
            section: Some(&section),
            target: place.target(),
            outcome: "ok",
            detail,
        };
        let audited = async {
            let mut conn = self.deps.db.acquire().await?;
            crate::audit::record_chat_at(&mut conn, entry, at).await
        };
        if let Err(e) = audited.await {
            tracing::warn!(section.id = %section, error = %e, "auditing an MCP shell call failed");
        }
    }
}

/// How often the shells of tokens revoked or expired since are looked for: a revocation
/// (made by `sshmode mcp token revoke`, in another process) closes them within this.
pub const SWEEP_EVERY: Duration = crate::mcp::fresh::FRESH;

/// Why a sweep closed a shell.
const TOKEN_GONE: &str = "its token was revoked or has expired";

impl Tools {
    /// Closes the shells of every token that no longer checks out (revoked or expired): one
    /// read of the tokens holding shells in this process (none when no MCP shell is open).
    /// Each closed shell is an audit row (`shell.close`, actor `system`). The number closed.
    pub async fn close_shells_of_gone_tokens(&self) -> sqlx::Result<usize> {
        let shells = &self.deps.exec.shells;
        let keys = shells.sections("mcp:");
        let ids: Vec<String> = keys
            .iter()
            .filter_map(|k| crate::mcp::token::split_key(k).map(|(_, id)| id.to_string()))
            .collect();
        if ids.is_empty() {
            return Ok(0);
        }
        let live = crate::mcp::token::live(&self.deps.db, &ids, self.deps.clock.now()).await?;
        let mut closed = 0;
        for key in &keys {
            let Some((section, id)) = crate::mcp::token::split_key(key) else {
                continue;
            };
            if live.contains(id) {
                continue;
            }
            let name = section.strip_prefix("mcp:").unwrap_or(section);
            for (shell_id, host) in shells.close_every(key, TOKEN_GONE) {
                closed += 1;
                let place = place_of(&host);
                let entry = crate::audit::ChatEntry {
                    actor: "system",
                    action: "shell.close",
                    section: Some(section),
                    target: place.target(),
                    outcome: "ok",
                    detail: json!({
                        "shell_id": shell_id, "via": "mcp", "token": name, "reason": TOKEN_GONE,
                    }),
                };
                let mut conn = self.deps.db.acquire().await?;
                crate::audit::record_chat(&mut conn, entry).await?;
            }
        }
        Ok(closed)
    }
}

/// Runs [`Tools::close_shells_of_gone_tokens`] every [`SWEEP_EVERY`] until `shutdown`; spawn
/// it on the app's task tracker.
pub async fn run_sweeper(tools: std::sync::Arc<Tools>, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(SWEEP_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        if let Err(e) = tools.close_shells_of_gone_tokens().await {
            tracing::warn!(error = %e, "closing the shells of revoked MCP tokens failed; trying again");
        }
    }
}
