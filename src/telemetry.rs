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
//!
//! Dependencies are capped whatever `RUST_LOG` asks ([`DEPENDENCY_CAPS`]): at debug and
//! trace they log raw requests and answers (rmcp every JSON-RPC message, the HTTP
//! stacks their URLs and frames, bollard its calls), which carry tool arguments,
//! results, customers' emails and secrets. Every line goes through [`lines`], so the
//! cap holds for every subscriber threadgate builds.

use std::io::IsTerminal as _;

use tracing::level_filters::LevelFilter;
use tracing_subscriber::filter::{FilterExt as _, Targets};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::{EnvFilter, Layer as _, Registry};

/// The most any target outside threadgate's own crates (`threadgate*`) logs, whatever
/// `RUST_LOG` asks: warnings and errors, which say what failed without the payloads.
pub const DEPENDENCY_CAP: LevelFilter = LevelFilter::WARN;

/// Dependencies capped lower than [`DEPENDENCY_CAP`]: rmcp's warnings quote what a
/// client sent (a refused `Host` header, a handler's error data), so only its errors
/// are kept.
pub const DEPENDENCY_CAPS: &[(&str, LevelFilter)] = &[("rmcp", LevelFilter::ERROR)];

/// The cap on every target: threadgate's own crates as `RUST_LOG` says, every other
/// at [`DEPENDENCY_CAP`] or its entry of [`DEPENDENCY_CAPS`].
pub fn dependency_caps() -> Targets {
    DEPENDENCY_CAPS.iter().fold(
        Targets::new()
            .with_default(DEPENDENCY_CAP)
            .with_target("threadgate", LevelFilter::TRACE),
        |targets, (target, cap)| targets.with_target(*target, *cap),
    )
}

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

/// The log lines: `format` to `writer`, filtered by `filter` within the
/// [`dependency_caps`], with their spans' fields.
fn lines<W>(
    format: LogFormat,
    filter: EnvFilter,
    writer: W,
    colours: bool,
) -> Box<dyn tracing_subscriber::Layer<Registry> + Send + Sync>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let filter = filter.and(dependency_caps());
    match format {
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
    }
}

/// The subscriber [`init`] installs: lines in `format` to `writer`, filtered by
/// `filter` within the [`dependency_caps`], with their spans' fields.
pub fn subscriber<W>(
    format: LogFormat,
    filter: EnvFilter,
    writer: W,
    colours: bool,
) -> impl tracing::Subscriber + Send + Sync
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    tracing_subscriber::registry().with(lines(format, filter, writer, colours))
}

/// Stderr lines as the environment asks (`THREADGATE_LOG_FORMAT`, `RUST_LOG`,
/// `NO_COLOR`).
fn stderr_lines() -> Result<Box<dyn tracing_subscriber::Layer<Registry> + Send + Sync>, String> {
    let format = LogFormat::parse(std::env::var("THREADGATE_LOG_FORMAT").ok().as_deref())?;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let colours = use_colours(
        std::io::stderr().is_terminal(),
        std::env::var("NO_COLOR").ok().as_deref(),
    );
    Ok(lines(format, filter, std::io::stderr, colours))
}

/// Installs the global subscriber; a second call does nothing. Fails on an unknown
/// `THREADGATE_LOG_FORMAT`.
pub fn init() -> Result<(), String> {
    let _ = tracing::subscriber::set_global_default(
        tracing_subscriber::registry().with(stderr_lines()?),
    );
    Ok(())
}

/// Keeps the span export running; flushes what is left and stops it when dropped.
#[must_use = "dropping the guard stops the span export"]
pub struct ExportGuard {
    #[cfg(feature = "otlp")]
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Drop for ExportGuard {
    fn drop(&mut self) {
        #[cfg(feature = "otlp")]
        if let Some(provider) = self.provider.take()
            && let Err(e) = provider.shutdown()
        {
            eprintln!("cannot flush the last spans to the OTLP collector: {e}");
        }
    }
}

/// [`init`] for `serve`: also exports threadgate's spans to the OpenTelemetry
/// collector at `otlp_endpoint` (its OTLP/HTTP base, e.g. `http://127.0.0.1:4318`)
/// when one is given. A build without the `otlp` feature refuses an endpoint rather
/// than silently exporting nothing.
pub fn init_serving(otlp_endpoint: Option<&str>) -> Result<ExportGuard, String> {
    let lines = stderr_lines()?;
    #[cfg(feature = "otlp")]
    {
        let (export, provider) = match otlp_endpoint {
            Some(endpoint) => {
                let (layer, provider) = otlp::layer(endpoint)?;
                (Some(layer), Some(provider))
            }
            None => (None, None),
        };
        let installed = tracing_subscriber::registry().with(lines).with(export);
        let _ = tracing::subscriber::set_global_default(installed);
        Ok(ExportGuard { provider })
    }
    #[cfg(not(feature = "otlp"))]
    {
        if let Some(endpoint) = otlp_endpoint {
            return Err(format!(
                "telemetry.otlp_endpoint (THREADGATE_OTLP_ENDPOINT) is {endpoint:?}, but this \
                 build has no OTLP export: build threadgate with --features otlp"
            ));
        }
        let _ = tracing::subscriber::set_global_default(tracing_subscriber::registry().with(lines));
        Ok(ExportGuard {})
    }
}

/// OTLP/HTTP export of threadgate's own spans (target `threadgate…`, info and up).
#[cfg(feature = "otlp")]
mod otlp {
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_otlp::WithExportConfig as _;
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::filter::Targets;

    /// The export layer for a subscriber `S`, and the provider that batches and sends.
    pub(crate) fn layer<S>(
        endpoint: &str,
    ) -> Result<
        (
            Box<dyn tracing_subscriber::Layer<S> + Send + Sync>,
            SdkTracerProvider,
        ),
        String,
    >
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a> + Send + Sync,
    {
        let traces = format!("{}/v1/traces", endpoint.trim_end_matches('/'));
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(traces)
            .build()
            .map_err(|e| format!("telemetry.otlp_endpoint {endpoint:?}: {e}"))?;
        let resource = opentelemetry_sdk::Resource::builder()
            .with_service_name("threadgate")
            .build();
        let provider = SdkTracerProvider::builder()
            .with_resource(resource)
            .with_batch_exporter(exporter)
            .build();
        let ours = Targets::new().with_target("threadgate", tracing::Level::INFO);
        let layer = tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("threadgate"))
            .with_filter(ours)
            .boxed();
        Ok((layer, provider))
    }
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

    /// Issue 17, item 9: at `RUST_LOG=trace` threadgate's own lines are all there, while
    /// a dependency's debug and trace lines (where rmcp and the HTTP stacks log raw
    /// requests and answers) and rmcp's warnings never are.
    #[test]
    fn dependencies_are_capped_whatever_rust_log_asks() {
        let buffer = Buffer::default();
        let sink = buffer.clone();
        let directives = "trace,rmcp=trace,hyper=trace,h2=trace,reqwest=trace,bollard=trace";
        let sub = subscriber(
            LogFormat::Text,
            EnvFilter::new(directives),
            move || sink.clone(),
            false,
        );
        tracing::subscriber::with_default(sub, || {
            tracing::trace!(target: "threadgate::gateway", "ours at trace");
            tracing::trace!(target: "threadgate_policy", "our crate at trace");
            tracing::debug!(target: "rmcp::service", "payload-debug rmcp");
            tracing::trace!(target: "rmcp::service", "payload-trace rmcp");
            tracing::debug!(target: "hyper::proto", "payload-debug hyper");
            tracing::trace!(target: "h2::codec", "payload-trace h2");
            tracing::debug!(target: "reqwest::connect", "payload-debug reqwest");
            tracing::debug!(target: "bollard::docker", "payload-debug bollard");
            tracing::info!(target: "tower_http::trace", "payload-info tower_http");
            tracing::warn!(target: "rmcp::transport", "payload-warn rmcp");
            tracing::error!(target: "rmcp::transport", "rmcp error kept");
            tracing::warn!(target: "hyper_util::client", "hyper warning kept");
        });
        let text = String::from_utf8(buffer.0.lock().expect("buffer").clone()).expect("utf8");
        assert!(text.contains("ours at trace"), "{text}");
        assert!(text.contains("our crate at trace"), "{text}");
        assert!(text.contains("rmcp error kept"), "{text}");
        assert!(text.contains("hyper warning kept"), "{text}");
        assert!(!text.contains("payload-"), "{text}");
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
