//! The encrypted secret store, its grants and the master key, against a real database.

use std::sync::Arc;
use threadgate::secrets::ExposeSecret as _;

use threadgate::secrets::{
    KeyError, KeySource, MasterKey, SecretStore, SecretString, SecretsError, Written,
};
use threadgate::store::Db;

const STRIPE_KEY: &str = "sk_test_51Hx9qLmN0pQrStUvWxYz";
const PLAIN_KEY: &str = "plainApiKey_AbCdEf0123456789";

struct Fixture {
    dir: tempfile::TempDir,
    db: Db,
    key: Arc<MasterKey>,
    store: SecretStore,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = Db::open(&dir.path().join("state.db")).expect("open");
    let key = Arc::new(MasterKey::generate());
    let store = SecretStore::new(db.clone(), Arc::clone(&key));
    Fixture {
        dir,
        db,
        key,
        store,
    }
}

fn names(values: &[(String, SecretString)]) -> Vec<&str> {
    values.iter().map(|(n, _)| n.as_str()).collect()
}

/// The raw sealed columns of one row.
async fn sealed(db: &Db, name: &str) -> (Vec<u8>, Vec<u8>) {
    let name = name.to_owned();
    db.read(move |c| {
        c.query_row(
            "SELECT nonce, ciphertext FROM secrets WHERE name = ?1",
            [name],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
    })
    .await
    .expect("read sealed row")
}

#[tokio::test]
async fn a_value_set_is_read_back_and_listed_without_it() {
    let f = fixture();
    let written = f
        .store
        .set("stripe_key", STRIPE_KEY.into())
        .await
        .expect("set");
    assert_eq!(written, Written::Created);
    assert_eq!(
        f.store
            .get("stripe_key")
            .await
            .expect("get")
            .expose_secret(),
        STRIPE_KEY
    );
    let listed = f.store.list().await.expect("list");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].name, "stripe_key");
    assert!(listed[0].grants.is_empty());
    assert!(!format!("{listed:?}").contains(STRIPE_KEY));
}

#[tokio::test]
async fn setting_again_replaces_the_value_with_a_fresh_nonce_and_keeps_grants() {
    let f = fixture();
    f.store.set("k", STRIPE_KEY.into()).await.expect("set");
    f.store.grant("k", "support").await.expect("grant");
    let first = sealed(&f.db, "k").await;
    let created = f.store.list().await.expect("list")[0].created_at;

    let written = f
        .store
        .set("k", STRIPE_KEY.into())
        .await
        .expect("set again");
    assert_eq!(written, Written::Updated);
    let second = sealed(&f.db, "k").await;
    assert_ne!(first.0, second.0, "same value, new nonce");
    assert_ne!(first.1, second.1, "same value, new ciphertext");

    f.store.set("k", PLAIN_KEY.into()).await.expect("replace");
    assert_eq!(
        f.store.get("k").await.expect("get").expose_secret(),
        PLAIN_KEY
    );
    let meta = &f.store.list().await.expect("list")[0];
    assert_eq!(meta.created_at, created);
    assert!(meta.updated_at >= created);
    assert_eq!(meta.grants, ["support"]);
}

#[tokio::test]
async fn the_database_file_never_holds_a_value_in_clear() {
    let f = fixture();
    f.store
        .set("stripe_key", STRIPE_KEY.into())
        .await
        .expect("set");
    f.store
        .set("plain_key", PLAIN_KEY.into())
        .await
        .expect("set");
    let dir = f.dir.path();
    let mut files = 0;
    for entry in std::fs::read_dir(dir).expect("read dir") {
        let bytes = std::fs::read(entry.expect("entry").path()).expect("read file");
        files += 1;
        for value in [STRIPE_KEY, PLAIN_KEY] {
            assert!(
                !bytes.windows(value.len()).any(|w| w == value.as_bytes()),
                "a value in clear on disk"
            );
        }
    }
    assert!(files >= 2, "the database and its WAL were searched");
}

#[tokio::test]
async fn a_ciphertext_moved_to_another_name_does_not_decrypt() {
    let f = fixture();
    f.store
        .set("stripe_key", STRIPE_KEY.into())
        .await
        .expect("set");
    f.store
        .set("plain_key", PLAIN_KEY.into())
        .await
        .expect("set");
    f.db.write(|c| {
        c.execute(
            "UPDATE secrets SET nonce = (SELECT nonce FROM secrets WHERE name = 'stripe_key'),
                 ciphertext = (SELECT ciphertext FROM secrets WHERE name = 'stripe_key')
             WHERE name = 'plain_key'",
            (),
        )
    })
    .await
    .expect("swap");
    let err = f.store.get("plain_key").await.expect_err("swapped row");
    assert_eq!(
        err.to_string(),
        "cannot decrypt secret plain_key: wrong master key or tampered data"
    );
    assert!(f.store.get("stripe_key").await.is_ok());
}

#[tokio::test]
async fn a_flipped_bit_is_detected() {
    let f = fixture();
    f.store.set("k", STRIPE_KEY.into()).await.expect("set");
    f.db.write(|c| {
        let mut ct: Vec<u8> = c.query_row("SELECT ciphertext FROM secrets", (), |r| r.get(0))?;
        ct[3] ^= 0x01;
        c.execute("UPDATE secrets SET ciphertext = ?1", [ct])
    })
    .await
    .expect("tamper");
    assert!(matches!(
        f.store.get("k").await,
        Err(SecretsError::Decrypt { ref name }) if name == "k"
    ));
}

#[tokio::test]
async fn the_wrong_master_key_is_a_clear_error_naming_the_secret() {
    let f = fixture();
    f.store
        .set("stripe_key", STRIPE_KEY.into())
        .await
        .expect("set");
    let other = SecretStore::new(f.db.clone(), Arc::new(MasterKey::generate()));
    let err = other.get("stripe_key").await.expect_err("wrong key");
    assert_eq!(
        err.to_string(),
        "cannot decrypt secret stripe_key: wrong master key or tampered data"
    );
    assert!(other.all_values().await.is_err());
}

#[tokio::test]
async fn names_are_validated_with_a_clear_error() {
    let f = fixture();
    let longest = "a".repeat(64);
    f.store
        .set(&longest, STRIPE_KEY.into())
        .await
        .expect("64 chars");
    f.store
        .set("A-z_0.9", STRIPE_KEY.into())
        .await
        .expect("all classes");
    let too_long = "a".repeat(65);
    for bad in ["", "has space", "slash/name", "ünïcode", too_long.as_str()] {
        let err = f
            .store
            .set(bad, STRIPE_KEY.into())
            .await
            .expect_err("invalid name");
        assert!(
            matches!(err, SecretsError::InvalidName { kind: "secret", ref name } if name == bad),
            "{err}"
        );
    }
    let err = f
        .store
        .grant("A-z_0.9", "bad agent")
        .await
        .expect_err("agent");
    assert_eq!(
        err.to_string(),
        "invalid agent name \"bad agent\": use 1 to 64 characters from A-Z, a-z, 0-9, '_', '.' and '-'"
    );
}

#[tokio::test]
async fn empty_and_oversized_values_are_refused() {
    let f = fixture();
    let err = f.store.set("k", "".into()).await.expect_err("empty");
    assert_eq!(err.to_string(), "secret k is empty");
    let big = "x".repeat(threadgate::secrets::MAX_SECRET_LEN + 1);
    let err = f.store.set("k", big.into()).await.expect_err("too large");
    assert!(matches!(err, SecretsError::TooLarge { .. }), "{err}");
    assert!(f.store.list().await.expect("list").is_empty());
}

#[tokio::test]
async fn grants_are_listed_revoked_and_go_with_the_secret() {
    let f = fixture();
    f.store
        .set("stripe_key", STRIPE_KEY.into())
        .await
        .expect("set");
    f.store
        .set("plain_key", PLAIN_KEY.into())
        .await
        .expect("set");
    f.store.grant("stripe_key", "billing").await.expect("grant");
    f.store
        .grant("stripe_key", "billing")
        .await
        .expect("grant twice");
    f.store.grant("plain_key", "billing").await.expect("grant");
    f.store.grant("plain_key", "triage").await.expect("grant");
    assert_eq!(
        f.store.granted("billing").await.expect("granted"),
        ["plain_key", "stripe_key"]
    );
    let listed = f.store.list().await.expect("list");
    assert_eq!(listed[0].grants, ["billing", "triage"]);

    f.store
        .revoke("plain_key", "billing")
        .await
        .expect("revoke");
    assert_eq!(
        f.store.granted("billing").await.expect("granted"),
        ["stripe_key"]
    );
    let err = f
        .store
        .revoke("plain_key", "billing")
        .await
        .expect_err("not granted");
    assert_eq!(
        err.to_string(),
        "secret plain_key is not granted to agent billing"
    );

    f.store.delete("plain_key").await.expect("delete");
    assert!(f.store.granted("triage").await.expect("granted").is_empty());
    let err = f.store.get("plain_key").await.expect_err("deleted");
    assert_eq!(err.to_string(), "no secret named plain_key");
    let err = f
        .store
        .grant("plain_key", "triage")
        .await
        .expect_err("gone");
    assert!(matches!(err, SecretsError::NotFound { .. }));
    let err = f.store.delete("plain_key").await.expect_err("twice");
    assert!(matches!(err, SecretsError::NotFound { .. }));
}

#[tokio::test]
async fn an_agent_gets_only_what_it_asks_for_and_is_granted() {
    let f = fixture();
    f.store
        .set("stripe_key", STRIPE_KEY.into())
        .await
        .expect("set");
    f.store
        .set("plain_key", PLAIN_KEY.into())
        .await
        .expect("set");
    f.store
        .set("github_token", "ghp_0123456789abcdef".into())
        .await
        .expect("set");
    f.store.grant("stripe_key", "billing").await.expect("grant");
    f.store.grant("plain_key", "billing").await.expect("grant");

    let asked = vec![
        "plain_key".to_owned(),
        "stripe_key".to_owned(),
        "plain_key".to_owned(),
    ];
    let got = f
        .store
        .resolve_for_agent("billing", &asked)
        .await
        .expect("resolve");
    assert_eq!(names(&got), ["plain_key", "stripe_key"]);
    assert_eq!(got[0].1.expose_secret(), PLAIN_KEY);
    assert_eq!(got[1].1.expose_secret(), STRIPE_KEY);

    let only_one = f
        .store
        .resolve_for_agent("billing", &["stripe_key".to_owned()])
        .await
        .expect("resolve");
    assert_eq!(names(&only_one), ["stripe_key"]);

    let asked = vec![
        "stripe_key".to_owned(),
        "unknown_one".to_owned(),
        "github_token".to_owned(),
    ];
    let err = f
        .store
        .resolve_for_agent("billing", &asked)
        .await
        .expect_err("not granted");
    assert!(matches!(
        &err,
        SecretsError::NotGranted { agent, names } if agent == "billing" && names == &["github_token", "unknown_one"]
    ));
    assert_eq!(
        err.to_string(),
        "agent billing asks for secrets not granted to it: github_token, unknown_one"
    );
    let err = f
        .store
        .resolve_for_agent("triage", &["plain_key".to_owned()])
        .await
        .expect_err("other agent");
    assert!(matches!(err, SecretsError::NotGranted { .. }));
}

#[tokio::test]
async fn all_values_feed_a_redactor() {
    let f = fixture();
    f.store
        .set("stripe_key", STRIPE_KEY.into())
        .await
        .expect("set");
    f.store.set("pin", "1234".into()).await.expect("set");
    let all = f.store.all_values().await.expect("all");
    assert_eq!(names(&all), ["pin", "stripe_key"]);
    let redactor = f.store.redactor().await.expect("redactor");
    assert_eq!(
        redactor.find(format!("Bearer {STRIPE_KEY}").as_bytes()),
        Some("stripe_key")
    );
    assert_eq!(redactor.too_short(), ["pin"]);
}

#[test]
fn nothing_prints_a_value_or_the_key() {
    let f = fixture();
    let value = SecretString::from(STRIPE_KEY);
    let shown = format!("{value:?} {:?} {:?}", f.key, f.store);
    assert!(!shown.contains(STRIPE_KEY));
    assert!(shown.contains("[REDACTED]"), "{shown}");
}

#[tokio::test]
async fn a_generated_key_written_to_a_file_loads_back_and_opens_secrets() {
    let f = fixture();
    f.store.set("k", STRIPE_KEY.into()).await.expect("set");
    let path = f.dir.path().join("master.key");
    f.key.write_to(&path).expect("write key");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    let loaded = MasterKey::from_file(&path).expect("load");
    let reopened = SecretStore::new(f.db.clone(), Arc::new(loaded));
    assert_eq!(
        reopened.get("k").await.expect("get").expose_secret(),
        STRIPE_KEY
    );

    let err = MasterKey::generate().write_to(&path).expect_err("exists");
    assert!(matches!(err, KeyError::Exists { .. }));
    let again = MasterKey::from_file(&path).expect("unchanged");
    let still = SecretStore::new(f.db.clone(), Arc::new(again));
    assert!(
        still.get("k").await.is_ok(),
        "the key file was not replaced"
    );
}

#[test]
fn key_errors_name_their_source_and_never_the_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("nope.key");
    let err = MasterKey::from_file(&missing).expect_err("missing");
    assert!(
        err.to_string().contains(&missing.display().to_string()),
        "{err}"
    );

    let short = "c2hvcnQta2V5LW1hdGVyaWFs"; // base64 of 18 bytes
    let err = MasterKey::from_base64(short, KeySource::Env("TG_KEY".into())).expect_err("short");
    assert_eq!(
        err.to_string(),
        "master key from environment variable TG_KEY is not valid: expected base64 of exactly 32 bytes"
    );
    let garbage = "not base64 at all: secret-material!";
    let file = dir.path().join("bad.key");
    std::fs::write(&file, garbage).expect("write");
    let err = MasterKey::from_file(&file).expect_err("garbage");
    let shown = format!("{err} {err:?}");
    assert!(shown.contains("bad.key"), "{shown}");
    assert!(!shown.contains("secret-material"), "{shown}");

    let var = "THREADGATE_TEST_MASTER_KEY_THAT_IS_NEVER_SET";
    let err = MasterKey::from_env(var).expect_err("unset");
    assert_eq!(
        err.to_string(),
        format!("environment variable {var} is not set; it should hold the base64 master key")
    );
}

#[tokio::test]
async fn a_key_parses_with_or_without_padding_and_whitespace() {
    let key = MasterKey::generate();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("k");
    key.write_to(&path).expect("write");
    let text = std::fs::read_to_string(&path).expect("read");
    let source = KeySource::Env("X".into());
    let padded = MasterKey::from_base64(&format!("  {text}  "), source.clone()).expect("padded");
    let unpadded =
        MasterKey::from_base64(text.trim().trim_end_matches('='), source).expect("unpadded");
    // Both decode to the same key: a value sealed under one opens under the other.
    let db = Db::open(&dir.path().join("s.db")).expect("open");
    SecretStore::new(db.clone(), Arc::new(padded))
        .set("k", STRIPE_KEY.into())
        .await
        .expect("set");
    let got = SecretStore::new(db, Arc::new(unpadded))
        .get("k")
        .await
        .expect("get");
    assert_eq!(got.expose_secret(), STRIPE_KEY);
}

/// The generation counter that tells every cache of the secrets (the redactor among
/// them) to refresh is never read as 0 when it is not a number: that would be a counter
/// that never moves. The error names the failure; the next write makes it a number again.
#[tokio::test]
async fn a_generation_that_is_not_a_number_is_an_error_not_zero() {
    let f = fixture();
    f.store
        .set("stripe_key", STRIPE_KEY.into())
        .await
        .expect("set");
    assert_eq!(f.store.generation().await.expect("generation"), 1);
    f.db.write(|c| {
        c.execute(
            "UPDATE meta SET value = 'garbage' WHERE key = 'secrets_generation'",
            (),
        )
    })
    .await
    .expect("corrupt");
    assert!(
        f.store.generation().await.is_err(),
        "garbage read as a number"
    );
    f.store
        .set("stripe_key", PLAIN_KEY.into())
        .await
        .expect("set again");
    assert!(f.store.generation().await.expect("generation") >= 1);
}
