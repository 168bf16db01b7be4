//! Benchmark: time from a signed message event's acknowledgement (`POST /lark/events` answered
//! 200) to the receipt reaction `OnIt` arriving at a fake Lark, with 1 thread and with 20
//! threads in 20 chats. The fake Lark enforces Lark's per-chat send limit (5 messages per second
//! per chat, HTTP 429 / 99991400 beyond it); a fake model answers every request at once.
//!
//! Then, on the same fake: 60 plain questions arriving at once in 60 threads of one chat
//! (time until all are answered, Lark calls per answer), and two replicas on one database
//! answering a burst of 300 questions in 300 threads of 100 chats (the most calls of one API the fake received in any
//! second, and in any 61 s).
//!
//! Run with `bash scripts/bench.sh receipt` (it provides TEST_DATABASE_URL).

#[path = "../tests/api/database.rs"]
mod database;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use sshmode::app::App;
use sshmode::config::Config;
use sshmode::lark::webhook;
use tokio_util::sync::CancellationToken;

const KEY: &str = "bench-encrypt-key";
const TOKEN: &str = "bench-verification-token";
const BOT: &str = "ou_bench_bot";
/// Lark's per-chat send limit.
const PER_CHAT_PER_SEC: usize = 5;

#[derive(Default)]
struct Lark {
    /// message id → when its receipt reaction arrived.
    typing: HashMap<String, Instant>,
    /// Messages that were answered (a reply to them arrived).
    ended: std::collections::HashSet<String>,
    /// chat → send times within the last second.
    sends: HashMap<String, VecDeque<Instant>>,
    next: u64,
    limited: u64,
    /// When each call but the token's and the bot's identity arrived.
    calls: Vec<(String, Instant)>,
}

type Shared = Arc<Mutex<Lark>>;

/// The chat of a bench message id `om_<scenario>_c<chat>_<n>`.
fn chat_of(message_id: &str) -> String {
    message_id
        .rsplit_once('_')
        .map(|(c, _)| c)
        .unwrap_or("")
        .to_string()
}

async fn lark(State(s): State<Shared>, method: Method, uri: Uri, body: Bytes) -> Response {
    let now = Instant::now();
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let parts: Vec<&str> = uri.path().trim_start_matches('/').split('/').collect();
    let mut l = s.lock().unwrap();
    if !uri.path().contains("/auth/") && !uri.path().ends_with("/bot/v3/info") {
        // The API as the platform's frequency control counts it: the method and the path's last
        // named part (reply, reactions, …), ids left out.
        let api = parts
            .iter()
            .rev()
            .find(|p| !p.contains('_') && !p.chars().all(|c| c.is_ascii_digit()))
            .copied()
            .unwrap_or("");
        l.calls.push((format!("{method} {api}"), now));
    }
    let ok = |data: Value| Json(json!({"code": 0, "msg": "ok", "data": data})).into_response();
    match (method.as_str(), parts.as_slice()) {
        (_, ["open-apis", "auth", "v3", "tenant_access_token", "internal"]) => {
            Json(json!({"code": 0, "msg": "ok", "tenant_access_token": "t-bench", "expire": 7200}))
                .into_response()
        }
        ("GET", ["open-apis", "bot", "v3", "info"]) => {
            Json(json!({"code": 0, "msg": "ok", "bot": {"open_id": BOT, "app_name": "SSH Mode"}}))
                .into_response()
        }
        ("POST", ["open-apis", "im", "v1", "messages", id, "reactions"]) => {
            let emoji = body.pointer("/reaction_type/emoji_type");
            if emoji.and_then(Value::as_str) == Some(sshmode::agent::RECEIPT) {
                l.typing.entry(id.to_string()).or_insert(now);
            }
            l.next += 1;
            let n = l.next;
            ok(json!({"reaction_id": format!("r_{n}"), "message_id": id}))
        }
        ("DELETE", ["open-apis", "im", "v1", "messages", _, "reactions", _]) => ok(json!({})),
        ("POST", ["open-apis", "im", "v1", "messages", id, "reply"]) => {
            let chat = chat_of(id);
            let window = l.sends.entry(chat.clone()).or_default();
            while window
                .front()
                .is_some_and(|t| now.duration_since(*t) >= Duration::from_secs(1))
            {
                window.pop_front();
            }
            if window.len() >= PER_CHAT_PER_SEC {
                l.limited += 1;
                return (
                    StatusCode::TOO_MANY_REQUESTS,
                    [("x-ogw-ratelimit-reset", "1")],
                    Json(json!({"code": 99991400, "msg": "request trigger frequency limit"})),
                )
                    .into_response();
            }
            window.push_back(now);
            l.ended.insert(id.to_string());
            l.next += 1;
            let n = l.next;
            ok(json!({"message_id": format!("om_sent_{n}"), "chat_id": chat, "root_id": id}))
        }
        _ => ok(json!({})),
    }
}

async fn model(Json(_): Json<Value>) -> Json<Value> {
    Json(
        json!({"id": "x", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "done"},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}),
    )
}

async fn serve(router: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    format!("http://{addr}")
}

/// A signed, encrypted `im.message.receive_v1` event for a message in a thread of `chat`.
fn event(scenario: &str, chat: usize, n: usize) -> (String, Vec<u8>, String, String) {
    event_in(scenario, chat, chat, n)
}

/// The same in thread `thread` of `chat`.
fn event_in(
    scenario: &str,
    chat: usize,
    thread: usize,
    n: usize,
) -> (String, Vec<u8>, String, String) {
    let now_ms = chrono::Utc::now().timestamp_millis();
    let message_id = format!("om_{scenario}_c{chat}_{n}");
    let env = json!({
        "schema": "2.0",
        "header": {"event_id": format!("ev_{scenario}_{chat}_{n}"), "event_type": "im.message.receive_v1",
            "create_time": now_ms.to_string(), "token": TOKEN, "app_id": "cli_bench", "tenant_key": "tk"},
        "event": {
            "sender": {"sender_id": {"open_id": "ou_user", "user_id": "u1", "union_id": "on_u"},
                "sender_type": "user", "tenant_key": "tk"},
            "message": {"message_id": message_id, "root_id": format!("om_{scenario}_root{thread}"),
                "parent_id": "", "thread_id": format!("omt_{scenario}_{thread}"),
                "create_time": now_ms.to_string(), "chat_id": format!("oc_{scenario}_{chat}"),
                "chat_type": "group", "message_type": "text",
                "content": json!({"text": format!("@_user_1 look at item {n}")}).to_string(),
                "mentions": [{"key": "@_user_1", "id": {"open_id": BOT, "union_id": "on_bot",
                    "user_id": null}, "name": "SSH Mode", "tenant_key": "tk"}]}
        }
    });
    let mut iv = [0u8; 16];
    iv[..8].copy_from_slice(&(n as u64 * 1000 + chat as u64).to_le_bytes());
    iv[8..].copy_from_slice(&(thread as u64).to_le_bytes());
    let body = json!({"encrypt": webhook::encrypt(KEY, iv, env.to_string().as_bytes())})
        .to_string()
        .into_bytes();
    let ts = (now_ms / 1000).to_string();
    let sig = webhook::signature(&ts, "bench-nonce", KEY, &body);
    (message_id, body, ts, sig)
}

fn pct(sorted: &[Duration], p: usize) -> Duration {
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)]
}

/// Sends `per_chat` messages a second to each of `chats` threads for `seconds`; returns the
/// ack→reaction latencies, the number of receipts that never came, and how many of those
/// messages were answered (a reply) before their receipt was due — the service then
/// skips the receipt by design.
async fn scenario(
    name: &str,
    url: &str,
    lark: &Shared,
    chats: usize,
    per_chat: f64,
    seconds: u64,
) -> (Vec<Duration>, usize, usize) {
    let client = reqwest::Client::new();
    let acks: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let per = (per_chat * seconds as f64) as usize;
    let mut tasks = Vec::new();
    for chat in 0..chats {
        let (client, url, acks, name) = (
            client.clone(),
            url.to_string(),
            acks.clone(),
            name.to_string(),
        );
        tasks.push(tokio::spawn(async move {
            let gap = Duration::from_secs_f64(1.0 / per_chat);
            // Spread the chats' starts over one gap.
            tokio::time::sleep(gap.mul_f64(chat as f64 / chats as f64)).await;
            let mut tick = tokio::time::interval(gap);
            for n in 0..per {
                tick.tick().await;
                let (id, body, ts, sig) = event(&name, chat, n);
                let r = client
                    .post(format!("{url}/lark/events"))
                    .header("content-type", "application/json")
                    .header("X-Lark-Request-Timestamp", ts)
                    .header("X-Lark-Request-Nonce", "bench-nonce")
                    .header("X-Lark-Signature", sig)
                    .body(body)
                    .send()
                    .await
                    .expect("post event");
                assert_eq!(r.status(), 200, "event refused");
                acks.lock().unwrap().insert(id, Instant::now());
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let done = {
            let a = acks.lock().unwrap();
            let l = lark.lock().unwrap();
            a.keys().all(|k| l.typing.contains_key(k))
        };
        if done || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let a = acks.lock().unwrap();
    let l = lark.lock().unwrap();
    let mut lat: Vec<Duration> = a
        .iter()
        .filter_map(|(k, ack)| l.typing.get(k).map(|t| t.saturating_duration_since(*ack)))
        .collect();
    lat.sort();
    let missing = a.len() - lat.len();
    let answered_first = a
        .keys()
        .filter(|k| !l.typing.contains_key(*k) && l.ended.contains(*k))
        .count();
    (lat, missing, answered_first)
}

/// Posts one prepared event; panics unless it is acknowledged.
async fn post(client: &reqwest::Client, url: &str, ev: (String, Vec<u8>, String, String)) {
    let (_, body, ts, sig) = ev;
    let r = client
        .post(format!("{url}/lark/events"))
        .header("content-type", "application/json")
        .header("X-Lark-Request-Timestamp", ts)
        .header("X-Lark-Request-Nonce", "bench-nonce")
        .header("X-Lark-Signature", sig)
        .body(body)
        .send()
        .await
        .expect("post event");
    assert_eq!(r.status(), 200, "event refused");
}

/// Posts `events` at once, spread over `urls` (replicas) in turn; waits (at most `limit`) until
/// every one is answered. Returns the time from the first post to the last answer (or `None`
/// when some were not answered in time), and the calls the fake received meanwhile.
async fn burst(
    urls: &[String],
    lark: &Shared,
    events: Vec<(String, Vec<u8>, String, String)>,
    limit: Duration,
) -> (Option<Duration>, Vec<(String, Instant)>) {
    let client = reqwest::Client::new();
    let ids: Vec<String> = events.iter().map(|e| e.0.clone()).collect();
    let before = lark.lock().unwrap().calls.len();
    let started = Instant::now();
    let mut posts = Vec::new();
    for (i, ev) in events.into_iter().enumerate() {
        let (client, url) = (client.clone(), urls[i % urls.len()].clone());
        posts.push(tokio::spawn(async move { post(&client, &url, ev).await }));
    }
    for p in posts {
        p.await.unwrap();
    }
    let answered = loop {
        let done = {
            let l = lark.lock().unwrap();
            ids.iter().all(|id| l.ended.contains(id))
        };
        if done {
            break Some(started.elapsed());
        }
        if started.elapsed() > limit {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // Calls that follow the answers (none expected for plain answers) get a moment to land.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let calls = lark.lock().unwrap().calls[before..].to_vec();
    (answered, calls)
}

/// The most of `times` (sorted) within any span shorter than `span`.
fn busiest(times: &[Instant], span: Duration) -> usize {
    let mut most = 0;
    let mut start = 0;
    for end in 0..times.len() {
        while times[end].duration_since(times[start]) >= span {
            start += 1;
        }
        most = most.max(end - start + 1);
    }
    most
}

/// The service on `db`, answering through the fake Lark and model; returns its URL and the
/// token that stops it.
async fn service(
    db: &str,
    lark_url: &str,
    model_url: &str,
) -> anyhow::Result<(
    String,
    CancellationToken,
    tokio::task::JoinHandle<anyhow::Result<()>>,
)> {
    let dir = tempfile::tempdir()?;
    let vars: HashMap<&str, String> = [
        ("DATABASE_URL", db.to_string()),
        ("SSHMODE_DATA_DIR", dir.path().display().to_string()),
        ("LARK_APP_ID", "cli_bench".into()),
        ("LARK_APP_SECRET", "bench-secret".into()),
        ("LARK_VERIFICATION_TOKEN", TOKEN.into()),
        ("LARK_ENCRYPT_KEY", KEY.into()),
        ("LARK_BASE_URL", lark_url.to_string()),
        ("LLM_BASE_URL", model_url.to_string()),
        ("LLM_MODEL", "m".into()),
    ]
    .into_iter()
    .collect();
    let config = Config::from_vars(&|k| vars.get(k).cloned(), dir.path())?;
    // The data directory lives as long as the process: the service is stopped before exit.
    std::mem::forget(dir);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let shutdown = CancellationToken::new();
    let app = App::build(config, listener, shutdown.clone()).await?;
    let url = format!("http://{}", app.local_addr());
    let task = tokio::spawn(app.run());
    Ok((url, shutdown, task))
}

/// 60 plain questions at once in 60 threads of one chat; then two replicas on one database
/// under a burst of 300 questions in 300 threads of 100 chats.
async fn bursts(lark_url: &str, model_url: &str, shared: &Shared) -> anyhow::Result<()> {
    let db = database::fresh_database().await;
    let (url, stop, task) = service(&db, lark_url, model_url).await?;
    // Warm-up: token, bot info, connections.
    burst(
        std::slice::from_ref(&url),
        shared,
        vec![event_in("warm", 9, 9, 0)],
        Duration::from_secs(30),
    )
    .await;
    let limited = shared.lock().unwrap().limited;
    let events = (0..60).map(|t| event_in("sixty", 0, t, t)).collect();
    let (took, calls) = burst(
        std::slice::from_ref(&url),
        shared,
        events,
        Duration::from_secs(180),
    )
    .await;
    println!();
    println!("| 60 plain questions at once, 60 threads of one chat | value |");
    println!("|---|---|");
    match took {
        Some(t) => println!("| all answered after | {:.1} s |", t.as_secs_f64()),
        None => println!("| all answered after | not within 180 s |"),
    }
    println!(
        "| Lark calls per answer | {:.2} |",
        calls.len() as f64 / 60.0
    );
    println!(
        "| replies refused by the fake's per-chat limit | {} |",
        shared.lock().unwrap().limited - limited
    );
    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(10), task).await;

    let db = database::fresh_database().await;
    let (a, stop_a, task_a) = service(&db, lark_url, model_url).await?;
    let (b, stop_b, task_b) = service(&db, lark_url, model_url).await?;
    let urls = [a, b];
    burst(
        &urls,
        shared,
        vec![event_in("warm2", 9, 9, 0), event_in("warm2", 8, 8, 0)],
        Duration::from_secs(30),
    )
    .await;
    // A thread per question, so that each is a turn of its own and gets its own answer.
    let events = (0..300).map(|n| event_in("pair", n % 100, n, n)).collect();
    let (took, calls) = burst(&urls, shared, events, Duration::from_secs(300)).await;
    let mut by_api: HashMap<&str, Vec<Instant>> = HashMap::new();
    for (api, at) in &calls {
        by_api.entry(api.as_str()).or_default().push(*at);
    }
    let mut all: Vec<Instant> = calls.iter().map(|(_, at)| *at).collect();
    all.sort();
    let mut most = |span: Duration| {
        by_api
            .iter_mut()
            .map(|(api, times)| {
                times.sort();
                (busiest(times, span), *api)
            })
            .max()
            .unwrap_or((0, ""))
    };
    println!();
    println!(
        "| two replicas, one database: 300 questions at once in 300 threads of 100 chats | value |"
    );
    println!("|---|---|");
    match took {
        Some(t) => println!("| all answered after | {:.1} s |", t.as_secs_f64()),
        None => println!("| all answered after | not within 300 s |"),
    }
    println!("| Lark calls | {} |", calls.len());
    let (second, api_s) = most(Duration::from_secs(1));
    let (minute, api_m) = most(Duration::from_secs(61));
    println!("| most calls of one API in any 1 s (Lark: 50 per API) | {second} ({api_s}) |");
    println!(
        "| most calls of one API in any 61 s (Lark: 1000 a minute per API) | {minute} ({api_m}) |"
    );
    println!(
        "| most calls of all APIs in any 1 s (no platform limit; was the app-wide budget) | {} |",
        busiest(&all, Duration::from_secs(1))
    );
    stop_a.cancel();
    stop_b.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(10), task_a).await;
    let _ = tokio::time::timeout(Duration::from_secs(10), task_b).await;
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    sshmode::install_crypto_provider();
    let shared: Shared = Arc::default();
    let lark_url = serve(
        axum::Router::new()
            .fallback(lark)
            .with_state(shared.clone()),
    )
    .await;
    let model_url = serve(axum::Router::new().fallback(axum::routing::post(model))).await;
    let seconds: u64 = std::env::var("RECEIPT_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);

    println!(
        "| threads (chats) | messages/s per thread | events | p50 | p90 | p99 | max | no receipt (of which answered first) |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    // `RECEIPT_BURSTS_ONLY=1` skips the latency scenarios.
    let scenarios = if std::env::var_os("RECEIPT_BURSTS_ONLY").is_some() {
        &[][..]
    } else {
        &[
            ("one", 1usize, 4.0f64),
            ("twenty", 20, 1.0),
            ("twentyslow", 20, 0.25),
        ][..]
    };
    for &(name, chats, per_chat) in scenarios {
        let db = database::fresh_database().await;
        let dir = tempfile::tempdir()?;
        let vars: HashMap<&str, String> = [
            ("DATABASE_URL", db),
            ("SSHMODE_DATA_DIR", dir.path().display().to_string()),
            ("LARK_APP_ID", "cli_bench".into()),
            ("LARK_APP_SECRET", "bench-secret".into()),
            ("LARK_VERIFICATION_TOKEN", TOKEN.into()),
            ("LARK_ENCRYPT_KEY", KEY.into()),
            ("LARK_BASE_URL", lark_url.clone()),
            ("LLM_BASE_URL", model_url.clone()),
            ("LLM_MODEL", "m".into()),
        ]
        .into_iter()
        .collect();
        let config = Config::from_vars(&|k| vars.get(k).cloned(), dir.path())?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let shutdown = CancellationToken::new();
        let app = App::build(config, listener, shutdown.clone()).await?;
        let url = format!("http://{}", app.local_addr());
        let task = tokio::spawn(app.run());
        // Warm-up: token, bot info, connections.
        scenario(&format!("w{name}"), &url, &shared, chats, per_chat, 1).await;
        let (lat, missing, answered_first) =
            scenario(name, &url, &shared, chats, per_chat, seconds).await;
        let f = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1e3);
        println!(
            "| {chats} | {per_chat} | {} | {} | {} | {} | {} | {missing} ({answered_first}) |",
            lat.len() + missing,
            f(pct(&lat, 50)),
            f(pct(&lat, 90)),
            f(pct(&lat, 99)),
            f(*lat.last().unwrap()),
        );
        shutdown.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
    }
    println!(
        "replies refused by the per-chat limit: {}",
        shared.lock().unwrap().limited
    );
    bursts(&lark_url, &model_url, &shared).await
}
