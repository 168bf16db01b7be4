//! The composition root of `sshmode chat`: the same [`Core`] as `serve`, with the terminal as
//! its front-end and a turn runner for the console's one section ([`crate::console`] is the
//! terminal itself).

use std::io::IsTerminal;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::build::{Core, Front};
use crate::clock::{Clock, SystemClock};
use crate::config::Config;
use crate::console::{NoAdminChannel, Session, Terminal};
use crate::metrics::Metrics;
use crate::store::Store;
use crate::turns::SectionFilter;

/// How long shutdown waits for background tasks.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Runs `sshmode chat`: returns the process's exit status.
pub async fn run(mut config: Config, section: Option<String>) -> anyhow::Result<i32> {
    crate::install_crypto_provider();
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let (name, section, actor) = crate::console::identify(&mut config, section, clock.as_ref())?;
    let interactive = std::io::stdin().is_terminal();

    let store = Store::open(&config).await?;
    let shutdown = CancellationToken::new();
    let tasks = TaskTracker::new();
    let result = async {
        let session = session(config, &store, clock, &section, &shutdown, &tasks).await?;
        eprintln!(
            "sshmode chat: section {section} (resume it with `sshmode chat --section {name}`); /help lists the commands"
        );
        session.repl(&section, &actor, interactive).await
    }
    .await;
    shutdown.cancel();
    tasks.close();
    if tokio::time::timeout(SHUTDOWN_GRACE, tasks.wait())
        .await
        .is_err()
    {
        tracing::warn!("background tasks still running after the shutdown grace; leaving them");
    }
    store.close().await;
    result
}

/// Builds the core with the terminal as its front-end and a turn runner for `section` alone
/// (spawned on `tasks` until `shutdown`), and the dispatcher's dependencies.
async fn session(
    config: Config,
    store: &Store,
    clock: Arc<dyn Clock>,
    section: &str,
    shutdown: &CancellationToken,
    tasks: &TaskTracker,
) -> anyhow::Result<Session> {
    let term = Arc::new(Terminal::new(std::io::stdout().is_terminal()));
    // Only this section: another section's answers belong to its own front-end.
    let core = Core::build(
        config,
        store.pool.clone(),
        clock,
        Arc::new(Metrics::new()),
        None,
        Front {
            out: term.clone(),
            steps: term.clone(),
            scope: SectionFilter::Only(section.to_string()),
        },
        tasks,
    )
    .await?;
    core.spawn(shutdown, tasks);
    let turn_wait = core.config.agent.turn_budget + core.config.agent.turn_lease * 2;
    let deps = core.chat_deps(Arc::new(NoAdminChannel), term.clone());
    // This section's schedules fire here, while the console runs (it has no inbox).
    let scheduler = crate::scheduler::Scheduler {
        db: core.db.clone(),
        clock: core.clock.clone(),
        deliver: crate::scheduler::Deliver::Direct(Box::new(deps.clone())),
        metrics: core.metrics.clone(),
        only: Some(section.to_string()),
        except: None,
    };
    tasks.spawn(scheduler.run(shutdown.clone()));
    Ok(Session {
        deps,
        term,
        turn_wait,
    })
}
