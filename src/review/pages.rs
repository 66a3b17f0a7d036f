//! The review page's handlers: the history, one approval (and deciding it),
//! and a thread's audit trail. Every handler needs a live session; every POST needs the
//! session's CSRF token.

use std::collections::BTreeMap;

use crate::store::Conn;
use askama::Template;
use axum::Form;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;

use super::auth::{self, Signed};
use super::views::{ApprovalView, HistoryRow, OtherCall, TrailRow};
use super::{ReviewState, message, render};
use crate::approvals::{Choice, DecideError};
use crate::executions::store::{self, Execution, Status};
use crate::ids::{ExecutionId, ThreadId};

/// Rows shown in the history and the thread pages.
const PAGE_ROWS: i64 = 200;
/// The longest message a reviewer may send back.
const MAX_MESSAGE: usize = 2000;

#[derive(Template)]
#[template(path = "review/history.html")]
struct HistoryPage<'a> {
    reviewer: &'a str,
    csrf: &'a str,
    banner: &'a str,
    banner_kind: &'a str,
    rows: Vec<HistoryRow>,
}

#[derive(Template)]
#[template(path = "review/approval.html")]
struct ApprovalPage<'a> {
    reviewer: &'a str,
    csrf: &'a str,
    banner: &'a str,
    banner_kind: &'a str,
    a: ApprovalView,
    others: Vec<OtherCall>,
}

#[derive(Template)]
#[template(path = "review/thread.html")]
struct ThreadPage<'a> {
    reviewer: &'a str,
    csrf: &'a str,
    banner: &'a str,
    banner_kind: &'a str,
    thread_id: &'a str,
    thread_url: String,
    rows: Vec<TrailRow>,
}

pub(super) fn internal(who: &Signed, e: impl std::fmt::Display) -> Response {
    tracing::error!(error = %e, "review page failed");
    message(
        StatusCode::INTERNAL_SERVER_ERROR,
        Some(who),
        "Error",
        "Internal error.",
    )
}

/// The thread's customer as recorded with its session.
pub(super) fn customer(c: &Conn<'_>, thread_id: &ThreadId) -> crate::store::Result<String> {
    let row = crate::session::store::get(c, thread_id)?.map(|s| (s.customer_email, s.customer_id));
    Ok(match row {
        Some((Some(email), _)) => email,
        Some((None, Some(id))) => id,
        _ => "unknown".into(),
    })
}

/// `GET /approvals/history`: decided and expired holds, newest first.
pub(super) async fn history(State(state): State<ReviewState>, who: Signed) -> Response {
    let read = state
        .approvals
        .gate
        .db()
        .read(|c| store::decided_holds(c, PAGE_ROWS))
        .await;
    match read {
        Ok(rows) => render(
            StatusCode::OK,
            &HistoryPage {
                reviewer: &who.reviewer.name,
                csrf: &who.csrf,
                banner: "",
                banner_kind: "",
                rows: {
                    let redactor = state.approvals.gate.current_redactor();
                    rows.iter().map(|e| HistoryRow::new(e, &redactor)).collect()
                },
            },
        ),
        Err(e) => internal(&who, e),
    }
}

/// The approval page of `id` with a banner.
async fn approval_page(
    state: &ReviewState,
    who: &Signed,
    id: &str,
    status: StatusCode,
    banner: &str,
    banner_kind: &str,
) -> Response {
    let owned = id.to_owned();
    let read = state
        .approvals
        .gate
        .db()
        .read(move |c| {
            let Some(e) = store::get(c, &owned)? else {
                return Ok(None);
            };
            let others: Vec<Execution> = store::for_thread(c, &e.thread_id, 21)?
                .into_iter()
                .filter(|o| o.id != e.id)
                .take(20)
                .collect();
            let cust = customer(c, &e.thread_id)?;
            Ok(Some((e, others, cust)))
        })
        .await;
    let (e, others, cust) = match read {
        Ok(Some(found)) => found,
        Ok(None) => {
            return message(
                StatusCode::NOT_FOUND,
                Some(who),
                "Not found",
                "No such approval.",
            );
        }
        Err(err) => return internal(who, err),
    };
    let gate = &state.approvals.gate;
    let redactor = gate.current_redactor();
    let policy = gate.current_policy();
    let view = ApprovalView::new(
        &e,
        gate.now(),
        &redactor,
        &policy.hash_hex,
        cust,
        state.thread_link(&e.thread_id),
    );
    let (banner, banner_kind) = match (banner.is_empty(), view.open) {
        (true, false) if view.status == "expired" => (
            "This approval expired: it can no longer be decided.",
            "warn",
        ),
        (true, false) => ("This approval was already decided.", "warn"),
        _ => (banner, banner_kind),
    };
    render(
        status,
        &ApprovalPage {
            reviewer: &who.reviewer.name,
            csrf: &who.csrf,
            banner,
            banner_kind,
            others: others
                .iter()
                .map(|o| OtherCall::new(o, &redactor))
                .collect(),
            a: view,
        },
    )
}

/// `GET /approvals/{id}`: the note's link.
pub(super) async fn approval(
    State(state): State<ReviewState>,
    who: Signed,
    Path(id): Path<String>,
) -> Response {
    approval_page(&state, &who, &id, StatusCode::OK, "", "").await
}

/// The decision form: `csrf`, `decision`, `message` and `lower.<argument>` fields.
struct DecideForm {
    csrf: String,
    decision: Option<Choice>,
    message: Option<String>,
    lower: BTreeMap<String, String>,
}

fn parse_form(fields: Vec<(String, String)>) -> DecideForm {
    let mut form = DecideForm {
        csrf: String::new(),
        decision: None,
        message: None,
        lower: BTreeMap::new(),
    };
    for (k, v) in fields {
        match k.as_str() {
            "csrf" => form.csrf = v,
            "decision" if v == "approve" => form.decision = Some(Choice::Approve),
            "decision" if v == "deny" => form.decision = Some(Choice::Deny),
            "message" => {
                let m = v.trim();
                form.message = (!m.is_empty()).then(|| m.chars().take(MAX_MESSAGE).collect());
            }
            _ => {
                if let Some(arg) = k.strip_prefix("lower.") {
                    form.lower.insert(arg.to_owned(), v);
                }
            }
        }
    }
    form
}

/// `POST /approvals/{id}/decide`.
pub(super) async fn decide(
    State(state): State<ReviewState>,
    who: Signed,
    Path(id): Path<String>,
    Form(fields): Form<Vec<(String, String)>>,
) -> Response {
    let form = parse_form(fields);
    if !auth::same_token(&form.csrf, &who.csrf) {
        return auth::csrf_refused(&who);
    }
    let (status, banner, kind) = match apply_decision(&state, &who, &id, form).await {
        Ok(shown) => shown,
        Err(response) => return *response,
    };
    approval_page(&state, &who, &id, status, &banner, kind).await
}

type Banner = (StatusCode, String, &'static str);

/// Records the form's decision; the banner to show above the approval, or a whole
/// response for a missing approval or an internal error.
async fn apply_decision(
    state: &ReviewState,
    who: &Signed,
    id: &str,
    form: DecideForm,
) -> Result<Banner, Box<Response>> {
    let refused =
        |status, text: String| -> Result<Banner, Box<Response>> { Ok((status, text, "error")) };
    let name = who.reviewer.name.as_str();
    // A text that is no execution id names no approval: answered as one not found.
    let parsed = ExecutionId::parse(id).ok();
    let result = match form.decision {
        None => return refused(StatusCode::BAD_REQUEST, "Choose Approve or Deny.".into()),
        Some(Choice::Deny) => match &parsed {
            Some(exec_id) => state
                .approvals
                .decide(exec_id, name, Choice::Deny, form.message)
                .await
                .map(Ok),
            None => Err(DecideError::NotFound(id.to_owned())),
        },
        Some(Choice::Approve) => {
            let held = match read_call(state, id).await {
                Ok(held) => held,
                Err(e) => {
                    // Unchecked is not "nothing hidden": the approval waits for a read.
                    tracing::error!(execution = id, error = %e, "cannot check what the page hides");
                    return refused(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "The call could not be read back to check it; nothing was approved. Try again.".into(),
                    );
                }
            };
            // A call that does not exist has nothing hidden and no currency: the decision
            // below answers 404 for it.
            let args = match &held {
                Some(e) => {
                    let redactor = state.approvals.gate.current_redactor();
                    let (_, left_out) = super::views::left_out(&redactor, &e.args);
                    if !left_out.is_empty() {
                        return refused(StatusCode::CONFLICT, left_out);
                    }
                    serde_json::from_str(&e.args).unwrap_or(serde_json::Value::Null)
                }
                None => serde_json::Value::Null,
            };
            let lower = match parse_lower(&form.lower, &args) {
                Ok(lower) => lower,
                Err(text) => return refused(StatusCode::UNPROCESSABLE_ENTITY, text),
            };
            match &parsed {
                Some(exec_id) => {
                    state
                        .approvals
                        .approve_narrowed(exec_id, name, form.message, lower)
                        .await
                }
                None => Err(DecideError::NotFound(id.to_owned())),
            }
        }
    };
    match result {
        Ok(Ok(e)) => {
            let verb = if e.status == Status::Denied {
                "Denied"
            } else {
                "Approved"
            };
            Ok((
                StatusCode::OK,
                format!("{verb}. The agent has been told."),
                "ok",
            ))
        }
        Ok(Err(narrowing)) => refused(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("Not approved: {narrowing}."),
        ),
        Err(DecideError::NotFound(_)) => Err(Box::new(message(
            StatusCode::NOT_FOUND,
            Some(who),
            "Not found",
            "No such approval.",
        ))),
        Err(DecideError::Expired { .. }) => Ok((
            StatusCode::GONE,
            "This approval expired before your decision: nothing was done.".into(),
            "warn",
        )),
        Err(DecideError::AlreadyDecided { status, .. }) => Ok((
            StatusCode::CONFLICT,
            already_decided(state, name, id, status).await,
            "warn",
        )),
        Err(DecideError::Store(e)) => Err(Box::new(internal(who, e))),
    }
}

/// The `lower.<argument>` fields in the smallest unit: an amount of money typed in its
/// currency's units ("10.00" USD is 1000), converted exactly; any other argument as a
/// whole number.
fn parse_lower(
    fields: &BTreeMap<String, String>,
    args: &serde_json::Value,
) -> Result<BTreeMap<String, i64>, String> {
    fields
        .iter()
        .map(|(arg, text)| {
            let value = match crate::money::money_arg(args, arg) {
                Some(currency) => currency
                    .parse_units(text)
                    .map_err(|e| format!("{arg}: {e}."))?,
                None => text
                    .trim()
                    .parse::<i64>()
                    .map_err(|_| format!("{arg} must be a whole number (got {text:?})."))?,
            };
            Ok((arg.clone(), value))
        })
        .collect()
}

/// The call `id` as stored, or `None`; a failed read is an error, never "nothing".
async fn read_call(
    state: &ReviewState,
    id: &str,
) -> Result<Option<Execution>, crate::store::StoreError> {
    let owned = id.to_owned();
    state
        .approvals
        .gate
        .db()
        .read(move |c| store::get(c, &owned))
        .await
}

/// Why a decision on an already decided call was not recorded, saying who decided it
/// and when: "You approved this at 14:02 UTC" when it was the same reviewer.
async fn already_decided(state: &ReviewState, me: &str, id: &str, status: &str) -> String {
    let decided = match read_call(state, id).await {
        Ok(Some(e)) => e,
        _ => {
            return format!(
                "This approval was already decided ({status}): your decision was not recorded."
            );
        }
    };
    let verb = match decided.status {
        Status::Denied => "denied",
        Status::Expired => "let expire",
        _ => "approved",
    };
    let at = super::views::when(decided.decided_at_ms);
    match decided.reviewer.as_deref() {
        Some(by) if by == me => {
            format!("You {verb} this at {at}: nothing more was done.")
        }
        Some(by) => format!("{by} already {verb} this at {at}: your decision was not recorded."),
        None => format!("This call {status} at {at}: your decision was not recorded."),
    }
}

/// `GET /threads/{thread_id}`: every audited event of the thread's calls.
pub(super) async fn thread(
    State(state): State<ReviewState>,
    who: Signed,
    Path(thread_id): Path<String>,
) -> Response {
    let t = thread_id.clone();
    let redactor = state.approvals.gate.current_redactor();
    let read = state
        .approvals
        .gate
        .db()
        .read(move |c| trail(c, &t, &redactor))
        .await;
    match read {
        Ok(rows) => render(
            StatusCode::OK,
            &ThreadPage {
                reviewer: &who.reviewer.name,
                csrf: &who.csrf,
                banner: "",
                banner_kind: "",
                thread_url: state.thread_link(&thread_id),
                thread_id: &thread_id,
                rows,
            },
        ),
        Err(e) => internal(&who, e),
    }
}

/// The newest audit rows of `thread_id`, oldest first, read through the audit log's
/// own query.
fn trail(
    c: &Conn<'_>,
    thread_id: &str,
    redactor: &crate::secrets::Redactor,
) -> crate::store::Result<Vec<TrailRow>> {
    let filter = crate::audit::AuditFilter {
        thread_id: Some(thread_id.to_owned()),
        limit: usize::try_from(PAGE_ROWS * 5).ok(),
        ..Default::default()
    };
    let rows = crate::audit::query(c, &filter)?;
    Ok(rows.iter().map(|r| TrailRow::new(r, redactor)).collect())
}
