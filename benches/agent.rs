//! Benchmark of the agent's own overhead per tool step (see BENCHMARKS.md): a fake model that
//! answers at once with a `terminal` call of `true` until a turn has made STEPS calls, turns run
//! by the real runner, local and against a real OpenSSH server on loopback. A step is the time
//! between two consecutive model requests of a turn; the overhead is that minus the model's
//! round trip (measured through the router alone) and the command's (the terminal tool alone),
//! both measured just before each turn so that they share the steps' conditions. Beside the SSH
//! steps, the same `true` through OpenSSH's own client and a ControlMaster opened once on the
//! same sshd, measured just before each turn too: the step's ratio to it is what later changes
//! are held to.
//!
//! Run as root with `bash scripts/bench.sh agent` (it provides TEST_DATABASE_URL).

#[path = "../tests/api/database.rs"]
mod database;

#[path = "support/mod.rs"]
#[allow(dead_code)]
mod support;

#[path = "../tests/api/sshd.rs"]
#[allow(dead_code)]
mod sshd;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use axum::Json;
use axum::extract::State;
use serde_json::{Value, json};
use sshmode::agent::ChatOut;
use sshmode::authz::{Binding, Kind};
use sshmode::chat::ChatBindings;
use sshmode::config::Config;
use sshmode::exec::{Executors, Place};
use sshmode::turns::TurnRequest;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Tool steps per turn.
const STEPS: usize = 20;
/// Turns per backend.
const TURNS: usize = 15;
/// Direct round trips of each baseline measured before each measured turn, so the baselines
/// are taken over the same minutes as the steps (this machine's speed drifts between runs).
const RUNS_PER_TURN: usize = 20;
/// Round trips of the one-read baseline, and of each warm-up.
const RUNS: usize = 300;

fn main() {
    if !sshd::available() {
        std::process::exit(1);
    }
    sshmode::install_crypto_provider();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run());
}

fn percentiles(mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    let med = samples[samples.len() / 2];
    let p99 = samples[(samples.len() * 99 / 100).min(samples.len() - 1)];
    (med, p99)
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

/// Arrival times of model requests with the number of tool results they carried.
type Arrivals = Arc<Mutex<Vec<(Instant, usize)>>>;

/// Occurrences of `pattern` in `body`.
fn count(body: &[u8], pattern: &[u8]) -> usize {
    body.windows(pattern.len())
        .filter(|w| *w == pattern)
        .count()
}

/// The fake model reads the request's raw bytes instead of parsing it: it stands for a model
/// on another machine, so the less of these two cores it takes, the less of its time lands in
/// the measured overhead. (serde_json writes no spaces: `"role":"tool"` is exact.)
async fn model(State(arrivals): State<Arrivals>, body: axum::body::Bytes) -> Json<Value> {
    let tools = count(&body, br#""role":"tool""#);
    arrivals.lock().unwrap().push((Instant::now(), tools));
    let message = if count(&body, br#""tools":["#) == 0 || tools >= STEPS {
        json!({"role": "assistant", "content": "done"})
    } else {
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": format!("c{tools}"),
               "type": "function", "function": {"name": "terminal",
               // Distinct arguments, so the repetition guard does not end the turn.
               "arguments": json!({"command": format!("true # {tools}")}).to_string()}}]})
    };
    Json(
        json!({"id": "x", "object": "chat.completion", "created": 1, "model": "m",
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}),
    )
}

/// Answers are not part of a step; they go nowhere.
struct Nowhere;

impl sshmode::agent::StepSink for Nowhere {
    fn step(&self, _: &str, _: i64, _: &sshmode::agent::StepEvent) {}
}

#[async_trait]
impl ChatOut for Nowhere {
    async fn add_reaction(&self, _: &str, _: &str) -> anyhow::Result<String> {
        Ok("r".into())
    }
    async fn remove_reaction(&self, _: &str, _: &str) -> anyhow::Result<()> {
        Ok(())
    }
    async fn reply_markdown(
        &self,
        _: &str,
        _: &str,
        _: &str,
        _: bool,
        _: &str,
    ) -> anyhow::Result<()> {
        Ok(())
    }
}

async fn run() {
    let db_url = database::fresh_database().await;

    let arrivals: Arrivals = Arc::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let llm_base = format!("http://{}/v1", listener.local_addr().unwrap());
    let fake = axum::Router::new()
        .route("/v1/chat/completions", axum::routing::post(model))
        .with_state(arrivals.clone());
    tokio::spawn(async move { axum::serve(listener, fake).await });

    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let sshd = sshd::Sshd::start_below(dir);
    let key = dir.join("bench_key");
    sshd::new_key(&key, "ed25519", "");
    sshd.authorize(&dir.join("bench_key.pub"));
    support::openssh::trust_host(dir, sshd.port, &dir.join("sshd/host_key.pub"));
    let cm = support::openssh::ControlMaster::open(dir, &key, sshd.port, sshd::USER);
    for _ in 0..20 {
        cm.run(&["true"]);
    }

    let mut vars = HashMap::new();
    vars.insert("DATABASE_URL".to_string(), db_url);
    vars.insert(
        "SSHMODE_DATA_DIR".to_string(),
        dir.join("data").display().to_string(),
    );
    vars.insert("LLM_BASE_URL".to_string(), llm_base);
    vars.insert("LLM_MODEL".to_string(), "m".to_string());
    vars.insert("SSHMODE_MAX_ITERATIONS".to_string(), "1000".to_string());
    let config = Config::from_vars(&|k| vars.get(k).cloned(), dir).unwrap();
    let store = sshmode::store::Store::open(&config).await.unwrap();
    let db = store.pool.clone();
    let vault = Arc::new(sshmode::vault::Vault::open_or_create(&config.master_key_file).unwrap());
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
    let exec = Arc::new(
        Executors::new(
            &config.exec,
            sshmode::target::registry(db.clone()),
            vault.clone(),
            tokio_util::task::TaskTracker::new(),
        )
        .unwrap(),
    );
    let metrics = Arc::new(sshmode::metrics::Metrics::new());
    let router = Arc::new(
        sshmode::llm::Router::from_config(
            &config,
            db.clone(),
            Arc::new(sshmode::clock::SystemClock),
            metrics,
        )
        .unwrap()
        .unwrap(),
    );

    // Warm-up of the model's baseline (its round trip through the router), measured per turn.
    for _ in 0..20 {
        router.chat(None, small_request()).await.unwrap();
    }
    arrivals.lock().unwrap().clear();
    // Baseline: one indexed single-row read, like each of the step's reads of the section's
    // state (the working directory for the prompt and again for the tool; the target).
    let mut read_rt = Vec::with_capacity(RUNS);
    for i in 0..RUNS + 20 {
        let t = Instant::now();
        let _: Option<String> = sqlx::query_scalar(
            "SELECT dir FROM section_cwds WHERE section_id = $1 AND backend = $2",
        )
        .bind("omt_bench_read")
        .bind("local")
        .fetch_optional(&db)
        .await
        .unwrap();
        if i >= 20 {
            read_rt.push(t.elapsed());
        }
    }
    let (read_med, read_p99) = percentiles(read_rt);

    println!("\n## Agent overhead per tool step ({STEPS} steps × {TURNS} turns per backend)\n");
    println!(
        "one indexed single-row read (each of the step's reads of section state): median {}, p99 {}\n",
        ms(read_med),
        ms(read_p99)
    );
    println!(
        "| backend | model round trip (router alone) median / p99 | command round trip (terminal tool alone) median / p99 | step median / p99 | overhead median / p99 (step − model − command medians) | per step: transactions / WAL flushes | `ssh true` through an open ControlMaster median / p99 | step / ControlMaster (medians) |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (label, place) in [("local", Place::Local), ("ssh", Place::Target("t".into()))] {
        let never = CancellationToken::new();
        let ops = exec.ops_for("bench_baseline", &place).await.unwrap();
        for _ in 0..20 {
            ops.terminal("true", Default::default(), &never)
                .await
                .unwrap();
        }
        let mut cmd_rt = Vec::with_capacity(RUNS_PER_TURN * TURNS);
        let mut model_rt = Vec::with_capacity(RUNS_PER_TURN * TURNS);
        // OpenSSH through the ControlMaster, beside the steps over SSH.
        let mut cm_rt = Vec::with_capacity(RUNS_PER_TURN * TURNS);

        let agent = sshmode::agent::Agent::new(sshmode::agent::AgentDeps {
            db: db.clone(),
            exec: exec.clone(),
            llm: Some(router.clone()),
            model: config.model.clone(),
            // The service's own chat control: the binding read at every call and prompt.
            bindings: Arc::new(ChatBindings::new(
                db.clone(),
                Arc::new(sshmode::clock::SystemClock),
                &config,
            )),
            plane: Arc::new(sshmode::plane::ControlPlane::new(
                &config,
                db.clone(),
                vault.clone(),
            )),
            out: Arc::new(Nowhere),
            steps: Arc::new(Nowhere),
            config: config.agent.clone(),
            prompts: Default::default(),
            workspaces: sshmode::workspace::LocalRules::from_config(&config.exec),
        });
        let runner = sshmode::turns::Runner::scoped(
            db.clone(),
            sshmode::turns::RunnerConfig {
                lease: config.agent.turn_lease,
                workers: config.agent.turn_workers,
                budget: config.agent.turn_budget,
                poll: Duration::from_secs(1),
            },
            agent.clone(),
            sshmode::turns::SectionFilter::All,
        );
        let shutdown = CancellationToken::new();
        let tasks = TaskTracker::new();
        tasks.spawn(runner.clone().run(shutdown.clone(), tasks.clone()));
        let mut steps = Vec::new();
        let mut before = None;
        // This benchmark's own queries between the counters (its polls of the turn's state).
        let mut polls = 0i64;
        // The generation a binding records, read before anything is counted.
        let generation = match &place {
            Place::Target(alias) => {
                Some(sshmode::target::get(&db, alias).await.unwrap().generation)
            }
            Place::Local => None,
        };
        for turn in 0..TURNS + 1 {
            if turn == 1 {
                before = Some(pg_counters(&db).await);
            }
            if turn > 0 {
                // The baselines, alternated, just before the turn.
                for _ in 0..RUNS_PER_TURN {
                    let t = Instant::now();
                    ops.terminal("true", Default::default(), &never)
                        .await
                        .unwrap();
                    cmd_rt.push(t.elapsed());
                    let t = Instant::now();
                    router.chat(None, small_request()).await.unwrap();
                    model_rt.push(t.elapsed());
                    // The router's read of its entry state, not the turn's.
                    polls += 1;
                    if matches!(place, Place::Target(_)) {
                        let t = Instant::now();
                        cm.run(&["true"]);
                        cm_rt.push(t.elapsed());
                    }
                }
            }
            arrivals.lock().unwrap().clear();
            let section = format!("omt_bench_{label}_{turn}");
            if let Place::Target(alias) = &place {
                // Bound by hand, as `/ssh use` does (for the target's generation, in the chat).
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
                        generation,
                    },
                )
                .await
                .unwrap();
                if turn > 0 {
                    polls += 1; // the binding is the benchmark's write, not the turn's
                }
            }
            agent
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
                if turn > 0 {
                    polls += 1;
                }
                let state: Option<String> =
                    sqlx::query_scalar("SELECT state FROM turns WHERE section_id = $1")
                        .bind(&section)
                        .fetch_optional(&db)
                        .await
                        .unwrap();
                if state.as_deref().is_some_and(|s| s != "running") {
                    break;
                }
                assert!(Instant::now() < deadline, "turn did not end");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let a = arrivals.lock().unwrap().clone();
            assert_eq!(a.len(), STEPS + 1, "every step reached the model");
            if turn == 0 {
                continue; // warm-up
            }
            for w in a.windows(2) {
                assert_eq!(w[1].1, w[0].1 + 1);
                steps.push(w[1].0 - w[0].0);
            }
        }
        let after = pg_counters(&db).await;
        let before = before.expect("measured turns");
        let per_step = |a: i64, b: i64| (a - b) as f64 / steps.len() as f64;
        let (xacts, flushes) = (
            per_step(after.0 - polls, before.0),
            per_step(after.1, before.1),
        );
        shutdown.cancel();
        tasks.close();
        tasks.wait().await;
        let (step_med, step_p99) = percentiles(steps);
        let (cmd_med, cmd_p99) = percentiles(cmd_rt);
        let (model_med, model_p99) = percentiles(model_rt);
        let over = |d: Duration| d.saturating_sub(model_med + cmd_med);
        let versus_cm = if cm_rt.is_empty() {
            "— | —".to_string()
        } else {
            let (cm_med, cm_p99) = percentiles(cm_rt);
            format!(
                "{} / {} | {:.2}×",
                ms(cm_med),
                ms(cm_p99),
                step_med.as_secs_f64() / cm_med.as_secs_f64()
            )
        };
        println!(
            "| {label} | {} / {} | {} / {} | {} / {} | {} / {} | {xacts:.1} / {flushes:.1} | {versus_cm} |",
            ms(model_med),
            ms(model_p99),
            ms(cmd_med),
            ms(cmd_p99),
            ms(step_med),
            ms(step_p99),
            ms(over(step_med)),
            ms(over(step_p99))
        );
    }
    drop(cm);
    drop(sshd);
}

/// The database's committed transactions and the cluster's WAL flushes so far (statistics are
/// published by each backend at most once a second, so this waits that long first). Both
/// include the runner's heartbeats and polls, a small share per step; the flushes also count
/// those the WAL writer makes in the background for commits that did not wait.
async fn pg_counters(db: &sqlx::PgPool) -> (i64, i64) {
    tokio::time::sleep(Duration::from_millis(1100)).await;
    sqlx::query_as(
        "SELECT (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()),
                (SELECT wal_sync FROM pg_stat_wal)",
    )
    .fetch_one(db)
    .await
    .unwrap()
}

fn small_request() -> sshmode::llm::ChatRequest {
    sshmode::llm::ChatRequest {
        messages: vec![sshmode::llm::Message::user("baseline")],
        ..Default::default()
    }
}
