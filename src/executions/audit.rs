//! The audit rows of executions, written inside the same transaction as the state
//! change they describe.

use crate::store::Conn;

use super::frozen::redact_args;
use super::store::Execution;
use crate::audit::{self, AuditEvent, AuditRecord};
use crate::secrets::Redactor;
use crate::session::SessionScope;

/// Appends one step of an execution: `step` (an [`AuditRecord::new`] with what the step
/// has: an outcome, a reviewer, a duration, the policy hash in force when it differs
/// from the one that decided the call) completed with the execution's fields; its
/// arguments pass through [`redact_args`].
pub fn record(
    conn: &Conn<'_>,
    redactor: &Redactor,
    exec: &Execution,
    step: AuditRecord,
) -> crate::store::Result<()> {
    record_all(conn, redactor, exec, vec![step])
}

/// Appends several steps of an execution at once, in their order, each completed as
/// [`record`] completes one: one read of the chain's head for all of them.
pub fn record_all(
    conn: &Conn<'_>,
    redactor: &Redactor,
    exec: &Execution,
    steps: Vec<AuditRecord>,
) -> crate::store::Result<()> {
    let records: Vec<AuditRecord> = steps.into_iter().map(completion(redactor, exec)).collect();
    audit::append_all(conn, &records, redactor)?;
    Ok(())
}

/// Writes how `exec` (sent by `runner`) ended ([`super::store::finish`]'s update) and
/// its outcome step, completed as [`record`] completes one, together: on Postgres one
/// statement ([`audit::append_after`]), which a write may send with no transaction
/// around it. Fails with [`super::store::OutcomeRefused`], writing nothing, when the
/// call is no longer running as `runner`'s.
pub fn finish_recorded(
    conn: &Conn<'_>,
    redactor: &Redactor,
    (exec, runner): (&Execution, &str),
    (status, result, error): (super::Status, Option<&str>, Option<&str>),
    now_ms: i64,
    step: AuditRecord,
) -> crate::store::Result<()> {
    let record = completion(redactor, exec)(step);
    let id = exec.id.as_str();
    let finish = (
        super::store::FINISH,
        crate::store::params![id, status.as_str(), result, error, now_ms, runner],
    );
    if audit::append_after(conn, finish, &[record], redactor)? {
        Ok(())
    } else {
        Err(super::store::OutcomeRefused { id: id.to_owned() }.into())
    }
}

/// Inserts the decided call `exec` (with its `runner` when it runs), the limit amounts
/// it reserves (`charges`: key and amount, counted at `now_ms`) and its first `steps`,
/// completed as [`record`] completes them, in the caller's transaction: on Postgres one
/// statement ([`audit::append_after_with`], the charges riding on the row's insert), on
/// SQLite the statements they are.
pub fn insert_decided(
    conn: &Conn<'_>,
    redactor: &Redactor,
    (exec, runner): (&Execution, Option<&str>),
    (charges, now_ms): (&[(String, i64)], i64),
    steps: Vec<AuditRecord>,
) -> crate::store::Result<()> {
    let records: Vec<AuditRecord> = steps.into_iter().map(completion(redactor, exec)).collect();
    let status = exec.status.as_str();
    let (sql, values) = super::store::insert_statement(exec, (&status, &runner));
    let riders: Vec<audit::Rider<'_>> = charges
        .iter()
        .map(|(key, amount)| audit::Rider {
            into: super::store::CHARGE_INTO,
            values: vec![&exec.id, key, amount, &now_ms],
        })
        .collect();
    if audit::append_after_with(conn, (&sql, &values), &riders, &records, redactor)? {
        Ok(())
    } else {
        // An insert always adds its row; were it ever to add none, nothing of the
        // decision may be taken as written.
        Err(crate::store::SqlError::other(std::io::Error::other(
            format!("the execution {} was not inserted", exec.id),
        )))
    }
}

/// Inserts `exec` (sent by `runner`) with its `steps`, completed as [`record`] completes
/// them, while `lease` is its thread's current lease: on Postgres one statement
/// ([`audit::append_after`], the insert's fence its `WHERE`), which a write may send with
/// no transaction around it. A stale lease writes nothing and fails with
/// [`Lease::lost`](crate::store::leases::Lease::lost).
pub fn insert_recorded(
    conn: &Conn<'_>,
    redactor: &Redactor,
    (exec, runner): (&Execution, &str),
    lease: &crate::store::leases::Lease,
    steps: Vec<AuditRecord>,
) -> crate::store::Result<()> {
    let records: Vec<AuditRecord> = steps.into_iter().map(completion(redactor, exec)).collect();
    let status = exec.status.as_str();
    let runner = Some(runner);
    let (sql, values) =
        super::store::insert_if_fenced(conn.dialect(), exec, (&status, &runner), lease);
    if audit::append_after(conn, (&sql, &values), &records, redactor)? {
        Ok(())
    } else {
        Err(lease.lost())
    }
}

/// Completes a step of `exec` with the execution's fields (its arguments redacted once,
/// for every step the returned function completes).
fn completion<'e>(
    redactor: &Redactor,
    exec: &'e Execution,
) -> impl Fn(AuditRecord) -> AuditRecord + 'e {
    let args: serde_json::Value = serde_json::from_str(&exec.args).unwrap_or_default();
    let args = redact_args(redactor, &args);
    let rule = match exec.rule_line {
        Some(line) => format!("{} (line {line})", exec.because),
        None => exec.because.clone(),
    };
    move |step| AuditRecord {
        execution_id: Some(exec.id.to_string()),
        session_id: Some(exec.session_id.to_string()),
        thread_id: Some(exec.thread_id.to_string()),
        agent: Some(exec.agent.clone()),
        tool: Some(exec.tool.clone()),
        args: Some(args.clone()),
        decision: Some(exec.verdict.clone()),
        rule: Some(rule.clone()),
        policy_hash: Some(step.policy_hash.unwrap_or_else(|| exec.policy_hash.clone())),
        ..step
    }
}

/// Appends a call refused before any decision (out of scope, a secret in the
/// arguments). The arguments are not recorded.
pub fn refusal(
    conn: &Conn<'_>,
    redactor: &Redactor,
    scope: &SessionScope,
    tool: &str,
    reason: &str,
    policy_hash: &str,
    now_ms: i64,
) -> crate::store::Result<()> {
    let rec = AuditRecord {
        at_ms: now_ms,
        session_id: Some(scope.session_id.to_string()),
        thread_id: Some(scope.thread_id.to_string()),
        agent: Some(scope.agent.clone()),
        tool: Some(tool.to_owned()),
        decision: Some("refused".into()),
        rule: Some(reason.to_owned()),
        policy_hash: Some(policy_hash.to_owned()),
        ..AuditRecord::new(AuditEvent::Refused)
    };
    audit::append(conn, &rec, redactor)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executions::Status;
    use crate::store::Db;

    fn execution() -> Execution {
        let scope = SessionScope {
            session_id: crate::ids::SessionId::parse("se_1").expect("id"),
            thread_id: crate::ids::ThreadId::parse("th_1").expect("id"),
            agent: "support".into(),
            customer_id: None,
            customer_email: None,
            lease: crate::store::leases::Lease {
                thread_id: crate::ids::ThreadId::parse("th_1").expect("id"),
                owner: "inst".into(),
                token: 1,
            },
        };
        let args = r#"{"amount":500,"charge":"ch_1"}"#.to_owned();
        let mut exec = Execution::by_threadgate(
            &crate::ids::ExecutionId::parse("ex_1").expect("id"),
            &scope,
            "stripe.create_refund",
            args,
            ("hold", Status::Approved),
            "refunds need a person",
            1_000,
        );
        exec.rule_line = Some(7);
        exec.policy_hash = "held-by".into();
        exec
    }

    /// Appends `step` for [`execution`] and reads the row back.
    async fn recorded(step: AuditRecord) -> audit::AuditRecordRow {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = Db::open(&dir.path().join("a.db")).expect("open");
        db.write(move |c| record(c, &Redactor::empty(), &execution(), step.clone()))
            .await
            .expect("record");
        let rows = db
            .read(|c| audit::query(c, &audit::AuditFilter::default()))
            .await
            .expect("query");
        rows.into_iter().next().expect("one row")
    }

    #[tokio::test]
    async fn a_step_is_completed_with_its_execution_and_keeps_what_it_set() {
        let step = AuditRecord::new(AuditEvent::Approved)
            .outcome(Some("fine"))
            .reviewer("alice")
            .duration_ms(12);
        let row = recorded(step).await;
        let got = (
            row.event.as_str(),
            row.execution_id.as_deref(),
            row.thread_id.as_deref(),
            row.tool.as_deref(),
            row.decision.as_deref(),
            row.rule.as_deref(),
            row.policy_hash.as_deref(),
            row.reviewer.as_deref(),
            row.outcome.as_deref(),
            row.duration_ms,
        );
        let want = (
            "approved",
            Some("ex_1"),
            Some("th_1"),
            Some("stripe.create_refund"),
            Some("hold"),
            Some("refunds need a person (line 7)"),
            Some("held-by"),
            Some("alice"),
            Some("fine"),
            Some(12),
        );
        assert_eq!(got, want);
    }

    #[tokio::test]
    async fn a_step_under_another_policy_keeps_that_policy_hash() {
        let step = AuditRecord::new(AuditEvent::Rechecked).policy_hash("current");
        let row = recorded(step).await;
        assert_eq!(row.policy_hash.as_deref(), Some("current"));
        assert_eq!(row.reviewer, None);
    }

    /// An outcome and its audit row (one statement on Postgres, sent with no
    /// transaction around it) are written only by the call's runner while it runs: the
    /// late outcome of an instance whose call another took over writes neither. On
    /// every backend.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_outcome_of_a_call_taken_over_writes_no_row_and_no_audit() {
        let dir = tempfile::tempdir().expect("tempdir");
        for backend in crate::store::testing::each_backend(dir.path()) {
            let db = backend.open().expect("open");
            let dialect = format!("{:?}", db.dialect());
            let mut exec = execution();
            exec.status = Status::Running;
            let row = exec.clone();
            db.write(move |c| super::super::store::insert_run_by(c, &row, Some("inst_b")))
                .await
                .expect("insert");
            let outcome = |runner: &'static str| {
                let exec = exec.clone();
                move |c: &Conn<'_>| {
                    let ran = (Status::Succeeded, Some(r#"{"ok":true}"#), None);
                    let step = AuditRecord::new(AuditEvent::Ran);
                    finish_recorded(c, &Redactor::empty(), (&exec, runner), ran, 2_000, step)
                }
            };
            let late = db.write_single(outcome("inst_a")).await.unwrap_err();
            assert!(
                late.to_string().contains("not running on this instance"),
                "{dialect}: {late}"
            );
            assert_eq!(status(&db).await, "running", "{dialect}");
            assert!(events(&db).await.is_empty(), "{dialect}: no audit row");

            db.write_single(outcome("inst_b"))
                .await
                .expect("its runner's outcome");
            assert_eq!(status(&db).await, "succeeded", "{dialect}");
            assert_eq!(events(&db).await, ["ran"], "{dialect}");
        }
    }

    async fn status(db: &Db) -> String {
        db.read(|c| {
            c.query_row("SELECT status FROM executions WHERE id = 'ex_1'", (), |r| {
                r.get(0)
            })
        })
        .await
        .expect("status")
    }

    /// The events of the audit rows, every one written so far chained first.
    async fn events(db: &Db) -> Vec<String> {
        db.background_settled().await;
        audit::chain_waiting(db).await.expect("chain");
        let rows = db.read(|c| audit::query(c, &audit::AuditFilter::default()));
        rows.await
            .expect("audit")
            .into_iter()
            .map(|r| r.event)
            .collect()
    }
}
