//! What threadgate writes on a Plain thread, and the outboxes that get it there: the
//! note of a held call (`held`), of a session that stopped on its own (`stop`) and of
//! a published pull request (`pull`), all queued in the transaction that records why,
//! and the three outboxes that deliver what is queued (notes, the held call's thread
//! events, the thread's state labels), woken through one [`Outbox`] handle.
//!
//! Below `gateway`, `model` and `approvals` (each queues notes and wakes the outbox
//! here); above `executions`, whose tables hold what is queued.

pub mod held;
pub mod label_outbox;
pub mod outbox;
pub mod pull;
mod pump;
pub mod stop;
pub mod trail_outbox;

use std::sync::{Arc, RwLock};

use tokio::sync::Notify;

use crate::connectors::HelpdeskConnector;
use crate::secrets::Redactor;
use crate::session::Clock;
use crate::store::Db;

pub use pump::run;

/// The longest an outbox (notes, thread events, state labels) waits between retries of
/// one item.
const MAX_BACKOFF_MS: i64 = 10 * 60 * 1000;

/// When an outbox item that failed `attempts` times so far is tried again: 2 s doubling
/// per attempt, at most [`MAX_BACKOFF_MS`]. The one retry schedule of the note, thread
/// event and state label outboxes.
fn retry_at(now_ms: i64, attempts: i64) -> i64 {
    now_ms + (2_000i64 << attempts.clamp(0, 16)).min(MAX_BACKOFF_MS)
}

/// What the outboxes and the note queues need, and nothing more: the database, Plain
/// (absent when not configured: nothing is sent), the clock, the redactor in force and
/// the wake-up of the outbox loop.
pub struct Outbox {
    db: Db,
    helpdesk: Option<Arc<HelpdeskConnector>>,
    clock: Clock,
    redactor: Arc<RwLock<Arc<Redactor>>>,
    wake: Notify,
}

impl Outbox {
    /// An outbox over `db`, posting to `helpdesk`, redacting with what `redactor` holds
    /// at the time (the slot the gate keeps current).
    pub fn new(
        db: Db,
        helpdesk: Option<Arc<HelpdeskConnector>>,
        clock: Clock,
        redactor: Arc<RwLock<Arc<Redactor>>>,
    ) -> Outbox {
        Outbox {
            db,
            helpdesk,
            clock,
            redactor,
            wake: Notify::new(),
        }
    }

    /// Wakes the outbox loop: something was queued.
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    fn now(&self) -> i64 {
        (self.clock)()
    }

    fn redactor(&self) -> Arc<Redactor> {
        self.redactor
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::{MAX_BACKOFF_MS, retry_at};

    #[test]
    fn retries_double_from_two_seconds_up_to_the_cap() {
        assert_eq!(retry_at(0, 0), 2_000);
        assert_eq!(retry_at(100, 3), 100 + 16_000);
        assert_eq!(retry_at(0, 40), MAX_BACKOFF_MS);
        assert_eq!(retry_at(0, -1), 2_000);
    }
}
