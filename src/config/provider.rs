//! `[stripe]` and `[github]`: two REST providers read into one [`ProviderSettings`],
//! each key left out taking that provider's default (never an empty string), and each
//! provider's own keys refused in the other's table.

use std::time::Duration;

use serde::ser::SerializeStruct as _;
use serde::{Deserialize, Deserializer, Serializer};

use crate::connectors::stripe::events::SignatureLimits;
use crate::session::publish::OnDone;

/// A REST provider: where it is and which stored secret holds its credential. Read
/// from TOML through this module, so each key left out takes the provider's default
/// (never an empty string).
#[derive(Debug, Clone, Default)]
pub struct ProviderSettings {
    /// The API's base URL.
    pub api_url: String,
    /// The name of the stored secret holding the credential.
    pub key_secret: String,
    /// GitHub only: the repositories (`owner/name`) the github tools may reach, and
    /// where a session's draft pull request is opened (the first). Empty: none.
    pub repos: Vec<String>,
    /// Stripe only: the name of the stored secret holding the signing secret of Stripe's
    /// webhook endpoint (`POST /webhooks/stripe`, events `customer.updated` and
    /// `customer.deleted`). When set, the read path's scope check remembers customer
    /// emails (those events forget them); unset, it asks Stripe on every read.
    pub webhook_secret: Option<String>,
    /// Stripe only: how long a remembered customer email is used at most, in case an
    /// event is lost (`15m` by default).
    pub email_max_age: Duration,
    /// Stripe only: the longest `Stripe-Signature` header and the most entries in it
    /// that `POST /webhooks/stripe` reads (`webhook_max_signature_bytes`, 1024, and
    /// `webhook_max_signature_entries`, 8); a longer one is refused before any MAC.
    pub signature_limits: SignatureLimits,
    /// GitHub only: what becomes of a session's pull request when its thread is done
    /// (`draft`, the default: left as it is; `ready`: marked ready for review; `close`).
    pub on_done: OnDone,
}

/// How long a remembered Stripe customer email is used at most.
const DEFAULT_EMAIL_MAX_AGE: Duration = Duration::from_secs(15 * 60);

/// `[stripe]` when the file has no such table.
pub(super) fn default_stripe() -> ProviderSettings {
    ProviderSettings {
        api_url: "https://api.stripe.com".into(),
        key_secret: "stripe_api_key".into(),
        repos: Vec::new(),
        webhook_secret: None,
        email_max_age: DEFAULT_EMAIL_MAX_AGE,
        signature_limits: Default::default(),
        on_done: Default::default(),
    }
}

/// `[github]` when the file has no such table.
pub(super) fn default_github() -> ProviderSettings {
    ProviderSettings {
        api_url: "https://api.github.com".into(),
        key_secret: "github_token".into(),
        ..default_stripe()
    }
}

/// Every key either table accepts, each optional.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Partial {
    api_url: Option<String>,
    key_secret: Option<String>,
    repos: Option<Vec<String>>,
    webhook_secret: Option<String>,
    #[serde(default, with = "humantime_serde::option")]
    email_max_age: Option<Duration>,
    webhook_max_signature_bytes: Option<usize>,
    webhook_max_signature_entries: Option<usize>,
    on_done: Option<OnDone>,
}

impl Partial {
    /// Refuses a key of the other provider, naming the table it belongs in.
    fn check_keys(&self, stripe: bool) -> Result<(), &'static str> {
        let stripe_only = self.webhook_secret.is_some()
            || self.email_max_age.is_some()
            || self.webhook_max_signature_bytes.is_some()
            || self.webhook_max_signature_entries.is_some();
        if stripe_only && !stripe {
            return Err(
                "webhook_secret, email_max_age and webhook_max_signature_* belong in [stripe], not [github]",
            );
        }
        if (self.on_done.is_some() || self.repos.is_some()) && stripe {
            return Err("on_done and repos belong in [github], not [stripe]");
        }
        Ok(())
    }
}

fn merge<'de, D: Deserializer<'de>>(
    d: D,
    defaults: ProviderSettings,
    stripe: bool,
) -> Result<ProviderSettings, D::Error> {
    let partial = Partial::deserialize(d)?;
    partial
        .check_keys(stripe)
        .map_err(serde::de::Error::custom)?;
    let limits = defaults.signature_limits;
    let signature_limits = SignatureLimits {
        max_bytes: partial
            .webhook_max_signature_bytes
            .unwrap_or(limits.max_bytes),
        max_entries: partial
            .webhook_max_signature_entries
            .unwrap_or(limits.max_entries),
    };
    Ok(ProviderSettings {
        api_url: partial.api_url.unwrap_or(defaults.api_url),
        key_secret: partial.key_secret.unwrap_or(defaults.key_secret),
        repos: partial.repos.unwrap_or(defaults.repos),
        webhook_secret: partial.webhook_secret.or(defaults.webhook_secret),
        email_max_age: partial.email_max_age.unwrap_or(defaults.email_max_age),
        signature_limits,
        on_done: partial.on_done.unwrap_or(defaults.on_done),
    })
}

/// Reads `[stripe]`.
pub(super) fn stripe<'de, D: Deserializer<'de>>(d: D) -> Result<ProviderSettings, D::Error> {
    merge(d, default_stripe(), true)
}

/// Reads `[github]`.
pub(super) fn github<'de, D: Deserializer<'de>>(d: D) -> Result<ProviderSettings, D::Error> {
    merge(d, default_github(), false)
}

/// Writes `[stripe]` with exactly the keys it accepts (the list of settable keys is
/// read from the defaults written this way).
pub(super) fn serialize_stripe<S: Serializer>(
    p: &ProviderSettings,
    s: S,
) -> Result<S::Ok, S::Error> {
    let mut table = s.serialize_struct("stripe", 6)?;
    table.serialize_field("api_url", &p.api_url)?;
    table.serialize_field("key_secret", &p.key_secret)?;
    table.serialize_field("webhook_secret", &p.webhook_secret)?;
    let age = humantime_serde::Serde::from(p.email_max_age);
    table.serialize_field("email_max_age", &age)?;
    let limits = p.signature_limits;
    table.serialize_field("webhook_max_signature_bytes", &limits.max_bytes)?;
    table.serialize_field("webhook_max_signature_entries", &limits.max_entries)?;
    table.end()
}

/// Writes `[github]` with exactly the keys it accepts.
pub(super) fn serialize_github<S: Serializer>(
    p: &ProviderSettings,
    s: S,
) -> Result<S::Ok, S::Error> {
    let mut table = s.serialize_struct("github", 4)?;
    table.serialize_field("api_url", &p.api_url)?;
    table.serialize_field("key_secret", &p.key_secret)?;
    table.serialize_field("repos", &p.repos)?;
    table.serialize_field("on_done", p.on_done.as_str())?;
    table.end()
}
