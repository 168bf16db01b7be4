//! Benchmark: events acknowledged per second over one long connection (each acknowledged only
//! after its durable insert), and frame → acknowledgement latency, against the same events
//! over the webhook (`POST /lark/events`, signed and encrypted) in the same run, on the same
//! service: `SSHMODE_LARK_MODE=both`, inbox workers on, real PostgreSQL.
//!
//! Run with `bash scripts/bench.sh lark_ws` (it provides TEST_DATABASE_URL). Optional
//! arguments: `--window N` (messages in flight, default 16), `--seconds S` (default 10).
//!
//! The events are messages another app sent (they need no answer, as a busy group with the
//! all-messages scope produces), spread over 200 chats. The fake long-connection server and
//! the webhook clients run on a thread of their own with a single-threaded runtime.

#[path = "../tests/api/database.rs"]
mod database;
#[path = "support/mod.rs"]
#[allow(dead_code)]
mod support;

use support::{arg, ms, on_generator, percentile};

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use futures_util::{SinkExt as _, StreamExt as _};
use serde_json::json;
use sshmode::app::App;
use sshmode::config::Config;
use sshmode::lark::frame::{Frame, METHOD_DATA, header};
use sshmode::lark::webhook;
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;

const KEY: &str = "bench-encrypt-key";
const TOKEN: &str = "bench-verification-token";

fn envelope(id: &str, chat: usize) -> String {
    let now = chrono::Utc::now().timestamp_millis();
    json!({
        "schema": "2.0",
        "header": {"event_id": id, "event_type": "im.message.receive_v1",
            "create_time": now.to_string(), "token": TOKEN,
            "app_id": "cli_bench", "tenant_key": "tk_bench"},
        "event": {
            "sender": {"sender_id": {"open_id": "ou_other_app"}, "sender_type": "app", "tenant_key": "tk_bench"},
            "message": {"message_id": format!("om_{id}"), "root_id": "", "parent_id": "",
                "create_time": now.to_string(), "update_time": now.to_string(),
                "chat_id": format!("oc_{chat:032}"), "chat_type": "group", "message_type": "text",
                "content": json!({"text": "the nightly build finished: 1423 tests passed, 0 failed, artefacts uploaded"}).to_string(),
                "mentions": []}
        }
    })
    .to_string()
}

/// The long connection: the service connects to `listener`; `window` messages stay in flight
/// for `seconds`. Returns each message's frame-sent → ack time.
async fn over_the_connection(
    listener: tokio::net::TcpListener,
    window: usize,
    seconds: u64,
) -> (Vec<Duration>, Duration) {
    let (tcp, _) = listener.accept().await.unwrap();
    let ws = tokio_tungstenite::accept_async(tcp).await.unwrap();
    let (mut sink, mut stream) = ws.split();
    let mut sent: HashMap<String, Instant> = HashMap::new();
    let mut order: VecDeque<String> = VecDeque::new();
    let mut lat = Vec::new();
    let mut next = 0usize;
    let started = Instant::now();
    let end = started + Duration::from_secs(seconds);
    loop {
        while sent.len() < window && Instant::now() < end {
            let id = format!("ev_ws_{next:09}");
            let body = envelope(&id, next % 200);
            next += 1;
            let frame = Frame {
                seq_id: next as u64,
                log_id: 1,
                service: 1,
                method: METHOD_DATA,
                headers: vec![
                    header("type", "event"),
                    header("message_id", &id),
                    header("sum", "1"),
                    header("seq", "0"),
                ],
                payload: Some(body.into_bytes()),
                ..Frame::default()
            };
            sent.insert(id.clone(), Instant::now());
            order.push_back(id);
            sink.send(Message::binary(frame.encode())).await.unwrap();
        }
        if sent.is_empty() {
            break;
        }
        let Some(Ok(Message::Binary(bytes))) = stream.next().await else {
            panic!("the service closed the long connection");
        };
        let Some(frame) = Frame::decode(&bytes) else {
            continue;
        };
        if frame.method != METHOD_DATA {
            // A ping: answer it.
            let mut pong = frame.clone();
            pong.headers = vec![header("type", "pong")];
            sink.send(Message::binary(pong.encode())).await.unwrap();
            continue;
        }
        let id = frame.header("message_id").unwrap_or_default().to_owned();
        assert!(
            frame.payload.as_deref() == Some(&br#"{"code":200}"#[..]),
            "a failed ack"
        );
        if let Some(at) = sent.remove(&id) {
            lat.push(at.elapsed());
        }
    }
    (lat, started.elapsed())
}

/// The webhook: `window` clients, each sending signed, encrypted events one after another.
async fn over_the_webhook(base: String, window: usize, seconds: u64) -> (Vec<Duration>, Duration) {
    let client = reqwest::Client::new();
    let started = Instant::now();
    let end = started + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for c in 0..window {
        let client = client.clone();
        let base = base.clone();
        tasks.push(tokio::task::spawn_local(async move {
            let mut lat = Vec::new();
            let mut n = 0usize;
            while Instant::now() < end {
                let id = format!("ev_hook_{c:03}_{n:09}");
                n += 1;
                let plain = envelope(&id, n % 200);
                let sealed = json!({"encrypt": webhook::encrypt(KEY, [7u8; 16], plain.as_bytes())})
                    .to_string();
                let ts = chrono::Utc::now().timestamp().to_string();
                let nonce = format!("n{n}");
                let sig = webhook::signature(&ts, &nonce, KEY, sealed.as_bytes());
                let t = Instant::now();
                let r = client
                    .post(format!("{base}/lark/events"))
                    .header("content-type", "application/json")
                    .header(webhook::HEADER_TIMESTAMP, &ts)
                    .header(webhook::HEADER_NONCE, &nonce)
                    .header(webhook::HEADER_SIGNATURE, sig)
                    .body(sealed)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 200);
                let _ = r.bytes().await;
                lat.push(t.elapsed());
            }
            lat
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    (all, started.elapsed())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let window = arg("--window", 16) as usize;
    let seconds = arg("--seconds", 10);
    let db = database::fresh_database().await;
    let dir = tempfile::tempdir()?;

    // The endpoint (on a fake of Lark's Open API) and the long-connection server.
    let ws_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let ws_url = format!(
        "ws://{}/ws/v2?device_id=1&service_id=1&ticket=bench",
        ws_listener.local_addr()?
    );
    let endpoint = axum::Router::new().route(
        "/callback/ws/endpoint",
        axum::routing::post(move || {
            let url = ws_url.clone();
            async move {
                axum::Json(json!({"code":0,"msg":"ok","data":{"URL":url,"ClientConfig":
                    {"ReconnectCount":-1,"ReconnectInterval":1,"ReconnectNonce":0,"PingInterval":120}}}))
            }
        }),
    );
    let api = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let api_base = format!("http://{}", api.local_addr()?);
    tokio::spawn(async move { axum::serve(api, endpoint).await });

    let vars: HashMap<&str, String> = [
        ("DATABASE_URL", db.clone()),
        ("SSHMODE_DATA_DIR", dir.path().display().to_string()),
        ("LARK_APP_ID", "cli_bench".into()),
        ("LARK_APP_SECRET", "bench-secret".into()),
        ("LARK_VERIFICATION_TOKEN", TOKEN.into()),
        ("LARK_ENCRYPT_KEY", KEY.into()),
        ("LARK_BASE_URL", api_base),
        ("SSHMODE_LARK_MODE", "both".into()),
    ]
    .into_iter()
    .collect();
    let config = Config::from_vars(&|k| vars.get(k).cloned(), dir.path())?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let shutdown = CancellationToken::new();
    let app = App::build(config, listener, shutdown.clone()).await?;
    let base = format!("http://{}", app.local_addr());
    let server = tokio::spawn(app.run());

    let (mut ws_lat, ws_time) =
        on_generator(move || over_the_connection(ws_listener, window, seconds)).await;
    let (mut hook_lat, hook_time) = on_generator(move || async move {
        tokio::task::LocalSet::new()
            .run_until(over_the_webhook(base, window, seconds))
            .await
    })
    .await;
    ws_lat.sort();
    hook_lat.sort();
    println!("| path | in flight | acked | per second | p50 | p99 | max |");
    println!("|---|---|---|---|---|---|---|");
    for (name, lat, time) in [
        ("long connection (frame → ack)", &ws_lat, ws_time),
        ("webhook (request → 200)", &hook_lat, hook_time),
    ] {
        println!(
            "| {name} | {window} | {} | {:.0} | {:.2} ms | {:.2} ms | {:.2} ms |",
            lat.len(),
            lat.len() as f64 / time.as_secs_f64(),
            ms(percentile(lat, 0.5)),
            ms(percentile(lat, 0.99)),
            ms(lat.last().copied().unwrap_or_default()),
        );
    }
    shutdown.cancel();
    let _ = server.await;
    Ok(())
}
