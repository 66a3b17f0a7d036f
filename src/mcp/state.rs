//! The `requestState` of a held call answered as an input request (URL-mode
//! elicitation): sealed with XChaCha20-Poly1305 under a key derived from the master key
//! ([`crate::secrets::SealPurpose::McpRequestState`]), bound to the session (associated data), the
//! execution and its binding hash, a digest of the call as the client sent it, and the
//! approval's expiry; and good once.
//!
//! Every instance with the same master key derives the same key, so a state sealed on
//! one instance opens on any other. Redeemed states are remembered in the database
//! (`mcp_redeemed_states`, keyed by a digest of the session and the state's random
//! nonce) until they expire, so a state redeemed on one instance is refused on every
//! other: the insert is `ON CONFLICT DO NOTHING`, and a conflict means already redeemed.
//! Each session has its own slots (`[mcp] max_redeemed_per_session`, a count of its
//! unexpired rows): a session that fills its own is refused, never another session.

use std::sync::atomic::{AtomicI64, Ordering};

use crate::store::{Conn, OptionalExtension as _, params};
use rand::Rng as _;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::secrets::SealingKey;
use crate::store::Db;

/// Domain separation of the associated data.
const AAD_PREFIX: &[u8] = b"threadgate mcp request state v1\0";
/// The longest sealed state accepted (a real one is about 300 characters).
const MAX_SEALED_LEN: usize = 2048;
/// How often one instance forgets every session's expired redemptions (a session that
/// no longer redeems keeps none past this after they expire; a redeeming session's own
/// expired rows go at each redemption).
const SWEEP_EVERY_MS: i64 = 60_000;

/// What a sealed state carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldState {
    /// The held execution.
    pub execution_id: String,
    /// The execution's binding hash (tool, canonical arguments, account, session).
    pub binding_hash: String,
    /// SHA-256 of the call as the client sent it (tool name and arguments).
    pub request_digest: String,
    /// Unix ms after which the state is void (the approval's expiry).
    pub expires_at_ms: i64,
    /// Random, so that each state is redeemed once.
    pub nonce: String,
}

/// Why a state was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum StateError {
    #[error("the request state is not one this server issued to this session")]
    Forged,
    #[error("the request state has expired")]
    Expired,
    #[error("the request state was already used")]
    Replayed,
    #[error("the request state does not match this call")]
    Mismatch,
    #[error(
        "this session has {0} redeemed request states not yet expired, the most \
         [mcp] max_redeemed_per_session ({0}) allows; use threadgate_wait"
    )]
    Full(usize),
    /// The database could not record the redemption (logged with its cause; the state
    /// is not marked, so the client may try again).
    #[error("internal error")]
    Store,
}

/// Seals and opens request states; remembers the redeemed ones in the database.
pub struct StateSealer {
    key: SealingKey,
    db: Db,
    /// How many redeemed states one session keeps until they expire.
    max_per_session: usize,
    /// When this instance last forgot every session's expired redemptions (unix ms).
    swept_at_ms: AtomicI64,
}

impl StateSealer {
    /// A sealer under `key` (derive it with
    /// [`crate::secrets::SealPurpose::McpRequestState`]),
    /// remembering redeemed states in `db`, at most `max_per_session` per session.
    pub fn new(key: SealingKey, db: Db, max_per_session: usize) -> StateSealer {
        StateSealer {
            key,
            db,
            max_per_session,
            swept_at_ms: AtomicI64::new(0),
        }
    }

    /// The sealed form of `state` for `session_id`.
    pub fn seal(&self, session_id: &str, state: &HeldState) -> String {
        // Serialising a struct of strings and integers cannot fail.
        let plain = serde_json::to_vec(state).unwrap_or_default();
        self.key.seal(&associated_data(session_id), &plain)
    }

    /// Opens `sealed` for `session_id`, checks it against the call (`request_digest`)
    /// and the clock, and marks it redeemed (for every instance sharing the database).
    /// The answer is the state; any failure leaves nothing marked.
    pub async fn redeem(
        &self,
        session_id: &str,
        sealed: &str,
        request_digest: &str,
        now_ms: i64,
    ) -> Result<HeldState, StateError> {
        let state = self.open(session_id, sealed)?;
        if state.expires_at_ms <= now_ms {
            return Err(StateError::Expired);
        }
        if state.request_digest != request_digest {
            return Err(StateError::Mismatch);
        }
        let redemption = Redemption {
            // INVARIANT: states are bound to their session (associated data), and the
            // digest covers the session too, so a row is only ever one session's.
            state_digest: state_digest(session_id, &state.nonce),
            session_id: session_id.to_owned(),
            expires_at_ms: state.expires_at_ms,
        };
        let cap = self.max_per_session;
        let sweep_all = self.sweep_due(now_ms);
        let recorded = self
            .db
            .write(move |c| redemption.record(c, now_ms, cap, sweep_all))
            .await;
        match recorded {
            Ok(Ok(())) => Ok(state),
            Ok(Err(refused)) => Err(refused),
            Err(e) => {
                tracing::error!(error = %e, "cannot record a redeemed request state");
                Err(StateError::Store)
            }
        }
    }

    /// Whether this redemption also forgets every session's expired rows (at most once
    /// per [`SWEEP_EVERY_MS`] on this instance).
    fn sweep_due(&self, now_ms: i64) -> bool {
        let last = self.swept_at_ms.load(Ordering::Relaxed);
        now_ms - last >= SWEEP_EVERY_MS
            && self
                .swept_at_ms
                .compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    fn open(&self, session_id: &str, sealed: &str) -> Result<HeldState, StateError> {
        let plain = self
            .key
            .open(&associated_data(session_id), sealed, MAX_SEALED_LEN)
            .ok_or(StateError::Forged)?;
        serde_json::from_slice(&plain).map_err(|_| StateError::Forged)
    }
}

/// One redemption to record.
struct Redemption {
    state_digest: String,
    session_id: String,
    expires_at_ms: i64,
}

impl Redemption {
    /// Records the redemption unless the state was redeemed before or its session's
    /// slots are full; the session's expired rows (every session's, with `sweep_all`)
    /// are forgotten first. Portable SQL: `?N` parameters, `ON CONFLICT DO NOTHING`.
    fn record(
        &self,
        c: &Conn<'_>,
        now_ms: i64,
        cap: usize,
        sweep_all: bool,
    ) -> crate::store::Result<Result<(), StateError>> {
        if sweep_all {
            c.execute(
                "DELETE FROM mcp_redeemed_states WHERE expires_at_ms <= ?1",
                [now_ms],
            )?;
        } else {
            c.execute(
                "DELETE FROM mcp_redeemed_states WHERE session_id = ?1 AND expires_at_ms <= ?2",
                params![self.session_id, now_ms],
            )?;
        }
        let seen = c
            .query_row(
                "SELECT 1 FROM mcp_redeemed_states WHERE state_digest = ?1",
                [&self.state_digest],
                |r| r.get::<_, i64>(0),
            )
            .optional()?;
        if seen.is_some() {
            return Ok(Err(StateError::Replayed));
        }
        let held: i64 = c.query_row(
            "SELECT count(*) FROM mcp_redeemed_states WHERE session_id = ?1 AND expires_at_ms > ?2",
            params![self.session_id, now_ms],
            |r| r.get(0),
        )?;
        if usize::try_from(held).unwrap_or(usize::MAX) >= cap {
            return Ok(Err(StateError::Full(cap)));
        }
        let inserted = c.execute(
            "INSERT INTO mcp_redeemed_states (state_digest, session_id, expires_at_ms) \
             VALUES (?1, ?2, ?3) ON CONFLICT (state_digest) DO NOTHING",
            params![self.state_digest, self.session_id, self.expires_at_ms],
        )?;
        // Another writer (an instance on a shared server database) got there first.
        if inserted == 0 {
            return Ok(Err(StateError::Replayed));
        }
        Ok(Ok(()))
    }
}

/// The key a redeemed state is remembered by: SHA-256 (hex) of its session and nonce.
fn state_digest(session_id: &str, nonce: &str) -> String {
    let mut h = Sha256::new();
    h.update(session_id.as_bytes());
    h.update([0]);
    h.update(nonce.as_bytes());
    hex::encode(h.finalize())
}

/// A fresh random nonce for a state, as text.
pub fn fresh_nonce() -> String {
    let mut bytes = [0u8; 16];
    rand::rng().fill_bytes(&mut bytes);
    hex::encode(bytes)
}

/// SHA-256 (hex) of a call as the client sent it: the tool name and the canonical
/// JSON of its arguments (keys sorted, as `serde_json` keeps them).
pub fn request_digest(tool: &str, args: &serde_json::Value) -> String {
    let mut h = Sha256::new();
    h.update(tool.as_bytes());
    h.update([0]);
    h.update(args.to_string().as_bytes());
    hex::encode(h.finalize())
}

fn associated_data(session_id: &str) -> Vec<u8> {
    let mut aad = AAD_PREFIX.to_vec();
    aad.extend_from_slice(session_id.as_bytes());
    aad
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secrets::{KeySource, MasterKey, SealPurpose};
    use base64::Engine as _;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;

    /// The per-session cap of the tests' sealers.
    const CAP: usize = 50;

    fn state(expires_at_ms: i64) -> HeldState {
        HeldState {
            execution_id: "ex_1".into(),
            binding_hash: "bh".into(),
            request_digest: request_digest(
                "stripe.create_refund",
                &serde_json::json!({"charge": "ch_1"}),
            ),
            expires_at_ms,
            nonce: fresh_nonce(),
        }
    }

    fn master() -> MasterKey {
        let text = base64::engine::general_purpose::STANDARD.encode([42u8; 32]);
        MasterKey::from_base64(&text, KeySource::Env("TEST".into())).expect("key")
    }

    /// A database in a temporary directory, and a sealer over it under the test master
    /// key.
    fn sealer() -> (tempfile::TempDir, StateSealer) {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = Db::open(&dir.path().join("state.db")).expect("open");
        let key = SealingKey::derive(&master(), SealPurpose::McpRequestState);
        (dir, StateSealer::new(key, db, CAP))
    }

    async fn rows(s: &StateSealer) -> Vec<String> {
        s.db.read(|c| {
            let mut q = c.prepare("SELECT session_id FROM mcp_redeemed_states ORDER BY 1")?;
            q.query_map((), |r| r.get(0))?.collect()
        })
        .await
        .expect("rows")
    }

    #[tokio::test]
    async fn a_sealed_state_opens_once_for_its_session_and_call() {
        let (_dir, s) = sealer();
        let st = state(2_000);
        let sealed = s.seal("se_a", &st);
        assert_eq!(
            s.redeem("se_b", &sealed, &st.request_digest, 1_000).await,
            Err(StateError::Forged),
            "another session"
        );
        assert_eq!(
            s.redeem("se_a", &sealed, "other digest", 1_000).await,
            Err(StateError::Mismatch)
        );
        assert_eq!(
            s.redeem("se_a", &sealed, &st.request_digest, 1_000).await,
            Ok(st.clone())
        );
        assert_eq!(
            s.redeem("se_a", &sealed, &st.request_digest, 1_001).await,
            Err(StateError::Replayed)
        );
    }

    /// Issue 19: a state sealed on one instance opens on another with the same master
    /// key, and once redeemed there it is refused everywhere (two sealers, two handles
    /// on one database file, as two processes would have).
    #[tokio::test]
    async fn a_state_sealed_on_one_instance_redeems_once_on_any() {
        let (dir, a) = sealer();
        let db_b = Db::open(&dir.path().join("state.db")).expect("a second handle");
        let b = StateSealer::new(
            SealingKey::derive(&master(), SealPurpose::McpRequestState),
            db_b,
            CAP,
        );
        let st = state(2_000);
        let sealed = a.seal("se_a", &st);
        assert_eq!(
            b.redeem("se_a", &sealed, &st.request_digest, 1_000).await,
            Ok(st.clone()),
            "sealed on a, redeemed on b"
        );
        assert_eq!(
            a.redeem("se_a", &sealed, &st.request_digest, 1_000).await,
            Err(StateError::Replayed),
            "redeemed on b, refused on a"
        );
        // The OpenID cookie's key, from the same master key, does not open it.
        let oidc = StateSealer::new(
            SealingKey::derive(&master(), SealPurpose::OidcSignIn),
            a.db.clone(),
            CAP,
        );
        let other = state(2_000);
        let sealed = a.seal("se_a", &other);
        assert_eq!(
            oidc.redeem("se_a", &sealed, &other.request_digest, 1_000)
                .await,
            Err(StateError::Forged)
        );
    }

    #[tokio::test]
    async fn expired_tampered_and_foreign_states_are_refused() {
        let (_dir, s) = sealer();
        let st = state(2_000);
        let sealed = s.seal("se_a", &st);
        assert_eq!(
            s.redeem("se_a", &sealed, &st.request_digest, 2_000).await,
            Err(StateError::Expired)
        );
        let mut bytes = URL_SAFE_NO_PAD.decode(&sealed).expect("b64");
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        let tampered = URL_SAFE_NO_PAD.encode(bytes);
        assert_eq!(
            s.redeem("se_a", &tampered, &st.request_digest, 1_000).await,
            Err(StateError::Forged)
        );
        let foreign = StateSealer::new(SealingKey::random(), s.db.clone(), CAP);
        let other = foreign.seal("se_a", &st);
        assert_eq!(
            s.redeem("se_a", &other, &st.request_digest, 1_000).await,
            Err(StateError::Forged),
            "sealed under another master key"
        );
        for junk in ["", "x", "!!!!", &"A".repeat(MAX_SEALED_LEN + 1)] {
            assert_eq!(
                s.redeem("se_a", junk, &st.request_digest, 1_000).await,
                Err(StateError::Forged)
            );
        }
        assert!(rows(&s).await.is_empty(), "nothing refused was marked");
    }

    #[tokio::test]
    async fn redemptions_are_capped_until_states_expire() {
        let (_dir, s) = sealer();
        for _ in 0..CAP {
            let st = state(5_000);
            let sealed = s.seal("se_a", &st);
            s.redeem("se_a", &sealed, &st.request_digest, 1_000)
                .await
                .expect("under the cap");
        }
        let st = state(9_000);
        let sealed = s.seal("se_a", &st);
        let full = s.redeem("se_a", &sealed, &st.request_digest, 1_000).await;
        assert_eq!(full, Err(StateError::Full(CAP)));
        let said = full.expect_err("full").to_string();
        assert!(
            said.contains("[mcp] max_redeemed_per_session (50)"),
            "the refusal names the limit: {said}"
        );
        // Once the earlier ones expire, the same state is good (it was not marked).
        assert_eq!(
            s.redeem("se_a", &sealed, &st.request_digest, 5_000).await,
            Ok(st)
        );
        assert_eq!(rows(&s).await.len(), 1, "the expired rows are gone");
    }

    /// Issue 17, item 8: one session filling its own slots does not refuse another
    /// session's genuine state (the slots were shared by all sessions).
    #[tokio::test]
    async fn a_session_that_fills_its_slots_refuses_only_itself() {
        let (_dir, s) = sealer();
        let mut refused = 0;
        for _ in 0..CAP * 3 {
            let st = state(5_000);
            let sealed = s.seal("se_greedy", &st);
            if s.redeem("se_greedy", &sealed, &st.request_digest, 1_000)
                .await
                == Err(StateError::Full(CAP))
            {
                refused += 1;
            }
        }
        assert_eq!(
            refused,
            CAP * 2,
            "the greedy session is held to its own slots"
        );
        for other in ["se_b", "se_c"] {
            let st = state(5_000);
            let sealed = s.seal(other, &st);
            assert_eq!(
                s.redeem(other, &sealed, &st.request_digest, 1_000).await,
                Ok(st),
                "{other}'s genuine state"
            );
        }
    }

    #[tokio::test]
    async fn expired_redemptions_of_every_session_are_forgotten() {
        let (_dir, s) = sealer();
        for session in ["se_a", "se_b"] {
            let st = state(SWEEP_EVERY_MS + 5_000);
            let sealed = s.seal(session, &st);
            s.redeem(session, &sealed, &st.request_digest, SWEEP_EVERY_MS)
                .await
                .expect("redeemed");
        }
        let st = state(SWEEP_EVERY_MS * 4);
        let sealed = s.seal("se_c", &st);
        s.redeem("se_c", &sealed, &st.request_digest, SWEEP_EVERY_MS * 3)
            .await
            .expect("redeemed");
        assert_eq!(
            rows(&s).await,
            vec!["se_c"],
            "the expired sessions are gone"
        );
    }
}
