//! Unit tests for the sandbox module: naming, secret validation, the host-side secrets
//! directory, and the fake runtime. The Docker runtime itself is tested for real in
//! `tests/it/sandbox_docker.rs`.

use crate::secrets::{ExposeSecret as _, secret_bytes};
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use super::docker::validate_secrets;
use super::host::{self, Owner, WriteSecrets};
use super::*;

fn spec(session: &str) -> SandboxSpec {
    SandboxSpec {
        session_id: crate::ids::SessionId::parse(session).expect("session id"),
        thread_id: crate::ids::ThreadId::parse(format!("th_{session}")).expect("thread id"),
        image: "threadgate-sandbox:latest".to_string(),
        workspace_dir: PathBuf::from("/nonexistent/workspace"),
        socket_dir: PathBuf::from("/nonexistent/socket"),
        secrets: vec![("API_TOKEN".to_string(), secret_bytes("s3cr3t-value"))],
        limits: Limits::default(),
        command: None,
        env: vec![("MODE".to_string(), "test".to_string())],
    }
}

fn mode(path: &Path) -> u32 {
    fs::symlink_metadata(path).unwrap().permissions().mode() & 0o7777
}

#[test]
fn sanitise_keeps_safe_characters_and_replaces_the_rest() {
    assert_eq!(sanitise_id("th_01HX-abc"), "th_01HX-abc");
    assert_eq!(sanitise_id("../etc/passwd"), "---etc-passwd");
    assert_eq!(sanitise_id("a b.c/d"), "a-b-c-d");
    assert_eq!(sanitise_id("é"), "-");
}

#[test]
fn container_name_joins_sanitised_instance_and_session() {
    assert_eq!(container_name("prod", "s/1"), "threadgate-prod-s-1");
}

#[test]
fn secret_bytes_debug_is_redacted_everywhere() {
    let spec = spec("s1");
    let printed = format!("{spec:?}");
    assert!(!printed.contains("s3cr3t-value"), "{printed}");
    assert!(printed.contains("[REDACTED]"), "{printed}");
    assert_eq!(spec.secrets[0].1.expose_secret(), b"s3cr3t-value");
}

#[test]
fn secret_names_are_plain_file_names() {
    for good in ["TOKEN", "github.token", "a-b_c.9"] {
        assert!(host::valid_secret_name(good), "{good}");
    }
    let too_long = "x".repeat(129);
    for bad in ["", ".", "..", ".hidden", "a/b", "a b", too_long.as_str()] {
        assert!(!host::valid_secret_name(bad), "{bad}");
    }
}

#[test]
fn validate_secrets_refuses_values_in_env_or_command_and_bad_names() {
    assert_eq!(validate_secrets(&spec("s")), Ok(()));

    let mut in_env = spec("s");
    in_env
        .env
        .push(("TOKEN".into(), "prefix-s3cr3t-value".into()));
    let err = validate_secrets(&in_env).unwrap_err();
    assert!(
        err.contains("API_TOKEN") && !err.contains("s3cr3t-value"),
        "{err}"
    );

    let mut in_command = spec("s");
    in_command.command = Some(vec!["echo".into(), "s3cr3t-value".into()]);
    assert!(validate_secrets(&in_command).is_err());

    let mut bad_name = spec("s");
    bad_name.secrets[0].0 = "../escape".into();
    assert!(validate_secrets(&bad_name).is_err());

    let mut twice = spec("s");
    twice
        .secrets
        .push(("API_TOKEN".into(), secret_bytes("other")));
    assert!(validate_secrets(&twice).is_err());
}

#[test]
fn require_tmpfs_accepts_dev_shm_and_refuses_a_disk() {
    if Path::new("/dev/shm").is_dir() {
        host::require_tmpfs(Path::new("/dev/shm/threadgate/not/yet/there")).unwrap();
    }
    let disk = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
    let err = host::require_tmpfs(disk.path()).unwrap_err();
    assert!(
        matches!(err, SandboxError::SecretsRootNotTmpfs { .. }),
        "{err}"
    );
}

#[test]
fn write_secrets_creates_private_files_and_cleans_up() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("inst").join("sess");
    let secrets = vec![
        ("ONE".to_string(), secret_bytes("first")),
        ("two.txt".to_string(), secret_bytes(vec![0u8, 1, 2])),
    ];
    let written = host::write_secrets(&dir, &secrets, None).unwrap();
    assert!(matches!(written, WriteSecrets::Written));
    assert_eq!(mode(&dir), 0o500);
    assert_eq!(mode(&root.path().join("inst")), 0o700);
    assert_eq!(fs::read(dir.join("ONE")).unwrap(), b"first");
    assert_eq!(fs::read(dir.join("two.txt")).unwrap(), [0u8, 1, 2]);
    assert_eq!(mode(&dir.join("ONE")), 0o400);

    // An existing directory is reported and left exactly as it was.
    let again = vec![("OTHER".to_string(), secret_bytes("x"))];
    let second = host::write_secrets(&dir, &again, None).unwrap();
    assert!(matches!(second, WriteSecrets::AlreadyExists));
    assert!(!dir.join("OTHER").exists());
    assert_eq!(fs::read(dir.join("ONE")).unwrap(), b"first");

    host::remove_secrets(&dir).unwrap();
    assert!(!dir.exists());
    host::remove_secrets(&dir).unwrap();
}

#[test]
fn write_secrets_hands_files_to_the_owner_when_root() {
    let me = host::process_owner();
    if me.uid != 0 {
        return; // chown to another uid needs root; covered by the docker tests there.
    }
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("sess");
    let agent = Owner {
        uid: 10001,
        gid: 10001,
    };
    let secrets = vec![("K".to_string(), secret_bytes("v"))];
    host::write_secrets(&dir, &secrets, Some(agent)).unwrap();
    for path in [dir.clone(), dir.join("K")] {
        let meta = fs::metadata(&path).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (10001, 10001), "{path:?}");
    }
    host::remove_secrets(&dir).unwrap();
}

#[test]
fn write_secrets_removes_its_directory_when_a_file_fails() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("sess");
    // A name given twice fails on the second create_new.
    let secrets = vec![
        ("K".to_string(), secret_bytes("a")),
        ("K".to_string(), secret_bytes("b")),
    ];
    let err = host::write_secrets(&dir, &secrets, None).unwrap_err();
    assert!(
        matches!(
            err,
            SandboxError::Io {
                action: "create secret file",
                ..
            }
        ),
        "{err}"
    );
    assert!(!dir.exists(), "half-made secrets dir left behind");
}

#[test]
fn chown_tree_does_not_follow_symlinks() {
    let me = host::process_owner();
    if me.uid != 0 {
        return; // Only root can give files away.
    }
    let outside = tempfile::NamedTempFile::new().unwrap();
    let tree = tempfile::tempdir().unwrap();
    fs::create_dir(tree.path().join("sub")).unwrap();
    fs::write(tree.path().join("sub/file"), "x").unwrap();
    symlink(outside.path(), tree.path().join("link")).unwrap();

    let agent = Owner {
        uid: 10001,
        gid: 10001,
    };
    host::chown_tree(tree.path(), agent).unwrap();

    for path in ["", "sub", "sub/file", "link"] {
        let meta = fs::symlink_metadata(tree.path().join(path)).unwrap();
        assert_eq!(meta.uid(), 10001, "{path}");
    }
    assert_eq!(fs::metadata(outside.path()).unwrap().uid(), 0);
}

#[tokio::test]
async fn fake_runtime_keeps_one_container_per_session() {
    let fake = FakeRuntime::new();
    let first = fake.start(&spec("s1")).await.unwrap();
    let err = fake.start(&spec("s1")).await.unwrap_err();
    assert!(matches!(err, SandboxError::AlreadyExists { .. }));
    let second = fake.start(&spec("s2")).await.unwrap();
    assert_ne!(first.container_id, second.container_id);

    let listed = fake.list().await.unwrap();
    assert_eq!(listed.len(), 2);
    assert!(listed.iter().all(|info| info.running));
    assert_eq!(fake.containers()[0].secret_names, ["API_TOKEN"]);

    fake.stop(&first.container_id).await.unwrap();
    fake.stop(&first.container_id).await.unwrap();
    fake.stop(&second.name).await.unwrap();
    assert!(fake.list().await.unwrap().is_empty());
    assert_eq!((fake.start_count(), fake.stop_count()), (2, 2));
    assert!(fake.secrets_dirs().is_empty());
}

#[tokio::test]
async fn fake_runtime_simulates_failures_exits_and_vanishing() {
    let fake = FakeRuntime::new();
    fake.fail_next_start(SandboxError::ImageMissing {
        image: "img".into(),
    });
    assert!(fake.start(&spec("s1")).await.is_err());
    assert!(fake.list().await.unwrap().is_empty());

    let a = fake.start(&spec("s1")).await.unwrap();
    let b = fake.start(&spec("s2")).await.unwrap();
    assert!(fake.exit(&a.container_id));
    let running: Vec<bool> = fake
        .list()
        .await
        .unwrap()
        .iter()
        .map(|i| i.running)
        .collect();
    assert_eq!(running, [false, true]);

    assert!(fake.vanish(&b.container_id));
    assert_eq!(fake.secrets_dirs(), ["s1", "s2"]);
    assert_eq!(fake.reap_orphan_secrets().await.unwrap(), 1);
    assert_eq!(fake.secrets_dirs(), ["s1"]);
}
