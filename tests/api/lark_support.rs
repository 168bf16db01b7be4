//! Building callback requests as Lark sends them, and looking into the inbox.

use std::path::PathBuf;

use serde_json::{Value, json};
use sshmode::lark::webhook;

use crate::fake_lark::FakeLark;
use crate::helpers::{TestApp, TestAppBuilder};

pub const TOKEN: &str = "test-verification-token";
pub const ENCRYPT_KEY: &str = "test-encrypt-key";

/// The vendored known-answer vectors: the copy in `tests/data` first, then `../shared`.
pub fn vectors() -> Value {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let candidates = [
        root.join("tests/data/lark_vectors.json"),
        root.join("../shared/lark/vectors.json"),
        PathBuf::from("/work/shared/lark/vectors.json"),
    ];
    let path = candidates
        .iter()
        .find(|p| p.is_file())
        .expect("lark vectors file");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// An app whose Lark client talks to `fake`, with an Encrypt Key (signed events only).
pub fn app_with(fake: &FakeLark) -> TestAppBuilder {
    TestApp::builder()
        .var("LARK_BASE_URL", &fake.base)
        .var("LARK_ENCRYPT_KEY", ENCRYPT_KEY)
}

/// Options of a test message.
#[derive(Clone)]
pub struct Msg {
    pub event_id: String,
    pub message_id: String,
    pub text: String,
    pub chat_type: &'static str,
    pub thread_id: Option<String>,
    pub sender_type: &'static str,
    /// Whether `@_user_1` (the bot) is in `mentions`.
    pub mention_bot: bool,
    pub create_ms: i64,
    /// The thread's root message (a message in a thread names it).
    pub root_id: Option<String>,
    pub sender: String,
    pub chat_id: String,
    /// The message replied to; defaults to `root_id` (as a message in a thread names it).
    pub parent_id: Option<String>,
    /// `(message_type, content)` in place of a text message holding `text`.
    pub body: Option<(&'static str, Value)>,
}

impl Msg {
    pub fn new(event_id: &str, text: &str) -> Msg {
        Msg {
            event_id: event_id.to_string(),
            message_id: format!("om_{event_id}"),
            text: text.to_string(),
            chat_type: "p2p",
            thread_id: None,
            sender_type: "user",
            mention_bot: false,
            create_ms: chrono::Utc::now().timestamp_millis(),
            root_id: None,
            sender: "ou_user".to_string(),
            chat_id: "oc_chat".to_string(),
            parent_id: None,
            body: None,
        }
    }

    pub fn envelope(&self, token: &str) -> Value {
        let mut mentions = vec![];
        if self.mention_bot {
            mentions.push(
                json!({"key":"@_user_1","id":{"open_id":crate::fake_lark::BOT_OPEN_ID,
                "user_id":null,"union_id":"on_bot"},"name":"SSH Mode","tenant_key":"tk"}),
            );
        }
        let mut message = json!({
            "message_id": self.message_id,
            "root_id": self.root_id.clone().unwrap_or_default(),
            "parent_id": self.parent_id.clone().or(self.root_id.clone()).unwrap_or_default(),
            "create_time": self.create_ms.to_string(), "update_time": self.create_ms.to_string(),
            "chat_id": self.chat_id, "chat_type": self.chat_type, "message_type": "text",
            "content": json!({"text": self.text}).to_string(), "mentions": mentions,
        });
        if let Some((kind, content)) = &self.body {
            message["message_type"] = json!(kind);
            message["content"] = json!(content.to_string());
        }
        if let Some(t) = &self.thread_id {
            message["thread_id"] = json!(t);
        }
        json!({
            "schema": "2.0",
            "header": {"event_id": self.event_id, "event_type": "im.message.receive_v1",
                "create_time": self.create_ms.to_string(), "token": token,
                "app_id": crate::fake_lark::APP_ID, "tenant_key": "tk"},
            "event": {
                "sender": {"sender_id": {"open_id": self.sender, "user_id": "u1", "union_id": "on_u"},
                    "sender_type": self.sender_type, "tenant_key": "tk"},
                "message": message
            }
        })
    }
}

/// A request body and its headers.
pub struct Req {
    pub body: Vec<u8>,
    pub headers: Vec<(&'static str, String)>,
}

/// A plain (unencrypted, unsigned) request.
pub fn plain(v: &Value) -> Req {
    Req {
        body: v.to_string().into_bytes(),
        headers: vec![],
    }
}

/// Encrypts `v` and signs the body with `key` at `ts` (seconds).
pub fn sealed(v: &Value, key: &str, ts: i64) -> Req {
    let body = json!({"encrypt": webhook::encrypt(key, [9; 16], v.to_string().as_bytes())})
        .to_string()
        .into_bytes();
    signed(body, key, ts)
}

/// `v` as Lark delivers it to an app with [`ENCRYPT_KEY`]: encrypted and signed now.
pub fn sealed_now(v: &Value) -> Req {
    sealed(v, ENCRYPT_KEY, now_secs())
}

/// Signs raw bytes.
pub fn signed(body: Vec<u8>, key: &str, ts: i64) -> Req {
    let ts = ts.to_string();
    let sig = webhook::signature(&ts, "nonce-1", key, &body);
    Req {
        body,
        headers: vec![
            ("X-Lark-Request-Timestamp", ts),
            ("X-Lark-Request-Nonce", "nonce-1".into()),
            ("X-Lark-Signature", sig),
        ],
    }
}

pub fn now_secs() -> i64 {
    chrono::Utc::now().timestamp()
}

/// POSTs to `/lark/events`; returns status and JSON body (Null if not JSON).
pub async fn post(app: &TestApp, req: Req) -> (u16, Value) {
    let mut b = app
        .http
        .post(app.url("/lark/events"))
        .header("content-type", "application/json")
        .body(req.body);
    for (k, v) in req.headers {
        b = b.header(k, v);
    }
    let r = b.send().await.unwrap();
    let status = r.status().as_u16();
    let body = r.json().await.unwrap_or(Value::Null);
    (status, body)
}

/// Inbox rows as (event_id, state, attempts).
pub async fn inbox(app: &TestApp) -> Vec<(String, String, i32)> {
    sqlx::query_as("SELECT event_id, state, attempts FROM inbox_events ORDER BY received_at")
        .fetch_all(&app.state.db)
        .await
        .unwrap()
}

/// Waits (bounded) until the event reaches `state`, woken by the fake's requests or polling
/// the row; the wait ends as soon as the state is seen.
pub async fn wait_state(app: &TestApp, event_id: &str, state: &str) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let s: Option<String> =
            sqlx::query_scalar("SELECT state FROM inbox_events WHERE event_id = $1")
                .bind(event_id)
                .fetch_optional(&app.state.db)
                .await
                .unwrap();
        if s.as_deref() == Some(state) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "event {event_id} never reached {state} (is {s:?})"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// A v2 envelope of `event_type` carrying `event`, as the platform sends it.
pub fn platform_event(event_id: &str, event_type: &str, event: Value) -> Value {
    let now = chrono::Utc::now().timestamp_millis().to_string();
    json!({
        "schema": "2.0",
        "header": {"event_id": event_id, "event_type": event_type, "create_time": now,
            "token": TOKEN, "app_id": crate::fake_lark::APP_ID, "tenant_key": "tk"},
        "event": event
    })
}

/// `im.message.recalled_v1`: its sender recalled `message_id` in `chat_id`.
pub fn recalled(event_id: &str, message_id: &str, chat_id: &str) -> Value {
    let now = chrono::Utc::now().timestamp_millis().to_string();
    platform_event(
        event_id,
        "im.message.recalled_v1",
        json!({"message_id": message_id, "chat_id": chat_id, "recall_time": now,
               "recall_type": "message_owner"}),
    )
}

/// The chat events' common body (`im.chat.member.bot.deleted_v1`, `im.chat.disbanded_v1`, …):
/// `operator` acted on `chat_id`.
pub fn chat_event(event_id: &str, event_type: &str, chat_id: &str, operator: &str) -> Value {
    platform_event(
        event_id,
        event_type,
        json!({"chat_id": chat_id,
               "operator_id": {"open_id": operator, "user_id": "u_op", "union_id": "on_op"},
               "external": false, "operator_tenant_key": "tk", "name": "ops",
               "i18n_names": {"zh_cn": "ops", "en_us": "ops", "ja_jp": ""}}),
    )
}

/// `im.chat.member.user.deleted_v1`: `operator` removed `users` (open_ids) from `chat_id`.
pub fn users_removed(event_id: &str, chat_id: &str, operator: &str, users: &[&str]) -> Value {
    let mut v = chat_event(
        event_id,
        "im.chat.member.user.deleted_v1",
        chat_id,
        operator,
    );
    v["event"]["users"] = users
        .iter()
        .map(|u| {
            json!({"name": u, "tenant_key": "tk",
                        "user_id": {"open_id": u, "user_id": "u_x", "union_id": "on_x"}})
        })
        .collect();
    v
}
