//! The gateway's side of a workspace that lives in a pod: the thread's branch tip
//! handed out as a bundle, and the pod's work received back as one.
//!
//! A received bundle is verified in a quarantine (see `bundle.rs`): it names only the
//! thread's branch, has exactly one prerequisite, a commit of threadgate's repository,
//! and its tip descends from it; its tree is safe to write and within the caps. Then
//! its tip's tree is written into the thread's worktree directory in place of what
//! was there, so the session's ordinary commit (the checkpoint's, the stop's) takes it
//! onto the branch with every rule a Docker worktree meets: the secret scan, the
//! commit caps, symlinks stored as links, reserved names left out. The pod's own
//! commit objects never reach the branch.
//!
//! When the base the pod started from is no longer in the branch's history (the
//! branch was moved to another instance's tip meanwhile), the pod's tip is kept under
//! `refs/threadgate-backup/<thread-id>/<commit>`, as a diverged local tip is when the
//! remote's wins, and the worktree is left alone.

use std::path::Path;

use git2::{Oid, Repository};

use crate::ids::ThreadId;
use crate::workspace::bundle::{self, BundleError, BundleLimits, Deadline, Quarantine};
use crate::workspace::refs::branch_tip;
use crate::workspace::remote::BACKUP_PREFIX;
use crate::workspace::{Settings, WorkspaceError, mirror};

/// What receiving a pod's bundle did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Received {
    /// The worktree now shows the pod's tip's tree; the next commit takes it.
    Mirrored {
        /// The pod's tip (its own commit, not on the branch).
        tip: String,
    },
    /// The base the pod started from is no longer in the branch's history: its tip is
    /// kept under `backup`, and neither the branch nor the worktree moved.
    Diverged {
        /// The full name of the ref holding the pod's tip.
        backup: String,
    },
}

/// The thread's branch tip and its tree (no history) as a bundle naming the branch.
pub(crate) fn hand_out(
    settings: &Settings,
    thread_id: &ThreadId,
) -> Result<Vec<u8>, WorkspaceError> {
    let thread_ref = settings.thread_ref(thread_id)?;
    let repo = settings.open_repository()?;
    let tip = branch_tip(&repo, thread_id, &thread_ref)?.ok_or_else(|| {
        WorkspaceError::BranchMissing {
            thread_id: thread_id.to_owned(),
            branch: thread_ref.clone(),
        }
    })?;
    let git_err = |action| WorkspaceError::git(thread_id, action);
    let mut pack = repo
        .packbuilder()
        .map_err(git_err("packing the branch tip"))?;
    pack.insert_commit(tip)
        .map_err(git_err("packing the branch tip"))?;
    let mut bytes = git2::Buf::new();
    pack.write_buf(&mut bytes)
        .map_err(git_err("packing the branch tip"))?;
    Ok(bundle::write(&[], &[(tip, thread_ref.as_str())], &bytes))
}

/// Verifies a pod's bundle and writes its tip's tree into the thread's worktree (see
/// the module's doc). A refusal changes nothing.
pub(crate) fn receive(
    settings: &Settings,
    thread_id: &ThreadId,
    bytes: &[u8],
    limits: &BundleLimits,
) -> Result<Received, BundleError> {
    let deadline = Deadline::after(limits.max_time);
    let thread_ref = settings
        .thread_ref(thread_id)
        .map_err(|_| BundleError::Base {
            reason: "the thread has no branch".into(),
        })?;
    let parsed = bundle::parse(bytes, limits)?;
    let tip = bundle::only_ref(&parsed, &thread_ref)?;
    let [base] = parsed.prerequisites.as_slice() else {
        return Err(BundleError::Base {
            reason: format!(
                "{} given, exactly one (the commit handed out) expected",
                parsed.prerequisites.len()
            ),
        });
    };
    let base = *base;
    let repo = settings.open_repository().map_err(|_| BundleError::Base {
        reason: "threadgate's repository cannot be opened".into(),
    })?;
    if repo.find_commit(base).is_err() {
        return Err(BundleError::Base {
            reason: format!("{base} is not a commit of threadgate's repository"),
        });
    }
    let current = branch_tip(&repo, thread_id, &thread_ref)
        .ok()
        .flatten()
        .ok_or_else(|| BundleError::Base {
            reason: "the thread's branch does not exist".into(),
        })?;
    let quarantine = Quarantine::index(&settings.worktrees_dir, Some(&repo), parsed.pack)?;
    deadline.check()?;
    let held = &quarantine.repo;
    let commit = held.find_commit(tip).map_err(|_| BundleError::Garbled {
        reason: format!("its tip {tip} is not a commit it holds"),
    })?;
    let descends = tip == base
        || held
            .graph_descendant_of(tip, base)
            .map_err(BundleError::git("comparing the tip with its base"))?;
    if !descends {
        return Err(BundleError::NotFastForward {
            base: base.to_string(),
            tip: tip.to_string(),
        });
    }
    let tree = commit.tree_id();
    bundle::check_tree(held, tree, limits, deadline)?;
    deadline.check()?;
    let on_branch = base == current
        || repo
            .graph_descendant_of(current, base)
            .map_err(BundleError::git("comparing the base with the branch"))?;
    if !on_branch {
        return keep_diverged(&repo, thread_id, tip, parsed.pack);
    }
    let worktree = settings.worktrees_dir.join(thread_id);
    mirror(held, thread_id, tree, &worktree)?;
    tracing::info!(thread_id = %thread_id, pod_tip = %tip, "the pod's workspace is in the worktree");
    Ok(Received::Mirrored {
        tip: tip.to_string(),
    })
}

/// Copies the pod's objects into threadgate's repository and keeps its tip under a
/// backup ref; the branch does not move.
fn keep_diverged(
    repo: &Repository,
    thread_id: &ThreadId,
    tip: Oid,
    pack: &[u8],
) -> Result<Received, BundleError> {
    bundle::store_pack(repo, pack)?;
    let backup = format!("{BACKUP_PREFIX}{thread_id}/{tip}");
    match repo.reference(
        &backup,
        tip,
        false,
        &format!("threadgate: the pod's work on thread {thread_id}, past a moved branch"),
    ) {
        Ok(_) => {}
        Err(e) if e.code() == git2::ErrorCode::Exists => {}
        Err(e) => return Err(BundleError::git("keeping the pod's tip")(e)),
    }
    tracing::warn!(thread_id = %thread_id, pod_tip = %tip, backup = %backup, "the pod started from a base the branch has left; its work is kept under the backup ref");
    Ok(Received::Diverged { backup })
}

/// Makes `worktree` show `tree`, writing only what differs (`mirror.rs`). In place, not
/// swapped in, since the worktree may be a mounted workspace filesystem.
fn mirror(
    held: &Repository,
    thread_id: &ThreadId,
    tree: Oid,
    worktree: &Path,
) -> Result<(), BundleError> {
    match std::fs::symlink_metadata(worktree) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => {
            return Err(BundleError::Io {
                path: worktree.to_owned(),
                source: std::io::Error::other("the worktree is not a directory"),
            });
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir(worktree).map_err(BundleError::io(worktree))?;
        }
        Err(e) => return Err(BundleError::io(worktree)(e)),
    }
    let tree = held
        .find_tree(tree)
        .map_err(BundleError::git("reading the tip's tree"))?;
    let changes = mirror::mirror_tree(held, &tree, worktree)?;
    tracing::debug!(thread_id = %thread_id, written = changes.written, modes = changes.modes, removed = changes.removed, kept = changes.kept, "the worktree follows the pod's tree");
    Ok(())
}

/// Removes everything inside `dir`, keeping `dir`. `remove_dir_all` never follows a
/// symlink; a symlink is removed as itself.
pub(crate) fn empty_dir(dir: &Path) -> Result<(), BundleError> {
    for entry in std::fs::read_dir(dir).map_err(BundleError::io(dir))? {
        let entry = entry.map_err(BundleError::io(dir))?;
        let path = entry.path();
        let kind = entry.file_type().map_err(BundleError::io(&path))?;
        let removed = if kind.is_dir() {
            std::fs::remove_dir_all(&path).or_else(|_| {
                crate::workspace::remove::make_owner_writable(&path);
                std::fs::remove_dir_all(&path)
            })
        } else {
            std::fs::remove_file(&path)
        };
        removed.map_err(BundleError::io(&path))?;
    }
    Ok(())
}
