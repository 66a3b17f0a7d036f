//! The ids that travel far: a Plain thread's ([`ThreadId`]), a session's
//! ([`SessionId`]) and a gated call's ([`ExecutionId`]). Each is parsed once where it
//! enters (a webhook's envelope, a route's path, a stored row, the command line) and
//! carried as its type from there, never checked again as a string downstream.
//!
//! A leaf: it imports nothing of threadgate, so every module may use it.

use std::fmt;

use rusqlite::types::{FromSql, FromSqlError, FromSqlResult, ToSql, ToSqlOutput, ValueRef};

/// The longest thread or session id accepted. Plain's thread ids are about 30
/// characters; session ids are 16.
const MAX_NAME_ID_LEN: usize = 128;
/// The longest execution id accepted (ids made by threadgate are under 100).
const MAX_EXECUTION_ID_LEN: usize = 256;

/// Why a text is not an id of its kind: names the rule it broke.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {kind} {shown:?}: {reason}")]
pub struct InvalidId {
    /// Which kind of id (`thread id`, `session id`, `execution id`).
    pub kind: &'static str,
    /// The rejected text (cut short when very long).
    pub shown: String,
    /// Which rule it broke.
    pub reason: &'static str,
}

impl InvalidId {
    fn new(kind: &'static str, text: &str, reason: &'static str) -> InvalidId {
        InvalidId {
            kind,
            shown: text.chars().take(MAX_NAME_ID_LEN + 8).collect(),
            reason,
        }
    }
}

/// Checks the rule of thread and session ids, which become a branch component and a
/// directory name: only ASCII letters, digits, `_` and `-`, the first a letter or a
/// digit, 1 to 128 characters. This rules out every ref-format trap (`..`, `.lock`,
/// `@{`, control characters, `/`) and every path trap (`.`, `..`, a leading `-` or
/// `.`) by construction rather than by listing them.
fn check_name_id(kind: &'static str, text: &str) -> Result<(), InvalidId> {
    let invalid = |reason| InvalidId::new(kind, text, reason);
    let Some(first) = text.chars().next() else {
        return Err(invalid("it is empty"));
    };
    if text.len() > MAX_NAME_ID_LEN {
        return Err(invalid("it is longer than 128 characters"));
    }
    if !first.is_ascii_alphanumeric() {
        return Err(invalid("it must start with an ascii letter or digit"));
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    if !text.chars().all(allowed) {
        return Err(invalid(
            "only ascii letters, digits, '_' and '-' are allowed",
        ));
    }
    Ok(())
}

/// Implements what every id shares: `parse` (through `check`), `as_str`, `Display`,
/// `FromStr`, serde as a plain string (parsed on the way in), and SQLite text (parsed
/// on the way out of a row, so a stored text that is no id is an error).
macro_rules! id_type {
    ($name:ident, $kind:literal, $check:expr) => {
        impl $name {
            /// Parses `text`, refusing what is not an id of this kind.
            pub fn parse(text: impl Into<String>) -> Result<$name, InvalidId> {
                let text = text.into();
                let check: fn(&str) -> Result<(), InvalidId> = $check;
                check(&text)?;
                Ok($name(text))
            }

            /// The id as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }

            /// The id as an owned string.
            pub fn into_string(self) -> String {
                self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl std::str::FromStr for $name {
            type Err = InvalidId;
            fn from_str(text: &str) -> Result<$name, InvalidId> {
                $name::parse(text)
            }
        }

        impl std::ops::Deref for $name {
            type Target = str;
            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl std::borrow::Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }

        impl TryFrom<String> for $name {
            type Error = InvalidId;
            fn try_from(text: String) -> Result<$name, InvalidId> {
                $name::parse(text)
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }

        impl ToSql for $name {
            fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
                self.0.to_sql()
            }
        }

        impl FromSql for $name {
            fn column_result(value: ValueRef<'_>) -> FromSqlResult<$name> {
                let text = String::column_result(value)?;
                $name::parse(text).map_err(|e| FromSqlError::Other(Box::new(e)))
            }
        }
    };
}

/// A Plain thread's id, safe as one git ref component and one directory name (see
/// [`check_name_id`]); the thread's branch is `threadgate/<id>`.
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(try_from = "String", into = "String")]
pub struct ThreadId(String);

id_type!(ThreadId, "thread id", |text| {
    check_name_id("thread id", text)?;
    // Belt and braces: libgit2 must agree that the thread's full ref is well formed.
    if !git2::Reference::is_valid_name(&format!("refs/heads/threadgate/{text}")) {
        return Err(InvalidId::new(
            "thread id",
            text,
            "git does not accept it as a branch name",
        ));
    }
    Ok(())
});

impl AsRef<std::path::Path> for ThreadId {
    fn as_ref(&self) -> &std::path::Path {
        std::path::Path::new(&self.0)
    }
}

/// A session's id (made by threadgate: `s` and 15 hex digits), under the same rule as
/// a thread's, since it names a directory too.
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(try_from = "String", into = "String")]
pub struct SessionId(String);

id_type!(SessionId, "session id", |text| check_name_id(
    "session id",
    text
));

impl AsRef<std::path::Path> for SessionId {
    fn as_ref(&self) -> &std::path::Path {
        std::path::Path::new(&self.0)
    }
}

impl SessionId {
    /// A new session's id: `s` and the first 15 hex digits of a random UUID.
    pub fn random() -> SessionId {
        let uuid = uuid::Uuid::new_v4().simple().to_string();
        SessionId(format!("s{}", uuid.get(..15).unwrap_or(&uuid)))
    }
}

/// A gated call's id: `ex_` and a UUID for an agent's call, or a name threadgate made
/// for its own pseudo-calls (`ex_stop_…`, `ex_pull_<owner/name>_…`). Printable ASCII
/// without spaces, 1 to 256 characters.
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(try_from = "String", into = "String")]
pub struct ExecutionId(String);

id_type!(ExecutionId, "execution id", |text| {
    let invalid = |reason| InvalidId::new("execution id", text, reason);
    if text.is_empty() {
        return Err(invalid("it is empty"));
    }
    if text.len() > MAX_EXECUTION_ID_LEN {
        return Err(invalid("it is longer than 256 characters"));
    }
    if !text.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(invalid("only printable ascii without spaces is allowed"));
    }
    Ok(())
});

impl ExecutionId {
    /// A new agent call's id: `ex_` and a time-ordered UUID.
    pub fn random() -> ExecutionId {
        ExecutionId(format!("ex_{}", uuid::Uuid::now_v7().simple()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_ids_are_strict() {
        for ok in ["th_01HXYZ", "a", "A-b_c-9", &"x".repeat(128)] {
            assert!(ThreadId::parse(ok).is_ok(), "{ok} should be accepted");
        }
        let long = "x".repeat(129);
        for bad in [
            "",
            ".",
            "..",
            "-x",
            "_x",
            ".hidden",
            "a/b",
            "a..b",
            "a.lock",
            "a b",
            "a\0b",
            "a@{1}",
            "a~1",
            "a^",
            "a:b",
            "a\\b",
            "é",
            "a\n",
            "*",
            "../outside",
            "threadgate/x",
            long.as_str(),
        ] {
            let err = ThreadId::parse(bad).expect_err(bad);
            assert_eq!(err.kind, "thread id");
        }
    }

    #[test]
    fn an_error_names_the_kind_the_text_and_the_rule() {
        let err = ThreadId::parse("a/b").expect_err("slash");
        assert_eq!(
            err.to_string(),
            "invalid thread id \"a/b\": only ascii letters, digits, '_' and '-' are allowed"
        );
        let err = SessionId::parse("").expect_err("empty");
        assert_eq!(err.to_string(), "invalid session id \"\": it is empty");
    }

    #[test]
    fn execution_ids_take_what_threadgate_makes() {
        for ok in ["ex_0190f3a2b4c5", "ex_stop_holds_s1", "ex_pull_acme/app_12"] {
            assert!(ExecutionId::parse(ok).is_ok(), "{ok}");
        }
        let long = "e".repeat(257);
        for bad in ["", "ex 1", "ex_\n", "ex_é", long.as_str()] {
            assert!(ExecutionId::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn made_ids_parse() {
        let made = SessionId::random();
        assert_eq!(SessionId::parse(made.as_str()), Ok(made));
        let made = ExecutionId::random();
        assert!(made.starts_with("ex_"));
        assert_eq!(ExecutionId::parse(made.as_str()), Ok(made));
    }

    #[test]
    fn serde_is_a_string_parsed_on_the_way_in() {
        let id: ThreadId = serde_json::from_str("\"th_1\"").expect("valid");
        assert_eq!(serde_json::to_string(&id).expect("json"), "\"th_1\"");
        let err = serde_json::from_str::<ThreadId>("\"../x\"").expect_err("invalid");
        assert!(err.to_string().contains("invalid thread id"), "{err}");
    }

    #[test]
    fn a_stored_text_that_is_no_id_is_an_error() {
        let conn = rusqlite::Connection::open_in_memory().expect("db");
        let id = SessionId::parse("s1").expect("valid");
        let back: SessionId = conn
            .query_row("SELECT ?1", [&id], |r| r.get(0))
            .expect("read");
        assert_eq!(back, id);
        let bad = conn.query_row("SELECT 'a/b'", [], |r| r.get::<_, ThreadId>(0));
        assert!(bad.is_err());
    }
}
