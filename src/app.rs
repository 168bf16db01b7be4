//! Wiring: builds the whole service from a config, a bound listener and a shutdown token, runs
//! it, and shuts it down in order. Used by `main` and by the tests alike. No business rules.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::chat::Deps;
use crate::clock::{Clock, SystemClock};
use crate::config::Config;
use crate::lark::client::LarkClient;
use crate::metrics::Metrics;
use crate::store::Store;

/// The shared state lives below the wiring; re-exported so `sshmode::app::AppState` works.
pub use crate::state::AppState;

/// How long shutdown waits for HTTP requests in flight, then again for background tasks,
/// before it goes on without them (a stuck peer must not keep the process alive).
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(30);

/// Seams tests may replace.
pub struct Overrides {
    pub clock: Arc<dyn Clock>,
    /// The agent's view of chat control (bindings, `ssh_mode`); `None` = every section local.
    pub section_control: Option<Arc<dyn crate::agent::SectionControl>>,
}

impl Default for Overrides {
    fn default() -> Self {
        Overrides {
            clock: Arc::new(SystemClock),
            section_control: None,
        }
    }
}

/// A built, not yet running, service.
pub struct App {
    listener: TcpListener,
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

    /// Builds the app: opens and migrates the store, wires every subsystem, starts the
    /// background workers (they stop when `shutdown` is cancelled).
    pub async fn build_with(
        config: Config,
        listener: TcpListener,
        shutdown: CancellationToken,
        overrides: Overrides,
    ) -> anyhow::Result<App> {
        crate::install_crypto_provider();
        let store = Store::open(&config).await?;
        let metrics = Arc::new(Metrics::new());
        // Without credentials (commands other than `serve`) calls fail with a token error.
        let (app_id, app_secret) = match &config.lark {
            Some(l) => (l.app_id.clone(), l.app_secret.clone()),
            None => (String::new(), secrecy::SecretString::from(String::new())),
        };
        let lark = LarkClient::new(&config.lark_base_url, &app_id, app_secret, metrics.clone())?;
        let llm = match crate::llm::Router::from_config(
            &config,
            store.pool.clone(),
            overrides.clock.clone(),
            metrics.clone(),
        ) {
            Ok(router) => router.map(Arc::new),
            Err(e) => {
                store.close().await;
                return Err(e.context("building the model router"));
            }
        };
        let vault = Arc::new(
            crate::vault::Vault::open_or_create(&config.master_key_file).map_err(|e| {
                anyhow::anyhow!(
                    "cannot open the vault key {} (SSHMODE_MASTER_KEY_FILE): {e}",
                    config.master_key_file.display()
                )
            })?,
        );
        // Vault records still bound to the alias alone are sealed again for their row and field.
        crate::target::reseal_legacy(&store.pool, &vault)
            .await
            .context("re-sealing vault records")?;
        let plane = Arc::new(crate::control::ControlPlane::new(
            &config,
            store.pool.clone(),
            vault.clone(),
        ));
        let tasks = TaskTracker::new();
        let exec = Arc::new(crate::exec::Executors::with_metrics(
            &config.exec,
            store.pool.clone(),
            vault,
            metrics.clone(),
            tasks.clone(),
        )?);
        exec.log_local_level();
        exec.warn_agent_targets(&store.pool).await;
        let lark = Arc::new(lark);
        // The agent reads bindings and answers `ssh_mode` through chat control.
        let control = overrides.section_control.unwrap_or_else(|| {
            Arc::new(crate::agent::port::ChatControl {
                db: store.pool.clone(),
                clock: overrides.clock.clone(),
                yolo_ttl: config.chat.yolo_ttl,
            })
        });
        let progress = crate::progress::Progress::new(
            lark.clone(),
            store.pool.clone(),
            metrics.clone(),
            config.progress.clone(),
            tasks.clone(),
        );
        let (agent, turns) = crate::agent::build(
            &config,
            store.pool.clone(),
            crate::agent::Parts {
                exec: exec.clone(),
                llm: llm.clone(),
                out: lark.clone(),
                control: Some(control),
                plane,
                steps: Some(Arc::new(progress.clone())),
            },
        );
        let config = Arc::new(config);
        let state = AppState {
            triage: Arc::new(crate::lark::adapter::LarkTriage {
                config: config.clone(),
            }),
            agent,
            config,
            db: store.pool.clone(),
            metrics,
            clock: overrides.clock,
            llm,
            shutdown: shutdown.clone(),
            lark,
            inbox: Arc::new(crate::inbox::Inbox::new(
                crate::inbox::ADMITTED_MAX,
                tasks.clone(),
            )),
            exec: exec.clone(),
            turns: turns.clone(),
            progress,
        };
        let lark_client = state.lark.clone();
        let deps = Deps {
            db: state.db.clone(),
            clock: state.clock.clone(),
            config: state.config.clone(),
            agent: state.agent.clone(),
            admins: Arc::new(crate::lark::adapter::LarkAdmins {
                lark: lark_client.clone(),
            }),
            workspaces: crate::workspace::LocalRules::from_config(&state.config.exec),
        };
        // The inbox is handed its handler: it never calls the chat domain by name.
        let handler = Arc::new(crate::lark::adapter::LarkHandler {
            lark: lark_client,
            deps: deps.clone(),
            agent: state.agent.clone(),
            progress: state.progress.clone(),
        });
        crate::inbox::spawn_workers(&state, handler, &tasks);
        if state.config.lark.is_some() {
            tasks.spawn(crate::chat::approval::run_notifier(deps, shutdown.clone()));
        }
        tasks.spawn(exec.run_reaper(shutdown.clone()));
        tasks.spawn(turns.run(shutdown.clone(), tasks.clone()));
        if let Some(router) = &state.llm {
            tasks.spawn(router.clone().probe_loop(shutdown.clone()));
        }
        Ok(App {
            listener,
            state,
            store,
            tasks,
        })
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
            state,
            store,
            tasks,
        } = self;
        let shutdown = state.shutdown.clone();
        let router = crate::http::router(state.clone());
        tracing::info!(http.addr = %listener.local_addr()?, "listening");
        let serve = crate::http::serve::serve(
            listener,
            router,
            state.config.http.clone(),
            state.metrics.clone(),
            shutdown,
        );
        // Once shutdown begins, requests in flight get a bounded grace, not forever.
        let overdue = async {
            state.shutdown.cancelled().await;
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        };
        tokio::select! {
            () = serve => {}
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
