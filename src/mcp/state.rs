//! The `requestState` of a held call answered as an input request (URL-mode
//! elicitation): sealed with XChaCha20-Poly1305 under a key drawn at process start,
//! bound to the session (associated data), the execution and its binding hash, a
//! digest of the call as the client sent it, and the approval's expiry; and good once.
//!
//! Redeemed states are remembered per session until they expire, each session with its
//! own slots (`[mcp] max_redeemed_per_session`): a session that fills its own is
//! refused, never another session.
//!
//! The key lives only in memory, so a restart turns every outstanding state into a
//! forgery: single use then holds across restarts without a table, and a client that
//! is refused still has `threadgate_wait`.

use std::collections::HashMap;
use std::sync::Mutex;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chacha20poly1305::aead::{Aead as _, Payload};
use chacha20poly1305::{Key, KeyInit as _, XChaCha20Poly1305, XNonce};
use rand::Rng as _;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use zeroize::Zeroizing;

/// Domain separation of the associated data.
const AAD_PREFIX: &[u8] = b"threadgate mcp request state v1\0";
const NONCE_LEN: usize = 24;
/// The longest sealed state accepted (a real one is about 300 characters).
const MAX_SEALED_LEN: usize = 2048;
/// How often every session's expired redemptions are forgotten (a session that no
/// longer redeems keeps none past this after they expire).
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
}

/// Seals and opens request states; remembers the redeemed ones, per session.
pub struct StateSealer {
    key: Zeroizing<[u8; 32]>,
    /// How many redeemed states one session keeps until they expire.
    max_per_session: usize,
    redeemed: Mutex<Redeemed>,
}

/// The redeemed states not yet expired.
#[derive(Default)]
struct Redeemed {
    /// session id → nonce → expiry (unix ms).
    by_session: HashMap<String, HashMap<String, i64>>,
    /// When every session's expired entries were last forgotten (unix ms).
    swept_at_ms: i64,
}

impl Redeemed {
    /// Forgets what expired in every session, at most once per [`SWEEP_EVERY_MS`].
    fn sweep(&mut self, now_ms: i64) {
        if now_ms - self.swept_at_ms < SWEEP_EVERY_MS {
            return;
        }
        self.swept_at_ms = now_ms;
        self.by_session.retain(|_, states| {
            states.retain(|_, expiry| *expiry > now_ms);
            !states.is_empty()
        });
    }
}

impl StateSealer {
    /// A sealer with a fresh random key, keeping at most `max_per_session` redeemed
    /// states per session.
    pub fn new(max_per_session: usize) -> StateSealer {
        let mut key = Zeroizing::new([0u8; 32]);
        rand::rng().fill_bytes(key.as_mut());
        StateSealer {
            key,
            max_per_session,
            redeemed: Mutex::new(Redeemed::default()),
        }
    }

    /// The sealed form of `state` for `session_id`.
    pub fn seal(&self, session_id: &str, state: &HeldState) -> String {
        let mut nonce = [0u8; NONCE_LEN];
        rand::rng().fill_bytes(&mut nonce);
        // Serialising a struct of strings and integers cannot fail.
        let plain = serde_json::to_vec(state).unwrap_or_default();
        let aad = associated_data(session_id);
        let sealed = self
            .cipher()
            .encrypt(
                &XNonce::from(nonce),
                Payload {
                    msg: &plain,
                    aad: &aad,
                },
            )
            // Encryption fails only beyond 256 GiB.
            .unwrap_or_default();
        let mut out = nonce.to_vec();
        out.extend_from_slice(&sealed);
        URL_SAFE_NO_PAD.encode(out)
    }

    /// Opens `sealed` for `session_id`, checks it against the call (`request_digest`)
    /// and the clock, and marks it redeemed. The answer is the state; any failure
    /// leaves nothing marked.
    pub fn redeem(
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
        let mut redeemed = self.redeemed.lock().unwrap_or_else(|p| p.into_inner());
        redeemed.sweep(now_ms);
        // INVARIANT: states are bound to their session (associated data), so a nonce is
        // only ever looked up among its own session's.
        let session = redeemed
            .by_session
            .entry(session_id.to_owned())
            .or_default();
        session.retain(|_, expiry| *expiry > now_ms);
        if session.contains_key(&state.nonce) {
            return Err(StateError::Replayed);
        }
        if session.len() >= self.max_per_session {
            return Err(StateError::Full(self.max_per_session));
        }
        session.insert(state.nonce.clone(), state.expires_at_ms);
        Ok(state)
    }

    fn open(&self, session_id: &str, sealed: &str) -> Result<HeldState, StateError> {
        if sealed.len() > MAX_SEALED_LEN {
            return Err(StateError::Forged);
        }
        let bytes = URL_SAFE_NO_PAD
            .decode(sealed)
            .map_err(|_| StateError::Forged)?;
        if bytes.len() <= NONCE_LEN {
            return Err(StateError::Forged);
        }
        let (nonce, ciphertext) = bytes.split_at(NONCE_LEN);
        let nonce = <&XNonce>::try_from(nonce).map_err(|_| StateError::Forged)?;
        let aad = associated_data(session_id);
        let plain = self
            .cipher()
            .decrypt(
                nonce,
                Payload {
                    msg: ciphertext,
                    aad: &aad,
                },
            )
            .map_err(|_| StateError::Forged)?;
        serde_json::from_slice(&plain).map_err(|_| StateError::Forged)
    }

    fn cipher(&self) -> XChaCha20Poly1305 {
        let key: &Key = (&*self.key).into();
        XChaCha20Poly1305::new(key)
    }
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

    #[test]
    fn a_sealed_state_opens_once_for_its_session_and_call() {
        let s = StateSealer::new(CAP);
        let st = state(2_000);
        let sealed = s.seal("se_a", &st);
        assert_eq!(
            s.redeem("se_b", &sealed, &st.request_digest, 1_000),
            Err(StateError::Forged),
            "another session"
        );
        assert_eq!(
            s.redeem("se_a", &sealed, "other digest", 1_000),
            Err(StateError::Mismatch)
        );
        assert_eq!(
            s.redeem("se_a", &sealed, &st.request_digest, 1_000),
            Ok(st.clone())
        );
        assert_eq!(
            s.redeem("se_a", &sealed, &st.request_digest, 1_001),
            Err(StateError::Replayed)
        );
    }

    #[test]
    fn expired_tampered_and_foreign_states_are_refused() {
        let s = StateSealer::new(CAP);
        let st = state(2_000);
        let sealed = s.seal("se_a", &st);
        assert_eq!(
            s.redeem("se_a", &sealed, &st.request_digest, 2_000),
            Err(StateError::Expired)
        );
        let mut bytes = URL_SAFE_NO_PAD.decode(&sealed).expect("b64");
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        let tampered = URL_SAFE_NO_PAD.encode(bytes);
        assert_eq!(
            s.redeem("se_a", &tampered, &st.request_digest, 1_000),
            Err(StateError::Forged)
        );
        let other = StateSealer::new(CAP).seal("se_a", &st);
        assert_eq!(
            s.redeem("se_a", &other, &st.request_digest, 1_000),
            Err(StateError::Forged),
            "sealed under another key (a restart)"
        );
        for junk in ["", "x", "!!!!", &"A".repeat(MAX_SEALED_LEN + 1)] {
            assert_eq!(
                s.redeem("se_a", junk, &st.request_digest, 1_000),
                Err(StateError::Forged)
            );
        }
    }

    #[test]
    fn redemptions_are_capped_until_states_expire() {
        let s = StateSealer::new(CAP);
        for _ in 0..CAP {
            let st = state(5_000);
            let sealed = s.seal("se_a", &st);
            s.redeem("se_a", &sealed, &st.request_digest, 1_000)
                .expect("under the cap");
        }
        let st = state(9_000);
        let sealed = s.seal("se_a", &st);
        let full = s.redeem("se_a", &sealed, &st.request_digest, 1_000);
        assert_eq!(full, Err(StateError::Full(CAP)));
        let said = full.expect_err("full").to_string();
        assert!(
            said.contains("[mcp] max_redeemed_per_session (50)"),
            "the refusal names the limit: {said}"
        );
        // Once the earlier ones expire, the same state is good (it was not marked).
        assert_eq!(s.redeem("se_a", &sealed, &st.request_digest, 5_000), Ok(st));
    }

    /// Issue 17, item 8: one session filling its own slots does not refuse another
    /// session's genuine state (the slots were shared by all sessions).
    #[test]
    fn a_session_that_fills_its_slots_refuses_only_itself() {
        let s = StateSealer::new(CAP);
        let mut refused = 0;
        for _ in 0..CAP * 3 {
            let st = state(5_000);
            let sealed = s.seal("se_greedy", &st);
            if s.redeem("se_greedy", &sealed, &st.request_digest, 1_000)
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
                s.redeem(other, &sealed, &st.request_digest, 1_000),
                Ok(st),
                "{other}'s genuine state"
            );
        }
    }

    #[test]
    fn expired_redemptions_of_every_session_are_forgotten() {
        let s = StateSealer::new(CAP);
        for session in ["se_a", "se_b"] {
            let st = state(5_000);
            let sealed = s.seal(session, &st);
            s.redeem(session, &sealed, &st.request_digest, 1_000)
                .expect("redeemed");
        }
        let st = state(SWEEP_EVERY_MS * 3);
        let sealed = s.seal("se_c", &st);
        s.redeem("se_c", &sealed, &st.request_digest, SWEEP_EVERY_MS * 2)
            .expect("redeemed");
        let redeemed = s.redeemed.lock().expect("lock");
        let sessions: Vec<&String> = redeemed.by_session.keys().collect();
        assert_eq!(sessions, vec!["se_c"], "the expired sessions are gone");
    }
}
