//! Table-driven tests of reading policy and calls files (errors with file:line:column),
//! the policy's settings, the linter and the catalog's argument checks.

use std::time::Duration;

use serde_json::json;
use sha2::{Digest, Sha256};
use threadgate_policy::calls::parse_calls;
use threadgate_policy::{ArgProblem, Catalog, DefaultMode, Policy, lint};

/// Parses a file that must be invalid and compares every `file:line:col: message` line.
fn check_error(source: &str, expected: &[&str]) {
    let error = match Policy::parse(source, "p.yaml") {
        Ok(_) => panic!("parsed but should not:\n{source}"),
        Err(error) => error,
    };
    let shown = error.to_string();
    let lines: Vec<&str> = shown.lines().collect();
    assert_eq!(lines, expected, "for:\n{source}");
}

#[test]
fn malformed_files_report_every_problem_with_its_position() {
    let cases: &[(&str, &[&str])] = &[
        (
            "polices: []\n",
            &[
                "p.yaml:1:1: unknown key `polices` in the policy file; expected policy, approvals or policies",
            ],
        ),
        (
            "connectors:\n  - name: stripe\n    policies: []\n",
            &[
                "p.yaml:1:1: `connectors` is a kortix key threadgate does not implement: connector rules are built into threadgate's catalog; remove it",
            ],
        ),
        (
            "policies:\n  - match: stripe.create_refund\n    action: block\n    sensitive: true\n",
            &["p.yaml:4:5: `sensitive` is a kortix key threadgate does not implement; remove it"],
        ),
        (
            "policy:\n  default_mode: deny\n  mode: risk\n",
            &[
                "p.yaml:2:17: unknown default_mode `deny`; expected risk or allow_all",
                "p.yaml:3:3: unknown key `mode` in `policy`; expected default_mode",
            ],
        ),
        (
            "approvals:\n  ttl: four hours\n",
            &["p.yaml:2:8: `ttl` must be a duration like 4h, 30m or 1h30m, not `four hours`"],
        ),
        (
            "approvals:\n  ttl: 0m\n",
            &["p.yaml:2:8: `ttl` must be a duration like 4h, 30m or 1h30m, not `0m`"],
        ),
        (
            "approvals:\n  ttl: 500us\n",
            &["p.yaml:2:8: `ttl` must be a duration like 4h, 30m or 1h30m, not `500us`"],
        ),
        (
            "policies:\n  - match: a.b\n    action: always\n  - match: c.d\n    action: block\n    action: block\n",
            &[
                "p.yaml:3:13: unknown action `always`; expected always_run, require_approval or block",
                "p.yaml:6:5: duplicate key `action` (first written at line 5)",
            ],
        ),
        (
            "policies:\n  - action: block\n  - match: x\n",
            &[
                "p.yaml:2:5: rule has no `match`",
                "p.yaml:3:5: rule has no `action`",
            ],
        ),
        (
            "policies:\n  - match: ''\n    action: block\n  - match: '/(/'\n    action: block\n",
            &[
                "p.yaml:2:12: `match` needs a pattern",
                "p.yaml:4:12: invalid regular expression `/(/`: unclosed group",
            ],
        ),
        (
            "policies:\n  - match: x\n    action: block\n    conditions:\n",
            &["p.yaml:4:5: `conditions` is empty; remove it or list at least one"],
        ),
        (
            "policies:\n  - match: x\n    action: always_run\n    conditions: []\n",
            &["p.yaml:4:5: `conditions` is empty; remove it or list at least one"],
        ),
        (
            "policies:\n  - match: x\n    action: block\n    conditions:\n      - {match: y}\n      - {arg: a, match: y, gt: 3}\n      - {arg: a}\n      - {arg: 'a..b', match: y}\n",
            &[
                "p.yaml:5:9: condition has no `arg`",
                "p.yaml:6:28: condition has both `match` and `gt`; write one test per condition",
                "p.yaml:7:9: condition needs one of match, gt, gte, lt or lte",
                "p.yaml:8:15: `arg` must be a dot path into the arguments, like `amount` or `customer.id`",
            ],
        ),
        (
            "policies:\n  - match: x\n    action: block\n    conditions:\n      - {arg: a, gt: '100'}\n      - {arg: a, lt: lots}\n      - {arg: a, match: y, negate: yes}\n      - {arg: a, match: y, when: now}\n",
            &[
                "p.yaml:5:22: `gt` needs a number, like 10000, not `100`",
                "p.yaml:6:22: `lt` needs a number, like 10000, not `lots`",
                "p.yaml:7:36: `negate` must be true or false",
                "p.yaml:8:28: unknown key `when` in a condition; expected arg, match, negate, gt, gte, lt or lte",
            ],
        ),
        (
            &format!(
                "policies:\n  - match: x\n    action: block\n    conditions:\n{}",
                "      - {arg: a, match: y}\n".repeat(11)
            ),
            &["p.yaml:4:5: a rule has at most 10 conditions; this one has 11"],
        ),
        (
            "policies:\n  - match: x\n    action: require_approval\n    limits:\n      - {sum: amount, per: customer, window: 24h, max: 5000}\n",
            &["p.yaml:4:5: `limits` apply only to always_run rules; this rule is require_approval"],
        ),
        (
            "policies:\n  - match: x\n    action: always_run\n    limits:\n      - {sum: amount, window: day, max: 50.5}\n",
            &[
                "p.yaml:5:9: limit has no `per`",
                "p.yaml:5:31: `window` must be a duration like 4h, 30m or 1h30m, not `day`",
                "p.yaml:5:41: `max` needs a whole number of the smallest currency unit, like 5000",
            ],
        ),
        (
            "policies: {match: x}\n",
            &["p.yaml:1:11: `policies` must be a list of rules, not a mapping"],
        ),
        (
            "policies:\n  - x\n",
            &["p.yaml:2:5: a rule must be a mapping, not a scalar"],
        ),
        (
            "- a\n- b\n",
            &["p.yaml:1:1: the policy file must be a mapping, not a list"],
        ),
        (
            "policies: [\n",
            &["p.yaml:2:1: invalid yaml: while parsing a node, did not find expected node content"],
        ),
        (
            "policy: &p {default_mode: risk}\napprovals: *p\n",
            &["p.yaml:2:12: yaml aliases are not supported"],
        ),
        (
            "policies: !!seq []\n",
            &["p.yaml:1:11: yaml tags are not supported"],
        ),
        (
            "policies: []\n---\npolicies: []\n",
            &["p.yaml:2:1: the file must hold one yaml document"],
        ),
    ];
    for (source, expected) in cases {
        check_error(source, expected);
    }
}

#[test]
fn settings_and_their_defaults() {
    let cases = [
        ("", DefaultMode::Risk, Duration::from_secs(4 * 3600)),
        (
            "policy: {}\napprovals: {}\n",
            DefaultMode::Risk,
            Duration::from_secs(4 * 3600),
        ),
        (
            "policy:\n  default_mode: allow_all\n",
            DefaultMode::AllowAll,
            Duration::from_secs(4 * 3600),
        ),
        (
            "approvals:\n  ttl: 30m\n",
            DefaultMode::Risk,
            Duration::from_secs(30 * 60),
        ),
        (
            "approvals:\n  ttl: 1h30m\n",
            DefaultMode::Risk,
            Duration::from_secs(90 * 60),
        ),
        (
            "approvals:\n  ttl: 2d\n",
            DefaultMode::Risk,
            Duration::from_secs(2 * 86_400),
        ),
        (
            "approvals:\n  ttl: 45s\n",
            DefaultMode::Risk,
            Duration::from_secs(45),
        ),
        (
            "approvals:\n  ttl: 4 hours\n",
            DefaultMode::Risk,
            Duration::from_secs(4 * 3600),
        ),
        (
            "approvals:\n  ttl: 1500ms\n",
            DefaultMode::Risk,
            Duration::from_millis(1500),
        ),
    ];
    for (source, mode, ttl) in cases {
        let policy = Policy::parse(source, "p.yaml").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(policy.default_mode(), mode, "{source}");
        assert_eq!(policy.approval_ttl(), ttl, "{source}");
        let digest: [u8; 32] = Sha256::digest(source.as_bytes()).into();
        assert_eq!(policy.hash(), digest);
    }
}

#[test]
fn the_shipped_support_policy_parses_with_its_eleven_rules() {
    let source = include_str!("../../../policies/support.yaml");
    let policy = Policy::parse(source, "support.yaml").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(policy.rule_count(), 11);
    assert_eq!(policy.approval_ttl(), Duration::from_secs(4 * 3600));
}

/// Lints a file and compares the diagnostics as printed.
fn check_lint(source: &str, expected: &[&str]) {
    let shown: Vec<String> = lint(source, "p.yaml")
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(shown, expected, "for:\n{source}");
}

#[test]
fn lint_reports_dead_rules_unknown_tools_and_arguments() {
    check_lint(include_str!("../../../policies/support.yaml"), &[]);
    check_lint(
        "policies:\n  - match: stripe.create_refund\n    action: require_approval\n  - match: stripe.create_refund\n    action: always_run\n    conditions:\n      - {arg: reason, match: duplicate}\n",
        &[
            "p.yaml:4:5: warning: rule `stripe.create_refund` at line 4 can never fire: rule `stripe.create_refund` at line 2 comes first and matches every call it matches; move the narrower rule above the general one",
        ],
    );
    check_lint(
        "policies:\n  - match: 'stripe.*'\n    action: block\n  - match: 'STRIPE.get_*'\n    action: always_run\n  - match: '/refund/'\n    action: always_run\n  - match: '*'\n    action: block\n  - match: '/x/'\n    action: block\n",
        &[
            "p.yaml:4:5: warning: rule `STRIPE.get_*` at line 4 can never fire: rule `stripe.*` at line 2 comes first and matches every call it matches",
            "p.yaml:10:5: warning: rule `/x/` at line 10 can never fire: rule `*` at line 8 comes first and matches every call it matches",
            "p.yaml:10:5: warning: pattern `/x/` matches no tool in the catalog",
        ],
    );
    check_lint(
        "policies:\n  - match: 'stripe.get_*'\n    action: block\n    conditions:\n      - {arg: reason, match: x}\n  - match: 'stripe.*'\n    action: always_run\n",
        &["p.yaml:5:9: warning: no tool matched by `stripe.get_*` takes an argument `reason`"],
    );
    check_lint(
        "policies:\n  - match: stripe.create_refund\n    action: always_run\n    conditions:\n      - {arg: amount_cents, lte: 100}\n    limits:\n      - {sum: amount, per: customer.id, window: 1d, max: 100}\n  - match: 'stripe.refund_*'\n    action: block\n",
        &[
            "p.yaml:5:9: warning: `stripe.create_refund` takes no argument `amount_cents`",
            "p.yaml:8:5: warning: pattern `stripe.refund_*` matches no tool in the catalog",
        ],
    );
    check_lint(
        "policies:\n  - match: '/stripe'\n    action: block\n",
        &[
            "p.yaml:2:12: error: `/stripe` starts with `/` but is not a regular expression `/body/flags` (no closing `/`); no tool name contains `/`",
        ],
    );
    check_lint(
        "policy:\n  default_mode: strict\npolicies: []\n",
        &["p.yaml:2:17: error: unknown default_mode `strict`; expected risk or allow_all"],
    );
    check_lint(
        "policies: []\n",
        &["p.yaml:1:1: warning: the file has no rules; every call is decided by default_mode"],
    );
}

#[test]
fn calls_files() {
    let calls = parse_calls(
        "calls:\n  - tool: stripe.create_refund\n    args: {charge: ch_1, amount: 4900, reason: duplicate, ok: true, note: ~, big: 1.5, s: '42'}\n  - tool: helpdesk.get_thread\n",
        "c.yaml",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0].tool, "stripe.create_refund");
    assert_eq!(
        calls[0].args,
        json!({"charge": "ch_1", "amount": 4900, "reason": "duplicate", "ok": true, "note": null, "big": 1.5, "s": "42"})
    );
    assert_eq!((calls[0].pos.line, calls[1].pos.line), (2, 4));
    assert_eq!(calls[1].args, json!({}));
    let cases: &[(&str, &[&str])] = &[
        (
            "calls:\n  - args: {}\n",
            &["c.yaml:2:5: call has no `tool`"],
        ),
        (
            "calls:\n  - tool: x\n    arg: {}\n",
            &["c.yaml:3:5: unknown key `arg` in a call; expected tool, args or evidence"],
        ),
        (
            "calls:\n  - tool: x\n    args: {a: 1, a: 2}\n",
            &["c.yaml:3:18: duplicate key `a` (first written at line 3)"],
        ),
        (
            "",
            &["c.yaml:1:1: the calls file is empty; expected `calls:` with a list of calls"],
        ),
    ];
    for (source, expected) in cases {
        let error = parse_calls(source, "c.yaml")
            .err()
            .unwrap_or_else(|| panic!("{source}"));
        let shown = error.to_string();
        assert_eq!(shown.lines().collect::<Vec<_>>(), *expected, "{source}");
    }
}

#[test]
fn catalog_argument_checks() {
    let catalog = Catalog::builtin();
    let cases = [
        (
            "stripe.create_refund",
            json!({"charge": "ch_1", "amount": 100}),
            vec![],
        ),
        (
            "stripe.create_refund",
            json!({"charge": "ch_1", "customer": "cus_1", "currency": "usd"}),
            vec![],
        ),
        (
            "stripe.create_refund",
            json!({"amount": 1.5, "reasons": "x"}),
            vec![
                ArgProblem::WrongType {
                    name: "amount",
                    expected: "integer",
                },
                ArgProblem::Unknown("reasons".into()),
                ArgProblem::Missing("charge"),
            ],
        ),
        (
            "stripe.create_refund",
            json!([]),
            vec![ArgProblem::NotAnObject],
        ),
        (
            "github.create_issue",
            json!({"repo": "a/b", "title": "t", "labels": ["bug"]}),
            vec![],
        ),
        (
            "github.create_issue",
            json!({"repo": "a/b", "title": "t", "labels": ["bug", 1]}),
            vec![ArgProblem::WrongType {
                name: "labels",
                expected: "array of strings",
            }],
        ),
        (
            "stripe.update_subscription",
            json!({"subscription": "sub_1", "cancel_at_period_end": "yes"}),
            vec![ArgProblem::WrongType {
                name: "cancel_at_period_end",
                expected: "boolean",
            }],
        ),
        ("helpdesk.mark_done", json!({}), vec![]),
        (
            "helpdesk.reply_to_thread",
            json!({}),
            vec![ArgProblem::Missing("text")],
        ),
        ("not.a_tool", json!({"anything": 1}), vec![]),
    ];
    for (tool, args, expected) in cases {
        let problems = catalog.validate_args(tool, &args).err().unwrap_or_default();
        assert_eq!(problems, expected, "{tool} {args}");
    }
    let names: Vec<&str> = catalog.tools().iter().map(|t| t.name).collect();
    assert_eq!(names.len(), 16);
    let refund = catalog
        .get("stripe.create_refund")
        .map(|t| (t.risk, t.args.len()));
    assert_eq!(refund, Some((threadgate_policy::Risk::Write, 5)));
    assert!(catalog.get("Stripe.create_refund").is_none());
}
