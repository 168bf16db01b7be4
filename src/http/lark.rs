//! `POST /lark/events`: verifies, records and answers (invariant 1). It makes no outbound call,
//! and a rejected request leaves nothing behind.
//!
//! # In detail
//!
//! | path | owns | never |
//! |---|---|---|
//! | `src/lark/webhook.rs` | the callback checks, pure: size → signature (raw bytes; no key and no opt-out: refused) → JSON / AES-256-CBC + strict PKCS#7 → envelope (url_verification, v2, v1; section + message id; the envelope to store: the plaintext's own members less the token) → token (digests compared in constant time) → app id → freshness (age and future skew) | I/O; parsing anything unsigned but a ≤ 4 KiB url_verification while a key is set |
//! | `src/lark/json.rs` | `Members`: one JSON object's members as raw, validated text in one pass (no `serde_json::Value`), read as `Value::get` would, and written back less chosen members | deciding what a field means |
//! | `src/http/lark.rs` | `POST /lark/events`: read the body (bounded), admit, check, `Inbox::record`, answer (`{"challenge"}`, `{"msg":"success"}`, a toast for card actions; a click it could not record gets 200 and a busy toast, never an error status) | outbound calls; storing a rejected request |
//! | `src/lark/event.rs` | wire types of `im.message.receive_v1` and `card.action.trigger`; `route` (section + message id for the envelope); → `Message` | deciding what a message means |
//! | `src/frontend/` | the chat domain on Lark: the inbox `Handler` (events → `chat::dispatch`, clicks → `chat::target_approval`), `Reply`, `AdminChannel` and the agent's `ChatOut` over the Open API, `LarkTriage` (the lane: express, inert or ordered; click toasts; no I/O) | deciding what a message means |
//! | `src/frontend/target_approval_card.rs` | the admin approval card of a target (cards 2.0) | deciding what they say |
//! | `src/lark/markup.rs` | the one escaping of model-written text for Lark's renderers: `inert` breaks every mention tag (`<at …>`, `<person …>`, in any case or spacing, as entities, in links and in code) and, outside code, every Lark tag and entity, keeping Markdown; `plain` for one-line names. Used by the answer post, the progress card and `/memory list` | I/O; letting a mention through; relying on Lark decoding entities |
//! | `src/lark/client.rs` | `LarkClient`: one `reqwest::Client`, tenant-token cache, limits (5/s per chat with governor, then the app's 50/s budget through `lane`, and for `im` message APIs 1000 calls per 61 s), retries, typed `LarkError`, `idempotency_key` | deciding what to say |
//! | `src/lark/lane.rs` | one API's call budget on a replica (the client keeps one per API, as the platform counts) in two bounded lanes: `Urgent` (receipt reactions) takes the next free slot ahead of every waiting `Bulk` call of that API; every call also needs room in a sliding window of the API's recent calls (the per-minute allowance), whose last places only urgent calls take; a full urgent lane fails at once, a full bulk lane makes the caller wait for a place; every wait has a deadline (`LarkError::Overloaded`); a caller that gave up takes no slot | sending anything; dropping a waiting call without telling its caller |
//! | `src/inbox/` | `inbox_events`: record (unique event id and message id, section, `seq`), claim in order per section (only a section's head: no older unfinished event of its section; + `FOR UPDATE SKIP LOCKED` + lease), complete, fail (backoff, short schedule for sections, dead letter), hand back, retention cleanup; the worker loop calling the `Handler` it is given | parsing event bodies; knowing its consumer |
//! | `src/chat/` | the domain of SSH Mode, see below | importing `lark` |
//!
//! **Decision: signed-only ingress.** Without an Encrypt Key Lark signs nothing; the static
//! verification token, which travels in every body, is then the only proof of origin, and
//! freshness comes from the sender's own `create_time` — anyone who sees one callback body can
//! forge events as an admin. So `serve` refuses to start without `LARK_ENCRYPT_KEY` (the error
//! says why and where the console sets it) unless `SSHMODE_ALLOW_UNSIGNED_EVENTS=true`, which is
//! warned about at every start; and the callback itself refuses every request (`unsigned`, 401)
//! in that state, so a library user or a test cannot end up unsigned by accident. With a key,
//! nothing is parsed — not even as JSON — before the signature over the raw bytes checks out; the
//! one exception is a request without any signature header, which is parsed only when at most
//! 4 KiB and answered only as a url_verification (PROTOCOL.md: the console's URL check may come
//! unsigned). Tokens and signatures are compared as SHA-256 digests in constant time, so their
//! length does not show; an envelope's `app_id` (v2 `header.app_id`, v1 `event.app_id`) must be
//! `LARK_APP_ID` when present; a request dated more than 5 minutes ahead is refused (`future`) as
//! one older than the retention is (`stale`).
//!
//! **A message's path.** The handler runs `webhook::verify` on the raw bytes; a refusal is counted
//! (`sshmode_events_rejected_total{reason}`) and answered 413/400/401 before anything is written.
//! A verified event is inserted with `ON CONFLICT (event_id) DO NOTHING` (the stored envelope is
//! the decrypted plaintext's own members, written back as they came less the verification token:
//! no `serde_json::Value` is built or serialised again on the way, and PostgreSQL parses the
//! text once, into `jsonb`) and only then acknowledged; a redelivery inserts nothing and is
//! acknowledged the same way. What no handler acts on — a message a bot sent, an event type
//! nothing handles (`frontend::LarkTriage::lane`) — is inserted already done: it still
//! de-duplicates its redeliveries, and no worker claims it. An insert that makes an event
//! claimable wakes one worker (`Inbox::wake`); a 1 s poll
//! catches retries and expired leases. A worker claims up to 16 due sections at once
//! (`inbox::claim_batch`), each one's head (its `available_at` and its section's row moved to
//! the end of the lease, `attempts` bumped) with the events queued behind it; success marks
//! them `done` (`inbox::finish`, which also lets go of the sections), failure sets the next
//! `available_at` (2 s, 4 s, 8 s … ≤ 1 h) or, after `SSHMODE_INBOX_MAX_ATTEMPTS`, `dead`. A
//! worker holding an event at shutdown hands it back (due at once; the attempt stays counted, so
//! the re-run knows it is a retry and does not log the message twice); a process that dies leaves
//! a lease that runs out, and the event is retaken. Handlers run within 90 % of the lease. Done
//! and dead rows older than the de-duplication retention are deleted, at most 50 000 per
//! 10-minute pass.
//!
//! **Slow clients and admission.** The body is read first — at most 1 MiB, within the server's
//! body deadline — holding nothing scarce: a client that sends slowly (and reconnects when cut
//! off) keeps only its own connection busy, never a permit a real delivery needs. Only then does
//! the callback take one of `inbox::ADMITTED_MAX` (512) admissions; past that it still checks
//! the request but stores nothing, and answers 503 (`reason = "saturated"`), so Lark retries —
//! except a card click: Lark never delivers a click again and shows any status but 200 as error
//! 200671, so a click that cannot be recorded (no admission left, or the database refused the
//! write) is answered 200 with an error toast asking for another click, and counted
//! (`reason = "click_busy"`). The server (`http::serve`) bounds
//! the rest: a request head must arrive within `SSHMODE_HTTP_HEADER_TIMEOUT_SECS` (also the idle
//! keep-alive limit), a whole body within `SSHMODE_HTTP_BODY_TIMEOUT_SECS` of its head (408,
//! `reason = "body_timeout"`), and at most `SSHMODE_HTTP_MAX_CONNECTIONS` connections are served
//! at once, further ones waiting in the listen backlog; so bodies in memory are bounded by
//! connections × 1 MiB. HTTP/1 only (an HTTP/2 connection would carry many requests past the
//! connection bound). axum's `serve` has none of these bounds, so the loop is our own, on the
//! same hyper.
//!
//! **Group commit.** An admitted event joins the inbox's queue (bounded by the admissions); if
//! fewer than two flush tasks are running, the request starts one, on the app's `TaskTracker`.
//! A flush task writes everything queued as one multi-row `INSERT … ON CONFLICT DO NOTHING
//! RETURNING event_id` (≤ 256 rows, one commit), hands each request its answer, and repeats until
//! the queue is empty. So an idle service writes each event at once, a loaded one writes batches
//! of whatever arrived during the last commit, and no request waits for a permit to be handed on.
//! One bad event must not fail its batch: U+0000, which JSON may carry but `text` and `jsonb`
//! refuse, is stored as U+FFFD (in the envelope's text, the escape `\u0000` and a lone surrogate
//! escape, which the callback's one-pass check lets through, become `\uFFFD`), and should a
//! batch still fail it is written again row by row, so only the refused row's request fails.
//!
//! **Replay and de-duplication share one window.** A request older than
//! `SSHMODE_DEDUP_RETENTION_HOURS` (by `X-Lark-Request-Timestamp` when signed, else
//! `header.create_time`, v1 `ts`) is refused, and event ids are remembered at least that long, so a
//! replayed event is either refused or recognised.
//!
//! **Exactly-once effects on Lark.** Replies carry a `uuid` derived from (event id, purpose), so a
//! retried job is de-duplicated by Lark itself. The client retries 429 / 99991400 (waiting for
//! `x-ogw-ratelimit-reset`), 5xx and transport errors up to 4 attempts, and refreshes the tenant
//! token once on 99991663/99991664/99991671; any other `code != 0` is a typed error, not retried.
//!
//! **Sections and order.** The section is the `thread_id` when present, else the `chat_id`;
//! `lark::event::route` puts it and the `message_id` on the verified envelope, and the inbox
//! stores both beside the event (never parsing bodies). The INSERT assigns `seq`, the recording
//! order. A claim takes an event only when no older unfinished (pending, not express) event of
//! its section exists, i.e. when it is its section's head. The sections with a claimable head
//! are rows of `inbox_sections`, kept by the inbox's writes (a row appears when a section gets
//! an unfinished event, is leased with its head, and moves to the next head or goes when the
//! run is done), so a claim reads the due sections only — neither the busy ones nor the events
//! queued behind their heads (BENCHMARKS.md) — with `SKIP LOCKED`, so one section is handled one event at
//! a time in recording order across workers and replicas, and sections run in parallel. Express
//! events (`/stop`, card clicks; decided by `frontend::LarkTriage` on the request path) neither wait nor hold.
//! An event of a section gets at most 5 attempts (2 + 4 + 8 + 16 s), then it is dead-lettered and
//! the handler tells the sender. The claim's cost with a deep backlog is in BENCHMARKS.md.
//!
//! **Sections and the event log.** The Lark front-end (`frontend`) appends `message.received` (event and message ids, sender open_id, text)
//! and `bot.reply` (sent message id, text) to that section's log — never tokens or secrets.

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::json;

use super::HttpState;
use super::body::BodyError;
use crate::frontend;
use crate::lark::event;
use crate::lark::webhook::{self, Rejection, SignatureHeaders, Verified};

pub use crate::inbox::SATURATED;

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
    // waiting on its writes. Without an admission the request is still checked, so that a
    // card click is told apart (it is answered 200, see `busy_click`), but nothing is recorded.
    let admitted = state.inbox.admit();
    let started = std::time::Instant::now();
    let answer = receive_inner(&state, &headers, &body, admitted.is_some()).await;
    state
        .metrics
        .event_ack_seconds
        .observe(started.elapsed().as_secs_f64());
    match answer {
        Ok(r) => r,
        Err(Failure::Rejected(r)) => refused(&state, r),
        Err(Failure::Saturated) => {
            state.metrics.rejected(SATURATED);
            tracing::warn!(
                lark.reject = SATURATED,
                "callback refused: too many requests in flight"
            );
            unavailable()
        }
        Err(Failure::Unavailable(e)) => {
            // The platform retries; nothing was acknowledged.
            tracing::error!(error = format!("{e:#}"), "recording a Lark event failed");
            unavailable()
        }
    }
}

/// A card click that could not be recorded: Lark does not retry a click and shows any status
/// but 200 as error 200671, so it is answered 200 with an error toast asking for another
/// click, and counted (`reason = "click_busy"`).
fn busy_click(state: &HttpState, why: &str) -> Response {
    state.metrics.rejected(frontend::CLICK_BUSY);
    tracing::warn!(
        lark.reject = frontend::CLICK_BUSY,
        cause = why,
        "card click not recorded; answered with a busy toast"
    );
    axum::Json(frontend::busy_answer()).into_response()
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
    /// No admission was left: nothing was recorded.
    Saturated,
    Unavailable(anyhow::Error),
}

async fn receive_inner(
    state: &HttpState,
    headers: &HeaderMap,
    body: &Bytes,
    admitted: bool,
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
        Verified::Challenge(c) if admitted => {
            Ok(axum::Json(json!({ "challenge": c })).into_response())
        }
        Verified::Challenge(_) => Err(Failure::Saturated),
        Verified::Event(env) => {
            let click = env.event_type == event::CARD_ACTION;
            if !admitted {
                return if click {
                    Ok(busy_click(state, SATURATED))
                } else {
                    Err(Failure::Saturated)
                };
            }
            // A card click is answered at once with a toast; the decision is the worker's.
            let card = if click {
                Some(state.triage.card_answer(&env).await)
            } else {
                None
            };
            let event_id = env.event_id.clone();
            let fresh = match state.inbox.record(state.triage.inbox_event(env)).await {
                Ok(fresh) => fresh,
                Err(e) if click => {
                    tracing::error!(error = format!("{e:#}"), "recording a card click failed");
                    return Ok(busy_click(state, "unrecorded"));
                }
                Err(e) => return Err(Failure::Unavailable(e)),
            };
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
