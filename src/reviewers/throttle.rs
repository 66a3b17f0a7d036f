//! A throttle on failed sign-ins and failed credentials, per key (a reviewer's name
//! from one client address, a client address, a reviewer's name from anywhere).
//!
//! Two rules, each refusing an attempt *before* any hash is computed, so a guesser
//! spends nothing of the server's:
//! - a **lock**: after [`Throttle::max_failures`] failures within the window, a key is
//!   locked for the window. Sign-ins lock the pair (name, client address) and the client
//!   address, so guesses from one address lock that address, never the name elsewhere.
//! - a **back-off**: past the same number of failures within the window, each further
//!   failure makes the key wait a delay before its next attempt, doubling from
//!   [`BACKOFF_BASE_MS`] up to the configured most ([`DEFAULT_BACKOFF_MAX_MS`]).
//!   Sign-ins back off per name from anywhere: a guesser with many addresses gets at
//!   most one guess per delay, and the right password is never kept out longer than
//!   that delay by anyone else's guesses (issue 17 item 5: a lock per name let anyone
//!   lock a reviewer out for 15 minutes).
//!
//! Client addresses are keyed as the listener counts them ([`client_key`]: an IPv6 /64
//! is one address). The table is capped; when it is full of live entries, new keys are
//! refused too (fails closed) until entries age out.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;

use crate::server::address_key;

/// Failures allowed within the window before a key is locked or starts backing off.
pub const MAX_FAILURES: u32 = 5;
/// The window failures are counted in, and how long a locked key stays locked.
pub const WINDOW_MS: i64 = 15 * 60 * 1000;
/// The most keys tracked at once.
pub const MAX_KEYS: usize = 100_000;
/// The first back-off delay.
pub const BACKOFF_BASE_MS: i64 = 1000;
/// The longest back-off delay by default (`[server] sign_in_backoff_max`).
pub const DEFAULT_BACKOFF_MAX_MS: i64 = 15 * 1000;

/// The throttle key of a client address: IPv4 as is, IPv6 by its /64, as the listener
/// counts connections ([`address_key`]).
pub fn client_key(ip: IpAddr) -> String {
    format!("addr:{}", address_key(ip))
}

/// The throttle key of a request's client (see [`client_key`]); `addr:unknown` when the
/// listener does not record peers.
pub fn request_client_key(ext: &axum::http::Extensions) -> String {
    match ext.get::<axum::extract::ConnectInfo<std::net::SocketAddr>>() {
        Some(axum::extract::ConnectInfo(addr)) => client_key(addr.ip()),
        None => "addr:unknown".to_owned(),
    }
}

/// The keys one sign-in attempt counts against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignInKeys {
    /// The name from this client address: locked.
    pair: String,
    /// The client address, whatever the name: locked.
    address: String,
    /// The name from anywhere: backs off.
    name: String,
}

impl SignInKeys {
    /// The keys of a sign-in as `name` from the client whose key is `client` (see
    /// [`client_key`]).
    pub fn new(name: &str, client: &str) -> SignInKeys {
        let name = name.to_lowercase();
        SignInKeys {
            pair: format!("pair:{name}|{client}"),
            address: client.to_owned(),
            name: format!("name:{name}"),
        }
    }
}

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
    backoff_max_ms: i64,
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
            backoff_max_ms: DEFAULT_BACKOFF_MAX_MS,
        }
    }

    /// The same throttle with back-off delays of at most `max_ms`.
    pub fn with_backoff_max(mut self, max_ms: i64) -> Throttle {
        self.backoff_max_ms = max_ms.max(0);
        self
    }

    /// Failures allowed before a key is locked.
    pub fn max_failures(&self) -> u32 {
        self.max_failures
    }

    /// The longest back-off delay.
    pub fn backoff_max_ms(&self) -> i64 {
        self.backoff_max_ms
    }

    /// `Err(seconds to wait)` when any of `keys` is locked or backing off at `now_ms`.
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

    /// `Err(seconds to wait)` when a sign-in with `keys` is refused at `now_ms`.
    pub fn check_sign_in(&self, keys: &SignInKeys, now_ms: i64) -> Result<(), u64> {
        self.check(&[&keys.pair, &keys.address, &keys.name], now_ms)
    }

    /// Records a failed sign-in: the pair and the address towards their lock, the name
    /// towards its back-off.
    pub fn fail_sign_in(&self, keys: &SignInKeys, now_ms: i64) {
        self.record(&[&keys.pair, &keys.address], now_ms, Rule::Lock);
        self.record(&[&keys.name], now_ms, Rule::BackOff);
    }

    /// Forgets the failures of a sign-in's name from its address (it succeeded). The
    /// name's back-off stays: it ages out with its window.
    pub fn clear_sign_in(&self, keys: &SignInKeys) {
        self.clear(&keys.pair);
    }

    /// Records a failure against each of `keys`, towards their lock.
    pub fn fail(&self, keys: &[&str], now_ms: i64) {
        self.record(keys, now_ms, Rule::Lock);
    }

    /// Forgets the failures of `key`.
    pub fn clear(&self, key: &str) {
        self.entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }

    fn record(&self, keys: &[&str], now_ms: i64, rule: Rule) {
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
            if now_ms - e.first_ms >= self.window_ms && e.locked_until_ms <= now_ms {
                *e = Entry {
                    failures: 0,
                    first_ms: now_ms,
                    locked_until_ms: 0,
                };
            }
            e.failures = e.failures.saturating_add(1);
            if e.failures < self.max_failures {
                continue;
            }
            e.locked_until_ms = match rule {
                Rule::Lock => now_ms + self.window_ms,
                Rule::BackOff => now_ms + self.backoff_ms(e.failures),
            };
        }
    }

    /// The delay after the `failures`th failure: from [`BACKOFF_BASE_MS`] at the limit,
    /// doubling with each further one, never more than the configured most.
    fn backoff_ms(&self, failures: u32) -> i64 {
        let doublings = (failures - self.max_failures).min(30);
        (BACKOFF_BASE_MS << doublings).min(self.backoff_max_ms)
    }
}

/// What a key's failures lead to.
#[derive(Debug, Clone, Copy)]
enum Rule {
    /// Locked for the window.
    Lock,
    /// A delay before the next attempt.
    BackOff,
}

#[cfg(test)]
#[path = "throttle_tests.rs"]
mod tests;
