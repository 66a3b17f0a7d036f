//! Creating a thread's branch and materialising its tree as a fresh directory with a
//! small standalone `.git` for the agent.
//!
//! Files are written by threadgate from the blobs, never through a libgit2 checkout, so
//! no filter, attribute or configuration applies. The directory is built under a
//! temporary name in the worktrees directory and renamed into place only when complete,
//! so a crash never leaves a half-written worktree that a later `prepare` would take for
//! the agent's work.

use std::ffi::OsStr;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use git2::{ErrorCode, Oid, Repository, RepositoryInitOptions, Tree};

use crate::ids::ThreadId;
use crate::workspace::names::{self, NameProblem};
use crate::workspace::refs::branch_tip;
use crate::workspace::{MAX_DEPTH, Settings, WorkspaceError, Worktree, remote};

/// Distinguishes temporary directories made by this process.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

pub(crate) fn prepare(
    settings: &Settings,
    thread_id: &ThreadId,
) -> Result<Worktree, WorkspaceError> {
    let thread_ref = settings.thread_ref(thread_id)?;
    let repo = settings.open_repository()?;
    // What another instance pushed comes first: the branch (and, when it moves, the
    // worktree) continue from the remote's tip.
    let remote = remote::sync(settings, &repo, thread_id, &thread_ref)?;
    let tip = ensure_branch(&repo, settings, thread_id, &thread_ref)?;
    let path = settings.worktrees_dir.join(thread_id);
    let worktree = |resumed| Worktree {
        path: path.clone(),
        branch: thread_ref.trim_start_matches("refs/heads/").to_owned(),
        head: tip.to_string(),
        resumed,
        remote: remote.clone(),
    };

    match fs::symlink_metadata(&path) {
        Ok(meta) if meta.is_dir() => return Ok(worktree(true)),
        Ok(_) => {
            return Err(WorkspaceError::NotADirectory {
                thread_id: thread_id.to_owned(),
                path,
            });
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(WorkspaceError::io(thread_id, &path)(e)),
    }

    let temp = settings.worktrees_dir.join(format!(
        ".tmp-{thread_id}-{}-{}",
        std::process::id(),
        TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    fs::create_dir(&temp).map_err(WorkspaceError::io(thread_id, &temp))?;
    let built = materialise(&repo, thread_id, &thread_ref, tip, &temp);
    if let Err(e) = built {
        let _ = fs::remove_dir_all(&temp);
        return Err(e);
    }
    match fs::rename(&temp, &path) {
        Ok(()) => Ok(worktree(false)),
        Err(e) => {
            let _ = fs::remove_dir_all(&temp);
            // Another prepare for the same thread won the race: its directory stands.
            if fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir()) {
                return Ok(worktree(true));
            }
            Err(WorkspaceError::io(thread_id, &path)(e))
        }
    }
}

/// Returns the tip of the thread's branch, creating the branch at the default branch's
/// tip first if it does not exist. Creation never overwrites: a branch created by a
/// concurrent call is reused.
fn ensure_branch(
    repo: &Repository,
    settings: &Settings,
    thread_id: &ThreadId,
    thread_ref: &str,
) -> Result<Oid, WorkspaceError> {
    if let Some(tip) = branch_tip(repo, thread_id, thread_ref)? {
        return Ok(tip);
    }
    let start = repo
        .find_reference(&settings.default_ref)
        .and_then(|r| r.peel_to_commit())
        .map_err(WorkspaceError::git(thread_id, "reading the default branch"))?;
    let message = format!("threadgate: branch for thread {thread_id}");
    match repo.reference(thread_ref, start.id(), false, &message) {
        Ok(_) => Ok(start.id()),
        Err(e) if e.code() == ErrorCode::Exists => branch_tip(repo, thread_id, thread_ref)?
            .ok_or_else(|| WorkspaceError::git(thread_id, "creating the branch")(e)),
        Err(e) => Err(WorkspaceError::git(thread_id, "creating the branch")(e)),
    }
}

/// Writes the tip's tree into `dir` and gives it its own standalone `.git`.
fn materialise(
    repo: &Repository,
    thread_id: &ThreadId,
    thread_ref: &str,
    tip: Oid,
    dir: &Path,
) -> Result<(), WorkspaceError> {
    let tree = repo
        .find_commit(tip)
        .and_then(|c| c.tree())
        .map_err(WorkspaceError::git(thread_id, "reading the branch tip"))?;
    write_tree(repo, thread_id, &tree, dir, 0)?;
    init_agent_git(repo, thread_id, thread_ref, tip, tree.id(), dir)
}

pub(crate) fn write_tree(
    repo: &Repository,
    thread_id: &ThreadId,
    tree: &Tree<'_>,
    dir: &Path,
    depth: usize,
) -> Result<(), WorkspaceError> {
    for entry in tree.iter() {
        let name = entry.name_bytes();
        match names::check_entry_name(name) {
            Ok(()) => {}
            Err(NameProblem::NotAComponent | NameProblem::ReservedGitName) => {
                tracing::warn!(thread_id = %thread_id, name = %String::from_utf8_lossy(name), "tree entry with an unsafe name not materialised");
                continue;
            }
        }
        let path = dir.join(OsStr::from_bytes(name));
        let io_err = WorkspaceError::io(thread_id, &path);
        match entry.filemode() {
            0o040000 => {
                fs::create_dir(&path).map_err(io_err)?;
                // Deeper content stays out of the worktree; commit keeps it unchanged.
                if depth + 1 > MAX_DEPTH {
                    continue;
                }
                let subtree = repo
                    .find_tree(entry.id())
                    .map_err(WorkspaceError::git(thread_id, "reading a tree"))?;
                write_tree(repo, thread_id, &subtree, &path, depth + 1)?;
            }
            mode @ (0o100644 | 0o100755) => {
                let blob = repo
                    .find_blob(entry.id())
                    .map_err(WorkspaceError::git(thread_id, "reading a blob"))?;
                let perm = if mode == 0o100755 { 0o755 } else { 0o644 };
                // create_new: never write through anything that already exists.
                let mut file = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(perm)
                    .open(&path)
                    .map_err(WorkspaceError::io(thread_id, &path))?;
                file.write_all(blob.content()).map_err(io_err)?;
            }
            0o120000 => {
                let blob = repo
                    .find_blob(entry.id())
                    .map_err(WorkspaceError::git(thread_id, "reading a blob"))?;
                std::os::unix::fs::symlink(OsStr::from_bytes(blob.content()), &path)
                    .map_err(io_err)?;
            }
            // A submodule: an empty directory, as git leaves an uninitialised one.
            0o160000 => fs::create_dir(&path).map_err(io_err)?,
            mode => {
                tracing::warn!(thread_id = %thread_id, mode, path = %path.display(), "tree entry not materialised");
            }
        }
    }
    Ok(())
}

/// Initialises `dir/.git` as a standalone repository holding only the tip commit (as a
/// shallow clone would), its tree, a branch and an index matching the written files.
/// Nothing in it refers to threadgate's repository.
pub(crate) fn init_agent_git(
    repo: &Repository,
    thread_id: &ThreadId,
    thread_ref: &str,
    tip: Oid,
    tree: Oid,
    dir: &Path,
) -> Result<(), WorkspaceError> {
    let git_err = |action| WorkspaceError::git(thread_id, action);
    let branch = thread_ref.trim_start_matches("refs/heads/");
    let mut opts = RepositoryInitOptions::new();
    opts.no_reinit(true)
        .mkdir(false)
        .external_template(false)
        .initial_head(branch);
    let agent_repo =
        Repository::init_opts(dir, &opts).map_err(git_err("creating the worktree's .git"))?;
    let git_dir = agent_repo.path().to_owned();
    drop(agent_repo);

    let mut pack = repo
        .packbuilder()
        .map_err(git_err("packing the branch tip"))?;
    pack.insert_commit(tip)
        .map_err(git_err("packing the branch tip"))?;
    pack.write(&git_dir.join("objects").join("pack"), 0)
        .map_err(git_err("writing the worktree's pack"))?;
    let shallow = git_dir.join("shallow");
    fs::write(&shallow, format!("{tip}\n")).map_err(WorkspaceError::io(thread_id, &shallow))?;

    let agent_repo =
        Repository::open_ext(dir, git2::RepositoryOpenFlags::NO_SEARCH, None::<&OsStr>)
            .map_err(git_err("opening the worktree's .git"))?;
    agent_repo
        .reference(thread_ref, tip, true, "threadgate: prepared")
        .map_err(git_err("setting the worktree's branch"))?;
    let tree = agent_repo
        .find_tree(tree)
        .map_err(git_err("reading the worktree's tree"))?;
    let mut index = agent_repo
        .index()
        .map_err(git_err("writing the worktree's index"))?;
    index
        .read_tree(&tree)
        .and_then(|()| index.write())
        .map_err(git_err("writing the worktree's index"))?;
    Ok(())
}
