//! A workspace handed out to a pod and its work received back, with real repositories:
//! the round trip, each refusal (and that it changes nothing), a moved branch.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use git2::{ObjectType, Oid, Repository, Signature};

use super::bundle::{self, BundleError, BundleLimits};
use super::{CommitLimits, PodWorkspace, Received, RepoConfig, Workspaces};
use crate::ids::ThreadId;

struct Setup {
    _dir: tempfile::TempDir,
    repo_path: PathBuf,
    workspaces: Workspaces,
    thread: ThreadId,
    pod: PodWorkspace,
}

const THREAD_REF: &str = "refs/heads/threadgate/th_pod";

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let repo_path = dir.path().join("repo");
    let repo = Repository::init(&repo_path).unwrap();
    let sig = Signature::now("t", "t@example.invalid").unwrap();
    let mut root = repo.treebuilder(None).unwrap();
    let readme = repo.blob(b"hello\n").unwrap();
    let keep = repo.blob(b"kept\n").unwrap();
    root.insert("README", readme, 0o100644).unwrap();
    let mut sub = repo.treebuilder(None).unwrap();
    sub.insert("b.txt", keep, 0o100644).unwrap();
    let sub = sub.write().unwrap();
    root.insert("dir", sub, 0o040000).unwrap();
    let tree = repo.find_tree(root.write().unwrap()).unwrap();
    repo.commit(Some("refs/heads/main"), &sig, &sig, "init", &tree, &[])
        .unwrap();
    repo.set_head("refs/heads/main").unwrap();
    let workspaces = Workspaces::open(RepoConfig {
        repo_path: repo_path.clone(),
        default_branch: Some("main".into()),
        worktrees_dir: dir.path().join("worktrees"),
        remote: None,
        commit_limits: CommitLimits::default(),
    })
    .unwrap();
    let thread = ThreadId::parse("th_pod").unwrap();
    workspaces.prepare(&thread).unwrap();
    let pod = PodWorkspace {
        work_dir: dir.path().join("pod/workspace"),
        git_dir: dir.path().join("pod/git"),
    };
    Setup {
        _dir: dir,
        repo_path,
        workspaces,
        thread,
        pod,
    }
}

impl Setup {
    fn repo(&self) -> Repository {
        Repository::open(&self.repo_path).unwrap()
    }

    fn worktree(&self) -> PathBuf {
        self.workspaces.settings.worktrees_dir.join(&self.thread)
    }

    fn tip(&self) -> Oid {
        self.repo().refname_to_id(THREAD_REF).unwrap()
    }

    /// The pod received its workspace.
    fn handed_out(&self) -> Oid {
        let out = self.workspaces.hand_out(&self.thread).unwrap();
        self.pod
            .receive_base(&out, &BundleLimits::default())
            .unwrap()
            .commit
    }

    /// Everything a refusal must leave as it was: every ref, every file of the git
    /// directory's objects, every file of the worktree.
    fn state(&self) -> BTreeMap<String, String> {
        let mut state = BTreeMap::new();
        let repo = self.repo();
        for r in repo.references().unwrap() {
            let r = r.unwrap();
            state.insert(
                format!("ref {}", r.name().unwrap()),
                format!("{:?}", r.target()),
            );
        }
        list(&self.repo_path.join(".git/objects"), "objects", &mut state);
        list(&self.worktree(), "worktree", &mut state);
        list(
            &self.workspaces.settings.worktrees_dir,
            "worktrees",
            &mut state,
        );
        state
    }
}

fn list(dir: &Path, prefix: &str, into: &mut BTreeMap<String, String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let path = entry.path();
        let name = format!("{prefix}/{}", entry.file_name().to_string_lossy());
        let meta = std::fs::symlink_metadata(&path).unwrap();
        if meta.is_dir() && prefix != "worktrees" {
            list(&path, &name, into);
        } else if meta.is_file() && prefix != "worktrees" {
            into.insert(name, format!("{:?}", std::fs::read(&path).unwrap()));
        } else {
            into.insert(name, format!("{:?}", meta.file_type()));
        }
    }
}

fn tree_files(repo: &Repository, commit: Oid) -> BTreeMap<String, (i32, Vec<u8>)> {
    let tree = repo.find_commit(commit).unwrap().tree().unwrap();
    let mut files = BTreeMap::new();
    tree.walk(git2::TreeWalkMode::PreOrder, |root, entry| {
        if entry.kind() == Some(ObjectType::Blob) {
            let blob = repo.find_blob(entry.id()).unwrap();
            files.insert(
                format!("{root}{}", entry.name().unwrap()),
                (entry.filemode(), blob.content().to_vec()),
            );
        }
        git2::TreeWalkResult::Ok
    })
    .unwrap();
    files
}

#[test]
fn a_workspace_goes_into_the_pod_and_its_work_comes_back_to_the_branch() {
    let s = setup();
    let base = s.handed_out();
    assert_eq!(base, s.tip());
    let work = &s.pod.work_dir;
    assert_eq!(std::fs::read(work.join("README")).unwrap(), b"hello\n");
    assert_eq!(std::fs::read(work.join("dir/b.txt")).unwrap(), b"kept\n");
    // The agent's convenience .git, as on Docker: the tip, shallow.
    let agent = Repository::open(work).unwrap();
    assert_eq!(agent.head().unwrap().target(), Some(base));

    // The agent works: an edit, a new file, a deletion, a symlink (out of the tree,
    // stored as a link and never followed).
    std::fs::write(work.join("README"), "hello from the pod\n").unwrap();
    std::fs::write(work.join("new.txt"), "new\n").unwrap();
    std::fs::remove_dir_all(work.join("dir")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", work.join("link")).unwrap();
    let sent = s.pod.bundle_changes(CommitLimits::default()).unwrap();
    let received = s
        .workspaces
        .receive(&s.thread, &sent, &BundleLimits::default())
        .unwrap();
    assert!(
        matches!(received, Received::Mirrored { .. }),
        "{received:?}"
    );
    // Nothing moved yet: the ordinary commit takes the worktree.
    assert_eq!(s.tip(), base);
    let committed = s.workspaces.commit(&s.thread, &[]).unwrap();
    let first = Oid::from_str(committed.commit.as_deref().unwrap()).unwrap();
    assert_eq!(s.tip(), first);
    let repo = s.repo();
    assert_eq!(repo.find_commit(first).unwrap().parent_id(0).unwrap(), base);
    let files = tree_files(&repo, first);
    assert_eq!(
        files["README"],
        (0o100644, b"hello from the pod\n".to_vec())
    );
    assert_eq!(files["new.txt"], (0o100644, b"new\n".to_vec()));
    assert_eq!(files["link"], (0o120000, b"/etc/passwd".to_vec()));
    assert!(!files.contains_key("dir/b.txt"), "{files:?}");

    // A second checkpoint: the pod still bundles against the base it was handed; the
    // branch has moved past it, so it is a fast-forward and applies on the new tip.
    std::fs::write(work.join("new.txt"), "newer\n").unwrap();
    let sent = s.pod.bundle_changes(CommitLimits::default()).unwrap();
    s.workspaces
        .receive(&s.thread, &sent, &BundleLimits::default())
        .unwrap();
    let second = s.workspaces.commit(&s.thread, &[]).unwrap();
    let second = Oid::from_str(second.commit.as_deref().unwrap()).unwrap();
    assert_eq!(
        repo.find_commit(second).unwrap().parent_id(0).unwrap(),
        first
    );
    let files = tree_files(&repo, second);
    assert_eq!(files["new.txt"], (0o100644, b"newer\n".to_vec()));
    assert_eq!(
        files["README"],
        (0o100644, b"hello from the pod\n".to_vec())
    );

    // A relay restarted in the same pod finds its base and keeps the agent's work.
    assert_eq!(s.pod.base().unwrap().unwrap().commit, base);
}

#[test]
fn a_secret_the_pod_sends_back_is_left_out_by_the_commit() {
    let s = setup();
    s.handed_out();
    std::fs::write(
        s.pod.work_dir.join("leak.txt"),
        "key fake_key_0123456789abcdef\n",
    )
    .unwrap();
    let sent = s.pod.bundle_changes(CommitLimits::default()).unwrap();
    s.workspaces
        .receive(&s.thread, &sent, &BundleLimits::default())
        .unwrap();
    let value = b"fake_key_0123456789abcdef".as_slice();
    let report = s
        .workspaces
        .commit(&s.thread, &[("stripe", value)])
        .unwrap();
    assert_eq!(report.skipped.len(), 1, "{:?}", report.skipped);
    let files = tree_files(&s.repo(), s.tip());
    assert!(!files.contains_key("leak.txt"), "{files:?}");
}

/// Receives `sent` and checks it is refused as `expected` with nothing changed.
fn refused(s: &Setup, sent: &[u8], limits: &BundleLimits, expected: fn(&BundleError) -> bool) {
    let before = s.state();
    let e = s.workspaces.receive(&s.thread, sent, limits).unwrap_err();
    assert!(expected(&e), "{e}");
    assert!(e.is_refusal(), "{e}");
    assert_eq!(s.state(), before, "a refusal changed something: {e}");
}

/// A bundle of `tip` (its objects not in `base`) naming `refname`, from the pod's
/// repository.
fn crafted(s: &Setup, base: Oid, tip: Oid, refname: &str) -> Vec<u8> {
    let repo = Repository::open_bare(&s.pod.git_dir).unwrap();
    let mut walk = repo.revwalk().unwrap();
    walk.push(tip).unwrap();
    let _ = walk.hide(base);
    let mut pack = repo.packbuilder().unwrap();
    pack.insert_walk(&mut walk).unwrap();
    let mut bytes = git2::Buf::new();
    pack.write_buf(&mut bytes).unwrap();
    bundle::write(&[base], &[(tip, refname)], &bytes)
}

/// A commit in the pod's repository on `parents` whose root tree is `tree`.
fn pod_commit(s: &Setup, tree: Oid, parents: &[Oid]) -> Oid {
    let repo = Repository::open_bare(&s.pod.git_dir).unwrap();
    let sig = Signature::now("agent", "agent@example.invalid").unwrap();
    let tree = repo.find_tree(tree).unwrap();
    let parents: Vec<_> = parents
        .iter()
        .map(|p| repo.find_commit(*p).unwrap())
        .collect();
    let parents: Vec<_> = parents.iter().collect();
    repo.commit(None, &sig, &sig, "crafted", &tree, &parents)
        .unwrap()
}

/// A raw tree object (not checked by libgit2's tree builder) of `entries`.
fn raw_tree(s: &Setup, entries: &[(&str, &[u8], Oid)]) -> Oid {
    let repo = Repository::open_bare(&s.pod.git_dir).unwrap();
    let mut raw = Vec::new();
    for (mode, name, id) in entries {
        raw.extend_from_slice(mode.as_bytes());
        raw.push(b' ');
        raw.extend_from_slice(name);
        raw.push(0);
        raw.extend_from_slice(id.as_bytes());
    }
    repo.odb().unwrap().write(ObjectType::Tree, &raw).unwrap()
}

#[test]
fn each_hostile_bundle_is_refused_and_changes_nothing() {
    let s = setup();
    let base = s.handed_out();
    std::fs::write(s.pod.work_dir.join("README"), "changed\n").unwrap();
    let good = s.pod.bundle_changes(CommitLimits::default()).unwrap();
    let limits = BundleLimits::default();

    // Garbage bytes, and a real header over a pack that does not index.
    refused(&s, b"garbage bytes", &limits, |e| {
        matches!(e, BundleError::Garbled { .. })
    });
    let tip = bundle::parse(&good, &limits).unwrap().refs[0].0;
    let mut broken = bundle::write(&[base], &[(tip, THREAD_REF)], b"PACK\0\0\0\x02\0\0\0\x01");
    broken.extend_from_slice(&[0xff; 64]);
    refused(&s, &broken, &limits, |e| {
        matches!(e, BundleError::Garbled { .. })
    });

    // Oversize, and more objects than allowed.
    let small = BundleLimits {
        max_bytes: good.len() - 1,
        ..limits
    };
    refused(&s, &good, &small, |e| {
        matches!(e, BundleError::TooLarge { .. })
    });
    let few = BundleLimits {
        max_objects: 1,
        ..limits
    };
    refused(&s, &good, &few, |e| {
        matches!(e, BundleError::TooManyObjects { .. })
    });

    // Another thread's branch, the default branch, two refs.
    let other = crafted(&s, base, tip, "refs/heads/threadgate/th_other");
    refused(&s, &other, &limits, |e| {
        matches!(e, BundleError::ForeignRef { .. })
    });
    let main = crafted(&s, base, tip, "refs/heads/main");
    refused(&s, &main, &limits, |e| {
        matches!(e, BundleError::ForeignRef { .. })
    });

    // A tip that does not descend from the base it names: not a fast-forward.
    let pod = Repository::open_bare(&s.pod.git_dir).unwrap();
    let tree = pod.find_commit(tip).unwrap().tree_id();
    let orphan = pod_commit(&s, tree, &[]);
    let rewritten = crafted(&s, base, orphan, THREAD_REF);
    refused(&s, &rewritten, &limits, |e| {
        matches!(e, BundleError::NotFastForward { .. })
    });

    // A base threadgate never handed out (unknown to its repository).
    let unknown = crafted(&s, orphan, pod_commit(&s, tree, &[orphan]), THREAD_REF);
    refused(&s, &unknown, &limits, |e| {
        matches!(e, BundleError::Base { .. })
    });

    // Paths out of the worktree or into git's own directory, a symlinked .gitmodules.
    let blob = pod.blob(b"x").unwrap();
    for (mode, name) in [
        ("100644", b"..".as_slice()),
        ("100644", b".GIT"),
        ("100644", b"a/b"),
        ("120000", b".gitmodules"),
    ] {
        let tree = raw_tree(&s, &[(mode, name, blob)]);
        let sent = crafted(&s, base, pod_commit(&s, tree, &[base]), THREAD_REF);
        refused(&s, &sent, &limits, |e| {
            matches!(e, BundleError::UnsafeEntry { .. })
        });
    }

    // A tree that names one subtree over and over: small to send, huge to write.
    let ten: Vec<(String, Oid)> = (0..10).map(|i| (format!("f{i}"), blob)).collect();
    let leaf = raw_tree(
        &s,
        &ten.iter()
            .map(|(n, id)| ("100644", n.as_bytes(), *id))
            .collect::<Vec<_>>(),
    );
    let fan: Vec<(String, Oid)> = (0..10).map(|i| (format!("d{i}"), leaf)).collect();
    let root = raw_tree(
        &s,
        &fan.iter()
            .map(|(n, id)| ("40000", n.as_bytes(), *id))
            .collect::<Vec<_>>(),
    );
    let bomb = crafted(&s, base, pod_commit(&s, root, &[base]), THREAD_REF);
    let capped = BundleLimits {
        max_entries: 50,
        ..limits
    };
    refused(&s, &bomb, &capped, |e| {
        matches!(e, BundleError::TreeTooLarge { .. })
    });

    // After all that, the honest bundle still applies.
    assert!(matches!(
        s.workspaces.receive(&s.thread, &good, &limits).unwrap(),
        Received::Mirrored { .. }
    ));
}

#[test]
fn a_pod_whose_base_the_branch_left_is_kept_under_a_backup_ref() {
    let s = setup();
    let base = s.handed_out();
    std::fs::write(s.pod.work_dir.join("README"), "pod work\n").unwrap();
    let sent = s.pod.bundle_changes(CommitLimits::default()).unwrap();
    let pod_tip = bundle::parse(&sent, &BundleLimits::default()).unwrap().refs[0].0;

    // Meanwhile the branch was moved to a history without the base (another instance's
    // tip, brought back from the remote).
    let repo = s.repo();
    let sig = Signature::now("t", "t@example.invalid").unwrap();
    let tree = repo.find_commit(base).unwrap().tree().unwrap();
    let elsewhere = repo
        .commit(None, &sig, &sig, "elsewhere", &tree, &[])
        .unwrap();
    repo.reference(THREAD_REF, elsewhere, true, "test").unwrap();
    let worktree_before = {
        let mut m = BTreeMap::new();
        list(&s.worktree(), "worktree", &mut m);
        m
    };

    let received = s
        .workspaces
        .receive(&s.thread, &sent, &BundleLimits::default())
        .unwrap();
    let backup = format!("refs/threadgate-backup/th_pod/{pod_tip}");
    assert_eq!(
        received,
        Received::Diverged {
            backup: backup.clone()
        }
    );
    assert_eq!(s.tip(), elsewhere, "the branch did not move");
    assert_eq!(repo.refname_to_id(&backup).unwrap(), pod_tip);
    let files = tree_files(&repo, pod_tip);
    assert_eq!(files["README"], (0o100644, b"pod work\n".to_vec()));
    let mut worktree_after = BTreeMap::new();
    list(&s.worktree(), "worktree", &mut worktree_after);
    assert_eq!(
        worktree_after, worktree_before,
        "the worktree was left alone"
    );
}

/// Files, links and the executable bit below `dir` (`.git` left out), as a map.
fn files_below(dir: &Path) -> BTreeMap<String, String> {
    use std::os::unix::fs::PermissionsExt as _;
    let mut files = BTreeMap::new();
    let mut pending = vec![(dir.to_path_buf(), String::new())];
    while let Some((at, prefix)) = pending.pop() {
        for entry in std::fs::read_dir(&at).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name().to_string_lossy().into_owned();
            if prefix.is_empty() && name == ".git" {
                continue;
            }
            let path = entry.path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let rel = format!("{prefix}{name}");
            if meta.is_dir() {
                pending.push((path, format!("{rel}/")));
            } else if meta.is_symlink() {
                let target = std::fs::read_link(&path).unwrap();
                files.insert(rel, format!("link {}", target.display()));
            } else {
                let exec = meta.permissions().mode() & 0o100 != 0;
                let content = String::from_utf8_lossy(&std::fs::read(&path).unwrap()).into_owned();
                files.insert(rel, format!("file exec={exec} {content:?}"));
            }
        }
    }
    files
}

fn inode(path: &Path) -> u64 {
    std::os::unix::fs::MetadataExt::ino(&std::fs::symlink_metadata(path).unwrap())
}

fn pull(s: &Setup) -> Received {
    let sent = s.pod.bundle_changes(CommitLimits::default()).unwrap();
    s.workspaces
        .receive(&s.thread, &sent, &BundleLimits::default())
        .unwrap()
}

/// A pull writes only what changed: deletions, renames, a mode change, a file that
/// became a directory and back, a retargeted symlink all land as a full rewrite would
/// have them, an unchanged file is not written again, and a worktree damaged in between
/// (a crash mid-pull) is completed without following a symlink out of it.
#[test]
fn a_pull_writes_only_what_changed() {
    use std::os::unix::fs::PermissionsExt as _;
    let s = setup();
    s.handed_out();
    let work = s.pod.work_dir.clone();
    let worktree = s.worktree();
    std::fs::write(work.join("run.sh"), "echo hi\n").unwrap();
    std::fs::create_dir(work.join("notes")).unwrap();
    std::fs::write(work.join("notes/a.md"), "a\n").unwrap();
    std::fs::write(work.join("swap"), "a file for now\n").unwrap();
    std::os::unix::fs::symlink("README", work.join("link")).unwrap();
    assert!(matches!(pull(&s), Received::Mirrored { .. }));
    assert_eq!(files_below(&worktree), files_below(&work));
    let readme = inode(&worktree.join("README"));
    let script = inode(&worktree.join("run.sh"));

    // A rename, a deletion (its directory goes with it), a mode change alone, a file
    // that becomes a directory, a retargeted link, an edit.
    std::fs::rename(work.join("notes/a.md"), work.join("notes/b.md")).unwrap();
    std::fs::remove_dir_all(work.join("dir")).unwrap();
    std::fs::set_permissions(work.join("run.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::remove_file(work.join("swap")).unwrap();
    std::fs::create_dir(work.join("swap")).unwrap();
    std::fs::write(work.join("swap/inner.txt"), "inside\n").unwrap();
    std::fs::remove_file(work.join("link")).unwrap();
    std::os::unix::fs::symlink("notes/b.md", work.join("link")).unwrap();
    std::fs::write(work.join("new.txt"), "new\n").unwrap();
    pull(&s);
    assert_eq!(files_below(&worktree), files_below(&work));
    assert!(!worktree.join("dir").exists());
    assert_eq!(
        inode(&worktree.join("README")),
        readme,
        "unchanged: not written"
    );
    assert_eq!(
        inode(&worktree.join("run.sh")),
        script,
        "a mode change: not written"
    );

    // The directory becomes a file again.
    std::fs::remove_dir_all(work.join("swap")).unwrap();
    std::fs::write(work.join("swap"), "a file again\n").unwrap();
    pull(&s);
    assert_eq!(files_below(&worktree), files_below(&work));

    // A pull cut short leaves a mix: the next one completes it, and a symlink standing
    // where a directory belongs is replaced, never written through.
    let outside = s._dir.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::remove_dir_all(worktree.join("notes")).unwrap();
    std::os::unix::fs::symlink(&outside, worktree.join("notes")).unwrap();
    std::fs::write(worktree.join("README"), "torn").unwrap();
    std::fs::remove_file(worktree.join("new.txt")).unwrap();
    std::fs::write(worktree.join("stray.txt"), "left by a crash\n").unwrap();
    pull(&s);
    assert_eq!(files_below(&worktree), files_below(&work));
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);

    // And the commit takes exactly the pod's files.
    let committed = s.workspaces.commit(&s.thread, &[]).unwrap();
    let files = tree_files(
        &s.repo(),
        Oid::from_str(committed.commit.as_deref().unwrap()).unwrap(),
    );
    assert_eq!(files["run.sh"].0, 0o100755);
    assert_eq!(files["link"], (0o120000, b"notes/b.md".to_vec()));
    assert_eq!(files["swap"], (0o100644, b"a file again\n".to_vec()));
    assert!(!files.contains_key("notes/a.md") && files.contains_key("notes/b.md"));
}

/// `[relay.workspace]` caps lowered in the settings refuse a bundle the defaults take,
/// and the refusal changes nothing; `sync_every = "0s"` turns the sync off.
#[test]
fn a_cap_lowered_in_the_settings_refuses_a_bundle_and_changes_nothing() {
    let s = setup();
    s.handed_out();
    for i in 0..4 {
        std::fs::write(s.pod.work_dir.join(format!("f{i}.txt")), format!("{i}\n")).unwrap();
    }
    let sent = s.pod.bundle_changes(CommitLimits::default()).unwrap();
    // As `[relay.workspace] max_entries = 4` gives them (config tests load the keys).
    let limits = BundleLimits {
        max_entries: 4,
        ..BundleLimits::default()
    };
    refused(
        &s,
        &sent,
        &limits,
        |e| matches!(e, BundleError::TreeTooLarge { cap } if cap == "4 entries"),
    );
    let bytes = BundleLimits {
        max_bytes: 1024,
        ..BundleLimits::default()
    };
    let mut large = sent.clone();
    large.resize(2048, 0);
    refused(&s, &large, &bytes, |e| {
        matches!(e, BundleError::TooLarge { limit: 1024 })
    });
    // The defaults take it.
    s.workspaces
        .receive(&s.thread, &sent, &BundleLimits::default())
        .unwrap();
}
