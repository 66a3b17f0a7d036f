//! Deleting a thread's worktree directory, and nothing outside it.
//!
//! `std::fs::remove_dir_all` on Linux walks with `openat`/`unlinkat` and unlinks a
//! symlink instead of following it (the fix for CVE-2022-21658), so a link the agent
//! planted to an outside directory is removed while its target survives. If the agent
//! made a directory unwritable, owner permissions are restored (again through
//! descriptors opened with `O_NOFOLLOW`) and the removal retried once.

use std::fs;
use std::io::ErrorKind;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{AtFlags, CWD, Dir, Mode, OFlags};

use crate::ids::ThreadId;
use crate::workspace::{MAX_DEPTH, Settings, WorkspaceError};

pub(crate) fn remove_worktree(
    settings: &Settings,
    thread_id: &ThreadId,
) -> Result<(), WorkspaceError> {
    let path = settings.worktrees_dir.join(thread_id);
    // INVARIANT: a validated id is one plain component, so the path is a direct child.
    if path.parent() != Some(settings.worktrees_dir.as_path()) {
        return Err(WorkspaceError::NotADirectory {
            thread_id: thread_id.to_owned(),
            path,
        });
    }
    match fs::symlink_metadata(&path) {
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(WorkspaceError::io(thread_id, &path)(e)),
        Ok(meta) if !meta.is_dir() => {
            return Err(WorkspaceError::NotADirectory {
                thread_id: thread_id.to_owned(),
                path,
            });
        }
        Ok(_) => {}
    }
    match fs::remove_dir_all(&path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::PermissionDenied => {
            make_owner_writable(&path);
            fs::remove_dir_all(&path).map_err(WorkspaceError::io(thread_id, &path))
        }
        Err(e) => Err(WorkspaceError::io(thread_id, &path)(e)),
    }
}

/// Gives the owner full access to every directory below `path`, best effort.
pub(crate) fn make_owner_writable(path: &Path) {
    if let Some(root) = unlock_dir(CWD, path.as_os_str().as_bytes()) {
        unlock_children(&root, 0);
    }
}

fn unlock_children(dir: &OwnedFd, depth: usize) {
    if depth > MAX_DEPTH + 1 {
        return;
    }
    let Ok(entries) = Dir::read_from(dir.as_fd()) else {
        return;
    };
    let names: Vec<Vec<u8>> = entries
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_bytes().to_vec())
        .filter(|n| n != b"." && n != b"..")
        .collect();
    for name in names {
        if let Some(child) = unlock_dir(dir, &name) {
            unlock_children(&child, depth + 1);
        }
    }
}

/// Sets mode 0700 on the directory `name` in `parent` and opens it for reading. A
/// symlink or anything else that is not a directory is left alone. The mode is changed
/// through an `O_PATH` descriptor (needs no permission on the directory itself) via its
/// `/proc/self/fd` link, which names exactly that inode and is never re-resolved.
fn unlock_dir<Fd: AsFd>(parent: Fd, name: &[u8]) -> Option<OwnedFd> {
    let parent = parent.as_fd();
    let nofollow_dir = OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let handle =
        rustix::fs::openat(parent, name, OFlags::PATH | nofollow_dir, Mode::empty()).ok()?;
    let by_fd = format!("/proc/self/fd/{}", handle.as_raw_fd());
    let _ = rustix::fs::chmodat(
        CWD,
        by_fd.as_str(),
        Mode::from_raw_mode(0o700),
        AtFlags::empty(),
    );
    rustix::fs::openat(parent, name, OFlags::RDONLY | nofollow_dir, Mode::empty()).ok()
}
