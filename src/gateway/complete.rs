//! Completing a call's arguments before it is decided and hashed: the thread it is
//! scoped to, and for Stripe writes the facts the policy needs (the charge's customer
//! and currency, the full remaining amount of a refund without one) and whether the
//! object belongs to the thread's customer.

use serde_json::{Map, Value};

use crate::connectors::{ConnectorError, StripeConnector};
use crate::session::SessionScope;

/// Why completing a call failed; the agent gets this as a 4xx or 502.
#[derive(Debug, thiserror::Error)]
pub enum CompleteError {
    #[error("{tool} is scoped to thread {scoped}; it cannot act on thread {asked}")]
    OutOfScope {
        tool: String,
        scoped: String,
        asked: String,
    },
    #[error("cannot look up {what}: {source}")]
    Lookup {
        what: String,
        #[source]
        source: ConnectorError,
    },
}

/// What completion learnt that the decision must take into account.
#[derive(Debug, Default)]
pub struct Completion {
    /// Set when the call touches an object that is not (or cannot be shown to be) the
    /// thread's customer's: the call is held whatever the policy says.
    pub forced_hold: Option<String>,
}

/// Fills in scope and provider facts in `args` (an object) for `tool`.
pub async fn complete(
    tool: &str,
    args: &mut Map<String, Value>,
    scope: &SessionScope,
    takes_thread: bool,
    is_write: bool,
    stripe: Option<&StripeConnector>,
) -> Result<Completion, CompleteError> {
    if takes_thread {
        if let Some(asked) = args.get("thread_id").and_then(Value::as_str)
            && asked != scope.thread_id
        {
            return Err(CompleteError::OutOfScope {
                tool: tool.to_owned(),
                scoped: scope.thread_id.clone(),
                asked: asked.to_owned(),
            });
        }
        args.insert("thread_id".into(), Value::String(scope.thread_id.clone()));
    }
    let Some(action) = tool.strip_prefix("stripe.") else {
        return Ok(Completion::default());
    };
    if !is_write {
        return Ok(Completion::default());
    }
    let Some(stripe) = stripe else {
        return Ok(Completion {
            forced_hold: Some(
                "the stripe connector is not configured, so ownership cannot be checked".into(),
            ),
        });
    };
    let owner = match action {
        "create_refund" => complete_refund(args, stripe).await?,
        "update_subscription" | "cancel_subscription" => {
            let sub = str_arg(args, "subscription");
            let customer = stripe
                .subscription_customer(&sub)
                .await
                .map_err(|source| lookup(format!("subscription {sub}"), source))?;
            if let Some(c) = &customer {
                args.insert("customer".into(), Value::String(c.clone()));
            }
            (format!("subscription {sub}"), customer)
        }
        _ => {
            let customer = args
                .get("customer")
                .and_then(Value::as_str)
                .map(str::to_owned);
            (
                format!("customer {}", customer.as_deref().unwrap_or("?")),
                customer,
            )
        }
    };
    let forced_hold = check_owner(&owner.0, owner.1.as_deref(), scope, stripe).await?;
    Ok(Completion { forced_hold })
}

fn str_arg(args: &Map<String, Value>, key: &str) -> String {
    args.get(key)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

fn lookup(what: String, source: ConnectorError) -> CompleteError {
    CompleteError::Lookup { what, source }
}

/// Adds the charge's customer and currency, and the full remaining amount when the
/// refund names none.
async fn complete_refund(
    args: &mut Map<String, Value>,
    stripe: &StripeConnector,
) -> Result<(String, Option<String>), CompleteError> {
    let charge = str_arg(args, "charge");
    let facts = stripe
        .charge_facts(&charge)
        .await
        .map_err(|source| lookup(format!("charge {charge}"), source))?;
    if let Some(c) = &facts.customer {
        args.insert("customer".into(), Value::String(c.clone()));
    } else {
        args.remove("customer");
    }
    args.insert(
        "currency".into(),
        Value::String(facts.currency.to_lowercase()),
    );
    if !args.contains_key("amount") {
        let remaining = facts.amount.saturating_sub(facts.amount_refunded);
        args.insert("amount".into(), Value::from(remaining));
    }
    Ok((format!("charge {charge}"), facts.customer))
}

/// Says why the call must be held when the object's customer is not the thread's.
async fn check_owner(
    object: &str,
    customer: Option<&str>,
    scope: &SessionScope,
    stripe: &StripeConnector,
) -> Result<Option<String>, CompleteError> {
    let Some(customer) = customer else {
        return Ok(Some(format!(
            "{object} has no customer, so it cannot be shown to belong to this thread's customer"
        )));
    };
    let Some(expected) = scope.customer_email.as_deref() else {
        return Ok(Some(
            "this thread has no known customer email to check ownership against".into(),
        ));
    };
    let email = stripe
        .customer_email(customer)
        .await
        .map_err(|source| lookup(format!("customer {customer}"), source))?;
    match email {
        Some(email) if email.eq_ignore_ascii_case(expected) => Ok(None),
        Some(_) => Ok(Some(format!(
            "{object} belongs to customer {customer}, not to this thread's customer"
        ))),
        None => Ok(Some(format!(
            "customer {customer} of {object} has no email to match this thread's customer"
        ))),
    }
}
