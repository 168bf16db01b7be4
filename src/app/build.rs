//! The core every front-end runs on, built in one place: the store's pool, the vault (its key
//! checked against the database's canary, records re-sealed), the model router, the control
//! plane, the executors, chat control as the agent sees it, the agent, a turn runner and the
//! replica's heartbeat. `serve` adds HTTP and Lark around it ([`super::App`]), and the MCP
//! endpoint when it is configured ([`Core::mcp`]); `sshmode chat` adds its terminal
//! ([`crate::console`]).

use std::sync::Arc;

use anyhow::Context;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::agent::{Agent, AgentDeps, Bindings, ChatOut, StepSink};
use crate::chat::{AdminChannel, Anchors, ChatBindings, Deps};
use crate::clock::Clock;
use crate::config::Config;
use crate::exec::Executors;
use crate::llm::Router;
use crate::metrics::Metrics;
use crate::turns::{Runner, RunnerConfig, SectionFilter};
use crate::workspace::LocalRules;

/// How often an idle turn runner looks for work without a wake-up.
const RUNNER_POLL: std::time::Duration = std::time::Duration::from_secs(1);

/// What a front-end plugs into the core: where answers and step events go, and which sections
/// its turn runner serves.
pub struct Front {
    pub out: Arc<dyn ChatOut>,
    pub steps: Arc<dyn StepSink>,
    pub scope: SectionFilter,
}

/// The core's handles. Cheap to clone.
#[derive(Clone)]
pub struct Core {
    pub config: Arc<Config>,
    pub db: PgPool,
    pub metrics: Arc<Metrics>,
    pub clock: Arc<dyn Clock>,
    /// The model router; `None` when no model is configured (the agent then says so).
    pub llm: Option<Arc<Router>>,
    /// The execution layer: local backend, the shared SSH pool, guard, per-section cwds.
    pub exec: Arc<Executors>,
    /// `accept` queues a turn request, `stop` is `/stop`.
    pub agent: Arc<Agent>,
    /// This process's turn runner (claims sections, drives turns).
    pub turns: Arc<Runner>,
    /// Where local workspaces may be.
    pub workspaces: LocalRules,
    /// What never goes back to an MCP client (private keys, service keys, target secrets).
    pub secrets: Arc<crate::plane::SecretFilter>,
    /// This process's row in `replicas`, its heartbeat renewed while it runs.
    pub replica: String,
}

impl Core {
    /// Builds the core on an open, migrated pool. `ssh_mode` replaces chat control as
    /// the agent's view of bindings (tests); `None` is the real one.
    pub async fn build(
        config: Config,
        db: PgPool,
        clock: Arc<dyn Clock>,
        metrics: Arc<Metrics>,
        ssh_mode: Option<Arc<dyn Bindings>>,
        front: Front,
        tasks: &TaskTracker,
    ) -> anyhow::Result<Core> {
        let llm = Router::from_config(&config, db.clone(), clock.clone(), metrics.clone())
            .context("building the model router")?
            .map(Arc::new);
        // Only the key that opens this database's vault (never a fresh one over sealed secrets).
        let vault = Arc::new(
            crate::target::keyring::open(&db, &config.master_key_file)
                .await
                .map_err(anyhow::Error::new)?,
        );
        // Vault records still bound to the alias alone are sealed again for their row and field.
        crate::target::reseal_legacy(&db, &vault)
            .await
            .context("re-sealing vault records")?;
        let plane = Arc::new(
            crate::plane::ControlPlane::new(&config, db.clone(), vault.clone())
                .with_metrics(metrics.clone()),
        );
        let secrets = Arc::new(
            crate::plane::SecretFilter::new(&config, vault.clone()).with_metrics(metrics.clone()),
        );
        let exec = Arc::new(Executors::with_metrics(
            &config.exec,
            crate::target::registry(db.clone()),
            vault,
            metrics.clone(),
            tasks.clone(),
        )?);
        exec.log_local_level();
        exec.warn_agent_targets(&db).await;
        let bindings = ssh_mode
            .unwrap_or_else(|| Arc::new(ChatBindings::new(db.clone(), clock.clone(), &config)));
        let workspaces = LocalRules::from_config(&config.exec);
        let agent = Agent::new(AgentDeps {
            db: db.clone(),
            exec: exec.clone(),
            llm: llm.clone(),
            model: config.model.clone(),
            bindings,
            plane,
            out: front.out,
            steps: front.steps,
            config: config.agent.clone(),
            prompts: Default::default(),
            workspaces: workspaces.clone(),
        });
        let turns = Runner::scoped(
            db.clone(),
            RunnerConfig {
                lease: config.agent.turn_lease,
                workers: config.agent.turn_workers,
                budget: config.agent.turn_budget,
                poll: RUNNER_POLL,
            },
            agent.clone(),
            front.scope,
        );
        // Seen as running from here (`vault rotate-key` refuses while it is).
        let replica = crate::store::replicas::register(&db)
            .await
            .context("recording this process as a running replica")?;
        Ok(Core {
            replica,
            config: Arc::new(config),
            db,
            metrics,
            clock,
            llm,
            exec,
            agent,
            turns,
            workspaces,
            secrets,
        })
    }

    /// The MCP endpoint's dependencies, when `SSHMODE_MCP_LISTEN` turns it on: the same
    /// executors, workspaces and secret filter as the chat's tools.
    pub fn mcp(&self) -> Option<crate::mcp::McpDeps> {
        let config = self.config.mcp.clone()?;
        Some(crate::mcp::McpDeps {
            db: self.db.clone(),
            clock: self.clock.clone(),
            exec: self.exec.clone(),
            workspaces: self.workspaces.clone(),
            secrets: self.secrets.clone(),
            tool_timeout: self.config.agent.tool_timeout,
            local_risky: self.config.agent.local_risky,
            config,
        })
    }

    /// Starts the core's background work on `tasks` until `shutdown`: the turn runner, the
    /// SSH pool's reaper, the audit of shells that closed on their own account, the closing of
    /// what this replica holds of chats the bot left, the router's probes and the replica
    /// heartbeat.
    pub fn spawn(&self, shutdown: &CancellationToken, tasks: &TaskTracker) {
        tasks.spawn(crate::store::replicas::run(
            self.db.clone(),
            self.replica.clone(),
            shutdown.clone(),
        ));
        tasks.spawn(self.turns.clone().run(shutdown.clone(), tasks.clone()));
        tasks.spawn(self.exec.clone().run_reaper(shutdown.clone()));
        tasks.spawn(crate::chat::leave::follow_departures(
            self.db.clone(),
            self.exec.clone(),
            shutdown.clone(),
        ));
        tasks.spawn(audit_closed_shells(
            self.exec.shells.clone(),
            self.db.clone(),
            shutdown.clone(),
        ));
        if let Some(router) = &self.llm {
            tasks.spawn(router.clone().probe_loop(shutdown.clone()));
        }
    }

    /// The chat dispatcher's dependencies, with the front-end's channel to admins.
    pub fn chat_deps(&self, admins: Arc<dyn AdminChannel>, anchors: Arc<dyn Anchors>) -> Deps {
        Deps {
            anchors,
            metrics: self.metrics.clone(),
            secrets: self.secrets.clone(),
            db: self.db.clone(),
            clock: self.clock.clone(),
            config: self.config.clone(),
            agent: self.agent.clone(),
            admins,
            workspaces: self.workspaces.clone(),
            exec: self.exec.clone(),
        }
    }
}

/// Records every interactive shell that closed on its own account — it ended, idled out, its
/// thread's backend changed, the service stopped — as a `shell.close` audit row (actor
/// `system`, with the reason), so that every shell opened has its close on record; closes a
/// caller made (`shell_close`, a revoked token's sweep) are recorded by that caller. Runs until
/// `shutdown`, then records what the shutdown itself closed.
async fn audit_closed_shells(
    shells: Arc<crate::exec::pty::Shells>,
    db: PgPool,
    shutdown: CancellationToken,
) {
    loop {
        let stopping = tokio::select! {
            _ = shutdown.cancelled() => true,
            _ = shells.closed_changed() => false,
        };
        if stopping {
            // The registry closes every shell on the same signal: let it finish, boundedly.
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
        for closed in shells.take_closed() {
            if let Err(e) = record_closed_shell(&db, &closed).await {
                tracing::warn!(error = %e, "a shell's close could not be audited");
            }
        }
        if stopping {
            return;
        }
    }
}

async fn record_closed_shell(db: &PgPool, c: &crate::exec::pty::ClosedShell) -> sqlx::Result<()> {
    // An MCP token's shells are kept under the token's id; the audit names its section.
    let (section, token) = match crate::mcp::token::split_key(&c.section) {
        Some((section, _)) if c.section.starts_with("mcp:") => {
            (section, section.strip_prefix("mcp:"))
        }
        _ => (c.section.as_str(), None),
    };
    let mut detail = serde_json::json!({"shell_id": c.shell_id, "reason": c.why});
    if let Some(name) = token {
        detail["via"] = "mcp".into();
        detail["token"] = name.into();
    }
    let entry = crate::audit::ChatEntry {
        actor: "system",
        action: "shell.close",
        section: Some(section),
        target: (c.host != "local").then_some(c.host.as_str()),
        outcome: "ok",
        detail,
    };
    let mut conn = db.acquire().await?;
    crate::audit::record_chat_at(&mut conn, entry, Some(c.at)).await
}
