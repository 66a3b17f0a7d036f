//! How a connector call can fail, classified by what it means for the call's outcome.

use std::time::Duration;

/// Why a connector call did not return a result.
///
/// The variants say whether anything may have happened at the provider:
/// [`Rejected`](Self::Rejected), [`RateLimited`](Self::RateLimited),
/// [`Unreachable`](Self::Unreachable) and [`InvalidArgs`](Self::InvalidArgs) are
/// definite (nothing happened); [`Unknown`](Self::Unknown) means the request was sent
/// and may or may not have run. Messages never contain a credential value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnectorError {
    /// The provider refused the call; nothing happened.
    #[error("provider refused the call (status {status}{}): {message}", code_suffix(.code))]
    Rejected {
        /// The HTTP status of the refusal (a GraphQL error answered with HTTP 200 keeps 200).
        status: u16,
        /// The provider's error code (Stripe `code`, falling back to its `type`; Plain
        /// `extensions.code` or `MutationError.code`; GitHub's first `errors[].code`).
        code: Option<String>,
        /// The provider's explanation.
        message: String,
    },
    /// The provider is rate limiting: nothing happened, try again after `retry_after`.
    #[error("provider is rate limiting; retry after {} ms", .retry_after.as_millis())]
    RateLimited {
        /// How long to wait before the next attempt.
        retry_after: Duration,
    },
    /// The request was sent but its outcome is unknown (timeout, connection lost after
    /// sending, 5xx, unreadable answer).
    #[error("outcome unknown: {message}")]
    Unknown {
        /// What went wrong.
        message: String,
    },
    /// The provider could not be reached; nothing was sent (connection refused, DNS).
    #[error("provider unreachable, nothing was sent: {message}")]
    Unreachable {
        /// What went wrong.
        message: String,
    },
    /// The arguments do not fit the tool; nothing was sent.
    #[error("invalid arguments: {message}")]
    InvalidArgs {
        /// Which argument is wrong and why.
        message: String,
    },
}

impl ConnectorError {
    /// True when the call certainly did not happen at the provider, so a reservation
    /// made for it can be released.
    pub fn is_definite(&self) -> bool {
        !matches!(self, Self::Unknown { .. })
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::InvalidArgs {
            message: message.into(),
        }
    }

    pub(crate) fn unknown(message: impl Into<String>) -> Self {
        Self::Unknown {
            message: message.into(),
        }
    }
}

fn code_suffix(code: &Option<String>) -> String {
    code.as_deref()
        .map(|code| format!(", code {code}"))
        .unwrap_or_default()
}

/// A connector could not be built from its configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The base URL is not an absolute `http` or `https` URL.
    #[error("invalid base url `{url}`: {reason}")]
    InvalidBaseUrl {
        /// The URL as given.
        url: String,
        /// Why it was refused.
        reason: String,
    },
    /// The HTTP client could not be built.
    #[error("cannot build the http client: {0}")]
    Client(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_unknown_is_indefinite() {
        let unknown = ConnectorError::unknown("timeout");
        let rejected = ConnectorError::Rejected {
            status: 400,
            code: Some("amount_too_large".into()),
            message: "too much".into(),
        };
        assert!(!unknown.is_definite());
        assert!(rejected.is_definite());
        assert!(ConnectorError::invalid("x").is_definite());
        assert_eq!(
            rejected.to_string(),
            "provider refused the call (status 400, code amount_too_large): too much"
        );
    }
}
