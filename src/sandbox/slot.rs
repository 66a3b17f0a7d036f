//! The host side of a parked sandbox: its slot directory, into which a thread's
//! directories are mounted when it is adopted.
//!
//! A container's mounts are fixed when it is created, so a parked container gets three
//! empty mount points of its slot (`<pool root>/<slot>/{workspace,socket,secrets}`),
//! each a shared mount on the host, bound into the container with `rslave` propagation.
//! Adoption bind-mounts the thread's worktree, socket directory and secrets directory
//! over them on the host, and the kernel propagates each mount into the running
//! container. The pool root is a private mount of itself, so nothing mounted below it
//! propagates out. A read-only bind is made read-only in a staging directory there
//! before it is moved over the slot's mount point, so the copy the container receives is
//! read-only too. Adoption is recorded first, as the file `<slot>/adopted` naming the
//! session and thread (on the secrets root's tmpfs, like the secrets themselves), and
//! a slot with that file is never parked again.
//!
//! All functions here block and need root (mounting); callers run them on tokio's
//! blocking pool.

use std::fs::{self, DirBuilder, OpenOptions};
use std::io::{self, Read as _, Write as _};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use rustix::mount::{MountFlags, MountPropagationFlags, UnmountFlags};

use super::SandboxError;
use super::host::io_err;

/// The three mount points of a slot, by the container path they appear at.
pub(crate) const MOUNT_POINTS: [Mount; 3] = [Mount::Workspace, Mount::Socket, Mount::Secrets];

/// The file that records a slot's adoption.
const MARKER: &str = "adopted";
/// The staging directory under the pool root, where read-only binds are made.
const STAGE: &str = ".stage";
/// The longest marker read back (a session id and a thread id).
const MAX_MARKER_BYTES: u64 = 4096;

/// One of a slot's mount points.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mount {
    Workspace,
    Socket,
    Secrets,
}

impl Mount {
    fn dir_name(self) -> &'static str {
        match self {
            Mount::Workspace => "workspace",
            Mount::Socket => "socket",
            Mount::Secrets => "secrets",
        }
    }
}

/// What a slot's marker says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Adoption {
    /// Never adopted: the slot is parked.
    Parked,
    /// Adopted by this session for this thread.
    Adopted { session: String, thread: String },
    /// A marker exists but cannot be read: adopted by someone, never again parked.
    Unreadable,
}

/// A slot's directory.
pub(crate) fn slot_dir(pool_root: &Path, slot: &str) -> PathBuf {
    pool_root.join(slot)
}

/// The host path of one of a slot's mount points (the source of its container bind).
pub(crate) fn mount_point(slot_dir: &Path, mount: Mount) -> PathBuf {
    slot_dir.join(mount.dir_name())
}

/// Creates the slot's directory and its three mount points, each a shared mount (a
/// bind of itself), empty and owned by root with mode 0555. If anything fails, what
/// was made is released.
pub(crate) fn create(slot_dir: &Path) -> Result<(), SandboxError> {
    if let Some(root) = slot_dir.parent() {
        private_mount(root)?;
    }
    DirBuilder::new()
        .mode(0o700)
        .create(slot_dir)
        .map_err(io_err("create a slot directory", slot_dir))?;
    let made = MOUNT_POINTS
        .iter()
        .try_for_each(|m| shared_mount_point(&mount_point(slot_dir, *m)));
    if made.is_err() {
        let _ = release(slot_dir);
    }
    made
}

fn shared_mount_point(dir: &Path) -> Result<(), SandboxError> {
    DirBuilder::new()
        .mode(0o555)
        .create(dir)
        .map_err(io_err("create a slot mount point", dir))?;
    let mount_err = |action| errno(action, dir);
    rustix::mount::mount_bind(dir, dir).map_err(mount_err("bind a slot mount point"))?;
    // Private first: a peer group of its own, whatever the parent's propagation.
    rustix::mount::mount_change(dir, MountPropagationFlags::PRIVATE)
        .map_err(mount_err("make a slot mount point private"))?;
    rustix::mount::mount_change(dir, MountPropagationFlags::SHARED)
        .map_err(mount_err("make a slot mount point shared"))
}

/// Records the slot's adoption by `session` for `thread`, before anything of the
/// thread is mounted. A slot adopted before is refused (`Ok(false)`): its marker is
/// never overwritten.
pub(crate) fn mark_adopted(
    slot_dir: &Path,
    session: &str,
    thread: &str,
) -> Result<bool, SandboxError> {
    let path = slot_dir.join(MARKER);
    let mut file = match OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
    {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Ok(false),
        Err(e) => return Err(io_err("record a slot's adoption", &path)(e)),
    };
    file.write_all(format!("{session}\n{thread}\n").as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(io_err("record a slot's adoption", &path))?;
    Ok(true)
}

/// What the slot's marker says. A missing slot directory reads as
/// [`Adoption::Unreadable`]: nothing proves it was never adopted.
pub(crate) fn adoption(slot_dir: &Path) -> Adoption {
    if !slot_dir.is_dir() {
        return Adoption::Unreadable;
    }
    let mut text = String::new();
    let read = fs::File::open(slot_dir.join(MARKER))
        .and_then(|f| f.take(MAX_MARKER_BYTES).read_to_string(&mut text));
    match read {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Adoption::Parked,
        Err(_) => Adoption::Unreadable,
        Ok(_) => {
            let mut lines = text.lines();
            match (lines.next(), lines.next()) {
                (Some(session), Some(thread)) if !session.is_empty() && !thread.is_empty() => {
                    Adoption::Adopted {
                        session: session.to_owned(),
                        thread: thread.to_owned(),
                    }
                }
                _ => Adoption::Unreadable,
            }
        }
    }
}

/// Whether the slot is as parking left it: never adopted, and each mount point a
/// mount of its own with nothing in it.
pub(crate) fn is_clean(slot_dir: &Path) -> bool {
    adoption(slot_dir) == Adoption::Parked
        && MOUNT_POINTS.iter().all(|m| {
            let dir = mount_point(slot_dir, *m);
            matches!(is_mountpoint(&dir), Ok(true))
                && fs::read_dir(&dir).is_ok_and(|mut entries| entries.next().is_none())
        })
}

/// Mounts `source` over the slot's mount point `mount`, so that the running container
/// sees it; read-only when asked, in the copy the container receives as well.
pub(crate) fn bind(
    slot_dir: &Path,
    mount: Mount,
    source: &Path,
    read_only: bool,
) -> Result<(), SandboxError> {
    let target = mount_point(slot_dir, mount);
    if !read_only {
        return rustix::mount::mount_bind(source, &target)
            .map_err(errno("bind into a slot", source));
    }
    let stage = private_stage(slot_dir)?;
    let staged = stage.join(format!(
        "{}-{}",
        slot_dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        mount.dir_name()
    ));
    DirBuilder::new()
        .mode(0o700)
        .create(&staged)
        .or_else(|e| match e.kind() {
            io::ErrorKind::AlreadyExists => Ok(()),
            _ => Err(e),
        })
        .map_err(io_err("create a staging mount point", &staged))?;
    let moved = rustix::mount::mount_bind(source, &staged)
        .map_err(errno("bind into the staging mount", source))
        .and_then(|()| {
            rustix::mount::mount_remount(
                &staged,
                MountFlags::BIND | MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV,
                "",
            )
            .map_err(errno("make a staged bind read-only", &staged))
        })
        .and_then(|()| {
            rustix::mount::mount_move(&staged, &target)
                .map_err(errno("move a staged bind into a slot", &target))
        });
    if moved.is_err() {
        let _ = unmount_all(&staged);
    }
    let _ = fs::remove_dir(&staged);
    moved
}

/// The staging directory under the pool root (itself a private mount, so a bind made
/// there propagates nowhere and may be moved).
fn private_stage(slot_dir: &Path) -> Result<PathBuf, SandboxError> {
    let root = slot_dir.parent().unwrap_or(slot_dir);
    private_mount(root)?;
    let stage = root.join(STAGE);
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&stage)
        .map_err(io_err("create the staging directory", &stage))?;
    Ok(stage)
}

/// Makes `dir` (created if missing, mode 0700) a private mount of itself, once: the
/// slots' shared mount points below it then propagate nowhere outside it, whatever
/// the propagation of the filesystem it is on.
fn private_mount(dir: &Path) -> Result<(), SandboxError> {
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io_err("create the pool directory", dir))?;
    if matches!(is_mountpoint(dir), Ok(true)) {
        return Ok(());
    }
    rustix::mount::mount_bind(dir, dir).map_err(errno("bind the pool directory", dir))?;
    rustix::mount::mount_change(dir, MountPropagationFlags::PRIVATE)
        .map_err(errno("make the pool directory private", dir))
}

/// Unmounts everything of the slot (a thread's binds and the mount points themselves),
/// then removes its marker and directories. Never removes a directory's contents
/// recursively: a mount still in place makes it fail instead of deleting a thread's
/// work through it. A slot already gone is fine.
pub(crate) fn release(slot_dir: &Path) -> Result<(), SandboxError> {
    if !slot_dir.exists() {
        return Ok(());
    }
    for mount in MOUNT_POINTS {
        let dir = mount_point(slot_dir, mount);
        unmount_all(&dir)?;
        match fs::remove_dir(&dir) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                return Err(io_err("remove a slot mount point", &dir)(e));
            }
            _ => {}
        }
    }
    let marker = slot_dir.join(MARKER);
    match fs::remove_file(&marker) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            return Err(io_err("remove a slot's marker", &marker)(e));
        }
        _ => {}
    }
    match fs::remove_dir(slot_dir) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            Err(io_err("remove a slot directory", slot_dir)(e))
        }
        _ => Ok(()),
    }
}

/// Detaches every mount stacked on `dir` (at most a few: the mount point's own bind
/// and one of a thread's).
fn unmount_all(dir: &Path) -> Result<(), SandboxError> {
    for _ in 0..8 {
        match is_mountpoint(dir) {
            Ok(true) => {}
            Ok(false) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(io_err("stat a slot mount point", dir)(e)),
        }
        rustix::mount::unmount(dir, UnmountFlags::DETACH)
            .map_err(errno("unmount a slot mount point", dir))?;
    }
    Err(io_err("unmount a slot mount point", dir)(io::Error::other(
        "still a mount point after 8 unmounts",
    )))
}

/// Builds a closure that wraps a mount call's errno with what was being done and where.
fn errno(
    action: &'static str,
    path: impl AsRef<Path>,
) -> impl FnOnce(rustix::io::Errno) -> SandboxError {
    let wrap = io_err(action, path);
    move |e| wrap(io::Error::from(e))
}

/// Whether `path` is the root of a mount (statx's `STATX_ATTR_MOUNT_ROOT`).
fn is_mountpoint(path: &Path) -> io::Result<bool> {
    use rustix::fs::{AtFlags, CWD, StatxAttributes, StatxFlags, statx};
    let stat = statx(
        CWD,
        path,
        AtFlags::SYMLINK_NOFOLLOW,
        StatxFlags::BASIC_STATS,
    )?;
    if !stat
        .stx_attributes_mask
        .contains(StatxAttributes::MOUNT_ROOT)
    {
        return Err(io::Error::other("the kernel does not report mount roots"));
    }
    Ok(stat.stx_attributes.contains(StatxAttributes::MOUNT_ROOT))
}

/// The slot directories under `pool_root`, by slot id (the staging mount left out).
pub(crate) fn slots(pool_root: &Path) -> Result<Vec<(String, PathBuf)>, SandboxError> {
    Ok(super::host::subdirectories(pool_root)?
        .into_iter()
        .filter(|(name, _)| name != STAGE)
        .collect())
}
