//! Reviewers: the people who approve or deny held calls, and their credentials.
//!
//! `add` creates a reviewer and returns its token once: `tgr_<id>_<secret>`, where the
//! secret is 32 random bytes in URL-safe base64. Only an argon2id PHC hash of the secret
//! is stored (table `reviewers`, migration 0005). [`authenticate`] parses the id, fetches
//! that hash and verifies on the blocking pool; an unknown id is verified against a dummy
//! hash so that it costs the same as a wrong secret.

use std::sync::OnceLock;

use argon2::password_hash::PasswordVerifier as _;
use argon2::{Argon2, PasswordHasher as _};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Utc};
use rand::Rng as _;
use rusqlite::{Connection, OptionalExtension as _, params};

use crate::secrets::SecretString;
use crate::store::{Db, StoreError};

/// The prefix of every reviewer token.
pub const TOKEN_PREFIX: &str = "tgr_";
/// The longest reviewer name.
pub const MAX_REVIEWER_NAME: usize = 64;
/// Random bytes in a token's secret part.
const SECRET_BYTES: usize = 32;

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
    let (secret, hash) = tokio::task::spawn_blocking(new_secret)
        .await
        .map_err(|_| ReviewerError::Interrupted)??;
    let owned = name.to_owned();
    let inserted = db.write(move |c| insert(c, &owned, &hash)).await?;
    finish_add(name, inserted, &secret)
}

/// [`add`] outside a runtime (the CLI).
pub fn add_blocking(db: &Db, name: &str) -> Result<ReviewerToken, ReviewerError> {
    validate_name(name)?;
    if db.read_blocking(|c| find_by_name(c, name))?.is_some() {
        return Err(ReviewerError::DuplicateName(name.to_owned()));
    }
    let (secret, hash) = new_secret()?;
    let owned = name.to_owned();
    let inserted = db.write_blocking(move |c| insert(c, &owned, &hash))?;
    finish_add(name, inserted, &secret)
}

/// The reviewer whose token `presented` is, or `None` for a malformed, unknown or wrong
/// token. Verifying takes the same time for an unknown id as for a wrong secret.
pub async fn authenticate(db: &Db, presented: &str) -> Result<Option<Reviewer>, ReviewerError> {
    let Some((id, secret)) = parse_token(presented) else {
        return Ok(None);
    };
    let secret = SecretString::from(secret);
    let stored = db.read(move |c| find_by_id(c, id)).await?;
    tokio::task::spawn_blocking(move || {
        let (reviewer, hash) = match stored {
            Some((reviewer, hash)) => (Some(reviewer), hash),
            None => (None, dummy_hash()?.to_owned()),
        };
        let matches = Argon2::default()
            .verify_password(secret.expose().as_bytes(), hash.as_str())
            .is_ok();
        Ok(reviewer.filter(|_| matches))
    })
    .await
    .map_err(|_| ReviewerError::Interrupted)?
}

/// Every reviewer, by name.
pub async fn list(db: &Db) -> Result<Vec<Reviewer>, ReviewerError> {
    Ok(db.read(list_all).await?)
}

/// [`list`] outside a runtime.
pub fn list_blocking(db: &Db) -> Result<Vec<Reviewer>, ReviewerError> {
    Ok(db.read_blocking(list_all)?)
}

/// Removes the reviewer named `name`; its token stops working at once.
pub async fn remove(db: &Db, name: &str) -> Result<(), ReviewerError> {
    let owned = name.to_owned();
    let removed = db.write(move |c| delete(c, &owned)).await?;
    finish_remove(name, removed)
}

/// [`remove`] outside a runtime.
pub fn remove_blocking(db: &Db, name: &str) -> Result<(), ReviewerError> {
    let owned = name.to_owned();
    let removed = db.write_blocking(move |c| delete(c, &owned))?;
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

/// A fresh random secret and its argon2id PHC hash.
fn new_secret() -> Result<(SecretString, String), ReviewerError> {
    let mut bytes = zeroize::Zeroizing::new([0u8; SECRET_BYTES]);
    rand::rng().fill_bytes(bytes.as_mut());
    let secret = SecretString::new(URL_SAFE_NO_PAD.encode(bytes.as_ref()));
    let hash = hash_secret(&secret)?;
    Ok((secret, hash))
}

fn hash_secret(secret: &SecretString) -> Result<String, ReviewerError> {
    Argon2::default()
        .hash_password(secret.expose().as_bytes())
        .map(|hash| hash.to_string())
        .map_err(|e| ReviewerError::Hash(e.to_string()))
}

/// A hash of a secret no one knows, for unknown ids. Computed once.
fn dummy_hash() -> Result<&'static str, ReviewerError> {
    static DUMMY: OnceLock<String> = OnceLock::new();
    if let Some(hash) = DUMMY.get() {
        return Ok(hash);
    }
    let (_, hash) = new_secret()?;
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
    let token = SecretString::new(format!("{TOKEN_PREFIX}{}_{}", reviewer.id, secret.expose()));
    Ok(ReviewerToken { reviewer, token })
}

fn finish_remove(name: &str, removed: usize) -> Result<(), ReviewerError> {
    if removed == 0 {
        return Err(ReviewerError::NotFound(name.to_owned()));
    }
    Ok(())
}

/// Inserts a reviewer; `None` when the name is taken (a concurrent `add`).
fn insert(c: &Connection, name: &str, hash: &str) -> rusqlite::Result<Option<Reviewer>> {
    let now = Utc::now().timestamp_millis();
    let inserted = c.execute(
        "INSERT INTO reviewers (name, token_hash, created_at) VALUES (?1, ?2, ?3)
         ON CONFLICT (name) DO NOTHING",
        params![name, hash, now],
    )?;
    if inserted == 0 {
        return Ok(None);
    }
    Ok(Some(Reviewer {
        id: c.last_insert_rowid(),
        name: name.to_owned(),
        created_at: from_ms(now),
    }))
}

fn delete(c: &Connection, name: &str) -> rusqlite::Result<usize> {
    c.execute("DELETE FROM reviewers WHERE name = ?1", [name])
}

fn find_by_name(c: &Connection, name: &str) -> rusqlite::Result<Option<Reviewer>> {
    c.query_row(
        "SELECT id, name, created_at FROM reviewers WHERE name = ?1",
        [name],
        reviewer_row,
    )
    .optional()
}

fn find_by_id(c: &Connection, id: i64) -> rusqlite::Result<Option<(Reviewer, String)>> {
    c.query_row(
        "SELECT id, name, created_at, token_hash FROM reviewers WHERE id = ?1",
        [id],
        |r| Ok((reviewer_row(r)?, r.get(3)?)),
    )
    .optional()
}

fn list_all(c: &Connection) -> rusqlite::Result<Vec<Reviewer>> {
    let mut stmt = c.prepare("SELECT id, name, created_at FROM reviewers ORDER BY name")?;
    let rows = stmt.query_map([], reviewer_row)?;
    rows.collect()
}

fn reviewer_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Reviewer> {
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
