//! Sign-ins sent to the provider and not yet back (`oidc_logins`): the state, nonce and
//! PKCE verifier of each, bound to the browser that started it, used once, expiring
//! after [`TTL_MS`], and capped overall and per client address, so a flood of started
//! sign-ins neither grows the table without end nor crowds out other addresses.

use crate::store::{Conn, OptionalExtension as _, params};
use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq as _;

use crate::store::{Db, StoreError};

/// A sign-in must come back from the provider within this long.
pub const TTL_MS: i64 = 10 * 60 * 1000;

/// A sign-in about to be sent to the provider.
#[derive(Debug, Clone)]
pub struct Started {
    /// The `state` sent to the provider (stored as its digest).
    pub state: String,
    /// The browser's cookie value (stored as its digest).
    pub browser: String,
    /// The client address's throttle key.
    pub client: String,
    pub nonce: String,
    pub pkce_verifier: String,
    /// Where to go once signed in.
    pub next: String,
}

/// What a sign-in that came back carries.
#[derive(Debug, Clone)]
pub struct Returned {
    pub nonce: String,
    pub pkce_verifier: String,
    pub next: String,
}

/// Why a sign-in was not stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    /// `max_pending` sign-ins are in progress.
    Everywhere,
    /// `max_pending_per_address` from this client address.
    FromAddress,
}

/// Why a returning sign-in was not accepted (the row is gone either way).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Stale {
    #[error("this sign-in is unknown or was already used")]
    Unknown,
    #[error("this sign-in took longer than ten minutes")]
    Expired,
    #[error("this sign-in was started in another browser")]
    OtherBrowser,
}

/// The caps of [`start`].
#[derive(Debug, Clone, Copy)]
pub struct Caps {
    pub max_pending: usize,
    pub max_pending_per_address: usize,
}

fn digest(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

/// Stores `login` at `now` unless a cap is reached; expired sign-ins go first.
pub async fn start(
    db: &Db,
    login: Started,
    caps: Caps,
    now: i64,
) -> Result<Result<(), Full>, StoreError> {
    db.write(move |c| insert(c, &login, caps, now)).await
}

fn insert(
    c: &Conn<'_>,
    login: &Started,
    caps: Caps,
    now: i64,
) -> crate::store::Result<Result<(), Full>> {
    c.execute(
        "DELETE FROM oidc_logins WHERE created_at_ms <= ?1",
        [now - TTL_MS],
    )?;
    let count = |sql: &str, p: &[&dyn crate::store::ToSql]| -> crate::store::Result<usize> {
        c.query_row(sql, p, |r| r.get::<_, i64>(0))
            .map(|n| usize::try_from(n).unwrap_or(usize::MAX))
    };
    if count("SELECT count(*) FROM oidc_logins", &[])? >= caps.max_pending {
        return Ok(Err(Full::Everywhere));
    }
    let mine = count(
        "SELECT count(*) FROM oidc_logins WHERE client = ?1",
        &[&login.client],
    )?;
    if mine >= caps.max_pending_per_address {
        return Ok(Err(Full::FromAddress));
    }
    c.execute(
        "INSERT INTO oidc_logins (state_digest, browser_digest, client, nonce, pkce_verifier, \
         next, created_at_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        params![
            digest(&login.state),
            digest(&login.browser),
            login.client,
            login.nonce,
            login.pkce_verifier,
            login.next,
            now
        ],
    )?;
    Ok(Ok(()))
}

/// Takes the sign-in whose state is `state` (once: it is deleted whatever follows), if
/// the browser presenting it is the one that started it (`browser`, its cookie) and it
/// is younger than [`TTL_MS`] at `now`.
pub async fn take(
    db: &Db,
    state: &str,
    browser: &str,
    now: i64,
) -> Result<Result<Returned, Stale>, StoreError> {
    let (state, browser) = (digest(state), digest(browser));
    db.write(move |c| {
        let row = c
            .query_row(
                "DELETE FROM oidc_logins WHERE state_digest = ?1 \
                 RETURNING browser_digest, nonce, pkce_verifier, next, created_at_ms",
                [&state],
                |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        Returned {
                            nonce: r.get(1)?,
                            pkce_verifier: r.get(2)?,
                            next: r.get(3)?,
                        },
                        r.get::<_, i64>(4)?,
                    ))
                },
            )
            .optional()?;
        let Some((bound_to, returned, created)) = row else {
            return Ok(Err(Stale::Unknown));
        };
        if !bool::from(bound_to.as_bytes().ct_eq(browser.as_bytes())) {
            return Ok(Err(Stale::OtherBrowser));
        }
        if now - created >= TTL_MS {
            return Ok(Err(Stale::Expired));
        }
        Ok(Ok(returned))
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open_temp() -> (tempfile::TempDir, Db) {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = Db::open(&dir.path().join("state.db")).expect("open");
        (dir, db)
    }

    fn login(n: usize, client: &str) -> Started {
        Started {
            state: format!("state-{n}-{client}"),
            browser: format!("browser-{n}"),
            client: client.into(),
            nonce: format!("nonce-{n}"),
            pkce_verifier: format!("verifier-{n}"),
            next: "/approvals".into(),
        }
    }

    const CAPS: Caps = Caps {
        max_pending: 6,
        max_pending_per_address: 3,
    };

    async fn rows(db: &Db) -> i64 {
        db.read(|c| c.query_row("SELECT count(*) FROM oidc_logins", (), |r| r.get(0)))
            .await
            .expect("count")
    }

    #[tokio::test]
    async fn a_sign_in_is_taken_once_by_its_own_browser_before_it_expires() {
        let (_dir, db) = open_temp();
        start(&db, login(1, "addr:a"), CAPS, 1_000)
            .await
            .expect("db")
            .expect("stored");
        let back = take(&db, "state-1-addr:a", "browser-1", 2_000)
            .await
            .expect("db");
        assert_eq!(back.expect("taken").nonce, "nonce-1");
        // Replayed: gone.
        let again = take(&db, "state-1-addr:a", "browser-1", 2_000)
            .await
            .expect("db");
        assert_eq!(again.err(), Some(Stale::Unknown));
        // Forged: never stored.
        let forged = take(&db, "state-made-up", "browser-1", 2_000)
            .await
            .expect("db");
        assert_eq!(forged.err(), Some(Stale::Unknown));

        // Another browser's state is refused, and used up.
        start(&db, login(2, "addr:a"), CAPS, 1_000)
            .await
            .expect("db")
            .expect("stored");
        let other = take(&db, "state-2-addr:a", "browser-1", 2_000)
            .await
            .expect("db");
        assert_eq!(other.err(), Some(Stale::OtherBrowser));
        let own = take(&db, "state-2-addr:a", "browser-2", 2_000)
            .await
            .expect("db");
        assert_eq!(own.err(), Some(Stale::Unknown));

        // Late.
        start(&db, login(3, "addr:a"), CAPS, 1_000)
            .await
            .expect("db")
            .expect("stored");
        let late = take(&db, "state-3-addr:a", "browser-3", 1_000 + TTL_MS).await;
        assert_eq!(late.expect("db").err(), Some(Stale::Expired));
        assert_eq!(rows(&db).await, 0);
    }

    #[tokio::test]
    async fn a_flood_of_started_sign_ins_is_capped_per_address_and_overall() {
        let (_dir, db) = open_temp();
        for n in 0..3 {
            start(&db, login(n, "addr:flood"), CAPS, 1_000)
                .await
                .expect("db")
                .expect("stored");
        }
        let refused = start(&db, login(3, "addr:flood"), CAPS, 1_000)
            .await
            .expect("db");
        assert_eq!(refused, Err(Full::FromAddress));
        // Other addresses still get in, up to the overall cap.
        for (n, client) in ["addr:b", "addr:c", "addr:d"].iter().enumerate() {
            start(&db, login(n, client), CAPS, 1_000)
                .await
                .expect("db")
                .expect("stored");
        }
        let full = start(&db, login(9, "addr:e"), CAPS, 1_000)
            .await
            .expect("db");
        assert_eq!(full, Err(Full::Everywhere));
        assert_eq!(rows(&db).await, 6);
        // Once they expire, they make room (and are deleted).
        let later = 1_000 + TTL_MS;
        start(&db, login(9, "addr:e"), CAPS, later)
            .await
            .expect("db")
            .expect("stored");
        assert_eq!(rows(&db).await, 1);
    }
}
