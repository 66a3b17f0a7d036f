//! The pod's side of a workspace carried through the relay (`threadgate relay
//! --workspace-dir`): the branch tip the gateway hands out written into the volume the
//! agent works in, and what the agent left there packed back as a bundle of one commit
//! on that tip.
//!
//! The relay keeps its own git directory (`--workspace-git`, a volume the agent does
//! not mount): the agent controls every byte of the workspace, `.git` included, so
//! nothing is read back from there but the files, walked as the gateway walks a
//! worktree (`openat` with `O_NOFOLLOW`, symlinks stored as links, `.git` skipped).
//! The base the gateway handed out is recorded last (`threadgate-base` in the git
//! directory): a relay restarted in the same pod finds it and leaves the agent's work
//! alone; one that died while writing finds none and writes the workspace again.

use std::ffi::OsStr;
use std::path::PathBuf;

use git2::{Oid, Repository, RepositoryOpenFlags, Signature};
use rustix::fs::{CWD, Mode, OFlags};

use crate::ids::ThreadId;
use crate::workspace::bundle::{self, BundleError, BundleLimits, Deadline, Quarantine};
use crate::workspace::snapshot::Snapshot;
use crate::workspace::{CommitLimits, names, prepare};

/// The file in the relay's git directory naming the base handed out and its branch.
const BASE_FILE: &str = "threadgate-base";

/// A pod's workspace and the relay's own git directory beside it.
#[derive(Debug, Clone)]
pub struct PodWorkspace {
    /// The volume the agent works in (`/workspace`).
    pub work_dir: PathBuf,
    /// The relay's own git directory.
    pub git_dir: PathBuf,
}

/// The pod's work, packed or not.
#[derive(Debug)]
pub enum PodWork {
    /// The workspace's tree is the one last sent.
    Unchanged,
    /// A bundle of one commit on the base, with its tree.
    Bundle {
        /// The tree of its commit.
        tree: Oid,
        /// The bundle.
        bytes: Vec<u8>,
    },
}

/// What the gateway handed out, as the pod recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodBase {
    /// The commit handed out.
    pub commit: Oid,
    /// The thread's branch, a full ref name.
    pub branch: String,
}

impl PodWorkspace {
    /// The base recorded by an earlier [`PodWorkspace::receive_base`], if any.
    pub fn base(&self) -> Result<Option<PodBase>, BundleError> {
        let path = self.git_dir.join(BASE_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(BundleError::io(&path)(e)),
        };
        let garbled = || BundleError::Garbled {
            reason: format!("{} is not \"<commit> <branch>\"", path.display()),
        };
        let (commit, branch) = text.trim().split_once(' ').ok_or_else(garbled)?;
        Ok(Some(PodBase {
            commit: Oid::from_str(commit).map_err(|_| garbled())?,
            branch: branch.to_owned(),
        }))
    }

    /// Writes the handed-out branch tip into the workspace (emptied first: a relay
    /// that died while writing leaves part of it), with the agent's standalone `.git`
    /// as on Docker, and records the base last.
    pub fn receive_base(
        &self,
        bytes: &[u8],
        limits: &BundleLimits,
    ) -> Result<PodBase, BundleError> {
        let deadline = Deadline::after(limits.max_time);
        let parsed = bundle::parse(bytes, limits)?;
        let (tip, branch) = match parsed.refs.as_slice() {
            [(tip, branch)] => (*tip, String::from(branch.as_str())),
            [] => return Err(BundleError::NoRef),
            [_, (_, other), ..] => {
                return Err(BundleError::ForeignRef {
                    refname: other.clone(),
                    expected: "one thread branch".into(),
                });
            }
        };
        let thread_id = thread_of(&branch)?;
        if !parsed.prerequisites.is_empty() {
            return Err(BundleError::Base {
                reason: "a handed-out workspace has no prerequisite".into(),
            });
        }
        std::fs::create_dir_all(&self.git_dir).map_err(BundleError::io(&self.git_dir))?;
        let _ = std::fs::remove_file(self.git_dir.join(BASE_FILE));
        let repo = self.repository()?;
        // Indexed through a quarantine in the git directory, then kept: the relay's
        // repository holds only what the gateway sent and what the relay wrote.
        let quarantine = Quarantine::index(&self.git_dir, None, parsed.pack)?;
        let commit = quarantine
            .repo
            .find_commit(tip)
            .map_err(|_| BundleError::Garbled {
                reason: format!("its tip {tip} is not a commit it holds"),
            })?;
        bundle::check_tree(&quarantine.repo, commit.tree_id(), limits, deadline)?;
        drop(commit);
        drop(quarantine);
        bundle::store_pack(&repo, parsed.pack)?;
        let tree = repo
            .find_commit(tip)
            .and_then(|c| c.tree())
            .map_err(BundleError::git("reading the handed-out tree"))?;
        std::fs::create_dir_all(&self.work_dir).map_err(BundleError::io(&self.work_dir))?;
        crate::workspace::handoff::empty_dir(&self.work_dir)?;
        let written =
            prepare::write_tree(&repo, &thread_id, &tree, &self.work_dir, 0).and_then(|()| {
                prepare::init_agent_git(&repo, &thread_id, &branch, tip, tree.id(), &self.work_dir)
            });
        written.map_err(|e| BundleError::Io {
            path: self.work_dir.clone(),
            source: std::io::Error::other(e.to_string()),
        })?;
        let base_file = self.git_dir.join(BASE_FILE);
        std::fs::write(&base_file, format!("{tip} {branch}\n"))
            .map_err(BundleError::io(&base_file))?;
        tracing::info!(base = %tip, "the thread's workspace is in place");
        Ok(PodBase {
            commit: tip,
            branch,
        })
    }

    /// What the agent left in the workspace as one commit on the base, bundled with
    /// the objects the base does not hold.
    pub fn bundle_changes(&self, limits: CommitLimits) -> Result<Vec<u8>, BundleError> {
        match self.bundle_changes_unless(limits, None)? {
            PodWork::Bundle { bytes, .. } => Ok(bytes),
            PodWork::Unchanged => Err(BundleError::Garbled {
                reason: "no tree to compare with was given".into(),
            }),
        }
    }

    /// As [`PodWorkspace::bundle_changes`], unless the workspace's tree is `sent` (the
    /// tree of the last bundle the gateway took): then nothing is packed.
    pub fn bundle_changes_unless(
        &self,
        limits: CommitLimits,
        sent: Option<Oid>,
    ) -> Result<PodWork, BundleError> {
        let base = self.base()?.ok_or_else(|| BundleError::Base {
            reason: "the workspace was never handed out".into(),
        })?;
        let thread_id = thread_of(&base.branch)?;
        let repo = self.repository()?;
        let loose = self.repository()?;
        let parent = repo
            .find_commit(base.commit)
            .map_err(BundleError::git("reading the base"))?;
        let base_tree = parent
            .tree()
            .map_err(BundleError::git("reading the base"))?;
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let root = rustix::fs::openat(CWD, &self.work_dir, flags, Mode::empty())
            .map_err(|e| BundleError::io(&self.work_dir)(e.into()))?;
        let mut snapshot = Snapshot::new((&repo, &loose), &thread_id, None, limits);
        let tree = snapshot
            .root_tree(&root, &base_tree)
            .map_err(|e| BundleError::Io {
                path: self.work_dir.clone(),
                source: std::io::Error::other(e.to_string()),
            })?;
        let skipped = snapshot.into_skipped();
        for file in skipped.iter().take(20) {
            tracing::warn!(file = %file.path.display(), reason = %file.reason, "left a file out of the workspace sent back");
        }
        if sent == Some(tree) {
            return Ok(PodWork::Unchanged);
        }
        let tree = repo
            .find_tree(tree)
            .map_err(BundleError::git("reading the tree"))?;
        let signature = Signature::now("threadgate relay", "relay@threadgate.invalid")
            .map_err(BundleError::git("making the signature"))?;
        let tip = repo
            .commit(
                None,
                &signature,
                &signature,
                "the pod's workspace",
                &tree,
                &[&parent],
            )
            .map_err(BundleError::git("writing the commit"))?;
        let mut walk = repo
            .revwalk()
            .map_err(BundleError::git("walking the commit"))?;
        walk.push(tip)
            .and_then(|()| walk.hide(base.commit))
            .map_err(BundleError::git("walking the commit"))?;
        let mut pack = repo.packbuilder().map_err(BundleError::git("packing"))?;
        pack.insert_walk(&mut walk)
            .map_err(BundleError::git("packing"))?;
        let mut bytes = git2::Buf::new();
        pack.write_buf(&mut bytes)
            .map_err(BundleError::git("packing"))?;
        Ok(PodWork::Bundle {
            tree: tree.id(),
            bytes: bundle::write(&[base.commit], &[(tip, base.branch.as_str())], &bytes),
        })
    }

    /// The relay's repository, made on first use.
    fn repository(&self) -> Result<Repository, BundleError> {
        match Repository::open_ext(
            &self.git_dir,
            RepositoryOpenFlags::NO_SEARCH | RepositoryOpenFlags::BARE,
            None::<&OsStr>,
        ) {
            Ok(repo) => Ok(repo),
            Err(_) => Repository::init_bare(&self.git_dir)
                .map_err(BundleError::git("making the relay's repository")),
        }
    }
}

/// The thread of a handed-out branch, `refs/heads/threadgate/<thread-id>`.
fn thread_of(branch: &str) -> Result<ThreadId, BundleError> {
    let foreign = || BundleError::ForeignRef {
        refname: branch.to_owned(),
        expected: format!("refs/heads/{}<thread-id>", names::BRANCH_PREFIX),
    };
    let id = branch
        .strip_prefix("refs/heads/")
        .and_then(|b| b.strip_prefix(names::BRANCH_PREFIX))
        .ok_or_else(foreign)?;
    ThreadId::parse(id).map_err(|_| foreign())
}
