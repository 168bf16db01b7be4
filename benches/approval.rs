//! Benchmark: a decision on a parked call → its command started (see BENCHMARKS.md).
//!
//! Each turn's model asks for a local `terminal` command the guard asks about
//! (`touch approval_mark && rm -rf "$NOPE_DIR"`); the agent parks the call and lets go of the
//! section. Once the call waits, the decision is recorded as the click's worker records it
//! (`turns::call_approval::decide`: the row, the section re-queued, the runners notified) and the
//! clock runs until the command's first effect, the mark in the workspace, appears (polled
//! every 0.2 ms). So it measures the resume path: notification, claim, the turn reopened, the
//! wait settled, the start recorded, the command spawned in the sandbox. The callback's
//! acknowledgement and the inbox hand-off before it are measured by `lark_ingress`.
//!
//! With `ssh` among the arguments the sections are bound to a target on a loopback sshd
//! (`tests/api/sshd.rs`) and the command is `touch approval_mark && curl … | sh` (what a
//! `read-write` workspace asks about there): the clock then also covers the SSH channel's
//! open and the remote shell's start, on the pooled connection.
//!
//! Run as root: `bash scripts/bench.sh approval [TURNS] [ssh]` (default 200 turns, local).

#[path = "../tests/api/database.rs"]
mod database;
#[path = "../tests/api/sshd.rs"]
#[allow(dead_code)]
mod sshd;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use axum::Json;
use serde_json::{Value, json};
use sshmode::agent::ChatOut;
use sshmode::agent::call_approval::CallApprovalCard;
use sshmode::config::Config;
use sshmode::exec::{Executors, Place};
use sshmode::turns::TurnRequest;
use sshmode::turns::call_approval::{self, Scope};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

fn main() {
    let turns: usize = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .and_then(|a| a.parse().ok())
        .unwrap_or(200);
    let ssh = std::env::args().any(|a| a == "ssh");
    sshmode::install_crypto_provider();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(run(turns, ssh));
}

/// The command a turn's model asks for on a target: text fetched into a shell is asked about.
const REMOTE: &str = "touch approval_mark && curl -s http://127.0.0.1:9/x | sh";

/// The command on the first request of a turn; "done" once a tool result came back.
async fn model(body: axum::body::Bytes) -> Json<Value> {
    model_for(body, "touch approval_mark && rm -rf \"$NOPE_DIR\"")
}

async fn model_remote(body: axum::body::Bytes) -> Json<Value> {
    model_for(body, REMOTE)
}

fn model_for(body: axum::body::Bytes, command: &str) -> Json<Value> {
    let has_result = body.windows(13).any(|w| w == br#""role":"tool""#);
    let message = if has_result {
        json!({"role": "assistant", "content": "done"})
    } else {
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c0",
               "type": "function", "function": {"name": "terminal",
               "arguments": json!({"command": command}).to_string()}}]})
    };
    Json(
        json!({"id": "x", "object": "chat.completion", "created": 1, "model": "m",
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}),
    )
}

/// A channel that can ask (its cards go nowhere).
struct Cards;

impl sshmode::agent::StepSink for Cards {
    fn step(&self, _: &str, _: i64, _: &sshmode::agent::StepEvent) {}
}

#[async_trait]
impl ChatOut for Cards {
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
    fn can_ask(&self) -> bool {
        true
    }
    async fn show_call_approval(&self, c: &CallApprovalCard) -> anyhow::Result<Option<String>> {
        Ok(Some(format!("card_{}", c.parked.turn_id)))
    }
}

/// Every section bound to one target (or none: local).
struct Bound(Option<String>);

#[async_trait]
impl sshmode::agent::Bindings for Bound {
    async fn place(&self, _: &str) -> anyhow::Result<Place> {
        Ok(match &self.0 {
            Some(alias) => Place::Target(alias.clone()),
            None => Place::Local,
        })
    }
    async fn ssh_mode(
        &self,
        _: &str,
        _: &str,
        _: sshmode::agent::SshModeAction,
        _: Option<&str>,
    ) -> anyhow::Result<String> {
        Ok("not in this benchmark".into())
    }
}

async fn run(turns: usize, ssh: bool) {
    let db_url = database::fresh_database().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let llm_base = format!("http://{}/v1", listener.local_addr().unwrap());
    let fake = axum::Router::new().route(
        "/v1/chat/completions",
        if ssh {
            axum::routing::post(model_remote)
        } else {
            axum::routing::post(model)
        },
    );
    tokio::spawn(async move { axum::serve(listener, fake).await });

    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mut vars = HashMap::new();
    vars.insert("DATABASE_URL".to_string(), db_url);
    vars.insert(
        "SSHMODE_DATA_DIR".to_string(),
        dir.join("data").display().to_string(),
    );
    vars.insert("LLM_BASE_URL".to_string(), llm_base);
    vars.insert("LLM_MODEL".to_string(), "m".to_string());
    let config = Config::from_vars(&|k| vars.get(k).cloned(), dir).unwrap();
    let store = sshmode::store::Store::open(&config).await.unwrap();
    let db = store.pool.clone();
    let vault = Arc::new(sshmode::vault::Vault::open_or_create(&config.master_key_file).unwrap());
    // On a target: a loopback sshd, its account's home holding the mark.
    let sshd = ssh.then(|| {
        assert!(
            sshd::available(),
            "the ssh benchmark needs an OpenSSH server"
        );
        sshd::Sshd::start_below(dir)
    });
    if let Some(sshd) = &sshd {
        let key = dir.join("bench_key");
        sshd::new_key(&key, "ed25519", "");
        sshd.authorize(&dir.join("bench_key.pub"));
        let new = sshmode::target::NewTarget {
            alias: "web".into(),
            host: "127.0.0.1".into(),
            port: sshd.port,
            user: sshd::USER.into(),
            description: None,
            secrets: sshmode::target::NewSecrets::Key {
                key: zeroize::Zeroizing::new(std::fs::read_to_string(&key).unwrap()),
                cert: None,
            },
            host_key_policy: sshmode::target::HostKeyPolicy::Tofu,
            host_key: None,
            approve: true,
            jump: None,
        };
        sshmode::target::add(&db, &vault, new, "bench")
            .await
            .unwrap();
    }
    let remote_mark = PathBuf::from(format!("/home/{}/approval_mark", sshd::USER));
    let exec = Arc::new(
        Executors::new(
            &config.exec,
            sshmode::target::registry(db.clone()),
            vault.clone(),
            TaskTracker::new(),
        )
        .unwrap(),
    );
    let router = Arc::new(
        sshmode::llm::Router::from_config(
            &config,
            db.clone(),
            Arc::new(sshmode::clock::SystemClock),
            Arc::new(sshmode::metrics::Metrics::new()),
        )
        .unwrap()
        .unwrap(),
    );
    let agent = sshmode::agent::Agent::new(sshmode::agent::AgentDeps {
        db: db.clone(),
        exec: exec.clone(),
        llm: Some(router),
        model: config.model.clone(),
        bindings: Arc::new(Bound(ssh.then(|| "web".to_string()))),
        plane: Arc::new(sshmode::plane::ControlPlane::new(
            &config,
            db.clone(),
            vault.clone(),
        )),
        out: Arc::new(Cards),
        steps: Arc::new(Cards),
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

    let warm = 10;
    let mut samples = Vec::with_capacity(turns);
    for n in 0..turns + warm {
        let section = format!("omt_approval_{n}");
        agent
            .accept(&TurnRequest {
                section: section.clone(),
                chat_id: "oc_bench".into(),
                message_id: format!("om_approval_{n}"),
                sender: "ou_bench".into(),
                text: "go".into(),
                in_thread: true,
            })
            .await
            .unwrap();
        let parked = loop {
            if let Some(p) = call_approval::waiting_in(&db, &section).await.unwrap() {
                break p;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        };
        let mark = if ssh {
            let _ = std::fs::remove_file(&remote_mark);
            remote_mark.clone()
        } else {
            let backend = exec.backend(&section, &Place::Local).await.unwrap();
            PathBuf::from(backend.initial_dir(&section).await.unwrap()).join("approval_mark")
        };
        // The card is posted after the row commits; let the runner let go of the section.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let t0 = Instant::now();
        call_approval::decide(
            &db,
            parked.0,
            &parked.1,
            Some(Scope::Once),
            "ou_bench",
            config.chat.yolo_ttl,
        )
        .await
        .unwrap();
        while !mark.exists() {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "the command never started"
            );
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
        if n >= warm {
            samples.push(t0.elapsed());
        }
        loop {
            let state: String = sqlx::query_scalar("SELECT state FROM turns WHERE section_id = $1")
                .bind(&section)
                .fetch_one(&db)
                .await
                .unwrap();
            if state != "running" && state != "awaiting_approval" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    shutdown.cancel();
    let _ = std::fs::remove_file(&remote_mark);
    drop(sshd);
    samples.sort();
    let at = |q: f64| samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)];
    let ms = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1e3);
    let place = if ssh {
        format!("a target on a loopback sshd ({}@127.0.0.1)", sshd::USER)
    } else {
        "local".to_string()
    };
    println!("\n## Decision → command started ({turns} turns, {place}, after {warm} warm-up)\n");
    println!("| median | p90 | p99 | max |");
    println!("|---|---|---|---|");
    println!(
        "| {} | {} | {} | {} |",
        ms(at(0.5)),
        ms(at(0.9)),
        ms(at(0.99)),
        ms(*samples.last().unwrap())
    );
}
