//! Orchestration tests with in-memory fakes for Docker, git and the socket; the real
//! backends have their own integration tests under `tests/`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::SessionSettings;
use super::*;
use crate::ids::ThreadId;
use crate::sandbox::{FakeRuntime, Limits, SandboxRuntime};
use crate::secrets::SecretString;
use crate::store::Db;

mod checkpoint;
mod pod_sync;

#[derive(Default)]
pub(super) struct FakeWorkspaces {
    pub(super) root: PathBuf,
    pub(super) log: Mutex<Vec<String>>,
    /// While true, a commit waits (after logging) until it is set back to false.
    pub(super) hold_commits: Arc<(Mutex<bool>, std::sync::Condvar)>,
    /// Commits running now, and the most that ever ran at once.
    pub(super) in_commit: std::sync::atomic::AtomicUsize,
    pub(super) most_in_commit: std::sync::atomic::AtomicUsize,
}

impl FakeWorkspaces {
    fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    fn hold_commits(&self, hold: bool) {
        let (lock, cvar) = &*self.hold_commits;
        *lock.lock().unwrap() = hold;
        cvar.notify_all();
    }
}

impl WorkspaceOps for FakeWorkspaces {
    fn branch_name(&self, thread_id: &ThreadId) -> String {
        format!("threadgate/{thread_id}")
    }
    fn prepare(&self, thread_id: &ThreadId) -> anyhow::Result<PreparedWorktree> {
        let path = self.root.join(thread_id);
        std::fs::create_dir_all(&path)?;
        self.log
            .lock()
            .unwrap()
            .push(format!("prepare {thread_id}"));
        Ok(PreparedWorktree {
            path,
            branch: format!("threadgate/{thread_id}"),
        })
    }
    fn commit(
        &self,
        thread_id: &ThreadId,
        _worktree: &Path,
        _secrets: &[(String, SecretString)],
    ) -> anyhow::Result<CommitReport> {
        self.log.lock().unwrap().push(format!("commit {thread_id}"));
        let running = self.in_commit.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_in_commit.fetch_max(running, Ordering::SeqCst);
        let (lock, cvar) = &*self.hold_commits;
        let held = lock.lock().unwrap();
        drop(cvar.wait_while(held, |hold| *hold).unwrap());
        self.in_commit.fetch_sub(1, Ordering::SeqCst);
        Ok(CommitReport::default())
    }
    fn remove_worktree(&self, thread_id: &ThreadId) -> anyhow::Result<()> {
        self.log.lock().unwrap().push(format!("remove {thread_id}"));
        Ok(())
    }
    fn push(&self, _thread_id: &ThreadId) -> anyhow::Result<()> {
        Ok(())
    }
    fn changed_files(
        &self,
        thread_id: &ThreadId,
        limit: usize,
    ) -> anyhow::Result<crate::workspace::ChangedFiles> {
        self.log.lock().unwrap().push(format!("diff {thread_id}"));
        let files = vec![(
            "FINDINGS.md".to_owned(),
            crate::workspace::FileChange::Added,
        )];
        Ok(crate::workspace::ChangedFiles {
            total: files.len(),
            files: files.into_iter().take(limit).collect(),
        })
    }
}

#[derive(Default)]
pub(super) struct FakeApi {
    open: Mutex<Vec<String>>,
}

#[async_trait::async_trait]
impl SessionApi for FakeApi {
    async fn open(&self, scope: SessionScope, _dir: PathBuf) -> anyhow::Result<()> {
        self.open.lock().unwrap().push(scope.session_id.to_string());
        Ok(())
    }
    async fn close(&self, session_id: &str) {
        self.open.lock().unwrap().retain(|s| s != session_id);
    }
}

pub(super) struct NoSecrets;

#[async_trait::async_trait]
impl SecretSource for NoSecrets {
    async fn for_agent(
        &self,
        _: &str,
        asked: &[String],
    ) -> anyhow::Result<Vec<(String, SecretString)>> {
        anyhow::ensure!(asked.is_empty(), "not granted: {}", asked.join(", "));
        Ok(Vec::new())
    }
    async fn all(&self) -> anyhow::Result<Vec<(String, SecretString)>> {
        Ok(Vec::new())
    }
}

pub(super) struct Harness {
    _dir: tempfile::TempDir,
    db: Db,
    pub(super) sandbox: Arc<FakeRuntime>,
    workspaces: Arc<FakeWorkspaces>,
    handle: SupervisorHandle,
    now: Arc<AtomicI64>,
    next_event: AtomicI64,
}

fn settings(max_live: usize) -> SessionSettings {
    SessionSettings {
        max_live,
        idle_timeout: Duration::from_secs(60),
        reconcile_every: Duration::from_secs(3600),
        workspace_bytes: 0,
        ..SessionSettings::default()
    }
}

fn harness_with(
    max_live: usize,
    sandbox: Arc<FakeRuntime>,
    db_dir: Option<tempfile::TempDir>,
) -> Harness {
    harness_full(
        max_live,
        sandbox,
        db_dir,
        Duration::from_secs(300),
        None,
        None,
    )
}

fn harness_checkpointing(
    max_live: usize,
    sandbox: Arc<FakeRuntime>,
    db_dir: Option<tempfile::TempDir>,
    checkpoint_every: Duration,
) -> Harness {
    harness_full(max_live, sandbox, db_dir, checkpoint_every, None, None)
}

/// A harness whose supervisor takes parked sandboxes from `pool` (over `sandbox`).
pub(super) fn harness_with_pool(
    max_live: usize,
    sandbox: Arc<FakeRuntime>,
    db_dir: Option<tempfile::TempDir>,
    pool: Option<Arc<crate::session::SandboxPool>>,
) -> Harness {
    harness_full(
        max_live,
        sandbox,
        db_dir,
        Duration::from_secs(300),
        pool,
        None,
    )
}

/// A harness whose sessions' workspaces live in pods reached through `pods`.
pub(super) fn harness_with_pods(pods: Arc<dyn crate::session::PodSync>) -> Harness {
    harness_full(
        4,
        Arc::new(FakeRuntime::new()),
        None,
        Duration::from_secs(300),
        None,
        Some(pods),
    )
}

fn harness_full(
    max_live: usize,
    sandbox: Arc<FakeRuntime>,
    db_dir: Option<tempfile::TempDir>,
    checkpoint_every: Duration,
    pool: Option<Arc<crate::session::SandboxPool>>,
    pod_sync: Option<Arc<dyn crate::session::PodSync>>,
) -> Harness {
    let dir = db_dir.unwrap_or_else(|| tempfile::tempdir().expect("tempdir"));
    let db = Db::open(&dir.path().join("t.db")).expect("db");
    let workspaces = Arc::new(FakeWorkspaces {
        root: dir.path().join("worktrees"),
        ..Default::default()
    });
    let now = Arc::new(AtomicI64::new(1_700_000_000_000));
    let clock_now = now.clone();
    let agents = support_agent();
    let (handle, _task) = Supervisor::spawn(SupervisorParts {
        db: db.clone(),
        instance_id: "inst-test".into(),
        sandbox: sandbox.clone(),
        workspaces: workspaces.clone(),
        api: Arc::new(FakeApi::default()),
        agents: Arc::new(agents),
        secrets: Arc::new(NoSecrets),
        image: "img".into(),
        limits: Limits::default(),
        sockets_dir: dir.path().join("sockets"),
        settings: settings(max_live),
        default_agent: "support".into(),
        clock: crate::clock::Clock::from_fn(move || clock_now.load(Ordering::SeqCst)),
        publisher: None,
        notes: None,
        checkpoint_every,
        tasks: crate::tasks::Tasks::new(),
        pool,
        pod_sync,
    });
    Harness {
        _dir: dir,
        db,
        sandbox,
        workspaces,
        handle,
        now,
        next_event: AtomicI64::new(1),
    }
}

/// An agent book with the one `support` agent.
pub(super) fn support_agent() -> AgentBook {
    let mut agents = AgentBook::default();
    agents.insert(AgentDefinition {
        name: "support".into(),
        description: String::new(),
        command: None,
        tools: vec!["*".into()],
        secrets: vec![],
        skills: vec![],
        model: "scripted-model".into(),
        limits: Default::default(),
        harness: None,
        instructions: String::new(),
    });
    agents
}

fn harness(max_live: usize) -> Harness {
    harness_with(max_live, Arc::new(FakeRuntime::new()), None)
}

impl Harness {
    /// Stores an event as intake would and tells the supervisor.
    pub(super) async fn event(&self, thread: &str, class: &str, occurred_at_ms: i64) {
        let n = self.next_event.fetch_add(1, Ordering::SeqCst);
        let thread_owned = thread.to_owned();
        let class = class.to_owned();
        self.db
            .write(move |c| {
                c.execute(
                    "INSERT INTO events (event_id, event_type, class, thread_id, customer_id, \
                     customer_email, actor, occurred_at_ms, received_at_ms, body) \
                     VALUES (?1, 'thread.email_received', ?2, ?3, 'c_1', 'a@example.com', \
                     'customer', ?4, ?4, '{}')",
                    crate::store::params![format!("pEv_{n}"), class, thread_owned, occurred_at_ms],
                )
            })
            .await
            .expect("insert event");
        self.handle.thread_changed(&tid(thread));
        self.settle().await;
    }

    async fn settle(&self) {
        // Each operation reports back through the supervisor's queue; two rounds cover
        // an operation that triggers another (a stop that frees a slot for a start).
        for _ in 0..4 {
            self.handle.quiet().await;
            tokio::task::yield_now().await;
        }
    }

    pub(super) async fn state(&self, thread: &str) -> Option<SessionState> {
        let thread = tid(thread);
        self.db
            .read(move |c| store::get(c, &thread))
            .await
            .expect("read")
            .map(|r| r.state)
    }

    pub(super) async fn running_containers(&self) -> usize {
        self.sandbox
            .list()
            .await
            .expect("list")
            .iter()
            .filter(|c| c.running)
            .count()
    }
}

#[tokio::test]
async fn the_first_customer_event_starts_one_container_and_later_ones_reuse_it() {
    let h = harness(4);
    h.event("th_1", "customer", 1_000).await;
    assert_eq!(h.state("th_1").await, Some(SessionState::Running));
    h.event("th_1", "customer", 2_000).await;
    h.event("th_1", "info", 3_000).await;
    assert_eq!(h.sandbox.start_count(), 1);
    assert_eq!(h.running_containers().await, 1);
}

#[tokio::test]
async fn a_second_thread_gets_a_second_container() {
    let h = harness(4);
    h.event("th_1", "customer", 1_000).await;
    h.event("th_2", "customer", 1_000).await;
    assert_eq!(h.running_containers().await, 2);
}

#[tokio::test]
async fn done_removes_the_container_commits_and_removes_the_worktree() {
    let h = harness(4);
    h.event("th_1", "customer", 1_000).await;
    h.event("th_1", "done", 2_000).await;
    assert_eq!(h.state("th_1").await, Some(SessionState::Ended));
    assert_eq!(h.running_containers().await, 0);
    assert_eq!(
        h.workspaces.log(),
        vec!["prepare th_1", "commit th_1", "diff th_1", "remove th_1"]
    );
}

#[tokio::test]
async fn an_event_older_than_done_does_not_reopen_the_thread() {
    let h = harness(4);
    h.event("th_1", "customer", 1_000).await;
    h.event("th_1", "done", 5_000).await;
    h.event("th_1", "customer", 3_000).await;
    assert_eq!(h.state("th_1").await, Some(SessionState::Ended));
    assert_eq!(h.sandbox.start_count(), 1);
    // A newer message reopens it on the same branch.
    h.event("th_1", "customer", 9_000).await;
    assert_eq!(h.state("th_1").await, Some(SessionState::Running));
    assert_eq!(h.sandbox.start_count(), 2);
}

#[tokio::test]
async fn done_is_remembered_until_the_session_has_ended_and_a_newer_message_cancels_it() {
    let h = harness(4);
    h.event("th_1", "customer", 1_000).await;
    // Applied together: DONE, then a newer message that reopens the thread.
    h.db.write(|c| {
        for (id, class, at) in [
            ("pEv_done", "done", 2_000),
            ("pEv_again", "customer", 3_000),
        ] {
            c.execute(
                "INSERT INTO events (event_id, event_type, class, thread_id, actor, \
                 occurred_at_ms, received_at_ms, body) \
                 VALUES (?1, 'thread.email_received', ?2, 'th_1', 'customer', ?3, ?3, '{}')",
                crate::store::params![id, class, at],
            )?;
        }
        Ok(())
    })
    .await
    .expect("insert events");
    h.handle.thread_changed(&tid("th_1"));
    h.settle().await;
    assert_eq!(h.state("th_1").await, Some(SessionState::Running));
    let flagged = h.db.read(store::stop_requests).await.expect("read");
    assert!(flagged.is_empty(), "the tick would stop a reopened thread");

    // DONE alone ends it, and the flag that remembered it is cleared.
    h.db.write(|c| {
        c.execute(
            "INSERT INTO events (event_id, event_type, class, thread_id, actor, \
             occurred_at_ms, received_at_ms, body) \
             VALUES ('pEv_done2', 'thread.thread_status_transitioned', 'done', 'th_1', \
             'user', 4000, 4000, '{}')",
            (),
        )?;
        Ok(())
    })
    .await
    .expect("insert done");
    h.handle.thread_changed(&tid("th_1"));
    h.settle().await;
    assert_eq!(h.state("th_1").await, Some(SessionState::Ended));
    assert!(
        h.db.read(store::stop_requests)
            .await
            .expect("read")
            .is_empty()
    );
}

#[tokio::test]
async fn a_stop_while_the_container_is_starting_ends_the_session_once_started() {
    let h = harness(4);
    h.db.write(|c| {
        c.execute(
            "INSERT INTO events (event_id, event_type, class, thread_id, actor, \
             occurred_at_ms, received_at_ms, body) \
             VALUES ('pEv_1', 'thread.thread_created', 'customer', 'th_1', 'system', \
             1000, 1000, '{}')",
            (),
        )
    })
    .await
    .expect("insert event");
    // Queued behind the event, so handled while the start is in flight.
    h.handle.thread_changed(&tid("th_1"));
    h.handle.stop(&tid("th_1")).await.expect("stop");
    let ended = async {
        loop {
            h.settle().await;
            if h.state("th_1").await == Some(SessionState::Ended) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), ended)
        .await
        .expect("the session ends");
    assert_eq!(h.running_containers().await, 0);
}

#[tokio::test]
async fn sessions_beyond_the_cap_wait_and_start_when_a_slot_frees() {
    let h = harness(2);
    for t in ["th_1", "th_2", "th_3"] {
        h.event(t, "customer", 1_000).await;
    }
    assert_eq!(h.running_containers().await, 2);
    assert_eq!(h.state("th_3").await, Some(SessionState::Queued));
    h.event("th_1", "done", 2_000).await;
    assert_eq!(h.state("th_3").await, Some(SessionState::Running));
    assert_eq!(h.running_containers().await, 2);
}

#[tokio::test]
async fn a_quiet_session_gives_up_its_container_and_resumes_on_its_next_event() {
    let h = harness(4);
    h.event("th_1", "customer", 1_000).await;
    h.now.fetch_add(61_000, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(600)).await;
    h.settle().await;
    assert_eq!(h.state("th_1").await, Some(SessionState::Idle));
    assert_eq!(h.running_containers().await, 0);
    assert!(h.workspaces.log().contains(&"commit th_1".to_owned()));
    h.event("th_1", "customer", 2_000).await;
    assert_eq!(h.state("th_1").await, Some(SessionState::Running));
}

#[tokio::test]
async fn a_decision_resumes_an_idle_session() {
    let h = harness(4);
    h.event("th_1", "customer", 1_000).await;
    h.now.fetch_add(61_000, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(600)).await;
    h.settle().await;
    assert_eq!(h.state("th_1").await, Some(SessionState::Idle));
    h.handle.resume(&tid("th_1"));
    h.settle().await;
    assert_eq!(h.state("th_1").await, Some(SessionState::Running));
}

#[tokio::test]
async fn while_paused_events_are_kept_and_sessions_start_after() {
    let h = harness(4);
    h.db.write(|c| store::set_paused(c, true))
        .await
        .expect("pause");
    h.event("th_1", "customer", 1_000).await;
    assert_eq!(h.state("th_1").await, Some(SessionState::Queued));
    assert_eq!(h.sandbox.start_count(), 0);
    h.db.write(|c| store::set_paused(c, false))
        .await
        .expect("unpause");
    tokio::time::sleep(Duration::from_millis(600)).await;
    h.settle().await;
    assert_eq!(h.state("th_1").await, Some(SessionState::Running));
}

#[tokio::test]
async fn an_operator_stop_request_ends_the_session() {
    let h = harness(4);
    h.event("th_1", "customer", 1_000).await;
    let asked =
        h.db.write(|c| store::request_stop(c, &tid("th_1")))
            .await
            .expect("stop");
    assert!(asked);
    tokio::time::sleep(Duration::from_millis(600)).await;
    h.settle().await;
    assert_eq!(h.state("th_1").await, Some(SessionState::Ended));
    assert_eq!(h.running_containers().await, 0);
}

#[tokio::test]
async fn machine_and_unknown_events_start_nothing() {
    let h = harness(4);
    h.event("th_1", "ignored", 1_000).await;
    h.event("th_1", "info", 1_000).await;
    assert_eq!(h.state("th_1").await, None);
    assert_eq!(h.sandbox.start_count(), 0);
}

#[tokio::test]
async fn a_failed_start_keeps_the_session_queued_for_a_retry() {
    let h = harness(4);
    h.sandbox
        .fail_next_start(crate::sandbox::SandboxError::ImageMissing {
            image: "img".into(),
        });
    h.event("th_1", "customer", 1_000).await;
    assert_eq!(h.state("th_1").await, Some(SessionState::Queued));
    h.now.fetch_add(10_000, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(600)).await;
    h.settle().await;
    assert_eq!(h.state("th_1").await, Some(SessionState::Running));
}

#[tokio::test]
async fn restart_adopts_live_containers_reaps_strays_and_resumes_vanished_ones() {
    let sandbox = Arc::new(FakeRuntime::new());
    let first = harness_with(4, sandbox.clone(), None);
    first.event("th_1", "customer", 1_000).await;
    first.event("th_2", "customer", 1_000).await;
    let containers = sandbox.list().await.expect("list");
    assert_eq!(containers.len(), 2);
    // threadgate dies; meanwhile th_2's container vanishes.
    first.handle.shutdown();
    let Harness { _dir: dir, db, .. } = first;
    drop(db);
    // A container labelled with this instance but belonging to no session.
    let stray = sandbox
        .start(&crate::sandbox::SandboxSpec {
            session_id: crate::ids::SessionId::parse("s_stray").expect("session id"),
            thread_id: tid("th_stray"),
            image: "img".into(),
            workspace_dir: dir.path().to_owned(),
            socket_dir: dir.path().to_owned(),
            secrets: vec![],
            limits: Limits::default(),
            command: None,
            env: vec![],
        })
        .await
        .expect("stray");
    let th2 = containers
        .iter()
        .find(|c| c.thread_id == "th_2")
        .expect("th_2");
    assert!(sandbox.vanish(&th2.container_id));
    let second = harness_with(4, sandbox.clone(), Some(dir));
    second.settle().await;
    assert_eq!(second.state("th_1").await, Some(SessionState::Running));
    assert_eq!(second.state("th_2").await, Some(SessionState::Running));
    let after = sandbox.list().await.expect("list");
    assert_eq!(after.len(), 2, "one container per live session: {after:?}");
    assert!(after.iter().all(|c| c.container_id != stray.container_id));
    assert!(
        after
            .iter()
            .any(|c| c.container_id == containers[0].container_id
                || c.container_id == containers[1].container_id)
    );
}

/// Makes every read of the sessions table fail, as a database that is down or locked
/// would, until [`restore_sessions_table`].
async fn break_sessions_table(db: &Db) {
    db.write(|c| c.execute_batch("ALTER TABLE sessions RENAME TO sessions_away"))
        .await
        .expect("rename");
}

async fn restore_sessions_table(db: &Db) {
    db.write(|c| c.execute_batch("ALTER TABLE sessions_away RENAME TO sessions"))
        .await
        .expect("rename back");
}

#[tokio::test]
async fn a_failed_read_of_live_sessions_stops_no_container() {
    let h = harness(4);
    h.event("th_1", "customer", 1_000).await;
    h.event("th_2", "customer", 1_000).await;
    assert_eq!(h.running_containers().await, 2);
    break_sessions_table(&h.db).await;
    h.handle.reconcile();
    h.settle().await;
    assert_eq!(
        h.running_containers().await,
        2,
        "a reconcile that could not read the live sessions stopped containers"
    );
    assert_eq!(h.sandbox.start_count(), 2, "nothing resumed either");
    // Once the database answers again, the next pass adopts both: nothing was lost.
    restore_sessions_table(&h.db).await;
    h.handle.reconcile();
    h.settle().await;
    assert_eq!(h.running_containers().await, 2);
    assert_eq!(h.sandbox.start_count(), 2);
    assert_eq!(h.state("th_1").await, Some(SessionState::Running));
}

#[tokio::test]
async fn failed_reads_in_the_tick_stop_and_start_nothing() {
    let h = harness(1);
    h.event("th_1", "customer", 1_000).await;
    h.event("th_2", "customer", 1_000).await;
    assert_eq!(h.state("th_2").await, Some(SessionState::Queued));
    assert!(
        h.db.write(|c| store::request_stop(c, &tid("th_1")))
            .await
            .expect("stop")
    );
    break_sessions_table(&h.db).await;
    // Ticks (every 500 ms) read the stop requests, the queue and the pause flag, and
    // idle sessions; every one of those reads fails now.
    h.now.fetch_add(10 * 60_000, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    h.settle().await;
    assert_eq!(h.running_containers().await, 1, "nothing stopped");
    assert_eq!(h.sandbox.start_count(), 1, "nothing started");
    restore_sessions_table(&h.db).await;
    // The stored stop request is still there and is carried out once reads work; the
    // freed slot goes to the queued thread.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    h.settle().await;
    assert_eq!(h.state("th_1").await, Some(SessionState::Ended));
    assert_eq!(h.state("th_2").await, Some(SessionState::Running));
}

pub(super) fn tid(text: &str) -> ThreadId {
    ThreadId::parse(text).expect("thread id")
}

#[tokio::test]
async fn a_secrets_reaper_waiting_on_container_starts_does_not_hold_the_supervisor() {
    let h = harness(4);
    // The reaper waits (as the Docker runtime's waits for every start in flight); the
    // reconciliation that starts it must not.
    let held = h.sandbox.hold_reaping().await;
    h.handle.reconcile();
    let served = tokio::time::timeout(Duration::from_secs(10), async {
        h.event("th_1", "customer", 1_000).await;
        h.state("th_1").await
    })
    .await;
    assert_eq!(
        served.ok().flatten(),
        Some(SessionState::Running),
        "the supervisor waited for the reaper"
    );
    drop(held);
}
