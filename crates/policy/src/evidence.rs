//! Evidence conditions: facts about the world that the gateway checks itself, so a rule
//! can rest on more than the agent's word.
//!
//! ```yaml
//! - match: stripe.create_refund
//!   action: always_run
//!   conditions:
//!     - {arg: reason, match: duplicate}
//!     - {evidence: duplicate_charge, within: 7d}
//! ```
//!
//! The engine stays pure: the caller asks [`Policy::evidence_wanted`](super::Policy) which
//! kinds a tool's rules name, gathers them (the gateway from the provider, `threadgate
//! check` from the calls file) and hands them to the decision as [`Evidence`]. A kind
//! that was not gathered, because it could not be (provider down, connector missing), or
//! because nobody asked, makes its conditions unevaluable: a restrictive rule matches, an
//! `always_run` rule does not (failing closed).
//!
//! Kinds:
//! - `duplicate_charge`, for `stripe.create_refund`: the customer of the refunded
//!   `charge` has another succeeded charge of the same amount and currency, not fully
//!   refunded, created at most `within` before or after it. The finding is the smallest
//!   such gap.

use std::fmt;

/// A kind of evidence the gateway can gather.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EvidenceKind {
    /// Another charge of the same customer, amount and currency near the refunded one.
    DuplicateCharge,
}

impl EvidenceKind {
    /// Every kind, in the order the docs list them.
    pub const ALL: [EvidenceKind; 1] = [EvidenceKind::DuplicateCharge];

    /// The name as written in the policy file.
    pub fn as_str(self) -> &'static str {
        match self {
            EvidenceKind::DuplicateCharge => "duplicate_charge",
        }
    }

    /// The kind written as `name`, if there is one.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.as_str() == name)
    }
}

impl fmt::Display for EvidenceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What gathering one kind of evidence found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finding {
    /// Found, with this distance in milliseconds (for `duplicate_charge`, how far apart
    /// the two charges were created).
    Found {
        /// The distance, never negative.
        apart_ms: i64,
    },
    /// Looked for and not found.
    NotFound,
}

/// The evidence gathered for one call. Kinds missing from it were not gathered.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Evidence {
    findings: Vec<(EvidenceKind, Finding)>,
}

impl Evidence {
    /// No evidence: every evidence condition is unevaluable.
    pub fn none() -> Self {
        Self::default()
    }

    /// Records what gathering `kind` found, replacing an earlier finding.
    pub fn insert(&mut self, kind: EvidenceKind, finding: Finding) {
        self.findings.retain(|(k, _)| *k != kind);
        self.findings.push((kind, finding));
    }

    /// What was found for `kind`; `None` when it was not gathered.
    pub fn get(&self, kind: EvidenceKind) -> Option<Finding> {
        self.findings
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, finding)| *finding)
    }

    /// Whether nothing was gathered.
    pub fn is_empty(&self) -> bool {
        self.findings.is_empty()
    }
}

/// One evidence condition of a rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct EvidenceCondition {
    pub kind: EvidenceKind,
    pub within_ms: i64,
    pub within_text: Box<str>,
    pub pos: super::Pos,
}

impl EvidenceCondition {
    /// Whether the condition holds (`Some(true)`), fails (`Some(false)`) or cannot be
    /// evaluated (`None`) with this evidence.
    pub(crate) fn holds(&self, evidence: &Evidence) -> Option<bool> {
        match evidence.get(self.kind)? {
            Finding::Found { apart_ms } => Some(apart_ms <= self.within_ms),
            Finding::NotFound => Some(false),
        }
    }

    /// The record of checking it, for explanations.
    pub(crate) fn check(&self, evidence: &Evidence) -> EvidenceCheck {
        EvidenceCheck {
            kind: self.kind,
            within: self.within_text.to_string(),
            finding: evidence.get(self.kind),
            holds: self.holds(evidence),
            line: self.pos.line,
        }
    }
}

/// An evidence condition the decision checked, shown by `threadgate check` and the audit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EvidenceCheck {
    /// The kind of evidence.
    pub kind: EvidenceKind,
    /// The condition's `within`, as written.
    pub within: String,
    /// What was found; `None` when it was not gathered.
    pub finding: Option<Finding>,
    /// Whether the condition held; `None` when it could not be evaluated.
    pub holds: Option<bool>,
    /// The condition's line in the policy file.
    pub line: u32,
}

impl fmt::Display for EvidenceCheck {
    /// `duplicate_charge within 7d (line 14): found 2h apart, holds`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} within {} (line {}): ",
            self.kind, self.within, self.line
        )?;
        match self.finding {
            Some(Finding::Found { apart_ms }) => write!(f, "found {} apart", duration(apart_ms))?,
            Some(Finding::NotFound) => f.write_str("not found")?,
            None => f.write_str("not gathered")?,
        }
        f.write_str(match self.holds {
            Some(true) => ", holds",
            Some(false) => ", fails",
            None => ", cannot be evaluated (fail closed)",
        })
    }
}

/// A duration in the policy file's notation, in its largest whole unit: `2d`, `90m`, `5s`.
pub fn duration(ms: i64) -> String {
    let secs = ms.max(0) / 1000;
    for (unit, size) in [("d", 86_400), ("h", 3_600), ("m", 60)] {
        if secs >= size && secs % size == 0 {
            return format!("{}{unit}", secs / size);
        }
    }
    format!("{secs}s")
}
