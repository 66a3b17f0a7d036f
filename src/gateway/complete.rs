//! Completing a call's arguments before it is decided and hashed: the thread it is
//! scoped to, and for Stripe writes the facts the policy needs (the charge's customer
//! and currency, the full remaining amount of a refund without one) and whether the
//! object belongs to the thread's customer. It also gathers the evidence the policy's
//! rules for the tool ask for (see `policy::evidence`): what it cannot gather stays out
//! of the [`Evidence`], so the conditions on it fail closed.

use serde_json::{Map, Value};

use crate::connectors::{ConnectorError, StripeConnector};
use crate::policy::{Evidence, EvidenceKind, Finding};
use crate::session::SessionScope;

/// Why completing a call failed; the agent gets this as a 4xx or 502.
#[derive(Debug, thiserror::Error)]
pub(super) enum CompleteError {
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
pub(super) struct Completion {
    /// Set when the call touches an object that is not (or cannot be shown to be) the
    /// thread's customer's: the call is held whatever the policy says.
    pub forced_hold: Option<String>,
    /// The evidence gathered for the policy's evidence conditions.
    pub evidence: Evidence,
}

/// Fills in scope and provider facts in `args` (an object) for `tool`, and gathers the
/// `wanted` evidence.
pub(super) async fn complete(
    tool: &str,
    args: &mut Map<String, Value>,
    scope: &SessionScope,
    takes_thread: bool,
    is_write: bool,
    stripe: Option<&StripeConnector>,
    wanted: &[EvidenceKind],
) -> Result<Completion, CompleteError> {
    let mut completion = complete_args(tool, args, scope, takes_thread, is_write, stripe).await?;
    if let (Some(stripe), "stripe.create_refund") = (stripe, tool) {
        for kind in wanted {
            let EvidenceKind::DuplicateCharge = kind;
            if let Some(finding) = duplicate_charge(args, stripe).await {
                completion.evidence.insert(*kind, finding);
            }
        }
    }
    Ok(completion)
}

async fn complete_args(
    tool: &str,
    args: &mut Map<String, Value>,
    scope: &SessionScope,
    takes_thread: bool,
    is_write: bool,
    stripe: Option<&StripeConnector>,
) -> Result<Completion, CompleteError> {
    if takes_thread {
        if let Some(asked) = args.get("thread_id").and_then(Value::as_str)
            && scope.thread_id != asked
        {
            return Err(CompleteError::OutOfScope {
                tool: tool.to_owned(),
                scoped: scope.thread_id.to_string(),
                asked: asked.to_owned(),
            });
        }
        args.insert(
            "thread_id".into(),
            Value::String(scope.thread_id.to_string()),
        );
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
            ..Completion::default()
        });
    };
    let owner = match action {
        "create_refund" => {
            // The charge and its customer's email in one request: a refund's owner is
            // checked against what Stripe says now, and asking twice cost a round trip.
            let (object, customer, email) = complete_refund(args, stripe).await?;
            let forced_hold = owner_hold(&object, customer.as_deref(), email, scope);
            return Ok(Completion {
                forced_hold,
                ..Completion::default()
            });
        }
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
    Ok(Completion {
        forced_hold,
        ..Completion::default()
    })
}

/// `duplicate_charge` for a refund of `args.charge` (whose `customer` completion filled
/// in): the smallest gap in creation time between that charge and another succeeded,
/// not fully refunded charge of the same customer with the same amount and currency.
/// `None` when it cannot be gathered (the provider failed or answered malformed data).
async fn duplicate_charge(args: &Map<String, Value>, stripe: &StripeConnector) -> Option<Finding> {
    let charge_id = args.get("charge")?.as_str()?;
    let Some(customer) = args.get("customer").and_then(Value::as_str) else {
        return Some(Finding::NotFound);
    };
    let query = serde_json::json!({ "customer": customer });
    let charges = match stripe.list_all("stripe.list_charges", &query).await {
        Ok(charges) => charges,
        Err(error) => {
            tracing::warn!(error = %error, "cannot gather duplicate_charge evidence");
            return None;
        }
    };
    let this = charges
        .iter()
        .find(|c| c["id"].as_str() == Some(charge_id))?;
    let (amount, currency, created) = (
        this["amount"].as_u64()?,
        this["currency"].as_str()?,
        this["created"].as_i64()?,
    );
    let gap_s = charges
        .iter()
        .filter(|c| c["id"].as_str() != Some(charge_id))
        .filter(|c| c["amount"].as_u64() == Some(amount))
        .filter(|c| {
            c["currency"]
                .as_str()
                .is_some_and(|x| x.eq_ignore_ascii_case(currency))
        })
        .filter(|c| c["status"].as_str() == Some("succeeded"))
        .filter(|c| c["amount_refunded"].as_u64().is_some_and(|r| r < amount))
        .filter_map(|c| c["created"].as_i64())
        .map(|other| other.abs_diff(created))
        .min();
    Some(match gap_s {
        Some(gap) => Finding::Found {
            apart_ms: i64::try_from(gap.saturating_mul(1000)).unwrap_or(i64::MAX),
        },
        None => Finding::NotFound,
    })
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
/// refund names none; answers the charge (named), its customer and that customer's
/// email, asked of Stripe with the charge.
async fn complete_refund(
    args: &mut Map<String, Value>,
    stripe: &StripeConnector,
) -> Result<(String, Option<String>, Option<String>), CompleteError> {
    let charge = str_arg(args, "charge");
    let (facts, email) = stripe
        .charge_facts_and_email(&charge)
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
    Ok((format!("charge {charge}"), facts.customer, email))
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
    Ok(email_hold(object, customer, email.as_deref(), expected))
}

/// [`check_owner`] with the customer's `email` already asked of Stripe.
fn owner_hold(
    object: &str,
    customer: Option<&str>,
    email: Option<String>,
    scope: &SessionScope,
) -> Option<String> {
    let Some(customer) = customer else {
        return Some(format!(
            "{object} has no customer, so it cannot be shown to belong to this thread's customer"
        ));
    };
    let Some(expected) = scope.customer_email.as_deref() else {
        return Some("this thread has no known customer email to check ownership against".into());
    };
    email_hold(object, customer, email.as_deref(), expected)
}

/// Why the call must be held when `customer`'s `email` is not the thread's `expected`.
fn email_hold(object: &str, customer: &str, email: Option<&str>, expected: &str) -> Option<String> {
    match email {
        Some(email) if email.eq_ignore_ascii_case(expected) => None,
        Some(_) => Some(format!(
            "{object} belongs to customer {customer}, not to this thread's customer"
        )),
        None => Some(format!(
            "customer {customer} of {object} has no email to match this thread's customer"
        )),
    }
}
