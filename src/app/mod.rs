//! The composition root of `serve`: builds the service from a config, a bound listener and a
//! shutdown token — the [`build::Core`] the front-ends share, with the Lark front-end, the
//! inbox and HTTP around it, and the MCP endpoint on its own listener when
//! `SSHMODE_MCP_LISTEN` is set — runs it, and shuts it down in order. Used by `main` and by the
//! tests alike. No business rules.

pub mod build;
pub mod console;
pub mod doctor;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::clock::{Clock, SystemClock};
use crate::config::Config;
use crate::frontend::{LarkAdmins, LarkAnchors, LarkHandler, LarkTriage};
use crate::http::HttpState;
use crate::inbox::{Inbox, InboxDeps};
use crate::lark::client::LarkClient;
use crate::metrics::Metrics;
use crate::store::Store;
use crate::turns::SectionFilter;
use build::{Core, Front};

/// How long shutdown waits for HTTP requests in flight, then again for background tasks,
/// before it goes on without them (a stuck peer must not keep the process alive).
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(30);

/// Seams tests may replace.
pub struct Overrides {
    pub clock: Arc<dyn Clock>,
    /// The agent's view of chat control (bindings, `ssh_mode`); `None` = chat control itself.
    pub ssh_mode: Option<Arc<dyn crate::agent::Bindings>>,
}

impl Default for Overrides {
    fn default() -> Self {
        Overrides {
            clock: Arc::new(SystemClock),
            ssh_mode: None,
        }
    }
}

/// Every handle of a running service: the core, and what `serve` adds around it. Cheap to
/// clone; tests look inside through it.
#[derive(Clone)]
pub struct AppState {
    pub config: Arc<Config>,
    pub db: sqlx::PgPool,
    pub metrics: Arc<Metrics>,
    pub clock: Arc<dyn Clock>,
    pub llm: Option<Arc<crate::llm::Router>>,
    pub exec: Arc<crate::exec::Executors>,
    pub agent: Arc<crate::agent::Agent>,
    pub turns: Arc<crate::turns::Runner>,
    /// The Lark Open API client (one connection pool, token cache and rate limits per app).
    pub lark: Arc<LarkClient>,
    /// The durable inbox: batched recording, workers.
    pub inbox: Arc<Inbox>,
    /// Live progress cards.
    pub progress: crate::progress::Progress,
    /// Cancelled when the service begins shutting down.
    pub shutdown: CancellationToken,
    /// What the HTTP handlers share.
    pub http: HttpState,
    /// The MCP endpoint's address; `None` when it is off.
    pub mcp_addr: Option<SocketAddr>,
}

/// A built, not yet running, service.
pub struct App {
    listener: TcpListener,
    /// The MCP endpoint: its own listener and routes.
    mcp: Option<(TcpListener, axum::Router)>,
    state: AppState,
    store: Store,
    tasks: TaskTracker,
}

impl App {
    /// Builds the app with the production seams.
    pub async fn build(
        config: Config,
        listener: TcpListener,
        shutdown: CancellationToken,
    ) -> anyhow::Result<App> {
        Self::build_with(config, listener, shutdown, Overrides::default()).await
    }

    /// Builds the app: opens and migrates the store, builds the core with the Lark front-end
    /// around it, starts the background workers (they stop when `shutdown` is cancelled).
    pub async fn build_with(
        config: Config,
        listener: TcpListener,
        shutdown: CancellationToken,
        overrides: Overrides,
    ) -> anyhow::Result<App> {
        crate::install_crypto_provider();
        // The MCP endpoint's own listener, bound first so a taken address fails at once.
        let mcp_listener = match config.mcp.as_ref().map(|m| m.listen) {
            Some(addr) => Some(TcpListener::bind(addr).await.map_err(|e| {
                anyhow::anyhow!("cannot listen on {addr} (SSHMODE_MCP_LISTEN): {e}")
            })?),
            None => None,
        };
        let store = Store::open(&config).await?;
        let tasks = TaskTracker::new();
        match Self::wire(config, &store, shutdown, overrides, &tasks).await {
            Ok((mut state, mcp_router)) => {
                if let Some(keep) = store.keep_embedded_running(state.shutdown.clone()) {
                    tasks.spawn(keep);
                }
                let mcp = mcp_listener.zip(mcp_router);
                state.mcp_addr = mcp.as_ref().and_then(|(l, _)| l.local_addr().ok());
                Ok(App {
                    listener,
                    mcp,
                    state,
                    store,
                    tasks,
                })
            }
            Err(e) => {
                store.close().await;
                Err(e)
            }
        }
    }

    async fn wire(
        config: Config,
        store: &Store,
        shutdown: CancellationToken,
        overrides: Overrides,
        tasks: &TaskTracker,
    ) -> anyhow::Result<(AppState, Option<axum::Router>)> {
        let db = store.pool.clone();
        let metrics = Arc::new(Metrics::new());
        // Without credentials (commands other than `serve`) calls fail with a token error.
        let (app_id, app_secret) = match &config.lark {
            Some(l) => (l.app_id.clone(), l.app_secret.clone()),
            None => (String::new(), secrecy::SecretString::from(String::new())),
        };
        let lark = Arc::new(
            LarkClient::new(&config.lark_base_url, &app_id, app_secret, metrics.clone())?
                .with_shared_budget(db.clone()),
        );
        let progress = crate::progress::Progress::new(
            lark.clone(),
            db.clone(),
            metrics.clone(),
            config.progress.clone(),
            tasks.clone(),
        );
        let inbox_config = config.inbox.clone();
        // Console sections are answered by the console that owns them.
        let front = Front {
            out: lark.clone(),
            steps: Arc::new(progress.clone()),
            scope: SectionFilter::Except(crate::console::SECTION_PREFIX.into()),
        };
        let core = Core::build(
            config,
            db.clone(),
            overrides.clock.clone(),
            metrics.clone(),
            overrides.ssh_mode,
            front,
            tasks,
        )
        .await?;
        let inbox = Inbox::new(
            InboxDeps {
                db: db.clone(),
                clock: core.clock.clone(),
                metrics: metrics.clone(),
                config: inbox_config,
                shutdown: shutdown.clone(),
            },
            crate::inbox::ADMITTED_MAX,
            tasks.clone(),
        );
        let deps = core.chat_deps(
            Arc::new(LarkAdmins { lark: lark.clone() }),
            Arc::new(LarkAnchors { lark: lark.clone() }),
        );
        // The inbox is handed its handler: it never calls the chat domain by name.
        inbox.spawn_workers(Arc::new(LarkHandler {
            lark: lark.clone(),
            deps: deps.clone(),
            agent: core.agent.clone(),
            progress: progress.clone(),
        }));
        if core.config.lark.is_some() {
            tasks.spawn(crate::chat::target_approval::run_notifier(
                deps,
                shutdown.clone(),
            ));
        }
        // Schedules fire through the inbox, so only where its workers run.
        if core.config.inbox.workers_enabled {
            let scheduler = crate::scheduler::Scheduler {
                db: db.clone(),
                clock: core.clock.clone(),
                deliver: crate::scheduler::Deliver::Inbox(inbox.clone()),
                metrics: metrics.clone(),
                only: None,
                except: Some(crate::console::SECTION_PREFIX.into()),
            };
            tasks.spawn(scheduler.run(shutdown.clone()));
        }
        tasks.spawn(crate::audit::run_retention(
            db.clone(),
            core.config.audit_retention_days,
            shutdown.clone(),
        ));
        tasks.spawn(crate::lifecycle::run_retention(
            db.clone(),
            core.config.retention,
            crate::lifecycle::Roots::of(&core.config),
            shutdown.clone(),
        ));
        tasks.spawn(crate::turns::inputs::run_image_purge(
            db.clone(),
            shutdown.clone(),
        ));
        core.spawn(&shutdown, tasks);
        let mcp = core
            .mcp()
            .map(|deps| crate::mcp::router(deps, &shutdown, tasks));
        doctor::log_light(&core.config, core.exec.local_level());
        if let Some(llm) = &core.llm {
            for h in llm.disabled().await {
                tracing::warn!(
                    llm.entry = %h.name(),
                    llm.disabled_since = ?h.since,
                    advice = %crate::llm::router::enable_advice(&h.name()),
                    "model entry disabled: its provider rejected the API key"
                );
            }
        }
        let triage = Arc::new(LarkTriage {
            config: core.config.clone(),
            db: db.clone(),
        });
        // The long connection: events and card callbacks over a WebSocket dialled out.
        let lark_ws = match (&core.config.lark, core.config.lark_mode.websocket()) {
            (Some(lark), true) => {
                let client = Arc::new(crate::lark::ws::LongConnection::new(
                    &core.config.lark_base_url,
                    &lark.app_id,
                    lark.app_secret.clone(),
                    metrics.clone(),
                )?);
                let deliver = Arc::new(crate::frontend::long_connection::InboxDeliver {
                    config: core.config.clone(),
                    inbox: inbox.clone(),
                    triage: triage.clone(),
                    clock: core.clock.clone(),
                    metrics: metrics.clone(),
                });
                let status = client.status();
                tasks.spawn(client.run(deliver, shutdown.clone(), tasks.clone()));
                Some(status)
            }
            _ => None,
        };
        let http = HttpState {
            config: core.config.clone(),
            db: db.clone(),
            metrics: metrics.clone(),
            clock: core.clock.clone(),
            llm: core.llm.clone(),
            inbox: inbox.clone(),
            triage,
            isolation: core.exec.local_level().clone(),
            lark_ws,
        };
        let state = AppState {
            config: core.config,
            db,
            metrics,
            clock: core.clock,
            llm: core.llm,
            exec: core.exec,
            agent: core.agent,
            turns: core.turns,
            lark,
            inbox,
            progress,
            shutdown,
            http,
            mcp_addr: None,
        };
        Ok((state, mcp))
    }

    /// The address the HTTP server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    /// Shared state, for tests that look inside.
    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// Serves until the shutdown token is cancelled, then drains: stops taking requests, lets
    /// workers finish or hand back what they claimed, closes the store.
    pub async fn run(self) -> anyhow::Result<()> {
        let App {
            listener,
            mcp,
            state,
            store,
            tasks,
        } = self;
        let shutdown = state.shutdown.clone();
        let router = crate::http::router(state.http.clone());
        tracing::info!(http.addr = %listener.local_addr()?, "listening");
        let serve = crate::http::serve::serve(
            listener,
            router,
            state.config.http.clone(),
            state.metrics.clone(),
            shutdown.clone(),
        );
        // The MCP endpoint: the same server loop and bounds, its own connection slots.
        let mcp = async {
            if let Some((listener, router)) = mcp {
                tracing::info!(mcp.addr = %listener.local_addr()?, "MCP endpoint listening");
                let limits = state.config.mcp.as_ref().map(|m| m.http.clone());
                crate::http::serve::serve(
                    listener,
                    router,
                    limits.unwrap_or_else(|| state.config.http.clone()),
                    state.metrics.clone(),
                    shutdown,
                )
                .await;
            }
            anyhow::Ok(())
        };
        let serve = async {
            let (_, mcp) = tokio::join!(serve, mcp);
            mcp
        };
        // Once shutdown begins, requests in flight get a bounded grace, not forever.
        let overdue = async {
            state.shutdown.cancelled().await;
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        };
        tokio::select! {
            r = serve => if let Err(e) = r {
                tracing::warn!(error = %e, "the MCP endpoint could not be served");
            },
            _ = overdue => {
                tracing::warn!(grace_secs = SHUTDOWN_GRACE.as_secs(), "HTTP requests still running after the shutdown grace; dropping them");
            }
        }
        state.shutdown.cancel();
        tasks.close();
        if tokio::time::timeout(SHUTDOWN_GRACE, tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                grace_secs = SHUTDOWN_GRACE.as_secs(),
                "background tasks still running after the shutdown grace; leaving them"
            );
        }
        state.inbox.worker_pool().close().await;
        drop(state);
        store.close().await;
        Ok(())
    }
}

/// Resolves when SIGINT or SIGTERM arrives.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("installing a SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
