//! The executions table, cumulative-limit charges and the note outbox: every query
//! the gateway and the approvals service run.

use crate::store::{Conn, OptionalExtension, params};
use serde::Serialize;

use crate::ids::{ExecutionId, SessionId, ThreadId};
use crate::store::{cached_execute, cached_query_row};

/// Where an execution stands. Stored as snake_case text; unknown text read back is an
/// error (`FromStr`), never a status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, strum::IntoStaticStr, strum::EnumString)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum Status {
    /// Decided `run` (directly or after approval) and handed to the connector.
    Running,
    Succeeded,
    /// The provider definitely refused; nothing happened.
    Failed,
    /// Sent to a provider without idempotency keys and its outcome is unknown: a person
    /// must look before anything is sent again.
    NeedsCheck,
    Held,
    Approved,
    Denied,
    Expired,
    Blocked,
}

impl Status {
    /// The name stored in the `status` column.
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// Whether nothing more will happen to the execution.
    pub fn is_final(self) -> bool {
        !matches!(self, Status::Running | Status::Held | Status::Approved)
    }
}

/// One row of the executions table.
#[derive(Debug, Clone, Serialize)]
pub struct Execution {
    pub id: ExecutionId,
    pub session_id: SessionId,
    pub thread_id: ThreadId,
    pub agent: String,
    pub tool: String,
    /// Canonical JSON of the frozen arguments.
    pub args: String,
    pub account: String,
    pub binding_hash: String,
    pub diagnosis: Option<String>,
    pub verdict: String,
    pub because: String,
    pub rule_line: Option<i64>,
    pub policy_hash: String,
    pub status: Status,
    pub summary: Option<String>,
    pub expires_at_ms: Option<i64>,
    pub reviewer: Option<String>,
    pub decision_message: Option<String>,
    pub decided_at_ms: Option<i64>,
    pub result: Option<String>,
    pub error: Option<String>,
    pub attempts: i64,
    pub created_at_ms: i64,
    pub finished_at_ms: Option<i64>,
}

impl Execution {
    /// A row threadgate writes for itself in a session's name (a stop note, the note of a
    /// published pull request): bound to no request, decided and finished at `now_ms`
    /// with `verdict` and `status`.
    pub fn by_threadgate(
        id: &ExecutionId,
        scope: &crate::session::SessionScope,
        tool: &str,
        args: String,
        (verdict, status): (&str, Status),
        because: &str,
        now_ms: i64,
    ) -> Execution {
        Execution {
            id: id.clone(),
            session_id: scope.session_id.clone(),
            thread_id: scope.thread_id.clone(),
            agent: scope.agent.clone(),
            tool: tool.to_owned(),
            args,
            account: String::new(),
            binding_hash: String::new(),
            diagnosis: None,
            verdict: verdict.to_owned(),
            because: because.to_owned(),
            rule_line: None,
            policy_hash: String::new(),
            status,
            summary: None,
            expires_at_ms: None,
            reviewer: None,
            decision_message: None,
            decided_at_ms: Some(now_ms),
            result: None,
            error: None,
            attempts: 0,
            created_at_ms: now_ms,
            finished_at_ms: Some(now_ms),
        }
    }
}

const COLUMNS: &str = "id, session_id, thread_id, agent, tool, args, account, binding_hash, \
    diagnosis, verdict, because, rule_line, policy_hash, status, summary, expires_at_ms, \
    reviewer, decision_message, decided_at_ms, result, error, attempts, created_at_ms, \
    finished_at_ms";

fn row_to_execution(r: &crate::store::Row<'_>) -> crate::store::Result<Execution> {
    Ok(Execution {
        id: r.get(0)?,
        session_id: r.get(1)?,
        thread_id: r.get(2)?,
        agent: r.get(3)?,
        tool: r.get(4)?,
        args: r.get(5)?,
        account: r.get(6)?,
        binding_hash: r.get(7)?,
        diagnosis: r.get(8)?,
        verdict: r.get(9)?,
        because: r.get(10)?,
        rule_line: r.get(11)?,
        policy_hash: r.get(12)?,
        status: crate::store::named(r, 13)?,
        summary: r.get(14)?,
        expires_at_ms: r.get(15)?,
        reviewer: r.get(16)?,
        decision_message: r.get(17)?,
        decided_at_ms: r.get(18)?,
        result: r.get(19)?,
        error: r.get(20)?,
        attempts: r.get(21)?,
        created_at_ms: r.get(22)?,
        finished_at_ms: r.get(23)?,
    })
}

/// Records a new execution.
pub fn insert(conn: &Conn<'_>, e: &Execution) -> crate::store::Result<()> {
    insert_run_by(conn, e, None)
}

/// Records a new execution sent by `runner` (an instance id; `None` for a row no
/// instance sends). A call decided `run` is written with its runner in the one insert,
/// so recovery knows whose it is from the moment it is `running`.
pub fn insert_run_by(
    conn: &Conn<'_>,
    e: &Execution,
    runner: Option<&str>,
) -> crate::store::Result<()> {
    let status = e.status.as_str();
    let (sql, values) = insert_statement(e, (&status, &runner));
    cached_execute(conn, &sql, values)?;
    Ok(())
}

/// The statement that inserts `e` with `status` and `runner`, and its values.
pub(super) fn insert_statement<'a>(
    e: &'a Execution,
    (status, runner): (&'a &'static str, &'a Option<&'a str>),
) -> (String, Vec<&'a dyn crate::store::ToSql>) {
    let sql = format!(
        "INSERT INTO executions ({COLUMNS}, runner) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, \
         ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22, ?23, ?24, ?25)"
    );
    (sql, row_values(e, status, runner, &[]))
}

/// Where a limit charge is written: its table and columns (`charge`'s), for a charge
/// that rides on its execution's insert (`audit::insert_decided`).
pub(super) const CHARGE_INTO: &str = "limit_charges (execution_id, key, amount, at_ms)";

/// The values of an execution's row and its runner, in the order of `COLUMNS, runner`
/// (placeholders ?1 to ?25), followed by `more` (?26 on).
fn row_values<'a>(
    e: &'a Execution,
    status: &'a &'static str,
    runner: &'a Option<&'a str>,
    more: &[&'a dyn crate::store::ToSql],
) -> Vec<&'a dyn crate::store::ToSql> {
    let mut values: Vec<&'a dyn crate::store::ToSql> = vec![
        &e.id,
        &e.session_id,
        &e.thread_id,
        &e.agent,
        &e.tool,
        &e.args,
        &e.account,
        &e.binding_hash,
        &e.diagnosis,
        &e.verdict,
        &e.because,
        &e.rule_line,
        &e.policy_hash,
        status,
        &e.summary,
        &e.expires_at_ms,
        &e.reviewer,
        &e.decision_message,
        &e.decided_at_ms,
        &e.result,
        &e.error,
        &e.attempts,
        &e.created_at_ms,
        &e.finished_at_ms,
        runner,
    ];
    values.extend_from_slice(more);
    values
}

/// The insert of `e`'s row (sent by `runner`) that writes it only while `lease` is the
/// thread's current lease (its `WHERE`, [`fence_clause_shared`](crate::store::leases::fence_clause_shared):
/// no row and nothing changed otherwise), and its values: the lead of
/// [`super::audit::insert_recorded`], sent with no transaction around it.
pub(super) fn insert_if_fenced<'a>(
    dialect: crate::store::Dialect,
    e: &'a Execution,
    (status, runner): (&'a &'static str, &'a Option<&'a str>),
    lease: &'a crate::store::leases::Lease,
) -> (String, Vec<&'a dyn crate::store::ToSql>) {
    let sql = format!(
        "INSERT INTO executions ({COLUMNS}, runner) SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, \
         ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22, ?23, ?24, ?25 \
         WHERE {}",
        crate::store::leases::fence_clause_shared(dialect, 26, 27, 28)
    );
    let fence: [&'a dyn crate::store::ToSql; 3] = [&lease.thread_id, &lease.owner, &lease.token];
    (sql, row_values(e, status, runner, &fence))
}

/// The execution with `id`.
pub fn get(conn: &Conn<'_>, id: &str) -> crate::store::Result<Option<Execution>> {
    cached_query_row(
        conn,
        &format!("SELECT {COLUMNS} FROM executions WHERE id = ?1"),
        [id],
        row_to_execution,
    )
    .optional()
}

/// Executions in `status`, oldest first.
pub fn with_status(conn: &Conn<'_>, status: Status) -> crate::store::Result<Vec<Execution>> {
    let mut stmt = conn.prepare(&format!(
        "SELECT {COLUMNS} FROM executions WHERE status = ?1 ORDER BY created_at_ms, id"
    ))?;
    let rows = stmt.query_map([status.as_str()], row_to_execution)?;
    rows.collect()
}

/// Claims the approved call `id` for `runner` (this instance's id): `approved` to
/// `running` with its runner, in one conditional statement, so of every instance that
/// tries (the decider, another instance's sweep, a restart) exactly one wins. False when
/// it was no longer approved.
pub fn claim_approved(conn: &Conn<'_>, id: &str, runner: &str) -> crate::store::Result<bool> {
    let changed = cached_execute(
        conn,
        "UPDATE executions SET status = 'running', runner = ?2 \
         WHERE id = ?1 AND status = 'approved'",
        params![id, runner],
    )?;
    Ok(changed == 1)
}

/// A running call's runner is not alive at `?2` (`alive_after_ms`): no instance of that
/// id has a heartbeat newer than it (it died, or stopped and deregistered).
const RUNNER_DEAD: &str = "NOT EXISTS (SELECT 1 FROM instances \
     WHERE instances.instance_id = executions.runner AND instances.heartbeat_at_ms > ?2)";

/// A running call as recovery reads it: the row and the instance recorded as sending it.
#[derive(Debug, Clone)]
pub struct RunningCall {
    pub execution: Execution,
    /// `None` for a row written before runners were recorded.
    pub runner: Option<String>,
}

fn row_to_running(r: &crate::store::Row<'_>) -> crate::store::Result<RunningCall> {
    Ok(RunningCall {
        execution: row_to_execution(r)?,
        runner: r.get(24)?,
    })
}

/// The running calls a restart of instance `me` must recover: those its earlier boot
/// was sending, those of an instance whose heartbeat is not newer than `alive_after_ms`
/// (it died), and those with no runner (written before runners were recorded). A call
/// another live instance is sending now is never among them.
pub fn leftover_running(
    conn: &Conn<'_>,
    me: &str,
    alive_after_ms: i64,
) -> crate::store::Result<Vec<RunningCall>> {
    let mut stmt = conn.prepare(&format!(
        "SELECT {COLUMNS}, runner FROM executions WHERE status = 'running' AND (runner IS NULL \
         OR runner = ?1 OR {RUNNER_DEAD}) ORDER BY created_at_ms, id"
    ))?;
    let rows = stmt.query_map(params![me, alive_after_ms], row_to_running)?;
    rows.collect()
}

/// The calls instance `me` is recorded as sending now (`running`, its runner): the
/// approvals' sweep recovers those this process is not sending
/// ([`crate::gateway::gate::Gate::is_sending`]).
pub fn own_running(conn: &Conn<'_>, me: &str) -> crate::store::Result<Vec<Execution>> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {COLUMNS} FROM executions WHERE status = 'running' AND runner = ?1 \
         ORDER BY created_at_ms, id"
    ))?;
    let rows = stmt.query_map(params![me], row_to_execution)?;
    rows.collect()
}

/// The running calls a live instance `me` takes over while it runs (the periodic
/// sweep): those of another instance whose heartbeat is not newer than
/// `alive_after_ms`. Never its own (it is sending them, or its start recovered them),
/// never one with no runner (only a start recovers those), never a live instance's.
pub fn orphaned_running(
    conn: &Conn<'_>,
    me: &str,
    alive_after_ms: i64,
) -> crate::store::Result<Vec<RunningCall>> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {COLUMNS}, runner FROM executions WHERE status = 'running' \
         AND runner IS NOT NULL AND runner <> ?1 AND {RUNNER_DEAD} ORDER BY created_at_ms, id"
    ))?;
    let rows = stmt.query_map(params![me, alive_after_ms], row_to_running)?;
    rows.collect()
}

/// Takes the running call `id` over for `me`: its runner becomes `me` only if it is still
/// running, still recorded as sent by `seen` (the runner recovery read), and `seen` is
/// `me`, no one, or an instance not alive at `alive_after_ms`, all in one conditional
/// statement. Of two instances recovering one dead instance's call at once (two sweeps,
/// a sweep and a start) exactly one wins and re-sends it; a runner that came back to
/// life in between keeps its call.
pub fn take_over(
    conn: &Conn<'_>,
    id: &str,
    seen: Option<&str>,
    me: &str,
    alive_after_ms: i64,
) -> crate::store::Result<bool> {
    let changed = cached_execute(
        conn,
        &format!(
            "UPDATE executions SET runner = ?3 WHERE id = ?1 AND status = 'running' \
             AND (runner = ?4 OR (runner IS NULL AND CAST(?4 AS TEXT) IS NULL)) \
             AND (runner IS NULL OR runner = ?3 OR {RUNNER_DEAD})"
        ),
        params![id, alive_after_ms, me, seen],
    )?;
    Ok(changed == 1)
}

/// Approved calls no instance claimed by `decided_before_ms` (their decider died
/// before running them, or is late): any instance may claim them now.
pub fn unclaimed_approved(
    conn: &Conn<'_>,
    decided_before_ms: i64,
) -> crate::store::Result<Vec<Execution>> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {COLUMNS} FROM executions WHERE status = 'approved' \
         AND coalesce(decided_at_ms, created_at_ms) <= ?1 ORDER BY created_at_ms, id"
    ))?;
    let rows = stmt.query_map([decided_before_ms], row_to_execution)?;
    rows.collect()
}

/// Which held calls the review queue shows, and in which order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeldFilter {
    /// Only this thread's calls.
    pub thread_id: Option<String>,
    /// Only calls of this tool.
    pub tool: Option<String>,
    /// Only calls held at least this long (ms).
    pub min_age_ms: i64,
    /// Newest first instead of oldest first.
    pub newest_first: bool,
}

/// One page of the calls that wait for a person at `now` (held, not past their ttl)
/// under `filter`, and how many there are in all.
pub fn held_page(
    conn: &Conn<'_>,
    filter: &HeldFilter,
    now: i64,
    limit: i64,
    offset: i64,
) -> crate::store::Result<(Vec<Execution>, i64)> {
    const WHERE: &str = "status = 'held' AND (expires_at_ms IS NULL OR expires_at_ms > ?1) \
        AND (CAST(?2 AS TEXT) IS NULL OR thread_id = ?2) \
        AND (CAST(?3 AS TEXT) IS NULL OR tool = ?3) \
        AND created_at_ms <= ?4";
    let born_by = now.saturating_sub(filter.min_age_ms);
    let order = if filter.newest_first {
        "created_at_ms DESC, id DESC"
    } else {
        "created_at_ms, id"
    };
    let args = params![now, filter.thread_id, filter.tool, born_by];
    let total = conn.query_row(
        &format!("SELECT count(*) FROM executions WHERE {WHERE}"),
        args,
        |r| r.get(0),
    )?;
    let mut stmt = conn.prepare(&format!(
        "SELECT {COLUMNS} FROM executions WHERE {WHERE} ORDER BY {order} LIMIT ?5 OFFSET ?6"
    ))?;
    let rows = stmt.query_map(
        params![now, filter.thread_id, filter.tool, born_by, limit, offset],
        row_to_execution,
    )?;
    Ok((rows.collect::<crate::store::Result<_>>()?, total))
}

/// The tools that have calls waiting for a person, by name.
pub fn held_tools(conn: &Conn<'_>) -> crate::store::Result<Vec<String>> {
    let mut stmt =
        conn.prepare("SELECT DISTINCT tool FROM executions WHERE status = 'held' ORDER BY tool")?;
    let rows = stmt.query_map((), |r| r.get(0))?;
    rows.collect()
}

/// A session's execution of the same binding that already succeeded, if any.
pub fn succeeded_binding(
    conn: &Conn<'_>,
    session_id: &str,
    binding_hash: &str,
) -> crate::store::Result<Option<Execution>> {
    cached_query_row(
        conn,
        &format!(
            "SELECT {COLUMNS} FROM executions WHERE session_id = ?1 AND binding_hash = ?2 \
             AND status = 'succeeded' ORDER BY created_at_ms LIMIT 1"
        ),
        params![session_id, binding_hash],
        row_to_execution,
    )
    .optional()
}

/// A session's (`?1`) execution of the same binding (`?2`) still waiting for a person at
/// `?3`: the one predicate of [`pending_binding`] and [`has_pending_binding`].
const PENDING_BINDING: &str = "session_id = ?1 AND binding_hash = ?2 \
     AND status IN ('held', 'approved') AND (expires_at_ms IS NULL OR expires_at_ms > ?3)";

/// What deciding a call must know of its session's earlier calls, read in one
/// statement: what [`succeeded_binding`], [`pending_binding`] and [`held_for_tool`]
/// answer one by one, and the same binding's call still being sent or in doubt.
#[derive(Debug, Default)]
pub struct EarlierCalls {
    /// The session's succeeded execution of the same binding (the oldest).
    pub succeeded: Option<Execution>,
    /// The session's execution of the same binding still waiting for a person.
    pub pending: Option<Execution>,
    /// The id of the session's oldest call to the same tool held for a person.
    pub held_for_tool: Option<String>,
    /// The session's execution of the same binding still being sent, or whose outcome
    /// is unknown until a person checks it (`needs_check`), the oldest: an identical
    /// write is answered from it (after waiting for a running one) instead of being
    /// sent again under a key of its own.
    pub unsettled: Option<Execution>,
}

/// The session's earlier calls that decide a new call of `tool` with `binding_hash` at
/// `now_ms` (see [`EarlierCalls`]), in one round trip.
pub fn earlier_calls(
    conn: &Conn<'_>,
    session_id: &str,
    binding_hash: &str,
    tool: &str,
    now_ms: i64,
) -> crate::store::Result<EarlierCalls> {
    let sql = format!(
        "SELECT s.*, 1 FROM (SELECT {COLUMNS} FROM executions WHERE session_id = ?1 \
         AND binding_hash = ?2 AND status = 'succeeded' ORDER BY created_at_ms LIMIT 1) AS s \
         UNION ALL \
         SELECT p.*, 2 FROM (SELECT {COLUMNS} FROM executions WHERE {PENDING_BINDING} \
         ORDER BY created_at_ms LIMIT 1) AS p \
         UNION ALL \
         SELECT h.*, 3 FROM (SELECT {COLUMNS} FROM executions WHERE session_id = ?1 \
         AND tool = ?4 AND status = 'held' AND expires_at_ms > ?3 ORDER BY created_at_ms \
         LIMIT 1) AS h \
         UNION ALL \
         SELECT r.*, 4 FROM (SELECT {COLUMNS} FROM executions WHERE session_id = ?1 \
         AND binding_hash = ?2 AND status IN ('running', 'needs_check') \
         ORDER BY created_at_ms LIMIT 1) AS r"
    );
    let mut stmt = conn.prepare_cached(&sql)?;
    let mut rows = stmt.query(params![session_id, binding_hash, now_ms, tool])?;
    let mut found = EarlierCalls::default();
    while let Some(row) = rows.next()? {
        let which: i64 = row.get(24)?;
        match which {
            1 => found.succeeded = Some(row_to_execution(&row)?),
            2 => found.pending = Some(row_to_execution(&row)?),
            3 => found.held_for_tool = Some(row.get(0)?),
            _ => found.unsettled = Some(row_to_execution(&row)?),
        }
    }
    Ok(found)
}

/// A session's execution of the same binding still waiting for a person, if any.
pub fn pending_binding(
    conn: &Conn<'_>,
    session_id: &str,
    binding_hash: &str,
    now_ms: i64,
) -> crate::store::Result<Option<Execution>> {
    cached_query_row(
        conn,
        &format!("SELECT {COLUMNS} FROM executions WHERE {PENDING_BINDING} ORDER BY created_at_ms LIMIT 1"),
        params![session_id, binding_hash, now_ms],
        row_to_execution,
    )
    .optional()
}

/// Whether the session has a call of the same binding still waiting for a person (the
/// read path's cheap question; [`pending_binding`] fetches it).
pub fn has_pending_binding(
    conn: &Conn<'_>,
    session_id: &str,
    binding_hash: &str,
    now_ms: i64,
) -> crate::store::Result<bool> {
    cached_query_row(
        conn,
        &format!("SELECT EXISTS (SELECT 1 FROM executions WHERE {PENDING_BINDING})"),
        params![session_id, binding_hash, now_ms],
        |r| r.get(0),
    )
}

/// The sessions that have a held or approved execution (at start, for the gate's hold
/// marks).
pub fn sessions_with_pending(conn: &Conn<'_>) -> crate::store::Result<Vec<String>> {
    let mut stmt = conn.prepare(
        "SELECT DISTINCT session_id FROM executions WHERE status IN ('held', 'approved')",
    )?;
    let rows = stmt.query_map((), |r| r.get(0))?;
    rows.collect()
}

/// Whether `session_id` has a held or approved execution.
pub fn session_has_pending(conn: &Conn<'_>, session_id: &str) -> crate::store::Result<bool> {
    cached_query_row(
        conn,
        "SELECT EXISTS (SELECT 1 FROM executions WHERE session_id = ?1 \
         AND status IN ('held', 'approved'))",
        [session_id],
        |r| r.get(0),
    )
}

/// How many of the session's calls are held and unexpired at `now_ms`.
pub fn held_count(conn: &Conn<'_>, session_id: &str, now_ms: i64) -> crate::store::Result<usize> {
    cached_query_row(
        conn,
        "SELECT count(*) FROM executions WHERE session_id = ?1 AND status = 'held' \
         AND expires_at_ms > ?2",
        params![session_id, now_ms],
        |r| r.get::<_, i64>(0),
    )
    .map(|n| usize::try_from(n).unwrap_or(usize::MAX))
}

/// The id of a held, unexpired call to `tool` in the session, if any.
pub fn held_for_tool(
    conn: &Conn<'_>,
    session_id: &str,
    tool: &str,
    now_ms: i64,
) -> crate::store::Result<Option<String>> {
    cached_query_row(
        conn,
        "SELECT id FROM executions WHERE session_id = ?1 AND tool = ?2 AND status = 'held' \
         AND expires_at_ms > ?3 ORDER BY created_at_ms LIMIT 1",
        params![session_id, tool, now_ms],
        |r| r.get(0),
    )
    .optional()
}

/// Moves an execution from `from` to `to`; false when it was not in `from` (someone
/// else moved it first). This compare-and-set is what makes approvals run once.
pub fn transition(
    conn: &Conn<'_>,
    id: &str,
    from: Status,
    to: Status,
) -> crate::store::Result<bool> {
    let changed = cached_execute(
        conn,
        "UPDATE executions SET status = ?3 WHERE id = ?1 AND status = ?2",
        params![id, from.as_str(), to.as_str()],
    )?;
    Ok(changed == 1)
}

/// Replaces a held call's frozen arguments, binding and summary (a narrowed approval); false when
/// it is no longer held.
pub fn narrow_held(
    conn: &Conn<'_>,
    id: &str,
    canonical_args: &str,
    binding_hash: &str,
    summary: &str,
) -> crate::store::Result<bool> {
    let changed = cached_execute(
        conn,
        "UPDATE executions SET args = ?2, binding_hash = ?3, summary = ?4 \
         WHERE id = ?1 AND status = 'held'",
        params![id, canonical_args, binding_hash, summary],
    )?;
    Ok(changed == 1)
}

/// Records a person's decision on a held call.
pub fn record_decision(
    conn: &Conn<'_>,
    id: &str,
    to: Status,
    reviewer: &str,
    message: Option<&str>,
    now_ms: i64,
) -> crate::store::Result<bool> {
    let changed = cached_execute(
        conn,
        "UPDATE executions SET status = ?2, reviewer = ?3, decision_message = ?4, \
         decided_at_ms = ?5 WHERE id = ?1 AND status = 'held'",
        params![id, to.as_str(), reviewer, message, now_ms],
    )?;
    Ok(changed == 1)
}

/// Records how the running call `id` that `runner` (this instance's id) sent ended:
/// only while it is still running and still `runner`'s, or marked `needs_check` (the
/// real outcome of a call whose runner was read as dead and came back beats "a person
/// must check"). An outcome of a call another instance took over and is sending, or
/// whose outcome is recorded, is refused by the database and writes nothing
/// ([`OutcomeRefused`]): the taker's outcome stands.
pub fn finish(
    conn: &Conn<'_>,
    id: &str,
    runner: &str,
    (status, result, error): (Status, Option<&str>, Option<&str>),
    now_ms: i64,
) -> crate::store::Result<()> {
    let changed = cached_execute(
        conn,
        FINISH,
        params![id, status.as_str(), result, error, now_ms, runner],
    )?;
    if changed == 0 {
        return Err(OutcomeRefused { id: id.to_owned() }.into());
    }
    Ok(())
}

/// [`finish`]'s statement: `?1` the id, then status, result, error, the time and the
/// runner it must still be.
pub(super) const FINISH: &str = "UPDATE executions SET status = ?2, result = ?3, error = ?4, \
     finished_at_ms = ?5, attempts = attempts + 1 \
     WHERE id = ?1 AND ((status = 'running' AND runner = ?6) OR status = 'needs_check')";

/// Blocks the approved call `id` that the current policy now blocks (`reason`), before
/// it is claimed: only while it is still `approved`. Whether it was blocked.
pub fn block_approved(
    conn: &Conn<'_>,
    id: &str,
    reason: &str,
    now_ms: i64,
) -> crate::store::Result<bool> {
    let changed = cached_execute(
        conn,
        "UPDATE executions SET status = 'blocked', error = ?2, finished_at_ms = ?3 \
         WHERE id = ?1 AND status = 'approved'",
        params![id, reason, now_ms],
    )?;
    Ok(changed == 1)
}

impl From<OutcomeRefused> for crate::store::SqlError {
    fn from(refused: OutcomeRefused) -> Self {
        crate::store::SqlError::other(refused)
    }
}

/// An outcome refused because its call is not running on this instance any more:
/// another instance took it over and is sending it, its outcome is recorded, or a
/// person removed its row.
#[derive(Debug, thiserror::Error)]
#[error(
    "execution {id} is not running on this instance (another instance took it over, its outcome is already recorded, or its row is gone); this outcome is not recorded"
)]
pub struct OutcomeRefused {
    pub id: String,
}

/// Marks the running call `id` that `runner` took over for a person to check
/// (`needs_check`, with `reason`): only while it is still running and still `runner`'s,
/// so an outcome its earlier runner recorded meanwhile stands. Whether it was marked.
pub fn mark_needs_check(
    conn: &Conn<'_>,
    id: &str,
    runner: &str,
    reason: &str,
    now_ms: i64,
) -> crate::store::Result<bool> {
    let changed = cached_execute(
        conn,
        "UPDATE executions SET status = 'needs_check', error = ?3, finished_at_ms = ?4, \
         attempts = attempts + 1 WHERE id = ?1 AND status = 'running' AND runner = ?2",
        params![id, runner, reason, now_ms],
    )?;
    Ok(changed == 1)
}

/// Held calls whose ttl has passed.
pub fn expired_holds(conn: &Conn<'_>, now_ms: i64) -> crate::store::Result<Vec<Execution>> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {COLUMNS} FROM executions WHERE status = 'held' AND expires_at_ms <= ?1"
    ))?;
    let rows = stmt.query_map([now_ms], row_to_execution)?;
    rows.collect()
}

/// The total of unreleased charges on `key` since `since_ms`. In a
/// [`crate::store::Db::write_locking`] transaction (the gate's decision, the only one
/// that charges) it is read under the key's lock ([`Conn::lock_name`], held to the end
/// of the transaction), so a decision that reads a total and then charges against it
/// is the only one doing so for that key until it ends, and it sees every charge
/// committed before. Elsewhere it is read on the caller's snapshot: a SERIALIZABLE
/// reader (an approval's re-decision) may miss a charge a locking decision committed
/// meanwhile and is then ordered before it, which is harmless because a re-decision
/// only reads totals and never charges.
pub fn charged_total(conn: &Conn<'_>, key: &str, since_ms: i64) -> crate::store::Result<i64> {
    conn.lock_name(&format!("limit:{key}"))?;
    cached_query_row(
        conn,
        "SELECT coalesce(sum(amount), 0) FROM limit_charges WHERE key = ?1 AND at_ms > ?2 \
         AND released = 0",
        params![key, since_ms],
        |r| r.get(0),
    )
}

/// Counts `amount` against `key` for an execution.
pub fn charge(
    conn: &Conn<'_>,
    execution_id: &str,
    key: &str,
    amount: i64,
    now_ms: i64,
) -> crate::store::Result<()> {
    cached_execute(
        conn,
        &format!("INSERT INTO {CHARGE_INTO} VALUES (?1, ?2, ?3, ?4)"),
        params![execution_id, key, amount, now_ms],
    )?;
    Ok(())
}

/// Gives back an execution's charges (the provider definitely refused the call).
pub fn release_charges(conn: &Conn<'_>, execution_id: &str) -> crate::store::Result<()> {
    cached_execute(
        conn,
        "UPDATE limit_charges SET released = 1 WHERE execution_id = ?1",
        [execution_id],
    )?;
    Ok(())
}

/// A note waiting to reach Plain.
#[derive(Debug, Clone)]
pub struct OutboxNote {
    pub execution_id: ExecutionId,
    pub thread_id: ThreadId,
    pub marker: String,
    pub text: String,
    pub markdown: String,
    pub attempts: i64,
}

/// Queues a note (in the transaction that held the call).
pub fn enqueue_note(conn: &Conn<'_>, note: &OutboxNote, now_ms: i64) -> crate::store::Result<()> {
    cached_execute(
        conn,
        "INSERT INTO note_outbox (execution_id, thread_id, marker, text, markdown, \
         next_attempt_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![
            note.execution_id,
            note.thread_id,
            note.marker,
            note.text,
            note.markdown,
            now_ms
        ],
    )?;
    Ok(())
}

/// Notes due for an attempt, fairly across threads: at most `per_thread` of each
/// thread (its oldest), taken round by round (every thread's oldest first, then every
/// thread's second, ...), `limit` in all. A thread with a backlog cannot keep another
/// thread's note waiting behind it.
pub fn due_notes(
    conn: &Conn<'_>,
    now_ms: i64,
    per_thread: i64,
    limit: i64,
) -> crate::store::Result<Vec<OutboxNote>> {
    let mut stmt = conn.prepare_cached(
        "SELECT execution_id, thread_id, marker, text, markdown, attempts FROM ( \
           SELECT *, row_number() OVER ( \
             PARTITION BY thread_id ORDER BY next_attempt_ms, execution_id) AS turn \
           FROM note_outbox WHERE sent_at_ms IS NULL AND next_attempt_ms <= ?1) AS due \
         WHERE turn <= ?2 ORDER BY turn, next_attempt_ms, execution_id LIMIT ?3",
    )?;
    let rows = stmt.query_map(params![now_ms, per_thread, limit], |r| {
        Ok(OutboxNote {
            execution_id: r.get(0)?,
            thread_id: r.get(1)?,
            marker: r.get(2)?,
            text: r.get(3)?,
            markdown: r.get(4)?,
            attempts: r.get(5)?,
        })
    })?;
    rows.collect()
}

/// Takes the notes [`due_notes`] names for one drainer. On Postgres, where several
/// instances drain, each one's next attempt moves to `until_ms`, so another drainer does
/// not take it meanwhile (a note another drainer's transaction holds is skipped: `FOR
/// UPDATE SKIP LOCKED`), and one whose drainer crashed mid-send is taken again after
/// that. On SQLite one process drains and its single writer runs claims one after the
/// other: the due notes are its own, and one left by a crash is due again at restart.
pub fn claim_notes(
    conn: &Conn<'_>,
    now_ms: i64,
    (per_thread, limit): (i64, i64),
    until_ms: i64,
) -> crate::store::Result<Vec<OutboxNote>> {
    let due = due_notes(conn, now_ms, per_thread, limit)?;
    if conn.dialect() == crate::store::Dialect::Sqlite {
        return Ok(due);
    }
    let check = "SELECT 1 FROM note_outbox WHERE execution_id = ?1 AND sent_at_ms IS NULL \
                 AND next_attempt_ms <= ?2 FOR UPDATE SKIP LOCKED";
    let mut claimed = Vec::with_capacity(due.len());
    for note in due {
        if !conn
            .prepare_cached(check)?
            .exists(params![note.execution_id, now_ms])?
        {
            continue;
        }
        cached_execute(
            conn,
            "UPDATE note_outbox SET next_attempt_ms = ?2 WHERE execution_id = ?1",
            params![note.execution_id, until_ms],
        )?;
        claimed.push(note);
    }
    Ok(claimed)
}

/// Records that Plain has the note.
pub fn note_sent(conn: &Conn<'_>, execution_id: &str, now_ms: i64) -> crate::store::Result<()> {
    cached_execute(
        conn,
        "UPDATE note_outbox SET sent_at_ms = ?2 WHERE execution_id = ?1",
        params![execution_id, now_ms],
    )?;
    Ok(())
}

/// Records a failed attempt and when to try again.
pub fn note_failed(
    conn: &Conn<'_>,
    execution_id: &str,
    error: &str,
    next_attempt_ms: i64,
) -> crate::store::Result<()> {
    cached_execute(
        conn,
        "UPDATE note_outbox SET last_error = ?2, next_attempt_ms = ?3 \
         WHERE execution_id = ?1",
        params![execution_id, error, next_attempt_ms],
    )?;
    Ok(())
}

/// Marks the attempt as started before sending, so a crash mid-send is known on restart
/// (the outbox then looks for the note on the thread before sending again).
pub fn note_attempting(conn: &Conn<'_>, execution_id: &str) -> crate::store::Result<()> {
    cached_execute(
        conn,
        "UPDATE note_outbox SET attempts = attempts + 1 WHERE execution_id = ?1",
        [execution_id],
    )?;
    Ok(())
}

/// Held calls that were decided or expired, newest first (the review page's history).
pub fn decided_holds(conn: &Conn<'_>, limit: i64) -> crate::store::Result<Vec<Execution>> {
    let mut stmt = conn.prepare(&format!(
        "SELECT {COLUMNS} FROM executions WHERE verdict = 'hold' AND status != 'held' \
         ORDER BY coalesce(decided_at_ms, finished_at_ms, created_at_ms) DESC, id DESC LIMIT ?1"
    ))?;
    let rows = stmt.query_map([limit], row_to_execution)?;
    rows.collect()
}

/// A thread's executions, newest first.
pub fn for_thread(
    conn: &Conn<'_>,
    thread_id: &str,
    limit: i64,
) -> crate::store::Result<Vec<Execution>> {
    let mut stmt = conn.prepare(&format!(
        "SELECT {COLUMNS} FROM executions WHERE thread_id = ?1 \
         ORDER BY created_at_ms DESC, id DESC LIMIT ?2"
    ))?;
    let rows = stmt.query_map(params![thread_id, limit], row_to_execution)?;
    rows.collect()
}

/// The agent's latest internal note that ran on `thread`, else its latest diagnosis
/// (what a draft pull request carries).
pub fn latest_finding(c: &Conn<'_>, thread: &str) -> crate::store::Result<Option<String>> {
    let note: Option<String> = c
        .query_row(
            "SELECT args FROM executions WHERE thread_id = ?1 AND tool = 'helpdesk.add_note' \
             AND status = 'succeeded' ORDER BY created_at_ms DESC, id DESC LIMIT 1",
            [thread],
            |r| r.get(0),
        )
        .optional()?;
    if let Some(text) = note
        .and_then(|args| serde_json::from_str::<serde_json::Value>(&args).ok())
        .and_then(|args| args.get("text").and_then(|t| t.as_str()).map(str::to_owned))
    {
        return Ok(Some(text));
    }
    cached_query_row(
        c,
        "SELECT diagnosis FROM executions WHERE thread_id = ?1 AND diagnosis IS NOT NULL \
         AND diagnosis <> '' ORDER BY created_at_ms DESC, id DESC LIMIT 1",
        [thread],
        |r| r.get(0),
    )
    .optional()
}

/// How many calls are held, and when the oldest of them was made.
pub fn held_summary(conn: &Conn<'_>) -> crate::store::Result<(i64, Option<i64>)> {
    cached_query_row(
        conn,
        "SELECT count(*), min(created_at_ms) FROM executions WHERE status = 'held'",
        (),
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
}

/// How many notes wait to reach Plain.
pub fn outbox_backlog(conn: &Conn<'_>) -> crate::store::Result<i64> {
    cached_query_row(
        conn,
        "SELECT count(*) FROM note_outbox WHERE sent_at_ms IS NULL",
        (),
        |r| r.get(0),
    )
}

#[cfg(test)]
mod tests {
    use super::Status;
    use crate::store::testing::each_backend;

    /// Of the running calls, a restart of `me` recovers its own, a dead instance's and
    /// those with no runner; never one a live instance is sending. On every backend.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_restart_recovers_no_call_another_live_instance_is_sending() {
        let dir = tempfile::tempdir().unwrap();
        for backend in each_backend(dir.path()) {
            let db = backend.open().unwrap();
            db.write(|c| {
                for (id, status) in [
                    ("ex_mine", "running"),
                    ("ex_live", "running"),
                    ("ex_dead", "running"),
                    ("ex_old", "running"),
                    ("ex_gone", "running"),
                    ("ex_done", "succeeded"),
                ] {
                    c.execute(
                        "INSERT INTO executions (id, session_id, thread_id, agent, tool, args, \
                         account, binding_hash, verdict, because, policy_hash, status, \
                         created_at_ms) VALUES (?1, 's_1', 'th_1', 'support', \
                         'stripe.create_refund', '{}', 'default', 'h', 'run', 'rule', 'p', ?2, 1)",
                        crate::store::params![id, status],
                    )?;
                }
                for (id, runner) in [
                    ("ex_mine", "me"),
                    ("ex_live", "live"),
                    ("ex_dead", "dead"),
                    ("ex_gone", "deregistered"),
                ] {
                    c.execute(
                        "UPDATE executions SET runner = ?2 WHERE id = ?1",
                        crate::store::params![id, runner],
                    )?;
                }
                for (instance, heartbeat) in [("me", 10_000), ("live", 9_500), ("dead", 2_000)] {
                    c.execute(
                        "INSERT INTO instances (instance_id, boot_nonce, started_at_ms, \
                         heartbeat_at_ms) VALUES (?1, 'n', 0, ?2)",
                        crate::store::params![instance, heartbeat],
                    )?;
                }
                Ok(())
            })
            .await
            .unwrap();
            // Alive: a heartbeat newer than 5,000 (now 10,000, lease 5,000).
            let left = db
                .read(|c| super::leftover_running(c, "me", 5_000))
                .await
                .unwrap();
            let mut ids: Vec<String> = left.iter().map(|e| e.execution.id.to_string()).collect();
            ids.sort();
            let kind = kind(&backend);
            assert_eq!(ids, ["ex_dead", "ex_gone", "ex_mine", "ex_old"], "{kind}");
            let runner_of = |id: &str| {
                left.iter()
                    .find(|e| e.execution.id.as_str() == id)
                    .and_then(|e| e.runner.clone())
            };
            assert_eq!(runner_of("ex_dead").as_deref(), Some("dead"), "{kind}");
            assert_eq!(runner_of("ex_old"), None, "{kind}");
        }
    }

    fn kind(backend: &crate::store::testing::TestDb) -> &'static str {
        if backend.url().is_some() {
            "postgres"
        } else {
            "sqlite"
        }
    }

    /// A row as the gate writes it: `id` in `status`, decided at `decided_at`.
    fn row(id: &str, status: Status, decided_at: Option<i64>) -> super::Execution {
        let scope = crate::session::SessionScope {
            session_id: crate::ids::SessionId::parse("s_1").unwrap(),
            thread_id: crate::ids::ThreadId::parse("th_1").unwrap(),
            agent: "support".into(),
            customer_id: None,
            customer_email: None,
            lease: crate::store::leases::Lease {
                thread_id: crate::ids::ThreadId::parse("th_1").unwrap(),
                owner: "inst".into(),
                token: 1,
            },
        };
        let mut e = super::Execution::by_threadgate(
            &crate::ids::ExecutionId::parse(id).unwrap(),
            &scope,
            "stripe.create_refund",
            "{}".into(),
            ("hold", status),
            "rule",
            1_000,
        );
        e.decided_at_ms = decided_at;
        e.finished_at_ms = None;
        e
    }

    async fn runner(db: &crate::store::Db, id: &'static str) -> (String, Option<String>) {
        db.read(move |c| {
            c.query_row(
                "SELECT status, runner FROM executions WHERE id = ?1",
                [id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
        })
        .await
        .unwrap()
    }

    /// The sweep's statements, on every backend: a call decided `run` is written with
    /// its runner in the insert; an approved call is claimed with its runner by exactly
    /// one of the instances trying; only approved calls past the grace are unclaimed;
    /// a dead runner's call is listed to every other instance and taken over by exactly
    /// one, a live runner's never, and a runner that came back keeps its call.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_sweep_claims_and_takes_over_once_and_never_from_a_live_runner() {
        let dir = tempfile::tempdir().unwrap();
        for backend in each_backend(dir.path()) {
            let kind = kind(&backend);
            let db = backend.open().unwrap();
            db.write(|c| {
                super::insert_run_by(c, &row("ex_run", Status::Running, None), Some("inst_a"))?;
                super::insert(c, &row("ex_new", Status::Approved, Some(9_800)))?;
                super::insert(c, &row("ex_late", Status::Approved, Some(5_000)))?;
                super::insert(c, &row("ex_old", Status::Approved, None))?;
                super::insert(c, &row("ex_held", Status::Held, None))?;
                super::insert_run_by(c, &row("ex_orph", Status::Running, None), Some("dead"))?;
                super::insert_run_by(c, &row("ex_live", Status::Running, None), Some("inst_b"))?;
                for (instance, heartbeat) in [("inst_a", 9_900), ("inst_b", 9_900), ("dead", 100)] {
                    c.execute(
                        "INSERT INTO instances (instance_id, boot_nonce, started_at_ms, \
                         heartbeat_at_ms) VALUES (?1, 'n', 0, ?2)",
                        crate::store::params![instance, heartbeat],
                    )?;
                }
                Ok(())
            })
            .await
            .unwrap();
            assert_eq!(
                runner(&db, "ex_run").await,
                ("running".into(), Some("inst_a".into())),
                "{kind}"
            );

            // Now 10,000, grace 1,000: the call decided at 9,800 is its decider's still.
            let due = db
                .read(|c| super::unclaimed_approved(c, 9_000))
                .await
                .unwrap();
            let mut due: Vec<String> = due.iter().map(|e| e.id.to_string()).collect();
            due.sort();
            assert_eq!(due, ["ex_late", "ex_old"], "{kind}");

            // Two instances claim ex_late at once: one wins, with its runner.
            let (a, b) = (db.clone(), backend.open().unwrap());
            let claims = tokio::join!(
                a.write(|c| super::claim_approved(c, "ex_late", "inst_a")),
                b.write(|c| super::claim_approved(c, "ex_late", "inst_b")),
            );
            let (won_a, won_b) = (claims.0.unwrap(), claims.1.unwrap());
            assert!(won_a ^ won_b, "{kind}: exactly one claim wins");
            let winner = if won_a { "inst_a" } else { "inst_b" };
            assert_eq!(
                runner(&db, "ex_late").await,
                ("running".into(), Some(winner.into())),
                "{kind}"
            );
            // A held call is never claimed.
            assert!(
                !db.write(|c| super::claim_approved(c, "ex_held", "inst_a"))
                    .await
                    .unwrap(),
                "{kind}"
            );

            // The current policy blocks an approved call only while it is approved: a
            // claimed one runs, a held one waits for its person.
            for (id, blocked) in [("ex_late", false), ("ex_held", false), ("ex_old", true)] {
                let done = db
                    .write(move |c| super::block_approved(c, id, "blocked now", 9_000))
                    .await
                    .unwrap();
                assert_eq!(done, blocked, "{kind} {id}");
            }
            assert_eq!(runner(&db, "ex_old").await.0, "blocked", "{kind}");
            let twice = db
                .write(|c| super::block_approved(c, "ex_old", "again", 9_001))
                .await
                .unwrap();
            assert!(!twice, "{kind}: blocked once");

            // Alive: a heartbeat newer than 5,000. Each live instance sees the dead
            // one's call, never its own or another live one's.
            for me in ["inst_a", "inst_b"] {
                let orphans = db
                    .read(move |c| super::orphaned_running(c, me, 5_000))
                    .await
                    .unwrap();
                let ids: Vec<(String, Option<String>)> = orphans
                    .iter()
                    .map(|o| (o.execution.id.to_string(), o.runner.clone()))
                    .collect();
                assert_eq!(
                    ids,
                    [("ex_orph".into(), Some("dead".into()))],
                    "{kind} {me}"
                );
            }
            // Both take it over at once: one wins.
            let takes = tokio::join!(
                a.write(|c| super::take_over(c, "ex_orph", Some("dead"), "inst_a", 5_000)),
                b.write(|c| super::take_over(c, "ex_orph", Some("dead"), "inst_b", 5_000)),
            );
            let (took_a, took_b) = (takes.0.unwrap(), takes.1.unwrap());
            assert!(took_a ^ took_b, "{kind}: exactly one take-over wins");
            let taker = if took_a { "inst_a" } else { "inst_b" };
            assert_eq!(
                runner(&db, "ex_orph").await,
                ("running".into(), Some(taker.into())),
                "{kind}"
            );
            // A live runner's call is never taken, whatever the caller saw.
            assert!(
                !db.write(|c| super::take_over(c, "ex_live", Some("inst_b"), "inst_a", 5_000))
                    .await
                    .unwrap(),
                "{kind}"
            );
            // A runner read as dead that came back (a new heartbeat) keeps its call.
            db.write(|c| {
                super::insert_run_by(c, &row("ex_back", Status::Running, None), Some("dead"))?;
                c.execute(
                    "UPDATE instances SET heartbeat_at_ms = 9950 WHERE instance_id = 'dead'",
                    (),
                )?;
                Ok(())
            })
            .await
            .unwrap();
            assert!(
                !db.write(|c| super::take_over(c, "ex_back", Some("dead"), "inst_a", 5_000))
                    .await
                    .unwrap(),
                "{kind}"
            );
            // A call that finished meanwhile is not taken over. Its outcome is written
            // only by its runner, and only once.
            let done = (Status::Succeeded, None, None);
            let not_its_runner = db
                .write(move |c| super::finish(c, "ex_live", "inst_a", done, 9_990))
                .await;
            assert!(not_its_runner.is_err(), "{kind}: another runner's outcome");
            assert_eq!(runner(&db, "ex_live").await.0, "running", "{kind}");
            db.write(move |c| super::finish(c, "ex_live", "inst_b", done, 9_990))
                .await
                .unwrap();
            let again = (Status::Failed, None, Some("late"));
            let twice = db
                .write(move |c| super::finish(c, "ex_live", "inst_b", again, 9_991))
                .await;
            assert!(twice.is_err(), "{kind}: an outcome is recorded once");
            db.write(|c| {
                c.execute(
                    "UPDATE instances SET heartbeat_at_ms = 0 WHERE instance_id = 'inst_b'",
                    (),
                )
            })
            .await
            .unwrap();
            assert!(
                !db.write(|c| super::take_over(c, "ex_live", Some("inst_b"), "inst_a", 5_000))
                    .await
                    .unwrap(),
                "{kind}"
            );
            // A row with no runner is taken only by a caller that saw none (a start).
            db.write(|c| super::insert(c, &row("ex_legacy", Status::Running, None)))
                .await
                .unwrap();
            assert!(
                db.write(|c| super::take_over(c, "ex_legacy", None, "inst_a", 5_000))
                    .await
                    .unwrap(),
                "{kind}"
            );
            assert!(
                !db.write(|c| super::take_over(c, "ex_legacy", None, "inst_b", 5_000))
                    .await
                    .unwrap(),
                "{kind}: taken once"
            );
            // Only the instance that took a call over marks it or records its outcome,
            // and only while running: the one read as dead that comes back late with
            // its outcome is refused by the database, and nothing of it is written.
            let loser = if took_a { "inst_b" } else { "inst_a" };
            let late = db
                .write(move |c| super::finish(c, "ex_orph", "dead", done, 9_995))
                .await
                .unwrap_err();
            assert!(
                late.to_string().contains("another instance took it over"),
                "{kind}: {late}"
            );
            assert_eq!(
                runner(&db, "ex_orph").await,
                ("running".into(), Some(taker.into())),
                "{kind}: the late outcome wrote nothing"
            );
            assert!(
                !db.write(move |c| super::mark_needs_check(c, "ex_orph", loser, "r", 9_999))
                    .await
                    .unwrap(),
                "{kind}"
            );
            assert!(
                db.write(move |c| super::mark_needs_check(c, "ex_orph", taker, "r", 9_999))
                    .await
                    .unwrap(),
                "{kind}"
            );
            assert_eq!(runner(&db, "ex_orph").await.0, "needs_check", "{kind}");
            // The earlier runner coming back with the real outcome replaces "a person
            // must check" (and only that: a recorded outcome stands, below).
            db.write(move |c| super::finish(c, "ex_orph", "dead", done, 10_000))
                .await
                .unwrap();
            assert_eq!(runner(&db, "ex_orph").await.0, "succeeded", "{kind}");
            assert!(
                !db.write(|c| super::mark_needs_check(c, "ex_live", "inst_b", "r", 9_999))
                    .await
                    .unwrap(),
                "{kind}: a recorded outcome stands"
            );
            assert_eq!(runner(&db, "ex_live").await.0, "succeeded", "{kind}");
        }
    }

    /// `earlier_calls` answers, in one statement, what `succeeded_binding`,
    /// `pending_binding` and `held_for_tool` answer one by one. On every backend.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn earlier_calls_answer_what_the_three_lookups_answer() {
        let dir = tempfile::tempdir().unwrap();
        for backend in each_backend(dir.path()) {
            let db = backend.open().unwrap();
            db.write(|c| {
                // (id, session, tool, binding, status, expires, created)
                for (id, session, tool, binding, status, expires, created) in [
                    (
                        "ex_done1",
                        "s_1",
                        "stripe.create_refund",
                        "b1",
                        "succeeded",
                        None,
                        5_i64,
                    ),
                    (
                        "ex_done0",
                        "s_1",
                        "stripe.create_refund",
                        "b1",
                        "succeeded",
                        None,
                        3,
                    ),
                    (
                        "ex_held",
                        "s_1",
                        "stripe.create_refund",
                        "b2",
                        "held",
                        Some(9_000_i64),
                        4,
                    ),
                    (
                        "ex_gone",
                        "s_1",
                        "stripe.create_refund",
                        "b4",
                        "held",
                        Some(500),
                        2,
                    ),
                    (
                        "ex_appr",
                        "s_1",
                        "stripe.cancel_subscription",
                        "b3",
                        "approved",
                        None,
                        6,
                    ),
                    (
                        "ex_other",
                        "s_2",
                        "stripe.create_refund",
                        "b1",
                        "succeeded",
                        None,
                        1,
                    ),
                    (
                        "ex_run1",
                        "s_1",
                        "stripe.create_refund",
                        "b6",
                        "running",
                        None,
                        8,
                    ),
                    (
                        "ex_run0",
                        "s_1",
                        "stripe.create_refund",
                        "b6",
                        "running",
                        None,
                        7,
                    ),
                    (
                        "ex_orun",
                        "s_2",
                        "stripe.create_refund",
                        "b6",
                        "running",
                        None,
                        1,
                    ),
                    (
                        "ex_ocheck",
                        "s_2",
                        "stripe.create_refund",
                        "b7",
                        "needs_check",
                        None,
                        2,
                    ),
                    (
                        "ex_oheld",
                        "s_2",
                        "stripe.update_subscription",
                        "b5",
                        "held",
                        Some(9_000),
                        1,
                    ),
                ] {
                    c.execute(
                        "INSERT INTO executions (id, session_id, thread_id, agent, tool, args, \
                         account, binding_hash, verdict, because, policy_hash, status, \
                         expires_at_ms, created_at_ms) VALUES (?1, ?2, 'th_1', 'support', ?3, \
                         '{}', 'default', ?4, 'run', 'rule', 'p', ?5, ?6, ?7)",
                        crate::store::params![id, session, tool, binding, status, expires, created],
                    )?;
                }
                Ok(())
            })
            .await
            .unwrap();
            let kind = if backend.url().is_some() {
                "postgres"
            } else {
                "sqlite"
            };
            let asks = [
                ("s_1", "b1", "stripe.create_refund", 1_000),
                ("s_1", "b2", "stripe.create_refund", 1_000),
                ("s_1", "b2", "stripe.create_refund", 10_000),
                ("s_1", "b3", "stripe.cancel_subscription", 1_000),
                ("s_1", "b4", "stripe.create_refund", 1_000),
                ("s_1", "b9", "stripe.update_subscription", 1_000),
                ("s_2", "b1", "stripe.update_subscription", 1_000),
                ("s_3", "b1", "stripe.create_refund", 1_000),
            ];
            let mut kinds_found = [false; 3];
            for (session, binding, tool, now) in asks {
                let (together, one_by_one) = db
                    .read(move |c| {
                        let together = super::earlier_calls(c, session, binding, tool, now)?;
                        let one_by_one = (
                            super::succeeded_binding(c, session, binding)?,
                            super::pending_binding(c, session, binding, now)?,
                            super::held_for_tool(c, session, tool, now)?,
                        );
                        Ok((together, one_by_one))
                    })
                    .await
                    .unwrap();
                let ids = |e: &Option<super::Execution>| e.as_ref().map(|e| e.id.to_string());
                let asked = format!("{kind}: {session} {binding} {tool} at {now}");
                assert_eq!(ids(&together.succeeded), ids(&one_by_one.0), "{asked}");
                assert_eq!(ids(&together.pending), ids(&one_by_one.1), "{asked}");
                assert_eq!(together.held_for_tool, one_by_one.2, "{asked}");
                kinds_found[0] |= together.succeeded.is_some();
                kinds_found[1] |= together.pending.is_some();
                kinds_found[2] |= together.held_for_tool.is_some();
                if let Some(done) = &together.succeeded {
                    assert_eq!(done.status, Status::Succeeded, "{asked}");
                }
            }
            assert_eq!(
                kinds_found, [true; 3],
                "{kind}: every kind was found somewhere"
            );
            // The same binding still being sent or in doubt, the oldest, of the
            // session only; a binding with none has none.
            for (session, binding, want) in [
                ("s_1", "b6", Some(("ex_run0".to_owned(), Status::Running))),
                ("s_2", "b6", Some(("ex_orun".to_owned(), Status::Running))),
                (
                    "s_2",
                    "b7",
                    Some(("ex_ocheck".to_owned(), Status::NeedsCheck)),
                ),
                ("s_3", "b6", None),
                ("s_1", "b1", None),
            ] {
                let found = db
                    .read(move |c| super::earlier_calls(c, session, binding, "t", 1_000))
                    .await
                    .unwrap();
                let unsettled = found.unsettled.map(|e| (e.id.to_string(), e.status));
                assert_eq!(unsettled, want, "{kind}: {session} {binding}");
            }
            // The oldest succeeded execution of a binding is the one replayed.
            let first = db
                .read(|c| super::earlier_calls(c, "s_1", "b1", "stripe.create_refund", 1_000))
                .await
                .unwrap();
            assert_eq!(
                first.succeeded.map(|e| e.id.to_string()).as_deref(),
                Some("ex_done0"),
                "{kind}"
            );
        }
    }

    #[test]
    fn statuses_round_trip_and_unknown_text_is_an_error() {
        for status in [
            Status::Running,
            Status::Succeeded,
            Status::Failed,
            Status::NeedsCheck,
            Status::Held,
            Status::Approved,
            Status::Denied,
            Status::Expired,
            Status::Blocked,
        ] {
            assert_eq!(status.as_str().parse::<Status>().ok(), Some(status));
        }
        assert_eq!(Status::NeedsCheck.as_str(), "needs_check");
        // Unknown text used to read as `needs_check`; it must not become any status.
        assert!("exploded".parse::<Status>().is_err());
        assert!("".parse::<Status>().is_err());
    }
}
