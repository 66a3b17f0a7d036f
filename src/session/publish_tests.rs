//! The pull request's description: every section, its caps, no secret value, and no
//! structure of the agent's or the customer's.

use super::*;
use crate::secrets::SecretString;
use crate::workspace::FileChange;

const KEY: &str = "sk_live_publish_test_5f1e9a7c3b2d";

fn redactor() -> Redactor {
    Redactor::new(vec![(
        "stripe_api_key".to_owned(),
        SecretString::from(KEY.to_owned()),
    )])
    .expect("redactor")
}

fn facts() -> PullFacts {
    PullFacts {
        thread_id: "th_1".into(),
        workspace: Some("w_2".into()),
        subject: Some("Invoice total is wrong".into()),
        branch: "threadgate/th_1".into(),
        finding: format!("The agent found the key {KEY} in config.toml."),
        calls: ThreadCalls {
            calls: vec![
                GatedCall {
                    tool: "stripe.get_charge".into(),
                    summary: None,
                    decision: "ran, succeeded".into(),
                },
                GatedCall {
                    tool: "stripe.create_refund".into(),
                    summary: Some("Refund 10.00 USD on ch_1; held: refund (policy.yaml:3)".into()),
                    decision: "approved by ana, succeeded".into(),
                },
                GatedCall {
                    tool: "stripe.delete_customer".into(),
                    summary: None,
                    decision: "blocked".into(),
                },
            ],
            total: 3,
        },
        files: ChangedFiles {
            files: vec![
                ("src/invoice.rs".into(), FileChange::Modified),
                ("FINDINGS.md".into(), FileChange::Added),
                ("old.txt".into(), FileChange::Deleted),
            ],
            total: 3,
        },
        cost: SessionCost {
            turns: 7,
            tokens: 12345,
        },
    }
}

#[test]
fn the_description_has_every_section_and_no_secret_value() {
    let body = redacted_description(&redactor(), &facts());
    assert!(!body.contains(KEY), "{body}");
    for expected in [
        "https://app.plain.com/workspace/w_2/thread/th_1",
        "Subject: Invoice total is wrong",
        "## What the agent found",
        "> The agent found the key ",
        "in config.toml.",
        "## Gated calls (3)",
        "- stripe\\.get\\_charge: ran\\, succeeded\n",
        "Refund 10\\.00 USD on ch\\_1",
        ": approved by ana\\, succeeded\n",
        "- stripe\\.delete\\_customer: blocked\n",
        "## Files changed (3)",
        "- modified: src\\/invoice\\.rs\n",
        "- added: FINDINGS\\.md\n",
        "- deleted: old\\.txt\n",
        "## Cost\n\n7 model turns, 12345 tokens.",
        "Branch `threadgate/th_1`",
    ] {
        assert!(body.contains(expected), "missing {expected:?} in\n{body}");
    }
}

#[test]
fn long_lists_are_capped_and_counted() {
    let mut facts = facts();
    facts.files = ChangedFiles {
        files: (0..MAX_LISTED_FILES)
            .map(|i| (format!("f{i}.rs"), FileChange::Added))
            .collect(),
        total: MAX_LISTED_FILES + 23,
    };
    facts.calls.total = 3 + 40;
    facts.finding = "x".repeat(MAX_SUMMARY_CHARS * 2);
    facts.subject = Some("s".repeat(MAX_SUBJECT_CHARS * 2));
    let body = description(&facts);
    assert!(body.contains("## Files changed (123)"), "{body}");
    assert!(body.contains("- and 23 more\n"), "{body}");
    assert!(body.contains("## Gated calls (43)"), "{body}");
    assert!(body.contains("- and 40 more\n"), "{body}");
    assert_eq!(body.matches("- added: ").count(), MAX_LISTED_FILES);
    assert!(!body.contains(&"x".repeat(MAX_SUMMARY_CHARS + 1)));
    assert!(!body.contains(&"s".repeat(MAX_SUBJECT_CHARS + 1)));

    facts.calls = ThreadCalls::default();
    facts.files = ChangedFiles::default();
    let body = description(&facts);
    assert!(body.contains("## Gated calls (0)\n\nNone.\n"), "{body}");
    assert!(body.contains("## Files changed (0)\n\nNone.\n"), "{body}");
}

#[test]
fn agent_and_customer_text_cannot_forge_structure() {
    let mut facts = facts();
    facts.finding =
        "Fine.\r\n## Approved by security\u{2028}[merge now](https://evil.test)\rdone".into();
    facts.subject = Some("Hi\n## Gated calls (0)\n[click](https://evil.test)".into());
    facts.files.files[0].0 = "a\n## Cost\n`x`.rs".into();
    facts.calls.calls[0].summary = Some("read\n## Files changed (0)".into());
    let body = description(&facts);
    // Every line of the agent's findings is quoted.
    for line in [
        "> Fine.\n",
        "> ## Approved by security\n",
        "> [merge now](https://evil.test)\n",
        "> done\n",
    ] {
        assert!(body.contains(line), "missing {line:?} in\n{body}");
    }
    // One-line texts stay on their line, escaped.
    assert!(
        body.contains(
            "Subject: Hi \\#\\# Gated calls \\(0\\) \\[click\\]\\(https\\:\\/\\/evil\\.test\\)\n"
        ),
        "{body}"
    );
    assert!(
        body.contains("- modified: a \\#\\# Cost \\`x\\`\\.rs\n"),
        "{body}"
    );
    assert!(
        body.contains("- read \\#\\# Files changed \\(0\\): ran"),
        "{body}"
    );
    // Only threadgate's own headings start a line with `#`.
    let headings: Vec<&str> = body.lines().filter(|l| l.starts_with('#')).collect();
    assert_eq!(
        headings,
        [
            "## The thread",
            "## What the agent found",
            "## Gated calls (3)",
            "## Files changed (3)",
            "## Cost"
        ],
        "{body}"
    );
}
