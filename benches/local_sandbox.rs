//! What isolating a local command costs (see BENCHMARKS.md): `true` through the local
//! backend (`Backend::exec`: clean environment, fork with a `pre_exec` hook, pipes, wait)
//! without a sandbox, with Landlock, with Landlock and the switch to the tools account, and
//! (root) the same through the launch server, in a PID namespace of its own. The first three fork
//! with a `pre_exec` hook (resource limits are set in every case), so they compare like with
//! like; the rounds are interleaved so machine noise falls on all cases. Then a 1 KiB
//! `read_file` through the backend, in the service's process and through the launch server.
//!
//! Run as root with `cargo bench --bench local_sandbox` (no database needed).

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sshmode::config::Config;
use sshmode::exec::{Backend, Command, Executors, Place};
use tokio_util::sync::CancellationToken;

const WARMUP: usize = 50;
const RUNS: usize = 1000;

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run());
}

fn stats(samples: &mut [Duration]) -> (f64, f64) {
    samples.sort();
    let med = samples[samples.len() / 2];
    let p99 = samples[(samples.len() * 99 / 100).min(samples.len() - 1)];
    (med.as_secs_f64() * 1e3, p99.as_secs_f64() * 1e3)
}

async fn backend(
    dir: &std::path::Path,
    name: &str,
    tune: impl Fn(&mut Config),
) -> (String, Arc<dyn Backend>) {
    let data = dir.join(name);
    let vars: HashMap<String, String> =
        [("SSHMODE_DATA_DIR".to_string(), data.display().to_string())]
            .into_iter()
            .collect();
    let mut config = Config::from_vars(&|k| vars.get(k).cloned(), dir).unwrap();
    // The direct spawn unless a case asks for the launcher.
    config.exec.local.launcher = None;
    tune(&mut config);
    // Local execution never touches the database: a lazy pool that is never used.
    let db = sqlx::postgres::PgPoolOptions::new()
        .connect_lazy("postgres://unused@127.0.0.1:9/unused")
        .unwrap();
    let vault = Arc::new(sshmode::vault::Vault::open_or_create(&config.master_key_file).unwrap());
    let exec = Executors::new(
        &config.exec,
        sshmode::target::registry(db),
        vault,
        tokio_util::task::TaskTracker::new(),
    )
    .unwrap();
    let level = exec.local_level().to_string();
    let b = exec.backend("omt_bench", &Place::Local).await.unwrap();
    b.initial_dir("omt_bench").await.unwrap();
    (level, b)
}

async fn once(b: &Arc<dyn Backend>) -> Duration {
    let cancel = CancellationToken::new();
    let t = Instant::now();
    let out = b
        .exec(
            Command {
                script: "true",
                stdin: None,
                timeout: Duration::from_secs(30),
                stdout_limit: 4096,
                stderr_limit: 4096,
                live: None,
            },
            &cancel,
        )
        .await
        .unwrap();
    let d = t.elapsed();
    assert!(out.exit.success(), "{out:?}");
    d
}

async fn run() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut cases = vec![
        backend(dir.path(), "none", |c| {
            c.exec.local.simulate_no_sandbox = true;
            c.exec.local.unsandboxed = true;
        })
        .await,
        backend(dir.path(), "landlock", |c| {
            c.exec.local.simulate_non_root = true
        })
        .await,
    ];
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        cases.push(backend(dir.path(), "full", |_| {}).await);
        cases.push(
            backend(dir.path(), "launched", |c| {
                c.exec.local.launcher = Some(env!("CARGO_BIN_EXE_sshmode").into())
            })
            .await,
        );
        assert!(cases[3].0.contains("pidns"), "the launcher is not in force");
    } else {
        eprintln!("not root: the uid switch and the launcher are not measured");
    }
    for (_, b) in &cases {
        for _ in 0..WARMUP {
            once(b).await;
        }
    }
    let mut samples: Vec<Vec<Duration>> = vec![Vec::with_capacity(RUNS); cases.len()];
    for _ in 0..RUNS {
        for (i, (_, b)) in cases.iter().enumerate() {
            samples[i].push(once(b).await);
        }
    }
    println!("| isolation (level reported) | runs | median | p99 | added: median | added: p99 |");
    println!("|---|---|---|---|---|---|");
    let mut base = None;
    for ((level, _), s) in cases.iter().zip(samples.iter_mut()) {
        let (med, p99) = stats(s);
        let (base_med, base_p99) = *base.get_or_insert((med, p99));
        println!(
            "| `{level}` | {RUNS} | {med:.3} ms | {p99:.3} ms | {:+.3} ms | {:+.3} ms |",
            med - base_med,
            p99 - base_p99
        );
    }
    if cases.len() < 4 {
        return;
    }
    // The file tools: a 1 KiB read in the service's process against the launcher's helper.
    let files = [&cases[2], &cases[3]];
    for (_, b) in files {
        let home = b.home().await.unwrap();
        b.write(&format!("{home}/f"), &[b'x'; 1024]).await.unwrap();
        for _ in 0..WARMUP {
            read_once(b, &home).await;
        }
    }
    let mut samples: Vec<Vec<Duration>> = (0..2).map(|_| Vec::with_capacity(RUNS)).collect();
    for _ in 0..RUNS {
        for (i, (_, b)) in files.iter().enumerate() {
            let home = b.home().await.unwrap();
            samples[i].push(read_once(b, &home).await);
        }
    }
    println!();
    println!(
        "| read_file 1 KiB (level reported) | runs | median | p99 | added: median | added: p99 |"
    );
    println!("|---|---|---|---|---|---|");
    let mut base = None;
    for ((level, _), s) in files.iter().zip(samples.iter_mut()) {
        let (med, p99) = stats(s);
        let (base_med, base_p99) = *base.get_or_insert((med, p99));
        println!(
            "| `{level}` | {RUNS} | {med:.3} ms | {p99:.3} ms | {:+.3} ms | {:+.3} ms |",
            med - base_med,
            p99 - base_p99
        );
    }
}

async fn read_once(b: &Arc<dyn Backend>, home: &str) -> Duration {
    let t = Instant::now();
    let got = b.read(&format!("{home}/f"), 0, 4096).await.unwrap();
    let d = t.elapsed();
    assert_eq!(got.data.len(), 1024);
    d
}
