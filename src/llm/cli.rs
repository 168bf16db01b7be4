//! `sshmode router …`: the operator's hand on the model router. `enable <provider>/<model>`
//! re-enables an entry the router disabled after its provider rejected the key (audited as
//! `router.enable`); `status` prints every entry's state, with since when and why.
//!
//! Never: prints a key (the entries are named by provider and model; errors are the router's
//! scrubbed ones); changes an entry's configuration.

use std::io::Write;

use clap::Subcommand;

use super::router::{EnableError, EntryHealth, Router};
use crate::config::Config;

/// `sshmode router …`
#[derive(Debug, Subcommand)]
pub enum RouterCmd {
    /// Every model entry with its state (ok, cooling, disabled), since when and why.
    #[command(after_help = "Examples:\n  sshmode router status")]
    Status,
    /// Re-enable a model entry disabled after an authentication failure (audited). Fix the
    /// key first: a rejected key disables the entry again at its next request. A key changed
    /// in the configuration starts clean by itself.
    #[command(
        after_help = "Examples:\n  sshmode router enable openai/gpt-4o-mini   # after fixing the key the provider rejected"
    )]
    Enable {
        /// The entry as `<provider>/<model>`, as `sshmode router status` and `doctor` name it.
        entry: String,
    },
}

/// Runs a router command; returns the process exit code.
pub async fn run(cmd: RouterCmd, config: &Config) -> anyhow::Result<i32> {
    let store = crate::store::Store::open(config).await?;
    let router = Router::from_config(
        config,
        store.pool.clone(),
        std::sync::Arc::new(crate::clock::SystemClock),
        std::sync::Arc::new(crate::metrics::Metrics::new()),
    );
    let stdout = std::io::stdout();
    let result = match router {
        Ok(Some(router)) => run_with(cmd, &router, &config.operator, &mut stdout.lock()).await,
        Ok(None) => Err(anyhow::anyhow!(
            "no model is configured (LLM_BASE_URL/LLM_MODEL or SSHMODE_ROUTER_CONFIG)"
        )),
        Err(e) => Err(e),
    };
    store.close().await;
    result
}

/// [`run`] on a given router and output, auditing as `actor`.
pub async fn run_with(
    cmd: RouterCmd,
    router: &Router,
    actor: &str,
    out: &mut dyn Write,
) -> anyhow::Result<i32> {
    match cmd {
        RouterCmd::Status => {
            for h in router.health().await {
                writeln!(out, "{}", status_line(&h))?;
            }
            Ok(0)
        }
        RouterCmd::Enable { entry } => match router.enable(&entry, actor).await {
            Ok(true) => {
                writeln!(
                    out,
                    "{entry} enabled: the next request tries it again (if its key is still \
                     rejected, it is disabled again)"
                )?;
                Ok(0)
            }
            Ok(false) => {
                writeln!(out, "{entry} was not disabled: nothing to do")?;
                Ok(0)
            }
            Err(e @ EnableError::Unknown { .. }) => {
                eprintln!("sshmode: {e}");
                Ok(2)
            }
            Err(EnableError::Database(e)) => Err(e.into()),
        },
    }
}

/// One entry as a line: `<chain> <provider>/<model>: <state>[ since …][ until …][ — why]`.
pub fn status_line(h: &EntryHealth) -> String {
    let mut s = format!("{} {}: {}", h.chain, h.name(), h.state);
    if let Some(since) = h.since {
        s.push_str(&format!(" since {}", since.format("%Y-%m-%d %H:%M:%S UTC")));
    }
    if let Some(until) = h.until {
        s.push_str(&format!(" until {}", until.format("%Y-%m-%d %H:%M:%S UTC")));
    }
    if let Some(reason) = h.reason {
        s.push_str(&format!(" ({})", reason.describe()));
    }
    if let Some(e) = h.last_error.as_ref().filter(|_| h.state != "ok") {
        s.push_str(&format!(" — {}", crate::audit::cli::printable(&e.message)));
    }
    s
}
