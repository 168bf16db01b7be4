//! Benchmark of a target behind a jump host (see BENCHMARKS.md): the round trip of `true` on
//! the same loopback sshd, pooled, directly and through a second sshd acting as jump host
//! (a `direct-tcpip` tunnel on its pooled connection), interleaved in the same run.
//!
//! Run as root with `bash scripts/bench.sh jump` (it provides TEST_DATABASE_URL).

#[path = "../tests/api/database.rs"]
mod database;

#[path = "support/mod.rs"]
#[allow(dead_code)]
mod support;

#[path = "../tests/api/sshd.rs"]
#[allow(dead_code)]
mod sshd;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sshmode::config::Config;
use sshmode::exec::{Backend, Command, Executors, Place};
use sshmode::target::NewTarget;
use tokio_util::sync::CancellationToken;
use zeroize::Zeroizing;

const RUNS: usize = 500;

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

fn stats(name: &str, mut samples: Vec<Duration>) {
    samples.sort();
    let med = samples[samples.len() / 2];
    let p99 = samples[(samples.len() * 99 / 100).min(samples.len() - 1)];
    println!(
        "| {name} | {} | {:.3} ms | {:.3} ms |",
        samples.len(),
        med.as_secs_f64() * 1e3,
        p99.as_secs_f64() * 1e3
    );
}

async fn run() {
    let db_url = database::fresh_database().await;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let target_dir = dir.join("target-sshd");
    let jump_dir = dir.join("jump-sshd");
    std::fs::create_dir_all(&target_dir).unwrap();
    std::fs::create_dir_all(&jump_dir).unwrap();
    let target = sshd::Sshd::start(&target_dir, sshd::free_port());
    let jump = sshd::Sshd::start(&jump_dir, sshd::free_port());
    let key = dir.join("bench_key");
    sshd::new_key(&key, "ed25519", "");
    target.authorize(&dir.join("bench_key.pub"));
    jump.authorize(&dir.join("bench_key.pub"));

    let mut vars = HashMap::new();
    vars.insert("DATABASE_URL".to_string(), db_url);
    vars.insert(
        "SSHMODE_DATA_DIR".to_string(),
        dir.join("data").display().to_string(),
    );
    let config = Config::from_vars(&|k| vars.get(k).cloned(), dir).unwrap();
    let store = sshmode::store::Store::open(&config).await.unwrap();
    let vault = Arc::new(sshmode::vault::Vault::open_or_create(&config.master_key_file).unwrap());
    let key_text = Zeroizing::new(std::fs::read_to_string(&key).unwrap());
    for (alias, port, via) in [
        ("direct", target.port, None),
        ("bastion", jump.port, None),
        ("jumped", target.port, Some("bastion")),
    ] {
        let new = NewTarget {
            jump: via.map(str::to_string),
            ..support::loopback_target(alias, port, sshd::USER, &key_text)
        };
        sshmode::target::add(&store.pool, &vault, new, "bench")
            .await
            .unwrap();
    }
    let exec = Executors::new(
        &config.exec,
        sshmode::target::registry(store.pool.clone()),
        vault,
        tokio_util::task::TaskTracker::new(),
    )
    .unwrap();
    let never = CancellationToken::new();
    let cmd = || Command {
        script: "true",
        stdin: None,
        timeout: Duration::from_secs(30),
        stdout_limit: 32 * 1024,
        stderr_limit: 32 * 1024,
        live: None,
    };
    let backend = |alias: &str| {
        let exec = &exec;
        let place = Place::Target(alias.into());
        async move { exec.backend("bench", &place).await.unwrap() }
    };
    let direct: Arc<dyn Backend> = backend("direct").await;
    let jumped: Arc<dyn Backend> = backend("jumped").await;
    // Connect both (the jump host's connection too) and warm up.
    for _ in 0..20 {
        direct.exec(cmd(), &never).await.unwrap();
        jumped.exec(cmd(), &never).await.unwrap();
    }
    let counts = exec.ssh.connection_counts().await;
    println!(
        "\n## Round trip of `true` through a jump host (loopback sshds, user {}; connections: {counts:?})\n",
        sshd::USER
    );
    println!("| path | runs | median | p99 |\n|---|---|---|---|");
    let (mut d, mut j) = (Vec::with_capacity(RUNS), Vec::with_capacity(RUNS));
    // Interleaved, so both see the same machine.
    for _ in 0..RUNS {
        let t = Instant::now();
        assert!(direct.exec(cmd(), &never).await.unwrap().exit.success());
        d.push(t.elapsed());
        let t = Instant::now();
        assert!(jumped.exec(cmd(), &never).await.unwrap().exit.success());
        j.push(t.elapsed());
    }
    stats("pooled, direct", d);
    stats("pooled, through a jump host", j);
    store.close().await;
}
