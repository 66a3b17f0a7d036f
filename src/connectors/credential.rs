//! The provider credential a connector holds: printable only as a placeholder.
//!
//! A credential is either fixed ([`Credential::new`]) or live ([`Credential::live`]):
//! a live one reads its stored secret through a [`CredentialSource`] and keeps it in a
//! small cache, invalidated by the source's generation counter, which every write to the
//! store bumps. Each request asks [`Credential::resolve`] first (one cheap read of the
//! counter), so a key changed with `threadgate secrets set` is used by the next call,
//! without a restart.

use crate::secrets::{ExposeSecret as _, SecretString};
use std::fmt;
use std::sync::{Arc, RwLock};

use async_trait::async_trait;
use base64::Engine as _;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

use super::ConnectorError;

/// What replaces a credential value in any text a connector produces.
pub(super) const REDACTED: &str = "[redacted]";

/// Where a live credential's value comes from (the secret store).
#[async_trait]
pub trait CredentialSource: Send + Sync {
    /// A number that changes whenever any stored value may have changed.
    async fn generation(&self) -> Result<u64, String>;
    /// The stored value of `name`, or `None` when no such secret is stored.
    async fn value(&self, name: &str) -> Result<Option<crate::secrets::SecretString>, String>;
}

/// A provider credential (API key or token). Its `Debug` and `Display` never show the
/// value, and it is not serializable; only the connector's HTTP layer reads it. Clones
/// share one cache.
#[derive(Clone)]
pub struct Credential(Arc<Inner>);

struct Inner {
    /// The stored secret's name, for a live credential.
    secret: Option<String>,
    source: Option<Arc<dyn CredentialSource>>,
    /// The generation the cached value was read at (`None`: never read) and the value
    /// (empty when the secret is not stored).
    cache: RwLock<(Option<u64>, Arc<SecretString>)>,
}

impl Credential {
    /// Wraps a fixed credential value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(Arc::new(Inner {
            secret: None,
            source: None,
            cache: RwLock::new((Some(0), Arc::new(SecretString::from(value.into())))),
        }))
    }

    /// A credential read from the stored secret `secret` of `source` at each use, cached
    /// until the source's generation changes.
    pub fn live(secret: &str, source: Arc<dyn CredentialSource>) -> Self {
        Self(Arc::new(Inner {
            secret: Some(secret.to_owned()),
            source: Some(source),
            cache: RwLock::new((None, Arc::new(SecretString::default()))),
        }))
    }

    /// The current value, refreshed from the source when its generation moved. Fails
    /// (before anything is sent) when no value is stored or the store cannot be read.
    pub(crate) async fn resolve(&self) -> Result<Arc<SecretString>, ConnectorError> {
        if let Some(source) = &self.0.source {
            let unreachable = |message: String| ConnectorError::Unreachable { message };
            let generation = source.generation().await.map_err(|e| {
                unreachable(format!("cannot read the credential's generation: {e}"))
            })?;
            if self.cached().0 != Some(generation) {
                let name = self.0.secret.as_deref().unwrap_or_default();
                let value = source
                    .value(name)
                    .await
                    .map_err(|e| unreachable(format!("cannot read stored secret {name}: {e}")))?;
                let value = Arc::new(value.unwrap_or_default());
                *self.0.cache.write().unwrap_or_else(|p| p.into_inner()) =
                    (Some(generation), value);
            }
        }
        let value = self.current();
        if value.expose_secret().is_empty() {
            let name = self.0.secret.as_deref().unwrap_or("the credential");
            return Err(ConnectorError::Unreachable {
                message: format!(
                    "no credential: stored secret {name} is not set (threadgate secrets set {name})"
                ),
            });
        }
        Ok(value)
    }

    /// The last value read (empty before the first [`Credential::resolve`] of a live
    /// credential, or when the secret is not stored).
    pub(crate) fn current(&self) -> Arc<SecretString> {
        self.cached().1
    }

    fn cached(&self) -> (Option<u64>, Arc<SecretString>) {
        self.0
            .cache
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Replaces every occurrence of the credential in `text` (raw, URL-encoded and
    /// base64-encoded) with [`REDACTED`].
    pub fn redact(&self, text: &str) -> String {
        let current = self.current();
        let current = current.expose_secret();
        if current.is_empty() {
            return text.to_owned();
        }
        let mut out = text.replace(current, REDACTED);
        let encoded: Vec<String> = vec![
            url_encode(current),
            base64::engine::general_purpose::STANDARD.encode(current.as_bytes()),
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(current.as_bytes()),
        ];
        for form in encoded {
            if form != *current {
                out = out.replace(&form, REDACTED);
            }
        }
        out
    }
}

#[async_trait]
impl CredentialSource for crate::secrets::SecretStore {
    async fn generation(&self) -> Result<u64, String> {
        // Read once per gated call, at its start (`secrets::call_generation`).
        if let Some(generation) = crate::secrets::call_generation::seen() {
            return Ok(generation);
        }
        crate::secrets::SecretStore::generation(self)
            .await
            .map_err(|e| e.to_string())
    }

    async fn value(&self, name: &str) -> Result<Option<crate::secrets::SecretString>, String> {
        match self.get(name).await {
            Ok(value) => Ok(Some(value)),
            Err(crate::secrets::SecretsError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e.to_string()),
        }
    }
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Credential([redacted])")
    }
}

impl fmt::Display for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

/// Every byte outside RFC 3986's unreserved set (`A-Z a-z 0-9 - . _ ~`): what URL and
/// form encoders escape.
const NOT_UNRESERVED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Percent-encodes `value` as URL and form encoders do.
fn url_encode(value: &str) -> String {
    utf8_percent_encode(value, NOT_UNRESERVED).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_and_display_hide_the_value() {
        let key = Credential::new("sk_test_supersecret");
        assert!(!format!("{key:?}").contains("supersecret"));
        assert!(!format!("{key}").contains("supersecret"));
    }

    #[test]
    fn redact_removes_raw_url_and_base64_forms() {
        let key = Credential::new("sk_test_a/b+c");
        let b64 = base64::engine::general_purpose::STANDARD.encode("sk_test_a/b+c");
        let text = format!("raw sk_test_a/b+c, url sk_test_a%2Fb%2Bc, b64 {b64}");
        let out = key.redact(&text);
        assert!(!out.contains("sk_test_a/b+c"));
        assert!(!out.contains("sk_test_a%2Fb%2Bc"));
        assert!(!out.contains(&b64));
        assert_eq!(out.matches(REDACTED).count(), 3);
    }
}
