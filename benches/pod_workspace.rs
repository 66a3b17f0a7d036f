//! A workspace carried into a pod and back as git bundles, on a repository of 2,000
//! files (1 KiB to 8 KiB, 8.6 MiB in all, 20 directories): the gateway's hand-out, the
//! pod writing it, the pod packing its work (one file changed, one added) and the
//! gateway receiving it (quarantine, checks, then the worktree updated: side by side,
//! every file written again as each pull once did, and only what differs), and beside
//! the last, the commit of that worktree that follows it at a checkpoint (as on Docker).
//!
//! `cargo bench --bench pod_workspace` (`--profile dev` for a debug build's figures).

#![expect(
    clippy::expect_used,
    reason = "test code: an unwrap or expect that fails is a failed test, with its message"
)]

use std::path::Path;

use criterion::{Criterion, criterion_group, criterion_main};
use threadgate::ids::ThreadId;
use threadgate::workspace::{BundleLimits, CommitLimits, PodWorkspace, RepoConfig, Workspaces};

const FILES: usize = 2_000;
const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz";

fn repository(path: &Path) {
    let repo = git2::Repository::init(path).expect("init");
    let mut dirs: Vec<git2::TreeBuilder<'_>> = (0..20)
        .map(|_| repo.treebuilder(None).expect("builder"))
        .collect();
    for i in 0..FILES {
        let size = 1024 + (i * 37 % 7) * 1024;
        let content: Vec<u8> = (0..size)
            .map(|j| ALPHABET.get((i + j) % 26).copied().unwrap_or(b'a'))
            .collect();
        let blob = repo.blob(&content).expect("blob");
        dirs.get_mut(i % 20)
            .expect("dir")
            .insert(format!("file{i}.txt"), blob, 0o100644)
            .expect("insert");
    }
    let mut root = repo.treebuilder(None).expect("root");
    for (i, dir) in dirs.into_iter().enumerate() {
        root.insert(format!("dir{i}"), dir.write().expect("dir"), 0o040000)
            .expect("insert");
    }
    let tree = repo.find_tree(root.write().expect("root")).expect("tree");
    let sig = git2::Signature::now("b", "b@example.invalid").expect("sig");
    repo.commit(Some("refs/heads/main"), &sig, &sig, "init", &tree, &[])
        .expect("commit");
}

fn round_trip(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("dir");
    let repo = dir.path().join("repo");
    repository(&repo);
    let workspaces = Workspaces::open(RepoConfig {
        repo_path: repo,
        default_branch: Some("main".into()),
        worktrees_dir: dir.path().join("worktrees"),
        remote: None,
        commit_limits: CommitLimits::default(),
    })
    .expect("open");
    let thread = ThreadId::parse("th_bench").expect("thread");
    workspaces.prepare(&thread).expect("prepare");
    let limits = BundleLimits::default();
    let pod = PodWorkspace {
        work_dir: dir.path().join("pod/workspace"),
        git_dir: dir.path().join("pod/git"),
    };
    let handed = workspaces.hand_out(&thread).expect("hand out");
    println!("hand-out bundle: {} bytes", handed.len());
    // Written once here too, so the later functions run when this one is filtered out.
    pod.receive_base(&handed, &limits).expect("receive base");

    let mut group = c.benchmark_group("pod_workspace");
    group.sample_size(10);
    group.bench_function("hand_out", |b| {
        b.iter(|| workspaces.hand_out(&thread).expect("hand out"));
    });
    group.bench_function("pod_receive_base", |b| {
        b.iter(|| {
            let _ = std::fs::remove_dir_all(&pod.git_dir);
            pod.receive_base(&handed, &limits).expect("receive base")
        });
    });
    std::fs::write(pod.work_dir.join("dir3/file3.txt"), "changed\n").expect("write");
    std::fs::write(pod.work_dir.join("FINDINGS.md"), "rounding twice\n").expect("write");
    group.bench_function("pod_bundle_changes", |b| {
        b.iter(|| pod.bundle_changes(CommitLimits::default()).expect("bundle"));
    });
    let sent = pod.bundle_changes(CommitLimits::default()).expect("bundle");
    println!("pod bundle: {} bytes", sent.len());
    let worktree = dir.path().join("worktrees/th_bench");
    workspaces
        .receive(&thread, &sent, &limits)
        .expect("receive");
    // Side by side: every file written again (what each pull did before it compared
    // the worktree with the tree: the worktree emptied, then the tree written), and
    // only what differs (the worktree already shows the last pull).
    group.bench_function("gateway_receive_rewrite_all", |b| {
        b.iter(|| {
            empty(&worktree);
            workspaces
                .receive(&thread, &sent, &limits)
                .expect("receive")
        });
    });
    group.bench_function("gateway_receive", |b| {
        b.iter(|| {
            workspaces
                .receive(&thread, &sent, &limits)
                .expect("receive")
        });
    });
    group.bench_function("gateway_commit_after_receive", |b| {
        b.iter(|| workspaces.commit(&thread, &[]).expect("commit"));
    });
    group.finish();
}

/// Removes everything inside `dir`, keeping `dir`.
fn empty(dir: &Path) {
    for entry in std::fs::read_dir(dir).expect("read") {
        let path = entry.expect("entry").path();
        if std::fs::symlink_metadata(&path).expect("meta").is_dir() {
            std::fs::remove_dir_all(&path).expect("remove");
        } else {
            std::fs::remove_file(&path).expect("remove");
        }
    }
}

criterion_group!(benches, round_trip);
criterion_main!(benches);
