//! The connector catalog: every tool threadgate knows, its risk class and its arguments,
//! plus the connectors' own built-in rules (evaluated after the policy file's rules).

use std::fmt;

use serde_json::Value;

use super::{Action, pattern::Pattern};

/// How much harm a call can do if it is wrong; decides `default_mode: risk`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Risk {
    /// Reads data; runs unattended under `risk`.
    Read,
    /// Changes something that can be corrected; held under `risk`.
    Write,
    /// Changes something that cannot be undone; held under `risk`.
    Destructive,
}

impl Risk {
    /// The lowercase name used in policy explanations.
    pub fn as_str(self) -> &'static str {
        match self {
            Risk::Read => "read",
            Risk::Write => "write",
            Risk::Destructive => "destructive",
        }
    }
}

impl fmt::Display for Risk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The JSON type an argument must have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgType {
    /// A JSON string.
    String,
    /// A JSON number without a fraction.
    Integer,
    /// `true` or `false`.
    Boolean,
    /// A JSON array of strings.
    StringArray,
}

impl ArgType {
    /// Whether `value` has this type.
    pub fn accepts(self, value: &Value) -> bool {
        match self {
            ArgType::String => value.is_string(),
            ArgType::Integer => value.is_i64() || value.is_u64(),
            ArgType::Boolean => value.is_boolean(),
            ArgType::StringArray => value
                .as_array()
                .is_some_and(|items| items.iter().all(Value::is_string)),
        }
    }

    /// The name used in messages.
    pub fn as_str(self) -> &'static str {
        match self {
            ArgType::String => "string",
            ArgType::Integer => "integer",
            ArgType::Boolean => "boolean",
            ArgType::StringArray => "array of strings",
        }
    }
}

/// One argument of a tool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArgSpec {
    /// The argument's key in the call's JSON object.
    pub name: &'static str,
    /// Its JSON type.
    pub ty: ArgType,
    /// Whether a call must carry it.
    pub required: bool,
    /// Whether the gateway fills it in (from the session or the provider); a caller may
    /// still send it, and the gateway overwrites or checks it.
    pub filled_by_gateway: bool,
}

/// One tool in the catalog.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ToolSpec {
    /// The full tool name, `connector.action`.
    pub name: &'static str,
    /// Its risk class.
    pub risk: Risk,
    /// Its arguments.
    pub args: &'static [ArgSpec],
}

impl ToolSpec {
    /// The connector part of the name (`stripe` for `stripe.create_refund`).
    pub fn connector(&self) -> &'static str {
        self.name.split_once('.').map_or(self.name, |(c, _)| c)
    }

    /// The argument named `name`, if the tool takes it.
    pub fn arg(&self, name: &str) -> Option<&'static ArgSpec> {
        self.args.iter().find(|a| a.name == name)
    }
}

/// A rule a connector carries for its own tools, after the policy file's rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectorRule {
    /// The connector that carries it.
    pub connector: &'static str,
    /// A tool pattern, as in a policy file.
    pub pattern: &'static str,
    /// What happens to a call it matches.
    pub action: Action,
}

/// Why a call's arguments do not fit the catalog.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ArgProblem {
    /// The arguments are not a JSON object.
    #[error("arguments must be a json object")]
    NotAnObject,
    /// A key the tool does not take.
    #[error("unknown argument `{0}`")]
    Unknown(String),
    /// A value of the wrong JSON type.
    #[error("argument `{name}` must be a {expected}")]
    WrongType {
        /// The argument.
        name: &'static str,
        /// The type it must have.
        expected: &'static str,
    },
    /// A required argument is absent.
    #[error("missing required argument `{0}`")]
    Missing(&'static str),
}

/// The tools threadgate knows and the connectors' built-in rules.
#[derive(Clone, Debug)]
pub struct Catalog {
    tools: &'static [ToolSpec],
    rules: Vec<(ConnectorRule, Pattern)>,
}

impl Catalog {
    /// The catalog of the connectors built into threadgate.
    pub fn builtin() -> Self {
        Self::new(BUILTIN_TOOLS, BUILTIN_RULES)
    }

    /// A catalog of the given tools and connector rules.
    ///
    /// Connector rule patterns that do not compile are skipped (the built-in ones do).
    pub fn new(tools: &'static [ToolSpec], rules: &'static [ConnectorRule]) -> Self {
        let rules = rules
            .iter()
            .filter_map(|rule| Some((*rule, Pattern::compile(rule.pattern).ok()?)))
            .collect();
        Self { tools, rules }
    }

    /// Every tool, in catalog order.
    pub fn tools(&self) -> &'static [ToolSpec] {
        self.tools
    }

    /// The tool named exactly `tool`.
    pub fn get(&self, tool: &str) -> Option<&'static ToolSpec> {
        self.tools.iter().find(|spec| spec.name == tool)
    }

    /// The connectors' rules, in evaluation order.
    pub fn rules(&self) -> impl Iterator<Item = &ConnectorRule> {
        self.rules.iter().map(|(rule, _)| rule)
    }

    /// The first connector rule that matches `tool`.
    pub(crate) fn rule_for(&self, tool: &str) -> Option<&ConnectorRule> {
        self.rules
            .iter()
            .find(|(_, pattern)| pattern.matches(tool))
            .map(|(rule, _)| rule)
    }

    /// Checks a call's arguments against the tool's: unknown keys, wrong types, missing
    /// required arguments. A tool missing from the catalog has no problems to report here.
    pub fn validate_args(&self, tool: &str, args: &Value) -> Result<(), Vec<ArgProblem>> {
        let Some(spec) = self.get(tool) else {
            return Ok(());
        };
        let Some(object) = args.as_object() else {
            return Err(vec![ArgProblem::NotAnObject]);
        };
        let mut problems = Vec::new();
        for (key, value) in object {
            match spec.arg(key) {
                None => problems.push(ArgProblem::Unknown(key.clone())),
                Some(arg) if !arg.ty.accepts(value) => problems.push(ArgProblem::WrongType {
                    name: arg.name,
                    expected: arg.ty.as_str(),
                }),
                Some(_) => {}
            }
        }
        for arg in spec.args {
            if arg.required && !object.contains_key(arg.name) {
                problems.push(ArgProblem::Missing(arg.name));
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }
}

const fn arg(name: &'static str, ty: ArgType) -> ArgSpec {
    ArgSpec {
        name,
        ty,
        required: false,
        filled_by_gateway: false,
    }
}

const fn required(name: &'static str, ty: ArgType) -> ArgSpec {
    ArgSpec {
        required: true,
        ..arg(name, ty)
    }
}

const fn filled(name: &'static str, ty: ArgType) -> ArgSpec {
    ArgSpec {
        filled_by_gateway: true,
        ..arg(name, ty)
    }
}

use ArgType::{Boolean, Integer, String as Str, StringArray};

const fn tool(name: &'static str, risk: Risk, args: &'static [ArgSpec]) -> ToolSpec {
    ToolSpec { name, risk, args }
}

/// The tools of the built-in Stripe, helpdesk and GitHub connectors.
pub const BUILTIN_TOOLS: &[ToolSpec] = &[
    tool("stripe.list_invoices", Risk::Read, LIST_ARGS),
    tool("stripe.list_charges", Risk::Read, LIST_ARGS),
    tool("stripe.get_charge", Risk::Read, &[required("charge", Str)]),
    tool(
        "stripe.get_customer",
        Risk::Read,
        &[required("customer", Str)],
    ),
    tool(
        "stripe.create_refund",
        Risk::Write,
        &[
            required("charge", Str),
            arg("amount", Integer),
            arg("reason", Str),
            filled("customer", Str),
            filled("currency", Str),
        ],
    ),
    tool(
        "stripe.update_subscription",
        Risk::Write,
        &[
            required("subscription", Str),
            arg("plan", Str),
            arg("quantity", Integer),
            arg("cancel_at_period_end", Boolean),
            filled("customer", Str),
        ],
    ),
    tool(
        "stripe.cancel_subscription",
        Risk::Destructive,
        &[required("subscription", Str), filled("customer", Str)],
    ),
    tool(
        "stripe.delete_customer",
        Risk::Destructive,
        &[required("customer", Str)],
    ),
    tool(
        "helpdesk.get_thread",
        Risk::Read,
        &[filled("thread_id", Str)],
    ),
    tool("helpdesk.reply_to_thread", Risk::Write, NOTE_ARGS),
    tool("helpdesk.add_note", Risk::Write, NOTE_ARGS),
    tool(
        "helpdesk.escalate_to_engineer",
        Risk::Write,
        &[filled("thread_id", Str), required("summary", Str)],
    ),
    tool(
        "helpdesk.mark_done",
        Risk::Write,
        &[filled("thread_id", Str)],
    ),
    tool(
        "github.search_code",
        Risk::Read,
        &[required("query", Str), arg("repo", Str)],
    ),
    tool(
        "github.get_file",
        Risk::Read,
        &[
            required("repo", Str),
            required("path", Str),
            arg("ref", Str),
        ],
    ),
    tool(
        "github.create_issue",
        Risk::Write,
        &[
            required("repo", Str),
            required("title", Str),
            arg("body", Str),
            arg("labels", StringArray),
        ],
    ),
];

const LIST_ARGS: &[ArgSpec] = &[
    required("customer", Str),
    arg("limit", Integer),
    arg("starting_after", Str),
];

const NOTE_ARGS: &[ArgSpec] = &[
    filled("thread_id", Str),
    required("text", Str),
    arg("markdown", Str),
];

/// The connectors' built-in rules: Stripe holds its destructive calls for a person even
/// under `default_mode: allow_all`, unless the policy file decides them first.
pub const BUILTIN_RULES: &[ConnectorRule] = &[
    ConnectorRule {
        connector: "stripe",
        pattern: "stripe.delete_customer",
        action: Action::RequireApproval,
    },
    ConnectorRule {
        connector: "stripe",
        pattern: "stripe.cancel_subscription",
        action: Action::RequireApproval,
    },
];
