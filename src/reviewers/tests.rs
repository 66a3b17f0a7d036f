use super::*;

fn open_temp() -> (tempfile::TempDir, Db) {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = Db::open(&dir.path().join("state.db")).expect("open");
    (dir, db)
}

/// The token with its secret part replaced by `secret`.
fn with_secret(token: &str, secret: &str) -> String {
    let (id, _) = parse_token(token).expect("well-formed token");
    format!("{TOKEN_PREFIX}{id}_{secret}")
}

#[tokio::test]
async fn the_returned_token_authenticates_its_reviewer() {
    let (_dir, db) = open_temp();
    let added = add(&db, "alice").await.expect("add");
    assert!(added.token.expose_secret().starts_with("tgr_"));
    let who = authenticate(&db, added.token.expose_secret())
        .await
        .expect("authenticate");
    assert_eq!(who, Some(added.reviewer.clone()));
    assert_eq!(who.map(|r| r.name), Some("alice".to_owned()));
}

#[tokio::test]
async fn the_token_is_stored_only_as_its_sha256_digest() {
    let (_dir, db) = open_temp();
    let added = add(&db, "alice").await.expect("add");
    let (_, secret) = parse_token(added.token.expose_secret()).expect("parse");
    let stored: String = db
        .read(|c| c.query_row("SELECT token_hash FROM reviewers", (), |r| r.get(0)))
        .await
        .expect("read");
    assert_eq!(
        stored,
        format!("sha256:{}", hex::encode(Sha256::digest(secret.as_bytes())))
    );
    assert!(!stored.contains(secret));
    let path = db.path().expect("a SQLite file");
    let raw = std::fs::read(path).expect("db file");
    let wal = std::fs::read(path.with_extension("db-wal")).unwrap_or_default();
    for bytes in [raw, wal] {
        assert!(!bytes.windows(secret.len()).any(|w| w == secret.as_bytes()));
    }
}

#[tokio::test]
async fn a_wrong_secret_is_refused() {
    let (_dir, db) = open_temp();
    let added = add(&db, "alice").await.expect("add");
    let wrong = with_secret(
        added.token.expose_secret(),
        &URL_SAFE_NO_PAD.encode([7u8; 32]),
    );
    assert_eq!(authenticate(&db, &wrong).await.expect("auth"), None);
}

#[tokio::test]
async fn a_tampered_secret_is_refused() {
    let (_dir, db) = open_temp();
    let added = add(&db, "alice").await.expect("add");
    let token = added.token.expose_secret();
    let mut chars: Vec<char> = token.chars().collect();
    let last = chars.len() - 1;
    chars[last] = if chars[last] == 'A' { 'B' } else { 'A' };
    let tampered: String = chars.into_iter().collect();
    assert_eq!(authenticate(&db, &tampered).await.expect("auth"), None);
    let truncated = &token[..token.len() - 1];
    assert_eq!(authenticate(&db, truncated).await.expect("auth"), None);
    let extended = format!("{token}A");
    assert_eq!(authenticate(&db, &extended).await.expect("auth"), None);
}

#[tokio::test]
async fn one_reviewers_secret_does_not_work_under_anothers_id() {
    let (_dir, db) = open_temp();
    let alice = add(&db, "alice").await.expect("add alice");
    let bob = add(&db, "bob").await.expect("add bob");
    let (_, alice_secret) = parse_token(alice.token.expose_secret()).expect("parse");
    let as_bob = with_secret(bob.token.expose_secret(), alice_secret);
    assert_eq!(authenticate(&db, &as_bob).await.expect("auth"), None);
    // Each still works on its own.
    assert_eq!(
        authenticate(&db, bob.token.expose_secret())
            .await
            .expect("auth"),
        Some(bob.reviewer)
    );
}

#[tokio::test]
async fn unknown_ids_and_malformed_tokens_are_refused() {
    let (_dir, db) = open_temp();
    let alice = add(&db, "alice").await.expect("add");
    let (_, secret) = parse_token(alice.token.expose_secret()).expect("parse");
    let unknown = format!("{TOKEN_PREFIX}999_{secret}");
    for presented in [
        unknown.as_str(),
        "",
        "tgr_",
        "tgr__abc",
        "tgr_1_",
        "tgr_x_abc",
        "tgr_-1_abc",
        "tgr_99999999999999999999_abc",
        secret,
    ] {
        assert_eq!(
            authenticate(&db, presented).await.expect("auth"),
            None,
            "{presented:?}"
        );
    }
}

#[tokio::test]
async fn a_removed_reviewers_token_stops_working_and_its_id_is_not_reused() {
    let (_dir, db) = open_temp();
    let alice = add(&db, "alice").await.expect("add");
    remove(&db, "alice").await.expect("remove");
    assert_eq!(
        authenticate(&db, alice.token.expose_secret())
            .await
            .expect("auth"),
        None
    );
    let again = add(&db, "alice").await.expect("add again");
    assert_ne!(again.reviewer.id, alice.reviewer.id);
    assert_eq!(
        authenticate(&db, alice.token.expose_secret())
            .await
            .expect("auth"),
        None
    );
}

#[tokio::test]
async fn duplicate_and_invalid_names_are_clear_errors() {
    let (_dir, db) = open_temp();
    add(&db, "alice@example.com").await.expect("add");
    let err = add(&db, "alice@example.com").await.expect_err("duplicate");
    assert_eq!(
        err.to_string(),
        "a reviewer named alice@example.com already exists"
    );
    let err = add(&db, "alice smith").await.expect_err("space");
    assert!(matches!(err, ReviewerError::InvalidName(ref n) if n == "alice smith"));
    let err = remove(&db, "nobody").await.expect_err("missing");
    assert_eq!(err.to_string(), "no reviewer named nobody");
}

#[tokio::test]
async fn reviewers_are_added_listed_by_name_and_removed() {
    let (_dir, db) = open_temp();
    let bob = add(&db, "bob").await.expect("add bob");
    add(&db, "alice").await.expect("add alice");
    assert!(matches!(
        add(&db, "bob").await,
        Err(ReviewerError::DuplicateName(_))
    ));
    let names: Vec<String> = list(&db)
        .await
        .expect("list")
        .into_iter()
        .map(|r| r.name)
        .collect();
    assert_eq!(names, ["alice", "bob"]);
    remove(&db, "bob").await.expect("remove");
    let listed = list(&db).await.expect("list");
    assert_eq!(listed.len(), 1);
    assert!(listed.iter().all(|r| r.id != bob.reviewer.id));
}

#[tokio::test]
async fn the_token_never_prints() {
    let (_dir, db) = open_temp();
    let added = add(&db, "carol").await.expect("add");
    let (_, secret) = parse_token(added.token.expose_secret()).expect("parse");
    let shown = format!("{added:?} {:?}", added.token);
    assert!(!shown.contains(secret), "{shown}");
    assert!(shown.contains("[REDACTED]"), "{shown}");
}

/// Issue 7 item 5: 400 parallel made-up tokens, for a real reviewer's id and for
/// unknown ids, are refused without computing a single argon2 hash.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flood_of_made_up_tokens_computes_no_argon2_hash() {
    let (_dir, db) = open_temp();
    let alice = add(&db, "alice").await.expect("add");
    let hasher = std::sync::Arc::new(Hasher::new(2, 32));
    let mut tasks = Vec::new();
    for i in 0..400 {
        let (db, hasher) = (db.clone(), hasher.clone());
        let id = if i % 2 == 0 {
            alice.reviewer.id
        } else {
            1000 + i
        };
        let made_up = format!(
            "{TOKEN_PREFIX}{id}_{}",
            URL_SAFE_NO_PAD.encode([u8::try_from(i).unwrap_or(u8::MAX); 32])
        );
        tasks.push(tokio::spawn(async move {
            authenticate_with(&db, &hasher, &made_up).await
        }));
    }
    for t in tasks {
        assert_eq!(t.await.expect("task").expect("auth"), None);
    }
    assert_eq!(hasher.started(), 0, "a made-up token cost an argon2 hash");
    let real = authenticate_with(&db, &hasher, alice.token.expose_secret())
        .await
        .expect("auth");
    assert_eq!(real.map(|r| r.name), Some("alice".to_owned()));
    assert_eq!(hasher.started(), 0);
}

/// A token issued before digests (an argon2id PHC hash) still works, verified through
/// the bounded pool.
#[tokio::test]
async fn a_legacy_argon2_token_is_verified_through_the_pool() {
    let (_dir, db) = open_temp();
    let alice = add(&db, "alice").await.expect("add");
    let (_, secret) = parse_token(alice.token.expose_secret()).expect("parse");
    let phc = Argon2::default()
        .hash_password(secret.as_bytes())
        .expect("hash")
        .to_string();
    db.write(move |c| c.execute("UPDATE reviewers SET token_hash = ?1", [&phc]))
        .await
        .expect("write");
    let hasher = Hasher::new(1, 4);
    let who = authenticate_with(&db, &hasher, alice.token.expose_secret())
        .await
        .expect("auth");
    assert_eq!(who.map(|r| r.name), Some("alice".to_owned()));
    assert_eq!(hasher.started(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_are_argon2id_and_checked_by_name() {
    let (_dir, db) = open_temp();
    add(&db, "alice").await.expect("add");
    let hasher = Hasher::new(2, 8);
    let pw = || SecretString::from("correct horse battery staple");
    let short = set_password(&db, &hasher, "alice", SecretString::from("short")).await;
    assert!(matches!(short, Err(ReviewerError::WeakPassword)));
    assert!(matches!(
        set_password(&db, &hasher, "nobody", pw()).await,
        Err(ReviewerError::NotFound(_))
    ));
    set_password(&db, &hasher, "alice", pw())
        .await
        .expect("set");
    let stored: String = db
        .read(|c| c.query_row("SELECT password_hash FROM reviewers", (), |r| r.get(0)))
        .await
        .expect("read");
    assert!(stored.starts_with("$argon2id$"), "{stored}");
    let ok = verify_password(&db, &hasher, "alice", pw())
        .await
        .expect("verify");
    assert_eq!(ok.map(|r| r.name), Some("alice".to_owned()));
    let wrong = SecretString::from("correct horse battery stapler");
    assert_eq!(
        verify_password(&db, &hasher, "alice", wrong)
            .await
            .expect("verify"),
        None
    );
    assert_eq!(
        verify_password(&db, &hasher, "bob", pw())
            .await
            .expect("verify"),
        None
    );
    assert!(hasher.peak() <= 2);
}
