//! Benchmark of the MCP endpoint (see BENCHMARKS.md): `exec true` on a loopback OpenSSH
//! target through `/mcp` from rmcp's Rust client (a 2025-era session: bearer check, tool
//! routing, the token and the resolved place — reused for `mcp::fresh::FRESH` after the first
//! call —, the judge, the guard, the audit row) vs the same command
//! through the chat path's operations directly (`Ops::terminal` on the pooled SSH backend) and
//! through the bare backend (`Backend::exec`). Rounds alternate between the three so the
//! machine's noise falls on all alike. Target: MCP ≤ 1.5× `Ops::terminal`.
//!
//! Run as root with `bash scripts/bench.sh mcp` (it provides TEST_DATABASE_URL), or
//! `cargo bench --locked --bench mcp` with TEST_DATABASE_URL set.

#[path = "../tests/api/database.rs"]
mod database;

#[path = "../tests/api/sshd.rs"]
#[allow(dead_code)]
mod sshd;

#[path = "support/mod.rs"]
#[allow(dead_code)]
mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use sshmode::app::{App, Overrides};
use sshmode::config::Config;
use sshmode::exec::ops::RunOptions;
use sshmode::exec::{Command, Place};
use sshmode::mcp::token::NewToken;
use tokio_util::sync::CancellationToken;

const ROUNDS: usize = 10;
const PER_ROUND: usize = 30;

fn main() {
    if !sshd::available() {
        eprintln!("the MCP benchmark needs root and sshd");
        std::process::exit(1);
    }
    sshmode::install_crypto_provider();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run());
}

fn row(name: &str, mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    let med = support::percentile(&samples, 0.5);
    println!(
        "| {name} | {} | {:.3} ms | {:.3} ms |",
        samples.len(),
        support::ms(med),
        support::ms(support::percentile(&samples, 0.99))
    );
    med
}

async fn run() {
    let db_url = database::fresh_database().await;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let sshd = sshd::Sshd::start_below(dir);
    let key = dir.join("bench_key");
    sshd::new_key(&key, "ed25519", "");
    sshd.authorize(&dir.join("bench_key.pub"));

    let vars: HashMap<&str, String> = HashMap::from([
        ("DATABASE_URL", db_url),
        ("SSHMODE_DATA_DIR", dir.join("data").display().to_string()),
        ("SSHMODE_MCP_LISTEN", "127.0.0.1:0".to_string()),
        (
            "SSHMODE_LAUNCHER",
            env!("CARGO_BIN_EXE_sshmode").to_string(),
        ),
    ]);
    let config = Config::from_vars(&|k| vars.get(k).cloned(), dir).unwrap();
    let vault = Arc::new(sshmode::vault::Vault::open_or_create(&config.master_key_file).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let shutdown = CancellationToken::new();
    let app = App::build_with(config, listener, shutdown.clone(), Overrides::default())
        .await
        .unwrap();
    let state = app.state().clone();
    let served = tokio::spawn(app.run());

    let new = support::loopback_target(
        "web",
        sshd.port,
        sshd::USER,
        &std::fs::read_to_string(&key).unwrap(),
    );
    sshmode::target::add(&state.db, &vault, new, "bench")
        .await
        .unwrap();
    let token = sshmode::mcp::token::create(
        &state.db,
        &NewToken {
            name: "bench".into(),
            targets: vec!["web".into()],
            all_targets: false,
            local: false,
            permission: sshmode::workspace::Permission::ReadWrite,
            expires_at: None,
        },
        "bench",
    )
    .await
    .unwrap();

    let url = format!("http://{}/mcp", state.mcp_addr.unwrap());
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(url).auth_header(token),
    );
    let client = ().serve(transport).await.expect("MCP client connects");
    let args = serde_json::json!({"target": "web", "command": "true"});
    let call =
        || CallToolRequestParams::new("exec").with_arguments(args.as_object().unwrap().clone());

    let never = CancellationToken::new();
    let ops = state
        .exec
        .ops_for("bench-direct", &Place::Target("web".into()))
        .await
        .unwrap();
    let backend = ops.backend().clone();

    // Warm-up: the pooled connection, the home directory, the session.
    for _ in 0..5 {
        let r = client.call_tool(call()).await.unwrap();
        assert_ne!(r.is_error, Some(true), "{r:?}");
        ops.terminal("true", RunOptions::default(), &never)
            .await
            .unwrap();
    }

    let (mut mcp, mut direct, mut bare) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        for _ in 0..PER_ROUND {
            let t = Instant::now();
            let r = client.call_tool(call()).await.unwrap();
            mcp.push(t.elapsed());
            let out = r.structured_content.expect("a structured result");
            assert_eq!(out["exit_code"], 0, "{out}");
        }
        for _ in 0..PER_ROUND {
            let t = Instant::now();
            let r = ops
                .terminal("true", RunOptions::default(), &never)
                .await
                .unwrap();
            direct.push(t.elapsed());
            assert!(r.output.exit.success());
        }
        for _ in 0..PER_ROUND {
            let t = Instant::now();
            let r = backend
                .exec(
                    Command {
                        script: "true",
                        stdin: None,
                        timeout: Duration::from_secs(30),
                        stdout_limit: 32 * 1024,
                        stderr_limit: 32 * 1024,
                        live: None,
                    },
                    &never,
                )
                .await
                .unwrap();
            bare.push(t.elapsed());
            assert!(r.exit.success());
        }
    }
    println!(
        "\n## `exec true` over MCP vs the chat path (loopback sshd, user {})\n",
        sshd::USER
    );
    println!("| path | runs | median | p99 |");
    println!("|---|---|---|---|");
    let m = row(
        "MCP `exec` (rmcp client, 2025-era session, HTTP/1 loopback)",
        mcp,
    );
    let d = row("chat path's operations (`Ops::terminal`)", direct);
    let b = row("bare pooled backend (`Backend::exec`)", bare);
    println!(
        "\nMCP / Ops::terminal: {:.2}× (target ≤ 1.5×); MCP / Backend::exec: {:.2}×",
        m.as_secs_f64() / d.as_secs_f64(),
        m.as_secs_f64() / b.as_secs_f64()
    );
    let _ = client.cancel().await;
    shutdown.cancel();
    let _ = served.await;
    drop(sshd);
}
