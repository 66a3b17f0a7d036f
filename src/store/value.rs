//! The value model every domain function's SQL goes through, whichever backend runs
//! it: null, integer, real, text, bytes ([`Value`]); [`ToSql`] and [`FromSql`] for the
//! types the domain modules bind and read; [`SqlError`] and [`Result`]. A leaf of
//! `store`: the connection API (`sql`), each backend's conversions (`pg_value` for
//! Postgres) and the migrations use it.

use crate::ids::{ExecutionId, SessionId, ThreadId};

/// What a domain function returns: its value or the SQL error that stopped it.
pub type Result<T, E = SqlError> = std::result::Result<T, E>;

/// The two SQL dialects threadgate speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Sqlite,
    Postgres,
}

/// An error from a statement, a row's value or a domain check inside a transaction.
#[derive(Debug, thiserror::Error)]
pub enum SqlError {
    #[error(transparent)]
    Sqlite(#[from] rusqlite::Error),
    #[error("{}", pg_message(.0))]
    Postgres(#[from] postgres::Error),
    /// `query_row` found no row ([`OptionalExtension::optional`] turns it into `None`).
    #[error("query returned no rows")]
    NoRows,
    /// A stored value that is not of the type asked for.
    #[error("column {idx}: {message}")]
    Decode { idx: usize, message: String },
    /// A value that cannot be bound (an integer out of range).
    #[error("cannot bind a value: {0}")]
    Encode(String),
    /// A single-statement write (`Db::write_single`) tried to run a second statement: it
    /// was not sent.
    #[error("a single-statement write tried to run a second statement")]
    SecondStatement,
    /// A domain error carried out of a transaction (it rolls the transaction back).
    #[error(transparent)]
    Other(Box<dyn std::error::Error + Send + Sync>),
}

impl SqlError {
    /// Carries a domain error out of a transaction closure.
    pub fn other(e: impl std::error::Error + Send + Sync + 'static) -> SqlError {
        SqlError::Other(Box::new(e))
    }

    /// The Postgres SQLSTATE of the error, if it came from the server.
    pub fn sqlstate(&self) -> Option<&str> {
        match self {
            SqlError::Postgres(e) => e.code().map(postgres::error::SqlState::code),
            _ => None,
        }
    }

    /// Whether the transaction lost a race with another one and is to be run again
    /// (Postgres' serialization failure or deadlock).
    pub fn is_retryable(&self) -> bool {
        matches!(self.sqlstate(), Some("40001" | "40P01"))
    }

    /// Whether a unique or primary key refused the row.
    pub fn is_unique_violation(&self) -> bool {
        match self {
            SqlError::Sqlite(rusqlite::Error::SqliteFailure(e, _)) => {
                e.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE
                    || e.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY
            }
            other => other.sqlstate() == Some("23505"),
        }
    }
}

/// A Postgres error's whole message: the driver's `Display` says only "db error".
fn pg_message(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {} ({})", db.severity(), db.message(), db.code().code()),
        None => e.to_string(),
    }
}

/// `query_row`'s "no row" as `None`, as rusqlite's extension of the same name.
pub trait OptionalExtension<T> {
    fn optional(self) -> Result<Option<T>>;
}

impl<T> OptionalExtension<T> for Result<T> {
    fn optional(self) -> Result<Option<T>> {
        match self {
            Ok(value) => Ok(Some(value)),
            Err(SqlError::NoRows | SqlError::Sqlite(rusqlite::Error::QueryReturnedNoRows)) => {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }
}

/// A value as bound to a statement or read from a row.
#[derive(Debug, Clone, Copy)]
pub enum Value<'a> {
    Null,
    Integer(i64),
    Real(f64),
    Text(&'a str),
    Blob(&'a [u8]),
}

/// A value a statement can take as a parameter.
pub trait ToSql {
    fn to_value(&self) -> Result<Value<'_>>;
}

/// A value a row's column can be read as.
pub trait FromSql: Sized {
    fn from_value(value: Value<'_>) -> std::result::Result<Self, String>;
}

impl<T: ToSql + ?Sized> ToSql for &T {
    fn to_value(&self) -> Result<Value<'_>> {
        (**self).to_value()
    }
}

impl<T: ToSql> ToSql for Option<T> {
    fn to_value(&self) -> Result<Value<'_>> {
        match self {
            Some(v) => v.to_value(),
            None => Ok(Value::Null),
        }
    }
}

impl<T: FromSql> FromSql for Option<T> {
    fn from_value(value: Value<'_>) -> std::result::Result<Self, String> {
        match value {
            Value::Null => Ok(None),
            other => T::from_value(other).map(Some),
        }
    }
}

macro_rules! integer {
    ($($t:ty),*) => {$(
        impl ToSql for $t {
            fn to_value(&self) -> Result<Value<'_>> {
                i64::try_from(*self)
                    .map(Value::Integer)
                    .map_err(|_| SqlError::Encode(format!("{} does not fit a 64-bit integer", self)))
            }
        }
        impl FromSql for $t {
            fn from_value(value: Value<'_>) -> std::result::Result<Self, String> {
                match value {
                    Value::Integer(i) => <$t>::try_from(i)
                        .map_err(|_| format!("{i} is out of range for {}", stringify!($t))),
                    other => Err(format!("expected an integer, found {}", kind(&other))),
                }
            }
        }
    )*};
}

integer!(i64, i32, i16, u8, u16, u32, u64, usize);

impl ToSql for bool {
    fn to_value(&self) -> Result<Value<'_>> {
        Ok(Value::Integer(i64::from(*self)))
    }
}

impl FromSql for bool {
    fn from_value(value: Value<'_>) -> std::result::Result<Self, String> {
        match value {
            Value::Integer(i) => Ok(i != 0),
            other => Err(format!("expected a boolean, found {}", kind(&other))),
        }
    }
}

impl ToSql for f64 {
    fn to_value(&self) -> Result<Value<'_>> {
        Ok(Value::Real(*self))
    }
}

impl FromSql for f64 {
    fn from_value(value: Value<'_>) -> std::result::Result<Self, String> {
        match value {
            Value::Real(f) => Ok(f),
            #[expect(
                clippy::cast_precision_loss,
                reason = "SQLite itself reads an integer as a real this way"
            )]
            Value::Integer(i) => Ok(i as f64),
            other => Err(format!("expected a real, found {}", kind(&other))),
        }
    }
}

impl ToSql for str {
    fn to_value(&self) -> Result<Value<'_>> {
        Ok(Value::Text(self))
    }
}

impl ToSql for String {
    fn to_value(&self) -> Result<Value<'_>> {
        Ok(Value::Text(self))
    }
}

impl FromSql for String {
    fn from_value(value: Value<'_>) -> std::result::Result<Self, String> {
        match value {
            Value::Text(s) => Ok(s.to_owned()),
            other => Err(format!("expected text, found {}", kind(&other))),
        }
    }
}

impl ToSql for [u8] {
    fn to_value(&self) -> Result<Value<'_>> {
        Ok(Value::Blob(self))
    }
}

impl ToSql for Vec<u8> {
    fn to_value(&self) -> Result<Value<'_>> {
        Ok(Value::Blob(self))
    }
}

impl<const N: usize> ToSql for [u8; N] {
    fn to_value(&self) -> Result<Value<'_>> {
        Ok(Value::Blob(self))
    }
}

impl FromSql for Vec<u8> {
    fn from_value(value: Value<'_>) -> std::result::Result<Self, String> {
        match value {
            Value::Blob(b) => Ok(b.to_vec()),
            other => Err(format!("expected bytes, found {}", kind(&other))),
        }
    }
}

macro_rules! id_value {
    ($($t:ty),*) => {$(
        impl ToSql for $t {
            fn to_value(&self) -> Result<Value<'_>> {
                Ok(Value::Text(self.as_str()))
            }
        }
        impl FromSql for $t {
            fn from_value(value: Value<'_>) -> std::result::Result<Self, String> {
                <$t>::parse(String::from_value(value)?).map_err(|e| e.to_string())
            }
        }
    )*};
}

id_value!(ThreadId, SessionId, ExecutionId);

fn kind(value: &Value<'_>) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Integer(_) => "an integer",
        Value::Real(_) => "a real",
        Value::Text(_) => "text",
        Value::Blob(_) => "bytes",
    }
}
