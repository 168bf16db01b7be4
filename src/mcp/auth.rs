//! The bearer check in front of the MCP service: a request without a valid, unexpired token is
//! answered `401` from its head alone (its body is never read); a valid one goes on with its
//! [`Token`] in the request's extensions, where the tools find their caller. A token verified
//! in the last [`super::fresh::FRESH`] is taken without reading its row again (so a revocation
//! reaches a client already calling within that bound); its expiry is checked every time. A request that
//! would open a 2025-era session past the bound is answered `503`.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use sqlx::PgPool;

use super::fresh::Fresh;
use super::token::{self, Refusal, Token};
use crate::clock::Clock;

/// What the check needs.
#[derive(Clone)]
pub struct Gate {
    pub db: PgPool,
    pub clock: Arc<dyn Clock>,
    /// The service's sessions, counted against `max_sessions`.
    pub sessions: Arc<LocalSessionManager>,
    pub max_sessions: usize,
    /// Tokens verified in the last [`super::fresh::FRESH`], by their SHA-256: a revocation
    /// reaches a client already calling within that bound; an expiry is checked every time.
    pub tokens: Arc<Fresh<Vec<u8>, Token>>,
}

/// The middleware: the token first, then the session bound, then the service.
pub async fn check(State(gate): State<Gate>, mut req: Request, next: Next) -> Response {
    let bearer = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim);
    let Some(bearer) = bearer else {
        return unauthorized(Refusal::Invalid);
    };
    let key = token::digest(bearer);
    let now = gate.clock.now();
    let token: Token = match gate.tokens.get(&key, Instant::now()) {
        Some(t) if t.expired(now) => return unauthorized(Refusal::Expired),
        Some(t) => t,
        None => match token::check(&gate.db, bearer, now).await {
            Ok(Ok(t)) => {
                gate.tokens.put(key, t.clone(), Instant::now());
                t
            }
            Ok(Err(r)) => return unauthorized(r),
            Err(e) => {
                tracing::warn!(error = %e, "checking an MCP token failed");
                return (StatusCode::SERVICE_UNAVAILABLE, "try again shortly").into_response();
            }
        },
    };
    // Only a POST without a session may open one (`initialize`); at the bound it waits for
    // idle sessions to close (they do after five minutes without a request).
    if req.method() == axum::http::Method::POST
        && !req.headers().contains_key("mcp-session-id")
        && gate.sessions.sessions.read().await.len() >= gate.max_sessions
    {
        tracing::warn!(
            mcp.max_sessions = gate.max_sessions,
            "MCP session bound reached"
        );
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "too many MCP sessions are open; close one or try again later",
        )
            .into_response();
    }
    req.extensions_mut().insert(token);
    next.run(req).await
}

fn unauthorized(why: Refusal) -> Response {
    let mut r = Response::new(Body::from(why.to_string()));
    *r.status_mut() = StatusCode::UNAUTHORIZED;
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"sshmode\""),
    );
    r
}
