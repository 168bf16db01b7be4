//! Benchmark: signed + encrypted Lark events acknowledged per second by `POST /lark/events`,
//! with ack latency, next to the same machine's raw single-row INSERT rate (pgbench, same
//! client concurrency, default `synchronous_commit`) into a table shaped like the inbox.
//!
//! Run with `bash scripts/bench.sh lark_ingress` (it provides TEST_DATABASE_URL and PG_BIN).
//! Optional arguments: `--clients N` (default 16), `--seconds S` (default 5: one round's
//! closed loop, and one pgbench run), `--rounds R` (default 4), `--workers` (the service as
//! deployed: inbox workers on; the events are then messages sent by another app, which need no
//! answer, as a busy group with the all-messages scope produces), `--people` (with
//! `--workers`: the messages are from people instead and mention no one, so the workers
//! handle each one — its log entry, the question whether the bot is in its thread — and a
//! fake Lark on loopback answers the bot's identity), `--chats N` (default 1: every event in
//! one chat; e.g. 200 spreads them round-robin).
//!
//! **Rounds.** The machine's speed drifts from second to second (a shared host), so the
//! service and pgbench take turns: each round runs the service's closed loop (N clients as
//! fast as acks come back), waits until the workers have handled what it left (timing that
//! drain), then runs pgbench (N clients, one INSERT per transaction, the payload as a
//! parameter) for as long. Each round's ratio compares two runs seconds apart; the table gives
//! every round, their median and the ratio of the totals. Then, once: pgbench with the payload
//! as a literal (for comparison); an open loop at half the median pgbench rate over N
//! connections, latency measured from each request's scheduled send time (so a stall is not
//! hidden by coordinated omission); and pgbench at that same rate (`-R`). Without `--workers`
//! the inbox workers are off: this measures the acknowledgement path alone (signature,
//! decrypt, parse, token, freshness, durable insert).
//!
//! The service runs on this process's multi-threaded runtime; the load generator runs on a
//! thread of its own with a single-threaded runtime, as pgbench runs in a process of its own.

#[path = "../tests/api/database.rs"]
mod database;
#[path = "support/mod.rs"]
#[allow(dead_code)]
mod support;

use support::{arg, ms, on_generator, percentile};

use std::cell::Cell;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use sshmode::app::App;
use sshmode::config::Config;
use sshmode::lark::webhook;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

const KEY: &str = "bench-encrypt-key";
const TOKEN: &str = "bench-verification-token";

/// A whole HTTP/1.1 request, serialised in advance so the load generator does as little work
/// per request as pgbench's client does.
struct Req {
    wire: Vec<u8>,
}

fn event(i: usize, now: i64, opts: Opts) -> Req {
    let id = format!("ev_bench_{i:09}");
    let chat = format!("oc_{:032}", i % opts.chats.max(1));
    let sender_type = if opts.from_app { "app" } else { "user" };
    let text = if opts.people {
        "is the build box still running last night's job, or can I take it for the release?"
    } else {
        "@_user_1 /ssh status please, and tell me what is running on the build box"
    };
    let env = json!({
        "schema": "2.0",
        "header": {"event_id": id, "event_type": "im.message.receive_v1",
            "create_time": (now * 1000).to_string(), "token": TOKEN,
            "app_id": "cli_bench", "tenant_key": "tk_bench"},
        "event": {
            "sender": {"sender_id": {"open_id": "ou_0123456789abcdef0123456789abcdef",
                "user_id": "u1", "union_id": "on_0123456789abcdef0123456789abcdef"},
                "sender_type": sender_type, "tenant_key": "tk_bench"},
            "message": {"message_id": format!("om_{i:032}"), "root_id": "", "parent_id": "",
                "create_time": (now * 1000).to_string(), "chat_id": chat,
                "chat_type": "group", "message_type": "text",
                "content": json!({"text": text}).to_string(),
                "mentions": [{"key": "@_user_1", "id": {"open_id": "ou_bot0123456789abcdef0123456789ab",
                    "union_id": "on_bot", "user_id": null}, "name": "SSH Mode", "tenant_key": "tk_bench"}]}
        }
    });
    let mut iv = [0u8; 16];
    iv[..8].copy_from_slice(&(i as u64).to_le_bytes());
    let body = json!({"encrypt": webhook::encrypt(KEY, iv, env.to_string().as_bytes())})
        .to_string()
        .into_bytes();
    let ts = now.to_string();
    let sig = webhook::signature(&ts, "bench-nonce", KEY, &body);
    let mut wire = format!(
        "POST /lark/events HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n\
         X-Lark-Request-Timestamp: {ts}\r\nX-Lark-Request-Nonce: bench-nonce\r\n\
         X-Lark-Signature: {sig}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    wire.extend_from_slice(&body);
    Req { wire }
}

/// A keep-alive HTTP/1.1 connection that sends prepared requests and reads status + body.
struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    async fn open(addr: SocketAddr) -> std::io::Result<Conn> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Conn {
            stream,
            buf: Vec::with_capacity(4096),
        })
    }

    /// Sends one request; returns the response status.
    async fn roundtrip(&mut self, wire: &[u8]) -> std::io::Result<u16> {
        self.stream.write_all(wire).await?;
        self.buf.clear();
        loop {
            let mut chunk = [0u8; 2048];
            let n = self.stream.read(&mut chunk).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            self.buf.extend_from_slice(&chunk[..n]);
            let Some(end) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                continue;
            };
            let head = std::str::from_utf8(&self.buf[..end]).map_err(std::io::Error::other)?;
            let status: u16 = head
                .split_whitespace()
                .nth(1)
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| std::io::Error::other("bad status line"))?;
            let len: usize = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse().ok())?
                })
                .unwrap_or(0);
            if self.buf.len() >= end + 4 + len {
                return Ok(status);
            }
        }
    }
}

async fn send(conn: &mut Conn, r: &Req) -> bool {
    matches!(conn.roundtrip(&r.wire).await, Ok(200))
}

async fn checkpoint(pool: &sqlx::PgPool) -> anyhow::Result<()> {
    sqlx::query("CHECKPOINT").execute(pool).await?;
    Ok(())
}

/// Closed loop: `clients` connections, each sending the next request when its ack arrives.
/// Returns the ack latencies, the refused or failed count and the elapsed time.
async fn closed_loop(
    addr: SocketAddr,
    reqs: Arc<Vec<Req>>,
    first: usize,
    clients: usize,
    seconds: u64,
) -> (Vec<Duration>, usize, Duration) {
    let next = Rc::new(Cell::new(first));
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let started = Instant::now();
    let local = tokio::task::LocalSet::new();
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (reqs, next) = (reqs.clone(), next.clone());
        tasks.push(local.spawn_local(async move {
            let mut conn = Conn::open(addr).await.expect("connect");
            let mut lat = Vec::new();
            let mut failed = 0usize;
            while Instant::now() < deadline {
                let i = next.replace(next.get() + 1);
                let Some(r) = reqs.get(i) else { break };
                let t = Instant::now();
                if send(&mut conn, r).await {
                    lat.push(t.elapsed());
                } else {
                    failed += 1;
                }
            }
            (lat, failed)
        }));
    }
    let results = local
        .run_until(async {
            let mut out = Vec::new();
            for t in tasks {
                out.push(t.await.expect("client task"));
            }
            out
        })
        .await;
    let elapsed = started.elapsed();
    let mut lat = Vec::new();
    let mut failed = 0;
    for (l, f) in results {
        lat.extend(l);
        failed += f;
    }
    (lat, failed, elapsed)
}

/// Open loop at `rate` per second over `clients` keep-alive connections: request k is due at
/// `k / rate`; a connection takes the next request when it is free, and the latency runs from
/// the due time (so a stall is not hidden by coordinated omission).
async fn open_loop(
    addr: SocketAddr,
    reqs: Arc<Vec<Req>>,
    clients: usize,
    rate: f64,
) -> (Vec<Duration>, Vec<Duration>, usize, Duration) {
    let interval = Duration::from_secs_f64(1.0 / rate);
    let next = Rc::new(Cell::new(0usize));
    let local = tokio::task::LocalSet::new();
    let mut conns = Vec::new();
    for _ in 0..clients {
        conns.push(Conn::open(addr).await.expect("connect"));
    }
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::new();
    for mut conn in conns {
        let (reqs, next) = (reqs.clone(), next.clone());
        tasks.push(local.spawn_local(async move {
            let mut lat = Vec::new();
            let mut late = Vec::new();
            let mut failed = 0usize;
            loop {
                let k = next.replace(next.get() + 1);
                let Some(r) = reqs.get(k) else { break };
                let due = start + interval.mul_f64(k as f64);
                tokio::time::sleep_until(due).await;
                late.push(due.elapsed());
                if send(&mut conn, r).await {
                    lat.push(due.elapsed());
                } else {
                    failed += 1;
                }
            }
            (lat, late, failed)
        }));
    }
    let results = local
        .run_until(async {
            let mut out = Vec::new();
            for t in tasks {
                out.push(t.await.expect("client task"));
            }
            out
        })
        .await;
    let elapsed = start.elapsed();
    let (mut lat, mut late) = (Vec::new(), Vec::new());
    let mut failed = 0;
    for (l, s, f) in results {
        lat.extend(l);
        late.extend(s);
        failed += f;
    }
    (lat, late, failed, elapsed)
}

/// What the events look like.
#[derive(Clone, Copy)]
struct Opts {
    chats: usize,
    from_app: bool,
    /// Messages from people that mention no one (`--people`).
    people: bool,
}

/// The bot's open_id the fake Lark gives (no event mentions it).
const BOT: &str = "ou_benchbot000000000000000000000000";

/// A fake Lark answering only what handling an unaddressed message asks: a tenant token and
/// the bot's identity. Any other call is counted (there should be none).
async fn fake_lark(other: Arc<std::sync::atomic::AtomicU64>) -> anyhow::Result<String> {
    use axum::{Json, Router, routing::any, routing::get, routing::post};
    let app = Router::new()
        .route(
            "/open-apis/auth/v3/tenant_access_token/internal",
            post(|| async {
                Json(json!({"code": 0, "msg": "ok", "tenant_access_token": "t-bench", "expire": 7200}))
            }),
        )
        .route(
            "/open-apis/bot/v3/info",
            get(|| async { Json(json!({"code": 0, "msg": "ok", "bot": {"open_id": BOT}})) }),
        )
        .fallback(any(move || {
            other.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            async { Json(json!({"code": 0, "msg": "ok", "data": {}})) }
        }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(url)
}

/// The median of `v` (not empty).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Events not yet done.
async fn pending(pool: &sqlx::PgPool) -> anyhow::Result<i64> {
    Ok(
        sqlx::query_scalar("SELECT count(*) FROM inbox_events WHERE state = 'pending'")
            .fetch_one(pool)
            .await?,
    )
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let clients = arg("--clients", 16) as usize;
    let seconds = arg("--seconds", 5);
    let rounds = arg("--rounds", 4).max(1) as usize;
    let workers = std::env::args().any(|a| a == "--workers");
    let people = workers && std::env::args().any(|a| a == "--people");
    let opts = Opts {
        chats: arg("--chats", 1) as usize,
        from_app: workers && !people,
        people,
    };
    let pg_bin = std::env::var("PG_BIN").expect("PG_BIN: run through scripts/bench.sh");
    let db = database::fresh_database().await;
    let other_calls = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let lark_url = if people {
        fake_lark(other_calls.clone()).await?
    } else {
        "http://127.0.0.1:9".into()
    };

    let dir = tempfile::tempdir()?;
    let vars: HashMap<&str, String> = [
        ("DATABASE_URL", db.clone()),
        ("SSHMODE_DATA_DIR", dir.path().display().to_string()),
        ("LARK_APP_ID", "cli_bench".into()),
        ("LARK_APP_SECRET", "bench-secret".into()),
        ("LARK_VERIFICATION_TOKEN", TOKEN.into()),
        ("LARK_ENCRYPT_KEY", KEY.into()),
        ("LARK_BASE_URL", lark_url),
        ("SSHMODE_WORKERS_ENABLED", workers.to_string()),
    ]
    .into_iter()
    .collect();
    let config = Config::from_vars(&|k| vars.get(k).cloned(), dir.path())?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let shutdown = CancellationToken::new();
    let app = App::build(config, listener, shutdown.clone()).await?;
    let addr = app.local_addr();
    let pool = app.state().db.clone();
    let metrics = app.state().metrics.clone();
    let server_task = tokio::spawn(app.run());

    let now = chrono::Utc::now().timestamp();
    let total = 600_000usize.min(clients * seconds as usize * rounds * 2000 + 200);
    eprintln!("preparing {total} signed, encrypted events …");
    let reqs: Arc<Vec<Req>> = Arc::new((0..total).map(|i| event(i, now, opts)).collect());
    // Warm-up: connections, prepared statements.
    let warm = reqs.clone();
    on_generator(move || async move {
        let mut conn = Conn::open(addr).await.expect("connect");
        for r in warm.iter().take(200) {
            assert!(send(&mut conn, r).await, "warm-up request refused");
        }
    })
    .await;
    wait_drained(&pool, workers).await?;

    // pgbench's table: raw single-row INSERTs into an inbox-shaped table, the payload sent as
    // a parameter (as the service sends it), so PostgreSQL parses each row's jsonb as it does
    // ours. For comparison, also with the payload as a literal of the prepared statement
    // (parsed once, when the statement is prepared).
    sqlx::query(
        "CREATE TABLE bench_raw (LIKE inbox_events INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING INDEXES)",
    )
    .execute(&pool)
    .await?;
    let payload_sample: String =
        sqlx::query_scalar("SELECT payload::text FROM inbox_events LIMIT 1")
            .fetch_one(&pool)
            .await?;
    let insert = |payload: &str| {
        format!(
            "INSERT INTO bench_raw (event_id, event_type, payload, received_at, available_at) \
             VALUES (md5(random()::text || clock_timestamp()::text), 'im.message.receive_v1', \
             {payload}, now(), now()) ON CONFLICT (event_id) DO NOTHING;\n"
        )
    };
    let script = dir.path().join("insert.sql");
    std::fs::write(&script, insert(":payload::jsonb"))?;
    let literal_script = dir.path().join("insert_literal.sql");
    std::fs::write(
        &literal_script,
        insert(&format!("'{}'::jsonb", payload_sample.replace('\'', "''"))),
    )?;
    let pgbench = |script: &std::path::Path, seconds: u64, extra: &[String]| {
        let mut cmd = tokio::process::Command::new(format!("{pg_bin}/pgbench"));
        cmd.args([
            "-n",
            "-M",
            "prepared",
            "-c",
            &clients.to_string(),
            "-j",
            "2",
            "-T",
        ])
        .arg(seconds.to_string())
        .arg("-D")
        .arg(format!("payload={payload_sample}"))
        .args(extra)
        .arg("-f")
        .arg(script)
        .arg(&db);
        cmd
    };
    let tps = |out: &std::process::Output| -> f64 {
        let text = String::from_utf8_lossy(&out.stdout);
        text.lines()
            .find(|l| l.starts_with("tps = "))
            .and_then(|l| l.split_whitespace().nth(2))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| {
                panic!(
                    "pgbench failed: {text}\n{}",
                    String::from_utf8_lossy(&out.stderr)
                )
            })
    };

    // Rounds: the service's closed loop, the drain of what it left, pgbench. Each part starts
    // from a checkpoint, so that none pays for another's dirty pages.
    let mut first = 200;
    let (mut lat, mut failed, mut acked, mut busy) = (Vec::new(), 0, 0usize, Duration::ZERO);
    let (mut backlogs, mut drained_in) = (0i64, Duration::ZERO);
    let mut round_rows = Vec::new();
    let (processed0, inert0) = (metrics.events_processed.get(), metrics.events_inert.get());
    for _ in 0..rounds {
        checkpoint(&pool).await?;
        let phase = reqs.clone();
        let (l, f, elapsed) =
            on_generator(move || closed_loop(addr, phase, first, clients, seconds)).await;
        first += l.len() + f;
        // A round that ran out of prepared events ends early; its rate still counts, but no
        // round follows it.
        let ran_out = first >= total;
        let ack_rate = l.len() as f64 / elapsed.as_secs_f64();
        acked += l.len();
        busy += elapsed;
        failed += f;
        lat.extend(l);
        // What the round left undone, and how long the workers take to finish it.
        let backlog = pending(&pool).await?;
        let t = Instant::now();
        wait_drained(&pool, workers).await?;
        if backlog > 0 {
            backlogs += backlog;
            drained_in += t.elapsed();
        }
        checkpoint(&pool).await?;
        let raw = tps(&pgbench(&script, seconds, &[]).output().await?);
        round_rows.push((ack_rate, backlog, raw));
        if ran_out {
            eprintln!(
                "the prepared events ran out after {} rounds",
                round_rows.len()
            );
            break;
        }
    }
    lat.sort();
    let handled = metrics.events_processed.get() - processed0;
    let inert = metrics.events_inert.get() - inert0;
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM inbox_events")
        .fetch_one(&pool)
        .await?;
    let raw_rates: Vec<f64> = round_rows.iter().map(|r| r.2).collect();
    let raw_rate = median(raw_rates.clone());
    let ratio_median = median(round_rows.iter().map(|r| r.0 / r.2).collect());
    let ack_rate = acked as f64 / busy.as_secs_f64();
    let raw_mean = raw_rates.iter().sum::<f64>() / raw_rates.len() as f64;
    checkpoint(&pool).await?;
    let literal_rate = tps(&pgbench(&literal_script, seconds, &[]).output().await?);

    // Open loop at half the (median) raw rate, on events of its own, through the same number
    // of connections as pgbench's clients (as `pgbench -R`: a request waits for a free
    // connection, and its latency counts from its scheduled time).
    let target = raw_rate / 2.0;
    let paced_seconds = seconds.max(10);
    let n = (target * paced_seconds as f64) as usize;
    let now = chrono::Utc::now().timestamp();
    let paced_reqs: Arc<Vec<Req>> = Arc::new((0..n).map(|k| event(total + k, now, opts)).collect());
    checkpoint(&pool).await?;
    let (mut paced, mut sent_late, paced_failed, paced_elapsed) =
        on_generator(move || open_loop(addr, paced_reqs, clients, target)).await;
    paced.sort();
    sent_late.sort();
    wait_drained(&pool, workers).await?;

    // The same open-loop rate through pgbench, for the raw path's own tail.
    checkpoint(&pool).await?;
    let out = pgbench(
        &script,
        paced_seconds,
        &[
            "-R".into(),
            format!("{target:.0}"),
            "-L".into(),
            "50".into(),
        ],
    )
    .output()
    .await?;
    let text = String::from_utf8_lossy(&out.stdout);
    let raw_late = text
        .lines()
        .find(|l| l.contains("above the 50.0 ms latency limit"))
        .map(|l| l.rsplit(':').next().unwrap_or("").trim().to_string())
        .unwrap_or_else(|| "?".into());
    let raw_avg = text
        .lines()
        .find(|l| l.starts_with("latency average"))
        .map(|l| l.trim_start_matches("latency average = ").to_string())
        .unwrap_or_else(|| "?".into());
    let ours_late = paced
        .iter()
        .filter(|d| **d > Duration::from_millis(50))
        .count();

    println!(
        "## lark_ingress ({clients} clients, {rounds} rounds of {seconds} s, workers {}, {} chat(s){})",
        if workers { "on" } else { "off" },
        opts.chats,
        if people {
            ", messages from people"
        } else if workers {
            ", messages from another app"
        } else {
            ""
        }
    );
    println!("| measure | value |");
    println!("|---|---|");
    for (i, (ack, backlog, raw)) in round_rows.iter().enumerate() {
        println!(
            "| round {}: acks/s, raw INSERT tps, ratio, backlog left | {ack:.0}, {raw:.0}, {:.2}, {backlog} |",
            i + 1,
            ack / raw
        );
    }
    println!("| **acks / raw inserts, median of the rounds** | **{ratio_median:.2}** |");
    println!(
        "| acks/s over all rounds / mean raw tps | {ack_rate:.0} / {raw_mean:.0} = {:.2} |",
        ack_rate / raw_mean
    );
    println!(
        "| ack p50 / p99, closed loop | {:.2} ms / {:.2} ms |",
        ms(percentile(&lat, 0.5)),
        ms(percentile(&lat, 0.99))
    );
    println!("| refused or failed requests | {failed} |");
    println!("| rows recorded by the warm-up and the rounds | {stored} |");
    if workers {
        println!(
            "| closed loops: handled by the workers / recorded done at the callback (inert) | {handled} / {inert} |"
        );
        println!(
            "| backlog left by the rounds, drained | {backlogs} in {:.2} s ({}) |",
            drained_in.as_secs_f64(),
            if backlogs > 0 {
                format!(
                    "{:.0}/s",
                    backlogs as f64 / drained_in.as_secs_f64().max(1e-9)
                )
            } else {
                "no backlog".into()
            }
        );
        if people {
            println!(
                "| Lark calls other than the token and the bot's identity | {} |",
                other_calls.load(std::sync::atomic::Ordering::Relaxed)
            );
        }
    }
    println!("| raw INSERT tps, payload as a prepared literal | {literal_rate:.0} |");
    println!(
        "| open loop at {target:.0}/s for {paced_seconds} s: achieved | {:.0}/s |",
        paced.len() as f64 / paced_elapsed.as_secs_f64()
    );
    println!(
        "| open loop ack p50 / p99 | {:.2} ms / {:.2} ms |",
        ms(percentile(&paced, 0.5)),
        ms(percentile(&paced, 0.99))
    );
    println!(
        "| open loop send delay p50 / p99 (from due time) | {:.2} ms / {:.2} ms |",
        ms(percentile(&sent_late, 0.5)),
        ms(percentile(&sent_late, 0.99))
    );
    println!("| open loop refused or failed | {paced_failed} |");
    println!(
        "| open loop acks over 50 ms | {ours_late}/{} ({:.2} %) |",
        paced.len(),
        100.0 * ours_late as f64 / paced.len().max(1) as f64
    );
    println!("| pgbench at the same rate for {paced_seconds} s: latency average | {raw_avg} |");
    println!("| pgbench at the same rate: over 50 ms | {raw_late} |");

    shutdown.cancel();
    server_task.await??;
    Ok(())
}

/// Waits until the workers have handled every recorded event (polled every 50 ms, for at
/// most five minutes); at once without workers.
async fn wait_drained(pool: &sqlx::PgPool, workers: bool) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(300);
    while workers && pending(pool).await? > 0 {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the backlog did not drain in 5 min"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}
