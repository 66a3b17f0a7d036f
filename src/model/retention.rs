//! How long a runner's transcript is kept: one not written for `[model]
//! transcript_retention` is deleted, at start and then every hour. A transcript is the
//! whole conversation (the customer's messages, tool results); it is kept for an idle
//! stop and resume, not for ever.

use std::sync::Arc;
use std::time::Duration;

use super::proxy::ModelProxy;
use super::store as model_store;

/// How often the transcripts past their retention are looked for.
pub const SWEEP_EVERY: Duration = Duration::from_secs(3600);

/// Deletes the transcripts not written for the retention period, as of the gate's
/// clock; how many.
pub async fn forget_old_transcripts(proxy: &ModelProxy) -> anyhow::Result<usize> {
    let retention = crate::clock::ms(proxy.settings.transcript_retention);
    let before = proxy.gate.now().saturating_sub(retention);
    let forgotten = proxy
        .gate
        .db()
        .write(move |c| model_store::forget_transcripts(c, before))
        .await?;
    Ok(forgotten)
}

/// Runs [`forget_old_transcripts`] now and every [`SWEEP_EVERY`], for ever.
pub async fn run(proxy: Arc<ModelProxy>) {
    loop {
        match forget_old_transcripts(&proxy).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(transcripts = n, "deleted transcripts past their retention"),
            Err(e) => tracing::error!(error = %e, "cannot delete transcripts past their retention"),
        }
        tokio::time::sleep(SWEEP_EVERY).await;
    }
}
