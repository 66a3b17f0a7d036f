//! A clock a test moves by hand, handed to the application as its injected clock
//! (`Overrides::clock`), so a test of a deadline (an approval's ttl) does not wait real
//! seconds.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use threadgate::clock::Clock;

/// Wall-clock time plus an offset the test advances.
#[derive(Clone, Default)]
pub struct TestClock {
    offset_ms: Arc<AtomicI64>,
}

impl TestClock {
    /// A clock reading the real time until advanced.
    pub fn new() -> TestClock {
        TestClock::default()
    }

    /// Moves this clock (and every reader of it) forward by `by`.
    pub fn advance(&self, by: Duration) {
        let ms = i64::try_from(by.as_millis()).expect("a test advances by less than ages");
        self.offset_ms.fetch_add(ms, Ordering::SeqCst);
    }

    /// The clock to hand to the application.
    pub fn clock(&self) -> Clock {
        let offset = self.offset_ms.clone();
        Clock::from_fn(move || {
            chrono::Utc::now().timestamp_millis() + offset.load(Ordering::SeqCst)
        })
    }
}
