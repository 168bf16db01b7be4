//! `POST /lark/events`: verifies, records and answers (invariant 1). It makes no outbound call,
//! and a rejected request leaves nothing behind.

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::json;

use super::HttpState;
use super::body::BodyError;
use crate::inbox::NewEvent;
use crate::lark::event;
use crate::lark::webhook::{self, Envelope, Rejection, SignatureHeaders, Verified};

/// The `reason` label counted when a request is refused because [`crate::inbox::ADMITTED_MAX`]
/// requests are already being recorded (answered 503: the platform retries).
pub const SATURATED: &str = "saturated";

/// `POST /lark/events`.
pub fn routes() -> Router<HttpState> {
    Router::new().route("/lark/events", post(receive))
}

async fn receive(State(state): State<HttpState>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let headers = parts.headers;
    // The body is read first, bounded in size and (by the server) in time, holding nothing
    // scarce: a client that sends slowly keeps only its own connection busy, never a permit
    // a real delivery needs.
    let body = match super::body::read(&headers, body, webhook::MAX_BODY).await {
        Ok(b) => b,
        Err(BodyError::TooLarge) => return refused(&state, Rejection::TooLarge),
        Err(BodyError::TimedOut) => return refused(&state, Rejection::BodyTimeout),
        // The client went away: nobody is left to answer.
        Err(BodyError::Broken) => return StatusCode::BAD_REQUEST.into_response(),
    };
    // Admitted once the body is in: bounds the events queued for the inbox and the tasks
    // waiting on its writes.
    let Some(_admitted) = state.inbox.admit() else {
        state.metrics.rejected(SATURATED);
        tracing::warn!(
            lark.reject = SATURATED,
            "callback refused: too many requests in flight"
        );
        return unavailable();
    };
    match receive_inner(&state, &headers, &body).await {
        Ok(r) => r,
        Err(Failure::Rejected(r)) => refused(&state, r),
        Err(Failure::Unavailable(e)) => {
            // The platform retries; nothing was acknowledged.
            tracing::error!(error = format!("{e:#}"), "recording a Lark event failed");
            unavailable()
        }
    }
}

/// A refused request: counted by reason, answered with its status and a short reason.
fn refused(state: &HttpState, r: Rejection) -> Response {
    state.metrics.rejected(r.reason());
    tracing::info!(lark.reject = r.reason(), "callback refused");
    let status = StatusCode::from_u16(r.status()).unwrap_or(StatusCode::BAD_REQUEST);
    (status, axum::Json(json!({ "error": r.to_string() }))).into_response()
}

/// `{"msg":"success"}`, the acknowledgement of an event, from a constant body.
fn success() -> Response {
    let mut r = Response::new(axum::body::Body::from(&br#"{"msg":"success"}"#[..]));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

fn unavailable() -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        axum::Json(json!({ "error": "temporarily unavailable" })),
    )
        .into_response()
}

enum Failure {
    Rejected(Rejection),
    Unavailable(anyhow::Error),
}

async fn receive_inner(
    state: &HttpState,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Response, Failure> {
    let Some(lark) = state.config.lark.as_ref() else {
        return Err(Failure::Unavailable(anyhow::anyhow!(
            "LARK_* credentials are not configured"
        )));
    };
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let sig = SignatureHeaders {
        timestamp: get(webhook::HEADER_TIMESTAMP),
        nonce: get(webhook::HEADER_NONCE),
        signature: get(webhook::HEADER_SIGNATURE),
    };
    let verified = webhook::verify(
        lark,
        sig,
        body,
        state.clock.now(),
        state.config.inbox.dedup_retention,
    )
    .map_err(Failure::Rejected)?;
    match verified {
        Verified::Challenge(c) => Ok(axum::Json(json!({ "challenge": c })).into_response()),
        Verified::Event(env) => {
            // A card click is answered at once with a toast; the decision is the worker's.
            let card =
                (env.event_type == event::CARD_ACTION).then(|| state.triage.card_answer(&env));
            let event_id = env.event_id.clone();
            let fresh = state
                .inbox
                .record(new_event(&state.triage, env))
                .await
                .map_err(Failure::Unavailable)?;
            if fresh {
                state.metrics.events_received.inc();
            } else {
                state.metrics.events_duplicate.inc();
            }
            tracing::debug!(lark.event_id = %event_id, fresh, "event recorded");
            if let Some(answer) = card {
                Ok(axum::Json(answer).into_response())
            } else {
                Ok(success())
            }
        }
    }
}

/// The inbox's event for a verified envelope.
fn new_event(triage: &crate::frontend::LarkTriage, env: Envelope) -> NewEvent {
    NewEvent {
        express: triage.express(&env),
        event_id: env.event_id,
        event_type: env.event_type,
        payload: env.payload,
        section: env.section,
        message_id: env.message_id,
    }
}
