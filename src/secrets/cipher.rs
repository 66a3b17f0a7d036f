//! Sealing one secret value: XChaCha20-Poly1305 under the master key, a fresh random
//! 192-bit nonce per write, and the secret's name in the associated data so that a
//! ciphertext moved to another name's row fails to open.

use super::value::secret_from_utf8;
use crate::secrets::ExposeSecret as _;
use chacha20poly1305::aead::{Aead as _, Payload};
use chacha20poly1305::{Key, KeyInit as _, XChaCha20Poly1305, XNonce};
use rand::Rng as _;

use super::{MasterKey, SecretString, SecretsError};

/// The layout stored in `secrets.scheme`: XChaCha20-Poly1305, AAD = [`AAD_PREFIX`] ||
/// name. A new layout gets a new number; rows keep theirs until rewritten.
pub(crate) const SCHEME_XCHACHA_V1: i64 = 1;

/// Domain separation for the associated data.
const AAD_PREFIX: &[u8] = b"threadgate secret v1\0";

/// The nonce length of XChaCha20-Poly1305.
const NONCE_LEN: usize = 24;

/// A sealed value as stored.
pub(crate) struct Sealed {
    pub nonce: [u8; NONCE_LEN],
    pub ciphertext: Vec<u8>,
}

/// Encrypts `value` for the secret `name`.
pub(crate) fn seal(
    key: &MasterKey,
    name: &str,
    value: &SecretString,
) -> Result<Sealed, SecretsError> {
    let mut nonce = [0u8; NONCE_LEN];
    rand::rng().fill_bytes(&mut nonce);
    let aad = associated_data(name);
    let ciphertext = cipher(key)
        .encrypt(
            &XNonce::from(nonce),
            Payload {
                msg: value.expose_secret().as_bytes(),
                aad: &aad,
            },
        )
        // Only inputs beyond 256 GiB fail; the store caps values far below that.
        .map_err(|_| SecretsError::TooLarge {
            name: name.to_owned(),
            len: value.expose_secret().len(),
        })?;
    Ok(Sealed { nonce, ciphertext })
}

/// Decrypts the stored row of the secret `name`.
pub(crate) fn open(
    key: &MasterKey,
    name: &str,
    scheme: i64,
    nonce: &[u8],
    ciphertext: &[u8],
) -> Result<SecretString, SecretsError> {
    let undecryptable = || SecretsError::Decrypt {
        name: name.to_owned(),
    };
    if scheme != SCHEME_XCHACHA_V1 {
        return Err(SecretsError::UnknownScheme {
            name: name.to_owned(),
            scheme,
        });
    }
    let nonce = <&XNonce>::try_from(nonce).map_err(|_| undecryptable())?;
    let aad = associated_data(name);
    let plaintext = cipher(key)
        .decrypt(
            nonce,
            Payload {
                msg: ciphertext,
                aad: &aad,
            },
        )
        .map_err(|_| undecryptable())?;
    secret_from_utf8(plaintext).ok_or_else(undecryptable)
}

fn cipher(key: &MasterKey) -> XChaCha20Poly1305 {
    let key: &Key = key.bytes().into();
    XChaCha20Poly1305::new(key)
}

fn associated_data(name: &str) -> Vec<u8> {
    let mut aad = Vec::with_capacity(AAD_PREFIX.len() + name.len());
    aad.extend_from_slice(AAD_PREFIX);
    aad.extend_from_slice(name.as_bytes());
    aad
}
