//! The long connection: Lark's events and card callbacks over a WebSocket the service dials
//! out (PROTOCOL.md, "Long-connection mode"), for deployments without a public URL.
//!
//! It owns the endpoint call, the connection (tokio-tungstenite on the process's rustls/ring
//! provider), pings and the client configuration pongs carry, a watchdog that takes a silent
//! connection for dead (nothing received within `PingInterval` + 30 s), reassembly of
//! fragmented messages (≤ 1 MiB each, at most [`MAX_PARTIAL`] incomplete ones, each dropped
//! after [`PARTIAL_TTL`] — every drop counted), and the supervisor that reconnects on the SDKs'
//! schedule (a random first delay under `ReconnectNonce`, then `ReconnectInterval`, the
//! endpoint fetched anew each time) but never gives up: a server-sent `ReconnectCount` is
//! ignored, and final errors (forbidden, too many connections, a client error from the
//! endpoint) are reported once with the platform's code and retried slowly.
//!
//! Each whole message goes to a [`Deliver`] — which records it durably, in a task on the app's
//! tracker, so that shutdown waits for it — and is acknowledged only after it returns:
//! `{"code":200}` (with the callback's response, a card click's toast) or `{"code":500}`, so
//! the platform redelivers an event that could not be recorded (a card callback is never
//! redelivered, and a failed one shows the user error 200671: the deliverer answers one it
//! could not record with code 200 and a toast). It never decides
//! what a message means, never checks it (the deliverer does), and never logs the connection
//! URL (it carries a ticket).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{SinkExt as _, StreamExt as _};
use secrecy::{ExposeSecret as _, SecretString};
use tokio::sync::{Semaphore, mpsc};
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::frame::{ClientConfig, Frame, METHOD_CONTROL, METHOD_DATA};
use crate::metrics::Metrics;

/// Largest message, fragments joined.
pub const MAX_MESSAGE: usize = 1 << 20;
/// Most incomplete messages buffered at once; past it the oldest is dropped.
pub const MAX_PARTIAL: usize = 64;
/// How long an incomplete message waits for its other fragments.
pub const PARTIAL_TTL: Duration = Duration::from_secs(10);
/// Most messages being handled at once on one connection.
const MAX_IN_FLIGHT: usize = 64;
/// Added to `PingInterval`: a connection that sent nothing for that long is dead.
const SILENCE_GRACE: Duration = Duration::from_secs(30);
/// Wait before retrying after a final error.
const FINAL_RETRY: Duration = Duration::from_secs(600);
/// Deadline of the endpoint call and of the WebSocket handshake.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

/// What a whole message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Event,
    Card,
}

/// Where whole messages go: recorded durably, then answered. `Ok(Some)` is a callback's
/// response (JSON) to carry in the acknowledgement; `Err` makes the acknowledgement a failure,
/// so the platform redelivers the event (never for a card callback, which is not redelivered:
/// answer it with a toast instead).
#[async_trait::async_trait]
pub trait Deliver: Send + Sync + 'static {
    async fn deliver(&self, kind: Kind, payload: Vec<u8>) -> Result<Option<Vec<u8>>, ()>;
}

/// The connection's state, for `/readyz` and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Connecting,
    Connected,
    /// Waiting to reconnect after a failure.
    Waiting,
    /// Waiting after a final error (forbidden, too many connections, a refused app).
    Refused,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Connecting => "connecting",
            State::Connected => "connected",
            State::Waiting => "reconnecting",
            State::Refused => "refused",
        }
    }
}

/// Why a connection ended or could not be made.
#[derive(Debug)]
enum Failure {
    /// Worth trying again on the usual schedule.
    Retry(String),
    /// The platform refused for good (with its code): retried slowly, reported once.
    Final(String),
}

/// Shared view of the connection's state.
#[derive(Debug, Clone)]
pub struct Status(Arc<std::sync::Mutex<State>>);

impl Status {
    fn new() -> Status {
        Status(Arc::new(std::sync::Mutex::new(State::Connecting)))
    }
    pub fn get(&self) -> State {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
    fn set(&self, s: State) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = s;
    }
}

/// The long-connection client of one app.
pub struct LongConnection {
    http: reqwest::Client,
    base_url: String,
    app_id: String,
    app_secret: SecretString,
    metrics: Arc<Metrics>,
    status: Status,
}

impl LongConnection {
    pub fn new(
        base_url: &str,
        app_id: &str,
        app_secret: SecretString,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<LongConnection> {
        let http = reqwest::Client::builder()
            .timeout(CONNECT_TIMEOUT)
            .build()?;
        Ok(LongConnection {
            http,
            base_url: base_url.trim_end_matches('/').to_owned(),
            app_id: app_id.to_owned(),
            app_secret,
            metrics,
            status: Status::new(),
        })
    }

    /// The connection's state, shared.
    pub fn status(&self) -> Status {
        self.status.clone()
    }

    /// Fetches the endpoint: the URL to connect to (secret: it carries a ticket) and the
    /// client configuration.
    pub async fn endpoint(&self) -> Result<(SecretString, ClientConfig), String> {
        self.fetch_endpoint().await.map_err(|f| match f {
            Failure::Retry(e) | Failure::Final(e) => e,
        })
    }

    async fn fetch_endpoint(&self) -> Result<(SecretString, ClientConfig), Failure> {
        #[derive(serde::Deserialize)]
        struct Answer {
            code: i64,
            #[serde(default)]
            msg: String,
            data: Option<Data>,
        }
        #[derive(serde::Deserialize)]
        struct Data {
            #[serde(rename = "URL", default)]
            url: String,
            #[serde(rename = "ClientConfig", default)]
            client_config: Option<ClientConfig>,
        }
        let body = serde_json::json!({
            "AppID": self.app_id,
            "AppSecret": self.app_secret.expose_secret(),
        });
        let response = self
            .http
            .post(format!("{}/callback/ws/endpoint", self.base_url))
            .header("locale", "zh")
            .json(&body)
            .send()
            .await
            .map_err(|e| {
                Failure::Retry(format!("the endpoint call failed: {}", e.without_url()))
            })?;
        let status = response.status();
        if !status.is_success() {
            return Err(Failure::Retry(format!(
                "the endpoint answered HTTP {status}"
            )));
        }
        let answer: Answer = response
            .json()
            .await
            .map_err(|e| Failure::Retry(format!("the endpoint's answer is not JSON: {e}")))?;
        match answer.code {
            0 => {}
            1 | 1000040343 => {
                return Err(Failure::Retry(format!(
                    "the endpoint is busy (code {}: {})",
                    answer.code, answer.msg
                )));
            }
            code => {
                return Err(Failure::Final(format!(
                    "the endpoint refused this app (code {code}: {}); check LARK_APP_ID and \
                     LARK_APP_SECRET, and that the app is a self-built app",
                    answer.msg
                )));
            }
        }
        let data = answer
            .data
            .filter(|d| !d.url.is_empty())
            .ok_or_else(|| Failure::Retry("the endpoint gave no URL".into()))?;
        Ok((
            SecretString::from(data.url),
            data.client_config.unwrap_or_default(),
        ))
    }

    /// Runs until `stop` is cancelled: connects, hands whole messages to `deliver`, each in a
    /// task on `tasks` (the app's tracker, so that shutdown waits for a message being
    /// recorded), and reconnects after every failure, forever.
    pub async fn run(
        self: Arc<Self>,
        deliver: Arc<dyn Deliver>,
        stop: CancellationToken,
        tasks: TaskTracker,
    ) {
        let mut config = ClientConfig::default();
        let mut attempts: u64 = 0;
        let mut reported_final = false;
        self.metrics.lark_ws_enabled.set(1);
        loop {
            self.status.set(State::Connecting);
            let (failure, connected) = tokio::select! {
                _ = stop.cancelled() => break,
                f = self.connect_once(&deliver, &tasks, &mut config) => f,
            };
            self.metrics.lark_ws_connected.set(0);
            // A connection that worked starts the schedule again: the random delay first.
            if connected {
                attempts = 0;
            }
            attempts += 1;
            let wait = match &failure {
                Failure::Retry(why) => {
                    reported_final = false;
                    tracing::warn!(
                        lark.ws = why.as_str(),
                        "Lark long connection lost; reconnecting"
                    );
                    self.metrics.lark_ws_frame("reconnect");
                    self.status.set(State::Waiting);
                    if attempts == 1 || config.reconnect_interval == 0 {
                        jitter(config.reconnect_nonce)
                    } else {
                        Duration::from_secs(config.reconnect_interval)
                    }
                }
                Failure::Final(why) => {
                    if !reported_final {
                        tracing::error!(lark.ws = why.as_str(), "Lark refused the long connection");
                    }
                    reported_final = true;
                    self.status.set(State::Refused);
                    FINAL_RETRY.max(Duration::from_secs(config.reconnect_interval))
                }
            };
            self.metrics
                .lark_ws_reconnects
                .get_or_create(&crate::metrics::ReasonLabel {
                    reason: match failure {
                        Failure::Retry(_) => "retry".into(),
                        Failure::Final(_) => "final".into(),
                    },
                })
                .inc();
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep(wait) => {}
            }
        }
        self.metrics.lark_ws_connected.set(0);
    }

    /// One endpoint call and one connection, until it ends; and whether it was open.
    async fn connect_once(
        &self,
        deliver: &Arc<dyn Deliver>,
        tasks: &TaskTracker,
        config: &mut ClientConfig,
    ) -> (Failure, bool) {
        let (url, fetched) = match self.fetch_endpoint().await {
            Ok(e) => e,
            Err(f) => return (f, false),
        };
        *config = fetched;
        let service_id = query(url.expose_secret(), "service_id")
            .and_then(|s| s.parse::<i32>().ok())
            .unwrap_or(0);
        let connection_id = query(url.expose_secret(), "device_id").unwrap_or_default();
        let mut ws_config = tungstenite::protocol::WebSocketConfig::default();
        ws_config.max_message_size = Some(MAX_MESSAGE + 64 * 1024);
        ws_config.max_frame_size = Some(MAX_MESSAGE + 64 * 1024);
        let connect = tokio_tungstenite::connect_async_with_config(
            url.expose_secret(),
            Some(ws_config),
            true,
        );
        let ws = match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
            Err(_) => {
                return (
                    Failure::Retry("the WebSocket handshake timed out".into()),
                    false,
                );
            }
            Ok(Err(e)) => return (handshake_failure(e), false),
            Ok(Ok((ws, _))) => ws,
        };
        tracing::info!(lark.ws_connection = %connection_id, "Lark long connection open");
        self.status.set(State::Connected);
        self.metrics.lark_ws_connected.set(1);
        (
            self.session(ws, service_id, deliver, tasks, config).await,
            true,
        )
    }

    /// Reads frames until the connection ends; pings, reassembles, delivers, acknowledges.
    async fn session<S>(
        &self,
        ws: tokio_tungstenite::WebSocketStream<S>,
        service_id: i32,
        deliver: &Arc<dyn Deliver>,
        tasks: &TaskTracker,
        config: &mut ClientConfig,
    ) -> Failure
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        let (mut sink, mut stream) = ws.split();
        let (acks, mut ack_rx) = mpsc::channel::<Frame>(MAX_IN_FLIGHT);
        let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
        let mut partial: HashMap<String, Partial> = HashMap::new();
        let mut last_seen = Instant::now();
        let ping = |config: &ClientConfig| Duration::from_secs(config.ping_interval.max(1));
        if let Err(e) = sink
            .send(Message::binary(Frame::ping(service_id).encode()))
            .await
        {
            return Failure::Retry(format!("sending the first ping failed: {e}"));
        }
        let mut next_ping = tokio::time::Instant::now() + ping(config);
        loop {
            let silence = ping(config) + SILENCE_GRACE;
            let dead_at = tokio::time::Instant::from_std(last_seen + silence);
            tokio::select! {
                message = stream.next() => {
                    let message = match message {
                        None => return Failure::Retry("the server closed the connection".into()),
                        Some(Err(e)) => return Failure::Retry(format!("reading failed: {e}")),
                        Some(Ok(m)) => m,
                    };
                    last_seen = Instant::now();
                    let bytes = match message {
                        Message::Binary(b) => b,
                        Message::Close(_) => {
                            return Failure::Retry("the server closed the connection".into());
                        }
                        // Text and WebSocket pings are not frames of the protocol.
                        _ => continue,
                    };
                    let Some(frame) = Frame::decode(&bytes) else {
                        self.metrics.lark_ws_frame("dropped:undecodable");
                        continue;
                    };
                    match frame.method {
                        METHOD_CONTROL => {
                            let kind = frame.header("type").unwrap_or("control");
                            self.metrics.lark_ws_frame(if kind == "pong" { "pong" } else if kind == "ping" { "ping" } else { "control" });
                            if kind == "pong"
                                && let Some(p) = frame.payload.as_deref().filter(|p| !p.is_empty())
                                && let Ok(c) = serde_json::from_slice::<ClientConfig>(p)
                            {
                                if c.reconnect_count >= 0 {
                                    tracing::info!(reconnect_count = c.reconnect_count, "the server limits reconnections; this client keeps reconnecting");
                                }
                                *config = c;
                                // A shorter interval takes effect now, not after the old one.
                                next_ping = next_ping.min(tokio::time::Instant::now() + ping(config));
                            }
                        }
                        METHOD_DATA => {
                            if let Some((kind, payload, last)) = self.reassemble(&mut partial, frame) {
                                let permit = match in_flight.clone().acquire_owned().await {
                                    Ok(p) => p,
                                    Err(_) => return Failure::Retry("closing".into()),
                                };
                                let deliver = deliver.clone();
                                let acks = acks.clone();
                                let metrics = self.metrics.clone();
                                tasks.spawn(async move {
                                    let started = Instant::now();
                                    let outcome = deliver.deliver(kind, payload).await;
                                    let ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
                                    let ack = last.ack(outcome.as_ref().map(|o| o.as_deref()).map_err(|_| ()), ms);
                                    let _ = acks.send(ack).await;
                                    metrics.lark_ws_ack_seconds.observe(started.elapsed().as_secs_f64());
                                    drop(permit);
                                });
                            }
                        }
                        _ => self.metrics.lark_ws_frame("dropped:unknown-method"),
                    }
                }
                Some(ack) = ack_rx.recv() => {
                    if let Err(e) = sink.send(Message::binary(ack.encode())).await {
                        return Failure::Retry(format!("sending an acknowledgement failed: {e}"));
                    }
                }
                _ = tokio::time::sleep_until(next_ping) => {
                    if let Err(e) = sink.send(Message::binary(Frame::ping(service_id).encode())).await {
                        return Failure::Retry(format!("sending a ping failed: {e}"));
                    }
                    next_ping = tokio::time::Instant::now() + ping(config);
                    self.expire(&mut partial);
                }
                _ = tokio::time::sleep_until(dead_at) => {
                    return Failure::Retry(format!(
                        "nothing received for {} s: taken for dead",
                        silence.as_secs()
                    ));
                }
            }
        }
    }

    /// Adds a data frame to its message; returns the message when it is whole, with the frame
    /// to acknowledge (the last to arrive).
    fn reassemble(
        &self,
        partial: &mut HashMap<String, Partial>,
        frame: Frame,
    ) -> Option<(Kind, Vec<u8>, Frame)> {
        let kind = match frame.header("type") {
            Some("card") => Kind::Card,
            Some("event") => Kind::Event,
            _ => {
                self.metrics.lark_ws_frame("dropped:unknown-type");
                return None;
            }
        };
        self.metrics
            .lark_ws_frame(if kind == Kind::Card { "card" } else { "event" });
        let sum: usize = frame
            .header("sum")
            .and_then(|s| s.parse().ok())
            .unwrap_or(1);
        let seq: usize = frame
            .header("seq")
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let payload = frame.payload.clone().unwrap_or_default();
        if sum <= 1 {
            if payload.len() > MAX_MESSAGE {
                self.metrics.lark_ws_frame("dropped:too-large");
                return None;
            }
            let mut ack = frame;
            ack.payload = None;
            return Some((kind, payload, ack));
        }
        if sum > 1024 || seq >= sum {
            self.metrics.lark_ws_frame("dropped:bad-fragment");
            return None;
        }
        let id = frame.header("message_id").unwrap_or_default().to_owned();
        self.expire(partial);
        if !partial.contains_key(&id)
            && partial.len() >= MAX_PARTIAL
            && let Some(oldest) = partial
                .iter()
                .min_by_key(|(_, p)| p.started)
                .map(|(k, _)| k.clone())
        {
            partial.remove(&oldest);
            self.metrics.lark_ws_frame("dropped:too-many-partial");
        }
        let entry = partial.entry(id.clone()).or_insert_with(|| Partial {
            parts: vec![None; sum],
            size: 0,
            started: Instant::now(),
        });
        if entry.parts.len() != sum {
            partial.remove(&id);
            self.metrics.lark_ws_frame("dropped:bad-fragment");
            return None;
        }
        if entry.parts[seq].is_none() {
            entry.size += payload.len();
            entry.parts[seq] = Some(payload);
        }
        if entry.size > MAX_MESSAGE {
            partial.remove(&id);
            self.metrics.lark_ws_frame("dropped:too-large");
            return None;
        }
        if entry.parts.iter().any(Option::is_none) {
            return None;
        }
        let whole = partial.remove(&id)?;
        let payload: Vec<u8> = whole.parts.into_iter().flatten().flatten().collect();
        let mut ack = frame;
        ack.payload = None;
        Some((kind, payload, ack))
    }

    /// Drops incomplete messages older than [`PARTIAL_TTL`].
    fn expire(&self, partial: &mut HashMap<String, Partial>) {
        let before = partial.len();
        partial.retain(|_, p| p.started.elapsed() < PARTIAL_TTL);
        for _ in partial.len()..before {
            self.metrics.lark_ws_frame("dropped:incomplete");
        }
    }
}

/// A message whose fragments are still arriving.
struct Partial {
    parts: Vec<Option<Vec<u8>>>,
    size: usize,
    started: Instant,
}

/// A refused upgrade: 403 (forbidden) and 514 with 1000040350 (too many connections) are
/// final; anything else is retried.
fn handshake_failure(e: tungstenite::Error) -> Failure {
    let tungstenite::Error::Http(response) = &e else {
        return Failure::Retry(format!("connecting failed: {}", redact(&e.to_string())));
    };
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let status = header("Handshake-Status");
    let message = header("Handshake-Msg");
    let code = header("Handshake-Autherrcode");
    let what = format!(
        "the upgrade was refused (HTTP {}, Handshake-Status {status}, Handshake-Autherrcode {code}: {message})",
        response.status().as_u16()
    );
    match (status.as_str(), code.as_str()) {
        ("403", _) => Failure::Final(format!("{what}: forbidden")),
        ("514", "1000040350") => Failure::Final(format!(
            "{what}: too many connections for this app (at most 50)"
        )),
        _ => Failure::Retry(what),
    }
}

/// `text` with anything after `ticket=` hidden.
fn redact(text: &str) -> String {
    match text.find("ticket=") {
        Some(at) => format!("{}ticket=…", &text[..at]),
        None => text.to_owned(),
    }
}

/// The value of `name` in the query of `url`.
fn query<'a>(url: &'a str, name: &str) -> Option<&'a str> {
    url.split_once('?')?
        .1
        .split('&')
        .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
}

/// A random delay in [0, `nonce`) seconds.
fn jitter(nonce: u64) -> Duration {
    if nonce == 0 {
        return Duration::ZERO;
    }
    let mut b = [0u8; 8];
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b);
    Duration::from_millis(u64::from_le_bytes(b) % (nonce * 1000))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_url_gives_its_ids_and_the_ticket_is_never_shown() {
        let url = "wss://x.example/ws/v2?fpid=1&aid=2&device_id=123&access_key=ab&service_id=33554678&ticket=6b1";
        assert_eq!(query(url, "service_id"), Some("33554678"));
        assert_eq!(query(url, "device_id"), Some("123"));
        assert_eq!(query(url, "aid"), Some("2"));
        assert!(!redact(&format!("error connecting to {url}")).contains("6b1"));
    }

    #[test]
    fn a_refused_upgrade_is_final_only_for_the_final_codes() {
        let refused = |status: &str, code: &str| {
            let response = tungstenite::http::Response::builder()
                .status(400)
                .header("Handshake-Status", status)
                .header("Handshake-Autherrcode", code)
                .body(None)
                .unwrap();
            handshake_failure(tungstenite::Error::Http(Box::new(response)))
        };
        assert!(matches!(refused("403", ""), Failure::Final(_)));
        assert!(matches!(refused("514", "1000040350"), Failure::Final(_)));
        assert!(matches!(refused("514", "1"), Failure::Retry(_)));
        assert!(matches!(refused("500", ""), Failure::Retry(_)));
    }

    #[test]
    fn the_first_delay_is_under_the_nonce() {
        for _ in 0..100 {
            assert!(jitter(3) < Duration::from_secs(3));
        }
        assert_eq!(jitter(0), Duration::ZERO);
    }
}
