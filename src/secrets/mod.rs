//! Secrets: values that never print, the master key, the encrypted store with grants to
//! agents, and the redactor that finds stored values in outgoing text.
//!
//! - [`SecretString`] / [`SecretBytes`] (from `secrecy`): `Debug` prints `[REDACTED]`, wiped on
//!   drop. Every credential in the crate travels in one of these.
//! - [`MasterKey`]: 32 bytes from a file or an environment variable (base64).
//! - [`SecretStore`]: secrets encrypted at rest (XChaCha20-Poly1305, the name bound as
//!   associated data), granted by name to agents.
//! - [`SealingKey`]: a key derived from the master key (HKDF-SHA256) for one
//!   [`SealPurpose`], sealing short-lived values handed to clients, the same on every
//!   instance with that master key.
//! - [`Redactor`]: one automaton over every stored value in its raw, base64, JSON-escaped
//!   and URL-encoded forms; finds or replaces them with `[secret:NAME]`.
//!
//! INVARIANT: no error, log line or `Debug` output of this module contains a secret
//! value or key material; names are not secret and appear in messages.

pub mod call_generation;
mod cipher;
mod key;
mod live;
mod redact;
mod sealing;
mod store;
mod value;

pub use key::{KeyError, KeySource, MASTER_KEY_LEN, MasterKey};
pub use live::RedactorSource;
pub use redact::{MIN_SECRET_LEN, Redactor};
pub use sealing::{SealPurpose, SealingKey};
pub(crate) use store::{GENERATION_KEY, parse_generation};
pub use store::{MAX_SECRET_LEN, SecretMeta, SecretStore, Written};
pub use value::{ExposeSecret, SecretBytes, SecretString, secret_bytes, secret_from_utf8};

use crate::store::StoreError;

/// The longest secret or agent name.
pub const MAX_NAME_LEN: usize = 64;

/// Errors from the secret store.
#[derive(Debug, thiserror::Error)]
pub enum SecretsError {
    /// A secret or agent name outside `[A-Za-z0-9_.-]{1,64}`.
    #[error(
        "invalid {kind} name {name:?}: use 1 to 64 characters from A-Z, a-z, 0-9, '_', '.' and '-'"
    )]
    InvalidName {
        /// `secret` or `agent`.
        kind: &'static str,
        /// The offending name.
        name: String,
    },
    /// No secret has this name.
    #[error("no secret named {name}")]
    NotFound {
        /// The name asked for.
        name: String,
    },
    /// `revoke` of a grant that does not exist.
    #[error("secret {name} is not granted to agent {agent}")]
    GrantNotFound {
        /// The secret.
        name: String,
        /// The agent.
        agent: String,
    },
    /// An agent asked for secrets that are not granted to it.
    #[error("agent {agent} asks for secrets not granted to it: {}", names.join(", "))]
    NotGranted {
        /// The agent.
        agent: String,
        /// Every name asked for without a grant, sorted.
        names: Vec<String>,
    },
    /// An empty value: it could never be recognised in output, so it is refused.
    #[error("secret {name} is empty")]
    Empty {
        /// The secret.
        name: String,
    },
    /// A value over [`MAX_SECRET_LEN`].
    #[error("secret {name} is too large ({len} bytes; the limit is {MAX_SECRET_LEN})")]
    TooLarge {
        /// The secret.
        name: String,
        /// Its length in bytes.
        len: usize,
    },
    /// Authentication of the ciphertext failed.
    #[error("cannot decrypt secret {name}: wrong master key or tampered data")]
    Decrypt {
        /// The secret.
        name: String,
    },
    /// A row written by a newer threadgate.
    #[error("secret {name} is stored with unknown scheme {scheme}; upgrade threadgate")]
    UnknownScheme {
        /// The secret.
        name: String,
        /// The stored scheme number.
        scheme: i64,
    },
    /// The automaton over the stored values could not be built (far too many or too
    /// long secrets).
    #[error("cannot build the secret scanner: {0}")]
    Scanner(String),
    /// The database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Checks a secret name (`kind` = "secret") or an agent name (`kind` = "agent").
pub fn validate_name(kind: &'static str, name: &str) -> Result<(), SecretsError> {
    let valid = (1..=MAX_NAME_LEN).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if valid {
        Ok(())
    } else {
        Err(SecretsError::InvalidName {
            kind,
            name: name.to_owned(),
        })
    }
}
