//! Each session's pace of tool calls: a token bucket per session, `[sessions]
//! calls_per_second` refilled up to `calls_burst`. A call that finds no token is
//! refused `rate_limited` before anything is checked, recorded or sent, so an agent
//! that loops on cheap reads cannot spend the providers' shared quotas (a GitHub
//! token's requests an hour, Stripe's and Plain's rate limits, all sessions' alike) or
//! fill the audit with rows as fast as it can send. In memory, per instance: a session
//! is served by the one instance holding its thread's lease. A bucket that has filled
//! up again is the same as none, so the table drops such buckets once it holds many.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::ids::SessionId;

/// Buckets kept before the full ones are dropped.
const PRUNE_AT: usize = 4096;

/// The pace allowed: `per_second` calls a second on average, `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallRate {
    pub per_second: u32,
    pub burst: u32,
}

/// The sessions' buckets under one [`CallRate`].
#[derive(Debug)]
pub struct CallPace {
    rate: CallRate,
    buckets: Mutex<HashMap<SessionId, Bucket>>,
}

/// A session's bucket as the time it would be full again (the generic cell rate
/// algorithm's theoretical arrival time): a call at `now` takes one interval from it,
/// and is let through while that time is at most a burst's worth of intervals ahead.
/// Whole durations, so a token is never a rounding short.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    full_at: Instant,
}

impl CallPace {
    /// Buckets under `rate`; `None` when `per_second` is 0 (no limit).
    pub fn new(rate: CallRate) -> Option<CallPace> {
        (rate.per_second > 0).then(|| CallPace {
            rate: CallRate {
                per_second: rate.per_second,
                burst: rate.burst.max(1),
            },
            buckets: Mutex::default(),
        })
    }

    /// The rate this pace allows.
    pub fn rate(&self) -> CallRate {
        self.rate
    }

    /// The time one call takes of a bucket.
    fn interval(&self) -> Duration {
        Duration::from_secs(1) / self.rate.per_second
    }

    /// How far ahead of now a bucket's time may be for one more call.
    fn tolerance(&self) -> Duration {
        self.interval() * (self.rate.burst - 1)
    }

    /// Takes one of `session`'s tokens at `now`; when there is none, how long until
    /// one is there. A refused call takes nothing.
    pub fn admit(&self, session: &SessionId, now: Instant) -> Result<(), Duration> {
        let (interval, tolerance) = (self.interval(), self.tolerance());
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if buckets.len() >= PRUNE_AT && !buckets.contains_key(session) {
            // A bucket whose time has passed is full: the same as none.
            buckets.retain(|_, b| b.full_at > now);
        }
        let bucket = buckets
            .entry(session.clone())
            .or_insert(Bucket { full_at: now });
        let from = bucket.full_at.max(now);
        let ahead = from.saturating_duration_since(now);
        if ahead > tolerance {
            return Err(ahead - tolerance);
        }
        bucket.full_at = from + interval;
        Ok(())
    }

    /// Buckets held now (tests).
    pub fn len(&self) -> usize {
        self.buckets.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Whether no bucket is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(n: u32) -> SessionId {
        SessionId::parse(format!("sess_{n:026}")).expect("a session id")
    }

    fn pace(per_second: u32, burst: u32) -> CallPace {
        CallPace::new(CallRate { per_second, burst }).expect("a pace")
    }

    #[test]
    fn a_burst_then_the_rate() {
        let pace = pace(2, 3);
        let (a, t0) = (session(1), Instant::now());
        for _ in 0..3 {
            assert_eq!(pace.admit(&a, t0), Ok(()));
        }
        let wait = pace.admit(&a, t0).expect_err("the burst is spent");
        assert_eq!(
            wait,
            Duration::from_millis(500),
            "one token every half second"
        );
        // Half a second later one more; not two.
        let t1 = t0 + Duration::from_millis(500);
        assert_eq!(pace.admit(&a, t1), Ok(()));
        assert!(pace.admit(&a, t1).is_err());
        // Long idle: refilled to the burst, no further.
        let t2 = t1 + Duration::from_secs(60);
        for _ in 0..3 {
            assert_eq!(pace.admit(&a, t2), Ok(()));
        }
        assert!(pace.admit(&a, t2).is_err());
    }

    #[test]
    fn refused_calls_do_not_earn_tokens() {
        let pace = pace(1, 1);
        let (a, t0) = (session(1), Instant::now());
        assert_eq!(pace.admit(&a, t0), Ok(()));
        // A flood of refused calls inside the second does not shorten the wait.
        for ms in [100, 200, 900] {
            let wait = pace
                .admit(&a, t0 + Duration::from_millis(ms))
                .expect_err("still inside the second");
            assert_eq!(wait, Duration::from_millis(1000 - ms));
        }
        assert_eq!(pace.admit(&a, t0 + Duration::from_secs(1)), Ok(()));
    }

    #[test]
    fn sessions_have_buckets_of_their_own() {
        let pace = pace(1, 2);
        let t0 = Instant::now();
        for _ in 0..2 {
            assert_eq!(pace.admit(&session(1), t0), Ok(()));
        }
        assert!(pace.admit(&session(1), t0).is_err());
        assert_eq!(
            pace.admit(&session(2), t0),
            Ok(()),
            "another session is not held back"
        );
    }

    #[test]
    fn full_buckets_are_dropped_once_the_table_is_large() {
        let pace = pace(10, 5);
        let t0 = Instant::now();
        for n in 0..u32::try_from(PRUNE_AT).expect("small") {
            pace.admit(&session(n), t0).expect("a first call");
        }
        assert_eq!(pace.len(), PRUNE_AT);
        // A second later every bucket has filled up again: the next new session's
        // admission drops them all.
        let later = t0 + Duration::from_secs(1);
        pace.admit(&session(1_000_000), later).expect("a call");
        assert_eq!(pace.len(), 1);
    }

    #[test]
    fn no_rate_is_no_limit() {
        assert!(
            CallPace::new(CallRate {
                per_second: 0,
                burst: 10
            })
            .is_none()
        );
    }
}
