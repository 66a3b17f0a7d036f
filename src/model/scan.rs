//! The secret scan of JSON that leaves the sandbox through the model proxy: every
//! string anywhere in it, every object key and every number's text, whatever field it
//! sits in. A scan of chosen fields misses the field nobody thought of (a named tool
//! choice, a key of a tool's schema); this one needs no list.

use serde_json::Value;

use crate::secrets::Redactor;

/// The name of a stored secret whose value `value` holds anywhere (never the value).
pub fn secret_in_json(redactor: &Redactor, value: &Value) -> Option<String> {
    if redactor.is_empty() {
        return None;
    }
    let found = |text: &str| redactor.find(text.as_bytes()).map(str::to_owned);
    match value {
        Value::Null | Value::Bool(_) => None,
        Value::Number(n) => found(&n.to_string()),
        Value::String(s) => found(s),
        Value::Array(items) => items.iter().find_map(|v| secret_in_json(redactor, v)),
        Value::Object(map) => map
            .iter()
            .find_map(|(k, v)| found(k).or_else(|| secret_in_json(redactor, v))),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::secret_in_json;
    use crate::secrets::{Redactor, SecretString};

    #[test]
    fn a_value_is_found_in_any_string_key_or_number() {
        let redactor = Redactor::new([
            (
                "key".to_owned(),
                SecretString::from("sk-abcdef123456".to_owned()),
            ),
            ("pin".to_owned(), SecretString::from("98765432".to_owned())),
        ])
        .expect("redactor");
        let clean = json!({"a": [1, "x", {"b": null, "c": true}]});
        assert_eq!(secret_in_json(&redactor, &clean), None);
        for leaky in [
            json!({"tool_choice": {"function": {"name": "sk-abcdef123456"}}}),
            json!({"a": {"sk-abcdef123456": 1}}),
            json!([[[{"deep": "x sk-abcdef123456 y"}]]]),
            json!({"n": 98765432}),
        ] {
            assert!(secret_in_json(&redactor, &leaky).is_some(), "{leaky}");
        }
    }
}
