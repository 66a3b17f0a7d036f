//! The pool of parked sandboxes over the fake runtime: filling, taking, expiry, the
//! take-over at start, a runtime that cannot park, and the supervisor's warm and cold
//! launches. `kubernetes`: the pool over the Kubernetes runtime's fake API server.

mod kubernetes;

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use super::pool::{PoolSettings, SandboxPool};
use super::tests::harness_with_pool;
use crate::clock::Clock;
use crate::sandbox::{
    FakeRuntime, Limits, ParkSpec, ParkedSandbox, SandboxError, SandboxRuntime as _,
};
use crate::session::SessionState;
use crate::tasks::Tasks;

const START_MS: i64 = 1_700_000_000_000;

fn spec(pool: &str) -> ParkSpec {
    ParkSpec {
        pool: pool.into(),
        image: "img".into(),
        limits: Limits::default(),
        command: None,
        env: vec![("THREADGATE_AGENT".into(), pool.into())],
    }
}

fn settings(size: usize) -> PoolSettings {
    PoolSettings {
        size,
        refill_per_second: 100,
        max_idle: Duration::from_secs(60),
    }
}

struct World {
    fake: Arc<FakeRuntime>,
    pool: Arc<SandboxPool>,
    now: Arc<AtomicI64>,
    tasks: Tasks,
}

fn world(fake: FakeRuntime, agents: &[&str], size: usize) -> World {
    let fake = Arc::new(fake);
    fake.set_now_ms(START_MS);
    let now = Arc::new(AtomicI64::new(START_MS));
    let clock_now = now.clone();
    let pool = SandboxPool::new(
        fake.clone(),
        agents.iter().map(|a| spec(a)).collect(),
        settings(size),
        Clock::from_fn(move || clock_now.load(Ordering::SeqCst)),
    );
    World {
        fake,
        pool,
        now,
        tasks: Tasks::new(),
    }
}

impl World {
    fn run(&self) {
        let pool = self.pool.clone();
        self.tasks
            .spawn_until_shutdown(pool.run(self.tasks.clone()));
    }

    /// Waits (bounded) until `check` holds.
    async fn until(&self, what: &str, check: impl Fn(&World) -> bool) {
        for _ in 0..400 {
            if check(self) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("timed out waiting for {what}");
    }
}

#[tokio::test]
async fn each_agent_gets_its_pool_filled_and_a_take_is_refilled() {
    let w = world(FakeRuntime::with_pool(), &["support", "billing"], 2);
    w.run();
    w.until("both pools full", |w| {
        w.pool.parked("support") == 2 && w.pool.parked("billing") == 2
    })
    .await;
    assert_eq!(w.fake.park_count(), 4, "no more than the pools' size");

    let first = w.pool.take("support").expect("a parked sandbox");
    assert_eq!(first.pool, "support");
    assert!(!w.pool.parked_ids("support").contains(&first.container_id));
    w.until("the support pool refilled", |w| {
        w.pool.parked("support") == 2
    })
    .await;
    assert_eq!(w.fake.park_count(), 5);
    assert!(
        !w.pool.parked_ids("support").contains(&first.container_id),
        "a taken sandbox never comes back"
    );
    assert!(
        w.pool.take("nobody").is_none(),
        "an unknown agent is a miss"
    );
}

#[tokio::test]
async fn two_takes_never_get_the_same_sandbox_and_an_adopted_one_is_refused_again() {
    let w = world(FakeRuntime::with_pool(), &["support"], 2);
    w.run();
    w.until("the pool full", |w| w.pool.parked("support") == 2)
        .await;
    let (a, b) = (
        w.pool.take("support").unwrap(),
        w.pool.take("support").unwrap(),
    );
    assert_ne!(a.container_id, b.container_id);
    let spec_a = sandbox_spec("ses_a", "th_a");
    w.fake.adopt(&a, &spec_a).await.expect("adopt a");
    let again = w.fake.adopt(&a, &sandbox_spec("ses_b", "th_b")).await;
    assert!(
        matches!(again, Err(SandboxError::NotAdoptable { .. })),
        "{again:?}"
    );
    let listed = w.fake.list().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].thread_id, "th_a");
}

#[tokio::test]
async fn a_sandbox_parked_past_its_idle_time_is_replaced_and_never_handed_out() {
    let w = world(FakeRuntime::with_pool(), &["support"], 1);
    w.run();
    w.until("the pool full", |w| w.pool.parked("support") == 1)
        .await;
    let old = w.pool.parked_ids("support");
    w.now.fetch_add(61_000, Ordering::SeqCst);
    assert!(
        w.pool.take("support").is_none(),
        "an expired sandbox is a miss, never adopted"
    );
    w.until("a fresh sandbox parked", |w| {
        w.pool.parked("support") == 1 && w.pool.parked_ids("support") != old
    })
    .await;
    let parked: Vec<String> = w
        .fake
        .parked()
        .into_iter()
        .map(|p| p.container_id)
        .collect();
    assert!(
        !parked.contains(&old[0]),
        "the expired one is removed: {parked:?}"
    );
}

#[tokio::test]
async fn at_start_clean_fresh_sandboxes_are_taken_over_and_the_rest_removed() {
    let fake = FakeRuntime::with_pool();
    fake.set_now_ms(START_MS);
    // Left by an earlier run: fresh and clean, of another image, of an agent no longer
    // defined, and one that is too old.
    let keep = fake.park(&spec("support")).await.unwrap();
    let other_image = fake
        .park(&ParkSpec {
            image: "old-img".into(),
            ..spec("support")
        })
        .await
        .unwrap();
    let gone_agent = fake.park(&spec("retired")).await.unwrap();
    fake.set_now_ms(START_MS - 120_000);
    let stale = fake.park(&spec("support")).await.unwrap();
    fake.set_now_ms(START_MS);
    let w = world(fake, &["support"], 2);
    w.run();
    w.until("the pool full", |w| w.pool.parked("support") == 2)
        .await;
    let held = w.pool.parked_ids("support");
    assert!(held.contains(&keep.container_id), "{held:?}");
    let parked: Vec<String> = w
        .fake
        .parked()
        .into_iter()
        .map(|p| p.container_id)
        .collect();
    for removed in [&other_image, &gone_agent, &stale] {
        assert!(
            !parked.contains(&removed.container_id),
            "{} should be removed",
            removed.container_id
        );
    }
}

#[tokio::test]
async fn a_runtime_that_cannot_park_turns_the_pool_off() {
    let w = world(FakeRuntime::new(), &["support"], 2);
    w.run();
    w.until("the pool off", |w| w.pool.off().is_some()).await;
    assert!(w.pool.take("support").is_none());
    assert_eq!(w.fake.park_count(), 0);
}

#[tokio::test]
async fn a_failed_park_backs_off_instead_of_looping() {
    let w = world(FakeRuntime::with_pool(), &["support"], 1);
    w.fake.fail_next_park(SandboxError::ImageMissing {
        image: "img".into(),
    });
    w.run();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(w.fake.park_count(), 0, "retried only after the back-off");
    // The pool's clock moves past the back-off: the next park succeeds.
    w.now.fetch_add(120_000, Ordering::SeqCst);
    w.fake.set_now_ms(START_MS + 120_000);
    w.until("the pool full", |w| w.pool.parked("support") == 1)
        .await;
}

fn sandbox_spec(session: &str, thread: &str) -> crate::sandbox::SandboxSpec {
    crate::sandbox::SandboxSpec {
        session_id: crate::ids::SessionId::parse(session).unwrap(),
        thread_id: crate::ids::ThreadId::parse(thread).unwrap(),
        image: "img".into(),
        workspace_dir: "/nonexistent".into(),
        socket_dir: "/nonexistent".into(),
        secrets: vec![],
        limits: Limits::default(),
        command: None,
        env: vec![],
    }
}

async fn full_pool(fake: &Arc<FakeRuntime>, size: usize) -> Arc<SandboxPool> {
    let pool = SandboxPool::new(
        fake.clone(),
        vec![spec("support")],
        settings(size),
        Clock::system(),
    );
    let tasks = Tasks::new();
    tasks.spawn_until_shutdown(pool.clone().run(tasks.clone()));
    for _ in 0..400 {
        if pool.parked("support") == size {
            return pool;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the pool never filled");
}

fn ids(parked: &[ParkedSandbox]) -> Vec<String> {
    parked.iter().map(|p| p.container_id.clone()).collect()
}

#[tokio::test]
async fn a_session_adopts_a_parked_sandbox_and_a_miss_starts_a_container() {
    let fake = Arc::new(FakeRuntime::with_pool());
    let pool = full_pool(&fake, 1).await;
    let parked = ids(&fake.parked());
    // The refill after the first take fails and backs off, so the pool stays empty.
    fake.fail_next_park(SandboxError::ImageMissing {
        image: "img".into(),
    });
    let (warm0, cold0) = (
        crate::metrics::session_launches("warm"),
        crate::metrics::session_launches("cold"),
    );
    let h = harness_with_pool(4, fake.clone(), None, Some(pool.clone()));
    h.event("th_1", "customer", 1_000).await;
    assert_eq!(h.state("th_1").await, Some(SessionState::Running));
    assert_eq!(
        fake.adopted(),
        parked,
        "the first thread adopted the parked sandbox"
    );
    assert_eq!(fake.start_count(), 0, "no container started for it");
    assert!(crate::metrics::session_launches("warm") > warm0);

    h.event("th_2", "customer", 1_000).await;
    assert_eq!(h.state("th_2").await, Some(SessionState::Running));
    assert_eq!(fake.start_count(), 1, "a miss starts a container");
    assert!(crate::metrics::session_launches("cold") > cold0);
    let listed = fake.list().await.unwrap();
    let th1 = listed.iter().find(|c| c.thread_id == "th_1").unwrap();
    let th2 = listed.iter().find(|c| c.thread_id == "th_2").unwrap();
    assert_eq!(th1.container_id, parked[0]);
    assert_ne!(
        th2.container_id, th1.container_id,
        "two threads never share one"
    );
}

#[tokio::test]
async fn an_adoption_that_fails_falls_back_to_a_cold_start() {
    let fake = Arc::new(FakeRuntime::with_pool());
    let pool = full_pool(&fake, 1).await;
    let parked = ids(&fake.parked());
    fake.fail_next_adopt(SandboxError::PoolUnsupported {
        reason: "test".into(),
    });
    let h = harness_with_pool(4, fake.clone(), None, Some(pool));
    h.event("th_1", "customer", 1_000).await;
    assert_eq!(h.state("th_1").await, Some(SessionState::Running));
    assert_eq!(fake.start_count(), 1, "started cold");
    let listed = fake.list().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert!(
        !parked.contains(&listed[0].container_id),
        "the sandbox whose adoption failed is not the thread's"
    );
    assert!(
        !ids(&fake.parked()).contains(&parked[0]),
        "and it is never parked again"
    );
}

/// A parked sandbox refused as not adoptable (another adopter won it: a 409 on
/// Kubernetes) is left to its winner, and the start takes the next one: still warm.
#[tokio::test]
async fn a_sandbox_another_adopter_won_is_skipped_for_the_next() {
    let fake = Arc::new(FakeRuntime::with_pool());
    let pool = full_pool(&fake, 2).await;
    let parked = ids(&fake.parked());
    fake.fail_next_adopt(SandboxError::NotAdoptable {
        container: parked[0].clone(),
        reason: "another adopter won it".into(),
    });
    let h = harness_with_pool(4, fake.clone(), None, Some(pool));
    h.event("th_1", "customer", 1_000).await;
    assert_eq!(h.state("th_1").await, Some(SessionState::Running));
    assert_eq!(
        fake.start_count(),
        0,
        "no container started: the next one was adopted"
    );
    let listed = fake.list().await.unwrap();
    let th1 = listed.iter().find(|c| c.thread_id == "th_1").unwrap();
    assert!(parked.contains(&th1.container_id));
    assert_eq!(fake.adopted().len(), 2, "two tried, one adopted");
}
