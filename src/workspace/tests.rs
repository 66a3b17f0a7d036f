//! Unit tests for the name rules and the compare-and-swap branch update.

use super::names::{NameProblem, check_entry_name, is_git_control_file, redact_remote};

#[test]
fn reserved_git_names_are_recognised() {
    for name in [
        ".git",
        ".GIT",
        ".Git",
        ".git.",
        ".git ",
        "git~1",
        "GIT~1",
        ".g\u{200c}it",
    ] {
        assert_eq!(
            check_entry_name(name.as_bytes()),
            Err(NameProblem::ReservedGitName),
            "{name:?}"
        );
    }
    for name in ["", ".", "..", "a/b", "a\0"] {
        assert_eq!(
            check_entry_name(name.as_bytes()),
            Err(NameProblem::NotAComponent),
            "{name:?}"
        );
    }
    for name in [".gitx", "git", "x.git", ".github", "..git", "gitmodules"] {
        assert_eq!(check_entry_name(name.as_bytes()), Ok(()), "{name:?}");
    }
    assert!(is_git_control_file(b".gitmodules"));
    assert!(is_git_control_file(b".GITATTRIBUTES"));
    assert!(!is_git_control_file(b".github"));
}

#[test]
fn branch_update_is_a_compare_and_swap() {
    use git2::{Repository, Signature};
    let dir = tempfile::tempdir().unwrap();
    let repo = Repository::init(dir.path()).unwrap();
    let sig = Signature::now("t", "t@example.invalid").unwrap();
    let tree_id = repo.treebuilder(None).unwrap().write().unwrap();
    let tree = repo.find_tree(tree_id).unwrap();
    let name = "refs/heads/threadgate/th";
    let a = repo
        .commit(Some(name), &sig, &sig, "a", &tree, &[])
        .unwrap();
    let parent = repo.find_commit(a).unwrap();
    let b = repo
        .commit(None, &sig, &sig, "b", &tree, &[&parent])
        .unwrap();
    let c = repo
        .commit(None, &sig, &sig, "c", &tree, &[&parent])
        .unwrap();

    let err = super::refs::move_branch(
        &repo,
        &crate::ids::ThreadId::parse("th").unwrap(),
        name,
        b,
        c,
    )
    .unwrap_err();
    assert!(
        matches!(err, super::WorkspaceError::BranchMoved { .. }),
        "{err}"
    );
    assert_eq!(
        repo.refname_to_id(name).unwrap(),
        a,
        "a stale expectation moves nothing"
    );
    super::refs::move_branch(
        &repo,
        &crate::ids::ThreadId::parse("th").unwrap(),
        name,
        a,
        c,
    )
    .unwrap();
    assert_eq!(repo.refname_to_id(name).unwrap(), c);
}

#[test]
fn unlocking_permissions_never_follows_symlinks() {
    use std::fs;
    use std::os::unix::fs::{PermissionsExt, symlink};
    let dir = tempfile::tempdir().unwrap();
    let outside = dir.path().join("outside");
    let worktree = dir.path().join("wt");
    fs::create_dir_all(outside.join("sub")).unwrap();
    fs::create_dir_all(worktree.join("locked/inner")).unwrap();
    symlink(&outside, worktree.join("escape")).unwrap();
    symlink(&outside, worktree.join("locked/escape")).unwrap();
    let set = |path: &std::path::Path, mode| {
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap()
    };
    set(&outside.join("sub"), 0o751);
    set(&outside, 0o751);
    set(&worktree.join("locked/inner"), 0o000);
    set(&worktree.join("locked"), 0o000);

    super::remove::make_owner_writable(&worktree);
    let mode =
        |path: &std::path::Path| fs::symlink_metadata(path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&worktree.join("locked")), 0o700);
    assert_eq!(mode(&worktree.join("locked/inner")), 0o700);
    assert_eq!(mode(&outside), 0o751, "a symlink's target keeps its mode");
    assert_eq!(mode(&outside.join("sub")), 0o751);
}

#[test]
fn remote_credentials_are_redacted() {
    assert_eq!(
        redact_remote("https://bot:tok3n@example.invalid/r.git"),
        "https://***@example.invalid/r.git"
    );
    assert_eq!(
        redact_remote("ssh://git@example.invalid/r@x.git"),
        "ssh://***@example.invalid/r@x.git"
    );
    assert_eq!(redact_remote("/srv/remote.git"), "/srv/remote.git");
    assert_eq!(redact_remote("origin"), "origin");
}

#[test]
fn remote_messages_lose_the_url_s_credentials() {
    use super::remote::scrub;
    let url = "https://bot:fake_key_pw@example.invalid/r.git";
    assert_eq!(
        scrub(&format!("failed to reach {url}: refused"), &[url]),
        "failed to reach https://***@example.invalid/r.git: refused"
    );
    // Quoted apart from the URL, or percent-decoded by a transport: still replaced.
    assert_eq!(
        scrub("auth bot:fake_key_pw refused; fake_key_pw expired", &[url]),
        "auth *** refused; *** expired"
    );
    // A token in the user's place is a credential too; a plain user name is not.
    let token = "https://fake_key_token123@example.invalid/r.git";
    assert_eq!(scrub("bad fake_key_token123", &[token]), "bad ***");
    let ssh = "ssh://git@example.invalid/r.git";
    assert_eq!(scrub("git said no", &[ssh]), "git said no");
    assert_eq!(scrub("nothing here", &["", "/srv/r.git"]), "nothing here");
}
