//! The sessions' settings (`[sessions]` in the config file): how many run at once, when
//! an idle one gives up its container, the caps on its socket, its workspace and its
//! calls waiting for a person, and the pool of parked sandboxes (warm starts).

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Limits on sessions.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct SessionSettings {
    /// Live containers at most; further sessions wait, durably, for a slot.
    pub max_live: usize,
    /// A session quiet this long gives up its container (and is resumed by its next
    /// event or by a decision on its held call).
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// How often containers and sessions are reconciled.
    #[serde(with = "humantime_serde")]
    pub reconcile_every: Duration,
    /// Open connections at most on each session's socket: a session that opens more
    /// exhausts only itself.
    pub socket_max_connections: usize,
    /// Size of each session's workspace filesystem (enforced when threadgate runs as
    /// root; see the README). 0 turns the limit off.
    pub workspace_bytes: u64,
    /// Free space kept for the database on the data directory's disk: below it, new
    /// sessions wait (webhooks are still stored).
    pub disk_reserve_bytes: u64,
    /// Calls of one session waiting for a person at most: a further call that would be
    /// held is refused and the session stops with a note (a person takes over). 0
    /// turns the limit off.
    pub max_pending_holds: usize,
    /// Tool calls of one session a second on average, at most (REST and MCP): a call
    /// past it is refused `rate_limited`, nothing recorded or sent, so an agent cannot
    /// spend the providers' shared quotas as fast as it can send. 0 turns it off.
    pub calls_per_second: u32,
    /// Tool calls of one session at once past `calls_per_second`: the bucket's size.
    pub calls_burst: u32,
    /// How long a thread's session lease lasts without renewal (renewed every third of
    /// it), and how fresh an instance's heartbeat must be for its instance id to count
    /// as taken. A session whose owner died is taken over by another instance after at
    /// most this long.
    #[serde(with = "humantime_serde")]
    pub lease_time: Duration,
    /// Parked sandboxes kept per agent definition for warm starts (a webhook adopts
    /// one instead of starting a container). 0 turns warm starts off. Needs a runtime
    /// that can park (Docker with threadgate as root); otherwise every start is cold.
    pub pool_size: usize,
    /// Parks begun per second at most while the pool refills.
    pub pool_refill_per_second: u32,
    /// A sandbox parked longer than this is removed and replaced by a fresh one.
    #[serde(with = "humantime_serde")]
    pub pool_max_idle: Duration,
}

impl Default for SessionSettings {
    fn default() -> Self {
        SessionSettings {
            max_live: 16,
            idle_timeout: Duration::from_secs(15 * 60),
            reconcile_every: Duration::from_secs(30),
            socket_max_connections: 32,
            workspace_bytes: 2 << 30,
            disk_reserve_bytes: 1 << 30,
            max_pending_holds: 20,
            calls_per_second: 20,
            calls_burst: 100,
            lease_time: Duration::from_secs(15),
            pool_size: 2,
            pool_refill_per_second: 4,
            pool_max_idle: Duration::from_secs(30 * 60),
        }
    }
}

impl SessionSettings {
    /// [`SessionSettings::reconcile_every`] in milliseconds, saturating.
    pub fn reconcile_every_ms(&self) -> i64 {
        crate::clock::ms(self.reconcile_every)
    }

    /// [`SessionSettings::lease_time`] in milliseconds, saturating.
    pub fn lease_ms(&self) -> i64 {
        crate::clock::ms(self.lease_time)
    }

    /// How often leases and the instance's heartbeat are renewed: a third of the lease
    /// time (at least 10 ms).
    pub fn renew_every(&self) -> Duration {
        (self.lease_time / 3).max(Duration::from_millis(10))
    }

    /// The pool's settings.
    pub fn pool(&self) -> crate::session::PoolSettings {
        crate::session::PoolSettings {
            size: self.pool_size,
            refill_per_second: self.pool_refill_per_second,
            max_idle: self.pool_max_idle,
        }
    }
}
