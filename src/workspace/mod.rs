//! One git branch and one worktree per support thread, and a safe way to commit what
//! the agent left there.
//!
//! Every thread gets the branch `threadgate/<thread-id>` in threadgate's own configured
//! repository, created from the default branch, and a directory
//! `<worktrees_dir>/<thread-id>` that is mounted into the sandbox at `/workspace`.
//!
//! # The worktree is not a git worktree
//!
//! The agent controls every byte of its directory, `.git` included, and the directory is
//! the only thing the container sees. So the directory is a plain copy of the branch's
//! tree written by threadgate itself (no checkout filters, no attributes), plus a small
//! standalone `.git` made for the agent's convenience: it holds a shallow copy of the
//! branch tip (same commit id, a pack of that commit's tree, a `shallow` file) and an
//! index that matches the files, so `git status`, `git diff` and `git log -1` work inside
//! the sandbox. It contains no path of the host and threadgate never reads it back.
//!
//! # Committing
//!
//! [`Workspaces::commit`] opens the repository at the configured path (never anything
//! found in the worktree), walks the worktree with `openat`/`O_NOFOLLOW` so that no
//! symlink is ever followed and no swapped path can redirect the walk, builds the tree
//! itself (`.git` skipped at every level, symlinks stored as links, files containing a
//! secret value in any form the gateway's redactor finds, raw or encoded, left out and
//! reported), writes the commit without touching any ref, and
//! then moves only `refs/heads/threadgate/<thread-id>` with a compare-and-swap against
//! the tip it started from. libgit2 never runs hooks, and nothing reads configuration,
//! attributes or filters from the worktree. The default branch is never written: it
//! cannot live under `threadgate/` (checked when opening).
//!
//! # The remote
//!
//! With a remote configured, [`Workspaces::push`] sends the thread's branch (only it,
//! as a fast-forward) at every checkpoint, and [`Workspaces::prepare`] first brings the
//! branch back from the remote (`remote.rs`): another instance that takes the thread
//! over continues from the last pushed checkpoint. A local branch behind the remote's
//! is fast-forwarded; one that diverged is moved to the remote's tip and its own tip is
//! kept under `refs/threadgate-backup/<thread-id>/<commit>`; in both cases a worktree
//! directory left from the old tip is written again.
//!
//! # Concurrency
//!
//! All methods block; call them from `spawn_blocking`. Each call opens its own handle on
//! the repository, so calls for different threads may run at once (they touch different
//! refs, and libgit2 writes objects atomically). Calls for the same thread must be
//! serialised by the caller. `commit` should run after the sandbox has stopped; the walk
//! is safe against a running agent but would see a half-written state.

mod bundle;
mod changes;
mod commit;
mod error;
mod handoff;
mod mirror;
mod names;
mod pod;
mod prepare;
mod refs;
mod remote;
mod remove;
mod snapshot;
pub mod volume;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_handoff;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use git2::{Repository, RepositoryOpenFlags};

use crate::ids::ThreadId;

pub use bundle::{BundleError, BundleLimits};
pub use changes::{ChangedFiles, FileChange};
pub use error::WorkspaceError;
pub use handoff::Received;
pub use pod::{PodBase, PodWork, PodWorkspace};
pub use remote::RemoteSync;
pub use snapshot::{LOOSE_BLOB_BYTES, MAX_DEPTH, MAX_FILE_BYTES};

/// Where threadgate's repository and the thread worktrees live.
#[derive(Clone)]
pub struct RepoConfig {
    /// threadgate's own configured repository (a working repository or a bare one).
    pub repo_path: PathBuf,
    /// The branch threads start from; `None` means the branch HEAD points at.
    pub default_branch: Option<String>,
    /// The directory that holds one worktree directory per thread; created if missing.
    pub worktrees_dir: PathBuf,
    /// A remote name (configured in the repository) or URL; `None` disables pushing.
    pub remote: Option<String>,
    /// What one commit may add to the repository.
    pub commit_limits: CommitLimits,
}

/// What one commit of a worktree may add to threadgate's repository (`[repo]
/// max_commit_files`, `max_commit_bytes`). Only content the repository does not hold
/// yet counts: an unchanged checkout of a large repository costs nothing. Past either
/// cap the remaining new files are left out (the branch keeps their previous versions)
/// and the commit message says so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommitLimits {
    /// New files (blobs, symlinks included) at most.
    pub max_files: usize,
    /// New bytes of file content at most.
    pub max_bytes: u64,
}

impl Default for CommitLimits {
    fn default() -> Self {
        CommitLimits {
            max_files: 10_000,
            max_bytes: 256 << 20,
        }
    }
}

/// Handle on the per-thread branches and worktrees. Cheap to clone and share.
#[derive(Debug, Clone)]
pub struct Workspaces {
    settings: Arc<Settings>,
}

/// A thread's worktree as [`Workspaces::prepare`] left it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Worktree {
    /// The directory to mount at `/workspace`.
    pub path: PathBuf,
    /// The branch name without `refs/heads/`, e.g. `threadgate/th_01H…`.
    pub branch: String,
    /// The branch tip (commit id, hex).
    pub head: String,
    /// True when the directory already existed and was kept as it was.
    pub resumed: bool,
    /// What bringing the branch back from the remote did.
    pub remote: RemoteSync,
}

/// What [`Workspaces::commit`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitOutcome {
    /// The new commit id, or `None` when the tree equals the branch tip's tree.
    pub commit: Option<String>,
    /// Entries of the worktree that were left out of the tree, and why.
    pub skipped: Vec<SkippedFile>,
}

/// One worktree entry left out of a commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedFile {
    /// The path relative to the worktree root. A name that contained a secret value is
    /// replaced by a placeholder, so this path never carries the value.
    pub path: PathBuf,
    /// Why it was left out.
    pub reason: SkipReason,
}

/// Why an entry was left out of a commit. The display text never contains a secret
/// value, only the secret's name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SkipReason {
    /// The file's content (or the symlink's target) contains the named secret's value.
    #[error("contains secret {secret}")]
    ContainsSecret {
        /// The secret's name.
        secret: String,
    },
    /// The entry's name contains the named secret's value.
    #[error("name contains secret {secret}")]
    NameContainsSecret {
        /// The secret's name.
        secret: String,
    },
    /// Not a regular file, directory or symlink (a fifo, socket or device).
    #[error("not a regular file, directory or symlink ({kind})")]
    Unsupported {
        /// What it is.
        kind: &'static str,
    },
    /// The file is larger than [`MAX_FILE_BYTES`]. If the branch already holds a file
    /// at that path, the branch's version is kept.
    #[error("larger than {limit} bytes; the branch keeps its previous version, if any")]
    TooLarge {
        /// The limit applied.
        limit: u64,
    },
    /// The directory is nested deeper than [`MAX_DEPTH`].
    #[error("nested deeper than {limit} directories")]
    TooDeep {
        /// The limit applied.
        limit: usize,
    },
    /// A name git reserves for itself on some platform (`.GIT`, `git~1`, ...).
    #[error("name reserved by git")]
    ReservedName,
    /// A `.gitmodules`, `.gitattributes`, `.gitignore` or `.mailmap` that is a symlink,
    /// which git refuses or warns about on checkout.
    #[error("git control file as a symlink")]
    SymlinkedGitFile,
    /// The commit already adds as many new files or bytes as [`CommitLimits`] allows;
    /// this file and `more` later ones are left out, and the branch keeps their previous
    /// versions.
    #[error(
        "this commit reached {cap}: left out with {more} more new files; the branch keeps their previous versions"
    )]
    OverCommitCap {
        /// The cap reached, by its config key and value.
        cap: String,
        /// How many further files were left out for the same reason.
        more: usize,
    },
    /// The entry could not be read (permissions, vanished while reading).
    #[error("unreadable: {error}")]
    Unreadable {
        /// The OS error.
        error: String,
    },
}

/// Settings resolved once by [`Workspaces::open`].
struct Settings {
    /// The repository path as configured (opened again for every call).
    repo_path: PathBuf,
    /// The default branch's full ref name, e.g. `refs/heads/main`.
    default_ref: String,
    /// The canonical worktrees directory.
    worktrees_dir: PathBuf,
    /// The remote to push to.
    remote: Option<String>,
    /// What one commit may add.
    commit_limits: CommitLimits,
}

impl Workspaces {
    /// Opens threadgate's repository, resolves the default branch and creates the
    /// worktrees directory.
    ///
    /// Refuses a default branch under `threadgate/` (a thread could then write it) and a
    /// worktrees directory that contains the repository or lies inside its git dir.
    pub fn open(cfg: RepoConfig) -> Result<Self, WorkspaceError> {
        let repo = open_repository(&cfg.repo_path)?;
        let default_ref = resolve_default_ref(&repo, &cfg)?;
        let worktrees_dir = prepare_worktrees_dir(&repo, &cfg.worktrees_dir)?;
        if let Some(remote) = &cfg.remote
            && (remote.is_empty() || remote.contains('\0'))
        {
            return Err(WorkspaceError::InvalidRemote {
                remote: names::redact_remote(remote),
            });
        }
        Ok(Workspaces {
            settings: Arc::new(Settings {
                repo_path: cfg.repo_path,
                default_ref,
                worktrees_dir,
                remote: cfg.remote,
                commit_limits: cfg.commit_limits,
            }),
        })
    }

    /// The branch name for a thread, `threadgate/<thread-id>` (a [`ThreadId`] is one
    /// safe ref component by construction).
    pub fn branch_name(thread_id: &ThreadId) -> String {
        format!("{}{thread_id}", names::BRANCH_PREFIX)
    }

    /// The default branch's full ref name, e.g. `refs/heads/main`.
    pub fn default_ref(&self) -> &str {
        &self.settings.default_ref
    }

    /// Brings the thread's branch back from the remote when one is configured and has
    /// it ([`RemoteSync`]; an unreachable remote is an error, so that no session starts
    /// from a branch another instance has moved on), creates it from the default
    /// branch's tip if it does not exist (or reuses it), and materialises the branch's
    /// tree at the thread's worktree path if that directory does not exist. An existing
    /// directory is kept untouched, so a resumed session finds the agent's uncommitted
    /// files, unless the remote moved the branch. Idempotent.
    pub fn prepare(&self, thread_id: &ThreadId) -> Result<Worktree, WorkspaceError> {
        prepare::prepare(&self.settings, thread_id)
    }

    /// Commits the thread's worktree onto its branch and moves only that branch.
    ///
    /// `secrets` are `(name, value)` pairs; a file whose content, symlink target or name
    /// contains a value (raw, or base64, hex, URL- or JSON-escaped: the gateway's
    /// [`crate::secrets::Redactor`]) is left out and reported by name. Empty values are
    /// ignored.
    /// Returns `commit: None` when the tree equals the branch tip's tree.
    pub fn commit(
        &self,
        thread_id: &ThreadId,
        secrets: &[(&str, &[u8])],
    ) -> Result<CommitOutcome, WorkspaceError> {
        commit::commit(&self.settings, thread_id, secrets)
    }

    /// Deletes the thread's worktree directory (without following any symlink in it) and
    /// keeps the branch. Succeeds when the directory is already gone.
    pub fn remove_worktree(&self, thread_id: &ThreadId) -> Result<(), WorkspaceError> {
        remove::remove_worktree(&self.settings, thread_id)
    }

    /// Whether the thread's branch holds commits the default branch does not (the
    /// session changed something). A missing branch has none.
    pub fn has_changes(&self, thread_id: &ThreadId) -> Result<bool, WorkspaceError> {
        let thread_ref = self.settings.thread_ref(thread_id)?;
        let repo = self.settings.open_repository()?;
        let Some(tip) = refs::branch_tip(&repo, thread_id, &thread_ref)? else {
            return Ok(false);
        };
        let base = repo
            .refname_to_id(&self.settings.default_ref)
            .map_err(WorkspaceError::git(thread_id, "reading the default branch"))?;
        let (ahead, _) = repo
            .graph_ahead_behind(tip, base)
            .map_err(WorkspaceError::git(
                thread_id,
                "comparing with the default branch",
            ))?;
        Ok(ahead > 0)
    }

    /// The message of the thread branch's tip commit, when the branch has changes.
    pub fn tip_message(&self, thread_id: &ThreadId) -> Result<Option<String>, WorkspaceError> {
        if !self.has_changes(thread_id)? {
            return Ok(None);
        }
        let thread_ref = self.settings.thread_ref(thread_id)?;
        let repo = self.settings.open_repository()?;
        let commit = repo
            .find_reference(&thread_ref)
            .and_then(|r| r.peel_to_commit())
            .map_err(WorkspaceError::git(thread_id, "reading the branch"))?;
        Ok(commit.message().ok().map(str::to_owned))
    }

    /// The paths the thread's branch changed against the default branch (its tip's
    /// tree against the default branch tip's tree), the first `limit` in path order.
    pub fn changed_files(
        &self,
        thread_id: &ThreadId,
        limit: usize,
    ) -> Result<ChangedFiles, WorkspaceError> {
        changes::changed_files(&self.settings, thread_id, limit)
    }

    /// Pushes `refs/heads/threadgate/<thread-id>` (and nothing else) to the configured
    /// remote as a fast-forward. Does nothing when no remote is configured.
    pub fn push(&self, thread_id: &ThreadId) -> Result<(), WorkspaceError> {
        remote::push(&self.settings, thread_id)
    }

    /// The thread's branch tip and its tree (no history) as a git bundle naming the
    /// branch: what a pod's relay writes into the agent's workspace (`handoff.rs`).
    pub fn hand_out(&self, thread_id: &ThreadId) -> Result<Vec<u8>, WorkspaceError> {
        handoff::hand_out(&self.settings, thread_id)
    }

    /// Verifies a pod's bundle of its work and writes its tree into the thread's
    /// worktree, for the session's next commit to take (`handoff.rs`). A refusal
    /// changes nothing in the repository or the worktree.
    pub fn receive(
        &self,
        thread_id: &ThreadId,
        bundle: &[u8],
        limits: &BundleLimits,
    ) -> Result<Received, BundleError> {
        handoff::receive(&self.settings, thread_id, bundle, limits)
    }

    /// Whether a remote is configured (branches are pushed and brought back).
    pub fn has_remote(&self) -> bool {
        self.settings.remote.is_some()
    }
}

impl std::fmt::Debug for RepoConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RepoConfig")
            .field("repo_path", &self.repo_path)
            .field("default_branch", &self.default_branch)
            .field("worktrees_dir", &self.worktrees_dir)
            .field("remote", &self.remote.as_deref().map(names::redact_remote))
            .field("commit_limits", &self.commit_limits)
            .finish()
    }
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("repo_path", &self.repo_path)
            .field("default_ref", &self.default_ref)
            .field("worktrees_dir", &self.worktrees_dir)
            .field("remote", &self.remote.as_deref().map(names::redact_remote))
            .finish()
    }
}

impl Settings {
    /// Opens a fresh handle on threadgate's repository (never discovering upwards and
    /// ignoring `GIT_DIR` and friends).
    fn open_repository(&self) -> Result<Repository, WorkspaceError> {
        open_repository(&self.repo_path)
    }

    /// The full ref of a thread's branch, checked never to be the default branch.
    fn thread_ref(&self, thread_id: &ThreadId) -> Result<String, WorkspaceError> {
        let full = format!("refs/heads/{}", Workspaces::branch_name(thread_id));
        // INVARIANT: open() refuses a default branch under threadgate/, so this holds;
        // checked again because writing the default branch is the one unrecoverable bug.
        if full == self.default_ref {
            return Err(WorkspaceError::InvalidThreadId {
                thread_id: thread_id.to_owned(),
                reason: "its branch would be the default branch",
            });
        }
        Ok(full)
    }
}

fn open_repository(path: &Path) -> Result<Repository, WorkspaceError> {
    Repository::open_ext(path, RepositoryOpenFlags::NO_SEARCH, None::<&OsStr>).map_err(|source| {
        WorkspaceError::OpenRepository {
            path: path.to_owned(),
            source,
        }
    })
}

fn resolve_default_ref(repo: &Repository, cfg: &RepoConfig) -> Result<String, WorkspaceError> {
    let fail = |reason: String| WorkspaceError::DefaultBranch {
        path: cfg.repo_path.clone(),
        reason,
    };
    let full = match &cfg.default_branch {
        Some(name) => format!("refs/heads/{name}"),
        None => {
            let head = repo
                .find_reference("HEAD")
                .map_err(|e| fail(format!("cannot read HEAD: {e}")))?;
            head.symbolic_target()
                .map_err(|e| fail(format!("cannot read HEAD: {e}")))?
                .ok_or_else(|| fail("HEAD is detached; configure default_branch".into()))?
                .to_owned()
        }
    };
    if !full.starts_with("refs/heads/") || !git2::Reference::is_valid_name(&full) {
        return Err(fail(format!("{full:?} is not a valid branch")));
    }
    let thread_namespace = format!("refs/heads/{}", names::BRANCH_PREFIX);
    if full.starts_with(&thread_namespace) || full == thread_namespace.trim_end_matches('/') {
        return Err(fail(format!(
            "{full:?} is inside the threadgate/ namespace that threads write to"
        )));
    }
    repo.find_reference(&full)
        .and_then(|r| r.peel_to_commit())
        .map_err(|e| fail(format!("{full:?} does not point at a commit: {e}")))?;
    Ok(full)
}

fn prepare_worktrees_dir(repo: &Repository, dir: &Path) -> Result<PathBuf, WorkspaceError> {
    let fail = |reason: String| WorkspaceError::WorktreesDir {
        path: dir.to_owned(),
        reason,
    };
    std::fs::create_dir_all(dir).map_err(|e| fail(format!("cannot create it: {e}")))?;
    let canonical = dir
        .canonicalize()
        .map_err(|e| fail(format!("cannot resolve it: {e}")))?;
    let mut repo_dirs = vec![repo.path().to_owned()];
    repo_dirs.extend(repo.workdir().map(Path::to_owned));
    for repo_dir in repo_dirs {
        let repo_dir = repo_dir
            .canonicalize()
            .map_err(|e| fail(format!("cannot resolve repository path: {e}")))?;
        if repo_dir.starts_with(&canonical) {
            return Err(fail(format!(
                "it contains the repository {}",
                repo_dir.display()
            )));
        }
    }
    let git_dir = repo
        .path()
        .canonicalize()
        .map_err(|e| fail(format!("cannot resolve the git dir: {e}")))?;
    if canonical.starts_with(&git_dir) {
        return Err(fail("it is inside the repository's git dir".into()));
    }
    Ok(canonical)
}
