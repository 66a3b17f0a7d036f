//! The git side of a session, as the supervisor sees it: a trait so the orchestration
//! logic is tested with an in-memory fake, implemented for real by
//! [`crate::workspace::Workspaces`].

use crate::ids::ThreadId;
use crate::secrets::ExposeSecret as _;
use std::path::{Path, PathBuf};

use crate::secrets::SecretString;
use crate::workspace::ChangedFiles;

/// A thread's branch checked out for its container.
#[derive(Debug, Clone)]
pub struct PreparedWorktree {
    pub path: PathBuf,
    pub branch: String,
}

/// What committing a worktree did.
#[derive(Debug, Clone, Default)]
pub struct CommitReport {
    /// The new commit on the thread's branch, if anything changed.
    pub commit: Option<String>,
    /// Files left out, with why (a secret's name, never its value).
    pub skipped: Vec<String>,
}

/// Branch and worktree operations for one thread at a time (the supervisor never runs
/// two for the same thread at once). Blocking: call from `spawn_blocking`.
pub trait WorkspaceOps: Send + Sync {
    /// The branch a thread's session works on.
    fn branch_name(&self, thread_id: &ThreadId) -> String;
    /// Creates the thread's branch from the default branch if needed and checks it out.
    fn prepare(&self, thread_id: &ThreadId) -> anyhow::Result<PreparedWorktree>;
    /// Commits what the agent left in `worktree` onto the thread's branch, leaving out
    /// any file that contains one of `secrets`.
    fn commit(
        &self,
        thread_id: &ThreadId,
        worktree: &Path,
        secrets: &[(String, SecretString)],
    ) -> anyhow::Result<CommitReport>;
    /// Removes the worktree; the branch stays.
    fn remove_worktree(&self, thread_id: &ThreadId) -> anyhow::Result<()>;
    /// Pushes the thread's branch (only it) when a remote is configured.
    fn push(&self, thread_id: &ThreadId) -> anyhow::Result<()>;
    /// Whether a remote is configured: checkpoints push to it and `prepare` brings a
    /// branch another instance pushed back from it.
    fn has_remote(&self) -> bool {
        false
    }
    /// Whether the thread's branch holds commits the default branch does not; only then
    /// is it pushed and published when the session ends.
    fn has_changes(&self, _thread_id: &ThreadId) -> anyhow::Result<bool> {
        Ok(true)
    }
    /// The message of the branch's tip commit, when it has changes.
    fn tip_message(&self, _thread_id: &ThreadId) -> anyhow::Result<Option<String>> {
        Ok(None)
    }
    /// The paths the thread's branch changed against the default branch, the first
    /// `limit` of them.
    fn changed_files(&self, thread_id: &ThreadId, limit: usize) -> anyhow::Result<ChangedFiles>;
}

impl WorkspaceOps for crate::workspace::Workspaces {
    fn branch_name(&self, thread_id: &ThreadId) -> String {
        crate::workspace::Workspaces::branch_name(thread_id)
    }

    fn prepare(&self, thread_id: &ThreadId) -> anyhow::Result<PreparedWorktree> {
        let w = crate::workspace::Workspaces::prepare(self, thread_id)?;
        Ok(PreparedWorktree {
            path: w.path,
            branch: w.branch,
        })
    }

    fn commit(
        &self,
        thread_id: &ThreadId,
        _worktree: &Path,
        secrets: &[(String, SecretString)],
    ) -> anyhow::Result<CommitReport> {
        let pairs: Vec<(&str, &[u8])> = secrets
            .iter()
            .map(|(name, value)| (name.as_str(), value.expose_secret().as_bytes()))
            .collect();
        let outcome = crate::workspace::Workspaces::commit(self, thread_id, &pairs)?;
        Ok(CommitReport {
            commit: outcome.commit,
            skipped: outcome
                .skipped
                .iter()
                .map(|s| format!("{}: {}", s.path.display(), s.reason))
                .collect(),
        })
    }

    fn remove_worktree(&self, thread_id: &ThreadId) -> anyhow::Result<()> {
        Ok(crate::workspace::Workspaces::remove_worktree(
            self, thread_id,
        )?)
    }

    fn push(&self, thread_id: &ThreadId) -> anyhow::Result<()> {
        Ok(crate::workspace::Workspaces::push(self, thread_id)?)
    }

    fn has_remote(&self) -> bool {
        crate::workspace::Workspaces::has_remote(self)
    }

    fn has_changes(&self, thread_id: &ThreadId) -> anyhow::Result<bool> {
        Ok(crate::workspace::Workspaces::has_changes(self, thread_id)?)
    }

    fn tip_message(&self, thread_id: &ThreadId) -> anyhow::Result<Option<String>> {
        Ok(crate::workspace::Workspaces::tip_message(self, thread_id)?)
    }

    fn changed_files(&self, thread_id: &ThreadId, limit: usize) -> anyhow::Result<ChangedFiles> {
        Ok(crate::workspace::Workspaces::changed_files(
            self, thread_id, limit,
        )?)
    }
}
