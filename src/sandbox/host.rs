//! Host-side preparation for a sandbox: the per-session secrets directory on a tmpfs,
//! handing the workspace and socket directories to the container's uid, and finding
//! out who threadgate runs as.
//!
//! All functions here block; callers run them on tokio's blocking pool.

use crate::secrets::ExposeSecret as _;
use std::fs::{self, DirBuilder, OpenOptions, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt, lchown};
use std::path::{Path, PathBuf};

use super::{SandboxError, SecretBytes};

/// A uid and gid pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Owner {
    pub uid: u32,
    pub gid: u32,
}

/// The effective uid and gid of this process.
pub(crate) fn process_owner() -> Owner {
    Owner {
        uid: rustix::process::geteuid().as_raw(),
        gid: rustix::process::getegid().as_raw(),
    }
}

/// `TMPFS_MAGIC` and `RAMFS_MAGIC` from `linux/magic.h`: the `f_type` of a memory-backed
/// filesystem in `statfs(2)`.
const TMPFS_MAGIC: u64 = 0x0102_1994;
const RAMFS_MAGIC: u64 = 0x8584_58f6;

/// Fails unless `path` (or, if it does not exist yet, its nearest existing ancestor)
/// lives on a tmpfs or ramfs, so that secret files never reach a disk.
pub(crate) fn require_tmpfs(path: &Path) -> Result<(), SandboxError> {
    let mut existing = path.to_path_buf();
    while !existing.exists() {
        if !existing.pop() {
            break;
        }
    }
    let stat = rustix::fs::statfs(&existing)
        .map_err(|e| io_err("statfs", &existing)(io::Error::from(e)))?;
    // `f_type` is signed on some targets; the magic numbers are read as unsigned words.
    let magic = stat.f_type as u64 & 0xffff_ffff;
    match magic {
        TMPFS_MAGIC | RAMFS_MAGIC => Ok(()),
        other => Err(SandboxError::SecretsRootNotTmpfs {
            path: path.to_path_buf(),
            fs_type: fs_type_name(other),
        }),
    }
}

/// A readable name for common filesystem magic numbers, the number otherwise.
fn fs_type_name(magic: u64) -> String {
    match magic {
        0xef53 => "ext4".to_string(),
        0x794c_7630 => "overlay".to_string(),
        0x5846_5342 => "xfs".to_string(),
        0x9123_683e => "btrfs".to_string(),
        other => format!("filesystem magic {other:#x}"),
    }
}

/// Whether `name` can be a secret's file name: `[A-Za-z0-9_.-]{1,128}`, not starting
/// with `.` (so neither `.` nor `..` nor hidden files).
pub(crate) fn valid_secret_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
}

/// What [`write_secrets`] found when the session's directory already existed.
#[derive(Debug)]
pub(crate) enum WriteSecrets {
    /// The directory was created and filled.
    Written,
    /// The directory already existed; nothing was touched.
    AlreadyExists,
}

/// Creates `dir` (mode 0500 when done) with one file per secret (mode 0400), all owned
/// by `owner` when given. Parents are created with mode 0700. If `dir` already exists
/// nothing is touched. If anything fails after `dir` was created, `dir` is removed.
pub(crate) fn write_secrets(
    dir: &Path,
    secrets: &[(String, SecretBytes)],
    owner: Option<Owner>,
) -> Result<WriteSecrets, SandboxError> {
    if let Some(parent) = dir.parent() {
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)
            .map_err(io_err("create secrets parent directory", parent))?;
    }
    match DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {
            return Ok(WriteSecrets::AlreadyExists);
        }
        Err(err) => return Err(io_err("create secrets directory", dir)(err)),
    }
    let filled = fill_secrets_dir(dir, secrets, owner);
    if filled.is_err() {
        // Best effort: the original error is the one worth reporting.
        let _ = remove_secrets(dir);
    }
    filled.map(|()| WriteSecrets::Written)
}

fn fill_secrets_dir(
    dir: &Path,
    secrets: &[(String, SecretBytes)],
    owner: Option<Owner>,
) -> Result<(), SandboxError> {
    for (name, value) in secrets {
        let path = dir.join(name);
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o400)
            .open(&path)
            .map_err(io_err("create secret file", &path))?;
        file.write_all(value.expose_secret())
            .map_err(io_err("write secret file", &path))?;
        if let Some(owner) = owner {
            lchown(&path, Some(owner.uid), Some(owner.gid))
                .map_err(io_err("chown secret file", &path))?;
        }
    }
    if let Some(owner) = owner {
        lchown(dir, Some(owner.uid), Some(owner.gid))
            .map_err(io_err("chown secrets directory", dir))?;
    }
    fs::set_permissions(dir, Permissions::from_mode(0o500))
        .map_err(io_err("chmod secrets directory", dir))
}

/// Removes a secrets directory and its files. A directory that is already gone is fine.
pub(crate) fn remove_secrets(dir: &Path) -> Result<(), SandboxError> {
    // The directory is 0500; make it writable so its files can be unlinked even when
    // threadgate is not root.
    match fs::set_permissions(dir, Permissions::from_mode(0o700)) {
        Ok(()) => {}
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(err) => return Err(io_err("chmod secrets directory", dir)(err)),
    }
    match fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(err) => Err(io_err("remove secrets directory", dir)(err)),
    }
}

/// The directories directly under `dir`, by name. A missing `dir` has none.
pub(crate) fn subdirectories(dir: &Path) -> Result<Vec<(String, PathBuf)>, SandboxError> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(err) => return Err(io_err("list", dir)(err)),
    };
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry.map_err(io_err("list", dir))?;
        let is_dir = entry.file_type().map(|t| t.is_dir()).unwrap_or(false);
        if is_dir {
            found.push((
                entry.file_name().to_string_lossy().into_owned(),
                entry.path(),
            ));
        }
    }
    Ok(found)
}

/// Gives `root` and everything under it to `owner`, without following symlinks
/// (a link is re-owned itself; its target is not touched). Entries that already have
/// the right owner are left alone.
pub(crate) fn chown_tree(root: &Path, owner: Owner) -> Result<(), SandboxError> {
    let mut pending = vec![root.to_path_buf()];
    while let Some(path) = pending.pop() {
        let meta = fs::symlink_metadata(&path).map_err(io_err("stat", &path))?;
        if meta.uid() != owner.uid || meta.gid() != owner.gid {
            lchown(&path, Some(owner.uid), Some(owner.gid)).map_err(io_err("chown", &path))?;
        }
        if meta.is_dir() {
            for entry in fs::read_dir(&path).map_err(io_err("list", &path))? {
                pending.push(entry.map_err(io_err("list", &path))?.path());
            }
        }
    }
    Ok(())
}

/// Builds a closure that wraps an `io::Error` with what was being done and where.
pub(crate) fn io_err(
    action: &'static str,
    path: impl AsRef<Path>,
) -> impl FnOnce(io::Error) -> SandboxError {
    let path = path.as_ref().to_path_buf();
    move |source| SandboxError::Io {
        action,
        path,
        source,
    }
}
