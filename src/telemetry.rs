//! The one tracing setup: `RUST_LOG` filter (default `info`), pretty or JSON lines on stderr.
//! Field names are dotted and shared across modules (`lark.event_id`, `ssh.target`, …).

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Installs the global subscriber; a second call is a no-op. A filter that does not parse
/// falls back to `info` with a warning, rather than silencing the service.
pub fn init(format: LogFormat, filter: &str) {
    let (filter, bad) = match EnvFilter::try_new(filter) {
        Ok(f) => (f, None),
        Err(e) => (EnvFilter::new("info"), Some(e.to_string())),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
        LogFormat::Pretty => builder.try_init(),
    };
    if let Some(e) = bad {
        tracing::warn!(error = %e, "RUST_LOG is invalid; logging at info");
    }
}
