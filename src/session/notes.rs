//! What a person must be told when the supervisor itself stops a session: the note goes
//! on the thread (through the note outbox, which lives above this module, so the
//! supervisor reaches it through this trait).

use super::SessionScope;

/// Why the supervisor stopped a session on its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    /// The agent filled its workspace filesystem (`limit_bytes` in size).
    WorkspaceFull { limit_bytes: u64 },
}

/// Leaves the note that tells the thread's people why its session stopped.
#[async_trait::async_trait]
pub trait StopNotes: Send + Sync {
    /// Queues the note durably (once per session and reason) before the stop begins.
    async fn stopped(&self, scope: &SessionScope, reason: &StopReason) -> anyhow::Result<()>;
}
