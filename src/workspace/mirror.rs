//! Making a worktree directory show a tree, writing only what differs: the gateway's
//! side of a pod's bundle (`handoff.rs`), pulled at every checkpoint, every sync and
//! the stop, where rewriting every file each time cost seconds on a large repository.
//!
//! The directory on disk is compared with the tree entry by entry: a file whose size,
//! content (its blob id, hashed from the file) and executable bit match is left alone;
//! one whose content matches but whose mode does not gets its mode changed; anything
//! else is removed and written again, and whatever the tree does not name (a deleted
//! or renamed file, `.git`) is removed. Symlinks are written as links and compared by
//! their target, never followed. The walk holds an open directory descriptor at every
//! level and reaches entries with `openat`/`statat`/`unlinkat` and `O_NOFOLLOW`, so a
//! symlink standing where the tree wants a directory is removed as itself, never
//! written through. The result is the directory the full rewrite gave; a run cut short
//! (a crash) leaves a mix that the next run compares and completes.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{Read as _, Write as _};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::Path;

use git2::{ObjectType, Oid, Repository, Tree};
use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags};

use crate::workspace::bundle::BundleError;
use crate::workspace::{MAX_DEPTH, names};

const MODE_TREE: i32 = 0o040000;
const MODE_BLOB: i32 = 0o100644;
const MODE_EXEC: i32 = 0o100755;
const MODE_LINK: i32 = 0o120000;
const MODE_GITLINK: i32 = 0o160000;

/// What one run changed, for the log and the tests.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Changes {
    /// Files and links written (new or changed content).
    pub(crate) written: usize,
    /// Files whose executable bit alone changed.
    pub(crate) modes: usize,
    /// Entries removed (a directory counts once).
    pub(crate) removed: usize,
    /// Entries already as the tree has them.
    pub(crate) kept: usize,
}

/// Makes the directory `root` show `tree` of `repo` (see the module's doc).
pub(crate) fn mirror_tree(
    repo: &Repository,
    tree: &Tree<'_>,
    root: &Path,
) -> Result<Changes, BundleError> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = rustix::fs::openat(rustix::fs::CWD, root, flags, Mode::empty())
        .map_err(|e| BundleError::io(root)(e.into()))?;
    let odb = repo
        .odb()
        .map_err(BundleError::git("opening the object database"))?;
    let mut walk = Mirror {
        repo,
        odb,
        root,
        changes: Changes::default(),
    };
    walk.dir(&fd, Path::new(""), tree, 0)?;
    Ok(walk.changes)
}

struct Mirror<'a> {
    repo: &'a Repository,
    odb: git2::Odb<'a>,
    root: &'a Path,
    changes: Changes,
}

/// An entry on disk, as `statat` without following saw it.
struct OnDisk {
    kind: FileType,
    mode: u32,
}

impl Mirror<'_> {
    fn io(&self, rel: &Path) -> impl FnOnce(rustix::io::Errno) -> BundleError {
        let path = self.root.join(rel);
        move |e| BundleError::io(path)(e.into())
    }

    fn git(action: &'static str) -> impl FnOnce(git2::Error) -> BundleError {
        BundleError::git(action)
    }

    /// Makes the open directory `dir` (at `rel`) hold exactly `tree`.
    fn dir(
        &mut self,
        dir: &OwnedFd,
        rel: &Path,
        tree: &Tree<'_>,
        depth: usize,
    ) -> Result<(), BundleError> {
        for name in read_names(dir).map_err(self.io(rel))? {
            if tree.get_name_bytes(&name).is_none() {
                let path = rel.join(OsStr::from_bytes(&name));
                self.remove(dir, &name, &path)?;
                self.changes.removed += 1;
            }
        }
        for entry in tree.iter() {
            let name = entry.name_bytes();
            if names::check_entry_name(name).is_err() {
                // Refused by the tree's check before anything is written; never written.
                continue;
            }
            let path = rel.join(OsStr::from_bytes(name));
            let on_disk = stat(dir, name).map_err(self.io(&path))?;
            match entry.filemode() {
                MODE_TREE => self.subdir(dir, name, &path, on_disk, entry.id(), depth)?,
                mode @ (MODE_BLOB | MODE_EXEC) => {
                    self.file(dir, name, &path, on_disk, entry.id(), mode)?;
                }
                MODE_LINK => self.link(dir, name, &path, on_disk, entry.id())?,
                // A submodule: an empty directory, as git leaves an uninitialised one.
                MODE_GITLINK => self.empty_subdir(dir, name, &path, on_disk)?,
                mode => {
                    tracing::warn!(mode, path = %path.display(), "tree entry not written");
                }
            }
        }
        Ok(())
    }

    fn subdir(
        &mut self,
        dir: &OwnedFd,
        name: &[u8],
        path: &Path,
        on_disk: Option<OnDisk>,
        id: Oid,
        depth: usize,
    ) -> Result<(), BundleError> {
        let fd = self.directory_at(dir, name, path, on_disk)?;
        // Deeper content stays out of the worktree (refused by the tree's check anyway).
        if depth + 1 > MAX_DEPTH {
            return Ok(());
        }
        let subtree = self
            .repo
            .find_tree(id)
            .map_err(Self::git("reading a tree"))?;
        self.dir(&fd, path, &subtree, depth + 1)
    }

    fn empty_subdir(
        &mut self,
        dir: &OwnedFd,
        name: &[u8],
        path: &Path,
        on_disk: Option<OnDisk>,
    ) -> Result<(), BundleError> {
        let fd = self.directory_at(dir, name, path, on_disk)?;
        for child in read_names(&fd).map_err(self.io(path))? {
            let child_path = path.join(OsStr::from_bytes(&child));
            self.remove(&fd, &child, &child_path)?;
            self.changes.removed += 1;
        }
        Ok(())
    }

    /// The directory `name` in `dir`, made when something else (or nothing) is there.
    fn directory_at(
        &mut self,
        dir: &OwnedFd,
        name: &[u8],
        path: &Path,
        on_disk: Option<OnDisk>,
    ) -> Result<OwnedFd, BundleError> {
        match on_disk {
            Some(d) if d.kind == FileType::Directory => self.changes.kept += 1,
            Some(_) => {
                self.remove(dir, name, path)?;
                self.make_dir(dir, name, path)?;
            }
            None => self.make_dir(dir, name, path)?,
        }
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        rustix::fs::openat(dir, name, flags, Mode::empty()).map_err(self.io(path))
    }

    fn make_dir(&mut self, dir: &OwnedFd, name: &[u8], path: &Path) -> Result<(), BundleError> {
        rustix::fs::mkdirat(dir, name, Mode::from_raw_mode(0o755)).map_err(self.io(path))?;
        self.changes.written += 1;
        Ok(())
    }

    fn file(
        &mut self,
        dir: &OwnedFd,
        name: &[u8],
        path: &Path,
        on_disk: Option<OnDisk>,
        id: Oid,
        mode: i32,
    ) -> Result<(), BundleError> {
        let perm = if mode == MODE_EXEC { 0o755 } else { 0o644 };
        if let Some(d) = on_disk {
            if d.kind == FileType::RegularFile
                && let Some(file) = self.same_content(dir, name, path, id)?
            {
                let exec = d.mode & 0o100 != 0;
                if exec == (mode == MODE_EXEC) {
                    self.changes.kept += 1;
                } else {
                    rustix::fs::fchmod(&file, Mode::from_raw_mode(perm)).map_err(self.io(path))?;
                    self.changes.modes += 1;
                }
                return Ok(());
            }
            self.remove(dir, name, path)?;
        }
        let blob = self
            .repo
            .find_blob(id)
            .map_err(Self::git("reading a blob"))?;
        // EXCL and NOFOLLOW: never write through anything that is there.
        let flags =
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(dir, name, flags, Mode::from_raw_mode(perm))
            .map_err(self.io(path))?;
        File::from(fd)
            .write_all(blob.content())
            .map_err(BundleError::io(self.root.join(path)))?;
        self.changes.written += 1;
        Ok(())
    }

    /// The regular file `name`, opened, when it holds blob `id`: its size first (the
    /// blob's header), then its content hashed as a blob.
    fn same_content(
        &self,
        dir: &OwnedFd,
        name: &[u8],
        path: &Path,
        id: Oid,
    ) -> Result<Option<OwnedFd>, BundleError> {
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(dir, name, flags, Mode::empty()).map_err(self.io(path))?;
        let stat = rustix::fs::fstat(&fd).map_err(self.io(path))?;
        if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
            return Ok(None);
        }
        let (size, _) = self
            .odb
            .read_header(id)
            .map_err(Self::git("reading a blob"))?;
        let on_disk = u64::try_from(stat.st_size).unwrap_or(u64::MAX);
        if u64::try_from(size).ok() != Some(on_disk) {
            return Ok(None);
        }
        let mut content = Vec::with_capacity(size);
        let mut file = File::from(fd);
        (&mut file)
            .take(on_disk.saturating_add(1))
            .read_to_end(&mut content)
            .map_err(BundleError::io(self.root.join(path)))?;
        let hashed =
            Oid::hash_object(ObjectType::Blob, &content).map_err(Self::git("hashing a file"))?;
        Ok((hashed == id).then(|| OwnedFd::from(file)))
    }

    fn link(
        &mut self,
        dir: &OwnedFd,
        name: &[u8],
        path: &Path,
        on_disk: Option<OnDisk>,
        id: Oid,
    ) -> Result<(), BundleError> {
        let blob = self
            .repo
            .find_blob(id)
            .map_err(Self::git("reading a blob"))?;
        if let Some(d) = on_disk {
            if d.kind == FileType::Symlink
                && rustix::fs::readlinkat(dir, name, Vec::new())
                    .is_ok_and(|target| target.as_bytes() == blob.content())
            {
                self.changes.kept += 1;
                return Ok(());
            }
            self.remove(dir, name, path)?;
        }
        rustix::fs::symlinkat(OsStr::from_bytes(blob.content()), dir, name)
            .map_err(self.io(path))?;
        self.changes.written += 1;
        Ok(())
    }

    /// Removes the entry `name` of `dir`, a directory with everything in it; a symlink
    /// is removed as itself. A directory without its owner's write bit gets it first.
    fn remove(&self, dir: &OwnedFd, name: &[u8], path: &Path) -> Result<(), BundleError> {
        let Some(on_disk) = stat(dir, name).map_err(self.io(path))? else {
            return Ok(());
        };
        if on_disk.kind != FileType::Directory {
            return rustix::fs::unlinkat(dir, name, AtFlags::empty()).map_err(self.io(path));
        }
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(dir, name, flags, Mode::empty()).map_err(self.io(path))?;
        if on_disk.mode & 0o700 != 0o700 {
            rustix::fs::fchmod(&fd, Mode::from_raw_mode(0o700)).map_err(self.io(path))?;
        }
        for child in read_names(&fd).map_err(self.io(path))? {
            self.remove(&fd, &child, &path.join(OsStr::from_bytes(&child)))?;
        }
        drop(fd);
        rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR).map_err(self.io(path))
    }
}

/// The entry `name` of `dir` as it is (a symlink as itself), or `None` when absent.
fn stat(dir: &OwnedFd, name: &[u8]) -> Result<Option<OnDisk>, rustix::io::Errno> {
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(stat) => Ok(Some(OnDisk {
            kind: FileType::from_raw_mode(stat.st_mode),
            mode: stat.st_mode,
        })),
        Err(rustix::io::Errno::NOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

/// All entry names of a directory except `.` and `..`.
fn read_names(dir: &OwnedFd) -> Result<Vec<Vec<u8>>, rustix::io::Errno> {
    let mut names = Vec::new();
    for entry in Dir::read_from(dir.as_fd())? {
        let name = entry?.file_name().to_bytes().to_vec();
        if name != b"." && name != b".." {
            names.push(name);
        }
    }
    Ok(names)
}
