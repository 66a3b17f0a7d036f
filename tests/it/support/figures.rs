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

/// CPU time used so far by every process on the machine, in clock ticks
/// (`/proc/PID/stat`'s utime + stime), by process: (pid, start time) → (command name,
/// the kernel's `comm`, at most 15 bytes; ticks). Two snapshots around a phase give what
/// each kind of process spent in it: [`cpu_spent`].
pub fn cpu_by_command() -> std::collections::BTreeMap<(u32, u64), (String, u64)> {
    let mut by = std::collections::BTreeMap::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return by;
    };
    for entry in entries.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
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
        // Fields 14, 15 and 22 of the line (utime, stime, starttime): the 12th, 13th
        // and 20th after the state, the 1st here.
        let number = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok());
        if let (Some(utime), Some(stime), Some(start)) = (number(11), number(12), number(19)) {
            by.insert((pid, start), (comm, utime + stime));
        }
    }
    by
}

/// What each command spent between two [`cpu_by_command`] snapshots, in milliseconds
/// (100 ticks a second, Linux's `USER_HZ`), largest first, those under 10 ms left out.
/// A process started in between counts whole; one that ended in between is not seen
/// (a process is its pid and start time, so a reused pid is another process).
pub fn cpu_spent(
    before: &std::collections::BTreeMap<(u32, u64), (String, u64)>,
    after: &std::collections::BTreeMap<(u32, u64), (String, u64)>,
) -> Vec<(String, u64)> {
    let mut by: std::collections::BTreeMap<String, u64> = std::collections::BTreeMap::new();
    for (process, (comm, ticks)) in after {
        let earlier = before.get(process).map_or(0, |(_, t)| *t);
        *by.entry(comm.clone()).or_insert(0) += ticks.saturating_sub(earlier) * 10;
    }
    let mut spent: Vec<(String, u64)> = by.into_iter().filter(|(_, ms)| *ms >= 10).collect();
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

/// A snapshot sees this process; what a phase spent is counted per process, so one
/// that ended in between takes nothing from another of its name, and one that started
/// in between counts whole.
#[test]
fn cpu_is_counted_per_process_not_per_name() {
    let now = cpu_by_command();
    let me = std::process::id();
    assert!(
        now.keys().any(|(pid, _)| *pid == me),
        "this process is in the snapshot"
    );
    let snapshot = |entries: &[((u32, u64), &str, u64)]| {
        entries
            .iter()
            .map(|(key, comm, ticks)| (*key, ((*comm).to_owned(), *ticks)))
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    // postgres 1 ends after 500 ticks; postgres 2 goes from 10 to 40; postgres 3 (the
    // pid of 1, started later) starts and spends 7; python from 0 to 100.
    let before = snapshot(&[
        ((1, 5), "postgres", 500),
        ((2, 6), "postgres", 10),
        ((9, 1), "python", 0),
    ]);
    let after = snapshot(&[
        ((1, 80), "postgres", 7),
        ((2, 6), "postgres", 40),
        ((9, 1), "python", 100),
    ]);
    assert_eq!(
        cpu_spent(&before, &after),
        vec![("python".to_owned(), 1000), ("postgres".to_owned(), 370)]
    );
}
