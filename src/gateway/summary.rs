//! The one-line summary of a held call, for the people who decide it (the review queue,
//! the approval page, the note) and for the agent (`approval_summary`): a phrase in
//! words for the tools that wait for a person ("Refund 10.00 USD on ch_1 (duplicate)"),
//! the tool and its compact arguments for any other, then the rule that held it.
//!
//! Built from the redacted arguments only, so no credential reaches it.

use serde_json::Value;

use crate::money::Currency;

/// The longest quoted text (a title, a reply) in a phrase, in characters.
const MAX_QUOTE: usize = 80;
/// The longest compact arguments of the fallback, in characters.
const MAX_ARGS: usize = 200;

/// What separates a held call's phrase from the rule that held it in its summary.
pub(crate) const HELD_BY: &str = "; held: ";

/// "Refund 10.00 USD on ch_1 (duplicate); held: refund (policy.yaml:33)".
pub(super) fn held_summary(tool: &str, redacted_args: &Value, rule_text: &str) -> String {
    format!("{}{HELD_BY}{rule_text}", phrase(tool, redacted_args))
}

/// The call in words, or `tool {compact args}` for a tool without a phrase.
pub(crate) fn phrase(tool: &str, args: &Value) -> String {
    let s = |key: &str| args.get(key).and_then(Value::as_str).map(one_line);
    let said =
        match tool {
            "stripe.create_refund" => Some(refund(args)),
            "stripe.update_subscription" => s("subscription").map(|sub| subscription(args, &sub)),
            "stripe.cancel_subscription" => s("subscription")
                .map(|sub| format!("Cancel subscription {sub} now{}", of_customer(args))),
            "stripe.delete_customer" => s("customer").map(|c| format!("Delete customer {c}")),
            "github.create_issue" => match (s("repo"), s("title")) {
                (Some(repo), Some(title)) => {
                    Some(format!("Open an issue in {repo}: {}", quote(&title)))
                }
                _ => None,
            },
            "helpdesk.reply_to_thread" => s("text")
                .map(|t| format!("Reply to the customer{}: {}", on_thread(args), quote(&t))),
            "helpdesk.add_note" => {
                s("text").map(|t| format!("Internal note{}: {}", on_thread(args), quote(&t)))
            }
            "helpdesk.escalate_to_engineer" => s("summary")
                .map(|t| format!("Escalate {} to an engineer: {}", thread(args), quote(&t))),
            "helpdesk.mark_done" => Some(format!("Mark {} done", thread(args))),
            _ => None,
        };
    said.unwrap_or_else(|| fallback(tool, args))
}

/// "Refund 10.00 USD on ch_1 (requested_by_customer)".
fn refund(args: &Value) -> String {
    let charge = args
        .get("charge")
        .and_then(Value::as_str)
        .map(one_line)
        .unwrap_or_else(|| "an unnamed charge".into());
    let currency = Currency::of_args(args);
    let amount = match (args.get("amount").and_then(Value::as_i64), currency) {
        (Some(n), Some(cur)) => cur.format(n),
        (Some(n), None) => format!("{n} (smallest currency unit)"),
        (None, _) => "the whole remaining amount".into(),
    };
    let reason = args
        .get("reason")
        .and_then(Value::as_str)
        .map(|r| format!(" ({})", one_line(r)))
        .unwrap_or_default();
    format!("Refund {amount} on {charge}{reason}")
}

/// "Change subscription sub_1 of customer cus_1: plan pro, quantity 3".
fn subscription(args: &Value, sub: &str) -> String {
    let mut changes = Vec::new();
    if let Some(plan) = args.get("plan").and_then(Value::as_str) {
        changes.push(format!("plan {}", one_line(plan)));
    }
    if let Some(q) = args.get("quantity").and_then(Value::as_u64) {
        changes.push(format!("quantity {q}"));
    }
    match args.get("cancel_at_period_end").and_then(Value::as_bool) {
        Some(true) => changes.push("cancel at the end of the period".into()),
        Some(false) => changes.push("keep renewing".into()),
        None => {}
    }
    let what = if changes.is_empty() {
        "no change named".to_owned()
    } else {
        changes.join(", ")
    };
    format!("Change subscription {sub}{}: {what}", of_customer(args))
}

fn of_customer(args: &Value) -> String {
    args.get("customer")
        .and_then(Value::as_str)
        .map(|c| format!(" of customer {}", one_line(c)))
        .unwrap_or_default()
}

fn on_thread(args: &Value) -> String {
    format!(" on {}", thread(args))
}

/// "thread th_1", or "the thread" when the arguments name none.
fn thread(args: &Value) -> String {
    args.get("thread_id")
        .and_then(Value::as_str)
        .map(|t| format!("thread {}", one_line(t)))
        .unwrap_or_else(|| "the thread".into())
}

/// `text` on one line, cut to [`MAX_QUOTE`] characters, in quotes.
fn quote(text: &str) -> String {
    let line = one_line(text);
    if line.chars().count() > MAX_QUOTE {
        let cut: String = line.chars().take(MAX_QUOTE).collect();
        format!("\"{}…\"", cut.trim_end())
    } else {
        format!("\"{line}\"")
    }
}

/// Whitespace runs (newlines included) as one space.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `tool {compact args}`, the arguments cut to [`MAX_ARGS`] characters.
fn fallback(tool: &str, args: &Value) -> String {
    let compact = args.to_string();
    if compact.chars().count() > MAX_ARGS {
        let cut: String = compact.chars().take(MAX_ARGS).collect();
        format!("{tool} {cut}…")
    } else {
        format!("{tool} {compact}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn held_tools_read_as_phrases() {
        let refund = json!({"charge": "ch_1", "amount": 1000, "currency": "usd",
            "reason": "requested_by_customer", "customer": "cus_1"});
        assert_eq!(
            phrase("stripe.create_refund", &refund),
            "Refund 10.00 USD on ch_1 (requested_by_customer)"
        );
        let yen = json!({"charge": "ch_2", "amount": 1000, "currency": "jpy"});
        assert_eq!(
            phrase("stripe.create_refund", &yen),
            "Refund 1000 JPY on ch_2"
        );
        let whole = json!({"charge": "ch_3"});
        assert_eq!(
            phrase("stripe.create_refund", &whole),
            "Refund the whole remaining amount on ch_3"
        );
        let update = json!({"subscription": "sub_1", "customer": "cus_1", "plan": "pro",
            "quantity": 3, "cancel_at_period_end": true});
        assert_eq!(
            phrase("stripe.update_subscription", &update),
            "Change subscription sub_1 of customer cus_1: plan pro, quantity 3, cancel at the end of the period"
        );
        assert_eq!(
            phrase(
                "stripe.cancel_subscription",
                &json!({"subscription": "sub_1"})
            ),
            "Cancel subscription sub_1 now"
        );
        assert_eq!(
            phrase("stripe.delete_customer", &json!({"customer": "cus_9"})),
            "Delete customer cus_9"
        );
        let issue = json!({"repo": "acme/billing", "title": "Invoices\nsent twice", "body": "b"});
        assert_eq!(
            phrase("github.create_issue", &issue),
            "Open an issue in acme/billing: \"Invoices sent twice\""
        );
        let reply = json!({"thread_id": "th_1", "text": "x".repeat(100)});
        let said = phrase("helpdesk.reply_to_thread", &reply);
        assert!(
            said.starts_with("Reply to the customer on thread th_1: \"xxx"),
            "{said}"
        );
        assert!(
            said.ends_with("…\"") && said.chars().count() < 130,
            "{said}"
        );
        assert_eq!(
            phrase("helpdesk.mark_done", &json!({"thread_id": "th_1"})),
            "Mark thread th_1 done"
        );
        let esc = json!({"thread_id": "th_1", "summary": "Double charge"});
        assert_eq!(
            phrase("helpdesk.escalate_to_engineer", &esc),
            "Escalate thread th_1 to an engineer: \"Double charge\""
        );
    }

    #[test]
    fn other_tools_and_malformed_args_fall_back_to_compact_json() {
        assert_eq!(
            phrase("github.open_pull", &json!({"repo": "a/b"})),
            "github.open_pull {\"repo\":\"a/b\"}"
        );
        // A phrase needs its arguments: without them, the raw call is shown.
        assert_eq!(
            phrase("stripe.delete_customer", &json!({"id": 5})),
            "stripe.delete_customer {\"id\":5}"
        );
        let long = phrase("x.y", &json!({"t": "a".repeat(500)}));
        assert!(long.ends_with('…') && long.chars().count() < 220, "{long}");
        assert_eq!(
            held_summary(
                "stripe.delete_customer",
                &json!({"customer": "cus_9"}),
                "r (p:3)"
            ),
            "Delete customer cus_9; held: r (p:3)"
        );
    }
}
