//! The one retry policy of threadgate, on `backon`: every backoff (a connector's rate
//! limit, the model proxy's upstream retries, the note, thread event and state label
//! outboxes, a session's failed start) is a [`Schedule`] here, and every retry loop in
//! the process is `backon`'s. What may be retried stays with each caller: a rate-limited
//! request did not happen; a call whose outcome is unknown on a provider without
//! idempotency keys is never sent again (`needs_check`); an outbox looks for what an
//! earlier attempt may have left before it sends again. None of these schedules has
//! jitter.
//!
//! A leaf: it imports nothing of threadgate.

use std::time::Duration;

use backon::{BackoffBuilder as _, ExponentialBuilder};

/// How long an item of an outbox (notes, thread events, state labels) waits after its
/// first failure (then doubling, at most ten minutes).
pub const OUTBOX: Schedule = Schedule::doubling(Duration::from_secs(2), Duration::from_secs(600));

/// How long a session whose start failed waits before it is started again (then
/// doubling, at most five minutes).
pub const SESSION_START: Schedule =
    Schedule::doubling(Duration::from_secs(1), Duration::from_secs(300));

/// A doubling backoff without jitter: the first wait, then twice the previous one, never
/// more than the cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schedule {
    first: Duration,
    max: Duration,
}

impl Schedule {
    /// Waits `first`, then doubling, at most `max`.
    pub const fn doubling(first: Duration, max: Duration) -> Schedule {
        Schedule { first, max }
    }

    /// The schedule as a `backon` builder without a bound on retries (the caller sets
    /// one with `with_max_times`).
    pub fn builder(self) -> ExponentialBuilder {
        ExponentialBuilder::default()
            .with_min_delay(self.first)
            .with_max_delay(self.max)
            .with_factor(2.0)
            .without_max_times()
    }

    /// The wait after the first `failed` retries already failed: [`Schedule::doubling`]'s
    /// `first` for 0, twice that for 1, and so on up to the cap.
    pub fn wait(self, failed: u32) -> Duration {
        // Past 64 doublings every schedule is at its cap.
        let step = usize::try_from(failed.min(64)).unwrap_or(64);
        self.builder().build().nth(step).map_or(self.max, whole_ms)
    }

    /// When (unix ms) an item that failed `attempts` times so far is tried again, from
    /// `now_ms`: the persisted form of [`Schedule::wait`], for the outboxes and the
    /// supervisor, whose retries outlive the process.
    pub fn next_at_ms(self, now_ms: i64, attempts: i64) -> i64 {
        let failed = u32::try_from(attempts.max(0)).unwrap_or(u32::MAX);
        let wait = i64::try_from(self.wait(failed).as_millis()).unwrap_or(i64::MAX);
        now_ms.saturating_add(wait)
    }
}

/// `wait` to the nearest millisecond: `backon` doubles in `f32`, which leaves a few
/// nanoseconds of noise on waits that are whole milliseconds.
pub fn whole_ms(wait: Duration) -> Duration {
    let ms = wait.as_nanos().saturating_add(500_000) / 1_000_000;
    Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(schedule: Schedule, expected_ms: &[u64]) {
        let waits: Vec<u64> = (0..u32::try_from(expected_ms.len()).unwrap())
            .map(|failed| u64::try_from(schedule.wait(failed).as_millis()).unwrap())
            .collect();
        assert_eq!(waits, expected_ms);
    }

    #[test]
    fn the_outbox_waits_two_seconds_doubling_up_to_ten_minutes() {
        check(
            OUTBOX,
            &[
                2_000, 4_000, 8_000, 16_000, 32_000, 64_000, 128_000, 256_000, 512_000, 600_000,
                600_000,
            ],
        );
        assert_eq!(OUTBOX.next_at_ms(1_000, 0), 3_000);
        assert_eq!(OUTBOX.next_at_ms(1_000, 3), 17_000);
        // A negative count (never stored, but a column can hold one) is a first failure.
        assert_eq!(OUTBOX.next_at_ms(1_000, -4), 3_000);
        assert_eq!(OUTBOX.next_at_ms(0, i64::MAX), 600_000);
    }

    #[test]
    fn a_failed_start_waits_a_second_doubling_up_to_five_minutes() {
        check(
            SESSION_START,
            &[
                1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 64_000, 128_000, 256_000, 300_000,
                300_000,
            ],
        );
    }

    #[test]
    fn small_and_odd_waits_stay_whole_milliseconds() {
        let quick = Schedule::doubling(Duration::from_millis(5), Duration::from_millis(5_120));
        check(
            quick,
            &[5, 10, 20, 40, 80, 160, 320, 640, 1_280, 2_560, 5_120, 5_120],
        );
        let odd = Schedule::doubling(Duration::from_millis(300), Duration::from_secs(30));
        check(odd, &[300, 600, 1_200, 2_400, 4_800, 9_600, 19_200, 30_000]);
    }

    #[test]
    fn the_schedule_is_the_same_every_time() {
        // No jitter: a retry's wait depends on its count alone.
        for failed in 0..12 {
            assert_eq!(OUTBOX.wait(failed), OUTBOX.wait(failed));
        }
        assert_eq!(OUTBOX.wait(u32::MAX), Duration::from_secs(600));
    }
}
