//! What one gated call costs the database and Stripe, counted exactly (not timed), on
//! SQLite and, when `THREADGATE_TEST_DATABASE_URL` names a server, on Postgres: durable
//! commits, statements, Postgres round trips and Stripe requests of a read
//! (`stripe.get_charge`, customer emails remembered) and of a write
//! (`stripe.create_refund`, run without a person). A change that adds a commit, a
//! statement or a round trip to the call path fails here; README "Where a call's work
//! goes" explains each number. `--nocapture` prints them.

use serde_json::json;
use threadgate::gateway::gate::{CallReply, CallRequest};
use threadgate::session::SessionScope;
use threadgate::store::counts::{Counts, counted};
use threadgate::store::leases::{self, Lease};
use threadgate::store::testing::TestDb;

use crate::support::app::TestApp;
use crate::support::world::{Customer, REFUNDS_RUN_POLICY, World, limited_reads_rule};

/// The scope the session's socket serves, as the supervisor built it.
async fn scope_of(app: &TestApp, customer: &Customer) -> SessionScope {
    let thread = threadgate::ids::ThreadId::parse(&customer.session.thread_id).expect("id");
    let now = chrono::Utc::now().timestamp_millis();
    let (row, holder) = app
        .db
        .read(move |c| {
            let row = threadgate::session::store::get(c, &thread)?;
            let holder = leases::holder(c, &thread, now)?;
            Ok((row, holder))
        })
        .await
        .expect("read the session");
    let row = row.expect("a session row");
    let (owner, token, _) = holder.expect("a lease");
    SessionScope {
        lease: Lease {
            thread_id: row.thread_id.clone(),
            owner,
            token,
        },
        session_id: row.session_id,
        thread_id: row.thread_id,
        agent: row.agent,
        customer_id: row.customer_id,
        customer_email: row.customer_email,
    }
}

/// Runs `tool` with `args` through the gate, counted; it must run.
async fn call(app: &TestApp, scope: &SessionScope, tool: &str, args: serde_json::Value) -> Counts {
    let req: CallRequest =
        serde_json::from_value(json!({"tool": tool, "args": args})).expect("a call request");
    // A read's outcome is written after its answer, by a task that carries the count.
    let (reply, counts) = counted(async {
        let reply = app.gate.call(scope, req).await;
        app.gate.outcomes_settled().await;
        reply
    })
    .await;
    assert!(matches!(reply, CallReply::Ran { .. }), "{reply:?}");
    counts
}

/// A read, a write, and a read whose rule reserves a limit amount
/// (`stripe.list_charges` of the thread's customer: decided in a write transaction,
/// which reads the limit's total under its key's lock, its outcome recorded after) on
/// `world`'s app: their counts, after one of each warmed the memory (charge owner,
/// customer email) and the statement caches.
async fn counts_of(world: &World) -> (Counts, Counts, Counts) {
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[4900, 1_000_000])
        .await;
    let scope = scope_of(&app, &ada).await;
    let read = json!({"charge": ada.charges[0]});
    let refund = |amount: u64| json!({"charge": ada.charges[1], "amount": amount, "reason": "requested_by_customer"});
    call(&app, &scope, "stripe.get_charge", read.clone()).await;
    call(&app, &scope, "stripe.create_refund", refund(100)).await;
    let read = call(&app, &scope, "stripe.get_charge", read).await;
    let write = call(&app, &scope, "stripe.create_refund", refund(200)).await;
    let list = json!({"customer": ada.id, "limit": 1});
    call(&app, &scope, "stripe.list_charges", list.clone()).await;
    let limited = call(&app, &scope, "stripe.list_charges", list).await;
    app.stop().await;
    (read, write, limited)
}

async fn world() -> World {
    // And a read whose rule reserves a limit no call here exhausts.
    let policy = format!("{REFUNDS_RUN_POLICY}{}", limited_reads_rule(1_000_000));
    let mut world = World::with_policy_text(&policy).await;
    world.use_stripe_events("whsec_counts_0123456789").await;
    world
}

/// Prepares depend on which pooled connection a call gets: not asserted.
fn without_prepares(counts: Counts) -> Counts {
    Counts {
        prepares: 0,
        ..counts
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_and_a_write_each_commit_once_durably_with_these_statements_on_sqlite() {
    let (read, write, limited) = counts_of(&world().await).await;
    println!("sqlite: read {read:?}\nsqlite: write {write:?}\nsqlite: limited read {limited:?}");
    // A read: the first look-up (the secrets' generation and the Stripe customer-change
    // mark, one statement) before the call and again before its result is redacted
    // (the Stripe key's generation is the first look-up's: `secrets::call_generation`);
    // its decision, committed while it is sent (the row inserted under the lease, the
    // audit chain's head, two audit rows); its outcome, a commit that skips the fsync
    // (status, the chain's head, one audit row). One request to Stripe: the call itself
    // (owner and email remembered).
    assert_eq!(
        read,
        Counts {
            commits: 1,
            unflushed_commits: 1,
            reads: 2,
            statements: 2 + 4 + 3,
            round_trips: 0,
            prepares: 0,
            provider_requests: 1,
        }
    );
    // A write: the first look-up twice (its generation serves both Stripe requests: the
    // charge with its customer, for ownership, currency and amount; then the refund);
    // the deciding transaction (fence, the session's earlier calls, the row, the
    // chain's head, two audit rows), durable before the refund is sent, and the
    // outcome's (status, the chain's head, one audit row), which skips the fsync: Stripe
    // deduplicates by the call's idempotency key, so recovery re-sends a lost one.
    assert_eq!(
        write,
        Counts {
            commits: 1,
            unflushed_commits: 1,
            reads: 2,
            statements: 2 + 6 + 3,
            round_trips: 0,
            prepares: 0,
            provider_requests: 2,
        }
    );
    // A read whose rule reserves a limit: the first look-up twice; the deciding
    // transaction (fence, the limit's total, the row, its charge, the chain's head, two
    // audit rows; no look-up of the session's earlier calls: it has no hold mark) and the
    // outcome's (status, the chain's head, one audit row).
    assert_eq!(
        limited,
        Counts {
            commits: 2,
            unflushed_commits: 0,
            reads: 2,
            statements: 2 + 7 + 3,
            round_trips: 0,
            prepares: 0,
            provider_requests: 1,
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_and_a_write_with_these_commits_and_round_trips_on_postgres() {
    let Some(pg) = TestDb::postgres_from_env() else {
        eprintln!("THREADGATE_TEST_DATABASE_URL is not set: skipped");
        return;
    };
    let mut world = world().await;
    world.use_postgres(pg.url().expect("a postgres url")).await;
    let (read, write, limited) = counts_of(&world).await;
    println!(
        "postgres: read {read:?}\npostgres: write {write:?}\npostgres: limited read {limited:?}"
    );
    // On Postgres a transaction's audit rows are not chained in it: they go to
    // `audit_pending` in one statement, and are chained after its commit by the store's
    // background thread (its own connection and transaction: not the call's work, and
    // not waited for). Every statement is a round trip, and so are each transaction's
    // BEGIN and COMMIT (the small reads run outside a transaction: one round trip each).
    //
    // A read: the small reads; its decision, one statement with no transaction around
    // it (the row under the lease and the two pending rows: `audit::append_after`),
    // committed while it is sent; its outcome, one statement that turns
    // `synchronous_commit` off for itself.
    assert_eq!(
        without_prepares(read),
        Counts {
            commits: 1,
            unflushed_commits: 1,
            reads: 2,
            statements: 2 + 1 + 1,
            round_trips: 2 + 1 + 1,
            prepares: 0,
            provider_requests: 1,
        }
    );
    // A write: the small reads; the deciding transaction (fence, the session's earlier
    // calls, the row with its pending rows in one statement:
    // `executions::audit::insert_decided`); the outcome, one statement with no
    // transaction around it (the status and the pending row: `audit::append_after`),
    // which turns `synchronous_commit` off for itself (a Stripe call: re-sent with its
    // key if lost).
    assert_eq!(
        without_prepares(write),
        Counts {
            commits: 1,
            unflushed_commits: 1,
            reads: 2,
            statements: 2 + 3 + 1,
            round_trips: 2 + (3 + 2) + 1,
            prepares: 0,
            provider_requests: 2,
        }
    );
    // A read whose rule reserves a limit: the small reads; the deciding transaction
    // (fence, the limit key's lock, its total, then one statement: the row, its charge,
    // the pending rows and `synchronous_commit` off; no look-up of the session's earlier
    // calls: it has no hold mark); the outcome, one statement.
    assert_eq!(
        without_prepares(limited),
        Counts {
            commits: 2,
            unflushed_commits: 0,
            reads: 2,
            statements: 2 + 4 + 1,
            round_trips: 2 + (4 + 2) + 1,
            prepares: 0,
            provider_requests: 1,
        }
    );
    drop(pg);
}

/// A read whose session's lease was taken over after it was decided: its row insert
/// carries the fence (no statement of its own), so nothing is written and the agent
/// gets `session_moved`, not the result.
async fn a_stale_lease_writes_no_read(world: &World) {
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[4900])
        .await;
    let scope = scope_of(&app, &ada).await;
    let read = json!({"charge": ada.charges[0]});
    call(&app, &scope, "stripe.get_charge", read.clone()).await;
    let thread = ada.session.thread_id.clone();
    let changed = app
        .db
        .write(move |c| {
            c.execute(
                "UPDATE session_leases SET owner = 'inst-elsewhere', token = token + 1, \
                 expires_at_ms = 4000000000000000 WHERE thread_id = ?1",
                [&thread],
            )
        })
        .await
        .expect("take the lease over");
    assert_eq!(changed, 1);
    let req: CallRequest =
        serde_json::from_value(json!({"tool": "stripe.get_charge", "args": read}))
            .expect("a call request");
    let reply = app.gate.call(&scope, req).await;
    assert!(
        matches!(
            reply,
            CallReply::Refused(threadgate::gateway::refusal::Refusal::SessionMoved)
        ),
        "{reply:?}"
    );
    let session = ada.session.id.clone();
    let rows: i64 = app
        .db
        .read(move |c| {
            c.query_row(
                "SELECT count(*) FROM executions WHERE session_id = ?1",
                [&session],
                |r| r.get(0),
            )
        })
        .await
        .expect("count");
    assert_eq!(rows, 1, "only the read made under the lease is recorded");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_under_a_stale_lease_is_not_written_on_sqlite() {
    a_stale_lease_writes_no_read(&world().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_under_a_stale_lease_is_not_written_on_postgres() {
    let Some(pg) = TestDb::postgres_from_env() else {
        eprintln!("THREADGATE_TEST_DATABASE_URL is not set: skipped");
        return;
    };
    let mut world = world().await;
    world.use_postgres(pg.url().expect("a postgres url")).await;
    a_stale_lease_writes_no_read(&world).await;
    drop(pg);
}
