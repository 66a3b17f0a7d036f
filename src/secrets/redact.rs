//! Finding stored secret values in outgoing text, and replacing them.
//!
//! Every secret of at least [`MIN_SECRET_LEN`] bytes contributes these needles to one
//! Aho-Corasick automaton:
//! - the raw value;
//! - the value as it appears inside a JSON string (escaped), when that differs;
//! - base64, standard and URL-safe alphabets: the value is encoded after 0, 1 and 2
//!   leading bytes, and the characters that depend on the value's bits alone are kept,
//!   so the needle matches wherever the value sits in a larger encoded blob (an
//!   `Authorization: Basic` header, say) and with or without `=` padding. A base64
//!   match is redacted together with the whole run of base64 characters around it, so
//!   no partial character of the value is left behind.
//!
//! - hex, lowercase and uppercase (two digits per byte, so one needle per case matches
//!   at any position).
//!
//! URL encoding is handled by decoding the haystack instead of by needles, so every
//! encoder's choice of which characters to escape and hex case is covered: when the text
//! holds a `%` it is also searched percent-decoded, and when some secret contains a
//! space, also with `+` read as a space (form encoding). A match in decoded text maps
//! back to the encoded span it came from.
//!
//! Redaction replaces every match, overlapping ones included (two secrets sharing
//! characters are covered by one `[secret:NAME]`).
//! Not covered: hex of mixed case, double URL encoding, and other transformations (compression,
//! encryption, splitting a value across fields).

use crate::secrets::ExposeSecret as _;
use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;

use aho_corasick::{AhoCorasick, MatchKind};
use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD_NO_PAD, URL_SAFE_NO_PAD};
use serde_json::Value;

use super::{SecretString, SecretsError};

/// Secrets shorter than this many bytes are not searched for: they would match ordinary
/// text. [`Redactor::too_short`] lists them so the operator can replace them.
pub const MIN_SECRET_LEN: usize = 6;

/// The shortest base64 needle kept (42 bits). A value of [`MIN_SECRET_LEN`] bytes gives
/// needles of at least this length at every alignment.
const MIN_ENCODED_NEEDLE: usize = 7;

/// Finds and replaces stored secret values (raw, JSON-escaped, base64, hex, URL-encoded).
///
/// Cheap to clone (the automaton is shared). `Debug` prints names only.
#[derive(Clone, Default)]
pub struct Redactor {
    automaton: Option<AhoCorasick>,
    /// What each needle of the automaton is, by pattern id.
    needles: Vec<Needle>,
    names: Vec<String>,
    too_short: Vec<String>,
    /// Whether some searched secret contains a space, so form-decoded text (`+` as
    /// space) must be searched too.
    decode_plus: bool,
}

impl Redactor {
    /// A redactor that finds nothing.
    pub fn empty() -> Redactor {
        Redactor::default()
    }

    /// Builds the automaton over `secrets` (name, value).
    pub fn new(
        secrets: impl IntoIterator<Item = (String, SecretString)>,
    ) -> Result<Redactor, SecretsError> {
        let mut redactor = Redactor::default();
        let mut needles: Vec<Vec<u8>> = Vec::new();
        let mut seen: HashSet<Vec<u8>> = HashSet::new();
        for (name, value) in secrets {
            if value.expose_secret().len() < MIN_SECRET_LEN {
                redactor.too_short.push(name);
                continue;
            }
            let owner = redactor.names.len();
            redactor.names.push(name);
            redactor.decode_plus |= value.expose_secret().contains(' ');
            for (needle, base64) in needles_for(value.expose_secret()) {
                if seen.insert(needle.clone()) {
                    needles.push(needle);
                    redactor.needles.push(Needle { owner, base64 });
                }
            }
        }
        if !needles.is_empty() {
            let automaton = AhoCorasick::builder()
                // Standard semantics allow overlapping iteration, so that no match
                // hides another.
                .match_kind(MatchKind::Standard)
                // Needles start with letters and digits, which are everywhere in real
                // text: a prefilter keeps stopping and costs 3-4x the plain automaton.
                .prefilter(false)
                .build(&needles)
                .map_err(|e| SecretsError::Scanner(e.to_string()))?;
            redactor.automaton = Some(automaton);
        }
        Ok(redactor)
    }

    /// Whether there is nothing to find (no secrets, or all too short).
    pub fn is_empty(&self) -> bool {
        self.automaton.is_none()
    }

    /// The names of the secrets searched for.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The names of the secrets ignored because they are shorter than
    /// [`MIN_SECRET_LEN`]: warn the operator about these.
    pub fn too_short(&self) -> &[String] {
        &self.too_short
    }

    /// The name of a secret whose value occurs in `haystack` in any supported form.
    pub fn find(&self, haystack: &[u8]) -> Option<&str> {
        let automaton = self.automaton.as_ref()?;
        let name = |m: aho_corasick::Match| self.name_of(&m);
        if let Some(m) = automaton.find(haystack) {
            return Some(name(m));
        }
        for plus in self.decodings(haystack) {
            let decoded = url_decode(haystack, plus, false);
            if let Some(m) = automaton.find(&decoded.bytes) {
                return Some(name(m));
            }
        }
        None
    }

    /// `text` with every occurrence of a secret, in any supported form, replaced by
    /// `[secret:NAME]`. Borrows `text` when there is nothing to replace.
    pub fn redact<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let spans = self.spans(text.as_bytes());
        if spans.is_empty() {
            return Cow::Borrowed(text);
        }
        let mut out = String::with_capacity(text.len());
        let mut copied = 0;
        for span in spans {
            let (start, end) = widen_to_chars(text, span.start, span.end);
            if start < copied {
                continue;
            }
            out.push_str(&text[copied..start]);
            out.push_str("[secret:");
            #[expect(
                clippy::indexing_slicing,
                reason = "INVARIANT: a span's owner is a needle's owner, an index into `names` built with the needles"
            )]
            out.push_str(&self.names[span.owner]);
            out.push(']');
            copied = end;
        }
        out.push_str(&text[copied..]);
        Cow::Owned(out)
    }

    /// Redacts every string in `value`, object keys included. A number whose text holds
    /// a secret becomes the string `[secret:NAME]`.
    pub fn redact_json(&self, value: &mut Value) {
        if self.is_empty() {
            return;
        }
        match value {
            Value::String(s) => {
                if let Cow::Owned(redacted) = self.redact(s) {
                    *s = redacted;
                }
            }
            Value::Number(n) => {
                if let Some(name) = self.find(n.to_string().as_bytes()) {
                    *value = Value::String(format!("[secret:{name}]"));
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|v| self.redact_json(v)),
            Value::Object(map) => {
                let keys_clean = map.keys().all(|k| self.find(k.as_bytes()).is_none());
                if keys_clean {
                    map.values_mut().for_each(|v| self.redact_json(v));
                    return;
                }
                for (key, mut v) in std::mem::take(map) {
                    self.redact_json(&mut v);
                    let mut key = self.redact(&key).into_owned();
                    // Two keys may redact to the same text; keep both values.
                    while map.contains_key(&key) {
                        key.push('\'');
                    }
                    map.insert(key, v);
                }
            }
            Value::Null | Value::Bool(_) => {}
        }
    }

    /// Which decoded forms of `haystack` need a search: `false` = percent-decoded,
    /// `true` = percent-decoded with `+` as space.
    fn decodings(&self, haystack: &[u8]) -> impl Iterator<Item = bool> {
        let percent = haystack.contains(&b'%');
        let plus = self.decode_plus && (percent || haystack.contains(&b'+'));
        [(percent, false), (plus, true)]
            .into_iter()
            .filter_map(|(needed, plus)| needed.then_some(plus))
    }

    /// Every match in `haystack` and its decoded forms, overlapping ones included, as
    /// sorted, disjoint spans of `haystack`.
    fn spans(&self, haystack: &[u8]) -> Vec<Span> {
        let Some(automaton) = self.automaton.as_ref() else {
            return Vec::new();
        };
        let mut spans: Vec<Span> = automaton
            .find_overlapping_iter(haystack)
            .map(|m| self.span(haystack, m.start(), m.end(), &m))
            .collect();
        for plus in self.decodings(haystack) {
            let decoded = url_decode(haystack, plus, true);
            #[expect(
                clippy::indexing_slicing,
                reason = "INVARIANT: `origin` has an entry for every decoded byte and one for the end, so for any match in `decoded.bytes` both ends are indexes of it; a fallback would leave a secret unredacted"
            )]
            spans.extend(automaton.find_overlapping_iter(&decoded.bytes).map(|m| {
                self.span(
                    haystack,
                    decoded.origin[m.start()],
                    decoded.origin[m.end()],
                    &m,
                )
            }));
        }
        merge(spans)
    }

    /// The span of `haystack` to redact for match `m` at `start..end`: a base64 match
    /// grows to the whole base64 run around it.
    fn span(&self, haystack: &[u8], start: usize, end: usize, m: &aho_corasick::Match) -> Span {
        #[expect(
            clippy::indexing_slicing,
            reason = "INVARIANT: the automaton is built from `needles`, so a pattern id is an index into them; a fallback would leave a secret unredacted"
        )]
        let needle = self.needles[m.pattern().as_usize()];
        let (start, end) = if needle.base64 {
            base64_run(haystack, start, end)
        } else {
            (start, end)
        };
        Span {
            start,
            end,
            owner: needle.owner,
        }
    }

    #[expect(
        clippy::indexing_slicing,
        reason = "INVARIANT: the automaton is built from `needles` and each needle's owner indexes `names`"
    )]
    fn name_of(&self, m: &aho_corasick::Match) -> &str {
        &self.names[self.needles[m.pattern().as_usize()].owner]
    }
}

impl fmt::Debug for Redactor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Redactor")
            .field("names", &self.names)
            .field("too_short", &self.too_short)
            .field("needles", &self.needles.len())
            .finish()
    }
}

/// What a needle stands for.
#[derive(Debug, Clone, Copy)]
struct Needle {
    /// The index of its secret in `names`.
    owner: usize,
    /// Whether it is a base64 fragment.
    base64: bool,
}

/// A match, as a byte range of the original haystack.
#[derive(Debug, Clone, Copy)]
struct Span {
    start: usize,
    end: usize,
    owner: usize,
}

/// Sorts spans and folds overlapping ones into the first.
fn merge(mut spans: Vec<Span>) -> Vec<Span> {
    spans.sort_by_key(|s| (s.start, std::cmp::Reverse(s.end)));
    let mut merged: Vec<Span> = Vec::with_capacity(spans.len());
    for span in spans {
        match merged.last_mut() {
            Some(last) if span.start < last.end => last.end = last.end.max(span.end),
            _ => merged.push(span),
        }
    }
    merged
}

/// Grows `start..end` over the base64 characters (either alphabet) on both sides and
/// any `=` padding after.
fn base64_run(haystack: &[u8], mut start: usize, mut end: usize) -> (usize, usize) {
    let is_b64 = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'-' | b'_');
    while start > 0 && haystack.get(start - 1).is_some_and(|&b| is_b64(b)) {
        start -= 1;
    }
    while haystack.get(end).is_some_and(|&b| is_b64(b)) {
        end += 1;
    }
    while haystack.get(end) == Some(&b'=') {
        end += 1;
    }
    (start, end)
}

/// Moves a byte range outwards to character boundaries. Matches of UTF-8 needles in
/// UTF-8 text already sit on boundaries; this is defence against a decoded match that
/// does not.
fn widen_to_chars(text: &str, mut start: usize, mut end: usize) -> (usize, usize) {
    while !text.is_char_boundary(start) {
        start -= 1;
    }
    while !text.is_char_boundary(end) {
        end += 1;
    }
    (start, end)
}

/// Every needle for one value, each with whether it is base64: raw, JSON-escaped, hex
/// (both cases), and alignment-independent base64.
fn needles_for(value: &str) -> Vec<(Vec<u8>, bool)> {
    let raw = value.as_bytes();
    let mut needles = vec![(raw.to_vec(), false)];
    let hex_lower = hex::encode(raw);
    needles.push((hex_lower.to_ascii_uppercase().into_bytes(), false));
    needles.push((hex_lower.into_bytes(), false));
    if let Ok(quoted) = serde_json::to_string(value) {
        let escaped = &quoted[1..quoted.len() - 1];
        if escaped != value {
            needles.push((escaped.as_bytes().to_vec(), false));
        }
    }
    for lead in 0..3usize {
        let mut shifted = vec![0u8; lead];
        shifted.extend_from_slice(raw);
        // Characters [first, last) of the encoding carry only the value's bits: the
        // first starts at or after bit 8*lead, the last ends at or before the value's
        // final bit.
        let first = (8 * lead).div_ceil(6);
        let last = 8 * shifted.len() / 6;
        for engine in [&STANDARD_NO_PAD, &URL_SAFE_NO_PAD] {
            let encoded = engine.encode(&shifted);
            if last - first >= MIN_ENCODED_NEEDLE {
                #[expect(
                    clippy::indexing_slicing,
                    reason = "INVARIANT: an unpadded encoding of n bytes has ceil(8n/6) characters, at least `last` = floor(8n/6), and `first` <= `last` here; a fallback would drop a needle and leave a secret unredacted"
                )]
                needles.push((encoded.as_bytes()[first..last].to_vec(), true));
            }
        }
    }
    needles
}

/// A URL-decoded haystack; `origin[i]` is where decoded byte `i` starts in the input,
/// with one extra entry for the end.
struct Decoded {
    bytes: Vec<u8>,
    origin: Vec<usize>,
}

/// Percent-decodes `input` (`%` and two hex digits, either case; anything else is kept
/// as is) and, with `plus`, reads `+` as a space. With `map`, records the origins.
fn url_decode(input: &[u8], plus: bool, map: bool) -> Decoded {
    let mut bytes = Vec::with_capacity(input.len());
    let mut origin = Vec::with_capacity(if map { input.len() + 1 } else { 0 });
    let mut i = 0;
    while let Some(&here) = input.get(i) {
        if map {
            origin.push(i);
        }
        let escaped = match here {
            b'%' => hex_pair(input.get(i + 1).copied(), input.get(i + 2).copied()),
            _ => None,
        };
        match (escaped, here) {
            (Some(byte), _) => {
                bytes.push(byte);
                i += 3;
            }
            (None, b'+') if plus => {
                bytes.push(b' ');
                i += 1;
            }
            (None, byte) => {
                bytes.push(byte);
                i += 1;
            }
        }
    }
    if map {
        origin.push(input.len());
    }
    Decoded { bytes, origin }
}

fn hex_pair(high: Option<u8>, low: Option<u8>) -> Option<u8> {
    let digit = |b: u8| (b as char).to_digit(16).and_then(|d| u8::try_from(d).ok());
    Some(digit(high?)? << 4 | digit(low?)?)
}
