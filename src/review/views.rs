//! What the review templates show, built from executions and audit rows. Every string
//! here is escaped by the templates; credentials are replaced before anything is shown.

use serde_json::Value;

use crate::approvals::narrow;
use crate::executions::redact_args;
use crate::executions::store::{Execution, Status};
use crate::secrets::Redactor;

/// The largest arguments shown in full; larger ones are left out (and Approve disabled).
pub(super) const MAX_SHOWN_ARGS: usize = 64 * 1024;
/// The longest diagnosis shown.
pub(super) const MAX_SHOWN_DIAGNOSIS: usize = 16 * 1024;

/// "3 min", "2 h 5 min", "4 d".
pub(super) fn span(ms: i64) -> String {
    let min = ms.max(0) / 60_000;
    match min {
        0 => "under a minute".into(),
        1..=59 => format!("{min} min"),
        60..=1439 => format!("{} h {} min", min / 60, min % 60),
        _ => format!("{} d", min / 1440),
    }
}

/// A UTC timestamp for people.
pub(super) fn when(ms: Option<i64>) -> String {
    ms.and_then(chrono::DateTime::from_timestamp_millis)
        .map(|t| t.format("%Y-%m-%d %H:%M UTC").to_string())
        .unwrap_or_else(|| "-".into())
}

/// "refund (line 12)".
pub(super) fn rule(e: &Execution) -> String {
    match e.rule_line {
        Some(line) => format!("{} (line {line})", e.because),
        None => e.because.clone(),
    }
}

/// The one-line summary, passed through the current redactor (a secret stored since
/// the call was held is hidden too).
fn summary(e: &Execution, redactor: &Redactor) -> String {
    let text = e.summary.as_deref().unwrap_or(&e.tool);
    redactor.redact(text).into_owned()
}

fn redacted(text: Option<&str>, redactor: &Redactor, none: &str) -> String {
    text.map(|t| redactor.redact(t).into_owned())
        .unwrap_or_else(|| none.to_owned())
}

/// One pending approval in the queue.
pub(super) struct QueueRow {
    pub id: String,
    pub tool: String,
    pub summary: String,
    pub customer: String,
    pub thread_id: String,
    pub thread_url: String,
    pub agent: String,
    pub rule: String,
    pub age: String,
    pub time_left: String,
    pub urgency: &'static str,
}

impl QueueRow {
    pub(super) fn new(
        e: &Execution,
        now: i64,
        redactor: &Redactor,
        customer: String,
        thread_url: String,
    ) -> QueueRow {
        let left = e.expires_at_ms.map(|at| at - now);
        QueueRow {
            id: e.id.to_string(),
            tool: e.tool.clone(),
            summary: summary(e, redactor),
            customer: redactor.redact(&customer).into_owned(),
            thread_id: e.thread_id.to_string(),
            thread_url,
            agent: e.agent.clone(),
            rule: rule(e),
            age: span(now - e.created_at_ms),
            time_left: left.map(span).unwrap_or_else(|| "no limit".into()),
            urgency: if left.is_some_and(|l| l < 15 * 60_000) {
                "soon"
            } else {
                ""
            },
        }
    }
}

/// One decided or expired approval.
pub(super) struct HistoryRow {
    pub id: String,
    pub tool: String,
    pub summary: String,
    pub status: &'static str,
    pub reviewer: String,
    pub when: String,
    pub message: String,
    /// What ran: the result or the error (redacted, cut), or the status word.
    pub outcome: String,
    pub thread_id: String,
}

impl HistoryRow {
    pub(super) fn new(e: &Execution, redactor: &Redactor) -> HistoryRow {
        HistoryRow {
            id: e.id.to_string(),
            tool: e.tool.clone(),
            summary: summary(e, redactor),
            status: e.status.as_str(),
            reviewer: e
                .reviewer
                .clone()
                .unwrap_or_else(|| "nobody (expired)".into()),
            when: when(e.decided_at_ms.or(e.finished_at_ms)),
            message: redacted(e.decision_message.as_deref(), redactor, "-"),
            outcome: outcome(e, redactor),
            thread_id: e.thread_id.to_string(),
        }
    }
}

/// A numeric argument the reviewer may lower: an amount of money is shown and typed in
/// its currency's units ("25.00", USD), any other number as a whole number.
pub(super) struct Narrowable {
    pub name: String,
    /// The held value as the reviewer reads and types it.
    pub held: String,
    /// The currency's code when the argument is money, else empty.
    pub currency: String,
    /// The input's `step` ("0.01" for USD, "1" for a count or JPY).
    pub step: String,
}

impl Narrowable {
    fn new(args: &Value, name: String, held: i64) -> Narrowable {
        match crate::money::money_arg(args, &name) {
            Some(currency) => Narrowable {
                held: currency.units(held),
                step: currency.units(1),
                currency: currency.code(),
                name,
            },
            None => Narrowable {
                held: held.to_string(),
                currency: String::new(),
                step: "1".into(),
                name,
            },
        }
    }
}

/// One approval's page.
pub(super) struct ApprovalView {
    pub id: String,
    pub tool: String,
    pub status: &'static str,
    pub open: bool,
    pub summary: String,
    pub customer: String,
    pub thread_id: String,
    pub thread_url: String,
    pub agent: String,
    pub age: String,
    pub time_left: String,
    pub rule: String,
    pub policy_version: String,
    pub policy_warning: String,
    pub args: String,
    /// Why Approve is disabled; empty when everything is shown.
    pub left_out: String,
    pub diagnosis: String,
    pub narrowable: Vec<Narrowable>,
    pub reviewer: String,
    pub decided_at: String,
    pub message: String,
    pub outcome: String,
}

/// What was left out of the arguments shown, if anything (then Approve is disabled: a
/// person does not approve what they cannot see).
pub(super) fn left_out(redactor: &Redactor, raw: &str) -> (String, String) {
    let Ok(args) = serde_json::from_str::<Value>(raw) else {
        return (
            String::new(),
            "The arguments cannot be read, so they cannot be approved.".into(),
        );
    };
    let shown = redact_args(redactor, &args);
    let pretty = serde_json::to_string_pretty(&shown).unwrap_or_default();
    if pretty.len() > MAX_SHOWN_ARGS {
        let cut: String = pretty.chars().take(MAX_SHOWN_ARGS).collect();
        return (
            format!("{cut}\n[... cut]"),
            "The arguments are too large to show in full, so Approve is disabled.".into(),
        );
    }
    if shown != args {
        return (
            pretty,
            "Some argument values are credentials or secrets and were replaced with [redacted]: \
             you cannot see what would be sent, so Approve is disabled. Deny, and tell the agent why."
                .into(),
        );
    }
    (pretty, String::new())
}

impl ApprovalView {
    /// The view of `e` at `now`, under the policy whose hash is `current_policy`.
    pub(super) fn new(
        e: &Execution,
        now: i64,
        redactor: &Redactor,
        current_policy: &str,
        customer: String,
        thread_url: String,
    ) -> ApprovalView {
        let expired = e.expires_at_ms.is_some_and(|at| at <= now);
        let open = e.status == Status::Held && !expired;
        let status = if e.status == Status::Held && expired {
            "expired"
        } else {
            e.status.as_str()
        };
        let (args, left_out) = left_out(redactor, &e.args);
        let parsed: Value = serde_json::from_str(&e.args).unwrap_or_default();
        let diagnosis = e
            .diagnosis
            .as_deref()
            .map(|d| {
                redactor
                    .redact(d)
                    .chars()
                    .take(MAX_SHOWN_DIAGNOSIS)
                    .collect()
            })
            .unwrap_or_else(|| "(none given)".into());
        let policy_warning = if e.policy_hash != current_policy {
            format!(
                "The policy has changed since this call was held (now {}). Approving decides it again against the policy in force.",
                short(current_policy)
            )
        } else {
            String::new()
        };
        ApprovalView {
            id: e.id.to_string(),
            tool: e.tool.clone(),
            status,
            open,
            summary: summary(e, redactor),
            customer: redactor.redact(&customer).into_owned(),
            thread_id: e.thread_id.to_string(),
            thread_url,
            agent: e.agent.clone(),
            age: span(now - e.created_at_ms),
            time_left: match e.expires_at_ms {
                Some(at) if at > now => format!("in {}", span(at - now)),
                Some(at) => format!("expired {}", when(Some(at))),
                None => "never".into(),
            },
            rule: rule(e),
            policy_version: short(&e.policy_hash),
            policy_warning,
            args,
            left_out,
            diagnosis,
            narrowable: narrow::narrowable(&parsed)
                .into_iter()
                .map(|(name, held)| Narrowable::new(&parsed, name, held))
                .collect(),
            reviewer: e.reviewer.clone().unwrap_or_else(|| "-".into()),
            decided_at: when(e.decided_at_ms),
            message: redacted(e.decision_message.as_deref(), redactor, "-"),
            outcome: outcome(e, redactor),
        }
    }
}

fn short(hash: &str) -> String {
    hash.chars().take(12).collect()
}

/// The longest result or error shown, in characters.
const MAX_SHOWN_OUTCOME: usize = 400;

/// The result of a call that ran or its error, redacted then cut to
/// [`MAX_SHOWN_OUTCOME`] characters (redacted first, so a cut never leaves part of a
/// secret); the status word when there is neither.
fn outcome(e: &Execution, redactor: &Redactor) -> String {
    let text = match (e.status, &e.result, &e.error) {
        (Status::Succeeded, Some(r), _) => r.as_str(),
        (_, _, Some(err)) => err.as_str(),
        (status, _, _) => status.as_str(),
    };
    let shown = redactor.redact(text);
    if shown.chars().count() > MAX_SHOWN_OUTCOME {
        let cut: String = shown.chars().take(MAX_SHOWN_OUTCOME).collect();
        format!("{cut}…")
    } else {
        shown.into_owned()
    }
}

/// Another call on the same thread.
pub(super) struct OtherCall {
    pub id: String,
    pub when: String,
    pub tool: String,
    pub status: &'static str,
    pub what: String,
}

impl OtherCall {
    pub(super) fn new(e: &Execution, redactor: &Redactor) -> OtherCall {
        let args: Value = serde_json::from_str(&e.args).unwrap_or_default();
        let shown = redact_args(redactor, &args).to_string();
        OtherCall {
            id: e.id.to_string(),
            when: when(Some(e.created_at_ms)),
            tool: e.tool.clone(),
            status: e.status.as_str(),
            what: match &e.summary {
                Some(s) => redactor.redact(s).into_owned(),
                None => shown.chars().take(200).collect(),
            },
        }
    }
}

/// One audit row of a thread.
pub(super) struct TrailRow {
    pub when: String,
    pub event: String,
    pub execution_id: String,
    pub tool: String,
    pub decision: String,
    pub rule: String,
    pub reviewer: String,
    pub outcome: String,
}

impl TrailRow {
    /// An audit row for people: every text redacted with the current redactor (a secret
    /// stored since the row was written is hidden too), the outcome cut.
    pub(super) fn new(r: &crate::audit::AuditRecordRow, redactor: &Redactor) -> TrailRow {
        let text = |t: &Option<String>| redacted(t.as_deref(), redactor, "-");
        TrailRow {
            when: when(Some(r.at_ms)),
            event: redactor.redact(&r.event).into_owned(),
            execution_id: r.execution_id.clone().unwrap_or_default(),
            tool: text(&r.tool),
            decision: text(&r.decision),
            rule: text(&r.rule),
            reviewer: text(&r.reviewer),
            outcome: text(&r.outcome).chars().take(300).collect(),
        }
    }
}
