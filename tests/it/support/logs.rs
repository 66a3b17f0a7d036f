//! Captured logs: one process-wide subscriber, threadgate's own (`telemetry::subscriber`)
//! at `RUST_LOG=trace`, writing every line it lets through into a buffer the tests
//! search: what a server run at the most verbose level would write, dependencies capped
//! as in production. `THREADGATE_E2E_LOGS=/tmp/e2e.log` writes the
//! buffer to a file whenever a [`super::app::TestApp`] stops, for debugging a failure.

use std::sync::{Arc, Mutex, OnceLock};

static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();

struct LogSink(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Installs (once per process) the capturing subscriber. A binary that installed its
/// own subscriber first keeps it, and [`captured_logs`] stays empty.
pub fn capture_logs() {
    LOGS.get_or_init(|| {
        let buffer = Arc::new(Mutex::new(Vec::new()));
        let sink = buffer.clone();
        let subscriber = threadgate::telemetry::subscriber(
            threadgate::telemetry::LogFormat::Text,
            tracing_subscriber::EnvFilter::new("trace"),
            move || LogSink(sink.clone()),
            false,
        );
        let _ = tracing::subscriber::set_global_default(subscriber);
        buffer
    });
}

/// Everything logged so far in this process.
pub fn captured_logs() -> Vec<u8> {
    LOGS.get()
        .map(|b| b.lock().unwrap_or_else(|p| p.into_inner()).clone())
        .unwrap_or_default()
}

/// Everything logged so far, as text.
pub fn captured_text() -> String {
    String::from_utf8_lossy(&captured_logs()).into_owned()
}

/// Writes the captured logs to `$THREADGATE_E2E_LOGS`, when set.
pub fn dump_if_asked() {
    if let Some(path) = std::env::var_os("THREADGATE_E2E_LOGS") {
        let _ = std::fs::write(path, captured_logs());
    }
}
