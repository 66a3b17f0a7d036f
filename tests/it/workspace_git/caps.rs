//! What one commit may add to threadgate's repository: new files and bytes are capped
//! (`[repo] max_commit_files`, `max_commit_bytes`), the rest is left out with one line
//! that names the cap, and the commit's objects are stored as one pack, not as loose
//! objects.

use std::fs;
use std::path::Path;

use super::support::{Fixture, tid};
use threadgate::workspace::{CommitLimits, SkipReason};

fn capped(max_files: usize, max_bytes: u64) -> Fixture {
    Fixture::with(|cfg| {
        cfg.commit_limits = CommitLimits {
            max_files,
            max_bytes,
        }
    })
}

/// Loose objects under the repository's `objects/` (two-hex-digit directories).
fn loose_objects(git_dir: &Path) -> usize {
    fs::read_dir(git_dir.join("objects"))
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().len() == 2)
        .map(|e| fs::read_dir(e.path()).unwrap().count())
        .sum()
}

#[test]
fn a_flood_of_new_files_stops_at_the_file_cap_and_the_message_says_so_once() {
    let fx = capped(50, u64::MAX);
    let wt = fx.ws.prepare(&tid("th_flood")).unwrap();
    fs::create_dir_all(wt.path.join("flood")).unwrap();
    for i in 0..2_000 {
        fs::write(
            wt.path.join(format!("flood/f{i:05}.txt")),
            format!("file {i}\n"),
        )
        .unwrap();
    }
    let outcome = fx.ws.commit(&tid("th_flood"), &[]).unwrap();

    let tree = fx.tree_of(fx.tip("th_flood"));
    let kept = tree.keys().filter(|k| k.starts_with("flood/")).count();
    assert_eq!(kept, 50, "only the cap's worth of new files is committed");
    let capped: Vec<_> = outcome
        .skipped
        .iter()
        .filter(|s| matches!(s.reason, SkipReason::OverCommitCap { .. }))
        .collect();
    assert_eq!(capped.len(), 1, "one entry sums up the files over the cap");
    assert_eq!(
        capped[0].reason,
        SkipReason::OverCommitCap {
            cap: "[repo] max_commit_files (50)".into(),
            more: 1_949,
        }
    );
    let message = fx
        .repo()
        .find_commit(fx.tip("th_flood"))
        .unwrap()
        .message()
        .unwrap()
        .to_owned();
    assert!(
        message.contains("[repo] max_commit_files (50)") && message.contains("1949 more"),
        "{message}"
    );
    assert!(message.lines().count() < 20, "{message}");
}

#[test]
fn the_byte_cap_counts_only_new_content_and_keeps_the_branch_version() {
    let fx = capped(1_000, 1_000);
    let wt = fx.ws.prepare(&tid("th_bytes")).unwrap();
    // The README is on the branch already: its unchanged bytes cost nothing.
    let readme_before = fx.tree_of(fx.tip("th_bytes"))["README.md"].clone();
    for name in ["a", "b", "c"] {
        fs::write(wt.path.join(name), name.repeat(400)).unwrap();
    }
    let outcome = fx.ws.commit(&tid("th_bytes"), &[]).unwrap();
    let tree = fx.tree_of(fx.tip("th_bytes"));
    let new: Vec<_> = ["a", "b", "c"]
        .into_iter()
        .filter(|n| tree.contains_key(*n))
        .collect();
    assert_eq!(
        new.len(),
        2,
        "800 of 1000 bytes fit, the third file does not"
    );
    assert_eq!(tree["README.md"], readme_before);
    assert!(
        outcome.skipped.iter().any(|s| s.reason
            == SkipReason::OverCommitCap {
                cap: "[repo] max_commit_bytes (1000)".into(),
                more: 0,
            }),
        "{:?}",
        outcome.skipped
    );

    // A file the branch holds, grown past the cap, keeps its branch version.
    fs::write(wt.path.join("README.md"), "x".repeat(5_000)).unwrap();
    fx.ws.commit(&tid("th_bytes"), &[]).unwrap();
    assert_eq!(fx.tree_of(fx.tip("th_bytes"))["README.md"], readme_before);
}

#[test]
fn a_commit_writes_one_pack_and_no_loose_objects() {
    let fx = Fixture::new();
    let git_dir = fx.repo().path().to_owned();
    let loose_before = loose_objects(&git_dir);
    let wt = fx.ws.prepare(&tid("th_pack")).unwrap();
    fs::create_dir_all(wt.path.join("notes/deep")).unwrap();
    for i in 0..300 {
        fs::write(
            wt.path.join(format!("notes/deep/n{i}.md")),
            format!("note {i}\n"),
        )
        .unwrap();
    }
    let outcome = fx.ws.commit(&tid("th_pack"), &[]).unwrap();
    assert!(outcome.commit.is_some());
    assert_eq!(
        loose_objects(&git_dir),
        loose_before,
        "the commit's blobs, trees and commit object are in a pack"
    );
    let packs = fs::read_dir(git_dir.join("objects/pack"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "pack")
        })
        .count();
    assert!(packs >= 1);
    // Everything is readable from the pack: the tree has every file.
    let tree = fx.tree_of(fx.tip("th_pack"));
    assert_eq!(
        tree.keys().filter(|k| k.starts_with("notes/deep/")).count(),
        300
    );
    assert_eq!(tree["notes/deep/n7.md"].1, b"note 7\n".to_vec());

    // A large blob is not worth packing: it is stored loose, alone.
    let big: Vec<u8> = (0..threadgate::workspace::LOOSE_BLOB_BYTES + 10)
        .map(|i| u8::try_from(i % 251).unwrap())
        .collect();
    fs::write(wt.path.join("big.bin"), &big).unwrap();
    fx.ws.commit(&tid("th_pack"), &[]).unwrap();
    assert_eq!(loose_objects(&git_dir), loose_before + 1);
    assert_eq!(fx.tree_of(fx.tip("th_pack"))["big.bin"].1, big);
}
