//! Benchmark: see BENCHMARKS.md.

fn main() {
    eprintln!("this benchmark is not written yet");
    std::process::exit(1);
}
