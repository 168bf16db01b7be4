//! A fake Lark Open API: axum on a random port, speaking the documented request and response
//! shapes (PROTOCOL.md) for the endpoints the service calls. It records every request so tests
//! can assert exactly what was sent, issues tenant tokens that can be invalidated, de-duplicates
//! sends by `uuid` as Lark does, and can be told to fail the next calls to a path.
//!
//! Messages can be read back (`GET /im/v1/messages/{id}`, a forwarded bundle with its
//! messages; a card in its 1.0-style read-back form, or its own JSON with
//! `card_msg_content_type=raw_card_content`) and their files downloaded (`…/resources/{key}?type=image|file`, with 234043 for
//! a bundle's messages and cards, 234001 for a wrong `type`, 99991672 without the scope). A
//! file is served with the content type Lark gives its kind (`application/json` for JSON). With
//! only `im:message.history:readonly` granted, reading a message answers 99991672 while its
//! files still download.
//!
//! Message requests are held to Lark's size limits on the raw request body: a post or card
//! (send, reply, PATCH, PUT) over 30 KB and a text over 150 KB are refused with 230025.
//!
//! Frequency limits are kept per API, as the platform keeps them (50 calls in any second, 1000
//! in any minute, for each method and path with its ids left out; streamed CardKit updates
//! exempt): past them HTTP 429, code 99991400, `x-ogw-ratelimit-reset`.
//!
//! CardKit cards are enforced as Lark enforces them: a `sequence` that does not increase past
//! every one the card accepted (content, settings, whole-card update, element removal) is
//! refused with 300317, an update after the streaming TTL (10 minutes, settable) with 300309,
//! more than 10 operations per second on one card with 230020, and a card over 30 KB or 200
//! elements with 230025; a card message is PATCHed at most 5 times a second. A card can be
//! scripted to refuse its next operations ([`FakeLark::fail_card`]: 200810, 300120, 5xx…) as
//! Lark does: a refused operation uses up no sequence number.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::watch;

pub const APP_ID: &str = "cli_test_app";
pub const APP_SECRET: &str = "test-app-secret";
pub const BOT_OPEN_ID: &str = "ou_bot";

/// One request as the fake received it.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    /// Path and query.
    pub path: String,
    /// `Authorization` header value.
    pub auth: Option<String>,
    pub body: Value,
    /// The raw body's length in bytes, as sent.
    pub bytes: usize,
    /// When it arrived.
    pub at: Instant,
}

impl Recorded {
    pub fn bearer(&self) -> Option<&str> {
        self.auth.as_deref().and_then(|a| a.strip_prefix("Bearer "))
    }
}

/// A canned failure for the next call to a path.
#[derive(Debug, Clone)]
pub enum Failure {
    /// HTTP 429, body code 99991400, `x-ogw-ratelimit-reset` = the given seconds.
    RateLimited(&'static str),
    /// HTTP 200 with this non-zero code.
    Code(i64),
    /// HTTP 503 with a non-JSON body.
    ServerError,
    /// HTTP 200 with a well-formed success answer padded to this many bytes.
    Huge(usize),
    /// A reply succeeds but its answer carries no `thread_id` (seen with some chats).
    NoThread,
    /// HTTP 400 with this frequency-limit code (230020, 11232), as the message APIs answer
    /// when a group's limit (shared by every bot in it) is reached.
    FrequencyLimit(i64),
    /// HTTP 400 with 230025, as for a message whose stored form is over the limit.
    TooLarge,
}

struct Inner {
    requests: Vec<Recorded>,
    tokens_issued: u32,
    valid_tokens: HashSet<String>,
    /// `expire` (seconds) of tokens issued from now on.
    expire: u64,
    /// Path substring → failures to serve, in order.
    script: Vec<(String, VecDeque<Failure>)>,
    /// uuid → the message it created (Lark de-duplicates sends by uuid).
    by_uuid: HashMap<String, Value>,
    /// Messages actually created.
    posted: Vec<Value>,
    next_id: u32,
    cards: HashMap<String, FakeCard>,
    /// Card number (in creation order, from 0) → failures for a card not created yet.
    card_scripts: HashMap<usize, Vec<Failure>>,
    cardkit_ttl: Duration,
    /// Every CardKit call answers this code (no scope, CardKit down).
    cardkit_down: Option<i64>,
    /// Interactive messages are refused (and so are card PATCHes).
    refuse_cards: bool,
    /// message id → the cards PATCHed into it, with when.
    patched: HashMap<String, Vec<(Instant, Value)>>,
    /// The long connection's endpoint answer: the WebSocket URL and the client configuration.
    ws_endpoint: Option<(String, Value)>,
    /// Messages `GET /im/v1/messages/{id}` reads, as its `items` hold them (a forwarded
    /// bundle's messages name it in `upper_message_id`).
    messages: Vec<Value>,
    /// (message id, key) → the resource's bytes.
    resources: HashMap<(String, String), Vec<u8>>,
    /// Resources served in chunks without a `Content-Length` (as a proxy may).
    streamed: HashSet<(String, String)>,
    /// The app lacks the message-reading scopes: both endpoints answer 99991672.
    no_message_scope: bool,
    /// When each API (method and path, ids left out) was called in the last minute: the
    /// platform's frequency control counts per API.
    api_calls: HashMap<String, VecDeque<Instant>>,
    /// Calls the frequency control refused.
    api_refused: usize,
    /// The app has `im:message.history:readonly` only: messages cannot be read (99991672),
    /// their resources can be downloaded.
    history_scope_only: bool,
}

/// A CardKit card as the fake holds it.
#[derive(Debug, Clone)]
pub struct FakeCard {
    pub card_id: String,
    /// The card JSON 2.0 with every update applied.
    pub data: Value,
    pub streaming: bool,
    enabled_at: Instant,
    /// Accepted operations: (when, sequence, what).
    pub ops: Vec<(Instant, i64, &'static str)>,
    /// Every refusal code answered for this card, in order (an HTTP 5xx as its status).
    pub refusals: Vec<i64>,
    /// When each operation reached the card (accepted or not): at most 10 a second.
    attempts: Vec<Instant>,
    /// Failures its next operations are answered with.
    script: VecDeque<Failure>,
    /// Whether the card entity was sent as a message.
    pub sent: bool,
}

impl FakeCard {
    /// The text of an element.
    pub fn element(&self, id: &str) -> String {
        self.data["body"]["elements"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|e| e["element_id"] == id)
            .and_then(|e| e["content"].as_str())
            .unwrap_or_default()
            .to_string()
    }
}

/// What a person reads of a message's `content` (a JSON string): a text message's text, or a
/// post's text and `md` elements, rows joined by newlines.
pub fn message_text(content: &str) -> String {
    let c: Value = serde_json::from_str(content).unwrap_or_default();
    if let Some(t) = c["text"].as_str() {
        return t.to_string();
    }
    let post = c
        .as_object()
        .and_then(|o| o.values().find(|v| v.get("content").is_some()))
        .cloned()
        .unwrap_or_default();
    post["content"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|row| {
            row.as_array()
                .into_iter()
                .flatten()
                .filter_map(|el| el["text"].as_str())
                .collect::<String>()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Markdown a message shows raw instead of rendering, as Lark renders it: a `text` message
/// renders only bold, `<i>`, `<u>`, `<s>` and links (backticks, headings and tables show as
/// typed); a post's `md` renders bold, italic, links, lists and code blocks, but not headings,
/// tables or inline code. Code blocks are shown as written. Empty when it renders cleanly.
pub fn unrendered_markdown(msg_type: &str, content: &str) -> Vec<String> {
    let text = message_text(content);
    if !matches!(msg_type, "text" | "post") {
        return vec![];
    }
    let mut found = vec![];
    let mut in_code = false;
    let lines: Vec<&str> = text.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        let t = line.trim_start();
        if t.starts_with("```") {
            if msg_type == "text" {
                found.push(format!("code fence in a text message: {line}"));
            }
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        if t.contains('`') {
            found.push(format!("backtick: {line}"));
        }
        let hashes = t.chars().take_while(|c| *c == '#').count();
        if (1..=6).contains(&hashes) && t[hashes..].starts_with(' ') {
            found.push(format!("heading: {line}"));
        }
        let delimiter = |l: &str| {
            let l = l.trim();
            l.contains('|') && l.contains('-') && l.chars().all(|c| "|-: ".contains(c))
        };
        if t.contains('|') && lines.get(i + 1).is_some_and(|n| delimiter(n)) {
            found.push(format!("table: {line}"));
        }
    }
    found
}

const CARD_BYTES: usize = 30 * 1024;
const CARD_ELEMENTS: usize = 200;

fn count_elements(v: &Value) -> usize {
    match v {
        Value::Object(m) => {
            usize::from(m.contains_key("tag")) + m.values().map(count_elements).sum::<usize>()
        }
        Value::Array(a) => a.iter().map(count_elements).sum(),
        _ => 0,
    }
}

fn card_too_big(card: &Value) -> bool {
    card.to_string().len() > CARD_BYTES || count_elements(card) > CARD_ELEMENTS
}

#[derive(Clone)]
struct Shared {
    inner: Arc<Mutex<Inner>>,
    /// While set, requests to paths containing it get no answer (until released).
    hold: Arc<watch::Sender<Option<String>>>,
    /// While set, requests that create a card message get no answer (until released).
    hold_cards: Arc<watch::Sender<bool>>,
    /// Bumped on every request, for waiting without sleeping.
    seen: Arc<watch::Sender<usize>>,
}

pub struct FakeLark {
    pub base: String,
    shared: Shared,
}

impl FakeLark {
    pub async fn start() -> FakeLark {
        let shared = Shared {
            inner: Arc::new(Mutex::new(Inner {
                requests: Vec::new(),
                tokens_issued: 0,
                valid_tokens: HashSet::new(),
                expire: 7200,
                script: Vec::new(),
                by_uuid: HashMap::new(),
                posted: Vec::new(),
                next_id: 0,
                cards: HashMap::new(),
                card_scripts: HashMap::new(),
                cardkit_ttl: Duration::from_secs(600),
                cardkit_down: None,
                refuse_cards: false,
                patched: HashMap::new(),
                ws_endpoint: None,
                messages: Vec::new(),
                resources: HashMap::new(),
                streamed: HashSet::new(),
                no_message_scope: false,
                api_calls: HashMap::new(),
                api_refused: 0,
                history_scope_only: false,
            })),
            seen: Arc::new(watch::channel(0).0),
            hold: Arc::new(watch::channel(None).0),
            hold_cards: Arc::new(watch::channel(false).0),
        };
        let app = Router::new().fallback(handle).with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        FakeLark {
            base: format!("http://{addr}"),
            shared,
        }
    }

    /// A message the message API can read back: `id`, `msg_type`, its content (a JSON value,
    /// stored as the string Lark uses), sent by `sender` (an open_id, or an app id when it
    /// starts with `cli_`); `upper` names the bundle it is inside.
    pub fn add_message(
        &self,
        id: &str,
        msg_type: &str,
        content: Value,
        sender: &str,
        upper: Option<&str>,
    ) {
        let mut item = json!({
            "message_id": id, "root_id": "", "parent_id": "", "msg_type": msg_type,
            "create_time": "1700000000000", "update_time": "1700000000000",
            "deleted": false, "updated": false, "chat_id": "oc_chat",
            "sender": {"id": sender, "id_type": if sender.starts_with("cli_") { "app_id" } else { "open_id" },
                "sender_type": if sender.starts_with("cli_") { "app" } else { "user" }, "tenant_key": "tk"},
            "body": {"content": content.to_string()},
            "mentions": [],
        });
        if let Some(u) = upper {
            item["upper_message_id"] = json!(u);
        }
        if msg_type == "interactive" {
            // Read back, a card is its 1.0-style form unless its own JSON is asked for.
            item["body"]["content"] = json!(card_read_form(&content).to_string());
            item[RAW_CARD] = json!(content.to_string());
        }
        self.shared.inner.lock().unwrap().messages.push(item);
    }

    /// The bytes the resource download serves for `key` of message `message_id`.
    pub fn add_resource(&self, message_id: &str, key: &str, bytes: Vec<u8>) {
        self.shared
            .inner
            .lock()
            .unwrap()
            .resources
            .insert((message_id.to_string(), key.to_string()), bytes);
    }

    /// The same, served in 64 KiB chunks with no declared length.
    pub fn add_resource_streamed(&self, message_id: &str, key: &str, bytes: Vec<u8>) {
        self.add_resource(message_id, key, bytes);
        self.shared
            .inner
            .lock()
            .unwrap()
            .streamed
            .insert((message_id.to_string(), key.to_string()));
    }

    /// From now on the app lacks the scopes to read messages and their resources.
    pub fn drop_message_scope(&self) {
        self.shared.inner.lock().unwrap().no_message_scope = true;
    }

    /// From now on the app has `im:message.history:readonly` but neither `im:message` nor
    /// `im:message:readonly`.
    pub fn grant_history_scope_only(&self) {
        self.shared.inner.lock().unwrap().history_scope_only = true;
    }

    /// The long connection's endpoint answers `url` and `config` from now on.
    pub fn set_ws_endpoint(&self, url: &str, config: Value) {
        self.shared.inner.lock().unwrap().ws_endpoint = Some((url.to_owned(), config));
    }

    /// Every request so far, in order.
    pub fn requests(&self) -> Vec<Recorded> {
        self.shared.inner.lock().unwrap().requests.clone()
    }

    /// Requests whose path contains `part` (token and bot-info calls are easy to filter out).
    pub fn requests_to(&self, part: &str) -> Vec<Recorded> {
        self.requests()
            .into_iter()
            .filter(|r| r.path.contains(part))
            .collect()
    }

    /// Messages actually created (after uuid de-duplication).
    pub fn posted(&self) -> Vec<Value> {
        self.shared.inner.lock().unwrap().posted.clone()
    }

    /// Invalidates every token issued so far (Lark answers 99991663 to them).
    pub fn invalidate_tokens(&self) {
        self.shared.inner.lock().unwrap().valid_tokens.clear();
    }

    /// Sets `expire` of tokens issued from now on.
    pub fn set_token_expire(&self, secs: u64) {
        self.shared.inner.lock().unwrap().expire = secs;
    }

    /// Calls refused by the per-API frequency control (HTTP 429, 99991400) so far.
    pub fn frequency_refusals(&self) -> usize {
        self.shared.inner.lock().unwrap().api_refused
    }

    /// The next calls to a path containing `part` fail as given, in order.
    pub fn fail_next(&self, part: &str, failures: Vec<Failure>) {
        self.shared
            .inner
            .lock()
            .unwrap()
            .script
            .push((part.to_string(), failures.into()));
    }

    /// CardKit cards created so far, in creation order.
    pub fn cards(&self) -> Vec<FakeCard> {
        let inner = self.shared.inner.lock().unwrap();
        let mut cards: Vec<FakeCard> = inner.cards.values().cloned().collect();
        cards.sort_by_key(|c| c.card_id[3..].parse::<u32>().unwrap_or(0));
        cards
    }

    /// The next operations on card number `n` (in creation order, from 0; it may not exist
    /// yet) are refused as given, in order: `Code` with HTTP 400 and that code (200810 the card
    /// is in an interaction, 300120 internal…), `ServerError` with HTTP 500. Checked after the
    /// rate and the sequence, as Lark does; a refused operation uses up no sequence number.
    pub fn fail_card(&self, n: usize, failures: Vec<Failure>) {
        let mut guard = self.shared.inner.lock().unwrap();
        let inner = &mut *guard;
        let mut cards: Vec<&mut FakeCard> = inner.cards.values_mut().collect();
        cards.sort_by_key(|c| c.card_id[3..].parse::<u32>().unwrap_or(0));
        match cards.into_iter().nth(n) {
            Some(card) => card.script.extend(failures),
            None => inner.card_scripts.entry(n).or_default().extend(failures),
        }
    }

    /// How long a card keeps streaming after it was last enabled.
    pub fn set_cardkit_ttl(&self, ttl: Duration) {
        self.shared.inner.lock().unwrap().cardkit_ttl = ttl;
    }

    /// Every CardKit call answers `code` from now on.
    pub fn cardkit_down(&self, code: i64) {
        self.shared.inner.lock().unwrap().cardkit_down = Some(code);
    }

    /// Interactive messages and card PATCHes are refused from now on.
    pub fn refuse_cards(&self) {
        self.shared.inner.lock().unwrap().refuse_cards = true;
    }

    /// The cards PATCHed into `message_id`, with when.
    pub fn patched(&self, message_id: &str) -> Vec<(Instant, Value)> {
        self.shared
            .inner
            .lock()
            .unwrap()
            .patched
            .get(message_id)
            .cloned()
            .unwrap_or_default()
    }

    /// Requests to paths containing `part` are recorded but not answered until [`release`].
    ///
    /// [`release`]: FakeLark::release
    pub fn hold(&self, part: &str) {
        self.shared.hold.send_replace(Some(part.to_string()));
    }

    pub fn release(&self) {
        self.shared.hold.send_replace(None);
    }

    /// Requests that create a card message (a send or reply of `msg_type` `interactive`) are
    /// recorded but not answered until [`release_cards`]; other replies go through.
    ///
    /// [`release_cards`]: FakeLark::release_cards
    pub fn hold_cards(&self) {
        self.shared.hold_cards.send_replace(true);
    }

    pub fn release_cards(&self) {
        self.shared.hold_cards.send_replace(false);
    }

    /// Waits (bounded) until `cond` holds for the recorded requests.
    pub async fn wait_until(&self, what: &str, cond: impl Fn(&[Recorded]) -> bool) {
        let mut rx = self.shared.seen.subscribe();
        let inner = self.shared.inner.clone();
        let done = tokio::time::timeout(Duration::from_secs(20), async move {
            loop {
                if cond(&inner.lock().unwrap().requests) {
                    return;
                }
                rx.changed().await.unwrap();
            }
        })
        .await;
        assert!(
            done.is_ok(),
            "timed out waiting for {what}: {:#?}",
            self.requests()
        );
    }
}

async fn handle(
    State(shared): State<Shared>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_default();
    let bytes = body.len();
    let body: Value = if body.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&body).unwrap_or(Value::String("<not json>".into()))
    };
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    shared.inner.lock().unwrap().requests.push(Recorded {
        method: method.to_string(),
        path: path.clone(),
        auth: auth.clone(),
        body: body.clone(),
        bytes,
        at: Instant::now(),
    });
    shared.seen.send_modify(|n| *n += 1);
    let mut hold = shared.hold.subscribe();
    let _ = hold
        .wait_for(|h| !h.as_deref().is_some_and(|part| path.contains(part)))
        .await;
    if let Some(refused) = over_size_limit(&method, &path, &body, bytes) {
        return refused;
    }
    if method == Method::POST && body["msg_type"] == "interactive" {
        let _ = shared.hold_cards.subscribe().wait_for(|h| !*h).await;
    }
    let mut inner = shared.inner.lock().unwrap();
    answer(&mut inner, &method, &path, auth.as_deref(), &body)
}

/// Lark's limits on a message request, measured on the raw body as sent: a post or a card
/// (send, reply, edit) at most 30 KB, a text at most 150 KB; 230025 over them.
fn over_size_limit(method: &Method, path: &str, body: &Value, bytes: usize) -> Option<Response> {
    let path = path.split('?').next().unwrap_or("");
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let message = matches!(
        (method.as_str(), parts.as_slice()),
        ("POST", ["open-apis", "im", "v1", "messages"])
            | ("POST", ["open-apis", "im", "v1", "messages", _, "reply"])
            | ("PUT" | "PATCH", ["open-apis", "im", "v1", "messages", _])
    );
    // A PATCH carries a card and no `msg_type`.
    let limit = match body["msg_type"].as_str() {
        Some("text") => 150 * 1024,
        _ => 30 * 1024,
    };
    (message && bytes > limit).then(|| {
        code(
            StatusCode::BAD_REQUEST,
            230025,
            "The message you sent exceeds the length limit.",
        )
    })
}

fn no_scope() -> Response {
    code(
        StatusCode::BAD_REQUEST,
        99991672,
        "Access denied. One of the following scopes is required: [im:message, im:message:readonly, im:message.history:readonly].",
    )
}

fn ok(data: Value) -> Response {
    axum::Json(json!({"code": 0, "msg": "success", "data": data})).into_response()
}

fn code(status: StatusCode, code: i64, msg: &str) -> Response {
    (status, axum::Json(json!({"code": code, "msg": msg}))).into_response()
}

fn answer(
    inner: &mut Inner,
    method: &Method,
    path_and_query: &str,
    auth: Option<&str>,
    body: &Value,
) -> Response {
    let path = path_and_query.split('?').next().unwrap_or("");
    if path == "/callback/ws/endpoint" {
        if method != Method::POST || body["AppID"] != APP_ID || body["AppSecret"] != APP_SECRET {
            return code(StatusCode::OK, 1000040344, "app secret invalid");
        }
        return match &inner.ws_endpoint {
            Some((url, config)) => {
                axum::Json(json!({"code":0,"msg":"ok","data":{"URL":url,"ClientConfig":config}}))
                    .into_response()
            }
            None => code(StatusCode::OK, 1, "system busy"),
        };
    }
    if path == "/open-apis/auth/v3/tenant_access_token/internal" {
        if method != Method::POST || body["app_id"] != APP_ID || body["app_secret"] != APP_SECRET {
            return code(StatusCode::OK, 10014, "app secret invalid");
        }
        inner.tokens_issued += 1;
        let token = format!("t-{}", inner.tokens_issued);
        inner.valid_tokens.insert(token.clone());
        return axum::Json(
            json!({"code":0,"msg":"ok","tenant_access_token":token,"expire":inner.expire}),
        )
        .into_response();
    }
    let token = auth.and_then(|a| a.strip_prefix("Bearer ")).unwrap_or("");
    if !inner.valid_tokens.contains(token) {
        return code(
            StatusCode::BAD_REQUEST,
            99991663,
            "Invalid access token for authorization",
        );
    }
    let mut no_thread = false;
    if let Some((_, queue)) = inner
        .script
        .iter_mut()
        .find(|(part, q)| path_and_query.contains(part.as_str()) && !q.is_empty())
    {
        match queue.pop_front().unwrap() {
            Failure::NoThread => no_thread = true,
            Failure::RateLimited(reset) => {
                return (
                    StatusCode::TOO_MANY_REQUESTS,
                    [("x-ogw-ratelimit-reset", reset)],
                    axum::Json(json!({"code": 99991400, "msg": "request trigger frequency limit"})),
                )
                    .into_response();
            }
            Failure::Code(c) => return code(StatusCode::OK, c, "scripted failure"),
            Failure::FrequencyLimit(c) => {
                return code(
                    StatusCode::BAD_REQUEST,
                    c,
                    "The operation triggers the frequency limit. Please lower the request frequency and try again.",
                );
            }
            Failure::TooLarge => {
                return code(
                    StatusCode::BAD_REQUEST,
                    230025,
                    "The message you sent exceeds the length limit.",
                );
            }
            Failure::ServerError => {
                return (StatusCode::SERVICE_UNAVAILABLE, "upstream unavailable").into_response();
            }
            Failure::Huge(size) => {
                return axum::Json(json!({"code": 0, "msg": "ok",
                    "data": {"message_id": "om_huge", "chat_id": "oc_1", "pad": "x".repeat(size)}}))
                .into_response();
            }
        }
    }
    if let Some(limited) = frequency_control(inner, method, path) {
        return limited;
    }
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    if parts.get(1) == Some(&"cardkit") {
        return cardkit(inner, method, &parts, body);
    }
    if inner.refuse_cards && body["msg_type"] == "interactive" {
        return code(
            StatusCode::BAD_REQUEST,
            230099,
            "card messages are not allowed here",
        );
    }
    match (method.as_str(), parts.as_slice()) {
        ("GET", ["open-apis", "bot", "v3", "info"]) => axum::Json(json!({
            "code": 0, "msg": "ok",
            "bot": {"open_id": BOT_OPEN_ID, "app_name": "SSH Mode", "activate_status": 2}
        }))
        .into_response(),
        ("POST", ["open-apis", "im", "v1", "messages"]) => {
            if !is_message_body(body) || body["receive_id"].as_str().is_none() {
                return code(StatusCode::BAD_REQUEST, 230001, "invalid body");
            }
            // The id must be of the kind `receive_id_type` names.
            let kind = path_and_query
                .split_once("receive_id_type=")
                .map(|(_, k)| k.split('&').next().unwrap_or(""));
            let prefix = match kind {
                Some("chat_id") => "oc_",
                Some("open_id") => "ou_",
                _ => return code(StatusCode::BAD_REQUEST, 230001, "invalid receive_id_type"),
            };
            if !body["receive_id"].as_str().unwrap().starts_with(prefix) {
                return code(
                    StatusCode::BAD_REQUEST,
                    230001,
                    "receive_id does not match its type",
                );
            }
            if body["msg_type"] == "interactive" && !is_card_2(&body["content"]) {
                return code(StatusCode::BAD_REQUEST, 230099, "card content invalid");
            }
            let chat = body["receive_id"].as_str().unwrap().to_string();
            create(inner, body, json!({"chat_id": chat}))
        }
        ("POST", ["open-apis", "im", "v1", "messages", target, "reply"]) => {
            if !target.starts_with("om_") {
                return code(StatusCode::BAD_REQUEST, 230001, "invalid message_id");
            }
            if !is_message_body(body) || !body["reply_in_thread"].is_boolean() {
                return code(StatusCode::BAD_REQUEST, 230001, "invalid body");
            }
            let thread = if body["reply_in_thread"] == true && !no_thread {
                json!(format!("omt_{}", target.trim_start_matches("om_")))
            } else {
                Value::Null
            };
            create(
                inner,
                body,
                json!({"root_id": target, "parent_id": target, "thread_id": thread, "chat_id": "oc_fake"}),
            )
        }
        ("PUT", ["open-apis", "im", "v1", "messages", _]) => {
            if !is_message_body(body) {
                return code(StatusCode::BAD_REQUEST, 230001, "invalid body");
            }
            ok(json!({}))
        }
        ("PATCH", ["open-apis", "im", "v1", "messages", id]) => {
            let Some(card) = body["content"]
                .as_str()
                .and_then(|c| serde_json::from_str::<Value>(c).ok())
            else {
                return code(StatusCode::BAD_REQUEST, 230001, "invalid body");
            };
            if inner.refuse_cards {
                return code(
                    StatusCode::BAD_REQUEST,
                    230099,
                    "card messages are not allowed here",
                );
            }
            if !is_card_2(&body["content"]) {
                return code(StatusCode::BAD_REQUEST, 230099, "card content invalid");
            }
            if card_too_big(&card) {
                return code(StatusCode::BAD_REQUEST, 230025, "card too large");
            }
            let now = Instant::now();
            let list = inner.patched.entry(id.to_string()).or_default();
            if list
                .iter()
                .filter(|(t, _)| now.duration_since(*t) < Duration::from_secs(1))
                .count()
                >= 5
            {
                return code(
                    StatusCode::BAD_REQUEST,
                    230020,
                    "message update rate limited",
                );
            }
            list.push((now, card));
            ok(json!({}))
        }
        ("POST", ["open-apis", "im", "v1", "messages", id, "reactions"]) => {
            let Some(emoji) = body
                .pointer("/reaction_type/emoji_type")
                .and_then(Value::as_str)
            else {
                return code(StatusCode::BAD_REQUEST, 231001, "reaction type invalid");
            };
            inner.next_id += 1;
            ok(
                json!({"reaction_id": format!("r_{}", inner.next_id), "message_id": id,
                      "reaction_type": {"emoji_type": emoji}}),
            )
        }
        ("DELETE", ["open-apis", "im", "v1", "messages", _, "reactions", _]) => ok(json!({})),
        ("GET", ["open-apis", "im", "v1", "messages", id]) => {
            if inner.no_message_scope {
                return no_scope();
            }
            if inner.history_scope_only {
                return code(
                    StatusCode::BAD_REQUEST,
                    99991672,
                    "Access denied. One of the following scopes is required: [im:message, im:message:readonly].",
                );
            }
            // The message, then (for a bundle) the messages inside it.
            let Some(first) = inner
                .messages
                .iter()
                .find(|m| m["message_id"] == *id)
                .cloned()
            else {
                return code(
                    StatusCode::BAD_REQUEST,
                    230110,
                    "Action unavailable as the message has been deleted.",
                );
            };
            let mut items = vec![first];
            items.extend(
                inner
                    .messages
                    .iter()
                    .filter(|m| m["upper_message_id"] == *id)
                    .cloned(),
            );
            // A card's own JSON only when asked for (`card_msg_content_type=raw_card_content`).
            let raw = path_and_query.split_once('?').is_some_and(|(_, q)| {
                q.split('&')
                    .any(|kv| kv == "card_msg_content_type=raw_card_content")
            });
            for item in &mut items {
                if let Some(card) = item.as_object_mut().and_then(|m| m.remove(RAW_CARD))
                    && raw
                {
                    item["body"]["content"] = card;
                }
            }
            ok(json!({"items": items}))
        }
        ("GET", ["open-apis", "im", "v1", "messages", id, "resources", key]) => {
            if inner.no_message_scope {
                return no_scope();
            }
            let kind = path_and_query
                .split_once("type=")
                .map(|(_, k)| k.split('&').next().unwrap_or(""));
            let image_key = key.starts_with("img_");
            if !matches!(
                (kind, image_key),
                (Some("image"), true) | (Some("file"), false)
            ) {
                return code(StatusCode::BAD_REQUEST, 234001, "Invalid request param.");
            }
            // Sub-messages of a forwarded bundle, and cards, hold nothing downloadable.
            let message = inner.messages.iter().find(|m| m["message_id"] == *id);
            if message.is_some_and(|m| {
                m.get("upper_message_id").is_some() || m["msg_type"] == "interactive"
            }) {
                return code(StatusCode::BAD_REQUEST, 234043, "Unsupported message type.");
            }
            let which = (id.to_string(), key.to_string());
            match inner.resources.get(&which) {
                Some(bytes) if inner.streamed.contains(&which) => {
                    let chunks: Vec<Result<Bytes, std::io::Error>> = bytes
                        .chunks(64 * 1024)
                        .map(|c| Ok(Bytes::copy_from_slice(c)))
                        .collect();
                    (
                        StatusCode::OK,
                        [("content-type", content_type(bytes))],
                        axum::body::Body::from_stream(futures_util::stream::iter(chunks)),
                    )
                        .into_response()
                }
                Some(bytes) => (
                    StatusCode::OK,
                    [("content-type", content_type(bytes))],
                    bytes.clone(),
                )
                    .into_response(),
                None => code(StatusCode::BAD_REQUEST, 234003, "File not in msg."),
            }
        }
        _ => code(StatusCode::NOT_FOUND, 404, "not found"),
    }
}

/// Where the fake keeps a card message's own JSON beside its read-back form.
const RAW_CARD: &str = "_raw_card";

/// A card as the message API reads it back by default: `{"title", "elements": [[…], …]}`, the
/// header's title and one row of post-like elements (`text`, `a`, `img`, `button`, `hr`) per
/// element that shows something, containers (columns, panels, forms, 1.0 actions and notes)
/// flattened, whatever their depth.
fn card_read_form(card: &Value) -> Value {
    fn text_of(v: &Value) -> Option<String> {
        v.as_str()
            .or_else(|| v["content"].as_str())
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
    }
    /// Markdown as `text` and `a` elements (a link `[t](u)` becomes an `a`).
    fn markdown(md: &str) -> Vec<Value> {
        let mut row = Vec::new();
        let mut rest = md;
        while let Some(open) = rest.find('[') {
            let Some((text, after)) = rest[open + 1..].split_once("](") else {
                break;
            };
            let Some((href, tail)) = after.split_once(')') else {
                break;
            };
            if !rest[..open].is_empty() {
                row.push(json!({"tag": "text", "text": &rest[..open]}));
            }
            row.push(json!({"tag": "a", "text": text, "href": href}));
            rest = tail;
        }
        if !rest.is_empty() {
            row.push(json!({"tag": "text", "text": rest}));
        }
        row
    }
    fn walk(el: &Value, rows: &mut Vec<Value>) {
        match el["tag"].as_str().unwrap_or("") {
            "markdown" | "lark_md" | "plain_text" => {
                if let Some(t) = text_of(el) {
                    rows.push(json!(markdown(&t)));
                }
            }
            "div" => {
                if let Some(t) = text_of(&el["text"]) {
                    rows.push(json!(markdown(&t)));
                }
                for f in el["fields"].as_array().into_iter().flatten() {
                    if let Some(t) = text_of(&f["text"]) {
                        rows.push(json!(markdown(&t)));
                    }
                }
            }
            "img" => rows.push(json!([{"tag": "img", "image_key": el["img_key"]}])),
            "button" => rows
                .push(json!([{"tag": "button", "text": text_of(&el["text"]).unwrap_or_default()}])),
            "hr" => rows.push(json!([{"tag": "hr"}])),
            _ => {
                if let Some(t) = text_of(&el["header"]["title"]) {
                    rows.push(json!([{"tag": "text", "text": t}]));
                }
                for key in ["elements", "columns", "actions"] {
                    for child in el[key].as_array().into_iter().flatten() {
                        walk(child, rows);
                    }
                }
            }
        }
    }
    let mut rows = Vec::new();
    let elements = card
        .pointer("/body/elements")
        .or_else(|| card.get("elements"));
    for el in elements.and_then(Value::as_array).into_iter().flatten() {
        walk(el, &mut rows);
    }
    json!({
        "title": text_of(&card["header"]["title"]).unwrap_or_default(),
        "elements": rows,
    })
}

/// Each API's frequency limits, as the platform keeps them: per API (the method and the path
/// without its ids), at most [`API_PER_SECOND`] calls in any second and [`API_PER_MINUTE`] in
/// any minute; past either, HTTP 429 with code 99991400 and `x-ogw-ratelimit-reset` (whole
/// seconds until a call would pass). Streamed CardKit element updates are exempt.
fn frequency_control(inner: &mut Inner, method: &Method, path: &str) -> Option<Response> {
    if method == Method::PUT
        && path.starts_with("/open-apis/cardkit/")
        && path.ends_with("/content")
    {
        return None;
    }
    let api = api_of(method, path);
    let now = Instant::now();
    let calls = inner.api_calls.entry(api).or_default();
    while calls
        .front()
        .is_some_and(|t| now.duration_since(*t) >= Duration::from_secs(60))
    {
        calls.pop_front();
    }
    let in_last_second = calls
        .iter()
        .rev()
        .take_while(|t| now.duration_since(**t) < Duration::from_secs(1))
        .count();
    let reset = if calls.len() >= API_PER_MINUTE {
        Some(Duration::from_secs(60) - now.duration_since(calls[0]))
    } else if in_last_second >= API_PER_SECOND {
        Some(Duration::from_secs(1) - now.duration_since(calls[calls.len() - in_last_second]))
    } else {
        None
    };
    if let Some(reset) = reset {
        inner.api_refused += 1;
        let secs = reset.as_secs() + u64::from(reset.subsec_nanos() > 0);
        return Some(
            (
                StatusCode::TOO_MANY_REQUESTS,
                [("x-ogw-ratelimit-reset", secs.to_string())],
                axum::Json(json!({"code": 99991400, "msg": "request trigger frequency limit"})),
            )
                .into_response(),
        );
    }
    calls.push_back(now);
    None
}

/// Calls of one API the platform allows in any second, and in any minute.
pub const API_PER_SECOND: usize = 50;
pub const API_PER_MINUTE: usize = 1000;

/// An API as the frequency control names it: the method and the path, ids replaced by `:id`.
fn api_of(method: &Method, path: &str) -> String {
    let id_prefixes = ["om_", "oc_", "ou_", "omt_", "ck_", "r_", "img_", "file_"];
    let parts: Vec<&str> = path
        .split('/')
        .map(|p| {
            if id_prefixes.iter().any(|x| p.starts_with(x))
                || (!p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
            {
                ":id"
            } else {
                p
            }
        })
        .collect();
    format!("{method} {}", parts.join("/"))
}

/// The content type a file is served with, by its content (as Lark does by its kind): JSON as
/// `application/json`, images as theirs, other text as `text/plain`.
fn content_type(bytes: &[u8]) -> &'static str {
    if serde_json::from_slice::<Value>(bytes).is_ok() {
        "application/json"
    } else if bytes.starts_with(b"\x89PNG") {
        "image/png"
    } else if bytes.starts_with(&[0xff, 0xd8, 0xff]) {
        "image/jpeg"
    } else if std::str::from_utf8(bytes).is_ok() {
        "text/plain; charset=utf-8"
    } else {
        "application/octet-stream"
    }
}

/// A card JSON 2.0 document (as a string): `schema` "2.0", elements under `body`, no 1.0
/// `action` wrapper, `update_multi` never false, buttons' callback values objects in
/// `behaviors`.
fn is_card_2(content: &Value) -> bool {
    let Some(card) = content
        .as_str()
        .and_then(|c| serde_json::from_str::<Value>(c).ok())
    else {
        return false;
    };
    let Some(elements) = card.pointer("/body/elements").and_then(Value::as_array) else {
        return false;
    };
    card["schema"] == "2.0"
        && card
            .pointer("/config/update_multi")
            .is_none_or(|u| u == &json!(true))
        && elements.iter().all(|e| {
            e["tag"] != "action"
                && e.get("value").is_none()
                && (e["tag"] != "button"
                    || e["behaviors"]
                        .as_array()
                        .is_some_and(|b| b.iter().all(|b| b["value"].is_object())))
        })
}

fn cardkit(inner: &mut Inner, method: &Method, parts: &[&str], body: &Value) -> Response {
    if let Some(c) = inner.cardkit_down {
        return code(StatusCode::BAD_REQUEST, c, "cardkit unavailable (scripted)");
    }
    let now = Instant::now();
    let ttl = inner.cardkit_ttl;
    match (method.as_str(), parts) {
        ("POST", ["open-apis", "cardkit", "v1", "cards"]) => {
            let Some(card) = (body["type"] == "card_json")
                .then(|| body["data"].as_str())
                .flatten()
                .and_then(|d| serde_json::from_str::<Value>(d).ok())
            else {
                return code(StatusCode::BAD_REQUEST, 300301, "invalid card_json");
            };
            if card["schema"] != "2.0" {
                return code(StatusCode::BAD_REQUEST, 300301, "schema 2.0 required");
            }
            if card_too_big(&card) {
                return code(StatusCode::BAD_REQUEST, 230025, "card too large");
            }
            inner.next_id += 1;
            let card_id = format!("ck_{}", inner.next_id);
            let script = inner
                .card_scripts
                .remove(&inner.cards.len())
                .unwrap_or_default()
                .into();
            inner.cards.insert(
                card_id.clone(),
                FakeCard {
                    card_id: card_id.clone(),
                    streaming: card["config"]["streaming_mode"] == true,
                    data: card,
                    enabled_at: now,
                    ops: Vec::new(),
                    refusals: Vec::new(),
                    attempts: Vec::new(),
                    script,
                    sent: false,
                },
            );
            ok(json!({"card_id": card_id}))
        }
        (m, ["open-apis", "cardkit", "v1", "cards", id, rest @ ..]) => {
            let Some(card) = inner.cards.get_mut(*id) else {
                return code(StatusCode::BAD_REQUEST, 300300, "card not found");
            };
            let refuse = |card: &mut FakeCard, c: i64, msg: &str| {
                card.refusals.push(c);
                code(StatusCode::BAD_REQUEST, c, msg)
            };
            if card
                .attempts
                .iter()
                .filter(|t| now.duration_since(**t) < Duration::from_secs(1))
                .count()
                >= 10
            {
                return refuse(card, 230020, "card operations rate limited");
            }
            card.attempts.push(now);
            let Some(seq) = body["sequence"].as_i64() else {
                return refuse(card, 300301, "sequence required");
            };
            if card.ops.last().is_some_and(|(_, last, _)| seq <= *last) {
                return refuse(card, 300317, "sequence must increase");
            }
            match card.script.pop_front() {
                Some(Failure::ServerError) => {
                    card.refusals.push(500);
                    return code(StatusCode::INTERNAL_SERVER_ERROR, 1, "internal error");
                }
                Some(Failure::Code(c)) => return refuse(card, c, "scripted card failure"),
                Some(other) => panic!("not a card failure: {other:?}"),
                None => {}
            }
            if card.streaming && now.duration_since(card.enabled_at) > ttl {
                card.streaming = false;
            }
            match (m, rest) {
                ("PUT", ["elements", element, "content"]) => {
                    if !card.streaming {
                        return refuse(card, 300309, "streaming mode is closed");
                    }
                    let Some(text) = body["content"].as_str() else {
                        return refuse(card, 300301, "content required");
                    };
                    let mut updated = card.data.clone();
                    let Some(el) = updated["body"]["elements"]
                        .as_array_mut()
                        .and_then(|a| a.iter_mut().find(|e| e["element_id"] == *element))
                    else {
                        return refuse(card, 300302, "element not found");
                    };
                    el["content"] = json!(text);
                    if card_too_big(&updated) {
                        return refuse(card, 230025, "card too large");
                    }
                    card.data = updated;
                    card.ops.push((now, seq, "content"));
                    ok(json!({}))
                }
                ("PATCH", ["settings"]) => {
                    let Some(config) = body["settings"]
                        .as_str()
                        .and_then(|s| serde_json::from_str::<Value>(s).ok())
                        .map(|v| v["config"].clone())
                    else {
                        return refuse(card, 300301, "settings required");
                    };
                    match config["streaming_mode"].as_bool() {
                        Some(true) => {
                            card.streaming = true;
                            card.enabled_at = now;
                        }
                        Some(false) => card.streaming = false,
                        None => {}
                    }
                    if let Some(summary) = config.get("summary") {
                        card.data["config"]["summary"] = summary.clone();
                    }
                    card.data["config"]["streaming_mode"] = json!(card.streaming);
                    card.ops.push((now, seq, "settings"));
                    ok(json!({}))
                }
                // The whole card replaced: allowed whether or not it streams.
                ("PUT", []) => {
                    let Some(new) = (body["card"]["type"] == "card_json")
                        .then(|| body["card"]["data"].as_str())
                        .flatten()
                        .and_then(|d| serde_json::from_str::<Value>(d).ok())
                    else {
                        return refuse(card, 300301, "invalid card_json");
                    };
                    if new["schema"] != "2.0"
                        || new.pointer("/config/update_multi") == Some(&json!(false))
                    {
                        return refuse(card, 300301, "schema 2.0 and a shared card required");
                    }
                    if card_too_big(&new) {
                        return refuse(card, 230025, "card too large");
                    }
                    let streaming = new["config"]["streaming_mode"] == true;
                    if streaming && !card.streaming {
                        card.enabled_at = now;
                    }
                    card.streaming = streaming;
                    card.data = new;
                    card.ops.push((now, seq, "card"));
                    ok(json!({}))
                }
                ("DELETE", ["elements", element]) => {
                    let Some(elements) = card.data["body"]["elements"].as_array_mut() else {
                        return refuse(card, 300302, "element not found");
                    };
                    let before = elements.len();
                    elements.retain(|e| e["element_id"] != *element);
                    if elements.len() == before {
                        return refuse(card, 300302, "element not found");
                    }
                    card.ops.push((now, seq, "delete"));
                    ok(json!({}))
                }
                _ => code(StatusCode::NOT_FOUND, 404, "not found"),
            }
        }
        _ => code(StatusCode::NOT_FOUND, 404, "not found"),
    }
}

fn is_message_body(body: &Value) -> bool {
    let content_ok = body["content"]
        .as_str()
        .is_some_and(|c| serde_json::from_str::<Value>(c).is_ok());
    let uuid_ok = body
        .get("uuid")
        .is_none_or(|u| u.as_str().is_some_and(|u| u.len() <= 50));
    body["msg_type"].as_str().is_some() && content_ok && uuid_ok
}

fn create(inner: &mut Inner, body: &Value, mut data: Value) -> Response {
    if let Some(uuid) = body["uuid"].as_str()
        && let Some(existing) = inner.by_uuid.get(uuid)
    {
        return ok(existing.clone());
    }
    if body["msg_type"] == "interactive" {
        let content: Value =
            serde_json::from_str(body["content"].as_str().unwrap_or("{}")).unwrap_or_default();
        if content["type"] == "card" {
            // A CardKit entity: it must exist and can be sent once.
            let id = content["data"]["card_id"].as_str().unwrap_or_default();
            match inner.cards.get_mut(id) {
                Some(c) if !c.sent => c.sent = true,
                _ => {
                    return code(
                        StatusCode::BAD_REQUEST,
                        230099,
                        "card entity invalid or sent",
                    );
                }
            }
        } else if card_too_big(&content) {
            return code(StatusCode::BAD_REQUEST, 230025, "card too large");
        }
    }
    inner.next_id += 1;
    data["message_id"] = json!(format!("om_sent_{}", inner.next_id));
    data["msg_type"] = body["msg_type"].clone();
    data["body"] = json!({"content": body["content"]});
    if let Some(uuid) = body["uuid"].as_str() {
        inner.by_uuid.insert(uuid.to_string(), data.clone());
    }
    inner.posted.push(data.clone());
    ok(data)
}
