//! Scope checks on reads and on GitHub calls, before the policy decides anything.
//!
//! A session reads only its own customer's objects. The thread's customer is the Plain
//! customer of the session (its email, from the signed webhook); a Stripe object belongs
//! to it when the object's Stripe customer has that email (the same mapping the write
//! path uses in `complete`). A read of another customer's object, or of an object whose
//! owner cannot be shown (no customer on it, no email on the thread, no Stripe
//! connector), is refused with `out_of_scope` before anything runs, and the result of a
//! read that ran is checked again ([`check_result`]) so a list never carries another
//! customer's rows.
//!
//! GitHub tools reach only the repositories in the config (`[github] repos`); a call
//! naming another repository, or a search query with its own `repo:`/`org:`/`user:`
//! qualifier, is refused the same way.

use serde_json::{Map, Value};

use crate::connectors::{ConnectorError, GithubConnector, StripeConnector};
use crate::session::SessionScope;

/// Why a call was refused before the policy.
#[derive(Debug, thiserror::Error)]
pub(super) enum ScopeError {
    /// The call reaches outside the thread's customer or the configured repositories.
    #[error("{0}")]
    OutOfScope(String),
    /// A fact needed to check ownership could not be looked up.
    #[error("cannot look up {what}: {source}")]
    Lookup {
        /// What was looked up.
        what: String,
        /// Why it failed.
        #[source]
        source: ConnectorError,
    },
}

fn out(message: String) -> ScopeError {
    ScopeError::OutOfScope(message)
}

/// Checks a Stripe read against the thread's customer, and fills in `customer` (the
/// object's owner) so the result can be checked after it runs.
pub(super) async fn check_stripe_read(
    tool: &str,
    args: &mut Map<String, Value>,
    scope: &SessionScope,
    stripe: Option<&StripeConnector>,
) -> Result<(), ScopeError> {
    let Some(stripe) = stripe else {
        return Err(out(format!(
            "{tool}: the stripe connector is not configured, so ownership cannot be checked"
        )));
    };
    let text = |key: &str| {
        args.get(key)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let (object, owner) = match tool {
        "stripe.get_customer" | "stripe.list_charges" | "stripe.list_invoices" => {
            let customer = text("customer");
            (format!("customer {customer}"), Some(customer))
        }
        "stripe.get_charge" => {
            let charge = text("charge");
            let customer =
                stripe
                    .charge_customer(&charge)
                    .await
                    .map_err(|source| ScopeError::Lookup {
                        what: format!("charge {charge}"),
                        source,
                    })?;
            (format!("charge {charge}"), customer)
        }
        // INVARIANT: a Stripe read the scope check does not know is refused, so a tool
        // added to the catalog without a rule here never reads unchecked.
        _ => {
            return Err(out(format!(
                "{tool}: no ownership check is defined for this read"
            )));
        }
    };
    let Some(owner) = owner.filter(|c| !c.is_empty()) else {
        return Err(out(format!(
            "{object} has no customer, so it cannot be shown to belong to this thread's customer"
        )));
    };
    let Some(expected) = scope.customer_email.as_deref() else {
        return Err(out(format!(
            "{tool}: this thread has no known customer email to check ownership against"
        )));
    };
    let email = stripe
        .known_customer_email(&owner)
        .await
        .map_err(|source| ScopeError::Lookup {
            what: format!("customer {owner}"),
            source,
        })?;
    match email {
        Some(email) if email.eq_ignore_ascii_case(expected) => {
            if tool == "stripe.get_charge" {
                args.insert("customer".into(), Value::String(owner));
            }
            Ok(())
        }
        _ => Err(out(format!(
            "{tool}: {object} does not belong to this thread's customer"
        ))),
    }
}

/// Checks what a Stripe read returned: every customer-owned object in it belongs to
/// `args.customer` (the owner checked before the call). Returns the refusal message.
fn check_stripe_result(tool: &str, args: &Value, result: &Value) -> Result<(), String> {
    let Some(expected) = args["customer"].as_str() else {
        return Err(format!("{tool}: the call has no checked customer"));
    };
    let owner = |object: &Value| -> Option<String> {
        match &object["customer"] {
            Value::String(id) => Some(id.clone()),
            Value::Object(map) => map.get("id").and_then(Value::as_str).map(str::to_owned),
            _ => None,
        }
    };
    let foreign = |what: &str| {
        Err(format!(
            "{tool}: the answer holds {what} of another customer"
        ))
    };
    match tool {
        "stripe.get_customer" => {
            if result["id"].as_str() != Some(expected) {
                return foreign("a customer");
            }
        }
        "stripe.get_charge" => {
            if owner(result).as_deref() != Some(expected) {
                return foreign("a charge");
            }
        }
        "stripe.list_charges" | "stripe.list_invoices" => {
            let Some(rows) = result["data"].as_array() else {
                return Err(format!("{tool}: the answer has no list of rows"));
            };
            if rows
                .iter()
                .any(|row| owner(row).as_deref() != Some(expected))
            {
                return foreign("rows");
            }
        }
        _ => return Err(format!("{tool}: no result check is defined for this read")),
    }
    Ok(())
}

/// Checks that a GitHub call names only configured repositories; a search without a
/// `repo` is left to the connector, which limits it to the configured ones.
pub(super) fn check_github(
    tool: &str,
    args: &Map<String, Value>,
    github: Option<&GithubConnector>,
) -> Result<(), ScopeError> {
    let Some(github) = github else {
        return Err(out(format!(
            "{tool}: the github connector is not configured"
        )));
    };
    if let Some(repo) = args.get("repo").and_then(Value::as_str)
        && !github.allows_repo(repo)
    {
        return Err(out(format!(
            "{tool}: repository {repo} is not one of the configured repositories"
        )));
    }
    if let Some(query) = args.get("query").and_then(Value::as_str)
        && let Some(qualifier) = crate::connectors::github::scope_qualifier(query)
    {
        return Err(out(format!(
            "{tool}: the query names its own `{qualifier}` qualifier; use the `repo` argument"
        )));
    }
    if github.repos().is_empty() {
        return Err(out(format!("{tool}: no github repository is configured")));
    }
    Ok(())
}

/// The Stripe reads whose answers are checked after they run.
const STRIPE_READS: &[&str] = &[
    "stripe.get_customer",
    "stripe.get_charge",
    "stripe.list_charges",
    "stripe.list_invoices",
];

/// Checks the answer of a call that ran; `Err` carries the refusal message and the
/// answer must then be dropped.
pub(super) fn check_result(tool: &str, args: &Value, result: &Value) -> Result<(), String> {
    if STRIPE_READS.contains(&tool) {
        return check_stripe_result(tool, args, result);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_list_with_another_customers_row_is_refused() {
        let args = json!({"customer": "cus_ada"});
        let own = json!({"data": [{"customer": "cus_ada"}, {"customer": {"id": "cus_ada"}}]});
        assert!(check_result("stripe.list_charges", &args, &own).is_ok());
        let mixed = json!({"data": [{"customer": "cus_ada"}, {"customer": "cus_bob"}]});
        assert!(check_result("stripe.list_charges", &args, &mixed).is_err());
        let ownerless = json!({"data": [{"id": "in_1"}]});
        assert!(check_result("stripe.list_invoices", &args, &ownerless).is_err());
        assert!(check_result("stripe.list_invoices", &args, &json!({})).is_err());
    }

    #[test]
    fn single_objects_must_be_the_checked_customers() {
        let args = json!({"customer": "cus_ada"});
        assert!(check_result("stripe.get_customer", &args, &json!({"id": "cus_ada"})).is_ok());
        assert!(check_result("stripe.get_customer", &args, &json!({"id": "cus_bob"})).is_err());
        let charge = json!({"id": "ch_1", "customer": "cus_bob"});
        assert!(check_result("stripe.get_charge", &args, &charge).is_err());
        // A read without the checked customer fails closed; other tools pass.
        assert!(check_result("stripe.get_charge", &json!({}), &charge).is_err());
        assert!(check_result("helpdesk.get_thread", &json!({}), &charge).is_ok());
    }
}
