//! Decision speed of the policy gate.
//!
//! - `support/ten_calls`: the ten calls of the support walkthrough against
//!   `policies/support.yaml`; divide by ten for one decision.
//! - `1000_rules/*`: a generated policy of 1,000 rules (half globs, one in ten a regular
//!   expression, the rest exact names) with a call that matches the last rule and one
//!   that matches none.

#![expect(
    clippy::indexing_slicing,
    reason = "test code: an index out of range is a failed test"
)]

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::json;
use threadgate_policy::calls::parse_calls;
use threadgate_policy::{Catalog, MemoryHistory, Policy, Verdict};

const NOW: i64 = 1_700_000_000_000;

fn support(c: &mut Criterion) {
    let policy = Policy::parse(
        include_str!("../../../policies/support.yaml"),
        "support.yaml",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let calls = parse_calls(
        include_str!("../../../policies/support.calls.yaml"),
        "support.calls.yaml",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(calls.len(), 10);
    let catalog = Catalog::builtin();
    let history = MemoryHistory::new();
    c.bench_function("support/ten_calls", |b| {
        b.iter(|| {
            for call in &calls {
                let decision = policy.decide_with_evidence(
                    black_box(&call.tool),
                    black_box(&call.args),
                    &catalog,
                    &history,
                    NOW,
                    &call.evidence,
                );
                black_box(decision);
            }
        });
    });
    let refund = &calls[5];
    c.bench_function("support/conditioned_refund", |b| {
        b.iter(|| {
            policy.decide_with_evidence(
                black_box(&refund.tool),
                black_box(&refund.args),
                &catalog,
                &history,
                NOW,
                &refund.evidence,
            )
        });
    });
}

/// Rule `i`: a regex when `i % 10 == 0`, a glob when `i` is odd (prefix, suffix or infix
/// literal in turn), an exact name otherwise.
fn thousand_rules() -> String {
    let mut source = String::from("policy:\n  default_mode: risk\npolicies:\n");
    for i in 0..1000 {
        let pattern = if i % 10 == 0 {
            format!("/^svc{i}\\.op_[a-z]+$/")
        } else if i % 2 == 1 {
            match (i / 2) % 3 {
                0 => format!("svc{i}.*"),
                1 => format!("*.op_{i}"),
                _ => format!("*.act{i}_*"),
            }
        } else {
            format!("svc{i}.op_{i}")
        };
        let action = ["always_run", "require_approval", "block"][i % 3];
        source.push_str(&format!("  - match: '{pattern}'\n    action: {action}\n"));
    }
    source
}

fn large(c: &mut Criterion) {
    let source = thousand_rules();
    let policy = Policy::parse(&source, "generated.yaml").unwrap_or_else(|e| panic!("{e}"));
    let catalog = Catalog::builtin();
    let history = MemoryHistory::new();
    let args = json!({"amount": 4900, "customer": "cus_1"});
    // Rule 999 is `*.op_999` (999 / 2 % 3 == 1) and no earlier rule matches.
    let last = policy.decide("svc999.op_999", &args, &catalog, &history, NOW);
    assert_eq!(
        (last.verdict, last.rule_line),
        (Verdict::Run, Some(2 * 999 + 4))
    );
    let none = policy.decide("svc5000.op_1", &args, &catalog, &history, NOW);
    assert_eq!(none.rule_line, None);
    for (name, tool) in [
        ("last_rule", "svc999.op_refund"),
        ("no_rule", "stripe.create_refund"),
    ] {
        c.bench_function(&format!("1000_rules/{name}"), |b| {
            b.iter(|| policy.decide(black_box(tool), black_box(&args), &catalog, &history, NOW));
        });
    }
    c.bench_function("1000_rules/parse", |b| {
        b.iter(|| Policy::parse(black_box(&source), "generated.yaml"));
    });
}

criterion_group!(benches, support, large);
criterion_main!(benches);
