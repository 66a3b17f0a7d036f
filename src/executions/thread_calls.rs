//! A thread's gated calls as its pull request lists them: one line each, with what was
//! decided (ran, held, blocked, approved or denied by whom). Read through
//! [`crate::session::publish::CallsReader`], since the session sits below this module.

use crate::store::{Conn, params};

use super::store::Status;
use crate::session::publish::{GatedCall, ThreadCalls};
use crate::store::cached_query_row;

/// The pseudo-tool of the execution that anchors a pull request's note on its thread;
/// it is threadgate's own doing, never listed as one of the agent's calls.
pub const PULL_REQUEST_TOOL: &str = "session.pull_request";

/// The first `limit` gated calls of `thread` (oldest first) and how many it has.
pub fn thread_calls(c: &Conn<'_>, thread: &str, limit: usize) -> crate::store::Result<ThreadCalls> {
    let total: i64 = cached_query_row(
        c,
        "SELECT count(*) FROM executions WHERE thread_id = ?1 AND tool <> ?2",
        params![thread, PULL_REQUEST_TOOL],
        |r| r.get(0),
    )?;
    let mut stmt = c.prepare_cached(
        "SELECT tool, summary, verdict, status, reviewer FROM executions \
         WHERE thread_id = ?1 AND tool <> ?2 ORDER BY created_at_ms, id LIMIT ?3",
    )?;
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let rows = stmt.query_map(params![thread, PULL_REQUEST_TOOL, limit], |r| {
        let (verdict, reviewer): (String, Option<String>) = (r.get(2)?, r.get(4)?);
        let status: Status = crate::store::named(r, 3)?;
        Ok(GatedCall {
            tool: r.get(0)?,
            summary: r.get(1)?,
            decision: decision(&verdict, status, reviewer.as_deref()),
        })
    })?;
    Ok(ThreadCalls {
        calls: rows.collect::<crate::store::Result<_>>()?,
        total: usize::try_from(total).unwrap_or_default(),
    })
}

/// What was decided of a call, and what became of it, in a few words.
fn decision(verdict: &str, status: Status, reviewer: Option<&str>) -> String {
    let by = reviewer.unwrap_or("a reviewer");
    let outcome = match status {
        Status::Running => Some("running"),
        Status::Succeeded => Some("succeeded"),
        Status::Failed => Some("failed"),
        Status::NeedsCheck => Some("outcome unknown, needs a check"),
        _ => None,
    };
    match (status, outcome) {
        (Status::Held, _) => "held, waiting for a person".into(),
        (Status::Approved, _) => format!("approved by {by}, not run yet"),
        (Status::Denied, _) => format!("denied by {by}"),
        (Status::Expired, _) => "held, expired undecided".into(),
        (Status::Blocked, _) => "blocked".into(),
        (_, Some(outcome)) if verdict == "hold" => format!("approved by {by}, {outcome}"),
        (_, Some(outcome)) => format!("ran, {outcome}"),
        (_, None) => status.as_str().into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_decision_reads_as_what_happened() {
        let check = |verdict, status, reviewer, expected: &str| {
            assert_eq!(decision(verdict, status, reviewer), expected);
        };
        check("run", Status::Succeeded, None, "ran, succeeded");
        check("hold", Status::Held, None, "held, waiting for a person");
        check("block", Status::Blocked, None, "blocked");
        check(
            "hold",
            Status::Succeeded,
            Some("ana"),
            "approved by ana, succeeded",
        );
        check("hold", Status::Denied, Some("ben"), "denied by ben");
        check("hold", Status::Expired, None, "held, expired undecided");
        check(
            "run",
            Status::NeedsCheck,
            None,
            "ran, outcome unknown, needs a check",
        );
    }
}
