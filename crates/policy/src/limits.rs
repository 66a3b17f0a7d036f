//! Cumulative limits on `always_run` rules:
//! `limits: [{sum: amount, per: customer, window: 24h, max: 5000}]`.
//!
//! Each limit sums one argument (a non-negative integer) over a rolling window, kept apart
//! per value of another argument and per currency when the call has a `currency`. The
//! engine only reads totals through [`LimitHistory`]; the caller records the
//! [`LimitCharge`]s of every call it runs.

use serde_json::Value;

use super::Pos;
use super::arg_path::ArgPath;
use super::decimal::NumberText;

/// What a caller must record for a call that runs under a rule with limits.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LimitCharge {
    /// Identifies the running total: the rule's pattern, the `sum` and `per` paths, the
    /// `per` value and the currency, as a JSON array. The same inputs always give the
    /// same key, and the key does not depend on `window` or `max`, so editing them keeps
    /// the history.
    pub key: String,
    /// How much the call adds to the total.
    pub amount: u128,
    /// The limit's rolling window in milliseconds (how far back totals are read).
    pub window_ms: i64,
}

/// The totals already used, implemented by the caller (the gateway over SQLite).
pub trait LimitHistory {
    /// The sum of the amounts recorded for `key` at a time strictly after
    /// `since_unix_ms`.
    fn total(&self, key: &str, since_unix_ms: i64) -> u128;
}

/// A history kept in memory: what `threadgate check` and tests use.
#[derive(Clone, Debug, Default)]
pub struct MemoryHistory {
    entries: Vec<(LimitCharge, i64)>,
}

impl MemoryHistory {
    /// An empty history.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records a charge as executed at `at_unix_ms`.
    pub fn record(&mut self, charge: &LimitCharge, at_unix_ms: i64) {
        self.entries.push((charge.clone(), at_unix_ms));
    }
}

impl LimitHistory for MemoryHistory {
    fn total(&self, key: &str, since_unix_ms: i64) -> u128 {
        self.entries
            .iter()
            .filter(|(charge, at)| charge.key == key && *at > since_unix_ms)
            .fold(0u128, |sum, (charge, _)| sum.saturating_add(charge.amount))
    }
}

/// One compiled limit.
#[derive(Clone, Debug)]
pub(crate) struct Limit {
    pub sum: ArgPath,
    pub per: ArgPath,
    pub window_ms: i64,
    pub max: u128,
    pub pos: Pos,
}

/// The charges a call would make on every limit, or `None` when a limit's argument is
/// missing or malformed or the call would take a total past its `max` (then the rule
/// does not match).
pub(crate) fn charges(
    rule_text: &str,
    limits: &[Limit],
    args: &Value,
    history: &dyn LimitHistory,
    now_ms: i64,
) -> Option<Vec<LimitCharge>> {
    let currency = match args.get("currency") {
        None => None,
        Some(Value::String(code)) if !code.is_empty() => Some(code.to_lowercase()),
        Some(_) => return None,
    };
    let mut charges = Vec::with_capacity(limits.len());
    for limit in limits {
        let amount = u128::from(limit.sum.lookup(args)?.as_u64()?);
        let per = match limit.per.lookup(args)? {
            Value::String(text) if !text.is_empty() => text.clone(),
            Value::Number(number) => NumberText::new(number).as_str().to_string(),
            _ => return None,
        };
        let key = serde_json::json!([
            rule_text,
            limit.sum.text.as_ref(),
            limit.per.text.as_ref(),
            per,
            currency
        ])
        .to_string();
        let since = now_ms.saturating_sub(limit.window_ms);
        if history.total(&key, since).saturating_add(amount) > limit.max {
            return None;
        }
        charges.push(LimitCharge {
            key,
            amount,
            window_ms: limit.window_ms,
        });
    }
    Some(charges)
}
