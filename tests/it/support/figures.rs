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

/// CPU time used so far by every process on the machine, by command name (the
/// kernel's `comm`, at most 15 bytes), in clock ticks (`/proc/PID/stat`'s utime +
/// stime; a process that ended is not counted). Two snapshots around a phase give what
/// each kind of process spent in it: [`cpu_spent`].
pub fn cpu_by_command() -> std::collections::BTreeMap<String, u64> {
    let mut by = std::collections::BTreeMap::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return by;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // `PID (comm) state ppid …`: the name may hold spaces and parentheses.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let comm = stat.get(open + 1..close).unwrap_or_default().to_owned();
        let fields: Vec<&str> = stat
            .get(close + 1..)
            .unwrap_or_default()
            .split_whitespace()
            .collect();
        // Fields 14 and 15 of the line; the 12th and 13th after the state (the 1st here).
        let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok());
        if let (Some(utime), Some(stime)) = (ticks(11), ticks(12)) {
            *by.entry(comm).or_insert(0) += utime + stime;
        }
    }
    by
}

/// What each command spent between two [`cpu_by_command`] snapshots, in milliseconds
/// (100 ticks a second, Linux's `USER_HZ`), largest first, those under 10 ms left out.
pub fn cpu_spent(
    before: &std::collections::BTreeMap<String, u64>,
    after: &std::collections::BTreeMap<String, u64>,
) -> Vec<(String, u64)> {
    let mut spent: Vec<(String, u64)> = after
        .iter()
        .map(|(comm, t)| {
            (
                comm.clone(),
                t.saturating_sub(before.get(comm).copied().unwrap_or(0)) * 10,
            )
        })
        .filter(|(_, ms)| *ms >= 10)
        .collect();
    spent.sort_by_key(|s| std::cmp::Reverse(s.1));
    spent
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
