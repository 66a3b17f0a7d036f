//! Building the connectors from the settings at start.
//!
//! Every connector whose table is valid is built, each with a live [`Credential`] that
//! reads its stored secret at each call (see [`crate::connectors::Credential`]): a secret stored or
//! replaced while the server runs is used by the next call, and a connector whose secret
//! is not stored yet answers its calls with a clear "not set" error instead of being
//! silently absent. A table that cannot give a connector (a bad base URL, an empty or
//! invalid secret name) stops the start with an error naming the key.

use std::sync::Arc;

use crate::config::Settings;
use crate::connectors::helpdesk::{EscalationRouting, LabelTypeState};
use crate::connectors::{
    ConfigError, Credential, CredentialSource, GithubConnector, HelpdeskConnector, StripeConnector,
};
use crate::gateway::Connectors;

/// A connector's table in the settings cannot give a connector.
#[derive(Debug, thiserror::Error)]
#[error("configuration key {key}: {message}")]
pub(super) struct SetupError {
    /// The offending key, e.g. `stripe.api_url`.
    pub key: String,
    /// What is wrong with it.
    pub message: String,
}

/// Builds the Stripe, Plain helpdesk and GitHub connectors, their credentials read from
/// `store`. Logs which connectors are configured and whether their secret is stored
/// (names only, never values).
pub(super) async fn build(
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
        move |e: ConfigError| SetupError {
            key: format!("{table}.api_url"),
            message: e.to_string(),
        }
    };
    let mut stripe_connector = StripeConnector::new(
        &stripe.api_url,
        credential("stripe", "key_secret", &stripe.key_secret)?,
    )
    .map_err(url_error("stripe"))?;
    if let Some(secret) = &stripe.webhook_secret {
        // Checked here so a bad name stops the start; the endpoint reads it per delivery.
        credential("stripe", "webhook_secret", secret)?;
        stripe_connector = stripe_connector.with_email_memory(stripe.email_max_age);
    }
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
    helpdesk = helpdesk.with_state_labels(plain.labels.clone());
    let plain_key_stored = matches!(store.value(&plain.api_key_secret).await, Ok(Some(_)));
    if plain_key_stored {
        check_state_labels(&helpdesk).await?;
    }
    let github_connector = GithubConnector::new(
        &github.api_url,
        credential("github", "key_secret", &github.key_secret)?,
    )
    .map_err(url_error("github"))?
    .with_repos(&github.repos);
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

/// Refuses to start when a `[plain] labels` entry names a label type Plain does not
/// know (or has archived), or cannot be checked: a wrong id is an error now, not a
/// failed label later.
async fn check_state_labels(helpdesk: &HelpdeskConnector) -> Result<(), SetupError> {
    for (key, id) in helpdesk.state_labels().configured() {
        let refused = |message: String| SetupError {
            key: format!("[plain] labels.{key}"),
            message,
        };
        match helpdesk.label_type_state(id).await {
            Ok(LabelTypeState::Usable) => {}
            Ok(LabelTypeState::Unknown) => {
                return Err(refused(format!("plain has no label type {id}")));
            }
            Ok(LabelTypeState::Archived) => {
                return Err(refused(format!("label type {id} is archived in plain")));
            }
            Err(e) => {
                return Err(refused(format!(
                    "cannot check label type {id} with plain: {e}"
                )));
            }
        }
    }
    Ok(())
}

/// Stripe's webhook endpoint (`POST /webhooks/stripe`), when `[stripe] webhook_secret`
/// names the stored signing secret: its events keep the connector's remembered customer
/// emails true. `None` when no secret is named.
pub(super) fn stripe_events(
    settings: &Settings,
    connectors: &Connectors,
    store: Arc<dyn CredentialSource>,
    clock: crate::clock::Clock,
    db: crate::store::Db,
) -> Option<axum::Router> {
    let secret = settings.stripe.webhook_secret.as_deref()?;
    let stripe = connectors.stripe.clone()?;
    Some(crate::connectors::stripe::events::router(
        crate::connectors::stripe::events::EventsState {
            stripe,
            db,
            keep: settings.stripe.email_max_age,
            secret: Credential::live(secret, store),
            clock,
            limits: settings.stripe.signature_limits,
        },
    ))
}

#[cfg(test)]
mod tests {
    use async_trait::async_trait;

    use super::*;
    use crate::secrets::SecretString;

    /// A store holding nothing.
    struct Empty;

    #[async_trait]
    impl CredentialSource for Empty {
        async fn generation(&self) -> Result<u64, String> {
            Ok(0)
        }
        async fn value(&self, _name: &str) -> Result<Option<SecretString>, String> {
            Ok(None)
        }
    }

    async fn error_of(adjust: impl FnOnce(&mut Settings)) -> String {
        let mut settings = Settings::default();
        adjust(&mut settings);
        match build(&settings, Arc::new(Empty)).await {
            Ok(_) => "built".into(),
            Err(e) => e.to_string(),
        }
    }

    #[tokio::test]
    async fn a_connector_that_cannot_be_built_names_its_key() {
        assert_eq!(error_of(|_| {}).await, "built");
        type Adjust = Box<dyn FnOnce(&mut Settings)>;
        let cases: [(&str, Adjust); 5] = [
            (
                "stripe.key_secret",
                Box::new(|s| s.stripe.key_secret.clear()),
            ),
            (
                "stripe.api_url",
                Box::new(|s| s.stripe.api_url = "localhost:8420".into()),
            ),
            (
                "github.key_secret",
                Box::new(|s| s.github.key_secret = "a b".into()),
            ),
            (
                "github.api_url",
                Box::new(|s| s.github.api_url = String::new()),
            ),
            (
                "plain.api_key_secret",
                Box::new(|s| s.plain.api_key_secret.clear()),
            ),
        ];
        for (key, adjust) in cases {
            let text = error_of(adjust).await;
            assert!(text.contains(key), "{key}: {text}");
        }
    }

    #[tokio::test]
    async fn a_connector_without_its_secret_fails_its_calls_by_name_sending_nothing() {
        let connectors = build(&Settings::default(), Arc::new(Empty))
            .await
            .expect("built");
        let stripe = connectors.for_tool("stripe.get_charge").expect("stripe");
        let ctx = crate::connectors::CallContext {
            execution_id: "ex_1",
        };
        let error = stripe
            .call(
                "stripe.get_charge",
                &serde_json::json!({"charge": "ch_1"}),
                &ctx,
            )
            .await
            .expect_err("no key");
        assert!(error.is_definite(), "{error}");
        assert!(error.to_string().contains("stripe_api_key"), "{error}");
    }
}
