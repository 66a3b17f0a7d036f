//! Patterns, as written in `match:` for rules and conditions.
//!
//! - `/body/flags` is a regular expression literal, as in Kortix: unanchored and always
//!   case-insensitive. Flags `i`, `m` (`^`/`$` at line ends, `\n` or `\r`) and `s` (`.`
//!   matches a line terminator) mean what they mean in JavaScript; `u` makes `\p{…}` and
//!   `\u{…}` escapes; `v` reads as `u`, its set notation refused; `d`, `g` and `y` are
//!   accepted and ignored, since a condition is a single test. Any other flag, a repeated
//!   flag, `u` with `v`, an empty body, or a pattern that starts with `/` without being
//!   such a literal is an error at load: no tool name contains `/`, so it can only be a
//!   mistake (Kortix reads an invalid literal as "never matches"). The body is
//!   JavaScript's syntax, rewritten for the `regex` crate so it means what it means in
//!   JavaScript (`\d`, `\w`, `\b` ASCII, `.` stopping at every line terminator: see
//!   `js_regex`); look-around and backreferences are refused (an error at load).
//! - anything with a `*` is a glob anchored at both ends; `*` matches any run of
//!   characters, dots included, but no line terminator (`\n`, `\r`, U+2028, U+2029),
//!   as Kortix's `.*` does not; it is the only wildcard. A lone `*` matches everything,
//!   line terminators included (Kortix's shortcut).
//! - anything else is compared whole.
//!
//! Globs and names are case-insensitive: both sides are lowercased (Unicode's
//! `to_lowercase`) before comparing. ASCII text, the common case, is compared without
//! allocating.

use regex::{Regex, RegexBuilder};

use super::js_regex::{self, Mode};

/// A compiled pattern.
#[derive(Clone, Debug)]
pub(crate) enum Pattern {
    /// A name without `*`, lowercased.
    Exact(Box<str>),
    /// A glob with at least one `*`, lowercased.
    Glob(Box<str>),
    /// A `/body/flags` regular expression, case-insensitive.
    Regex(Regex),
}

/// Compiled regexes are capped at this size so a policy cannot exhaust memory.
pub(crate) const REGEX_SIZE_LIMIT: usize = 1 << 20;

impl Pattern {
    /// Compiles a pattern; the error says why a regular expression is invalid.
    pub(crate) fn compile(text: &str) -> Result<Self, String> {
        if text.starts_with('/') {
            let (body, flags) = regex_literal(text)?;
            let body = js_regex::translate(body, flags.mode)
                .map_err(|detail| format!("invalid regular expression `{text}`: {detail}"))?;
            // The flags go inline, so that the index's `RegexSet`, built from the text,
            // reads them too; `R`: `$` also before `\r`, as in JavaScript.
            let inline = if flags.multi_line { "(?mR)" } else { "(?R)" };
            return RegexBuilder::new(&format!("{inline}{body}"))
                .case_insensitive(true)
                .size_limit(REGEX_SIZE_LIMIT)
                .build()
                .map(Pattern::Regex)
                .map_err(|error| {
                    // The regex crate's message spans lines; its last line says what is wrong.
                    let shown = error.to_string();
                    let detail = shown.lines().last().unwrap_or_default();
                    let detail = detail.strip_prefix("error: ").unwrap_or(detail);
                    format!("invalid regular expression `{text}`: {detail}")
                });
        }
        let lowered = text.to_lowercase().into_boxed_str();
        if lowered.contains('*') {
            Ok(Pattern::Glob(lowered))
        } else {
            Ok(Pattern::Exact(lowered))
        }
    }

    /// Whether the pattern matches `text`.
    pub(crate) fn matches(&self, text: &str) -> bool {
        match self {
            Pattern::Regex(regex) => regex.is_match(text),
            Pattern::Exact(name) => {
                if text.is_ascii() {
                    text.eq_ignore_ascii_case(name)
                } else {
                    text.to_lowercase() == name.as_ref()
                }
            }
            Pattern::Glob(glob) => {
                if text.is_ascii() {
                    glob_match(glob.as_bytes(), text.as_bytes(), true)
                } else {
                    glob_match(glob.as_bytes(), text.to_lowercase().as_bytes(), false)
                }
            }
        }
    }

    /// Whether the pattern matches a name given both as written and lowercased.
    pub(crate) fn matches_lowered(&self, original: &str, lowered: &str) -> bool {
        match self {
            Pattern::Regex(regex) => regex.is_match(original),
            Pattern::Exact(name) => name.as_ref() == lowered,
            Pattern::Glob(glob) => glob_match(glob.as_bytes(), lowered.as_bytes(), false),
        }
    }

    /// For a glob, the literal text before its first `*` and after its last.
    pub(crate) fn glob_affixes(&self) -> Option<(&str, &str)> {
        let Pattern::Glob(glob) = self else {
            return None;
        };
        let first = glob.find('*')?;
        let last = glob.rfind('*')?;
        Some((&glob[..first], &glob[last + 1..]))
    }

    /// Whether every text this pattern matches is also matched by `wider`.
    ///
    /// Sound but not complete: `false` may mean "cannot tell" (regular expressions).
    pub(crate) fn is_covered_by(&self, wider: &Pattern) -> bool {
        let wider = match wider {
            Pattern::Regex(_) => return false,
            Pattern::Exact(name) | Pattern::Glob(name) => name,
        };
        match self {
            Pattern::Regex(_) => !wider.is_empty() && wider.bytes().all(|b| b == b'*'),
            Pattern::Exact(name) | Pattern::Glob(name) => {
                glob_covers(wider.as_bytes(), name.as_bytes())
            }
        }
    }
}

/// The flags of a `/body/flags` literal that change how it matches.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Flags {
    pub multi_line: bool,
    /// How the body reads: `u`/`v` escapes, `v` set notation, `s`.
    pub mode: Mode,
}

/// Splits a `/body/flags` literal, or says why `text` (which starts with `/`) is not one.
pub(crate) fn regex_literal(text: &str) -> Result<(&str, Flags), String> {
    let close = text.rfind('/').filter(|&at| at > 0).ok_or_else(|| {
        format!(
            "`{text}` starts with `/` but is not a regular expression `/body/flags` \
             (no closing `/`); no tool name contains `/`"
        )
    })?;
    let (body, flag_text) = (&text[1..close], &text[close + 1..]);
    if body.is_empty() {
        return Err(format!("`{text}` is an empty regular expression"));
    }
    let mut flags = Flags::default();
    let mut seen = String::new();
    for flag in flag_text.chars() {
        if seen.contains(flag) {
            return Err(format!("flag `{flag}` is repeated in `{text}`"));
        }
        seen.push(flag);
        match flag {
            'i' | 'g' | 'y' | 'd' => {}
            'm' => flags.multi_line = true,
            's' => flags.mode.dot_all = true,
            'u' => flags.mode.unicode = true,
            'v' => {
                flags.mode.unicode = true;
                flags.mode.sets = true;
            }
            _ => {
                return Err(format!(
                    "unknown regular expression flag `{flag}` in `{text}`; expected i, m, s, \
                     u or v (d, g and y are ignored)"
                ));
            }
        }
    }
    if seen.contains('u') && seen.contains('v') {
        return Err(format!(
            "flags `u` and `v` cannot be used together in `{text}`"
        ));
    }
    Ok((body, flags))
}

/// Matches a lowercased glob against text, lowercasing ASCII text bytes when `fold`.
///
/// The classic linear-backtracking wildcard match: on a mismatch after a `*`, the star
/// takes one more byte. Literal runs are whole UTF-8 sequences, so byte matching is exact.
pub(crate) fn glob_match(glob: &[u8], text: &[u8], fold: bool) -> bool {
    // Kortix matches a lone `*` against anything, line terminators included.
    if glob == b"*" {
        return true;
    }
    let byte_at = |i: usize| {
        text.get(i)
            .map(|&b| if fold { b.to_ascii_lowercase() } else { b })
    };
    let (mut g, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while let Some(current) = byte_at(t) {
        let wanted = glob.get(g).copied();
        if wanted == Some(b'*') {
            star = Some((g, t));
            g += 1;
        } else if wanted == Some(current) {
            g += 1;
            t += 1;
        } else if let Some((star_g, star_t)) = star {
            // As in Kortix (`*` becomes JavaScript's `.*`), a star never absorbs a line
            // terminator: `*@example.com` does not match `x@evil.com\n@example.com`.
            if is_line_terminator(text.get(star_t..).unwrap_or_default()) {
                return false;
            }
            g = star_g + 1;
            t = star_t + 1;
            star = Some((star_g, star_t + 1));
        } else {
            return false;
        }
    }
    glob.get(g..).unwrap_or_default().iter().all(|&b| b == b'*')
}

/// Whether `text` starts with a JavaScript line terminator: `\n`, `\r`, U+2028, U+2029.
fn is_line_terminator(text: &[u8]) -> bool {
    matches!(text, [b'\n' | b'\r', ..] | [0xE2, 0x80, 0xA8 | 0xA9, ..])
}

/// Whether glob `wide` matches every text glob `narrow` matches: `wide` must match
/// `narrow` as text, where a `*` in `narrow` can only be absorbed by a `*` in `wide`.
fn glob_covers(wide: &[u8], narrow: &[u8]) -> bool {
    match wide.split_first() {
        None => narrow.is_empty(),
        Some((b'*', rest)) => {
            (0..=narrow.len()).any(|skip| narrow.get(skip..).is_some_and(|n| glob_covers(rest, n)))
        }
        Some((&c, rest)) => match narrow.split_first() {
            Some((&n, narrow_rest)) if n == c && n != b'*' => glob_covers(rest, narrow_rest),
            _ => false,
        },
    }
}
