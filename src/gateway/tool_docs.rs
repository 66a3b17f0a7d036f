//! What `GET /v1/tools` tells the agent about each catalog tool beyond its name and
//! argument types: a description of the tool and of each argument, and the values an
//! argument takes when the connector accepts only a few (a refund's `reason`: Stripe's
//! own list, the one the connector checks). A catalog tool without a description here
//! is caught by this module's test.

use serde_json::{Value, json};

use crate::connectors::stripe::REFUND_REASONS;
use crate::policy::{ArgSpec, ToolSpec};

/// What the tool does, for the model.
pub fn tool_description(tool: &str) -> Option<&'static str> {
    Some(match tool {
        "stripe.list_invoices" => "Lists the customer's Stripe invoices, newest first.",
        "stripe.list_charges" => "Lists the customer's Stripe charges, newest first.",
        "stripe.get_charge" => "Reads one of the customer's Stripe charges.",
        "stripe.get_customer" => "Reads the customer's Stripe customer record.",
        "stripe.create_refund" => {
            "Refunds a charge of the customer, in full or in part. A refund may be held for a person's approval."
        }
        "stripe.update_subscription" => {
            "Changes the customer's subscription (plan, quantity, cancellation at period end)."
        }
        "stripe.cancel_subscription" => "Cancels the customer's subscription at once.",
        "stripe.delete_customer" => "Deletes the Stripe customer.",
        "helpdesk.get_thread" => "Reads this support thread: its customer, status and messages.",
        "helpdesk.reply_to_thread" => "Sends a reply to the customer on this thread.",
        "helpdesk.add_note" => "Adds an internal note on this thread, seen only by the team.",
        "helpdesk.escalate_to_engineer" => {
            "Hands this thread to an engineer with a summary of what you found."
        }
        "helpdesk.mark_done" => "Marks this thread done.",
        "github.search_code" => "Searches the code of the configured GitHub repositories.",
        "github.get_file" => "Reads one file of a configured GitHub repository.",
        "github.create_issue" => "Opens an issue in a configured GitHub repository.",
        _ => return None,
    })
}

/// What an argument means, for the model.
fn arg_description(tool: &str, arg: &str) -> Option<&'static str> {
    Some(match (tool, arg) {
        ("stripe.create_refund", "amount") => {
            "The amount to refund in the charge's smallest currency unit (cents); the whole charge when left out."
        }
        ("stripe.create_refund", "reason") => {
            "Why: `duplicate` only for a charge that repeats another, `fraudulent`, or `requested_by_customer`."
        }
        (_, "customer") => "The Stripe customer id (`cus_...`) of this thread's customer.",
        (_, "charge") => "The Stripe charge id (`ch_...`).",
        (_, "limit") => "How many to list at most.",
        (_, "starting_after") => "The last id of the previous page, to list the next one.",
        (_, "subscription") => "The Stripe subscription id (`sub_...`).",
        (_, "text") => "The message, as plain text.",
        (_, "markdown") => "The same message as Markdown, if it has formatting.",
        (_, "summary") => "What you found, for the engineer.",
        (_, "query") => "What to search for.",
        (_, "repo") => "The repository, `owner/name`.",
        (_, "path") => "The file's path in the repository.",
        _ => return None,
    })
}

/// The values an argument takes, when only a few are accepted.
fn arg_values(tool: &str, arg: &str) -> Option<&'static [&'static str]> {
    match (tool, arg) {
        ("stripe.create_refund", "reason") => Some(REFUND_REASONS),
        _ => None,
    }
}

/// One argument as `GET /v1/tools` lists it.
pub fn arg_listing(tool: &ToolSpec, a: &ArgSpec) -> Value {
    let mut v = json!({"name": a.name, "type": a.ty.as_str(), "required": a.required});
    if let Some(d) = arg_description(tool.name, a.name) {
        v["description"] = json!(d);
    }
    if let Some(values) = arg_values(tool.name, a.name) {
        v["enum"] = json!(values);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Catalog;

    #[test]
    fn every_catalog_tool_is_described() {
        for t in Catalog::builtin().tools() {
            assert!(
                tool_description(t.name).is_some(),
                "{} has no description",
                t.name
            );
        }
    }

    #[test]
    fn a_refunds_reason_lists_the_values_stripe_accepts() {
        let catalog = Catalog::builtin();
        let refund = catalog.get("stripe.create_refund").expect("refund");
        let reason = refund.arg("reason").expect("reason");
        let listed = arg_listing(refund, reason);
        assert_eq!(
            listed["enum"],
            json!(["duplicate", "fraudulent", "requested_by_customer"])
        );
        assert!(
            listed["description"]
                .as_str()
                .is_some_and(|d| d.contains("duplicate"))
        );
    }
}
