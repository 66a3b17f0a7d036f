//! Runs the built `threadgate` binary: `check` and `lint`, their output formats, errors
//! with file:line:column and exit codes.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn threadgate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_threadgate"))
        .args(args)
        .current_dir(root())
        .output()
        .unwrap_or_else(|e| panic!("cannot run threadgate: {e}"))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Writes files into a temporary directory and returns it (kept alive by the caller).
fn files(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    for (name, content) in files {
        std::fs::write(dir.path().join(name), content).unwrap_or_else(|e| panic!("{e}"));
    }
    dir
}

fn path_str(dir: &Path, name: &str) -> String {
    dir.join(name).display().to_string()
}

/// `threadgate check POLICY CALLS` must print exactly the expected table and exit 0.
fn check_table(policy: &str, calls: &str, expected: &str) {
    let output = threadgate(&["check", policy, calls]);
    let expected = std::fs::read_to_string(root().join(expected))
        .unwrap_or_else(|e| panic!("{expected}: {e}"));
    assert_eq!(text(&output.stdout), expected, "{}", text(&output.stderr));
    assert_eq!(output.status.code(), Some(0));
}

#[test]
fn shipped_policies_print_their_expected_tables() {
    let cases = [
        (
            "policies/support.yaml",
            "policies/support.calls.yaml",
            "policies/support.expected.txt",
        ),
        (
            "policies/support.yaml",
            "policies/support-refunds.calls.yaml",
            "policies/support-refunds.expected.txt",
        ),
        (
            "policies/examples/refund-over-100.yaml",
            "policies/examples/refund-over-100.calls.yaml",
            "policies/examples/refund-over-100.expected.txt",
        ),
        (
            "policies/examples/refund-limits.yaml",
            "policies/examples/refund-limits.calls.yaml",
            "policies/examples/refund-limits.expected.txt",
        ),
    ];
    for (policy, calls, expected) in cases {
        check_table(policy, calls, expected);
    }
}

#[test]
fn check_json_gives_decisions_rule_lines_and_charges() {
    let output = threadgate(&[
        "check",
        "--format",
        "json",
        "policies/support.yaml",
        "policies/support.calls.yaml",
    ]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let report: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("{e}"));
    let rows = report["calls"].as_array().cloned().unwrap_or_default();
    let lines: Vec<(String, Value)> = rows
        .iter()
        .map(|r| {
            (
                r["decision"].as_str().unwrap_or("").to_string(),
                r["rule_line"].clone(),
            )
        })
        .collect();
    let expected_lines = [
        Some(47),
        Some(53),
        Some(50),
        Some(41),
        Some(44),
        Some(18),
        Some(35),
        Some(38),
        None,
        Some(56),
    ];
    assert_eq!(lines.len(), expected_lines.len());
    for ((decision, line), expected) in lines.iter().zip(expected_lines) {
        assert_eq!(line.as_u64(), expected, "{decision}");
    }
    assert_eq!(
        rows[5]["because"],
        "rule stripe.create_refund + 3 conditions + limit"
    );
    assert_eq!(
        rows[5]["evidence"],
        serde_json::json!(["duplicate_charge within 7d (line 25): found 2h apart, holds"])
    );
    assert_eq!(rows[0]["line"], 6);
    assert_eq!(
        report["summary"],
        serde_json::json!({"calls": 10, "run": 6, "hold": 3, "block": 1})
    );

    let output = threadgate(&[
        "check",
        "--format=json",
        "policies/examples/refund-limits.yaml",
        "policies/examples/refund-limits.calls.yaml",
    ]);
    let report: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("{e}"));
    let charge = &report["calls"][0]["charges"][0];
    assert_eq!(charge["amount"], 2500);
    assert_eq!(charge["window_ms"], 86_400_000);
    assert_eq!(
        charge["key"],
        r#"["stripe.create_refund","amount","customer","cus_a","usd"]"#
    );
    assert_eq!(report["calls"][4]["charges"], serde_json::json!([]));
}

#[test]
fn check_warns_about_unknown_tools_and_arguments_without_changing_decisions() {
    let dir = files(&[
        (
            "p.yaml",
            "policies:\n  - match: 'stripe.*'\n    action: always_run\n",
        ),
        (
            "c.yaml",
            "calls:\n  - tool: stripe.get_charge\n    args: {charge: ch_1, expand: all}\n  - tool: a.very_long_tool_name_from_elsewhere\n",
        ),
    ]);
    let output = threadgate(&[
        "check",
        &path_str(dir.path(), "p.yaml"),
        &path_str(dir.path(), "c.yaml"),
    ]);
    assert_eq!(output.status.code(), Some(0));
    let expected = "\
call                                  decision  because
stripe.get_charge                     run       rule stripe.*
a.very_long_tool_name_from_elsewhere  hold      default_mode: risk (unknown tool, write)

2 calls: 1 runs without a person, 1 waits for one, 0 blocked.
";
    assert_eq!(text(&output.stdout), expected);
    let calls = path_str(dir.path(), "c.yaml");
    let stderr = text(&output.stderr);
    assert_eq!(
        stderr,
        format!(
            "{calls}:2:5: warning: stripe.get_charge: unknown argument `expand`\n\
             {calls}:4:5: warning: `a.very_long_tool_name_from_elsewhere` is not in the catalog; decided as a write\n"
        )
    );
}

#[test]
fn check_reports_invalid_or_unreadable_files_with_positions() {
    let dir = files(&[
        (
            "bad.yaml",
            "policies:\n  - match: x\n    action: maybe\n    sensitive: true\n",
        ),
        ("good.yaml", "policies: []\n"),
        ("calls.yaml", "calls:\n  - tool: x\n    argz: {}\n"),
    ]);
    let bad = path_str(dir.path(), "bad.yaml");
    let good = path_str(dir.path(), "good.yaml");
    let calls = path_str(dir.path(), "calls.yaml");
    let output = threadgate(&["check", &bad, &calls]);
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(text(&output.stdout), "");
    assert_eq!(
        text(&output.stderr),
        format!(
            "{bad}:3:13: error: unknown action `maybe`; expected always_run, require_approval or block\n\
             {bad}:4:5: error: `sensitive` is a kortix key threadgate does not implement; remove it\n"
        )
    );
    let output = threadgate(&["check", &good, &calls]);
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(
        text(&output.stderr),
        format!(
            "{calls}:3:5: error: unknown key `argz` in a call; expected tool, args or evidence\n"
        )
    );
    let missing = path_str(dir.path(), "missing.yaml");
    let output = threadgate(&["check", &missing, &calls]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        text(&output.stderr).starts_with(&format!("error: cannot read {missing}: ")),
        "{}",
        text(&output.stderr)
    );
}

#[test]
fn lint_exit_codes_and_formats() {
    let dir = files(&[
        (
            "shadowed.yaml",
            "policies:\n  - match: stripe.create_refund\n    action: require_approval\n  - match: stripe.create_refund\n    action: always_run\n    conditions:\n      - {arg: reason, match: duplicate}\n",
        ),
        ("broken.yaml", "policy:\n  default_mode: yolo\n"),
    ]);
    let shadowed = path_str(dir.path(), "shadowed.yaml");
    let output = threadgate(&["lint", &shadowed]);
    assert_eq!(output.status.code(), Some(0));
    assert_eq!(
        text(&output.stdout),
        format!(
            "{shadowed}:4:5: warning: rule `stripe.create_refund` at line 4 can never fire: rule \
             `stripe.create_refund` at line 2 comes first and matches every call it matches; move \
             the narrower rule above the general one\n{shadowed}: 0 errors, 1 warning\n"
        )
    );
    let broken = path_str(dir.path(), "broken.yaml");
    let output = threadgate(&["lint", &broken]);
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(
        text(&output.stdout),
        format!(
            "{broken}:2:17: error: unknown default_mode `yolo`; expected risk or allow_all\n\
             {broken}: 1 error, 0 warnings\n"
        )
    );
    let output = threadgate(&["lint", "--format", "json", &broken]);
    assert_eq!(output.status.code(), Some(1));
    let report: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(report["errors"], 1);
    assert_eq!(report["diagnostics"][0]["line"], 2);
    assert_eq!(report["diagnostics"][0]["column"], 17);
    assert_eq!(report["diagnostics"][0]["severity"], "error");
    let output = threadgate(&["lint", "policies/support.yaml"]);
    assert_eq!(output.status.code(), Some(0));
    assert_eq!(
        text(&output.stdout),
        "policies/support.yaml: 0 errors, 0 warnings\n"
    );
}

#[test]
fn a_malformed_command_line_exits_with_two() {
    for args in [
        &["check", "only-one.yaml"][..],
        &["lint"],
        &["frobnicate"],
        &["check", "a", "b", "--format", "xml"],
    ] {
        let output = threadgate(args);
        assert_eq!(output.status.code(), Some(2), "{args:?}");
    }
}

#[test]
fn lint_kortix_names_every_line_kortix_reads_differently() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let file = dir.path().join("p.yaml");
    std::fs::write(
        &file,
        "policies:\n  - match: stripe.create_refund\n    action: always_run\n    conditions:\n      - {arg: reason, match: duplicate, negate: true}\n      - {arg: amount, lte: 100}\n      - {evidence: duplicate_charge, within: 7d}\n    limits:\n      - {sum: amount, per: customer, window: 1d, max: 100}\n  - match: '/delete/i'\n    action: block\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let path = file.display().to_string();
    let plain = threadgate(&["lint", &path]);
    assert!(!text(&plain.stdout).contains("kortix"));
    let output = threadgate(&["lint", "--kortix", &path]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let shown = text(&output.stdout).replace(&path, "p.yaml");
    let lines: Vec<&str> = shown.lines().collect();
    assert_eq!(
        lines,
        [
            "p.yaml:1:1: warning: kortix reads this differently: no `policy.default_mode`: Kortix defaults to allow_all (every unmatched call runs), threadgate to risk (unmatched writes wait for a person)",
            "p.yaml:5:9: warning: kortix reads this differently: a negated condition on a missing, null, object or empty `reason` holds in Kortix; threadgate cannot evaluate it, so this always_run rule does not apply",
            "p.yaml:6:9: warning: kortix reads this differently: `gt`/`gte`/`lt`/`lte` are threadgate extensions; Kortix finds the rule's conditions malformed and drops the whole rule",
            "p.yaml:7:9: warning: kortix reads this differently: evidence conditions are a threadgate extension; Kortix finds the rule's conditions malformed and drops the whole rule",
            "p.yaml:9:9: warning: kortix reads this differently: `limits` are a threadgate extension Kortix ignores: there the rule applies without them",
            "p.yaml: 0 errors, 5 warnings",
        ]
    );
}
