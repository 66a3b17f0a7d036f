//! Every manifest in `deploy/kubernetes/`, parsed into its k8s-openapi (or agent-sandbox)
//! type and written out again: a field the type does not know would be dropped, so the
//! written object must equal the file's. Then the invariants a platform team relies on:
//! no privilege anywhere, non-root, read-only roots, the sandbox's egress only to the
//! relay port, RBAC in the namespace only, and the template equal to the pod threadgate
//! builds for plain pods.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, PodSpec, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::sandbox::Limits;
use crate::sandbox::k8s::crd::{SandboxTemplate, SandboxWarmPool};
use crate::sandbox::k8s::objects;
use crate::sandbox::k8s::settings::{Backend, KubernetesSettings};

/// The `[sandbox]` table of the ConfigMap's `threadgate.toml` (the whole file is
/// loaded as `Settings` by `config::tests`; `sandbox` stays below `config`).
#[derive(Debug, Deserialize)]
struct ConfigFile {
    sandbox: SandboxTable,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SandboxTable {
    backend: Backend,
    image: String,
    memory_bytes: u64,
    nano_cpus: u64,
    kubernetes: KubernetesSettings,
}

/// `kustomization.yaml`: only the keys used here.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Kustomization {
    api_version: String,
    kind: String,
    namespace: String,
    resources: Vec<String>,
}

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes")
}

/// Every document of every YAML file, as `(file, document)`.
fn documents() -> Vec<(String, Value)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir())
        .expect("deploy/kubernetes")
        .map(|entry| entry.expect("entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    let mut docs = Vec::new();
    for path in files {
        let name = path
            .file_name()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        let text = std::fs::read_to_string(&path).expect("read");
        for doc in serde_norway::Deserializer::from_str(&text) {
            let value = Value::deserialize(doc).unwrap_or_else(|e| panic!("{name}: {e}"));
            docs.push((name.clone(), value));
        }
    }
    docs
}

/// Parses `value` as `T` and checks that writing it out gives the same object.
fn round_trip<T: DeserializeOwned + Serialize>(file: &str, value: &Value) -> T {
    let typed: T = serde_json::from_value(value.clone())
        .unwrap_or_else(|e| panic!("{file}: {} does not parse: {e}", value["kind"]));
    let back = serde_json::to_value(&typed).expect("serialise");
    if let Some(at) = first_difference(value, &back, String::new()) {
        panic!(
            "{file}: {} {} is dropped or changed by its type (an unknown or misspelt field?)",
            value["kind"], at
        );
    }
    typed
}

/// The JSON path of the first place where `written` differs from `read`.
fn first_difference(read: &Value, written: &Value, at: String) -> Option<String> {
    match (read, written) {
        (Value::Object(a), Value::Object(b)) => a
            .iter()
            .find_map(|(key, value)| match b.get(key) {
                None => Some(format!("{at}.{key}")),
                Some(other) => first_difference(value, other, format!("{at}.{key}")),
            })
            .or_else(|| {
                b.keys()
                    .find(|key| !a.contains_key(*key))
                    .map(|key| format!("{at}.{key} (added)"))
            }),
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => a
            .iter()
            .zip(b)
            .enumerate()
            .find_map(|(i, (x, y))| first_difference(x, y, format!("{at}[{i}]"))),
        _ if read == written => None,
        _ => Some(format!("{at} ({read} became {written})")),
    }
}

#[derive(Default)]
struct Parsed {
    deployments: Vec<Deployment>,
    policies: Vec<NetworkPolicy>,
    roles: Vec<Role>,
    bindings: Vec<RoleBinding>,
    cluster_roles: Vec<ClusterRole>,
    cluster_bindings: Vec<ClusterRoleBinding>,
    config_maps: Vec<ConfigMap>,
    templates: Vec<SandboxTemplate>,
    pools: Vec<SandboxWarmPool>,
    accounts: Vec<ServiceAccount>,
    services: Vec<Service>,
    kustomization: Option<Kustomization>,
    files: Vec<String>,
}

fn parse_all() -> Parsed {
    let mut parsed = Parsed::default();
    for (file, value) in documents() {
        if !parsed.files.contains(&file) {
            parsed.files.push(file.clone());
        }
        let kind = value["kind"].as_str().unwrap_or_default().to_string();
        match kind.as_str() {
            "Namespace" => {
                round_trip::<Namespace>(&file, &value);
            }
            "ServiceAccount" => parsed.accounts.push(round_trip(&file, &value)),
            "ConfigMap" => parsed.config_maps.push(round_trip(&file, &value)),
            "Deployment" => parsed.deployments.push(round_trip(&file, &value)),
            "Service" => parsed.services.push(round_trip(&file, &value)),
            "NetworkPolicy" => parsed.policies.push(round_trip(&file, &value)),
            "Role" => parsed.roles.push(round_trip(&file, &value)),
            "RoleBinding" => parsed.bindings.push(round_trip(&file, &value)),
            "ClusterRole" => parsed.cluster_roles.push(round_trip(&file, &value)),
            "ClusterRoleBinding" => parsed.cluster_bindings.push(round_trip(&file, &value)),
            "SandboxTemplate" => parsed.templates.push(round_trip(&file, &value)),
            "SandboxWarmPool" => parsed.pools.push(round_trip(&file, &value)),
            "Kustomization" => parsed.kustomization = Some(round_trip(&file, &value)),
            other => panic!("{file}: kind {other:?} is not checked by this test"),
        }
    }
    parsed
}

/// The locked-down settings every container must have.
fn check_pod(what: &str, pod: &PodSpec) {
    for flag in [pod.host_network, pod.host_pid, pod.host_ipc] {
        assert_ne!(flag, Some(true), "{what}: host namespaces");
    }
    for volume in pod.volumes.iter().flatten() {
        assert!(
            volume.host_path.is_none(),
            "{what}: hostPath volume {}",
            volume.name
        );
    }
    let pod_non_root = pod
        .security_context
        .as_ref()
        .and_then(|s| s.run_as_non_root)
        == Some(true);
    let pod_seccomp = pod
        .security_context
        .as_ref()
        .and_then(|s| s.seccomp_profile.as_ref())
        .map(|p| p.type_.as_str());
    assert_eq!(pod_seccomp, Some("RuntimeDefault"), "{what}: seccomp");
    let containers = pod
        .containers
        .iter()
        .chain(pod.init_containers.iter().flatten());
    for container in containers {
        let at = format!("{what}: container {}", container.name);
        let sc = container
            .security_context
            .as_ref()
            .unwrap_or_else(|| panic!("{at}: no securityContext"));
        assert_ne!(sc.privileged, Some(true), "{at}: privileged");
        assert_eq!(
            sc.allow_privilege_escalation,
            Some(false),
            "{at}: privilege escalation"
        );
        assert_eq!(
            sc.read_only_root_filesystem,
            Some(true),
            "{at}: writable root"
        );
        assert!(
            pod_non_root || sc.run_as_non_root == Some(true),
            "{at}: may run as root"
        );
        assert_ne!(sc.run_as_user, Some(0), "{at}: uid 0");
        let dropped = sc
            .capabilities
            .as_ref()
            .and_then(|c| c.drop.clone())
            .unwrap_or_default();
        assert_eq!(dropped, ["ALL"], "{at}: capabilities not all dropped");
        let added = sc
            .capabilities
            .as_ref()
            .and_then(|c| c.add.clone())
            .unwrap_or_default();
        assert!(added.is_empty(), "{at}: capabilities added");
        let limits = container.resources.as_ref().and_then(|r| r.limits.as_ref());
        assert!(
            limits.is_some_and(|l| l.contains_key("memory") && l.contains_key("cpu")),
            "{at}: no memory and cpu limits"
        );
        assert!(
            container
                .env
                .iter()
                .flatten()
                .all(|e| e.value.is_none() || !e.name.contains("SECRET")),
            "{at}: a secret-looking value in env"
        );
    }
}

#[test]
fn every_manifest_parses_whole_and_kustomize_lists_them_all() {
    let parsed = parse_all();
    let kustomization = parsed.kustomization.as_ref().expect("kustomization.yaml");
    assert_eq!(kustomization.namespace, "threadgate");
    let mut listed = kustomization.resources.clone();
    listed.sort();
    let mut files: Vec<String> = parsed
        .files
        .iter()
        .filter(|f| *f != "kustomization.yaml")
        .cloned()
        .collect();
    files.sort();
    assert_eq!(listed, files, "kustomization.yaml must list every manifest");
    assert!(!parsed.templates.is_empty() && !parsed.pools.is_empty());
    for pool in &parsed.pools {
        let template = &pool.spec.sandbox_template_ref.name;
        assert!(
            parsed
                .templates
                .iter()
                .any(|t| t.metadata.name.as_ref() == Some(template)),
            "warm pool names a template that is not here: {template}"
        );
    }
}

#[test]
fn threadgate_runs_replicated_on_postgres_unprivileged() {
    let parsed = parse_all();
    let [deployment] = parsed.deployments.as_slice() else {
        panic!("one Deployment");
    };
    let spec = deployment.spec.as_ref().expect("spec");
    assert!(spec.replicas.unwrap_or(1) >= 2, "several replicas");
    let pod = spec.template.spec.as_ref().expect("pod");
    check_pod("deployment threadgate", pod);
    assert_eq!(pod.service_account_name.as_deref(), Some("threadgate"));
    let env = pod
        .containers
        .first()
        .and_then(|c| c.env.clone())
        .unwrap_or_default();
    // Each replica advertises its pod IP as its relay address (redirects go there).
    let pod_ip = env.iter().position(|e| e.name == "POD_IP").expect("POD_IP");
    let field = env[pod_ip]
        .value_from
        .as_ref()
        .and_then(|v| v.field_ref.as_ref())
        .map(|f| f.field_path.as_str());
    assert_eq!(field, Some("status.podIP"));
    let advertise = env
        .iter()
        .position(|e| e.name == "THREADGATE_RELAY__ADVERTISE")
        .expect("THREADGATE_RELAY__ADVERTISE");
    assert!(pod_ip < advertise, "POD_IP is defined before it is used");
    // The bare pod IP (IPv6 has no brackets there): the listener's port is added.
    let value = env[advertise].value.as_deref().expect("a value");
    assert_eq!(value, "$(POD_IP)");
    // A bare address, as `[relay] advertise` takes it (its own tests parse both forms).
    for pod_ip in ["10.0.3.7", "fd00::1"] {
        let given: std::net::IpAddr = value
            .replace("$(POD_IP)", pod_ip)
            .parse()
            .expect("advertise");
        assert_eq!(given.to_string(), pod_ip);
    }
    let database = env
        .iter()
        .find(|e| e.name == "THREADGATE_DATABASE_URL")
        .expect("THREADGATE_DATABASE_URL");
    assert!(
        database.value.is_none(),
        "the database URL comes from a Secret"
    );
    assert!(
        database
            .value_from
            .as_ref()
            .and_then(|v| v.secret_key_ref.as_ref())
            .is_some()
    );
}

#[test]
fn rbac_is_the_least_threadgate_needs_in_its_namespace() {
    let parsed = parse_all();
    let [role] = parsed.roles.as_slice() else {
        panic!("one Role");
    };
    assert_eq!(role.metadata.namespace.as_deref(), Some("threadgate"));
    let allowed: BTreeMap<&str, &[&str]> = BTreeMap::from([
        // `patch`: adopting a parked pod (a conditional merge patch of its metadata).
        (
            "pods",
            &["get", "list", "watch", "create", "patch", "delete"][..],
        ),
        ("secrets", &["get", "list", "create", "delete"][..]),
        (
            "sandboxclaims",
            &["get", "list", "watch", "create", "delete"][..],
        ),
        ("sandboxwarmpools", &["get"][..]),
    ]);
    for rule in role.rules.iter().flatten() {
        for resource in rule.resources.iter().flatten() {
            let verbs = allowed
                .get(resource.as_str())
                .unwrap_or_else(|| panic!("role grants {resource}"));
            for verb in &rule.verbs {
                assert!(
                    verbs.contains(&verb.as_str()),
                    "role grants {verb} on {resource}"
                );
            }
        }
        assert!(rule.resource_names.is_none() && rule.non_resource_urls.is_none());
    }
    let [binding] = parsed.bindings.as_slice() else {
        panic!("one RoleBinding");
    };
    assert_eq!(binding.role_ref.kind, "Role");
    let subjects = binding.subjects.clone().unwrap_or_default();
    assert_eq!(subjects.len(), 1);
    assert_eq!(subjects[0].name, "threadgate");
    let sandbox_account = parsed
        .accounts
        .iter()
        .find(|a| a.metadata.name.as_deref() == Some(objects::SANDBOX_SERVICE_ACCOUNT))
        .expect("the sandbox service account");
    assert_eq!(sandbox_account.automount_service_account_token, Some(false));
    assert!(
        subjects
            .iter()
            .all(|s| s.name != objects::SANDBOX_SERVICE_ACCOUNT),
        "the sandboxes' account is bound to nothing"
    );

    // The one cluster-wide grant: `create` on `tokenreviews` (a claimed sandbox's relay
    // token is reviewed), bound to threadgate's account only.
    let [cluster_role] = parsed.cluster_roles.as_slice() else {
        panic!("one ClusterRole");
    };
    let rules = cluster_role.rules.clone().unwrap_or_default();
    assert_eq!(rules.len(), 1, "{rules:?}");
    assert_eq!(
        rules[0].api_groups.as_deref(),
        Some(&["authentication.k8s.io".to_string()][..])
    );
    assert_eq!(
        rules[0].resources.as_deref(),
        Some(&["tokenreviews".to_string()][..])
    );
    assert_eq!(rules[0].verbs, ["create"]);
    assert!(rules[0].resource_names.is_none() && rules[0].non_resource_urls.is_none());
    let [cluster_binding] = parsed.cluster_bindings.as_slice() else {
        panic!("one ClusterRoleBinding");
    };
    assert_eq!(cluster_binding.role_ref.kind, "ClusterRole");
    assert_eq!(
        Some(&cluster_binding.role_ref.name),
        cluster_role.metadata.name.as_ref()
    );
    let subjects = cluster_binding.subjects.clone().unwrap_or_default();
    assert_eq!(subjects.len(), 1);
    assert_eq!(
        (subjects[0].name.as_str(), subjects[0].namespace.as_deref()),
        ("threadgate", Some("threadgate"))
    );
}

#[test]
fn sandboxes_reach_nothing_but_the_relay_port() {
    let parsed = parse_all();
    let relay_port = parsed
        .services
        .iter()
        .find(|s| s.metadata.name.as_deref() == Some("threadgate-relay"))
        .and_then(|s| s.spec.as_ref())
        .and_then(|s| s.ports.as_ref())
        .and_then(|p| p.first())
        .map(|p| p.port)
        .expect("the relay Service");
    let sandbox_policy = parsed
        .policies
        .iter()
        .find(|p| {
            let labels = p
                .spec
                .as_ref()
                .and_then(|s| s.pod_selector.as_ref())
                .and_then(|s| s.match_labels.clone());
            labels.is_some_and(|l| {
                l.get(objects::LABEL_APP).map(String::as_str) == Some(objects::APP_SANDBOX)
            })
        })
        .and_then(|p| p.spec.clone())
        .expect("a NetworkPolicy selecting sandbox pods");
    let types = sandbox_policy.policy_types.clone().unwrap_or_default();
    assert!(types.contains(&"Egress".to_string()) && types.contains(&"Ingress".to_string()));
    assert!(
        sandbox_policy
            .ingress
            .clone()
            .unwrap_or_default()
            .is_empty(),
        "no inbound route"
    );
    let egress = sandbox_policy.egress.clone().unwrap_or_default();
    assert!(!egress.is_empty());
    let mut reaches_relay = false;
    for rule in &egress {
        let ports: Vec<i32> = rule
            .ports
            .iter()
            .flatten()
            .map(|p| match &p.port {
                Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(n)) => *n,
                other => panic!("egress port must be a number: {other:?}"),
            })
            .collect();
        let peers = rule.to.clone().unwrap_or_default();
        assert!(
            !peers.is_empty() && !ports.is_empty(),
            "an egress rule open to everything"
        );
        for peer in &peers {
            assert!(peer.ip_block.is_none(), "egress to an address block");
            let app = peer
                .pod_selector
                .as_ref()
                .and_then(|s| s.match_labels.clone())
                .unwrap_or_default();
            let dns = app.get("k8s-app").map(String::as_str) == Some("kube-dns");
            let threadgate = app.get(objects::LABEL_APP).map(String::as_str) == Some("threadgate");
            assert!(dns || threadgate, "egress to {peer:?}");
            if threadgate {
                assert_eq!(ports, [relay_port], "to threadgate only its relay port");
                reaches_relay = true;
            } else {
                assert!(ports.iter().all(|p| *p == 53), "to DNS only port 53");
            }
        }
    }
    assert!(reaches_relay, "the relay port is reachable");
}

/// The template holds the pod threadgate builds for plain pods, given the settings of
/// the ConfigMap: what `claims = "auto"` picks makes no difference to the pod.
#[test]
fn the_sandbox_template_is_the_pod_threadgate_builds() {
    let parsed = parse_all();
    let config = parsed
        .config_maps
        .iter()
        .find(|c| c.metadata.name.as_deref() == Some("threadgate-config"))
        .and_then(|c| c.data.as_ref())
        .and_then(|d| d.get("threadgate.toml"))
        .expect("threadgate.toml in the ConfigMap");
    let file: ConfigFile = toml::from_str(config).expect("the ConfigMap's threadgate.toml parses");
    let sandbox = file.sandbox;
    assert_eq!(sandbox.backend, Backend::Kubernetes);
    let k8s = &sandbox.kubernetes;
    let [template] = parsed.templates.as_slice() else {
        panic!("one SandboxTemplate");
    };
    assert_eq!(template.metadata.name.as_ref(), Some(&k8s.template));
    assert!(
        parsed
            .pools
            .iter()
            .any(|p| p.metadata.name.as_ref() == Some(&k8s.warm_pool))
    );
    let pod = &template.spec.pod_template.spec;
    check_pod("sandbox template", pod);
    assert_eq!(pod.automount_service_account_token, Some(false));
    let labels = &template.spec.pod_template.metadata.labels;
    assert_eq!(
        labels.get(objects::LABEL_APP).map(String::as_str),
        Some(objects::APP_SANDBOX)
    );

    let limits = Limits {
        memory_bytes: sandbox.memory_bytes,
        nano_cpus: sandbox.nano_cpus,
        pids: 0,
    };
    let built = objects::template_pod_spec(k8s, &sandbox.image, limits);
    assert_eq!(
        serde_json::to_value(pod).expect("json"),
        serde_json::to_value(&built).expect("json"),
        "deploy/kubernetes/sandbox-template.yaml differs from objects::template_pod_spec"
    );
}
