//! The MCP front-end: the same targets, vault, guard, workspace permissions and audit trail as
//! the chat, for any Model Context Protocol client, over Streamable HTTP at `/mcp` on its own
//! listener (`SSHMODE_MCP_LISTEN`; off when unset), never on the public one that serves Lark.
//!
//! - [`router`]: the official SDK's (`rmcp`) Streamable HTTP service mounted as a tower service,
//!   behind the bearer check ([`auth`]), which runs before anything of the request is parsed.
//!   Both protocol eras are served: the 2025 revisions (`initialize` issues an
//!   `Mcp-Session-Id`; POST, GET stream, DELETE) and the stateless one (POST only). `Host` is
//!   checked against the allowed hosts (the DNS-rebinding guard) and any `Origin` against the
//!   allowed origins (none by default: a browser page is refused).
//! - [`token`]: tokens, stored as SHA-256 digests, each limited to its targets (which must also
//!   be approved; a target behind jump hosts needs each of them among its targets too), to
//!   `local` only with `--local`, to a highest workspace permission, and to its expiry; [`cli`]
//!   is `sshmode mcp token …`. What a token holds in this process — its shells, its resolved
//!   places, its share of the bounds — is keyed by its id ([`token::Token::key`]), so a token
//!   issued again under a revoked one's name starts with none of it; a sweep closes the shells
//!   of tokens revoked (by the CLI, in another process) or expired within
//!   [`server::SWEEP_EVERY`].
//! - [`server`]: the tools (`host_list`, `exec`, `read_file`, `write_file`, `search_files`,
//!   and the interactive shells `shell_open|write|read|close|list` over
//!   [`crate::exec::pty::Shells`]), each in the token's own section `mcp:<name>` (its
//!   working directory and workspace, from [`crate::workspace`]) through
//!   [`crate::exec::ops::Ops`]: the workspace judge, the command guard (an `ask` verdict is an
//!   error naming the approval needed, unless the backend's `risky` policy is `allow`; lines
//!   typed into a shell are judged alike), the secret scanner on what comes back (secrets
//!   masked), and the audit trail with the token's name as actor.
//!
//! Bounds: the listener's connections ([`crate::config::McpConfig::http`]), sessions held
//! ([`crate::config::McpConfig::max_sessions`], and per token
//! [`crate::config::McpConfig::max_sessions_per_token`]), tool calls running at once
//! ([`crate::config::McpConfig::max_calls`], and per token
//! [`crate::config::McpConfig::max_calls_per_token`]), request bodies (4 MiB), command output
//! (the execution layer's head + tail), progress notifications (one a second at most).
//!
//! Never: serves on the public listener; reads a request body before its token checked out;
//! returns a secret; falls back to local when a target fails.

pub mod auth;
pub mod cli;
pub mod fresh;
pub mod server;
pub mod token;

use std::sync::Arc;

use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::clock::Clock;
use crate::config::McpConfig;
use crate::exec::Executors;
use crate::plane::secrets::SecretFilter;
use crate::workspace::LocalRules;

impl McpDeps {
    /// The gate every tool call of the endpoint passes.
    pub fn gate(&self) -> crate::gate::Gate<'_> {
        crate::gate::Gate {
            db: &self.db,
            exec: &self.exec,
            secrets: &self.secrets,
            tool_timeout: self.tool_timeout,
            local_risky: self.local_risky,
        }
    }
}

/// The route of the endpoint on its listener.
pub const PATH: &str = "/mcp";

/// What the endpoint needs of the core.
#[derive(Clone)]
pub struct McpDeps {
    pub db: PgPool,
    pub clock: Arc<dyn Clock>,
    /// The executors the chat path uses (local sandbox, the SSH pool, the guard, cwds).
    pub exec: Arc<Executors>,
    /// Where local workspaces may be.
    pub workspaces: LocalRules,
    /// What never goes back to a client.
    pub secrets: Arc<SecretFilter>,
    /// The longest a command may run (the agent's tool timeout).
    pub tool_timeout: std::time::Duration,
    /// What a command the guard asks about does locally (`SSHMODE_LOCAL_RISKY`).
    pub local_risky: crate::config::Risky,
    pub config: McpConfig,
}

/// The endpoint's routes: `/mcp` behind the bearer check. Streams and sessions end when
/// `shutdown` is cancelled; the sweep that closes the shells of revoked tokens runs on `tasks`
/// until then.
pub fn router(deps: McpDeps, shutdown: &CancellationToken, tasks: &TaskTracker) -> axum::Router {
    let sessions = Arc::new(LocalSessionManager::default());
    let config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(deps.config.allowed_hosts.clone())
        .with_allowed_origins(deps.config.allowed_origins.clone())
        .enforce_origin_validation()
        .with_cancellation_token(shutdown.child_token());
    let tools = Arc::new(server::Tools::new(deps.clone()));
    tasks.spawn(server::run_sweeper(tools.clone(), shutdown.child_token()));
    let service = StreamableHttpService::new(
        move || Ok(server::Server::new(tools.clone())),
        sessions.clone(),
        config,
    );
    let gate = auth::Gate {
        db: deps.db.clone(),
        clock: deps.clock.clone(),
        sessions,
        max_sessions: deps.config.max_sessions,
        max_sessions_per_token: deps.config.max_sessions_per_token.max(1),
        owners: Arc::default(),
        tokens: Arc::new(fresh::Fresh::default()),
    };
    axum::Router::new()
        .route_service(PATH, service)
        .layer(axum::middleware::from_fn_with_state(gate, auth::check))
}
