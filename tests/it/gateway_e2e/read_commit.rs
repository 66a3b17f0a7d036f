//! Reads with their durable commit beside the provider's answer (issue 11, "The gateway
//! under a millisecond"; issue 19, the read's commit off the answer's path): a read's
//! execution row and decision are committed while it is sent, and the agent is answered
//! only after that commit, so a read whose decision cannot be committed is never
//! returned; its outcome follows without waiting for the log's flush, after the
//! answer, at most `PER_SESSION` of a session at once. A write's decision is still
//! durable before it runs.

use serde_json::json;

use crate::support::app::TestApp;
use crate::support::pg_hold::{hold_open, let_go};
use crate::support::rows::AuditRow;
use crate::support::wait::eventually;
use crate::support::world::{Customer, World, limited_reads_policy};

/// Makes every audit row of `event` fail to insert, as a full disk or a failed commit
/// would: the job writing it rolls back whole.
async fn fail_audit_event(app: &TestApp, event: &'static str) {
    app.db
        .write(move |c| {
            c.execute_batch(&format!(
                "CREATE TRIGGER fail_{event} BEFORE INSERT ON audit WHEN NEW.event = '{event}' \
                 BEGIN SELECT RAISE(ABORT, 'injected commit failure'); END;"
            ))
        })
        .await
        .expect("install the trigger");
}

async fn allow_audit_event(app: &TestApp, event: &'static str) {
    app.db
        .write(move |c| c.execute_batch(&format!("DROP TRIGGER fail_{event};")))
        .await
        .expect("drop the trigger");
}

fn events_of(rows: &[AuditRow], execution_id: &str) -> Vec<String> {
    rows.iter()
        .filter(|r| r.execution_id.as_deref() == Some(execution_id))
        .map(|r| r.event.clone())
        .collect()
}

/// A world on the shipped policy, its app, and Ada's session with one charge of 49.00.
async fn ada_with_a_charge() -> (World, TestApp, Customer) {
    let world = World::new().await;
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[4900])
        .await;
    (world, app, ada)
}

/// Ada's read of her charge: the status and the body answered.
async fn get_charge(ada: &Customer) -> (u16, serde_json::Value) {
    ada.session
        .call("stripe.get_charge", json!({"charge": ada.charges[0]}), None)
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_commits_its_decision_then_its_outcome() {
    let (_world, app, ada) = ada_with_a_charge().await;

    let (status, body) = get_charge(&ada).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["result"]["amount"], 4900, "{body}");
    let id = body["execution_id"].as_str().expect("execution id");

    let exec = app.execution(id).await;
    assert_eq!(exec.status, "succeeded");
    assert_eq!(exec.verdict, "run");
    assert!(exec.result.is_some_and(|r| r.contains("4900")));
    // The decision and the outcome, in order, and the chain still verifies.
    let rows = app.audit_rows().await;
    assert_eq!(events_of(&rows, id), ["requested", "decided", "ran"]);
    assert_eq!(app.verify_audit().await, rows.len());
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_whose_decision_cannot_be_committed_is_never_returned() {
    let (_world, app, ada) = ada_with_a_charge().await;
    let of_calls = |rows: Vec<AuditRow>| rows.iter().filter(|r| r.execution_id.is_some()).count();
    let before = of_calls(app.audit_rows().await);

    // The read is sent to localstripe, but its decision cannot be recorded.
    fail_audit_event(&app, "decided").await;
    let (status, body) = get_charge(&ada).await;
    assert_eq!(status, 500, "{body}");
    assert!(body.get("result").is_none(), "{body}");
    assert!(!body.to_string().contains("4900"), "{body}");
    // Nothing of it was kept: no execution, no audit row (its `requested` row went with
    // the decision's transaction), no outcome written after.
    assert!(
        app.executions()
            .await
            .iter()
            .all(|e| e.tool != "stripe.get_charge")
    );
    assert_eq!(of_calls(app.audit_rows().await), before);

    // Once the audit can be written again, the same read is answered and recorded.
    allow_audit_event(&app, "decided").await;
    let (status, body) = get_charge(&ada).await;
    assert_eq!(status, 200, "{body}");
    let id = body["execution_id"].as_str().expect("execution id");
    assert_eq!(
        events_of(&app.audit_rows().await, id),
        ["requested", "decided", "ran"]
    );
    app.verify_audit().await;
    app.stop().await;
}

/// A read whose decision is on disk but whose outcome cannot be written is answered:
/// the audit holds the read. Its row stays `running`, sent by this instance; once
/// outcomes can be written again, this instance's sweep (which finds it `running` with
/// nothing here sending it) re-sends it (a read is idempotent) and records its outcome,
/// without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_whose_outcome_cannot_be_written_is_answered_and_recovered_here() {
    let (_world, app, ada) = ada_with_a_charge().await;

    fail_audit_event(&app, "ran").await;
    let (status, body) = get_charge(&ada).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["result"]["amount"], 4900, "{body}");
    let id = body["execution_id"].as_str().expect("execution id");
    let exec = app.execution(id).await;
    assert_eq!(exec.status, "running");
    assert_eq!(
        events_of(&app.audit_rows().await, id),
        ["requested", "decided"]
    );
    app.verify_audit().await;
    allow_audit_event(&app, "ran").await;

    // The sweep re-sends it and records its outcome.
    eventually(&format!("{id} is recovered"), || async {
        app.execution(id).await.status == "succeeded"
    })
    .await;
    assert_eq!(
        events_of(&app.audit_rows().await, id),
        ["requested", "decided", "ran"]
    );
    app.verify_audit().await;
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_is_decided_durably_before_it_runs() {
    let world = World::new().await;
    let app = world.start().await;
    let ada = world.customer_session(&app, "ada@example.com", &[]).await;

    // The note's outcome cannot be recorded; its decision was committed before it ran.
    fail_audit_event(&app, "ran").await;
    let _ = ada
        .session
        .call(
            "helpdesk.add_note",
            json!({"text": "Checked the invoice."}),
            None,
        )
        .await;
    let exec = app
        .executions()
        .await
        .into_iter()
        .find(|e| e.tool == "helpdesk.add_note")
        .expect("the write's execution was committed before it ran");
    assert_eq!(exec.status, "running");
    assert_eq!(
        events_of(&app.audit_rows().await, &exec.id),
        ["requested", "decided"]
    );
    let thread = world.plain.thread(&ada.session.thread_id);
    assert!(
        format!("{thread:?}").contains("Checked the invoice."),
        "the note ran: {thread:?}"
    );
    app.verify_audit().await;
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limited_read_whose_outcome_is_not_recorded_is_never_returned() {
    let world = World::with_policy_text(&limited_reads_policy(1000)).await;
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[4900])
        .await;
    let args = json!({"customer": ada.id, "limit": 1});

    // Its decision (and reservation) is written, it runs against localstripe, but its
    // outcome cannot be recorded: the agent gets a 500 and no result.
    fail_audit_event(&app, "ran").await;
    let (status, body) = ada
        .session
        .call("stripe.list_charges", args.clone(), None)
        .await;
    assert_eq!(status, 500, "{body}");
    assert!(body.get("result").is_none(), "{body}");
    assert!(!body.to_string().contains("4900"), "{body}");
    let decided = app
        .executions()
        .await
        .into_iter()
        .find(|e| e.tool == "stripe.list_charges")
        .expect("the decision was written before the read ran");
    assert_eq!(decided.verdict, "run");
    assert_eq!(decided.status, "running", "its outcome was not recorded");

    // Once the audit can be written again, the same read is answered and recorded.
    allow_audit_event(&app, "ran").await;
    let (status, body) = ada.session.call("stripe.list_charges", args, None).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.to_string().contains("4900"), "{body}");
    let id = body["execution_id"].as_str().expect("execution id");
    assert_eq!(
        events_of(&app.audit_rows().await, id),
        ["requested", "decided", "ran"]
    );
    app.stop().await;
}

/// The advisory lock the outcome gate below waits on.
const OUTCOME_GATE: i64 = 7311;

/// Makes every read's outcome (its row's update to `succeeded`) wait on Postgres for
/// [`OUTCOME_GATE`], which the test holds while it looks.
async fn gate_outcomes(app: &TestApp) {
    app.db
        .write(|c| {
            c.execute_batch(
                "CREATE FUNCTION test_outcome_gate() RETURNS trigger AS $$ \
                 BEGIN PERFORM pg_advisory_xact_lock_shared(7311); RETURN NEW; END $$ \
                 LANGUAGE plpgsql; \
                 CREATE TRIGGER test_outcome_gate BEFORE UPDATE ON executions FOR EACH ROW \
                 WHEN (NEW.status = 'succeeded') EXECUTE FUNCTION test_outcome_gate();",
            )
        })
        .await
        .expect("install the outcome gate");
}

/// Holds [`OUTCOME_GATE`] on a connection of its own until [`let_go`].
async fn hold_outcomes(
    pg: &threadgate::store::testing::TestDb,
) -> (std::sync::mpsc::Sender<()>, tokio::task::JoinHandle<()>) {
    let sql = "SELECT pg_advisory_xact_lock(CAST(CAST(?1 AS text) AS bigint))";
    hold_open(pg, sql, OUTCOME_GATE.to_string()).await
}

/// A world on Postgres with Ada's session (one charge of 49.00); `None` without a test
/// database.
async fn on_postgres() -> Option<(threadgate::store::testing::TestDb, World, TestApp, Customer)> {
    let Some(pg) = threadgate::store::testing::TestDb::postgres_from_env() else {
        eprintln!("skipped: THREADGATE_TEST_DATABASE_URL is not set");
        return None;
    };
    let mut world = World::new().await;
    world.use_postgres(pg.url().expect("a postgres url")).await;
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[4900])
        .await;
    Some((pg, world, app, ada))
}

/// The status of execution `id` as stored now (not waiting for its outcome).
async fn status_now(app: &TestApp, id: &str) -> String {
    let id = id.to_owned();
    app.db
        .read(move |c| {
            c.query_row("SELECT status FROM executions WHERE id = ?1", [&id], |r| {
                r.get(0)
            })
        })
        .await
        .expect("read the status")
}

/// A read is answered once its decision is durable, without waiting for its outcome,
/// which a task of its own writes after; and a session that floods reads while its
/// outcomes cannot be written gets at most `PER_SESSION` answers ahead of them: the
/// rest wait for their own outcome, so nothing queues without bound. Postgres: an
/// advisory lock holds the outcomes back (SQLite's one writer would hold the decisions
/// back with them).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_read_is_answered_before_its_outcome_and_a_flood_only_so_far_ahead() {
    use threadgate::gateway::slots::PER_SESSION;
    let Some((pg, _world, app, ada)) = on_postgres().await else {
        return;
    };
    gate_outcomes(&app).await;
    let ada = std::sync::Arc::new(ada);
    let (release, holding) = hold_outcomes(&pg).await;

    // One read: answered with its result while its outcome waits.
    let (status, body) = get_charge(&ada).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["result"]["amount"], 4900, "{body}");
    let first = body["execution_id"].as_str().expect("id").to_owned();
    assert_eq!(status_now(&app, &first).await, "running");
    assert_eq!(app.gate.outcomes_trailing(), 1);
    // The agent asking after it is answered once its outcome is written, never
    // `running`.
    let asked = tokio::spawn({
        let (ada, path) = (ada.clone(), format!("/v1/executions/{first}"));
        async move { ada.session.get(&path).await }
    });

    // A flood: as many answers as the session has slots left, no more.
    let flood = PER_SESSION + 2;
    let answered = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let calls: Vec<_> = (0..flood)
        .map(|_| {
            let (ada, answered) = (ada.clone(), answered.clone());
            tokio::spawn(async move {
                let reply = get_charge(&ada).await;
                answered.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                reply
            })
        })
        .collect();
    let ahead = PER_SESSION - 1;
    eventually("the reads with a slot are answered", || async {
        answered.load(std::sync::atomic::Ordering::SeqCst) >= ahead
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(
        answered.load(std::sync::atomic::Ordering::SeqCst),
        ahead,
        "the reads past the cap wait for their own outcome"
    );
    assert_eq!(app.gate.outcomes_trailing(), PER_SESSION);

    assert!(
        !asked.is_finished(),
        "the read's status waits for its outcome"
    );

    // Once the outcomes can be written every read is answered and recorded.
    let_go(release, holding).await;
    let (status, view) = asked.await.expect("the status");
    assert_eq!((status, &view["status"]), (200, &json!("ok")), "{view}");
    for call in calls {
        let (status, body) = call.await.expect("a read");
        assert_eq!(status, 200, "{body}");
    }
    let reads: Vec<_> = app.executions_of("stripe.get_charge").await;
    assert_eq!(reads.len(), flood + 1);
    assert!(reads.iter().all(|e| e.status == "succeeded"), "{reads:?}");
    assert_eq!(app.gate.outcomes_trailing(), 0);
    let rows = app.audit_rows().await;
    for read in &reads {
        assert_eq!(events_of(&rows, &read.id), ["requested", "decided", "ran"]);
    }
    app.verify_audit().await;
    app.stop().await;
}

/// A clean stop waits for the outcomes still trailing: the read answered before its
/// outcome could be written is `succeeded` once the instance has stopped, not left for
/// recovery.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_clean_stop_writes_the_outcomes_still_trailing() {
    let Some((pg, _world, app, ada)) = on_postgres().await else {
        return;
    };
    gate_outcomes(&app).await;
    let (release, holding) = hold_outcomes(&pg).await;
    let (status, body) = get_charge(&ada).await;
    assert_eq!(status, 200, "{body}");
    let id = body["execution_id"].as_str().expect("id").to_owned();
    assert_eq!(app.gate.outcomes_trailing(), 1);

    let stopping = tokio::spawn(app.stop());
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(!stopping.is_finished(), "the stop waits for the outcome");
    let_go(release, holding).await;
    stopping.await.expect("the app stops");

    let db = pg.open().expect("a handle");
    let status: String = db
        .read(move |c| {
            c.query_row("SELECT status FROM executions WHERE id = ?1", [&id], |r| {
                r.get(0)
            })
        })
        .await
        .expect("read the status");
    assert_eq!(status, "succeeded");
}

/// On Postgres a read's decision is one statement with no transaction around it (READ
/// COMMITTED): its fence reads the lease row `FOR SHARE`, so a takeover that has changed
/// the row but not yet committed when the read is sent is waited for and then seen. The
/// read is refused (`session_moved`) and nothing of it is written. (A fence that read
/// the statement's snapshot alone would let the read in under the old token.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_read_decided_while_a_takeover_commits_is_refused() {
    let Some((pg, _world, app, ada)) = on_postgres().await else {
        return;
    };
    let (status, body) = get_charge(&ada).await;
    assert_eq!(status, 200, "{body}");

    // Another instance takes the thread over, and has not committed yet.
    let takeover = "UPDATE session_leases SET owner = 'inst-elsewhere', token = token + 1, \
                    expires_at_ms = 4000000000000000 WHERE thread_id = ?1";
    let (done, takeover) = hold_open(&pg, takeover, ada.session.thread_id.clone()).await;

    let ada = std::sync::Arc::new(ada);
    let read = tokio::spawn({
        let ada = ada.clone();
        async move { get_charge(&ada).await }
    });
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert!(!read.is_finished(), "the read waits for the takeover");
    let_go(done, takeover).await;
    let (status, body) = read.await.expect("the read");
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"], "session_moved", "{body}");
    let reads = app.executions_of("stripe.get_charge").await.len();
    assert_eq!(reads, 1, "only the read before the takeover was written");
    app.verify_audit().await;
    app.stop().await;
}
