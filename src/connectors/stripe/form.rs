//! Stripe's form encoding: nested objects and lists flattened to bracketed keys
//! (`metadata[k]=v`, `items[0][plan]=p`).

use serde_json::Value;

/// Flattens a JSON object into Stripe form pairs, in the object's key order. `null`
/// values are left out; booleans and numbers are written as JSON writes them.
pub(crate) fn encode(params: &Value) -> Vec<(String, String)> {
    let mut pairs = Vec::new();
    if let Value::Object(map) = params {
        for (key, value) in map {
            flatten(key.clone(), value, &mut pairs);
        }
    }
    pairs
}

fn flatten(prefix: String, value: &Value, pairs: &mut Vec<(String, String)>) {
    match value {
        Value::Null => {}
        Value::Bool(flag) => pairs.push((prefix, flag.to_string())),
        Value::Number(number) => pairs.push((prefix, number.to_string())),
        Value::String(text) => pairs.push((prefix, text.clone())),
        Value::Array(items) => {
            for (index, item) in items.iter().enumerate() {
                flatten(format!("{prefix}[{index}]"), item, pairs);
            }
        }
        Value::Object(map) => {
            for (key, item) in map {
                flatten(format!("{prefix}[{key}]"), item, pairs);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn nested_objects_and_lists_use_brackets() {
        let params = json!({
            "amount": 500,
            "charge": "ch_1",
            "items": [{"plan": "gold", "quantity": 2}],
            "metadata": {"k": "v"},
            "skip": null,
            "flag": false,
        });
        let pairs = encode(&params);
        let has = |k: &str, v: &str| pairs.iter().any(|(pk, pv)| pk == k && pv == v);
        assert!(has("amount", "500"));
        assert!(has("charge", "ch_1"));
        assert!(has("items[0][plan]", "gold"));
        assert!(has("items[0][quantity]", "2"));
        assert!(has("metadata[k]", "v"));
        assert!(has("flag", "false"));
        assert_eq!(pairs.len(), 6);
    }

    #[test]
    fn same_params_encode_identically() {
        let a = json!({"b": 1, "a": {"y": 2, "x": 3}});
        let b = json!({"b": 1, "a": {"y": 2, "x": 3}});
        assert_eq!(encode(&a), encode(&b));
    }
}
