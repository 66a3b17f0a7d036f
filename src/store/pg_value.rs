//! How the value model ([`Value`]) crosses to Postgres: `?N` placeholders rewritten as
//! `$N`, a value bound in the type the server inferred, a column read by its type
//! (`NUMERIC` sums as integers). A leaf beside `value`: the connection API (`sql`)
//! calls it, and it knows nothing of connections.

use postgres::types::{FromSql, IsNull, ToSql, Type};

use super::value::Value;

/// `?N` (and a bare `?`) placeholders as Postgres' `$N`, outside quoted text,
/// quoted names and comments.
pub(crate) fn placeholders(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len() + 8);
    let mut chars = sql.chars().peekable();
    let mut next_bare = 0;
    let mut quote: Option<char> = None;
    while let Some(c) = chars.next() {
        if let Some(q) = quote {
            out.push(c);
            if c == q {
                quote = None;
            }
            continue;
        }
        match c {
            '\'' | '"' => {
                quote = Some(c);
                out.push(c);
            }
            '-' if chars.peek() == Some(&'-') => {
                out.push(c);
                for c in chars.by_ref() {
                    out.push(c);
                    if c == '\n' {
                        break;
                    }
                }
            }
            '?' => {
                out.push('$');
                let mut digits = false;
                while let Some(d) = chars.peek().copied().filter(char::is_ascii_digit) {
                    out.push(d);
                    chars.next();
                    digits = true;
                }
                if !digits {
                    next_bare += 1;
                    out.push_str(&next_bare.to_string());
                }
            }
            _ => out.push(c),
        }
    }
    out
}

type BoxError = Box<dyn std::error::Error + Sync + Send>;

/// Writes `value` in the type Postgres inferred for its placeholder.
pub(crate) fn bind(
    value: &Value<'_>,
    ty: &Type,
    out: &mut bytes::BytesMut,
) -> std::result::Result<IsNull, BoxError> {
    match *value {
        Value::Null => Ok(IsNull::Yes),
        Value::Integer(i) => match *ty {
            Type::INT8 => i.to_sql(ty, out),
            Type::INT4 => i32::try_from(i)?.to_sql(ty, out),
            Type::INT2 => i16::try_from(i)?.to_sql(ty, out),
            Type::BOOL => (i != 0).to_sql(ty, out),
            #[expect(clippy::cast_precision_loss, reason = "as SQLite compares them")]
            Type::FLOAT8 => (i as f64).to_sql(ty, out),
            Type::TEXT | Type::VARCHAR => i.to_string().to_sql(ty, out),
            _ => Err(format!("an integer cannot go into a {ty} parameter").into()),
        },
        Value::Real(f) => match *ty {
            Type::FLOAT8 => f.to_sql(ty, out),
            _ => Err(format!("a real cannot go into a {ty} parameter").into()),
        },
        Value::Text(s) => match *ty {
            Type::JSONB => {
                out.extend_from_slice(&[1]);
                out.extend_from_slice(s.as_bytes());
                Ok(IsNull::No)
            }
            Type::JSON => {
                out.extend_from_slice(s.as_bytes());
                Ok(IsNull::No)
            }
            Type::INT8 => s.parse::<i64>()?.to_sql(ty, out),
            _ => s.to_sql(&Type::TEXT, out),
        },
        Value::Blob(b) => match *ty {
            Type::BYTEA => b.to_sql(ty, out),
            _ => Err(format!("bytes cannot go into a {ty} parameter").into()),
        },
    }
}

/// Column `idx` of `row` as a [`Value`], read by the column's type.
pub(crate) fn column<'r>(
    row: &'r postgres::Row,
    idx: usize,
) -> std::result::Result<Value<'r>, String> {
    let ty = row
        .columns()
        .get(idx)
        .map(|c| c.type_().clone())
        .ok_or_else(|| format!("no column {idx}"))?;
    let err = |e: postgres::Error| e.to_string();
    let value = match ty {
        Type::INT8 => row
            .try_get::<_, Option<i64>>(idx)
            .map_err(err)?
            .map(Value::Integer),
        Type::INT4 => row
            .try_get::<_, Option<i32>>(idx)
            .map_err(err)?
            .map(|i| Value::Integer(i.into())),
        Type::INT2 => row
            .try_get::<_, Option<i16>>(idx)
            .map_err(err)?
            .map(|i| Value::Integer(i.into())),
        Type::BOOL => row
            .try_get::<_, Option<bool>>(idx)
            .map_err(err)?
            .map(|b| Value::Integer(b.into())),
        Type::FLOAT8 => row
            .try_get::<_, Option<f64>>(idx)
            .map_err(err)?
            .map(Value::Real),
        Type::FLOAT4 => row
            .try_get::<_, Option<f32>>(idx)
            .map_err(err)?
            .map(|f| Value::Real(f.into())),
        Type::NUMERIC => row
            .try_get::<_, Option<Numeric>>(idx)
            .map_err(err)?
            .map(|n| n.0),
        Type::BYTEA => row
            .try_get::<_, Option<&[u8]>>(idx)
            .map_err(err)?
            .map(Value::Blob),
        _ => row
            .try_get::<_, Option<&str>>(idx)
            .map_err(err)?
            .map(Value::Text),
    };
    Ok(value.unwrap_or(Value::Null))
}

/// A `NUMERIC` (what `sum` of `BIGINT`s is) as an integer when it has no fraction,
/// else as a real.
struct Numeric(Value<'static>);

impl<'a> FromSql<'a> for Numeric {
    fn from_sql(_: &Type, raw: &'a [u8]) -> std::result::Result<Numeric, BoxError> {
        let word = |i: usize| -> std::result::Result<u16, BoxError> {
            let bytes = raw.get(i * 2..i * 2 + 2).ok_or("short numeric")?;
            Ok(u16::from_be_bytes(<[u8; 2]>::try_from(bytes)?))
        };
        let ndigits = usize::from(word(0)?);
        let weight = i64::from(word(1)?.cast_signed());
        let sign = word(2)?;
        if sign == 0xC000 {
            return Err("NaN".into());
        }
        let mut whole: i128 = 0;
        let mut fraction = false;
        for i in 0..ndigits {
            let digit = i128::from(word(4 + i)?);
            let position = weight - i64::try_from(i)?;
            if position < 0 {
                fraction |= digit != 0;
                continue;
            }
            whole = whole
                .checked_mul(10_000)
                .and_then(|w| w.checked_add(digit))
                .ok_or("numeric out of range")?;
        }
        let last = weight - i64::try_from(ndigits)? + 1;
        for _ in 0..last.max(0) {
            whole = whole.checked_mul(10_000).ok_or("numeric out of range")?;
        }
        if sign == 0x4000 {
            whole = -whole;
        }
        if fraction {
            return Err("a numeric with a fraction where an integer was expected".into());
        }
        Ok(Numeric(Value::Integer(i64::try_from(whole)?)))
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::NUMERIC
    }
}
