//! One long poll of an execution's change, for `GET /v1/executions/{id}/wait` and MCP's
//! `threadgate_wait` (and a redeemed request state): the session's execution is loaded,
//! then waited on until it is final, its approval runs out, or the wait's time is up.

use std::future::Future;
use std::time::Duration;

use threadgate_api::{ExecutionStatus, ExecutionView};
use tokio::sync::broadcast::{self, error::RecvError};
use tokio::time::Instant;

use super::answers::agent_view;
use super::gate::Gate;
use crate::executions::store::{self as exec_store, Execution};
use crate::ids::ExecutionId;

/// How often a wait reads its execution again even when no change was announced: a
/// change made by another instance (an approval decided there, a run finished there) is
/// announced only on that instance, so this is the longest it goes unseen here.
pub const RELOAD_EVERY: Duration = Duration::from_secs(1);

/// Why an execution cannot be shown or waited on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WaitError {
    /// No execution of that id in this session (another session's is not found either).
    #[error("no such execution in this session")]
    NotFound,
    /// It could not be read (the cause is logged).
    #[error("internal error")]
    Internal,
}

/// How a wait ended: the execution as it then was.
#[derive(Debug)]
pub struct Settled {
    pub execution: Execution,
    /// Its approval ran out (perhaps before the sweeper marked it).
    pub expired: bool,
}

impl Settled {
    /// What the agent is told: the execution's view, `expired` when its approval ran out.
    pub fn view(&self) -> ExecutionView {
        let mut view = agent_view(&self.execution);
        if self.expired {
            view.status = ExecutionStatus::Expired;
        }
        view
    }
}

/// Who is told while a wait goes on (MCP's progress notifications).
pub trait WaitProgress: Send {
    /// How often to be told; `None` for never.
    fn interval(&self) -> Option<Duration>;

    /// The wait has gone on for `waited` of `timeout`, and `execution` is still open.
    fn report(
        &mut self,
        waited: Duration,
        timeout: Duration,
        execution: &Execution,
    ) -> impl Future<Output = ()> + Send;
}

/// A wait nobody is told about.
pub struct Unreported;

impl WaitProgress for Unreported {
    fn interval(&self) -> Option<Duration> {
        None
    }

    fn report(&mut self, _: Duration, _: Duration, _: &Execution) -> impl Future<Output = ()> {
        std::future::ready(())
    }
}

/// The execution `id` if it belongs to session `session_id`. A text that is no execution
/// id is answered as an id that is not there. A read of the session answered before its
/// outcome was written (`trailing`) is read once that outcome is: the agent never sees
/// a read it has the answer of still `running`.
pub async fn load(gate: &Gate, session_id: &str, id: &str) -> Result<Execution, WaitError> {
    let Ok(owned) = ExecutionId::parse(id) else {
        return Err(WaitError::NotFound);
    };
    gate.session_outcomes_settled(session_id).await;
    match gate.db.read(move |c| exec_store::get(c, &owned)).await {
        Ok(Some(e)) if e.session_id == session_id => Ok(e),
        Ok(_) => Err(WaitError::NotFound),
        Err(e) => {
            tracing::error!(error = %e, "cannot read execution");
            Err(WaitError::Internal)
        }
    }
}

/// One session's executions, watched for changes from the moment the watch is made, so
/// a change between loading an execution and waiting on it is not missed.
pub struct ExecutionWatch<'g> {
    gate: &'g Gate,
    session_id: &'g str,
    changes: broadcast::Receiver<ExecutionId>,
}

impl<'g> ExecutionWatch<'g> {
    /// Starts watching session `session_id`'s executions.
    pub fn new(gate: &'g Gate, session_id: &'g str) -> ExecutionWatch<'g> {
        ExecutionWatch {
            gate,
            session_id,
            changes: gate.changes(),
        }
    }

    /// The execution `id` if it belongs to the session.
    pub async fn load(&self, id: &str) -> Result<Execution, WaitError> {
        load(self.gate, self.session_id, id).await
    }

    /// Waits until `execution` is final, its approval runs out, or `timeout` passes,
    /// reloading it at each change; `progress` is told when the wait starts and at its
    /// interval after.
    pub async fn settle(
        &mut self,
        mut execution: Execution,
        timeout: Duration,
        progress: &mut impl WaitProgress,
    ) -> Result<Settled, WaitError> {
        let started = Instant::now();
        let deadline = started + timeout;
        let mut next_report = started;
        loop {
            let open = !execution.status.is_final();
            let expired = open
                && execution
                    .expires_at_ms
                    .is_some_and(|at| at <= self.gate.now());
            let now = Instant::now();
            if !open || expired || now >= deadline {
                return Ok(Settled { execution, expired });
            }
            // Another instance's change is never announced here: read again at least
            // this often.
            let mut wake = deadline.min(now + RELOAD_EVERY);
            if let Some(at) = execution.expires_at_ms {
                let left = u64::try_from(at - self.gate.now()).unwrap_or(0);
                wake = wake.min(now + Duration::from_millis(left));
            }
            if let Some(every) = progress.interval() {
                if now >= next_report {
                    progress.report(now - started, timeout, &execution).await;
                    next_report = now + every;
                }
                wake = wake.min(next_report);
            }
            self.changed(&execution.id, wake).await;
            execution = self.load(&execution.id).await?;
        }
    }

    /// Returns when execution `id` may have changed (a missed message counts), or at
    /// `until`.
    async fn changed(&mut self, id: &str, until: Instant) {
        let _ = tokio::time::timeout_at(until, async {
            loop {
                match self.changes.recv().await {
                    Ok(changed) if changed.as_str() == id => return,
                    Ok(_) => continue,
                    Err(RecvError::Lagged(_)) => return,
                    // No one announces changes any more: only the time is left.
                    Err(RecvError::Closed) => std::future::pending::<()>().await,
                }
            }
        })
        .await;
    }
}
