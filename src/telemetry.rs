//! Logging, set up once per process: human-readable lines on stderr, filtered by
//! `RUST_LOG` (default `info`), or JSON lines with `THREADGATE_LOG_FORMAT=json`.

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber; a second call does nothing.
pub fn init() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let json = std::env::var("THREADGATE_LOG_FORMAT").is_ok_and(|v| v == "json");
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}
