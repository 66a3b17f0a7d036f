//! `threadgate lint --kortix`: every line of a valid policy file that Kortix's evaluator
//! would read differently, and why. The differences are deliberate: where threadgate
//! departs from Kortix it is stricter, never weaker (see the module docs of `policy`).

use super::lint::{Diagnostic, Severity};
use super::pattern::{Pattern, regex_literal};
use super::rule::{Condition, Rule, Test};
use super::yaml::{self, Kind, Node, ScalarType};
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
    if rule.written != ScalarType::String {
        found.push((rule.pos, not_a_string(rule.written)));
    }
    for condition in &rule.conditions {
        condition_differences(rule.action, condition, found);
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

fn condition_differences(action: Action, condition: &Condition, found: &mut Vec<(Pos, String)>) {
    let dropped = "Kortix finds the rule's conditions malformed and drops the whole rule";
    let path = &condition.path.text;
    match &condition.test {
        Test::Compare(..) => found.push((
            condition.pos,
            format!("`gt`/`gte`/`lt`/`lte` are threadgate extensions; {dropped}"),
        )),
        Test::Match(..) if condition.written != ScalarType::String => {
            found.push((condition.pos, not_a_string(condition.written)));
        }
        Test::Match(Pattern::Regex(_), text) if nested_quantifier(text) => found.push((
            condition.pos,
            format!(
                "`{text}` nests a quantifier in a quantified group (like `(a+)+`), a \
                 shape Kortix refuses as catastrophic backtracking; {dropped}"
            ),
        )),
        Test::Match(..) => {}
    }
    // In a `block` or `require_approval` rule the verdict is the same: Kortix's
    // condition holds, threadgate's fails closed.
    if condition.negate && action == Action::AlwaysRun {
        found.push((
            condition.pos,
            format!(
                "a negated condition on a missing, null, object or empty `{path}` holds in \
                 Kortix; threadgate cannot evaluate it, so this always_run rule does not \
                 apply"
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

fn not_a_string(written: ScalarType) -> String {
    format!(
        "Kortix drops this rule: match is not a string (its YAML reader reads it as {}); \
         quote it for both to read it alike",
        written.as_str()
    )
}

/// Kortix's `hasNestedQuantifier` on a `/body/flags` literal: a group followed by `*`,
/// `+` or `{` whose text, escapes removed, holds `*`, `+` or a `{n,m}` with a comma.
fn nested_quantifier(literal: &str) -> bool {
    let Ok((body, _)) = regex_literal(literal) else {
        return false;
    };
    let chars: Vec<char> = body.chars().collect();
    let opens = chars.iter().enumerate().filter(|&(_, &c)| c == '(');
    opens.map(|(i, _)| i).any(|i| {
        let (mut depth, mut j) = (1, i + 1);
        while depth > 0
            && let Some(&c) = chars.get(j)
        {
            match c {
                '\\' => j += 1,
                '(' => depth += 1,
                ')' => depth -= 1,
                _ => {}
            }
            j += 1;
        }
        if depth != 0 || !matches!(chars.get(j), Some('*' | '+' | '{')) {
            return false;
        }
        let mut inner = Vec::new();
        let mut k = i + 1;
        while k + 1 < j {
            match chars.get(k) {
                Some('\\') => k += 2,
                Some(&c) => {
                    inner.push(c);
                    k += 1;
                }
                None => break,
            }
        }
        inner.contains(&'*') || inner.contains(&'+') || has_comma_repetition(&inner)
    })
}

/// Whether `text` holds `{digits,digits}` (either run may be empty).
fn has_comma_repetition(text: &[char]) -> bool {
    let opens = text.iter().enumerate().filter(|&(_, &c)| c == '{');
    opens.map(|(i, _)| i).any(|i| {
        let rest = text.get(i + 1..).unwrap_or_default();
        let first = rest.iter().take_while(|c| c.is_ascii_digit()).count();
        if rest.get(first) != Some(&',') {
            return false;
        }
        let second = rest
            .get(first + 1..)
            .unwrap_or_default()
            .iter()
            .take_while(|c| c.is_ascii_digit())
            .count();
        rest.get(first + 1 + second) == Some(&'}')
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The `kortix reads this differently: …` warnings, as `line: message`.
    fn warnings(source: &str) -> Vec<String> {
        kortix_differences(source, "p.yaml")
            .into_iter()
            .map(|d| {
                let message = d.message;
                let message = message.strip_prefix("kortix reads this differently: ");
                format!("{}: {}", d.pos.line, message.unwrap_or("(no prefix)"))
            })
            .collect()
    }

    const MODE: &str = "policy:\n  default_mode: risk\n";

    fn rule(action: &str, condition: &str) -> String {
        format!(
            "{MODE}policies:\n  - match: stripe.create_refund\n    action: {action}\n    conditions:\n      - {condition}\n"
        )
    }

    #[test]
    fn an_unquoted_number_or_boolean_match_is_not_a_string_for_kortix() {
        let dropped = "7: Kortix drops this rule: match is not a string (its YAML reader reads \
                       it as a number); quote it for both to read it alike";
        assert_eq!(
            warnings(&rule("block", "{arg: amount, match: 4900}")),
            [dropped]
        );
        assert_eq!(
            warnings(&rule("block", "{arg: amount, match: -2.5}")),
            [dropped]
        );
        assert!(warnings(&rule("block", "{arg: flag, match: true}"))[0].contains("a boolean"));
        assert!(warnings(&rule("block", "{arg: amount, match: '4900'}")).is_empty());
        assert!(warnings(&rule("block", "{arg: amount, match: \"4900\"}")).is_empty());
        assert!(warnings(&rule("block", "{arg: amount, match: 49*}")).is_empty());
        let tool = format!("{MODE}policies:\n  - match: 4900\n    action: block\n");
        assert_eq!(warnings(&tool).len(), 1);
        assert!(warnings(&tool)[0].starts_with("4: Kortix drops this rule"));
    }

    #[test]
    fn a_nested_quantifier_in_a_condition_is_dropped_by_kortix() {
        // Kortix's check is a heuristic on the text: a class's parentheses count too.
        for body in [
            "(a+)+",
            "^(a|b*)*$",
            "(x{1,})+",
            "(?:a{2,3}){2}",
            "((ab)+c)*",
            "[(a+)+]x",
        ] {
            let found = warnings(&rule(
                "always_run",
                &format!("{{arg: reason, match: '/{body}/'}}"),
            ));
            assert_eq!(found.len(), 1, "{body}: {found:?}");
            assert!(found[0].contains("catastrophic backtracking"), "{found:?}");
        }
        for body in ["(a+)", "(a)+", r"(a\+)+", "(a{2})+", "a+b*"] {
            let found = warnings(&rule(
                "always_run",
                &format!("{{arg: reason, match: '/{body}/'}}"),
            ));
            assert!(found.is_empty(), "{body}: {found:?}");
        }
        assert!(nested_quantifier("/(a+)+$/i"));
        assert!(!nested_quantifier("(a+)+"));
    }

    #[test]
    fn a_negated_condition_is_a_difference_only_in_an_always_run_rule() {
        let negated = "{arg: reason, match: fraud, negate: true}";
        assert_eq!(
            warnings(&rule("always_run", negated)),
            [
                "7: a negated condition on a missing, null, object or empty `reason` holds in \
              Kortix; threadgate cannot evaluate it, so this always_run rule does not apply"
            ]
        );
        // A restrictive rule gives the same verdict in both: no warning.
        assert!(warnings(&rule("block", negated)).is_empty());
        assert!(warnings(&rule("require_approval", negated)).is_empty());
    }

    #[test]
    fn approvals_and_non_identifier_args_are_named() {
        let source = format!("{MODE}approvals:\n  ttl: 2h\npolicies: []\n");
        assert_eq!(
            warnings(&source),
            ["4: Kortix has no `approvals`: its approvals do not expire after a ttl"]
        );
        assert_eq!(
            warnings(&rule("block", "{arg: items.0, match: x}")),
            [
                "7: Kortix accepts only identifier segments in `arg` (`items.0`); Kortix finds \
              the rule's conditions malformed and drops the whole rule"
            ]
        );
        assert!(warnings(&rule("block", "{arg: customer.id, match: x}")).is_empty());
    }
}
