//! Issue 13's readings, each on the example that showed it (the three-valued AND, regex
//! literals with flags, numbers as JavaScript writes them), and evidence conditions
//! (issue 7 item 1) in the engine: parsed, decided, failing closed when not gathered.

use serde_json::{Value, json};
use threadgate_policy::{Catalog, Evidence, EvidenceKind, Finding, MemoryHistory, Policy, Verdict};

fn policy(source: &str) -> Policy {
    Policy::parse(source, "p.yaml").unwrap_or_else(|e| panic!("{e}"))
}

fn verdict(policy: &Policy, tool: &str, args: Value, evidence: &Evidence) -> Verdict {
    let catalog = Catalog::builtin();
    policy
        .decide_with_evidence(tool, &args, &catalog, &MemoryHistory::new(), 0, evidence)
        .verdict
}

fn load_error(source: &str) -> String {
    match Policy::parse(source, "p.yaml") {
        Ok(_) => panic!("accepted:\n{source}"),
        Err(error) => error.to_string(),
    }
}

#[test]
fn a_definitely_failing_condition_rules_the_rule_out_and_a_later_block_applies() {
    let p = policy(
        "policies:
  - match: stripe.create_refund
    action: require_approval
    conditions:
      - {arg: reason, match: 'fraud*'}
      - {arg: currency, match: usd, negate: true}
  - match: stripe.create_refund
    action: block
",
    );
    let none = Evidence::none();
    let call = json!({"charge": "ch_1", "reason": "duplicate"});
    assert_eq!(
        verdict(&p, "stripe.create_refund", call, &none),
        Verdict::Block
    );
    // Nothing fails and `currency` cannot be judged: the restrictive rule fails closed.
    let call = json!({"charge": "ch_1", "reason": "fraudulent"});
    assert_eq!(
        verdict(&p, "stripe.create_refund", call, &none),
        Verdict::Hold
    );
}

#[test]
fn regex_literals_take_javascript_flags() {
    let none = Evidence::none();
    let p = policy("policies:\n  - match: /delete/i\n    action: block\n");
    assert_eq!(
        verdict(
            &p,
            "stripe.delete_customer",
            json!({"customer": "cus_1"}),
            &none
        ),
        Verdict::Block
    );
    let p = policy(
        "policies:
  - match: helpdesk.reply_to_thread
    action: block
    conditions:
      - {arg: text, match: '/^refund$/m'}
  - match: helpdesk.add_note
    action: block
    conditions:
      - {arg: text, match: '/a.b/s'}
  - match: helpdesk.*
    action: always_run
",
    );
    let reply = json!({"text": "hello\nRefund\nbye"});
    assert_eq!(
        verdict(&p, "helpdesk.reply_to_thread", reply, &none),
        Verdict::Block
    );
    let note = json!({"text": "a\nb"});
    assert_eq!(
        verdict(&p, "helpdesk.add_note", note, &none),
        Verdict::Block
    );
    let p = policy("policies:\n  - match: '/a.b/gyu'\n    action: block\n");
    assert_eq!(verdict(&p, "a.b", json!({}), &none), Verdict::Block);
    assert_eq!(verdict(&p, "a\nb", json!({}), &none), Verdict::Hold);
}

#[test]
fn malformed_regex_literals_are_load_errors_with_positions() {
    let cases = [
        (
            "policies:\n  - match: /delete\n    action: block\n",
            "p.yaml:2:12: `/delete` starts with `/` but is not a regular expression `/body/flags` (no closing `/`); no tool name contains `/`",
        ),
        (
            "policies:\n  - match: /delete/x\n    action: block\n",
            "p.yaml:2:12: unknown regular expression flag `x` in `/delete/x`; expected i, m, s, u or v (d, g and y are ignored)",
        ),
        (
            "policies:\n  - match: /delete/ii\n    action: block\n",
            "p.yaml:2:12: flag `i` is repeated in `/delete/ii`",
        ),
        (
            "policies:\n  - match: //\n    action: block\n",
            "p.yaml:2:12: `//` is an empty regular expression",
        ),
        (
            "policies:\n  - match: x\n    action: block\n    conditions:\n      - {arg: a, match: '/x/I'}\n",
            "p.yaml:5:25: unknown regular expression flag `I` in `/x/I`; expected i, m, s, u or v (d, g and y are ignored)",
        ),
    ];
    for (source, expected) in cases {
        assert_eq!(load_error(source), expected);
    }
}

#[test]
fn numbers_are_matched_as_javascript_writes_them() {
    let none = Evidence::none();
    let p = policy(
        "policies:\n  - match: x.y\n    action: block\n    conditions:\n      - {arg: n, match: '10'}\n  - match: x.z\n    action: block\n    conditions:\n      - {arg: n, match: '1e+21'}\n  - match: x.w\n    action: block\n    conditions:\n      - {arg: n, match: '0'}\n",
    );
    let n = |text: &str| json!({ "n": serde_json::from_str::<Value>(text).expect("number") });
    assert_eq!(verdict(&p, "x.y", n("10.0"), &none), Verdict::Block);
    assert_eq!(verdict(&p, "x.y", n("1e1"), &none), Verdict::Block);
    assert_eq!(verdict(&p, "x.z", n("1e21"), &none), Verdict::Block);
    assert_eq!(
        verdict(&p, "x.z", n("1000000000000000000000"), &none),
        Verdict::Block
    );
    assert_eq!(verdict(&p, "x.w", n("-0.0"), &none), Verdict::Block);
    assert_eq!(verdict(&p, "x.w", n("0.5"), &none), Verdict::Hold);
}

const DUPLICATE: &str = "policies:
  - match: stripe.create_refund
    action: always_run
    conditions:
      - {arg: reason, match: duplicate}
      - {evidence: duplicate_charge, within: 7d}
  - match: stripe.create_refund
    action: require_approval
";

#[test]
fn evidence_conditions_decide_on_what_the_gateway_found_and_fail_closed_without_it() {
    let p = policy(DUPLICATE);
    assert_eq!(
        p.evidence_wanted("stripe.create_refund"),
        [EvidenceKind::DuplicateCharge]
    );
    assert!(p.evidence_wanted("stripe.get_charge").is_empty());
    let call = || json!({"charge": "ch_1", "reason": "duplicate", "amount": 100});
    let mut found = Evidence::none();
    found.insert(
        EvidenceKind::DuplicateCharge,
        Finding::Found {
            apart_ms: 3_600_000,
        },
    );
    let mut far = Evidence::none();
    far.insert(
        EvidenceKind::DuplicateCharge,
        Finding::Found {
            apart_ms: 8 * 86_400_000,
        },
    );
    let mut missing = Evidence::none();
    missing.insert(EvidenceKind::DuplicateCharge, Finding::NotFound);
    let tool = "stripe.create_refund";
    assert_eq!(verdict(&p, tool, call(), &found), Verdict::Run);
    assert_eq!(verdict(&p, tool, call(), &far), Verdict::Hold);
    assert_eq!(verdict(&p, tool, call(), &missing), Verdict::Hold);
    assert_eq!(verdict(&p, tool, call(), &Evidence::none()), Verdict::Hold);

    // A restrictive rule with evidence it cannot check matches (fail closed).
    let block = policy(
        "policies:\n  - match: stripe.create_refund\n    action: block\n    conditions:\n      - {evidence: duplicate_charge, within: 1d}\n",
    );
    let decision = block.decide(tool, &call(), &Catalog::builtin(), &MemoryHistory::new(), 0);
    assert_eq!(decision.verdict, Verdict::Block);
    assert_eq!(decision.evidence.len(), 1);
    assert_eq!(
        decision.evidence[0].to_string(),
        "duplicate_charge within 1d (line 5): not gathered, cannot be evaluated (fail closed)"
    );
}

#[test]
fn malformed_evidence_conditions_are_load_errors() {
    let rule = |condition: &str| {
        format!(
            "policies:\n  - match: stripe.create_refund\n    action: block\n    conditions:\n      - {condition}\n"
        )
    };
    let cases = [
        (
            "{evidence: same_amount, within: 7d}",
            "p.yaml:5:20: unknown evidence `same_amount`; expected duplicate_charge",
        ),
        (
            "{evidence: duplicate_charge}",
            "p.yaml:5:9: evidence condition has no `within`, like `within: 7d`",
        ),
        (
            "{evidence: duplicate_charge, within: soon}",
            "p.yaml:5:46: `within` must be a duration like 4h, 30m or 1h30m, not `soon`",
        ),
        (
            "{evidence: duplicate_charge, within: 7d, negate: true}",
            "p.yaml:5:50: unknown key `negate` in an evidence condition; expected evidence or within",
        ),
    ];
    for (condition, expected) in cases {
        assert_eq!(load_error(&rule(condition)), expected, "{condition}");
    }
}

#[test]
fn a_glob_star_does_not_cross_a_line_terminator() {
    let p = policy(
        "policies:\n  - match: helpdesk.reply_to_thread\n    action: always_run\n    conditions:\n      - {arg: text, match: '*@example.com'}\n",
    );
    let none = Evidence::none();
    let ok = json!({"text": "ada@example.com"});
    assert_eq!(
        verdict(&p, "helpdesk.reply_to_thread", ok, &none),
        Verdict::Run
    );
    for text in [
        "x@evil.com\n@example.com",
        "x\r@example.com",
        "x\u{2028}@example.com",
    ] {
        let call = json!({ "text": text });
        assert_eq!(
            verdict(&p, "helpdesk.reply_to_thread", call, &none),
            Verdict::Hold,
            "{text:?}"
        );
    }
}

/// A `block` rule on `x.y` with one condition `{arg: n, match: MATCH}` (MATCH as written).
fn block_if(written: &str) -> String {
    format!(
        "policies:\n  - match: x.y\n    action: block\n    conditions:\n      - {{arg: n, match: {written}}}\n"
    )
}

#[test]
fn an_unquoted_number_not_written_as_javascript_writes_it_is_a_load_error() {
    // `String(10.0)` is `10` in JavaScript: `match: 10.0` could never match a number, and
    // this block rule would block nothing.
    let cases = [
        ("10.0", "10"),
        ("1e3", "1000"),
        ("+5", "5"),
        ("007", "7"),
        ("-0", "0"),
        (".5", "0.5"),
        ("0x10", "16"),
        ("0o17", "15"),
        ("12345678901234567890", "12345678901234567000"),
        (".inf", "Infinity"),
    ];
    for (written, js) in cases {
        assert_eq!(
            load_error(&block_if(written)),
            format!(
                "p.yaml:5:25: unquoted `match: {written}` can never match a number: numbers are \
                 compared as JavaScript writes them, here `{js}`; write `match: '{js}'`, or \
                 quote `'{written}'` to match that text"
            )
        );
    }
    let none = Evidence::none();
    let n = |text: &str| json!({ "n": serde_json::from_str::<Value>(text).expect("number") });
    // Written as JavaScript writes them, unquoted numbers and booleans keep their meaning.
    for (written, value) in [
        ("4900", "4900"),
        ("-2.5", "-2.5"),
        ("1e+21", "1e21"),
        ("true", "true"),
    ] {
        let p = policy(&block_if(written));
        assert_eq!(
            verdict(&p, "x.y", n(value), &none),
            Verdict::Block,
            "{written}"
        );
        assert_eq!(
            verdict(&p, "x.y", n("3"), &none),
            Verdict::Hold,
            "{written}"
        );
    }
    // Quoted, the text is a pattern like any other.
    let p = policy(&block_if("'10.0'"));
    assert_eq!(
        verdict(&p, "x.y", json!({"n": "10.0"}), &none),
        Verdict::Block
    );
    assert_eq!(verdict(&p, "x.y", n("10.0"), &none), Verdict::Hold);
}
