//! Differential test: the engine against a deliberately simple reference implementation
//! of DESIGN.md §2, on random policies and call sequences.
//!
//! The reference scans every rule in order, matches globs by naive recursion on
//! lowercased characters, compares numbers as integers scaled by 100 (the generated
//! numbers have at most two decimals), and keeps its own limit history. It shares nothing
//! with the engine but the catalog's data and the regex crate.

#![expect(
    clippy::indexing_slicing,
    reason = "test code: an index out of range is a failed test"
)]
#![expect(
    clippy::cast_possible_truncation,
    reason = "the reference model converts numbers the simple way, on purpose: it is what the engine is checked against"
)]

use std::fmt::Write as _;

use proptest::prelude::*;
use regex::RegexBuilder;
use serde_json::{Value, json};
use threadgate_policy::{Catalog, MemoryHistory, Policy, Risk};

// --- the random inputs --------------------------------------------------------------

#[derive(Clone, Debug)]
enum TestKind {
    Match(String),
    /// Operator name, threshold text, threshold × 100.
    Compare(&'static str, &'static str, i128),
}

#[derive(Clone, Debug)]
struct RefCondition {
    arg: &'static str,
    test: TestKind,
    negate: bool,
}

#[derive(Clone, Debug)]
struct RefLimit {
    sum: &'static str,
    per: &'static str,
    window_ms: i64,
    window_text: &'static str,
    max: u128,
}

#[derive(Clone, Debug)]
struct RefRule {
    pattern: String,
    action: &'static str,
    conditions: Vec<RefCondition>,
    limits: Vec<RefLimit>,
}

const TOOLS: &[&str] = &[
    "stripe.create_refund",
    "stripe.get_charge",
    "stripe.list_invoices",
    "stripe.delete_customer",
    "stripe.cancel_subscription",
    "helpdesk.escalate_to_engineer",
    "helpdesk.get_thread",
    "github.search_code",
    "Stripe.Create_Refund",
    "x.delete_y",
    "über.tool",
    "a.b.c",
];

fn pattern() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(TOOLS).prop_map(str::to_string),
        prop::sample::select(TOOLS).prop_map(|t| t.to_uppercase()),
        prop::sample::select(vec![
            "*",
            "stripe.*",
            "*.delete_*",
            "*refund*",
            "stripe*refund",
            "*.get_*",
            "a*c",
            "ÜBER.*",
            "*_*_*",
            "helpdesk.*_thread",
            "github.*",
            "**",
            "x.*.y",
        ])
        .prop_map(str::to_string),
        prop::sample::select(vec![
            "/refund/",
            "/^stripe\\.(get|list)_/",
            "/DELETE/",
            "/thread$/",
            "/./",
            "/^a\\.b/",
        ])
        .prop_map(str::to_string),
    ]
}

const THRESHOLDS: &[(&str, i128)] = &[
    ("-100", -10_000),
    ("0", 0),
    ("100", 10_000),
    ("2500", 250_000),
    ("10000", 1_000_000),
    ("99.5", 9_950),
    ("1e3", 100_000),
    ("2500.25", 250_025),
];

fn condition() -> impl Strategy<Value = RefCondition> {
    let arg = prop::sample::select(vec![
        "amount",
        "amount",
        "amount",
        "reason",
        "customer",
        "items",
        "meta.kind",
        "items.0",
        "flag",
    ]);
    let test = prop_oneof![
        prop::sample::select(vec![
            "duplicate",
            "dup*",
            "*",
            "/^re/",
            "4900",
            "49*",
            "true",
            "cus_a",
            "*a*",
        ])
        .prop_map(|p| TestKind::Match(p.to_string())),
        (
            prop::sample::select(vec!["gt", "gte", "lt", "lte"]),
            prop::sample::select(THRESHOLDS)
        )
            .prop_map(|(op, (text, scaled))| TestKind::Compare(op, text, scaled)),
    ];
    (arg, test, any::<bool>()).prop_map(|(arg, test, negate)| RefCondition { arg, test, negate })
}

fn limit() -> impl Strategy<Value = RefLimit> {
    (
        prop::sample::select(vec!["amount", "amount", "amount", "items.0"]),
        prop::sample::select(vec!["customer", "customer", "customer", "reason"]),
        prop::sample::select(vec![(60_000, "1m"), (3_600_000, "1h")]),
        prop::sample::select(vec![0u128, 100, 2500, 5000, 10_000]),
    )
        .prop_map(|(sum, per, (window_ms, window_text), max)| RefLimit {
            sum,
            per,
            window_ms,
            window_text,
            max,
        })
}

fn rule() -> impl Strategy<Value = RefRule> {
    (
        pattern(),
        prop::sample::select(vec!["always_run", "require_approval", "block"]),
        prop::collection::vec(condition(), 0..3),
        prop::collection::vec(limit(), 0..3),
    )
        .prop_map(|(pattern, action, conditions, limits)| RefRule {
            pattern,
            action,
            conditions,
            limits: if action == "always_run" {
                limits
            } else {
                Vec::new()
            },
        })
}

/// Numbers near every threshold (equal, one cent and one unit either side), and others.
fn number() -> impl Strategy<Value = Value> {
    let near: Vec<Value> = THRESHOLDS
        .iter()
        .flat_map(|(_, scaled)| [-100, -1, 0, 1, 100].map(|d| scaled + d))
        .map(from_cents)
        .collect();
    prop_oneof![
        3 => prop::sample::select(near),
        1 => (-20_000i64..20_000).prop_map(Value::from),
        1 => (-2_000_000i64..2_000_000).prop_map(|k| json!(k as f64 / 100.0)),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        3 => number(),
        2 => prop::sample::select(vec!["duplicate", "Duplicate", "requested", "cus_a", "cus_b", "4900", "true", ""])
            .prop_map(Value::from),
        1 => any::<bool>().prop_map(Value::from),
        1 => Just(Value::Null),
    ];
    leaf.prop_recursive(2, 8, 3, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
            inner.prop_map(|v| json!({"kind": v})),
        ]
    })
}

/// Cents as the JSON number a caller would send: an integer when whole.
fn from_cents(cents: i128) -> Value {
    if cents % 100 == 0 {
        Value::from((cents / 100) as i64)
    } else {
        json!(cents as f64 / 100.0)
    }
}

/// An amount: often exactly a threshold, often a cent or a unit away, sometimes anything.
fn amount() -> impl Strategy<Value = Value> {
    let exact: Vec<Value> = THRESHOLDS
        .iter()
        .map(|(_, cents)| from_cents(*cents))
        .collect();
    prop_oneof![
        3 => prop::sample::select(exact),
        1 => number(),
        1 => value(),
    ]
}

fn args() -> impl Strategy<Value = Value> {
    let keys = ["reason", "items", "meta", "flag"];
    let others = prop::collection::vec(prop::option::of(value()), keys.len());
    let customer = prop_oneof![
        3 => prop::sample::select(vec!["cus_a", "cus_b"]).prop_map(Value::from),
        1 => value(),
    ];
    let currency = prop::sample::select(vec![json!("usd"), json!("USD"), json!("eur"), json!(840)]);
    let object = (
        prop::option::weighted(0.8, amount()),
        prop::option::weighted(0.8, customer),
        prop::option::weighted(0.3, currency),
        others,
    )
        .prop_map(move |(amount, customer, currency, values)| {
            let mut map = serde_json::Map::new();
            if let Some(currency) = currency {
                map.insert("currency".to_string(), currency);
            }
            if let Some(amount) = amount {
                map.insert("amount".to_string(), amount);
            }
            if let Some(customer) = customer {
                map.insert("customer".to_string(), customer);
            }
            for (key, value) in keys.iter().zip(values) {
                if let Some(value) = value {
                    map.insert((*key).to_string(), value);
                }
            }
            Value::Object(map)
        });
    prop_oneof![
        9 => object,
        1 => prop::sample::select(vec![json!([1, 2]), json!("x"), json!(null)]),
    ]
}

// --- the policy file ---------------------------------------------------------------

fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// Renders the policy and returns each rule's line.
fn render(mode: &str, rules: &[RefRule]) -> (String, Vec<u32>) {
    let mut out = format!("policy:\n  default_mode: {mode}\npolicies:\n");
    let mut lines = Vec::new();
    for rule in rules {
        lines.push(out.lines().count() as u32 + 1);
        let _ = writeln!(
            out,
            "  - match: {}\n    action: {}",
            quote(&rule.pattern),
            rule.action
        );
        if !rule.conditions.is_empty() {
            out.push_str("    conditions:\n");
        }
        for c in &rule.conditions {
            let test = match &c.test {
                TestKind::Match(p) => format!("match: {}", quote(p)),
                TestKind::Compare(op, text, _) => format!("{op}: {text}"),
            };
            let _ = writeln!(
                out,
                "      - {{arg: {}, {test}, negate: {}}}",
                c.arg, c.negate
            );
        }
        if !rule.limits.is_empty() {
            out.push_str("    limits:\n");
        }
        for l in &rule.limits {
            let _ = writeln!(
                out,
                "      - {{sum: {}, per: {}, window: {}, max: {}}}",
                l.sum, l.per, l.window_text, l.max
            );
        }
    }
    (out, lines)
}

// --- the reference -----------------------------------------------------------------

fn glob(p: &[char], t: &[char]) -> bool {
    match p.split_first() {
        None => t.is_empty(),
        Some(('*', rest)) => (0..=t.len()).any(|i| glob(rest, &t[i..])),
        Some((c, rest)) => t.first() == Some(c) && glob(rest, &t[1..]),
    }
}

fn pattern_matches(pattern: &str, text: &str) -> bool {
    if pattern.len() >= 2 && pattern.starts_with('/') && pattern.ends_with('/') {
        let body = &pattern[1..pattern.len() - 1];
        let regex = RegexBuilder::new(body).case_insensitive(true).build();
        return regex.is_ok_and(|r| r.is_match(text));
    }
    let p: Vec<char> = pattern.to_lowercase().chars().collect();
    let t: Vec<char> = text.to_lowercase().chars().collect();
    glob(&p, &t)
}

fn lookup<'v>(args: &'v Value, path: &str) -> Option<&'v Value> {
    path.split('.')
        .try_fold(args, |value, segment| match value {
            Value::Object(map) => map.get(segment),
            Value::Array(items) => items.get(segment.parse::<usize>().ok()?),
            _ => None,
        })
}

fn text_of(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        // Numbers as JavaScript's String(n) writes them (the generated numbers are small
        // enough for plain notation): integral values without a fraction, `-0` as `0`.
        Value::Number(n) => match n.as_i64() {
            Some(i) => Some(i.to_string()),
            None => {
                let f = n.as_f64()?;
                Some(if f == f.trunc() {
                    format!("{}", f as i64)
                } else {
                    format!("{f}")
                })
            }
        },
        Value::Bool(_) => Some(value.to_string()),
        _ => None,
    }
}

fn every_element_matches(pattern: &str, value: &Value) -> bool {
    match value {
        Value::Array(items) => {
            !items.is_empty() && items.iter().all(|i| every_element_matches(pattern, i))
        }
        _ => text_of(value).is_some_and(|t| pattern_matches(pattern, &t)),
    }
}

fn unjudgeable(value: &Value) -> bool {
    match value {
        Value::Null | Value::Object(_) => true,
        Value::Array(items) => items.is_empty() || items.iter().any(unjudgeable),
        _ => false,
    }
}

fn scaled_numbers(value: &Value) -> Option<Vec<i128>> {
    match value {
        Value::Number(n) => Some(vec![match n.as_i64() {
            Some(i) => i128::from(i) * 100,
            None => (n.as_f64()? * 100.0).round() as i128,
        }]),
        Value::Array(items) if !items.is_empty() => {
            let mut all = Vec::new();
            for item in items {
                all.extend(scaled_numbers(item)?);
            }
            Some(all)
        }
        _ => None,
    }
}

/// `Some(true)` holds, `Some(false)` fails, `None` cannot be evaluated.
fn condition_outcome(c: &RefCondition, args: &Value) -> Option<bool> {
    if !args.is_object() {
        return None;
    }
    let value = lookup(args, c.arg);
    match &c.test {
        TestKind::Match(p) if c.negate => match value {
            Some(v) if !unjudgeable(v) => Some(!every_element_matches(p, v)),
            _ => None,
        },
        TestKind::Match(p) => Some(value.is_some_and(|v| every_element_matches(p, v))),
        TestKind::Compare(op, _, threshold) => {
            let numbers = scaled_numbers(value?)?;
            let all = numbers.iter().all(|n| match *op {
                "gt" => n > threshold,
                "gte" => n >= threshold,
                "lt" => n < threshold,
                _ => n <= threshold,
            });
            Some(all != c.negate)
        }
    }
}

type Key = (String, &'static str, &'static str, String, Option<String>);

#[derive(Default)]
struct RefHistory(Vec<(Key, u128, i64)>);

fn limit_charges(
    rule: &RefRule,
    args: &Value,
    history: &RefHistory,
    now: i64,
) -> Option<Vec<(Key, u128)>> {
    let currency = match args.get("currency") {
        None => None,
        Some(Value::String(s)) if !s.is_empty() => Some(s.to_lowercase()),
        Some(_) => return None,
    };
    let mut charges = Vec::new();
    for l in &rule.limits {
        let amount = u128::from(lookup(args, l.sum)?.as_u64()?);
        let per = match lookup(args, l.per)? {
            Value::String(s) if !s.is_empty() => s.clone(),
            v @ Value::Number(_) => v.to_string(),
            _ => return None,
        };
        let key = (rule.pattern.clone(), l.sum, l.per, per, currency.clone());
        let used: u128 = history
            .0
            .iter()
            .filter(|(k, _, at)| *k == key && *at > now - l.window_ms)
            .map(|(_, amount, _)| amount)
            .sum();
        if used + amount > l.max {
            return None;
        }
        charges.push((key, amount));
    }
    Some(charges)
}

/// The reference decision: verdict, explanation, rule line and charges.
fn reference(
    mode: &str,
    rules: &[RefRule],
    lines: &[u32],
    tool: &str,
    args: &Value,
    history: &RefHistory,
    now: i64,
) -> (String, String, Option<u32>, Vec<(Key, u128)>) {
    for (rule, line) in rules.iter().zip(lines) {
        if !pattern_matches(&rule.pattern, tool) {
            continue;
        }
        let outcomes: Vec<Option<bool>> = rule
            .conditions
            .iter()
            .map(|c| condition_outcome(c, args))
            .collect();
        let verdict = match rule.action {
            "always_run" => "run",
            "require_approval" => "hold",
            _ => "block",
        };
        // Three-valued AND: a definite failure rules the rule out first.
        if outcomes.contains(&Some(false)) {
            continue;
        }
        if outcomes.contains(&None) {
            if rule.action == "always_run" {
                continue;
            }
            let because = format!(
                "rule {} + condition not evaluable (fail closed)",
                rule.pattern
            );
            return (verdict.into(), because, Some(*line), Vec::new());
        }
        let charges = if rule.limits.is_empty() {
            Vec::new()
        } else {
            match limit_charges(rule, args, history, now) {
                Some(charges) => charges,
                None => continue,
            }
        };
        let mut because = format!("rule {}", rule.pattern);
        for (n, noun) in [
            (rule.conditions.len(), "condition"),
            (rule.limits.len(), "limit"),
        ] {
            match n {
                0 => {}
                1 => because.push_str(&format!(" + {noun}")),
                n => because.push_str(&format!(" + {n} {noun}s")),
            }
        }
        return (verdict.into(), because, Some(*line), charges);
    }
    if ["stripe.delete_customer", "stripe.cancel_subscription"].contains(&tool) {
        return (
            "hold".into(),
            format!("connector rule {tool}"),
            None,
            Vec::new(),
        );
    }
    let risk = Catalog::builtin().get(tool).map(|spec| spec.risk);
    let (verdict, because) = match (mode, risk) {
        ("allow_all", _) => ("run", "default_mode: allow_all".to_string()),
        (_, Some(Risk::Read)) => ("run", "default_mode: risk (read)".to_string()),
        (_, Some(risk)) => ("hold", format!("default_mode: risk ({risk})")),
        (_, None) => (
            "hold",
            "default_mode: risk (unknown tool, write)".to_string(),
        ),
    };
    (verdict.into(), because, None, Vec::new())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn engine_agrees_with_the_reference(
        mode in prop::sample::select(vec!["risk", "allow_all"]),
        rules in prop::collection::vec(rule(), 0..8),
        calls in prop::collection::vec((prop::sample::select(TOOLS), args(), 0i64..120_000), 1..12),
    ) {
        let (source, lines) = render(mode, &rules);
        let policy = Policy::parse(&source, "random.yaml")
            .unwrap_or_else(|e| panic!("{e}\n{source}"));
        let catalog = Catalog::builtin();
        let mut history = MemoryHistory::new();
        let mut ref_history = RefHistory::default();
        let mut now = 1_700_000_000_000i64;
        for (tool, args, gap) in calls {
            now += gap;
            let decision = policy.decide(tool, &args, &catalog, &history, now);
            let (verdict, because, line, charges) =
                reference(mode, &rules, &lines, tool, &args, &ref_history, now);
            let context = format!("{source}\ncall {tool} {args}");
            prop_assert_eq!(decision.verdict.as_str(), verdict.as_str(), "{}", context);
            prop_assert_eq!(decision.because.to_string(), because, "{}", context);
            prop_assert_eq!(decision.rule_line, line, "{}", context);
            let amounts: Vec<u128> = decision.charges.iter().map(|c| c.amount).collect();
            let ref_amounts: Vec<u128> = charges.iter().map(|c| c.1).collect();
            prop_assert_eq!(amounts, ref_amounts, "{}", context);
            if verdict == "run" {
                for charge in &decision.charges {
                    history.record(charge, now);
                }
                for (key, amount) in charges {
                    ref_history.0.push((key, amount, now));
                }
            }
        }
    }
}
