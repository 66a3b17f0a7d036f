//! Reading a tool's JSON arguments: an object with known keys and typed values.
//!
//! A `null` value counts as absent. Error messages name the tool and the argument but
//! never echo the value (it may be long, or something the agent should not see back).

use serde_json::{Map, Value};

use super::ConnectorError;

/// A tool's arguments, checked to be an object whose keys are all allowed.
pub(crate) struct Args<'a> {
    tool: &'a str,
    map: &'a Map<String, Value>,
}

impl<'a> Args<'a> {
    /// Checks that `value` is an object with no key outside `allowed`.
    pub(super) fn new(
        tool: &'a str,
        value: &'a Value,
        allowed: &[&str],
    ) -> Result<Self, ConnectorError> {
        let Some(map) = value.as_object() else {
            return Err(ConnectorError::invalid(format!(
                "{tool}: arguments must be a json object"
            )));
        };
        if let Some(key) = map.keys().find(|key| !allowed.contains(&key.as_str())) {
            return Err(ConnectorError::invalid(format!(
                "{tool}: unknown argument `{key}` (expected one of: {})",
                allowed.join(", ")
            )));
        }
        Ok(Self { tool, map })
    }

    fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|value| !value.is_null())
    }

    fn wrong(&self, key: &str, expected: &str) -> ConnectorError {
        ConnectorError::invalid(format!(
            "{}: argument `{key}` must be {expected}",
            self.tool
        ))
    }

    /// A required non-empty string.
    pub(super) fn str(&self, key: &str) -> Result<&'a str, ConnectorError> {
        self.opt_str(key)?
            .ok_or_else(|| self.wrong(key, "a non-empty string (it is required)"))
    }

    /// An optional non-empty string.
    pub(super) fn opt_str(&self, key: &str) -> Result<Option<&'a str>, ConnectorError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(text)) if !text.trim().is_empty() => Ok(Some(text)),
            Some(_) => Err(self.wrong(key, "a non-empty string")),
        }
    }

    /// A required provider object id: letters, digits, `_` and `-` only, so it is safe
    /// as a URL path segment.
    pub(super) fn id(&self, key: &str) -> Result<&'a str, ConnectorError> {
        let id = self.str(key)?;
        if is_plain_id(id) {
            Ok(id)
        } else {
            Err(self.wrong(key, "an id made of letters, digits, `_` and `-`"))
        }
    }

    /// An optional id, as [`Args::id`].
    pub(super) fn opt_id(&self, key: &str) -> Result<Option<&'a str>, ConnectorError> {
        match self.get(key) {
            None => Ok(None),
            Some(_) => self.id(key).map(Some),
        }
    }

    /// An optional integer in `min..=max`.
    pub(super) fn opt_int(
        &self,
        key: &str,
        min: u64,
        max: u64,
    ) -> Result<Option<u64>, ConnectorError> {
        match self.get(key) {
            None => Ok(None),
            Some(value) => match value.as_u64() {
                Some(number) if (min..=max).contains(&number) => Ok(Some(number)),
                _ => Err(self.wrong(key, &format!("an integer from {min} to {max}"))),
            },
        }
    }

    /// An optional boolean.
    pub(super) fn opt_bool(&self, key: &str) -> Result<Option<bool>, ConnectorError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(flag)) => Ok(Some(*flag)),
            Some(_) => Err(self.wrong(key, "true or false")),
        }
    }

    /// An optional list of non-empty strings.
    pub(super) fn opt_str_list(&self, key: &str) -> Result<Option<Vec<&'a str>>, ConnectorError> {
        let Some(value) = self.get(key) else {
            return Ok(None);
        };
        let items = value
            .as_array()
            .ok_or_else(|| self.wrong(key, "a list of strings"))?;
        items
            .iter()
            .map(|item| match item.as_str() {
                Some(text) if !text.trim().is_empty() => Ok(text),
                _ => Err(self.wrong(key, "a list of non-empty strings")),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// Fails with a message naming `key` and what it must be.
    pub(super) fn reject(&self, key: &str, expected: &str) -> ConnectorError {
        self.wrong(key, expected)
    }
}

/// Letters, digits, `_` and `-`, non-empty: safe as one URL path segment.
pub fn is_plain_id(id: &str) -> bool {
    !id.is_empty()
        && id
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'_' | b'-'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unknown_keys_and_non_objects_are_refused() {
        let args = json!({"charge": "ch_1", "amout": 5});
        let error = Args::new("stripe.create_refund", &args, &["charge", "amount"])
            .err()
            .unwrap();
        assert!(error.to_string().contains("unknown argument `amout`"));
        assert!(Args::new("t", &json!([1]), &[]).is_err());
    }

    #[test]
    fn typed_reads() {
        let value = json!({
            "id": "ch_1A-b", "bad_id": "../x", "n": 5, "big": 500, "flag": true,
            "list": ["a", "b"], "nothing": null, "empty": " "
        });
        let keys = [
            "id", "bad_id", "n", "big", "flag", "list", "nothing", "empty",
        ];
        let args = Args::new("t", &value, &keys).unwrap();
        assert_eq!(args.id("id").unwrap(), "ch_1A-b");
        assert!(args.id("bad_id").is_err());
        assert_eq!(args.opt_int("n", 1, 100).unwrap(), Some(5));
        assert!(args.opt_int("big", 1, 100).is_err());
        assert_eq!(args.opt_bool("flag").unwrap(), Some(true));
        assert_eq!(args.opt_str_list("list").unwrap(), Some(vec!["a", "b"]));
        assert_eq!(args.opt_str("nothing").unwrap(), None);
        assert!(args.str("nothing").is_err());
        assert!(args.opt_str("empty").is_err());
        assert!(args.opt_int("id", 0, 10).is_err());
    }
}
