//! Benchmark of the live progress card (see BENCHMARKS.md): 20 turns in 20 chats at once, each
//! reporting STEPS tool steps to the real `progress::Progress` sink, which streams to a fake
//! CardKit over HTTP. Measured: the time from a step's completion (the `ToolFinished` event) to
//! the card update that first shows it finished, p50 and p99. Target: p99 ≤ 500 ms.
//!
//! Run with `bash scripts/bench.sh progress` (it provides TEST_DATABASE_URL).

#[path = "../tests/api/database.rs"]
mod database;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::State;
use axum::http::Uri;
use serde_json::{Value, json};
use sshmode::agent::{StepEvent, StepSink};
use sshmode::config::Config;
use sshmode::exec::Place;

/// Concurrent turns (each in its own chat).
const TURNS: usize = 20;
/// Steps per turn.
const STEPS: usize = 30;

/// marker → when its step finished; samples of the delay until a card showed it.
#[derive(Default)]
struct Seen {
    pending: HashMap<String, Instant>,
    samples: Vec<Duration>,
    next: u64,
}

type Shared = Arc<Mutex<Seen>>;

fn main() {
    sshmode::install_crypto_provider();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run());
}

async fn fake(State(seen): State<Shared>, uri: Uri, body: Option<Json<Value>>) -> Json<Value> {
    let path = uri.path();
    let body = body.map(|b| b.0).unwrap_or(Value::Null);
    if path.ends_with("/tenant_access_token/internal") {
        return Json(json!({"code":0,"msg":"ok","tenant_access_token":"t-1","expire":7200}));
    }
    let mut s = seen.lock().unwrap();
    s.next += 1;
    let n = s.next;
    if path == "/open-apis/cardkit/v1/cards" {
        return Json(json!({"code":0,"msg":"ok","data":{"card_id": format!("ck_{n}")}}));
    }
    if path.ends_with("/reply") {
        return Json(json!({"code":0,"msg":"ok","data":{"message_id": format!("om_{n}")}}));
    }
    if path.ends_with("/content") {
        let text = body["content"].as_str().unwrap_or_default().to_string();
        let now = Instant::now();
        let done: Vec<String> = s
            .pending
            .keys()
            .filter(|m| text.contains(&format!("`{m}` · exit 0")))
            .cloned()
            .collect();
        for m in done {
            let t0 = s.pending.remove(&m).unwrap();
            s.samples.push(now - t0);
        }
    }
    Json(json!({"code":0,"msg":"ok","data":{}}))
}

async fn run() {
    let db_url = database::fresh_database().await;
    let seen: Shared = Arc::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let app = axum::Router::new().fallback(fake).with_state(seen.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });

    let tmp = tempfile::tempdir().unwrap();
    let mut vars = HashMap::new();
    vars.insert("DATABASE_URL".to_string(), db_url);
    vars.insert(
        "SSHMODE_DATA_DIR".to_string(),
        tmp.path().join("data").display().to_string(),
    );
    vars.insert("LARK_BASE_URL".to_string(), base.clone());
    let config = Config::from_vars(&|k| vars.get(k).cloned(), tmp.path()).unwrap();
    let store = sshmode::store::Store::open(&config).await.unwrap();
    let db = store.pool.clone();
    let metrics = Arc::new(sshmode::metrics::Metrics::new());
    let lark = Arc::new(
        sshmode::lark::client::LarkClient::new(
            &base,
            "cli_bench",
            secrecy::SecretString::from("s".to_string()),
            metrics.clone(),
        )
        .unwrap(),
    );
    let progress = sshmode::progress::Progress::new(
        lark,
        db.clone(),
        metrics,
        config.progress.clone(),
        tokio_util::task::TaskTracker::new(),
    );

    let started = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..TURNS {
        let section = format!("oc_bench_{t}");
        let turn_id: i64 = sqlx::query_scalar(
            "INSERT INTO turns (section_id, chat_id) VALUES ($1, $1) RETURNING id",
        )
        .bind(&section)
        .fetch_one(&db)
        .await
        .unwrap();
        let progress = progress.clone();
        let seen = seen.clone();
        tasks.push(tokio::spawn(async move {
            progress.step(
                &section,
                turn_id,
                &StepEvent::Started {
                    resumed: false,
                    chat_id: section.clone(),
                    reply_to: format!("om_user_{t}"),
                    in_thread: false,
                    place: Some(Place::Local),
                },
            );
            for k in 0..STEPS {
                let marker = format!("s{t}x{k}");
                progress.step(
                    &section,
                    turn_id,
                    &StepEvent::ToolStarted {
                        tool: "terminal".into(),
                        short: marker.clone(),
                    },
                );
                // Steps of 20–320 ms, different per turn and step.
                let ms = 20 + ((t * 37 + k * 101) % 300) as u64;
                tokio::time::sleep(Duration::from_millis(ms)).await;
                seen.lock().unwrap().pending.insert(marker, Instant::now());
                progress.step(
                    &section,
                    turn_id,
                    &StepEvent::ToolFinished {
                        tool: "terminal".into(),
                        ok: true,
                        millis: ms,
                        backend: Some("local".into()),
                        exit: Some("exit 0".into()),
                        approval: None,
                    },
                );
            }
            progress.step(
                &section,
                turn_id,
                &StepEvent::Ended {
                    outcome: "done".into(),
                    lark_calls: 0,
                },
            );
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while !seen.lock().unwrap().pending.is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (mut samples, missing) = {
        let s = seen.lock().unwrap();
        (s.samples.clone(), s.pending.len())
    };
    samples.sort();
    let p = |q: usize| samples[(samples.len() * q / 100).min(samples.len() - 1)];
    println!(
        "progress card: {TURNS} concurrent turns × {STEPS} steps in {:.1} s; step finished → card shows it: \
         n={} p50={:.1} ms p99={:.1} ms max={:.1} ms; never shown: {missing}",
        started.elapsed().as_secs_f64(),
        samples.len(),
        p(50).as_secs_f64() * 1e3,
        p(99).as_secs_f64() * 1e3,
        samples.last().unwrap().as_secs_f64() * 1e3,
    );
    store.close().await;
}
