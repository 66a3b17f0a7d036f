//! The policy gate: a pure engine that parses the policy file once and decides, for every
//! tool call, whether it runs, waits for a person, or is blocked.
//!
//! No IO, no async, no logging: the caller reads the file, calls [`Policy::parse`], and
//! asks [`Policy::decide`] (or [`Policy::decide_with_evidence`]) for each call.
//! `DESIGN.md` §2 defines the semantics; the module docs of `rule`, `pattern` and
//! `evidence` restate the parts they implement.
//!
//! # Kortix
//!
//! The shared language (`match`, `action`, `conditions` of `arg`/`match`/`negate`,
//! `policy.default_mode`) means what Kortix's evaluator (`resolveEffectiveAction` in
//! kortix-ai/suna) means: first match wins; conditions combine with a three-valued AND
//! (a definite failure rules a rule out before any failing closed); `/body/flags` is a
//! regular expression, always case-insensitive, whose body reads as JavaScript reads it
//! (`\d`, `\w`, `\b` ASCII, `.` stopping at every line terminator: see `js_regex`);
//! numbers are matched as JavaScript's `String(n)`; a glob's `*` does not cross a line
//! terminator.
//!
//! Where threadgate differs from Kortix, it is stricter, never weaker, on purpose
//! (`threadgate lint --kortix` names each such line; `tests/policy_kortix.rs` checks
//! everything else against a model of Kortix's evaluator):
//! - a negated condition on a missing, null, object or empty-array value holds in
//!   Kortix; here it cannot be evaluated, so an `always_run` rule with it does not apply
//!   and a `block` or `require_approval` rule matches;
//! - a file without `policy.default_mode` is `allow_all` in Kortix and `risk` here;
//! - Kortix drops a malformed rule and enforces the rest; threadgate refuses the whole
//!   file with every problem's file:line:column;
//! - Kortix reads an invalid `/…/` literal or unknown flag as "never matches"; here it is
//!   a load error, as is syntax the `regex` crate cannot read as JavaScript does
//!   (look-around, backreferences, `\p{…}` without `u`, flag `v`'s set notation);
//! - Kortix drops a rule whose `match` YAML reads as a number or boolean (`match: 4900`,
//!   `match: true`: not a string). Here a number written as JavaScript writes it, or a
//!   boolean, matches that value (`lint --kortix` warns); any other unquoted number
//!   (`10.0`, `1e3`, `0x10`) is a load error, since it could never match a number;
//! - Kortix drops a rule whose condition's regular expression nests a quantifier in a
//!   quantified group (`(a+)+`, its guard against catastrophic backtracking); here it is
//!   enforced (the `regex` crate matches in linear time), and `lint --kortix` warns;
//! - `gt`, `gte`, `lt`, `lte` and evidence conditions are extensions Kortix finds
//!   malformed (it drops the rule), and `limits` an extension it ignores (there the rule
//!   applies without them).
//!
//! Not yet alike, and not chosen (each has a README row): case-insensitive matching
//! without `u` (globs and names included) uses Unicode's lower-casing and case folding
//! here, JavaScript's upper-casing in Kortix, so some non-ASCII letters compare
//! differently (the Kelvin sign and long s match `k` and `s` here only); without `u`
//! JavaScript counts a character outside the BMP as two for `.` and classes; with `m`,
//! `^`/`$` also meet U+2028/U+2029 in JavaScript.

mod arg_path;
pub mod calls;
mod catalog;
mod decimal;
pub mod evidence;
mod index;
mod js_regex;
mod kortix;
mod limits;
mod lint;
mod parse;
mod pattern;
mod rule;
mod yaml;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use sha2::{Digest, Sha256};

pub use catalog::{
    ArgProblem, ArgSpec, ArgType, BUILTIN_RULES, BUILTIN_TOOLS, Catalog, ConnectorRule, Risk,
    ToolSpec,
};
pub use evidence::{Evidence, EvidenceCheck, EvidenceKind, Finding};
pub use kortix::kortix_differences;
pub use limits::{LimitCharge, LimitHistory, MemoryHistory};
pub use lint::{Diagnostic, Severity, lint};
pub use yaml::{Pos, Problem};

use index::{LoweredName, ToolIndex};
use rule::{CallFacts, Rule, RuleOutcome};

/// How long a held call can be approved when the file has no `approvals.ttl`.
pub const DEFAULT_APPROVAL_TTL: Duration = Duration::from_secs(4 * 60 * 60);

/// What happens to a call that no rule matches.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum DefaultMode {
    /// Reads run; writes, destructive calls and unknown tools wait for a person.
    #[default]
    Risk,
    /// Every unmatched call runs.
    AllowAll,
}

impl DefaultMode {
    /// The name as written in the file.
    pub fn as_str(self) -> &'static str {
        match self {
            DefaultMode::Risk => "risk",
            DefaultMode::AllowAll => "allow_all",
        }
    }
}

/// A rule's action, as written in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// `always_run`: the call runs without a person.
    AlwaysRun,
    /// `require_approval`: the call waits for a person.
    RequireApproval,
    /// `block`: the call never runs.
    Block,
}

impl Action {
    /// The verdict a matching rule with this action gives.
    pub fn verdict(self) -> Verdict {
        match self {
            Action::AlwaysRun => Verdict::Run,
            Action::RequireApproval => Verdict::Hold,
            Action::Block => Verdict::Block,
        }
    }

    /// The name as written in the file.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::AlwaysRun => "always_run",
            Action::RequireApproval => "require_approval",
            Action::Block => "block",
        }
    }
}

/// The outcome of a decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// Run the call now.
    Run,
    /// Hold the call until a person approves or denies it.
    Hold,
    /// Refuse the call.
    Block,
}

impl Verdict {
    /// The word `threadgate check` prints: `run`, `hold` or `block`.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Run => "run",
            Verdict::Hold => "hold",
            Verdict::Block => "block",
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a decision came out the way it did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Because {
    /// A rule of the policy file matched.
    Rule {
        /// The rule's `match` pattern as written.
        pattern: Arc<str>,
        /// How many conditions the rule has (all held, unless `fail_closed`).
        conditions: usize,
        /// How many cumulative limits the rule has (all had room).
        limits: usize,
        /// A condition could not be evaluated and this restrictive rule matched for it.
        fail_closed: bool,
    },
    /// A connector's built-in rule matched.
    ConnectorRule {
        /// The rule's tool pattern.
        pattern: &'static str,
    },
    /// No rule matched.
    DefaultMode {
        /// The file's default mode.
        mode: DefaultMode,
        /// The tool's risk class; `None` for a tool missing from the catalog.
        risk: Option<Risk>,
    },
}

impl fmt::Display for Because {
    /// `rule github.*`, `rule stripe.create_refund + condition`,
    /// `rule x + 2 conditions + limit`, `rule x + condition not evaluable (fail closed)`,
    /// `connector rule stripe.delete_customer`, `default_mode: risk (write)`,
    /// `default_mode: risk (unknown tool, write)`, `default_mode: allow_all`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Because::Rule {
                pattern,
                fail_closed: true,
                ..
            } => write!(f, "rule {pattern} + condition not evaluable (fail closed)"),
            Because::Rule {
                pattern,
                conditions,
                limits,
                ..
            } => {
                write!(f, "rule {pattern}")?;
                plural(f, *conditions, "condition")?;
                plural(f, *limits, "limit")
            }
            Because::ConnectorRule { pattern } => write!(f, "connector rule {pattern}"),
            Because::DefaultMode {
                mode: DefaultMode::AllowAll,
                ..
            } => f.write_str("default_mode: allow_all"),
            Because::DefaultMode {
                mode: DefaultMode::Risk,
                risk: Some(risk),
            } => write!(f, "default_mode: risk ({risk})"),
            Because::DefaultMode {
                mode: DefaultMode::Risk,
                risk: None,
            } => f.write_str("default_mode: risk (unknown tool, write)"),
        }
    }
}

fn plural(f: &mut fmt::Formatter<'_>, n: usize, noun: &str) -> fmt::Result {
    match n {
        0 => Ok(()),
        1 => write!(f, " + {noun}"),
        n => write!(f, " + {n} {noun}s"),
    }
}

/// The gate's answer for one call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Run, hold or block.
    pub verdict: Verdict,
    /// Why.
    pub because: Because,
    /// The line of the deciding rule in the policy file, if a file rule decided.
    pub rule_line: Option<u32>,
    /// What the caller must record against the deciding rule's limits if the call runs
    /// (when it is executed, or when it is reserved before running). Empty, without
    /// allocating, for rules without limits.
    pub charges: Vec<LimitCharge>,
    /// Every evidence condition the decision checked, in the order checked (those of
    /// rules that did not match too). Empty, without allocating, when none was checked.
    pub evidence: Vec<EvidenceCheck>,
}

/// Every problem found in a policy or calls file, each with file:line:column.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct PolicyError {
    /// The file name as given to the parser.
    pub file: String,
    /// The problems, in file order.
    pub problems: Vec<Problem>,
}

impl fmt::Display for PolicyError {
    /// One problem per line: `support.yaml:12:7: unknown action `always`; …`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, problem) in self.problems.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            let Pos { line, column } = problem.pos;
            write!(f, "{}:{line}:{column}: {}", self.file, problem.message)?;
        }
        Ok(())
    }
}

/// A compiled policy file.
#[derive(Clone, Debug)]
pub struct Policy {
    hash: [u8; 32],
    default_mode: DefaultMode,
    approval_ttl: Duration,
    rules: Vec<Rule>,
    index: ToolIndex,
}

impl Policy {
    /// The decision of rule `i`, whose pattern matches the tool, if the rule matches.
    #[expect(
        clippy::indexing_slicing,
        reason = "INVARIANT: `i` is an index into `self.rules` (from the index built from them); out of range is a bug that must stop the decision, never skip a rule"
    )]
    fn try_rule(
        &self,
        i: usize,
        call: &CallFacts<'_>,
        checks: &mut Vec<EvidenceCheck>,
    ) -> Option<Decision> {
        let rule = &self.rules[i];
        match rule.evaluate(call, checks) {
            RuleOutcome::NoMatch => None,
            RuleOutcome::Match {
                fail_closed,
                charges,
            } => Some(Decision {
                verdict: rule.action.verdict(),
                because: Because::Rule {
                    pattern: Arc::clone(&rule.text),
                    conditions: rule.conditions.len() + rule.evidence.len(),
                    limits: rule.limits.len(),
                    fail_closed,
                },
                rule_line: Some(rule.pos.line),
                charges,
                evidence: Vec::new(),
            }),
        }
    }

    /// Parses and compiles a policy file; `file_name` is only used in error messages.
    pub fn parse(source: &str, file_name: &str) -> Result<Self, PolicyError> {
        let parsed = parse::parse(source).map_err(|mut problems| {
            problems.sort_by_key(|p| p.pos);
            PolicyError {
                file: file_name.to_string(),
                problems,
            }
        })?;
        let index = ToolIndex::build(parsed.rules.iter().map(|rule| &rule.pattern));
        Ok(Self {
            hash: Sha256::digest(source.as_bytes()).into(),
            default_mode: parsed.default_mode,
            approval_ttl: parsed.approval_ttl,
            rules: parsed.rules,
            index,
        })
    }

    /// The SHA-256 of the source bytes, to record which policy made a decision.
    pub fn hash(&self) -> [u8; 32] {
        self.hash
    }

    /// How long a held call can be approved: `approvals.ttl`, or
    /// [`DEFAULT_APPROVAL_TTL`] (4 hours) when absent.
    pub fn approval_ttl(&self) -> Duration {
        self.approval_ttl
    }

    /// `policy.default_mode`, or `risk` when absent.
    pub fn default_mode(&self) -> DefaultMode {
        self.default_mode
    }

    /// How many rules the file has.
    pub fn rule_count(&self) -> usize {
        self.rules.len()
    }

    /// Decides one call without evidence: every evidence condition is unevaluable. See
    /// [`Policy::decide_with_evidence`].
    pub fn decide(
        &self,
        tool: &str,
        args: &Value,
        catalog: &Catalog,
        history: &dyn LimitHistory,
        now_unix_ms: i64,
    ) -> Decision {
        self.decide_with_evidence(tool, args, catalog, history, now_unix_ms, &Evidence::none())
    }

    /// Decides one call: the file's rules in order (first match wins), then the
    /// connectors' rules, then `default_mode`.
    ///
    /// `history` answers how much each limit has already used; `now_unix_ms` is the end
    /// of every limit's rolling window. `evidence` is what the caller gathered of the
    /// kinds [`Policy::evidence_wanted`] names.
    #[expect(
        clippy::indexing_slicing,
        reason = "INVARIANT: candidate indices come from the index built from `self.rules`; out of range is a bug that must stop the decision, never skip a rule"
    )]
    pub fn decide_with_evidence(
        &self,
        tool: &str,
        args: &Value,
        catalog: &Catalog,
        history: &dyn LimitHistory,
        now_unix_ms: i64,
        evidence: &Evidence,
    ) -> Decision {
        let call = CallFacts {
            args,
            evidence,
            history,
            now_ms: now_unix_ms,
        };
        let mut checks = Vec::new();
        let decided = match self.index.known(tool) {
            Some(rules) => rules
                .iter()
                .find_map(|&i| self.try_rule(i, &call, &mut checks)),
            None => {
                let name = LoweredName::new(tool);
                let candidates = self.index.candidates(tool, name.as_str(), self.rules.len());
                candidates.iter().find_map(|i| {
                    let matches = self.rules[i].pattern.matches_lowered(tool, name.as_str());
                    matches.then(|| self.try_rule(i, &call, &mut checks))?
                })
            }
        };
        if let Some(mut decision) = decided {
            decision.evidence = checks;
            return decision;
        }
        let mut decision = self.fallback(tool, catalog);
        decision.evidence = checks;
        decision
    }

    /// The kinds of evidence the rules whose pattern matches `tool` name, each once: what
    /// the caller should gather before deciding a call to it.
    pub fn evidence_wanted(&self, tool: &str) -> Vec<EvidenceKind> {
        let mut kinds: Vec<EvidenceKind> = self
            .rules
            .iter()
            .filter(|rule| !rule.evidence.is_empty() && rule.pattern.matches(tool))
            .flat_map(|rule| rule.evidence.iter().map(|condition| condition.kind))
            .collect();
        kinds.sort();
        kinds.dedup();
        kinds
    }

    /// The decision when no rule of the file matches.
    fn fallback(&self, tool: &str, catalog: &Catalog) -> Decision {
        if let Some(rule) = catalog.rule_for(tool) {
            return Decision {
                verdict: rule.action.verdict(),
                because: Because::ConnectorRule {
                    pattern: rule.pattern,
                },
                rule_line: None,
                charges: Vec::new(),
                evidence: Vec::new(),
            };
        }
        let risk = catalog.get(tool).map(|spec| spec.risk);
        let verdict = match (self.default_mode, risk) {
            (DefaultMode::AllowAll, _) | (DefaultMode::Risk, Some(Risk::Read)) => Verdict::Run,
            (DefaultMode::Risk, _) => Verdict::Hold,
        };
        Decision {
            verdict,
            because: Because::DefaultMode {
                mode: self.default_mode,
                risk,
            },
            rule_line: None,
            charges: Vec::new(),
            evidence: Vec::new(),
        }
    }
}

/// Whether `tool` matches a tool pattern written in the policy grammar (anchored
/// case-insensitive `*` glob, `/regex/`, or an exact name). An invalid pattern matches
/// nothing.
pub fn tool_pattern_matches(pattern: &str, tool: &str) -> bool {
    pattern::Pattern::compile(pattern).is_ok_and(|p| p.matches(tool))
}

impl Policy {
    /// Whether every call to `tool` is blocked whatever its arguments: the decision for
    /// a call without arguments is a block by an unconditional rule. The sandbox API
    /// leaves such tools out of a session's catalog.
    pub fn always_blocks(&self, tool: &str, catalog: &Catalog) -> bool {
        let empty = Value::Object(serde_json::Map::new());
        let decision = self.decide(tool, &empty, catalog, &MemoryHistory::new(), 0);
        decision.verdict == Verdict::Block
            && match decision.because {
                Because::Rule {
                    conditions,
                    limits,
                    fail_closed,
                    ..
                } => conditions == 0 && limits == 0 && !fail_closed,
                Because::ConnectorRule { .. } => true,
                Because::DefaultMode { .. } => false,
            }
    }
}
