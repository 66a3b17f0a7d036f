//! The custom resources of kubernetes-sigs/agent-sandbox that threadgate reads and
//! writes, declared by hand (serde structs and a [`kube::Resource`] impl each) rather
//! than derived, so no schema generator is compiled in.
//!
//! Group `extensions.agents.x-k8s.io`, version `v1beta1`: a `SandboxTemplate` holds the
//! pod template, a `SandboxWarmPool` keeps started sandboxes of a template, and a
//! `SandboxClaim` takes one from a pool (or has one made cold). Every struct refuses a
//! field it does not know, so a manifest with a typo fails its test instead of being
//! applied without the field.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PodSpec;
use k8s_openapi::api::networking::v1::{NetworkPolicyEgressRule, NetworkPolicyIngressRule};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use kube::core::NamespaceResourceScope;
use serde::{Deserialize, Serialize};

/// The API group of the claim, template and warm pool kinds.
pub(crate) const GROUP: &str = "extensions.agents.x-k8s.io";
/// Their version.
pub(crate) const VERSION: &str = "v1beta1";
/// `GROUP/VERSION`, as objects carry it in `apiVersion`.
pub const API_VERSION: &str = "extensions.agents.x-k8s.io/v1beta1";

/// Labels and annotations for a pod (`PodMetadata` upstream).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PodMetadata {
    /// Labels put on the pod.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations put on the pod.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// The pod a template makes: only its labels, annotations and spec are used.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PodTemplate {
    /// Labels and annotations of the pod.
    #[serde(default)]
    pub metadata: PodMetadata,
    /// The pod's spec.
    pub spec: PodSpec,
}

/// The network policy the agent-sandbox controller makes for a template's pods.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SandboxNetworkPolicy {
    /// Allowed inbound traffic; empty denies all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ingress: Vec<NetworkPolicyIngressRule>,
    /// Allowed outbound traffic; empty denies all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress: Vec<NetworkPolicyEgressRule>,
}

/// `SandboxTemplate.spec`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SandboxTemplateSpec {
    /// The pod every sandbox of the template runs.
    pub pod_template: PodTemplate,
    /// Whether the controller makes a headless Service per sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<bool>,
    /// The controller-managed network policy (`Managed`), when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_policy: Option<SandboxNetworkPolicy>,
    /// `Managed` (the controller keeps a policy) or `Unmanaged` (the cluster's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_policy_management: Option<String>,
    /// Whether a claim may add environment variables: `Disallowed`, `Allowed`,
    /// `Overrides`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env_vars_injection_policy: Option<String>,
    /// Whether a claim may add volume claim templates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_claim_templates_policy: Option<String>,
}

/// A pod template for sandboxes (`SandboxTemplate`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SandboxTemplate {
    /// `extensions.agents.x-k8s.io/v1beta1`.
    #[serde(default)]
    pub api_version: String,
    /// `SandboxTemplate`.
    #[serde(default)]
    pub kind: String,
    /// Name, namespace, labels.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The template.
    pub spec: SandboxTemplateSpec,
}

/// A reference by name.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NameRef {
    /// The referenced object's name.
    pub name: String,
}

/// `SandboxWarmPool.spec`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SandboxWarmPoolSpec {
    /// How many started sandboxes the pool keeps.
    pub replicas: i32,
    /// The template its sandboxes are made from.
    pub sandbox_template_ref: NameRef,
    /// `Recreate` or `OnReplenish`, when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_strategy: Option<UpdateStrategy>,
}

/// How a warm pool replaces pods when its template changes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpdateStrategy {
    /// `Recreate` or `OnReplenish`.
    #[serde(rename = "type")]
    pub kind: String,
}

/// A pool of started sandboxes (`SandboxWarmPool`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SandboxWarmPool {
    /// `extensions.agents.x-k8s.io/v1beta1`.
    #[serde(default)]
    pub api_version: String,
    /// `SandboxWarmPool`.
    #[serde(default)]
    pub kind: String,
    /// Name, namespace, labels.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The pool.
    pub spec: SandboxWarmPoolSpec,
    /// What the controller reports; threadgate only reads it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<serde_json::Value>,
}

/// When and how a claim ends.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClaimLifecycle {
    /// When the claim expires, if ever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_time: Option<Time>,
    /// `Delete`, `DeleteForeground` or `Retain`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_policy: Option<String>,
    /// How long a finished claim is kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds_after_finished: Option<i32>,
}

/// `SandboxClaim.spec`. threadgate never sets `env`: a claim with environment is
/// always started cold, and a thread's identity must not be in the pod spec anyway.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SandboxClaimSpec {
    /// The warm pool to take a sandbox from (it names the template).
    pub warm_pool_ref: NameRef,
    /// When the claim ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<ClaimLifecycle>,
    /// Labels and annotations added to the sandbox's pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub additional_pod_metadata: Option<PodMetadata>,
}

/// The sandbox a claim was bound to.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimedSandbox {
    /// The `Sandbox`'s name.
    #[serde(default)]
    pub name: String,
    /// Its pod's addresses.
    #[serde(default, skip_serializing_if = "Vec::is_empty", rename = "podIPs")]
    pub pod_ips: Vec<String>,
}

/// `SandboxClaim.status`: written by the controller. Unknown fields are kept out of
/// the check (a newer controller may report more).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxClaimStatus {
    /// `Ready` among others.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The bound sandbox, once there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<ClaimedSandbox>,
}

/// One thread's sandbox, taken from a warm pool (`SandboxClaim`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SandboxClaim {
    /// `extensions.agents.x-k8s.io/v1beta1`.
    #[serde(default)]
    pub api_version: String,
    /// `SandboxClaim`.
    #[serde(default)]
    pub kind: String,
    /// Name, namespace, labels, annotations, uid.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// What is claimed.
    pub spec: SandboxClaimSpec,
    /// What the controller reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<SandboxClaimStatus>,
}

impl SandboxClaim {
    /// Whether the controller reports the claim's sandbox `Ready`.
    pub fn is_ready(&self) -> bool {
        self.status.as_ref().is_some_and(|status| {
            status
                .conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        })
    }
}

macro_rules! agent_sandbox_resource {
    ($ty:ty, $kind:literal, $plural:literal) => {
        impl kube::Resource for $ty {
            type DynamicType = ();
            type Scope = NamespaceResourceScope;

            fn kind(_: &()) -> Cow<'_, str> {
                Cow::Borrowed($kind)
            }
            fn group(_: &()) -> Cow<'_, str> {
                Cow::Borrowed(GROUP)
            }
            fn version(_: &()) -> Cow<'_, str> {
                Cow::Borrowed(VERSION)
            }
            fn plural(_: &()) -> Cow<'_, str> {
                Cow::Borrowed($plural)
            }
            fn meta(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

agent_sandbox_resource!(SandboxClaim, "SandboxClaim", "sandboxclaims");
agent_sandbox_resource!(SandboxTemplate, "SandboxTemplate", "sandboxtemplates");
agent_sandbox_resource!(SandboxWarmPool, "SandboxWarmPool", "sandboxwarmpools");
