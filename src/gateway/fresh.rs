//! The first look-up of every gated call, one statement: the secrets' generation (the
//! redactor is rebuilt when it moved, so a secret stored a moment ago, by any process,
//! is already found) and the Stripe customer-change mark (other instances' forgotten
//! customer emails are forgotten here too before the scope check uses one:
//! `connectors::stripe::changes`). On Postgres it runs outside a transaction: one round
//! trip where a read transaction takes three.

use super::gate::Gate;
use crate::connectors::stripe::changes;
use crate::secrets::{GENERATION_KEY, parse_generation};

impl Gate {
    /// Brings the redactor up to date with the secret store and the remembered Stripe
    /// customer emails with the other instances' changes, from one small read (a
    /// second read only when a Stripe customer changed since the last).
    pub async fn refresh_redactor(&self) {
        let stripe = self
            .connectors
            .stripe
            .as_deref()
            .filter(|s| s.remembers_emails());
        if self.redactor_source.is_none() && stripe.is_none() {
            return;
        }
        let read = crate::store::meta::get_inline(&self.db, [GENERATION_KEY, changes::MARK_KEY]);
        let rows = match read {
            Ok(rows) => rows,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the secrets' generation");
                return;
            }
        };
        let value = |key: &str| rows.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
        if let Some(source) = &self.redactor_source {
            match parse_generation(value(GENERATION_KEY)) {
                Ok(generation) => {
                    crate::secrets::call_generation::observed(generation);
                    source.refresh_at(generation, &self.redactor).await;
                }
                Err(e) => tracing::warn!(error = %e, "cannot read the secrets' generation"),
            }
        }
        if let Some(stripe) = stripe {
            // An unreadable mark forgets everything, and is looked at again next call.
            let mark = changes::parse_mark(value(changes::MARK_KEY)).ok();
            stripe.catch_up(&self.db, mark).await;
        }
    }
}
