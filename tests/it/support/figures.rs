//! What the benches (`benches/*.rs`, which mount this harness) report a series of
//! latencies with: the median and p99 of a sample, in microseconds, and the load
//! average it was measured under.

use std::time::Duration;

/// The `p` quantile (0 to 1) of a sorted, non-empty sample: the nearest rank.
#[expect(
    clippy::cast_possible_truncation,
    reason = "a rank in a sorted sample, rounded and within its length"
)]
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len().saturating_sub(1)) as f64 * p).round() as usize;
    sorted.get(i).copied().unwrap_or_default()
}

/// `d` in microseconds.
pub fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// The 1, 5 and 15 minute load averages (`/proc/loadavg`), or `unknown`.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(", "))
        .unwrap_or_else(|_| "unknown".into())
}

/// Latencies of one kind of call, sorted when reported.
pub struct Series {
    pub label: &'static str,
    pub times: Vec<Duration>,
}

impl Series {
    pub fn new(label: &'static str, n: usize) -> Series {
        Series {
            label,
            times: Vec::with_capacity(n),
        }
    }

    /// Median and p99, in microseconds.
    pub fn median_p99(&mut self) -> (f64, f64) {
        self.times.sort();
        (
            micros(percentile(&self.times, 0.5)),
            micros(percentile(&self.times, 0.99)),
        )
    }

    /// One line: the label, the median and the p99.
    pub fn print(&mut self) {
        let (p50, p99) = self.median_p99();
        println!(
            "  {:<44} median {p50:8.0} us   p99 {p99:8.0} us",
            self.label
        );
    }
}
