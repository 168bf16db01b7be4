//! Benchmark of the execution layer against a real OpenSSH server on loopback (see
//! BENCHMARKS.md): round trip of `true` through the pooled SSH backend vs OpenSSH through an
//! open ControlMaster vs a fresh `ssh`; 10 MB write and read (over SFTP, and through the
//! shell on an sshd without SFTP) vs `scp` through the same
//! ControlMaster; RSS of the process holding connections to 20 targets.
//!
//! Run as root with `bash scripts/bench.sh exec` (it provides TEST_DATABASE_URL).

#[path = "../tests/api/database.rs"]
mod database;

#[path = "support/mod.rs"]
#[allow(dead_code)]
mod support;

#[path = "../tests/api/sshd.rs"]
#[allow(dead_code)]
mod sshd;

use std::collections::HashMap;
use std::process::{Command as Proc, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sshmode::config::Config;
use sshmode::exec::{Command, Executors, Place};
use tokio_util::sync::CancellationToken;
use zeroize::Zeroizing;

const RUNS: usize = 300;
const FRESH_RUNS: usize = 200;
const FILE_RUNS: usize = 10;
const FILE_SIZE: usize = 10 * 1024 * 1024;

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

fn stats(name: &str, mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    let med = samples[samples.len() / 2];
    let p99 = samples[(samples.len() * 99 / 100).min(samples.len() - 1)];
    println!(
        "| {name} | {} | {:.3} ms | {:.3} ms |",
        samples.len(),
        med.as_secs_f64() * 1e3,
        p99.as_secs_f64() * 1e3
    );
    (med, p99)
}

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

async fn run() {
    let db_url = database::fresh_database().await;

    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let sshd = sshd::Sshd::start_below(dir);
    let port = sshd.port;
    let key = dir.join("bench_key");
    sshd::new_key(&key, "ed25519", "");
    sshd.authorize(&dir.join("bench_key.pub"));
    support::openssh::trust_host(dir, port, &dir.join("sshd/host_key.pub"));

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
    for i in 0..20 {
        let new = support::loopback_target(&format!("t{i}"), port, sshd::USER, &key_text);
        sshmode::target::add(&store.pool, &vault, new, "bench")
            .await
            .unwrap();
    }
    let shell_vault = vault.clone();
    let exec = Executors::new(
        &config.exec,
        sshmode::target::registry(store.pool.clone()),
        vault,
        tokio_util::task::TaskTracker::new(),
    )
    .unwrap();
    let never = CancellationToken::new();
    let cmd = |script: &'static str| Command {
        script,
        stdin: None,
        timeout: Duration::from_secs(30),
        stdout_limit: 32 * 1024,
        stderr_limit: 32 * 1024,
        live: None,
    };

    // Memory with 20 targets connected.
    let before = rss_kib();
    let mut held = Vec::new();
    for i in 0..20 {
        let b = exec
            .backend("bench", &Place::Target(format!("t{i}")))
            .await
            .unwrap();
        b.exec(cmd("true"), &never).await.unwrap();
        held.push(b);
    }
    let counts = exec.ssh.connection_counts().await;
    let open: usize = counts.values().sum();
    let after = rss_kib();
    println!("\n## Memory\n");
    println!(
        "RSS with {open} open connections to 20 targets: {after} KiB ({before} KiB before connecting; +{} KiB)",
        after.saturating_sub(before)
    );

    let backend = exec
        .backend("bench", &Place::Target("t0".into()))
        .await
        .unwrap();
    println!(
        "\n## Round trip of `true` (loopback sshd, user {})\n",
        sshd::USER
    );
    println!("| path | runs | median | p99 |\n|---|---|---|---|");
    for _ in 0..20 {
        backend.exec(cmd("true"), &never).await.unwrap();
    }
    let mut pooled = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let t = Instant::now();
        let out = backend.exec(cmd("true"), &never).await.unwrap();
        pooled.push(t.elapsed());
        assert!(out.exit.success());
    }
    let (pooled_med, _) = stats("pooled SSH backend (`Backend::exec`)", pooled);
    let ops = exec.ops("bench", backend.clone());
    let mut term = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let t = Instant::now();
        ops.terminal("true", Default::default(), &never)
            .await
            .unwrap();
        term.push(t.elapsed());
    }
    stats(
        "pooled SSH backend, terminal tool (guard + cwd tracking)",
        term,
    );

    // OpenSSH ControlMaster, opened once.
    let cm = support::openssh::ControlMaster::open(dir, &key, port, sshd::USER);
    for _ in 0..10 {
        cm.run(&["true"]);
    }
    let mut cmv = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let t = Instant::now();
        cm.run(&["true"]);
        cmv.push(t.elapsed());
    }
    let (cm_med, _) = stats("`ssh` through an open ControlMaster", cmv);
    let mut fresh = Vec::with_capacity(FRESH_RUNS);
    for _ in 0..FRESH_RUNS {
        let t = Instant::now();
        let st = Proc::new("ssh")
            .args(cm.opts())
            .args(["-o", "ControlPath=none", cm.target(), "true"])
            .stdin(Stdio::null())
            .status()
            .unwrap();
        fresh.push(t.elapsed());
        assert!(st.success());
    }
    let (fresh_med, _) = stats("fresh `ssh` (new connection each time)", fresh);
    println!(
        "\npooled / ControlMaster = {:.2}×; fresh / pooled = {:.1}×",
        pooled_med.as_secs_f64() / cm_med.as_secs_f64(),
        fresh_med.as_secs_f64() / pooled_med.as_secs_f64()
    );

    // 10 MB both ways.
    println!("\n## 10 MB transfer (median of {FILE_RUNS})\n");
    println!("| path | write | read |\n|---|---|---|");
    let data: Vec<u8> = (0..FILE_SIZE).map(|i| (i * 7919 % 251) as u8).collect();
    let remote = format!("/home/{}/bench-10mb.bin", sshd::USER);
    let mut w = Vec::new();
    let mut r = Vec::new();
    for _ in 0..FILE_RUNS {
        let t = Instant::now();
        backend.write(&remote, &data).await.unwrap();
        w.push(t.elapsed());
        let t = Instant::now();
        let back = backend.read(&remote, 0, u64::MAX).await.unwrap();
        r.push(t.elapsed());
        assert_eq!(back.data.len(), FILE_SIZE);
    }
    let mb = FILE_SIZE as f64 / (1024.0 * 1024.0);
    let med = |mut v: Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    let (bw, br) = (med(w), med(r));
    println!(
        "| SSH backend (SFTP, pipelined) | {:.0} MiB/s | {:.0} MiB/s |",
        mb / bw.as_secs_f64(),
        mb / br.as_secs_f64()
    );
    // The same on an sshd with no SFTP subsystem: files through the shell (`cat` + `mv`,
    // `head -c`), same host, same key.
    let plain_dir = dir.join("nosftp");
    std::fs::create_dir_all(&plain_dir).unwrap();
    let plain = sshd::Sshd::start_opts(&plain_dir, sshd::free_port(), "", false);
    plain.authorize(&dir.join("bench_key.pub"));
    sshmode::target::add(
        &store.pool,
        &shell_vault,
        support::loopback_target("noftp", plain.port, sshd::USER, &key_text),
        "bench",
    )
    .await
    .unwrap();
    let shell_backend = exec
        .backend("bench", &Place::Target("noftp".into()))
        .await
        .unwrap();
    let mut w = Vec::new();
    let mut r = Vec::new();
    for _ in 0..FILE_RUNS {
        let t = Instant::now();
        shell_backend.write(&remote, &data).await.unwrap();
        w.push(t.elapsed());
        let t = Instant::now();
        let back = shell_backend
            .read(&remote, 0, FILE_SIZE as u64)
            .await
            .unwrap();
        r.push(t.elapsed());
        assert!(back.data == data);
    }
    let (hw, hr) = (med(w), med(r));
    println!(
        "| SSH backend without SFTP (through the shell) | {:.0} MiB/s | {:.0} MiB/s |",
        mb / hw.as_secs_f64(),
        mb / hr.as_secs_f64()
    );
    println!(
        "\nshell / SFTP time: write {:.2}×, read {:.2}×",
        hw.as_secs_f64() / bw.as_secs_f64(),
        hr.as_secs_f64() / br.as_secs_f64()
    );
    drop(plain);
    let local = dir.join("local-10mb.bin");
    let local_back = dir.join("local-back.bin");
    std::fs::write(&local, &data).unwrap();
    let scp = |from: &str, to: &str| {
        let st = Proc::new("scp")
            .args(["-q", "-F", "/dev/null", "-o", "BatchMode=yes"])
            .args(["-o", "StrictHostKeyChecking=yes", "-o"])
            .arg(format!(
                "UserKnownHostsFile={}",
                dir.join("known_hosts").display()
            ))
            .arg("-o")
            .arg(format!("ControlPath={}", cm.path().display()))
            .args([
                "-P",
                &port.to_string(),
                "-i",
                key.to_str().unwrap(),
                from,
                to,
            ])
            .status()
            .unwrap();
        assert!(st.success());
    };
    let remote_scp = format!("{}:/home/{}/bench-scp.bin", cm.target(), sshd::USER);
    let mut w = Vec::new();
    let mut r = Vec::new();
    for _ in 0..FILE_RUNS {
        let t = Instant::now();
        scp(local.to_str().unwrap(), &remote_scp);
        w.push(t.elapsed());
        let t = Instant::now();
        scp(&remote_scp, local_back.to_str().unwrap());
        r.push(t.elapsed());
    }
    let (sw, sr) = (med(w), med(r));
    println!(
        "| `scp` through the open ControlMaster | {:.0} MiB/s | {:.0} MiB/s |",
        mb / sw.as_secs_f64(),
        mb / sr.as_secs_f64()
    );
    println!(
        "\nbackend / scp throughput: write {:.2}×, read {:.2}×",
        sw.as_secs_f64() / bw.as_secs_f64(),
        sr.as_secs_f64() / br.as_secs_f64()
    );
    drop(cm);

    drop(held);
    drop(exec);
    store.close().await;
    drop(sshd);
}
