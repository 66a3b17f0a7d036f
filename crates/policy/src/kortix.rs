//! `threadgate lint --kortix`: every line of a valid policy file that Kortix's evaluator
//! would read differently, and why. The differences are deliberate: where threadgate
//! departs from Kortix it is stricter, never weaker (see the module docs of `policy`).

use super::lint::{Diagnostic, Severity};
use super::rule::{Rule, Test};
use super::yaml::{self, Kind, Node};
use super::{Action, Policy, Pos};

/// The lines Kortix reads differently, as warnings in file order; empty when the file is
/// invalid (plain `lint` reports its errors).
pub fn kortix_differences(source: &str, file_name: &str) -> Vec<Diagnostic> {
    let Ok(policy) = Policy::parse(source, file_name) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    let root = yaml::parse(source).ok().and_then(|(root, _)| root);
    let section = |name: &str| root.as_ref().and_then(|r| field(r, name)).map(|n| n.pos);
    match root
        .as_ref()
        .and_then(|r| field(r, "policy"))
        .and_then(|p| field(p, "default_mode"))
    {
        Some(_) => {}
        None => found.push((
            section("policy").unwrap_or(Pos { line: 1, column: 1 }),
            "no `policy.default_mode`: Kortix defaults to allow_all (every unmatched call \
             runs), threadgate to risk (unmatched writes wait for a person)"
                .to_string(),
        )),
    }
    if let Some(pos) = section("approvals") {
        found.push((
            pos,
            "Kortix has no `approvals`: its approvals do not expire after a ttl".to_string(),
        ));
    }
    for rule in &policy.rules {
        rule_differences(rule, &mut found);
    }
    let mut diagnostics: Vec<Diagnostic> = found
        .into_iter()
        .map(|(pos, message)| Diagnostic {
            severity: Severity::Warning,
            file: file_name.to_string(),
            pos,
            message: format!("kortix reads this differently: {message}"),
        })
        .collect();
    diagnostics.sort_by_key(|d| d.pos);
    diagnostics
}

fn rule_differences(rule: &Rule, found: &mut Vec<(Pos, String)>) {
    let dropped = "Kortix finds the rule's conditions malformed and drops the whole rule";
    for condition in &rule.conditions {
        let path = &condition.path.text;
        if let Test::Compare(..) = condition.test {
            found.push((
                condition.pos,
                format!("`gt`/`gte`/`lt`/`lte` are threadgate extensions; {dropped}"),
            ));
        } else if condition.negate {
            found.push((
                condition.pos,
                format!(
                    "a negated condition on a missing, null, object or empty `{path}` holds in \
                     Kortix; threadgate cannot evaluate it, so {}",
                    match rule.action {
                        Action::AlwaysRun => "this always_run rule does not apply",
                        _ => "this rule matches (fail closed)",
                    }
                ),
            ));
        }
        if !kortix_path(path) {
            found.push((
                condition.pos,
                format!("Kortix accepts only identifier segments in `arg` (`{path}`); {dropped}"),
            ));
        }
    }
    for condition in &rule.evidence {
        found.push((
            condition.pos,
            format!("evidence conditions are a threadgate extension; {dropped}"),
        ));
    }
    for limit in &rule.limits {
        found.push((
            limit.pos,
            "`limits` are a threadgate extension Kortix ignores: there the rule applies \
             without them"
                .to_string(),
        ));
    }
}

/// Kortix's `ARG_PATH_REGEX` and forbidden segments.
fn kortix_path(path: &str) -> bool {
    path.split('.').all(|segment| {
        let mut bytes = segment.bytes();
        bytes
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
            && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
            && !["__proto__", "constructor", "prototype"].contains(&segment)
    })
}

fn field<'n, 'a>(node: &'n Node<'a>, key: &str) -> Option<&'n Node<'a>> {
    let Kind::Map(pairs) = &node.kind else {
        return None;
    };
    pairs
        .iter()
        .find(|(k, _)| k.scalar() == Some(key))
        .map(|(_, value)| value)
}
