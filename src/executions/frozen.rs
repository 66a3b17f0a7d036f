//! What freezes a call: the binding hash an approval is tied to, and the arguments as a
//! person or the audit may see them.

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::secrets::Redactor;

/// Arguments as a person or the audit sees them: stored secrets replaced, and values of
/// credential-like keys masked.
pub fn redact_args(redactor: &Redactor, args: &Value) -> Value {
    let mut copy = args.clone();
    mask_credential_keys(&mut copy);
    redactor.redact_json(&mut copy);
    copy
}

fn mask_credential_keys(v: &mut Value) {
    match v {
        Value::Object(map) => {
            for (k, item) in map.iter_mut() {
                let key = k.to_ascii_lowercase();
                let sensitive = [
                    "secret",
                    "token",
                    "password",
                    "api_key",
                    "apikey",
                    "authorization",
                    "cvc",
                    "card_number",
                ]
                .iter()
                .any(|needle| key.contains(needle));
                if sensitive {
                    *item = Value::String("[redacted]".into());
                } else {
                    mask_credential_keys(item);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(mask_credential_keys),
        _ => {}
    }
}

/// The canonical text of a call's arguments, the form its binding hash covers: compact
/// JSON with every object's keys in byte order at every level, so that two requests that
/// differ only in key order are one request. Written out here rather than trusting the
/// map type's order, which a cargo feature of any dependency (serde_json's
/// `preserve_order`) could change.
pub fn canonical_args(args: &Value) -> String {
    let mut out = String::new();
    write_canonical(&mut out, args);
    out
}

fn write_canonical(out: &mut String, v: &Value) {
    match v {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push('{');
            for (i, (key, value)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(out, value);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(out, item);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// Binds an approval to one exact request: tool, canonical arguments, account, session.
pub fn binding_hash(tool: &str, canonical_args: &str, account: &str, session_id: &str) -> String {
    let mut h = Sha256::new();
    for part in [tool, canonical_args, account, session_id] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    hex::encode(h.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Arbitrary JSON arguments, nested a few levels.
    fn json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            "[a-z0-9 _.\\-\"]{0,12}".prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 24, 5, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map("[a-z_]{1,6}", inner, 0..5)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// The same value written as JSON text with every object's keys in reverse order.
    fn reversed_text(v: &Value) -> String {
        match v {
            Value::Object(map) => {
                let parts: Vec<String> = map
                    .iter()
                    .rev()
                    .map(|(k, v)| format!("{}:{}", Value::String(k.clone()), reversed_text(v)))
                    .collect();
                format!("{{{}}}", parts.join(","))
            }
            Value::Array(items) => {
                let parts: Vec<String> = items.iter().map(reversed_text).collect();
                format!("[{}]", parts.join(","))
            }
            scalar => scalar.to_string(),
        }
    }

    /// Every leaf of `v` by its path, so that one can be changed.
    fn leaves(v: &Value, path: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
        match v {
            Value::Object(map) => {
                for (k, item) in map {
                    path.push(k.clone());
                    leaves(item, path, out);
                    path.pop();
                }
            }
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    path.push(i.to_string());
                    leaves(item, path, out);
                    path.pop();
                }
            }
            _ => out.push(path.clone()),
        }
    }

    fn hash(args: &Value) -> String {
        binding_hash(
            "stripe.create_refund",
            &canonical_args(args),
            "stripe:default",
            "s_1",
        )
    }

    proptest! {
        #[test]
        fn the_binding_hash_ignores_key_order(args in json()) {
            let reordered: Value = serde_json::from_str(&reversed_text(&args)).unwrap();
            prop_assert_eq!(hash(&args), hash(&reordered));
            prop_assert_eq!(canonical_args(&args), args.to_string());
        }

        #[test]
        fn the_binding_hash_changes_with_any_value(args in json(), pick in any::<prop::sample::Index>()) {
            let mut paths = Vec::new();
            leaves(&args, &mut Vec::new(), &mut paths);
            prop_assume!(!paths.is_empty());
            let path = pick.get(&paths);
            let mut changed = args.clone();
            // A JSON pointer: "" is the root, each step "/" + the escaped key or index.
            let pointer: String = path
                .iter()
                .map(|p| format!("/{}", p.replace('~', "~0").replace('/', "~1")))
                .collect();
            let leaf = changed.pointer_mut(&pointer).unwrap();
            *leaf = match leaf.take() {
                Value::String(s) => Value::String(format!("{s}x")),
                Value::Number(n) => Value::from(n.as_i64().unwrap().wrapping_add(1)),
                Value::Bool(b) => Value::Bool(!b),
                _ => Value::from(0),
            };
            prop_assert_ne!(hash(&args), hash(&changed));
        }
    }

    #[test]
    fn each_part_of_the_binding_counts() {
        let base = binding_hash("t", "{}", "a", "s");
        assert_ne!(base, binding_hash("u", "{}", "a", "s"));
        assert_ne!(base, binding_hash("t", "{\"x\":1}", "a", "s"));
        assert_ne!(base, binding_hash("t", "{}", "b", "s"));
        assert_ne!(base, binding_hash("t", "{}", "a", "r"));
        // Length-prefixed: moving a boundary between parts is another binding.
        assert_ne!(
            binding_hash("ab", "c", "a", "s"),
            binding_hash("a", "bc", "a", "s")
        );
    }
}
