//! Building the connectors from the settings at start.
//!
//! Every connector whose table is valid is built, each with a live [`Credential`] that
//! reads its stored secret at each call (see [`super::credential`]): a secret stored or
//! replaced while the server runs is used by the next call, and a connector whose secret
//! is not stored yet answers its calls with a clear "not set" error instead of being
//! silently absent. A table that cannot give a connector (a bad base URL, an empty or
//! invalid secret name) stops the start with an error naming the key.

use std::sync::Arc;

use super::helpdesk::EscalationRouting;
use super::{Credential, CredentialSource, GithubConnector, HelpdeskConnector, StripeConnector};
use crate::config::Settings;
use crate::gateway::Connectors;

/// A connector's table in the settings cannot give a connector.
#[derive(Debug, thiserror::Error)]
#[error("configuration key {key}: {message}")]
pub struct SetupError {
    /// The offending key, e.g. `stripe.api_url`.
    pub key: String,
    /// What is wrong with it.
    pub message: String,
}

/// Builds the Stripe, Plain helpdesk and GitHub connectors, their credentials read from
/// `store`. Logs which connectors are configured and whether their secret is stored
/// (names only, never values).
pub async fn build(
    settings: &Settings,
    store: Arc<dyn CredentialSource>,
) -> Result<Connectors, SetupError> {
    let stripe = &settings.stripe;
    let plain = &settings.plain;
    let github = &settings.github;
    let credential = |table: &str, field: &str, secret: &str| -> Result<Credential, SetupError> {
        crate::secrets::validate_name("secret", secret).map_err(|e| SetupError {
            key: format!("{table}.{field}"),
            message: e.to_string(),
        })?;
        Ok(Credential::live(secret, store.clone()))
    };
    let url_error = |table: &'static str| {
        move |e: super::ConfigError| SetupError {
            key: format!("{table}.api_url"),
            message: e.to_string(),
        }
    };
    let stripe_connector = StripeConnector::new(
        &stripe.api_url,
        credential("stripe", "key_secret", &stripe.key_secret)?,
    )
    .map_err(url_error("stripe"))?;
    let mut helpdesk = HelpdeskConnector::new(
        &plain.api_url,
        credential("plain", "api_key_secret", &plain.api_key_secret)?,
    )
    .map_err(url_error("plain"))?;
    if let Some(label) = &plain.escalation_label_type_id {
        helpdesk = helpdesk.with_escalation(EscalationRouting {
            label_type_ids: vec![label.clone()],
            assign_to_user_id: None,
            use_escalation_path: false,
        });
    }
    let github_connector = GithubConnector::new(
        &github.api_url,
        credential("github", "key_secret", &github.key_secret)?,
    )
    .map_err(url_error("github"))?;
    for (name, secret) in [
        ("stripe", &stripe.key_secret),
        ("helpdesk", &plain.api_key_secret),
        ("github", &github.key_secret),
    ] {
        let stored = matches!(store.value(secret).await, Ok(Some(_)));
        if stored {
            tracing::info!(connector = name, secret = %secret, "connector configured");
        } else {
            tracing::warn!(
                connector = name,
                secret = %secret,
                "connector configured, but its secret is not stored yet: its calls fail \
                 until `threadgate secrets set {secret}`",
            );
        }
    }
    Ok(Connectors {
        stripe: Some(Arc::new(stripe_connector)),
        helpdesk: Some(Arc::new(helpdesk)),
        github: Some(Arc::new(github_connector)),
    })
}
