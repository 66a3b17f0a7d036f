//! Fixtures for the workspace tests: a real repository built with git2, and helpers
//! that read refs, trees and directories back for comparison.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use git2::{Oid, Repository, Signature};
use tempfile::TempDir;
use threadgate::workspace::{RepoConfig, Workspaces};

/// A temporary world: threadgate's repository, a worktrees directory, and a directory
/// "outside" that nothing may touch.
pub(super) struct Fixture {
    pub _tmp: TempDir,
    pub repo_path: PathBuf,
    pub worktrees: PathBuf,
    pub outside: PathBuf,
    pub main_tip: Oid,
    pub ws: Workspaces,
}

impl Fixture {
    pub(super) fn new() -> Fixture {
        Fixture::with(|_| {})
    }

    /// Builds the fixture, letting `adjust` change the config before opening.
    pub(super) fn with(adjust: impl FnOnce(&mut RepoConfig)) -> Fixture {
        let tmp = TempDir::new().unwrap();
        let root = tmp.path().canonicalize().unwrap();
        let repo_path = root.join("repo");
        let main_tip = init_repo(&repo_path);
        let outside = root.join("outside");
        fs::create_dir_all(outside.join("hooks")).unwrap();
        fs::write(outside.join("data.txt"), "outside data\n").unwrap();
        let worktrees = root.join("worktrees");
        let mut cfg = RepoConfig {
            repo_path: repo_path.clone(),
            default_branch: None,
            worktrees_dir: worktrees.clone(),
            remote: None,
            commit_limits: Default::default(),
        };
        adjust(&mut cfg);
        let ws = Workspaces::open(cfg).unwrap();
        Fixture {
            _tmp: tmp,
            repo_path,
            worktrees,
            outside,
            main_tip,
            ws,
        }
    }

    pub(super) fn repo(&self) -> Repository {
        Repository::open(&self.repo_path).unwrap()
    }

    pub(super) fn refs(&self) -> BTreeMap<String, String> {
        all_refs(&self.repo())
    }

    pub(super) fn tip(&self, thread: &str) -> Oid {
        self.repo()
            .refname_to_id(&format!("refs/heads/threadgate/{thread}"))
            .unwrap()
    }

    /// Path -> (mode, content) of the tree of `commit`.
    pub(super) fn tree_of(&self, commit: Oid) -> BTreeMap<String, (i32, Vec<u8>)> {
        let repo = self.repo();
        let tree = repo.find_commit(commit).unwrap().tree().unwrap();
        tree_files(&repo, &tree)
    }
}

/// Creates a working repository at `path` whose `main` holds a few files, an executable,
/// a nested directory and a symlink, plus a `release` branch. Returns main's tip.
pub(super) fn init_repo(path: &Path) -> Oid {
    let mut opts = git2::RepositoryInitOptions::new();
    opts.initial_head("main");
    let repo = Repository::init_opts(path, &opts).unwrap();
    let first = commit_files(
        &repo,
        Some("refs/heads/main"),
        &[
            ("README.md", 0o100644, b"hello\n".as_slice()),
            ("src/lib.rs", 0o100644, b"pub fn f() {}\n"),
        ],
        &[],
    );
    repo.reference("refs/heads/release", first, false, "test")
        .unwrap();
    let parent = repo.find_commit(first).unwrap();
    commit_files(
        &repo,
        Some("refs/heads/main"),
        &[
            ("README.md", 0o100644, b"hello\n".as_slice()),
            ("src/lib.rs", 0o100644, b"pub fn f() {}\n"),
            ("run.sh", 0o100755, b"#!/bin/sh\necho hi\n"),
            ("docs/guide.md", 0o100644, b"# guide\n"),
            ("link", 0o120000, b"README.md"),
        ],
        &[&parent],
    )
}

/// Writes a commit whose tree holds exactly `files` (path, mode, content).
pub(super) fn commit_files(
    repo: &Repository,
    update_ref: Option<&str>,
    files: &[(&str, i32, &[u8])],
    parents: &[&git2::Commit<'_>],
) -> Oid {
    let mut index = git2::Index::new().unwrap();
    for (path, mode, content) in files {
        let id = repo.blob(content).unwrap();
        let entry = git2::IndexEntry {
            ctime: git2::IndexTime::new(0, 0),
            mtime: git2::IndexTime::new(0, 0),
            dev: 0,
            ino: 0,
            mode: *mode as u32,
            uid: 0,
            gid: 0,
            file_size: u32::try_from(content.len()).unwrap_or(u32::MAX),
            id,
            flags: 0,
            flags_extended: 0,
            path: path.as_bytes().to_vec(),
        };
        index.add(&entry).unwrap();
    }
    let tree_id = index.write_tree_to(repo).unwrap();
    let tree = repo.find_tree(tree_id).unwrap();
    let sig = Signature::now("fixture", "fixture@example.invalid").unwrap();
    repo.commit(update_ref, &sig, &sig, "fixture", &tree, parents)
        .unwrap()
}

/// Every reference (symbolic ones by their target name) of a repository.
pub(super) fn all_refs(repo: &Repository) -> BTreeMap<String, String> {
    let mut refs = BTreeMap::new();
    for reference in repo.references().unwrap() {
        let reference = reference.unwrap();
        let value = match reference.target() {
            Some(id) => id.to_string(),
            None => format!("-> {}", reference.symbolic_target().unwrap().unwrap()),
        };
        refs.insert(reference.name().unwrap().to_owned(), value);
    }
    let head = repo.find_reference("HEAD").unwrap();
    refs.insert(
        "HEAD".into(),
        format!("{:?}", (head.symbolic_target().unwrap(), head.target())),
    );
    refs
}

pub(super) fn tree_files(
    repo: &Repository,
    tree: &git2::Tree<'_>,
) -> BTreeMap<String, (i32, Vec<u8>)> {
    let mut files = BTreeMap::new();
    tree.walk(git2::TreeWalkMode::PreOrder, |dir, entry| {
        let path = format!("{dir}{}", entry.name().unwrap());
        let content = match entry.kind() {
            Some(git2::ObjectType::Blob) => repo.find_blob(entry.id()).unwrap().content().to_vec(),
            _ => entry.id().to_string().into_bytes(),
        };
        if entry.kind() != Some(git2::ObjectType::Tree) {
            files.insert(path, (entry.filemode(), content));
        }
        git2::TreeWalkResult::Ok
    })
    .unwrap();
    files
}

/// Path -> description of every entry below `dir`, symlinks not followed.
pub(super) fn dir_listing(dir: &Path) -> BTreeMap<PathBuf, String> {
    let mut listing = BTreeMap::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(current) = stack.pop() {
        for entry in fs::read_dir(&current).unwrap() {
            let path = entry.unwrap().path();
            let meta = fs::symlink_metadata(&path).unwrap();
            let described = if meta.file_type().is_symlink() {
                format!("link {}", fs::read_link(&path).unwrap().display())
            } else if meta.is_dir() {
                stack.push(path.clone());
                format!("dir {:o}", meta.permissions().mode())
            } else {
                format!(
                    "file {}",
                    String::from_utf8_lossy(&fs::read(&path).unwrap_or_default())
                )
            };
            listing.insert(path.strip_prefix(dir).unwrap().to_owned(), described);
        }
    }
    listing
}

pub(super) fn write_exec(path: &Path, content: &str) {
    fs::write(path, content).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(0o755)).unwrap();
}

/// `text` as a thread id (the tests' ids are all valid).
pub(super) fn tid(text: &str) -> threadgate::ids::ThreadId {
    threadgate::ids::ThreadId::parse(text).expect("thread id")
}
