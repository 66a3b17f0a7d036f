//! What threadgate writes on a Plain thread, and the outboxes that get it there: the
//! note of a held call (`held`), of a session that stopped on its own (`stop`) and of
//! a published pull request (`pull`), all queued in the transaction that records why,
//! and the three outboxes that deliver what is queued (notes, the held call's thread
//! events, the thread's state labels), woken through one [`Outbox`] handle and retried
//! on `retry::OUTBOX`.
//!
//! Below `gateway`, `model` and `approvals` (each queues notes and wakes the outbox
//! here); above `executions`, whose tables hold what is queued.

pub mod held;
pub mod label_outbox;
pub mod outbox;
pub mod pull;
mod pump;
mod rounds;
pub mod stop;
pub mod trail_outbox;

use std::sync::{Arc, RwLock};

use tokio::sync::Notify;

use crate::clock::Clock;
use crate::connectors::HelpdeskConnector;
use crate::secrets::Redactor;
use crate::store::Db;

pub use pump::run;

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
        self.clock.now_ms()
    }

    fn redactor(&self) -> Arc<Redactor> {
        self.redactor
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}
