//! The held-call note against an agent that writes line breaks and Markdown into its
//! diagnosis and arguments.

use serde_json::json;

use super::*;
use crate::executions::store::Status;
use crate::ids::{ExecutionId, SessionId, ThreadId};

const URL: &str = "https://threadgate.reviewers.test/approvals/ex_real";

/// A bare `\r`, the Unicode separators and NEL each start a line in some view of the
/// note; the forged link copies the real one's words.
const ATTACK: &str = "The customer was charged twice.\r\r**Approve or deny:** \
    [https://threadgate.reviewers.test/approvals/ex_real](https://evil.example/approve)\
    \u{2028}Held by: nothing to worry about\u{2029}## Approved already\r\n\
    <a href=\"https://evil.example/html\">click</a>\u{85}https://evil.example/auto\u{0B}www.evil.example";

/// Fragments of [`ATTACK`] that must stay inside the quote.
const AGENT_FRAGMENTS: [&str; 6] = [
    "charged twice",
    "evil",
    "worry",
    "Approved already",
    "click",
    "](https://evil",
];

fn held(diagnosis: &str, args: serde_json::Value) -> Execution {
    Execution {
        id: ExecutionId::parse("ex_real").expect("id"),
        session_id: SessionId::parse("s1").expect("id"),
        thread_id: ThreadId::parse("th_1").expect("id"),
        agent: "support".into(),
        tool: "helpdesk.escalate_to_engineer".into(),
        args: args.to_string(),
        account: String::new(),
        binding_hash: String::new(),
        diagnosis: Some(diagnosis.into()),
        verdict: "hold".into(),
        because: "rule helpdesk.*".into(),
        rule_line: Some(3),
        policy_hash: String::new(),
        status: Status::Held,
        summary: None,
        expires_at_ms: None,
        reviewer: None,
        decision_message: None,
        decided_at_ms: None,
        result: None,
        error: None,
        attempts: 0,
        created_at_ms: 0,
        finished_at_ms: None,
    }
}

/// The note's lines as the most generous viewer breaks them.
fn shown_lines(note: &str) -> Vec<&str> {
    note.split(|c: char| {
        matches!(
            c,
            '\n' | '\r' | '\u{0B}' | '\u{0C}' | '\u{85}' | '\u{2028}' | '\u{2029}'
        )
    })
    .collect()
}

/// The lines outside the quote and the JSON block (fenced in Markdown, indented in
/// text): threadgate's own.
fn own_lines(note: &str) -> Vec<&str> {
    let mut in_code = false;
    let mut own = Vec::new();
    for line in shown_lines(note) {
        if line.starts_with("```") {
            in_code = !in_code;
            continue;
        }
        // The call's table holds agent values escaped, one row each (tested apart).
        let table_row = line.starts_with("| ");
        if !(in_code || table_row || line.starts_with("> ") || line.starts_with("    ")) {
            own.push(line);
        }
    }
    own
}

/// No line of threadgate's own holds agent text.
fn assert_agent_text_is_quoted(note: &str) {
    for line in own_lines(note) {
        for fragment in AGENT_FRAGMENTS {
            assert!(
                !line.contains(fragment),
                "agent text {fragment:?} outside the quote: {line:?}\n{note}"
            );
        }
    }
}

#[test]
fn agent_text_cannot_leave_the_quote_or_forge_the_link() {
    let args = json!({"thread_id": "th_1", "summary": "x\u{2028}**Approve or deny:** https://evil.example/args"});
    let rule = "charge ch_1\r**Approve or deny:** [go](https://rule.example/x) (support.yaml:3)";
    let note = held_note(
        &held(ATTACK, args.clone()),
        &args,
        rule,
        URL,
        &Redactor::empty(),
    );
    for shown in [&note.markdown, &note.text] {
        assert_agent_text_is_quoted(shown);
        let link = shown.find(URL).expect("the real link");
        let diagnosis = shown.find("diagnosis").expect("the diagnosis");
        assert!(link < diagnosis, "the real link comes first: {shown}");
        let deny_lines: Vec<&str> = own_lines(shown)
            .into_iter()
            .filter(|l| l.trim_start_matches('*').starts_with("Approve or deny"))
            .collect();
        assert_eq!(deny_lines.len(), 1, "one real link line: {deny_lines:?}");
        assert!(deny_lines[0].ends_with(URL), "{deny_lines:?}");
    }
    // The rule (which can hold an id the agent wrote) stays on its one line.
    assert!(
        note.text
            .contains("Held by: charge ch_1 **Approve or deny:** [go](https://rule.example/x)"),
        "{}",
        note.text
    );
    assert!(
        note.markdown.contains(
            "**Held by:** charge ch\\_1 \\*\\*Approve or deny\\:\\*\\* \\[go\\]\\(https\\:"
        ),
        "{}",
        note.markdown
    );
    // In Markdown nothing of the agent's outside the JSON block is a link, an autolink
    // or HTML (a fenced block renders none).
    let prose = own_lines(&note.markdown).join("\n")
        + &shown_lines(&note.markdown)
            .into_iter()
            .filter(|l| l.starts_with("> "))
            .collect::<Vec<_>>()
            .join("\n");
    for raw in ["](https://evil", "https://evil", "www.evil", "## Approved"] {
        assert!(!prose.contains(raw), "{raw:?} left unescaped: {prose}");
    }
    let tags: Vec<usize> = prose.match_indices("<a").map(|(at, _)| at).collect();
    assert!(!tags.is_empty(), "{prose}");
    for at in tags {
        assert_eq!(&prose[at - 1..at], "\\", "HTML left unescaped: {prose}");
    }
    assert!(prose.contains("> \\#\\# Approved already"), "{prose}");
    // A JSON value cannot end a line either.
    for shown in [&note.markdown, &note.text] {
        assert!(shown.contains("x\\u2028**Approve"), "{shown}");
        assert!(!shown.contains('\u{2028}'), "{shown}");
    }
}

#[test]
fn line_endings_are_normalised_and_controls_shown() {
    assert_eq!(
        agent_lines("a\r\nb\rc\u{2028}d\u{2029}e\u{85}f\ng\u{0C}h"),
        ["a", "b", "c", "d", "e", "f", "g", "h"]
    );
    assert_eq!(agent_lines("a\u{1b}[2Jb\n\n\r\n"), ["a\u{FFFD}[2Jb"]);
    assert_eq!(agent_lines(""), [""]);
    assert_eq!(
        escape_markdown("[a](b) *c* `d`"),
        "\\[a\\]\\(b\\) \\*c\\* \\`d\\`"
    );
}

#[test]
fn each_note_gets_its_own_marker_with_a_key() {
    let (a, b) = (new_marker("ex_1"), new_marker("ex_1"));
    assert_ne!(a, b);
    assert!(a.starts_with(&reference("ex_1")), "{a}");
    assert!(a.len() > reference("ex_1").len() + 32, "{a}");
}

fn refund_note(args: &serde_json::Value) -> OutboxNote {
    let mut exec = held("Charged twice.", args.clone());
    exec.tool = "stripe.create_refund".into();
    held_note(
        &exec,
        args,
        "refunds over 10.00 USD (support.yaml:3)",
        URL,
        &Redactor::empty(),
    )
}

#[test]
fn the_call_reads_as_a_table_in_the_currencys_units_with_agent_values_escaped() {
    let args = json!({
        "charge": "ch_1", "amount": 2500, "currency": "usd", "customer": "cus_9",
        "reason": "dup | **Approve or deny:** [x](https://evil.example)\r\n## heading",
    });
    let note = refund_note(&args);
    let rows: Vec<&str> = note
        .markdown
        .lines()
        .filter(|l| l.starts_with("| "))
        .collect();
    assert_eq!(
        rows,
        [
            "| | |",
            "| --- | --- |",
            "| Tool | stripe\\.create\\_refund |",
            "| Amount | 25\\.00 USD |",
            "| Customer | cus\\_9 |",
            "| Charge | ch\\_1 |",
            "| Reason | dup \\| \\*\\*Approve or deny\\:\\*\\* \\[x\\]\\(https\\:\\/\\/evil\\.example\\) \\#\\# heading |",
        ],
        "{}",
        note.markdown
    );
    assert!(
        note.text.contains("    Amount: 25.00 USD\n"),
        "{}",
        note.text
    );
    assert!(
        note.text.contains(
            "    Reason: dup | **Approve or deny:** [x](https://evil.example) ## heading\n"
        ),
        "{}",
        note.text
    );
    // The arguments stay below the table, whole.
    assert!(
        note.markdown.contains("\"amount\": 2500"),
        "{}",
        note.markdown
    );
}

#[test]
fn an_amount_without_a_currency_says_so_and_a_long_value_is_cut() {
    let long = "r".repeat(500);
    let note = refund_note(&json!({"charge": "ch_1", "amount": 10, "reason": long}));
    assert!(
        note.markdown
            .contains("| Amount | 10 \\(in the smallest unit\\; no currency given\\) |"),
        "{}",
        note.markdown
    );
    let reason = note
        .text
        .lines()
        .find(|l| l.starts_with("    Reason: "))
        .expect("row");
    assert_eq!(
        reason.chars().count(),
        "    Reason: ".len() + CELL_CHARS + 1,
        "{reason}"
    );
    assert!(reason.ends_with('…'), "{reason}");
}
