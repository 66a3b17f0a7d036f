//! The audit chain on Postgres with several instances writing at once (issue 19): a
//! write adds its rows to `audit_pending` inside its transaction and they are chained
//! after its commit by the store's background thread, under the chain's lock, with
//! every row waiting then (`Db::background_settled` waits for it). Each test
//! makes a fresh database on the server `THREADGATE_TEST_DATABASE_URL` names and opens
//! three `Db` handles on it, three pools as three instances would have; without the
//! variable each test says so and passes.
//!
//! - audited writes of three instances at once (each with a state change) make one
//!   chain that verifies, with nothing left waiting once their steps have run, each
//!   write's rows together and in order, and every state change's rows present;
//! - a write that fails or rolls back leaves no audit row, waiting or chained;
//! - rows a crash left waiting (committed, never chained) are chained by the next
//!   write's step, before its own, and by `audit::chain_waiting` (what `audit --verify`
//!   and the anchor's rounds run first);
//! - a write resolves without waiting for its chaining: while another holds the chain's
//!   lock, writes resolve and their rows wait; once it is released they are chained,
//!   the steps queued meanwhile run as one.

use std::collections::BTreeMap;

use threadgate::audit::{self, AuditEvent, AuditFilter, AuditRecord};
use threadgate::secrets::Redactor;
use threadgate::store::counts::counted;
use threadgate::store::testing::TestDb;
use threadgate::store::{Db, SqlError};

/// A fresh database and three handles on it, or `None` (said on stderr) without a
/// server.
fn three_instances(test: &str) -> Option<(TestDb, [Db; 3])> {
    let Some(db) = TestDb::postgres_from_env() else {
        eprintln!("{test}: THREADGATE_TEST_DATABASE_URL is not set: skipped");
        return None;
    };
    let handles = [
        db.open().expect("first instance"),
        db.open().expect("second instance"),
        db.open().expect("third instance"),
    ];
    Some((db, handles))
}

fn step(execution: &str, event: AuditEvent) -> AuditRecord {
    AuditRecord {
        execution_id: Some(execution.to_owned()),
        ..AuditRecord::new(event)
    }
}

/// The rows of one write: 1 to 3 steps of its execution.
fn steps(i: usize) -> Vec<AuditRecord> {
    let events = [AuditEvent::Requested, AuditEvent::Decided, AuditEvent::Ran];
    events
        .into_iter()
        .take(1 + i % 3)
        .map(|e| step(&format!("ex_{i}"), e))
        .collect()
}

async fn pending(db: &Db) -> i64 {
    db.read(audit::pending_count)
        .await
        .expect("count the rows waiting")
}

async fn verified(db: &Db) -> usize {
    db.read(|c| Ok(audit::verify(c)))
        .await
        .expect("read")
        .expect("the chain verifies")
}

/// (id, execution, event) of every chained row, oldest first.
async fn chained(db: &Db) -> Vec<(i64, String, String)> {
    let mut rows: Vec<_> = db
        .read(|c| audit::query(c, &AuditFilter::default()))
        .await
        .expect("rows")
        .into_iter()
        .map(|r| (r.id, r.execution_id.unwrap_or_default(), r.event))
        .collect();
    rows.sort();
    rows
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn audited_writes_of_three_instances_at_once_make_one_chain() {
    let Some((_db, handles)) = three_instances("audit chain of three instances") else {
        return;
    };
    const WRITES: usize = 90;
    let mut tasks = Vec::new();
    for i in 0..WRITES {
        let db = handles[i % 3].clone();
        tasks.push(tokio::spawn(async move {
            db.write(move |c| {
                // The state change the rows record, in the same transaction.
                c.execute(
                    "INSERT INTO meta (key, value) VALUES (?1, 'x')",
                    [format!("write-{i}")],
                )?;
                audit::append_all(c, &steps(i), &Redactor::empty())
            })
            .await
            .expect("append")
        }));
    }
    for task in tasks {
        task.await.expect("join");
    }
    let total: usize = (0..WRITES).map(|i| steps(i).len()).sum();
    for db in &handles {
        db.background_settled().await;
    }
    for db in &handles {
        assert_eq!(
            pending(db).await,
            0,
            "nothing waits once every write's step has run"
        );
    }
    assert_eq!(verified(&handles[2]).await, total);
    let rows = chained(&handles[1]).await;
    assert_eq!(rows.len(), total);
    let ids: Vec<i64> = rows.iter().map(|r| r.0).collect();
    assert_eq!(
        ids,
        (1..=i64::try_from(total).expect("small")).collect::<Vec<_>>()
    );
    // Each write's rows together and in the order written.
    let mut by_write: BTreeMap<&str, Vec<(i64, &str)>> = BTreeMap::new();
    for (id, execution, event) in &rows {
        by_write
            .entry(execution.as_str())
            .or_default()
            .push((*id, event.as_str()));
    }
    assert_eq!(by_write.len(), WRITES, "every write's rows are chained");
    for (execution, written) in by_write {
        let first = written[0].0;
        let expected: Vec<(i64, &str)> = ["requested", "decided", "ran"]
            .into_iter()
            .take(written.len())
            .enumerate()
            .map(|(k, e)| (first + i64::try_from(k).expect("small"), e))
            .collect();
        assert_eq!(
            written, expected,
            "{execution}: its rows together, in order"
        );
    }
    let states: i64 = handles[0]
        .read(|c| {
            c.query_row(
                "SELECT count(*) FROM meta WHERE key LIKE 'write-%'",
                (),
                |r| r.get(0),
            )
        })
        .await
        .expect("count");
    assert_eq!(states, i64::try_from(WRITES).expect("small"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_that_does_not_commit_leaves_no_audit_row() {
    let Some((_db, [a, b, _])) = three_instances("audit of a failed write") else {
        return;
    };
    let failed = a
        .write(|c| {
            audit::append(
                c,
                &step("ex_failed", AuditEvent::Requested),
                &Redactor::empty(),
            )?;
            Err::<(), _>(SqlError::other(std::io::Error::other(
                "the state change fails",
            )))
        })
        .await;
    assert!(failed.is_err());
    b.write(|c| audit::append(c, &step("ex_ok", AuditEvent::Requested), &Redactor::empty()))
        .await
        .expect("append");
    b.background_settled().await;
    assert_eq!(pending(&a).await, 0);
    assert_eq!(verified(&a).await, 1);
    let rows = chained(&b).await;
    assert_eq!(rows, vec![(1, "ex_ok".to_owned(), "requested".to_owned())]);
}

/// What a crash between a write's commit and its chaining leaves: committed rows in
/// `audit_pending`, never chained.
async fn left_by_a_crash(db: &Db, execution: &'static str, n: usize) {
    db.write(move |c| {
        for _ in 0..n {
            c.execute(
                "INSERT INTO audit_pending (at_ms, execution_id, event) VALUES (1, ?1, 'ran')",
                [execution],
            )?;
        }
        Ok(())
    })
    .await
    .expect("rows left waiting");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_a_crash_left_waiting_are_chained_by_the_next_writes_step_before_its_own() {
    let Some((_db, [a, b, c])) = three_instances("audit rows left waiting") else {
        return;
    };
    a.write(|c| audit::append(c, &step("ex_1", AuditEvent::Requested), &Redactor::empty()))
        .await
        .expect("append");
    a.background_settled().await;
    left_by_a_crash(&b, "ex_crashed", 2).await;
    assert_eq!(pending(&c).await, 2);
    c.write(|c| audit::append(c, &step("ex_2", AuditEvent::Requested), &Redactor::empty()))
        .await
        .expect("append");
    c.background_settled().await;
    assert_eq!(pending(&a).await, 0);
    assert_eq!(verified(&b).await, 4);
    let executions: Vec<String> = chained(&a).await.into_iter().map(|r| r.1).collect();
    assert_eq!(executions, ["ex_1", "ex_crashed", "ex_crashed", "ex_2"]);

    // `audit --verify` chains what waits first.
    left_by_a_crash(&c, "ex_crashed_again", 3).await;
    let waiting = audit::chain_waiting(&b)
        .await
        .expect("chain the waiting rows");
    assert_eq!(waiting, 0);
    assert_eq!(verified(&c).await, 7);
}

/// The chaining step commits without waiting for its WAL flush, for itself alone: the
/// writer's own transactions and reads still run with `synchronous_commit` on, and the
/// anchor names the chained head only once the WAL is flushed past it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chaining_steps_unflushed_commit_stays_its_own() {
    let Some(test_db) = TestDb::postgres_from_env() else {
        eprintln!("chaining step's commit: THREADGATE_TEST_DATABASE_URL is not set: skipped");
        return;
    };
    let db = Db::connect_pooled(test_db.url().expect("a url"), 1).expect("a pool of one");
    let setting_in_write = db
        .write(|c| {
            audit::append_all(c, &steps(2), &Redactor::empty())?;
            c.query_row("SELECT current_setting('synchronous_commit')", (), |r| {
                r.get::<_, String>(0)
            })
        })
        .await
        .expect("an audited write");
    assert_eq!(
        setting_in_write, "on",
        "the writer's own transaction commits durably"
    );
    let setting_after = db
        .write(|c| {
            c.query_row("SELECT current_setting('synchronous_commit')", (), |r| {
                r.get::<_, String>(0)
            })
        })
        .await
        .expect("the next write on the same connection");
    assert_eq!(
        setting_after, "on",
        "the step's setting ended with its transaction"
    );
    db.background_settled().await;
    assert_eq!(pending(&db).await, 0, "the step chained the rows");
    // Where the WAL was once the step had committed (other tests' databases on the same
    // server may add to it meanwhile: only this position is asserted).
    let (head, flushed) = db
        .read(|c| {
            let after_step: String =
                c.query_row("SELECT pg_current_wal_insert_lsn()::text", (), |r| r.get(0))?;
            let head = audit::anchor::head(c).map_err(SqlError::other)?;
            let flushed: bool = c.query_row(
                "SELECT pg_current_wal_flush_lsn() >= ?1::text::pg_lsn",
                [after_step.as_str()],
                |r| r.get(0),
            )?;
            Ok((head, flushed))
        })
        .await
        .expect("the head");
    assert_eq!(head.count, 3, "the three chained rows");
    assert!(flushed, "the WAL was flushed before the head was answered");
    assert_eq!(verified(&db).await, 3);
}

/// A write resolves without waiting for its rows to be chained: while another instance
/// holds the chain's lock (here a write that takes it and waits), 20 audited writes on
/// one handle resolve and their rows wait; once the lock is released they are chained,
/// and the steps queued meanwhile run as one batch (the first step, blocked on the
/// lock, and one more), not twenty.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writes_resolve_while_the_chain_is_locked_and_their_steps_run_as_one() {
    let Some((_db, [a, b, _])) = three_instances("chaining in the background") else {
        return;
    };
    const WRITES: usize = 20;
    // The chain's advisory lock ("tgaudit" in ASCII), as `audit::chain_pending` takes it.
    const AUDIT_CHAIN_LOCK: i64 = 0x0074_6761_7564_6974;
    let (locked_tx, locked) = std::sync::mpsc::channel::<()>();
    let (release, released) = std::sync::mpsc::channel::<()>();
    let signals = std::sync::Arc::new(std::sync::Mutex::new((locked_tx, released)));
    let holder = tokio::spawn({
        let b = b.clone();
        async move {
            b.write(move |c| {
                c.execute("SELECT pg_advisory_xact_lock(?1)", [AUDIT_CHAIN_LOCK])?;
                let signals = signals.lock().expect("signals");
                signals.0.send(()).expect("say locked");
                signals.1.recv().expect("wait for the release");
                Ok(())
            })
            .await
            .expect("the lock holder's write")
        }
    });
    tokio::task::spawn_blocking(move || locked.recv())
        .await
        .expect("join")
        .expect("the lock is held");
    let batches_before = a.background_batches();
    let writes = async {
        for i in 0..WRITES {
            a.write(move |c| {
                audit::append(
                    c,
                    &step(&format!("ex_{i}"), AuditEvent::Requested),
                    &Redactor::empty(),
                )
            })
            .await
            .expect("append");
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(60), writes)
        .await
        .expect("the writes resolve while the chain's lock is held");
    assert_eq!(
        pending(&a).await,
        i64::try_from(WRITES).expect("small"),
        "every row waits while the lock is held"
    );
    release.send(()).expect("release");
    holder.await.expect("join");
    a.background_settled().await;
    assert_eq!(pending(&a).await, 0, "chained once the lock is free");
    assert_eq!(verified(&b).await, WRITES);
    let batches = a.background_batches() - batches_before;
    assert!(
        (1..=2).contains(&batches),
        "{WRITES} writes' steps ran in {batches} batches"
    );
}

/// `audit::append_after` (an outcome's status and its audit row, a read's row and its
/// decision's rows; on Postgres one statement with no transaction around it): the
/// audit rows are written only with the change they record, on both backends. A lead
/// that changes nothing writes nothing and says so; one that changes its row writes the
/// row and the audit rows, in their order, chained and verified.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_audit_row_after_a_statement_is_written_only_with_its_change() {
    let dir = tempfile::tempdir().expect("tempdir");
    for test_db in threadgate::store::testing::each_backend(dir.path()) {
        let db = test_db.open().expect("open");
        let backend = format!("{:?}", db.dialect());
        db.write(|c| threadgate::store::meta::set(c, "after_test", "before"))
            .await
            .expect("seed");
        // Every record of a decision and its outcome after one lead, in their order.
        let lead = |key: &'static str| {
            move |c: &threadgate::store::Conn<'_>| {
                let records = [
                    step("ex_after", AuditEvent::Requested),
                    step("ex_after", AuditEvent::Decided),
                    step("ex_after", AuditEvent::Ran),
                ];
                audit::append_after(
                    c,
                    (
                        "UPDATE meta SET value = ?2 WHERE key = ?1",
                        &[&key as &dyn threadgate::store::ToSql, &"after"],
                    ),
                    &records,
                    &Redactor::empty(),
                )
            }
        };
        let missed = db.write_single(lead("no_such_key")).await.expect("write");
        assert!(!missed, "{backend}: a lead that changed nothing");
        let missed = db
            .write_unflushed(lead("no_such_key"))
            .await
            .expect("write");
        assert!(!missed, "{backend}: unflushed, a lead that changed nothing");
        db.background_settled().await;
        assert_eq!(pending(&db).await, 0, "{backend}");
        assert!(chained(&db).await.is_empty(), "{backend}: no audit row");

        let hit = db.write_single(lead("after_test")).await.expect("write");
        assert!(hit, "{backend}: the lead changed its row");
        db.background_settled().await;
        audit::chain_waiting(&db).await.expect("chain");
        let value = db
            .read(|c| threadgate::store::meta::get(c, "after_test"))
            .await
            .expect("read");
        assert_eq!(value.as_deref(), Some("after"), "{backend}");
        let in_order = ["requested", "decided", "ran"]
            .into_iter()
            .zip(1..)
            .map(|(event, id)| (id, "ex_after".to_owned(), event.to_owned()))
            .collect::<Vec<_>>();
        assert_eq!(chained(&db).await, in_order, "{backend}");
        assert_eq!(verified(&db).await, 3, "{backend}");

        // The same, in a write that does not wait for the log's flush.
        let hit = db.write_unflushed(lead("after_test")).await.expect("write");
        assert!(hit, "{backend}: unflushed, the lead changed its row");
        db.background_settled().await;
        audit::chain_waiting(&db).await.expect("chain");
        assert_eq!(chained(&db).await.len(), 6, "{backend}");
        assert_eq!(verified(&db).await, 6, "{backend}");
    }
}

/// The WAL syncs Postgres counts (`pg_stat_wal.wal_sync`, every backend's and the WAL
/// writer's), read through `db` after the backend it uses has reported its own.
async fn wal_syncs(db: &Db) -> i64 {
    db.read(|c| c.query_row("SELECT pg_stat_force_next_flush()", (), |_| Ok(())))
        .await
        .expect("force the stats' report");
    db.read(|c| c.query_row("SELECT wal_sync FROM pg_stat_wal", (), |r| r.get(0)))
        .await
        .expect("read pg_stat_wal")
}

/// On Postgres, `Db::write_unflushed`'s one statement (`audit::append_after`) commits
/// without waiting for the WAL's flush, where `Db::write_single`'s waits for it, and the
/// setting dies with its statement: the connection's next write is synchronous again.
/// Counted by the server's WAL syncs over 100 writes of each kind, on one connection
/// (the WAL writer's own syncs, a few a second at most, count in both).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unflushed_statement_leaves_the_wal_flush_to_later_and_the_connection_synchronous() {
    let Some(test_db) = TestDb::postgres_from_env() else {
        eprintln!("THREADGATE_TEST_DATABASE_URL is not set: skipped");
        return;
    };
    let db = Db::connect_pooled(test_db.url().expect("url"), 1).expect("connect");
    db.write(|c| threadgate::store::meta::set(c, "flush_test", "0"))
        .await
        .expect("seed");
    let lead = |i: usize| {
        move |c: &threadgate::store::Conn<'_>| {
            let value = i.to_string();
            audit::append_after(
                c,
                (
                    "UPDATE meta SET value = ?2 WHERE key = 'flush_test' AND ?1 = ?1",
                    &[&"flush_test" as &dyn threadgate::store::ToSql, &value],
                ),
                &[step(&format!("ex_{i}"), AuditEvent::Ran)],
                &Redactor::empty(),
            )
        }
    };
    let before = wal_syncs(&db).await;
    for i in 0..100 {
        assert!(db.write_single(lead(i)).await.expect("write"));
    }
    let flushed = wal_syncs(&db).await - before;
    // The count is the server's: other tests' commits on it can only add to it, so the
    // fewest of up to three rounds of 100 is the one to judge (a write that synced would
    // count 100 in every round).
    let mut unflushed = i64::MAX;
    for round in 0..3 {
        let before = wal_syncs(&db).await;
        for i in 0..100 {
            let i = 100 * (round + 1) + i;
            assert!(db.write_unflushed(lead(i)).await.expect("write"));
        }
        unflushed = unflushed.min(wal_syncs(&db).await - before);
        if unflushed < 50 {
            break;
        }
    }
    println!("WAL syncs over 100 writes: synchronous {flushed}, unflushed {unflushed}");
    assert!(flushed >= 100, "each synchronous write syncs: {flushed}");
    assert!(
        unflushed < 50,
        "unflushed writes leave the sync to the WAL writer: {unflushed} against {flushed}"
    );
    let setting: String = db
        .read(|c| c.query_row("SHOW synchronous_commit", (), |r| r.get(0)))
        .await
        .expect("show");
    assert_eq!(
        setting, "on",
        "the connection's setting after an unflushed write"
    );
    db.background_settled().await;
    drop(db);
    drop(test_db);
}

/// `Conn::commit_unflushed` sends nothing itself: the next statement that can carry the
/// setting does (`audit::append_after`'s, the gate's decision of a limited read: its
/// row, charge and audit rows), and a transaction none carried sends it just before its
/// `COMMIT`. Either way the setting ends with its transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unflushed_commit_is_carried_by_the_next_append_or_sent_before_commit() {
    let Some(test_db) = TestDb::postgres_from_env() else {
        eprintln!("commit_unflushed: THREADGATE_TEST_DATABASE_URL is not set: skipped");
        return;
    };
    // One connection, so the next write runs where the setting was made.
    let db = Db::connect_pooled(test_db.url().expect("a url"), 1).expect("a pool of one");
    let setting = |c: &threadgate::store::Conn<'_>| {
        c.query_row("SELECT current_setting('synchronous_commit')", (), |r| {
            r.get::<_, String>(0)
        })
    };
    let (carried, counts) = counted(db.write_locking(move |c| {
        let before = setting(c)?;
        c.commit_unflushed()?;
        let asked = setting(c)?;
        let lead = "INSERT INTO meta (key, value) VALUES (?1, ?2)";
        audit::append_after(
            c,
            (lead, &[&"carried", &"1"]),
            &steps(2),
            &Redactor::empty(),
        )?;
        Ok((before, asked, setting(c)?))
    }))
    .await;
    assert_eq!(
        carried.expect("a locking write"),
        ("on".into(), "on".into(), "off".into()),
        "asked, then carried by the append"
    );
    // BEGIN, the four statements, COMMIT: nothing sent for the setting alone.
    assert_eq!(
        (counts.statements, counts.round_trips),
        (4, 6),
        "{counts:?}"
    );

    let (alone, counts) = counted(db.write_locking(move |c| {
        c.commit_unflushed()?;
        setting(c)
    }))
    .await;
    assert_eq!(alone.expect("a locking write"), "on", "nothing carried it");
    // BEGIN, the read, the setting sent before COMMIT, COMMIT.
    assert_eq!(
        (counts.statements, counts.round_trips),
        (2, 4),
        "{counts:?}"
    );

    let next = db.write(move |c| setting(c)).await.expect("the next write");
    assert_eq!(next, "on", "the setting ended with its transaction");
    db.background_settled().await;
}
