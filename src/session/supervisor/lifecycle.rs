//! The slow work of a session's life, run off the actor in spawned tasks: starting its
//! container (branch, socket, sandbox) and stopping it (commit, push, publish); the
//! commit is shared with `checkpoint`.

use crate::secrets::ExposeSecret as _;
use std::path::{Path, PathBuf};

use super::parts::SupervisorParts;
use crate::ids::ThreadId;
use crate::sandbox::{SandboxError, SandboxHandle, SandboxSpec};
use crate::secrets::SecretString;
use crate::session::publish::MAX_LISTED_FILES;
use crate::session::store::SessionRow;
use crate::session::{BranchPublisher, CommitReport, SessionScope, WorkspaceOps};
use crate::store::leases::Lease;
use crate::workspace::ChangedFiles;
use crate::workspace::volume;

pub(super) fn scope_of(row: &SessionRow, lease: Lease) -> SessionScope {
    SessionScope {
        lease,
        session_id: row.session_id.clone(),
        thread_id: row.thread_id.clone(),
        agent: row.agent.clone(),
        customer_id: row.customer_id.clone(),
        customer_email: row.customer_email.clone(),
    }
}

/// Prepares the branch, opens the session's socket and starts its container.
pub(super) async fn start_session(
    parts: &SupervisorParts,
    row: &SessionRow,
    lease: Lease,
) -> anyhow::Result<(String, String)> {
    let agent = parts
        .agents
        .get(&row.agent)
        .ok_or_else(|| anyhow::anyhow!("no agent definition named {}", row.agent))?
        .clone();
    let secrets = parts.secrets.for_agent(&agent.name, &agent.secrets).await?;
    let workspaces = parts.workspaces.clone();
    let thread = row.thread_id.clone();
    let prepared =
        crate::tasks::Tasks::spawn_blocking(move || workspaces.prepare(&thread)).await??;
    let (path, bytes) = (prepared.path.clone(), parts.settings.workspace_bytes);
    let limited =
        crate::tasks::Tasks::spawn_blocking(move || volume::limit(&path, bytes)).await??;
    if !limited && bytes > 0 {
        tracing::warn!(thread = %row.thread_id, "workspace not size-limited (threadgate is not root)");
    }
    let socket_dir = parts.sockets_dir.join(&row.session_id);
    std::fs::create_dir_all(&socket_dir)?;
    parts
        .api
        .open(scope_of(row, lease), socket_dir.clone())
        .await?;
    let spec = SandboxSpec {
        session_id: row.session_id.clone(),
        thread_id: row.thread_id.clone(),
        image: parts.image.clone(),
        workspace_dir: prepared.path.clone(),
        socket_dir,
        secrets: secrets
            .into_iter()
            .map(|(name, value)| {
                (
                    name,
                    crate::secrets::secret_bytes(value.expose_secret().as_bytes()),
                )
            })
            .collect(),
        limits: parts.limits,
        command: agent.command.clone(),
        env: vec![
            ("THREADGATE_THREAD_ID".into(), row.thread_id.to_string()),
            ("THREADGATE_AGENT".into(), agent.name.clone()),
        ],
    };
    match launch(parts, &agent.name, &spec).await {
        Ok((handle, kind)) => {
            crate::metrics::session_launch(kind);
            tracing::info!(launch = kind, container = %handle.container_id, "session has its sandbox");
            Ok((handle.container_id, prepared.path.display().to_string()))
        }
        Err(e) => {
            parts.api.close(&row.session_id).await;
            Err(e.into())
        }
    }
}

/// Stops every container of this instance that serves `thread` and closes their
/// sessions' sockets, touching nothing in the database: the thread's lease has gone to
/// another instance, which owns the session's state now.
pub(super) async fn drop_local(parts: &SupervisorParts, thread: &ThreadId) -> anyhow::Result<()> {
    let mine = parts.sandbox.list().await?;
    for c in mine.iter().filter(|c| c.thread_id == thread.as_str()) {
        parts.sandbox.stop(&c.container_id).await?;
        parts.api.close(&c.session_id).await;
    }
    Ok(())
}

/// Adopts a parked sandbox of the agent's pool when there is one (`warm`), otherwise
/// (a miss, or an adoption that failed: the runtime removed that sandbox) starts a
/// container (`cold`). A parked sandbox refused as not adoptable (another adopter won
/// it: a 409 on Kubernetes) is left to its winner and the next one is taken, at most
/// [`ADOPT_TRIES`] in all.
async fn launch(
    parts: &SupervisorParts,
    agent: &str,
    spec: &SandboxSpec,
) -> Result<(SandboxHandle, &'static str), SandboxError> {
    for _ in 0..ADOPT_TRIES {
        let Some(parked) = parts.pool.as_ref().and_then(|pool| pool.take(agent)) else {
            break;
        };
        match parts.sandbox.adopt(&parked, spec).await {
            Ok(handle) => return Ok((handle, "warm")),
            Err(e @ SandboxError::NotAdoptable { .. }) => {
                tracing::warn!(container = %parked.container_id, error = %e, "a parked sandbox cannot be adopted; taking the next");
            }
            Err(e) => {
                tracing::warn!(container = %parked.container_id, error = %e, "cannot adopt a parked sandbox; starting a container");
                break;
            }
        }
    }
    parts.sandbox.start(spec).await.map(|h| (h, "cold"))
}

/// Parked sandboxes a start tries to adopt before it starts one cold.
const ADOPT_TRIES: usize = 3;

/// Removes the container, commits the worktree onto the thread's branch, and when the
/// session ends also pushes the branch and removes the worktree.
pub(super) async fn stop_session(
    parts: &SupervisorParts,
    row: &SessionRow,
    end: bool,
    lease: Option<Lease>,
) -> anyhow::Result<()> {
    // A pod's workspace comes into the worktree while the pod still runs; a pod that
    // cannot send it leaves the worktree at its last checkpoint.
    if let Some(pods) = &parts.pod_sync
        && let Err(e) = pods.pull(&row.session_id).await
    {
        tracing::warn!(thread = %row.thread_id, error = %format!("{e:#}"), "the pod's workspace could not be brought back before its stop; its last checkpoint is committed");
    }
    if let Some(container) = &row.container_id {
        match parts.sandbox.stop(container).await {
            // Another instance's container (a session taken over from an owner that
            // died): not this instance's to stop; its own instance reaps it when it
            // comes back, since it no longer holds the thread's lease.
            Err(SandboxError::NotOwned { .. }) => {
                tracing::info!(thread = %row.thread_id, "the session's container belongs to another instance; left to it");
            }
            other => other?,
        }
    }
    parts.api.close(&row.session_id).await;
    // After the close: its relay can no longer reach it to be remembered again.
    if let Some(pods) = &parts.pod_sync {
        pods.forget(&row.session_id);
    }
    let Some(worktree) = row.worktree.clone() else {
        return Ok(());
    };
    let secrets = parts.secrets.all().await?;
    let workspaces = parts.workspaces.clone();
    let thread = row.thread_id.clone();
    let published = crate::tasks::Tasks::spawn_blocking(move || -> anyhow::Result<Option<_>> {
        let path = PathBuf::from(&worktree);
        // An unmounted workspace image: a stop that crashed after committing, pushing
        // and unmounting; what the directory shows now is not the session's work.
        if path.exists() && !volume::is_unmounted(&path) {
            commit_worktree(workspaces.as_ref(), &thread, &path, &secrets)?;
        }
        if !end {
            // Going idle is a checkpoint too: another instance may resume the thread.
            push_checkpoint(workspaces.as_ref(), &thread);
            return Ok(None);
        }
        // Only a branch with changes is pushed and published; without a remote, push
        // does nothing and the branch stays local.
        let changed = workspaces.has_changes(&thread)?;
        let published = if changed {
            workspaces.push(&thread)?;
            let message = workspaces.tip_message(&thread)?;
            let files = workspaces.changed_files(&thread, MAX_LISTED_FILES)?;
            Some((message, files))
        } else {
            None
        };
        // On a workspace filesystem, removing empties it and then cannot remove the
        // mount point: unmount only then (never before the work is gone, so no later
        // commit can see the checkout under the mount), and remove what is left.
        if workspaces.remove_worktree(&thread).is_err() {
            volume::unmount(&path)?;
            workspaces.remove_worktree(&thread)?;
        }
        volume::unmount(&path)?;
        volume::remove_image(&path)?;
        Ok(published)
    })
    .await??;
    if let (Some((message, files)), Some(publisher)) = (published, &parts.publisher) {
        match lease {
            Some(lease) => {
                let scope = scope_of(row, lease);
                publish(
                    publisher.as_ref(),
                    &scope,
                    &row.branch,
                    message.as_deref(),
                    &files,
                )
                .await;
            }
            // Not the thread's owner any more: the pushed branch is published by the
            // owner's next end of the session.
            None => {
                tracing::warn!(thread = %row.thread_id, "no lease on the thread; its pull request is left to its owner")
            }
        }
    }
    Ok(())
}

/// Commits what the agent left in `worktree` onto the thread's branch, logging what
/// was left out (by name and reason, never content). Blocking.
pub(super) fn commit_worktree(
    workspaces: &dyn WorkspaceOps,
    thread: &ThreadId,
    worktree: &Path,
    secrets: &[(String, SecretString)],
) -> anyhow::Result<CommitReport> {
    let report = workspaces.commit(thread, worktree, secrets)?;
    for skipped in report.skipped.iter().take(20) {
        tracing::warn!(thread = %thread, file = %skipped, "left a file out of the commit");
    }
    if report.skipped.len() > 20 {
        let more = report.skipped.len() - 20;
        tracing::warn!(thread = %thread, more, "left more files out of the commit");
    }
    if let Some(commit) = &report.commit {
        tracing::info!(thread = %thread, commit, "committed the session's work");
    }
    Ok(report)
}

/// Pushes the branch of a session that goes idle when it has changes; a failure is
/// logged (the remote's credentials replaced) and the next checkpoint or end pushes.
fn push_checkpoint(workspaces: &dyn WorkspaceOps, thread: &ThreadId) {
    if !workspaces.has_remote() {
        return;
    }
    let pushed = workspaces.has_changes(thread).and_then(|changed| {
        if changed {
            workspaces.push(thread)
        } else {
            Ok(())
        }
    });
    if let Err(e) = pushed {
        tracing::warn!(thread = %thread, error = %format!("{e:#}"), "cannot push the idle session's branch; pushed at its next checkpoint or end");
    }
}

/// Opens or updates the ended session's draft pull request. A failure is logged and
/// does not keep the session from ending: its branch is already pushed, and the next
/// end of the thread's session updates the same pull request.
async fn publish(
    publisher: &dyn BranchPublisher,
    scope: &SessionScope,
    branch: &str,
    message: Option<&str>,
    files: &ChangedFiles,
) {
    match publisher.publish(scope, branch, message, files).await {
        Ok(pull) => tracing::info!(
            thread = %scope.thread_id,
            number = pull.number,
            created = pull.created,
            "published the session's draft pull request"
        ),
        Err(e) => tracing::error!(
            thread = %scope.thread_id,
            error = %e,
            "cannot open the session's draft pull request"
        ),
    }
}
