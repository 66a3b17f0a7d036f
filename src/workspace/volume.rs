//! A size limit for each session's workspace, and the free-space reserve of the data
//! disk.
//!
//! When threadgate runs as root, a session's worktree is moved onto its own ext4
//! filesystem: a sparse image file beside the worktree (`<worktree>.img`, at most
//! `workspace_bytes` on the data disk), loop-mounted over the worktree directory. A
//! container writing past the limit gets `ENOSPC` and cannot touch the rest of the
//! disk. The mount outlives a threadgate restart; after a host reboot the image is
//! mounted again when the session resumes. Not root: no mount is possible, the
//! workspace is not limited (logged once per session), and only the disk reserve
//! protects the database.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

/// Free bytes below which a workspace filesystem counts as full.
const FULL_MARGIN: u64 = 1 << 20;

/// The image file holding the workspace filesystem of `worktree`.
pub fn image_of(worktree: &Path) -> PathBuf {
    let mut name = worktree.as_os_str().to_owned();
    name.push(".img");
    PathBuf::from(name)
}

/// Whether this process can mount workspace filesystems (it runs as root).
pub fn can_limit() -> bool {
    rustix::process::geteuid().is_root()
}

/// Puts `worktree` on its own filesystem of `bytes` (see the module docs). Returns
/// whether the workspace is limited; `bytes == 0` or not root leaves it as it is.
pub fn limit(worktree: &Path, bytes: u64) -> anyhow::Result<bool> {
    if bytes == 0 || !can_limit() {
        return Ok(false);
    }
    if is_mountpoint(worktree)? {
        return Ok(true);
    }
    let image = image_of(worktree);
    if image.exists() {
        // A resumed session's filesystem, made before: mount it again.
        run(Command::new("mount")
            .args(["-o", "loop,nosuid,nodev"])
            .arg(&image)
            .arg(worktree))?;
        return Ok(true);
    }
    // A fresh filesystem made with the checkout already in it (`mkfs.ext4 -d`), then
    // mounted over the worktree directory: one mount, no copy through a staging mount.
    let made = std::fs::File::create(&image)
        .with_context(|| format!("cannot create {}", image.display()))
        .and_then(|file| Ok(file.set_len(bytes)?))
        .and_then(|()| {
            run(Command::new("mkfs.ext4")
                .args(["-q", "-F", "-m", "0", "-E", "root_owner=0:0", "-d"])
                .arg(worktree)
                .arg(&image))
        })
        .and_then(|()| {
            run(Command::new("mount")
                .args(["-o", "loop,nosuid,nodev"])
                .arg(&image)
                .arg(worktree))
        });
    if let Err(e) = made {
        let _ = std::fs::remove_file(&image);
        return Err(e);
    }
    // mkfs's own directory, unless the checkout had one of that name with files in it.
    let _ = std::fs::remove_dir(worktree.join("lost+found"));
    Ok(true)
}

/// Unmounts the workspace filesystem of `worktree`, if mounted. Its image stays until
/// [`remove_image`]: while it does, [`is_unmounted`] tells a later stop (after a crash)
/// that the directory shows only the checkout hidden under the mount, not the work.
pub fn unmount(worktree: &Path) -> anyhow::Result<()> {
    if is_mountpoint(worktree)? {
        run(Command::new("umount").arg(worktree))?;
    }
    Ok(())
}

/// Deletes the image of `worktree`'s filesystem (after [`unmount`]).
pub fn remove_image(worktree: &Path) -> anyhow::Result<()> {
    let image = image_of(worktree);
    match std::fs::remove_file(&image) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("cannot remove {}", image.display()))
        }
        _ => Ok(()),
    }
}

/// Whether `worktree` has a filesystem image that is not mounted: its contents are then
/// not the session's work (which is in the image) and must not be committed.
pub fn is_unmounted(worktree: &Path) -> bool {
    image_of(worktree).exists() && !matches!(is_mountpoint(worktree), Ok(true))
}

/// Whether the workspace filesystem at `worktree` is full (less than 1 MiB free).
pub fn is_full(worktree: &Path) -> bool {
    matches!(is_mountpoint(worktree), Ok(true))
        && free_bytes(worktree).is_ok_and(|f| f < FULL_MARGIN)
}

/// Bytes available to unprivileged writers on the filesystem holding `path`.
pub fn free_bytes(path: &Path) -> std::io::Result<u64> {
    let s = rustix::fs::statvfs(path)?;
    Ok(s.f_bavail.saturating_mul(s.f_frsize))
}

fn is_mountpoint(path: &Path) -> anyhow::Result<bool> {
    use rustix::fs::{AtFlags, CWD, StatxAttributes, StatxFlags, statx};
    let stat = match statx(
        CWD,
        path,
        AtFlags::SYMLINK_NOFOLLOW,
        StatxFlags::BASIC_STATS,
    ) {
        Ok(stat) => stat,
        Err(rustix::io::Errno::NOENT) => return Ok(false),
        Err(e) => return Err(std::io::Error::from(e).into()),
    };
    if !stat
        .stx_attributes_mask
        .contains(StatxAttributes::MOUNT_ROOT)
    {
        anyhow::bail!(
            "the kernel does not say whether {} is a mount point",
            path.display()
        );
    }
    Ok(stat.stx_attributes.contains(StatxAttributes::MOUNT_ROOT))
}

fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let out = cmd
        .output()
        .with_context(|| format!("cannot run {:?}", cmd.get_program()))?;
    if !out.status.success() {
        bail!(
            "{:?} failed: {}",
            cmd.get_program(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::is_mountpoint;

    #[test]
    fn mount_points_are_told_from_plain_directories() {
        // `/proc` is its own mount everywhere threadgate runs; a fresh directory is not.
        assert!(is_mountpoint(std::path::Path::new("/proc")).unwrap());
        let dir = tempfile::tempdir().unwrap();
        assert!(!is_mountpoint(dir.path()).unwrap());
        assert!(!is_mountpoint(&dir.path().join("missing")).unwrap());
    }
}
