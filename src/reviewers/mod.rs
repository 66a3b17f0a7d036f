//! Reviewers: the people who approve or deny held calls, and their credentials, with
//! what guards them: the bounded password [`hasher`] and the failure [`throttle`]. Both
//! the review page ([`crate::review`]) and the approvals API ([`crate::approvals::http`])
//! use this module; neither owns it.
//!
//! `add` creates a reviewer and returns its API token once: `tgr_<id>_<secret>`, where
//! the secret is 32 random bytes in URL-safe base64. A token is high-entropy, so it is
//! stored as its SHA-256 digest (`sha256:<hex>`, table `reviewers`) and checked by
//! [`authenticate`] with one digest and a constant-time comparison: no argon2, so a
//! flood of made-up tokens costs the server nothing (issue 7 item 5). Tokens issued
//! before that are argon2id PHC hashes and are verified through the bounded
//! [`Hasher`]; an unknown id is compared against a dummy digest.
//!
//! Passwords (for the review page's sign-in, set with `reviewers passwd`) are
//! low-entropy: they are stored as argon2id PHC hashes (migration 0008) and checked
//! only through the bounded [`Hasher`], behind the caller's throttle.

use crate::secrets::ExposeSecret as _;
use std::sync::OnceLock;

use crate::store::{Conn, OptionalExtension as _, params};
use argon2::{Argon2, PasswordHasher as _};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Utc};
use rand::Rng as _;
use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq as _;

pub mod hasher;
pub mod provider;
pub mod throttle;

use crate::secrets::SecretString;
use crate::store::{Db, StoreError};
use hasher::{HashError, Hasher};

/// The prefix of every reviewer token.
pub const TOKEN_PREFIX: &str = "tgr_";
/// The longest reviewer name.
pub const MAX_REVIEWER_NAME: usize = 64;
/// Random bytes in a token's secret part.
const SECRET_BYTES: usize = 32;
/// The shortest password accepted.
pub const MIN_PASSWORD: usize = 12;
/// The longest password accepted (argon2 hashes it all).
pub const MAX_PASSWORD: usize = 1024;
/// How a token's digest is marked in `token_hash`.
const DIGEST_PREFIX: &str = "sha256:";

/// A person who may decide held calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reviewer {
    /// The id embedded in the reviewer's token.
    pub id: i64,
    /// The name recorded with each decision.
    pub name: String,
    /// When the reviewer was added.
    pub created_at: DateTime<Utc>,
}

/// A new reviewer and its token, which is shown once and never stored.
#[derive(Debug)]
pub struct ReviewerToken {
    /// The reviewer.
    pub reviewer: Reviewer,
    /// `tgr_<id>_<secret>`; `Debug` prints `[redacted]`.
    pub token: SecretString,
}

/// Errors managing reviewers.
#[derive(Debug, thiserror::Error)]
pub enum ReviewerError {
    /// A name outside `[A-Za-z0-9_.@-]{1,64}`.
    #[error(
        "invalid reviewer name {0:?}: use 1 to 64 characters from A-Z, a-z, 0-9, '_', '.', '@' and '-'"
    )]
    InvalidName(String),
    /// The name is taken.
    #[error("a reviewer named {0} already exists")]
    DuplicateName(String),
    /// No reviewer has this name.
    #[error("no reviewer named {0}")]
    NotFound(String),
    /// argon2 failed (not a wrong password: a broken stored hash or parameters).
    #[error("cannot hash the reviewer credential: {0}")]
    Hash(String),
    /// The hashing task did not finish.
    #[error("the credential check was interrupted")]
    Interrupted,
    /// Too many password checks run already.
    #[error("too many password checks at once; try again in a moment")]
    Busy,
    /// A password shorter than [`MIN_PASSWORD`] or longer than [`MAX_PASSWORD`].
    #[error("a reviewer's password must be {MIN_PASSWORD} to {MAX_PASSWORD} characters long")]
    WeakPassword,
    /// The database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Creates a reviewer named `name` and returns its token (the only time it exists in
/// clear).
pub async fn add(db: &Db, name: &str) -> Result<ReviewerToken, ReviewerError> {
    validate_name(name)?;
    let owned = name.to_owned();
    if db.read(move |c| find_by_name(c, &owned)).await?.is_some() {
        return Err(ReviewerError::DuplicateName(name.to_owned()));
    }
    let (secret, hash) = new_secret()?;
    let owned = name.to_owned();
    let inserted = db.write(move |c| insert(c, &owned, &hash)).await?;
    finish_add(name, inserted, &secret)
}

/// The reviewer whose token `presented` is, or `None` for a malformed, unknown or wrong
/// token. A current token costs one SHA-256 and a constant-time comparison; only a
/// token issued before digests existed is verified with argon2, through the server's
/// bounded [`Hasher::global`].
pub async fn authenticate(db: &Db, presented: &str) -> Result<Option<Reviewer>, ReviewerError> {
    authenticate_with(db, Hasher::global(), presented).await
}

/// [`authenticate`] with the given hashing pool (for legacy argon2 tokens).
pub async fn authenticate_with(
    db: &Db,
    hasher: &Hasher,
    presented: &str,
) -> Result<Option<Reviewer>, ReviewerError> {
    let Some((id, secret)) = parse_token(presented) else {
        return Ok(None);
    };
    let secret = SecretString::from(secret);
    let stored = db.read(move |c| find_by_id(c, id)).await?;
    let Some((reviewer, hash)) = stored else {
        // The same work as a wrong secret: one digest and one comparison.
        let _ = digest_matches(&secret, dummy_digest());
        return Ok(None);
    };
    let matches = match hash.strip_prefix(DIGEST_PREFIX) {
        Some(digest) => digest_matches(&secret, digest),
        None => hasher.verify(secret, hash).await.map_err(hash_error)?,
    };
    Ok(matches.then_some(reviewer))
}

/// Whether `secret`'s SHA-256 is the hex `digest`, compared in constant time.
fn digest_matches(secret: &SecretString, digest: &str) -> bool {
    let mine = hex::encode(Sha256::digest(secret.expose_secret().as_bytes()));
    mine.as_bytes().ct_eq(digest.as_bytes()).into()
}

fn dummy_digest() -> &'static str {
    static DUMMY: OnceLock<String> = OnceLock::new();
    DUMMY.get_or_init(|| hex::encode(Sha256::digest(uuid::Uuid::new_v4().as_bytes())))
}

fn hash_error(e: HashError) -> ReviewerError {
    match e {
        HashError::Busy => ReviewerError::Busy,
        HashError::Failed(m) => ReviewerError::Hash(m),
    }
}

/// Sets the sign-in password of the reviewer named `name` (argon2id, hashed through
/// `hasher`).
pub async fn set_password(
    db: &Db,
    hasher: &Hasher,
    name: &str,
    password: SecretString,
) -> Result<(), ReviewerError> {
    check_password(&password)?;
    let phc = hasher.hash(password).await.map_err(hash_error)?;
    let owned = name.to_owned();
    let changed = db.write(move |c| store_password(c, &owned, &phc)).await?;
    finish_remove(name, changed)
}

fn check_password(password: &SecretString) -> Result<(), ReviewerError> {
    let len = password.expose_secret().chars().count();
    if (MIN_PASSWORD..=MAX_PASSWORD).contains(&len) {
        Ok(())
    } else {
        Err(ReviewerError::WeakPassword)
    }
}

fn store_password(c: &Conn<'_>, name: &str, phc: &str) -> crate::store::Result<usize> {
    c.execute(
        "UPDATE reviewers SET password_hash = ?2 WHERE name = ?1",
        params![name, phc],
    )
}

/// The reviewer named `name` when `password` is theirs. An unknown name, or one
/// without a password, is verified against a dummy hash, so it costs the same. The
/// caller throttles failures before calling this.
pub async fn verify_password(
    db: &Db,
    hasher: &Hasher,
    name: &str,
    password: SecretString,
) -> Result<Option<Reviewer>, ReviewerError> {
    if password.expose_secret().len() > MAX_PASSWORD * 4 {
        return Ok(None);
    }
    let owned = name.to_owned();
    let stored = db
        .read(move |c| {
            c.query_row(
                "SELECT id, name, created_at, password_hash FROM reviewers WHERE name = ?1",
                [&owned],
                |r| Ok((reviewer_row(r)?, r.get::<_, Option<String>>(3)?)),
            )
            .optional()
        })
        .await?;
    let (reviewer, phc) = match stored {
        Some((r, Some(phc))) => (Some(r), phc),
        _ => (None, dummy_hash()?.to_owned()),
    };
    let matches = hasher.verify(password, phc).await.map_err(hash_error)?;
    Ok(reviewer.filter(|_| matches))
}

/// The reviewer with `id`, if any.
pub fn by_id(c: &Conn<'_>, id: i64) -> crate::store::Result<Option<Reviewer>> {
    Ok(find_by_id(c, id)?.map(|(r, _)| r))
}

/// Every reviewer, by name.
pub async fn list(db: &Db) -> Result<Vec<Reviewer>, ReviewerError> {
    Ok(db.read(list_all).await?)
}

/// Removes the reviewer named `name`; its token stops working at once.
pub async fn remove(db: &Db, name: &str) -> Result<(), ReviewerError> {
    let owned = name.to_owned();
    let removed = db.write(move |c| delete(c, &owned)).await?;
    finish_remove(name, removed)
}

fn validate_name(name: &str) -> Result<(), ReviewerError> {
    let valid = (1..=MAX_REVIEWER_NAME).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'@' | b'-'));
    if valid {
        Ok(())
    } else {
        Err(ReviewerError::InvalidName(name.to_owned()))
    }
}

/// A fresh random secret and its stored form, `sha256:<hex digest>`.
fn new_secret() -> Result<(SecretString, String), ReviewerError> {
    let mut bytes = zeroize::Zeroizing::new([0u8; SECRET_BYTES]);
    rand::rng().fill_bytes(bytes.as_mut());
    let secret = SecretString::from(URL_SAFE_NO_PAD.encode(bytes.as_ref()));
    let digest = hex::encode(Sha256::digest(secret.expose_secret().as_bytes()));
    Ok((secret, format!("{DIGEST_PREFIX}{digest}")))
}

/// An argon2id hash of a password no one knows, for unknown names. Computed once.
fn dummy_hash() -> Result<&'static str, ReviewerError> {
    static DUMMY: OnceLock<String> = OnceLock::new();
    if let Some(hash) = DUMMY.get() {
        return Ok(hash);
    }
    let unknown = uuid::Uuid::new_v4().simple().to_string();
    let hash = Argon2::default()
        .hash_password(unknown.as_bytes())
        .map_err(|e| ReviewerError::Hash(e.to_string()))?
        .to_string();
    Ok(DUMMY.get_or_init(|| hash))
}

/// Splits `tgr_<id>_<secret>`; the id is decimal digits, the secret is URL-safe base64
/// (which may itself hold `_`).
fn parse_token(presented: &str) -> Option<(i64, &str)> {
    let rest = presented.trim().strip_prefix(TOKEN_PREFIX)?;
    let (id, secret) = rest.split_once('_')?;
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) || secret.is_empty() {
        return None;
    }
    Some((id.parse().ok()?, secret))
}

fn finish_add(
    name: &str,
    inserted: Option<Reviewer>,
    secret: &SecretString,
) -> Result<ReviewerToken, ReviewerError> {
    let reviewer = inserted.ok_or_else(|| ReviewerError::DuplicateName(name.to_owned()))?;
    let token = SecretString::from(format!(
        "{TOKEN_PREFIX}{}_{}",
        reviewer.id,
        secret.expose_secret()
    ));
    Ok(ReviewerToken { reviewer, token })
}

fn finish_remove(name: &str, removed: usize) -> Result<(), ReviewerError> {
    if removed == 0 {
        return Err(ReviewerError::NotFound(name.to_owned()));
    }
    Ok(())
}

/// Inserts a reviewer; `None` when the name is taken (a concurrent `add`).
fn insert(c: &Conn<'_>, name: &str, hash: &str) -> crate::store::Result<Option<Reviewer>> {
    let now = Utc::now().timestamp_millis();
    let inserted = c
        .query_row(
            "INSERT INTO reviewers (name, token_hash, created_at) VALUES (?1, ?2, ?3)
             ON CONFLICT (name) DO NOTHING RETURNING id",
            params![name, hash, now],
            |r| r.get(0),
        )
        .optional()?;
    let Some(id) = inserted else {
        return Ok(None);
    };
    Ok(Some(Reviewer {
        id,
        name: name.to_owned(),
        created_at: from_ms(now),
    }))
}

fn delete(c: &Conn<'_>, name: &str) -> crate::store::Result<usize> {
    c.execute(
        "DELETE FROM review_sessions WHERE reviewer_id IN \
         (SELECT id FROM reviewers WHERE name = ?1)",
        [name],
    )?;
    c.execute("DELETE FROM reviewers WHERE name = ?1", [name])
}

fn find_by_name(c: &Conn<'_>, name: &str) -> crate::store::Result<Option<Reviewer>> {
    c.query_row(
        "SELECT id, name, created_at FROM reviewers WHERE name = ?1",
        [name],
        reviewer_row,
    )
    .optional()
}

fn find_by_id(c: &Conn<'_>, id: i64) -> crate::store::Result<Option<(Reviewer, String)>> {
    c.query_row(
        "SELECT id, name, created_at, token_hash FROM reviewers WHERE id = ?1",
        [id],
        |r| Ok((reviewer_row(r)?, r.get(3)?)),
    )
    .optional()
}

fn list_all(c: &Conn<'_>) -> crate::store::Result<Vec<Reviewer>> {
    let mut stmt = c.prepare("SELECT id, name, created_at FROM reviewers ORDER BY name")?;
    let rows = stmt.query_map((), reviewer_row)?;
    rows.collect()
}

fn reviewer_row(r: &crate::store::Row<'_>) -> crate::store::Result<Reviewer> {
    Ok(Reviewer {
        id: r.get(0)?,
        name: r.get(1)?,
        created_at: from_ms(r.get(2)?),
    })
}

fn from_ms(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(ms).unwrap_or_default()
}

#[cfg(test)]
mod tests;
