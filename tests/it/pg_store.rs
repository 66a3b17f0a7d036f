//! The store's guarantees on Postgres with several instances: each test makes a fresh
//! database on the server `THREADGATE_TEST_DATABASE_URL` names (scripts/test.sh starts
//! one with scripts/postgres-up.sh) and opens two `Db` handles on it, two pools as two
//! instances would have. Without the variable each test says so and passes.

use std::collections::HashSet;
use std::sync::Arc;

use threadgate::executions::store::{self as exec_store, Execution, OutboxNote, Status};
use threadgate::ids::{ExecutionId, SessionId, ThreadId};
use threadgate::secrets::{MasterKey, SecretStore, SecretString};
use threadgate::store::testing::{TestDb, test_database_url};
use threadgate::store::{Db, StoreError};
use threadgate::webhook::Envelope;
use threadgate::webhook::store::{self as events, InsertOutcome};

use crate::support::intake::spawn_intake_on;
use crate::support::plain::example;

/// A fresh database and two handles on it, or `None` (said on stderr) without a server.
fn two_instances(test: &str) -> Option<(TestDb, Db, Db)> {
    let Some(db) = TestDb::postgres_from_env() else {
        eprintln!("{test}: THREADGATE_TEST_DATABASE_URL is not set: skipped");
        return None;
    };
    let a = db.open().expect("first instance");
    let b = db.open().expect("second instance");
    Some((db, a, b))
}

fn execution(id: &str, status: Status) -> Execution {
    Execution {
        id: ExecutionId::parse(id).expect("execution id"),
        session_id: SessionId::parse("s1").expect("session id"),
        thread_id: ThreadId::parse("th_1").expect("thread id"),
        agent: "support".into(),
        tool: "stripe.refund".into(),
        args: "{}".into(),
        account: String::new(),
        binding_hash: format!("b-{id}"),
        diagnosis: None,
        verdict: "hold".into(),
        because: "test".into(),
        rule_line: None,
        policy_hash: String::new(),
        status,
        summary: None,
        expires_at_ms: None,
        reviewer: None,
        decision_message: None,
        decided_at_ms: None,
        result: None,
        error: None,
        attempts: 0,
        created_at_ms: 1,
        finished_at_ms: None,
    }
}

fn handle(i: usize, a: &Db, b: &Db) -> Db {
    if i.is_multiple_of(2) {
        a.clone()
    } else {
        b.clone()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_delivery_is_stored_once_when_two_instances_insert_it_at_once() {
    let Some((_db, a, b)) = two_instances("dedupe") else {
        return;
    };
    let mut template: serde_json::Value =
        serde_json::from_slice(&example("email-received.json")).expect("example");
    let mut tasks = Vec::new();
    for event in 0..30 {
        template["id"] = serde_json::json!(format!("pEv_{event}"));
        let body = serde_json::to_string(&template).expect("json");
        let envelope = Envelope::parse(body.as_bytes()).expect("envelope");
        for copy in 0..4 {
            let (db, envelope, body) = (handle(copy, &a, &b), envelope.clone(), body.clone());
            tasks.push(tokio::spawn(async move {
                // Copies 0 and 1 in a SERIALIZABLE transaction, 2 and 3 as the intake
                // stores them: one autocommit statement.
                if copy < 2 {
                    db.write(move |c| events::insert(c, &envelope, &body, 1))
                        .await
                        .expect("insert")
                } else {
                    db.write_single(move |c| events::insert(c, &envelope, &body, 1))
                        .await
                        .expect("insert")
                }
            }));
        }
    }
    let mut inserted = 0;
    for task in tasks {
        if matches!(task.await.expect("join"), InsertOutcome::Inserted { .. }) {
            inserted += 1;
        }
    }
    assert_eq!(inserted, 30, "each event inserted exactly once");
    let rows: i64 = a
        .read(|c| c.query_row("SELECT count(*) FROM events", (), |r| r.get(0)))
        .await
        .expect("count");
    assert_eq!(rows, 30);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_deliveries_of_one_event_to_two_instances_intakes_are_stored_once_and_all_answered_200()
 {
    let Some((_db, a, b)) = two_instances("intake dedupe") else {
        return;
    };
    const SECRET: &[u8] = b"whsec-test-secret";
    let now_ms = 1_709_728_631_577;
    let mut first = spawn_intake_on(a.clone(), SECRET, now_ms).await;
    let mut second = spawn_intake_on(b.clone(), SECRET, now_ms).await;
    let mut template: serde_json::Value =
        serde_json::from_slice(&example("email-received.json")).expect("example");
    let attempt = |ms: i64| {
        chrono::DateTime::from_timestamp_millis(ms)
            .expect("time")
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
    };
    // Twenty events, each delivered twice at once (Plain's retry racing the first
    // attempt), once to each instance: different attempt bodies, one envelope id.
    let mut sends = Vec::new();
    for event in 0..20i64 {
        for copy in 0..2i64 {
            template["id"] = serde_json::json!(format!("pEv_race{event}"));
            template["webhookMetadata"]["webhookDeliveryAttemptTimestamp"] =
                serde_json::json!(attempt(now_ms - copy * 1000));
            let body = serde_json::to_vec(&template).expect("json");
            let app = if copy == 0 { &first } else { &second };
            sends.push(app.post_signed(body));
        }
    }
    let answers = futures::future::join_all(sends).await;
    assert!(
        answers.iter().all(|(status, _)| *status == 200),
        "every copy answered 200: {answers:?}"
    );
    let stored = answers
        .iter()
        .filter(|(_, answer)| answer["status"] == "stored")
        .count();
    let duplicates = answers
        .iter()
        .filter(|(_, answer)| answer["status"] == "duplicate")
        .count();
    assert_eq!((stored, duplicates), (20, 20), "{answers:?}");
    // Each event is one row, read by the instance that did not necessarily store it.
    let ids: Vec<String> = b
        .read(|c| {
            c.prepare("SELECT event_id FROM events ORDER BY event_id")?
                .query_map((), |r| r.get(0))?
                .collect()
        })
        .await
        .expect("rows");
    let mut expected: Vec<String> = (0..20).map(|e| format!("pEv_race{e}")).collect();
    expected.sort();
    assert_eq!(ids, expected);
    // One notification per event, from whichever instance stored it.
    assert_eq!(
        first.notifications().len() + second.notifications().len(),
        20
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_statement_write_refuses_a_second_statement_before_sending_it() {
    let Some((_db, a, _b)) = two_instances("single statement") else {
        return;
    };
    let refused = a
        .write_single(|c| {
            c.execute(
                "INSERT INTO meta (key, value) VALUES ('single_first', 'x')",
                (),
            )?;
            c.execute(
                "INSERT INTO meta (key, value) VALUES ('single_second', 'x')",
                (),
            )
        })
        .await;
    assert!(
        matches!(
            refused,
            Err(StoreError::Sql(
                threadgate::store::SqlError::SecondStatement
            ))
        ),
        "{refused:?}"
    );
    let second: i64 = a
        .read(|c| {
            c.query_row(
                "SELECT count(*) FROM meta WHERE key = 'single_second'",
                (),
                |r| r.get(0),
            )
        })
        .await
        .expect("count");
    assert_eq!(second, 0, "the second statement was never sent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_of_two_instances_wins_each_approval_step() {
    let Some((_db, a, b)) = two_instances("approval steps") else {
        return;
    };
    for round in 0..20 {
        let id = format!("ex_{round}");
        let exec = execution(&id, Status::Held);
        a.write(move |c| exec_store::insert(c, &exec))
            .await
            .expect("insert");
        for (from, to) in [
            (Status::Held, Status::Approved),
            (Status::Approved, Status::Running),
        ] {
            let mut tasks = Vec::new();
            for i in 0..6 {
                let (db, id) = (handle(i, &a, &b), id.clone());
                tasks.push(tokio::spawn(async move {
                    db.write(move |c| exec_store::transition(c, &id, from, to))
                        .await
                        .expect("transition")
                }));
            }
            let mut won = 0;
            for task in tasks {
                won += usize::from(task.await.expect("join"));
            }
            assert_eq!(won, 1, "round {round}: {from:?} -> {to:?} won once");
        }
    }
}

/// How a deciding transaction runs: SERIALIZABLE (`Db::write`) or READ COMMITTED with
/// its locks (`Db::write_locking`, the gate's way).
#[derive(Clone, Copy, Debug)]
enum Isolation {
    Serializable,
    Locking,
}

async fn write_as<R, F>(db: &Db, how: Isolation, f: F) -> Result<R, StoreError>
where
    R: Send + 'static,
    F: Fn(&threadgate::store::Conn<'_>) -> threadgate::store::Result<R> + Send + 'static,
{
    match how {
        Isolation::Serializable => db.write(f).await,
        Isolation::Locking => db.write_locking(f).await,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_deciding_at_once_never_overspend_a_limit() {
    overspend_race(Isolation::Serializable).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_deciding_at_once_with_locks_never_overspend_a_limit() {
    overspend_race(Isolation::Locking).await;
}

/// Racers meeting between their read and their write: each waits until `n` have
/// arrived or `patience` has passed (a racer kept out by a lock never arrives).
struct Gather {
    arrived: std::sync::Mutex<usize>,
    all: std::sync::Condvar,
    n: usize,
}

impl Gather {
    fn arrive_and_wait(&self, patience: std::time::Duration) {
        let mut arrived = self.arrived.lock().expect("gather");
        *arrived += 1;
        self.all.notify_all();
        let deadline = std::time::Instant::now() + patience;
        while *arrived < self.n {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return;
            }
            arrived = self.all.wait_timeout(arrived, left).expect("gather").0;
        }
    }
}

async fn overspend_race(how: Isolation) {
    let Some((_db, a, b)) = two_instances(&format!("limits ({how:?})")) else {
        return;
    };
    const LIMIT: i64 = 100;
    const AMOUNT: i64 = 30;
    const RACERS: usize = 8;
    // Every racer reads the total before any writes, unless something keeps it out.
    let gather = Arc::new(Gather {
        arrived: std::sync::Mutex::new(0),
        all: std::sync::Condvar::new(),
        n: RACERS,
    });
    let mut tasks = Vec::new();
    for i in 0..RACERS {
        let db = handle(i, &a, &b);
        let gather = gather.clone();
        tasks.push(tokio::spawn(async move {
            write_as(&db, how, move |c| {
                // What `Gate::decide` does in its one transaction: read the key's total
                // (`SqlHistory`), decide, record the execution and its charge.
                let total = exec_store::charged_total(c, "refunds", 0)?;
                gather.arrive_and_wait(std::time::Duration::from_millis(300));
                if total + AMOUNT > LIMIT {
                    return Ok(false);
                }
                let exec = execution(&format!("ex_{i}"), Status::Running);
                exec_store::insert(c, &exec)?;
                exec_store::charge(c, exec.id.as_str(), "refunds", AMOUNT, 1)?;
                Ok(true)
            })
            .await
            .expect("decide")
        }));
    }
    let mut ran = 0;
    for task in tasks {
        ran += usize::from(task.await.expect("join"));
    }
    assert_eq!(ran, 3, "three calls of 30 fit a limit of 100");
    let total = b
        .read(|c| exec_store::charged_total(c, "refunds", 0))
        .await
        .expect("total");
    assert_eq!(total, 90);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_drainers_never_take_the_same_note() {
    let Some((_db, a, b)) = two_instances("outbox") else {
        return;
    };
    a.write(|c| {
        for i in 0..40 {
            let exec = execution(&format!("ex_{i}"), Status::Held);
            exec_store::insert(c, &exec)?;
            let note = OutboxNote {
                execution_id: exec.id.clone(),
                thread_id: ThreadId::parse(format!("th_{}", i % 7)).expect("thread"),
                marker: format!("m{i}"),
                text: "held".into(),
                markdown: "held".into(),
                attempts: 0,
            };
            exec_store::enqueue_note(c, &note, 10)?;
        }
        Ok(())
    })
    .await
    .expect("seed");
    let mut tasks = Vec::new();
    for i in 0..8 {
        let db = handle(i, &a, &b);
        tasks.push(tokio::spawn(async move {
            let mut taken = Vec::new();
            loop {
                let round = db
                    .write(|c| exec_store::claim_notes(c, 100, (2, 5), 1_000_000))
                    .await
                    .expect("claim");
                if round.is_empty() {
                    return taken;
                }
                taken.extend(round.into_iter().map(|n| n.execution_id.to_string()));
            }
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.expect("join"));
    }
    let unique: HashSet<_> = all.iter().cloned().collect();
    assert_eq!(all.len(), 40, "every note taken once: {all:?}");
    assert_eq!(unique.len(), 40);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn several_instances_append_one_audit_chain() {
    let Some((_db, a, b)) = two_instances("audit") else {
        return;
    };
    let mut tasks = Vec::new();
    for i in 0..60 {
        let db = handle(i, &a, &b);
        tasks.push(tokio::spawn(async move {
            db.write(move |c| {
                let record =
                    threadgate::audit::AuditRecord::new(threadgate::audit::AuditEvent::Requested);
                threadgate::audit::append(c, &record, &threadgate::secrets::Redactor::empty())
            })
            .await
            .expect("append")
        }));
    }
    let mut ids = HashSet::new();
    for task in tasks {
        assert!(ids.insert(task.await.expect("join")));
    }
    a.background_settled().await;
    b.background_settled().await;
    let verified = b
        .read(|c| Ok(threadgate::audit::verify(c)))
        .await
        .expect("read")
        .expect("the chain verifies");
    assert_eq!(verified, 60);
}

/// Steps of several rows (`append_all`, one head read each) from two instances at once
/// still make one chain, each step's rows consecutive.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn several_instances_append_steps_of_several_rows_in_one_chain() {
    use threadgate::audit::{self, AuditEvent, AuditFilter, AuditRecord};
    let Some((_db, a, b)) = two_instances("audit steps") else {
        return;
    };
    let mut tasks = Vec::new();
    for i in 0..30 {
        let db = handle(i, &a, &b);
        tasks.push(tokio::spawn(async move {
            db.write(move |c| {
                let step = |event| AuditRecord {
                    execution_id: Some(format!("ex_{i}")),
                    ..AuditRecord::new(event)
                };
                let records = [
                    step(AuditEvent::Requested),
                    step(AuditEvent::Decided),
                    step(AuditEvent::Ran),
                ];
                audit::append_all(c, &records, &threadgate::secrets::Redactor::empty())
            })
            .await
            .expect("append")
        }));
    }
    for task in tasks {
        task.await.expect("join");
    }
    a.background_settled().await;
    b.background_settled().await;
    let verified = b
        .read(|c| Ok(audit::verify(c)))
        .await
        .expect("read")
        .expect("the chain verifies");
    assert_eq!(verified, 90);
    let rows = a
        .read(|c| audit::query(c, &AuditFilter::default()))
        .await
        .expect("rows");
    let mut rows: Vec<_> = rows
        .into_iter()
        .map(|r| (r.id, r.execution_id.unwrap_or_default()))
        .collect();
    rows.sort();
    for step in rows.chunks(3) {
        let ids: Vec<&str> = step.iter().map(|r| r.1.as_str()).collect();
        assert!(
            ids.iter().all(|id| *id == ids[0]),
            "one step's rows together: {ids:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_written_on_one_instance_moves_the_generation_on_another() {
    let Some((_db, a, b)) = two_instances("secrets generation") else {
        return;
    };
    let key = Arc::new(MasterKey::generate());
    let on_a = SecretStore::new(a, Arc::clone(&key));
    let on_b = SecretStore::new(b, key);
    let before = on_b.generation().await.expect("generation");
    on_a.set(
        "stripe_key",
        SecretString::from("fake_key_0123456789abcdef".to_owned()),
    )
    .await
    .expect("set");
    let after = on_b.generation().await.expect("generation");
    assert!(after > before, "{before} -> {after}");
    let value = on_b.get("stripe_key").await.expect("get");
    use threadgate::secrets::ExposeSecret as _;
    assert_eq!(value.expose_secret(), "fake_key_0123456789abcdef");
}

#[test]
fn an_unreachable_database_is_named_without_its_password() {
    let err = Db::connect("postgres://tg:fake_key_pw@127.0.0.1:1/tg")
        .err()
        .expect("nothing listens on port 1");
    let text = err.to_string();
    assert!(matches!(err, StoreError::Unreachable { .. }), "{text}");
    assert!(text.contains("127.0.0.1:1/tg"), "{text}");
    assert!(!text.contains("fake_key_pw"), "{text}");
    let err = Db::connect("postgres://tg:fake_key_pw@127.0.0.1:notaport/tg")
        .err()
        .expect("a bad port");
    assert!(!err.to_string().contains("fake_key_pw"), "{err}");
}

#[test]
fn wrong_credentials_are_named_without_the_password() {
    let Some(url) = test_database_url() else {
        eprintln!("credentials: THREADGATE_TEST_DATABASE_URL is not set: skipped");
        return;
    };
    let scheme_end = url.find("://").expect("a URL") + 3;
    let at = url.find('@').expect("a user in the URL");
    let user = url[scheme_end..at].split(':').next().expect("user");
    let wrong = format!("{}{user}:fake_key_wrong{}", &url[..scheme_end], &url[at..]);
    let err = Db::connect(&wrong).err().expect("a wrong password");
    let text = err.to_string();
    assert!(matches!(err, StoreError::Credentials { .. }), "{text}");
    assert!(text.contains(user), "{text}");
    assert!(!text.contains("fake_key_wrong"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_newer_than_the_binary_is_refused_by_name() {
    let Some((db, a, b)) = two_instances("schema newer") else {
        return;
    };
    a.write(|c| c.execute("UPDATE threadgate_schema SET version = 999", ()))
        .await
        .expect("bump");
    drop((a, b));
    let err = db.open().err().expect("a newer schema");
    assert!(
        matches!(err, StoreError::SchemaNewer { found: 999, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("999"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_starting_at_once_migrate_once() {
    let Some(db) = TestDb::postgres_from_env() else {
        eprintln!("migrate: THREADGATE_TEST_DATABASE_URL is not set: skipped");
        return;
    };
    let url = db.url().expect("url").to_owned();
    let opens: Vec<_> = (0..4)
        .map(|_| {
            let url = url.clone();
            std::thread::spawn(move || Db::connect(&url).map(drop))
        })
        .collect();
    for open in opens {
        open.join().expect("join").expect("open");
    }
}

/// Eight drainers on two instances post the held calls' thread events: each event is
/// taken by one drainer once, and a thread's later event only once its earlier one was
/// sent (claimed events hold their thread's next ones back).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_never_take_the_same_thread_event() {
    use threadgate::executions::trail::{self, TrailEvent};
    let Some((_db, a, b)) = two_instances("thread events") else {
        return;
    };
    a.write(|c| {
        for i in 0..40 {
            let event = TrailEvent {
                external_id: format!("ex_{i}:held"),
                thread_id: ThreadId::parse(format!("th_{}", i % 7)).expect("thread"),
                title: "held".into(),
                body: "held".into(),
                link: None,
                attempts: 0,
            };
            trail::enqueue(c, &event, 10)?;
        }
        Ok(())
    })
    .await
    .expect("seed");
    let mut tasks = Vec::new();
    for i in 0..8 {
        let db = handle(i, &a, &b);
        tasks.push(tokio::spawn(async move {
            let mut taken = Vec::new();
            loop {
                let round = db
                    .write(|c| trail::claim(c, 100, (2, 5), 1_000_000))
                    .await
                    .expect("claim");
                if round.is_empty() {
                    // Another drainer may hold a thread's earlier event: look again
                    // once nothing at all is left unsent.
                    let left: i64 = db
                        .read(|c| {
                            c.query_row(
                                "SELECT count(*) FROM thread_event_outbox WHERE sent_at_ms IS NULL",
                                (),
                                |r| r.get(0),
                            )
                        })
                        .await
                        .expect("left");
                    if left == 0 {
                        return taken;
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                    continue;
                }
                for event in round {
                    let id = event.external_id.clone();
                    db.write(move |c| trail::sent(c, &id, 100))
                        .await
                        .expect("sent");
                    taken.push(event.external_id);
                }
            }
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.expect("join"));
    }
    let unique: HashSet<_> = all.iter().cloned().collect();
    assert_eq!(all.len(), 40, "every event taken once: {all:?}");
    assert_eq!(unique.len(), 40);
}

/// Eight drainers on two instances sync the threads' state labels: each thread's sync
/// is taken by one drainer at a time; once recorded, a later change is taken again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_never_sync_one_threads_labels_at_once() {
    use threadgate::executions::labels;
    let Some((_db, a, b)) = two_instances("labels") else {
        return;
    };
    a.write(|c| {
        for i in 0..30 {
            labels::set_working(c, &format!("th_{i}"), true, 10)?;
        }
        Ok(())
    })
    .await
    .expect("seed");
    let mut tasks = Vec::new();
    for i in 0..8 {
        let db = handle(i, &a, &b);
        tasks.push(tokio::spawn(async move {
            let mut taken = Vec::new();
            loop {
                let round = db
                    .write(|c| labels::claim(c, 100, 4, 1_000_000))
                    .await
                    .expect("claim");
                if round.is_empty() {
                    return taken;
                }
                taken.extend(round.into_iter().map(|s| (s.thread_id, s.version)));
            }
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.expect("join"));
    }
    let unique: HashSet<_> = all.iter().cloned().collect();
    assert_eq!(all.len(), 30, "every thread taken once: {all:?}");
    assert_eq!(unique.len(), 30);
    // Nothing is due while claimed; a recorded sync frees the thread, and its next
    // change is taken at once.
    let (_, version) = all
        .iter()
        .find(|(t, _)| t == "th_0")
        .cloned()
        .unwrap_or_default();
    let again = b
        .write(move |c| {
            labels::set_working(c, "th_0", false, 200)?;
            let held = labels::claim(c, 200, 50, 2_000_000)?;
            labels::synced(c, "th_0", version)?;
            let freed = labels::claim(c, 200, 50, 2_000_000)?;
            Ok((held.len(), freed.len()))
        })
        .await
        .expect("again");
    assert_eq!(again, (0, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_locking_write_keeps_a_takeover_out_until_it_ends_and_is_refused_after_one() {
    use threadgate::store::leases;
    let Some((_db, a, b)) = two_instances("fence_exclusive") else {
        return;
    };
    let thread = ThreadId::parse("th_1").expect("thread");
    let t = thread.clone();
    let lease = a
        .write(move |c| leases::acquire(c, &t, "instance-a", 0, 1_000))
        .await
        .expect("acquire")
        .expect("a lease");
    // A's write locks the lease row, says so, and holds it for a while.
    let (fenced_tx, fenced_rx) = std::sync::mpsc::channel::<()>();
    let fenced_tx = std::sync::Mutex::new(fenced_tx);
    let held = lease.clone();
    let writer = tokio::spawn(async move {
        a.write_locking(move |c| {
            leases::fence_exclusive(c, &held)?;
            let _ = fenced_tx.lock().map(|tx| tx.send(()));
            std::thread::sleep(std::time::Duration::from_secs(3));
            exec_store::insert(c, &execution("ex_fenced", Status::Running))
        })
        .await
    });
    tokio::task::spawn_blocking(move || fenced_rx.recv())
        .await
        .expect("join")
        .expect("A fenced");
    // B's takeover of the (expired) lease cannot take the row while A's write runs.
    let t = thread.clone();
    let blocked = b
        .write(move |c| {
            c.execute("SET LOCAL lock_timeout = '500ms'", ())?;
            leases::acquire(c, &t, "instance-b", 5_000, 1_000)
        })
        .await;
    let err = blocked.expect_err("the takeover waited for A's lock and gave up");
    assert!(
        err.to_string().contains("lock timeout"),
        "a lock timeout (55P03), not another error: {err}"
    );
    writer.await.expect("join").expect("A's write committed");
    // Once A's write has ended the takeover goes through, and A's lease is refused.
    let t = thread.clone();
    let taken = b
        .write(move |c| leases::acquire(c, &t, "instance-b", 5_000, 1_000))
        .await
        .expect("takeover")
        .expect("B's lease");
    assert_eq!(taken.token, lease.token + 1);
    let stale = lease.clone();
    let refused = b
        .write_locking(move |c| {
            leases::fence_exclusive(c, &stale)?;
            exec_store::insert(c, &execution("ex_stale", Status::Running))
        })
        .await;
    let refused = refused.expect_err("a stale lease writes nothing");
    assert!(
        leases::is_lost(&refused),
        "refused as a lost lease: {refused}"
    );
    let rows: Vec<String> = b
        .read(|c| {
            let mut stmt = c.prepare("SELECT id FROM executions ORDER BY id")?;
            let rows = stmt.query_map((), |r| r.get::<_, String>(0))?;
            rows.collect()
        })
        .await
        .expect("rows");
    assert_eq!(rows, vec!["ex_fenced".to_owned()]);
}
