//! Table-driven tests of the policy engine's decisions: patterns, conditions, numbers,
//! failing closed, evaluation order, default modes and cumulative limits.
//!
//! Each feature has one `check_*` helper and a table of cases.

use serde_json::{Value, json};
use threadgate_policy::{Catalog, Decision, MemoryHistory, Policy, Verdict};

const NOW: i64 = 1_700_000_000_000;
const DAY_MS: i64 = 24 * 60 * 60 * 1000;

fn decide(policy: &str, tool: &str, args: &Value) -> Decision {
    let policy = Policy::parse(policy, "test.yaml").unwrap_or_else(|e| panic!("{e}\n{policy}"));
    policy.decide(tool, args, &Catalog::builtin(), &MemoryHistory::new(), NOW)
}

fn summary(decision: &Decision) -> String {
    let line = decision
        .rule_line
        .map_or(String::new(), |l| format!(" @{l}"));
    format!("{} | {}{line}", decision.verdict, decision.because)
}

// --- tool patterns -------------------------------------------------------------------

/// A `block` rule with `pattern` under `allow_all`: a block means the pattern matched.
fn check_pattern(pattern: &str, tool: &str, expected: bool) {
    let policy = format!(
        "policy: {{default_mode: allow_all}}\npolicies:\n  - match: '{}'\n    action: block\n",
        pattern.replace('\'', "''")
    );
    let decision = decide(&policy, tool, &json!({}));
    assert_eq!(
        decision.verdict == Verdict::Block,
        expected,
        "pattern {pattern:?} on {tool:?}: {}",
        summary(&decision)
    );
}

#[test]
fn tool_patterns() {
    let cases = [
        ("github.*", "github.search_code", true),
        ("github.*", "GitHub.Search_Code", true),
        ("github.*", "xgithub.search_code", false),
        ("github.*", "github", false),
        ("*.delete_*", "stripe.delete_customer", true),
        ("*.delete_*", "stripe.undelete", false),
        ("*", "anything.at.all", true),
        ("*", "", true),
        ("stripe.*", "stripe.", true),
        ("stripe*refund", "stripe.create_refund", true),
        ("stripe*refund", "stripe.create_refund_later", false),
        ("*refund*", "stripe.create_refund_later", true),
        ("stripe.create_refund", "stripe.create_refund", true),
        ("stripe.create_refund", "STRIPE.CREATE_REFUND", true),
        ("stripe.create_refund", "stripe.create_refund_x", false),
        ("create", "stripe.create_refund", false),
        ("a*a", "a", false),
        ("a*a", "aa", true),
        ("a*b*c", "abxbxc", true),
        ("a*b*c", "acb", false),
        ("**", "x", true),
        ("stripe.get_?", "stripe.get_x", false),
        ("stripe.get_?", "stripe.get_?", true),
        ("stripe.[gl]*", "stripe.get_charge", false),
        ("/refund$/", "stripe.create_refund", true),
        ("/^stripe\\./", "github.search_code", false),
        ("/REFUND/", "stripe.create_refund", true),
        ("/create/", "stripe.create_refund", true),
        ("ÜBER.*", "über.tool", true),
        ("über.*", "ÜBER.TOOL", true),
    ];
    for (pattern, tool, expected) in cases {
        check_pattern(pattern, tool, expected);
    }
}

// --- conditions --------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq)]
enum Outcome {
    Holds,
    Fails,
    Unevaluable,
}
use Outcome::{Fails, Holds, Unevaluable};

/// Runs one condition under an `always_run` rule (default `risk`, unmatched writes hold)
/// and under a `block` rule (default `allow_all`, unmatched calls run), and reads the
/// condition's outcome off both.
fn check_condition(condition: &str, args: Value, expected: Outcome) {
    let rule = |action: &str, mode: &str| {
        format!(
            "policy: {{default_mode: {mode}}}\npolicies:\n  - match: stripe.create_refund\n    \
             action: {action}\n    conditions:\n      - {condition}\n"
        )
    };
    let allow = decide(&rule("always_run", "risk"), "stripe.create_refund", &args);
    let block = decide(&rule("block", "allow_all"), "stripe.create_refund", &args);
    let outcome = match (allow.verdict, block.verdict) {
        (Verdict::Run, Verdict::Block) => Holds,
        (Verdict::Hold, Verdict::Run) => Fails,
        (Verdict::Hold, Verdict::Block) => Unevaluable,
        _ => panic!("{condition} on {args}: inconsistent {allow:?} / {block:?}"),
    };
    assert_eq!(outcome, expected, "{condition} on {args}");
    let fail_closed = block.because.to_string().ends_with("(fail closed)");
    assert_eq!(fail_closed, expected == Unevaluable, "{}", block.because);
}

#[test]
fn match_conditions() {
    let reason = "{arg: reason, match: duplicate}";
    let cases = [
        (reason, json!({"reason": "duplicate"}), Holds),
        (reason, json!({"reason": "Duplicate"}), Holds),
        (reason, json!({"reason": "duplicates"}), Fails),
        (reason, json!({"reason": "a duplicate"}), Fails),
        (reason, json!({}), Fails),
        (reason, json!({"reason": null}), Fails),
        (reason, json!({"reason": {"kind": "duplicate"}}), Fails),
        (reason, json!({"reason": []}), Fails),
        (reason, json!({"reason": ["duplicate", "DUPLICATE"]}), Holds),
        (reason, json!({"reason": ["duplicate", "other"]}), Fails),
        (reason, json!({"reason": ["duplicate", null]}), Fails),
        (
            reason,
            json!({"reason": [["duplicate"], "duplicate"]}),
            Holds,
        ),
        (reason, json!({"reason": [[], "duplicate"]}), Fails),
        (
            "{arg: reason, match: '*dup*'}",
            json!({"reason": "a duplicate"}),
            Holds,
        ),
        (
            "{arg: reason, match: '/^dup/'}",
            json!({"reason": "Duplicate"}),
            Holds,
        ),
        (
            "{arg: amount, match: '4900'}",
            json!({"amount": 4900}),
            Holds,
        ),
        // Unquoted, written as JavaScript writes the number (`10.0` is a load error:
        // see policy_semantics.rs); `lint --kortix` warns that Kortix drops such a rule.
        ("{arg: amount, match: 4900}", json!({"amount": 4900}), Holds),
        (
            "{arg: amount, match: 4900}",
            json!({"amount": 4900.0}),
            Holds,
        ),
        ("{arg: amount, match: 4900}", json!({"amount": 490}), Fails),
        ("{arg: flag, match: true}", json!({"flag": true}), Holds),
        (
            "{arg: amount, match: '49*'}",
            json!({"amount": 4900}),
            Holds,
        ),
        (
            "{arg: amount, match: '49.5'}",
            json!({"amount": 49.5}),
            Holds,
        ),
        ("{arg: flag, match: 'true'}", json!({"flag": true}), Holds),
        ("{arg: flag, match: 'TRUE'}", json!({"flag": true}), Holds),
        ("{arg: flag, match: 'true'}", json!({"flag": "true"}), Holds),
        ("{arg: flag, match: 'true'}", json!({"flag": false}), Fails),
        ("{arg: a.b, match: x}", json!({"a": {"b": "x"}}), Holds),
        ("{arg: a.b, match: x}", json!({"a": "x"}), Fails),
        ("{arg: a.b, match: x}", json!({"a.b": "x"}), Fails),
        (
            "{arg: items.1, match: x}",
            json!({"items": ["y", "x"]}),
            Holds,
        ),
        (
            "{arg: items.2, match: x}",
            json!({"items": ["y", "x"]}),
            Fails,
        ),
        (
            "{arg: items.1.id, match: x}",
            json!({"items": [{}, {"id": "x"}]}),
            Holds,
        ),
        (
            "{arg: labels, match: 'bug*'}",
            json!({"labels": ["bug", "bugfix"]}),
            Holds,
        ),
    ];
    for (condition, args, expected) in cases {
        check_condition(condition, args, expected);
    }
}

#[test]
fn negated_conditions() {
    let not_dup = "{arg: reason, match: duplicate, negate: true}";
    let cases = [
        (not_dup, json!({"reason": "other"}), Holds),
        (not_dup, json!({"reason": "DUPLICATE"}), Fails),
        (not_dup, json!({}), Unevaluable),
        (not_dup, json!({"reason": null}), Unevaluable),
        (not_dup, json!({"reason": {}}), Unevaluable),
        (not_dup, json!({"reason": []}), Unevaluable),
        (not_dup, json!({"reason": ["other", null]}), Unevaluable),
        (not_dup, json!({"reason": ["other", {}]}), Unevaluable),
        (not_dup, json!({"reason": ["other", []]}), Unevaluable),
        (not_dup, json!({"reason": ["duplicate", "other"]}), Holds),
        (
            not_dup,
            json!({"reason": ["duplicate", "duplicate"]}),
            Fails,
        ),
        (not_dup, json!({"reason": 7}), Holds),
        (
            "{arg: reason, match: duplicate, negate: false}",
            json!({}),
            Fails,
        ),
    ];
    for (condition, args, expected) in cases {
        check_condition(condition, args, expected);
    }
}

#[test]
fn arguments_that_are_not_an_object() {
    for args in [json!([1, 2]), json!("duplicate"), json!(null), json!(4900)] {
        check_condition("{arg: reason, match: duplicate}", args.clone(), Unevaluable);
        check_condition("{arg: amount, gt: 1}", args, Unevaluable);
    }
}

#[test]
fn numeric_conditions() {
    let over = "{arg: amount, gt: 10000}";
    let cases = [
        (over, json!({"amount": 10001}), Holds),
        (over, json!({"amount": 10000}), Fails),
        (over, json!({"amount": 10000.5}), Holds),
        (over, json!({"amount": 9999.99}), Fails),
        (over, json!({"amount": -20000}), Fails),
        (over, json!({"amount": "20000"}), Unevaluable),
        (over, json!({}), Unevaluable),
        (over, json!({"amount": null}), Unevaluable),
        (over, json!({"amount": true}), Unevaluable),
        (over, json!({"amount": {"value": 20000}}), Unevaluable),
        (over, json!({"amount": [20000, 30000]}), Holds),
        (over, json!({"amount": [20000, 5]}), Fails),
        (over, json!({"amount": []}), Unevaluable),
        (over, json!({"amount": [20000, "x"]}), Unevaluable),
        ("{arg: amount, gte: 10000}", json!({"amount": 10000}), Holds),
        ("{arg: amount, gte: 10000}", json!({"amount": 9999}), Fails),
        ("{arg: amount, lt: 100}", json!({"amount": 99.999}), Holds),
        ("{arg: amount, lt: 100}", json!({"amount": 100}), Fails),
        ("{arg: amount, lte: 100}", json!({"amount": 100.0}), Holds),
        (
            "{arg: amount, lte: 100}",
            json!({"amount": 100.0000000000001}),
            Fails,
        ),
        ("{arg: amount, gt: -5}", json!({"amount": -4}), Holds),
        ("{arg: amount, gt: -5}", json!({"amount": -6}), Fails),
        ("{arg: amount, gt: 0.1}", json!({"amount": 0.10}), Fails),
        ("{arg: amount, gt: 0}", json!({"amount": -0.0}), Fails),
        ("{arg: amount, gte: 0}", json!({"amount": -0.0}), Holds),
        ("{arg: amount, gt: 1e3}", json!({"amount": 1001}), Holds),
        (
            "{arg: amount, gt: 1.5e-3}",
            json!({"amount": 0.0016}),
            Holds,
        ),
        (
            "{arg: amount, lt: 1e-300}",
            json!({"amount": 1e-301}),
            Holds,
        ),
        // Through f64 both sides would be 2^53 and the comparison would fail.
        (
            "{arg: amount, gt: 9007199254740992}",
            json!({"amount": 9_007_199_254_740_993_u64}),
            Holds,
        ),
        (
            "{arg: amount, gt: 18446744073709551614}",
            json!({"amount": u64::MAX}),
            Holds,
        ),
        (
            "{arg: amount, lt: -9223372036854775807}",
            json!({"amount": i64::MIN}),
            Holds,
        ),
        (
            "{arg: amount, gt: 100, negate: true}",
            json!({"amount": 50}),
            Holds,
        ),
        (
            "{arg: amount, gt: 100, negate: true}",
            json!({"amount": 500}),
            Fails,
        ),
        (
            "{arg: amount, gt: 100, negate: true}",
            json!({}),
            Unevaluable,
        ),
        (
            "{arg: amount, gt: 100, negate: true}",
            json!({"amount": "5"}),
            Unevaluable,
        ),
    ];
    for (condition, args, expected) in cases {
        check_condition(condition, args, expected);
    }
}

// --- whole rules: several conditions, order, default mode -----------------------------

/// Decides calls against one policy and compares each `verdict | because @line`.
fn check_decisions(policy: &str, cases: &[(&str, Value, &str)]) {
    for (tool, args, expected) in cases {
        let decision = decide(policy, tool, args);
        assert_eq!(summary(&decision), *expected, "{tool} {args}");
    }
}

#[test]
fn several_conditions_fail_closed_as_a_rule() {
    let policy = "\
policies:
  - match: stripe.create_refund
    action: block
    conditions:
      - {arg: reason, match: fraudulent}
      - {arg: amount, gt: 100}
  - match: stripe.create_refund
    action: always_run
    conditions:
      - {arg: reason, match: duplicate}
      - {arg: amount, lte: 100}
";
    check_decisions(
        policy,
        &[
            (
                "stripe.create_refund",
                json!({"reason": "fraudulent", "amount": 500}),
                "block | rule stripe.create_refund + 2 conditions @2",
            ),
            (
                "stripe.create_refund",
                json!({"reason": "duplicate", "amount": 50}),
                "run | rule stripe.create_refund + 2 conditions @7",
            ),
            // The block rule's first condition definitely fails, so its second, which
            // cannot be evaluated, does not matter (three-valued AND, as in Kortix); the
            // always_run rule's amount cannot be evaluated, so it does not apply.
            (
                "stripe.create_refund",
                json!({"reason": "duplicate"}),
                "hold | default_mode: risk (write)",
            ),
            // Nothing fails and one condition cannot be evaluated: the block rule
            // fails closed.
            (
                "stripe.create_refund",
                json!({"reason": "fraudulent"}),
                "block | rule stripe.create_refund + condition not evaluable (fail closed) @2",
            ),
            (
                "stripe.create_refund",
                json!({"reason": "duplicate", "amount": 500}),
                "hold | default_mode: risk (write)",
            ),
            (
                "stripe.create_refund",
                json!({"reason": "other", "amount": 50}),
                "hold | default_mode: risk (write)",
            ),
        ],
    );
}

#[test]
fn first_match_wins_then_connector_rules_then_default_mode() {
    let risk = "\
policies:
  - match: 'stripe.*'
    action: always_run
    conditions:
      - {arg: customer, match: cus_trusted}
  - match: '/delete/'
    action: require_approval
  - match: '*.delete_*'
    action: block
";
    check_decisions(
        risk,
        &[
            (
                "stripe.delete_customer",
                json!({"customer": "cus_trusted"}),
                "run | rule stripe.* + condition @2",
            ),
            (
                "stripe.delete_customer",
                json!({"customer": "cus_other"}),
                "hold | rule /delete/ @6",
            ),
            ("github.delete_repo", json!({}), "hold | rule /delete/ @6"),
            (
                "stripe.get_charge",
                json!({"charge": "ch_1"}),
                "run | default_mode: risk (read)",
            ),
            (
                "stripe.create_refund",
                json!({"charge": "ch_1"}),
                "hold | default_mode: risk (write)",
            ),
            (
                "stripe.cancel_subscription",
                json!({}),
                "hold | connector rule stripe.cancel_subscription",
            ),
            (
                "helpdesk.mark_done",
                json!({}),
                "hold | default_mode: risk (write)",
            ),
            (
                "unknown.tool",
                json!({}),
                "hold | default_mode: risk (unknown tool, write)",
            ),
            // Case-insensitive matching does not make an unknown spelling a catalog tool.
            (
                "STRIPE.GET_CHARGE",
                json!({}),
                "hold | default_mode: risk (unknown tool, write)",
            ),
        ],
    );
    let allow_all = "policy:\n  default_mode: allow_all\npolicies: []\n";
    check_decisions(
        allow_all,
        &[
            (
                "stripe.create_refund",
                json!({}),
                "run | default_mode: allow_all",
            ),
            ("unknown.tool", json!({}), "run | default_mode: allow_all"),
            (
                "stripe.delete_customer",
                json!({}),
                "hold | connector rule stripe.delete_customer",
            ),
        ],
    );
    let empty = "";
    check_decisions(
        empty,
        &[(
            "helpdesk.get_thread",
            json!({}),
            "run | default_mode: risk (read)",
        )],
    );
}

// --- cumulative limits -------------------------------------------------------------

const LIMITED: &str = "\
policies:
  - match: stripe.create_refund
    action: always_run
    conditions:
      - {arg: amount, lte: 2500}
    limits:
      - {sum: amount, per: customer, window: 24h, max: 5000}
  - match: stripe.create_refund
    action: require_approval
";

/// Decides calls in order at the given times, recording each run's charges, and
/// compares the verdicts.
fn check_limits(policy: &str, calls: &[(i64, Value, Verdict)]) {
    let policy = Policy::parse(policy, "limits.yaml").unwrap_or_else(|e| panic!("{e}"));
    let catalog = Catalog::builtin();
    let mut history = MemoryHistory::new();
    for (i, (at, args, expected)) in calls.iter().enumerate() {
        let decision = policy.decide("stripe.create_refund", args, &catalog, &history, *at);
        assert_eq!(decision.verdict, *expected, "call {i}: {args} {decision:?}");
        if decision.verdict == Verdict::Run {
            assert!(!decision.charges.is_empty());
            for charge in &decision.charges {
                history.record(charge, *at);
            }
        } else {
            assert!(decision.charges.is_empty());
        }
    }
}

#[test]
fn limits_sum_per_value_and_currency_in_a_rolling_window() {
    let a = |amount: i64| json!({"amount": amount, "customer": "cus_a"});
    let usd = |customer: &str, amount: i64| json!({"amount": amount, "customer": customer, "currency": "usd"});
    use Verdict::{Hold, Run};
    let cases = [
        (NOW, a(2500), Run),
        (NOW + 1, a(2500), Run),
        (NOW + 2, a(1), Hold),
        (NOW + 3, json!({"amount": 2500, "customer": "cus_b"}), Run),
        (NOW + 4, usd("cus_a", 2500), Run),
        (
            NOW + 5,
            json!({"amount": 2500, "customer": "cus_a", "currency": "USD"}),
            Run,
        ),
        (NOW + 6, usd("cus_a", 1), Hold),
        (
            NOW + 7,
            json!({"amount": 2500, "customer": "cus_a", "currency": "eur"}),
            Run,
        ),
        // The first charge leaves the window exactly one day later.
        (NOW + DAY_MS - 1, a(2500), Hold),
        (NOW + DAY_MS, a(2500), Run),
        (NOW + DAY_MS + 1, a(2500), Run),
    ];
    check_limits(LIMITED, &cases);
}

#[test]
fn limits_do_not_match_when_their_arguments_are_unusable() {
    use Verdict::{Hold, Run};
    let cases = [
        (NOW, json!({"amount": 100}), Hold),
        (NOW, json!({"customer": "cus_a"}), Hold),
        (NOW, json!({"amount": 100, "customer": null}), Hold),
        (NOW, json!({"amount": 100, "customer": ""}), Hold),
        (
            NOW,
            json!({"amount": 100, "customer": {"id": "cus_a"}}),
            Hold,
        ),
        (NOW, json!({"amount": 100.5, "customer": "cus_a"}), Hold),
        (NOW, json!({"amount": -100, "customer": "cus_a"}), Hold),
        (
            NOW,
            json!({"amount": 100, "customer": "cus_a", "currency": 840}),
            Hold,
        ),
        (NOW, json!({"amount": 100, "customer": 42}), Run),
        (NOW, json!({"amount": 0, "customer": "cus_a"}), Run),
    ];
    check_limits(LIMITED, &cases);
}

#[test]
fn charges_name_the_rule_the_paths_the_value_and_the_currency() {
    let args = json!({"amount": 1200, "customer": "cus_a", "currency": "USD"});
    let decision = decide(LIMITED, "stripe.create_refund", &args);
    assert_eq!(decision.charges.len(), 1);
    let charge = &decision.charges[0];
    assert_eq!(
        charge.key,
        r#"["stripe.create_refund","amount","customer","cus_a","usd"]"#
    );
    assert_eq!(charge.amount, 1200);
    assert_eq!(charge.window_ms, DAY_MS);
    let again = decide(LIMITED, "stripe.create_refund", &args);
    assert_eq!(again.charges, decision.charges);
    let unlimited = decide(LIMITED, "stripe.create_refund", &json!({"amount": 9000}));
    assert_eq!(unlimited.charges.capacity(), 0);
}

#[test]
fn a_limit_larger_than_any_u64_sum_still_compares() {
    let policy = "\
policies:
  - match: stripe.create_refund
    action: always_run
    limits:
      - {sum: amount, per: customer, window: 1h, max: 100000000000000000000}
";
    check_limits(
        policy,
        &[
            (
                NOW,
                json!({"amount": u64::MAX, "customer": "c"}),
                Verdict::Run,
            ),
            (
                NOW,
                json!({"amount": u64::MAX, "customer": "c"}),
                Verdict::Run,
            ),
            (
                NOW,
                json!({"amount": u64::MAX, "customer": "c"}),
                Verdict::Run,
            ),
            (
                NOW,
                json!({"amount": u64::MAX, "customer": "c"}),
                Verdict::Run,
            ),
            (
                NOW,
                json!({"amount": u64::MAX, "customer": "c"}),
                Verdict::Run,
            ),
            (
                NOW,
                json!({"amount": u64::MAX, "customer": "c"}),
                Verdict::Hold,
            ),
        ],
    );
}

#[test]
fn a_policy_can_be_shared_across_threads() {
    fn shareable<T: Send + Sync + 'static>(_: &T) -> bool {
        true
    }
    let policy = Policy::parse("policies: []\n", "p.yaml").unwrap_or_else(|e| panic!("{e}"));
    assert!(shareable(&policy));
    let handle = std::thread::spawn(move || {
        policy
            .decide(
                "stripe.get_charge",
                &json!({}),
                &Catalog::builtin(),
                &MemoryHistory::new(),
                NOW,
            )
            .verdict
    });
    assert_eq!(handle.join().ok(), Some(Verdict::Run));
}
