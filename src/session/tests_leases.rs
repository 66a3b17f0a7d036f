//! Several supervisors on one database (in-memory fakes for Docker, git and the socket,
//! one fake engine per instance): each thread's session runs on the instance holding
//! its lease, events stored anywhere are applied once by that owner, a lost lease stops
//! the container here without a write, and a dead owner's session is taken over in a
//! fresh container.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use super::tests::{FakeApi, FakeWorkspaces, NoSecrets, support_agent, tid};
use super::*;
use crate::ids::ThreadId;
use crate::sandbox::{FakeRuntime, Limits, SandboxRuntime};
use crate::store::Db;
use crate::store::leases;
use crate::tasks::Tasks;

const START_MS: i64 = 1_700_000_000_000;

/// One instance: its own engine, workspaces and supervisor, the shared database file.
struct Instance {
    db: Db,
    sandbox: Arc<FakeRuntime>,
    handle: SupervisorHandle,
    tasks: Tasks,
}

fn instance(dir: &Path, id: &str, now: &Arc<AtomicI64>, lease_time: Duration) -> Instance {
    let db = Db::open(&dir.join("shared.db")).expect("db");
    let sandbox = Arc::new(FakeRuntime::new());
    let tasks = Tasks::new();
    let clock_now = now.clone();
    let (handle, _task) = Supervisor::spawn(SupervisorParts {
        db: db.clone(),
        instance_id: id.to_owned(),
        sandbox: sandbox.clone(),
        workspaces: Arc::new(FakeWorkspaces {
            root: dir.join(id).join("worktrees"),
            ..Default::default()
        }),
        api: Arc::new(FakeApi::default()),
        agents: Arc::new(support_agent()),
        secrets: Arc::new(NoSecrets),
        image: "img".into(),
        limits: Limits::default(),
        sockets_dir: dir.join(id).join("sockets"),
        settings: SessionSettings {
            max_live: 8,
            idle_timeout: Duration::from_secs(600),
            reconcile_every: Duration::from_secs(3600),
            workspace_bytes: 0,
            lease_time,
            ..SessionSettings::default()
        },
        default_agent: "support".into(),
        checkpoint_every: Duration::ZERO,
        pool: None,
        pod_sync: None,
        clock: crate::clock::Clock::from_fn(move || clock_now.load(Ordering::SeqCst)),
        publisher: None,
        notes: None,
        tasks: tasks.clone(),
    });
    Instance {
        db,
        sandbox,
        handle,
        tasks,
    }
}

impl Instance {
    async fn settle(&self) {
        for _ in 0..4 {
            self.handle.quiet().await;
            tokio::task::yield_now().await;
        }
    }

    /// How many of `thread`'s containers run here once `want` do, or after five seconds
    /// (a loaded machine may take more than a settle to start one).
    async fn running_soon(&self, thread: &str, want: usize) -> usize {
        let mut seen = self.running_of(thread).await;
        for _ in 0..50 {
            if seen == want {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            self.settle().await;
            seen = self.running_of(thread).await;
        }
        seen
    }

    async fn running_of(&self, thread: &str) -> usize {
        self.sandbox
            .list()
            .await
            .expect("list")
            .iter()
            .filter(|c| c.running && c.thread_id == thread)
            .count()
    }
}

/// Stores a customer's event as intake would (on any instance: it is in the database).
async fn store_event(db: &Db, event: &str, thread: &str, at: i64) {
    let (event, thread) = (event.to_owned(), thread.to_owned());
    db.write(move |c| {
        c.execute(
            "INSERT INTO events (event_id, event_type, class, thread_id, customer_id, \
             customer_email, actor, occurred_at_ms, received_at_ms, body) \
             VALUES (?1, 'thread.email_received', 'customer', ?2, 'c_1', 'a@example.com', \
             'customer', ?3, ?3, '{}')",
            crate::store::params![event, thread, at],
        )
    })
    .await
    .expect("insert event");
}

async fn owner_of(db: &Db, thread: &str) -> Option<(String, i64, bool)> {
    let t = tid(thread);
    db.read(move |c| leases::holder(c, &t, START_MS))
        .await
        .expect("read lease")
}

async fn session_row(db: &Db, thread: &str) -> store::SessionRow {
    let t = tid(thread);
    db.read(move |c| store::get(c, &t))
        .await
        .expect("read")
        .expect("a session")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_stored_anywhere_are_applied_once_by_the_owner_and_each_thread_runs_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let now = Arc::new(AtomicI64::new(START_MS));
    let lease = Duration::from_secs(15);
    let a = instance(dir.path(), "inst-a", &now, lease);
    let b = instance(dir.path(), "inst-b", &now, lease);
    let threads: Vec<String> = (0..6).map(|i| format!("th_{i}")).collect();
    for (i, thread) in threads.iter().enumerate() {
        store_event(&a.db, &format!("pEv_first_{i}"), thread, 1_000).await;
        // Both instances are told at once: they race for the thread.
        a.handle.thread_changed(&tid(thread));
        b.handle.thread_changed(&tid(thread));
    }
    a.settle().await;
    b.settle().await;
    for thread in &threads {
        // Each thread runs on the instance that won its lease; give a loaded machine time.
        let mut here = 0;
        for _ in 0..50 {
            here = a.running_of(thread).await + b.running_of(thread).await;
            if here >= 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            a.settle().await;
            b.settle().await;
        }
        assert_eq!(here, 1, "{thread}: one container across both instances");
        assert_eq!(
            session_row(&a.db, thread).await.state,
            SessionState::Running
        );
    }
    assert_eq!(a.sandbox.start_count() + b.sandbox.start_count(), 6);

    // A second message for each thread reaches only the instance that does not own it:
    // it is stored, and the owner's tick applies it.
    for (i, thread) in threads.iter().enumerate() {
        let (owner, _, live) = owner_of(&a.db, thread).await.expect("a lease");
        assert!(live, "{thread}: leased while it runs");
        store_event(&a.db, &format!("pEv_second_{i}"), thread, 2_000).await;
        let elsewhere = if owner == "inst-a" { &b } else { &a };
        elsewhere.handle.thread_changed(&tid(thread));
    }
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    a.settle().await;
    b.settle().await;
    let (pending, positions): (i64, Vec<(String, i64)>) =
        a.db.read(|c| {
            let pending = c.query_row(
                "SELECT count(*) FROM events WHERE applied_at_ms IS NULL",
                (),
                |r| r.get(0),
            )?;
            let mut stmt = c.prepare(
                "SELECT thread_id, thread_pos FROM events ORDER BY thread_id, thread_pos",
            )?;
            let rows = stmt.query_map((), |r| Ok((r.get(0)?, r.get(1)?)))?;
            Ok((pending, rows.collect::<crate::store::Result<Vec<_>>>()?))
        })
        .await
        .expect("read events");
    assert_eq!(pending, 0, "every event applied");
    let expected: Vec<(String, i64)> = threads
        .iter()
        .flat_map(|t| [(t.clone(), 1), (t.clone(), 2)])
        .collect();
    assert_eq!(positions, expected, "each event applied once, in order");
    assert_eq!(
        a.sandbox.start_count() + b.sandbox.start_count(),
        6,
        "no second container for a running session"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lease_stops_the_container_here_and_writes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let now = Arc::new(AtomicI64::new(START_MS));
    // Renewed every 100 ms.
    let a = instance(dir.path(), "inst-a", &now, Duration::from_millis(300));
    store_event(&a.db, "pEv_1", "th_1", 1_000).await;
    a.handle.thread_changed(&tid("th_1"));
    a.settle().await;
    assert_eq!(a.running_of("th_1").await, 1);
    let before = session_row(&a.db, "th_1").await;
    assert_eq!(before.state, SessionState::Running);

    // Another instance takes the lease over (as it would once inst-a had been paused
    // past the lease time): the token grows.
    let taken =
        a.db.write(|c| leases::acquire(c, &tid("th_1"), "inst-b", START_MS + 3_600_000, 15_000))
            .await
            .expect("acquire")
            .expect("expired by then");
    assert_eq!(taken.token, 2);

    // inst-a's next renewal is refused: its container goes, and nothing it writes lands.
    let mut gone = false;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        a.settle().await;
        if a.running_of("th_1").await == 0 {
            gone = true;
            break;
        }
    }
    assert!(gone, "the container of a lost lease still runs");
    let after = session_row(&a.db, "th_1").await;
    assert_eq!(
        after.state,
        SessionState::Running,
        "the new owner's state stays"
    );
    assert_eq!(after.container_id, before.container_id);
    assert_eq!(after.updated_at_ms, before.updated_at_ms);
    assert_eq!(
        owner_of(&a.db, "th_1").await.map(|(o, t, _)| (o, t)),
        Some(("inst-b".to_owned(), 2))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_whose_owner_died_is_taken_over_in_a_fresh_container() {
    let dir = tempfile::tempdir().expect("tempdir");
    let now = Arc::new(AtomicI64::new(START_MS));
    let lease = Duration::from_secs(15);
    let a = instance(dir.path(), "inst-a", &now, lease);
    store_event(&a.db, "pEv_1", "th_1", 1_000).await;
    a.handle.thread_changed(&tid("th_1"));
    a.settle().await;
    assert_eq!(a.running_soon("th_1", 1).await, 1);
    let old_container = session_row(&a.db, "th_1").await.container_id;
    // inst-b starts once inst-a owns the thread (started before, its tick could win the
    // unowned thread itself, which the race test above covers).
    let b = instance(dir.path(), "inst-b", &now, lease);

    // inst-a dies: its actor and its lease renewal stop at once.
    a.tasks.shutdown(Duration::ZERO).await;
    // Within the lease time, inst-b leaves the thread alone.
    tokio::time::sleep(Duration::from_millis(700)).await;
    b.settle().await;
    assert_eq!(
        b.sandbox.start_count(),
        0,
        "taken over before the lease expired"
    );

    // Past it, inst-b's tick takes the session over in a fresh container of its own.
    now.fetch_add(16_000, Ordering::SeqCst);
    let mut taken = false;
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        b.settle().await;
        if b.running_of("th_1").await == 1 {
            taken = true;
            break;
        }
    }
    assert!(taken, "inst-b did not take the session over");
    let row = session_row(&b.db, "th_1").await;
    assert_eq!(row.state, SessionState::Running);
    // (Each fake engine numbers its containers from 1: the ids compare equal.)
    assert!(old_container.is_some());
    let mine = b.sandbox.list().await.expect("list");
    assert_eq!(
        row.container_id.as_deref(),
        Some(mine[0].container_id.as_str())
    );
    let t: ThreadId = tid("th_1");
    let held =
        b.db.read(move |c| leases::holder(c, &t, START_MS + 16_000))
            .await
            .expect("lease");
    assert_eq!(held, Some(("inst-b".to_owned(), 2, true)));
    // The dead owner's container was never reached.
    assert_eq!(a.sandbox.stop_count(), 0);
    assert_eq!(a.running_of("th_1").await, 1);
}
