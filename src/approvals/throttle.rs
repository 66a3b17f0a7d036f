//! A throttle on failed sign-ins and failed credentials, per key (a reviewer's name, a
//! client address).
//!
//! After [`Throttle::max_failures`] failures within the window, the key is locked for
//! the lock time: every attempt on it is refused *before* any hash is computed, so a
//! guesser spends nothing of the server's. The table is capped; when it is full of live
//! entries, new keys are refused too (fails closed) until entries age out.

use std::collections::HashMap;
use std::sync::Mutex;

/// Failures allowed within the window before a key is locked.
pub const MAX_FAILURES: u32 = 5;
/// The window failures are counted in, and how long a locked key stays locked.
pub const WINDOW_MS: i64 = 15 * 60 * 1000;
/// The most keys tracked at once.
pub const MAX_KEYS: usize = 100_000;

#[derive(Debug, Clone, Copy)]
struct Entry {
    failures: u32,
    first_ms: i64,
    locked_until_ms: i64,
}

/// Failed attempts per key.
#[derive(Debug)]
pub struct Throttle {
    entries: Mutex<HashMap<String, Entry>>,
    max_failures: u32,
    window_ms: i64,
    max_keys: usize,
}

impl Default for Throttle {
    fn default() -> Self {
        Throttle::new(MAX_FAILURES, WINDOW_MS, MAX_KEYS)
    }
}

impl Throttle {
    /// A throttle locking a key for `window_ms` after `max_failures` failures within it.
    pub fn new(max_failures: u32, window_ms: i64, max_keys: usize) -> Throttle {
        Throttle {
            entries: Mutex::new(HashMap::new()),
            max_failures: max_failures.max(1),
            window_ms,
            max_keys,
        }
    }

    /// Failures allowed before a key is locked.
    pub fn max_failures(&self) -> u32 {
        self.max_failures
    }

    /// `Err(seconds to wait)` when any of `keys` is locked at `now_ms`.
    pub fn check(&self, keys: &[&str], now_ms: i64) -> Result<(), u64> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let mut wait = 0i64;
        for key in keys {
            match entries.get(*key) {
                Some(e) if e.locked_until_ms > now_ms => {
                    wait = wait.max(e.locked_until_ms - now_ms);
                }
                None if entries.len() >= self.max_keys => wait = wait.max(self.window_ms),
                _ => {}
            }
        }
        if wait > 0 {
            Err(u64::try_from(wait).unwrap_or(0).div_ceil(1000))
        } else {
            Ok(())
        }
    }

    /// Records a failure against each of `keys`.
    pub fn fail(&self, keys: &[&str], now_ms: i64) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if entries.len() >= self.max_keys {
            let window = self.window_ms;
            entries.retain(|_, e| e.locked_until_ms > now_ms || now_ms - e.first_ms < window);
        }
        for key in keys {
            if !entries.contains_key(*key) && entries.len() >= self.max_keys {
                continue;
            }
            let e = entries.entry((*key).to_owned()).or_insert(Entry {
                failures: 0,
                first_ms: now_ms,
                locked_until_ms: 0,
            });
            if now_ms - e.first_ms >= self.window_ms {
                *e = Entry {
                    failures: 0,
                    first_ms: now_ms,
                    locked_until_ms: 0,
                };
            }
            e.failures += 1;
            if e.failures >= self.max_failures {
                e.locked_until_ms = now_ms + self.window_ms;
            }
        }
    }

    /// Forgets the failures of `key` (a successful sign-in of that name).
    pub fn clear(&self, key: &str) {
        self.entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn five_failures_lock_the_key_until_the_window_passes() {
        let t = Throttle::new(5, 1000, 10);
        for i in 0..4 {
            t.fail(&["name:alice"], i);
            assert_eq!(t.check(&["name:alice"], i), Ok(()));
        }
        t.fail(&["name:alice"], 4);
        assert_eq!(t.check(&["name:alice"], 5), Err(1));
        assert_eq!(t.check(&["name:bob"], 5), Ok(()));
        assert_eq!(t.check(&["name:bob", "name:alice"], 5), Err(1));
        assert_eq!(t.check(&["name:alice"], 1004), Ok(()));
    }

    #[test]
    fn a_full_table_refuses_new_keys() {
        let t = Throttle::new(5, 1000, 2);
        t.fail(&["a", "b"], 0);
        assert!(t.check(&["c"], 1).is_err());
        assert_eq!(t.check(&["a"], 1), Ok(()));
        // Once the entries age out, they are pruned and new keys are tracked again.
        t.fail(&["c"], 5000);
        assert_eq!(t.check(&["c"], 5001), Ok(()));
    }
}
