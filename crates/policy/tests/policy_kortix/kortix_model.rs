//! A MODEL OF KORTIX'S EVALUATOR, not threadgate's engine: written from kortix-ai/suna's
//! `apps/api/src/connectors/policy.ts` (`resolveEffectiveAction`, `firstMatchOrNull`,
//! `ruleApplies`, `conditionHolds`, `argValueMatches`, `valueAtPath`, `compileMatcher`,
//! `areValidConditions`) and `apps/api/src/projects/policies.ts`
//! (`extractProjectPolicies`), for the differential test in `policy_kortix.rs`.
//!
//! It takes rules as data (what the manifest parser produced), never threadgate's
//! parser. JavaScript's regular expressions are stood in for by the `regex` crate on the
//! common core the generated patterns use, and JavaScript's case-insensitive matching by
//! ASCII lowercasing (the generated text is ASCII).

use regex::{Regex, RegexBuilder};
use serde_json::Value;

/// A rule as the manifest parser keeps it.
#[derive(Clone, Debug)]
pub(crate) struct KRule {
    pub pattern: String,
    pub action: &'static str,
    pub conditions: Vec<KCondition>,
}

/// `{arg, match, negate}`.
#[derive(Clone, Debug)]
pub(crate) struct KCondition {
    pub arg: String,
    pub pattern: String,
    pub negate: bool,
}

/// `isRegexMatcher`: `/^\/.*\/[a-z]*$/` and longer than two characters (`.` does not
/// cross a line terminator).
fn is_regex_matcher(pattern: &str) -> bool {
    if pattern.len() <= 2 || !pattern.starts_with('/') || pattern.contains(['\n', '\r']) {
        return false;
    }
    let close = pattern.rfind('/').unwrap_or(0);
    close > 0 && pattern[close + 1..].bytes().all(|b| b.is_ascii_lowercase())
}

/// `new RegExp(body, flags)`, or `None` where JavaScript throws.
fn js_regex(body: &str, flags: &str) -> Option<Regex> {
    let mut seen = String::new();
    for flag in flags.chars() {
        if !"dgimsuvy".contains(flag) || seen.contains(flag) {
            return None;
        }
        seen.push(flag);
    }
    RegexBuilder::new(body)
        .case_insensitive(flags.contains('i'))
        .multi_line(flags.contains('m'))
        .dot_matches_new_line(flags.contains('s'))
        .build()
        .ok()
}

/// `compileMatcher(pattern).test(text)`, with `matchesPolicy`'s `*` shortcut.
pub(crate) fn matches(pattern: &str, text: &str) -> bool {
    if pattern == "*" {
        return true;
    }
    if is_regex_matcher(pattern) {
        let close = pattern.rfind('/').unwrap_or(0);
        let body = &pattern[1..close];
        let flags = match &pattern[close + 1..] {
            "" => "i".to_string(),
            f if f.contains('i') => f.to_string(),
            f => format!("{f}i"),
        };
        // An invalid regex never matches.
        return js_regex(body, &flags).is_some_and(|r| r.is_match(text));
    }
    glob(
        pattern.to_ascii_lowercase().as_bytes(),
        text.to_ascii_lowercase().as_bytes(),
    )
}

/// `globToRegex`: anchored, `*` is `.*`, which does not cross a line terminator.
fn glob(p: &[u8], t: &[u8]) -> bool {
    match p.split_first() {
        None => t.is_empty(),
        Some((b'*', rest)) => {
            let run = t.iter().take_while(|&&b| b != b'\n' && b != b'\r').count();
            (0..=run).any(|i| glob(rest, &t[i..]))
        }
        Some((c, rest)) => t.first() == Some(c) && glob(rest, &t[1..]),
    }
}

/// `isValidMatcher` (without the nested-quantifier check; the generated regexes have
/// none).
fn is_valid_matcher(pattern: &str) -> bool {
    if !is_regex_matcher(pattern) {
        return !pattern.is_empty();
    }
    let close = pattern.rfind('/').unwrap_or(0);
    let flags = match &pattern[close + 1..] {
        "" => "i",
        f => f,
    };
    js_regex(&pattern[1..close], flags).is_some()
}

/// `areValidConditions`: a rule whose conditions fail it is dropped by the manifest
/// parser (`extractProjectPolicies`).
pub(crate) fn valid_conditions(conditions: &[KCondition]) -> bool {
    let segment_ok = |s: &str| {
        let mut bytes = s.bytes();
        bytes
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
            && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
            && !["__proto__", "constructor", "prototype"].contains(&s)
    };
    conditions.len() <= 10
        && conditions
            .iter()
            .all(|c| c.arg.split('.').all(segment_ok) && is_valid_matcher(&c.pattern))
}

/// `valueAtPath`: own properties only; anything but an object or array stops the walk.
fn value_at_path<'v>(args: &'v Value, path: &str) -> Option<&'v Value> {
    path.split('.')
        .try_fold(args, |cursor, segment| match cursor {
            Value::Object(map) => map.get(segment),
            Value::Array(items) => items.get(segment.parse::<usize>().ok()?),
            _ => None,
        })
}

/// `String(value)` for a JavaScript number: ECMAScript Number::toString, written here
/// from the specification's cases on the shortest round-tripping digits.
pub(crate) fn js_string_of_number(x: f64) -> String {
    if x == 0.0 {
        return "0".into();
    }
    let abs = x.abs();
    let sign = if x < 0.0 { "-" } else { "" };
    if (1e-6..1e21).contains(&abs) {
        // Rust's Display writes the shortest round-tripping digits in plain notation.
        return format!("{sign}{abs}");
    }
    let sci = format!("{abs:e}");
    let (mantissa, exponent) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let e_sign = if exponent < 0 { "-" } else { "+" };
    format!("{sign}{mantissa}e{e_sign}{}", exponent.abs())
}

/// `argValueMatches`.
fn arg_value_matches(value: Option<&Value>, pattern: &str) -> bool {
    match value {
        None | Some(Value::Null) | Some(Value::Object(_)) => false,
        Some(Value::Array(items)) => {
            !items.is_empty() && items.iter().all(|i| arg_value_matches(Some(i), pattern))
        }
        Some(Value::String(s)) => matches(pattern, s),
        Some(Value::Bool(b)) => matches(pattern, &b.to_string()),
        // JSON.parse reads every number as a double.
        Some(Value::Number(n)) => matches(
            pattern,
            &js_string_of_number(n.as_f64().unwrap_or(f64::NAN)),
        ),
    }
}

/// `conditionHolds`.
fn condition_holds(c: &KCondition, args: &Value) -> bool {
    let matched = arg_value_matches(value_at_path(args, &c.arg), &c.pattern);
    matched != c.negate
}

/// `firstMatchOrNull` with `argsAvailable: true`.
fn first_match(rules: &[KRule], tool: &str, args: &Value) -> Option<&'static str> {
    rules
        .iter()
        .filter(|r| matches(&r.pattern, tool))
        .find(|r| r.conditions.iter().all(|c| condition_holds(c, args)))
        .map(|r| r.action)
}

/// `resolveEffectiveAction`: project rules, then connector rules, then the default.
pub(crate) fn resolve(
    project: &[KRule],
    connector: &[KRule],
    default_mode: &str,
    read: bool,
    tool: &str,
    args: &Value,
) -> &'static str {
    if let Some(action) = first_match(project, tool, args) {
        return action;
    }
    if let Some(action) = first_match(connector, tool, args) {
        return action;
    }
    match (default_mode, read) {
        ("allow_all", _) | (_, true) => "always_run",
        _ => "require_approval",
    }
}
