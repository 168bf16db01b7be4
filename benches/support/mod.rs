//! What the benchmarks share: their arguments, percentiles, the load generator's own thread,
//! an approved target on a loopback sshd, and OpenSSH through a ControlMaster ([`openssh`]).

use std::time::Duration;

pub mod openssh;

pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

pub fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Runs a load-generator phase on a thread of its own with a single-threaded runtime (as
/// pgbench is a process of its own), so that it neither steals the service's worker threads
/// nor waits behind the service's tasks to send or time a request.
pub async fn on_generator<F, Fut, T>(phase: F) -> T
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = T>,
    T: Send + 'static,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("generator runtime");
        let _ = tx.send(rt.block_on(phase()));
    });
    rx.await.expect("the load generator panicked")
}

/// An approved target `alias` on a loopback sshd at `port`, logged into as `user` with the
/// private key `key` (its text), its host key trusted on first use.
pub fn loopback_target(
    alias: &str,
    port: u16,
    user: &str,
    key: &str,
) -> sshmode::target::NewTarget {
    sshmode::target::NewTarget {
        alias: alias.into(),
        host: "127.0.0.1".into(),
        port,
        user: user.into(),
        description: None,
        secrets: sshmode::target::NewSecrets::Key {
            key: zeroize::Zeroizing::new(key.to_string()),
            cert: None,
        },
        host_key_policy: sshmode::target::HostKeyPolicy::Tofu,
        host_key: None,
        approve: true,
        jump: None,
    }
}
