//! The OpenAI-compatible HTTP client: sends one chat request to one provider entry and returns
//! the parsed reply or a [`CallFailure`] to classify. One `reqwest::Client` for every provider;
//! no retries here (reqwest's own retry layer is switched off) — retrying is the router's job.
//! Never logs a key or a request body.

use std::time::Duration;

use chrono::{DateTime, Utc};
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use secrecy::{ExposeSecret, SecretString};
use serde_json::Value;

use super::classify::CallFailure;
use super::wire::{ChatRequest, ChatResponse};

/// Largest reply body read; a completion far larger than this is a broken provider.
const MAX_BODY: usize = 16 * 1024 * 1024;

/// Longest `Retry-After` honoured; a provider asking for more is treated as this.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(6 * 3600);

/// Where one router entry sends its requests.
#[derive(Clone)]
pub struct Endpoint {
    /// `{base_url}/chat/completions`.
    pub url: String,
    /// `Authorization: Bearer …` (marked sensitive) plus the provider's extra headers.
    pub headers: HeaderMap,
    /// Kept only to scrub it from provider messages that echo it back.
    pub key: Option<SecretString>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl Endpoint {
    pub fn new(
        base_url: &str,
        key: Option<SecretString>,
        extra: &[(String, String)],
    ) -> anyhow::Result<Self> {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        for (name, value) in extra {
            headers.insert(
                HeaderName::from_bytes(name.as_bytes())?,
                HeaderValue::from_str(value)?,
            );
        }
        if let Some(k) = &key {
            let mut v =
                HeaderValue::from_str(&format!("Bearer {}", k.expose_secret())).map_err(|_| {
                    anyhow::anyhow!("the API key contains characters not allowed in a header")
                })?;
            v.set_sensitive(true);
            headers.insert(AUTHORIZATION, v);
        }
        Ok(Endpoint {
            url: format!("{}/chat/completions", base_url.trim_end_matches('/')),
            headers,
            key,
        })
    }

    /// The key, for scrubbing only.
    pub fn key_text(&self) -> Option<&str> {
        self.key.as_ref().map(|k| k.expose_secret())
    }
}

/// The shared HTTP client.
#[derive(Clone, Debug)]
pub struct Client {
    http: reqwest::Client,
}

impl Client {
    /// `timeout` bounds each whole request (connect, send, wait, read).
    pub fn new(timeout: Duration) -> anyhow::Result<Self> {
        crate::install_crypto_provider();
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(10)))
            .retry(reqwest::retry::never())
            .pool_max_idle_per_host(16)
            .user_agent(concat!("sshmode/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(Client { http })
    }

    /// Sends `request` (whose `model` is already the provider's) and parses the reply. `now`
    /// dates a `Retry-After` given as an HTTP date.
    pub async fn send(
        &self,
        endpoint: &Endpoint,
        request: &ChatRequest,
        now: DateTime<Utc>,
    ) -> Result<ChatResponse, CallFailure> {
        let body = serde_json::to_vec(request)
            .map_err(|e| CallFailure::BadReply(format!("request not encodable: {e}")))?;
        let resp = self
            .http
            .post(&endpoint.url)
            .headers(endpoint.headers.clone())
            .body(body)
            .send()
            .await
            .map_err(transport)?;
        let status = resp.status().as_u16();
        let retry_after = retry_after(resp.headers(), now);
        let bytes = read_bounded(resp).await?;
        if !(200..300).contains(&status) {
            return Err(error_reply(status, retry_after, &bytes));
        }
        let mut reply: ChatResponse = serde_json::from_slice(&bytes).map_err(|e| {
            // Some providers answer 200 with an error body.
            match serde_json::from_slice::<Value>(&bytes) {
                Ok(v) if v.get("error").is_some() => error_reply(500, None, &bytes),
                _ => CallFailure::BadReply(format!("reply is not a chat completion: {e}")),
            }
        })?;
        if reply.choices.is_empty() {
            if serde_json::from_slice::<Value>(&bytes)
                .ok()
                .is_some_and(|v| v.get("error").is_some())
            {
                return Err(error_reply(500, None, &bytes));
            }
            return Err(CallFailure::BadReply("reply has no choices".into()));
        }
        reply.normalize();
        Ok(reply)
    }
}

fn transport(e: reqwest::Error) -> CallFailure {
    if e.is_timeout() {
        CallFailure::Timeout
    } else {
        // The display of a reqwest error names the URL but never headers; its causes say
        // what went wrong (`tcp connect error: Connection refused`, a DNS or TLS failure).
        CallFailure::Connection(with_causes(&without_url(e)))
    }
}

/// An error and its causes, `: `-joined, each once (bounded: eight levels).
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    for _ in 0..8 {
        let Some(c) = cause else { break };
        let text = c.to_string();
        if !s.contains(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        cause = c.source();
    }
    s
}

fn without_url(e: reqwest::Error) -> reqwest::Error {
    e.without_url()
}

async fn read_bounded(mut resp: reqwest::Response) -> Result<Vec<u8>, CallFailure> {
    let mut out = Vec::new();
    loop {
        match resp.chunk().await {
            Ok(Some(chunk)) => {
                if out.len() + chunk.len() > MAX_BODY {
                    return Err(CallFailure::BadReply("reply is too large".into()));
                }
                out.extend_from_slice(&chunk);
            }
            Ok(None) => return Ok(out),
            Err(e) => return Err(transport(e)),
        }
    }
}

/// Reads `{"error":{"message","type","code"}}` and the variants providers use instead
/// (`{"error":"text"}`, top-level `code`/`message`, plain text).
fn error_reply(status: u16, retry_after: Option<Duration>, body: &[u8]) -> CallFailure {
    let text = |v: Option<&Value>| -> Option<String> {
        match v? {
            Value::String(s) if !s.is_empty() => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        }
    };
    let (code, kind, message) = match serde_json::from_slice::<Value>(body) {
        Ok(v) => {
            let err = match v.get("error") {
                Some(Value::Object(_)) => v.get("error").unwrap_or(&v),
                Some(Value::String(s)) => {
                    return CallFailure::Status {
                        status,
                        retry_after,
                        code: text(v.get("code")),
                        kind: text(v.get("type")),
                        message: s.clone(),
                    };
                }
                _ => &v,
            };
            (
                text(err.get("code")),
                text(err.get("type")),
                text(err.get("message"))
                    .or_else(|| text(err.get("msg")))
                    .unwrap_or_default(),
            )
        }
        Err(_) => (
            None,
            None,
            String::from_utf8_lossy(&body[..body.len().min(1024)]).into_owned(),
        ),
    };
    CallFailure::Status {
        status,
        retry_after,
        code,
        kind,
        message,
    }
}

/// `retry-after-ms`, then `Retry-After` in seconds or as an HTTP date; capped.
fn retry_after(h: &HeaderMap, now: DateTime<Utc>) -> Option<Duration> {
    let get = |name: &str| h.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
    let d = if let Some(ms) = get("retry-after-ms").and_then(|v| v.parse::<f64>().ok()) {
        Duration::try_from_secs_f64(ms / 1000.0).ok()?
    } else {
        let v = get("retry-after")?;
        if let Ok(secs) = v.parse::<f64>() {
            Duration::try_from_secs_f64(secs).ok()?
        } else {
            let at = DateTime::parse_from_rfc2822(v).ok()?.with_timezone(&Utc);
            (at - now).to_std().ok()?
        }
    };
    Some(d.min(MAX_RETRY_AFTER))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_forms() {
        let now = DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let mut h = HeaderMap::new();
        h.insert("retry-after", HeaderValue::from_static("17"));
        assert_eq!(retry_after(&h, now), Some(Duration::from_secs(17)));
        h.insert(
            "retry-after",
            HeaderValue::from_static("Thu, 01 Jan 2026 00:01:00 GMT"),
        );
        assert_eq!(retry_after(&h, now), Some(Duration::from_secs(60)));
        h.insert("retry-after", HeaderValue::from_static("999999"));
        assert_eq!(retry_after(&h, now), Some(MAX_RETRY_AFTER));
        h.insert("retry-after-ms", HeaderValue::from_static("1500"));
        assert_eq!(retry_after(&h, now), Some(Duration::from_millis(1500)));
        assert_eq!(retry_after(&HeaderMap::new(), now), None);
    }

    #[test]
    fn error_bodies() {
        let f = error_reply(
            403,
            None,
            br#"{"error":{"code":"AccountOverdueError","message":"overdue","type":"Forbidden"}}"#,
        );
        let CallFailure::Status {
            code,
            kind,
            message,
            ..
        } = f
        else {
            panic!()
        };
        assert_eq!(code.as_deref(), Some("AccountOverdueError"));
        assert_eq!(kind.as_deref(), Some("Forbidden"));
        assert_eq!(message, "overdue");
        let f = error_reply(502, None, b"<html>bad gateway</html>");
        assert!(
            matches!(f, CallFailure::Status { status: 502, message, .. } if message.contains("bad gateway"))
        );
        let f = error_reply(
            400,
            None,
            br#"{"code":"Arrearage","message":"Access denied"}"#,
        );
        assert!(matches!(f, CallFailure::Status { code: Some(c), .. } if c == "Arrearage"));
    }
}
