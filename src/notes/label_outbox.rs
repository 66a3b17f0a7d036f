//! The state label outbox: makes each thread's labels in Plain match what
//! `executions::labels` says it should show (`[plain] labels`), at least once, retried
//! with a backoff while Plain refuses or is down. A sync reads the thread's labels and
//! adds or removes only the configured label types, so repeating one does no harm.
//! Nothing is read or sent when no state label is configured.

use super::Outbox;
use crate::connectors::HelpdeskConnector;
use crate::connectors::helpdesk::StateLabels;
use crate::executions::labels::{self, LabelSync, WantedLabels};
use crate::store::StoreError;

/// Threads synced in one round at most.
const SYNCS_PER_ROUND: i64 = 50;
/// How long a drainer holds the threads it took: another instance syncs one again only
/// after this, or once the sync is recorded.
const CLAIM_MS: i64 = 60_000;

/// Syncs every due thread's labels once; returns how many threads Plain now matches.
pub async fn drain(outbox: &Outbox) -> Result<usize, StoreError> {
    let Some(helpdesk) = outbox.helpdesk.clone() else {
        return Ok(0);
    };
    if helpdesk.state_labels().configured().is_empty() {
        return Ok(0);
    }
    let now = outbox.now();
    let until = now.saturating_add(CLAIM_MS);
    // A read first: nothing due costs no write. Then the round is claimed, so no other
    // instance sharing the database syncs these threads meanwhile.
    let seen = outbox
        .db
        .read(move |c| labels::due(c, now, SYNCS_PER_ROUND))
        .await?;
    if seen.is_empty() {
        return Ok(0);
    }
    let due = outbox
        .db
        .write(move |c| labels::claim(c, now, SYNCS_PER_ROUND, until))
        .await?;
    let mut synced = 0;
    for sync in due {
        if sync_one(outbox, &helpdesk, &sync).await {
            synced += 1;
        }
    }
    Ok(synced)
}

/// The label type ids `wanted` asks for, of those configured.
pub fn wanted_ids(config: &StateLabels, wanted: WantedLabels) -> Vec<&str> {
    [
        (wanted.waiting_for_approval, &config.waiting_for_approval),
        (wanted.agent_working, &config.agent_working),
        (wanted.handed_to_person, &config.handed_to_person),
    ]
    .into_iter()
    .filter_map(|(on, id)| if on { id.as_deref() } else { None })
    .collect()
}

async fn sync_one(outbox: &Outbox, helpdesk: &HelpdeskConnector, sync: &LabelSync) -> bool {
    let config = helpdesk.state_labels();
    let managed: Vec<&str> = config.configured().into_iter().map(|(_, id)| id).collect();
    let wanted = wanted_ids(config, sync.wanted);
    let thread = sync.thread_id.clone();
    let sent = helpdesk
        .sync_labels(&sync.thread_id, &managed, &wanted)
        .await;
    let written = match &sent {
        Ok(()) => {
            let version = sync.version;
            outbox
                .db
                .write(move |c| labels::synced(c, &thread, version))
                .await
        }
        Err(error) => {
            let next = crate::retry::OUTBOX.next_at_ms(outbox.now(), sync.attempts);
            let error = outbox.redactor().redact(&error.to_string()).into_owned();
            tracing::warn!(thread = %sync.thread_id, error = %error, "cannot sync the thread's state labels yet; will retry");
            outbox
                .db
                .write(move |c| labels::sync_failed(c, &thread, &error, next))
                .await
        }
    };
    if let Err(e) = written {
        tracing::error!(thread = %sync.thread_id, error = %e, "cannot record a label sync; it is done again");
    }
    sent.is_ok()
}
