//! `threadgate reviewers add --password-stdin` and `reviewers passwd`: the password
//! reaches the database as an argon2id hash that signs the reviewer in; a short one or an
//! unknown name is a clear error.

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use threadgate::approvals::hasher::Hasher;
use threadgate::approvals::reviewers;
use threadgate::secrets::SecretString;
use threadgate::store::Db;

fn threadgate(dir: &Path, args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_threadgate"))
        .args(args)
        .current_dir(dir)
        .env("THREADGATE_DATA_DIR", dir.join("data"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run threadgate");
    if let Some(mut input) = child.stdin.take() {
        input.write_all(stdin.as_bytes()).expect("stdin");
    }
    child.wait_with_output().expect("output")
}

#[tokio::test]
async fn reviewers_passwords_are_set_from_stdin() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pw = "correct horse battery staple";
    let out = threadgate(
        dir.path(),
        &["reviewers", "add", "alice", "--password-stdin"],
        &format!("{pw}\n"),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("tgr_") && !stdout.contains(pw), "{stdout}");

    let out = threadgate(dir.path(), &["reviewers", "passwd", "alice"], "short\n");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("12 to 1024 characters"), "{stderr}");
    let out = threadgate(
        dir.path(),
        &["reviewers", "passwd", "nobody"],
        &format!("{pw}\n"),
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("no reviewer named nobody"));

    let db = Db::open(&dir.path().join("data/threadgate.db")).expect("db");
    let hasher = Hasher::new(1, 1);
    let who = reviewers::verify_password(&db, &hasher, "alice", SecretString::from(pw))
        .await
        .expect("verify");
    assert_eq!(who.map(|r| r.name), Some("alice".to_owned()));

    let new_pw = "another long passphrase";
    let out = threadgate(
        dir.path(),
        &["reviewers", "passwd", "alice"],
        &format!("{new_pw}\r\n"),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let old = reviewers::verify_password(&db, &hasher, "alice", SecretString::from(pw))
        .await
        .expect("verify");
    assert_eq!(old, None, "the old password no longer works");
    let new = reviewers::verify_password(&db, &hasher, "alice", SecretString::from(new_pw))
        .await
        .expect("verify");
    assert!(new.is_some());
}
