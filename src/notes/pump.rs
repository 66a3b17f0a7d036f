//! The outbox loop: drains the notes, then the thread events, then the state labels, on
//! every wake-up and every few seconds, until the process stops.

use std::sync::Arc;
use std::time::Duration;

use super::Outbox;

/// Runs the outboxes until the process stops: on every wake-up and every few seconds.
pub async fn run(outbox: Arc<Outbox>) {
    loop {
        if let Err(e) = super::outbox::drain(&outbox).await {
            tracing::error!(error = %e, "cannot read the notes due; trying again at the next round");
        }
        if let Err(e) = super::trail_outbox::drain(&outbox).await {
            tracing::error!(error = %e, "cannot read the thread events due; trying again at the next round");
        }
        if let Err(e) = super::label_outbox::drain(&outbox).await {
            tracing::error!(error = %e, "cannot read the threads whose labels are due; trying again at the next round");
        }
        let _ = tokio::time::timeout(Duration::from_secs(2), outbox.wake.notified()).await;
    }
}
