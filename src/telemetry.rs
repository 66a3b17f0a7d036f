//! Logging, set up once per process: human-readable lines on stderr, filtered by
//! `RUST_LOG` (default `info`), or JSON lines with `THREADGATE_LOG_FORMAT=json`.
//! Human-readable lines carry ANSI colours only when stderr is a terminal (and
//! `NO_COLOR` is not set): a log file or a pipe gets plain text.
//!
//! Every line carries the fields of the spans it happened in: `thread_id`,
//! `session_id` and `execution_id` along the webhook path (`webhook_intake`,
//! `supervisor`, `session_start`) and the call path (`gate`, `execute`,
//! `connector_call`), so one grep for an id shows a call's life. In JSON each line has
//! the innermost span under `span` and the whole chain under `spans`.

use std::io::IsTerminal as _;

use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::{EnvFilter, Layer as _};

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

/// The subscriber [`init`] installs: lines in `format` to `writer`, filtered by
/// `filter`, with their spans' fields.
pub fn subscriber<W>(
    format: LogFormat,
    filter: EnvFilter,
    writer: W,
    colours: bool,
) -> impl tracing::Subscriber + Send + Sync
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let lines = match format {
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .with_ansi(false)
            .with_writer(writer)
            .with_filter(filter)
            .boxed(),
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_ansi(colours)
            .with_writer(writer)
            .with_filter(filter)
            .boxed(),
    };
    tracing_subscriber::registry().with(lines)
}

/// Installs the global subscriber; a second call does nothing. Fails on an unknown
/// `THREADGATE_LOG_FORMAT`.
pub fn init() -> Result<(), String> {
    let format = LogFormat::parse(std::env::var("THREADGATE_LOG_FORMAT").ok().as_deref())?;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let colours = use_colours(
        std::io::stderr().is_terminal(),
        std::env::var("NO_COLOR").ok().as_deref(),
    );
    let _ = tracing::subscriber::set_global_default(subscriber(
        format,
        filter,
        std::io::stderr,
        colours,
    ));
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

    #[derive(Clone, Default)]
    struct Buffer(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("buffer").extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn json_lines_carry_the_ids_of_their_spans() {
        let buffer = Buffer::default();
        let sink = buffer.clone();
        let sub = subscriber(
            LogFormat::Json,
            EnvFilter::new("info"),
            move || sink.clone(),
            false,
        );
        tracing::subscriber::with_default(sub, || {
            let gate = tracing::info_span!("gate", thread_id = "th_01", session_id = "s_01");
            let _g = gate.enter();
            let exec = tracing::info_span!("execute", execution_id = "ex_01");
            let _e = exec.enter();
            tracing::info!(provider = "stripe", "provider answered");
            tracing::debug!("filtered out");
        });
        let text = String::from_utf8(buffer.0.lock().expect("buffer").clone()).expect("utf8");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 1, "{text}");
        let line: serde_json::Value = serde_json::from_str(lines[0]).expect("a JSON line");
        assert_eq!(line["fields"]["message"], "provider answered", "{line}");
        assert_eq!(line["span"]["execution_id"], "ex_01", "{line}");
        assert_eq!(line["spans"][0]["thread_id"], "th_01", "{line}");
        assert_eq!(line["spans"][0]["session_id"], "s_01", "{line}");
    }
}
