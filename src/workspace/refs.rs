//! The thread's branch as a reference: its tip read, and moved only from the tip a
//! commit started from. A leaf of `workspace`: preparing, committing and syncing with
//! the remote all use it.

use git2::{ErrorCode, Oid, Repository};

use crate::ids::ThreadId;
use crate::workspace::WorkspaceError;

/// The commit a thread's branch points at, or `None` if the branch does not exist.
/// A symbolic ref in its place is an error, never followed.
pub(crate) fn branch_tip(
    repo: &Repository,
    thread_id: &ThreadId,
    thread_ref: &str,
) -> Result<Option<Oid>, WorkspaceError> {
    let reference = match repo.find_reference(thread_ref) {
        Ok(reference) => reference,
        Err(e) if e.code() == ErrorCode::NotFound => return Ok(None),
        Err(e) => return Err(WorkspaceError::git(thread_id, "reading the branch")(e)),
    };
    let Some(target) = reference.target() else {
        return Err(WorkspaceError::git(thread_id, "reading the branch")(
            git2::Error::from_str("the branch is a symbolic reference"),
        ));
    };
    Ok(Some(target))
}

/// Moves exactly `thread_ref` from `old` to `new`, failing if it no longer points at
/// `old` (libgit2 checks under the ref's lock file).
pub(crate) fn move_branch(
    repo: &Repository,
    thread_id: &ThreadId,
    thread_ref: &str,
    old: git2::Oid,
    new: git2::Oid,
) -> Result<(), WorkspaceError> {
    let log = format!("threadgate: commit work of thread {thread_id}");
    match repo.reference_matching(thread_ref, new, true, old, &log) {
        Ok(_) => Ok(()),
        Err(e) if matches!(e.code(), ErrorCode::Modified | ErrorCode::Locked) => {
            Err(WorkspaceError::BranchMoved {
                thread_id: thread_id.to_owned(),
                branch: thread_ref.to_owned(),
            })
        }
        Err(e) => Err(WorkspaceError::git(thread_id, "moving the branch")(e)),
    }
}
