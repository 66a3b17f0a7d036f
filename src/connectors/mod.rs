//! Connectors: the only code that talks to the outside world on an agent's behalf.
//!
//! Each connector (Stripe, the Plain helpdesk, GitHub) holds its provider credential
//! server-side and exposes a fixed catalog of tools through the [`Connector`] trait. The
//! gateway decides a call with the policy gate first and only then calls
//! [`Connector::call`]; the agent never sees a credential.
//!
//! Every failure is classified by what it means for the call's outcome
//! ([`ConnectorError`]): a definite refusal (nothing happened), a rate limit (nothing
//! happened, try later), an unknown outcome (the request was sent and may have run), or
//! an unreachable provider (nothing was sent). The approvals code relies on this split
//! to run a call exactly once.
//!
//! No credential value ever appears in an error message or in `Debug` output: errors
//! built from provider answers are scrubbed with [`Credential::redact`].

mod args;
mod credential;
mod error;
pub mod github;
pub mod helpdesk;
mod http;
mod metered;
mod rate_limit;
pub mod stripe;

pub use args::is_plain_id;
pub use credential::{Credential, CredentialSource};
pub use error::{ConfigError, ConnectorError};
pub use github::GithubConnector;
pub use helpdesk::HelpdeskConnector;
pub use metered::{Metered, metered};
pub use rate_limit::{RateLimitRetry, retry_rate_limited};
pub use stripe::StripeConnector;

use async_trait::async_trait;

/// What a connector knows about the call it is running, besides the tool and arguments.
#[derive(Debug, Clone, Copy)]
pub struct CallContext<'a> {
    /// The gateway's execution id for this call. A provider that supports idempotency
    /// keys gets one derived from it ([`CallContext::idempotency_key`]), so running the
    /// same execution twice has the effect of running it once.
    pub execution_id: &'a str,
}

impl CallContext<'_> {
    /// The idempotency key sent to providers that support one: `threadgate-<execution id>`.
    pub fn idempotency_key(&self) -> String {
        format!("threadgate-{}", self.execution_id)
    }
}

/// One external system behind a fixed catalog of tools.
#[async_trait]
pub trait Connector: Send + Sync {
    /// The connector's name and the prefix of its tools: `"stripe"`, `"helpdesk"` or
    /// `"github"`.
    fn name(&self) -> &'static str;

    /// Runs one tool. `tool` is the full catalog name (`"stripe.create_refund"`) or the
    /// bare action (`"create_refund"`); `args` is the JSON object of arguments, already
    /// completed and decided by the gateway.
    async fn call(
        &self,
        tool: &str,
        args: &serde_json::Value,
        ctx: &CallContext<'_>,
    ) -> Result<serde_json::Value, ConnectorError>;

    /// Whether a repeated call with the same execution id is deduplicated by the
    /// provider. When it is not, a call whose outcome is unknown must never be re-sent
    /// blindly. When it is, only within [`RESEND_WITHIN_MS`] of its decision.
    fn supports_idempotency(&self) -> bool;
}

/// How long after its decision a call whose outcome was lost may still be re-sent with
/// its idempotency key: Stripe replays a key's first answer for at least 24 hours and
/// may forget it after, when the same key would run the call again. An hour short of
/// that, counted from the decision (never later than the first send), so a re-send is
/// always within the key's life; past it a person checks the provider instead.
pub const RESEND_WITHIN_MS: i64 = 23 * 60 * 60 * 1000;

/// Strips the connector prefix from a tool name: `"stripe.get_charge"` and
/// `"get_charge"` both give `"get_charge"`.
fn action_name<'t>(connector: &str, tool: &'t str) -> &'t str {
    tool.strip_prefix(connector)
        .and_then(|rest| rest.strip_prefix('.'))
        .unwrap_or(tool)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn action_name_accepts_full_and_bare_names() {
        assert_eq!(action_name("stripe", "stripe.get_charge"), "get_charge");
        assert_eq!(action_name("stripe", "get_charge"), "get_charge");
        assert_eq!(action_name("stripe", "github.get_file"), "github.get_file");
        assert_eq!(
            action_name("stripe", "stripeget_charge"),
            "stripeget_charge"
        );
    }

    #[test]
    fn idempotency_key_is_derived_from_the_execution_id() {
        let ctx = CallContext {
            execution_id: "exec-42",
        };
        assert_eq!(ctx.idempotency_key(), "threadgate-exec-42");
    }
}
