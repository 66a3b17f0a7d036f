//! The configured remote: a thread's branch pushed there at every checkpoint, and
//! brought back from there before a session starts, so that another instance can take
//! the thread over.
//!
//! Only `refs/heads/threadgate/<thread-id>` is ever pushed or fetched, and fetching
//! writes no ref of the remote's: the remote's tip is read from the same connection
//! that downloads its objects (no `FETCH_HEAD`, no remote-tracking ref), and then only
//! the thread's own branch moves. A diverged local tip is kept under
//! `refs/threadgate-backup/<thread-id>/<commit>`. Every error and log line names the
//! remote with any credential of its URL replaced ([`names::redact_remote`], and
//! [`scrub`] for libgit2's messages).

use std::path::Path;

use git2::{AutotagOption, Direction, ErrorCode, FetchOptions, Oid, PushOptions, Remote};
use git2::{RemoteCallbacks, Repository};

use crate::ids::ThreadId;
use crate::workspace::refs::branch_tip;
use crate::workspace::refs::move_branch;
use crate::workspace::{Settings, WorkspaceError, names, remove, volume};

/// The namespace, outside `refs/heads/`, where a local tip that diverged from the
/// remote's is kept when the remote's wins.
pub(crate) const BACKUP_PREFIX: &str = "refs/threadgate-backup/";

/// What bringing a thread's branch back from the remote did to the local branch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RemoteSync {
    /// No remote is configured.
    NoRemote,
    /// The remote has no branch for the thread (it never checkpointed elsewhere).
    Absent,
    /// Local and remote branches point at the same commit.
    UpToDate,
    /// The local branch holds the remote's commits and more (pushed at the next
    /// checkpoint).
    LocalAhead,
    /// The local branch did not exist and was created at the remote's tip.
    Created,
    /// The local branch was behind and was fast-forwarded to the remote's tip.
    FastForwarded,
    /// The branches diverged: the local branch now points at the remote's tip and its
    /// previous tip is kept under `backup`.
    Diverged {
        /// The full name of the ref holding the previous local tip.
        backup: String,
    },
}

/// Pushes `refs/heads/threadgate/<thread-id>` (and nothing else) to the configured
/// remote as a fast-forward. Does nothing when no remote is configured.
pub(crate) fn push(settings: &Settings, thread_id: &ThreadId) -> Result<(), WorkspaceError> {
    let thread_ref = settings.thread_ref(thread_id)?;
    let Some(remote_spec) = settings.remote.as_deref() else {
        return Ok(());
    };
    let repo = settings.open_repository()?;
    if branch_tip(&repo, thread_id, &thread_ref)?.is_none() {
        return Err(WorkspaceError::BranchMissing {
            thread_id: thread_id.to_owned(),
            branch: thread_ref,
        });
    }
    let mut remote = find_remote(&repo, thread_id, remote_spec)?;
    let url = remote.url().unwrap_or_default().to_owned();

    let mut rejection: Option<String> = None;
    let mut callbacks = RemoteCallbacks::new();
    callbacks.push_update_reference(|refname, status| {
        if let Some(message) = status {
            rejection = Some(format!("{refname}: {message}"));
        }
        Ok(())
    });
    let mut options = PushOptions::new();
    options.remote_callbacks(callbacks);
    // Not forced: the branch only ever grows, so the remote must fast-forward.
    let refspec = format!("{thread_ref}:{thread_ref}");
    let pushed = remote.push(&[refspec.as_str()], Some(&mut options));
    drop(options);
    let rejected = |message: &str| WorkspaceError::PushRejected {
        thread_id: thread_id.to_owned(),
        branch: thread_ref.clone(),
        remote: names::redact_remote(remote_spec),
        message: scrub(message, &[remote_spec, &url]),
    };
    pushed.map_err(|e| rejected(e.message()))?;
    match rejection {
        Some(message) => Err(rejected(&message)),
        None => Ok(()),
    }
}

/// Brings the thread's branch up to the remote's before its worktree is prepared (see
/// [`RemoteSync`]). When the local branch moves and the thread's worktree directory
/// exists, that directory shows the old tip's files: it is removed first (before the
/// branch moves, so a failure or crash leaves the next attempt the same decision), and
/// `prepare` writes the new tip's files.
pub(crate) fn sync(
    settings: &Settings,
    repo: &Repository,
    thread_id: &ThreadId,
    thread_ref: &str,
) -> Result<RemoteSync, WorkspaceError> {
    let Some(remote_spec) = settings.remote.as_deref() else {
        return Ok(RemoteSync::NoRemote);
    };
    let Some(theirs) = fetch_branch(repo, thread_id, thread_ref, remote_spec)? else {
        return Ok(RemoteSync::Absent);
    };
    let remote = names::redact_remote(remote_spec);
    let Some(ours) = branch_tip(repo, thread_id, thread_ref)? else {
        // A worktree without its branch shows no tip this instance knows of.
        drop_stale_worktree(settings, thread_id)?;
        return match repo.reference(
            thread_ref,
            theirs,
            false,
            &format!("threadgate: thread {thread_id} from the remote"),
        ) {
            Ok(_) => {
                tracing::info!(thread_id = %thread_id, remote = %remote, commit = %theirs, "branch created from the remote's");
                Ok(RemoteSync::Created)
            }
            // A concurrent prepare created it: decide again against it.
            Err(e) if e.code() == ErrorCode::Exists => sync(settings, repo, thread_id, thread_ref),
            Err(e) => Err(WorkspaceError::git(thread_id, "creating the branch")(e)),
        };
    };
    if ours == theirs {
        return Ok(RemoteSync::UpToDate);
    }
    let descends = |a, b| {
        repo.graph_descendant_of(a, b)
            .map_err(WorkspaceError::git(thread_id, "comparing with the remote"))
    };
    if descends(ours, theirs)? {
        return Ok(RemoteSync::LocalAhead);
    }
    let fast_forward = descends(theirs, ours)?;
    drop_stale_worktree(settings, thread_id)?;
    let outcome = if fast_forward {
        tracing::info!(thread_id = %thread_id, remote = %remote, from = %ours, to = %theirs, "branch fast-forwarded to the remote's");
        RemoteSync::FastForwarded
    } else {
        let backup = format!("{BACKUP_PREFIX}{thread_id}/{ours}");
        match repo.reference(
            &backup,
            ours,
            false,
            &format!("threadgate: local tip of thread {thread_id} before the remote's"),
        ) {
            Ok(_) => {}
            Err(e) if e.code() == ErrorCode::Exists => {}
            Err(e) => return Err(WorkspaceError::git(thread_id, "keeping the local tip")(e)),
        }
        tracing::warn!(thread_id = %thread_id, remote = %remote, local = %ours, remote_tip = %theirs, backup = %backup, "branch diverged from the remote's; continuing from the remote's, the local tip is kept under the backup ref");
        RemoteSync::Diverged { backup }
    };
    move_branch(repo, thread_id, thread_ref, ours, theirs)?;
    Ok(outcome)
}

/// Reads the remote's tip of `thread_ref` and downloads its objects, over one
/// connection, writing no ref. `None` when the remote has no such branch.
fn fetch_branch(
    repo: &Repository,
    thread_id: &ThreadId,
    thread_ref: &str,
    remote_spec: &str,
) -> Result<Option<Oid>, WorkspaceError> {
    let mut remote = find_remote(repo, thread_id, remote_spec)?;
    let url = remote.url().unwrap_or_default().to_owned();
    let failed = |action: &'static str, e: git2::Error| WorkspaceError::Remote {
        thread_id: thread_id.to_owned(),
        action,
        remote: names::redact_remote(remote_spec),
        message: scrub(e.message(), &[remote_spec, &url]),
    };
    remote
        .connect(Direction::Fetch)
        .map_err(|e| failed("connecting to the remote", e))?;
    let theirs = remote
        .list()
        .map_err(|e| failed("listing the remote's branches", e))?
        .iter()
        .find(|head| head.name() == thread_ref)
        .map(git2::RemoteHead::oid);
    let Some(theirs) = theirs else {
        let _ = remote.disconnect();
        return Ok(None);
    };
    let have = repo
        .odb()
        .map(|odb| odb.exists(theirs))
        .map_err(WorkspaceError::git(
            thread_id,
            "reading the object database",
        ))?;
    if !have {
        let mut options = FetchOptions::new();
        options
            .download_tags(AutotagOption::None)
            .update_fetchhead(false);
        remote
            .download(&[thread_ref], Some(&mut options))
            .map_err(|e| failed("fetching the thread's branch", e))?;
    }
    let _ = remote.disconnect();
    // The objects must be here now; a remote that advertised a tip it did not send is
    // an error, never a branch pointed at nothing.
    repo.find_commit(theirs)
        .map_err(|e| failed("reading the fetched tip", e))?;
    Ok(Some(theirs))
}

/// Removes the thread's worktree directory when it exists (it shows a tip the branch
/// is about to leave), unmounting its workspace filesystem if it has one.
fn drop_stale_worktree(settings: &Settings, thread_id: &ThreadId) -> Result<(), WorkspaceError> {
    let path = settings.worktrees_dir.join(thread_id);
    let exists = std::fs::symlink_metadata(&path).is_ok();
    if !exists && !volume::image_of(&path).exists() {
        return Ok(());
    }
    tracing::warn!(thread_id = %thread_id, path = %path.display(), "the worktree shows a tip the remote has moved past; writing it again from the remote's");
    if remove::remove_worktree(settings, thread_id).is_err() {
        unmount(&path, thread_id)?;
        remove::remove_worktree(settings, thread_id)?;
    }
    unmount(&path, thread_id)?;
    volume::remove_image(&path).map_err(|e| {
        WorkspaceError::io(thread_id, volume::image_of(&path))(std::io::Error::other(e))
    })
}

fn unmount(path: &Path, thread_id: &ThreadId) -> Result<(), WorkspaceError> {
    volume::unmount(path)
        .map_err(|e| WorkspaceError::io(thread_id, path)(std::io::Error::other(e.to_string())))
}

/// A remote configured by name in threadgate's repository, else an anonymous remote
/// for the URL or path given.
fn find_remote<'r>(
    repo: &'r Repository,
    thread_id: &ThreadId,
    spec: &str,
) -> Result<Remote<'r>, WorkspaceError> {
    if Remote::is_valid_name(spec) {
        match repo.find_remote(spec) {
            Ok(remote) => return Ok(remote),
            Err(e) if e.code() == ErrorCode::NotFound => {}
            Err(e) => return Err(WorkspaceError::git(thread_id, "reading the remote")(e)),
        }
    }
    repo.remote_anonymous(spec)
        .map_err(WorkspaceError::git(thread_id, "reading the remote"))
}

/// A user name at least this long in a URL is taken for a token (as GitHub's
/// `https://<token>@github.com/...`).
const MIN_TOKEN_CHARS: usize = 8;

/// `message` (libgit2's, which may quote a URL) with the credentials of every URL in
/// `urls` replaced: the whole URL by its redacted form, then its `user:password` part
/// and its password wherever else they appear.
pub(crate) fn scrub(message: &str, urls: &[&str]) -> String {
    let mut out = message.to_owned();
    for url in urls.iter().filter(|u| !u.is_empty()) {
        let Some(userinfo) = names::userinfo(url) else {
            continue;
        };
        out = out.replace(url, &names::redact_remote(url));
        // A bare user name (`git@`) is no secret and too common a word to replace; a
        // `user:password` or a token in the user's place is.
        let password = userinfo.split_once(':').map(|(_, p)| p);
        if password.is_some() || userinfo.len() >= MIN_TOKEN_CHARS {
            out = out.replace(userinfo, "***");
        }
        if let Some(password) = password.filter(|p| !p.is_empty()) {
            out = out.replace(password, "***");
        }
    }
    out
}
