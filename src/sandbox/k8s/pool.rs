//! Parked pods on a cluster without agent-sandbox: [`KubeRuntime`]'s `park`, `adopt`
//! and `list_parked` for plain pods, so `session::pool` keeps warm pods exactly as it
//! keeps warm containers on Docker.
//!
//! A parked pod is the template's pod (`objects::parked_pod`) with its agent's command
//! and environment, labelled with the instance, the pool, a random slot and
//! `component=pool`, and nothing of any thread: no session or thread label, no
//! annotation, no Secret, a name made of the slot. Its relay's credential is the
//! pod-bound token the kubelet projects for the `threadgate-sandbox` service account
//! (audience `threadgate-relay`), so it needs no credential minted for a session; until
//! the pod is adopted the gateway's [`super::TokenReviewer`] finds it in no adoption
//! and refuses it, and the relay keeps asking.
//!
//! Adoption is one conditional merge patch (`objects::adoption_patch`, at the
//! `resourceVersion` the pod was read with): `component` becomes `sandbox` and the
//! session's labels and annotations are written, so the pod is from then on listed as
//! the session's (`list`) and never as parked. Of two adopters the API server lets one
//! write (the other's patch is answered 409; it reads the pod again and finds it
//! adopted). Only after the patch is the pod recorded in [`super::Adoptions`]: from then
//! its relay's token reaches that session and no other, and the relay fetches the
//! session's secrets and workspace. A pod adopted but not named by its session (a crash
//! between the patch and the session's row) is listed with its session and removed by
//! reconciliation as any stray.

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt as _;
use kube::api::{ListParams, Patch, PatchParams, PostParams};

use super::adoptions::Adopted;
use super::objects::{self, COMPONENT_POOL, instance_selector};
use super::wait::{self, State};
use super::{Kind, KubeRuntime, create_err, delete_quietly, grace, kube_err, status_of};
use crate::sandbox::{
    LABEL_INSTANCE, LABEL_POOL, LABEL_SLOT, ParkSpec, ParkedSandbox, SandboxError, SandboxHandle,
    SandboxSpec,
};

/// Conditional patches tried when the pod changed between the read and the patch
/// (its status, typically) and is still parked.
const ADOPT_ATTEMPTS: usize = 3;

impl KubeRuntime {
    fn require_pods(&self) -> Result<(), SandboxError> {
        match self.kind {
            Kind::Pods => Ok(()),
            Kind::Claims => Err(SandboxError::PoolUnsupported {
                reason: "sessions are agent-sandbox claims here: its SandboxWarmPool keeps \
                         the warm pods (sandbox.kubernetes.warm_pool)"
                    .into(),
            }),
        }
    }

    /// Creates a parked pod of `spec.pool` and waits until it is ready; one that is not
    /// ready in `ready_timeout` (or can never be) is removed.
    pub(super) async fn park_pod(&self, spec: &ParkSpec) -> Result<ParkedSandbox, SandboxError> {
        self.require_pods()?;
        let invalid = |reason: String| SandboxError::InvalidSpec {
            session: format!("pool {}", spec.pool),
            reason,
        };
        if spec.pool.is_empty() || !objects::is_label_value(&spec.pool) || spec.image.is_empty() {
            return Err(invalid(
                "the pool name must be a label value (at most 63 of [A-Za-z0-9_.-], alphanumeric \
                 at both ends) and the image not empty"
                    .into(),
            ));
        }
        if let Some((key, _)) = spec.env.iter().find(|(key, _)| !is_env_name(key)) {
            return Err(invalid(format!(
                "environment variable name {key:?} is invalid"
            )));
        }
        let simple = uuid::Uuid::new_v4().simple().to_string();
        let slot = simple.get(..16).unwrap_or(&simple).to_owned();
        let name = objects::object_name(&self.instance_id, &format!("pool-{slot}"));
        let pod = objects::parked_pod(&self.settings, &self.instance_id, &name, &slot, spec);
        let created = self
            .pods()
            .create(&PostParams::default(), &pod)
            .await
            .map_err(|e| create_err(&name, e))?;
        if let Err(e) = self.wait(self.pods(), &name, wait::pod_state).await {
            if let Err(undo) = delete_quietly(&self.pods(), &name, &grace()).await {
                tracing::error!(%name, error = %undo, "cannot remove a parked pod that did not become ready");
            }
            return Err(e);
        }
        tracing::info!(%name, pool = %spec.pool, %slot, "pod parked");
        Ok(ParkedSandbox {
            container_id: name.clone(),
            name,
            pool: spec.pool.clone(),
            slot,
            image: spec.image.clone(),
            created_at_ms: created_at_ms(&created)
                .unwrap_or_else(|| chrono::Utc::now().timestamp_millis()),
            clean: true,
        })
    }

    /// Adopts the parked pod for `spec`'s session (see the module's text). A pod that is
    /// gone, another instance's, or adopted already is refused with
    /// [`SandboxError::NotAdoptable`] and left alone; a parked pod that is not ready, or
    /// whose adoption failed otherwise, is removed.
    pub(super) async fn adopt_pod(
        &self,
        parked: &ParkedSandbox,
        spec: &SandboxSpec,
    ) -> Result<SandboxHandle, SandboxError> {
        self.require_pods()?;
        self.validate(spec)?;
        let name = parked.container_id.as_str();
        let refuse = |reason: &str| SandboxError::NotAdoptable {
            container: name.to_owned(),
            reason: reason.to_owned(),
        };
        for _ in 0..ADOPT_ATTEMPTS {
            let pod = match self.pods().get_opt(name).await {
                Ok(pod) => pod,
                Err(e) => {
                    // Taken from the pool, it is never handed out again: removed (the
                    // pool's sweep skips a taken pod), adopted by no one.
                    self.remove_parked(name).await;
                    return Err(kube_err("read", name, e));
                }
            };
            let Some(pod) = pod else {
                return Err(refuse("it is gone"));
            };
            if !self.is_parked_here(&pod, &parked.slot) {
                // Adopted before (by this instance or another), or not this instance's
                // parked pod at all: it stays whose it is.
                return Err(refuse("it is not a parked pod of this instance"));
            }
            if wait::pod_state(&pod) != State::Ready {
                self.remove_parked(name).await;
                return Err(refuse("it is not ready"));
            }
            let Some(version) = pod.metadata.resource_version.as_deref() else {
                self.remove_parked(name).await;
                return Err(refuse("the API server gave no resourceVersion"));
            };
            let patch = objects::adoption_patch(&self.instance_id, spec, version);
            let patched = self
                .pods()
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await;
            let adopted = match patched {
                Ok(adopted) => adopted,
                // Changed since it was read: read again; whoever won is seen then.
                Err(e) if status_of(&e) == Some(409) => {
                    tracing::debug!(pod = %name, "the parked pod changed before its adoption; reading it again");
                    continue;
                }
                Err(e) if status_of(&e) == Some(404) => return Err(refuse("it is gone")),
                Err(e) => {
                    // The patch may have been written: the pod is removed, never left
                    // to be adopted again or bound to this session unknowingly.
                    self.remove_parked(name).await;
                    return Err(kube_err("adopt", name, e));
                }
            };
            let Some(uid) = adopted.metadata.uid.clone() else {
                self.remove_parked(name).await;
                return Err(refuse("the API server gave no uid"));
            };
            // INVARIANT: recorded only after the adoption is written: the pod's token
            // reaches its session from now on, and no other session ever.
            self.adoptions.record(
                uid,
                Adopted {
                    pod_name: name.to_owned(),
                    session: spec.session_id.clone(),
                },
            );
            tracing::info!(pod = %name, session = %spec.session_id, "parked pod adopted");
            return Ok(SandboxHandle {
                container_id: name.to_owned(),
                name: name.to_owned(),
            });
        }
        // Still parked at the last read, yet every patch lost: taken from the pool, it is
        // never handed out again.
        self.remove_parked(name).await;
        Err(refuse("it kept changing while it was being adopted"))
    }

    /// This instance's parked pods (never adopted); `clean` when ready and not being
    /// deleted.
    pub(super) async fn parked_pods(&self) -> Result<Vec<ParkedSandbox>, SandboxError> {
        if self.kind != Kind::Pods {
            return Ok(Vec::new());
        }
        let params =
            ListParams::default().labels(&instance_selector(&self.instance_id, COMPONENT_POOL));
        let pods = self
            .pods()
            .list(&params)
            .await
            .map_err(|e| kube_err("list", "parked pods", e))?;
        let mut parked = Vec::new();
        for pod in pods {
            let labels = pod.labels();
            let (Some(name), Some(pool), Some(slot)) = (
                pod.metadata.name.clone(),
                labels.get(LABEL_POOL),
                labels.get(LABEL_SLOT),
            ) else {
                continue;
            };
            // The server filtered already; checking again costs nothing.
            if !self.is_parked_here(&pod, slot) {
                continue;
            }
            let image = pod
                .spec
                .as_ref()
                .and_then(|s| s.containers.first())
                .and_then(|c| c.image.clone())
                .unwrap_or_default();
            parked.push(ParkedSandbox {
                container_id: name.clone(),
                name,
                pool: pool.clone(),
                slot: slot.clone(),
                image,
                created_at_ms: created_at_ms(&pod).unwrap_or(0),
                clean: wait::pod_state(&pod) == State::Ready,
            });
        }
        Ok(parked)
    }

    /// Whether `pod` is a parked pod of this instance in `slot`, never adopted.
    fn is_parked_here(&self, pod: &Pod, slot: &str) -> bool {
        let labels = pod.labels();
        labels.get(LABEL_INSTANCE) == Some(&self.instance_id)
            && labels.get(objects::LABEL_COMPONENT).map(String::as_str) == Some(COMPONENT_POOL)
            && labels.get(LABEL_SLOT).map(String::as_str) == Some(slot)
            && labels.get(crate::sandbox::LABEL_SESSION).is_none()
            && !pod.annotations().contains_key(objects::ANNOTATION_SESSION)
    }

    /// Removes a parked pod whose adoption failed; a failure is logged (the pool's
    /// sweep, or reconciliation when it was adopted, gets it later).
    async fn remove_parked(&self, name: &str) {
        if let Err(e) = delete_quietly(&self.pods(), name, &grace()).await {
            tracing::error!(pod = %name, error = %e, "cannot remove a parked pod");
        }
    }
}

/// A pod's creation time in milliseconds since the Unix epoch.
fn created_at_ms(pod: &Pod) -> Option<i64> {
    pod.metadata
        .creation_timestamp
        .as_ref()
        .map(|t| t.0.as_millisecond())
}

/// An environment variable name the API server takes.
fn is_env_name(key: &str) -> bool {
    !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}
