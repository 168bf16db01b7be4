//! What isolating a local command costs (see BENCHMARKS.md): `true` through the local
//! backend (`Backend::exec`: clean environment, fork with a `pre_exec` hook, pipes, wait)
//! without a sandbox, with Landlock, and with Landlock and the switch to the tools account.
//! All three fork with a `pre_exec` hook (resource limits are set in every case), so they
//! compare like with like; the rounds are interleaved so machine noise falls on all three.
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
    tune(&mut config);
    // Local execution never touches the database: a lazy pool that is never used.
    let db = sqlx::postgres::PgPoolOptions::new()
        .connect_lazy("postgres://unused@127.0.0.1:9/unused")
        .unwrap();
    let vault = Arc::new(sshmode::vault::Vault::open_or_create(&config.master_key_file).unwrap());
    let exec = Executors::new(&config.exec, db, vault).unwrap();
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
    } else {
        eprintln!("not root: the uid switch is not measured");
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
}
