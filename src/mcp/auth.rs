//! The bearer check in front of the MCP service: a request without a valid, unexpired token is
//! answered `401` from its head alone (its body is never read); a valid one goes on with its
//! [`Token`] in the request's extensions, where the tools find their caller. A token verified
//! in the last [`super::fresh::FRESH`] is taken without reading its row again (so a revocation
//! reaches a client already calling within that bound); its expiry is checked every time. A request that
//! would open a 2025-era session past the bound — the endpoint's, or the token's own, so that
//! one token never holds every session — is answered `503`. A session belongs to the token
//! that opened it: another token's request naming it is answered `404`.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
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
    /// Sessions one token may hold.
    pub max_sessions_per_token: usize,
    /// The sessions each token opened, by [`Token::key`] (pruned of sessions the service has
    /// closed whenever a token opens one).
    pub owners: Arc<Mutex<HashMap<String, HashSet<String>>>>,
    /// Tokens verified in the last [`super::fresh::FRESH`], by their SHA-256: a revocation
    /// reaches a client already calling within that bound; an expiry is checked every time.
    pub tokens: Arc<Fresh<Vec<u8>, Token>>,
}

/// The middleware: the token first, then the session it names (its own only) or the session
/// bounds, then the service.
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
    let owner = token.key();
    if let Some(session) = req
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
    {
        if gate.owner_of(session).is_some_and(|o| o != owner) {
            return (StatusCode::NOT_FOUND, "no such MCP session").into_response();
        }
        req.extensions_mut().insert(token);
        return next.run(req).await;
    }
    // Only a POST without a session may open one (`initialize`); at the bound it waits for
    // idle sessions to close (they do after five minutes without a request).
    let opens = req.method() == axum::http::Method::POST;
    if opens && gate.sessions.sessions.read().await.len() >= gate.max_sessions {
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
    let name = token.name.clone();
    req.extensions_mut().insert(token);
    let response = next.run(req).await;
    // Whether the request opened a session shows only in its answer (a stateless request
    // opens none): one that would put the token past its own bound is closed at once.
    let opened = response
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    if let (true, Some(session)) = (opens, opened)
        && !gate.hold(&owner, &session).await
    {
        use rmcp::transport::streamable_http_server::session::SessionManager as _;
        let _ = gate
            .sessions
            .close_session(&Arc::from(session.as_str()))
            .await;
        return too_many_for(&name, gate.max_sessions_per_token);
    }
    response
}

impl Gate {
    /// The token (key) that opened `session`, if a token did.
    fn owner_of(&self, session: &str) -> Option<String> {
        let owners = self.owners.lock().expect("mcp sessions lock");
        owners
            .iter()
            .find(|(_, ids)| ids.contains(session))
            .map(|(key, _)| key.clone())
    }

    /// Records `session` as opened by the token `key`; `false` (and nothing recorded) when
    /// that would put the token past its bound. Sessions the service has closed since are
    /// forgotten first (of every token, so the map never outgrows the service's sessions).
    async fn hold(&self, key: &str, session: &str) -> bool {
        let live: HashSet<String> = self
            .sessions
            .sessions
            .read()
            .await
            .keys()
            .map(|id| id.to_string())
            .collect();
        let mut owners = self.owners.lock().expect("mcp sessions lock");
        owners.retain(|_, ids| {
            ids.retain(|id| live.contains(id));
            !ids.is_empty()
        });
        let ids = owners.entry(key.to_string()).or_default();
        if ids.len() >= self.max_sessions_per_token {
            return false;
        }
        ids.insert(session.to_string());
        true
    }
}

fn too_many_for(name: &str, most: usize) -> Response {
    tracing::warn!(
        mcp.token = %name,
        mcp.max_sessions_per_token = most,
        "an MCP token's session bound reached"
    );
    (
        StatusCode::SERVICE_UNAVAILABLE,
        format!(
            "the token `{name}` holds {most} MCP sessions already, the most one token may hold; close one (DELETE with its Mcp-Session-Id) or wait for an idle one to close"
        ),
    )
        .into_response()
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
