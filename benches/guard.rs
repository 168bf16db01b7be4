//! Benchmark of the command guard (see BENCHMARKS.md): the time one `Guard::check` takes on
//! ordinary commands, and on the inputs that used to be slow or that reach a bound.
//!
//! Run with `cargo bench --bench guard`; it needs no database or sshd.

use std::time::{Duration, Instant};

use sshmode::exec::guard::Guard;

const RUNS: usize = 20_000;
const SLOW_RUNS: usize = 20;

fn stats(name: &str, runs: usize, mut samples: Vec<Duration>) {
    samples.sort();
    let med = samples[samples.len() / 2];
    let p99 = samples[(samples.len() * 99 / 100).min(samples.len() - 1)];
    println!(
        "| {name} | {runs} | {:.1} µs | {:.1} µs |",
        med.as_secs_f64() * 1e6,
        p99.as_secs_f64() * 1e6
    );
}

fn measure(guard: &Guard, cmd: &str, runs: usize) -> (Vec<Duration>, bool) {
    let mut samples = Vec::with_capacity(runs);
    let mut allowed = true;
    for _ in 0..runs {
        let t = Instant::now();
        allowed = std::hint::black_box(guard.check(std::hint::black_box(cmd))).is_ok();
        samples.push(t.elapsed());
    }
    (samples, allowed)
}

fn main() {
    let guard = Guard::default();
    let ordinary = [
        "ls -la",
        "cargo build --release 2>&1 | tail -n 20",
        "cd src && grep -rn 'fn main' . | head",
        "git status && git diff --stat",
        "for f in *.rs; do wc -l \"$f\"; done",
        "rm -rf ./target/debug/incremental",
        "find . -name '*.o' -delete",
        "cat <<EOF > config.toml\n[server]\nport = 8080\nEOF",
        "sudo systemctl restart nginx && journalctl -u nginx -n 50",
        "X=$(date +%s); echo \"started at $X\" >> log.txt",
    ];
    println!("| command | runs | median | p99 |\n|---|---|---|---|");
    let mut all = Vec::new();
    for cmd in ordinary {
        let (samples, allowed) = measure(&guard, cmd, RUNS / ordinary.len());
        assert!(allowed, "{cmd}");
        all.extend(samples);
    }
    stats("ten ordinary commands (allowed), per check", RUNS, all);
    let (samples, _) = measure(&guard, "sudo rm -rf /", RUNS);
    stats("`sudo rm -rf /` (refused)", RUNS, samples);

    let braces = format!("echo {}", "{".repeat(60 * 1024));
    let commas = format!("echo {}", "{a,".repeat(20_000));
    let wrappers = format!("{}rm -rf /etc", "nice ".repeat(33));
    let nested = format!("{}true{}", "$(".repeat(8), ")".repeat(8));
    for (name, cmd) in [
        ("a 60 KB word of `{` (allowed)", braces.as_str()),
        ("20 000 × `{a,` (allowed)", commas.as_str()),
        (
            "33 stacked `nice` (refused: too-complex)",
            wrappers.as_str(),
        ),
        ("8 nested `$(…)` (allowed)", nested.as_str()),
    ] {
        let (samples, _) = measure(&guard, cmd, SLOW_RUNS);
        stats(name, SLOW_RUNS, samples);
    }
}
