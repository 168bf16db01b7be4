//! Benchmark: the model router's overhead per request (see BENCHMARKS.md).
//!
//! Starts an in-process fake OpenAI-compatible provider and, in one run, alternates three ways
//! of sending the same chat request to it: a bare `reqwest` POST whose reply is parsed as JSON,
//! the router's own client alone, and the full router (entry state read from PostgreSQL,
//! bookkeeping, metrics). Prints the median and p90 of each and the router's added median.
//!
//! Needs a PostgreSQL server in `TEST_DATABASE_URL`: `bash scripts/bench.sh router`.
//! Optional argument: the number of requests per variant (default 2000).

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Json;
use axum::routing::post;
use serde_json::{Value, json};
use sqlx::Connection;
use sshmode::clock::SystemClock;
use sshmode::config::RouterTunables;
use sshmode::config::router_file::RouterFile;
use sshmode::llm::client::{Client, Endpoint};
use sshmode::llm::{ChatRequest, Message, Router};
use sshmode::metrics::Metrics;

fn main() -> anyhow::Result<()> {
    let n: usize = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .and_then(|a| a.parse().ok())
        .unwrap_or(2000);
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(run(n))
}

async fn fake_reply(Json(body): Json<Value>) -> Json<Value> {
    Json(json!({
        "id": "chatcmpl-bench", "object": "chat.completion", "created": 1,
        "model": body["model"],
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 20, "completion_tokens": 1, "total_tokens": 21}
    }))
}

async fn run(n: usize) -> anyhow::Result<()> {
    let server = std::env::var("TEST_DATABASE_URL").map_err(|_| {
        anyhow::anyhow!("TEST_DATABASE_URL is not set: run `bash scripts/bench.sh router`")
    })?;
    let db_name = format!("bench_router_{}", uuid::Uuid::new_v4().simple());
    let mut admin = sqlx::PgConnection::connect(&server).await?;
    sqlx::query(&format!("CREATE DATABASE {db_name}"))
        .execute(&mut admin)
        .await?;
    let db_url = match server.rsplit_once('/') {
        Some((prefix, _)) => format!("{prefix}/{db_name}"),
        None => anyhow::bail!("TEST_DATABASE_URL has no database path"),
    };
    let pool = sqlx::PgPool::connect(&db_url).await?;
    sshmode::store::MIGRATOR.run(&pool).await?;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}/v1", listener.local_addr()?);
    let app = axum::Router::new().route("/v1/chat/completions", post(fake_reply));
    tokio::spawn(async move { axum::serve(listener, app).await });

    let tunables = RouterTunables {
        request_timeout: Duration::from_secs(30),
        quota_cooldown: Duration::from_secs(5 * 3600),
        rate_cooldown: Duration::from_secs(30),
        probe_interval: Duration::from_secs(300),
    };
    let file = RouterFile::single(&base, Some("sk-bench".to_string().into()), "bench-model");
    let router = Router::new(
        file,
        None,
        &tunables,
        pool.clone(),
        Arc::new(SystemClock),
        Arc::new(Metrics::new()),
    )?;
    let client = Client::new(tunables.request_timeout)?;
    let endpoint = Endpoint::new(&base, Some("sk-bench".to_string().into()), &[])?;
    let raw = reqwest::Client::builder()
        .retry(reqwest::retry::never())
        .build()?;
    let url = format!("{base}/chat/completions");

    let request = ChatRequest {
        model: "bench-model".into(),
        messages: vec![
            Message::system("You are a helpful assistant."),
            Message::user("Say ok."),
        ],
        max_tokens: Some(16),
        ..Default::default()
    };

    let (mut t_raw, mut t_client, mut t_router) = (Vec::new(), Vec::new(), Vec::new());
    // Warm-up: connections, the pool, lazy statics.
    for _ in 0..100 {
        router.chat(None, request.clone()).await?;
        client
            .send(&endpoint, &request, chrono::Utc::now())
            .await
            .ok();
    }
    for _ in 0..n {
        let t = Instant::now();
        let body = serde_json::to_vec(&request)?;
        let v: Value = raw
            .post(&url)
            .bearer_auth("sk-bench")
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await?
            .json()
            .await?;
        assert!(v["choices"][0]["message"]["content"] == "ok");
        t_raw.push(t.elapsed());

        let t = Instant::now();
        client
            .send(&endpoint, &request, chrono::Utc::now())
            .await
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
        t_client.push(t.elapsed());

        let t = Instant::now();
        let routed = router.chat(None, request.clone()).await?;
        t_router.push(t.elapsed());
        assert_eq!(routed.served.model, "bench-model");
    }

    let (raw_m, raw_90) = summary(&mut t_raw);
    let (cl_m, cl_90) = summary(&mut t_client);
    let (ro_m, ro_90) = summary(&mut t_router);
    println!("router overhead, {n} requests per variant, interleaved");
    println!("  direct reqwest + JSON parse : median {raw_m:8.1} µs   p90 {raw_90:8.1} µs");
    println!("  router client only          : median {cl_m:8.1} µs   p90 {cl_90:8.1} µs");
    println!("  full router (state in PG)   : median {ro_m:8.1} µs   p90 {ro_90:8.1} µs");
    println!(
        "  added by the router vs direct: median {:+.1} µs (target ≤ 1000 µs)",
        ro_m - raw_m
    );

    pool.close().await;
    sqlx::query(&format!("DROP DATABASE {db_name} WITH (FORCE)"))
        .execute(&mut admin)
        .await?;
    Ok(())
}

/// Median and p90 in microseconds.
fn summary(samples: &mut [Duration]) -> (f64, f64) {
    samples.sort();
    let at =
        |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1e6;
    (at(0.5), at(0.9))
}
