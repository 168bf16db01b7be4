//! A fake OpenAI-compatible provider: an axum server on 127.0.0.1:0 that answers
//! `POST /v1/chat/completions` from a per-model script (then a per-model default, then a plain
//! text reply) and records every request it receives.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};

/// What the fake answers to one request.
#[derive(Clone, Debug)]
pub enum Reply {
    Json {
        status: u16,
        headers: Vec<(&'static str, String)>,
        body: Value,
    },
    /// Never answers (for timeouts).
    Hang,
    /// Answers with the inner reply after a pause (a test acts while the request is open).
    Delayed(std::time::Duration, Box<Reply>),
    /// A text answer that repeats the last tool result of the conversation on one line
    /// (newlines become ` | `), prefixed with `prefix` (a model reporting what a command printed).
    EchoTool { prefix: String },
}

/// One request the fake received.
#[derive(Clone, Debug)]
pub struct Recorded {
    pub model: String,
    pub body: Value,
    pub headers: HeaderMap,
}

#[derive(Default)]
struct Inner {
    scripts: HashMap<String, VecDeque<Reply>>,
    defaults: HashMap<String, Reply>,
    requests: Vec<Recorded>,
}

#[derive(Clone)]
pub struct FakeProvider {
    /// Base URL including the version path, as a router file wants it.
    pub base: String,
    inner: Arc<Mutex<Inner>>,
}

impl FakeProvider {
    /// Starts the fake; it accepts connections as soon as this returns (the listener is bound).
    pub async fn start() -> FakeProvider {
        let inner = Arc::new(Mutex::new(Inner::default()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = axum::Router::new()
            .route("/v1/chat/completions", post(handle))
            .with_state(inner.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        FakeProvider {
            base: format!("http://{addr}/v1"),
            inner,
        }
    }

    /// Queues `reply` for the next request naming `model`.
    pub fn push(&self, model: &str, reply: Reply) -> &Self {
        self.inner
            .lock()
            .unwrap()
            .scripts
            .entry(model.into())
            .or_default()
            .push_back(reply);
        self
    }

    /// Answers every unscripted request for `model` with `reply`.
    pub fn always(&self, model: &str, reply: Reply) -> &Self {
        self.inner
            .lock()
            .unwrap()
            .defaults
            .insert(model.into(), reply);
        self
    }

    /// Back to the plain text reply for `model`.
    pub fn heal(&self, model: &str) {
        self.inner.lock().unwrap().defaults.remove(model);
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.inner.lock().unwrap().requests.clone()
    }

    /// How many requests named `model`.
    pub fn count(&self, model: &str) -> usize {
        self.requests().iter().filter(|r| r.model == model).count()
    }
}

async fn handle(
    State(inner): State<Arc<Mutex<Inner>>>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    let model = body["model"].as_str().unwrap_or_default().to_string();
    let reply = {
        let mut g = inner.lock().unwrap();
        g.requests.push(Recorded {
            model: model.clone(),
            body: body.clone(),
            headers,
        });
        let scripted = g.scripts.get_mut(&model).and_then(VecDeque::pop_front);
        scripted
            .or_else(|| g.defaults.get(&model).cloned())
            .unwrap_or_else(|| text(&model, &format!("hello from {model}")))
    };
    let mut reply = reply;
    while let Reply::Delayed(pause, inner) = reply {
        tokio::time::sleep(pause).await;
        reply = *inner;
    }
    match reply {
        Reply::Hang => std::future::pending().await,
        Reply::Delayed(..) => unreachable!("unwrapped above"),
        Reply::EchoTool { prefix } => {
            let last = body["messages"]
                .as_array()
                .and_then(|m| m.iter().rev().find(|m| m["role"] == "tool"))
                .map(|m| {
                    m["content"]
                        .as_str()
                        .unwrap_or_default()
                        .replace('\n', " | ")
                })
                .unwrap_or_default();
            match text(&model, &format!("{prefix}{last}")) {
                Reply::Json { body, .. } => Json(body).into_response(),
                _ => unreachable!("text() builds a JSON reply"),
            }
        }
        Reply::Json {
            status,
            headers,
            body,
        } => {
            let mut r = (StatusCode::from_u16(status).unwrap(), Json(body)).into_response();
            for (k, v) in headers {
                r.headers_mut().insert(k, v.parse().unwrap());
            }
            r
        }
    }
}

/// A 200 with a completion built from `message` and `finish_reason`.
pub fn completion(model: &str, message: Value, finish_reason: Value) -> Reply {
    Reply::Json {
        status: 200,
        headers: vec![],
        body: json!({
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": 1,
            "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
            "usage": {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16},
            "system_fingerprint": "fp_fake"
        }),
    }
}

/// A plain text answer.
pub fn text(model: &str, content: &str) -> Reply {
    completion(
        model,
        json!({"role": "assistant", "content": content}),
        json!("stop"),
    )
}

/// An error reply.
pub fn error(status: u16, body: Value) -> Reply {
    Reply::Json {
        status,
        headers: vec![],
        body,
    }
}

/// OpenAI's rate limit, with `Retry-After`.
pub fn rate_limited(retry_after_secs: u64) -> Reply {
    Reply::Json {
        status: 429,
        headers: vec![("retry-after", retry_after_secs.to_string())],
        body: json!({"error": {"message": "Rate limit reached for requests", "type": "requests", "code": "rate_limit_exceeded"}}),
    }
}

/// OpenAI's exhausted quota (a 429 that is not a rate limit).
pub fn openai_quota() -> Reply {
    error(
        429,
        json!({"error": {"message": "You exceeded your current quota, please check your plan and billing details.", "type": "insufficient_quota", "code": "insufficient_quota"}}),
    )
}
