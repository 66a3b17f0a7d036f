//! `GET /approvals`: what waits for a decision, a page at a time, filtered by thread,
//! tool and age, oldest (the default) or newest first.
//!
//! The query string is `thread`, `tool`, `age` (a minimum wait such as `15m` or `2h`),
//! `order` (`oldest` or `newest`) and `page` (from 1). A value the page cannot read is a
//! 400 that names the field; an empty field is no filter.

use askama::Template;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;

use super::auth::Signed;
use super::pages::{customer, internal};
use super::views::QueueRow;
use super::{ReviewState, message, render};
use crate::executions::store::{self, HeldFilter};

/// Held calls on one page of the queue.
pub(super) const QUEUE_PAGE: i64 = 25;
/// The longest thread id or tool name a filter takes.
const MAX_FILTER_LEN: usize = 128;

/// The query string as sent.
#[derive(Debug, Default, Deserialize)]
pub(super) struct QueueQuery {
    #[serde(default)]
    thread: String,
    #[serde(default)]
    tool: String,
    #[serde(default)]
    age: String,
    #[serde(default)]
    order: String,
    #[serde(default)]
    page: String,
}

/// The query read: the filter, the page, and the same values to write back into the
/// form and the links.
struct Asked {
    filter: HeldFilter,
    page: i64,
    thread: String,
    tool: String,
    age: String,
    newest: bool,
}

#[derive(Template)]
#[template(path = "review/queue.html")]
struct QueuePage<'a> {
    reviewer: &'a str,
    csrf: &'a str,
    banner: &'a str,
    banner_kind: &'a str,
    rows: Vec<QueueRow>,
    total: i64,
    page: i64,
    pages: i64,
    thread: &'a str,
    tool: &'a str,
    age: &'a str,
    newest: bool,
    tools: Vec<String>,
    /// Links to the previous and next page with the same filters; empty when none.
    prev: String,
    next: String,
}

/// `GET /approvals`.
pub(super) async fn queue(
    State(state): State<ReviewState>,
    who: Signed,
    Query(query): Query<QueueQuery>,
) -> Response {
    let asked = match read_query(query) {
        Ok(asked) => asked,
        Err(why) => {
            return message(StatusCode::BAD_REQUEST, Some(&who), "Bad filter", &why);
        }
    };
    let now = state.approvals.gate.now();
    let filter = asked.filter.clone();
    let offset = (asked.page - 1).saturating_mul(QUEUE_PAGE);
    let read = state
        .approvals
        .gate
        .db()
        .read(move |c| {
            let (held, total) = store::held_page(c, &filter, now, QUEUE_PAGE, offset)?;
            let mut rows = Vec::with_capacity(held.len());
            for e in held {
                let cust = customer(c, &e.thread_id)?;
                rows.push((e, cust));
            }
            Ok((rows, total, store::held_tools(c)?))
        })
        .await;
    let (rows, total, tools) = match read {
        Ok(read) => read,
        Err(e) => return internal(&who, e),
    };
    let redactor = state.approvals.gate.current_redactor();
    let rows = rows
        .into_iter()
        .map(|(e, cust)| {
            let link = state.thread_link(&e.thread_id);
            QueueRow::new(&e, now, &redactor, cust, link)
        })
        .collect();
    let pages = ((total + QUEUE_PAGE - 1) / QUEUE_PAGE).max(1);
    let link = |page: i64| link_to(&asked, page);
    render(
        StatusCode::OK,
        &QueuePage {
            reviewer: &who.reviewer.name,
            csrf: &who.csrf,
            banner: "",
            banner_kind: "",
            rows,
            total,
            page: asked.page,
            pages,
            thread: &asked.thread,
            tool: &asked.tool,
            age: &asked.age,
            newest: asked.newest,
            tools,
            prev: if asked.page > 1 {
                link(asked.page - 1)
            } else {
                String::new()
            },
            next: if asked.page < pages {
                link(asked.page + 1)
            } else {
                String::new()
            },
        },
    )
}

fn read_query(q: QueueQuery) -> Result<Asked, String> {
    let name = |field: &str, text: &str| -> Result<Option<String>, String> {
        let text = text.trim();
        if text.is_empty() {
            return Ok(None);
        }
        let fine = text.len() <= MAX_FILTER_LEN
            && text
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b));
        if fine {
            Ok(Some(text.to_owned()))
        } else {
            Err(format!(
                "{field} must be at most {MAX_FILTER_LEN} letters, digits, '_', '-' or '.' (got {text:?})."
            ))
        }
    };
    let thread = name("thread", &q.thread)?;
    let tool = name("tool", &q.tool)?;
    let age = q.age.trim();
    let min_age_ms = if age.is_empty() {
        0
    } else {
        let d = humantime::parse_duration(age)
            .map_err(|e| format!("age must be a duration such as 15m or 2h (got {age:?}: {e})."))?;
        crate::clock::ms(d)
    };
    let newest = match q.order.trim() {
        "" | "oldest" => false,
        "newest" => true,
        other => return Err(format!("order must be oldest or newest (got {other:?}).")),
    };
    let page = match q.page.trim() {
        "" => 1,
        text => text
            .parse::<i64>()
            .ok()
            .filter(|p| (1..=1_000_000).contains(p))
            .ok_or_else(|| format!("page must be a whole number from 1 (got {text:?})."))?,
    };
    Ok(Asked {
        filter: HeldFilter {
            thread_id: thread.clone(),
            tool: tool.clone(),
            min_age_ms,
            newest_first: newest,
        },
        page,
        thread: thread.unwrap_or_default(),
        tool: tool.unwrap_or_default(),
        age: age.to_owned(),
        newest,
    })
}

/// `/approvals?...&page=N` with the asked filters (values are of the characters
/// [`read_query`] lets through, and durations, so they need no escaping beyond spaces).
fn link_to(asked: &Asked, page: i64) -> String {
    let mut parts = Vec::new();
    for (key, value) in [
        ("thread", asked.thread.as_str()),
        ("tool", asked.tool.as_str()),
        ("age", asked.age.as_str()),
    ] {
        if !value.is_empty() {
            parts.push(format!("{key}={}", value.replace(' ', "+")));
        }
    }
    if asked.newest {
        parts.push("order=newest".into());
    }
    parts.push(format!("page={page}"));
    format!("/approvals?{}", parts.join("&"))
}
