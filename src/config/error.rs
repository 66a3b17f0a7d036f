//! [`ConfigError`]: what is wrong in the settings, naming the key and where its value
//! came from (`file:line` or the environment variable), never the value itself, so a
//! secret written into the wrong key does not reach a terminal or a log.

use std::fmt;
use std::path::{Path, PathBuf};

use figment::error::{Actual, Kind};

/// Errors while reading settings.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A file cannot be read: the settings file, or the one a key names.
    #[error("cannot read {what} {path}: {source}")]
    Read {
        /// `config file`, or the key that names the file.
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The settings file is not TOML.
    #[error("{path}:{line}:{column}: {message}")]
    Syntax {
        path: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },
    /// A key's value is wrong, or the key is unknown.
    #[error("{origin}: {key}: {message}")]
    Value {
        /// The key's dotted path (`sessions.max_live`).
        key: String,
        origin: Origin,
        message: String,
    },
    /// A `THREADGATE_…__…` variable that names no key.
    #[error(
        "environment variable {name} names no setting (a table's key is \
         THREADGATE_TABLE__KEY, e.g. THREADGATE_SESSIONS__MAX_LIVE)"
    )]
    UnknownVariable { name: String },
    /// A table's key written with `_` where the rule has `__`.
    #[error("environment variable {name} names no setting; did you mean {meant}?")]
    Misspelt { name: String, meant: String },
    /// Two variables set the same key (an older name and the rule's).
    #[error("{key} is set by both {first} and {second}; set one")]
    Conflict {
        key: String,
        first: String,
        second: String,
    },
}

/// Where a value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// The settings file, at the line of the key when it could be found.
    File { path: PathBuf, line: Option<usize> },
    /// An environment variable.
    Env { name: String },
    /// The built-in defaults.
    Defaults,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::File {
                path,
                line: Some(line),
            } => write!(f, "{}:{line}", path.display()),
            Origin::File { path, line: None } => write!(f, "{}", path.display()),
            Origin::Env { name } => write!(f, "environment variable {name}"),
            Origin::Defaults => f.write_str("the defaults"),
        }
    }
}

impl ConfigError {
    /// The error of a value figment could not read; `file` is the settings file's path
    /// and text, to find the key's line.
    pub(super) fn from_figment(error: figment::Error, file: Option<(&Path, &str)>) -> Self {
        let origin = match error.metadata.as_ref().and_then(|m| m.source.as_ref()) {
            Some(figment::Source::File(path)) => Origin::File {
                path: path.clone(),
                line: file.and_then(|(_, text)| line_of(text, &error.path)),
            },
            Some(figment::Source::Custom(name)) => Origin::Env { name: name.clone() },
            _ => file
                .and_then(|(path, text)| {
                    let line = line_of(text, &error.path)?;
                    Some(Origin::File {
                        path: path.to_owned(),
                        line: Some(line),
                    })
                })
                .unwrap_or(Origin::Defaults),
        };
        ConfigError::Value {
            key: error.path.join("."),
            origin,
            message: describe(&error.kind),
        }
    }
}

/// What is wrong, without the value: a secret put in the wrong key stays unprinted.
fn describe(kind: &Kind) -> String {
    match kind {
        Kind::Message(message) => without_quoted(message),
        Kind::InvalidType(actual, expected) | Kind::InvalidValue(actual, expected) => {
            format!("expected {expected}, found {}", noun(actual))
        }
        Kind::InvalidLength(length, expected) => {
            format!("expected {expected}, found {length} items")
        }
        Kind::UnknownVariant(_, expected) => format!("must be one of {}", expected.join(", ")),
        Kind::UnknownField(_, expected) => {
            format!("unknown key; the keys here are {}", expected.join(", "))
        }
        Kind::MissingField(name) => format!("missing key {name}"),
        Kind::DuplicateField(name) => format!("key {name} given twice"),
        Kind::ISizeOutOfRange(_) | Kind::USizeOutOfRange(_) => "number out of range".into(),
        Kind::Unsupported(actual) => format!("cannot hold {}", noun(actual)),
        Kind::UnsupportedKey(actual, _) => format!("a key cannot be {}", noun(actual)),
    }
}

/// The kind of a value, never its content.
fn noun(actual: &Actual) -> &'static str {
    match actual {
        Actual::Bool(_) => "a boolean",
        Actual::Unsigned(_) | Actual::Signed(_) => "an integer",
        Actual::Float(_) => "a float",
        Actual::Char(_) => "a character",
        Actual::Str(_) => "a string",
        Actual::Bytes(_) => "bytes",
        Actual::Unit | Actual::Option => "nothing",
        Actual::Seq => "a list",
        Actual::Map => "a table",
        _ => "another kind of value",
    }
}

/// `message` with whatever it quotes (`"…"` or `` `…` ``) left out: a parser's message
/// may quote part of the value (humantime's `unknown time unit "x"`).
fn without_quoted(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut open: Option<char> = None;
    for c in message.chars() {
        match open {
            None if c == '"' || c == '`' => {
                open = Some(c);
                out.push(c);
                out.push('…');
            }
            None => out.push(c),
            Some(quote) if c == quote => {
                open = None;
                out.push(c);
            }
            Some(_) => {}
        }
    }
    out
}

/// The line of `path`'s last key found in the TOML `text` (1-based).
fn line_of(text: &str, path: &[String]) -> Option<usize> {
    use toml::de::{DeTable, DeValue};
    let root = DeTable::parse(text).ok()?;
    let mut table = root.get_ref();
    let mut offset = None;
    for segment in path {
        let (key, value) = table
            .iter()
            .find(|(k, _)| k.get_ref().as_ref() == segment)?;
        offset = Some(key.span().start);
        match value.get_ref() {
            DeValue::Table(inner) => table = inner,
            _ => break,
        }
    }
    offset.map(|at| text.get(..at).unwrap_or(text).matches('\n').count() + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_keeps_its_words_and_loses_what_it_quotes() {
        for (message, expected) in [
            (
                "unknown time unit \"sk_live\", supported units: s",
                "unknown time unit \"…\", supported units: s",
            ),
            ("bad `sk_live` here", "bad `…` here"),
            ("unclosed \"sk_live", "unclosed \"…"),
            (
                "wait_default must be from 1s to 300s",
                "wait_default must be from 1s to 300s",
            ),
        ] {
            assert_eq!(without_quoted(message), expected);
        }
        let kind = Kind::InvalidType(Actual::Str("sk_live".into()), "usize".into());
        assert_eq!(describe(&kind), "expected usize, found a string");
    }

    #[test]
    fn a_key_s_line_is_found_in_tables_and_inline_tables() {
        let text = "a = 1\n[sessions]\n\nmax_live = 2\n[plain]\nlabels = { x = 1 }\n";
        let path = |p: &[&str]| p.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(line_of(text, &path(&["sessions", "max_live"])), Some(4));
        assert_eq!(line_of(text, &path(&["plain", "labels", "x"])), Some(6));
        assert_eq!(line_of(text, &path(&["sessions", "idle_timeout"])), None);
    }
}
