//! An index from tool names to the rules that may match them, so a decision on a large
//! policy does not test every rule.
//!
//! The index only narrows: it returns a superset of the matching rules as a bit set, and
//! the engine still checks each candidate's pattern, in rule order, so first-match-wins is
//! untouched. Exact names are looked up in a hash map; globs are filed under the literal
//! text before their first `*` (or after their last), looked up for each length present;
//! globs with neither (`*.delete_*`) are found by their longest literal piece with one
//! Aho-Corasick automaton; globs with no literal at all are always candidates; regular
//! expressions go through one `RegexSet`.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use aho_corasick::AhoCorasick;
use regex::{RegexSet, RegexSetBuilder};

use super::catalog::BUILTIN_TOOLS;
use super::pattern::{Pattern, REGEX_SIZE_LIMIT};

/// A tool name lowercased once per decision, on the stack when it is short ASCII.
pub(crate) struct LoweredName {
    buffer: [u8; 128],
    len: usize,
    long: Option<String>,
}

impl LoweredName {
    pub(crate) fn new(name: &str) -> Self {
        let mut lowered = Self {
            buffer: [0; 128],
            len: 0,
            long: None,
        };
        if name.is_ascii() && name.len() <= lowered.buffer.len() {
            for (slot, byte) in lowered.buffer.iter_mut().zip(name.bytes()) {
                *slot = byte.to_ascii_lowercase();
            }
            lowered.len = name.len();
        } else {
            lowered.long = Some(name.to_lowercase());
        }
        lowered
    }

    pub(crate) fn as_str(&self) -> &str {
        if let Some(long) = &self.long {
            return long;
        }
        // INVARIANT: the buffer holds a lowercased copy of an ASCII string.
        self.buffer
            .get(..self.len)
            .and_then(|b| std::str::from_utf8(b).ok())
            .unwrap_or_default()
    }
}

/// FNV-1a: tool names are short and not attacker-chosen in bulk, so a fast hash fits.
#[derive(Default)]
pub(crate) struct Fnv(u64);

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut hash = if self.0 == 0 {
            0xcbf2_9ce4_8422_2325
        } else {
            self.0
        };
        for &byte in bytes {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        self.0 = hash;
    }
}

type FastMap<V> = HashMap<Box<str>, V, BuildHasherDefault<Fnv>>;

/// Rules filed by a literal affix, with the affix lengths present.
#[derive(Clone, Debug, Default)]
struct AffixMap {
    lengths: Vec<usize>,
    rules: FastMap<Vec<usize>>,
}

impl AffixMap {
    fn insert(&mut self, affix: &str, rule: usize) {
        if !self.lengths.contains(&affix.len()) {
            self.lengths.push(affix.len());
        }
        self.rules.entry(affix.into()).or_default().push(rule);
    }
}

/// The compiled index of a policy's rule patterns.
#[derive(Clone, Debug, Default)]
pub(crate) struct ToolIndex {
    /// For each built-in catalog tool, spelled exactly, the rules that match it.
    known: FastMap<Box<[usize]>>,
    exact: FastMap<Vec<usize>>,
    prefixes: AffixMap,
    suffixes: AffixMap,
    /// Automaton over the distinct infix literals, and the rules of each.
    infixes: Option<(AhoCorasick, Vec<Vec<usize>>)>,
    always: Vec<usize>,
    regex_set: Option<RegexSet>,
    regex_rules: Vec<usize>,
}

impl ToolIndex {
    #[expect(
        clippy::indexing_slicing,
        reason = "INVARIANT: every index comes from the rules this index was built from; one out of range is a bug that must stop the decision (the gate then fails closed), never drop a rule"
    )]
    pub(crate) fn build<'a>(patterns: impl Iterator<Item = &'a Pattern> + Clone) -> Self {
        let mut index = Self::default();
        for tool in BUILTIN_TOOLS {
            let rules = patterns
                .clone()
                .enumerate()
                .filter(|(_, p)| p.matches(tool.name));
            let rules: Box<[usize]> = rules.map(|(rule, _)| rule).collect();
            index.known.insert(tool.name.into(), rules);
        }
        let mut regexes = Vec::new();
        let mut infixes: FastMap<usize> = FastMap::default();
        let mut infix_rules: Vec<Vec<usize>> = Vec::new();
        for (rule, pattern) in patterns.enumerate() {
            match pattern {
                Pattern::Exact(name) => index.exact.entry(name.clone()).or_default().push(rule),
                Pattern::Glob(_) => match pattern.glob_affixes() {
                    Some((prefix, _)) if !prefix.is_empty() => index.prefixes.insert(prefix, rule),
                    Some((_, suffix)) if !suffix.is_empty() => index.suffixes.insert(suffix, rule),
                    _ => match longest_literal(pattern) {
                        Some(literal) => {
                            let next = infix_rules.len();
                            let slot = *infixes.entry(literal.into()).or_insert(next);
                            if slot == next {
                                infix_rules.push(Vec::new());
                            }
                            infix_rules[slot].push(rule);
                        }
                        None => index.always.push(rule),
                    },
                },
                Pattern::Regex(regex) => {
                    regexes.push(regex.as_str().to_string());
                    index.regex_rules.push(rule);
                }
            }
        }
        if !regexes.is_empty() {
            let set = RegexSetBuilder::new(&regexes)
                .case_insensitive(true)
                .size_limit(REGEX_SIZE_LIMIT.saturating_mul(4))
                .build();
            match set {
                Ok(set) => index.regex_set = Some(set),
                // A set too large to compile: every regex rule stays a candidate.
                Err(_) => index.always.append(&mut index.regex_rules),
            }
        }
        if !infix_rules.is_empty() {
            let mut literals: Vec<(Box<str>, usize)> = infixes.into_iter().collect();
            literals.sort_by_key(|(_, slot)| *slot);
            match AhoCorasick::new(literals.iter().map(|(literal, _)| literal.as_bytes())) {
                Ok(automaton) => index.infixes = Some((automaton, infix_rules)),
                // Too many literals for an automaton: those globs stay candidates.
                Err(_) => index.always.extend(infix_rules.into_iter().flatten()),
            }
        }
        index.always.sort_unstable();
        index
    }

    /// The rules that match a built-in catalog tool spelled exactly, in order; `None` for
    /// any other name.
    pub(crate) fn known(&self, name: &str) -> Option<&[usize]> {
        self.known.get(name).map(|rules| &rules[..])
    }

    /// The rules whose pattern may match the tool (`name` as written, `lowered`).
    #[expect(
        clippy::indexing_slicing,
        reason = "INVARIANT: every index comes from the rules this index was built from; one out of range is a bug that must stop the decision (the gate then fails closed), never drop a rule"
    )]
    pub(crate) fn candidates(&self, name: &str, lowered: &str, rule_count: usize) -> Candidates {
        let mut set = Candidates::new(rule_count);
        if let Some(rules) = self.exact.get(lowered) {
            set.insert_all(rules);
        }
        for &len in &self.prefixes.lengths {
            if let Some(prefix) = lowered.get(..len)
                && let Some(rules) = self.prefixes.rules.get(prefix)
            {
                set.insert_all(rules);
            }
        }
        for &len in &self.suffixes.lengths {
            if let Some(suffix) = lowered
                .len()
                .checked_sub(len)
                .and_then(|start| lowered.get(start..))
                && let Some(rules) = self.suffixes.rules.get(suffix)
            {
                set.insert_all(rules);
            }
        }
        if let Some((automaton, rules)) = &self.infixes {
            for found in automaton.find_overlapping_iter(lowered) {
                set.insert_all(&rules[found.pattern().as_usize()]);
            }
        }
        set.insert_all(&self.always);
        if let Some(regex_set) = &self.regex_set
            && regex_set.is_match(name)
        {
            for i in regex_set.matches(name).iter() {
                set.insert(self.regex_rules[i]);
            }
        }
        set
    }
}

/// The longest run of literal text in a glob, if it has any.
fn longest_literal(pattern: &Pattern) -> Option<&str> {
    let Pattern::Glob(glob) = pattern else {
        return None;
    };
    glob.split('*')
        .max_by_key(|piece| piece.len())
        .filter(|piece| !piece.is_empty())
}

/// A set of rule indices, on the stack for policies up to 1,024 rules.
pub(crate) enum Candidates {
    Inline([u64; 16], usize),
    Heap(Vec<u64>),
}

impl Candidates {
    fn new(rule_count: usize) -> Self {
        let words = rule_count.div_ceil(64);
        if words <= 16 {
            Candidates::Inline([0; 16], words)
        } else {
            Candidates::Heap(vec![0; words])
        }
    }

    #[expect(
        clippy::indexing_slicing,
        reason = "INVARIANT: `used` is at most the inline array's 16 words (set in `new`)"
    )]
    fn words(&self) -> &[u64] {
        match self {
            Candidates::Inline(words, used) => &words[..*used],
            Candidates::Heap(words) => words,
        }
    }

    #[expect(
        clippy::indexing_slicing,
        reason = "INVARIANT: every index comes from the rules the set was sized for; one out of range is a bug that must stop the decision (the gate then fails closed), never drop a rule"
    )]
    fn insert(&mut self, rule: usize) {
        let words = match self {
            Candidates::Inline(words, _) => &mut words[..],
            Candidates::Heap(words) => &mut words[..],
        };
        words[rule / 64] |= 1 << (rule % 64);
    }

    fn insert_all(&mut self, rules: &[usize]) {
        for &rule in rules {
            self.insert(rule);
        }
    }

    /// The rule indices in ascending order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.words()
            .iter()
            .enumerate()
            .flat_map(|(i, &word)| BitIter(word).map(move |bit| i * 64 + bit))
    }
}

struct BitIter(u64);

impl Iterator for BitIter {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        if self.0 == 0 {
            return None;
        }
        let bit = self.0.trailing_zeros() as usize;
        self.0 &= self.0 - 1;
        Some(bit)
    }
}
