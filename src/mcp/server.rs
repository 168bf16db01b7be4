//! The MCP tools: `host_list`, `exec`, `read_file`, `write_file`, `search_files`, and the
//! interactive shells ([`shells`]). Every call names its target or its `shell_id` (explicit
//! handles, no session state), is checked against the caller's token (the target and every
//! jump host on its way among its targets and approved), takes a place among the calls running
//! at once (the token's own bound first, then the endpoint's), and runs through [`Ops`]
//! in the token's section, as the chat's task tools do: the workspace permission (the section's
//! choice capped by the token's `--permission`, or without a choice the token's permission
//! capped by the target's maximum), the judge, the guard, the secret scanner on what comes
//! back (secrets masked), and an audit row with the token's name as actor.
//!
//! A failure is a tool result with `isError` and a sentence saying what to do, never an
//! internal dump.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolResult, ContentBlock, Implementation, ProgressNotificationParam, ServerCapabilities,
    ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, schemars, tool, tool_handler, tool_router};
use serde::Deserialize;
use serde_json::json;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::McpDeps;
use super::fresh::Fresh;
use super::token::Token;
use crate::bash::Verdict;

use crate::exec::ops::{ReadRange, SearchRequest, SearchTarget};
use crate::exec::{Exit, Place};
use crate::gate::{self, Caller, Done, Outcome};
use crate::workspace::{Permission, Workspace};

mod shells;

pub use shells::{SWEEP_EVERY, run_sweeper};

/// How often a long call reports progress, at most.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);
/// Most variables one `exec` may set.
const MAX_ENV: usize = 32;

/// The tools' shared state, built once: the core's handles, the bounds on calls running at
/// once (in all and per token), and the tool table.
pub struct Tools {
    deps: McpDeps,
    calls: Semaphore,
    /// Calls running now per token ([`Token::key`]); a token at zero has no entry.
    running: Arc<std::sync::Mutex<std::collections::HashMap<String, usize>>>,
    router: ToolRouter<Server>,
    /// Each token's resolved places, by ([`Token::key`], target), reused for
    /// [`FRESH`](super::fresh::FRESH).
    places: Fresh<(String, String), Arc<Placed>>,
}

impl Tools {
    pub fn new(deps: McpDeps) -> Tools {
        let calls = Semaphore::new(deps.config.max_calls.max(1));
        Tools {
            deps,
            calls,
            running: Arc::default(),
            router: Server::tool_router(),
            places: Fresh::default(),
        }
    }
}

/// One MCP service instance (one per session, or per stateless request) over the shared
/// [`Tools`].
#[derive(Clone)]
pub struct Server {
    tools: Arc<Tools>,
}

impl Server {
    pub fn new(tools: Arc<Tools>) -> Server {
        Server { tools }
    }
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct ExecArgs {
    /// A target alias from host_list (`local` only where the token allows it).
    pub target: String,
    /// The shell command (bash), run in the token's working directory on that target.
    pub command: String,
    /// A directory to run in for this call only.
    #[serde(default)]
    pub workdir: Option<String>,
    /// Extra environment variables for this command. Below the workspace permission `full`
    /// only LANG, LANGUAGE, LC_*, TZ, TERM, COLORTERM, COLUMNS, LINES, NO_COLOR and names the
    /// operator allows.
    #[serde(default)]
    pub env: Option<std::collections::BTreeMap<String, String>>,
    /// Timeout in milliseconds (capped by the service's tool timeout).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct ReadArgs {
    pub target: String,
    /// Absolute, `~/…`, or relative to the working directory.
    pub path: String,
    /// First line to read (1-based).
    #[serde(default)]
    pub offset: Option<u64>,
    /// Lines to read.
    #[serde(default)]
    pub limit: Option<u64>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct WriteArgs {
    pub target: String,
    pub path: String,
    /// The whole new content (the file is replaced atomically).
    pub content: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct SearchArgs {
    pub target: String,
    /// A regex (content search) or a glob (file-name search).
    pub pattern: String,
    /// Where to search; default the working directory.
    #[serde(default)]
    pub path: Option<String>,
    /// `content` (default) or `files`.
    #[serde(default)]
    pub kind: Option<String>,
    /// Only files whose name matches this glob (content search).
    #[serde(default)]
    pub file_glob: Option<String>,
    /// Most results (default 100, at most 1000).
    #[serde(default)]
    pub max_results: Option<u64>,
}

/// A tool's failure: the text the client gets (`isError`).
type Fail = String;

fn fail(text: impl Into<String>) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(text.into())])
}

fn done(r: Result<CallToolResult, Fail>) -> Result<CallToolResult, ErrorData> {
    Ok(r.unwrap_or_else(fail))
}

#[tool_router]
impl Server {
    #[tool(
        description = "The hosts this token may use: each target's alias, where it is (user@host), and whether it is usable now (it and every jump host on its way approved and among the token's targets). `local` is the service's own machine, listed only for tokens made with --local."
    )]
    async fn host_list(
        &self,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        done(self.tools.host_list(&ctx).await)
    }

    #[tool(
        description = "Runs a shell command on a target and returns {host, exit_code, stdout, stderr} (long output keeps its head and tail). Passes the command guard and the workspace permission; a command the guard would ask a person about is refused with the approval it needs. Sends progress notifications while it runs when the request has a progress token; cancellation stops the command."
    )]
    async fn exec(
        &self,
        Parameters(args): Parameters<ExecArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        done(self.tools.exec(&ctx, args).await)
    }

    #[tool(
        description = "Reads a text file on a target (optionally `limit` lines from line `offset`); says so when it is binary."
    )]
    async fn read_file(
        &self,
        Parameters(args): Parameters<ReadArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        done(self.tools.read_file(&ctx, args).await)
    }

    #[tool(
        description = "Writes a whole file on a target (atomically, parent directories created), inside the workspace unless the permission is full."
    )]
    async fn write_file(
        &self,
        Parameters(args): Parameters<WriteArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        done(self.tools.write_file(&ctx, args).await)
    }

    #[tool(
        description = "Searches a target: lines matching a regex (`kind` content, default) as path:line:text, or file names matching a glob (`kind` files)."
    )]
    async fn search_files(
        &self,
        Parameters(args): Parameters<SearchArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        done(self.tools.search_files(&ctx, args).await)
    }

    #[tool(
        description = "Opens an interactive shell (a terminal) on a target and returns its shell_id and first screen; it keeps its directory and variables until shell_close (or 30 min idle). On a target it needs the workspace permission full. A shell lives in one service process: after a restart its id is closed."
    )]
    async fn shell_open(
        &self,
        Parameters(args): Parameters<shells::OpenArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        done(self.tools.shell_open(&ctx, args).await)
    }

    #[tool(
        description = "Types into a shell: raw input, `\\r` for Enter, `\\u0003` for Ctrl-C, `\\u0004` for Ctrl-D. At a password prompt only Enter, Ctrl-C or Ctrl-D are sent: a secret is never typed."
    )]
    async fn shell_write(
        &self,
        Parameters(args): Parameters<shells::WriteArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        done(self.tools.shell_write(&ctx, args).await)
    }

    #[tool(
        description = "Reads a shell: mode `screen` (default) is the visible screen, the cursor and whether a full-screen program is on; `raw` the output since `since` (default where the last raw read stopped). With `wait_ms` it waits until `expect` (a regex) matches, or without one until new output settles."
    )]
    async fn shell_read(
        &self,
        Parameters(args): Parameters<shells::ReadArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        done(self.tools.shell_read(&ctx, args).await)
    }

    #[tool(description = "Closes a shell (its programs get a hangup).")]
    async fn shell_close(
        &self,
        Parameters(args): Parameters<shells::CloseArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        done(self.tools.shell_close(&ctx, args).await)
    }

    #[tool(
        description = "Lists this token's open shells: shell_id, host, size, idle time, prompt."
    )]
    async fn shell_list(
        &self,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        done(self.tools.shell_list(&ctx).await)
    }
}

/// The workspace permission a token's calls get in `ws`: the section's choice capped by the
/// token's, or, where the section chose none, the token's (its `--permission` is the default)
/// capped by the backend's maximum.
fn permission(ws: &Workspace, token: &Token) -> Permission {
    match ws.set {
        Some(_) => ws.permission.min(token.permission),
        None => token.permission.min(ws.max),
    }
}

#[tool_handler(router = self.tools.router)]
impl ServerHandler for Server {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("sshmode", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "sshmode runs commands and file operations on the SSH targets its admins approved. \
                 Call host_list first; every other tool names its target. The command guard, the \
                 workspace permission and the audit trail apply to every call.",
            )
    }
}

/// Where one call runs: the gate's resolved place (the backend's operations, the workspace
/// and the permission enforced). Reused by the token's calls on that target for
/// [`FRESH`](super::fresh::FRESH) ([`Tools::here`]).
struct Placed {
    at: gate::At,
    /// The token's own permission this was resolved for.
    token_permission: Permission,
    /// Where the section's first command there starts: its stored directory, or the workspace.
    start: String,
}

/// The gate's view of a token's call of `tool`.
fn caller<'a>(token: &'a Token, section: &'a str, tool: &'a str) -> Caller<'a> {
    Caller {
        actor: &token.name,
        section,
        via: "mcp",
        tool,
    }
}

impl Tools {
    /// The caller: the token the bearer check put on the request.
    fn caller(ctx: &RequestContext<RoleServer>) -> Result<Token, Fail> {
        ctx.extensions
            .get::<axum::http::request::Parts>()
            .and_then(|p| p.extensions.get::<Token>())
            .cloned()
            .ok_or_else(|| "this request carries no token".to_string())
    }

    async fn host_list(&self, ctx: &RequestContext<RoleServer>) -> Result<CallToolResult, Fail> {
        let token = Self::caller(ctx)?;
        let targets = crate::target::list(&self.deps.db)
            .await
            .map_err(|e| format!("the target registry cannot be read now: {e}"))?;
        let mut hosts: Vec<serde_json::Value> = Vec::new();
        if token.local {
            hosts.push(
                json!({"target": "local", "location": "the service's own machine", "usable": true}),
            );
        }
        let by_alias: std::collections::HashMap<&str, &crate::target::Target> =
            targets.iter().map(|t| (t.alias.as_str(), t)).collect();
        for t in targets.iter().filter(|t| token.may_use(&t.alias)) {
            // The target, then its jump hosts outwards (one past the most the pool follows).
            let mut path = vec![t.clone()];
            while let Some(next) = path.last().and_then(|h| h.jump.as_deref())
                && path.len() <= crate::target::MAX_HOPS + 1
            {
                match by_alias.get(next) {
                    Some(hop) => path.push((*hop).clone()),
                    None => break,
                }
            }
            hosts.push(json!({
                "target": t.alias,
                "location": t.location(),
                "description": t.description,
                "usable": refused_route(&token, &path).is_none(),
            }));
        }
        Ok(CallToolResult::structured(json!({ "hosts": hosts })))
    }

    /// Checks the token's right to `target`, reads the section's workspace there, judges
    /// `tool` at the permission enforced, and makes the backend's operations.
    ///
    /// A resolution is reused by the token's next calls on that target for [`FRESH`](super::fresh::FRESH): a
    /// target disabled, a maximum lowered or a workspace chosen since reaches them within it.
    async fn here(&self, token: &Token, target: &str, tool: &str) -> Result<Arc<Placed>, Fail> {
        let deps = &self.deps;
        if !token.may_use(target) {
            let text = not_its_target(token, target);
            self.refused(
                token,
                &place_of(target),
                tool,
                "token",
                Verdict::Refuse,
                &text,
            )
            .await;
            return Err(text);
        }
        let section = token.section();
        let key = (token.key(), target.to_string());
        let here = match self.places.get(&key, Instant::now()) {
            Some(h) if h.token_permission == token.permission => h,
            _ => {
                let h = Arc::new(self.resolve(token, target, tool).await?);
                self.places.put(key, h.clone(), Instant::now());
                h
            }
        };
        self.deps
            .gate()
            .check_tool(
                &caller(token, &section, tool),
                &here.at.place,
                &here.at.location,
                here.at.permission,
            )
            .await?;
        // A section's first call here starts in the workspace.
        let backend = here.at.ops.backend().name();
        if deps.exec.cwds().get(backend, &section).is_none() {
            deps.exec.cwds().set(backend, &section, here.start.clone());
        }
        Ok(here)
    }

    /// [`Tools::here`] from the database and the backend.
    async fn resolve(&self, token: &Token, target: &str, tool: &str) -> Result<Placed, Fail> {
        let deps = &self.deps;
        let place = place_of(target);
        self.route(token, &place, tool).await?;
        let section = token.section();
        let ws = crate::workspace::current(&deps.db, &deps.workspaces, &section, &place)
            .await
            .map_err(|e| format!("{e:#}"))?;
        let permission = permission(&ws, token);
        let location = match &place {
            Place::Local => "local".to_string(),
            Place::Target(alias) => crate::target::get(&deps.db, alias)
                .await
                .map(|t| t.location())
                .unwrap_or_else(|_| alias.clone()),
        };
        // Refused before the backend is reached.
        deps.gate()
            .check_tool(
                &caller(token, &section, tool),
                &place,
                &location,
                permission,
            )
            .await?;
        let ops = match &place {
            Place::Local => deps.exec.local_ops_in(
                &section,
                std::path::Path::new(&ws.dir),
                permission > Permission::Read,
            ),
            Place::Target(_) => deps.exec.ops_for(&section, &place).await,
        }
        .map_err(|e| e.to_string())?;
        let location = match &place {
            Place::Local => location,
            Place::Target(_) => ops.backend().location(),
        };
        let workspace = ops.resolve(&ws.dir).await.map_err(|e| e.to_string())?;
        Ok(Placed {
            start: ws.cwd.unwrap_or_else(|| workspace.clone()),
            at: gate::At {
                place,
                location,
                ops,
                workspace,
                permission,
            },
            token_permission: token.permission,
        })
    }

    /// Whether `token` may reach `place` now: it may use the target and every jump host on
    /// the way there, and each of them is approved (a chain longer than the pool follows is
    /// refused as the pool refuses it). One read of the registry; a refusal is audited.
    async fn route(&self, token: &Token, place: &Place, tool: &str) -> Result<(), Fail> {
        let why = match place {
            Place::Local => (!token.may_use("local")).then(|| not_its_target(token, "local")),
            Place::Target(alias) if !token.may_use(alias) => Some(not_its_target(token, alias)),
            Place::Target(alias) => match crate::target::path(&self.deps.db, alias).await {
                Ok(path) => refused_route(token, &path),
                Err(crate::target::TargetError::NotFound(_)) => Some(format!(
                    "there is no target `{alias}`; host_list shows the targets this token may use"
                )),
                Err(e) => return Err(format!("the target registry cannot be read now: {e}")),
            },
        };
        match why {
            None => Ok(()),
            Some(text) => {
                self.refused(token, place, tool, "target", Verdict::Refuse, &text)
                    .await;
                Err(text)
            }
        }
    }

    async fn exec(
        &self,
        ctx: &RequestContext<RoleServer>,
        args: ExecArgs,
    ) -> Result<CallToolResult, Fail> {
        let token = Self::caller(ctx)?;
        let _slot = self.slot(&token)?;
        let here = self.here(&token, &args.target, "terminal").await?;
        let env: Vec<(String, String)> = args.env.unwrap_or_default().into_iter().collect();
        if env.len() > MAX_ENV {
            return Err(format!("at most {MAX_ENV} variables in `env`"));
        }
        let tool = gate::Tool::Terminal {
            command: args.command.clone(),
            workdir: args.workdir,
            env,
            timeout: args.timeout_ms.map(Duration::from_millis),
        };
        let started = Instant::now();
        let cancel = ctx.ct.child_token();
        let (ran, section) = self
            .through(ctx, &token, &here, "exec", tool, &cancel)
            .await;
        let ran = ran?;
        let masked = ran.masked;
        let Done::Command { output: out, cwd } = ran.done else {
            return Err("the command returned no output".into());
        };
        let (exit_code, outcome) = match &out.exit {
            Exit::Code(c) => (
                Some(*c),
                if *c == 0 {
                    "ok".to_string()
                } else {
                    format!("exit {c}")
                },
            ),
            Exit::Signal(s) => (None, format!("signal {s}")),
            Exit::TimedOut => (None, "timed out".into()),
            Exit::Cancelled => (None, "cancelled".into()),
        };
        let row = gate::command_row(
            &caller(&token, &section, "exec"),
            here.at.place.target(),
            &args.command,
            &outcome,
            json!({
                "duration_ms": started.elapsed().as_millis() as u64,
                "masked": (!masked.is_empty()).then_some(&masked),
            }),
        );
        self.audit_command(&section, &row).await;
        let mut result = json!({
            "host": here.at.ops.backend().location(),
            "exit_code": exit_code,
            "stdout": String::from_utf8_lossy(&out.stdout),
            "stderr": String::from_utf8_lossy(&out.stderr),
            "cwd": cwd,
        });
        if exit_code.is_none() {
            result["ended"] = json!(outcome);
            if let Some(note) = &out.stop_note {
                result["stop_note"] = json!(note);
            }
        }
        Ok(CallToolResult::structured(result))
    }

    /// Runs `tool` through the gate at `here` for `token`, with progress notifications while
    /// it runs; what a person would be asked about is refused with how to get it allowed (an
    /// MCP call does not wait for a person). Also returns the token's section.
    async fn through(
        &self,
        ctx: &RequestContext<RoleServer>,
        token: &Token,
        here: &Placed,
        name: &str,
        tool: gate::Tool,
        cancel: &CancellationToken,
    ) -> (Result<gate::Ran, Fail>, String) {
        let section = token.section();
        let gate = self.deps.gate();
        let who = caller(token, &section, name);
        let call = gate.call(&who, &here.at, tool, false, None, cancel);
        let r = match with_progress(ctx, cancel, call).await {
            Outcome::Ran(ran) => Ok(ran),
            Outcome::Asked(a) => Err(approval_needed(&here.at.place, &a.reason)),
            Outcome::Refused(text) | Outcome::Failed(text) => Err(text),
        };
        (r, section)
    }

    async fn read_file(
        &self,
        ctx: &RequestContext<RoleServer>,
        args: ReadArgs,
    ) -> Result<CallToolResult, Fail> {
        let token = Self::caller(ctx)?;
        let _slot = self.slot(&token)?;
        let here = self.here(&token, &args.target, "read_file").await?;
        let range = match (args.offset, args.limit) {
            (None, None) => ReadRange::Whole,
            (start, count) => ReadRange::Lines {
                start: start.unwrap_or(1),
                count: count.unwrap_or(2000),
            },
        };
        let tool = gate::Tool::Read {
            path: args.path,
            range,
        };
        let cancel = ctx.ct.child_token();
        let Done::Read(r) = self
            .through(ctx, &token, &here, "read_file", tool, &cancel)
            .await
            .0?
            .done
        else {
            return Err("the read returned nothing".into());
        };
        Ok(CallToolResult::structured(json!({
            "host": here.at.ops.backend().location(),
            "path": r.path,
            "size": r.size,
            "binary": r.binary,
            "truncated": r.truncated,
            "text": r.text,
        })))
    }

    async fn write_file(
        &self,
        ctx: &RequestContext<RoleServer>,
        args: WriteArgs,
    ) -> Result<CallToolResult, Fail> {
        let token = Self::caller(ctx)?;
        let _slot = self.slot(&token)?;
        let here = self.here(&token, &args.target, "write_file").await?;
        let tool = gate::Tool::Write {
            path: args.path,
            content: args.content,
        };
        let cancel = ctx.ct.child_token();
        let (ran, section) = self
            .through(ctx, &token, &here, "write_file", tool, &cancel)
            .await;
        let Done::Wrote { path, bytes } = ran?.done else {
            return Err("the write returned nothing".into());
        };
        if let Some(row) = gate::file_row(
            &caller(&token, &section, "write_file"),
            here.at.place.target(),
            &path,
            json!({ "bytes": bytes }),
        ) {
            self.audit_command(&section, &row).await;
        }
        Ok(CallToolResult::structured(json!({
            "host": here.at.ops.backend().location(),
            "path": path,
            "bytes": bytes,
        })))
    }

    async fn search_files(
        &self,
        ctx: &RequestContext<RoleServer>,
        args: SearchArgs,
    ) -> Result<CallToolResult, Fail> {
        let token = Self::caller(ctx)?;
        let _slot = self.slot(&token)?;
        let here = self.here(&token, &args.target, "search_files").await?;
        let target = match args.kind.as_deref() {
            None | Some("content") => SearchTarget::Content,
            Some("files") => SearchTarget::Files,
            Some(_) => return Err("`kind` is content or files".into()),
        };
        let tool = gate::Tool::Search(SearchRequest {
            pattern: args.pattern,
            path: args.path,
            target,
            file_glob: args.file_glob,
            max_results: args.max_results.unwrap_or(100) as usize,
        });
        let cancel = ctx.ct.child_token();
        let Done::Found(r) = self
            .through(ctx, &token, &here, "search_files", tool, &cancel)
            .await
            .0?
            .done
        else {
            return Err("the search returned nothing".into());
        };
        Ok(CallToolResult::structured(json!({
            "host": here.at.ops.backend().location(),
            "matches": r.matches,
            "truncated": r.truncated,
        })))
    }

    /// A place among the calls running at once — the token's own first (so one token never
    /// takes every place), then the endpoint's — or a clear "busy".
    fn slot(&self, token: &Token) -> Result<Slot<'_>, Fail> {
        let key = token.key();
        let most = self.deps.config.max_calls_per_token.max(1);
        {
            let mut running = self.running.lock().expect("mcp calls lock");
            let n = running.entry(key.clone()).or_default();
            if *n >= most {
                tracing::warn!(mcp.token = %token.name, mcp.max_calls_per_token = most, "an MCP token's call bound reached");
                return Err(format!(
                    "the token `{}` is running {most} MCP calls already, the most one token may run at once; try again when one has finished",
                    token.name
                ));
            }
            *n += 1;
        }
        let mine = TokenCall {
            running: self.running.clone(),
            key,
        };
        let permit = self.calls.try_acquire().map_err(|_| {
            format!(
                "sshmode is running {} MCP calls already; try again shortly",
                self.deps.config.max_calls
            )
        })?;
        Ok(Slot {
            _permit: permit,
            _mine: mine,
        })
    }

    /// A shell operation within the tool timeout (plus a margin), dropped on cancellation.
    async fn bounded<T>(
        &self,
        ctx: &RequestContext<RoleServer>,
        op: impl Future<Output = T>,
    ) -> Result<T, Fail> {
        let outer = self.deps.tool_timeout + Duration::from_secs(15);
        tokio::select! {
            r = tokio::time::timeout(outer, op) => r.map_err(|_| format!("the call did not finish within {} s and was abandoned", outer.as_secs())),
            _ = ctx.ct.cancelled() => Err("cancelled".into()),
        }
    }

    /// A text handed back with its secrets masked (as every tool result is, by the gate).
    async fn masked(&self, text: &str) -> Result<String, Fail> {
        self.deps.gate().masked(text).await
    }

    /// Writes the audit row of a command that ran (built by the gate).
    async fn audit_command(&self, section: &str, run: &crate::audit::CommandRun) {
        let audited = async {
            let mut conn = self.deps.db.acquire().await?;
            crate::audit::record_command(&mut conn, section, run).await
        };
        if let Err(e) = audited.await {
            tracing::warn!(section.id = %section, error = %e, "auditing an MCP command failed");
        }
    }

    /// Audits a refused call (by the token, the target, the workspace permission or the
    /// guard), through the gate.
    async fn refused(
        &self,
        token: &Token,
        place: &Place,
        tool: &str,
        by: &str,
        verdict: Verdict,
        reason: &str,
    ) {
        let section = token.section();
        let location = match place {
            Place::Local => "local",
            Place::Target(alias) => alias,
        };
        self.deps
            .gate()
            .audit_refusal(
                &caller(token, &section, tool),
                place,
                location,
                by,
                verdict,
                reason,
            )
            .await;
    }
}

/// A call's places among those running at once: given back when it ends.
struct Slot<'a> {
    _permit: tokio::sync::SemaphorePermit<'a>,
    _mine: TokenCall,
}

/// One of a token's calls running now; counted down on drop (an entry at zero is removed, so
/// the map holds only tokens with calls running).
struct TokenCall {
    running: Arc<std::sync::Mutex<std::collections::HashMap<String, usize>>>,
    key: String,
}

impl Drop for TokenCall {
    fn drop(&mut self) {
        let mut running = self.running.lock().expect("mcp calls lock");
        if let Some(n) = running.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                running.remove(&self.key);
            }
        }
    }
}

/// Runs `op`, sending a progress notification at most every [`PROGRESS_EVERY`] while it runs
/// when the client asked for progress; a cancelled request cancels `cancel`, which the
/// operation honours.
async fn with_progress<T>(
    ctx: &RequestContext<RoleServer>,
    cancel: &CancellationToken,
    op: impl Future<Output = T>,
) -> T {
    let Some(progress) = ctx.meta.get_progress_token() else {
        return op.await;
    };
    let started = Instant::now();
    let mut ticks =
        tokio::time::interval_at(tokio::time::Instant::now() + PROGRESS_EVERY, PROGRESS_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    tokio::pin!(op);
    loop {
        tokio::select! {
            r = &mut op => return r,
            _ = ticks.tick(), if !cancel.is_cancelled() => {
                let secs = started.elapsed().as_secs();
                let note = ProgressNotificationParam::new(progress.clone(), secs as f64)
                    .with_message(format!("running for {secs} s"));
                // A client that went away is no reason to stop the command: its cancellation is.
                let _ = ctx.peer.notify_progress(note).await;
            }
        }
    }
}

/// A place by its name in a call: `local`, or a target alias.
fn place_of(target: &str) -> Place {
    match target {
        "local" => Place::Local,
        alias => Place::Target(alias.to_string()),
    }
}

/// The refusal of a target (or `local`) the token was not issued for.
fn not_its_target(token: &Token, target: &str) -> String {
    format!(
        "the token `{}` may not use `{target}`; host_list shows the targets it may use",
        token.name
    )
}

/// Why `token` may not take `path` (a target, then its jump hosts outwards), if it may not:
/// every hop must be among its targets and approved.
fn refused_route(token: &Token, path: &[crate::target::Target]) -> Option<String> {
    use crate::target::{MAX_HOPS, Status};
    let alias = &path.first()?.alias;
    if path.len() > MAX_HOPS + 1 {
        return Some(format!(
            "`{alias}` is reached through more than {MAX_HOPS} jump hosts (or its jump hosts form a loop)"
        ));
    }
    for (i, hop) in path.iter().enumerate() {
        let what = if i == 0 {
            format!("`{alias}`")
        } else {
            format!("its jump host `{}`", hop.alias)
        };
        if i > 0 && !token.may_use(&hop.alias) {
            return Some(format!(
                "`{alias}` is reached through the jump host `{}`, which the token `{}` may not use: every jump host on the way must be among its targets (an operator can issue a token with `--targets {alias},{}`)",
                hop.alias, token.name, hop.alias
            ));
        }
        match hop.status {
            Status::Approved => {}
            Status::Pending => {
                return Some(format!("{what} is pending; an admin must approve it first"));
            }
            Status::Disabled => return Some(format!("{what} is disabled")),
        }
    }
    None
}

/// The error an MCP client gets for what the guard asks a person about (an MCP call does not
/// wait for a person).
fn approval_needed(place: &Place, reason: &str) -> String {
    format!(
        "approval needed: the command guard asks a person before this runs on `{name}` ({reason}). An MCP call cannot wait for that approval: run it from a chat where an admin can approve it, or have an operator allow such commands on the target (`sshmode target set {name} --risky allow`).",
        name = place.name()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `exec`'s schema tells a client every variable it may set below `full`.
    #[test]
    fn the_exec_schema_names_the_variables_allowed_below_full() {
        let schema = serde_json::to_string(&schemars::schema_for!(ExecArgs)).unwrap();
        for name in crate::workspace::judge::built_in_env_names() {
            assert!(schema.contains(name), "{name}: {schema}");
        }
    }
}
