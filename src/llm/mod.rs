//! Model access: the OpenAI-compatible client and the router (fallback chains, failure
//! classification, cooldowns, probes). Knows nothing of tools' effects.

use axum::Json;
use axum::Router;
use axum::routing::get;

use crate::app::AppState;

/// `/router/health`, `/router/stats`, `/v1/chat/completions`.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route(
            "/router/health",
            get(|| async { Json(serde_json::json!({ "entries": [] })) }),
        )
        .route(
            "/router/stats",
            get(|| async { Json(serde_json::json!({ "entries": [] })) }),
        )
}
