//! From the YAML tree to compiled rules, collecting every problem with its position.
//!
//! The parser never widens an allow rule: unknown and duplicate keys, malformed
//! conditions and limits, and Kortix keys threadgate does not implement are errors, never
//! dropped. A rule with any problem makes the whole file invalid.

use std::sync::Arc;
use std::time::Duration;

use super::arg_path::ArgPath;
use super::evidence::{EvidenceCondition, EvidenceKind};
use super::limits::Limit;
use super::pattern::Pattern;
use super::rule::{Comparison, Condition, Rule, Test};
use super::yaml::{self, Kind, Node, Pos, Problem, ScalarType};
use super::{Action, DEFAULT_APPROVAL_TTL, DefaultMode, decimal};

/// At most this many conditions per rule.
pub(crate) const MAX_CONDITIONS: usize = 10;

/// The parts of a valid policy file.
#[derive(Debug)]
pub(crate) struct Parsed {
    pub default_mode: DefaultMode,
    pub approval_ttl: Duration,
    pub rules: Vec<Rule>,
}

/// Parses a policy file's text, or returns every problem found.
pub(crate) fn parse(source: &str) -> Result<Parsed, Vec<Problem>> {
    let (root, problems) = yaml::parse(source)?;
    let mut parser = PolicyParser { problems };
    let mut parsed = Parsed {
        default_mode: DefaultMode::Risk,
        approval_ttl: DEFAULT_APPROVAL_TTL,
        rules: Vec::new(),
    };
    if let Some(root) = root.filter(|node| !node.is_null()) {
        parser.file(&root, &mut parsed);
    }
    if parser.problems.is_empty() {
        Ok(parsed)
    } else {
        Err(parser.problems)
    }
}

/// The keys of a mapping that are allowed in `context`, with unknown ones reported.
pub(crate) fn known_fields<'n, 'a>(
    node: &'n Node<'a>,
    context: &str,
    allowed: &[&str],
    problems: &mut Vec<Problem>,
) -> Option<Vec<(&'n str, &'n Node<'a>, Pos)>> {
    let Kind::Map(pairs) = &node.kind else {
        problems.push(Problem::new(
            node.pos,
            format!("{context} must be a mapping, not {}", node.shape()),
        ));
        return None;
    };
    let mut fields = Vec::with_capacity(pairs.len());
    for (key, value) in pairs {
        let name = key.scalar().unwrap_or_default();
        if allowed.contains(&name) {
            fields.push((name, value, key.pos));
        } else {
            problems.push(Problem::new(key.pos, unknown_key(name, context, allowed)));
        }
    }
    Some(fields)
}

fn unknown_key(name: &str, context: &str, allowed: &[&str]) -> String {
    match name {
        "connectors" => "`connectors` is a kortix key threadgate does not implement: \
            connector rules are built into threadgate's catalog; remove it"
            .to_string(),
        "sensitive" => {
            "`sensitive` is a kortix key threadgate does not implement; remove it".to_string()
        }
        _ => format!(
            "unknown key `{name}` in {context}; expected {}",
            one_of(allowed)
        ),
    }
}

fn one_of(names: &[&str]) -> String {
    match names {
        [] => String::new(),
        [only] => (*only).to_string(),
        [init @ .., last] => format!("{} or {last}", init.join(", ")),
    }
}

/// Parses a duration in `humantime`'s grammar (`4h`, `30m`, `1h30m`, `90s`, `7d`);
/// `None` when it is malformed or shorter than a millisecond (a zero window or TTL would
/// mean nothing).
pub(crate) fn parse_duration(text: &str) -> Option<Duration> {
    humantime::parse_duration(text)
        .ok()
        .filter(|d| d.as_millis() > 0)
}

#[derive(Default)]
struct PolicyParser {
    problems: Vec<Problem>,
}

impl PolicyParser {
    fn error(&mut self, pos: Pos, message: impl Into<String>) {
        self.problems.push(Problem::new(pos, message));
    }

    fn file(&mut self, root: &Node<'_>, parsed: &mut Parsed) {
        let allowed = ["policy", "approvals", "policies"];
        let Some(fields) = known_fields(root, "the policy file", &allowed, &mut self.problems)
        else {
            return;
        };
        for (name, value, _) in fields {
            match name {
                "policy" => self.policy_section(value, parsed),
                "approvals" => self.approvals_section(value, parsed),
                _ => self.rules(value, parsed),
            }
        }
    }

    fn policy_section(&mut self, node: &Node<'_>, parsed: &mut Parsed) {
        if node.is_null() {
            return;
        }
        let fields = known_fields(node, "`policy`", &["default_mode"], &mut self.problems);
        for (_, value, _) in fields.into_iter().flatten() {
            match value.scalar() {
                Some("risk") => parsed.default_mode = DefaultMode::Risk,
                Some("allow_all") => parsed.default_mode = DefaultMode::AllowAll,
                text => self.error(
                    value.pos,
                    format!(
                        "unknown default_mode `{}`; expected risk or allow_all",
                        text.unwrap_or(value.shape())
                    ),
                ),
            }
        }
    }

    fn approvals_section(&mut self, node: &Node<'_>, parsed: &mut Parsed) {
        if node.is_null() {
            return;
        }
        let fields = known_fields(node, "`approvals`", &["ttl"], &mut self.problems);
        for (_, value, _) in fields.into_iter().flatten() {
            match value.scalar().and_then(parse_duration) {
                Some(ttl) => parsed.approval_ttl = ttl,
                None => self.error(value.pos, bad_duration("ttl", value)),
            }
        }
    }

    fn rules(&mut self, node: &Node<'_>, parsed: &mut Parsed) {
        if node.is_null() {
            return;
        }
        let Kind::Seq(items) = &node.kind else {
            self.error(
                node.pos,
                format!("`policies` must be a list of rules, not {}", node.shape()),
            );
            return;
        };
        for item in items {
            if let Some(rule) = self.rule(item) {
                parsed.rules.push(rule);
            }
        }
    }

    fn rule(&mut self, node: &Node<'_>) -> Option<Rule> {
        let allowed = ["match", "action", "conditions", "limits"];
        let fields = known_fields(node, "a rule", &allowed, &mut self.problems)?;
        let errors_before = self.problems.len();
        let (mut pattern, mut action, mut conditions, mut limits) = (None, None, None, None);
        let mut limits_pos = node.pos;
        let mut match_type = ScalarType::String;
        for (name, value, key_pos) in fields {
            match name {
                "match" => {
                    match_type = value.scalar_type().unwrap_or_default();
                    pattern = self.pattern(value);
                }
                "action" => action = self.action(value),
                "conditions" => conditions = Some(self.conditions(value, key_pos)),
                _ => {
                    limits_pos = key_pos;
                    limits = Some(self.limits(value, key_pos));
                }
            }
        }
        let action = match action {
            Some(action) => action,
            None => {
                if !has_key(node, "action") {
                    self.error(node.pos, "rule has no `action`");
                }
                Action::Block
            }
        };
        if pattern.is_none() && !has_key(node, "match") {
            self.error(node.pos, "rule has no `match`");
        }
        if limits.is_some() && action != Action::AlwaysRun {
            self.error(
                limits_pos,
                format!(
                    "`limits` apply only to always_run rules; this rule is {}",
                    action.as_str()
                ),
            );
        }
        let (text, pattern) = pattern?;
        if self.problems.len() > errors_before {
            return None;
        }
        let (conditions, evidence) = conditions.unwrap_or_default();
        Some(Rule {
            pattern,
            written: match_type,
            text,
            action,
            conditions,
            evidence,
            limits: limits.unwrap_or_default(),
            pos: node.pos,
        })
    }

    fn pattern(&mut self, node: &Node<'_>) -> Option<(Arc<str>, Pattern)> {
        let text = match node.scalar() {
            Some(text) if !node.is_null() && !text.is_empty() => text,
            _ => {
                self.error(node.pos, "`match` needs a pattern");
                return None;
            }
        };
        match Pattern::compile(text) {
            Ok(pattern) => Some((Arc::from(text), pattern)),
            Err(message) => {
                self.error(node.pos, message);
                None
            }
        }
    }

    fn action(&mut self, node: &Node<'_>) -> Option<Action> {
        match node.scalar() {
            Some("always_run") => Some(Action::AlwaysRun),
            Some("require_approval") => Some(Action::RequireApproval),
            Some("block") => Some(Action::Block),
            text => {
                self.error(
                    node.pos,
                    format!(
                        "unknown action `{}`; expected always_run, require_approval or block",
                        text.unwrap_or(node.shape())
                    ),
                );
                None
            }
        }
    }

    fn list<'n, 'a>(&mut self, node: &'n Node<'a>, key: &str, key_pos: Pos) -> &'n [Node<'a>] {
        match &node.kind {
            Kind::Seq(items) if !items.is_empty() => items,
            _ if node.is_null() || matches!(node.kind, Kind::Seq(_)) => {
                self.error(
                    key_pos,
                    format!("`{key}` is empty; remove it or list at least one"),
                );
                &[]
            }
            _ => {
                self.error(
                    node.pos,
                    format!("`{key}` must be a list, not {}", node.shape()),
                );
                &[]
            }
        }
    }

    fn conditions(
        &mut self,
        node: &Node<'_>,
        key_pos: Pos,
    ) -> (Vec<Condition>, Vec<EvidenceCondition>) {
        let items = self.list(node, "conditions", key_pos);
        if items.len() > MAX_CONDITIONS {
            self.error(
                key_pos,
                format!(
                    "a rule has at most {MAX_CONDITIONS} conditions; this one has {}",
                    items.len()
                ),
            );
        }
        let (mut conditions, mut evidence) = (Vec::new(), Vec::new());
        for item in items {
            if has_key(item, "evidence") {
                evidence.extend(self.evidence_condition(item));
            } else {
                conditions.extend(self.condition(item));
            }
        }
        (conditions, evidence)
    }

    /// `{evidence: KIND, within: DURATION}`: see the `evidence` module.
    fn evidence_condition(&mut self, node: &Node<'_>) -> Option<EvidenceCondition> {
        let allowed = ["evidence", "within"];
        let fields = known_fields(node, "an evidence condition", &allowed, &mut self.problems)?;
        let errors_before = self.problems.len();
        let (mut kind, mut within) = (None, None);
        for (name, value, _) in fields {
            if name == "evidence" {
                kind = value.scalar().and_then(EvidenceKind::parse);
                if kind.is_none() {
                    let names: Vec<&str> = EvidenceKind::ALL.iter().map(|k| k.as_str()).collect();
                    let shown = value.scalar().unwrap_or(value.shape());
                    self.error(
                        value.pos,
                        format!("unknown evidence `{shown}`; expected {}", one_of(&names)),
                    );
                }
            } else {
                match value.scalar().and_then(parse_duration) {
                    Some(duration) => {
                        let ms = i64::try_from(duration.as_millis()).unwrap_or(i64::MAX);
                        within = Some((ms, value.scalar().unwrap_or_default().into()));
                    }
                    None => self.error(value.pos, bad_duration("within", value)),
                }
            }
        }
        if !has_key(node, "within") {
            self.error(
                node.pos,
                "evidence condition has no `within`, like `within: 7d`",
            );
        }
        if self.problems.len() > errors_before {
            return None;
        }
        let (within_ms, within_text) = within?;
        Some(EvidenceCondition {
            kind: kind?,
            within_ms,
            within_text,
            pos: node.pos,
        })
    }

    fn condition(&mut self, node: &Node<'_>) -> Option<Condition> {
        let allowed = ["arg", "match", "negate", "gt", "gte", "lt", "lte"];
        let fields = known_fields(node, "a condition", &allowed, &mut self.problems)?;
        let errors_before = self.problems.len();
        let (mut path, mut tests, mut negate) = (None, Vec::new(), false);
        let mut written = ScalarType::String;
        for (name, value, key_pos) in fields {
            match name {
                "arg" => path = self.path(value, "arg"),
                "negate" => match value.as_bool() {
                    Some(flag) => negate = flag,
                    None => self.error(value.pos, "`negate` must be true or false"),
                },
                "match" => {
                    written = value.scalar_type().unwrap_or_default();
                    self.number_pattern(value);
                    tests.push((
                        name,
                        key_pos,
                        self.pattern(value).map(|(text, p)| Test::Match(p, text)),
                    ));
                }
                _ => tests.push((name, key_pos, self.threshold(name, value))),
            }
        }
        if path.is_none() && !has_key(node, "arg") {
            self.error(node.pos, "condition has no `arg`");
        }
        match tests.as_slice() {
            [] => self.error(node.pos, "condition needs one of match, gt, gte, lt or lte"),
            [_] => {}
            [(first, _, _), (second, pos, _), ..] => self.error(
                *pos,
                format!(
                    "condition has both `{first}` and `{second}`; write one test per condition"
                ),
            ),
        }
        let test = tests.pop().and_then(|(_, _, test)| test)?;
        if self.problems.len() > errors_before {
            return None;
        }
        Some(Condition {
            path: path?,
            test,
            negate,
            written,
            pos: node.pos,
        })
    }

    /// Refuses an unquoted number in `match` that is not written as JavaScript writes
    /// it: numbers are compared as `String(n)`, so `10.0` (`10` in JavaScript) could
    /// never match a number, and a `block` rule with it would block nothing.
    fn number_pattern(&mut self, node: &Node<'_>) {
        let Kind::Scalar { text, plain: true } = &node.kind else {
            return;
        };
        let Some(js) = yaml::core_number_js_text(text) else {
            return;
        };
        if js != text.as_ref() {
            self.error(
                node.pos,
                format!(
                    "unquoted `match: {text}` can never match a number: numbers are compared \
                     as JavaScript writes them, here `{js}`; write `match: '{js}'`, or quote \
                     `'{text}'` to match that text"
                ),
            );
        }
    }

    fn path(&mut self, node: &Node<'_>, key: &str) -> Option<ArgPath> {
        let path = node
            .scalar()
            .filter(|_| !node.is_null())
            .and_then(ArgPath::parse);
        if path.is_none() {
            self.error(
                node.pos,
                format!(
                    "`{key}` must be a dot path into the arguments, like `amount` or `customer.id`"
                ),
            );
        }
        path
    }

    fn threshold(&mut self, key: &str, node: &Node<'_>) -> Option<Test> {
        let comparison = Comparison::KEYS.iter().find(|(k, _)| *k == key)?.1;
        match &node.kind {
            Kind::Scalar { text, plain: true } if decimal::is_decimal(text) => {
                Some(Test::Compare(comparison, text.as_ref().into()))
            }
            _ => {
                let shown = node.scalar().unwrap_or(node.shape());
                self.error(
                    node.pos,
                    format!("`{key}` needs a number, like 10000, not `{shown}`"),
                );
                None
            }
        }
    }

    fn limits(&mut self, node: &Node<'_>, key_pos: Pos) -> Vec<Limit> {
        let items = self.list(node, "limits", key_pos);
        items.iter().filter_map(|item| self.limit(item)).collect()
    }

    fn limit(&mut self, node: &Node<'_>) -> Option<Limit> {
        let allowed = ["sum", "per", "window", "max"];
        let fields = known_fields(node, "a limit", &allowed, &mut self.problems)?;
        let errors_before = self.problems.len();
        let (mut sum, mut per, mut window, mut max) = (None, None, None, None);
        for (name, value, _) in fields {
            match name {
                "sum" => sum = self.path(value, "sum"),
                "per" => per = self.path(value, "per"),
                "window" => match value.scalar().and_then(parse_duration) {
                    Some(duration) => {
                        window = Some(i64::try_from(duration.as_millis()).unwrap_or(i64::MAX));
                    }
                    None => self.error(value.pos, bad_duration("window", value)),
                },
                _ => match &value.kind {
                    Kind::Scalar { text, plain: true }
                        if text.bytes().all(|b| b.is_ascii_digit()) =>
                    {
                        max = text.parse::<u128>().ok();
                        if max.is_none() {
                            self.error(value.pos, format!("`max` {text} is too large"));
                        }
                    }
                    _ => self.error(
                        value.pos,
                        "`max` needs a whole number of the smallest currency unit, like 5000",
                    ),
                },
            }
        }
        for key in allowed {
            if !has_key(node, key) {
                self.error(node.pos, format!("limit has no `{key}`"));
            }
        }
        if self.problems.len() > errors_before {
            return None;
        }
        Some(Limit {
            sum: sum?,
            per: per?,
            window_ms: window?,
            max: max?,
            pos: node.pos,
        })
    }
}

fn has_key(node: &Node<'_>, key: &str) -> bool {
    matches!(&node.kind, Kind::Map(pairs) if pairs.iter().any(|(k, _)| k.scalar() == Some(key)))
}

fn bad_duration(key: &str, node: &Node<'_>) -> String {
    let shown = node.scalar().unwrap_or(node.shape());
    format!("`{key}` must be a duration like 4h, 30m or 1h30m, not `{shown}`")
}
