//! A compiled rule and how its conditions and limits decide whether it matches a call.
//!
//! A condition holds, fails, or cannot be evaluated:
//! - `match`: strings compare as written; numbers as JavaScript's `String(n)` writes them
//!   (`10.0` is `10`, `1e21` is `1e+21`, `-0` is `0`: see `decimal::js_number_text`), as
//!   Kortix does; booleans as `true`/`false`. An array holds only if every element
//!   matches; an empty array, a missing value, null or an object fails.
//! - `gt`/`gte`/`lt`/`lte`: the value must be a JSON number (or a non-empty array of
//!   them, every element compared) and is compared exactly from its decimal text;
//!   anything else cannot be evaluated.
//! - `negate` flips holds and fails. A negated condition that meets a missing, null,
//!   object or empty-array value (also inside an array) cannot be evaluated.
//! - `evidence`: see the `evidence` module; evidence that was not gathered cannot be
//!   evaluated.
//! - Arguments that are not a JSON object make every argument condition unevaluable.
//!
//! The conditions combine with a three-valued AND, as in Kortix: one condition that
//! definitely fails makes the rule not match, whatever the others say. Only when none
//! fails and at least one cannot be evaluated does failing closed decide: a `block` or
//! `require_approval` rule matches and an `always_run` rule does not. Otherwise a rule
//! matches when all its conditions hold and, for `always_run`, every limit has room for
//! the call.

use std::cmp::Ordering;
use std::sync::Arc;

use serde_json::Value;

use super::arg_path::ArgPath;
use super::decimal::{self, NumberText};
use super::evidence::{Evidence, EvidenceCheck, EvidenceCondition};
use super::limits::{Limit, LimitCharge, LimitHistory};
use super::pattern::Pattern;
use super::yaml::ScalarType;
use super::{Action, Pos};

/// A rule of the policy file.
#[derive(Clone, Debug)]
pub(crate) struct Rule {
    pub pattern: Pattern,
    /// The pattern as written, shown in explanations.
    pub text: Arc<str>,
    /// What YAML's core schema reads `match` as: Kortix drops a rule whose `match` is
    /// not a string (`threadgate lint --kortix` says so).
    pub written: ScalarType,
    pub action: Action,
    pub conditions: Vec<Condition>,
    /// Evidence conditions, checked after the argument conditions.
    pub evidence: Vec<EvidenceCondition>,
    pub limits: Vec<Limit>,
    /// Where the rule starts in the file.
    pub pos: Pos,
}

/// One `{arg, match|gt|gte|lt|lte, negate}` condition.
#[derive(Clone, Debug)]
pub(crate) struct Condition {
    pub path: ArgPath,
    pub test: Test,
    pub negate: bool,
    /// What YAML's core schema reads `match` as (`String` for the other tests): Kortix
    /// drops a rule whose condition `match` is not a string.
    pub written: ScalarType,
    pub pos: Pos,
}

/// What a condition tests its value with.
#[derive(Clone, Debug)]
pub(crate) enum Test {
    /// Match the value with a pattern, kept with its text as written.
    Match(Pattern, Arc<str>),
    /// Compare the value with a decimal threshold, e.g. `gt: 10000`.
    Compare(Comparison, Box<str>),
}

/// A numeric comparison operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Comparison {
    Gt,
    Gte,
    Lt,
    Lte,
}

impl Comparison {
    pub(crate) const KEYS: [(&'static str, Comparison); 4] = [
        ("gt", Comparison::Gt),
        ("gte", Comparison::Gte),
        ("lt", Comparison::Lt),
        ("lte", Comparison::Lte),
    ];

    fn holds(self, order: Ordering) -> bool {
        match self {
            Comparison::Gt => order == Ordering::Greater,
            Comparison::Gte => order != Ordering::Less,
            Comparison::Lt => order == Ordering::Less,
            Comparison::Lte => order != Ordering::Greater,
        }
    }
}

/// What a rule is evaluated against: the call's arguments, the evidence gathered for it,
/// and the limits' history up to `now_ms`.
pub(crate) struct CallFacts<'a> {
    pub args: &'a Value,
    pub evidence: &'a Evidence,
    pub history: &'a dyn LimitHistory,
    pub now_ms: i64,
}

/// Whether a rule whose tool pattern matched also matches the call.
pub(crate) enum RuleOutcome {
    NoMatch,
    Match {
        fail_closed: bool,
        charges: Vec<LimitCharge>,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Holds,
    Fails,
    Unevaluable,
}

impl Rule {
    /// Evaluates the conditions (three-valued AND) and limits against a call whose tool
    /// matched, recording every evidence condition it checks in `checks`.
    pub(crate) fn evaluate(
        &self,
        call: &CallFacts<'_>,
        checks: &mut Vec<EvidenceCheck>,
    ) -> RuleOutcome {
        let mut unevaluable = false;
        for condition in &self.conditions {
            match condition.evaluate(call.args) {
                Outcome::Holds => {}
                Outcome::Fails => return RuleOutcome::NoMatch,
                Outcome::Unevaluable => unevaluable = true,
            }
        }
        for condition in &self.evidence {
            checks.push(condition.check(call.evidence));
            match condition.holds(call.evidence) {
                Some(true) => {}
                Some(false) => return RuleOutcome::NoMatch,
                None => unevaluable = true,
            }
        }
        if unevaluable {
            return if self.action == Action::AlwaysRun {
                RuleOutcome::NoMatch
            } else {
                RuleOutcome::Match {
                    fail_closed: true,
                    charges: Vec::new(),
                }
            };
        }
        if self.limits.is_empty() {
            return RuleOutcome::Match {
                fail_closed: false,
                charges: Vec::new(),
            };
        }
        let (args, history, now_ms) = (call.args, call.history, call.now_ms);
        match super::limits::charges(&self.text, &self.limits, args, history, now_ms) {
            Some(charges) => RuleOutcome::Match {
                fail_closed: false,
                charges,
            },
            None => RuleOutcome::NoMatch,
        }
    }
}

impl Condition {
    /// Whether the condition holds for these arguments.
    pub(crate) fn evaluate(&self, args: &Value) -> Outcome {
        if !args.is_object() {
            return Outcome::Unevaluable;
        }
        let value = self.path.lookup(args);
        let result = match &self.test {
            Test::Compare(comparison, threshold) => {
                match value.and_then(|v| compare_all(v, *comparison, threshold)) {
                    Some(result) => result,
                    None => return Outcome::Unevaluable,
                }
            }
            Test::Match(pattern, _) => {
                let Some(value) = value else {
                    return self.unmatchable();
                };
                if self.negate && has_unmatchable(value) {
                    return Outcome::Unevaluable;
                }
                matches_value(pattern, value)
            }
        };
        if result != self.negate {
            Outcome::Holds
        } else {
            Outcome::Fails
        }
    }

    fn unmatchable(&self) -> Outcome {
        if self.negate {
            Outcome::Unevaluable
        } else {
            Outcome::Fails
        }
    }
}

/// Whether a pattern matches a value by the `match` rules above.
pub(crate) fn matches_value(pattern: &Pattern, value: &Value) -> bool {
    match value {
        Value::String(text) => pattern.matches(text),
        Value::Number(number) => pattern.matches(&decimal::js_number_text(number)),
        Value::Bool(true) => pattern.matches("true"),
        Value::Bool(false) => pattern.matches("false"),
        Value::Array(items) => {
            !items.is_empty() && items.iter().all(|item| matches_value(pattern, item))
        }
        Value::Null | Value::Object(_) => false,
    }
}

/// Whether a value is, or holds in an array, something a negated match cannot judge.
fn has_unmatchable(value: &Value) -> bool {
    match value {
        Value::Null | Value::Object(_) => true,
        Value::Array(items) => items.is_empty() || items.iter().any(has_unmatchable),
        Value::String(_) | Value::Number(_) | Value::Bool(_) => false,
    }
}

/// Compares a number, or every number of a non-empty array, with a threshold; `None`
/// if a value is not a number.
fn compare_all(value: &Value, comparison: Comparison, threshold: &str) -> Option<bool> {
    match value {
        Value::Number(number) => {
            let order = decimal::compare(NumberText::new(number).as_str(), threshold)?;
            Some(comparison.holds(order))
        }
        Value::Array(items) if !items.is_empty() => {
            let mut all = true;
            for item in items {
                all &= compare_all(item, comparison, threshold)?;
            }
            Some(all)
        }
        _ => None,
    }
}
