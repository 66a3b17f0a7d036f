//! The plain-text table `threadgate audit` prints.

use chrono::DateTime;

use super::AuditRecordRow;

/// The widest a cell gets before it is cut with `…`.
const MAX_CELL: usize = 40;
/// The widest the arguments column gets.
const MAX_ARGS: usize = 80;

/// One column: its header, how wide it may grow, and how to read a cell from a row.
struct Column {
    header: &'static str,
    max: usize,
    cell: fn(&AuditRecordRow) -> String,
}

const COLUMNS: &[Column] = &[
    Column {
        header: "id",
        max: MAX_CELL,
        cell: |r| r.id.to_string(),
    },
    Column {
        header: "time (utc)",
        max: MAX_CELL,
        cell: |r| match DateTime::from_timestamp_millis(r.at_ms) {
            Some(t) => t.format("%Y-%m-%d %H:%M:%S%.3f").to_string(),
            None => r.at_ms.to_string(),
        },
    },
    Column {
        header: "event",
        max: MAX_CELL,
        cell: |r| r.event.clone(),
    },
    Column {
        header: "execution",
        max: MAX_CELL,
        cell: |r| opt(&r.execution_id),
    },
    Column {
        header: "thread",
        max: MAX_CELL,
        cell: |r| opt(&r.thread_id),
    },
    Column {
        header: "agent",
        max: MAX_CELL,
        cell: |r| opt(&r.agent),
    },
    Column {
        header: "tool",
        max: MAX_CELL,
        cell: |r| opt(&r.tool),
    },
    Column {
        header: "decision",
        max: MAX_CELL,
        cell: |r| opt(&r.decision),
    },
    Column {
        header: "rule",
        max: MAX_CELL,
        cell: |r| opt(&r.rule),
    },
    Column {
        header: "policy",
        max: 12,
        cell: |r| opt(&r.policy_hash),
    },
    Column {
        header: "reviewer",
        max: MAX_CELL,
        cell: |r| opt(&r.reviewer),
    },
    Column {
        header: "outcome",
        max: MAX_CELL,
        cell: |r| opt(&r.outcome),
    },
    Column {
        header: "ms",
        max: MAX_CELL,
        cell: |r| r.duration_ms.map(|d| d.to_string()).unwrap_or_default(),
    },
    Column {
        header: "args",
        max: MAX_ARGS,
        cell: |r| opt(&r.args_redacted),
    },
];

/// Formats rows as an aligned table, one line per row, leaving out columns that are
/// empty in every row. Control characters are shown escaped, so a stored value cannot
/// drive the terminal. No rows gives `no audit records`.
pub fn format_table(rows: &[AuditRecordRow]) -> String {
    if rows.is_empty() {
        return "no audit records\n".to_owned();
    }
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|row| {
            COLUMNS
                .iter()
                .map(|c| fit(&printable(&(c.cell)(row)), c.max))
                .collect()
        })
        .collect();
    let shown: Vec<usize> = (0..COLUMNS.len())
        .filter(|&i| {
            cells
                .iter()
                .any(|row| row.get(i).is_some_and(|c| !c.is_empty()))
        })
        .collect();
    let widths: Vec<usize> = shown
        .iter()
        .map(|&i| {
            cells
                .iter()
                .map(|row| row.get(i).map_or(0, |c| c.chars().count()))
                .chain(COLUMNS.get(i).map(|c| c.header.len()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    let header: Vec<&str> = shown
        .iter()
        .map(|&i| COLUMNS.get(i).map_or("", |c| c.header))
        .collect();
    push_line(&mut out, &header, &widths);
    for row in &cells {
        let line: Vec<&str> = shown
            .iter()
            .map(|&i| row.get(i).map_or("", String::as_str))
            .collect();
        push_line(&mut out, &line, &widths);
    }
    out
}

fn push_line(out: &mut String, cells: &[&str], widths: &[usize]) {
    let mut line = String::new();
    for (i, (cell, width)) in cells.iter().zip(widths).enumerate() {
        if i > 0 {
            line.push_str("  ");
        }
        line.push_str(cell);
        let pad = width.saturating_sub(cell.chars().count());
        line.extend(std::iter::repeat_n(' ', pad));
    }
    out.push_str(line.trim_end());
    out.push('\n');
}

fn opt(value: &Option<String>) -> String {
    value.clone().unwrap_or_default()
}

/// Escapes control characters (newlines, escape sequences) as `\n`, `\u{1b}`, ...
fn printable(text: &str) -> String {
    if !text.chars().any(char::is_control) {
        return text.to_owned();
    }
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// Cuts `text` to at most `max` characters, ending with `…` when cut.
fn fit(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut cut: String = text.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}
