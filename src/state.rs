//! The shared handles every layer needs, below the wiring: `app` builds an [`AppState`] and
//! hands it to the HTTP routes and the workers. Nothing here imports `app`; the domain's
//! decisions reach the request path through [`Triage`], which `app` supplies.

use std::sync::Arc;

use serde_json::Value;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::config::Config;
use crate::lark::client::LarkClient;
use crate::lark::webhook::Envelope;
use crate::metrics::Metrics;

/// The one state every handler and worker shares. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    pub config: Arc<Config>,
    pub db: PgPool,
    pub metrics: Arc<Metrics>,
    pub clock: Arc<dyn Clock>,
    /// The model router; `None` when no model is configured (the agent then says so).
    pub llm: Option<Arc<crate::llm::Router>>,
    /// Cancelled when the service begins shutting down.
    pub shutdown: CancellationToken,
    /// The Lark Open API client (one connection pool, token cache and rate limits per app).
    pub lark: Arc<LarkClient>,
    /// The inbox's in-process side: batched recording and worker wake-ups.
    pub inbox: Arc<crate::inbox::Inbox>,
    /// The execution layer: local backend, the shared SSH pool, guard, per-section cwds.
    pub exec: Arc<crate::exec::Executors>,
    /// The agent: `accept` queues a turn request, `stop` is `/stop` (and the dispatcher's `AgentPort`).
    pub agent: Arc<crate::agent::Agent>,
    /// This replica's turn runner (claims sections, drives turns).
    pub turns: Arc<crate::turns::Runner>,
    /// Live progress cards; the card Stop button goes to [`crate::progress::on_stop_click`].
    pub progress: crate::progress::Progress,
    /// The domain's answers the request path needs without I/O.
    pub triage: Arc<dyn Triage>,
}

/// What the callback path asks the domain before it answers, with no I/O and no outbound call
/// (invariant 1).
pub trait Triage: Send + Sync {
    /// Whether the event must never wait behind other events of its section (`/stop`, card
    /// actions).
    fn express(&self, env: &Envelope) -> bool;
    /// The synchronous answer to a card action (`{}` or a toast).
    fn card_answer(&self, env: &Envelope) -> Value;
}
