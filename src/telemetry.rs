//! The one tracing setup: `RUST_LOG` filter (default `info`), pretty or JSON lines on stderr.
//! Field names are dotted and shared across modules (`lark.event_id`, `ssh.target`, …).

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Installs the global subscriber; a second call is a no-op.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
        LogFormat::Pretty => builder.try_init(),
    };
}
