//! Logging, set up once per process: human-readable lines on stderr, filtered by
//! `RUST_LOG` (default `info`), or JSON lines with `THREADGATE_LOG_FORMAT=json`.
//! Human-readable lines carry ANSI colours only when stderr is a terminal (and
//! `NO_COLOR` is not set): a log file or a pipe gets plain text.

use std::io::IsTerminal as _;

use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// One human-readable line per event.
    Text,
    /// One JSON object per line.
    Json,
}

impl LogFormat {
    /// Reads `THREADGATE_LOG_FORMAT`'s value: unset, empty or `text`, or `json`
    /// (either in any case).
    pub fn parse(value: Option<&str>) -> Result<LogFormat, String> {
        match value.map(|v| v.trim().to_ascii_lowercase()).as_deref() {
            None | Some("") | Some("text") => Ok(LogFormat::Text),
            Some("json") => Ok(LogFormat::Json),
            Some(_) => Err(format!(
                "environment variable THREADGATE_LOG_FORMAT: {:?} is not a log format; use text or json",
                value.unwrap_or_default()
            )),
        }
    }
}

/// Whether human-readable lines get colours: only on a terminal, and never with
/// `NO_COLOR` set.
pub fn use_colours(is_terminal: bool, no_color: Option<&str>) -> bool {
    is_terminal && no_color.is_none_or(str::is_empty)
}

/// Installs the global subscriber; a second call does nothing. Fails on an unknown
/// `THREADGATE_LOG_FORMAT`.
pub fn init() -> Result<(), String> {
    let format = LogFormat::parse(std::env::var("THREADGATE_LOG_FORMAT").ok().as_deref())?;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().with_ansi(false).try_init(),
        LogFormat::Text => {
            let colours = use_colours(
                std::io::stderr().is_terminal(),
                std::env::var("NO_COLOR").ok().as_deref(),
            );
            builder.with_ansi(colours).try_init()
        }
    };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_and_colours() {
        assert_eq!(LogFormat::parse(None), Ok(LogFormat::Text));
        assert_eq!(LogFormat::parse(Some("JSON")), Ok(LogFormat::Json));
        assert_eq!(LogFormat::parse(Some("text")), Ok(LogFormat::Text));
        let error = LogFormat::parse(Some("yaml")).expect_err("unknown");
        assert!(error.contains("THREADGATE_LOG_FORMAT") && error.contains("yaml"));
        assert!(use_colours(true, None));
        assert!(!use_colours(false, None));
        assert!(!use_colours(true, Some("1")));
    }
}
