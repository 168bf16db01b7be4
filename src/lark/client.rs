//! The Lark Open API client: one `reqwest::Client` (rustls on ring) against a configurable base
//! URL, the tenant access token cache, outbound rate limits (per chat, then the budget of the
//! API called — the platform counts its limits per API — in two lanes: receipt reactions ahead
//! of bulk traffic, see [`super::lane`]; then, when given the database, the deployment's
//! budgets shared by every replica, see [`super::budget`]; streamed CardKit updates are exempt,
//! as on the platform), retries with backoff on rate limits (HTTP 429, and the message APIs'
//! 230020 and 11232, which no budget of ours prevents: a group's limit is shared by every bot in
//! it), 5xx and transport errors, and typed errors for `code != 0`. It also reads messages back
//! by id and downloads a message's files, streaming under a byte cap (an HTTP 200 body is the
//! file, whatever its type).
//!
//! It never decides what to say; callers pass content and an idempotency `uuid` derived from
//! what they answer, so a retried job never posts twice. Secrets (app secret, tenant token)
//! never appear in errors or logs.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use reqwest::{Method, StatusCode};
use secrecy::{ExposeSecret, SecretString};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::sync::{Mutex, OnceCell};
use tokio::time::Instant;

use super::budget::SharedBudget;
use super::lane::{LaneConfig, Lanes, Overloaded, Priority};
use crate::metrics::{LarkCallLabels, Metrics};

/// Token-invalid codes: drop the cached token, fetch a new one, retry once.
const TOKEN_INVALID: [i64; 3] = [99991663, 99991664, 99991671];
/// The rate-limit code (with HTTP 429, or 400 on some older APIs).
const RATE_LIMITED: i64 = 99991400;
/// The message APIs' own frequency limits, answered with HTTP 400: 230020 ("the operation
/// triggers the frequency limit", e.g. a group's 5 calls a second, shared by every bot in it)
/// and 11232. Backed off and retried like a 429; the `uuid` makes a resent message safe.
const FREQUENCY_LIMITED: [i64; 2] = [230020, 11232];
/// The app lacks the scope an API needs.
pub const NO_SCOPE: i64 = 99991672;
/// A message request over Lark's size limit.
pub const TOO_LARGE: i64 = 230025;
/// Lark's limit on a post or card message request, measured on the serialized request body
/// (`content` is JSON inside that JSON, so its quotes and backslashes count twice).
pub const MAX_POST_REQUEST: usize = 30 * 1024;
/// Attempts per call, counting the first.
const MAX_ATTEMPTS: u32 = 4;
/// Longest single wait between attempts of the exponential backoff.
const MAX_BACKOFF: Duration = Duration::from_secs(20);
/// Longest `x-ogw-ratelimit-reset` honoured: a minute (the frequency limits' longest window).
const MAX_RESET: Duration = Duration::from_secs(60);
/// A token is used until this long before it expires.
const TOKEN_MARGIN: Duration = Duration::from_secs(300);
/// Per-request timeout.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);
/// Per-chat limiter entries kept before idle ones are pruned.
const MAX_CHAT_KEYS: usize = 10_000;
/// Lark allows about 5 messages a second per chat (shared with every bot in it).
const CHAT_RATE: u32 = 5;
/// Each API's budget on this replica (the deployment's, shared by replicas, is
/// [`super::budget`]'s): 40 calls/s with a burst of 5 (at most 45 in any second, under the
/// platform's 50 per API), and at most 950 in any 61 s (its 1000 a minute) with the last 50 of
/// those for receipts. Queue bounds: receipts are one per incoming message and each waits at most
/// a few slots, so 256 waiting means something is badly wrong and a further one fails at once;
/// bulk callers are the bounded set of workers, turns and progress cards, and one finding 1024
/// waiting waits for a place. A receipt that cannot go out within 3 s is dropped (it would come
/// after the answer it announces); a bulk call gives up after 60 s. Either with
/// [`LarkError::Overloaded`].
const LANES: LaneConfig = LaneConfig {
    interval: Duration::from_millis(25),
    burst: 5,
    urgent_capacity: 256,
    bulk_capacity: 1024,
    urgent_wait: Duration::from_secs(3),
    bulk_wait: Duration::from_secs(60),
    window: super::budget::WINDOW,
    window_max: super::budget::PER_WINDOW as usize,
    urgent_reserve: 50,
};
/// The APIs whose calls take no place in any budget: CardKit's streamed element updates, which
/// the platform exempts from its API limits (each card's own 10 operations a second is kept by
/// the progress writer's pace).
const EXEMPT: [&str; 1] = ["cardkit_content"];
/// How long one resource download may take, the body included.
const DOWNLOAD_TIMEOUT: Duration = Duration::from_secs(120);
/// Most messages read from one `GET /messages/{id}` answer (a forwarded bundle lists its
/// messages there); the rest are counted, not read.
pub const MAX_FETCHED: usize = 50;
/// `uuid` may be at most 50 characters.
const UUID_LEN: usize = 40;
/// Largest answer read from the Open API (its answers are a few kilobytes); a longer one is
/// unreadable, not buffered.
pub const MAX_RESPONSE: usize = 1024 * 1024;

/// What went wrong with a call. Messages carry codes and Lark's `msg`, never tokens.
#[derive(Debug, thiserror::Error)]
pub enum LarkError {
    #[error("Lark API {api} answered code {code}: {msg}")]
    Api {
        api: &'static str,
        code: i64,
        msg: String,
    },
    #[error("Lark API {api} is rate limiting and retries ran out")]
    RateLimited { api: &'static str },
    #[error("Lark API {api} failed with HTTP {status}")]
    Http { api: &'static str, status: u16 },
    #[error("Lark API {api} could not be reached: {reason}")]
    Transport { api: &'static str, reason: String },
    #[error("Lark API {api} answered something unreadable")]
    Decode { api: &'static str },
    #[error("no tenant access token: {0}")]
    Token(String),
    #[error("Lark API {api} was not called: the app's call budget is overloaded ({why})")]
    Overloaded { api: &'static str, why: Overloaded },
}

/// Message content in one of the shapes Lark takes.
#[derive(Debug, Clone)]
pub enum Content {
    Text(String),
    /// A `post` (rich text) body.
    Post(Value),
    /// An interactive card.
    Card(Value),
}

impl Content {
    fn msg_type(&self) -> &'static str {
        match self {
            Content::Text(_) => "text",
            Content::Post(_) => "post",
            Content::Card(_) => "interactive",
        }
    }

    /// `content` is a JSON document inside a string.
    fn encoded(&self) -> String {
        match self {
            Content::Text(t) => json!({ "text": t }).to_string(),
            Content::Post(v) | Content::Card(v) => v.to_string(),
        }
    }
}

/// Where a sent message landed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    pub message_id: String,
    pub chat_id: Option<String>,
    /// Set when the message is in a thread (always after `reply_in_thread`).
    pub thread_id: Option<String>,
}

/// A message read back by id (`GET /open-apis/im/v1/messages/{message_id}`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched {
    pub message_id: String,
    pub msg_type: String,
    /// `body.content`: a JSON string, as in a received message.
    pub content: String,
    /// The sender's id (an open_id for people, an app id for bots).
    pub sender_id: String,
    /// `user` or `app`.
    pub sender_type: String,
    /// Set on the messages inside a forwarded bundle: the bundle's id.
    pub upper_message_id: Option<String>,
    pub deleted: bool,
    /// `(placeholder, name)` of each mention.
    pub mentions: Vec<(String, String)>,
}

/// Why a resource was not downloaded.
#[derive(Debug, thiserror::Error)]
pub enum DownloadError {
    /// Larger than the cap: refused before or while reading, nothing of it kept.
    #[error("larger than {limit} bytes")]
    TooLarge { limit: u64 },
    #[error(transparent)]
    Lark(#[from] LarkError),
}

/// Reads an answer as JSON, at most [`MAX_RESPONSE`] bytes of it; `None` when it is longer,
/// cut off, or not JSON.
async fn read_json(mut resp: reqwest::Response) -> Option<Value> {
    if resp
        .content_length()
        .is_some_and(|n| n > MAX_RESPONSE as u64)
    {
        return None;
    }
    let mut out = Vec::new();
    while let Some(chunk) = resp.chunk().await.ok()? {
        if out.len() + chunk.len() > MAX_RESPONSE {
            return None;
        }
        out.extend_from_slice(&chunk);
    }
    serde_json::from_slice(&out).ok()
}

/// An idempotency key for a message send: the same inputs always give the same ≤ 50-character
/// `uuid`, so Lark drops a retried send.
pub fn idempotency_key(answered: &str, purpose: &str) -> String {
    let mut h = Sha256::new();
    h.update(answered.as_bytes());
    h.update([0]);
    h.update(purpose.as_bytes());
    let mut s = hex::encode(h.finalize());
    s.truncate(UUID_LEN);
    s
}

struct CachedToken {
    token: SecretString,
    refresh_at: Instant,
}

/// The Open API client. One per app, shared.
pub struct LarkClient {
    /// One connection pool for every call.
    http: reqwest::Client,
    /// `LARK_BASE_URL`, without trailing slash (tests point it at a fake).
    base: String,
    app_id: String,
    app_secret: SecretString,
    /// The tenant token; the lock also makes concurrent refreshes wait for one fetch.
    token: Mutex<Option<CachedToken>>,
    /// The bot's own open_id (`/bot/v3/info`), fetched once on first need.
    bot_open_id: OnceCell<String>,
    /// One budget per API (the platform counts per API), each receipts first; made on first
    /// use, for the fixed set of APIs the client calls.
    api_limits: std::sync::Mutex<std::collections::HashMap<&'static str, Arc<Lanes>>>,
    /// Keeps each chat under Lark's per-chat ceiling.
    chat_limit: DefaultKeyedRateLimiter<String>,
    /// The deployment's budgets, when the client was given the database.
    budget: Option<SharedBudget>,
    metrics: Arc<Metrics>,
}

impl LarkClient {
    pub fn new(
        base: &str,
        app_id: &str,
        app_secret: SecretString,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Self> {
        crate::install_crypto_provider();
        let http = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .connect_timeout(Duration::from_secs(5))
            .pool_max_idle_per_host(16)
            .build()
            .map_err(|e| anyhow::anyhow!("building the Lark HTTP client failed: {e}"))?;
        let per_sec = |n| Quota::per_second(NonZeroU32::new(n).expect("non-zero rate"));
        Ok(LarkClient {
            http,
            base: base.trim_end_matches('/').to_string(),
            app_id: app_id.to_string(),
            app_secret,
            token: Mutex::new(None),
            bot_open_id: OnceCell::new(),
            api_limits: Default::default(),
            chat_limit: RateLimiter::keyed(per_sec(CHAT_RATE)),
            budget: None,
            metrics,
        })
    }

    /// Keeps every call also within the deployment's budgets in `db`, which every replica
    /// shares (the service does this; a client without it keeps its own limits only).
    pub fn with_shared_budget(mut self, db: sqlx::PgPool) -> Self {
        self.budget = Some(SharedBudget::new(db, &self.app_id));
        self
    }

    /// The app's id (`LARK_APP_ID`): the sender id of the bot's own messages.
    pub fn app_id(&self) -> &str {
        &self.app_id
    }

    /// Obtains a tenant access token (`sshmode doctor`: the credentials work).
    pub async fn check_token(&self) -> Result<(), LarkError> {
        self.token().await.map(|_| ())
    }

    /// The bot's own open_id, cached after the first successful call.
    pub async fn bot_open_id(&self) -> Result<String, LarkError> {
        self.bot_open_id
            .get_or_try_init(|| async {
                let v = self
                    .call(
                        "bot_info",
                        Method::GET,
                        "/open-apis/bot/v3/info",
                        None,
                        None,
                    )
                    .await?;
                v.pointer("/bot/open_id")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
                    .ok_or(LarkError::Decode { api: "bot_info" })
            })
            .await
            .cloned()
    }

    /// Sends a new message to a chat.
    pub async fn send(
        &self,
        chat_id: &str,
        content: &Content,
        uuid: &str,
    ) -> Result<Sent, LarkError> {
        self.send_to("chat_id", chat_id, content, uuid).await
    }

    /// Sends a new message to one user, one-to-one, by open_id.
    pub async fn send_to_user(
        &self,
        open_id: &str,
        content: &Content,
        uuid: &str,
    ) -> Result<Sent, LarkError> {
        self.send_to("open_id", open_id, content, uuid).await
    }

    /// `POST /open-apis/im/v1/messages` to `receive_id` of the given `receive_id_type`.
    async fn send_to(
        &self,
        id_type: &'static str,
        receive_id: &str,
        content: &Content,
        uuid: &str,
    ) -> Result<Sent, LarkError> {
        let body = json!({
            "receive_id": receive_id,
            "msg_type": content.msg_type(),
            "content": content.encoded(),
            "uuid": uuid,
        });
        let path = format!("/open-apis/im/v1/messages?receive_id_type={id_type}");
        let v = self
            .call("send", Method::POST, &path, Some(body), Some(receive_id))
            .await?;
        sent("send", &v)
    }

    /// Replies to a message (an `om_` id). `in_thread` opens or continues a thread; the answer
    /// names the thread.
    pub async fn reply(
        &self,
        message_id: &str,
        content: &Content,
        in_thread: bool,
        uuid: &str,
        chat_key: Option<&str>,
    ) -> Result<Sent, LarkError> {
        let body = reply_body(content, in_thread, uuid);
        let path = format!(
            "/open-apis/im/v1/messages/{}/reply",
            path_segment(message_id)
        );
        let v = self
            .call(
                "reply",
                Method::POST,
                &path,
                Some(body),
                chat_key.or(Some(message_id)),
            )
            .await?;
        sent("reply", &v)
    }

    /// Edits a text or post message (PUT) or a card (PATCH).
    pub async fn edit(&self, message_id: &str, content: &Content) -> Result<(), LarkError> {
        let path = format!("/open-apis/im/v1/messages/{}", path_segment(message_id));
        let (api, method, body) = match content {
            Content::Card(_) => (
                "edit_card",
                Method::PATCH,
                json!({ "content": content.encoded() }),
            ),
            _ => (
                "edit",
                Method::PUT,
                json!({ "msg_type": content.msg_type(), "content": content.encoded() }),
            ),
        };
        self.call(api, method, &path, Some(body), Some(message_id))
            .await?;
        Ok(())
    }

    /// CardKit: creates a card entity from a JSON 2.0 card; returns its `card_id`.
    pub async fn cardkit_create(&self, card: &Value) -> Result<String, LarkError> {
        let body = json!({ "type": "card_json", "data": card.to_string() });
        let v = self
            .call(
                "cardkit_create",
                Method::POST,
                "/open-apis/cardkit/v1/cards",
                Some(body),
                None,
            )
            .await?;
        v.pointer("/data/card_id")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or(LarkError::Decode {
                api: "cardkit_create",
            })
    }

    /// CardKit: replaces the full text of a card's `markdown` element.
    pub async fn cardkit_content(
        &self,
        card_id: &str,
        element_id: &str,
        content: &str,
        sequence: i32,
        uuid: &str,
    ) -> Result<(), LarkError> {
        let path = format!(
            "/open-apis/cardkit/v1/cards/{}/elements/{}/content",
            path_segment(card_id),
            path_segment(element_id)
        );
        let body = json!({ "content": content, "sequence": sequence, "uuid": uuid });
        self.call("cardkit_content", Method::PUT, &path, Some(body), None)
            .await?;
        Ok(())
    }

    /// CardKit: changes a card's settings (`config`: streaming mode, summary).
    pub async fn cardkit_settings(
        &self,
        card_id: &str,
        config: &Value,
        sequence: i32,
        uuid: &str,
    ) -> Result<(), LarkError> {
        let path = format!(
            "/open-apis/cardkit/v1/cards/{}/settings",
            path_segment(card_id)
        );
        let body = json!({
            "settings": json!({ "config": config }).to_string(),
            "sequence": sequence,
            "uuid": uuid,
        });
        self.call("cardkit_settings", Method::PATCH, &path, Some(body), None)
            .await?;
        Ok(())
    }

    /// CardKit: replaces a whole card by a JSON 2.0 card.
    pub async fn cardkit_update(
        &self,
        card_id: &str,
        card: &Value,
        sequence: i32,
        uuid: &str,
    ) -> Result<(), LarkError> {
        let path = format!("/open-apis/cardkit/v1/cards/{}", path_segment(card_id));
        let body = json!({
            "card": { "type": "card_json", "data": card.to_string() },
            "sequence": sequence,
            "uuid": uuid,
        });
        self.call("cardkit_update", Method::PUT, &path, Some(body), None)
            .await?;
        Ok(())
    }

    /// CardKit: removes an element from a card.
    pub async fn cardkit_delete_element(
        &self,
        card_id: &str,
        element_id: &str,
        sequence: i32,
        uuid: &str,
    ) -> Result<(), LarkError> {
        let path = format!(
            "/open-apis/cardkit/v1/cards/{}/elements/{}",
            path_segment(card_id),
            path_segment(element_id)
        );
        let body = json!({ "sequence": sequence, "uuid": uuid });
        self.call(
            "cardkit_delete_element",
            Method::DELETE,
            &path,
            Some(body),
            None,
        )
        .await?;
        Ok(())
    }

    /// Adds an emoji reaction; returns its id (for removal). Waits in the bulk lane.
    pub async fn add_reaction(&self, message_id: &str, emoji: &str) -> Result<String, LarkError> {
        self.react(message_id, emoji, Priority::Bulk).await
    }

    /// Adds the receipt reaction a user waits to see: it takes the app's next free call slot,
    /// ahead of every waiting reply, final reaction or card update.
    pub async fn add_receipt(&self, message_id: &str, emoji: &str) -> Result<String, LarkError> {
        self.react(message_id, emoji, Priority::Urgent).await
    }

    async fn react(
        &self,
        message_id: &str,
        emoji: &str,
        priority: Priority,
    ) -> Result<String, LarkError> {
        let path = format!(
            "/open-apis/im/v1/messages/{}/reactions",
            path_segment(message_id)
        );
        let body = json!({ "reaction_type": { "emoji_type": emoji } });
        let v = self
            .call_in(
                priority,
                "add_reaction",
                Method::POST,
                &path,
                Some(body),
                Some(message_id),
            )
            .await?;
        v.pointer("/data/reaction_id")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or(LarkError::Decode {
                api: "add_reaction",
            })
    }

    pub async fn remove_reaction(
        &self,
        message_id: &str,
        reaction_id: &str,
    ) -> Result<(), LarkError> {
        let path = format!(
            "/open-apis/im/v1/messages/{}/reactions/{}",
            path_segment(message_id),
            path_segment(reaction_id)
        );
        self.call(
            "remove_reaction",
            Method::DELETE,
            &path,
            None,
            Some(message_id),
        )
        .await?;
        Ok(())
    }

    fn count(&self, api: &'static str, outcome: &'static str) {
        self.metrics
            .lark_api_calls
            .get_or_create(&LarkCallLabels {
                api: api.to_string(),
                outcome: outcome.to_string(),
            })
            .inc();
    }

    /// A message by id, and for a forwarded bundle the messages inside it (at most
    /// [`MAX_FETCHED`] of all of them).
    pub async fn get_message(&self, message_id: &str) -> Result<Vec<Fetched>, LarkError> {
        let api = "message_get";
        let path = format!("/open-apis/im/v1/messages/{}", path_segment(message_id));
        let v = self.call(api, Method::GET, &path, None, None).await?;
        let items = v
            .pointer("/data/items")
            .and_then(Value::as_array)
            .ok_or(LarkError::Decode { api })?;
        let s = |v: &Value, p: &str| {
            v.pointer(p)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        Ok(items
            .iter()
            .take(MAX_FETCHED)
            .map(|m| Fetched {
                message_id: s(m, "/message_id"),
                msg_type: s(m, "/msg_type"),
                content: s(m, "/body/content"),
                sender_id: s(m, "/sender/id"),
                sender_type: s(m, "/sender/sender_type"),
                upper_message_id: Some(s(m, "/upper_message_id")).filter(|u| !u.is_empty()),
                deleted: m.get("deleted").and_then(Value::as_bool).unwrap_or(false),
                mentions: m
                    .get("mentions")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .map(|x| (s(x, "/key"), s(x, "/name")))
                    .collect(),
            })
            .collect())
    }

    /// Downloads a file or image of a message (`GET …/messages/{id}/resources/{key}?type=`),
    /// streaming, at most `max` bytes: a larger one is refused by its declared length, or
    /// as soon as what arrived passes `max`, and what was read is dropped. An HTTP 200 body is
    /// the file whatever its `Content-Type`; only a non-2xx answer is read as an error.
    pub async fn download(
        &self,
        message_id: &str,
        key: &str,
        download_type: &str,
        max: u64,
    ) -> Result<Vec<u8>, DownloadError> {
        let api = "message_resource";
        let path = format!(
            "/open-apis/im/v1/messages/{}/resources/{}?type={}",
            path_segment(message_id),
            path_segment(key),
            if download_type == "image" {
                "image"
            } else {
                "file"
            }
        );
        let url = format!("{}{}", self.base, path);
        let mut token_refreshed = false;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let last = attempt >= MAX_ATTEMPTS;
            self.admit(Priority::Bulk, api, None).await?;
            let token = self.token().await?;
            let sent = self
                .http
                .get(&url)
                .bearer_auth(token.expose_secret())
                .timeout(DOWNLOAD_TIMEOUT)
                .send()
                .await;
            let mut resp = match sent {
                Ok(r) => r,
                Err(e) => {
                    self.count(api, "transport");
                    if last {
                        return Err(LarkError::Transport {
                            api,
                            reason: without_url(&e),
                        }
                        .into());
                    }
                    tokio::time::sleep(backoff(attempt)).await;
                    continue;
                }
            };
            let status = resp.status();
            // A 200 is the file, whatever its Content-Type says (a `.json` file comes as
            // `application/json`); only another status carries an error body.
            if status.is_success() {
                if resp.content_length().is_some_and(|n| n > max) {
                    self.count(api, "too_large");
                    return Err(DownloadError::TooLarge { limit: max });
                }
                let mut out = Vec::new();
                loop {
                    let chunk = match resp.chunk().await {
                        Ok(Some(c)) => c,
                        Ok(None) => break,
                        Err(e) => {
                            self.count(api, "transport");
                            return Err(LarkError::Transport {
                                api,
                                reason: without_url(&e),
                            }
                            .into());
                        }
                    };
                    if (out.len() + chunk.len()) as u64 > max {
                        self.count(api, "too_large");
                        return Err(DownloadError::TooLarge { limit: max });
                    }
                    out.extend_from_slice(&chunk);
                }
                self.count(api, "ok");
                return Ok(out);
            }
            // An error comes as the usual JSON answer.
            let code = read_json(resp)
                .await
                .map(|v| (v.get("code").and_then(Value::as_i64), v));
            let code_of = code.as_ref().and_then(|(c, _)| *c);
            if is_rate_limit(status, code_of, true) {
                self.count(api, "rate_limited");
                if last {
                    return Err(LarkError::RateLimited { api }.into());
                }
                tokio::time::sleep(backoff(attempt)).await;
                continue;
            }
            if status.is_server_error() && !last {
                self.count(api, "retry");
                tokio::time::sleep(backoff(attempt)).await;
                continue;
            }
            if let Some(c) = code_of
                && TOKEN_INVALID.contains(&c)
                && !token_refreshed
            {
                token_refreshed = true;
                self.drop_token().await;
                attempt -= 1;
                continue;
            }
            self.count(api, "error");
            return Err(match code {
                Some((Some(code), v)) if code != 0 => LarkError::Api {
                    api,
                    code,
                    msg: v
                        .get("msg")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string(),
                },
                _ => LarkError::Http {
                    api,
                    status: status.as_u16(),
                },
            }
            .into());
        }
    }

    /// Waits for the chat's limit, then a slot of `api`'s budget in `priority`'s lane, then the
    /// deployment's budget for `api`. An exempt API waits for none of them.
    async fn admit(
        &self,
        priority: Priority,
        api: &'static str,
        chat_key: Option<&str>,
    ) -> Result<(), LarkError> {
        if EXEMPT.contains(&api) {
            return Ok(());
        }
        if let Some(key) = chat_key {
            if self.chat_limit.len() > MAX_CHAT_KEYS {
                self.chat_limit.retain_recent();
            }
            self.chat_limit.until_key_ready(&key.to_string()).await;
        }
        let lanes = self
            .api_limits
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(api)
            .or_insert_with(|| Arc::new(Lanes::new(LANES)))
            .clone();
        if let Err(why) = lanes.acquire(priority).await {
            self.count(api, "overloaded");
            return Err(LarkError::Overloaded { api, why });
        }
        if let Some(budget) = &self.budget {
            let wait = match priority {
                Priority::Urgent => LANES.urgent_wait,
                Priority::Bulk => LANES.bulk_wait,
            };
            if let Err(why) = budget.take(priority, api, chat_key, wait).await {
                self.count(api, "overloaded");
                return Err(LarkError::Overloaded { api, why });
            }
        }
        Ok(())
    }

    /// A cached token, or a new one.
    async fn token(&self) -> Result<SecretString, LarkError> {
        let mut slot = self.token.lock().await;
        if let Some(t) = slot.as_ref()
            && Instant::now() < t.refresh_at
        {
            return Ok(t.token.clone());
        }
        let body = json!({ "app_id": self.app_id, "app_secret": self.app_secret.expose_secret() });
        let url = format!(
            "{}/open-apis/auth/v3/tenant_access_token/internal",
            self.base
        );
        let resp = self.http.post(url).json(&body).send().await.map_err(|e| {
            self.count("token", "transport");
            LarkError::Token(format!("transport error: {}", without_url(&e)))
        })?;
        let status = resp.status();
        let v: Value = read_json(resp).await.ok_or_else(|| {
            self.count("token", "error");
            LarkError::Token(format!("unreadable answer (HTTP {status})"))
        })?;
        let code = v.get("code").and_then(Value::as_i64).unwrap_or(-1);
        let token = v.get("tenant_access_token").and_then(Value::as_str);
        let (0, Some(token)) = (code, token) else {
            self.count("token", "error");
            let msg = v.get("msg").and_then(Value::as_str).unwrap_or("");
            return Err(LarkError::Token(format!("code {code}: {msg}")));
        };
        self.count("token", "ok");
        let expire = Duration::from_secs(v.get("expire").and_then(Value::as_u64).unwrap_or(0));
        let lifetime = if expire > TOKEN_MARGIN * 2 {
            expire - TOKEN_MARGIN
        } else {
            expire / 2
        };
        let token = SecretString::from(token.to_string());
        *slot = Some(CachedToken {
            token: token.clone(),
            refresh_at: Instant::now() + lifetime,
        });
        Ok(token)
    }

    async fn drop_token(&self) {
        *self.token.lock().await = None;
    }

    /// One API call in the bulk lane.
    async fn call(
        &self,
        api: &'static str,
        method: Method,
        path: &str,
        body: Option<Value>,
        chat_key: Option<&str>,
    ) -> Result<Value, LarkError> {
        self.call_in(Priority::Bulk, api, method, path, body, chat_key)
            .await
    }

    /// One API call with limits, token, retries and error mapping. Returns the whole answer
    /// (`{"code":0, "data": …}`). Every attempt waits for its chat's limit first, then for a
    /// slot of the app's budget in `priority`'s lane (so a slot is never held while the chat's
    /// limit is waited for).
    async fn call_in(
        &self,
        priority: Priority,
        api: &'static str,
        method: Method,
        path: &str,
        body: Option<Value>,
        chat_key: Option<&str>,
    ) -> Result<Value, LarkError> {
        let url = format!("{}{}", self.base, path);
        let mut token_refreshed = false;
        let mut attempt = 0;
        loop {
            attempt += 1;
            self.admit(priority, api, chat_key).await?;
            let token = self.token().await?;
            let mut req = self
                .http
                .request(method.clone(), &url)
                .bearer_auth(token.expose_secret());
            if let Some(b) = &body {
                req = req.json(b);
            }
            let last = attempt >= MAX_ATTEMPTS;
            let resp = match req.send().await {
                Ok(r) => r,
                Err(e) => {
                    self.count(api, "transport");
                    if last {
                        return Err(LarkError::Transport {
                            api,
                            reason: without_url(&e),
                        });
                    }
                    tokio::time::sleep(backoff(attempt)).await;
                    continue;
                }
            };
            let status = resp.status();
            let reset = resp
                .headers()
                .get("x-ogw-ratelimit-reset")
                .and_then(|h| h.to_str().ok())
                .and_then(|s| s.trim().parse::<f64>().ok());
            let v: Option<Value> = read_json(resp).await;
            let code = v
                .as_ref()
                .and_then(|v| v.get("code"))
                .and_then(Value::as_i64);

            if is_rate_limit(status, code, path.starts_with("/open-apis/im/")) {
                self.count(api, "rate_limited");
                if last {
                    return Err(LarkError::RateLimited { api });
                }
                tokio::time::sleep(rate_limit_wait(reset, attempt)).await;
                continue;
            }
            if let Some(c) = code
                && TOKEN_INVALID.contains(&c)
                && !token_refreshed
            {
                self.count(api, "token_invalid");
                token_refreshed = true;
                self.drop_token().await;
                // The refresh-and-retry does not use up a transient-failure attempt.
                attempt -= 1;
                continue;
            }
            if status.is_server_error() {
                self.count(api, "server_error");
                if last {
                    return Err(LarkError::Http {
                        api,
                        status: status.as_u16(),
                    });
                }
                tokio::time::sleep(backoff(attempt)).await;
                continue;
            }
            let Some(v) = v else {
                self.count(api, "error");
                return Err(if status.is_success() {
                    LarkError::Decode { api }
                } else {
                    LarkError::Http {
                        api,
                        status: status.as_u16(),
                    }
                });
            };
            match code {
                Some(0) => {
                    self.count(api, "ok");
                    return Ok(v);
                }
                Some(code) => {
                    self.count(api, "error");
                    let msg = v
                        .get("msg")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string();
                    return Err(LarkError::Api { api, code, msg });
                }
                None => {
                    self.count(api, "error");
                    return Err(LarkError::Decode { api });
                }
            }
        }
    }
}

/// The body of a reply (`POST …/messages/{id}/reply`).
fn reply_body(content: &Content, in_thread: bool, uuid: &str) -> Value {
    json!({
        "msg_type": content.msg_type(),
        "content": content.encoded(),
        "reply_in_thread": in_thread,
        "uuid": uuid,
    })
}

/// The bytes of the largest reply request that carries `content` (`reply_in_thread: false`,
/// a `uuid` of the 50 characters Lark allows), serialized as it is sent: what Lark's size
/// limits ([`MAX_POST_REQUEST`]) measure.
pub fn reply_request_bytes(content: &Content) -> usize {
    let body = reply_body(content, false, &"u".repeat(50));
    serde_json::to_vec(&body).map_or(usize::MAX, |b| b.len())
}

/// Whether an answer says "slow down": HTTP 429 or 99991400 from any API, and on the message
/// APIs (`message_api`: `/open-apis/im/…`) also their own frequency-limit codes (with HTTP 400).
fn is_rate_limit(status: StatusCode, code: Option<i64>, message_api: bool) -> bool {
    status == StatusCode::TOO_MANY_REQUESTS
        || code == Some(RATE_LIMITED)
        || (message_api && code.is_some_and(|c| FREQUENCY_LIMITED.contains(&c)))
}

/// How long to wait before retrying a rate-limited call: the `x-ogw-ratelimit-reset` the
/// platform sent (seconds; its docs' example is 52 s), honoured up to [`MAX_RESET`], else the
/// exponential backoff.
fn rate_limit_wait(reset: Option<f64>, attempt: u32) -> Duration {
    reset
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(|s| Duration::from_secs_f64(s.min(MAX_RESET.as_secs_f64())))
        .unwrap_or_else(|| backoff(attempt))
}

fn sent(api: &'static str, v: &Value) -> Result<Sent, LarkError> {
    let data = v.get("data").ok_or(LarkError::Decode { api })?;
    let s = |k: &str| {
        data.get(k)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
    };
    Ok(Sent {
        message_id: s("message_id").ok_or(LarkError::Decode { api })?,
        chat_id: s("chat_id"),
        thread_id: s("thread_id"),
    })
}

/// Exponential backoff: 0.5 s, 1 s, 2 s … capped.
fn backoff(attempt: u32) -> Duration {
    (Duration::from_millis(500) * 2u32.saturating_pow(attempt.saturating_sub(1).min(10)))
        .min(MAX_BACKOFF)
}

/// Ids come from Lark, but a path segment is still kept to the characters ids use.
fn path_segment(id: &str) -> String {
    id.chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-')
        .collect()
}

/// A transport error's text without the URL (which could carry a query we do not want logged).
fn without_url(e: &reqwest::Error) -> String {
    let kind = if e.is_timeout() {
        "timeout"
    } else if e.is_connect() {
        "connection failed"
    } else {
        "request failed"
    };
    kind.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idempotency_keys_are_short_and_stable() {
        let a = idempotency_key("ev_1", "reply");
        assert_eq!(a, idempotency_key("ev_1", "reply"));
        assert_ne!(a, idempotency_key("ev_1", "reply2"));
        assert_ne!(a, idempotency_key("ev_1r", "eply"));
        assert!(a.len() <= 50);
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        assert!(backoff(1) < backoff(2));
        assert_eq!(backoff(40), MAX_BACKOFF);
    }

    /// The platform's reset header is honoured to its value (its docs say 52 s), within a
    /// minute; without one, the backoff.
    #[test]
    fn the_rate_limit_reset_is_honoured_up_to_a_minute() {
        assert_eq!(rate_limit_wait(Some(52.0), 1), Duration::from_secs(52));
        assert_eq!(rate_limit_wait(Some(0.5), 3), Duration::from_millis(500));
        assert_eq!(rate_limit_wait(Some(3600.0), 1), MAX_RESET);
        assert_eq!(rate_limit_wait(None, 2), backoff(2));
        assert_eq!(rate_limit_wait(Some(f64::NAN), 2), backoff(2));
        assert_eq!(rate_limit_wait(Some(-1.0), 1), backoff(1));
    }
}
