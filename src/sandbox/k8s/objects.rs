//! The objects one session is made of on Kubernetes, built as values: the pod (or the
//! claim that gets one from a warm pool) and the credential Secret of its relay; a
//! parked pod of threadgate's own pool and the patch that adopts it.
//!
//! The pod has two containers sharing an `emptyDir` socket directory and the
//! `emptyDir` workspace (the relay writes the thread's branch there before the agent's
//! socket opens, and sends the agent's work back when the gateway asks; its own git
//! directory is a third `emptyDir` the agent does not mount): the agent (the
//! sandbox image: non-root, read-only root, no privilege escalation, no capabilities,
//! seccomp `RuntimeDefault`) and the relay sidecar (`threadgate relay`), which dials
//! out to the gateway and serves the agent's socket. The credential Secret is mounted
//! into the relay only; the agent's granted secrets arrive later, written by the relay
//! into a memory-backed `emptyDir` the agent sees read-only at `/run/secrets`. Nothing
//! secret is in the pod spec, its labels or its environment.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMapProjection, Container, EmptyDirVolumeSource, EnvVar, KeyToPath, Pod,
    PodSecurityContext, PodSpec, ProjectedVolumeSource, ResourceRequirements, SeccompProfile,
    Secret, SecretVolumeSource, SecurityContext, ServiceAccountTokenProjection, Volume,
    VolumeMount, VolumeProjection,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use sha2::{Digest as _, Sha256};

use super::crd::{
    API_VERSION, ClaimLifecycle, NameRef, PodMetadata, SandboxClaim, SandboxClaimSpec,
};
use super::settings::KubernetesSettings;
use crate::sandbox::{
    CONTAINER_SECRETS_DIR, CONTAINER_SOCKET_DIR, CONTAINER_WORKSPACE, LABEL_INSTANCE, LABEL_POOL,
    LABEL_SESSION, LABEL_SLOT, LABEL_THREAD, SANDBOX_UID, SandboxSpec,
};

/// The label every sandbox pod carries, selected by the sandbox NetworkPolicy.
pub(crate) const LABEL_APP: &str = "app.kubernetes.io/name";
/// Its value on sandbox pods.
pub(crate) const APP_SANDBOX: &str = "threadgate-sandbox";
/// The label naming what an object is for: `sandbox` (pod or claim) or `relay-credential`.
pub(crate) const LABEL_COMPONENT: &str = "app.kubernetes.io/component";
/// `LABEL_COMPONENT` on pods and claims.
pub(crate) const COMPONENT_SANDBOX: &str = "sandbox";
/// `LABEL_COMPONENT` on credential Secrets.
pub(crate) const COMPONENT_CREDENTIAL: &str = "relay-credential";
/// Annotation holding the full session id (a label value may have had to be hashed).
pub(crate) const ANNOTATION_SESSION: &str = "threadgate.session";
/// Annotation holding the full thread id.
pub(crate) const ANNOTATION_THREAD: &str = "threadgate.thread";

/// Where the relay finds its credential.
pub(crate) const CREDENTIAL_DIR: &str = "/run/threadgate-credential";
/// The credential Secret's key holding the session's token.
pub(crate) const TOKEN_KEY: &str = "token";
/// The credential Secret's key holding the gateway's CA certificate.
pub(crate) const CA_KEY: &str = "ca.crt";
/// The socket the relay serves inside the pod.
pub(crate) const RELAY_SOCKET: &str = "/run/threadgate/api.sock";
/// The relay's own git directory (`--workspace-git`), on a volume the agent does not
/// mount: the base it was handed and the commits it sends back.
pub(crate) const RELAY_GIT_DIR: &str = "/run/threadgate-relay/git";

const AGENT: &str = "agent";
const RELAY: &str = "relay";
const VOLUME_SOCKET: &str = "threadgate-socket";
const VOLUME_SECRETS: &str = "secrets";
const VOLUME_CREDENTIAL: &str = "relay-credential";
const VOLUME_WORKSPACE: &str = "workspace";
const VOLUME_RELAY_GIT: &str = "relay-git";
const VOLUME_TMP: &str = "tmp";
/// `/tmp` in the agent: memory-backed, counted against the pod's memory.
const TMP_BYTES: u64 = 256 << 20;
/// The secrets volume: a handful of small files.
const SECRETS_BYTES: u64 = 1 << 20;
/// The socket directory holds one socket.
const SOCKET_DIR_BYTES: u64 = 1 << 20;
/// Seconds between SIGTERM and SIGKILL when a sandbox is stopped (Docker's default too).
pub(crate) const GRACE_SECONDS: i64 = 5;

/// The name of a session's pod or claim: a DNS label, `tg-<instance>-<session>-<hash>`,
/// lowercase, at most 63 characters. The hash of the exact ids keeps two sessions
/// whose ids differ only in case or in `_`/`-` apart.
pub fn object_name(instance_id: &str, session_id: &str) -> String {
    let digest = Sha256::digest(format!("{instance_id}/{session_id}").as_bytes());
    let hash = hex::encode(digest.get(..4).unwrap_or_default());
    let instance: String = dns_part(instance_id).chars().take(8).collect();
    let session: String = dns_part(session_id).chars().take(40).collect();
    let name = format!("tg-{instance}-{session}");
    let name = name.trim_end_matches('-');
    format!("{name}-{hash}")
}

/// The credential Secret's name for a session's object.
pub(crate) fn credential_name(object_name: &str) -> String {
    format!("{object_name}-relay")
}

fn dns_part(id: &str) -> String {
    id.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect()
}

/// Whether `value` can be a label value as it is: at most 63 of `[A-Za-z0-9_.-]`,
/// starting and ending alphanumeric (or empty).
pub(crate) fn is_label_value(value: &str) -> bool {
    let edges_ok = |c: Option<char>| c.is_none_or(|c| c.is_ascii_alphanumeric());
    value.len() <= 63
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
        && edges_ok(value.chars().next())
        && edges_ok(value.chars().last())
}

/// An id as a label value: itself when it is one, else `h-` and a hash of it (the full
/// id is in an annotation).
pub(crate) fn label_value(id: &str) -> String {
    if is_label_value(id) {
        return id.to_string();
    }
    let digest = Sha256::digest(id.as_bytes());
    format!("h-{}", hex::encode(digest.get(..16).unwrap_or_default()))
}

/// The labels of every object of a session.
pub(crate) fn session_labels(
    instance_id: &str,
    spec: &SandboxSpec,
    component: &str,
) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_INSTANCE.to_string(), instance_id.to_string()),
        (LABEL_SESSION.to_string(), label_value(&spec.session_id)),
        (LABEL_THREAD.to_string(), label_value(&spec.thread_id)),
        (LABEL_COMPONENT.to_string(), component.to_string()),
        (
            "app.kubernetes.io/managed-by".to_string(),
            "threadgate".to_string(),
        ),
    ])
}

fn session_annotations(spec: &SandboxSpec) -> BTreeMap<String, String> {
    BTreeMap::from([
        (ANNOTATION_SESSION.to_string(), spec.session_id.to_string()),
        (ANNOTATION_THREAD.to_string(), spec.thread_id.to_string()),
    ])
}

/// The selector of this instance's objects of one component.
pub(crate) fn instance_selector(instance_id: &str, component: &str) -> String {
    format!("{LABEL_INSTANCE}={instance_id},{LABEL_COMPONENT}={component}")
}

/// A session's pod, when plain pods are used.
pub(crate) fn pod(
    settings: &KubernetesSettings,
    instance_id: &str,
    name: &str,
    spec: &SandboxSpec,
) -> Pod {
    let mut labels = session_labels(instance_id, spec, COMPONENT_SANDBOX);
    labels.insert(LABEL_APP.to_string(), APP_SANDBOX.to_string());
    Pod {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(settings.namespace.clone()),
            labels: Some(labels),
            annotations: Some(session_annotations(spec)),
            ..Default::default()
        },
        spec: Some(pod_spec(
            settings,
            &spec.image,
            spec.command.clone(),
            &spec.env,
            credential_secret_volume(&credential_name(name)),
            spec.limits,
        )),
        status: None,
    }
}

/// The pod of a claimed sandbox, as `deploy/kubernetes/sandbox-template.yaml` holds
/// it: the plain pod's shape, with nothing of any session (no command or environment
/// of an agent, no per-session Secret). Its relay's credential is the pod-bound token
/// of the `threadgate-sandbox` service account, projected and rotated by the kubelet,
/// beside the relay listener's CA.
pub fn template_pod_spec(
    settings: &KubernetesSettings,
    image: &str,
    limits: crate::sandbox::Limits,
) -> PodSpec {
    PodSpec {
        service_account_name: Some(SANDBOX_SERVICE_ACCOUNT.to_string()),
        ..pod_spec(settings, image, None, &[], projected_credential(), limits)
    }
}

/// The relay credential of a pod started before its thread was known (a claimed or a
/// parked pod): the pod-bound token of the `threadgate-sandbox` service account with
/// the relay's audience, projected and rotated by the kubelet, beside the relay
/// listener's CA. It names the pod, never a session: the session is the one the pod is
/// adopted for.
fn projected_credential() -> Volume {
    Volume {
        name: VOLUME_CREDENTIAL.to_string(),
        projected: Some(ProjectedVolumeSource {
            default_mode: Some(0o400),
            sources: Some(vec![
                VolumeProjection {
                    service_account_token: Some(ServiceAccountTokenProjection {
                        audience: Some(RELAY_AUDIENCE.to_string()),
                        expiration_seconds: Some(600),
                        path: TOKEN_KEY.to_string(),
                    }),
                    ..Default::default()
                },
                VolumeProjection {
                    config_map: Some(ConfigMapProjection {
                        name: RELAY_CA_CONFIG_MAP.to_string(),
                        items: Some(vec![KeyToPath {
                            key: CA_KEY.to_string(),
                            path: CA_KEY.to_string(),
                            mode: None,
                        }]),
                        optional: None,
                    }),
                    ..Default::default()
                },
            ]),
        }),
        ..Default::default()
    }
}

/// `LABEL_COMPONENT` on parked pods (threadgate's own pool, without agent-sandbox).
/// Adoption changes it to [`COMPONENT_SANDBOX`], once: a pod is parked only until then.
pub(crate) const COMPONENT_POOL: &str = "pool";
/// Annotation naming the instance that adopted a parked pod (set by the adoption).
pub(crate) const ANNOTATION_ADOPTED_BY: &str = "threadgate.adopted-by";

/// A parked pod of `spec.pool`: the template's pod (the projected, pod-bound relay
/// token; no Secret) with the agent's command and environment, labelled with the
/// instance, the pool, the slot and `component=pool` only. Nothing of any thread: no
/// session or thread label, no annotation, a name made of the slot.
pub(crate) fn parked_pod(
    settings: &KubernetesSettings,
    instance_id: &str,
    name: &str,
    slot: &str,
    spec: &crate::sandbox::ParkSpec,
) -> Pod {
    let labels = BTreeMap::from([
        (LABEL_INSTANCE.to_string(), instance_id.to_string()),
        (LABEL_POOL.to_string(), spec.pool.clone()),
        (LABEL_SLOT.to_string(), slot.to_string()),
        (LABEL_COMPONENT.to_string(), COMPONENT_POOL.to_string()),
        (LABEL_APP.to_string(), APP_SANDBOX.to_string()),
        (
            "app.kubernetes.io/managed-by".to_string(),
            "threadgate".to_string(),
        ),
    ]);
    Pod {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(settings.namespace.clone()),
            labels: Some(labels),
            ..Default::default()
        },
        spec: Some(PodSpec {
            service_account_name: Some(SANDBOX_SERVICE_ACCOUNT.to_string()),
            ..pod_spec(
                settings,
                &spec.image,
                spec.command.clone(),
                &spec.env,
                projected_credential(),
                spec.limits,
            )
        }),
        status: None,
    }
}

/// The merge patch that adopts a parked pod for `spec`'s session, applied only at
/// `resource_version` (the API server answers 409 to a pod changed since it was read,
/// so of two adopters one wins): the session's labels (`component` becomes `sandbox`,
/// so it is listed as a session's and never as parked again) and annotations, and the
/// adopting instance.
pub(crate) fn adoption_patch(
    instance_id: &str,
    spec: &SandboxSpec,
    resource_version: &str,
) -> serde_json::Value {
    let mut annotations = session_annotations(spec);
    annotations.insert(ANNOTATION_ADOPTED_BY.to_string(), instance_id.to_string());
    serde_json::json!({
        "metadata": {
            "resourceVersion": resource_version,
            "labels": {
                LABEL_COMPONENT: COMPONENT_SANDBOX,
                LABEL_SESSION: label_value(&spec.session_id),
                LABEL_THREAD: label_value(&spec.thread_id),
            },
            "annotations": annotations,
        }
    })
}

/// The audience of the projected token a claimed sandbox's relay presents.
pub(crate) const RELAY_AUDIENCE: &str = "threadgate-relay";
/// The ConfigMap holding the relay listener's CA for claimed sandboxes.
pub(crate) const RELAY_CA_CONFIG_MAP: &str = "threadgate-relay-ca";
/// The service account of sandbox pods (bound to no role).
pub(crate) const SANDBOX_SERVICE_ACCOUNT: &str = "threadgate-sandbox";

/// The relay credential of a plain pod: its session's own Secret.
fn credential_secret_volume(secret_name: &str) -> Volume {
    Volume {
        name: VOLUME_CREDENTIAL.to_string(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret_name.to_string()),
            default_mode: Some(0o400),
            optional: Some(false),
            items: None,
        }),
        ..Default::default()
    }
}

/// The pod every sandbox runs, whether threadgate makes it (a plain pod) or an
/// agent-sandbox template does; `credential` is the relay's credential volume.
pub fn pod_spec(
    settings: &KubernetesSettings,
    image: &str,
    command: Option<Vec<String>>,
    env: &[(String, String)],
    credential: Volume,
    limits: crate::sandbox::Limits,
) -> PodSpec {
    let uid = i64::from(SANDBOX_UID);
    let agent_limits = BTreeMap::from([
        (
            "memory".to_string(),
            Quantity(limits.memory_bytes.to_string()),
        ),
        (
            "cpu".to_string(),
            Quantity(format!("{}m", limits.nano_cpus.div_ceil(1_000_000).max(1))),
        ),
    ]);
    let relay_limits = BTreeMap::from([
        (
            "memory".to_string(),
            Quantity(settings.relay_memory_bytes.to_string()),
        ),
        (
            "cpu".to_string(),
            Quantity(format!("{}m", settings.relay_millicpus.max(1))),
        ),
    ]);
    let agent = Container {
        name: AGENT.to_string(),
        image: Some(image.to_string()),
        image_pull_policy: Some("IfNotPresent".to_string()),
        command,
        env: (!env.is_empty()).then(|| {
            env.iter()
                .map(|(name, value)| EnvVar {
                    name: name.clone(),
                    value: Some(value.clone()),
                    value_from: None,
                })
                .collect()
        }),
        working_dir: Some(CONTAINER_WORKSPACE.to_string()),
        security_context: Some(locked_down()),
        resources: Some(ResourceRequirements {
            limits: Some(agent_limits.clone()),
            requests: Some(agent_limits),
            ..Default::default()
        }),
        volume_mounts: Some(vec![
            mount(VOLUME_WORKSPACE, CONTAINER_WORKSPACE, false),
            // Read-only is enough to connect to the socket.
            mount(VOLUME_SOCKET, CONTAINER_SOCKET_DIR, true),
            mount(VOLUME_SECRETS, CONTAINER_SECRETS_DIR, true),
            mount(VOLUME_TMP, "/tmp", false),
        ]),
        ..Default::default()
    };
    let relay = Container {
        name: RELAY.to_string(),
        image: Some(settings.relay_image.clone()),
        image_pull_policy: Some("IfNotPresent".to_string()),
        command: Some(vec!["threadgate".to_string()]),
        args: Some(relay_args(settings)),
        security_context: Some(locked_down()),
        resources: Some(ResourceRequirements {
            limits: Some(relay_limits.clone()),
            requests: Some(relay_limits),
            ..Default::default()
        }),
        volume_mounts: Some(vec![
            mount(VOLUME_SOCKET, CONTAINER_SOCKET_DIR, false),
            mount(VOLUME_CREDENTIAL, CREDENTIAL_DIR, true),
            mount(VOLUME_SECRETS, CONTAINER_SECRETS_DIR, false),
            // The relay writes the thread's branch here before the agent's socket opens
            // and reads the agent's work back from it.
            mount(VOLUME_WORKSPACE, CONTAINER_WORKSPACE, false),
            mount(VOLUME_RELAY_GIT, "/run/threadgate-relay", false),
        ]),
        ..Default::default()
    };
    PodSpec {
        containers: vec![agent, relay],
        volumes: Some(vec![
            empty_dir(VOLUME_SOCKET, false, SOCKET_DIR_BYTES),
            empty_dir(VOLUME_SECRETS, true, SECRETS_BYTES),
            empty_dir(VOLUME_WORKSPACE, false, settings.workspace_bytes),
            empty_dir(VOLUME_RELAY_GIT, false, settings.workspace_bytes),
            empty_dir(VOLUME_TMP, true, TMP_BYTES),
            credential,
        ]),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(uid),
            run_as_group: Some(uid),
            fs_group: Some(uid),
            seccomp_profile: Some(runtime_default()),
            ..Default::default()
        }),
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        host_network: Some(false),
        host_pid: Some(false),
        host_ipc: Some(false),
        restart_policy: Some("Never".to_string()),
        runtime_class_name: settings.runtime_class.clone(),
        termination_grace_period_seconds: Some(GRACE_SECONDS),
        ..Default::default()
    }
}

/// The relay sidecar's arguments after `threadgate`: with a `--workspace-max-*` flag for
/// each of `[relay.workspace]`'s caps that is not the relay's default, so the pod's relay
/// takes its workspace under the caps the gateway was configured with.
pub fn relay_args(settings: &KubernetesSettings) -> Vec<String> {
    let mut args = [
        "relay",
        "--listen",
        RELAY_SOCKET,
        "--gateway",
        &settings.gateway_url,
        "--token-file",
        &format!("{CREDENTIAL_DIR}/{TOKEN_KEY}"),
        "--ca-file",
        &format!("{CREDENTIAL_DIR}/{CA_KEY}"),
        "--secrets-dir",
        CONTAINER_SECRETS_DIR,
        "--workspace-dir",
        CONTAINER_WORKSPACE,
        "--workspace-git",
        RELAY_GIT_DIR,
    ]
    .map(str::to_string)
    .to_vec();
    let (limits, defaults) = (
        settings.relay_workspace_limits,
        crate::workspace::BundleLimits::default(),
    );
    let caps = [
        (
            "--workspace-max-bytes",
            limits.max_bytes != defaults.max_bytes,
            limits.max_bytes.to_string(),
        ),
        (
            "--workspace-max-objects",
            limits.max_objects != defaults.max_objects,
            limits.max_objects.to_string(),
        ),
        (
            "--workspace-max-entries",
            limits.max_entries != defaults.max_entries,
            limits.max_entries.to_string(),
        ),
        (
            "--workspace-max-tree-bytes",
            limits.max_tree_bytes != defaults.max_tree_bytes,
            limits.max_tree_bytes.to_string(),
        ),
        (
            "--workspace-max-time",
            limits.max_time != defaults.max_time,
            humantime::format_duration(limits.max_time).to_string(),
        ),
    ];
    for (flag, set, value) in caps {
        if set {
            args.extend([flag.to_string(), value]);
        }
    }
    args
}

fn locked_down() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        privileged: Some(false),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".to_string()]),
            add: None,
        }),
        seccomp_profile: Some(runtime_default()),
        ..Default::default()
    }
}

fn runtime_default() -> SeccompProfile {
    SeccompProfile {
        type_: "RuntimeDefault".to_string(),
        localhost_profile: None,
    }
}

fn mount(volume: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: volume.to_string(),
        mount_path: path.to_string(),
        read_only: Some(read_only),
        ..Default::default()
    }
}

fn empty_dir(name: &str, memory: bool, bytes: u64) -> Volume {
    Volume {
        name: name.to_string(),
        empty_dir: Some(EmptyDirVolumeSource {
            medium: memory.then(|| "Memory".to_string()),
            size_limit: Some(Quantity(bytes.to_string())),
        }),
        ..Default::default()
    }
}

/// A session's claim on the warm pool. Its identity reaches the pod only as labels and
/// annotations (never `env`, which would force a cold start and put it in the spec).
pub(crate) fn claim(
    settings: &KubernetesSettings,
    instance_id: &str,
    name: &str,
    spec: &SandboxSpec,
) -> SandboxClaim {
    let labels = session_labels(instance_id, spec, COMPONENT_SANDBOX);
    let annotations = session_annotations(spec);
    SandboxClaim {
        api_version: API_VERSION.to_string(),
        kind: "SandboxClaim".to_string(),
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(settings.namespace.clone()),
            labels: Some(labels.clone()),
            annotations: Some(annotations.clone()),
            ..Default::default()
        },
        spec: SandboxClaimSpec {
            warm_pool_ref: NameRef {
                name: settings.warm_pool.clone(),
            },
            lifecycle: Some(ClaimLifecycle {
                shutdown_policy: Some("Delete".to_string()),
                ..Default::default()
            }),
            additional_pod_metadata: Some(PodMetadata {
                labels,
                annotations,
            }),
        },
        status: None,
    }
}

/// The relay's credential: the session's token and the gateway's CA, owned by the
/// session's pod or claim so the cluster removes it with them.
pub(crate) fn credential(
    settings: &KubernetesSettings,
    instance_id: &str,
    spec: &SandboxSpec,
    owner: OwnerReference,
    token: &[u8],
    ca_pem: &[u8],
) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(credential_name(&owner.name)),
            namespace: Some(settings.namespace.clone()),
            labels: Some(session_labels(instance_id, spec, COMPONENT_CREDENTIAL)),
            annotations: Some(session_annotations(spec)),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        data: Some(BTreeMap::from([
            (TOKEN_KEY.to_string(), ByteString(token.to_vec())),
            (CA_KEY.to_string(), ByteString(ca_pem.to_vec())),
        ])),
        immutable: Some(true),
        type_: Some("Opaque".to_string()),
        ..Default::default()
    }
}
