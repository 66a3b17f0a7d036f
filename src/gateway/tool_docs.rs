//! What the agent's model is told about each catalog tool beyond its name and argument
//! types: a description of the tool and of each argument, and the values an argument
//! takes when the connector accepts only a few (a refund's `reason`: Stripe's own list,
//! the one the connector checks). The one source of both `GET /v1/tools` (what the
//! built-in runner offers its model) and MCP's `tools/list` (its JSON input schemas).
//! A catalog tool or argument without a description here is caught by this module's
//! tests.

use serde_json::{Value, json};
use threadgate_api::ToolArg;

use crate::connectors::stripe::REFUND_REASONS;
use crate::policy::{ArgSpec, ArgType, ToolSpec};

/// What the optional `diagnosis` argument of every gateway tool is for.
pub const DIAGNOSIS_DESCRIPTION: &str = "What you found and why you make this call, with the evidence. A person reads it if the call is held for approval.";

/// Said of an argument the gateway fills in (`ArgSpec::filled_by_gateway`).
const FILLED: &str = "threadgate fills it in from the thread or the charge; you may leave it out.";

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

/// What an argument means, for the model; an argument the gateway fills in says so.
pub fn arg_description(tool: &str, arg: &ArgSpec) -> Option<String> {
    let own = own_arg_description(tool, arg.name);
    if !arg.filled_by_gateway {
        return own.map(str::to_owned);
    }
    Some(match own {
        Some(d) => format!("{d} {FILLED}"),
        None => FILLED.to_owned(),
    })
}

fn own_arg_description(tool: &str, arg: &str) -> Option<&'static str> {
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
        (_, "ref") => "The branch, tag or commit to read it at; the default branch when left out.",
        (_, "title") => "The issue's title.",
        (_, "body") => "The issue's text, as Markdown.",
        (_, "labels") => "Labels to put on the issue.",
        (_, "plan") => "The Stripe price id (`price_...`) to move the subscription to.",
        (_, "quantity") => "The subscription's new quantity.",
        (_, "cancel_at_period_end") => {
            "Whether the subscription ends at the end of the period already paid."
        }
        (_, "currency") => "The charge's currency (three-letter ISO code, lowercase).",
        (_, "thread_id") => "This support thread's id.",
        _ => return None,
    })
}

/// The values an argument takes, when only a few are accepted.
pub fn arg_values(tool: &str, arg: &str) -> Option<&'static [&'static str]> {
    match (tool, arg) {
        ("stripe.create_refund", "reason") => Some(REFUND_REASONS),
        _ => None,
    }
}

/// One argument as `GET /v1/tools` lists it.
pub fn arg_listing(tool: &ToolSpec, a: &ArgSpec) -> ToolArg {
    ToolArg {
        description: arg_description(tool.name, a),
        values: arg_values(tool.name, a.name)
            .map(|values| values.iter().map(|v| (*v).to_owned()).collect()),
        name: a.name.to_owned(),
        required: a.required,
        ty: a.ty.as_str().to_owned(),
    }
}

/// One argument as a JSON schema (MCP's input schemas): its type, with the same
/// description and values as [`arg_listing`].
pub fn arg_schema(tool: &ToolSpec, a: &ArgSpec) -> Value {
    let v = match a.ty {
        ArgType::String => json!({"type": "string"}),
        ArgType::Integer => json!({"type": "integer"}),
        ArgType::Boolean => json!({"type": "boolean"}),
        ArgType::StringArray => json!({"type": "array", "items": {"type": "string"}}),
    };
    with_docs(v, tool, a)
}

fn with_docs(mut v: Value, tool: &ToolSpec, a: &ArgSpec) -> Value {
    if let Some(d) = arg_description(tool.name, a)
        && let Some(fields) = v.as_object_mut()
    {
        fields.insert("description".into(), json!(d));
    }
    if let Some(values) = arg_values(tool.name, a.name)
        && let Some(fields) = v.as_object_mut()
    {
        fields.insert("enum".into(), json!(values));
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
    fn every_argument_is_described_and_filled_ones_say_so() {
        let catalog = Catalog::builtin();
        for t in catalog.tools() {
            for a in t.args {
                let said = arg_description(t.name, a);
                assert!(said.is_some(), "{}.{} has no description", t.name, a.name);
                assert_eq!(
                    said.is_some_and(|d| d.contains(FILLED)),
                    a.filled_by_gateway,
                    "{}.{}",
                    t.name,
                    a.name
                );
                let (listed, schema) = (arg_listing(t, a), arg_schema(t, a));
                assert_eq!(json!(listed.description), schema["description"]);
                assert_eq!(json!(listed.values), schema["enum"]);
            }
        }
    }

    #[test]
    fn a_refunds_reason_lists_the_values_stripe_accepts() {
        let catalog = Catalog::builtin();
        let refund = catalog.get("stripe.create_refund").expect("refund");
        let reason = refund.arg("reason").expect("reason");
        let listed = arg_listing(refund, reason);
        assert_eq!(
            listed.values.expect("values"),
            ["duplicate", "fraudulent", "requested_by_customer"]
        );
        assert!(listed.description.is_some_and(|d| d.contains("duplicate")));
    }
}
