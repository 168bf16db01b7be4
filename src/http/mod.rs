//! HTTP surface: one axum router merged from each area's routes, one error type. Handlers
//! here never make outbound calls (webhooks: verify, record, answer).

pub mod body;
mod health;
pub mod serve;

use axum::Router;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::state::AppState;

/// The whole HTTP surface.
pub fn router(state: AppState) -> Router {
    Router::new()
        .merge(health::routes())
        .merge(crate::llm::routes())
        .merge(crate::lark::routes())
        .with_state(state)
}

/// The one HTTP error type. Its body never carries internal detail.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    #[error("unauthorized")]
    Unauthorized,
    #[error("not found")]
    NotFound,
    #[error("payload too large")]
    TooLarge,
    #[error("service unavailable")]
    Unavailable,
    #[error(transparent)]
    Internal(#[from] anyhow::Error),
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = match &self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::NotFound => StatusCode::NOT_FOUND,
            ApiError::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(e) => {
                tracing::error!(error = format!("{e:#}"), "request failed");
                StatusCode::INTERNAL_SERVER_ERROR
            }
        };
        let msg = match &self {
            ApiError::Internal(_) => "internal error".to_string(),
            other => other.to_string(),
        };
        (status, axum::Json(serde_json::json!({ "error": msg }))).into_response()
    }
}
