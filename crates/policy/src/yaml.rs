//! A small YAML reader for the policy and calls files.
//!
//! It turns saphyr-parser's event stream into a tree that keeps, for every key and value,
//! its line and column and its raw scalar text. Keeping the raw text lets the policy parser
//! read numbers exactly (no float round trip) and treat `match: 100` as the pattern `100`.
//! Aliases, tags and more than one document are refused, and so are duplicate keys: a
//! policy file must mean exactly what it says.

use std::borrow::Cow;

use saphyr_parser::{Event, Parser, ScalarStyle, Span};
use serde_json::{Map, Number, Value};

/// A position in a source file: line and column, both counted from 1.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Pos {
    /// The line, from 1.
    pub line: u32,
    /// The column in characters, from 1.
    pub column: u32,
}

/// One problem in a source file, at a position.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// Where the problem is.
    pub pos: Pos,
    /// What is wrong, in lowercase prose naming the offending input.
    pub message: String,
}

impl Problem {
    /// A problem at `pos`; line breaks in the message (from quoted input) are escaped so
    /// that every problem prints on one line.
    pub(crate) fn new(pos: Pos, message: impl Into<String>) -> Self {
        Self {
            pos,
            message: message.into().replace('\n', "\\n"),
        }
    }
}

/// A YAML node with the position of its first character.
#[derive(Debug)]
pub(crate) struct Node<'a> {
    pub pos: Pos,
    pub kind: Kind<'a>,
}

/// The three shapes a YAML node can take.
#[derive(Debug)]
pub(crate) enum Kind<'a> {
    /// A scalar with its text as written; `plain` is false for quoted and block scalars.
    Scalar {
        text: Cow<'a, str>,
        plain: bool,
    },
    Seq(Vec<Node<'a>>),
    /// A mapping with scalar keys, in written order, without duplicates.
    Map(Vec<(Node<'a>, Node<'a>)>),
}

impl<'a> Node<'a> {
    /// The scalar's text, if this node is a scalar.
    pub(crate) fn scalar(&self) -> Option<&str> {
        match &self.kind {
            Kind::Scalar { text, .. } => Some(text),
            _ => None,
        }
    }

    /// Whether this node is YAML's null (`~`, `null` or nothing, unquoted).
    pub(crate) fn is_null(&self) -> bool {
        matches!(&self.kind, Kind::Scalar { text, plain: true } if is_null_text(text))
    }

    /// The boolean this plain scalar spells, if any (YAML 1.2 core schema).
    pub(crate) fn as_bool(&self) -> Option<bool> {
        match &self.kind {
            Kind::Scalar { text, plain: true } => match text.as_ref() {
                "true" | "True" | "TRUE" => Some(true),
                "false" | "False" | "FALSE" => Some(false),
                _ => None,
            },
            _ => None,
        }
    }

    /// A short name of this node's shape for error messages.
    pub(crate) fn shape(&self) -> &'static str {
        match &self.kind {
            Kind::Scalar { .. } if self.is_null() => "nothing",
            Kind::Scalar { .. } => "a scalar",
            Kind::Seq(_) => "a list",
            Kind::Map(_) => "a mapping",
        }
    }
}

/// What a YAML 1.2 core-schema reader (Kortix's) makes of a scalar as written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum ScalarType {
    /// Quoted, a block scalar, or plain text that is nothing else.
    #[default]
    String,
    /// A plain number: `4900`, `-2.5`, `1e3`, `0x1F`, `0o17`, `.inf`, `.nan`.
    Number,
    /// A plain `true` or `false` (any of the core schema's spellings).
    Bool,
    /// A plain null: `~`, `null`, or nothing.
    Null,
}

impl ScalarType {
    /// The name a message gives this type.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ScalarType::String => "a string",
            ScalarType::Number => "a number",
            ScalarType::Bool => "a boolean",
            ScalarType::Null => "null",
        }
    }
}

impl Node<'_> {
    /// The core-schema type of this scalar; `None` for a list or mapping.
    pub(crate) fn scalar_type(&self) -> Option<ScalarType> {
        match &self.kind {
            Kind::Scalar { plain: false, .. } => Some(ScalarType::String),
            Kind::Scalar { text, plain: true } => Some(if is_null_text(text) {
                ScalarType::Null
            } else if self.as_bool().is_some() {
                ScalarType::Bool
            } else if core_number_js_text(text).is_some() {
                ScalarType::Number
            } else {
                ScalarType::String
            }),
            _ => None,
        }
    }
}

/// For plain text the core schema reads as a number, that number as JavaScript's
/// `String(n)` writes it (`10.0` is `10`, `0x1F` is `31`, `.inf` is `Infinity`).
pub(crate) fn core_number_js_text(text: &str) -> Option<String> {
    let radix = |digits: &str, base: u32| {
        let all = !digits.is_empty() && digits.chars().all(|c| c.is_digit(base));
        all.then(|| {
            digits
                .chars()
                .filter_map(|c| c.to_digit(base))
                .fold(0.0_f64, |n, d| n * f64::from(base) + f64::from(d))
        })
    };
    let unsigned = text.strip_prefix(['-', '+']).unwrap_or(text);
    let negative = text.starts_with('-');
    let value = if let Some(hex) = text.strip_prefix("0x") {
        radix(hex, 16)?
    } else if let Some(octal) = text.strip_prefix("0o") {
        radix(octal, 8)?
    } else if matches!(unsigned, ".inf" | ".Inf" | ".INF") {
        if negative {
            f64::NEG_INFINITY
        } else {
            f64::INFINITY
        }
    } else if matches!(text, ".nan" | ".NaN" | ".NAN") {
        f64::NAN
    } else if is_yaml_int(text) || is_yaml_float(text) {
        text.parse::<f64>().ok()?
    } else {
        return None;
    };
    Some(super::decimal::js_f64_text(value))
}

fn is_null_text(text: &str) -> bool {
    matches!(text, "" | "~" | "null" | "Null" | "NULL")
}

/// A parsed document (`None` when empty) and the problems that did not stop parsing
/// (duplicate keys; both values are kept so the caller can report their problems too).
pub(crate) type Parsed<'a> = (Option<Node<'a>>, Vec<Problem>);

/// Parses one YAML document; `Err` holds a problem that stopped parsing.
pub(crate) fn parse(source: &str) -> Result<Parsed<'_>, Vec<Problem>> {
    let mut builder = Builder::default();
    let mut parser = Parser::new_from_str(source);
    while let Some(event) = parser.next_event() {
        let (event, span) = match event {
            Ok(pair) => pair,
            Err(error) => {
                let marker = error.marker();
                let pos = Pos {
                    line: to_u32(marker.line()),
                    column: to_u32(marker.col() + 1),
                };
                return Err(vec![Problem::new(
                    pos,
                    format!("invalid yaml: {}", error.info()),
                )]);
            }
        };
        if let Err(problem) = builder.event(event, span) {
            return Err(vec![problem]);
        }
    }
    Ok((builder.root, builder.problems))
}

fn to_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn pos_of(span: &Span) -> Pos {
    Pos {
        line: to_u32(span.start.line()),
        column: to_u32(span.start.col() + 1),
    }
}

enum Frame<'a> {
    Seq(Pos, Vec<Node<'a>>),
    Map(Pos, Vec<(Node<'a>, Node<'a>)>, Option<Node<'a>>),
}

#[derive(Default)]
struct Builder<'a> {
    stack: Vec<Frame<'a>>,
    root: Option<Node<'a>>,
    documents: usize,
    problems: Vec<Problem>,
}

impl<'a> Builder<'a> {
    fn event(&mut self, event: Event<'a>, span: Span) -> Result<(), Problem> {
        let pos = pos_of(&span);
        match event {
            Event::DocumentStart(_) => {
                self.documents += 1;
                if self.documents > 1 {
                    return Err(Problem::new(pos, "the file must hold one yaml document"));
                }
            }
            Event::Alias(_) => return Err(Problem::new(pos, "yaml aliases are not supported")),
            Event::Scalar(text, style, _, tag) => {
                if tag.is_some() {
                    return Err(Problem::new(pos, "yaml tags are not supported"));
                }
                let plain = style == ScalarStyle::Plain;
                self.push(Node {
                    pos,
                    kind: Kind::Scalar { text, plain },
                })?;
            }
            Event::SequenceStart(_, tag) | Event::MappingStart(_, tag) if tag.is_some() => {
                return Err(Problem::new(pos, "yaml tags are not supported"));
            }
            Event::SequenceStart(..) => self.stack.push(Frame::Seq(pos, Vec::new())),
            Event::MappingStart(..) => self.stack.push(Frame::Map(pos, Vec::new(), None)),
            Event::SequenceEnd | Event::MappingEnd => {
                let node = match self.stack.pop() {
                    Some(Frame::Seq(pos, items)) => Node {
                        pos,
                        kind: Kind::Seq(items),
                    },
                    Some(Frame::Map(pos, pairs, _)) => Node {
                        pos,
                        kind: Kind::Map(pairs),
                    },
                    None => return Err(Problem::new(pos, "invalid yaml: unbalanced collection")),
                };
                self.push(node)?;
            }
            Event::Nothing | Event::StreamStart | Event::StreamEnd | Event::DocumentEnd => {}
        }
        Ok(())
    }

    fn push(&mut self, node: Node<'a>) -> Result<(), Problem> {
        match self.stack.last_mut() {
            None => self.root = Some(node),
            Some(Frame::Seq(_, items)) => items.push(node),
            Some(Frame::Map(_, pairs, pending)) => match pending.take() {
                Some(key) => pairs.push((key, node)),
                None => {
                    let Some(text) = node.scalar() else {
                        return Err(Problem::new(node.pos, "mapping keys must be plain text"));
                    };
                    if let Some((first, _)) = pairs.iter().find(|(k, _)| k.scalar() == Some(text)) {
                        self.problems.push(Problem::new(
                            node.pos,
                            format!(
                                "duplicate key `{text}` (first written at line {})",
                                first.pos.line
                            ),
                        ));
                    }
                    *pending = Some(node);
                }
            },
        }
        Ok(())
    }
}

/// Converts a node to JSON with the YAML 1.2 core schema: plain `true`, `42`, `-1.5`, `~`
/// become a boolean, numbers and null; everything quoted stays a string.
pub(crate) fn to_json(node: &Node<'_>) -> Result<Value, Problem> {
    match &node.kind {
        Kind::Scalar { text, plain: false } => Ok(Value::String(text.to_string())),
        Kind::Scalar { text, plain: true } => plain_to_json(text, node.pos),
        Kind::Seq(items) => items
            .iter()
            .map(to_json)
            .collect::<Result<_, _>>()
            .map(Value::Array),
        Kind::Map(pairs) => {
            let mut map = Map::new();
            for (key, value) in pairs {
                map.insert(
                    key.scalar().unwrap_or_default().to_string(),
                    to_json(value)?,
                );
            }
            Ok(Value::Object(map))
        }
    }
}

fn plain_to_json(text: &str, pos: Pos) -> Result<Value, Problem> {
    if is_null_text(text) {
        return Ok(Value::Null);
    }
    match text {
        "true" | "True" | "TRUE" => return Ok(Value::Bool(true)),
        "false" | "False" | "FALSE" => return Ok(Value::Bool(false)),
        _ => {}
    }
    if is_yaml_int(text) {
        if let Ok(n) = text.parse::<i64>() {
            return Ok(Value::from(n));
        }
        if let Ok(n) = text.trim_start_matches('+').parse::<u64>() {
            return Ok(Value::from(n));
        }
        return Err(Problem::new(pos, format!("integer `{text}` is too large")));
    }
    if is_yaml_float(text) {
        let number = text.parse::<f64>().ok().and_then(Number::from_f64);
        return number
            .map(Value::Number)
            .ok_or_else(|| Problem::new(pos, format!("number `{text}` is out of range")));
    }
    Ok(Value::String(text.to_string()))
}

fn is_yaml_int(text: &str) -> bool {
    let digits = text.strip_prefix(['-', '+']).unwrap_or(text);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

fn is_yaml_float(text: &str) -> bool {
    let body = text.strip_prefix(['-', '+']).unwrap_or(text);
    let (mantissa, exponent) = match body.find(['e', 'E']) {
        Some(at) => (&body[..at], Some(&body[at + 1..])),
        None => (body, None),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    let mantissa_ok = digits(int) && digits(frac) && !(int.is_empty() && frac.is_empty());
    let exponent_ok = exponent.is_none_or(|e| {
        let e = e.strip_prefix(['-', '+']).unwrap_or(e);
        !e.is_empty() && digits(e)
    });
    mantissa_ok && exponent_ok
}
