//! Approving a narrower request: a reviewer may lower a numeric argument of a held call
//! (a refund's `amount`) before approving it.
//!
//! The narrowed request replaces the held one in the same compare-and-set that records
//! the approval (`held` to `approved`), with its own binding hash, after it has been
//! decided again against the policy in force (a `block` refuses the narrowing). It then
//! runs once, like any approved call, and the agent's wait returns what ran. Raising a
//! value, changing a non-numeric argument or an unknown one is refused.

use std::collections::BTreeMap;

use crate::store::Conn;
use serde_json::Value;

use super::{Approvals, DecideError};
use crate::audit::{AuditEvent, AuditRecord};
use crate::executions::binding_hash;
use crate::executions::store::{self, Status};
use crate::executions::{self, trail};
use crate::gateway::{HELD_BY, LoadedPolicy, SqlHistory};
use crate::ids::ExecutionId;
use crate::money::money_arg;
use crate::policy::{Catalog, Verdict};
use crate::secrets::Redactor;

/// Why a narrowing was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NarrowError {
    /// The argument is missing, not a whole number, or nested.
    #[error("argument {0} is not a whole number of the request: it cannot be narrowed")]
    NotNumeric(String),
    /// The new value is higher than the held one.
    #[error("argument {arg} may only be lowered: {wanted} is more than the requested {held}")]
    Wider { arg: String, held: i64, wanted: i64 },
    /// The new value is below 1.
    #[error("argument {arg} must stay at least 1 (asked for {wanted})")]
    BelowOne { arg: String, wanted: i64 },
    /// The narrowed request is blocked by the policy in force.
    #[error("the narrowed request is blocked by the current policy: {0}")]
    Blocked(String),
}

/// The top-level whole-number arguments of `args` a reviewer may lower.
pub fn narrowable(args: &Value) -> Vec<(String, i64)> {
    args.as_object()
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_i64().filter(|n| *n >= 1).map(|n| (k.clone(), n)))
                .collect()
        })
        .unwrap_or_default()
}

/// `args` with `lower` applied; equal values are no change.
pub fn apply(args: &Value, lower: &BTreeMap<String, i64>) -> Result<Value, NarrowError> {
    let mut out = args.clone();
    for (arg, wanted) in lower {
        let held = args
            .get(arg)
            .and_then(Value::as_i64)
            .ok_or_else(|| NarrowError::NotNumeric(arg.clone()))?;
        if *wanted > held {
            return Err(NarrowError::Wider {
                arg: arg.clone(),
                held,
                wanted: *wanted,
            });
        }
        if *wanted < 1 {
            return Err(NarrowError::BelowOne {
                arg: arg.clone(),
                wanted: *wanted,
            });
        }
        #[expect(
            clippy::indexing_slicing,
            reason = "INVARIANT: `args.get(arg)` held a number above, so `out` (its clone) is an object with `arg`; a silent skip would approve the wider value"
        )]
        {
            out[arg.as_str()] = Value::from(*wanted);
        }
    }
    Ok(out)
}

enum Outcome {
    Approved(Box<store::Execution>),
    /// The ttl had passed: the row is now `expired`, with its audit step.
    Expired(Box<store::Execution>),
    Refused(NarrowError),
    Other(DecideError),
}

impl Approvals {
    /// Approves the held call `id` with the arguments in `lower` lowered. With nothing
    /// lowered it is a plain approval.
    pub async fn approve_narrowed(
        &self,
        id: &ExecutionId,
        reviewer: &str,
        message: Option<String>,
        lower: BTreeMap<String, i64>,
    ) -> Result<Result<store::Execution, NarrowError>, DecideError> {
        let changed_any = {
            let owned = id.clone();
            let exec = self.gate.db().read(move |c| store::get(c, &owned)).await?;
            let Some(exec) = exec else {
                return Err(DecideError::NotFound(id.to_string()));
            };
            // Unreadable arguments are not "no change": a narrowing must never become an
            // approval of the call as held.
            let Ok(args) = serde_json::from_str::<Value>(&exec.args) else {
                let arg = lower.keys().next().cloned().unwrap_or_default();
                return Ok(Err(NarrowError::NotNumeric(arg)));
            };
            lower
                .iter()
                .any(|(k, v)| args.get(k).and_then(Value::as_i64) != Some(*v))
        };
        if !changed_any {
            return self
                .decide(id, reviewer, super::Choice::Approve, message)
                .await
                .map(Ok);
        }
        let outcome = self
            .narrow_and_approve(id, reviewer, message, lower)
            .await?;
        match outcome {
            Outcome::Approved(exec) => {
                self.spawn_run(&exec.id);
                self.after_change(&exec);
                Ok(Ok(*exec))
            }
            Outcome::Expired(exec) => {
                let waited = self.gate.now() - exec.created_at_ms;
                crate::metrics::approval("expired", waited);
                self.after_change(&exec);
                Err(DecideError::Expired { id: id.to_string() })
            }
            Outcome::Refused(e) => Ok(Err(e)),
            Outcome::Other(e) => Err(e),
        }
    }

    async fn narrow_and_approve(
        &self,
        id: &str,
        reviewer: &str,
        message: Option<String>,
        lower: BTreeMap<String, i64>,
    ) -> Result<Outcome, DecideError> {
        let now = self.gate.now();
        let redactor = self.gate.current_redactor();
        let loaded = self.gate.current_policy();
        let catalog = self.gate.catalog().clone();
        let ask = Ask {
            id: id.to_owned(),
            reviewer: reviewer.to_owned(),
            message,
            lower,
            now,
        };
        let outcome = self
            .gate
            .db()
            .write(move |conn| {
                let found = recheck(conn, &loaded, &catalog, &redactor, &ask)?;
                let (held, args, narrowed) = match found {
                    Ok(found) => found,
                    Err(outcome) => return Ok(outcome),
                };
                record(conn, &loaded, &redactor, &ask, held, &args, &narrowed)
            })
            .await?;
        Ok(outcome)
    }
}

/// A narrowed approval as asked.
struct Ask {
    id: String,
    reviewer: String,
    message: Option<String>,
    lower: BTreeMap<String, i64>,
    now: i64,
}

/// The held call with its arguments and the narrowed ones, when it is still held, the
/// lowering applies and the current policy does not block the narrowed call. A hold
/// whose ttl has passed is moved to `expired` here, with its audit step, as a plain
/// decision does.
fn recheck(
    conn: &Conn<'_>,
    loaded: &LoadedPolicy,
    catalog: &Catalog,
    redactor: &Redactor,
    ask: &Ask,
) -> crate::store::Result<Result<(store::Execution, Value, Value), Outcome>> {
    let Some(found) = store::get(conn, &ask.id)? else {
        return Ok(Err(Outcome::Other(DecideError::NotFound(ask.id.clone()))));
    };
    if found.status == Status::Held && found.expires_at_ms.is_some_and(|at| at <= ask.now) {
        super::expire_held(conn, redactor, &found)?;
        return Ok(Err(Outcome::Expired(Box::new(found))));
    }
    let held = match still_held(found) {
        Ok(held) => held,
        Err(other) => return Ok(Err(Outcome::Other(other))),
    };
    let args: Value = serde_json::from_str(&held.args).unwrap_or_default();
    let narrowed = match apply(&args, &ask.lower) {
        Ok(n) => n,
        Err(e) => return Ok(Err(Outcome::Refused(e))),
    };
    // The limits' real totals, as the gate's own decision reads them: a rule that
    // counts earlier calls must count them here too.
    let history = SqlHistory(conn);
    let again = loaded
        .policy
        .decide(&held.tool, &narrowed, catalog, &history, ask.now);
    if again.verdict == Verdict::Block {
        let because = again.because.to_string();
        return Ok(Err(Outcome::Refused(NarrowError::Blocked(because))));
    }
    Ok(Ok((held, args, narrowed)))
}

/// Freezes the narrowed arguments under their new binding and records the approval
/// with its audit step; a call decided meanwhile is left alone.
fn record(
    conn: &Conn<'_>,
    loaded: &LoadedPolicy,
    redactor: &Redactor,
    ask: &Ask,
    held: store::Execution,
    args: &Value,
    narrowed: &Value,
) -> crate::store::Result<Outcome> {
    let canonical = executions::canonical_args(narrowed);
    let binding = binding_hash(&held.tool, &canonical, &held.account, &held.session_id);
    let note = describe(args, &ask.lower);
    let text = match ask.message.as_deref() {
        Some(m) if !m.trim().is_empty() => format!("{m}\n({note})"),
        _ => note.clone(),
    };
    let summary = narrowed_summary(&held, redactor, args, narrowed, ask);
    let (id, now) = (ask.id.as_str(), ask.now);
    if !store::narrow_held(conn, id, &canonical, &binding, &summary)?
        || !store::record_decision(conn, id, Status::Approved, &ask.reviewer, Some(&text), now)?
    {
        return Ok(Outcome::Other(DecideError::AlreadyDecided {
            id: id.to_owned(),
            status: "decided",
        }));
    }
    let exec = store::get(conn, id)?.unwrap_or(held);
    let step = AuditRecord::new(AuditEvent::Approved)
        .outcome(Some(&note))
        .reviewer(&ask.reviewer)
        .policy_hash(&loaded.hash_hex);
    executions::audit(conn, redactor, &exec, step)?;
    if let Some(event) = trail::decided(&exec, redactor) {
        trail::enqueue(conn, &event, now)?;
    }
    Ok(Outcome::Approved(Box::new(exec)))
}

/// The held call, or why it can no longer be decided (its ttl was checked before).
fn still_held(held: store::Execution) -> Result<store::Execution, DecideError> {
    let id = held.id.to_string();
    if held.status == Status::Expired {
        return Err(DecideError::Expired { id });
    }
    if held.status != Status::Held {
        let status = held.status.as_str();
        return Err(DecideError::AlreadyDecided { id, status });
    }
    Ok(held)
}

/// "approved narrower: amount 25.00 USD -> 10.00 USD" (money in its currency's units,
/// any other number as it is).
fn describe(args: &Value, lower: &BTreeMap<String, i64>) -> String {
    let parts: Vec<String> = lower
        .iter()
        .map(|(k, v)| {
            let held = args.get(k).and_then(Value::as_i64).unwrap_or_default();
            match money_arg(args, k) {
                Some(currency) => {
                    format!("{k} {} -> {}", currency.format(held), currency.format(*v))
                }
                None => format!("{k} {held} -> {v}"),
            }
        })
        .collect();
    format!("approved narrower: {}", parts.join(", "))
}

/// The summary of what will run once narrowed, saying what was asked and who lowered
/// it: "Refund 10.00 USD on ch_1 (duplicate), narrowed from 25.00 USD by alice; held:
/// refund (policy.yaml:33)". Built from the redacted arguments, like the held summary.
fn narrowed_summary(
    held: &store::Execution,
    redactor: &Redactor,
    args: &Value,
    narrowed: &Value,
    ask: &Ask,
) -> String {
    let was: Vec<String> = ask
        .lower
        .keys()
        .filter_map(|k| {
            let before = args.get(k).and_then(Value::as_i64)?;
            (narrowed.get(k).and_then(Value::as_i64) != Some(before)).then(|| {
                match money_arg(args, k) {
                    Some(currency) => currency.format(before),
                    None => format!("{k} {before}"),
                }
            })
        })
        .collect();
    let phrase =
        crate::gateway::call_phrase(&held.tool, &executions::redact_args(redactor, narrowed));
    let held_because = held
        .summary
        .as_deref()
        .and_then(|s| s.rsplit_once(HELD_BY))
        .map(|(_, rule)| format!("{HELD_BY}{rule}"))
        .unwrap_or_default();
    if was.is_empty() {
        return format!("{phrase}{held_because}");
    }
    format!(
        "{phrase}, narrowed from {} by {}{held_because}",
        was.join(", "),
        ask.reviewer
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_lower_whole_numbers_pass() {
        let args = json!({"charge": "ch_1", "amount": 1000, "reason": "duplicate"});
        let lower = |k: &str, v: i64| BTreeMap::from([(k.to_owned(), v)]);
        assert_eq!(
            apply(&args, &lower("amount", 400)).expect("lower")["amount"],
            400
        );
        assert!(matches!(
            apply(&args, &lower("amount", 1001)),
            Err(NarrowError::Wider {
                held: 1000,
                wanted: 1001,
                ..
            })
        ));
        assert!(matches!(
            apply(&args, &lower("amount", 0)),
            Err(NarrowError::BelowOne { .. })
        ));
        assert!(matches!(
            apply(&args, &lower("charge", 1)),
            Err(NarrowError::NotNumeric(_))
        ));
        assert!(matches!(
            apply(&args, &lower("extra", 1)),
            Err(NarrowError::NotNumeric(_))
        ));
        assert_eq!(narrowable(&args), vec![("amount".to_owned(), 1000)]);
    }
}
