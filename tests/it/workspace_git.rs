//! Integration tests of `threadgate::workspace` against real repositories built with
//! git2 in temporary directories: branches, materialised worktrees, safe commits of an
//! agent-controlled directory, removal, pushing, and resuming from the remote.

#[path = "workspace_git/caps.rs"]
mod caps;
#[path = "workspace_git/hostile.rs"]
mod hostile;
#[path = "workspace_git/remote.rs"]
mod remote;
#[path = "workspace_git/support.rs"]
mod support;

use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;
use std::time::{Duration, Instant};

use git2::Repository;
use support::{Fixture, all_refs, commit_files, dir_listing, init_repo, tid, write_exec};
use threadgate::workspace::{RepoConfig, SkipReason, WorkspaceError, Workspaces};

#[test]
fn a_thread_branch_is_named_from_its_id() {
    assert_eq!(
        Workspaces::branch_name(&tid("th_01HABC")),
        "threadgate/th_01HABC"
    );
}

/// Ids that would escape `threadgate/` or the worktrees directory are no thread ids:
/// the workspace never sees them (the one validator is `ThreadId::parse`).
#[test]
fn ids_that_would_escape_are_no_thread_ids() {
    for bad in [
        "",
        "../x",
        "a/b",
        "x.lock",
        ".git",
        "-rf",
        "a b",
        "a..b",
        "../outside",
        "..",
        "a/../../b",
        "threadgate/x",
    ] {
        assert!(threadgate::ids::ThreadId::parse(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn prepare_creates_branch_and_materialises_tree() {
    let fx = Fixture::new();
    let before = fx.refs();
    let wt = fx.ws.prepare(&tid("th_1")).unwrap();
    assert_eq!(wt.branch, "threadgate/th_1");
    assert_eq!(wt.path, fx.worktrees.join("th_1"));
    assert_eq!(wt.head, fx.main_tip.to_string());
    assert!(!wt.resumed);

    let mut expected = before.clone();
    expected.insert("refs/heads/threadgate/th_1".into(), fx.main_tip.to_string());
    assert_eq!(fx.refs(), expected, "only the thread branch is new");

    assert_eq!(fs::read(wt.path.join("README.md")).unwrap(), b"hello\n");
    assert_eq!(
        fs::read(wt.path.join("docs/guide.md")).unwrap(),
        b"# guide\n"
    );
    let run = fs::metadata(wt.path.join("run.sh")).unwrap();
    assert_ne!(run.permissions().mode() & 0o100, 0, "run.sh is executable");
    let readme = fs::metadata(wt.path.join("README.md")).unwrap();
    assert_eq!(readme.permissions().mode() & 0o111, 0);
    assert_eq!(
        fs::read_link(wt.path.join("link")).unwrap(),
        Path::new("README.md")
    );

    // The agent's own .git: same tip commit, shallow, clean status, no host path.
    let inner = Repository::open(&wt.path).unwrap();
    assert_eq!(inner.head().unwrap().target().unwrap(), fx.main_tip);
    assert_eq!(
        inner.head().unwrap().name().unwrap(),
        "refs/heads/threadgate/th_1"
    );
    assert!(inner.is_shallow());
    let mut status_opts = git2::StatusOptions::new();
    status_opts
        .include_untracked(true)
        .recurse_untracked_dirs(true);
    let statuses = inner.statuses(Some(&mut status_opts)).unwrap();
    let dirty: Vec<_> = statuses
        .iter()
        .map(|s| (s.path().map(str::to_owned), s.status()))
        .collect();
    assert!(dirty.is_empty(), "fresh worktree is clean: {dirty:?}");
    let host_path = fx.repo_path.to_string_lossy().into_owned();
    for (path, described) in dir_listing(&wt.path) {
        assert!(
            !described.contains(&host_path),
            "{} names the host repo",
            path.display()
        );
    }
}

#[test]
fn prepare_is_idempotent_and_resume_keeps_uncommitted_files() {
    let fx = Fixture::new();
    let first = fx.ws.prepare(&tid("th_resume")).unwrap();
    fs::write(first.path.join("notes.txt"), "work in progress\n").unwrap();
    fs::write(first.path.join("README.md"), "edited\n").unwrap();
    let second = fx.ws.prepare(&tid("th_resume")).unwrap();
    assert!(second.resumed);
    assert_eq!((&second.path, &second.head), (&first.path, &first.head));
    assert_eq!(
        fs::read(second.path.join("notes.txt")).unwrap(),
        b"work in progress\n"
    );
    assert_eq!(
        fs::read(second.path.join("README.md")).unwrap(),
        b"edited\n"
    );

    // After a commit and removal, prepare rebuilds from the branch, not from main.
    let outcome = fx.ws.commit(&tid("th_resume"), &[]).unwrap();
    fx.ws.remove_worktree(&tid("th_resume")).unwrap();
    let third = fx.ws.prepare(&tid("th_resume")).unwrap();
    assert!(!third.resumed);
    assert_eq!(Some(third.head.clone()), outcome.commit);
    assert_eq!(
        fs::read(third.path.join("notes.txt")).unwrap(),
        b"work in progress\n"
    );
    assert_eq!(fs::read(third.path.join("README.md")).unwrap(), b"edited\n");
    let leftovers: Vec<_> = fs::read_dir(&fx.worktrees)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        leftovers,
        vec![std::ffi::OsString::from("th_resume")],
        "no temp dirs left"
    );
}

#[test]
fn commit_records_the_worktree_on_the_thread_branch_only() {
    let fx = Fixture::new();
    let wt = fx.ws.prepare(&tid("th_c")).unwrap();
    let before = fx.refs();
    let p = &wt.path;
    fs::write(p.join("README.md"), "changed\n").unwrap();
    write_exec(&p.join("tool.sh"), "#!/bin/sh\n");
    fs::remove_file(p.join("docs/guide.md")).unwrap();
    fs::create_dir_all(p.join("nested/.git/hooks")).unwrap();
    fs::write(p.join("nested/.git/config"), "[core]\n").unwrap();
    fs::write(p.join("nested/file.txt"), "nested\n").unwrap();
    fs::create_dir_all(p.join("empty/dir")).unwrap();
    symlink("../outside/data.txt", p.join("cfg")).unwrap();

    let outcome = fx.ws.commit(&tid("th_c"), &[]).unwrap();
    assert!(outcome.skipped.is_empty(), "{:?}", outcome.skipped);
    let tip = fx.tip("th_c");
    assert_eq!(outcome.commit, Some(tip.to_string()));

    let repo = fx.repo();
    let commit = repo.find_commit(tip).unwrap();
    assert_eq!(commit.parent_ids().collect::<Vec<_>>(), vec![fx.main_tip]);
    assert!(commit.author().name().unwrap().contains("th_c"));
    assert!(commit.committer().name().unwrap().contains("th_c"));
    assert!(commit.message().unwrap().contains("th_c"));

    let tree = fx.tree_of(tip);
    assert_eq!(tree["README.md"], (0o100644, b"changed\n".to_vec()));
    assert_eq!(tree["tool.sh"], (0o100755, b"#!/bin/sh\n".to_vec()));
    assert_eq!(tree["run.sh"].0, 0o100755);
    assert_eq!(tree["link"], (0o120000, b"README.md".to_vec()));
    assert_eq!(tree["cfg"], (0o120000, b"../outside/data.txt".to_vec()));
    assert_eq!(tree["nested/file.txt"], (0o100644, b"nested\n".to_vec()));
    assert!(!tree.contains_key("docs/guide.md"));
    assert!(
        tree.keys()
            .all(|k| !k.contains(".git/") && !k.starts_with("empty")),
        "{tree:?}"
    );

    let mut expected = before;
    expected.insert("refs/heads/threadgate/th_c".into(), tip.to_string());
    assert_eq!(fx.refs(), expected, "only the thread branch moved");

    // Nothing changed since: no new commit.
    let again = fx.ws.commit(&tid("th_c"), &[]).unwrap();
    assert_eq!(again.commit, None);
    assert_eq!(fx.tip("th_c"), tip);
}

#[test]
fn commit_without_changes_writes_nothing() {
    let fx = Fixture::new();
    fx.ws.prepare(&tid("th_idle")).unwrap();
    let before = fx.refs();
    let outcome = fx.ws.commit(&tid("th_idle"), &[]).unwrap();
    assert_eq!(outcome.commit, None);
    assert_eq!(fx.refs(), before);
}

#[test]
fn files_holding_secrets_are_left_out_and_named() {
    let fx = Fixture::new();
    let wt = fx.ws.prepare(&tid("th_s")).unwrap();
    let value: &[u8] = b"sk_live_51Habc123SECRET";
    let p = &wt.path;
    fs::write(p.join("leak.txt"), b"token=sk_live_51Habc123SECRET\n").unwrap();
    fs::write(p.join("README.md"), b"now with sk_live_51Habc123SECRET\n").unwrap();
    fs::write(p.join("clean.txt"), b"nothing to see\n").unwrap();
    symlink("sk_live_51Habc123SECRET", p.join("sneaky-link")).unwrap();
    fs::write(p.join("name-sk_live_51Habc123SECRET"), b"x").unwrap();
    fs::write(p.join("other.txt"), b"pw hunter2\n").unwrap();

    let secrets: &[(&str, &[u8])] = &[
        ("STRIPE_KEY", value),
        ("DB_PASSWORD", b"hunter2"),
        ("EMPTY", b""),
    ];
    let outcome = fx.ws.commit(&tid("th_s"), secrets).unwrap();
    let tree = fx.tree_of(fx.tip("th_s"));
    assert!(tree.contains_key("clean.txt"));
    for gone in ["leak.txt", "README.md", "sneaky-link", "other.txt"] {
        assert!(!tree.contains_key(gone), "{gone} must be left out");
    }
    assert!(tree.keys().all(|k| !k.contains("sk_live")));
    for (path, (_, content)) in &tree {
        assert!(
            !contains(content, value) && !contains(content, b"hunter2"),
            "{path} leaks"
        );
    }

    let reasons: Vec<(String, String)> = outcome
        .skipped
        .iter()
        .map(|s| (s.path.display().to_string(), s.reason.to_string()))
        .collect();
    let stripe = SkipReason::ContainsSecret {
        secret: "STRIPE_KEY".into(),
    };
    for path in ["leak.txt", "README.md", "sneaky-link"] {
        assert!(
            outcome
                .skipped
                .iter()
                .any(|s| s.path == Path::new(path) && s.reason == stripe),
            "{path}: {reasons:?}"
        );
    }
    assert!(reasons.contains(&("other.txt".into(), "contains secret DB_PASSWORD".into())));
    assert!(reasons.contains(&(
        "<name containing a secret>".into(),
        "name contains secret STRIPE_KEY".into()
    )));
    assert_eq!(outcome.skipped.len(), 5, "{reasons:?}");

    let shown = format!("{outcome:?} {reasons:?}");
    assert!(
        !shown.contains("sk_live") && !shown.contains("hunter2"),
        "{shown}"
    );
    let message = fx
        .repo()
        .find_commit(fx.tip("th_s"))
        .unwrap()
        .message()
        .unwrap()
        .to_owned();
    assert!(
        message.contains("STRIPE_KEY") && !message.contains("sk_live"),
        "{message}"
    );
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn commit_before_prepare_names_the_thread() {
    let fx = Fixture::new();
    let err = fx.ws.commit(&tid("th_none"), &[]).unwrap_err();
    assert!(matches!(err, WorkspaceError::BranchMissing { .. }));
    assert!(err.to_string().contains("threadgate/th_none"), "{err}");
}

#[test]
fn default_branch_is_chosen_and_protected() {
    let fx = Fixture::with(|cfg| cfg.default_branch = Some("release".into()));
    let release = fx.repo().refname_to_id("refs/heads/release").unwrap();
    assert_eq!(
        fx.ws.prepare(&tid("th_rel")).unwrap().head,
        release.to_string()
    );
    assert_eq!(fx.ws.default_ref(), "refs/heads/release");

    let tmp = tempfile::tempdir().unwrap();
    init_repo(&tmp.path().join("repo"));
    let open = |branch: Option<&str>, worktrees: &Path| {
        Workspaces::open(RepoConfig {
            repo_path: tmp.path().join("repo"),
            default_branch: branch.map(str::to_owned),
            worktrees_dir: worktrees.to_owned(),
            remote: None,
            commit_limits: Default::default(),
        })
    };
    let wts = tmp.path().join("wt");
    assert_eq!(open(None, &wts).unwrap().default_ref(), "refs/heads/main");
    for bad in ["threadgate/th_x", "threadgate", "missing", "a..b"] {
        let err = open(Some(bad), &wts).unwrap_err();
        assert!(
            matches!(err, WorkspaceError::DefaultBranch { .. }),
            "{bad}: {err}"
        );
    }
    assert!(matches!(
        open(None, tmp.path()),
        Err(WorkspaceError::WorktreesDir { .. })
    ));
    assert!(matches!(
        open(None, &tmp.path().join("repo/.git/wt")),
        Err(WorkspaceError::WorktreesDir { .. })
    ));
}

#[test]
fn submodule_entries_survive_a_commit() {
    let fx = Fixture::new();
    let repo = fx.repo();
    let main = repo.find_commit(fx.main_tip).unwrap();
    let gitlink = git2::Oid::from_str("1234567890123456789012345678901234567890").unwrap();
    let mut builder = repo.treebuilder(Some(&main.tree().unwrap())).unwrap();
    builder.insert("vendor", gitlink, 0o160000).unwrap();
    let tree = repo.find_tree(builder.write().unwrap()).unwrap();
    let sig = git2::Signature::now("t", "t@example.invalid").unwrap();
    let with_sub = repo
        .commit(Some("refs/heads/main"), &sig, &sig, "sub", &tree, &[&main])
        .unwrap();

    let wt = fx.ws.prepare(&tid("th_sub")).unwrap();
    assert!(wt.path.join("vendor").is_dir());
    fs::write(wt.path.join("README.md"), "sub\n").unwrap();
    fx.ws.commit(&tid("th_sub"), &[]).unwrap();
    let files = fx.tree_of(fx.tip("th_sub"));
    assert_eq!(
        files["vendor"],
        (0o160000, gitlink.to_string().into_bytes())
    );
    assert_eq!(
        repo.find_commit(fx.tip("th_sub"))
            .unwrap()
            .parent_id(0)
            .unwrap(),
        with_sub
    );
}

#[test]
fn push_sends_only_the_thread_branch() {
    let remote_dir = tempfile::tempdir().unwrap();
    let remote_path = remote_dir.path().join("remote.git");
    let remote = Repository::init_bare(&remote_path).unwrap();
    let url = remote_path.to_string_lossy().into_owned();
    let fx = Fixture::with(|cfg| cfg.remote = Some(url.clone()));

    let wt = fx.ws.prepare(&tid("th_push")).unwrap();
    fs::write(wt.path.join("README.md"), "pushed\n").unwrap();
    fx.ws.commit(&tid("th_push"), &[]).unwrap();
    fx.ws.push(&tid("th_push")).unwrap();
    let pushed = all_refs(&remote);
    let branch_refs: Vec<_> = pushed
        .keys()
        .filter(|k| k.starts_with("refs/"))
        .cloned()
        .collect();
    assert_eq!(
        branch_refs,
        vec!["refs/heads/threadgate/th_push".to_owned()]
    );
    assert_eq!(
        pushed["refs/heads/threadgate/th_push"],
        fx.tip("th_push").to_string()
    );

    // A remote configured by name works too, and fast-forwards.
    fx.repo().remote("backup", &url).unwrap();
    let named = Workspaces::open(RepoConfig {
        repo_path: fx.repo_path.clone(),
        default_branch: None,
        worktrees_dir: fx.worktrees.clone(),
        remote: Some("backup".into()),
        commit_limits: Default::default(),
    })
    .unwrap();
    fs::write(wt.path.join("README.md"), "pushed again\n").unwrap();
    named.commit(&tid("th_push"), &[]).unwrap();
    named.push(&tid("th_push")).unwrap();
    assert_eq!(
        all_refs(&remote)["refs/heads/threadgate/th_push"],
        fx.tip("th_push").to_string()
    );

    // A diverged remote branch is not overwritten.
    let stray = commit_files(&remote, None, &[("x", 0o100644, b"x".as_slice())], &[]);
    remote
        .reference("refs/heads/threadgate/th_push", stray, true, "test")
        .unwrap();
    let err = fx.ws.push(&tid("th_push")).unwrap_err();
    assert!(matches!(err, WorkspaceError::PushRejected { .. }), "{err}");
    assert_eq!(
        remote
            .refname_to_id("refs/heads/threadgate/th_push")
            .unwrap(),
        stray
    );

    // No remote configured: nothing to do.
    let local = Fixture::new();
    local.ws.prepare(&tid("th_local")).unwrap();
    local.ws.push(&tid("th_local")).unwrap();
}

#[test]
fn many_threads_commit_at_once() {
    let fx = Fixture::new();
    let before = fx.refs();
    std::thread::scope(|scope| {
        for i in 0..8 {
            let ws = fx.ws.clone();
            scope.spawn(move || {
                let thread = tid(&format!("th_par{i}"));
                let wt = ws.prepare(&thread).unwrap();
                fs::write(wt.path.join(format!("mine-{i}.txt")), format!("{i}\n")).unwrap();
                assert!(ws.commit(&thread, &[]).unwrap().commit.is_some());
                ws.remove_worktree(&thread).unwrap();
            });
        }
    });
    let after = fx.refs();
    assert_eq!(after["refs/heads/main"], before["refs/heads/main"]);
    assert_eq!(after.len(), before.len() + 8);
    for i in 0..8 {
        let tree = fx.tree_of(fx.tip(&format!("th_par{i}")));
        let mine: Vec<_> = tree
            .keys()
            .filter(|k| k.starts_with("mine-"))
            .cloned()
            .collect();
        assert_eq!(mine, vec![format!("mine-{i}.txt")]);
    }
}

/// Not a benchmark gate: prints the figures for the report (run with --nocapture).
#[test]
fn prepare_and_commit_time_for_a_small_repo() {
    let fx = Fixture::new();
    let rounds = 20;
    let (mut preparing, mut committing) = (Duration::ZERO, Duration::ZERO);
    for i in 0..rounds {
        let thread = tid(&format!("th_time{i}"));
        let start = Instant::now();
        let wt = fx.ws.prepare(&thread).unwrap();
        preparing += start.elapsed();
        fs::write(wt.path.join("answer.md"), "done\n").unwrap();
        let start = Instant::now();
        let outcome = fx.ws.commit(&thread, &[("K", b"secret-value")]).unwrap();
        committing += start.elapsed();
        assert!(outcome.commit.is_some());
    }
    eprintln!(
        "6-file repo, mean of {rounds}: prepare {:?}, commit {:?}",
        preparing / rounds,
        committing / rounds
    );
}

/// A granted value written in any form the gateway's scanner knows (base64 in both
/// alphabets and at any offset, hex in both cases, URL- and JSON-escaped) keeps its file
/// off the branch, as the raw value does.
#[test]
fn encoded_secrets_are_left_out_too() {
    use base64::Engine as _;
    use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
    let fx = Fixture::new();
    let wt = fx.ws.prepare(&tid("th_enc")).unwrap();
    let value = "sk_live_9x\"q\\z/+?~>>SECRET";
    let url: String = value
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    let json_escaped = serde_json::to_string(value).unwrap();
    let forms: Vec<(&str, String)> = vec![
        (
            "b64.txt",
            format!(
                "Authorization: Basic {}",
                STANDARD.encode(format!("user:{value}"))
            ),
        ),
        ("b64url.txt", URL_SAFE_NO_PAD.encode(format!("x{value}"))),
        ("hex.txt", format!("key = 0x{}", hex::encode(value))),
        ("HEX.txt", hex::encode_upper(value)),
        ("url.txt", format!("https://h.test/?k={url}")),
        ("json.json", format!("{{\"key\": {json_escaped}}}")),
    ];
    for (name, content) in &forms {
        assert!(
            !content.contains(value),
            "{name} must hold an encoding only"
        );
        fs::write(wt.path.join(name), content).unwrap();
    }
    fs::write(wt.path.join("clean.txt"), b"nothing here\n").unwrap();
    let outcome = fx
        .ws
        .commit(&tid("th_enc"), &[("STRIPE_KEY", value.as_bytes())])
        .unwrap();
    let tree = fx.tree_of(fx.tip("th_enc"));
    assert!(tree.contains_key("clean.txt"));
    for (name, content) in &forms {
        assert!(
            !tree.contains_key(*name),
            "{name} ({content}) reached the branch"
        );
        assert!(
            outcome.skipped.iter().any(|s| s.path == Path::new(name)
                && s.reason
                    == SkipReason::ContainsSecret {
                        secret: "STRIPE_KEY".into()
                    }),
            "{name}: {:?}",
            outcome.skipped
        );
    }
}

#[test]
fn changed_files_diff_the_branch_tip_against_the_default_branch() {
    use threadgate::workspace::{ChangedFiles, FileChange};
    let fx = Fixture::new();
    assert_eq!(
        fx.ws.changed_files(&tid("th_1"), 10).unwrap(),
        ChangedFiles::default(),
        "a missing branch changed nothing"
    );
    let wt = fx.ws.prepare(&tid("th_1")).unwrap();
    fs::write(wt.path.join("README.md"), "hello again\n").unwrap();
    fs::write(wt.path.join("NEW.md"), "new\n").unwrap();
    fs::remove_file(wt.path.join("docs/guide.md")).unwrap();
    fx.ws.commit(&tid("th_1"), &[]).unwrap();
    let changed = fx.ws.changed_files(&tid("th_1"), 10).unwrap();
    assert_eq!(changed.total, 3);
    assert_eq!(
        changed.files,
        vec![
            ("NEW.md".to_owned(), FileChange::Added),
            ("README.md".to_owned(), FileChange::Modified),
            ("docs/guide.md".to_owned(), FileChange::Deleted),
        ]
    );
    // Capped: the first paths listed, all of them counted.
    let capped = fx.ws.changed_files(&tid("th_1"), 1).unwrap();
    assert_eq!((capped.files.len(), capped.total), (1, 3));
}
