//! A fake of Lark's long-connection server: a WebSocket on loopback speaking `pbbp2` frames
//! as PROTOCOL.md describes — it answers pings with pongs (optionally carrying a client
//! configuration), sends the frames a test gives it to the connection open now, records the
//! acknowledgements, and can refuse the upgrade with Lark's handshake headers, stall (accept and
//! then never answer), or drop the connection.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{SinkExt as _, StreamExt as _};
use serde_json::Value;
use sshmode::lark::frame::{Frame, METHOD_CONTROL, METHOD_DATA, header};
use tokio::sync::{mpsc, watch};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};

pub const SERVICE_ID: i32 = 33554678;
pub const TICKET: &str = "ticket-that-must-never-be-logged";

#[derive(Default)]
struct State {
    connections: usize,
    /// `(Handshake-Status, Handshake-Autherrcode)` of refused upgrades, while set.
    refuse: Option<(String, String)>,
    /// Accept, then never send or answer anything.
    stall: bool,
    pong_config: Option<Value>,
    pings: usize,
    acks: Vec<Frame>,
    /// To each connection open, the newest last.
    outboxes: Vec<mpsc::UnboundedSender<Option<Frame>>>,
}

pub struct FakeWs {
    /// The URL the endpoint hands out, ticket included.
    pub url: String,
    state: Arc<Mutex<State>>,
    changed: Arc<watch::Sender<u64>>,
}

impl FakeWs {
    pub async fn start() -> FakeWs {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State::default()));
        let changed = Arc::new(watch::channel(0u64).0);
        let (s, c) = (state.clone(), changed.clone());
        tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(serve(tcp, s.clone(), c.clone()));
            }
        });
        FakeWs {
            url: format!(
                "ws://{addr}/ws/v2?fpid=1&aid=2&device_id=7001&access_key=ab&service_id={SERVICE_ID}&ticket={TICKET}"
            ),
            state,
            changed,
        }
    }

    fn bump(&self) {
        self.changed.send_modify(|n| *n += 1);
    }

    /// Waits (bounded) until `check` holds.
    async fn until<T>(&self, what: &str, mut check: impl FnMut(&State) -> Option<T>) -> T {
        let mut rx = self.changed.subscribe();
        // Longer than the client's watchdog (PingInterval + 30 s), which a stall waits for.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(50);
        loop {
            if let Some(v) = check(&self.state.lock().unwrap()) {
                return v;
            }
            assert!(tokio::time::Instant::now() < deadline, "never: {what}");
            let _ = tokio::time::timeout(Duration::from_millis(200), rx.changed()).await;
        }
    }

    pub async fn wait_connections(&self, n: usize) {
        self.until(&format!("{n} connections"), |s| {
            (s.connections >= n && s.outboxes.iter().any(|o| !o.is_closed())).then_some(())
        })
        .await
    }

    pub async fn wait_pings(&self, n: usize) {
        self.until(&format!("{n} pings"), |s| (s.pings >= n).then_some(()))
            .await
    }

    pub fn connections(&self) -> usize {
        self.state.lock().unwrap().connections
    }

    /// Sends `frame` on the newest connection open.
    pub fn send(&self, frame: Frame) {
        let mut s = self.state.lock().unwrap();
        s.outboxes.retain(|o| !o.is_closed());
        s.outboxes
            .last()
            .expect("a connection")
            .send(Some(frame))
            .unwrap();
    }

    /// Closes the newest connection open.
    pub fn drop_connection(&self) {
        let mut s = self.state.lock().unwrap();
        s.outboxes.retain(|o| !o.is_closed());
        if let Some(out) = s.outboxes.pop() {
            let _ = out.send(None);
        }
    }

    pub fn refuse(&self, status: &str, code: &str) {
        self.state.lock().unwrap().refuse = Some((status.into(), code.into()));
    }

    pub fn accept(&self) {
        self.state.lock().unwrap().refuse = None;
        self.bump();
    }

    pub fn stall(&self, on: bool) {
        self.state.lock().unwrap().stall = on;
    }

    pub fn set_pong_config(&self, config: Value) {
        self.state.lock().unwrap().pong_config = Some(config);
    }

    /// The acknowledgement of the message whose frames carried `message_id`.
    pub async fn ack(&self, message_id: &str) -> Frame {
        self.until(&format!("an ack of {message_id}"), |s| {
            s.acks
                .iter()
                .find(|a| a.header("message_id") == Some(message_id))
                .cloned()
        })
        .await
    }

    pub fn acks(&self) -> Vec<Frame> {
        self.state.lock().unwrap().acks.clone()
    }
}

/// A data frame of kind `kind` (`event` or `card`), fragment `seq` of `sum`.
/// An event envelope as the platform sends it over the long connection: `header.token` empty
/// (the connection was opened with the app secret; no SDK checks the token on this path).
pub fn platform_form(mut envelope: Value) -> Vec<u8> {
    if let Some(header) = envelope.get_mut("header").and_then(Value::as_object_mut) {
        header.insert("token".into(), Value::String(String::new()));
    }
    envelope.to_string().into_bytes()
}

pub fn data_frame(kind: &str, message_id: &str, sum: usize, seq: usize, payload: &[u8]) -> Frame {
    Frame {
        seq_id: seq as u64 + 1,
        log_id: 42,
        service: SERVICE_ID,
        method: METHOD_DATA,
        headers: vec![
            header("type", kind),
            header("message_id", message_id),
            header("sum", &sum.to_string()),
            header("seq", &seq.to_string()),
            header("trace_id", "tr"),
        ],
        payload: Some(payload.to_vec()),
        ..Frame::default()
    }
}

// The upgrade callback's `Result<Response, ErrorResponse>` is tungstenite's own signature.
#[allow(clippy::result_large_err)]
async fn serve(
    tcp: tokio::net::TcpStream,
    state: Arc<Mutex<State>>,
    changed: Arc<watch::Sender<u64>>,
) {
    let refuse = state.lock().unwrap().refuse.clone();
    let callback = |_req: &Request, resp: Response| -> Result<Response, ErrorResponse> {
        match &refuse {
            None => Ok(resp),
            Some((status, code)) => {
                let mut e = ErrorResponse::new(Some("refused".into()));
                *e.status_mut() = tokio_tungstenite::tungstenite::http::StatusCode::FORBIDDEN;
                e.headers_mut()
                    .insert("Handshake-Status", status.parse().unwrap());
                e.headers_mut()
                    .insert("Handshake-Msg", "refused".parse().unwrap());
                e.headers_mut()
                    .insert("Handshake-Autherrcode", code.parse().unwrap());
                Err(e)
            }
        }
    };
    let Ok(ws) = tokio_tungstenite::accept_hdr_async(tcp, callback).await else {
        changed.send_modify(|n| *n += 1);
        return;
    };
    let (mut sink, mut stream) = ws.split();
    let (tx, mut rx) = mpsc::unbounded_channel::<Option<Frame>>();
    {
        let mut s = state.lock().unwrap();
        s.connections += 1;
        s.outboxes.push(tx.clone());
    }
    changed.send_modify(|n| *n += 1);
    loop {
        tokio::select! {
            out = rx.recv() => match out {
                Some(Some(frame)) => {
                    if sink.send(Message::binary(frame.encode())).await.is_err() {
                        return;
                    }
                }
                // Dropped by the test (or replaced by a newer connection).
                _ => {
                    let _ = sink.close().await;
                    return;
                }
            },
            incoming = stream.next() => {
                let Some(Ok(Message::Binary(bytes))) = incoming else {
                    return;
                };
                let Some(frame) = Frame::decode(&bytes) else { continue };
                let mut s = state.lock().unwrap();
                if s.stall {
                    continue;
                }
                if frame.method == METHOD_CONTROL && frame.header("type") == Some("ping") {
                    s.pings += 1;
                    let mut pong = frame.clone();
                    pong.headers = vec![header("type", "pong")];
                    pong.payload = s.pong_config.as_ref().map(|c| c.to_string().into_bytes());
                    let _ = tx.send(Some(pong));
                } else if frame.method == METHOD_DATA {
                    s.acks.push(frame);
                }
                drop(s);
                changed.send_modify(|n| *n += 1);
            }
        }
    }
}
