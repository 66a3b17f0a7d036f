//! The relay credentials this instance has issued: which session each token opens.
//!
//! A token is 32 random bytes, written once into the session's credential Secret and
//! known here only by its SHA-256 digest. The gateway's relay listener asks
//! [`RelayTokens::session_of`] which session a presented token belongs to: a token
//! opens exactly one session, and none after the session is stopped.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use rand::Rng as _;
use sha2::{Digest as _, Sha256};

use crate::ids::SessionId;
use crate::secrets::SecretBytes;

/// The tokens of this instance's live Kubernetes sessions, shared by the runtime (which
/// issues and revokes them) and the gateway's relay listener (which checks them).
#[derive(Debug, Clone, Default)]
pub struct RelayTokens {
    inner: Arc<Mutex<Tokens>>,
}

#[derive(Debug, Default)]
struct Tokens {
    by_digest: HashMap<[u8; 32], SessionId>,
    by_session: HashMap<SessionId, [u8; 32]>,
}

impl RelayTokens {
    /// Makes a fresh token for `session`, replacing the session's previous one.
    pub fn issue(&self, session: &SessionId) -> SecretBytes {
        let mut token = [0u8; 32];
        rand::rng().fill_bytes(&mut token);
        // Hex keeps the token printable in the Secret's file; the value never leaves it.
        let text = hex::encode(token).into_bytes();
        self.register(session, &text);
        SecretBytes::from(text)
    }

    /// Records an existing token (read back from its Secret after a restart).
    pub fn register(&self, session: &SessionId, token: &[u8]) {
        let digest: [u8; 32] = Sha256::digest(token).into();
        let mut tokens = self.lock();
        if let Some(old) = tokens.by_session.insert(session.clone(), digest) {
            tokens.by_digest.remove(&old);
        }
        tokens.by_digest.insert(digest, session.clone());
    }

    /// Forgets the session's token: it opens nothing from now on.
    pub fn revoke(&self, session: &SessionId) {
        let mut tokens = self.lock();
        if let Some(digest) = tokens.by_session.remove(session) {
            tokens.by_digest.remove(&digest);
        }
    }

    /// The session a presented token opens, if any.
    pub fn session_of(&self, token: &[u8]) -> Option<SessionId> {
        let digest: [u8; 32] = Sha256::digest(token).into();
        self.lock().by_digest.get(&digest).cloned()
    }

    /// How many sessions have a token.
    pub fn len(&self) -> usize {
        self.lock().by_session.len()
    }

    /// Whether no session has a token.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Tokens> {
        // The maps are consistent after every statement: a panic elsewhere leaves
        // nothing half-written.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
