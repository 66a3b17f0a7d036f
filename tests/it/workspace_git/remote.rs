//! A thread's branch through the remote (issue 19): two `Workspaces`, each on its own
//! clone of the product's repository (two instances), share one bare remote on disk.
//! What one checkpoints and pushes, the other's `prepare` continues from: created,
//! fast-forwarded, or (diverged) reset to the remote's with the local tip kept under a
//! backup ref; a worktree left from an old tip is written again. A remote that cannot
//! be reached fails with an error that never shows the URL's credentials.

use std::fs;
use std::path::{Path, PathBuf};

use git2::Repository;
use tempfile::TempDir;
use threadgate::workspace::{RemoteSync, RepoConfig, WorkspaceError, Workspaces};

use super::support::{Fixture, all_refs, init_repo, tid};

/// One bare remote holding `main` of a fixture's repository.
struct Remote {
    _tmp: TempDir,
    path: PathBuf,
}

impl Remote {
    /// A bare remote holding `main` of a fresh product repository.
    fn new() -> Remote {
        let tmp = TempDir::new().unwrap();
        let root = tmp.path().canonicalize().unwrap();
        init_repo(&root.join("src"));
        let path = root.join("remote.git");
        let mut opts = git2::RepositoryInitOptions::new();
        opts.bare(true).initial_head("main");
        Repository::init_opts(&path, &opts).unwrap();
        let src = Repository::open(root.join("src")).unwrap();
        let mut anon = src.remote_anonymous(path.to_str().unwrap()).unwrap();
        anon.push(&["refs/heads/main:refs/heads/main"], None)
            .unwrap();
        Remote { _tmp: tmp, path }
    }

    fn url(&self) -> String {
        self.path.display().to_string()
    }

    fn tip(&self, thread: &str) -> Option<git2::Oid> {
        Repository::open(&self.path)
            .unwrap()
            .refname_to_id(&format!("refs/heads/threadgate/{thread}"))
            .ok()
    }
}

/// Another instance: its own clone of the remote's `main`, its own worktrees, the same
/// remote.
struct Instance {
    _tmp: TempDir,
    repo_path: PathBuf,
    ws: Workspaces,
}

impl Instance {
    fn cloning(remote: &Remote) -> Instance {
        let tmp = TempDir::new().unwrap();
        let root = tmp.path().canonicalize().unwrap();
        let repo_path = root.join("repo");
        Repository::clone(&remote.url(), &repo_path).unwrap();
        let ws = Workspaces::open(RepoConfig {
            repo_path: repo_path.clone(),
            default_branch: Some("main".into()),
            worktrees_dir: root.join("worktrees"),
            remote: Some(remote.url()),
            commit_limits: Default::default(),
        })
        .unwrap();
        Instance {
            _tmp: tmp,
            repo_path,
            ws,
        }
    }

    fn tip(&self, thread: &str) -> git2::Oid {
        Repository::open(&self.repo_path)
            .unwrap()
            .refname_to_id(&format!("refs/heads/threadgate/{thread}"))
            .unwrap()
    }

    fn refs(&self) -> std::collections::BTreeMap<String, String> {
        all_refs(&Repository::open(&self.repo_path).unwrap())
    }
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap()
}

#[test]
fn another_instance_continues_from_the_pushed_branch() {
    let remote = Remote::new();
    let a = Instance::cloning(&remote);
    let thread = tid("th_takeover");

    // Instance A works and checkpoints.
    let wt_a = a.ws.prepare(&thread).unwrap();
    assert_eq!(wt_a.remote, RemoteSync::Absent);
    fs::write(wt_a.path.join("NOTES.md"), "seen by a\n").unwrap();
    a.ws.commit(&thread, &[]).unwrap();
    a.ws.push(&thread).unwrap();
    assert_eq!(remote.tip("th_takeover"), Some(a.tip("th_takeover")));

    // Instance B takes the thread over: its branch and worktree come from the remote.
    let b = Instance::cloning(&remote);
    let wt_b = b.ws.prepare(&thread).unwrap();
    assert_eq!(wt_b.remote, RemoteSync::Created);
    assert!(!wt_b.resumed);
    assert_eq!(b.tip("th_takeover"), a.tip("th_takeover"));
    assert_eq!(wt_b.head, a.tip("th_takeover").to_string());
    assert_eq!(read(&wt_b.path.join("NOTES.md")), "seen by a\n");
    assert_eq!(read(&wt_b.path.join("README.md")), "hello\n");
    // Preparing again changes nothing.
    let again = b.ws.prepare(&thread).unwrap();
    assert_eq!(again.remote, RemoteSync::UpToDate);
    assert!(again.resumed);

    // B goes on and checkpoints; A, whose worktree still shows its own last tip, gets
    // the thread back: fast-forwarded, and the worktree written again from B's tip.
    fs::write(wt_b.path.join("NOTES.md"), "seen by b\n").unwrap();
    fs::write(wt_b.path.join("FIX.md"), "the fix\n").unwrap();
    b.ws.commit(&thread, &[]).unwrap();
    b.ws.push(&thread).unwrap();
    fs::write(wt_a.path.join("stale.txt"), "only in a's old worktree\n").unwrap();
    let fetch_head = a.repo_path.join(".git/FETCH_HEAD");
    let fetched_before = fs::read(&fetch_head).ok();
    let back = a.ws.prepare(&thread).unwrap();
    assert_eq!(back.remote, RemoteSync::FastForwarded);
    assert!(!back.resumed, "the old worktree is not kept");
    assert_eq!(a.tip("th_takeover"), b.tip("th_takeover"));
    assert_eq!(read(&back.path.join("NOTES.md")), "seen by b\n");
    assert_eq!(read(&back.path.join("FIX.md")), "the fix\n");
    assert!(!back.path.join("stale.txt").exists());
    // Only the thread's branch moved in A's repository: no new remote-tracking ref, no
    // FETCH_HEAD, no backup.
    let refs = a.refs();
    let threads: Vec<_> = refs.keys().filter(|r| r.contains("threadgate")).collect();
    assert_eq!(threads, ["refs/heads/threadgate/th_takeover"], "{refs:?}");
    assert_eq!(
        fs::read(&fetch_head).ok(),
        fetched_before,
        "FETCH_HEAD untouched"
    );
}

#[test]
fn diverged_branches_continue_from_the_remote_and_keep_the_local_tip() {
    let remote = Remote::new();
    let a = Instance::cloning(&remote);
    let thread = tid("th_split");
    let wt_a = a.ws.prepare(&thread).unwrap();
    fs::write(wt_a.path.join("NOTES.md"), "common\n").unwrap();
    a.ws.commit(&thread, &[]).unwrap();
    a.ws.push(&thread).unwrap();

    // B takes over and pushes; A, cut off meanwhile, committed on its own.
    let b = Instance::cloning(&remote);
    let wt_b = b.ws.prepare(&thread).unwrap();
    fs::write(wt_b.path.join("NOTES.md"), "b's line\n").unwrap();
    b.ws.commit(&thread, &[]).unwrap();
    b.ws.push(&thread).unwrap();
    fs::write(wt_a.path.join("NOTES.md"), "a's line\n").unwrap();
    a.ws.commit(&thread, &[]).unwrap();
    let a_tip = a.tip("th_split");
    // A's push is refused (not a fast-forward): the remote keeps B's work.
    let err = a.ws.push(&thread).unwrap_err();
    assert!(matches!(err, WorkspaceError::PushRejected { .. }), "{err}");
    assert_eq!(remote.tip("th_split"), Some(b.tip("th_split")));

    let resumed = a.ws.prepare(&thread).unwrap();
    let backup = format!("refs/threadgate-backup/th_split/{a_tip}");
    assert_eq!(
        resumed.remote,
        RemoteSync::Diverged {
            backup: backup.clone()
        }
    );
    assert_eq!(a.tip("th_split"), b.tip("th_split"));
    assert_eq!(a.refs()[&backup], a_tip.to_string(), "a's work is kept");
    assert_eq!(read(&resumed.path.join("NOTES.md")), "b's line\n");
    // Now a fast-forward of the remote's: A's next push goes through.
    fs::write(resumed.path.join("NOTES.md"), "b's line\nand a's again\n").unwrap();
    a.ws.commit(&thread, &[]).unwrap();
    a.ws.push(&thread).unwrap();
    assert_eq!(remote.tip("th_split"), Some(a.tip("th_split")));
}

#[test]
fn a_local_branch_ahead_of_the_remote_is_kept_with_its_worktree() {
    let remote = Remote::new();
    let a = Instance::cloning(&remote);
    let thread = tid("th_ahead");
    let wt = a.ws.prepare(&thread).unwrap();
    fs::write(wt.path.join("NOTES.md"), "pushed\n").unwrap();
    a.ws.commit(&thread, &[]).unwrap();
    a.ws.push(&thread).unwrap();
    fs::write(wt.path.join("NOTES.md"), "not pushed yet\n").unwrap();
    a.ws.commit(&thread, &[]).unwrap();
    let tip = a.tip("th_ahead");
    fs::write(wt.path.join("draft.txt"), "uncommitted\n").unwrap();

    let again = a.ws.prepare(&thread).unwrap();
    assert_eq!(again.remote, RemoteSync::LocalAhead);
    assert!(again.resumed);
    assert_eq!(a.tip("th_ahead"), tip);
    assert_eq!(read(&wt.path.join("draft.txt")), "uncommitted\n");
}

#[test]
fn an_unreachable_remote_fails_without_showing_its_credentials() {
    let fx = Fixture::new();
    let thread = tid("th_down");
    let url = "http://bot:fake_key_r3m0te@127.0.0.1:9/product.git";
    let down = Fixture::with(|cfg| cfg.remote = Some(url.into()));
    let err = down.ws.prepare(&thread).unwrap_err();
    assert!(matches!(err, WorkspaceError::Remote { .. }), "{err}");
    let text = format!("{err} {err:?}");
    assert!(!text.contains("fake_key_r3m0te"), "{text}");
    assert!(text.contains("127.0.0.1:9"), "the remote is named: {text}");
    assert!(
        !down.worktrees.join("th_down").exists(),
        "no worktree is prepared from a branch the remote may have moved on"
    );

    // A push to it fails the same way.
    down.repo()
        .reference(
            "refs/heads/threadgate/th_down",
            down.main_tip,
            false,
            "test",
        )
        .unwrap();
    let err = down.ws.push(&thread).unwrap_err();
    assert!(matches!(err, WorkspaceError::PushRejected { .. }), "{err}");
    let text = format!("{err} {err:?}");
    assert!(!text.contains("fake_key_r3m0te"), "{text}");

    // A remote path that does not exist: the same, by name, and no ref moves.
    let gone = fx.outside.join("no-such-remote.git").display().to_string();
    let missing = Fixture::with(|cfg| cfg.remote = Some(gone.clone()));
    missing
        .repo()
        .reference(
            "refs/heads/threadgate/th_down",
            missing.main_tip,
            false,
            "test",
        )
        .unwrap();
    let err = missing.ws.push(&thread).unwrap_err();
    assert!(matches!(err, WorkspaceError::PushRejected { .. }), "{err}");
    let before = missing.refs();
    let err = missing.ws.prepare(&thread).unwrap_err();
    assert!(matches!(err, WorkspaceError::Remote { .. }), "{err}");
    assert!(err.to_string().contains(&gone), "{err}");
    assert_eq!(missing.refs(), before, "a failed fetch moves no ref");
}

#[test]
fn a_stale_worktree_on_its_own_filesystem_is_unmounted_and_written_again() {
    use threadgate::workspace::volume;
    if !volume::can_limit() {
        eprintln!("skipped: mounting a workspace filesystem needs root");
        return;
    }
    let remote = Remote::new();
    let a = Instance::cloning(&remote);
    let thread = tid("th_mounted");
    let wt_a = a.ws.prepare(&thread).unwrap();
    assert!(volume::limit(&wt_a.path, 16 << 20).unwrap(), "mounted");
    fs::write(wt_a.path.join("NOTES.md"), "on a's filesystem\n").unwrap();
    a.ws.commit(&thread, &[]).unwrap();
    a.ws.push(&thread).unwrap();

    let b = Instance::cloning(&remote);
    let wt_b = b.ws.prepare(&thread).unwrap();
    fs::write(wt_b.path.join("NOTES.md"), "b went on\n").unwrap();
    b.ws.commit(&thread, &[]).unwrap();
    b.ws.push(&thread).unwrap();

    let back = a.ws.prepare(&thread).unwrap();
    assert_eq!(back.remote, RemoteSync::FastForwarded);
    assert_eq!(read(&back.path.join("NOTES.md")), "b went on\n");
    assert!(
        !volume::image_of(&back.path).exists(),
        "the old filesystem's image is gone (a later limit makes a fresh one)"
    );
    let mounts = fs::read_to_string("/proc/self/mounts").unwrap();
    assert!(
        !mounts.contains(&back.path.display().to_string()),
        "nothing is mounted at the worktree any more"
    );
}
