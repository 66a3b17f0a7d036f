//! [`KubeRuntime`]: the [`SandboxRuntime`] that runs each session as a pod on a
//! Kubernetes cluster, through kube-rs.
//!
//! Where the cluster serves kubernetes-sigs/agent-sandbox (found by discovery, or
//! forced by `sandbox.kubernetes.claims`), a session is one `SandboxClaim` on the
//! configured `SandboxWarmPool`; elsewhere it is one plain pod built like the
//! template's (`objects::pod_spec`). Either way the object is named after the instance
//! and the session, labelled with both and the thread, and carries the full ids in
//! annotations. [`SandboxHandle::container_id`] is the object's name.
//!
//! A plain pod's relay authenticates with a credential of its own session (minted by
//! the gateway's [`RelayMinter`]), in a Secret owned by the pod (garbage-collected with
//! it) and mounted only into the relay. A claimed pod comes from a shared template,
//! which cannot name a per-session Secret: its relay presents the pod-bound service
//! account token the kubelet projects and rotates (see
//! `deploy/kubernetes/sandbox-template.yaml`), which the gateway checks with the API
//! server's TokenReview against the pod recorded when the claim was bound
//! ([`Adoptions`], `review.rs`).
//!
//! Without agent-sandbox the runtime keeps parked pods for `session::pool` itself
//! (`pool.rs`): the template's pod with nothing of any thread, adopted by one
//! conditional patch and recorded in [`Adoptions`] like a claimed pod.
//!
//! The contract is the Docker runtime's: `start` returns once the pod is ready and
//! leaves nothing behind when it fails (a 409 is [`SandboxError::AlreadyExists`]);
//! `stop` is idempotent and refuses another instance's object; `list` is what adopting
//! after a restart and reaping strays read; `reap_orphan_secrets` removes credential
//! Secrets whose pod is gone.

mod adoptions;
mod crd;
mod objects;
mod pool;
mod review;
mod settings;
mod wait;

#[cfg(test)]
pub(crate) mod tests;

use std::collections::HashSet;
use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DeleteParams, ListParams, PostParams, PropagationPolicy};
use kube::{Api, Client, Resource, ResourceExt as _};
use serde::de::DeserializeOwned;

pub use adoptions::{Adopted, AdoptionWaiter, Adoptions, MAX_ADOPTION_WAITERS};
pub use crd::{
    API_VERSION as AGENT_SANDBOX_API_VERSION, SandboxClaim, SandboxTemplate, SandboxWarmPool,
};
pub use objects::{object_name, pod_spec, relay_args, template_pod_spec};
pub use review::{MAX_WAIT_REVIEWS_IN_FLIGHT, TokenReviewer};
pub use settings::{Backend, ClaimMode, KubernetesSettings};

use super::{
    LABEL_INSTANCE, LABEL_SLOT, ParkSpec, ParkedSandbox, RelayMinter, SandboxError, SandboxHandle,
    SandboxInfo, SandboxRuntime, SandboxSpec,
};
use crate::secrets::ExposeSecret as _;
use objects::{
    ANNOTATION_SESSION, ANNOTATION_THREAD, COMPONENT_CREDENTIAL, COMPONENT_SANDBOX, GRACE_SECONDS,
    credential_name, instance_selector,
};
use wait::NotReady;

/// Whether sessions are claims or plain pods on this cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `SandboxClaim`s on the warm pool.
    Claims,
    /// Plain pods.
    Pods,
}

/// Starts and stops session pods (or claims) in one namespace, for one instance.
#[derive(Clone)]
pub struct KubeRuntime {
    client: Client,
    settings: KubernetesSettings,
    instance_id: String,
    kind: Kind,
    /// Mints the credential a plain pod's relay presents (the gateway's relay
    /// credentials, so the relay listener of any instance sharing the master key
    /// accepts it).
    minter: Arc<dyn RelayMinter>,
    /// The pods bound to this instance's claims, by uid: what a claimed pod's token is
    /// checked against.
    adoptions: Adoptions,
    ca_pem: Vec<u8>,
}

impl std::fmt::Debug for KubeRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeRuntime")
            .field("namespace", &self.settings.namespace)
            .field("instance_id", &self.instance_id)
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

impl KubeRuntime {
    /// Connects with the in-cluster service account (or `KUBECONFIG`), reads the
    /// gateway's CA from `ca_file`, and sets up as [`KubeRuntime::with_client`] does.
    pub async fn connect(
        instance_id: &str,
        settings: KubernetesSettings,
        minter: Arc<dyn RelayMinter>,
    ) -> Result<Self, SandboxError> {
        let Some(ca_file) = settings.ca_file.clone() else {
            return Err(SandboxError::Cluster {
                reason: "sandbox.kubernetes.ca_file must name the relay listener's CA (PEM)".into(),
            });
        };
        let ca_pem = tokio::fs::read(&ca_file)
            .await
            .map_err(|source| SandboxError::Io {
                action: "read sandbox.kubernetes.ca_file",
                path: ca_file.clone(),
                source,
            })?;
        let client = Client::try_default()
            .await
            .map_err(|e| kube_err("connect to", "the cluster", e))?;
        Self::with_client(client, instance_id, settings, ca_pem, minter).await
    }

    /// Sets up on `client`: checks the instance id can be a label value, finds out
    /// whether claims are served (unless `settings.claims` says), and (claims) records
    /// the pods bound to this instance's claims again (adopting after a restart).
    /// `minter` mints the credential each plain pod's relay presents.
    pub async fn with_client(
        client: Client,
        instance_id: &str,
        settings: KubernetesSettings,
        ca_pem: Vec<u8>,
        minter: Arc<dyn RelayMinter>,
    ) -> Result<Self, SandboxError> {
        if instance_id.is_empty() || !objects::is_label_value(instance_id) {
            return Err(SandboxError::InvalidInstance {
                instance: instance_id.to_string(),
            });
        }
        let served = match settings.claims {
            ClaimMode::Never => false,
            ClaimMode::Auto | ClaimMode::Always => claims_served(&client).await?,
        };
        let kind = match (settings.claims, served) {
            (ClaimMode::Always, false) => {
                return Err(SandboxError::Cluster {
                    reason: format!(
                        "sandbox.kubernetes.claims is \"always\" but the cluster does not serve \
                         sandboxclaims.{}",
                        crd::GROUP
                    ),
                });
            }
            (_, true) => Kind::Claims,
            (_, false) => Kind::Pods,
        };
        let runtime = KubeRuntime {
            client,
            settings,
            instance_id: instance_id.to_string(),
            kind,
            minter,
            adoptions: Adoptions::default(),
            ca_pem,
        };
        // Claimed pods, and parked pods adopted before a restart.
        runtime.restore_adoptions().await?;
        tracing::info!(namespace = %runtime.settings.namespace, kind = ?kind, "kubernetes sandbox runtime ready");
        Ok(runtime)
    }

    /// Claims or plain pods.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// The pods bound to this instance's claims: what the gateway's
    /// [`TokenReviewer`] checks a claimed pod's relay against.
    pub fn adoptions(&self) -> Adoptions {
        self.adoptions.clone()
    }

    /// The verifier of claimed pods' relay tokens: TokenReview on this runtime's
    /// cluster, checked against its [`Adoptions`].
    pub fn token_reviewer(&self) -> TokenReviewer {
        TokenReviewer::new(
            self.client.clone(),
            &self.settings.namespace,
            self.adoptions.clone(),
        )
        .parking_for(self.pods(), &self.instance_id)
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.settings.namespace)
    }

    fn claims(&self) -> Api<SandboxClaim> {
        Api::namespaced(self.client.clone(), &self.settings.namespace)
    }

    fn secrets(&self) -> Api<Secret> {
        Api::namespaced(self.client.clone(), &self.settings.namespace)
    }

    fn validate(&self, spec: &SandboxSpec) -> Result<(), SandboxError> {
        let invalid = |reason: String| SandboxError::InvalidSpec {
            session: spec.session_id.to_string(),
            reason,
        };
        if spec.image.is_empty() {
            return Err(invalid("image must not be empty".into()));
        }
        for (key, _) in &spec.env {
            let ok = !key.is_empty()
                && key
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
            if !ok {
                return Err(invalid(format!(
                    "environment variable name {key:?} is invalid"
                )));
            }
        }
        super::docker::validate_secrets(spec).map_err(invalid)
    }

    /// Creates the pod and its credential, and waits for it to be ready.
    async fn start_pod(&self, spec: &SandboxSpec, name: &str) -> Result<(), SandboxError> {
        let pod = objects::pod(&self.settings, &self.instance_id, name, spec);
        let created = self
            .pods()
            .create(&PostParams::default(), &pod)
            .await
            .map_err(|e| create_err(name, e))?;
        let result = async {
            let owner = owner_of(&created, name)?;
            let token = self.minter.mint(&spec.session_id);
            let secret = objects::credential(
                &self.settings,
                &self.instance_id,
                spec,
                owner,
                token.expose_secret().as_bytes(),
                &self.ca_pem,
            );
            self.create_credential(&secret).await?;
            self.wait(self.pods(), name, wait::pod_state).await
        }
        .await;
        if result.is_err() {
            self.undo(name, &spec.session_id).await;
        }
        result
    }

    /// Creates the claim and waits for the controller to report it ready.
    async fn start_claim(&self, spec: &SandboxSpec, name: &str) -> Result<(), SandboxError> {
        if spec.command.is_some() || !spec.env.is_empty() {
            // A warm sandbox was started before its thread was known: the agent learns
            // its thread and definition through its socket, not its environment.
            tracing::debug!("a claimed sandbox runs the template's command and environment");
        }
        let claim = objects::claim(&self.settings, &self.instance_id, name, spec);
        self.claims()
            .create(&PostParams::default(), &claim)
            .await
            .map_err(|e| create_err(name, e))?;
        let result = async {
            self.wait(self.claims(), name, wait::claim_state).await?;
            self.adopt_claimed_pod(spec, name).await
        }
        .await;
        if result.is_err() {
            self.undo(name, &spec.session_id).await;
        }
        result
    }

    /// Creates a credential Secret. One left by an earlier pod of the same name (its
    /// owner is gone and the collector has not got to it yet) is replaced.
    async fn create_credential(&self, secret: &Secret) -> Result<(), SandboxError> {
        let name = secret.name_any();
        let api = self.secrets();
        match api.create(&PostParams::default(), secret).await {
            Ok(_) => return Ok(()),
            Err(e) if status_of(&e) == Some(409) => {}
            Err(e) => return Err(kube_err("create", &name, e)),
        }
        let stale = api
            .get_opt(&name)
            .await
            .map_err(|e| kube_err("read", &name, e))?;
        if let Some(stale) = stale
            && stale.labels().get(LABEL_INSTANCE) != Some(&self.instance_id)
        {
            return Err(SandboxError::NotOwned { container: name });
        }
        tracing::warn!(secret = %name, "replacing a stale relay credential");
        delete_quietly(&api, &name, &DeleteParams::default()).await?;
        api.create(&PostParams::default(), secret)
            .await
            .map_err(|e| kube_err("create", &name, e))?;
        Ok(())
    }

    async fn wait<K>(
        &self,
        api: Api<K>,
        name: &str,
        check: fn(&K) -> wait::State,
    ) -> Result<(), SandboxError>
    where
        K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
        K::DynamicType: Default,
    {
        let waited = self.settings.ready_timeout;
        wait::until_ready(api, name, waited, check)
            .await
            .map_err(|not_ready| {
                let reason = match not_ready {
                    NotReady::TimedOut(last) => format!("not ready in time ({last})"),
                    NotReady::Failed(reason) => reason,
                };
                SandboxError::NotReady {
                    name: name.to_string(),
                    waited,
                    reason,
                }
            })
    }

    /// Removes what a failed start made; failures are logged (the reaper and the
    /// garbage collector get what this misses).
    async fn undo(&self, name: &str, session: &crate::ids::SessionId) {
        self.adoptions.forget_session(session);
        if let Err(e) = self.delete_object(name).await {
            tracing::error!(%name, error = %e, "cannot remove a sandbox whose start failed");
        }
        if let Err(e) = delete_quietly(&self.secrets(), &credential_name(name), &now()).await {
            tracing::error!(%name, error = %e, "cannot remove the credential of a failed start");
        }
    }

    async fn delete_object(&self, name: &str) -> Result<(), SandboxError> {
        let params = grace();
        match self.kind {
            Kind::Pods => delete_quietly(&self.pods(), name, &params).await,
            Kind::Claims => delete_quietly(&self.claims(), name, &params).await,
        }
    }

    /// The labels and annotations of the session object `name`, if it exists.
    async fn object_meta(
        &self,
        name: &str,
    ) -> Result<Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>, SandboxError>
    {
        let meta = match self.kind {
            Kind::Pods => self
                .pods()
                .get_opt(name)
                .await
                .map(|o| o.map(|p| p.metadata)),
            Kind::Claims => self
                .claims()
                .get_opt(name)
                .await
                .map(|o| o.map(|c| c.metadata)),
        };
        meta.map_err(|e| kube_err("read", name, e))
    }

    async fn list_sessions(&self) -> Result<Vec<SandboxInfo>, SandboxError> {
        let params =
            ListParams::default().labels(&instance_selector(&self.instance_id, COMPONENT_SANDBOX));
        let infos = match self.kind {
            Kind::Pods => {
                let pods = self
                    .pods()
                    .list(&params)
                    .await
                    .map_err(|e| kube_err("list", "sandbox pods", e))?;
                pods.into_iter()
                    .map(|pod| {
                        let running = pod.metadata.deletion_timestamp.is_none()
                            && pod.status.as_ref().and_then(|s| s.phase.as_deref())
                                == Some("Running");
                        info_of(&self.instance_id, &pod.metadata, running)
                    })
                    .collect::<Vec<_>>()
            }
            Kind::Claims => {
                let claims = self
                    .claims()
                    .list(&params)
                    .await
                    .map_err(|e| kube_err("list", "sandbox claims", e))?;
                claims
                    .into_iter()
                    .map(|claim| {
                        let running =
                            claim.metadata.deletion_timestamp.is_none() && claim.is_ready();
                        info_of(&self.instance_id, &claim.metadata, running)
                    })
                    .collect()
            }
        };
        // The server filtered already; checking again costs nothing.
        Ok(infos.into_iter().flatten().collect())
    }
}

#[async_trait]
impl SandboxRuntime for KubeRuntime {
    #[tracing::instrument(skip_all, fields(session = %spec.session_id, thread = %spec.thread_id))]
    async fn start(&self, spec: &SandboxSpec) -> Result<SandboxHandle, SandboxError> {
        self.validate(spec)?;
        let name = object_name(&self.instance_id, &spec.session_id);
        match self.kind {
            Kind::Pods => self.start_pod(spec, &name).await?,
            Kind::Claims => self.start_claim(spec, &name).await?,
        }
        tracing::info!(%name, "sandbox started");
        Ok(SandboxHandle {
            container_id: name.clone(),
            name,
        })
    }

    #[tracing::instrument(skip_all, fields(container = %container_id))]
    async fn stop(&self, container_id: &str) -> Result<(), SandboxError> {
        let Some(meta) = self.object_meta(container_id).await? else {
            return Ok(());
        };
        let labels = meta.labels.unwrap_or_default();
        if labels.get(LABEL_INSTANCE) != Some(&self.instance_id) {
            return Err(SandboxError::NotOwned {
                container: container_id.to_string(),
            });
        }
        self.delete_object(container_id).await?;
        delete_quietly(&self.secrets(), &credential_name(container_id), &now()).await?;
        if labels.contains_key(LABEL_SLOT) {
            // A pod of the pool: only this pod's adoption is forgotten (a stray of a
            // crash must not take the record of its session's live pod with it).
            if let Some(uid) = &meta.uid {
                self.adoptions.forget_pod(uid);
            }
        } else {
            let session = meta
                .annotations
                .unwrap_or_default()
                .remove(ANNOTATION_SESSION);
            if let Some(Ok(session)) = session.map(crate::ids::SessionId::parse) {
                self.adoptions.forget_session(&session);
            }
        }
        tracing::info!("sandbox stopped");
        Ok(())
    }

    async fn list(&self) -> Result<Vec<SandboxInfo>, SandboxError> {
        self.list_sessions().await
    }

    async fn reap_orphan_secrets(&self) -> Result<usize, SandboxError> {
        // Secrets first: a Secret is made after its pod, so any pod a listed Secret
        // belongs to is in the pod list read after it (unless it is gone since).
        let params = ListParams::default()
            .labels(&instance_selector(&self.instance_id, COMPONENT_CREDENTIAL));
        let secrets = self
            .secrets()
            .list(&params)
            .await
            .map_err(|e| kube_err("list", "credential secrets", e))?;
        let live: HashSet<String> = self
            .list_sessions()
            .await?
            .into_iter()
            .map(|info| credential_name(&info.container_id))
            .collect();
        let mut removed = 0;
        for secret in secrets {
            let name = secret.name_any();
            if live.contains(&name) {
                continue;
            }
            delete_quietly(&self.secrets(), &name, &now()).await?;
            removed += 1;
        }
        Ok(removed)
    }

    async fn park(&self, spec: &ParkSpec) -> Result<ParkedSandbox, SandboxError> {
        self.park_pod(spec).await
    }

    #[tracing::instrument(skip_all, fields(session = %spec.session_id, container = %parked.container_id))]
    async fn adopt(
        &self,
        parked: &ParkedSandbox,
        spec: &SandboxSpec,
    ) -> Result<SandboxHandle, SandboxError> {
        self.adopt_pod(parked, spec).await
    }

    async fn list_parked(&self) -> Result<Vec<ParkedSandbox>, SandboxError> {
        self.parked_pods().await
    }

    fn pod_token_verifier(&self) -> Option<Arc<dyn super::PodTokenVerifier>> {
        // A claimed pod's relay, and an adopted parked pod's, present the pod's
        // service-account token (a cold plain pod's a minted credential).
        Some(Arc::new(self.token_reviewer()))
    }

    async fn check_ready(&self, _image: &str) -> Result<(), SandboxError> {
        // Images are pulled by the nodes: whether one exists is the registry's to say,
        // and a pod that cannot pull fails its start with the reason.
        self.client
            .apiserver_version()
            .await
            .map_err(|e| kube_err("reach", "the API server", e))?;
        let probe = ListParams::default()
            .labels(&instance_selector(&self.instance_id, COMPONENT_SANDBOX))
            .limit(1);
        match self.kind {
            Kind::Pods => {
                self.pods()
                    .list_metadata(&probe)
                    .await
                    .map_err(|e| kube_err("list", "sandbox pods", e))?;
            }
            Kind::Claims => {
                let pools: Api<SandboxWarmPool> =
                    Api::namespaced(self.client.clone(), &self.settings.namespace);
                let pool = &self.settings.warm_pool;
                if pools
                    .get_opt(pool)
                    .await
                    .map_err(|e| kube_err("read", pool, e))?
                    .is_none()
                {
                    return Err(SandboxError::Cluster {
                        reason: format!(
                            "sandbox warm pool {pool:?} (sandbox.kubernetes.warm_pool) not found in namespace {:?}",
                            self.settings.namespace
                        ),
                    });
                }
            }
        }
        Ok(())
    }
}

/// Whether the cluster serves agent-sandbox's claims (discovery of the group version).
async fn claims_served(client: &Client) -> Result<bool, SandboxError> {
    match client.list_api_group_resources(crd::API_VERSION).await {
        Ok(list) => Ok(list.resources.iter().any(|r| r.name == "sandboxclaims")),
        Err(e) if status_of(&e) == Some(404) => Ok(false),
        Err(e) => Err(kube_err("discover", crd::API_VERSION, e)),
    }
}

fn info_of(
    instance_id: &str,
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    running: bool,
) -> Option<SandboxInfo> {
    let instance = meta.labels.as_ref().and_then(|l| l.get(LABEL_INSTANCE));
    if instance.map(String::as_str) != Some(instance_id) {
        return None;
    }
    let annotations = meta.annotations.as_ref();
    let annotation = |key: &str| {
        annotations
            .and_then(|a| a.get(key))
            .cloned()
            .unwrap_or_default()
    };
    Some(SandboxInfo {
        container_id: meta.name.clone()?,
        session_id: annotation(ANNOTATION_SESSION),
        thread_id: annotation(ANNOTATION_THREAD),
        running,
    })
}

/// The owner reference to a created pod (its uid is the server's).
fn owner_of(pod: &Pod, name: &str) -> Result<OwnerReference, SandboxError> {
    let uid = pod
        .metadata
        .uid
        .clone()
        .ok_or_else(|| SandboxError::Cluster {
            reason: format!("the API server returned pod {name:?} without a uid"),
        })?;
    Ok(OwnerReference {
        api_version: "v1".to_string(),
        kind: "Pod".to_string(),
        name: name.to_string(),
        uid,
        ..Default::default()
    })
}

/// Deletes `name`; one already gone is fine.
async fn delete_quietly<K>(
    api: &Api<K>,
    name: &str,
    params: &DeleteParams,
) -> Result<(), SandboxError>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, params).await {
        Ok(_) => Ok(()),
        Err(e) if status_of(&e) == Some(404) => Ok(()),
        Err(e) => Err(kube_err("delete", name, e)),
    }
}

/// Delete after the sandbox's grace period, its dependents in the background.
fn grace() -> DeleteParams {
    DeleteParams {
        grace_period_seconds: u32::try_from(GRACE_SECONDS).ok(),
        propagation_policy: Some(PropagationPolicy::Background),
        ..Default::default()
    }
}

/// Delete without a grace period (Secrets have none to wait out).
fn now() -> DeleteParams {
    DeleteParams::default()
}

fn create_err(name: &str, e: kube::Error) -> SandboxError {
    if status_of(&e) == Some(409) {
        return SandboxError::AlreadyExists {
            name: name.to_string(),
        };
    }
    kube_err("create", name, e)
}

/// The HTTP status of an API error, if it was one.
fn status_of(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

fn kube_err(action: &'static str, target: &str, source: kube::Error) -> SandboxError {
    SandboxError::Kube {
        action,
        target: target.to_string(),
        source: Box::new(source),
    }
}
