//! Benchmark of interactive shells (see BENCHMARKS.md): a keystroke typed into a shell on a
//! loopback sshd until its echo is visible in a read (`Shells::write`, then `Shells::read`
//! waiting for it), and, interleaved in the same run for scale, the round trip of `true` run as
//! a command on the same pooled connection.
//!
//! Run as root with `bash scripts/bench.sh terminals` (it provides TEST_DATABASE_URL).

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
use sshmode::exec::pty::{OpenOpts, ReadMode, ReadOpts};
use sshmode::exec::{Command, Executors, Place};
use tokio_util::sync::CancellationToken;

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
    let sshd_dir = dir.join("sshd");
    std::fs::create_dir_all(&sshd_dir).unwrap();
    let target = sshd::Sshd::start(&sshd_dir, sshd::free_port());
    let key = dir.join("bench_key");
    sshd::new_key(&key, "ed25519", "");
    target.authorize(&dir.join("bench_key.pub"));

    let mut vars = HashMap::new();
    vars.insert("DATABASE_URL".to_string(), db_url);
    vars.insert(
        "SSHMODE_DATA_DIR".to_string(),
        dir.join("data").display().to_string(),
    );
    let config = Config::from_vars(&|k| vars.get(k).cloned(), dir).unwrap();
    let store = sshmode::store::Store::open(&config).await.unwrap();
    let vault = Arc::new(sshmode::vault::Vault::open_or_create(&config.master_key_file).unwrap());
    let new = support::loopback_target(
        "web",
        target.port,
        sshd::USER,
        &std::fs::read_to_string(&key).unwrap(),
    );
    sshmode::target::add(&store.pool, &vault, new, "bench")
        .await
        .unwrap();
    let exec = Executors::new(
        &config.exec,
        sshmode::target::registry(store.pool.clone()),
        vault,
        tokio_util::task::TaskTracker::new(),
    )
    .unwrap();
    let place = Place::Target("web".into());
    let backend = exec.backend("bench", &place).await.unwrap();
    let host = exec.pty_host("bench", &place).await.unwrap();
    let shells = exec.shells.clone();
    let info = shells
        .open(host, "bench", OpenOpts::default())
        .await
        .unwrap();
    let id = info.shell_id;
    let never = CancellationToken::new();
    let cmd = || Command {
        script: "true",
        stdin: None,
        timeout: Duration::from_secs(30),
        stdout_limit: 32 * 1024,
        stderr_limit: 32 * 1024,
        live: None,
    };
    // One keystroke, until its echo shows in a raw read from where the output ended.
    let keystroke = |i: usize| {
        let shells = shells.clone();
        let id = id.clone();
        let never = never.clone();
        async move {
            let key = (b'a' + (i % 26) as u8) as char;
            let since = shells
                .read("bench", &id, read(None, Duration::ZERO, None), &never)
                .await
                .unwrap()
                .end;
            let t = Instant::now();
            shells
                .write("bench", &id, key.to_string().as_bytes())
                .await
                .unwrap();
            let r = shells
                .read(
                    "bench",
                    &id,
                    read(Some(since), Duration::from_secs(10), Some(key)),
                    &never,
                )
                .await
                .unwrap();
            let took = t.elapsed();
            assert_eq!(r.matched, Some(true), "the echo of {key} never came");
            if i % 40 == 39 {
                // Ctrl-U: an empty line again (not measured).
                shells.write("bench", &id, b"\x15").await.unwrap();
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            took
        }
    };
    for i in 0..20 {
        keystroke(i).await;
        backend.exec(cmd(), &never).await.unwrap();
    }
    println!(
        "\n## Keystroke → echo visible in a read, over SSH (loopback sshd, user {})\n",
        sshd::USER
    );
    println!("| what | runs | median | p99 |\n|---|---|---|---|");
    let (mut k, mut c) = (Vec::with_capacity(RUNS), Vec::with_capacity(RUNS));
    // Interleaved, so both see the same machine.
    for i in 0..RUNS {
        k.push(keystroke(i).await);
        let t = Instant::now();
        assert!(backend.exec(cmd(), &never).await.unwrap().exit.success());
        c.push(t.elapsed());
    }
    stats("keystroke → echo in `shell_read` (raw, expect)", k);
    stats("`true` as a command on the same pool", c);
    shells.close_all("done");
}

fn read(since: Option<u64>, wait: Duration, key: Option<char>) -> ReadOpts {
    ReadOpts {
        mode: ReadMode::Raw,
        since,
        wait,
        expect: key.map(|k| regex::Regex::new(&regex::escape(&k.to_string())).unwrap()),
    }
}
