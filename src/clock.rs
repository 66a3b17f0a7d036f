//! The one clock of threadgate: unix milliseconds from [`Clock::now_ms`]. The
//! application reads the wall clock ([`Clock::system`]); a test hands in its own
//! ([`Clock::fixed`], [`Clock::from_fn`]: a clock it moves by hand) through
//! `app::Overrides::clock`, so a deadline (an approval's ttl, an outbox's backoff, a
//! retention) is tested without waiting real time.
//!
//! A leaf: it imports nothing of threadgate.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// `d` in whole milliseconds, as the clock counts them; a span too long for an `i64`
/// (hundreds of millions of years) reads as `i64::MAX`.
pub fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// `d` in whole milliseconds for a log field or a wire value; saturates at `u64::MAX`.
pub fn ms_u64(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The current time in unix milliseconds. Cheap to clone; every clone reads the same
/// source.
#[derive(Clone)]
pub struct Clock(Arc<dyn Fn() -> i64 + Send + Sync>);

impl Clock {
    /// The wall clock.
    pub fn system() -> Clock {
        Clock::from_fn(|| chrono::Utc::now().timestamp_millis())
    }

    /// A clock that always reads `ms`.
    pub fn fixed(ms: i64) -> Clock {
        Clock::from_fn(move || ms)
    }

    /// A clock reading `now` (a test's clock that it moves by hand).
    pub fn from_fn(now: impl Fn() -> i64 + Send + Sync + 'static) -> Clock {
        Clock(Arc::new(now))
    }

    /// Now, in unix milliseconds.
    pub fn now_ms(&self) -> i64 {
        (self.0)()
    }
}

impl Default for Clock {
    /// The wall clock.
    fn default() -> Clock {
        Clock::system()
    }
}

impl fmt::Debug for Clock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Clock").field(&self.now_ms()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicI64, Ordering};

    #[test]
    fn a_span_is_whole_milliseconds_and_saturates() {
        assert_eq!(ms(Duration::from_micros(2_999)), 2);
        assert_eq!(ms_u64(Duration::from_secs(3)), 3_000);
        assert_eq!(ms(Duration::MAX), i64::MAX);
        assert_eq!(ms_u64(Duration::MAX), u64::MAX);
    }

    #[test]
    fn every_clone_reads_the_same_source() {
        let now = Arc::new(AtomicI64::new(1_000));
        let moved = now.clone();
        let clock = Clock::from_fn(move || moved.load(Ordering::SeqCst));
        let copy = clock.clone();
        now.store(5_000, Ordering::SeqCst);
        assert_eq!((clock.now_ms(), copy.now_ms()), (5_000, 5_000));
        assert_eq!(Clock::fixed(42).now_ms(), 42);
    }

    #[test]
    fn the_system_clock_reads_the_wall_clock() {
        let before = chrono::Utc::now().timestamp_millis();
        let read = Clock::system().now_ms();
        assert!(read >= before, "{read} < {before}");
    }
}
