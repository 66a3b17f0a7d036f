//! Agent-written text shown to people (a held call's note, a pull request's
//! description): split into lines with every line ending an agent could use normalised,
//! so the text can be quoted line by line and never makes a line of its own, and
//! escaped for Markdown where it must stay on one line.
//!
//! It lives with the sessions because both the gateway's notes and the session's pull
//! request quote the agent, and the gateway sits above this module.

/// Whether `c` ends a line somewhere a note may be shown (a Markdown renderer, a plain
/// text view, a browser).
fn is_line_break(c: char) -> bool {
    matches!(
        c,
        '\n' | '\r' | '\u{0B}' | '\u{0C}' | '\u{85}' | '\u{2028}' | '\u{2029}'
    )
}

/// Agent-written `text` as lines: every line ending normalised (`\r\n` counts once),
/// other control characters shown as U+FFFD, trailing blank lines dropped.
pub fn agent_lines(text: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if is_line_break(c) {
            if c == '\r' && chars.peek() == Some(&'\n') {
                chars.next();
            }
            lines.push(std::mem::take(&mut line));
        } else if c.is_control() && c != '\t' {
            line.push('\u{FFFD}');
        } else {
            line.push(c);
        }
    }
    lines.push(line);
    while lines.len() > 1 && lines.last().is_some_and(|l| l.trim().is_empty()) {
        lines.pop();
    }
    lines
}

/// `text` on one line: its lines joined by a space.
pub fn one_line(text: &str) -> String {
    agent_lines(text).join(" ")
}

/// `line` with every ASCII punctuation mark backslash-escaped: CommonMark renders it
/// as written, with no link, autolink, image, HTML, emphasis, code or heading.
pub fn escape_markdown(line: &str) -> String {
    let mut out = String::with_capacity(line.len() + line.len() / 4);
    for c in line.chars() {
        if c.is_ascii_punctuation() {
            out.push('\\');
        }
        out.push(c);
    }
    out
}
