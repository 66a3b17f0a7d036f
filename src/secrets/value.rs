//! A string that holds a secret: it never prints, and its memory is wiped on drop.

use std::fmt;

use zeroize::Zeroize;

/// A secret value (an API key, a password, a credential).
///
/// `Debug` and `Display` print `[redacted]`, and there is deliberately no `PartialEq`
/// (a plain comparison is not constant-time) and no `Serialize`; the bytes are overwritten with zeros when
/// the value is dropped. Read it with [`SecretString::expose`], at the last moment and
/// as briefly as possible.
#[derive(Clone, Default)]
pub struct SecretString(String);

impl SecretString {
    /// Wraps a value; the `String`'s buffer is taken over, not copied.
    pub fn new(value: String) -> SecretString {
        SecretString(value)
    }

    /// The secret itself.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The length of the value in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the value is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Builds a value from bytes that must be UTF-8; on failure the bytes are wiped and
    /// `None` is returned.
    pub fn from_utf8(bytes: Vec<u8>) -> Option<SecretString> {
        match String::from_utf8(bytes) {
            Ok(value) => Some(SecretString(value)),
            Err(err) => {
                err.into_bytes().zeroize();
                None
            }
        }
    }
}

impl From<String> for SecretString {
    fn from(value: String) -> SecretString {
        SecretString(value)
    }
}

/// Settings files can hold a secret directly; it is never serialized back.
impl<'de> serde::Deserialize<'de> for SecretString {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(SecretString)
    }
}

impl From<&str> for SecretString {
    fn from(value: &str) -> SecretString {
        SecretString(value.to_owned())
    }
}

impl Drop for SecretString {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

impl fmt::Debug for SecretString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

impl fmt::Display for SecretString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

/// Secret bytes (key material), with the same guarantees as [`SecretString`].
#[derive(Clone, Default)]
pub struct SecretBytes(Vec<u8>);

impl SecretBytes {
    /// Wraps bytes; the buffer is taken over, not copied.
    pub fn new(value: impl Into<Vec<u8>>) -> SecretBytes {
        SecretBytes(value.into())
    }

    /// The secret itself.
    pub fn expose(&self) -> &[u8] {
        &self.0
    }

    /// The length in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl From<Vec<u8>> for SecretBytes {
    fn from(value: Vec<u8>) -> SecretBytes {
        SecretBytes(value)
    }
}

impl Drop for SecretBytes {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

impl fmt::Debug for SecretBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

impl fmt::Display for SecretBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}
