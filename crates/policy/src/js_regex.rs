//! A JavaScript regular expression body, rewritten in the `regex` crate's syntax so that
//! it means what it means in JavaScript (Kortix compiles it with `new RegExp`).
//!
//! The two syntaxes share a common core but read some of it differently; the rewrite
//! makes each such piece mean JavaScript's reading:
//! - `\d`, `\w`, `\b`, `\B` are ASCII in JavaScript (with or without `u`), Unicode in the
//!   `regex` crate; `\s` is JavaScript's own set (with U+FEFF, without U+0085).
//! - `.` does not match a line terminator (`\n`, `\r`, U+2028, U+2029) without `s`.
//! - `[^]` matches any character and `[]` none; inside a class `\b` is a backspace, and
//!   `[`, `&&`, `--`, `~~` are plain characters (set operators in the `regex` crate).
//! - a `{` that does not start a quantifier, a `}` and a `]` are plain characters.
//!
//! Syntax that JavaScript reads in a way the `regex` crate cannot express, or that only
//! the `regex` crate knows, is refused with a message: look-around, backreferences,
//! inline flags `(?i)`, `(?P<…>`, `\p{…}` or `\u{…}` without the `u` flag (JavaScript
//! reads them as letters), and escapes of letters JavaScript does not define (`\A`,
//! `\z`, `\h`, …). With the `v` flag, a class may not use `v`'s set notation (nested
//! classes, `--`, `&&` and the other doubled punctuators): it is refused, and otherwise
//! `v` reads as `u`.

use std::fmt::Write;

/// JavaScript's `\s`: WhiteSpace and LineTerminator, as the body of a class.
macro_rules! space {
    () => {
        r"\t\n\x0B\f\r \xA0\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000}\x{FEFF}"
    };
}
const SPACE: &str = space!();
/// What `.` matches without the `s` flag: anything but a line terminator.
const DOT: &str = r"[^\n\r\x{2028}\x{2029}]";
/// Every character (`[^]` in JavaScript).
const ANY: &str = r"[\x00-\x{10FFFF}]";
/// No character (`[]` in JavaScript).
const NONE: &str = r"[^\x00-\x{10FFFF}]";
/// Characters that must be escaped inside a class with the `v` flag.
const V_CLASS_SYNTAX: &str = "()[]{}/|";
/// The doubled punctuators reserved inside a class with the `v` flag (`--` included).
const V_DOUBLED: &str = "&!#$%*+,.:;<=>?@^`~-";

/// How the flags change the reading of the body.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Mode {
    /// `u` or `v`: `\p{…}` and `\u{…}` are escapes.
    pub unicode: bool,
    /// `v`: classes may use set notation (refused here).
    pub sets: bool,
    /// `s`: `.` matches line terminators too.
    pub dot_all: bool,
}

/// Rewrites a JavaScript regular expression body, or says why it cannot be read alike.
pub(crate) fn translate(body: &str, mode: Mode) -> Result<String, String> {
    let mut out = String::with_capacity(body.len() + 16);
    let chars: Vec<char> = body.chars().collect();
    let mut i = 0;
    while let Some(&c) = chars.get(i) {
        i += 1;
        match c {
            '\\' => i = escape(&chars, i, mode, false, &mut out)?,
            '[' => i = class(&chars, i, mode, &mut out)?,
            '.' if mode.dot_all => out.push_str(ANY),
            '.' => out.push_str(DOT),
            '(' if chars.get(i) == Some(&'?') => i = group(&chars, i, &mut out)?,
            '{' if quantifier_len(&chars, i) > 0 => {
                let end = i + quantifier_len(&chars, i);
                out.push('{');
                out.extend(chars.get(i..end).unwrap_or_default());
                i = end;
            }
            '{' | '}' | ']' if mode.unicode => {
                return Err(format!(
                    "a lone `{c}` is a syntax error with flag `u` or `v`"
                ));
            }
            '{' | '}' | ']' => {
                out.push('\\');
                out.push(c);
            }
            _ => out.push(c),
        }
    }
    Ok(out)
}

/// `(?` at `chars[at - 1..]`: a non-capturing or named group; anything else is refused.
fn group(chars: &[char], at: usize, out: &mut String) -> Result<usize, String> {
    match (chars.get(at + 1), chars.get(at + 2)) {
        (Some(':'), _) => out.push_str("(?:"),
        (Some('<'), Some(c)) if *c != '=' && *c != '!' => out.push_str("(?<"),
        (Some('=' | '!'), _) | (Some('<'), _) => {
            return Err("look-around `(?=`, `(?!`, `(?<=`, `(?<!` is not supported".into());
        }
        _ => {
            return Err(
                "`(?` must start `(?:` or a named group `(?<name>`: inline flags \
                        and `(?P` are not JavaScript syntax"
                    .into(),
            );
        }
    }
    Ok(at + 2)
}

/// The length of the rest of a quantifier `{n}`, `{n,}` or `{n,m}` whose `{` is just
/// before `chars[at]` (its `}` included), or 0 when that `{` starts none.
fn quantifier_len(chars: &[char], at: usize) -> usize {
    let rest = chars.get(at..).unwrap_or_default();
    let digits = |s: &[char]| s.iter().take_while(|c| c.is_ascii_digit()).count();
    let first = digits(rest);
    if first == 0 {
        return 0;
    }
    match rest.get(first) {
        Some('}') => first + 1,
        Some(',') => {
            let second = digits(rest.get(first + 1..).unwrap_or_default());
            if rest.get(first + 1 + second) == Some(&'}') {
                first + second + 2
            } else {
                0
            }
        }
        _ => 0,
    }
}

/// A class whose `[` is just before `chars[at]`; returns the index after its `]`.
fn class(chars: &[char], mut at: usize, mode: Mode, out: &mut String) -> Result<usize, String> {
    let negated = chars.get(at) == Some(&'^');
    if negated {
        at += 1;
    }
    if chars.get(at) == Some(&']') {
        out.push_str(if negated { ANY } else { NONE });
        return Ok(at + 1);
    }
    out.push_str(if negated { "[^" } else { "[" });
    let mut previous = None;
    while let Some(&c) = chars.get(at) {
        at += 1;
        if mode.sets && c != '\\' {
            if V_CLASS_SYNTAX.contains(c) && c != ']' {
                return Err(v_sets(c));
            }
            if previous == Some(c) && V_DOUBLED.contains(c) {
                return Err(v_sets(c));
            }
        }
        match c {
            ']' => {
                out.push(']');
                return Ok(at);
            }
            '\\' => {
                at = escape(chars, at, mode, true, out)?;
                previous = None;
                continue;
            }
            '[' | '&' | '~' => {
                out.push('\\');
                out.push(c);
            }
            '-' if previous == Some('-') => out.push_str(r"\-"),
            _ => out.push(c),
        }
        previous = Some(c);
    }
    Err("a character class `[` is not closed".into())
}

fn v_sets(c: char) -> String {
    format!(
        "`{c}` inside a character class with flag `v`: `v`'s set notation is not supported \
         (escape the character, or use flag `u`)"
    )
}

/// An escape whose `\` is just before `chars[at]`; returns the index after it.
fn escape(
    chars: &[char],
    at: usize,
    mode: Mode,
    in_class: bool,
    out: &mut String,
) -> Result<usize, String> {
    let Some(&c) = chars.get(at) else {
        return Err("the pattern ends with a lone `\\`".into());
    };
    let next = at + 1;
    let hex = |from: usize, n: usize| -> Option<String> {
        let digits: String = chars.get(from..from + n)?.iter().collect();
        digits
            .chars()
            .all(|d| d.is_ascii_hexdigit())
            .then_some(digits)
    };
    if let Some(class) = class_escape(c, in_class) {
        out.push_str(class);
        return Ok(next);
    }
    match c {
        'n' | 'r' | 't' | 'f' | 'v' => {
            out.push('\\');
            out.push(c);
        }
        '0' if !chars.get(next).is_some_and(char::is_ascii_digit) => out.push_str(r"\x00"),
        '0'..='9' | 'k' => {
            return Err(format!(
                "`\\{c}`: backreferences and octal escapes are not supported"
            ));
        }
        'x' => {
            let digits = hex(next, 2).ok_or("`\\x` needs two hex digits")?;
            let _ = write!(out, r"\x{{{digits}}}");
            return Ok(next + 2);
        }
        'u' => return unicode_escape(chars, next, mode, out),
        'c' => {
            let letter = chars.get(next).filter(|l| l.is_ascii_alphabetic());
            let letter = letter.ok_or("`\\c` needs a letter")?;
            let _ = write!(out, r"\x{{{:02X}}}", u32::from(*letter) % 32);
            return Ok(next + 1);
        }
        'p' | 'P' => return property_escape(chars, at, mode, out),
        _ if c.is_ascii_alphanumeric() => {
            return Err(format!("`\\{c}` is not a JavaScript escape"));
        }
        _ => out.push_str(&regex::escape(c.encode_utf8(&mut [0; 4]))),
    }
    Ok(next)
}

/// `\p{…}` or `\P{…}` whose `p` is at `chars[at]`: a property with flag `u` or `v`.
fn property_escape(
    chars: &[char],
    at: usize,
    mode: Mode,
    out: &mut String,
) -> Result<usize, String> {
    let Some(&c) = chars.get(at) else {
        return Err("`\\p` needs a property, like `\\p{L}`".into());
    };
    if !mode.unicode {
        return Err(format!(
            "`\\{c}{{…}}` needs flag `u`: without it JavaScript reads `\\{c}` as the letter {c}"
        ));
    }
    let next = at + 1;
    let close = chars
        .get(next..)
        .unwrap_or_default()
        .iter()
        .position(|&b| b == '}')
        .map(|p| next + p);
    let end = close.filter(|_| chars.get(next) == Some(&'{'));
    let end = end.ok_or_else(|| format!("`\\{c}` needs a property, like `\\{c}{{L}}`"))?;
    out.push('\\');
    out.extend(chars.get(at..=end).unwrap_or_default());
    Ok(end + 1)
}

/// The translation of a class escape (`\d`, `\w`, `\s`, `\b` and their negations),
/// inside a class or outside one.
fn class_escape(c: char, in_class: bool) -> Option<&'static str> {
    Some(match (c, in_class) {
        ('d', false) => "[0-9]",
        ('d', true) => "0-9",
        ('D', _) => "[^0-9]",
        ('w', false) => r"(?-u:\w)",
        ('w', true) => "0-9A-Za-z_",
        ('W', _) => "[^0-9A-Za-z_]",
        ('s', false) => concat!("[", space!(), "]"),
        ('s', true) => SPACE,
        ('S', _) => concat!("[^", space!(), "]"),
        ('b', false) => r"(?-u:\b)",
        ('B', false) => r"(?-u:\B)",
        ('b', true) => r"\x08",
        _ => return None,
    })
}

/// `\uHHHH`, or `\u{H…}` with flag `u`, whose `u` is just before `chars[at]`.
fn unicode_escape(
    chars: &[char],
    at: usize,
    mode: Mode,
    out: &mut String,
) -> Result<usize, String> {
    if chars.get(at) == Some(&'{') {
        if !mode.unicode {
            return Err(
                "`\\u{…}` needs flag `u`: without it JavaScript reads `\\u` as the letter u".into(),
            );
        }
        let close = chars
            .get(at..)
            .unwrap_or_default()
            .iter()
            .position(|&c| c == '}')
            .map(|p| at + p);
        let digits: Option<String> = close
            .and_then(|end| chars.get(at + 1..end))
            .map(|d| d.iter().collect());
        return match (close, digits) {
            (Some(end), Some(d)) if !d.is_empty() && d.chars().all(|h| h.is_ascii_hexdigit()) => {
                let _ = write!(out, r"\x{{{d}}}");
                Ok(end + 1)
            }
            _ => Err("`\\u{…}` needs hex digits".into()),
        };
    }
    let digits: String = chars.get(at..at + 4).unwrap_or_default().iter().collect();
    if digits.len() != 4 || !digits.chars().all(|h| h.is_ascii_hexdigit()) {
        return Err("`\\u` needs four hex digits".into());
    }
    let _ = write!(out, r"\x{{{digits}}}");
    Ok(at + 4)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compiles(body: &str, mode: Mode) -> regex::Regex {
        let translated = translate(body, mode).unwrap_or_else(|e| panic!("{body}: {e}"));
        regex::Regex::new(&translated).unwrap_or_else(|e| panic!("{body} as {translated}: {e}"))
    }

    #[test]
    fn common_patterns_keep_working() {
        let cases = [
            (r"^charges\.(create|update)$", "charges.create"),
            (r"^(owner|admin)@example\.com$", "admin@example.com"),
            (r"^[\w.-]+@[^\s@]+$", "a.b-c@x.org"),
            (r"^\d{3,}$", "4900"),
            (r"^a{,3}$", "a{,3}"),
            (r"^(?<year>\d{4})-\d\d$", "2026-12"),
            (r"^a\/b\-c\$$", "a/b-c$"),
            (r"^\S+\s\S+$", "two words"),
            (r"^x*?y+?$", "xxy"),
            (r"^[^a-c]$", "d"),
        ];
        for (body, text) in cases {
            assert!(compiles(body, Mode::default()).is_match(text), "{body}");
        }
        let unicode = Mode {
            unicode: true,
            ..Mode::default()
        };
        assert!(compiles(r"^\p{Lu}\u{e9}$", unicode).is_match("Aé"));
    }

    #[test]
    fn translation_names_each_javascript_reading() {
        let mode = Mode::default();
        assert_eq!(
            translate(r"\d\w\b", mode).as_deref(),
            Ok(r"[0-9](?-u:\w)(?-u:\b)")
        );
        assert_eq!(
            translate("a.b", mode).as_deref(),
            Ok(r"a[^\n\r\x{2028}\x{2029}]b")
        );
        assert_eq!(translate("[&-]", mode).as_deref(), Ok(r"[\&-]"));
        assert!(translate("[a", mode).is_err_and(|e| e.contains("not closed")));
        assert!(translate(r"a\", mode).is_err_and(|e| e.contains("lone")));
    }
}
