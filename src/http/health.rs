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
/// that level leaves open (`local-isolation-open: …; …`), and a `degraded:` line per model
/// entry disabled after its key was rejected. A disabled entry keeps the answer 200: it needs a
/// person, and a load balancer pulling every replica for it would only stop the chat
/// commands too.
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
        let mut degraded = String::new();
        if let Some(llm) = &state.llm {
            for h in llm.disabled().await {
                degraded.push_str(&format!(
                    "degraded: model {} disabled{} ({}); {}\n",
                    h.name(),
                    h.since
                        .map(|t| format!(
                            " since {}",
                            t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                        ))
                        .unwrap_or_default(),
                    h.reason.map(|r| r.describe()).unwrap_or("API key rejected"),
                    crate::llm::router::enable_advice(&h.name()),
                ));
            }
        }
        (StatusCode::OK, format!("ready\n{degraded}{isolation}\n"))
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("database not reachable or not migrated\n{isolation}\n"),
        )
    }
}

/// How long a scrape waits for the database's answers.
const SCRAPE_DB_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The metrics, with what is read at scrape time refreshed first: the inbox's depth, whether
/// the database answers and this replica is ready, and the model entries disabled.
async fn metrics(State(state): State<HttpState>) -> impl IntoResponse {
    state.inbox.refresh_depth().await;
    let up = tokio::time::timeout(
        SCRAPE_DB_WAIT,
        sqlx::query_scalar::<_, i32>("SELECT 1").fetch_one(&state.db),
    )
    .await
    .is_ok_and(|r| r.is_ok());
    state.metrics.database_up.set(i64::from(up));
    let ready = up
        && tokio::time::timeout(SCRAPE_DB_WAIT, crate::store::is_ready(&state.db))
            .await
            .unwrap_or(false);
    state.metrics.ready.set(i64::from(ready));
    if let Some(llm) = &state.llm {
        let disabled = llm.disabled().await.len();
        state
            .metrics
            .llm_entries_disabled
            .set(i64::try_from(disabled).unwrap_or(i64::MAX));
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.render(),
    )
}
