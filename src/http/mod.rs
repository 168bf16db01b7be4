//! The HTTP surface: `POST /lark/events` ([`lark`]), the model router's routes ([`router`]),
//! liveness, readiness and metrics ([`health`]), on the hand-written server loop ([`serve`]).
//! Handlers never make outbound calls (a webhook is verified, recorded, answered).
//!
//! Handlers share an [`HttpState`]: only what they use, never the whole app.

pub mod body;
mod health;
pub mod lark;
pub mod router;
pub mod serve;

use std::sync::Arc;

use sqlx::PgPool;

use crate::clock::Clock;
use crate::config::Config;
use crate::exec::local::sandbox::Level;
use crate::frontend::LarkTriage;
use crate::inbox::Inbox;
use crate::metrics::Metrics;

/// What the HTTP handlers need. Cheap to clone.
#[derive(Clone)]
pub struct HttpState {
    pub config: Arc<Config>,
    pub db: PgPool,
    pub metrics: Arc<Metrics>,
    pub clock: Arc<dyn Clock>,
    /// The model router; `None` when no model is configured.
    pub llm: Option<Arc<crate::llm::Router>>,
    /// Where verified events are recorded before they are acknowledged.
    pub inbox: Arc<Inbox>,
    /// The Lark front-end's answers the callback needs without I/O (express lane, toasts).
    pub triage: Arc<LarkTriage>,
    /// The local tools' isolation level, reported by `/readyz`.
    pub isolation: Level,
    /// The long connection's state, reported by `/readyz`; `None` when it is not held.
    pub lark_ws: Option<crate::lark::ws::Status>,
}

/// The whole HTTP surface.
pub fn router(state: HttpState) -> axum::Router {
    axum::Router::new()
        .merge(health::routes())
        .merge(router::routes())
        .merge(match state.config.lark_mode.webhook() {
            true => lark::routes(),
            false => axum::Router::new(),
        })
        .with_state(state)
}
