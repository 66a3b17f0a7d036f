//! Committing a worktree onto its thread's branch (pushing it is `remote.rs`'s).

use std::fmt::Write as _;
use std::io::Write as _;

use git2::{Repository, Signature};
use rustix::fs::{CWD, Mode, OFlags};

use crate::ids::ThreadId;
use crate::workspace::refs::{branch_tip, move_branch};
use crate::workspace::snapshot::{SecretScanner, Snapshot};
use crate::workspace::{CommitOutcome, Settings, SkippedFile, WorkspaceError};

pub(crate) fn commit(
    settings: &Settings,
    thread_id: &ThreadId,
    secrets: &[(&str, &[u8])],
) -> Result<CommitOutcome, WorkspaceError> {
    let thread_ref = settings.thread_ref(thread_id)?;
    let scanner = SecretScanner::new(secrets).map_err(|reason| WorkspaceError::SecretScanner {
        thread_id: thread_id.to_owned(),
        reason,
    })?;
    let repo = settings.open_repository()?;
    let old_tip = branch_tip(&repo, thread_id, &thread_ref)?.ok_or_else(|| {
        WorkspaceError::BranchMissing {
            thread_id: thread_id.to_owned(),
            branch: thread_ref.clone(),
        }
    })?;
    let parent = repo
        .find_commit(old_tip)
        .map_err(WorkspaceError::git(thread_id, "reading the branch tip"))?;
    let base = parent
        .tree()
        .map_err(WorkspaceError::git(thread_id, "reading the branch tip"))?;

    let root = open_worktree_root(settings, thread_id)?;
    // Every small object of this commit is written in memory, then stored as one pack: a
    // worktree of many small files must not become as many loose objects on disk. Large
    // blobs go straight to disk through a second handle without the in-memory backend.
    let odb = repo.odb().map_err(WorkspaceError::git(
        thread_id,
        "reading the object database",
    ))?;
    let pending = odb
        .add_new_mempack_backend(MEMPACK_PRIORITY)
        .map_err(WorkspaceError::git(thread_id, "opening the in-memory pack"))?;
    let loose = settings.open_repository()?;
    let mut snapshot = Snapshot::new((&repo, &loose), thread_id, scanner, settings.commit_limits);
    let tree_id = snapshot.root_tree(&root, &base)?;
    let skipped = snapshot.into_skipped();
    if tree_id == base.id() {
        return Ok(CommitOutcome {
            commit: None,
            skipped,
        });
    }

    let tree = repo
        .find_tree(tree_id)
        .map_err(WorkspaceError::git(thread_id, "reading the new tree"))?;
    let signature = thread_signature(thread_id)?;
    let message = commit_message(thread_id, &skipped);
    // No ref moves here: the commit object is written and nothing points at it yet.
    let new_tip = repo
        .commit(None, &signature, &signature, &message, &tree, &[&parent])
        .map_err(WorkspaceError::git(thread_id, "writing the commit"))?;
    write_pack(&repo, &odb, &pending, thread_id)?;
    move_branch(&repo, thread_id, &thread_ref, old_tip, new_tip)?;
    tracing::info!(thread_id = %thread_id, commit = %new_tip, skipped = skipped.len(), "committed worktree");
    Ok(CommitOutcome {
        commit: Some(new_tip.to_string()),
        skipped,
    })
}

/// The in-memory pack's priority among the object database's backends: above the
/// on-disk ones, so that every object written during a commit lands in it.
const MEMPACK_PRIORITY: i32 = 999;

/// At most this many left-out files are listed one by one in a commit message.
const MAX_LISTED_SKIPS: usize = 100;

/// Stores what `pending` holds as one indexed pack in the repository, before any ref
/// points at it.
fn write_pack(
    repo: &Repository,
    odb: &git2::Odb<'_>,
    pending: &git2::Mempack<'_>,
    thread_id: &ThreadId,
) -> Result<(), WorkspaceError> {
    let mut pack = git2::Buf::new();
    pending.dump(repo, &mut pack).map_err(WorkspaceError::git(
        thread_id,
        "packing the commit's objects",
    ))?;
    let mut writer = odb
        .packwriter()
        .map_err(WorkspaceError::git(thread_id, "writing the pack"))?;
    writer.write_all(&pack).map_err(WorkspaceError::io(
        thread_id,
        repo.path().join("objects/pack"),
    ))?;
    writer
        .commit()
        .map_err(WorkspaceError::git(thread_id, "indexing the pack"))?;
    pending.reset().map_err(WorkspaceError::git(
        thread_id,
        "clearing the in-memory pack",
    ))
}

/// Opens the worktree root without following a symlink in its place.
fn open_worktree_root(
    settings: &Settings,
    thread_id: &ThreadId,
) -> Result<std::os::fd::OwnedFd, WorkspaceError> {
    let path = settings.worktrees_dir.join(thread_id);
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    rustix::fs::openat(CWD, &path, flags, Mode::empty()).map_err(|e| match e {
        rustix::io::Errno::NOENT => WorkspaceError::WorktreeMissing {
            thread_id: thread_id.to_owned(),
            path,
        },
        rustix::io::Errno::NOTDIR | rustix::io::Errno::LOOP => WorkspaceError::NotADirectory {
            thread_id: thread_id.to_owned(),
            path,
        },
        other => WorkspaceError::io(thread_id, path)(other.into()),
    })
}

/// Author and committer of a thread's commits: derived from the thread id alone.
fn thread_signature(thread_id: &ThreadId) -> Result<Signature<'static>, WorkspaceError> {
    Signature::now(
        &format!("threadgate thread {thread_id}"),
        &format!("{thread_id}@threadgate.invalid"),
    )
    .map_err(WorkspaceError::git(thread_id, "making the signature"))
}

fn commit_message(thread_id: &ThreadId, skipped: &[SkippedFile]) -> String {
    let mut message = format!(
        "threadgate: work on thread {thread_id}\n\n\
         What the support session for thread {thread_id} left in its worktree.\n"
    );
    if !skipped.is_empty() {
        message.push_str("\nLeft out:\n");
        for file in skipped.iter().take(MAX_LISTED_SKIPS) {
            // Paths and reasons never carry a secret value (see SkippedFile); the path is
            // quoted so that an agent-chosen name cannot forge lines of the message.
            let _ = writeln!(message, "- {:?}: {}", file.path, file.reason);
        }
        if skipped.len() > MAX_LISTED_SKIPS {
            let _ = writeln!(
                message,
                "- and {} more entries, not listed",
                skipped.len() - MAX_LISTED_SKIPS
            );
        }
    }
    let _ = write!(message, "\nThreadgate-Thread: {thread_id}\n");
    message
}
