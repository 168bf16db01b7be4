//! The secret scanner on the committed corpora (`tests/corpus/`, written before the detectors):
//! at least 98 % of the generated secrets are masked, and at most 0.1 % of the lines of
//! ordinary command output are touched. Run with `--nocapture` for the rates BENCHMARKS.md
//! reports.

use std::collections::BTreeMap;
use std::path::Path;

use sshmode::mask::redact;

fn corpus() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/corpus"))
}

/// Whether the masked text still holds the secret: the whole of it, or for a multi-line one
/// (a key) any of its lines of 16 characters or more other than the armour.
fn survives(masked: &str, secret: &str) -> bool {
    let lines: Vec<&str> = secret
        .split(['\n'])
        .flat_map(|l| l.split("\\n"))
        .map(str::trim)
        .filter(|l| l.len() >= 16 && !l.starts_with("-----"))
        .collect();
    if lines.len() > 1 {
        return lines.iter().any(|l| masked.contains(l));
    }
    masked.contains(secret)
}

#[test]
fn generated_secrets_are_masked() {
    let mut total = 0usize;
    let mut missed: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut per_kind: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for entry in std::fs::read_dir(corpus().join("secrets")).expect("the secrets corpus") {
        let path = entry.expect("an entry").path();
        let text = std::fs::read_to_string(&path).expect("a corpus file");
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let case: serde_json::Value = serde_json::from_str(line).expect("a JSON case");
            let kind = case["kind"].as_str().expect("kind").to_string();
            let secret = case["secret"].as_str().expect("secret");
            let text = case["text"].as_str().expect("text");
            assert!(text.contains(secret), "a case holds its secret");
            total += 1;
            let masked = redact(text);
            let e = per_kind.entry(kind.clone()).or_default();
            e.0 += 1;
            if survives(&masked, secret) || !masked.contains("[secret: ") {
                missed.entry(kind).or_default().push(masked);
            } else {
                e.1 += 1;
            }
        }
    }
    let found = total - missed.values().map(Vec::len).sum::<usize>();
    let rate = found as f64 / total as f64;
    println!("secrets masked: {found}/{total} ({:.1} %)", rate * 100.0);
    for (kind, (n, ok)) in &per_kind {
        println!("  {kind}: {ok}/{n}");
    }
    for (kind, texts) in &missed {
        for t in texts {
            println!("missed {kind}: {t}");
        }
    }
    assert!(total >= 200, "the corpus holds {total} secrets");
    assert!(rate >= 0.98, "{found}/{total} secrets masked");
}

#[test]
fn ordinary_output_is_untouched() {
    let mut lines = 0usize;
    let mut touched = Vec::new();
    for entry in std::fs::read_dir(corpus().join("ordinary")).expect("the ordinary corpus") {
        let path = entry.expect("an entry").path();
        let text = std::fs::read_to_string(&path).expect("a corpus file");
        for line in text.lines() {
            lines += 1;
            let masked = redact(line);
            if masked != line {
                touched.push(format!("{}: {line}\n  -> {masked}", path.display()));
            }
        }
        // Whole files too: no detector spans lines into a false find.
        let masked = redact(&text);
        if masked != text {
            touched.push(format!("{} (whole file)", path.display()));
        }
    }
    let rate = touched.len() as f64 / lines as f64;
    println!(
        "ordinary lines touched: {}/{lines} ({:.2} %)",
        touched.len(),
        rate * 100.0
    );
    for t in &touched {
        println!("touched {t}");
    }
    assert!(lines >= 1000, "the corpus holds {lines} lines");
    assert!(rate <= 0.001, "{} of {lines} lines touched", touched.len());
}
