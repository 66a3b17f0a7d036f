//! A session whose lease this instance cannot renew (the database slow for that row or
//! locked, this process starved) is dropped here before the lease expires: another instance may
//! take the thread over only after the expiry, so the two never run a container of the
//! thread at once. Then, the lease expired, the thread is taken over again (here: the
//! only instance) and its session answers.

use std::time::Duration;

use crate::support::pg_hold::{hold_open, let_go};
use crate::support::wait::wait_for;
use crate::support::world::World;

/// Short, so the test is quick; its quarter (1 s) is the time the instance gives itself
/// to stop the container before the expiry.
const LEASE: Duration = Duration::from_secs(4);

/// How the test keeps the thread's lease from being renewed, and lets go.
enum Hold {
    /// Postgres: the lease row held `FOR UPDATE` by another transaction (that lease
    /// alone cannot be renewed).
    Postgres(threadgate::store::testing::TestDb),
    /// SQLite: the database's write lock held by another connection (`BEGIN
    /// IMMEDIATE`: no write gets through, renewals included).
    Sqlite,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_whose_lease_cannot_be_renewed_is_dropped_before_it_expires() {
    let Some(pg) = threadgate::store::testing::TestDb::postgres_from_env() else {
        eprintln!("skipped: THREADGATE_TEST_DATABASE_URL is not set");
        return;
    };
    dropped_before_expiry(Hold::Postgres(pg)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_whose_database_is_locked_is_dropped_before_its_lease_expires() {
    dropped_before_expiry(Hold::Sqlite).await;
}

async fn dropped_before_expiry(hold: Hold) {
    let mut world = World::new().await;
    if let Hold::Postgres(pg) = &hold {
        world.use_postgres(pg.url().expect("a postgres url")).await;
    }
    world.settings.sessions.lease_time = LEASE;
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[4900])
        .await;
    let thread = ada.session.thread_id.clone();
    let running = || {
        world
            .sandbox
            .containers()
            .iter()
            .filter(|c| c.thread_id.as_str() == thread && c.running)
            .count()
    };
    assert_eq!(running(), 1);

    // Every renewal of the thread's lease now waits for this transaction; the lease's
    // expiry as its last renewal left it is what another instance would wait for.
    let held = match &hold {
        Hold::Postgres(pg) => {
            let lock = "SELECT 1 FROM session_leases WHERE thread_id = ?1 FOR UPDATE";
            Held::Postgres(hold_open(pg, lock, thread.clone()).await)
        }
        Hold::Sqlite => Held::Sqlite(lock_sqlite(&world.settings.database_path()).await),
    };
    let t = thread.clone();
    let expires_at_ms: i64 = app
        .db
        .read(move |c| {
            c.query_row(
                "SELECT expires_at_ms FROM session_leases WHERE thread_id = ?1",
                [&t],
                |r| r.get(0),
            )
        })
        .await
        .expect("the lease's expiry");
    let dropped = wait_for(LEASE * 3, || async {
        (running() == 0).then(|| chrono::Utc::now().timestamp_millis())
    })
    .await;
    let dropped_at_ms = dropped.expect("the session is dropped while its lease cannot be renewed");
    assert!(
        dropped_at_ms < expires_at_ms,
        "the container was stopped {} ms after the lease expired",
        dropped_at_ms - expires_at_ms
    );
    println!(
        "the container was stopped {} ms before the lease expired",
        expires_at_ms - dropped_at_ms
    );
    // Its socket is closed right after.
    let closed = wait_for(LEASE, || async {
        let accepts = tokio::net::UnixStream::connect(&ada.session.socket).await;
        accepts.is_err().then_some(())
    })
    .await;
    assert!(
        closed.is_some(),
        "the dropped session's socket still accepts"
    );
    match held {
        Held::Postgres((release, holding)) => let_go(release, holding).await,
        Held::Sqlite(release) => release.send(()).expect("release the write lock"),
    }

    // Once the lease has expired, the thread is taken over (here, the one instance) in
    // a fresh container, and its session answers again.
    let socket_of = |session: &str| world.settings.sockets_dir().join(session).join("api.sock");
    let started = wait_for(LEASE * 8, || async {
        let container = world
            .sandbox
            .containers()
            .into_iter()
            .find(|c| c.thread_id.as_str() == thread && c.running)?;
        let socket = socket_of(container.session_id.as_str());
        tokio::net::UnixStream::connect(&socket).await.ok()?;
        Some(())
    })
    .await;
    assert!(started.is_some(), "the thread was not taken over again");
    let back = world.session_of(&app, &thread).await;
    assert_eq!(back.get("/v1/agent").await.0, 200);
    assert_eq!(running(), 1);
    app.stop().await;
}

/// What [`Hold`] holds while the test waits.
enum Held {
    Postgres((std::sync::mpsc::Sender<()>, tokio::task::JoinHandle<()>)),
    Sqlite(std::sync::mpsc::Sender<()>),
}

/// Takes the SQLite file's write lock on a connection of its own (a thread of its own)
/// and keeps it until the returned sender says so; once this returns it is held.
async fn lock_sqlite(path: &std::path::Path) -> std::sync::mpsc::Sender<()> {
    let path = path.to_owned();
    let (locked_tx, locked) = std::sync::mpsc::channel::<()>();
    let (release, released) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        let conn = threadgate::store::rusqlite::Connection::open(path).expect("open the db");
        conn.busy_timeout(Duration::from_secs(30))
            .expect("busy timeout");
        conn.execute_batch("BEGIN IMMEDIATE")
            .expect("the write lock");
        locked_tx.send(()).expect("say it is held");
        let _ = released.recv();
        conn.execute_batch("ROLLBACK").expect("let go");
    });
    tokio::task::spawn_blocking(move || locked.recv())
        .await
        .expect("join")
        .expect("the lock is held");
    release
}
