//! The one error type of the workspace module; every variant names the thread or path.

use std::path::PathBuf;

use crate::ids::ThreadId;

/// Everything that can go wrong while preparing, committing, removing or pushing a
/// thread's workspace. Messages never contain file contents or secret values.
#[derive(Debug, thiserror::Error)]
pub enum WorkspaceError {
    /// The thread id cannot be used as a branch component and directory name.
    #[error("invalid thread id {thread_id:?}: {reason}")]
    InvalidThreadId {
        /// The rejected id (truncated if very long).
        thread_id: ThreadId,
        /// Which rule it broke.
        reason: &'static str,
    },
    /// threadgate's configured repository could not be opened.
    #[error("cannot open repository {path}: {source}")]
    OpenRepository {
        /// The configured repository path.
        path: PathBuf,
        /// The libgit2 error.
        source: git2::Error,
    },
    /// The configured or HEAD default branch is unusable.
    #[error("default branch of repository {path}: {reason}")]
    DefaultBranch {
        /// The configured repository path.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The worktrees directory could not be created or is badly placed.
    #[error("worktrees directory {path}: {reason}")]
    WorktreesDir {
        /// The configured worktrees directory.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The configured remote is empty or contains a NUL byte.
    #[error("remote {remote:?} is not a usable remote name or url")]
    InvalidRemote {
        /// The configured remote.
        remote: String,
    },
    /// A git operation on threadgate's repository failed.
    #[error("git error for thread {thread_id} while {action}: {source}")]
    Git {
        /// The thread whose workspace was being handled.
        thread_id: ThreadId,
        /// What was being done, e.g. "writing the tree".
        action: &'static str,
        /// The libgit2 error.
        source: git2::Error,
    },
    /// A filesystem operation failed.
    #[error("filesystem error for thread {thread_id} at {path}: {source}")]
    Io {
        /// The thread whose workspace was being handled.
        thread_id: ThreadId,
        /// The path involved.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The thread's branch does not exist (commit or push before prepare).
    #[error("branch {branch} of thread {thread_id} does not exist")]
    BranchMissing {
        /// The thread.
        thread_id: ThreadId,
        /// The full branch name.
        branch: String,
    },
    /// The branch moved between reading its tip and updating it.
    #[error("branch {branch} of thread {thread_id} moved while committing; nothing was written")]
    BranchMoved {
        /// The thread.
        thread_id: ThreadId,
        /// The full branch name.
        branch: String,
    },
    /// The thread's worktree path exists but is not a plain directory.
    #[error("worktree {path} of thread {thread_id} is not a directory")]
    NotADirectory {
        /// The thread.
        thread_id: ThreadId,
        /// The worktree path.
        path: PathBuf,
    },
    /// The thread's worktree directory does not exist (commit before prepare).
    #[error("worktree {path} of thread {thread_id} does not exist")]
    WorktreeMissing {
        /// The thread.
        thread_id: ThreadId,
        /// The worktree path.
        path: PathBuf,
    },
    /// The secret values could not be compiled into a matcher.
    #[error("cannot scan the worktree of thread {thread_id} for secrets: {reason}")]
    SecretScanner {
        /// The thread.
        thread_id: ThreadId,
        /// The matcher's build error (it never contains the values).
        reason: String,
    },
    /// The remote could not be read while bringing the thread's branch back from it.
    #[error("remote {remote} for thread {thread_id}, while {action}: {message}")]
    Remote {
        /// The thread.
        thread_id: ThreadId,
        /// What was being done, e.g. "connecting to the remote".
        action: &'static str,
        /// The configured remote name or URL, credentials replaced.
        remote: String,
        /// libgit2's message, credentials replaced.
        message: String,
    },
    /// The remote refused the branch update.
    #[error("remote {remote} rejected {branch} of thread {thread_id}: {message}")]
    PushRejected {
        /// The thread.
        thread_id: ThreadId,
        /// The full ref pushed.
        branch: String,
        /// The configured remote name or URL, credentials replaced.
        remote: String,
        /// The remote's message, credentials replaced.
        message: String,
    },
}

impl WorkspaceError {
    pub(crate) fn git(
        thread_id: &ThreadId,
        action: &'static str,
    ) -> impl FnOnce(git2::Error) -> Self {
        let thread_id = thread_id.to_owned();
        move |source| WorkspaceError::Git {
            thread_id,
            action,
            source,
        }
    }

    pub(crate) fn io(
        thread_id: &ThreadId,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> Self {
        let thread_id = thread_id.to_owned();
        let path = path.into();
        move |source| WorkspaceError::Io {
            thread_id,
            path,
            source,
        }
    }
}
