//! The audit log: an append-only, hash-chained record of every step of every execution.
//!
//! A caller appends its audit row inside the same [`crate::store::Db::write`] closure as
//! the state change it records, so the two commit together or not at all. Each row
//! stores `hash = SHA-256(prev_hash || canonical encoding of its fields)`, where
//! `prev_hash` is the previous row's hash (32 zero bytes for the first row), and ids run
//! 1, 2, 3, ... without gaps. SQLite triggers refuse `UPDATE` and `DELETE`; [`verify`]
//! detects a row changed or removed behind their back. Truncating the newest rows leaves
//! a valid shorter chain: [`anchor`] keeps the head (last hash and row count) outside
//! the database and checks that the chain still extends it.
//!
//! Every text field is passed through the [`Redactor`] before it is stored, whatever the
//! caller already did: no secret value reaches this table.

pub mod anchor;
mod chain;
mod table;

use crate::store::{Conn, OptionalExtension as _, Row};
use serde_json::Value;

pub use anchor::{Anchor, AnchorError};
pub use table::format_table;

use crate::secrets::Redactor;
use crate::store::{cached_execute, cached_query_row};

/// What happened to an execution. Stored by name (`as_str`, read back with `FromStr`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, strum::IntoStaticStr, strum::EnumString, strum::Display,
)]
#[strum(serialize_all = "snake_case")]
pub enum AuditEvent {
    /// A tool call arrived.
    Requested,
    /// The policy gate decided it.
    Decided,
    /// It waits for a person.
    Held,
    /// The policy blocked it.
    Blocked,
    /// Refused before the policy (out of scope, a secret in the arguments, ...).
    Refused,
    /// A reviewer approved it.
    Approved,
    /// A reviewer denied it.
    Denied,
    /// Its approval ran out.
    Expired,
    /// It was decided again just before running an approved call.
    Rechecked,
    /// It ran and the provider answered.
    Ran,
    /// It ran and failed.
    Failed,
    /// Its outcome is unknown (a crash mid-call without an idempotency key); a person
    /// must check.
    OutcomeUnknown,
    /// An identical write had already run in this session; its result was returned.
    Replayed,
    /// A model call went through the model proxy (tokens, latency, model; never text).
    ModelCall,
}

impl AuditEvent {
    /// Every event, in the order above.
    pub const ALL: [AuditEvent; 14] = [
        AuditEvent::Requested,
        AuditEvent::Decided,
        AuditEvent::Held,
        AuditEvent::Blocked,
        AuditEvent::Refused,
        AuditEvent::Approved,
        AuditEvent::Denied,
        AuditEvent::Expired,
        AuditEvent::Rechecked,
        AuditEvent::Ran,
        AuditEvent::Failed,
        AuditEvent::OutcomeUnknown,
        AuditEvent::Replayed,
        AuditEvent::ModelCall,
    ];

    /// The name stored in the `event` column.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// One event to append: the one shape of an audit record, whoever writes it. Build it
/// with [`AuditRecord::new`] and the setters (or struct update syntax); a step of an
/// execution gets the execution's fields from `executions::audit`.
#[derive(Debug, Clone, PartialEq)]
pub struct AuditRecord {
    /// When, in ms since the Unix epoch ([`AuditRecord::new`] sets now).
    pub at_ms: i64,
    /// What happened.
    pub event: AuditEvent,
    /// The execution (tool call) it belongs to.
    pub execution_id: Option<String>,
    /// The session.
    pub session_id: Option<String>,
    /// The Plain thread.
    pub thread_id: Option<String>,
    /// The agent that made the call.
    pub agent: Option<String>,
    /// `connector.action`.
    pub tool: Option<String>,
    /// The call's arguments; redacted before storing.
    pub args: Option<Value>,
    /// `run`, `hold` or `block`.
    pub decision: Option<String>,
    /// The rule behind the decision.
    pub rule: Option<String>,
    /// The hash of the policy file that decided.
    pub policy_hash: Option<String>,
    /// The reviewer who approved or denied.
    pub reviewer: Option<String>,
    /// The result in a few words, or the error.
    pub outcome: Option<String>,
    /// How long the step took.
    pub duration_ms: Option<i64>,
}

impl AuditRecord {
    /// An event at the current time with every other field empty.
    pub fn new(event: AuditEvent) -> AuditRecord {
        AuditRecord {
            at_ms: chrono::Utc::now().timestamp_millis(),
            event,
            execution_id: None,
            session_id: None,
            thread_id: None,
            agent: None,
            tool: None,
            args: None,
            decision: None,
            rule: None,
            policy_hash: None,
            reviewer: None,
            outcome: None,
            duration_ms: None,
        }
    }

    /// The step's outcome (an error, a reviewer's message, `ok`).
    pub fn outcome(mut self, outcome: Option<&str>) -> Self {
        self.outcome = outcome.map(str::to_owned);
        self
    }

    /// The reviewer who took the step.
    pub fn reviewer(mut self, reviewer: &str) -> Self {
        self.reviewer = Some(reviewer.to_owned());
        self
    }

    /// How long the step took.
    pub fn duration_ms(mut self, ms: i64) -> Self {
        self.duration_ms = Some(ms);
        self
    }

    /// The hash of the policy in force at this step.
    pub fn policy_hash(mut self, hash: &str) -> Self {
        self.policy_hash = Some(hash.to_owned());
        self
    }
}

/// One stored row, as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditRecordRow {
    /// Position in the chain, from 1.
    pub id: i64,
    /// When, in ms since the Unix epoch.
    pub at_ms: i64,
    /// The execution.
    pub execution_id: Option<String>,
    /// The event's name (see [`AuditEvent::as_str`]).
    pub event: String,
    /// The session.
    pub session_id: Option<String>,
    /// The thread.
    pub thread_id: Option<String>,
    /// The agent.
    pub agent: Option<String>,
    /// The tool.
    pub tool: Option<String>,
    /// The redacted arguments, as JSON text.
    pub args_redacted: Option<String>,
    /// The decision.
    pub decision: Option<String>,
    /// The rule.
    pub rule: Option<String>,
    /// The policy file's hash.
    pub policy_hash: Option<String>,
    /// The reviewer.
    pub reviewer: Option<String>,
    /// The outcome.
    pub outcome: Option<String>,
    /// The duration.
    pub duration_ms: Option<i64>,
    /// The previous row's hash.
    pub prev_hash: Vec<u8>,
    /// This row's hash.
    pub hash: Vec<u8>,
}

/// Errors from [`verify`].
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    /// The chain does not hold at row `id`.
    #[error("the audit chain is broken at row {id}: {reason}")]
    Broken {
        /// The first row that fails.
        id: i64,
        /// What is wrong with it.
        reason: String,
    },
    /// Postgres did not flush its WAL past the head in time, so the head is not
    /// anchored (a crash could take back its newest, unflushed chaining step).
    #[error(
        "the database's WAL was not flushed to {target} within {waited:?}: the audit head is \
         not durable yet, so it is not anchored"
    )]
    NotDurable {
        /// The WAL position waited for.
        target: String,
        /// How long it was waited for.
        waited: std::time::Duration,
    },
    /// The database failed.
    #[error("cannot read the audit log: {0}")]
    Sql(#[from] crate::store::SqlError),
}

/// Which rows [`query`] returns; empty fields do not filter.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditFilter {
    /// Only this thread.
    pub thread_id: Option<String>,
    /// Only this execution.
    pub execution_id: Option<String>,
    /// Only this session.
    pub session_id: Option<String>,
    /// Only this decision (`run`, `hold`, `block`).
    pub decision: Option<String>,
    /// Only this event.
    pub event: Option<AuditEvent>,
    /// Only the newest `limit` matching rows.
    pub limit: Option<usize>,
}

/// The Postgres advisory lock serialising the chaining of audit rows ("tgaudit" in
/// ASCII).
const AUDIT_CHAIN_LOCK: i64 = 0x0074_6761_7564_6974;

/// The most rows one chaining statement takes out of `audit_pending`.
const CHAIN_BATCH: i64 = 1000;

/// Appends `record` to the chain on `conn`, which must be inside the caller's write
/// transaction (a [`crate::store::Db::write`] closure). Redacts every text field and the
/// arguments with `redactor`. Returns the new row's number: on SQLite its id in the
/// chain; on Postgres its place in the queue chained right after the commit (see
/// [`append_all`]), in the same order as the ids it gets.
pub fn append(
    conn: &Conn<'_>,
    record: &AuditRecord,
    redactor: &Redactor,
) -> crate::store::Result<i64> {
    append_all(conn, std::slice::from_ref(record), redactor)
}

/// Appends `records` to the chain in their order, as [`append`] does one. Returns the
/// last row's number (0 when `records` is empty).
///
/// On SQLite, whose one writer runs one transaction at a time, the chain's head is read
/// once and each row chained to the one before it. On Postgres, where the instances'
/// writers run at once, the rows are added to `audit_pending` in the caller's
/// transaction, with no lock and no read of the head (so they commit, or not, with the
/// state change they record, and a concurrent writer never makes this transaction run
/// again), and chained right after its commit by [`chain_pending`] in a transaction of
/// its own on the store's background thread (the write resolves without waiting for
/// it: [`crate::store::Db::background_settled`] waits): under the chain's lock, with a
/// fresh view of the head, together with every row waiting then. A reader that must see
/// every row committed so far chained, whoever wrote it, runs [`chain_waiting`] first.
pub fn append_all(
    conn: &Conn<'_>,
    records: &[AuditRecord],
    redactor: &Redactor,
) -> crate::store::Result<i64> {
    if records.is_empty() {
        return Ok(0);
    }
    if conn.dialect() == crate::store::Dialect::Postgres {
        let rows = records
            .iter()
            .map(|record| redacted_row(record, redactor))
            .collect::<crate::store::Result<Vec<_>>>()?;
        let last = insert_pending(conn, &rows)?;
        chain_after_commit(conn);
        return Ok(last);
    }
    let last: Option<(i64, Vec<u8>)> = cached_query_row(
        conn,
        "SELECT id, hash FROM audit ORDER BY id DESC LIMIT 1",
        (),
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
    .optional()?;
    let (mut id, mut prev_hash) = match last {
        Some((id, hash)) => (id, hash),
        None => (0, chain::GENESIS.to_vec()),
    };
    for record in records {
        id += 1;
        let mut row = redacted_row(record, redactor)?;
        link(&mut row, id, prev_hash);
        insert_row(conn, &row)?;
        prev_hash = row.hash;
    }
    Ok(id)
}

/// A row written together with a lead's ([`append_after_with`]), only when the lead
/// changed one: `into` names its table and columns (`limit_charges (execution_id, …)`),
/// `values` are theirs, in that order.
pub struct Rider<'a> {
    pub into: &'static str,
    pub values: Vec<&'a dyn crate::store::ToSql>,
}

/// Runs `lead`, one data-modifying statement that changes at most one row (its
/// parameters `?1`… are `lead_params`), and when it changed a row appends `records`, in
/// their order, as [`append_all`] does; whether it did (when not, nothing is written).
/// On Postgres they are one statement (`WITH lead AS (… RETURNING 1) INSERT INTO
/// audit_pending … SELECT … FROM lead`; each further record's insert reads the row the
/// one before returned, which orders their serial numbers): one round trip, so a write
/// of just these is sent with no transaction around it (`Db::write_single`). On SQLite
/// they are the statements they say, in the caller's transaction.
pub fn append_after(
    conn: &Conn<'_>,
    lead: (&str, &[&dyn crate::store::ToSql]),
    records: &[AuditRecord],
    redactor: &Redactor,
) -> crate::store::Result<bool> {
    append_after_with(conn, lead, &[], records, redactor)
}

/// [`append_after`], also inserting each of `riders` when the lead changed a row: on
/// Postgres in the same statement (a `WITH` insert of each, reading the lead's row),
/// elsewhere as statements of their own after the lead's. With no `records` the riders
/// are statements of their own on Postgres too, which a `Db::write_single` refuses.
pub fn append_after_with(
    conn: &Conn<'_>,
    (lead, lead_params): (&str, &[&dyn crate::store::ToSql]),
    riders: &[Rider<'_>],
    records: &[AuditRecord],
    redactor: &Redactor,
) -> crate::store::Result<bool> {
    if records.is_empty() || conn.dialect() != crate::store::Dialect::Postgres {
        if cached_execute(conn, lead, lead_params)? == 0 {
            return Ok(false);
        }
        for rider in riders {
            let sql = format!(
                "INSERT INTO {} VALUES ({})",
                rider.into,
                placeholders(0, rider.values.len())
            );
            cached_execute(conn, &sql, rider.values.as_slice())?;
        }
        if !records.is_empty() {
            append_all(conn, records, redactor)?;
        }
        return Ok(true);
    }
    let rows = records
        .iter()
        .map(|r| redacted_row(r, redactor))
        .collect::<crate::store::Result<Vec<_>>>()?;
    // In a write that need not wait for the WAL's flush (`Db::write_unflushed`, or a
    // transaction that asked `Conn::commit_unflushed`), the statement turns
    // `synchronous_commit` off for its transaction; the setting is evaluated whenever a
    // row is changed (the join yields a row only then), and an unchanged row writes
    // nothing to flush.
    let skips_flush = conn.skips_flush();
    let (unflushed, joined) = if skips_flush {
        (
            ", unflushed AS (SELECT set_config('synchronous_commit', 'off', true))",
            ", unflushed",
        )
    } else {
        ("", "")
    };
    // The riders' and records' values take their types from their tables' columns
    // (INSERT … SELECT coerces them); the lead's row, if any, is what makes the first
    // SELECT yield one, and each insert's row what makes the next one's yield one. A
    // rider is written even though nothing reads it (every data-modifying `WITH` runs).
    let changed = "(SELECT 1 FROM lead LIMIT 1) AS changed";
    let mut sql = format!("WITH lead AS ({lead} RETURNING 1){unflushed}");
    let mut after = lead_params.len();
    for (n, rider) in riders.iter().enumerate() {
        sql.push_str(&format!(
            ", rider{n} AS (INSERT INTO {} SELECT {} FROM {changed})",
            rider.into,
            placeholders(after, rider.values.len())
        ));
        after += rider.values.len();
    }
    let mut source = format!("{changed}{joined}");
    for step in 1..rows.len() {
        sql.push_str(&format!(
            ", step{step} AS (INSERT INTO audit_pending ({RECORD_COLUMNS}) SELECT {} FROM \
             {source} RETURNING seq)",
            placeholders(after, RECORD_VALUES)
        ));
        source = format!("step{step}");
        after += RECORD_VALUES;
    }
    sql.push_str(&format!(
        " INSERT INTO audit_pending ({RECORD_COLUMNS}) SELECT {} FROM {source} RETURNING seq",
        placeholders(after, RECORD_VALUES)
    ));
    let mut values: Vec<&dyn crate::store::ToSql> = lead_params.to_vec();
    for rider in riders {
        values.extend(rider.values.iter().copied());
    }
    for row in &rows {
        values.extend(record_values(row));
    }
    let appended = !conn
        .prepare_cached(&sql)?
        .query_map(values, |r| r.get::<_, i64>(0))?
        .collect::<crate::store::Result<Vec<i64>>>()?
        .is_empty();
    if appended {
        if skips_flush {
            conn.flush_skip_carried();
        }
        chain_after_commit(conn);
    }
    Ok(appended)
}

/// Queues the chaining of the rows this Postgres transaction adds to `audit_pending`:
/// one step per transaction whatever its appends (one key), run in the background: the
/// caller does not wait for it, and the steps of writes that commit while one runs are
/// one step. It chains every row waiting, not only up to this write's (another instance
/// may have chained those before a write that committed next to this one, whose step
/// this one may stand for).
fn chain_after_commit(conn: &Conn<'_>) {
    conn.after_postgres_commit_in_background("audit.chain", |c| chain_pending(c).map(|_| ()));
}

/// Chains the rows waiting in `audit_pending` (Postgres) onto the audit chain, oldest
/// first, and returns how many it chained. `conn` must be a READ COMMITTED transaction
/// (a step after a commit, [`crate::store::Conn`]'s `after_postgres_commit`): every
/// statement after the lock then sees the rows and the head the previous holder
/// committed. It chains every row waiting (none, when another step chained them while
/// this one waited for the lock).
///
/// INVARIANT: one chainer at a time, across every instance, reads the head and adds
/// the next rows (the advisory lock, held until commit), so the chain never forks; the
/// rows it chains leave `audit_pending` in the same statement that reads them, so none
/// is chained twice or skipped.
pub(crate) fn chain_pending(conn: &Conn<'_>) -> crate::store::Result<usize> {
    // The chain's lock. The same statement lets this transaction commit without waiting
    // for its WAL flush (`synchronous_commit` off for it alone). Nothing is lost that
    // way: the rows it chains were committed to `audit_pending` by their writers before
    // this step began, so their commits precede this one in the WAL, which is flushed in
    // order: a crash that loses this step leaves them waiting there, for the next step
    // to chain (and one that loses a writer's unflushed commit, a read's outcome, loses
    // this step too). A later durable commit (any writer's) makes this one durable as
    // well; an anchor is taken only once the WAL is flushed past the head it names
    // (`anchor::head`).
    cached_execute(
        conn,
        "SELECT pg_advisory_xact_lock(?1), set_config('synchronous_commit', 'off', true)",
        [AUDIT_CHAIN_LOCK],
    )?;
    let mut chained = 0;
    loop {
        let (mut rows, head) = take_pending(conn)?;
        if rows.is_empty() {
            break;
        }
        rows.sort_by_key(|(order, _)| *order);
        let (mut id, mut prev_hash) = head.unwrap_or((0, chain::GENESIS.to_vec()));
        let mut linked = Vec::with_capacity(rows.len());
        for (_, mut row) in rows {
            id += 1;
            link(&mut row, id, prev_hash);
            prev_hash = row.hash.clone();
            linked.push(row);
        }
        insert_rows(conn, &linked)?;
        chained += linked.len();
        if i64::try_from(linked.len()).unwrap_or(i64::MAX) < CHAIN_BATCH {
            break;
        }
    }
    Ok(chained)
}

/// Rows still waiting to be chained (Postgres; always 0 on SQLite): what a crash between
/// a commit and its chaining leaves until the next chaining.
pub fn pending_count(conn: &Conn<'_>) -> crate::store::Result<i64> {
    conn.query_row("SELECT count(*) FROM audit_pending", (), |r| r.get(0))
}

/// Chains every row waiting in `audit_pending` (Postgres; nothing to do on SQLite) and
/// returns how many are still waiting after it: what `threadgate audit --verify` does
/// first, so rows a crash left unchained are checked too.
pub async fn chain_waiting(db: &crate::store::Db) -> Result<i64, crate::store::StoreError> {
    if db.dialect() == crate::store::Dialect::Sqlite {
        return Ok(0);
    }
    db.write(|c| {
        c.after_postgres_commit("audit.chain", |c| chain_pending(c).map(|_| ()));
        Ok(())
    })
    .await?;
    db.read(pending_count).await
}

/// Rows taken out of `audit_pending` with their order (transaction, number; in no
/// particular order), and the chain's head (id and hash) when it has one.
type Taken = (Vec<((i64, i64), AuditRecordRow)>, Option<(i64, Vec<u8>)>);

/// Takes up to [`CHAIN_BATCH`] of the oldest waiting rows out of `audit_pending` (a
/// transaction's rows together, in the order written) and reads the chain's head, in
/// one statement.
fn take_pending(conn: &Conn<'_>) -> crate::store::Result<Taken> {
    let mut stmt = conn.prepare_cached(
        "WITH taken AS ( \
             DELETE FROM audit_pending WHERE seq IN \
                 (SELECT seq FROM audit_pending ORDER BY xact, seq LIMIT ?1) \
             RETURNING xact, seq, at_ms, execution_id, event, session_id, thread_id, agent, tool, \
                 args_redacted, decision, rule, policy_hash, reviewer, outcome, duration_ms) \
         SELECT taken.*, head.id, head.hash FROM taken \
         LEFT JOIN (SELECT id, hash FROM audit ORDER BY id DESC LIMIT 1) head ON true",
    )?;
    let mut head = None;
    let mut rows = Vec::new();
    let mut found = stmt.query([CHAIN_BATCH])?;
    while let Some(r) = found.next()? {
        let id: Option<i64> = r.get(16)?;
        let hash: Option<Vec<u8>> = r.get(17)?;
        if let (Some(id), Some(hash)) = (id, hash) {
            head = Some((id, hash));
        }
        rows.push((
            (r.get(0)?, r.get(1)?),
            AuditRecordRow {
                id: 0,
                at_ms: r.get(2)?,
                execution_id: r.get(3)?,
                event: r.get(4)?,
                session_id: r.get(5)?,
                thread_id: r.get(6)?,
                agent: r.get(7)?,
                tool: r.get(8)?,
                args_redacted: r.get(9)?,
                decision: r.get(10)?,
                rule: r.get(11)?,
                policy_hash: r.get(12)?,
                reviewer: r.get(13)?,
                outcome: r.get(14)?,
                duration_ms: r.get(15)?,
                prev_hash: Vec::new(),
                hash: Vec::new(),
            },
        ));
    }
    Ok((rows, head))
}

/// The columns of a record as written, `at_ms` to `duration_ms`: in `audit_pending`
/// all of them, in `audit` between `id` and the two hashes.
const RECORD_COLUMNS: &str = "at_ms, execution_id, event, session_id, thread_id, agent, tool, \
     args_redacted, decision, rule, policy_hash, reviewer, outcome, duration_ms";

/// How many [`RECORD_COLUMNS`] there are.
const RECORD_VALUES: usize = 14;

/// `row`'s values for [`RECORD_COLUMNS`], in their order.
fn record_values(row: &AuditRecordRow) -> [&dyn crate::store::ToSql; RECORD_VALUES] {
    [
        &row.at_ms,
        &row.execution_id,
        &row.event,
        &row.session_id,
        &row.thread_id,
        &row.agent,
        &row.tool,
        &row.args_redacted,
        &row.decision,
        &row.rule,
        &row.policy_hash,
        &row.reviewer,
        &row.outcome,
        &row.duration_ms,
    ]
}

/// `(?1, …, ?c), (?c+1, …)`: the placeholders of `rows` tuples of `columns` values.
fn values_list(rows: usize, columns: usize) -> String {
    let tuples: Vec<String> = (0..rows)
        .map(|i| format!("({})", placeholders(i * columns, columns)))
        .collect();
    tuples.join(", ")
}

/// `?{after+1}, …, ?{after+count}`: `count` placeholders after the first `after`.
fn placeholders(after: usize, count: usize) -> String {
    let marks: Vec<String> = (1..=count).map(|k| format!("?{}", after + k)).collect();
    marks.join(", ")
}

/// Inserts chained rows, up to 32 per statement (one statement text per chunk size, at
/// most 32 prepared per connection): the few rows of one call's step are one round trip.
fn insert_rows(conn: &Conn<'_>, rows: &[AuditRecordRow]) -> crate::store::Result<()> {
    const COLUMNS: usize = RECORD_VALUES + 3;
    for chunk in rows.chunks(32) {
        let sql = format!(
            "INSERT INTO audit (id, {RECORD_COLUMNS}, prev_hash, hash) VALUES {}",
            values_list(chunk.len(), COLUMNS)
        );
        let mut values: Vec<&dyn crate::store::ToSql> = Vec::with_capacity(chunk.len() * COLUMNS);
        for row in chunk {
            values.push(&row.id);
            values.extend(record_values(row));
            values.extend([&row.prev_hash as &dyn crate::store::ToSql, &row.hash]);
        }
        cached_execute(conn, &sql, values)?;
    }
    Ok(())
}

/// Adds redacted rows to `audit_pending` in one statement, in their order; answers
/// the last one's number.
fn insert_pending(conn: &Conn<'_>, rows: &[AuditRecordRow]) -> crate::store::Result<i64> {
    // A transaction writes a handful of rows: one statement text per count, cached.
    let sql = format!(
        "INSERT INTO audit_pending ({RECORD_COLUMNS}) VALUES {} RETURNING seq",
        values_list(rows.len(), RECORD_VALUES)
    );
    let values: Vec<&dyn crate::store::ToSql> = rows.iter().flat_map(record_values).collect();
    // Rows of one VALUES list get their serial numbers in list order.
    let seqs = conn
        .prepare_cached(&sql)?
        .query_map(values, |r| r.get::<_, i64>(0))?
        .collect::<crate::store::Result<Vec<i64>>>()?;
    Ok(seqs.into_iter().max().unwrap_or(0))
}

/// Makes `row` row `id` of the chain, after a row whose hash is `prev_hash`.
fn link(row: &mut AuditRecordRow, id: i64, prev_hash: Vec<u8>) {
    row.id = id;
    row.prev_hash = prev_hash;
    row.hash = chain::row_hash(row).to_vec();
}

/// `record` with every text field and the arguments redacted, not chained yet (no id,
/// no hashes: [`link`] sets them).
fn redacted_row(record: &AuditRecord, redactor: &Redactor) -> crate::store::Result<AuditRecordRow> {
    let text = |field: &Option<String>| field.as_deref().map(|t| redactor.redact(t).into_owned());
    let args_redacted = match &record.args {
        Some(args) => {
            let mut args = args.clone();
            redactor.redact_json(&mut args);
            let json = serde_json::to_string(&args).map_err(crate::store::SqlError::other)?;
            Some(redactor.redact(&json).into_owned())
        }
        None => None,
    };
    Ok(AuditRecordRow {
        id: 0,
        at_ms: record.at_ms,
        execution_id: text(&record.execution_id),
        event: record.event.as_str().to_owned(),
        session_id: text(&record.session_id),
        thread_id: text(&record.thread_id),
        agent: text(&record.agent),
        tool: text(&record.tool),
        args_redacted,
        decision: text(&record.decision),
        rule: text(&record.rule),
        policy_hash: text(&record.policy_hash),
        reviewer: text(&record.reviewer),
        outcome: text(&record.outcome),
        duration_ms: record.duration_ms,
        prev_hash: Vec::new(),
        hash: Vec::new(),
    })
}

fn insert_row(conn: &Conn<'_>, row: &AuditRecordRow) -> crate::store::Result<()> {
    insert_rows(conn, std::slice::from_ref(row))
}

/// Checks the whole chain: ids without gaps from 1, each `prev_hash` equal to the
/// previous row's hash, each hash equal to the recomputed one. Returns the number of
/// rows.
pub fn verify(conn: &Conn<'_>) -> Result<usize, AuditError> {
    let mut stmt = conn.prepare(&format!("SELECT {COLUMNS} FROM audit ORDER BY id"))?;
    let mut rows = stmt.query(())?;
    let mut expected_prev = chain::GENESIS.to_vec();
    let mut expected_id = 1;
    let mut count = 0;
    while let Some(r) = rows.next()? {
        let row = read_row(&r)?;
        let broken = |reason: String| AuditError::Broken { id: row.id, reason };
        if row.id != expected_id {
            return Err(broken(format!("expected row {expected_id} before it")));
        }
        if row.prev_hash != expected_prev {
            return Err(broken(
                "its prev_hash does not match the previous row's hash".into(),
            ));
        }
        if row.hash != chain::row_hash(&row) {
            return Err(broken("its contents do not match its hash".into()));
        }
        expected_prev = row.hash;
        expected_id += 1;
        count += 1;
    }
    Ok(count)
}

/// The rows matching `filter`, oldest first.
pub fn query(conn: &Conn<'_>, filter: &AuditFilter) -> crate::store::Result<Vec<AuditRecordRow>> {
    let mut clauses = Vec::new();
    let mut values: Vec<String> = Vec::new();
    let conditions = [
        ("thread_id", filter.thread_id.clone()),
        ("execution_id", filter.execution_id.clone()),
        ("session_id", filter.session_id.clone()),
        ("decision", filter.decision.clone()),
        ("event", filter.event.map(|e| e.as_str().to_owned())),
    ];
    for (column, value) in conditions {
        if let Some(value) = value {
            values.push(value);
            clauses.push(format!("{column} = ?{}", values.len()));
        }
    }
    let mut sql = format!("SELECT {COLUMNS} FROM audit");
    if !clauses.is_empty() {
        sql.push_str(" WHERE ");
        sql.push_str(&clauses.join(" AND "));
    }
    sql.push_str(" ORDER BY id DESC");
    if let Some(limit) = filter.limit {
        sql.push_str(&format!(" LIMIT {limit}"));
    }
    let mut stmt = conn.prepare(&format!("SELECT * FROM ({sql}) AS page ORDER BY id"))?;
    let params: Vec<&dyn crate::store::ToSql> = values
        .iter()
        .map(|v| v as &dyn crate::store::ToSql)
        .collect();
    let rows = stmt.query_map(params, read_row)?;
    rows.collect()
}

/// The columns in the order [`read_row`] reads them.
const COLUMNS: &str = "id, at_ms, execution_id, event, session_id, thread_id, agent, tool, \
     args_redacted, decision, rule, policy_hash, reviewer, outcome, duration_ms, prev_hash, hash";

fn read_row(r: &Row<'_>) -> crate::store::Result<AuditRecordRow> {
    Ok(AuditRecordRow {
        id: r.get(0)?,
        at_ms: r.get(1)?,
        execution_id: r.get(2)?,
        event: r.get(3)?,
        session_id: r.get(4)?,
        thread_id: r.get(5)?,
        agent: r.get(6)?,
        tool: r.get(7)?,
        args_redacted: r.get(8)?,
        decision: r.get(9)?,
        rule: r.get(10)?,
        policy_hash: r.get(11)?,
        reviewer: r.get(12)?,
        outcome: r.get(13)?,
        duration_ms: r.get(14)?,
        prev_hash: r.get(15)?,
        hash: r.get(16)?,
    })
}
