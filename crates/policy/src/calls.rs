//! The calls file `threadgate check` resolves against a policy:
//!
//! ```yaml
//! calls:
//!   - tool: stripe.create_refund
//!     args: {charge: ch_1, amount: 4900, reason: duplicate}
//!     evidence: {duplicate_charge: 2d}
//! ```
//!
//! `args` defaults to `{}`. `evidence` states what the gateway would have gathered, per
//! kind: a duration (`2d`, `0s`) means found that far apart, `none` means looked for and
//! not found; a kind left out was not gathered (its conditions fail closed). Plain YAML scalars follow the core schema (`4900` is a number,
//! `true` a boolean); quote a value to keep it a string.

use serde_json::Value;

use super::PolicyError;
use super::evidence::{Evidence, EvidenceKind, Finding};
use super::parse::known_fields;
use super::yaml::{self, Kind, Pos, Problem};

/// One call to decide.
#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    /// The tool name, as the agent would send it.
    pub tool: String,
    /// The arguments, as the agent would send them.
    pub args: Value,
    /// The evidence stated for the call.
    pub evidence: Evidence,
    /// Where the call starts in the calls file.
    pub pos: Pos,
}

/// Parses a calls file, or returns every problem with its position.
pub fn parse_calls(source: &str, file_name: &str) -> Result<Vec<Call>, PolicyError> {
    let error = |problems: Vec<Problem>| PolicyError {
        file: file_name.to_string(),
        problems,
    };
    let (root, mut problems) = yaml::parse(source).map_err(error)?;
    let mut calls = Vec::new();
    let Some(root) = root else {
        return Err(error(vec![Problem::new(
            Pos { line: 1, column: 1 },
            "the calls file is empty; expected `calls:` with a list of calls",
        )]));
    };
    let fields = known_fields(&root, "the calls file", &["calls"], &mut problems);
    for (_, list, _) in fields.into_iter().flatten() {
        let Kind::Seq(items) = &list.kind else {
            problems.push(Problem::new(list.pos, "`calls` must be a list of calls"));
            continue;
        };
        for item in items {
            let Some(fields) =
                known_fields(item, "a call", &["tool", "args", "evidence"], &mut problems)
            else {
                continue;
            };
            let mut tool = None;
            let mut args = Value::Object(serde_json::Map::new());
            let mut evidence = Evidence::none();
            for (name, value, _) in fields {
                if name == "evidence" {
                    evidence = parse_evidence(value, &mut problems);
                } else if name == "tool" {
                    match value.scalar().filter(|t| !t.is_empty() && !value.is_null()) {
                        Some(text) => tool = Some(text.to_string()),
                        None => problems.push(Problem::new(value.pos, "`tool` needs a tool name")),
                    }
                } else {
                    match yaml::to_json(value) {
                        Ok(json) => args = json,
                        Err(problem) => problems.push(problem),
                    }
                }
            }
            match tool {
                Some(tool) => calls.push(Call {
                    tool,
                    args,
                    evidence,
                    pos: item.pos,
                }),
                None if !fields_have_tool(item) => {
                    problems.push(Problem::new(item.pos, "call has no `tool`"));
                }
                None => {}
            }
        }
    }
    if problems.is_empty() {
        Ok(calls)
    } else {
        problems.sort_by_key(|p| p.pos);
        Err(error(problems))
    }
}

fn fields_have_tool(node: &yaml::Node<'_>) -> bool {
    matches!(&node.kind, Kind::Map(pairs) if pairs.iter().any(|(k, _)| k.scalar() == Some("tool")))
}

/// `{duplicate_charge: 2d}` / `{duplicate_charge: none}`.
fn parse_evidence(node: &yaml::Node<'_>, problems: &mut Vec<Problem>) -> Evidence {
    let names: Vec<&str> = EvidenceKind::ALL.iter().map(|k| k.as_str()).collect();
    let mut evidence = Evidence::none();
    let Some(fields) = known_fields(node, "`evidence`", &names, problems) else {
        return evidence;
    };
    for (name, value, _) in fields {
        let Some(kind) = EvidenceKind::parse(name) else {
            continue;
        };
        let finding = match value.scalar() {
            Some("none") => Some(Finding::NotFound),
            Some("0" | "0s") => Some(Finding::Found { apart_ms: 0 }),
            Some(text) => super::parse::parse_duration(text).map(|d| Finding::Found {
                apart_ms: i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
            }),
            None => None,
        };
        match finding {
            Some(finding) => evidence.insert(kind, finding),
            None => problems.push(Problem::new(
                value.pos,
                format!("`{name}` must be how far apart it was found, like 2d or 0s, or `none`"),
            )),
        }
    }
    evidence
}
