//! The redactor: stored values found raw, JSON-escaped, in base64 at any alignment and
//! URL-encoded in any style, and replaced by `[secret:NAME]`.

use std::borrow::Cow;

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
use proptest::prelude::*;
use serde_json::json;
use threadgate::secrets::{MIN_SECRET_LEN, Redactor, SecretString};

const STRIPE: &str = "sk_live_4eC39HqLyjWDarjtT1zdp7dc";
const PASSWORD: &str = "p@ss w0rd/+&=?é";

fn redactor(secrets: &[(&str, &str)]) -> Redactor {
    Redactor::new(
        secrets
            .iter()
            .map(|(n, v)| (n.to_string(), SecretString::from(*v))),
    )
    .expect("build redactor")
}

/// Percent-encodes every byte outside `keep`, in upper or lower hex; `plus` writes a
/// space as `+`.
fn percent_encode(value: &str, keep: &str, upper: bool, plus: bool) -> String {
    let mut out = String::new();
    for &b in value.as_bytes() {
        if b.is_ascii_alphanumeric() || keep.as_bytes().contains(&b) {
            out.push(b as char);
        } else if b == b' ' && plus {
            out.push('+');
        } else if upper {
            out.push_str(&format!("%{b:02X}"));
        } else {
            out.push_str(&format!("%{b:02x}"));
        }
    }
    out
}

#[test]
fn a_raw_value_is_found_and_replaced_everywhere() {
    let r = redactor(&[("stripe", STRIPE), ("password", PASSWORD)]);
    let text = format!("Authorization: Bearer {STRIPE}\npw={PASSWORD}; again {STRIPE}.");
    assert_eq!(r.find(text.as_bytes()), Some("stripe"));
    assert_eq!(
        r.redact(&text),
        "Authorization: Bearer [secret:stripe]\npw=[secret:password]; again [secret:stripe]."
    );
}

#[test]
fn text_without_secrets_is_borrowed_unchanged() {
    let r = redactor(&[("stripe", STRIPE)]);
    let text = "refund ch_3MmlLrLkdIwHu7ix0snN0B15 for 2500 cents, reason duplicate";
    assert_eq!(r.find(text.as_bytes()), None);
    assert!(matches!(r.redact(text), Cow::Borrowed(t) if t == text));
    // A prefix of the value is not the value.
    assert_eq!(r.find(&STRIPE.as_bytes()[..STRIPE.len() - 1]), None);
}

#[test]
fn short_secrets_are_skipped_and_reported() {
    let short = "a".repeat(MIN_SECRET_LEN - 1);
    let r = redactor(&[("pin", "1234"), ("short", &short), ("stripe", STRIPE)]);
    assert_eq!(r.too_short(), ["pin", "short"]);
    assert_eq!(r.names(), ["stripe"]);
    assert_eq!(r.find(b"pin is 1234"), None);
    let only_short = redactor(&[("pin", "1234")]);
    assert!(only_short.is_empty());
    assert_eq!(only_short.redact("1234"), "1234");
    let exactly = "b".repeat(MIN_SECRET_LEN);
    let r = redactor(&[("six", &exactly)]);
    assert_eq!(r.find(format!("x{exactly}x").as_bytes()), Some("six"));
}

#[test]
fn base64_of_the_value_is_found_in_every_engine_and_alignment() {
    let r = redactor(&[("stripe", STRIPE), ("password", PASSWORD)]);
    for (name, value) in [("stripe", STRIPE), ("password", PASSWORD)] {
        for lead in ["", "u", "us", "use", "user:"] {
            for tail in ["", "!", "!!", "!!!"] {
                let blob = format!("{lead}{value}{tail}");
                for engine in [&STANDARD, &STANDARD_NO_PAD, &URL_SAFE, &URL_SAFE_NO_PAD] {
                    let encoded = engine.encode(&blob);
                    let header = format!("Authorization: Basic {encoded}");
                    assert_eq!(r.find(header.as_bytes()), Some(name), "{lead:?} {tail:?}");
                    // The whole encoded blob goes: no partial character is left.
                    assert_eq!(
                        r.redact(&header),
                        format!("Authorization: Basic [secret:{name}]")
                    );
                }
            }
        }
    }
}

#[test]
fn hex_of_the_value_is_found_in_either_case() {
    let r = redactor(&[("stripe", STRIPE), ("password", PASSWORD)]);
    for value in [STRIPE, PASSWORD] {
        let lower = hex::encode(value);
        for form in [lower.clone(), lower.to_ascii_uppercase()] {
            let text = format!("dump: 0x{form} end");
            assert!(r.find(text.as_bytes()).is_some(), "{form}");
            let redacted = r.redact(&text);
            assert!(!redacted.contains(&form), "{redacted}");
            assert!(redacted.starts_with("dump: 0x[secret:"), "{redacted}");
        }
    }
    // Hex of another value is not a match.
    assert_eq!(
        r.find(hex::encode("sk_live_other_value_123").as_bytes()),
        None
    );
}

#[test]
fn url_encoded_values_are_found_whatever_the_encoder_escapes() {
    let r = redactor(&[("password", PASSWORD), ("stripe", STRIPE)]);
    let styles = [
        percent_encode(PASSWORD, "-._~", true, false), // RFC 3986, upper hex
        percent_encode(PASSWORD, "-._~", false, false), // lower hex
        percent_encode(PASSWORD, "*-._", true, true),  // form encoding, '+' for space
        percent_encode(PASSWORD, "-_.!~*'()", true, false), // encodeURIComponent
        percent_encode(PASSWORD, "/", false, true),    // a path-style mix
        percent_encode(PASSWORD, "", true, false),     // everything escaped
    ];
    for encoded in &styles {
        let query = format!("https://api.example/v1?user=ann&password={encoded}&x=1");
        assert_eq!(r.find(query.as_bytes()), Some("password"), "{encoded}");
        assert_eq!(
            r.redact(&query),
            "https://api.example/v1?user=ann&password=[secret:password]&x=1"
        );
    }
    // Every byte escaped, even unreserved ones.
    let all: String = STRIPE.bytes().map(|b| format!("%{b:02X}")).collect();
    assert_eq!(r.find(all.as_bytes()), Some("stripe"));
    assert_eq!(r.redact(&format!("k={all}")), "k=[secret:stripe]");
}

#[test]
fn json_escaped_values_are_found_in_serialized_json() {
    let quoted = "abc\"def\\ghi\n";
    let r = redactor(&[("quoted", quoted)]);
    let body = serde_json::to_string(&json!({"note": format!("x {quoted} y")})).expect("json");
    assert!(!body.contains(quoted), "the value is escaped in the body");
    assert_eq!(r.find(body.as_bytes()), Some("quoted"));
    assert_eq!(r.redact(&body), r#"{"note":"x [secret:quoted] y"}"#);
}

#[test]
fn overlapping_values_are_redacted_as_one_span() {
    let r = redactor(&[("left", "abcdefgh"), ("right", "efghijkl")]);
    assert_eq!(r.redact("<abcdefghijkl>"), "<[secret:left]>");
    assert_eq!(
        r.redact("abcdefgh efghijkl"),
        "[secret:left] [secret:right]"
    );
}

#[test]
fn redact_json_reaches_strings_keys_and_numbers_anywhere() {
    let r = redactor(&[("stripe", STRIPE), ("account", "987654321")]);
    let mut value = json!({
        "headers": {"authorization": format!("Bearer {STRIPE}")},
        "list": [1, "plain", {"deep": [stripe_b64()]}],
        STRIPE: "as a key",
        "account": 987654321,
        "amount": 2500,
        "ok": true,
        "none": null
    });
    r.redact_json(&mut value);
    assert_eq!(
        value,
        json!({
            "headers": {"authorization": "Bearer [secret:stripe]"},
            "list": [1, "plain", {"deep": ["[secret:stripe]"]}],
            "[secret:stripe]": "as a key",
            "account": "[secret:account]",
            "amount": 2500,
            "ok": true,
            "none": null
        })
    );
    let text = value.to_string();
    assert!(!text.contains(STRIPE));
}

fn stripe_b64() -> String {
    STANDARD.encode(STRIPE)
}

#[test]
fn two_keys_that_redact_alike_keep_both_values() {
    let r = redactor(&[("a", "aaaaaaaa"), ("b", "bbbbbbbb")]);
    let mut value = json!({"x[secret:a]": 1, "xaaaaaaaa": 2});
    r.redact_json(&mut value);
    let object = value.as_object().expect("object");
    assert_eq!(object.len(), 2);
    let mut numbers: Vec<i64> = object.values().filter_map(|v| v.as_i64()).collect();
    numbers.sort();
    assert_eq!(numbers, [1, 2]);
}

#[test]
fn the_redactor_debug_output_has_names_only() {
    let r = redactor(&[("stripe", STRIPE)]);
    let shown = format!("{r:?}");
    assert!(shown.contains("stripe"));
    assert!(!shown.contains(STRIPE));
    assert!(!shown.contains(&STANDARD.encode(STRIPE)[4..20]));
}

proptest! {
    #[test]
    fn any_value_is_found_base64_encoded_at_any_offset(
        value in "[ -~]{6,48}|\\PC{6,24}",
        lead in proptest::collection::vec(any::<u8>(), 0..7),
        tail in proptest::collection::vec(any::<u8>(), 0..7),
        engine in 0usize..4,
    ) {
        prop_assume!(value.len() >= MIN_SECRET_LEN);
        let r = redactor(&[("s", &value)]);
        let mut blob = lead.clone();
        blob.extend_from_slice(value.as_bytes());
        blob.extend_from_slice(&tail);
        let engines = [&STANDARD, &STANDARD_NO_PAD, &URL_SAFE, &URL_SAFE_NO_PAD];
        let encoded = engines[engine].encode(&blob);
        prop_assert_eq!(r.find(encoded.as_bytes()), Some("s"));
        let redacted = r.redact(&encoded);
        prop_assert!(redacted.contains("[secret:s]"));
        prop_assert_eq!(r.find(redacted.as_bytes()), None, "{}", redacted);
    }

    #[test]
    fn any_value_is_found_and_removed_raw_and_url_encoded(
        value in "[ -~]{6,40}|\\PC{6,20}",
        before in "[a-z =&]{0,12}",
        after in "[a-z =&]{0,12}",
        upper in any::<bool>(),
        plus in any::<bool>(),
    ) {
        prop_assume!(value.len() >= MIN_SECRET_LEN);
        let r = redactor(&[("s", &value)]);
        for form in [value.clone(), percent_encode(&value, "-._~", upper, plus)] {
            let text = format!("{before}{form}{after}");
            prop_assert_eq!(r.find(text.as_bytes()), Some("s"));
            let redacted = r.redact(&text);
            prop_assert!(redacted.contains("[secret:s]"));
            prop_assert_eq!(r.find(redacted.as_bytes()), None, "{}", redacted);
        }
    }
}
