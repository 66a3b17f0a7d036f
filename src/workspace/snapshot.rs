//! Building a git tree from a worktree directory without trusting anything in it.
//!
//! The walk holds an open directory descriptor at every level and reaches each entry
//! with `openat`/`statat`/`readlinkat` relative to it, always with `O_NOFOLLOW`. A
//! symlink is read as a link and stored with mode `120000`; it is never followed, and an
//! entry swapped for a symlink or a fifo between the `stat` and the `open` fails the
//! `open` or the `fstat` check instead of redirecting the walk outside the worktree.

use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use aho_corasick::AhoCorasick;
use git2::{ObjectType, Oid, Repository, Tree, TreeEntry};
use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags};

use crate::ids::ThreadId;
use crate::secrets::{MIN_SECRET_LEN, Redactor, SecretString};
use crate::workspace::names::{self, NameProblem};
use crate::workspace::{CommitLimits, SkipReason, SkippedFile, WorkspaceError};

/// Files larger than this are left out of commits (GitHub warns from 50 MiB).
pub const MAX_FILE_BYTES: u64 = 50 * 1024 * 1024;

/// Directories nested deeper than this below the worktree root are neither written by
/// `prepare` nor read by `commit`; what the branch holds there is kept unchanged.
pub const MAX_DEPTH: usize = 256;

const MODE_TREE: i32 = 0o040000;
const MODE_BLOB: i32 = 0o100644;
const MODE_EXEC: i32 = 0o100755;
const MODE_LINK: i32 = 0o120000;
const MODE_GITLINK: i32 = 0o160000;

/// Finds secret values in bytes and says which secret matched: the gateway's
/// [`Redactor`] (raw, JSON-escaped, base64 either alphabet, hex, URL-encoded), plus a raw
/// match for values the redactor cannot take (shorter than [`MIN_SECRET_LEN`], or not
/// UTF-8), so that no granted value reaches a branch in a form the gateway would catch.
/// Deliberately not `Debug`: the matchers hold the values.
pub(crate) struct SecretScanner {
    redactor: Redactor,
    raw: Option<(AhoCorasick, Vec<String>)>,
}

impl SecretScanner {
    /// Compiles the non-empty values; `None` when there is nothing to look for.
    pub(crate) fn new(secrets: &[(&str, &[u8])]) -> Result<Option<Self>, String> {
        let mut encoded = Vec::new();
        let mut raw: Vec<(&str, &[u8])> = Vec::new();
        for (name, value) in secrets.iter().filter(|(_, v)| !v.is_empty()) {
            match std::str::from_utf8(value) {
                Ok(text) if value.len() >= MIN_SECRET_LEN => {
                    encoded.push(((*name).to_owned(), SecretString::from(text)));
                }
                _ => raw.push((name, value)),
            }
        }
        if encoded.is_empty() && raw.is_empty() {
            return Ok(None);
        }
        let redactor = Redactor::new(encoded).map_err(|e| e.to_string())?;
        let raw = if raw.is_empty() {
            None
        } else {
            let matcher =
                AhoCorasick::new(raw.iter().map(|(_, v)| v)).map_err(|e| e.to_string())?;
            Some((matcher, raw.iter().map(|(n, _)| (*n).to_owned()).collect()))
        };
        Ok(Some(SecretScanner { redactor, raw }))
    }

    fn find(&self, haystack: &[u8]) -> Option<&str> {
        if let Some(name) = self.redactor.find(haystack) {
            return Some(name);
        }
        let (matcher, names) = self.raw.as_ref()?;
        let found = matcher.find(haystack)?;
        #[expect(
            clippy::indexing_slicing,
            reason = "INVARIANT: the matcher is built from `names`, so a pattern id is an index into them; a fallback would miss a secret"
        )]
        Some(names[found.pattern().as_usize()].as_str())
    }
}

/// Blobs at least this large are written straight to the repository as loose objects
/// rather than into the commit's pack: packing a large blob costs a delta search and a
/// second pass of compression for nothing a pack of small files gains.
pub const LOOSE_BLOB_BYTES: usize = 512 * 1024;

/// One tree-building pass over a worktree.
pub(crate) struct Snapshot<'a> {
    repo: &'a Repository,
    /// The same repository without the in-memory pack, for blobs of
    /// [`LOOSE_BLOB_BYTES`] or more.
    loose: &'a Repository,
    thread_id: &'a ThreadId,
    scanner: Option<SecretScanner>,
    /// Entries left out so far.
    pub(crate) skipped: Vec<SkippedFile>,
    limits: CommitLimits,
    /// New files and bytes written so far (content the repository did not hold).
    new_files: usize,
    new_bytes: u64,
    /// The first file left out for a cap, the cap, and how many more followed it.
    over_cap: Option<(PathBuf, String, usize)>,
}

/// What one directory entry becomes in the tree.
enum Entry {
    Keep {
        id: Oid,
        mode: i32,
    },
    Skip(SkipReason),
    /// The worktree's version is reported and left out; the branch's version stays.
    KeepBase {
        id: Oid,
        mode: i32,
        reason: SkipReason,
    },
    Absent,
}

impl<'a> Snapshot<'a> {
    pub(crate) fn new(
        (repo, loose): (&'a Repository, &'a Repository),
        thread_id: &'a ThreadId,
        scanner: Option<SecretScanner>,
        limits: CommitLimits,
    ) -> Self {
        Snapshot {
            repo,
            loose,
            thread_id,
            scanner,
            skipped: Vec::new(),
            limits,
            new_files: 0,
            new_bytes: 0,
            over_cap: None,
        }
    }

    /// The entries left out, the files over a cap summed up in one entry (a flood of
    /// tiny files must not become a flood of lines).
    pub(crate) fn into_skipped(mut self) -> Vec<SkippedFile> {
        if let Some((path, cap, more)) = self.over_cap.take() {
            self.skipped.push(SkippedFile {
                path,
                reason: SkipReason::OverCommitCap { cap, more },
            });
        }
        self.skipped
    }

    /// Builds the tree of the worktree whose root directory is open as `root`. `base` is
    /// the branch tip's tree, consulted only to keep what the worktree cannot represent:
    /// submodule entries, content below [`MAX_DEPTH`], and the branch's version of a file
    /// that grew past [`MAX_FILE_BYTES`].
    pub(crate) fn root_tree(
        &mut self,
        root: &OwnedFd,
        base: &Tree<'_>,
    ) -> Result<Oid, WorkspaceError> {
        match self.dir_tree(root, Path::new(""), Some(base), 0)? {
            Some(id) => Ok(id),
            None => self
                .repo
                .treebuilder(None)
                .and_then(|b| b.write())
                .map_err(WorkspaceError::git(self.thread_id, "writing the tree")),
        }
    }

    /// The tree of one directory, or `None` when nothing in it is kept.
    fn dir_tree(
        &mut self,
        dir: &OwnedFd,
        rel: &Path,
        base: Option<&Tree<'_>>,
        depth: usize,
    ) -> Result<Option<Oid>, WorkspaceError> {
        let mut builder = self
            .repo
            .treebuilder(None)
            .map_err(WorkspaceError::git(self.thread_id, "building a tree"))?;
        for name in self.read_names(dir, rel)? {
            let base_entry = base.and_then(|t| t.get_name_bytes(&name));
            let path = rel.join(std::ffi::OsStr::from_bytes(&name));
            let (path, entry) = match self.name_problem(&name) {
                Some(reason) => (self.reported_path(rel, &name, &reason), Entry::Skip(reason)),
                None if name == b".git" => continue,
                None => {
                    let entry = self.entry(dir, &path, &name, base_entry.as_ref(), depth)?;
                    (path, entry)
                }
            };
            match entry {
                Entry::Keep { id, mode } => {
                    if builder.insert(&name, id, mode).is_err() {
                        self.skip(path, SkipReason::ReservedName);
                    }
                }
                Entry::Skip(reason) => self.skip(path, reason),
                Entry::KeepBase { id, mode, reason } => {
                    builder
                        .insert(&name, id, mode)
                        .map_err(WorkspaceError::git(self.thread_id, "building a tree"))?;
                    self.skip(path, reason);
                }
                Entry::Absent => {}
            }
        }
        if builder.is_empty() {
            return Ok(None);
        }
        builder
            .write()
            .map(Some)
            .map_err(WorkspaceError::git(self.thread_id, "writing a tree"))
    }

    /// What a name alone rules out: git-reserved names and names carrying a secret.
    fn name_problem(&self, name: &[u8]) -> Option<SkipReason> {
        if let Some(secret) = self.scanner.as_ref().and_then(|s| s.find(name)) {
            return Some(SkipReason::NameContainsSecret {
                secret: secret.to_owned(),
            });
        }
        match names::check_entry_name(name) {
            Ok(()) => None,
            Err(NameProblem::ReservedGitName) if name == b".git" => None,
            Err(NameProblem::ReservedGitName | NameProblem::NotAComponent) => {
                Some(SkipReason::ReservedName)
            }
        }
    }

    /// The path to report for a skipped name: never the name itself if it holds a secret.
    fn reported_path(&self, rel: &Path, name: &[u8], reason: &SkipReason) -> PathBuf {
        match reason {
            SkipReason::NameContainsSecret { .. } => rel.join("<name containing a secret>"),
            _ => rel.join(std::ffi::OsStr::from_bytes(name)),
        }
    }

    fn entry(
        &mut self,
        dir: &OwnedFd,
        path: &Path,
        name: &[u8],
        base: Option<&TreeEntry<'_>>,
        depth: usize,
    ) -> Result<Entry, WorkspaceError> {
        let stat = match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) => stat,
            Err(e) => return Ok(unreadable(e)),
        };
        match FileType::from_raw_mode(stat.st_mode) {
            FileType::RegularFile => self.file_entry(dir, path, name, base),
            FileType::Symlink => self.link_entry(dir, path, name, base),
            FileType::Directory => self.subdir_entry(dir, path, name, base, depth),
            other => Ok(Entry::Skip(SkipReason::Unsupported {
                kind: kind_name(other),
            })),
        }
    }

    fn file_entry(
        &mut self,
        dir: &OwnedFd,
        path: &Path,
        name: &[u8],
        base: Option<&TreeEntry<'_>>,
    ) -> Result<Entry, WorkspaceError> {
        let flags =
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY;
        let fd = match rustix::fs::openat(dir, name, flags, Mode::empty()) {
            Ok(fd) => fd,
            Err(e) => return Ok(unreadable(e)),
        };
        // The entry may have been swapped since statat: trust only the opened file.
        let stat = match rustix::fs::fstat(&fd) {
            Ok(stat) => stat,
            Err(e) => return Ok(unreadable(e)),
        };
        let kind = FileType::from_raw_mode(stat.st_mode);
        if kind != FileType::RegularFile {
            return Ok(Entry::Skip(SkipReason::Unsupported {
                kind: kind_name(kind),
            }));
        }
        // A large file the branch already holds (an asset) must not vanish from it.
        let reason = SkipReason::TooLarge {
            limit: MAX_FILE_BYTES,
        };
        let too_large = match base.map(|e| (e.id(), e.filemode())) {
            Some((id, mode @ (MODE_BLOB | MODE_EXEC))) => Entry::KeepBase { id, mode, reason },
            _ => Entry::Skip(reason),
        };
        if u64::try_from(stat.st_size).unwrap_or(u64::MAX) > MAX_FILE_BYTES {
            return Ok(too_large);
        }
        let mut content = Vec::new();
        if let Err(e) = File::from(fd)
            .take(MAX_FILE_BYTES + 1)
            .read_to_end(&mut content)
        {
            return Ok(Entry::Skip(SkipReason::Unreadable {
                error: e.to_string(),
            }));
        }
        if content.len() as u64 > MAX_FILE_BYTES {
            return Ok(too_large);
        }
        if let Some(reason) = self.secret_in(&content) {
            return Ok(Entry::Skip(reason));
        }
        let mode = if stat.st_mode & 0o100 != 0 {
            MODE_EXEC
        } else {
            MODE_BLOB
        };
        self.blob(path, &content, mode, base)
    }

    fn link_entry(
        &mut self,
        dir: &OwnedFd,
        path: &Path,
        name: &[u8],
        base: Option<&TreeEntry<'_>>,
    ) -> Result<Entry, WorkspaceError> {
        if names::is_git_control_file(name) {
            return Ok(Entry::Skip(SkipReason::SymlinkedGitFile));
        }
        // readlinkat on a name that is no longer a symlink fails (EINVAL): never followed.
        let target = match rustix::fs::readlinkat(dir, name, Vec::new()) {
            Ok(target) => target.into_bytes(),
            Err(e) => return Ok(unreadable(e)),
        };
        if let Some(reason) = self.secret_in(&target) {
            return Ok(Entry::Skip(reason));
        }
        self.blob(path, &target, MODE_LINK, base)
    }

    fn subdir_entry(
        &mut self,
        dir: &OwnedFd,
        path: &Path,
        name: &[u8],
        base: Option<&TreeEntry<'_>>,
        depth: usize,
    ) -> Result<Entry, WorkspaceError> {
        let base_mode = base.map(|e| e.filemode());
        // A submodule's directory stands for the gitlink the branch already records.
        if let (Some(MODE_GITLINK), Some(entry)) = (base_mode, base) {
            return Ok(Entry::Keep {
                id: entry.id(),
                mode: MODE_GITLINK,
            });
        }
        if depth + 1 > MAX_DEPTH {
            return Ok(match (base_mode, base) {
                (Some(MODE_TREE), Some(entry)) => Entry::Keep {
                    id: entry.id(),
                    mode: MODE_TREE,
                },
                _ => Entry::Skip(SkipReason::TooDeep { limit: MAX_DEPTH }),
            });
        }
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = match rustix::fs::openat(dir, name, flags, Mode::empty()) {
            Ok(fd) => fd,
            Err(e) => return Ok(unreadable(e)),
        };
        let base_tree = match (base_mode, base) {
            (Some(MODE_TREE), Some(entry)) => self.repo.find_tree(entry.id()).ok(),
            _ => None,
        };
        Ok(
            match self.dir_tree(&fd, path, base_tree.as_ref(), depth + 1)? {
                Some(id) => Entry::Keep {
                    id,
                    mode: MODE_TREE,
                },
                None => Entry::Absent,
            },
        )
    }

    /// All entry names of a directory except `.` and `..`.
    fn read_names(&self, dir: &OwnedFd, rel: &Path) -> Result<Vec<Vec<u8>>, WorkspaceError> {
        let io_err = |e: rustix::io::Errno| WorkspaceError::Io {
            thread_id: self.thread_id.to_owned(),
            path: rel.to_owned(),
            source: e.into(),
        };
        let mut names = Vec::new();
        for entry in Dir::read_from(dir.as_fd()).map_err(io_err)? {
            let name = entry.map_err(io_err)?.file_name().to_bytes().to_vec();
            if name != b"." && name != b".." {
                names.push(name);
            }
        }
        Ok(names)
    }

    fn secret_in(&self, bytes: &[u8]) -> Option<SkipReason> {
        let secret = self.scanner.as_ref()?.find(bytes)?;
        Some(SkipReason::ContainsSecret {
            secret: secret.to_owned(),
        })
    }

    /// The blob of `content`: content the repository holds already is free; new content
    /// counts against [`CommitLimits`], and past them the file is left out (the branch's
    /// version of `path`, if any, stays).
    fn blob(
        &mut self,
        path: &Path,
        content: &[u8],
        mode: i32,
        base: Option<&TreeEntry<'_>>,
    ) -> Result<Entry, WorkspaceError> {
        let id = Oid::hash_object(ObjectType::Blob, content)
            .map_err(WorkspaceError::git(self.thread_id, "hashing a blob"))?;
        let known = self
            .repo
            .odb()
            .map_err(WorkspaceError::git(
                self.thread_id,
                "reading the object database",
            ))?
            .exists(id);
        if known {
            return Ok(Entry::Keep { id, mode });
        }
        let bytes = u64::try_from(content.len()).unwrap_or(u64::MAX);
        if let Some(cap) = self.cap_reached(bytes) {
            return Ok(self.left_out_for_cap(path, cap, base));
        }
        self.new_files += 1;
        self.new_bytes = self.new_bytes.saturating_add(bytes);
        let target = if content.len() >= LOOSE_BLOB_BYTES {
            self.loose
        } else {
            self.repo
        };
        let written = target
            .blob(content)
            .map_err(WorkspaceError::git(self.thread_id, "writing a blob"))?;
        Ok(Entry::Keep { id: written, mode })
    }

    /// The cap (by config key and value) that one more new file of `bytes` would pass.
    fn cap_reached(&self, bytes: u64) -> Option<String> {
        if self.new_files >= self.limits.max_files {
            return Some(format!(
                "[repo] max_commit_files ({})",
                self.limits.max_files
            ));
        }
        if self.new_bytes.saturating_add(bytes) > self.limits.max_bytes {
            return Some(format!(
                "[repo] max_commit_bytes ({})",
                self.limits.max_bytes
            ));
        }
        None
    }

    fn left_out_for_cap(
        &mut self,
        path: &Path,
        cap: String,
        base: Option<&TreeEntry<'_>>,
    ) -> Entry {
        match &mut self.over_cap {
            Some((_, _, more)) => *more += 1,
            None => self.over_cap = Some((path.to_owned(), cap, 0)),
        }
        match base.map(|e| (e.id(), e.filemode())) {
            Some((id, mode @ (MODE_BLOB | MODE_EXEC | MODE_LINK))) => Entry::Keep { id, mode },
            _ => Entry::Absent,
        }
    }

    fn skip(&mut self, path: PathBuf, reason: SkipReason) {
        self.skipped.push(SkippedFile { path, reason });
    }
}

fn unreadable(e: rustix::io::Errno) -> Entry {
    Entry::Skip(SkipReason::Unreadable {
        error: std::io::Error::from(e).to_string(),
    })
}

fn kind_name(kind: FileType) -> &'static str {
    match kind {
        FileType::Fifo => "fifo",
        FileType::Socket => "socket",
        FileType::CharacterDevice => "character device",
        FileType::BlockDevice => "block device",
        FileType::Directory => "directory",
        FileType::Symlink => "symlink",
        FileType::RegularFile => "regular file",
        _ => "unknown file type",
    }
}
