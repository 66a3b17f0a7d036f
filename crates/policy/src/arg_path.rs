//! A dot path into a call's arguments (`amount`, `metadata.order_id`, `items.0`): what
//! conditions test and limits sum and group by.

use serde_json::Value;

/// A dot path into a call's arguments: `customer.address.city`, `items.0.amount`.
///
/// A segment names a key of an object, or the index of an array element.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ArgPath {
    pub text: Box<str>,
    segments: Box<[Box<str>]>,
}

impl ArgPath {
    /// Parses a dot path; `None` if a segment is empty.
    pub(crate) fn parse(text: &str) -> Option<Self> {
        let segments: Box<[Box<str>]> = text.split('.').map(Box::from).collect();
        if segments.iter().any(|s| s.is_empty()) {
            return None;
        }
        Some(Self {
            text: text.into(),
            segments,
        })
    }

    /// The first segment: the top-level argument the path reads.
    pub(crate) fn root(&self) -> &str {
        self.segments.first().map_or("", |s| s.as_ref())
    }

    /// The value at this path, if there is one.
    pub(crate) fn lookup<'v>(&self, args: &'v Value) -> Option<&'v Value> {
        let mut value = args;
        for segment in &self.segments {
            value = match value {
                Value::Object(map) => map.get(segment.as_ref())?,
                Value::Array(items) => items.get(segment.parse::<usize>().ok()?)?,
                _ => return None,
            };
        }
        Some(value)
    }
}
