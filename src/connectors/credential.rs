//! The provider credential a connector holds: printable only as a placeholder.

use std::fmt;
use std::sync::Arc;

use base64::Engine as _;

/// What replaces a credential value in any text a connector produces.
pub const REDACTED: &str = "[redacted]";

/// A provider credential (API key or token). Its `Debug` and `Display` never show the
/// value, and it is not serializable; only the connector's HTTP layer reads it.
#[derive(Clone)]
pub struct Credential(Arc<str>);

impl Credential {
    /// Wraps a credential value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(Arc::from(value.into()))
    }

    /// The raw value, for building an `Authorization` header.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }

    /// Replaces every occurrence of the credential in `text` (raw, URL-encoded and
    /// base64-encoded) with [`REDACTED`].
    pub fn redact(&self, text: &str) -> String {
        if self.0.is_empty() {
            return text.to_owned();
        }
        let mut out = text.replace(&*self.0, REDACTED);
        let encoded: Vec<String> = vec![
            url_encode(&self.0),
            base64::engine::general_purpose::STANDARD.encode(self.0.as_bytes()),
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(self.0.as_bytes()),
        ];
        for form in encoded {
            if form != *self.0 {
                out = out.replace(&form, REDACTED);
            }
        }
        out
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

/// Percent-encodes every byte outside RFC 3986's unreserved set, as URL and form
/// encoders do.
fn url_encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
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
