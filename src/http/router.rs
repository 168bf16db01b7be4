//! The router's HTTP surface: `GET /router/health`, `GET /router/stats`, and the router as an
//! OpenAI-compatible endpoint, `POST /v1/chat/completions` (plus `GET /v1/models`), behind the
//! `SSHMODE_API_TOKEN` bearer token and off while it is unset. The router status routes need
//! the same token while it is set. Errors on `/v1` use OpenAI's error shape so that SDKs
//! report them properly; they never carry keys or internal detail.
//!
//! A completion request is checked before anything of its body is read: the token first,
//! then a place among [`MAX_CONCURRENT`], then the body (bounded in size here, in time by
//! the server).

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use secrecy::ExposeSecret;
use serde_json::json;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio::sync::Semaphore;

use super::HttpState;
use super::body::{self, BodyError};
use crate::llm::router::RouterError;
use crate::llm::wire::ChatRequest;

/// Largest accepted request body: long agent contexts run to a few MB.
const MAX_BODY: usize = 16 * 1024 * 1024;
/// Completion requests handled at once (body read, then the model call). Past it a request is
/// answered 503 at once: so at most this many bodies of up to [`MAX_BODY`] are held.
pub const MAX_CONCURRENT: usize = 32;

/// `/router/health`, `/router/stats`, `/v1/chat/completions`, `/v1/models`.
pub fn routes() -> Router<HttpState> {
    let places = Arc::new(Semaphore::new(MAX_CONCURRENT));
    Router::new()
        .route("/router/health", get(health))
        .route("/router/stats", get(stats))
        .route(
            "/v1/chat/completions",
            post(move |state, headers, body| chat_completions(state, headers, body, places)),
        )
        .route("/v1/models", get(models))
}

async fn health(State(state): State<HttpState>, headers: HeaderMap) -> Response {
    if let Some(r) = status_refusal(&state, &headers) {
        return r;
    }
    match &state.llm {
        None => Json(json!({ "entries": [], "default_model": null })).into_response(),
        Some(router) => Json(json!({
            "default_model": router.default_model(),
            "entries": router.health().await,
        }))
        .into_response(),
    }
}

async fn stats(State(state): State<HttpState>, headers: HeaderMap) -> Response {
    if let Some(r) = status_refusal(&state, &headers) {
        return r;
    }
    match &state.llm {
        None => Json(json!({ "entries": [], "chains": [] })).into_response(),
        Some(router) => {
            let (entries, chains) = router.stats();
            Json(json!({ "entries": entries, "chains": chains })).into_response()
        }
    }
}

/// The router status routes are open while `SSHMODE_API_TOKEN` is unset (they carry no
/// keys); once it is set they need it too, since they show provider errors.
fn status_refusal(state: &HttpState, headers: &HeaderMap) -> Option<Response> {
    let expected = state.config.api_token.as_ref()?;
    (!bearer_matches(headers, expected.expose_secret())).then(|| {
        (
            StatusCode::UNAUTHORIZED,
            Json(json!({ "error": "missing or wrong bearer token" })),
        )
            .into_response()
    })
}

/// Whether the request carries `Authorization: Bearer <expected>`. Both sides are hashed
/// first so the comparison is constant-time and leaks no length.
fn bearer_matches(headers: &HeaderMap, expected: &str) -> bool {
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .unwrap_or("")
        .trim();
    let a = Sha256::digest(given.as_bytes());
    let b = Sha256::digest(expected.as_bytes());
    !given.is_empty() && bool::from(a.ct_eq(&b))
}

/// An error in OpenAI's shape: `{"error":{"message","type","code"}}`.
fn openai_error(status: StatusCode, kind: &str, code: Option<&str>, message: &str) -> Response {
    (
        status,
        Json(json!({ "error": { "message": message, "type": kind, "code": code, "param": null } })),
    )
        .into_response()
}

/// The refusal to send when the request lacks the configured bearer token (`None`: go on).
/// Both sides are hashed first so the comparison is constant-time and leaks no length.
fn refusal(state: &HttpState, headers: &HeaderMap) -> Option<Response> {
    let Some(expected) = &state.config.api_token else {
        return Some(openai_error(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            Some("endpoint_disabled"),
            "this endpoint is off: set SSHMODE_API_TOKEN to enable it",
        ));
    };
    if !bearer_matches(headers, expected.expose_secret()) {
        return Some(openai_error(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            Some("invalid_api_key"),
            "missing or wrong bearer token",
        ));
    }
    None
}

async fn chat_completions(
    State(state): State<HttpState>,
    headers: HeaderMap,
    body: Body,
    places: Arc<Semaphore>,
) -> Response {
    // Nothing of the body is read before the token is checked and a place is taken.
    if let Some(r) = refusal(&state, &headers) {
        return r;
    }
    let Ok(_place) = places.try_acquire() else {
        return openai_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "service_unavailable",
            Some("server_busy"),
            "too many requests in progress; retry shortly",
        );
    };
    let body = match body::read(&headers, body, MAX_BODY).await {
        Ok(b) => b,
        Err(BodyError::TooLarge) => {
            return openai_error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                Some("request_too_large"),
                "the request body is too large",
            );
        }
        Err(BodyError::TimedOut) => {
            return openai_error(
                StatusCode::REQUEST_TIMEOUT,
                "invalid_request_error",
                Some("request_timeout"),
                "the request body did not arrive in time",
            );
        }
        Err(BodyError::Broken) => return StatusCode::BAD_REQUEST.into_response(),
    };
    let Some(router) = &state.llm else {
        return openai_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "service_unavailable",
            Some("no_model_configured"),
            "no model is configured on this server",
        );
    };
    let request: ChatRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return openai_error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                None,
                &format!("the body is not a chat completions request: {e}"),
            );
        }
    };
    if request.extra.get("stream").and_then(|v| v.as_bool()) == Some(true) {
        return openai_error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            Some("stream_unsupported"),
            "streaming is not supported by this endpoint; send stream: false",
        );
    }
    let model = request.model.clone();
    match router.chat(Some(&model), request).await {
        Ok(routed) => {
            let mut resp = Json(routed.response).into_response();
            let h = resp.headers_mut();
            for (name, value) in [
                ("x-sshmode-provider", routed.served.provider.as_str()),
                ("x-sshmode-model", routed.served.model.as_str()),
            ] {
                if let Ok(v) = HeaderValue::from_str(value) {
                    h.insert(name, v);
                }
            }
            resp
        }
        Err(RouterError::UnknownModel(name)) => openai_error(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            Some("model_not_found"),
            &format!("there is no model called `{name}`; GET /v1/models lists them"),
        ),
        Err(RouterError::Rejected(a)) => {
            let status = a
                .status
                .and_then(|s| StatusCode::from_u16(s).ok())
                .filter(|s| s.is_client_error())
                .unwrap_or(StatusCode::BAD_REQUEST);
            openai_error(
                status,
                "invalid_request_error",
                a.code.as_deref(),
                &a.message,
            )
        }
        Err(e @ RouterError::Unavailable { .. }) => openai_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "service_unavailable",
            Some("no_provider_available"),
            &e.to_string(),
        ),
    }
}

async fn models(State(state): State<HttpState>, headers: HeaderMap) -> Response {
    if let Some(r) = refusal(&state, &headers) {
        return r;
    }
    let data: Vec<_> = state
        .llm
        .iter()
        .flat_map(|r| r.models())
        .map(|m| json!({ "id": m, "object": "model", "created": 0, "owned_by": "sshmode" }))
        .collect();
    Json(json!({ "object": "list", "data": data })).into_response()
}
