//! The one tracing setup: a `RUST_LOG` filter (default `info`; one-shot commands choose `warn`
//! in `main`), pretty or JSON lines on stderr, and with `SSHMODE_LOG_FILE` the same events in a
//! file rotated by size ([`RotatingFile`]: past `SSHMODE_LOG_MAX_MB` the file becomes
//! `name.1`, older ones shift up to `name.N` with N = `SSHMODE_LOG_KEEP`, the oldest is dropped).
//!
//! Field names are dotted and shared across modules: `section.id`, `ssh.target`,
//! `lark.event_id`, `llm.route`, `duration_ms`. Never logs a secret (secrets are
//! `SecretString`, whose `Debug` is redacted).

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry};

use crate::config::{LogFileConfig, LogFormat};

type BoxedLayer = Box<dyn Layer<Registry> + Send + Sync>;

fn layer<W>(format: LogFormat, writer: W, ansi: bool) -> BoxedLayer
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(writer)
        .with_ansi(ansi);
    match format {
        LogFormat::Json => fmt.json().flatten_event(true).boxed(),
        LogFormat::Pretty => fmt.boxed(),
    }
}

/// Installs the global subscriber; a second call is a no-op. A filter that does not parse
/// falls back to `info` with a warning, rather than silencing the service; a log file that
/// cannot be opened is warned about and left out. Colour codes go to standard error only when
/// it is a terminal and `no_color` (`NO_COLOR`) is not set; never into a file.
pub fn init(format: LogFormat, filter: &str, file: Option<&LogFileConfig>, no_color: bool) {
    let (filter, bad) = match EnvFilter::try_new(filter) {
        Ok(f) => (f, None),
        Err(e) => (EnvFilter::new("info"), Some(e.to_string())),
    };
    let ansi = colour(io::IsTerminal::is_terminal(&io::stderr()), no_color);
    let mut layers: Vec<BoxedLayer> = vec![layer(format, io::stderr, ansi)];
    let mut file_error = None;
    if let Some(f) = file {
        match RotatingFile::open(&f.path, f.max_bytes, f.keep) {
            Ok(r) => layers.push(layer(format, Mutex::new(r), false)),
            Err(e) => file_error = Some((f.path.clone(), e)),
        }
    }
    let _ = tracing_subscriber::registry()
        .with(layers)
        .with(filter)
        .try_init();
    if let Some(e) = bad {
        tracing::warn!(error = %e, "RUST_LOG is invalid; logging at info");
    }
    if let Some((path, e)) = file_error {
        tracing::warn!(path = %path.display(), error = %e, "SSHMODE_LOG_FILE cannot be opened; logging to stderr only");
    }
}

/// Whether log lines carry colour codes: on a terminal, unless `NO_COLOR` says no.
fn colour(terminal: bool, no_color: bool) -> bool {
    terminal && !no_color
}

/// A log file rotated by size: a write that would take it past `max_bytes` first moves it to
/// `name.1` (and `name.1` … to `name.2` …, keeping `keep` of them). One write is never split,
/// so a file exceeds the bound only by a single event longer than it.
#[derive(Debug)]
pub struct RotatingFile {
    path: PathBuf,
    file: File,
    size: u64,
    max_bytes: u64,
    keep: usize,
}

impl RotatingFile {
    /// Opens (appends to) `path`, creating its directory.
    pub fn open(path: &Path, max_bytes: u64, keep: usize) -> io::Result<RotatingFile> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let file = Self::open_file(path)?;
        let size = file.metadata()?.len();
        Ok(RotatingFile {
            path: path.to_path_buf(),
            file,
            size,
            max_bytes: max_bytes.max(1),
            keep,
        })
    }

    fn open_file(path: &Path) -> io::Result<File> {
        use std::os::unix::fs::OpenOptionsExt;
        OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o640)
            .open(path)
    }

    /// `name.n`.
    fn numbered(&self, n: usize) -> PathBuf {
        let mut s = self.path.clone().into_os_string();
        s.push(format!(".{n}"));
        PathBuf::from(s)
    }

    fn rotate(&mut self) -> io::Result<()> {
        if self.keep == 0 {
            self.file.set_len(0)?;
        } else {
            // The oldest is overwritten by the one before it, and so on down to the current.
            for n in (1..self.keep).rev() {
                let from = self.numbered(n);
                if from.exists() {
                    std::fs::rename(&from, self.numbered(n + 1))?;
                }
            }
            std::fs::rename(&self.path, self.numbered(1))?;
            self.file = Self::open_file(&self.path)?;
        }
        self.size = 0;
        Ok(())
    }
}

impl Write for RotatingFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.size > 0 && self.size + buf.len() as u64 > self.max_bytes {
            self.rotate()?;
        }
        self.file.write_all(buf)?;
        self.size += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::{RotatingFile, colour};
    use std::io::Write;

    #[test]
    fn colour_only_on_a_terminal_and_never_with_no_color() {
        assert!(colour(true, false));
        assert!(!colour(true, true));
        assert!(!colour(false, false));
        assert!(!colour(false, true));
    }

    #[test]
    fn the_log_file_rotates_at_its_size_and_keeps_n() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("logs/sshmode.log");
        let mut f = RotatingFile::open(&path, 100, 2).unwrap();
        let line = |i: usize| format!("event {i:02} {}\n", "x".repeat(30)); // 40 bytes
        for i in 0..10 {
            f.write_all(line(i).as_bytes()).unwrap();
        }
        let read = |p: &str| std::fs::read_to_string(dir.path().join("logs").join(p)).unwrap();
        // Two events fit in 100 bytes, a third would not: 10 events = 5 files, of which the
        // current one and two rotated ones are kept.
        assert_eq!(read("sshmode.log"), format!("{}{}", line(8), line(9)));
        assert_eq!(read("sshmode.log.1"), format!("{}{}", line(6), line(7)));
        assert_eq!(read("sshmode.log.2"), format!("{}{}", line(4), line(5)));
        assert!(!dir.path().join("logs/sshmode.log.3").exists());
        // Reopened, it appends and goes on counting the size it has.
        drop(f);
        let mut f = RotatingFile::open(&path, 100, 2).unwrap();
        f.write_all(line(10).as_bytes()).unwrap();
        assert_eq!(read("sshmode.log"), line(10));
        assert_eq!(read("sshmode.log.1"), format!("{}{}", line(8), line(9)));
        // An event longer than the bound is written whole.
        f.write_all("y".repeat(300).as_bytes()).unwrap();
        assert_eq!(read("sshmode.log").len(), 300);
    }
}
