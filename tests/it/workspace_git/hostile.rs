//! The agent controls every byte of its worktree: tests that nothing it plants there
//! (a rewritten `.git`, symlinks out, fifos, sockets, reserved names) makes threadgate
//! read, write or delete anything outside its worktree and its thread's branch.

use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;

use super::support::{Fixture, dir_listing, tid, write_exec};
use threadgate::workspace::{MAX_FILE_BYTES, SkipReason, WorkspaceError};

#[test]
fn special_files_and_reserved_names_are_skipped() {
    let fx = Fixture::new();
    let wt = fx.ws.prepare(&tid("th_special")).unwrap();
    let p = &wt.path;
    let _socket = std::os::unix::net::UnixListener::bind(p.join("agent.sock")).unwrap();
    let dir = fs::File::open(p).unwrap();
    rustix::fs::mkfifoat(&dir, "pipe", rustix::fs::Mode::from_raw_mode(0o644)).unwrap();
    fs::create_dir(p.join(".GIT")).unwrap();
    fs::write(p.join(".GIT/config"), "x").unwrap();
    symlink("/etc/passwd", p.join(".gitmodules")).unwrap();
    fs::write(p.join("kept.txt"), "kept\n").unwrap();

    let outcome = fx.ws.commit(&tid("th_special"), &[]).unwrap();
    let reason_of = |name: &str| {
        outcome
            .skipped
            .iter()
            .find(|s| s.path == Path::new(name))
            .map(|s| s.reason.clone())
    };
    assert_eq!(
        reason_of("agent.sock"),
        Some(SkipReason::Unsupported { kind: "socket" })
    );
    assert_eq!(
        reason_of("pipe"),
        Some(SkipReason::Unsupported { kind: "fifo" })
    );
    assert_eq!(reason_of(".GIT"), Some(SkipReason::ReservedName));
    assert_eq!(reason_of(".gitmodules"), Some(SkipReason::SymlinkedGitFile));
    let tree = fx.tree_of(fx.tip("th_special"));
    assert!(tree.contains_key("kept.txt"));
    assert!(
        tree.keys().all(|k| !k.to_lowercase().starts_with(".git")),
        "{tree:?}"
    );
}

/// The ways an agent can rewrite `.git` in its worktree to try to redirect threadgate.
fn plant_hostile_git(variant: usize, wt: &Path, fx: &Fixture) {
    let main_git = fx.repo_path.join(".git");
    let dot_git = wt.join(".git");
    fs::remove_dir_all(&dot_git).unwrap();
    let marker = fx.outside.join("hook-ran");
    match variant {
        // A gitfile pointing at threadgate's own git dir.
        0 => fs::write(&dot_git, format!("gitdir: {}\n", main_git.display())).unwrap(),
        // A git dir with hooks and a config that points everything elsewhere.
        1 => {
            fs::create_dir_all(dot_git.join("hooks")).unwrap();
            for hook in [
                "pre-commit",
                "post-commit",
                "reference-transaction",
                "post-checkout",
            ] {
                write_exec(
                    &dot_git.join("hooks").join(hook),
                    &format!("#!/bin/sh\ntouch {}\n", marker.display()),
                );
                write_exec(
                    &fx.outside.join("hooks").join(hook),
                    &format!("#!/bin/sh\ntouch {}\n", marker.display()),
                );
            }
            let config = format!(
                "[core]\n\tworktree = {o}\n\thooksPath = {o}/hooks\n\tbare = false\n\
                 [include]\n\tpath = {o}/evil.cfg\n[filter \"evil\"]\n\tclean = touch {m}\n\tsmudge = touch {m}\n",
                o = fx.outside.display(),
                m = marker.display()
            );
            fs::write(dot_git.join("config"), config).unwrap();
            fs::write(dot_git.join("HEAD"), "ref: refs/heads/main\n").unwrap();
            fs::write(wt.join(".gitattributes"), "* filter=evil\n").unwrap();
        }
        // A git dir whose HEAD is main and whose objects and refs are threadgate's.
        2 => {
            fs::create_dir_all(dot_git.join("refs/heads")).unwrap();
            fs::write(dot_git.join("HEAD"), "ref: refs/heads/main\n").unwrap();
            fs::write(
                dot_git.join("refs/heads/main"),
                format!("{}\n", fx.main_tip),
            )
            .unwrap();
            symlink(main_git.join("objects"), dot_git.join("objects")).unwrap();
            symlink(
                main_git.join("refs/heads"),
                dot_git.join("refs/heads/threadgate"),
            )
            .unwrap();
        }
        // .git itself a symlink to threadgate's git dir.
        _ => symlink(&main_git, &dot_git).unwrap(),
    }
    symlink("/etc/passwd", wt.join("passwd")).unwrap();
    symlink(&fx.outside, wt.join("escape")).unwrap();
}

#[test]
fn a_hostile_worktree_cannot_make_threadgate_write_elsewhere() {
    let fx = Fixture::new();
    let main_config = fs::read(fx.repo_path.join(".git/config")).unwrap();
    for variant in 0..4 {
        let thread = tid(&format!("th_hostile{variant}"));
        let wt = fx.ws.prepare(&thread).unwrap();
        plant_hostile_git(variant, &wt.path, &fx);
        fs::write(wt.path.join("README.md"), format!("variant {variant}\n")).unwrap();
        let refs_before = fx.refs();
        let outside_before = dir_listing(&fx.outside);

        let outcome = fx.ws.commit(&thread, &[]).unwrap();
        let tip = fx.tip(&thread);
        assert_eq!(outcome.commit, Some(tip.to_string()));
        assert!(
            outcome.skipped.is_empty(),
            "variant {variant}: {:?}",
            outcome.skipped
        );

        let mut expected = refs_before;
        expected.insert(format!("refs/heads/threadgate/{thread}"), tip.to_string());
        assert_eq!(
            fx.refs(),
            expected,
            "variant {variant}: only the thread branch moved"
        );
        assert_eq!(
            fx.repo().refname_to_id("refs/heads/main").unwrap(),
            fx.main_tip
        );
        assert_eq!(
            dir_listing(&fx.outside),
            outside_before,
            "variant {variant}: outside untouched"
        );
        assert!(
            !fx.outside.join("hook-ran").exists(),
            "variant {variant}: a hook or filter ran"
        );
        assert_eq!(
            fs::read(fx.repo_path.join(".git/config")).unwrap(),
            main_config
        );

        let tree = fx.tree_of(tip);
        assert_eq!(
            tree["README.md"].1,
            format!("variant {variant}\n").into_bytes()
        );
        assert_eq!(tree["passwd"], (0o120000, b"/etc/passwd".to_vec()));
        assert_eq!(
            tree["escape"],
            (0o120000, fx.outside.to_string_lossy().as_bytes().to_vec())
        );
        assert!(
            tree.keys()
                .all(|k| !k.starts_with("escape/") && k != ".git" && !k.starts_with(".git/")),
            "{tree:?}"
        );
        let repo = fx.repo();
        let commit = repo.find_commit(tip).unwrap();
        assert_eq!(commit.parent_ids().collect::<Vec<_>>(), vec![fx.main_tip]);
    }
}

#[test]
fn remove_worktree_deletes_only_the_directory_and_keeps_the_branch() {
    let fx = Fixture::new();
    let wt = fx.ws.prepare(&tid("th_rm")).unwrap();
    symlink(&fx.outside, wt.path.join("escape")).unwrap();
    symlink(fx.outside.join("data.txt"), wt.path.join("data-link")).unwrap();
    fs::create_dir_all(wt.path.join("locked/inner")).unwrap();
    fs::write(wt.path.join("locked/inner/f"), "x").unwrap();
    fs::set_permissions(wt.path.join("locked"), fs::Permissions::from_mode(0o500)).unwrap();
    fs::set_permissions(
        wt.path.join("locked/inner"),
        fs::Permissions::from_mode(0o000),
    )
    .unwrap();
    let outside_before = dir_listing(&fx.outside);
    let refs_before = fx.refs();

    fx.ws.remove_worktree(&tid("th_rm")).unwrap();
    assert!(!wt.path.exists());
    assert_eq!(
        dir_listing(&fx.outside),
        outside_before,
        "symlink targets survive"
    );
    assert_eq!(
        fs::read(fx.outside.join("data.txt")).unwrap(),
        b"outside data\n"
    );
    assert_eq!(fx.refs(), refs_before, "branch kept");
    fx.ws.remove_worktree(&tid("th_rm")).unwrap();
}

#[test]
fn remove_worktree_refuses_a_worktree_that_is_a_symlink() {
    let fx = Fixture::new();
    symlink(&fx.outside, fx.worktrees.join("th_link")).unwrap();
    let err = fx.ws.remove_worktree(&tid("th_link")).unwrap_err();
    assert!(matches!(err, WorkspaceError::NotADirectory { .. }), "{err}");
    assert!(err.to_string().contains("th_link"));
    assert!(fx.outside.join("data.txt").exists());
    assert!(matches!(
        fx.ws.prepare(&tid("th_link")),
        Err(WorkspaceError::NotADirectory { .. })
    ));
    assert!(matches!(
        fx.ws.commit(&tid("th_link"), &[]),
        Err(WorkspaceError::NotADirectory { .. })
    ));
}

#[test]
fn oversized_files_are_left_out_without_deleting_the_branch_version() {
    let fx = Fixture::new();
    let wt = fx.ws.prepare(&tid("th_big")).unwrap();
    let huge = MAX_FILE_BYTES + 1;
    // Sparse files: the size check happens before any byte is read.
    fs::OpenOptions::new()
        .write(true)
        .open(wt.path.join("README.md"))
        .unwrap()
        .set_len(huge)
        .unwrap();
    fs::File::create(wt.path.join("new.bin"))
        .unwrap()
        .set_len(huge)
        .unwrap();
    fs::write(wt.path.join("small.txt"), "small\n").unwrap();

    let outcome = fx.ws.commit(&tid("th_big"), &[]).unwrap();
    let too_large = SkipReason::TooLarge {
        limit: MAX_FILE_BYTES,
    };
    let skipped: Vec<_> = outcome
        .skipped
        .iter()
        .map(|s| (s.path.clone(), s.reason.clone()))
        .collect();
    assert_eq!(skipped.len(), 2, "{skipped:?}");
    for name in ["README.md", "new.bin"] {
        assert!(
            skipped.contains(&(name.into(), too_large.clone())),
            "{name}: {skipped:?}"
        );
    }
    let tree = fx.tree_of(fx.tip("th_big"));
    assert_eq!(
        tree["README.md"],
        (0o100644, b"hello\n".to_vec()),
        "branch version kept"
    );
    assert!(!tree.contains_key("new.bin"));
    assert!(tree.contains_key("small.txt"));
}
