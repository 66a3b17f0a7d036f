//! The Kubernetes runtime against an in-process API server ([`fake_api`]): the Docker
//! runtime's contract (start, stop, list, adopt, reap), the shape of what it creates,
//! and the cluster's failures (409, 410 Gone, watches that end, sandboxes that never
//! become ready). `manifests` checks `deploy/kubernetes/`.
//!
//! The fake server and the fixtures below are `pub(crate)` (tests only) so that the
//! session pool's tests drive a `KubeRuntime` on them without the sandbox module
//! importing the session module (`session::pool_tests::kubernetes`).

pub(crate) mod fake_api;
mod manifests;
mod pool;
mod review;

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Secret};
use serde_json::{Value, json};

use super::objects::{self, CREDENTIAL_DIR};
use super::{ClaimMode, Kind, KubeRuntime, KubernetesSettings, SandboxClaim};
use crate::sandbox::{Limits, ParkSpec, SandboxError, SandboxRuntime, SandboxSpec};
use crate::secrets::secret_bytes;
use fake_api::{FakeApi, Kubelet};

/// The instance id every runtime under test runs as.
pub(crate) const INSTANCE: &str = "tgtest01";
/// The image parked and started pods run.
pub(crate) const IMAGE: &str = "threadgate-sandbox:latest";
const CA: &[u8] = b"-----BEGIN CERTIFICATE-----\nfake\n-----END CERTIFICATE-----\n";

/// The runtime's settings under test: a generous readiness deadline, gVisor.
pub(crate) fn settings() -> KubernetesSettings {
    KubernetesSettings {
        ready_timeout: Duration::from_secs(20),
        runtime_class: Some("gvisor".into()),
        ..KubernetesSettings::default()
    }
}

/// A session's sandbox: thread `th_<session>`, one granted (fake) secret.
pub(crate) fn spec(session: &str) -> SandboxSpec {
    SandboxSpec {
        session_id: crate::ids::SessionId::parse(session).expect("session id"),
        thread_id: crate::ids::ThreadId::parse(format!("th_{session}")).expect("thread id"),
        image: IMAGE.to_string(),
        workspace_dir: PathBuf::from("/nonexistent/workspace"),
        socket_dir: PathBuf::from("/nonexistent/socket"),
        secrets: vec![(
            "API_TOKEN".to_string(),
            secret_bytes("fake_key_granted_secret"),
        )],
        limits: Limits::default(),
        command: None,
        env: vec![("MODE".to_string(), "test".to_string())],
    }
}

/// A runtime of [`INSTANCE`] on `fake`.
pub(crate) async fn runtime(fake: &FakeApi, settings: KubernetesSettings) -> KubeRuntime {
    KubeRuntime::with_client(fake.client(), INSTANCE, settings, CA.to_vec(), minter())
        .await
        .expect("runtime")
}

/// A parked sandbox of `pool`: the agent runner, one agent variable, nothing of a thread.
pub(crate) fn park_spec(pool: &str) -> ParkSpec {
    ParkSpec {
        pool: pool.into(),
        image: IMAGE.into(),
        limits: Limits::default(),
        command: Some(vec!["threadgate-agent-runner".into()]),
        env: vec![("THREADGATE_AGENT".into(), pool.into())],
    }
}

/// A parked pod of pool `support` as an earlier run (or another instance) left it;
/// `ready` is its Ready condition's status, `None` for one the kubelet never started.
pub(crate) fn parked_object(
    instance: &str,
    name: &str,
    slot: &str,
    image: &str,
    ready: Option<&str>,
) -> Value {
    let status = match ready {
        Some(ready) => {
            json!({"phase": "Running", "conditions": [{"type": "Ready", "status": ready}]})
        }
        None => json!({"phase": "Pending"}),
    };
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name,
        "labels": {"threadgate.instance": instance, "app.kubernetes.io/component": "pool",
            "threadgate.pool": "support", "threadgate.slot": slot}},
        "spec": {"containers": [{"name": "agent", "image": image}]},
        "status": status})
}

/// Waits (up to ten seconds) until `check` holds, naming `what` when it never does.
pub(crate) async fn until(what: &str, check: impl Fn() -> bool) {
    for _ in 0..1000 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

/// A fake server whose next two watches end as soon as they open and whose third is
/// answered 410 Gone, with pods ready only after the watcher's backoff following the
/// 410 (so a watch opened after the fresh list is what sees them), and a runtime on it.
async fn with_flaky_watches() -> (FakeApi, KubeRuntime) {
    let fake = FakeApi::start(false).await;
    let rt = runtime(&fake, settings()).await;
    fake.set_kubelet(Kubelet::ReadyAfter(Duration::from_millis(2500)));
    fake.drop_next_watches(2);
    fake.gone_next_watches(1);
    (fake, rt)
}

/// The pod lists and watches `fake` was asked for, in order.
fn pod_reads(fake: &FakeApi) -> Vec<String> {
    fake.requests()
        .into_iter()
        .filter(|r| r.starts_with("GET /api/v1/namespaces/threadgate/pods?"))
        .collect()
}

/// A fake server (serving claims or not) whose pods and claims never become ready, and
/// a runtime on it that gives up after `ready_timeout`.
async fn never_ready(claims: bool, ready_timeout: Duration) -> (FakeApi, KubeRuntime) {
    let fake = FakeApi::start(claims).await;
    let quick = KubernetesSettings {
        ready_timeout,
        ..settings()
    };
    let rt = runtime(&fake, quick).await;
    fake.set_kubelet(Kubelet::Never);
    (fake, rt)
}

fn minter() -> std::sync::Arc<dyn crate::sandbox::RelayMinter> {
    std::sync::Arc::new(NamingMinter)
}

fn pod_of(fake: &FakeApi, name: &str) -> Pod {
    let object = fake.objects("pods").remove(name).expect("pod exists");
    serde_json::from_value(object).expect("a pod")
}

fn secret_of(fake: &FakeApi, name: &str) -> Secret {
    let object = fake.objects("secrets").remove(name).expect("secret exists");
    serde_json::from_value(object).expect("a secret")
}

#[tokio::test]
async fn a_pod_session_starts_locked_down_with_a_credential_only_its_relay_sees() {
    let fake = FakeApi::start(false).await;
    let rt = runtime(&fake, settings()).await;
    assert_eq!(rt.kind(), Kind::Pods);

    let handle = rt.start(&spec("s1")).await.expect("start");
    assert_eq!(handle.container_id, handle.name);
    assert!(handle.name.len() <= 63 && handle.name.starts_with("tg-tgtest01-s1-"));

    let pod = pod_of(&fake, &handle.name);
    let labels = pod.metadata.labels.clone().expect("labels");
    assert_eq!(labels["threadgate.instance"], INSTANCE);
    assert_eq!(labels["threadgate.session"], "s1");
    assert_eq!(labels["threadgate.thread"], "th_s1");
    assert_eq!(labels["app.kubernetes.io/name"], "threadgate-sandbox");
    let spec_ = pod.spec.clone().expect("spec");
    assert_eq!(spec_.automount_service_account_token, Some(false));
    assert_eq!(spec_.runtime_class_name.as_deref(), Some("gvisor"));
    assert_eq!(spec_.host_network, Some(false));
    let names: Vec<&str> = spec_.containers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["agent", "relay"]);
    for container in &spec_.containers {
        let sc = container
            .security_context
            .as_ref()
            .expect("security context");
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(sc.run_as_non_root, Some(true));
        assert_eq!(sc.privileged, Some(false));
        let caps = sc.capabilities.as_ref().and_then(|c| c.drop.clone());
        assert_eq!(caps, Some(vec!["ALL".to_string()]));
        let seccomp = sc.seccomp_profile.as_ref().map(|p| p.type_.as_str());
        assert_eq!(seccomp, Some("RuntimeDefault"));
        let mounts: Vec<&str> = container
            .volume_mounts
            .iter()
            .flatten()
            .map(|m| m.mount_path.as_str())
            .collect();
        let sees_credential = mounts.contains(&CREDENTIAL_DIR);
        assert_eq!(sees_credential, container.name == "relay", "{mounts:?}");
        // Both work in the workspace; only the relay sees its own git directory.
        assert!(mounts.contains(&"/workspace"), "{mounts:?}");
        let sees_relay_git = mounts.contains(&"/run/threadgate-relay");
        assert_eq!(sees_relay_git, container.name == "relay", "{mounts:?}");
    }
    let relay = spec_.containers.get(1).expect("relay");
    assert_eq!(
        relay.args.clone().unwrap_or_default(),
        objects::relay_args(&settings())
    );
    // The relay writes the granted secrets where its own mount of the secrets volume is
    // (without `--secrets-dir` a pod's agent would never get them).
    let args = relay.args.clone().unwrap_or_default();
    let secrets_dir = args
        .iter()
        .position(|a| a == "--secrets-dir")
        .and_then(|i| args.get(i + 1))
        .expect("the relay is told where the secrets go");
    let relay_secrets_mount = relay
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == "secrets")
        .expect("the relay mounts the secrets volume");
    assert_eq!(secrets_dir, &relay_secrets_mount.mount_path);
    assert_ne!(
        relay_secrets_mount.read_only,
        Some(true),
        "the relay writes them"
    );
    let secrets_volume = spec_
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "secrets")
        .and_then(|v| v.empty_dir.clone())
        .expect("secrets emptyDir");
    assert_eq!(secrets_volume.medium.as_deref(), Some("Memory"));

    // No granted secret value anywhere in what was sent for the pod.
    let sent = serde_json::to_string(&pod).expect("json");
    assert!(!sent.contains("fake_key_granted_secret"));

    let secret = secret_of(&fake, &format!("{}-relay", handle.name));
    let owner = secret.metadata.owner_references.clone().expect("owned");
    assert_eq!(owner.len(), 1);
    assert_eq!(owner[0].kind, "Pod");
    assert_eq!(Some(&owner[0].uid), pod.metadata.uid.as_ref());
    let data = secret.data.clone().expect("data");
    assert_eq!(data["ca.crt"].0, CA);
    assert_eq!(data["token"].0, b"minted-for-s1", "the minter's credential");

    let listed = rt.list().await.expect("list");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].session_id, "s1");
    assert_eq!(listed[0].thread_id, "th_s1");
    assert!(listed[0].running);

    rt.stop(&handle.container_id).await.expect("stop");
    assert!(fake.objects("pods").is_empty());
    assert!(fake.objects("secrets").is_empty());
    rt.stop(&handle.container_id)
        .await
        .expect("stop is idempotent");
    assert!(rt.list().await.expect("list").is_empty());
}

#[tokio::test]
async fn a_claim_session_takes_a_sandbox_from_the_warm_pool() {
    let fake = FakeApi::start(true).await;
    let rt = runtime(&fake, settings()).await;
    assert_eq!(rt.kind(), Kind::Claims);

    let handle = rt.start(&spec("s2")).await.expect("start");
    let object = fake
        .objects("sandboxclaims")
        .remove(&handle.name)
        .expect("claim");
    let claim: SandboxClaim = serde_json::from_value(object.clone()).expect("claim type");
    assert_eq!(claim.spec.warm_pool_ref.name, "threadgate-sandbox");
    assert!(
        object["spec"].get("env").is_none(),
        "no env: it would force a cold start"
    );
    let pod_meta = claim.spec.additional_pod_metadata.expect("pod metadata");
    assert_eq!(pod_meta.labels["threadgate.instance"], INSTANCE);
    assert_eq!(pod_meta.annotations["threadgate.thread"], "th_s2");
    assert!(
        !fake
            .requests()
            .iter()
            .any(|r| r.starts_with("POST /api/v1/")),
        "the controller makes the pod, threadgate no pod and no Secret"
    );
    assert!(!object.to_string().contains("fake_key_granted_secret"));
    // The pod the claim was bound to is recorded for the session.
    let pods = fake.objects("pods");
    let (pod_name, pod) = pods.iter().next().expect("the bound pod");
    let uid = pod["metadata"]["uid"].as_str().expect("uid");
    let adopted = rt.adoptions().get(uid).expect("recorded");
    assert_eq!(&adopted.pod_name, pod_name);
    assert_eq!(adopted.session.as_str(), "s2");

    let listed = rt.list().await.expect("list");
    assert_eq!(listed.len(), 1);
    assert!(listed[0].running);
    rt.stop(&handle.name).await.expect("stop");
    assert!(fake.objects("sandboxclaims").is_empty());
    assert!(rt.adoptions().is_empty(), "forgotten at stop");
    rt.stop(&handle.name).await.expect("idempotent");
}

#[tokio::test]
async fn the_claims_setting_overrides_discovery() {
    let without = FakeApi::start(false).await;
    let always = KubernetesSettings {
        claims: ClaimMode::Always,
        ..settings()
    };
    let err = KubeRuntime::with_client(without.client(), INSTANCE, always, CA.to_vec(), minter())
        .await
        .expect_err("no CRDs");
    assert!(matches!(err, SandboxError::Cluster { .. }), "{err}");
    assert!(err.to_string().contains("sandboxclaims"), "{err}");

    let with = FakeApi::start(true).await;
    let never = KubernetesSettings {
        claims: ClaimMode::Never,
        ..settings()
    };
    assert_eq!(runtime(&with, never).await.kind(), Kind::Pods);

    let bad =
        KubeRuntime::with_client(with.client(), "bad id!", settings(), CA.to_vec(), minter()).await;
    assert!(matches!(bad, Err(SandboxError::InvalidInstance { .. })));
}

/// A new process (same instance) finds its sessions by label; with claims it records
/// their bound pods again, so their relays' tokens keep reaching their sessions.
#[tokio::test]
async fn a_restarted_instance_adopts_its_pods() {
    let fake = FakeApi::start(false).await;
    let first = runtime(&fake, settings()).await;
    let handle = first.start(&spec("s3")).await.expect("start");
    drop(first);

    let second = runtime(&fake, settings()).await;
    let listed = second.list().await.expect("list");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].container_id, handle.container_id);
    assert_eq!(listed[0].session_id, "s3");
    second.stop(&listed[0].container_id).await.expect("stop");

    let claims = FakeApi::start(true).await;
    let first = runtime(&claims, settings()).await;
    first.start(&spec("c3")).await.expect("start");
    let recorded: Vec<_> = claims.objects("pods").into_values().collect();
    assert_eq!(recorded.len(), 1);
    drop(first);
    let second = runtime(&claims, settings()).await;
    let uid = recorded[0]["metadata"]["uid"].as_str().expect("uid");
    let adopted = second.adoptions().get(uid).expect("recorded again");
    assert_eq!(adopted.session.as_str(), "c3");
}

/// Reconcile's part: this instance's objects whose session is not live are stopped,
/// another instance's are neither listed nor stoppable, and credentials without a pod
/// are reaped.
#[tokio::test]
async fn strays_are_reaped_and_other_instances_are_left_alone() {
    let fake = FakeApi::start(false).await;
    let rt = runtime(&fake, settings()).await;
    let live = rt.start(&spec("live")).await.expect("start");
    let stray = rt.start(&spec("stray")).await.expect("start");
    fake.insert(
        "pods",
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "theirs",
            "labels": {"threadgate.instance": "other", "app.kubernetes.io/component": "sandbox"}},
            "spec": {"containers": [{"name": "agent"}]}}),
    );

    let listed = rt.list().await.expect("list");
    assert_eq!(listed.len(), 2, "{listed:?}");
    for info in listed.iter().filter(|info| info.session_id != "live") {
        rt.stop(&info.container_id).await.expect("stop stray");
    }
    let names: Vec<String> = rt
        .list()
        .await
        .expect("list")
        .into_iter()
        .map(|i| i.container_id)
        .collect();
    assert_eq!(names, std::slice::from_ref(&live.container_id));
    assert!(!fake.objects("pods").contains_key(&stray.name));

    let err = rt.stop("theirs").await.expect_err("not ours");
    assert!(matches!(err, SandboxError::NotOwned { .. }), "{err}");
    assert!(fake.objects("pods").contains_key("theirs"));

    // A credential whose pod is gone (a crash between the two creates, or a pod
    // removed behind threadgate's back) is reaped; the live one stays.
    fake.insert(
        "secrets",
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "tg-orphan-relay",
            "labels": {"threadgate.instance": INSTANCE,
                       "app.kubernetes.io/component": "relay-credential"},
            "annotations": {"threadgate.session": "orphan"}},
            "data": {"token": "ZmFrZQ=="}}),
    );
    assert_eq!(rt.reap_orphan_secrets().await.expect("reap"), 1);
    let left: Vec<String> = fake.objects("secrets").into_keys().collect();
    assert_eq!(left, [format!("{}-relay", live.name)]);
    assert_eq!(rt.reap_orphan_secrets().await.expect("reap"), 0);
}

/// A 409 on create is `AlreadyExists`, as Docker's; the existing pod is untouched. A
/// stale credential of an earlier pod of the same name is replaced.
#[tokio::test]
async fn conflicts_on_create() {
    let fake = FakeApi::start(false).await;
    let rt = runtime(&fake, settings()).await;
    let first = rt.start(&spec("s4")).await.expect("start");
    let uid = pod_of(&fake, &first.name).metadata.uid;
    let err = rt.start(&spec("s4")).await.expect_err("conflict");
    assert!(matches!(err, SandboxError::AlreadyExists { .. }), "{err}");
    assert_eq!(pod_of(&fake, &first.name).metadata.uid, uid, "untouched");
    assert_eq!(fake.objects("secrets").len(), 1);

    let name = objects::object_name(INSTANCE, "s5");
    fake.insert(
        "secrets",
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": format!("{name}-relay"),
            "labels": {"threadgate.instance": INSTANCE,
                       "app.kubernetes.io/component": "relay-credential"}},
            "data": {"token": "c3RhbGU="}}),
    );
    rt.start(&spec("s5"))
        .await
        .expect("start over a stale credential");
    let secret = secret_of(&fake, &format!("{name}-relay"));
    assert_eq!(secret.data.expect("data")["token"].0, b"minted-for-s5");
}

/// Watches that end at once and a 410 Gone in the middle of the wait: the start still
/// sees the pod become ready, by watching again and by listing afresh.
#[tokio::test]
async fn the_wait_survives_ended_watches_and_410_gone() {
    let (fake, rt) = with_flaky_watches().await;
    let handle = rt.start(&spec("s6")).await.expect("start");
    let pod_requests = pod_reads(&fake);
    let watches = pod_requests
        .iter()
        .filter(|r| r.contains("watch=true"))
        .count();
    let lists = pod_requests.len() - watches;
    assert!(
        watches >= 4,
        "two dropped, one gone, one that saw it ready: {pod_requests:?}"
    );
    assert!(lists >= 2, "the 410 made it list again: {pod_requests:?}");
    let relist = pod_requests
        .iter()
        .filter(|r| !r.contains("watch=true"))
        .nth(1)
        .expect("a second list");
    assert!(
        !relist.contains("resourceVersion="),
        "a fresh list: {relist}"
    );
    assert!(
        rt.list()
            .await
            .expect("list")
            .iter()
            .any(|i| i.container_id == handle.name)
    );
}

/// A pod that never becomes ready: the start fails after its deadline and leaves no
/// pod, no Secret and no token behind.
#[tokio::test]
async fn a_pod_that_never_becomes_ready_is_undone() {
    let (fake, rt) = never_ready(false, Duration::from_millis(600)).await;
    let err = rt.start(&spec("s7")).await.expect_err("never ready");
    assert!(matches!(err, SandboxError::NotReady { .. }), "{err}");
    assert!(err.to_string().contains("not ready in time"), "{err}");
    assert!(fake.objects("pods").is_empty());
    assert!(fake.objects("secrets").is_empty());
}

#[tokio::test]
async fn a_claim_that_never_becomes_ready_is_undone() {
    let (fake, rt) = never_ready(true, Duration::from_millis(600)).await;
    let err = rt.start(&spec("s8")).await.expect_err("never ready");
    assert!(matches!(err, SandboxError::NotReady { .. }), "{err}");
    assert!(fake.objects("sandboxclaims").is_empty());
    assert!(fake.objects("secrets").is_empty());
}

/// An image that cannot be pulled fails the start at once, not at the deadline.
#[tokio::test]
async fn an_image_that_cannot_be_pulled_fails_fast() {
    let fake = FakeApi::start(false).await;
    let rt = runtime(&fake, settings()).await;
    fake.set_kubelet(Kubelet::ImagePullFails);
    let started = std::time::Instant::now();
    let err = rt.start(&spec("s9")).await.expect_err("no image");
    assert!(err.to_string().contains("ImagePullBackOff"), "{err}");
    assert!(started.elapsed() < settings().ready_timeout);
    assert!(fake.objects("pods").is_empty());
    assert!(fake.objects("secrets").is_empty());
}

#[tokio::test]
async fn readiness_needs_the_api_and_the_warm_pool() {
    let pods = FakeApi::start(false).await;
    runtime(&pods, settings())
        .await
        .check_ready("threadgate-sandbox:latest")
        .await
        .expect("ready");

    let claims = FakeApi::start(true).await;
    let rt = runtime(&claims, settings()).await;
    let err = rt.check_ready("img").await.expect_err("no pool");
    assert!(
        err.to_string().contains("sandbox.kubernetes.warm_pool"),
        "{err}"
    );
    claims.insert(
        "sandboxwarmpools",
        json!({"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxWarmPool",
            "metadata": {"name": "threadgate-sandbox"},
            "spec": {"replicas": 2, "sandboxTemplateRef": {"name": "threadgate-sandbox"}}}),
    );
    rt.check_ready("img").await.expect("ready");
}

#[test]
fn names_are_dns_labels_and_ids_that_are_no_label_values_are_hashed() {
    let long = "a".repeat(128);
    for (instance, session) in [("tg1", "s1"), ("TG_x", "S_1"), ("tg1", long.as_str())] {
        let name = objects::object_name(instance, session);
        assert!(name.len() <= 63, "{name}");
        assert!(
            name.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
            "{name}"
        );
    }
    assert_ne!(
        objects::object_name("tg1", "S_1"),
        objects::object_name("tg1", "s-1")
    );
    let mut long_spec = spec("s1");
    long_spec.thread_id = crate::ids::ThreadId::parse(long.clone()).expect("id");
    let labels = objects::session_labels("tg1", &long_spec, "sandbox");
    assert!(
        labels.values().all(|v| objects::is_label_value(v)),
        "{labels:?}"
    );
    assert!(labels["threadgate.thread"].starts_with("h-"));
}

/// Claims keep the same contract: a 409 is `AlreadyExists`, another instance's claim
/// is neither listed nor stoppable, and a watch that RBAC forbids is named when the
/// start gives up.
#[tokio::test]
async fn claims_keep_the_contract_on_conflicts_and_ownership() {
    let fake = FakeApi::start(true).await;
    let rt = runtime(&fake, settings()).await;
    let handle = rt.start(&spec("c1")).await.expect("start");
    let err = rt.start(&spec("c1")).await.expect_err("conflict");
    assert!(matches!(err, SandboxError::AlreadyExists { .. }), "{err}");
    assert!(fake.objects("sandboxclaims").contains_key(&handle.name));

    fake.insert(
        "sandboxclaims",
        json!({"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxClaim",
            "metadata": {"name": "theirs", "labels": {"threadgate.instance": "other",
                "app.kubernetes.io/component": "sandbox"}},
            "spec": {"warmPoolRef": {"name": "threadgate-sandbox"}}}),
    );
    let listed = rt.list().await.expect("list");
    assert_eq!(listed.len(), 1);
    let err = rt.stop("theirs").await.expect_err("not ours");
    assert!(matches!(err, SandboxError::NotOwned { .. }), "{err}");
    assert!(fake.objects("sandboxclaims").contains_key("theirs"));
}

#[tokio::test]
async fn a_start_that_times_out_says_why_the_watch_failed() {
    let (fake, rt) = never_ready(false, Duration::from_millis(1500)).await;
    fake.forbid_watches();
    let err = rt.start(&spec("s10")).await.expect_err("never seen ready");
    assert!(err.to_string().contains("watch failed"), "{err}");
    assert!(err.to_string().contains("forbidden"), "{err}");
    assert!(fake.objects("pods").is_empty());
}

/// The backend refuses to start without the relay listener's CA, naming the key,
/// before it reaches for a cluster.
#[tokio::test]
async fn connect_needs_the_relay_ca_and_names_the_key() {
    let err = KubeRuntime::connect(INSTANCE, KubernetesSettings::default(), minter())
        .await
        .expect_err("no CA");
    assert!(
        err.to_string().contains("sandbox.kubernetes.ca_file"),
        "{err}"
    );
    let missing = KubernetesSettings {
        ca_file: Some(PathBuf::from("/nonexistent/ca.crt")),
        ..KubernetesSettings::default()
    };
    let err = KubeRuntime::connect(INSTANCE, missing, minter())
        .await
        .expect_err("unreadable CA");
    assert!(
        err.to_string().contains("sandbox.kubernetes.ca_file"),
        "{err}"
    );
    assert!(err.to_string().contains("/nonexistent/ca.crt"), "{err}");
}

/// A minter that names the session it minted for, so the test can see which one wrote
/// the Secret.
struct NamingMinter;

impl crate::sandbox::RelayMinter for NamingMinter {
    fn mint(&self, session: &crate::ids::SessionId) -> crate::secrets::SecretString {
        crate::secrets::SecretString::from(format!("minted-for-{session}"))
    }
}
