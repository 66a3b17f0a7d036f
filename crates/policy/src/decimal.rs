//! Exact comparison of numbers written in decimal, with no floating point on the way.
//!
//! A threshold such as `gt: 10000` and an argument such as `10000.5` are compared digit by
//! digit from their decimal text, so no value is ever rounded. JSON numbers are turned into
//! that text without allocating (see [`NumberText`]).

use std::cmp::Ordering;
use std::fmt::Write;

/// The parts of a decimal number's text: `[-+]int[.frac][e[-+]exp]`.
#[derive(Clone, Copy, Debug)]
struct Parts<'a> {
    negative: bool,
    int: &'a [u8],
    frac: &'a [u8],
    exponent: i64,
}

/// Exponents beyond this many digits are refused rather than overflowing.
const MAX_EXPONENT_DIGITS: usize = 12;

impl<'a> Parts<'a> {
    fn parse(text: &'a str) -> Option<Self> {
        let (negative, body) = match text.as_bytes().first() {
            Some(b'-') => (true, &text[1..]),
            Some(b'+') => (false, &text[1..]),
            _ => (false, text),
        };
        let (mantissa, exponent) = match body.find(['e', 'E']) {
            Some(at) => (&body[..at], parse_exponent(&body[at + 1..])?),
            None => (body, 0),
        };
        let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
        let all_digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
        if (int.is_empty() && frac.is_empty()) || !all_digits(int) || !all_digits(frac) {
            return None;
        }
        Some(Self {
            negative,
            int: int.as_bytes(),
            frac: frac.as_bytes(),
            exponent,
        })
    }

    /// The significant digits (leading zeros skipped) and `e` such that the value's
    /// magnitude is `0.digits × 10^e`. `None` digits means the value is zero.
    fn normalized(&self) -> Option<(impl Iterator<Item = u8> + 'a, i64)> {
        let leading_zeros = self
            .int
            .iter()
            .chain(self.frac)
            .take_while(|&&b| b == b'0')
            .count();
        let total = self.int.len() + self.frac.len();
        if leading_zeros == total {
            return None;
        }
        let int_len = i64::try_from(self.int.len()).ok()?;
        let zeros = i64::try_from(leading_zeros).ok()?;
        let digits = self
            .int
            .iter()
            .chain(self.frac)
            .copied()
            .skip(leading_zeros);
        Some((digits, int_len - zeros + self.exponent))
    }
}

fn parse_exponent(text: &str) -> Option<i64> {
    let digits = text.strip_prefix(['-', '+']).unwrap_or(text);
    if digits.is_empty() || digits.len() > MAX_EXPONENT_DIGITS {
        return None;
    }
    text.parse().ok()
}

/// Whether `text` is a decimal number this module can compare.
pub(crate) fn is_decimal(text: &str) -> bool {
    Parts::parse(text).is_some()
}

/// Compares two decimal texts exactly; `None` if either is not a decimal number.
pub(crate) fn compare(a: &str, b: &str) -> Option<Ordering> {
    let (a, b) = (Parts::parse(a)?, Parts::parse(b)?);
    let (a_norm, b_norm) = (a.normalized(), b.normalized());
    let sign = |negative: bool, zero: bool| match (zero, negative) {
        (true, _) => 0,
        (false, true) => -1,
        (false, false) => 1,
    };
    let a_sign = sign(a.negative, a_norm.is_none());
    let b_sign = sign(b.negative, b_norm.is_none());
    if a_sign != b_sign {
        return Some(a_sign.cmp(&b_sign));
    }
    let (Some((a_digits, a_exp)), Some((b_digits, b_exp))) = (a_norm, b_norm) else {
        return Some(Ordering::Equal);
    };
    let magnitude = a_exp
        .cmp(&b_exp)
        .then_with(|| compare_digits(a_digits, b_digits));
    Some(if a_sign < 0 {
        magnitude.reverse()
    } else {
        magnitude
    })
}

/// Compares digit sequences as fractions `0.d1d2…`, so trailing zeros do not matter.
fn compare_digits(a: impl Iterator<Item = u8>, b: impl Iterator<Item = u8>) -> Ordering {
    let (mut a, mut b) = (a.fuse(), b.fuse());
    loop {
        match (a.next(), b.next()) {
            (None, None) => return Ordering::Equal,
            (x, y) => {
                let order = x.unwrap_or(b'0').cmp(&y.unwrap_or(b'0'));
                if order != Ordering::Equal {
                    return order;
                }
            }
        }
    }
}

/// The decimal text of a JSON number, written to the stack when it fits.
pub(crate) struct NumberText {
    buffer: [u8; 64],
    len: usize,
    spilled: Option<String>,
}

impl NumberText {
    /// Writes `number` as serde_json prints it: exact for integers, the shortest
    /// round-tripping text for floats, the original text with arbitrary precision.
    pub(crate) fn new(number: &serde_json::Number) -> Self {
        let mut text = Self {
            buffer: [0; 64],
            len: 0,
            spilled: None,
        };
        if write!(text, "{number}").is_err() {
            text.spilled = Some(number.to_string());
        }
        text
    }

    /// The text.
    pub(crate) fn as_str(&self) -> &str {
        if let Some(spilled) = &self.spilled {
            return spilled;
        }
        // INVARIANT: `write_str` only ever copies whole `&str`s into the buffer.
        self.buffer
            .get(..self.len)
            .and_then(|b| std::str::from_utf8(b).ok())
            .unwrap_or_default()
    }
}

impl Write for NumberText {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let end = self.len + s.len();
        let Some(slot) = self.buffer.get_mut(self.len..end) else {
            return Err(std::fmt::Error);
        };
        slot.copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

/// JavaScript's `String(n)` for a JSON number, as Kortix compares numbers: the number is
/// read as an IEEE double (as JavaScript's `JSON.parse` reads it), then written by
/// ECMAScript's Number::toString: the shortest digits that round-trip, plain notation
/// for exponents from -7 to 20 (`10`, `0.000001`, `123456789012345680000`), otherwise
/// `d.ddde+N` / `de-N` (`1e+21`, `1.5e-7`); negative zero is `0`.
pub(crate) fn js_number_text(number: &serde_json::Number) -> String {
    match number.as_f64() {
        Some(value) => js_f64_text(value),
        None => number.to_string(),
    }
}

/// ECMAScript Number::toString(x) with radix 10.
pub(crate) fn js_f64_text(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x == 0.0 {
        return "0".into();
    }
    let sign = if x < 0.0 { "-" } else { "" };
    if x.is_infinite() {
        return format!("{sign}Infinity");
    }
    // Rust's `{:e}` writes the shortest round-tripping digits, like ECMAScript's step 5.
    let scientific = format!("{:e}", x.abs());
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let k = i64::try_from(digits.len()).unwrap_or(i64::MAX);
    let n = exponent.parse::<i64>().unwrap_or(0) + 1;
    let zeros = |count: i64| "0".repeat(usize::try_from(count).unwrap_or(0));
    let body = if k <= n && n <= 21 {
        format!("{digits}{}", zeros(n - k))
    } else if 0 < n && n <= 21 {
        let (int, frac) = digits.split_at(usize::try_from(n).unwrap_or(0));
        format!("{int}.{frac}")
    } else if -6 < n && n <= 0 {
        format!("0.{}{digits}", zeros(-n))
    } else {
        let e = n - 1;
        let e_sign = if e < 0 { '-' } else { '+' };
        let (first, rest) = digits.split_at(1);
        if rest.is_empty() {
            format!("{first}e{e_sign}{}", e.abs())
        } else {
            format!("{first}.{rest}e{e_sign}{}", e.abs())
        }
    };
    format!("{sign}{body}")
}

#[cfg(test)]
mod js_tests {
    use super::js_f64_text;

    #[test]
    fn writes_numbers_as_javascript_does() {
        let cases: &[(f64, &str)] = &[
            (10.0, "10"),
            (-0.0, "0"),
            (0.0, "0"),
            (1e21, "1e+21"),
            (1e20, "100000000000000000000"),
            (123456789012345680000.0, "123456789012345680000"),
            (1.5e-7, "1.5e-7"),
            (1e-7, "1e-7"),
            (0.000001, "0.000001"),
            (0.0000012345, "0.0000012345"),
            (-2.5, "-2.5"),
            (4900.0, "4900"),
            (0.1 + 0.2, "0.30000000000000004"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
            (5e-324, "5e-324"),
            (-1.25e22, "-1.25e+22"),
            (123.456, "123.456"),
            (9007199254740993.0, "9007199254740992"),
        ];
        for (value, expected) in cases {
            assert_eq!(js_f64_text(*value), *expected, "{value:?}");
        }
    }
}
