//! Git bundles (the v2 format `git bundle` writes: a header of prerequisites and refs,
//! then one pack) as the relay carries a workspace into a pod and its work back out;
//! their caps and the refusals a hostile one meets.
//!
//! ```text
//! # v2 git bundle\n
//! -<base commit>\n            (a prerequisite: the receiver must have it)
//! <tip commit> <ref name>\n
//! \n
//! PACK...                     (the objects reachable from the tip and not from the base)
//! ```
//!
//! Reading one never runs anything of git's but libgit2's indexer, which hashes every
//! object it stores (a corrupt or forged object fails there), and it stores them in a
//! quarantine: a bare repository of its own under the worktrees directory that borrows
//! threadgate's objects through `objects/info/alternates`, removed when dropped. Nothing
//! of a bundle reaches threadgate's repository unless the receiver copies it there.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use git2::{Oid, Repository};

use crate::workspace::names;

/// The first line of every bundle.
pub(crate) const SIGNATURE: &[u8] = b"# v2 git bundle\n";
/// The longest header (prerequisites and refs) read.
const MAX_HEADER: usize = 64 << 10;

/// Distinguishes quarantine directories made by this process.
static QUARANTINE_COUNTER: AtomicU64 = AtomicU64::new(0);

/// What one bundle may hold and cost. A bundle past any of them is refused whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BundleLimits {
    /// Bytes of the whole bundle.
    pub max_bytes: usize,
    /// Objects its pack may declare.
    pub max_objects: u32,
    /// Entries (files, links, directories) of the tip's tree, counted as written out.
    pub max_entries: usize,
    /// Bytes of file content of the tip's tree, counted as written out.
    pub max_tree_bytes: u64,
    /// Time to verify and apply it.
    pub max_time: Duration,
}

impl Default for BundleLimits {
    fn default() -> Self {
        BundleLimits {
            max_bytes: 256 << 20,
            max_objects: 200_000,
            max_entries: 200_000,
            max_tree_bytes: 2 << 30,
            max_time: Duration::from_secs(120),
        }
    }
}

/// Why a bundle was refused. A refusal changes nothing in the repository or the
/// worktree; its message names what was wrong, never file content.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    /// Not a v2 bundle, or its header or pack is malformed.
    #[error("the bundle is not one: {reason}")]
    Garbled {
        /// What is wrong with it.
        reason: String,
    },
    /// Larger than `max_bytes`.
    #[error("the bundle is larger than {limit} bytes")]
    TooLarge {
        /// The cap.
        limit: usize,
    },
    /// Its pack declares more than `max_objects` objects.
    #[error("the bundle's pack holds {count} objects, more than {limit}")]
    TooManyObjects {
        /// Objects declared.
        count: u32,
        /// The cap.
        limit: u32,
    },
    /// It names a ref other than the thread's branch, or several refs.
    #[error("the bundle names {refname:?}; only {expected} may be sent")]
    ForeignRef {
        /// The ref it named.
        refname: String,
        /// The thread's branch.
        expected: String,
    },
    /// It names no ref.
    #[error("the bundle names no ref")]
    NoRef,
    /// Its prerequisites are not the one base commit the receiver expects.
    #[error("the bundle's prerequisites: {reason}")]
    Base {
        /// What is wrong with them.
        reason: String,
    },
    /// Its tip does not descend from its base: not a fast-forward of what was handed out.
    #[error("the bundle's tip {tip} is not a fast-forward of its base {base}")]
    NotFastForward {
        /// The base commit.
        base: String,
        /// The tip commit.
        tip: String,
    },
    /// Its tree holds an entry that cannot be written into a worktree.
    #[error("the bundle's tree holds {path:?}: {reason}")]
    UnsafeEntry {
        /// The entry's path (lossy UTF-8).
        path: String,
        /// Why it is refused.
        reason: &'static str,
    },
    /// Its tree, written out, would pass a cap.
    #[error("the bundle's tree holds more than {cap}")]
    TreeTooLarge {
        /// The cap passed, named with its value.
        cap: String,
    },
    /// Verifying and applying it took longer than `max_time`.
    #[error("the bundle was not verified within {limit:?}")]
    TimedOut {
        /// The cap.
        limit: Duration,
    },
    /// A git operation failed.
    #[error("git error while {action}: {source}")]
    Git {
        /// What was being done.
        action: &'static str,
        /// libgit2's error.
        source: git2::Error,
    },
    /// A filesystem operation failed.
    #[error("filesystem error at {path}: {source}")]
    Io {
        /// The path involved.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

impl BundleError {
    pub(crate) fn git(action: &'static str) -> impl FnOnce(git2::Error) -> Self {
        move |source| BundleError::Git { action, source }
    }

    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| BundleError::Io { path, source }
    }

    /// Whether the bundle itself was at fault (the sender's), not the receiver.
    pub fn is_refusal(&self) -> bool {
        !matches!(self, BundleError::Io { .. })
    }
}

/// A bundle's parts, read from its bytes.
#[derive(Debug)]
pub(crate) struct Parsed<'a> {
    pub(crate) prerequisites: Vec<Oid>,
    pub(crate) refs: Vec<(Oid, String)>,
    pub(crate) pack: &'a [u8],
}

/// Writes a bundle of `pack` with its prerequisites and refs.
pub(crate) fn write(prerequisites: &[Oid], refs: &[(Oid, &str)], pack: &[u8]) -> Vec<u8> {
    let mut out = SIGNATURE.to_vec();
    for base in prerequisites {
        out.extend_from_slice(format!("-{base}\n").as_bytes());
    }
    for (tip, name) in refs {
        out.extend_from_slice(format!("{tip} {name}\n").as_bytes());
    }
    out.push(b'\n');
    out.extend_from_slice(pack);
    out
}

/// Reads a bundle's header and its pack's header, checking the size and object caps
/// before anything is stored.
pub(crate) fn parse<'a>(bytes: &'a [u8], limits: &BundleLimits) -> Result<Parsed<'a>, BundleError> {
    if bytes.len() > limits.max_bytes {
        return Err(BundleError::TooLarge {
            limit: limits.max_bytes,
        });
    }
    let garbled = |reason: &str| BundleError::Garbled {
        reason: reason.to_owned(),
    };
    let rest = bytes
        .strip_prefix(SIGNATURE)
        .ok_or_else(|| garbled("it does not start with \"# v2 git bundle\""))?;
    let window = rest.get(..MAX_HEADER.min(rest.len())).unwrap_or(rest);
    let end =
        find_blank_line(window).ok_or_else(|| garbled("its header has no end within 64 KiB"))?;
    let (header, pack) = (rest.get(..end).unwrap_or_default(), rest.get(end + 1..));
    let pack = pack.unwrap_or_default();
    let header = std::str::from_utf8(header).map_err(|_| garbled("its header is not UTF-8"))?;
    let mut prerequisites = Vec::new();
    let mut refs = Vec::new();
    for line in header.lines() {
        if let Some(base) = line.strip_prefix('-') {
            let id = base.split(' ').next().unwrap_or_default();
            prerequisites
                .push(Oid::from_str(id).map_err(|_| garbled("a prerequisite is not a commit id"))?);
            continue;
        }
        let (id, name) = line
            .split_once(' ')
            .ok_or_else(|| garbled("a ref line is not \"<id> <name>\""))?;
        if id.len() != 40 {
            return Err(garbled("a ref's id is not a full commit id"));
        }
        let id = Oid::from_str(id).map_err(|_| garbled("a ref's id is not a commit id"))?;
        refs.push((id, name.to_owned()));
    }
    if pack.len() < 12 || pack.get(..4) != Some(b"PACK".as_slice()) {
        return Err(garbled("no pack follows its header"));
    }
    let version = read_u32(pack, 4);
    if !matches!(version, Some(2 | 3)) {
        return Err(garbled("its pack is not version 2 or 3"));
    }
    let objects = read_u32(pack, 8).ok_or_else(|| garbled("its pack header is cut"))?;
    if objects > limits.max_objects {
        return Err(BundleError::TooManyObjects {
            count: objects,
            limit: limits.max_objects,
        });
    }
    Ok(Parsed {
        prerequisites,
        refs,
        pack,
    })
}

/// The offset of the newline that ends the header: the empty line after the refs.
fn find_blank_line(header: &[u8]) -> Option<usize> {
    if header.first() == Some(&b'\n') {
        return Some(0);
    }
    header
        .windows(2)
        .position(|w| w == b"\n\n")
        .map(|at| at + 1)
}

fn read_u32(bytes: &[u8], at: usize) -> Option<u32> {
    let word: [u8; 4] = bytes.get(at..at + 4)?.try_into().ok()?;
    Some(u32::from_be_bytes(word))
}

/// The one ref a bundle names, which must be `expected` (a full ref name).
pub(crate) fn only_ref(parsed: &Parsed<'_>, expected: &str) -> Result<Oid, BundleError> {
    let mut refs = parsed.refs.iter();
    let Some((tip, name)) = refs.next() else {
        return Err(BundleError::NoRef);
    };
    let foreign = |name: &str| BundleError::ForeignRef {
        refname: name.to_owned(),
        expected: expected.to_owned(),
    };
    if name != expected {
        return Err(foreign(name));
    }
    if let Some((_, other)) = refs.next() {
        return Err(foreign(other));
    }
    Ok(*tip)
}

/// A bare repository holding one bundle's objects (and reading threadgate's through
/// its alternates), removed with its directory when dropped.
pub(crate) struct Quarantine {
    dir: PathBuf,
    pub(crate) repo: Repository,
}

impl Quarantine {
    /// Makes the quarantine under `parent` (borrowing the objects of `borrow`, when
    /// given) and indexes `pack` into it; libgit2's indexer hashes every object.
    pub(crate) fn index(
        parent: &Path,
        borrow: Option<&Repository>,
        pack: &[u8],
    ) -> Result<Quarantine, BundleError> {
        let dir = parent.join(format!(
            ".quarantine-{}-{}",
            std::process::id(),
            QUARANTINE_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let made = Repository::init_bare(&dir).map_err(BundleError::git("making the quarantine"));
        // From here on the directory is removed on any error (the guard's drop).
        let mut guard = RemoveOnDrop(Some(dir.clone()));
        drop(made?);
        if let Some(main) = borrow {
            let objects = main.path().join("objects");
            let alternates = dir.join("objects/info/alternates");
            std::fs::write(&alternates, format!("{}\n", objects.display()))
                .map_err(BundleError::io(&alternates))?;
        }
        // Opened again, so the alternates are read.
        let repo =
            Repository::open_bare(&dir).map_err(BundleError::git("opening the quarantine"))?;
        guard.0 = None;
        let quarantine = Quarantine { dir, repo };
        store_pack(&quarantine.repo, pack)?;
        Ok(quarantine)
    }
}

/// Removes a directory when dropped (a quarantine not finished).
struct RemoveOnDrop(Option<PathBuf>);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if let Some(dir) = &self.0 {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

impl Drop for Quarantine {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Indexes `pack` into `repo`'s object database (every object hashed as it is stored).
pub(crate) fn store_pack(repo: &Repository, pack: &[u8]) -> Result<(), BundleError> {
    let odb = repo
        .odb()
        .map_err(BundleError::git("opening the object database"))?;
    let mut writer = odb
        .packwriter()
        .map_err(BundleError::git("indexing the pack"))?;
    std::io::Write::write_all(&mut writer, pack).map_err(|e| BundleError::Garbled {
        reason: format!("its pack does not index: {e}"),
    })?;
    writer.commit().map_err(|e| BundleError::Garbled {
        reason: format!("its pack does not index: {}", e.message()),
    })?;
    Ok(())
}

/// A deadline for one bundle's verification.
#[derive(Clone, Copy)]
pub(crate) struct Deadline {
    at: Instant,
    limit: Duration,
}

impl Deadline {
    pub(crate) fn after(limit: Duration) -> Deadline {
        Deadline {
            at: Instant::now() + limit,
            limit,
        }
    }

    pub(crate) fn check(&self) -> Result<(), BundleError> {
        if Instant::now() > self.at {
            return Err(BundleError::TimedOut { limit: self.limit });
        }
        Ok(())
    }
}

/// Walks the tree `tree` of `repo` as it would be written out, refusing what cannot be
/// (an unsafe name, an unknown mode, a symlinked `.gitmodules`) and what passes the
/// caps: every entry counts, and every file's size, so a tree that names one blob a
/// million times is refused before anything is written.
pub(crate) fn check_tree(
    repo: &Repository,
    tree: Oid,
    limits: &BundleLimits,
    deadline: Deadline,
) -> Result<(), BundleError> {
    let mut walk = TreeWalk {
        repo,
        limits,
        deadline,
        entries: 0,
        bytes: 0,
    };
    walk.tree(tree, "", 0)
}

struct TreeWalk<'a> {
    repo: &'a Repository,
    limits: &'a BundleLimits,
    deadline: Deadline,
    entries: usize,
    bytes: u64,
}

impl TreeWalk<'_> {
    fn tree(&mut self, id: Oid, prefix: &str, depth: usize) -> Result<(), BundleError> {
        self.deadline.check()?;
        let tree = self.repo.find_tree(id).map_err(|_| BundleError::Garbled {
            reason: format!("the tree at {prefix:?} is missing from it"),
        })?;
        let odb = self
            .repo
            .odb()
            .map_err(BundleError::git("opening the object database"))?;
        for entry in tree.iter() {
            let name = entry.name_bytes();
            let path = format!("{prefix}{}", String::from_utf8_lossy(name));
            let unsafe_entry = |reason| BundleError::UnsafeEntry {
                path: path.clone(),
                reason,
            };
            match names::check_entry_name(name) {
                Ok(()) => {}
                Err(names::NameProblem::NotAComponent) => {
                    return Err(unsafe_entry("not one path component"));
                }
                Err(names::NameProblem::ReservedGitName) => {
                    return Err(unsafe_entry("a name git reserves for itself"));
                }
            }
            self.entries += 1;
            if self.entries > self.limits.max_entries {
                return Err(BundleError::TreeTooLarge {
                    cap: format!("{} entries", self.limits.max_entries),
                });
            }
            match entry.filemode() {
                0o040000 => {
                    if depth + 1 > crate::workspace::MAX_DEPTH {
                        return Err(unsafe_entry("nested too deep"));
                    }
                    self.tree(entry.id(), &format!("{path}/"), depth + 1)?;
                }
                mode @ (0o100644 | 0o100755 | 0o120000) => {
                    if mode == 0o120000 && names::is_git_control_file(name) {
                        return Err(unsafe_entry("a git control file as a symlink"));
                    }
                    let (size, kind) =
                        odb.read_header(entry.id())
                            .map_err(|_| BundleError::Garbled {
                                reason: format!("the file {path:?} is missing from it"),
                            })?;
                    if kind != git2::ObjectType::Blob {
                        return Err(unsafe_entry("a file that is not a blob"));
                    }
                    self.bytes = self
                        .bytes
                        .saturating_add(u64::try_from(size).unwrap_or(u64::MAX));
                    if self.bytes > self.limits.max_tree_bytes {
                        return Err(BundleError::TreeTooLarge {
                            cap: format!("{} bytes of files", self.limits.max_tree_bytes),
                        });
                    }
                }
                // A submodule: written as an empty directory, its commit never read.
                0o160000 => {}
                _ => return Err(unsafe_entry("a mode git does not write")),
            }
        }
        Ok(())
    }
}
