//! Parked pods on a cluster without agent-sandbox, against the fake API server: what a
//! parked pod holds (nothing of any thread), adoption as a conditional patch (409s, a
//! pod adopted once is never adopted again), a crash between adoption and binding, a
//! restart that finds its parked and adopted pods again, pods that never become ready,
//! and the watch's 410 Gone while parking. The pool's take-over of parked pods after a
//! restart is tested with the pool, in `session::pool_tests::kubernetes`.

use std::time::Duration;

use serde_json::{Value, json};

use super::fake_api::{FakeApi, IssuedToken};
use super::{
    IMAGE, INSTANCE, never_ready, park_spec, parked_object, pod_reads, runtime, settings, spec,
    with_flaky_watches,
};
use crate::sandbox::k8s::objects::{self, RELAY_AUDIENCE, SANDBOX_SERVICE_ACCOUNT};
use crate::sandbox::k8s::{ClaimMode, KubeRuntime, KubernetesSettings};
use crate::sandbox::{PodTokenError, SandboxError, SandboxRuntime as _};
use crate::secrets::SecretString;

fn pod_json(fake: &FakeApi, name: &str) -> Value {
    fake.objects("pods").remove(name).expect("the pod exists")
}

/// The token the kubelet projects into `pod`'s relay.
fn relay_token(fake: &FakeApi, pod: &Value) -> SecretString {
    SecretString::from(fake.pod_token(IssuedToken {
        pod_name: pod["metadata"]["name"].as_str().expect("name").into(),
        pod_uid: pod["metadata"]["uid"].as_str().expect("uid").into(),
        service_account: SANDBOX_SERVICE_ACCOUNT.into(),
        audience: RELAY_AUDIENCE.into(),
    }))
}

async fn session_of(rt: &KubeRuntime, token: &SecretString) -> Result<String, PodTokenError> {
    let verifier = crate::sandbox::SandboxRuntime::pod_token_verifier(rt).expect("a verifier");
    verifier.session_of(token).await.map(|s| s.to_string())
}

#[tokio::test]
async fn a_parked_pod_holds_nothing_of_any_thread() {
    let fake = FakeApi::start(false).await;
    let rt = runtime(&fake, settings()).await;
    let first = rt.park(&park_spec("support")).await.expect("park");
    let second = rt.park(&park_spec("support")).await.expect("park");
    assert!(first.clean && first.pool == "support" && first.image == IMAGE);
    assert!(first.name.starts_with("tg-tgtest01-pool-") && first.name.len() <= 63);

    // One of them serves a thread; the other still holds nothing of it.
    rt.adopt(&first, &spec("s1")).await.expect("adopt");
    let pod = pod_json(&fake, &second.name);
    let labels: Vec<&str> = pod["metadata"]["labels"]
        .as_object()
        .expect("labels")
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        labels,
        [
            "app.kubernetes.io/component",
            "app.kubernetes.io/managed-by",
            "app.kubernetes.io/name",
            "threadgate.instance",
            "threadgate.pool",
            "threadgate.slot",
        ]
    );
    assert_eq!(
        pod["metadata"]["labels"]["app.kubernetes.io/component"],
        "pool"
    );
    assert_eq!(pod["metadata"]["labels"]["threadgate.pool"], "support");
    assert!(pod["metadata"].get("annotations").is_none(), "{pod}");
    let sent = pod.to_string();
    for of_a_thread in ["s1", "th_s1", "threadgate.session", "threadgate.thread"] {
        assert!(
            !sent.contains(&format!("\"{of_a_thread}\"")),
            "{of_a_thread} in a parked pod: {sent}"
        );
    }
    assert!(!sent.contains("fake_key_granted_secret"));
    let agent = &pod["spec"]["containers"][0];
    assert_eq!(
        agent["env"],
        json!([{"name": "THREADGATE_AGENT", "value": "support"}])
    );
    assert_eq!(agent["command"], json!(["threadgate-agent-runner"]));
    // The relay's credential is the pod's own projected token, not a Secret.
    let spec_ = &pod["spec"];
    assert_eq!(spec_["serviceAccountName"], SANDBOX_SERVICE_ACCOUNT);
    assert_eq!(spec_["automountServiceAccountToken"], false);
    let credential = spec_["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .find(|v| v["name"] == "relay-credential")
        .expect("the relay's credential volume");
    assert!(credential.get("secret").is_none(), "{credential}");
    let projected = &credential["projected"]["sources"][0]["serviceAccountToken"];
    assert_eq!(projected["audience"], RELAY_AUDIENCE);
    assert_eq!(
        spec_["containers"][1]["args"],
        json!(objects::relay_args(&settings()))
    );
    assert!(
        fake.objects("secrets").is_empty(),
        "no Secret for a parked pod, nor for an adopted one"
    );
    let adopted = pod_json(&fake, &first.name).to_string();
    assert!(!adopted.contains("fake_key_granted_secret"));

    // Parked pods are not sessions' until adopted.
    let listed = rt.list().await.expect("list");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].container_id, first.name);
    let parked = rt.list_parked().await.expect("parked");
    assert_eq!(parked.len(), 1);
    assert_eq!(parked[0].container_id, second.name);
    assert!(parked[0].clean);
}

#[tokio::test]
async fn adoption_binds_one_session_once_and_the_relay_token_reaches_only_it() {
    let fake = FakeApi::start(false).await;
    let rt = runtime(&fake, settings()).await;
    let parked = rt.park(&park_spec("support")).await.expect("park");
    let token = relay_token(&fake, &pod_json(&fake, &parked.name));
    assert_eq!(
        session_of(&rt, &token).await,
        Err(PodTokenError::Unknown),
        "a parked pod's relay reaches no session"
    );

    let handle = rt.adopt(&parked, &spec("s1")).await.expect("adopt");
    assert_eq!(handle.container_id, parked.name);
    assert_eq!(session_of(&rt, &token).await.as_deref(), Ok("s1"));
    let pod = pod_json(&fake, &parked.name);
    assert_eq!(
        pod["metadata"]["labels"]["app.kubernetes.io/component"],
        "sandbox"
    );
    assert_eq!(pod["metadata"]["labels"]["threadgate.thread"], "th_s1");
    assert_eq!(pod["metadata"]["annotations"]["threadgate.session"], "s1");
    assert_eq!(
        pod["metadata"]["annotations"]["threadgate.adopted-by"],
        INSTANCE
    );
    let listed = rt.list().await.expect("list");
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (listed[0].session_id.as_str(), listed[0].thread_id.as_str()),
        ("s1", "th_s1")
    );
    assert!(listed[0].running);
    assert!(rt.list_parked().await.expect("parked").is_empty());

    // Never adopted again, by this instance or another; never removed by a refusal.
    let again = rt.adopt(&parked, &spec("s2")).await;
    assert!(
        matches!(again, Err(SandboxError::NotAdoptable { .. })),
        "{again:?}"
    );
    let other = KubeRuntime::with_client(
        fake.client(),
        "other01",
        settings(),
        super::CA.to_vec(),
        super::minter(),
    )
    .await
    .expect("runtime");
    let theirs = other.adopt(&parked, &spec("s3")).await;
    assert!(
        matches!(theirs, Err(SandboxError::NotAdoptable { .. })),
        "{theirs:?}"
    );
    assert!(other.list_parked().await.expect("parked").is_empty());
    assert_eq!(
        pod_json(&fake, &parked.name)["metadata"]["annotations"]["threadgate.session"],
        "s1"
    );
    assert_eq!(session_of(&rt, &token).await.as_deref(), Ok("s1"));

    rt.stop(&handle.container_id).await.expect("stop");
    assert!(fake.objects("pods").is_empty());
    assert_eq!(session_of(&rt, &token).await, Err(PodTokenError::Unknown));
}

/// Adoption is a conditional patch: a pod another adopter changed between the read and
/// the patch gets a 409 and is read again; adopted by the other, it is refused and left
/// to it (the caller takes the next one); merely changed, it is adopted.
#[tokio::test]
async fn a_conflicting_adoption_loses_to_the_winner_and_a_mere_change_is_retried() {
    let fake = FakeApi::start(false).await;
    let rt = runtime(&fake, settings()).await;
    let contested = rt.park(&park_spec("support")).await.expect("park");
    let next = rt.park(&park_spec("support")).await.expect("park");

    fake.race_next_patch(json!({"metadata": {
        "labels": {"app.kubernetes.io/component": "sandbox", "threadgate.session": "winner"},
        "annotations": {"threadgate.session": "winner", "threadgate.thread": "th_winner"}}}));
    let lost = rt.adopt(&contested, &spec("s1")).await;
    assert!(
        matches!(lost, Err(SandboxError::NotAdoptable { .. })),
        "{lost:?}"
    );
    let pod = pod_json(&fake, &contested.name);
    assert_eq!(
        pod["metadata"]["annotations"]["threadgate.session"],
        "winner"
    );
    assert_eq!(
        pod["metadata"]["annotations"]["threadgate.thread"],
        "th_winner"
    );
    assert!(
        pod["metadata"]["annotations"]
            .get("threadgate.adopted-by")
            .is_none()
    );
    let uid = pod["metadata"]["uid"].as_str().expect("uid");
    assert!(
        rt.adoptions().get(uid).is_none(),
        "the loser recorded nothing"
    );

    rt.adopt(&next, &spec("s1")).await.expect("the next one");

    let touched = rt.park(&park_spec("support")).await.expect("park");
    fake.race_next_patch(json!({"metadata": {"annotations": {"example.com/touched": "yes"}}}));
    rt.adopt(&touched, &spec("s2"))
        .await
        .expect("adopted after reading it again");
    let patches = fake
        .requests()
        .iter()
        .filter(|r| {
            r.starts_with(&format!(
                "PATCH /api/v1/namespaces/threadgate/pods/{}",
                touched.name
            ))
        })
        .count();
    assert_eq!(patches, 2, "one refused with 409, one written");
    assert_eq!(
        pod_json(&fake, &touched.name)["metadata"]["annotations"]["threadgate.session"],
        "s2"
    );
}

/// A parked pod whose every conditional patch loses while it stays parked (only this
/// instance adopts its pods) is removed: taken from the pool, it is never handed out
/// again, nor left for the pool to skip forever.
#[tokio::test]
async fn a_parked_pod_that_keeps_changing_is_removed_not_left_taken() {
    let fake = FakeApi::start(false).await;
    let rt = runtime(&fake, settings()).await;
    let restless = rt.park(&park_spec("support")).await.expect("park");
    fake.race_next_patches(
        json!({"metadata": {"annotations": {"example.com/touched": "yes"}}}),
        3,
    );
    let refused = rt.adopt(&restless, &spec("s1")).await;
    assert!(
        matches!(&refused, Err(SandboxError::NotAdoptable { reason, .. }) if reason.contains("kept changing")),
        "{refused:?}"
    );
    assert!(fake.objects("pods").is_empty(), "removed");
    assert!(rt.adoptions().is_empty());
}

#[tokio::test]
async fn a_parked_pod_that_never_becomes_ready_is_removed() {
    let (fake, rt) = never_ready(false, Duration::from_millis(600)).await;
    let err = rt
        .park(&park_spec("support"))
        .await
        .expect_err("never ready");
    assert!(matches!(err, SandboxError::NotReady { .. }), "{err}");
    assert!(fake.objects("pods").is_empty());

    // One that stopped being ready while parked is removed when it is taken.
    fake.insert(
        "pods",
        parked_object(INSTANCE, "tg-unready", "slot-unready", IMAGE, None),
    );
    let unready = rt.list_parked().await.expect("parked");
    assert_eq!(unready.len(), 1);
    assert!(!unready[0].clean);
    let refused = rt.adopt(&unready[0], &spec("s1")).await;
    assert!(
        matches!(refused, Err(SandboxError::NotAdoptable { .. })),
        "{refused:?}"
    );
    assert!(fake.objects("pods").is_empty(), "removed, never handed out");
}

#[tokio::test]
async fn parking_survives_ended_watches_and_410_gone() {
    let (fake, rt) = with_flaky_watches().await;
    let parked = rt.park(&park_spec("support")).await.expect("park");
    assert!(
        rt.list_parked()
            .await
            .expect("parked")
            .iter()
            .any(|p| p.name == parked.name)
    );
    let relists = pod_reads(&fake)
        .iter()
        .filter(|r| !r.contains("watch=true"))
        .count();
    assert!(relists >= 2, "the 410 made it list again");
}

/// A crash after the adoption was written and before the session's row named the pod:
/// after the restart the pod is listed as its session's (so reconciliation, which finds
/// no row naming it, removes it) and never as parked; its removal forgets only it, so
/// the pod the resumed session adopted meanwhile keeps its relay.
#[tokio::test]
async fn a_crash_between_adoption_and_binding_leaves_no_pod_bound_to_a_thread() {
    let fake = FakeApi::start(false).await;
    let before = runtime(&fake, settings()).await;
    let orphan = before.park(&park_spec("support")).await.expect("park");
    let spare = before.park(&park_spec("support")).await.expect("park");
    before.adopt(&orphan, &spec("s1")).await.expect("adopt");
    drop(before);

    let after = runtime(&fake, settings()).await;
    let orphan_token = relay_token(&fake, &pod_json(&fake, &orphan.name));
    let parked: Vec<String> = after
        .list_parked()
        .await
        .expect("parked")
        .into_iter()
        .map(|p| p.name)
        .collect();
    assert_eq!(
        parked,
        std::slice::from_ref(&spare.name),
        "an adopted pod is never parked again"
    );
    let listed = after.list().await.expect("list");
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (
            listed[0].container_id.as_str(),
            listed[0].session_id.as_str()
        ),
        (orphan.name.as_str(), "s1")
    );

    // The session resumes on another pod; reconciliation removes the one no row names.
    let resumed = after.adopt(&spare, &spec("s1")).await.expect("adopt");
    let spare_token = relay_token(&fake, &pod_json(&fake, &resumed.name));
    after
        .stop(&orphan.name)
        .await
        .expect("reconcile removes the stray");
    assert_eq!(
        session_of(&after, &orphan_token).await,
        Err(PodTokenError::Unknown)
    );
    assert_eq!(session_of(&after, &spare_token).await.as_deref(), Ok("s1"));
    assert!(!fake.objects("pods").contains_key(&orphan.name));
}

/// Where agent-sandbox serves claims, its warm pool is the pool: threadgate parks
/// nothing, and its own pool turns off.
#[tokio::test]
async fn with_claims_threadgate_parks_nothing() {
    let fake = FakeApi::start(true).await;
    let rt = runtime(&fake, settings()).await;
    let err = rt.park(&park_spec("support")).await.expect_err("claims");
    assert!(matches!(err, SandboxError::PoolUnsupported { .. }), "{err}");
    assert!(rt.list_parked().await.expect("parked").is_empty());
    assert!(fake.objects("pods").is_empty());
    let never = KubernetesSettings {
        claims: ClaimMode::Never,
        ..settings()
    };
    let pods = runtime(&fake, never).await;
    let bad = pods.park(&park_spec("no label value!")).await;
    assert!(
        matches!(bad, Err(SandboxError::InvalidSpec { .. })),
        "{bad:?}"
    );
}
