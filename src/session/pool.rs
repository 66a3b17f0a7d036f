//! Warm starts: a pool of parked sandboxes per agent definition, over any
//! [`SandboxRuntime`] that can park (`park`, `adopt`, `list_parked`).
//!
//! A parked sandbox holds nothing of any thread; a session's start takes one for its
//! agent ([`SandboxPool::take`]) and the runtime's `adopt` hands it the thread. A
//! taken sandbox never comes back: it is adopted or removed. The pool refills in the
//! background ([`SandboxPool::run`], owned by the application's tasks): at most
//! `pool_refill_per_second` parks begin each second, a park that fails backs off on
//! the session-start schedule, and a sandbox parked longer than `pool_max_idle` is
//! replaced. At start it takes over the parked sandboxes an earlier run left that are
//! clean, fresh and of the configured image, and removes the others. A runtime that
//! cannot park turns the pool off (logged once): every start is then cold.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;

use crate::clock::Clock;
use crate::sandbox::{ParkSpec, ParkedSandbox, SandboxError, SandboxRuntime};
use crate::tasks::Tasks;

/// How often parked sandboxes the pool does not know (left by a park cut at shutdown,
/// or a removal that failed) are looked for and removed.
const SWEEP_EVERY: Duration = Duration::from_secs(30);
/// The longest the refill loop sleeps with nothing to do (expiry is checked then).
const IDLE_WAIT: Duration = Duration::from_secs(1);

/// The pool's settings (from `[sessions]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolSettings {
    /// Parked sandboxes kept per agent definition; 0 turns warm starts off.
    pub size: usize,
    /// Parks begun per second at most (0 counts as 1).
    pub refill_per_second: u32,
    /// A sandbox parked longer than this is removed and replaced.
    pub max_idle: Duration,
}

/// One parked sandbox the pool holds.
#[derive(Debug, Clone)]
struct Parked {
    sandbox: ParkedSandbox,
    /// When it was parked, on the pool's clock.
    since_ms: i64,
}

#[derive(Debug, Default)]
struct PoolState {
    /// Per pool (agent), oldest first.
    parked: HashMap<String, VecDeque<Parked>>,
    /// Parks in flight per pool.
    parking: HashMap<String, usize>,
    /// Handed out by `take`, until the runtime no longer lists them as parked.
    taken: HashSet<String>,
    /// Consecutive failed parks, and when the next may begin.
    failures: u32,
    retry_at_ms: i64,
    /// Set when the runtime cannot park: why.
    off: Option<String>,
}

/// The pools of parked sandboxes of every agent definition.
pub struct SandboxPool {
    runtime: Arc<dyn SandboxRuntime>,
    specs: Vec<ParkSpec>,
    settings: PoolSettings,
    clock: Clock,
    state: Mutex<PoolState>,
    wake: Notify,
    /// Set by the first `run`: a second one returns at once.
    running: AtomicBool,
}

impl SandboxPool {
    /// A pool keeping `settings.size` sandboxes of each spec (one per agent
    /// definition, `spec.pool` its name) parked in `runtime`.
    pub fn new(
        runtime: Arc<dyn SandboxRuntime>,
        specs: Vec<ParkSpec>,
        settings: PoolSettings,
        clock: Clock,
    ) -> Arc<SandboxPool> {
        Arc::new(SandboxPool {
            runtime,
            specs,
            settings,
            clock,
            state: Mutex::new(PoolState::default()),
            wake: Notify::new(),
            running: AtomicBool::new(false),
        })
    }

    /// Takes a parked sandbox of `pool` (the oldest one still fresh), or `None` on a
    /// miss. The caller adopts it; it is never handed out again.
    pub fn take(&self, pool: &str) -> Option<ParkedSandbox> {
        let now = self.clock.now_ms();
        let max_idle = crate::clock::ms(self.settings.max_idle);
        let taken = {
            let mut state = self.lock();
            let queue = state.parked.get_mut(pool)?;
            // Expired ones stay for the refill loop to remove.
            let fresh = queue.iter().position(|p| now - p.since_ms < max_idle)?;
            let sandbox = queue.remove(fresh)?.sandbox;
            state.taken.insert(sandbox.container_id.clone());
            sandbox
        };
        self.publish_count();
        crate::metrics::pool_action("taken", 1);
        self.wake.notify_one();
        Some(taken)
    }

    /// How many sandboxes of `pool` are parked now.
    pub fn parked(&self, pool: &str) -> usize {
        self.lock().parked.get(pool).map_or(0, VecDeque::len)
    }

    /// The container ids of `pool`'s parked sandboxes, oldest first.
    pub fn parked_ids(&self, pool: &str) -> Vec<String> {
        self.lock()
            .parked
            .get(pool)
            .map(|q| q.iter().map(|p| p.sandbox.container_id.clone()).collect())
            .unwrap_or_default()
    }

    /// Why the pool is off, if it is (the runtime cannot park).
    pub fn off(&self) -> Option<String> {
        self.lock().off.clone()
    }

    /// Keeps the pools full until the shutdown signal: takes over what an earlier run
    /// parked, then parks, replaces expired sandboxes and sweeps unknown ones. Meant
    /// for `Tasks::spawn_until_shutdown`; each park runs in `tasks`.
    pub async fn run(self: Arc<Self>, tasks: Tasks) {
        if self.settings.size == 0
            || self.specs.is_empty()
            || self.running.swap(true, Ordering::SeqCst)
        {
            return;
        }
        self.restore().await;
        let rate = self.settings.refill_per_second.max(1);
        let gap = Duration::from_secs(1) / rate;
        let mut swept = tokio::time::Instant::now();
        loop {
            if let Some(reason) = self.off() {
                tracing::warn!(reason, "warm starts are off; every session starts cold");
                return;
            }
            self.remove_expired().await;
            if swept.elapsed() >= SWEEP_EVERY {
                self.sweep().await;
                swept = tokio::time::Instant::now();
            }
            match self.next_to_park() {
                Some(spec) => {
                    let pool = self.clone();
                    tasks.spawn(async move { pool.park_one(spec).await });
                    tokio::time::sleep(gap).await;
                }
                None => {
                    let _ = tokio::time::timeout(IDLE_WAIT, self.wake.notified()).await;
                }
            }
        }
    }

    /// The spec of the pool furthest below its size, counting parks in flight, unless
    /// parks are backing off.
    fn next_to_park(&self) -> Option<ParkSpec> {
        let now = self.clock.now_ms();
        let mut state = self.lock();
        if state.retry_at_ms > now {
            return None;
        }
        let have = |state: &PoolState, pool: &str| {
            state.parked.get(pool).map_or(0, VecDeque::len)
                + state.parking.get(pool).copied().unwrap_or(0)
        };
        let spec = self
            .specs
            .iter()
            .filter(|s| have(&state, &s.pool) < self.settings.size)
            .min_by_key(|s| have(&state, &s.pool))?
            .clone();
        *state.parking.entry(spec.pool.clone()).or_default() += 1;
        Some(spec)
    }

    async fn park_one(&self, spec: ParkSpec) {
        let parked = self.runtime.park(&spec).await;
        let now = self.clock.now_ms();
        {
            let mut state = self.lock();
            if let Some(n) = state.parking.get_mut(&spec.pool) {
                *n = n.saturating_sub(1);
            }
            match parked {
                Ok(sandbox) => {
                    state.failures = 0;
                    state
                        .parked
                        .entry(spec.pool.clone())
                        .or_default()
                        .push_back(Parked {
                            sandbox,
                            since_ms: now,
                        });
                }
                Err(SandboxError::PoolUnsupported { reason }) => state.off = Some(reason),
                Err(e) => {
                    state.failures = state.failures.saturating_add(1);
                    state.retry_at_ms =
                        crate::retry::SESSION_START.next_at_ms(now, i64::from(state.failures));
                    tracing::error!(pool = %spec.pool, error = %e, "cannot park a sandbox; retrying later");
                    crate::metrics::pool_action("failed", 1);
                    self.wake.notify_one();
                    return;
                }
            }
        }
        crate::metrics::pool_action("parked", 1);
        self.publish_count();
        self.wake.notify_one();
    }

    /// Removes the sandboxes parked longer than `max_idle` (the refill replaces them).
    async fn remove_expired(&self) {
        let now = self.clock.now_ms();
        let max_idle = crate::clock::ms(self.settings.max_idle);
        let expired: Vec<ParkedSandbox> = {
            let mut state = self.lock();
            let mut expired = Vec::new();
            for queue in state.parked.values_mut() {
                queue.retain(|p| {
                    let fresh = now - p.since_ms < max_idle;
                    if !fresh {
                        expired.push(p.sandbox.clone());
                    }
                    fresh
                });
            }
            expired
        };
        if expired.is_empty() {
            return;
        }
        self.publish_count();
        crate::metrics::pool_action("expired", expired.len());
        tracing::info!(
            count = expired.len(),
            "replacing parked sandboxes past their idle time"
        );
        self.remove_all(&expired).await;
    }

    /// Takes over the parked sandboxes an earlier run left: clean, fresh, of a known
    /// pool and of the configured image; removes every other one.
    async fn restore(&self) {
        let found = match self.runtime.list_parked().await {
            Ok(found) => found,
            Err(e) => {
                // Nothing is taken over on an unknown list; the sweep removes them later.
                tracing::error!(error = %e, "cannot list parked sandboxes; starting with an empty pool");
                return;
            }
        };
        let now = self.clock.now_ms();
        let max_idle = crate::clock::ms(self.settings.max_idle);
        let mut stale = Vec::new();
        {
            let mut state = self.lock();
            let held: HashSet<String> = state
                .parked
                .values()
                .flatten()
                .map(|p| p.sandbox.container_id.clone())
                .collect();
            for sandbox in found {
                if held.contains(&sandbox.container_id) {
                    continue;
                }
                let spec = self.specs.iter().find(|s| s.pool == sandbox.pool);
                let keep = sandbox.clean
                    && now - sandbox.created_at_ms < max_idle
                    && spec.is_some_and(|s| s.image == sandbox.image)
                    && state.parked.get(&sandbox.pool).map_or(0, VecDeque::len)
                        < self.settings.size;
                if keep {
                    let since_ms = sandbox.created_at_ms;
                    state
                        .parked
                        .entry(sandbox.pool.clone())
                        .or_default()
                        .push_back(Parked { sandbox, since_ms });
                } else {
                    stale.push(sandbox);
                }
            }
        }
        let kept: usize = self.lock().parked.values().map(VecDeque::len).sum();
        tracing::info!(
            kept,
            removed = stale.len(),
            "parked sandboxes of an earlier run"
        );
        self.publish_count();
        crate::metrics::pool_action("removed", stale.len());
        self.remove_all(&stale).await;
    }

    /// Removes parked sandboxes the pool neither holds nor handed out.
    async fn sweep(&self) {
        let found = match self.runtime.list_parked().await {
            Ok(found) => found,
            Err(e) => {
                tracing::error!(error = %e, "cannot list parked sandboxes; sweep skipped");
                return;
            }
        };
        let unknown: Vec<ParkedSandbox> = {
            let mut state = self.lock();
            let listed: HashSet<&str> = found.iter().map(|s| s.container_id.as_str()).collect();
            // A taken sandbox stops being listed once its adoption is recorded.
            state.taken.retain(|id| listed.contains(id.as_str()));
            let held: HashSet<&str> = state
                .parked
                .values()
                .flatten()
                .map(|p| p.sandbox.container_id.as_str())
                .chain(state.taken.iter().map(String::as_str))
                .collect();
            let parking = state.parking.values().any(|n| *n > 0);
            found
                .iter()
                .filter(|s| !parking && !held.contains(s.container_id.as_str()))
                .cloned()
                .collect()
        };
        if !unknown.is_empty() {
            tracing::warn!(
                count = unknown.len(),
                "removing parked sandboxes the pool does not hold"
            );
            crate::metrics::pool_action("removed", unknown.len());
            self.remove_all(&unknown).await;
        }
    }

    async fn remove_all(&self, sandboxes: &[ParkedSandbox]) {
        let runtime = &self.runtime;
        let stops = sandboxes
            .iter()
            .map(|s| async move { (s, runtime.stop(&s.container_id).await) });
        for (sandbox, result) in futures::future::join_all(stops).await {
            if let Err(e) = result {
                tracing::error!(container = %sandbox.container_id, error = %e, "cannot remove a parked sandbox");
            }
        }
    }

    fn publish_count(&self) {
        let count = self.lock().parked.values().map(VecDeque::len).sum();
        crate::metrics::pool_parked(count);
    }

    fn lock(&self) -> MutexGuard<'_, PoolState> {
        // Plain data: a panic while holding the lock leaves nothing half-done.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}
