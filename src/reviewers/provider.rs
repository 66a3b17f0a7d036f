//! Reviewers made by the team's identity provider (the review page's single sign-on):
//! found by the provider's subject, named by the claim the configuration picks.
//!
//! The subject (`<issuer> <sub>`) is the identity; the name is what decisions and the
//! audit record. A provider's sign-in never takes over a reviewer it did not make: a
//! name already used by a password reviewer (or by another subject) is refused, so an
//! account at the provider whose claim happens to read `alice` cannot become the
//! password reviewer `alice`.

use crate::store::{Conn, OptionalExtension as _, params};
use chrono::Utc;

use super::{Reviewer, ReviewerError, new_secret, reviewer_row, validate_name};
use crate::store::Db;

/// The reviewer of `subject`, named `name`: made on its first sign-in, renamed when
/// the provider's claim changed. A name another reviewer has is
/// [`ReviewerError::DuplicateName`]; a name outside the reviewer name rules is
/// [`ReviewerError::InvalidName`].
pub async fn sign_in(db: &Db, subject: &str, name: &str) -> Result<Reviewer, ReviewerError> {
    validate_name(name)?;
    // A digest of a secret no one is given: such a reviewer has no API token.
    let (_, unusable_token) = new_secret()?;
    let (subject, owned) = (subject.to_owned(), name.to_owned());
    let found = db
        .write(move |c| find_or_make(c, &subject, &owned, &unusable_token))
        .await?;
    found.ok_or_else(|| ReviewerError::DuplicateName(name.to_owned()))
}

/// `None` when `name` belongs to another reviewer.
fn find_or_make(
    c: &Conn<'_>,
    subject: &str,
    name: &str,
    token_hash: &str,
) -> crate::store::Result<Option<Reviewer>> {
    let known = c
        .query_row(
            "SELECT id, name, created_at FROM reviewers WHERE oidc_subject = ?1",
            [subject],
            reviewer_row,
        )
        .optional()?;
    // INVARIANT: a name is one reviewer's whatever its case, so `Alice` cannot stand
    // beside the password reviewer `alice` in decisions and the audit.
    let taken_by_another: Option<i64> = c
        .query_row(
            "SELECT id FROM reviewers WHERE lower(name) = lower(?1) \
             AND (oidc_subject IS NULL OR oidc_subject != ?2)",
            params![name, subject],
            |row| row.get(0),
        )
        .optional()?;
    if taken_by_another.is_some() {
        return Ok(None);
    }
    match known {
        Some(r) if r.name == name => Ok(Some(r)),
        Some(r) => {
            let renamed = c.execute(
                "UPDATE reviewers SET name = ?2 WHERE id = ?1 \
                 AND NOT EXISTS (SELECT 1 FROM reviewers WHERE name = ?2 AND id <> ?1)",
                params![r.id, name],
            )?;
            Ok((renamed == 1).then(|| Reviewer {
                name: name.to_owned(),
                ..r
            }))
        }
        None => {
            let now = Utc::now().timestamp_millis();
            let made = c
                .query_row(
                    "INSERT INTO reviewers (name, token_hash, created_at, oidc_subject) \
                     VALUES (?1, ?2, ?3, ?4) ON CONFLICT DO NOTHING RETURNING id",
                    params![name, token_hash, now, subject],
                    |r| r.get(0),
                )
                .optional()?;
            let Some(id) = made else {
                return Ok(None);
            };
            Ok(Some(Reviewer {
                id,
                name: name.to_owned(),
                created_at: super::from_ms(now),
            }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open_temp() -> (tempfile::TempDir, Db) {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = Db::open(&dir.path().join("state.db")).expect("open");
        (dir, db)
    }

    #[tokio::test]
    async fn a_subject_keeps_its_reviewer_and_follows_its_claim() {
        let (_dir, db) = open_temp();
        let first = sign_in(&db, "https://id.test alice-1", "alice@acme.test")
            .await
            .expect("made");
        let again = sign_in(&db, "https://id.test alice-1", "alice@acme.test")
            .await
            .expect("found");
        assert_eq!(first.id, again.id);
        let renamed = sign_in(&db, "https://id.test alice-1", "alice.smith@acme.test")
            .await
            .expect("renamed");
        assert_eq!(
            (renamed.id, renamed.name.as_str()),
            (first.id, "alice.smith@acme.test")
        );
        let listed = super::super::list(&db).await.expect("list");
        assert_eq!(listed.len(), 1, "{listed:?}");
    }

    #[tokio::test]
    async fn a_name_of_another_reviewer_is_never_taken() {
        let (_dir, db) = open_temp();
        super::super::add(&db, "alice")
            .await
            .expect("password reviewer");
        let err = sign_in(&db, "https://id.test mallory", "alice").await;
        assert!(matches!(err, Err(ReviewerError::DuplicateName(n)) if n == "alice"));
        sign_in(&db, "https://id.test bob-1", "bob")
            .await
            .expect("bob");
        let err = sign_in(&db, "https://id.test bob-2", "bob").await;
        assert!(matches!(err, Err(ReviewerError::DuplicateName(_))));
        // Nor by renaming: a known subject whose claim now reads another's name.
        let err = sign_in(&db, "https://id.test bob-1", "alice").await;
        assert!(matches!(err, Err(ReviewerError::DuplicateName(_))));
        // Nor in another case.
        let err = sign_in(&db, "https://id.test mallory", "Alice").await;
        assert!(matches!(err, Err(ReviewerError::DuplicateName(n)) if n == "Alice"));
        let err = sign_in(&db, "https://id.test bob-1", "ALICE").await;
        assert!(matches!(err, Err(ReviewerError::DuplicateName(_))));
        let err = sign_in(&db, "https://id.test carol", "Carol Smith").await;
        assert!(matches!(err, Err(ReviewerError::InvalidName(_))));
    }
}
