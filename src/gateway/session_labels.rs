//! The session sockets as the supervisor sees them ([`SessionApi`]), with the thread's
//! "agent working" state label kept in step: a session's socket opens when its session
//! runs and closes when it stops, so that is where the label's wanted state is written
//! (`executions::labels`); the outbox makes Plain match.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use super::Gate;
use crate::executions::labels;
use crate::ids::SessionId;
use crate::session::{SessionApi, SessionScope};
use crate::store::leases::{self, Lease};

/// Wraps the sockets' [`SessionApi`], recording whether each thread's session runs.
pub struct LabelledSessions {
    inner: Arc<dyn SessionApi>,
    gate: Arc<Gate>,
    /// The lease (and so the thread) each open session is served under.
    threads: Mutex<HashMap<SessionId, Lease>>,
}

impl LabelledSessions {
    pub fn new(inner: Arc<dyn SessionApi>, gate: Arc<Gate>) -> LabelledSessions {
        LabelledSessions {
            inner,
            gate,
            threads: Mutex::new(HashMap::new()),
        }
    }

    /// Whether any state label is configured (else nothing is recorded).
    fn labels_configured(&self) -> bool {
        self.gate
            .connectors
            .helpdesk
            .as_ref()
            .is_some_and(|h| !h.state_labels().configured().is_empty())
    }

    /// Records the wanted label under the session's lease: a session dropped here
    /// because its thread went to another instance writes nothing (the new owner's
    /// session is the one working).
    async fn record(&self, lease: Lease, working: bool) {
        let now = self.gate.now();
        let thread_id = lease.thread_id.clone();
        let written = self
            .gate
            .db()
            .write(move |c| {
                leases::fence(c, &lease)?;
                labels::set_working(c, &lease.thread_id, working, now)
            })
            .await;
        match written {
            Ok(()) => self.gate.outbox().wake(),
            Err(e) if leases::is_lost(&e) => {
                tracing::info!(thread = %thread_id, "the thread went to another instance; its label is the new owner's to write");
            }
            Err(e) => {
                tracing::error!(thread = %thread_id, error = %e, "cannot record the thread's agent-working label");
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[async_trait::async_trait]
impl SessionApi for LabelledSessions {
    async fn open(&self, scope: SessionScope, socket_dir: PathBuf) -> anyhow::Result<()> {
        let lease = scope.lease.clone();
        let session_id = scope.session_id.clone();
        // Before the socket serves a call: reads rely on the hold marks, and the
        // session's holds may have been made on another instance.
        self.gate.load_session_holds(&session_id).await?;
        self.inner.open(scope, socket_dir).await?;
        let first = lock(&self.threads)
            .insert(session_id, lease.clone())
            .is_none_or(|earlier| earlier != lease);
        if first && self.labels_configured() {
            self.record(lease, true).await;
        }
        Ok(())
    }

    async fn close(&self, session_id: &str) {
        self.inner.close(session_id).await;
        let lease = lock(&self.threads).remove(session_id);
        if let Some(lease) = lease
            && self.labels_configured()
        {
            self.record(lease, false).await;
        }
    }
}
