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
//! is one address).
//!
//! The failures live in the database (`auth_failures`), so every instance sharing it
//! counts the same keys: guesses split across three instances are throttled as on one.
//! A check is one read; a failure is one write transaction (read, count, upsert), which
//! the single SQLite writer or Postgres' serializable retries make atomic across
//! instances. A key is stored as the SHA-256 of the throttle's namespace and the key,
//! never the name someone typed. The table is capped at [`MAX_KEYS`] live rows: rows
//! past their expiry are pruned before a new key is tracked, and when it is still full
//! new keys are refused too (fails closed) until rows age out, so a flood of made-up
//! names cannot grow it without bound.
//!
//! No per-process cache answers before the database: a lock held in memory here could
//! not see a failure counted on another instance, nor a window that ended.

use std::net::IpAddr;

use sha2::{Digest as _, Sha256};

use crate::server::address_key;
use crate::store::{Conn, Db, OptionalExtension as _, params};

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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    failures: i64,
    first_ms: i64,
    locked_until_ms: i64,
}

/// How long a check waits when the database cannot be read: the attempt is refused
/// (fails closed), briefly.
const UNREADABLE_WAIT_S: u64 = 5;

/// Failed attempts per key, counted in the database under one namespace (the review
/// page's sign-ins and the approvals API's credentials are counted apart).
#[derive(Clone)]
pub struct Throttle {
    db: Db,
    namespace: &'static str,
    max_failures: u32,
    window_ms: i64,
    max_keys: usize,
    backoff_max_ms: i64,
}

impl Throttle {
    /// The default throttle over `db`, its keys counted under `namespace`.
    pub fn new(db: Db, namespace: &'static str) -> Throttle {
        Throttle {
            db,
            namespace,
            max_failures: MAX_FAILURES,
            window_ms: WINDOW_MS,
            max_keys: MAX_KEYS,
            backoff_max_ms: DEFAULT_BACKOFF_MAX_MS,
        }
    }

    /// The same throttle locking a key for `window_ms` after `max_failures` failures
    /// within it, tracking at most `max_keys` live keys.
    pub fn with_limits(mut self, max_failures: u32, window_ms: i64, max_keys: usize) -> Throttle {
        self.max_failures = max_failures.max(1);
        self.window_ms = window_ms;
        self.max_keys = max_keys;
        self
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

    /// The stored form of `key`.
    fn digest(&self, key: &str) -> String {
        let mut h = Sha256::new();
        h.update(self.namespace.as_bytes());
        h.update(b"|");
        h.update(key.as_bytes());
        hex::encode(h.finalize())
    }

    /// `Err(seconds to wait)` when any of `keys` is locked or backing off at `now_ms`
    /// (or when the table is full and one of them is not tracked yet).
    pub async fn check(&self, keys: &[&str], now_ms: i64) -> Result<(), u64> {
        let digests: Vec<String> = keys.iter().map(|k| self.digest(k)).collect();
        let (max_keys, window) = (self.max_keys, self.window_ms);
        let read = self
            .db
            .read(move |c| {
                let mut wait = 0i64;
                let mut untracked = false;
                for d in &digests {
                    match entry(c, d)? {
                        Some(e) if e.locked_until_ms > now_ms => {
                            wait = wait.max(e.locked_until_ms - now_ms);
                        }
                        Some(_) => {}
                        None => untracked = true,
                    }
                }
                if untracked && live_rows(c, now_ms)? >= max_keys {
                    wait = wait.max(window);
                }
                Ok(wait)
            })
            .await;
        match read {
            Ok(0) => Ok(()),
            Ok(wait) => Err(u64::try_from(wait).unwrap_or(0).div_ceil(1000)),
            Err(e) => {
                tracing::error!(error = %e, "cannot read the failure throttle; attempt refused");
                Err(UNREADABLE_WAIT_S)
            }
        }
    }

    /// `Err(seconds to wait)` when a sign-in with `keys` is refused at `now_ms`.
    pub async fn check_sign_in(&self, keys: &SignInKeys, now_ms: i64) -> Result<(), u64> {
        self.check(&[&keys.pair, &keys.address, &keys.name], now_ms)
            .await
    }

    /// Records a failed sign-in: the pair and the address towards their lock, the name
    /// towards its back-off.
    pub async fn fail_sign_in(&self, keys: &SignInKeys, now_ms: i64) {
        self.record(
            &[
                (&keys.pair, Rule::Lock),
                (&keys.address, Rule::Lock),
                (&keys.name, Rule::BackOff),
            ],
            now_ms,
        )
        .await;
    }

    /// Forgets the failures of a sign-in's name from its address (it succeeded). The
    /// name's back-off stays: it ages out with its window.
    pub async fn clear_sign_in(&self, keys: &SignInKeys) {
        self.clear(&keys.pair).await;
    }

    /// Records a failure against each of `keys`, towards their lock.
    pub async fn fail(&self, keys: &[&str], now_ms: i64) {
        let keys: Vec<(&str, Rule)> = keys.iter().map(|k| (*k, Rule::Lock)).collect();
        self.record(&keys, now_ms).await;
    }

    /// Forgets the failures of `key`.
    pub async fn clear(&self, key: &str) {
        let digest = self.digest(key);
        let cleared = self
            .db
            .write(move |c| {
                c.execute(
                    "DELETE FROM auth_failures WHERE key_digest = ?1",
                    params![digest],
                )
            })
            .await;
        if let Err(e) = cleared {
            tracing::error!(error = %e, "cannot clear a key of the failure throttle");
        }
    }

    /// Counts one failure against each key, in one write transaction.
    async fn record(&self, keys: &[(&str, Rule)], now_ms: i64) {
        let keys: Vec<(String, Rule)> = keys.iter().map(|(k, r)| (self.digest(k), *r)).collect();
        let me = self.clone();
        let written = self
            .db
            .write(move |c| {
                let mut live: Option<usize> = None;
                for (digest, rule) in &keys {
                    let earlier = entry(c, digest)?;
                    if earlier.is_none() && !me.room_for_one_more(c, now_ms, &mut live)? {
                        continue;
                    }
                    let e = me.next(earlier, now_ms, *rule);
                    let expires = e
                        .locked_until_ms
                        .max(e.first_ms.saturating_add(me.window_ms));
                    c.execute(
                        "INSERT INTO auth_failures \
                         (key_digest, failures, first_ms, locked_until_ms, expires_at_ms) \
                         VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (key_digest) DO UPDATE SET \
                         failures = excluded.failures, first_ms = excluded.first_ms, \
                         locked_until_ms = excluded.locked_until_ms, \
                         expires_at_ms = excluded.expires_at_ms",
                        params![digest, e.failures, e.first_ms, e.locked_until_ms, expires],
                    )?;
                }
                Ok(())
            })
            .await;
        if let Err(e) = written {
            tracing::error!(error = %e, "cannot record a failure in the failure throttle");
        }
    }

    /// Whether a new key may be tracked: the table holds fewer than `max_keys` live rows
    /// (those past their expiry are pruned first, once per transaction). `live` carries
    /// the count through one transaction.
    fn room_for_one_more(
        &self,
        c: &Conn<'_>,
        now_ms: i64,
        live: &mut Option<usize>,
    ) -> crate::store::Result<bool> {
        let count = match *live {
            Some(n) => n,
            None => {
                c.execute(
                    "DELETE FROM auth_failures WHERE expires_at_ms <= ?1",
                    params![now_ms],
                )?;
                live_rows(c, now_ms)?
            }
        };
        let room = count < self.max_keys;
        *live = Some(if room { count + 1 } else { count });
        Ok(room)
    }

    /// A key's entry after one more failure at `now_ms`.
    fn next(&self, earlier: Option<Entry>, now_ms: i64, rule: Rule) -> Entry {
        let fresh = Entry {
            failures: 0,
            first_ms: now_ms,
            locked_until_ms: 0,
        };
        let mut e = match earlier {
            Some(e) if now_ms - e.first_ms >= self.window_ms && e.locked_until_ms <= now_ms => {
                fresh
            }
            Some(e) => e,
            None => fresh,
        };
        e.failures = e.failures.saturating_add(1);
        if e.failures >= i64::from(self.max_failures) {
            e.locked_until_ms = match rule {
                Rule::Lock => now_ms + self.window_ms,
                Rule::BackOff => now_ms + self.backoff_ms(e.failures),
            };
        }
        e
    }

    /// The delay after the `failures`th failure: from [`BACKOFF_BASE_MS`] at the limit,
    /// doubling with each further one, never more than the configured most.
    fn backoff_ms(&self, failures: i64) -> i64 {
        let doublings = (failures - i64::from(self.max_failures)).clamp(0, 30);
        (BACKOFF_BASE_MS << doublings).min(self.backoff_max_ms)
    }
}

/// The stored entry of a key digest.
fn entry(c: &Conn<'_>, digest: &str) -> crate::store::Result<Option<Entry>> {
    c.query_row(
        "SELECT failures, first_ms, locked_until_ms FROM auth_failures WHERE key_digest = ?1",
        params![digest],
        |r| {
            Ok(Entry {
                failures: r.get(0)?,
                first_ms: r.get(1)?,
                locked_until_ms: r.get(2)?,
            })
        },
    )
    .optional()
}

/// The rows not yet expired at `now_ms`.
fn live_rows(c: &Conn<'_>, now_ms: i64) -> crate::store::Result<usize> {
    let n: i64 = c.query_row(
        "SELECT count(*) FROM auth_failures WHERE expires_at_ms > ?1",
        params![now_ms],
        |r| r.get(0),
    )?;
    Ok(usize::try_from(n).unwrap_or(0))
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
