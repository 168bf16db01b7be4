//! Benchmark of the secret scanner (see BENCHMARKS.md): the cost per MB of output of the
//! detectors ([`sshmode::mask::redact`]) on ordinary command output (the corpus of
//! `tests/corpus/ordinary/`, repeated) and on output dense with secrets (the generated
//! corpus), in 64 KiB results as the gate sees them; and of looking for 20 known secrets
//! (plain, base64, hex) as the vault does for the service's and the targets' secrets.
//!
//! Run with `cargo bench --bench mask`; it needs no database.

use std::time::Instant;

use sshmode::mask::{find_known, redact};

const MB: usize = 1 << 20;
const CHUNK: usize = 64 * 1024;
const ROUNDS: usize = 7;

fn corpus(dir: &str) -> String {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/corpus/");
    let mut paths: Vec<_> = std::fs::read_dir(format!("{root}{dir}"))
        .expect("the corpus")
        .map(|e| e.expect("an entry").path())
        .collect();
    paths.sort();
    paths
        .iter()
        .map(|p| std::fs::read_to_string(p).expect("a corpus file"))
        .collect()
}

/// `text` repeated to at least `size` bytes, cut into results of [`CHUNK`] bytes at line ends.
fn results(text: &str, size: usize) -> Vec<String> {
    let mut all = String::with_capacity(size + text.len());
    while all.len() < size {
        all.push_str(text);
        all.push('\n');
    }
    let mut out = Vec::new();
    let mut cur = String::with_capacity(CHUNK);
    for line in all.lines() {
        if cur.len() + line.len() + 1 > CHUNK && !cur.is_empty() {
            out.push(std::mem::take(&mut cur));
        }
        cur.push_str(line);
        cur.push('\n');
    }
    out.push(cur);
    out
}

/// Median milliseconds per MB of `f` over `chunks`.
fn per_mb(chunks: &[String], f: impl Fn(&str) -> usize) -> (f64, usize) {
    let bytes: usize = chunks.iter().map(String::len).sum();
    let mut times = Vec::new();
    let mut found = 0;
    for _ in 0..ROUNDS {
        let t = Instant::now();
        found = chunks.iter().map(|c| f(std::hint::black_box(c))).sum();
        times.push(t.elapsed().as_secs_f64() * 1e3 / (bytes as f64 / MB as f64));
    }
    times.sort_by(f64::total_cmp);
    (times[ROUNDS / 2], found)
}

fn main() {
    let ordinary = results(&corpus("ordinary"), 8 * MB);
    let secrets: String = corpus("secrets")
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .map(|c| c["text"].as_str().unwrap_or_default().to_string())
        .collect::<Vec<_>>()
        .join("\n");
    let dense = results(&secrets, 2 * MB);
    let masks = |t: &str| redact(t).matches("[secret: ").count();
    // Warm up the table.
    let _ = redact("password=x");
    let (ord_ms, ord_found) = per_mb(&ordinary, masks);
    let (dense_ms, dense_found) = per_mb(&dense, masks);
    let known: Vec<String> = (0..20)
        .map(|i| format!("known-secret-{i:02}-Xk29fQ7zLp"))
        .collect();
    let (known_ms, known_found) = per_mb(&ordinary, |t| {
        known
            .iter()
            .map(|s| find_known(t, s, "service-secret", "0000").len())
            .sum()
    });
    println!("| what | ms per MB (median of {ROUNDS}) | MB/s | masks |");
    println!("|---|---|---|---|");
    for (what, ms, n) in [
        ("detectors, ordinary output", ord_ms, ord_found),
        (
            "detectors, output dense with secrets",
            dense_ms,
            dense_found,
        ),
        ("20 known secrets, plain/base64/hex", known_ms, known_found),
    ] {
        println!("| {what} | {ms:.2} | {:.0} | {n} |", 1e3 / ms);
    }
}
