//! Liveness, readiness and metrics.

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use super::HttpState;

pub fn routes() -> Router<HttpState> {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
}

/// Readiness, with the local tools' isolation level as detail (`local-isolation: …`) and what
/// that level leaves open (`local-isolation-open: …; …`).
async fn readyz(State(state): State<HttpState>) -> impl IntoResponse {
    let level = &state.isolation;
    let mut isolation = format!(
        "local-isolation: {level}\nlocal-isolation-open: {}",
        level.leaves_open().join("; ")
    );
    if let Some(ws) = &state.lark_ws {
        isolation.push_str(&format!("\nlark-long-connection: {}", ws.get().as_str()));
    }
    if crate::store::is_ready(&state.db).await {
        (StatusCode::OK, format!("ready\n{isolation}\n"))
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("database not reachable or not migrated\n{isolation}\n"),
        )
    }
}

async fn metrics(State(state): State<HttpState>) -> impl IntoResponse {
    state.inbox.refresh_depth().await;
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.render(),
    )
}
