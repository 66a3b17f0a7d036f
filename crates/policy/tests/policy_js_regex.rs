//! Issue 13 (audit): a `/body/flags` pattern means what JavaScript's `new RegExp` means
//! (Kortix compiles it so), for the syntax both the `regex` crate and JavaScript accept,
//! and JavaScript's flags `d` and `v` are read as JavaScript reads them.

use serde_json::{Value, json};
use threadgate_policy::{Catalog, MemoryHistory, Policy, Verdict};

/// An `always_run` rule on `x.y` whose one condition is `{arg: t, match: PATTERN}`,
/// then a `block` for every other call to `x.y`.
fn allow_only(pattern: &str) -> Policy {
    let source = format!(
        "policies:\n  - match: x.y\n    action: always_run\n    conditions:\n      - {{arg: t, match: {}}}\n  - match: x.y\n    action: block\n",
        serde_json::to_string(pattern).unwrap_or_default()
    );
    Policy::parse(&source, "p.yaml").unwrap_or_else(|e| panic!("{e}"))
}

fn runs(policy: &Policy, text: &str) -> bool {
    let args = json!({ "t": text });
    let decision = policy.decide("x.y", &args, &Catalog::builtin(), &MemoryHistory::new(), 0);
    decision.verdict == Verdict::Run
}

fn load_error(pattern: &str) -> String {
    let source = format!(
        "policies:\n  - match: x.y\n    action: block\n    conditions:\n      - {{arg: t, match: {}}}\n",
        serde_json::to_string(pattern).unwrap_or_default()
    );
    match Policy::parse(&source, "p.yaml") {
        Ok(_) => panic!("accepted {pattern}"),
        Err(error) => error.to_string(),
    }
}

#[test]
fn digit_word_and_boundary_classes_are_ascii_as_in_javascript() {
    let digits = allow_only(r"/^\d+$/");
    assert!(runs(&digits, "4900"));
    // Arabic-Indic digits are `\d` in the regex crate's Unicode mode, not in JavaScript.
    assert!(!runs(&digits, "٤٩٠٠"));
    // So are they with `u`: JavaScript's `\d` is ASCII with every flag.
    assert!(!runs(&allow_only(r"/^\d+$/u"), "٤٩٠٠"));
    let word = allow_only(r"/^\w+$/");
    assert!(runs(&word, "Refund_2"));
    assert!(!runs(&word, "réfund"));
    // The Kelvin sign folds to `k` in Unicode case-insensitive matching.
    assert!(!runs(&word, "o\u{212A}"));
    assert!(runs(&allow_only(r"/^[\d\w]+$/"), "a1"));
    assert!(!runs(&allow_only(r"/^[\d\w]+$/"), "é"));
    assert!(!runs(&allow_only(r"/^\D$/"), "5"));
    assert!(runs(&allow_only(r"/^\D$/"), "٤"));
    assert!(runs(&allow_only(r"/^\W$/"), "é"));
    // `é` is not a word character in JavaScript, so `fraud` is a whole word in `éfraudé`.
    let boundary = allow_only(r"/\bfraud\b/");
    assert!(runs(&boundary, "éfraudé"));
    assert!(!runs(&boundary, "afraud"));
    assert!(runs(&allow_only(r"/^a\Bb$/"), "ab"));
}

#[test]
fn dot_never_matches_a_javascript_line_terminator_without_s() {
    let dot = allow_only("/^a.b$/");
    assert!(runs(&dot, "a-b"));
    for terminator in ["\n", "\r", "\u{2028}", "\u{2029}"] {
        assert!(!runs(&dot, &format!("a{terminator}b")), "{terminator:?}");
    }
    let dot_all = allow_only("/^a.b$/s");
    for terminator in ["\n", "\r", "\u{2028}", "\u{2029}"] {
        assert!(runs(&dot_all, &format!("a{terminator}b")), "{terminator:?}");
    }
    // `[^]` is any character, `[]` none.
    assert!(runs(&allow_only("/^a[^]b$/"), "a\nb"));
    assert!(!runs(&allow_only("/a[]/"), "a"));
}

#[test]
fn line_anchors_with_m_break_at_carriage_returns_as_in_javascript() {
    let anchored = allow_only("/^fraud$/m");
    assert!(runs(&anchored, "ok\r\nfraud\r\nbye"));
    assert!(runs(&anchored, "ok\rfraud"));
    assert!(!runs(&allow_only("/^fraud$/"), "ok\nfraud"));
}

#[test]
fn white_space_is_javascripts_set() {
    let spaces = allow_only(r"/^\S+$/");
    // U+FEFF is `\s` in JavaScript, not in Unicode's White_Space.
    assert!(!runs(&spaces, "a\u{FEFF}b"));
    // U+0085 is White_Space but not JavaScript's `\s`.
    assert!(runs(&spaces, "a\u{85}b"));
    assert!(runs(&allow_only(r"/^a\sb$/"), "a\u{3000}b"));
    assert!(runs(&allow_only(r"/^a[\s]b$/"), "a\u{FEFF}b"));
}

#[test]
fn class_and_escape_syntax_reads_as_javascript_reads_it() {
    // `&&`, `~~`, `--` and `[` are characters in a JavaScript class, set operators or
    // nested classes in the regex crate.
    assert!(runs(&allow_only("/^[a&&b]$/"), "&"));
    assert!(runs(&allow_only("/^[a~~b]$/"), "~"));
    assert!(runs(&allow_only("/^[[a]$/"), "["));
    assert!(runs(&allow_only(r"/^[\b]$/"), "\u{8}"));
    // A `{` that starts no quantifier is a character; quantifiers still work.
    assert!(runs(&allow_only("/^a{$/"), "a{"));
    assert!(runs(&allow_only("/^a{2}$/"), "aa"));
    assert!(runs(&allow_only(r"/^\x41\u0042\cJ\/$/"), "ab\n/"));
    assert!(runs(&allow_only(r"/^\u{1F600}$/u"), "😀"));
}

#[test]
fn syntax_javascript_reads_otherwise_is_a_load_error() {
    let cases = [
        (r"/\p{L}/", "`\\p{…}` needs flag `u`"),
        (r"/\u{41}/", "`\\u{…}` needs flag `u`"),
        ("/(?i)x/", "inline flags"),
        ("/(?P<n>x)/", "inline flags"),
        ("/(?=x)/", "look-around"),
        (r"/(a)\1/", "backreferences"),
        (r"/\Ax/", "`\\A` is not a JavaScript escape"),
        ("/a}/u", "a lone `}` is a syntax error with flag `u`"),
    ];
    for (pattern, expected) in cases {
        let error = load_error(pattern);
        assert!(error.contains(expected), "{pattern}: {error}");
        assert!(error.starts_with("p.yaml:5:25: "), "{error}");
    }
    assert!(runs(&allow_only(r"/^\p{L}+$/u"), "été"));
}

#[test]
fn flag_d_is_ignored_and_v_reads_as_u_without_set_notation() {
    let indices = allow_only("/^refund$/d");
    assert!(runs(&indices, "REFUND"));
    assert!(!runs(&indices, "refunds"));
    let sets = allow_only(r"/^\p{L}+$/v");
    assert!(runs(&sets, "été"));
    assert!(!runs(&sets, "a1"));
    assert!(runs(&allow_only(r"/^[a\-z]$/v"), "-"));
    for pattern in [r"/[\p{L}--[a-z]]/v", "/[a&&b]/v", "/[(]/v"] {
        let error = load_error(pattern);
        assert!(error.contains("set notation is not supported"), "{error}");
    }
    assert!(load_error("/x/uv").contains("`u` and `v` cannot be used together"));
}

#[test]
fn the_tool_pattern_index_reads_the_flags_too() {
    let source = "policies:\n  - match: '/^b$/m'\n    action: block\n  - match: '/a.c/s'\n    action: block\n";
    let policy = Policy::parse(source, "p.yaml").unwrap_or_else(|e| panic!("{e}"));
    let decide = |tool: &str| {
        let args = Value::Object(serde_json::Map::new());
        let catalog = Catalog::builtin();
        policy
            .decide(tool, &args, &catalog, &MemoryHistory::new(), 0)
            .verdict
    };
    assert_eq!(decide("a\nb"), Verdict::Block);
    assert_eq!(decide("a\nc"), Verdict::Block);
}
