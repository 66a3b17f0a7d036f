//! The pool over the Kubernetes runtime, against the sandbox module's fake API server:
//! after a restart the pool takes over this instance's healthy parked pods, removes the
//! rest of its own and leaves another instance's alone. (Moved here from the sandbox
//! module's tests so that `sandbox` never imports `session`.)

use std::sync::Arc;
use std::time::Duration;

use crate::clock::Clock;
use crate::sandbox::SandboxRuntime as _;
use crate::sandbox::k8s::tests::fake_api::FakeApi;
use crate::sandbox::k8s::tests::{
    IMAGE, INSTANCE, park_spec, parked_object, runtime, settings, spec, until,
};
use crate::session::pool::{PoolSettings, SandboxPool};
use crate::tasks::Tasks;

/// After a restart the pool takes over this instance's parked pods that are ready and
/// of the configured image, removes its other parked pods, leaves another instance's
/// alone, and refills; a taken pod is adopted and replaced.
#[tokio::test]
async fn a_restarted_pool_keeps_its_healthy_parked_pods_and_removes_strays() {
    let fake = FakeApi::start(false).await;
    let before = runtime(&fake, settings()).await;
    let kept_a = before.park(&park_spec("support")).await.expect("park");
    let kept_b = before.park(&park_spec("support")).await.expect("park");
    drop(before);
    fake.insert(
        "pods",
        parked_object(INSTANCE, "tg-unready", "slot-1", IMAGE, None),
    );
    fake.insert(
        "pods",
        parked_object(INSTANCE, "tg-old-image", "slot-2", "old:1", Some("True")),
    );
    fake.insert(
        "pods",
        parked_object("other01", "tg-theirs", "slot-3", IMAGE, Some("True")),
    );

    let rt = Arc::new(runtime(&fake, settings()).await);
    let pool = SandboxPool::new(
        rt.clone(),
        vec![park_spec("support")],
        PoolSettings {
            size: 2,
            refill_per_second: 100,
            max_idle: Duration::from_secs(600),
        },
        Clock::system(),
    );
    let tasks = Tasks::new();
    tasks.spawn_until_shutdown(pool.clone().run(tasks.clone()));
    until("the strays removed", || fake.objects("pods").len() == 3).await;
    let mut held = pool.parked_ids("support");
    held.sort();
    let mut kept = vec![kept_a.name.clone(), kept_b.name.clone()];
    kept.sort();
    assert_eq!(
        held, kept,
        "the healthy ones are taken over, none parked anew"
    );
    assert!(
        fake.objects("pods").contains_key("tg-theirs"),
        "another instance's is left alone"
    );

    let taken = pool.take("support").expect("a warm pod");
    rt.adopt(&taken, &spec("s1")).await.expect("adopt");
    until("the pool refilled", || pool.parked("support") == 2).await;
    assert!(!pool.parked_ids("support").contains(&taken.container_id));
    assert_eq!(fake.objects("pods").len(), 4);
    let _ = tasks.shutdown(Duration::from_secs(5)).await;
}
