//! `threadgate check` and `threadgate lint`: the policy engine's shell for reviewers.
//!
//! Exit codes: 0 on success (lint: warnings only), 1 when a file cannot be read or is
//! invalid (lint: any error), 2 for a malformed command line.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use clap::{Args, ValueEnum};
use serde_json::{Value, json};

use crate::policy::calls::{Call, parse_calls};
use crate::policy::{
    Catalog, Decision, Diagnostic, LimitCharge, MemoryHistory, Policy, PolicyError, Severity,
    Verdict,
};

/// How to print the results.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Aligned columns for people.
    #[default]
    Table,
    /// JSON for programs.
    Json,
}

/// Arguments of `threadgate check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The policy file.
    pub policy: PathBuf,
    /// A YAML file with `calls: [{tool, args}]`.
    pub calls: PathBuf,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

/// Arguments of `threadgate lint`.
#[derive(Debug, Args)]
pub struct LintArgs {
    /// The policy file.
    pub policy: PathBuf,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Also warn about every line Kortix's evaluator would read differently, and why.
    #[arg(long)]
    pub kortix: bool,
}

/// The first column is as wide as the longest tool name plus two, at least this.
const MIN_CALL_WIDTH: usize = 31;
/// The width of the decision column: `decision` plus two spaces.
const DECISION_WIDTH: usize = 10;

/// Runs `threadgate check`.
pub(super) fn check(args: &CheckArgs) -> ExitCode {
    match decide_calls(args) {
        Ok((calls, decisions)) => {
            let output = match args.format {
                Format::Table => render_table(&calls, &decisions),
                Format::Json => render_json(&args.policy, &calls, &decisions),
            };
            print!("{output}");
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("{message}");
            ExitCode::FAILURE
        }
    }
}

/// Runs `threadgate lint`.
pub(super) fn lint(args: &LintArgs) -> ExitCode {
    let file = display(&args.policy);
    let source = match read(&args.policy) {
        Ok(source) => source,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::FAILURE;
        }
    };
    let mut diagnostics = crate::policy::lint(&source, &file);
    if args.kortix {
        diagnostics.extend(crate::policy::kortix_differences(&source, &file));
        diagnostics.sort_by_key(|d| (d.pos, d.severity));
    }
    let errors = count(&diagnostics, Severity::Error);
    let warnings = count(&diagnostics, Severity::Warning);
    match args.format {
        Format::Table => {
            for diagnostic in &diagnostics {
                println!("{diagnostic}");
            }
            println!(
                "{file}: {errors} {}, {warnings} {}",
                noun(errors, "error", "errors"),
                noun(warnings, "warning", "warnings")
            );
        }
        Format::Json => {
            let items: Vec<Value> = diagnostics.iter().map(diagnostic_json).collect();
            let report =
                json!({"file": file, "errors": errors, "warnings": warnings, "diagnostics": items});
            println!("{}", pretty(&report));
        }
    }
    if errors > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn count(diagnostics: &[Diagnostic], severity: Severity) -> usize {
    diagnostics
        .iter()
        .filter(|d| d.severity == severity)
        .count()
}

fn diagnostic_json(d: &Diagnostic) -> Value {
    json!({
        "severity": d.severity.as_str(),
        "file": d.file,
        "line": d.pos.line,
        "column": d.pos.column,
        "message": d.message,
    })
}

fn display(path: &Path) -> String {
    path.display().to_string()
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path)
        .map_err(|error| format!("error: cannot read {}: {error}", path.display()))
}

fn file_errors(error: &PolicyError) -> String {
    let mut out = String::new();
    for (i, problem) in error.problems.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let _ = write!(
            out,
            "{}:{}:{}: error: {}",
            error.file, problem.pos.line, problem.pos.column, problem.message
        );
    }
    out
}

/// Reads both files and decides every call in order; each call decided `run` adds its
/// limit charges to the history later calls see.
fn decide_calls(args: &CheckArgs) -> Result<(Vec<Call>, Vec<Decision>), String> {
    let policy_source = read(&args.policy)?;
    let policy = Policy::parse(&policy_source, &display(&args.policy))
        .map_err(|error| file_errors(&error))?;
    let calls_file = display(&args.calls);
    let calls_source = read(&args.calls)?;
    let calls = parse_calls(&calls_source, &calls_file).map_err(|error| file_errors(&error))?;
    let catalog = Catalog::builtin();
    let mut history = MemoryHistory::new();
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, crate::clock::ms);
    let mut decisions = Vec::with_capacity(calls.len());
    for call in &calls {
        warn_about_arguments(&catalog, &calls_file, call);
        let decision = policy.decide_with_evidence(
            &call.tool,
            &call.args,
            &catalog,
            &history,
            now_ms,
            &call.evidence,
        );
        if decision.verdict == Verdict::Run {
            for charge in &decision.charges {
                history.record(charge, now_ms);
            }
        }
        decisions.push(decision);
    }
    Ok((calls, decisions))
}

/// Warnings never change a decision: `check` decides every call as written.
fn warn_about_arguments(catalog: &Catalog, file: &str, call: &Call) {
    let at = format!("{file}:{}:{}", call.pos.line, call.pos.column);
    if catalog.get(&call.tool).is_none() {
        eprintln!(
            "{at}: warning: `{}` is not in the catalog; decided as a write",
            call.tool
        );
        return;
    }
    if let Err(problems) = catalog.validate_args(&call.tool, &call.args) {
        for problem in problems {
            eprintln!("{at}: warning: {}: {problem}", call.tool);
        }
    }
}

/// The table: one row per call, then a summary line.
pub(crate) fn render_table(calls: &[Call], decisions: &[Decision]) -> String {
    let longest = calls.iter().map(|c| c.tool.chars().count()).max();
    let width = longest.map_or(0, |n| n + 2).max(MIN_CALL_WIDTH);
    let mut out = String::new();
    let mut row = |call: &str, decision: &str, because: &dyn std::fmt::Display| {
        let _ = writeln!(out, "{call:<width$}{decision:<DECISION_WIDTH$}{because}");
    };
    row("call", "decision", &"because");
    for (call, decision) in calls.iter().zip(decisions) {
        row(&call.tool, decision.verdict.as_str(), &decision.because);
        for check in &decision.evidence {
            row("", "", &format_args!("  evidence {check}"));
        }
    }
    let (run, hold, block) = tally(decisions);
    let _ = write!(
        out,
        "\n{} {}: {run} {} without a person, {hold} {} for one, {block} blocked.\n",
        calls.len(),
        noun(calls.len(), "call", "calls"),
        noun(run, "runs", "run"),
        noun(hold, "waits", "wait"),
    );
    out
}

fn tally(decisions: &[Decision]) -> (usize, usize, usize) {
    let of = |verdict| decisions.iter().filter(|d| d.verdict == verdict).count();
    (of(Verdict::Run), of(Verdict::Hold), of(Verdict::Block))
}

fn noun<'a>(n: usize, one: &'a str, many: &'a str) -> &'a str {
    if n == 1 { one } else { many }
}

fn render_json(policy: &Path, calls: &[Call], decisions: &[Decision]) -> String {
    let rows: Vec<Value> = calls
        .iter()
        .zip(decisions)
        .map(|(call, decision)| {
            json!({
                "tool": call.tool,
                "line": call.pos.line,
                "decision": decision.verdict.as_str(),
                "because": decision.because.to_string(),
                "rule_line": decision.rule_line,
                "charges": decision.charges.iter().map(charge_json).collect::<Vec<_>>(),
                "evidence": decision.evidence.iter().map(|c| c.to_string()).collect::<Vec<_>>(),
            })
        })
        .collect();
    let (run, hold, block) = tally(decisions);
    let report = json!({
        "policy": display(policy),
        "calls": rows,
        "summary": {"calls": calls.len(), "run": run, "hold": hold, "block": block},
    });
    format!("{}\n", pretty(&report))
}

fn charge_json(charge: &LimitCharge) -> Value {
    let amount = u64::try_from(charge.amount)
        .map(Value::from)
        .unwrap_or_else(|_| Value::String(charge.amount.to_string()));
    json!({"key": charge.key, "amount": amount, "window_ms": charge.window_ms})
}

fn pretty(value: &Value) -> String {
    // Serializing a `Value` cannot fail: its keys are strings.
    serde_json::to_string_pretty(value).unwrap_or_default()
}
