//! `threadgate lint`: everything wrong or suspicious in a policy file, with positions.
//!
//! Errors are the parser's problems (malformed rules, unknown keys and values). Warnings:
//! rules that can never fire because an earlier unconditional rule always wins first,
//! patterns that match no tool in the catalog, conditions and limits on an argument no
//! matched tool takes.

use std::fmt;

use super::rule::Rule;
use super::{Catalog, Policy, Pos, ToolSpec};

/// How serious a diagnostic is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// The file is invalid; the gate refuses it.
    Error,
    /// The file works but probably not as its author meant.
    Warning,
}

impl Severity {
    /// `error` or `warning`.
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Error => "error",
            Severity::Warning => "warning",
        }
    }
}

/// One finding of the linter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    /// Error or warning.
    pub severity: Severity,
    /// The file name as given.
    pub file: String,
    /// Where in the file.
    pub pos: Pos,
    /// What, in lowercase prose.
    pub message: String,
}

impl fmt::Display for Diagnostic {
    /// `support.yaml:14:5: warning: rule … can never fire: …`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Pos { line, column } = self.pos;
        write!(
            f,
            "{}:{line}:{column}: {}: {}",
            self.file,
            self.severity.as_str(),
            self.message
        )
    }
}

/// Lints a policy file against the built-in catalog, errors and warnings in file order.
pub fn lint(source: &str, file_name: &str) -> Vec<Diagnostic> {
    lint_with_catalog(source, file_name, &Catalog::builtin())
}

/// Lints a policy file against `catalog`.
pub(crate) fn lint_with_catalog(
    source: &str,
    file_name: &str,
    catalog: &Catalog,
) -> Vec<Diagnostic> {
    let found = match Policy::parse(source, file_name) {
        Err(error) => error
            .problems
            .into_iter()
            .map(|problem| (Severity::Error, problem.pos, problem.message))
            .collect(),
        Ok(policy) => warnings(&policy.rules, catalog),
    };
    let mut diagnostics: Vec<Diagnostic> = found
        .into_iter()
        .map(|(severity, pos, message)| Diagnostic {
            severity,
            file: file_name.to_string(),
            pos,
            message,
        })
        .collect();
    diagnostics.sort_by_key(|d| (d.pos, d.severity));
    diagnostics
}

fn warnings(rules: &[Rule], catalog: &Catalog) -> Vec<(Severity, Pos, String)> {
    let mut found = Vec::new();
    let mut warn = |pos: Pos, message: String| found.push((Severity::Warning, pos, message));
    if rules.is_empty() {
        warn(
            Pos { line: 1, column: 1 },
            "the file has no rules; every call is decided by default_mode".to_string(),
        );
    }
    for (j, rule) in rules.iter().enumerate() {
        if let Some(earlier) = rules.iter().take(j).find(|earlier| shadows(earlier, rule)) {
            warn(rule.pos, shadowed_message(earlier, rule));
        }
        let tools: Vec<&ToolSpec> = catalog
            .tools()
            .iter()
            .filter(|tool| rule.pattern.matches(tool.name))
            .collect();
        if tools.is_empty() {
            warn(
                rule.pos,
                format!("pattern `{}` matches no tool in the catalog", rule.text),
            );
            continue;
        }
        let paths = rule.conditions.iter().map(|c| (c.pos, &c.path)).chain(
            rule.limits
                .iter()
                .flat_map(|l| [(l.pos, &l.sum), (l.pos, &l.per)]),
        );
        for (pos, path) in paths {
            if !tools.iter().any(|tool| tool.arg(path.root()).is_some()) {
                warn(pos, no_such_argument(&rule.text, &tools, path.root()));
            }
        }
    }
    found
}

/// Whether `earlier` matches every call `later` could match, so `later` never decides.
fn shadows(earlier: &Rule, later: &Rule) -> bool {
    earlier.conditions.is_empty()
        && earlier.limits.is_empty()
        && later.pattern.is_covered_by(&earlier.pattern)
}

fn shadowed_message(earlier: &Rule, later: &Rule) -> String {
    let mut message = format!(
        "rule `{}` at line {} can never fire: rule `{}` at line {} comes first and matches \
         every call it matches",
        later.text, later.pos.line, earlier.text, earlier.pos.line
    );
    if !later.conditions.is_empty() || !later.limits.is_empty() {
        message.push_str("; move the narrower rule above the general one");
    }
    message
}

fn no_such_argument(pattern: &str, tools: &[&ToolSpec], arg: &str) -> String {
    match tools {
        [tool] => format!("`{}` takes no argument `{arg}`", tool.name),
        _ => format!("no tool matched by `{pattern}` takes an argument `{arg}`"),
    }
}
