//! Benchmark of live output (see BENCHMARKS.md), in two parts.
//!
//! 1. **Line → card.** The service as `serve` builds it (`App::build`, inbox and turn workers
//!    on, real PostgreSQL), a fake model that asks for one `terminal` call, and a fake Lark
//!    (CardKit over HTTP). The command prints a line with its wall-clock time (`date +%s%N`)
//!    every 200 ms; the fake CardKit notes, for each line, when a content update first shows
//!    it. Locally and on a real OpenSSH server on loopback (one host, one clock).
//! 2. **Cost to the command.** A command printing 50 MB as fast as it can, through
//!    `Ops::terminal`, with and without a live tail sampled as the agent samples it,
//!    alternated, locally and over SSH: the median wall time of each, and their ratio.
//!
//! Run as root with `bash scripts/bench.sh live_output` (it provides TEST_DATABASE_URL).

#[path = "../tests/api/database.rs"]
mod database;

#[path = "../tests/api/sshd.rs"]
#[allow(dead_code)]
mod sshd;

#[path = "support/mod.rs"]
#[allow(dead_code)]
mod support;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::extract::State;
use axum::http::Uri;
use serde_json::{Value, json};
use sshmode::app::App;
use sshmode::authz::{Binding, Kind};
use sshmode::config::Config;
use sshmode::exec::Place;
use sshmode::exec::live::LiveTail;
use sshmode::turns::TurnRequest;
use tokio_util::sync::CancellationToken;

/// Lines each measured command prints, one every 200 ms.
const LINES: usize = 40;
/// Turns per backend.
const TURNS: usize = 3;
/// Bytes of the flood.
const FLOOD: u64 = 50_000_000;
/// Flood runs per variant and backend.
const FLOOD_RUNS: usize = 5;

#[derive(Default)]
struct Seen {
    /// Line stamps already seen on a card.
    shown: HashSet<u64>,
    samples: Vec<Duration>,
    next: u64,
}

type Shared = Arc<Mutex<Seen>>;

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

fn main() {
    if !sshd::available() {
        eprintln!("live_output: needs root and sshd");
        std::process::exit(1);
    }
    sshmode::install_crypto_provider();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run());
}

/// The fake model and the fake Lark, on one port.
async fn fake(State(seen): State<Shared>, uri: Uri, body: Option<Json<Value>>) -> Json<Value> {
    let path = uri.path();
    let body = body.map(|b| b.0).unwrap_or(Value::Null);
    if path.ends_with("/chat/completions") {
        let ran = body["messages"]
            .as_array()
            .is_some_and(|m| m.iter().any(|m| m["role"] == "tool"));
        let message = if ran {
            json!({"role": "assistant", "content": "done"})
        } else {
            let command =
                format!("for i in $(seq {LINES}); do echo \"t=$(date +%s%N)\"; sleep 0.2; done");
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "terminal", "arguments": json!({"command": command}).to_string()}}]})
        };
        return Json(
            json!({"id": "x", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "message": message, "finish_reason": if ran {"stop"} else {"tool_calls"}}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}),
        );
    }
    if path.ends_with("/tenant_access_token/internal") {
        return Json(json!({"code":0,"msg":"ok","tenant_access_token":"t-1","expire":7200}));
    }
    let mut s = seen.lock().unwrap();
    s.next += 1;
    let n = s.next;
    if path == "/open-apis/cardkit/v1/cards" {
        return Json(json!({"code":0,"msg":"ok","data":{"card_id": format!("ck_{n}")}}));
    }
    if path.ends_with("/content") {
        let now = now_ns();
        let text = body["content"].as_str().unwrap_or_default();
        for stamp in text
            .lines()
            .filter_map(|l| l.strip_prefix("t=")?.parse::<u64>().ok())
        {
            if s.shown.insert(stamp) {
                s.samples
                    .push(Duration::from_nanos(now.saturating_sub(stamp)));
            }
        }
    }
    Json(
        json!({"code":0,"msg":"ok","data":{"message_id": format!("om_{n}"), "reaction_id": format!("r_{n}")}}),
    )
}

async fn run() {
    let db_url = database::fresh_database().await;
    let seen: Shared = Arc::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let fake_app = axum::Router::new().fallback(fake).with_state(seen.clone());
    tokio::spawn(async move { axum::serve(listener, fake_app).await });

    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let sshd = sshd::Sshd::start_below(dir);
    let key = dir.join("bench_key");
    sshd::new_key(&key, "ed25519", "");
    sshd.authorize(&dir.join("bench_key.pub"));
    let vars: HashMap<&str, String> = [
        ("DATABASE_URL", db_url),
        ("SSHMODE_DATA_DIR", dir.join("data").display().to_string()),
        ("LARK_APP_ID", "cli_bench".into()),
        ("LARK_APP_SECRET", "bench-secret".into()),
        ("LARK_VERIFICATION_TOKEN", "bench-token".into()),
        ("LARK_ENCRYPT_KEY", "bench-encrypt-key".into()),
        ("LARK_BASE_URL", base.clone()),
        ("LLM_BASE_URL", format!("{base}/v1")),
        ("LLM_MODEL", "m".into()),
        ("SSHMODE_WORKERS_ENABLED", "true".into()),
    ]
    .into_iter()
    .collect();
    let config = Config::from_vars(&|k| vars.get(k).cloned(), dir).unwrap();
    let vault = sshmode::vault::Vault::open_or_create(&config.master_key_file).unwrap();
    let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let shutdown = CancellationToken::new();
    let app = App::build(config, http, shutdown.clone()).await.unwrap();
    let state = app.state().clone();
    let db = state.db.clone();
    let server = tokio::spawn(app.run());
    sshmode::target::add(
        &db,
        &vault,
        support::loopback_target(
            "t",
            sshd.port,
            sshd::USER,
            &std::fs::read_to_string(&key).unwrap(),
        ),
        "bench",
    )
    .await
    .unwrap();
    let generation = sshmode::target::get(&db, "t").await.unwrap().generation;

    println!("\n## Live output\n");
    println!(
        "| backend | lines | line written → card update p50 | p99 | max |\n|---|---|---|---|---|"
    );
    for (label, place) in [("local", Place::Local), ("ssh", Place::Target("t".into()))] {
        seen.lock().unwrap().samples.clear();
        for turn in 0..TURNS {
            let section = format!("omt_live_{label}_{turn}");
            if let Place::Target(alias) = &place {
                let mut conn = db.acquire().await.unwrap();
                sshmode::chat::binding::set(
                    &mut conn,
                    &Binding {
                        section: section.clone(),
                        alias: alias.clone(),
                        kind: Kind::Sticky,
                        owner: "ou_bench".into(),
                        bound_at: chrono::Utc::now(),
                        grant_id: None,
                        chat_id: Some("oc_bench".into()),
                        generation: Some(generation),
                    },
                )
                .await
                .unwrap();
            }
            state
                .agent
                .accept(&TurnRequest {
                    section: section.clone(),
                    chat_id: "oc_bench".into(),
                    message_id: format!("om_bench_{label}_{turn}"),
                    sender: "ou_bench".into(),
                    text: "go".into(),
                    in_thread: true,
                })
                .await
                .unwrap();
            let deadline = Instant::now() + Duration::from_secs(120);
            loop {
                let st: Option<String> =
                    sqlx::query_scalar("SELECT state FROM turns WHERE section_id = $1")
                        .bind(&section)
                        .fetch_optional(&db)
                        .await
                        .unwrap();
                if st
                    .as_deref()
                    .is_some_and(|s| s != "running" && s != "queued")
                {
                    break;
                }
                assert!(Instant::now() < deadline, "turn did not end");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let mut samples = seen.lock().unwrap().samples.clone();
        samples.sort();
        assert!(!samples.is_empty(), "no line reached a card");
        println!(
            "| {label} | {} of {} | {:.0} ms | {:.0} ms | {:.0} ms |",
            samples.len(),
            LINES * TURNS,
            support::ms(support::percentile(&samples, 0.5)),
            support::ms(support::percentile(&samples, 0.99)),
            support::ms(*samples.last().unwrap()),
        );
    }

    println!(
        "\n| backend | 50 MB, no live tail (median of {FLOOD_RUNS}) | with a live tail sampled every 200 ms | ratio |\n|---|---|---|---|"
    );
    let never = CancellationToken::new();
    let command =
        format!("yes 0123456789abcdefghijklmnopqrstuvwxyz0123456789abc | head -c {FLOOD}");
    for (label, place) in [("local", Place::Local), ("ssh", Place::Target("t".into()))] {
        let (mut plain, mut live) = (Vec::new(), Vec::new());
        for i in 0..FLOOD_RUNS * 2 + 1 {
            let watched = i % 2 == 1;
            let tail = watched.then(|| Arc::new(LiveTail::new()));
            let ops = state
                .exec
                .ops_for("bench_flood", &place)
                .await
                .unwrap()
                .with_live(tail.clone());
            let done = CancellationToken::new();
            let sampler = tail.clone().map(|t| {
                let done = done.clone();
                tokio::spawn(async move {
                    let mut samples = 0u64;
                    loop {
                        tokio::select! {
                            _ = done.cancelled() => break,
                            _ = t.changed() => {}
                        }
                        std::hint::black_box(t.snapshot(false).text());
                        samples += 1;
                        tokio::select! {
                            _ = done.cancelled() => break,
                            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                        }
                    }
                    samples
                })
            });
            let t0 = Instant::now();
            let r = ops
                .terminal(&command, Default::default(), &never)
                .await
                .unwrap();
            let took = t0.elapsed();
            done.cancel();
            if let Some(s) = sampler {
                s.await.unwrap();
            }
            assert_eq!(
                r.output.stdout_omitted + r.output.stdout.len() as u64
                    - sshmode::exec::truncate::marker(r.output.stdout_omitted).len() as u64,
                FLOOD
            );
            if i == 0 {
                continue; // warm-up
            }
            if watched {
                live.push(took);
            } else {
                plain.push(took);
            }
        }
        plain.sort();
        live.sort();
        let (p, l) = (
            support::percentile(&plain, 0.5),
            support::percentile(&live, 0.5),
        );
        println!(
            "| {label} | {:.0} ms | {:.0} ms | {:.3} |",
            support::ms(p),
            support::ms(l),
            l.as_secs_f64() / p.as_secs_f64()
        );
    }
    shutdown.cancel();
    let _ = server.await;
    drop(sshd);
}
