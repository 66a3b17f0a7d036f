//! What a thread's branch changed: the paths of its tip's tree that differ from the
//! default branch's tip (what an engineer reviews in the pull request).

use super::{Settings, WorkspaceError, refs};
use crate::ids::ThreadId;

/// How one path differs between the default branch and the thread's branch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileChange {
    Added,
    Modified,
    Deleted,
}

impl FileChange {
    /// The word a description uses for it.
    pub fn as_str(self) -> &'static str {
        match self {
            FileChange::Added => "added",
            FileChange::Modified => "modified",
            FileChange::Deleted => "deleted",
        }
    }
}

/// The paths a thread's branch changed, the first `limit` of them in path order, and
/// how many there are in all.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChangedFiles {
    pub files: Vec<(String, FileChange)>,
    pub total: usize,
}

/// Diffs the thread branch tip's tree against the default branch tip's tree. A missing
/// thread branch changed nothing.
pub(super) fn changed_files(
    settings: &Settings,
    thread_id: &ThreadId,
    limit: usize,
) -> Result<ChangedFiles, WorkspaceError> {
    let thread_ref = settings.thread_ref(thread_id)?;
    let repo = settings.open_repository()?;
    let Some(tip) = refs::branch_tip(&repo, thread_id, &thread_ref)? else {
        return Ok(ChangedFiles::default());
    };
    let tree_of = |id: git2::Oid| repo.find_commit(id).and_then(|c| c.tree());
    let ours = tree_of(tip).map_err(WorkspaceError::git(thread_id, "reading the branch"))?;
    let base = repo
        .refname_to_id(&settings.default_ref)
        .and_then(tree_of)
        .map_err(WorkspaceError::git(thread_id, "reading the default branch"))?;
    let diff = repo
        .diff_tree_to_tree(Some(&base), Some(&ours), None)
        .map_err(WorkspaceError::git(
            thread_id,
            "comparing with the default branch",
        ))?;
    let mut changed = ChangedFiles {
        files: Vec::new(),
        total: diff.deltas().len(),
    };
    for delta in diff.deltas().take(limit) {
        let (change, file) = match delta.status() {
            git2::Delta::Added => (FileChange::Added, delta.new_file()),
            git2::Delta::Deleted => (FileChange::Deleted, delta.old_file()),
            _ => (FileChange::Modified, delta.new_file()),
        };
        let path = file
            .path()
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        changed.files.push((path, change));
    }
    Ok(changed)
}
