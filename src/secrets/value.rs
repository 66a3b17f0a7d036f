//! Secret values: `secrecy`'s types, which never print and are wiped on drop.
//!
//! `Debug` shows `[REDACTED]`, there is no `Display`, no `Serialize` and no `PartialEq`
//! (a plain comparison is not constant-time). Read a value with
//! [`ExposeSecret::expose_secret`], at the last moment and as briefly as possible.
//! Settings files can hold a secret directly (`Deserialize`); it is never written back.

use zeroize::Zeroize;

pub use secrecy::{ExposeSecret, SecretString};

/// Secret bytes (key material), with the same guarantees as [`SecretString`].
pub type SecretBytes = secrecy::SecretSlice<u8>;

/// A secret from bytes that must be UTF-8; on failure the bytes are wiped and `None` is
/// returned.
pub fn secret_from_utf8(bytes: Vec<u8>) -> Option<SecretString> {
    match String::from_utf8(bytes) {
        Ok(value) => Some(SecretString::from(value)),
        Err(err) => {
            err.into_bytes().zeroize();
            None
        }
    }
}

/// Secret bytes copied from `value` (a literal, a slice or a vector).
pub fn secret_bytes(value: impl Into<Vec<u8>>) -> SecretBytes {
    SecretBytes::from(value.into())
}
