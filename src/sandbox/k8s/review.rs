//! Claimed and adopted parked pods' relays: the pod recorded when a claim is bound or a
//! parked pod adopted ([`Adoptions`], kept by the runtime), and the relay's projected
//! service-account token, checked with the API server's TokenReview against it.
//!
//! A pod drawn from a warm pool was started before any thread existed, so it cannot
//! carry a session credential. Its relay presents the token the kubelet projects for
//! the `threadgate-sandbox` service account with the audience [`RELAY_AUDIENCE`]
//! (`deploy/kubernetes/sandbox-template.yaml`), bound to the pod and rotated. A token
//! reaches a session only when:
//!
//! 1. it names (unverified, read only to skip the API call for junk) a pod recorded in
//!    [`Adoptions`]: a pod this instance adopted for a session, by uid;
//! 2. the API server's TokenReview, asked with the relay audience, says it is
//!    authenticated for that audience, as `system:serviceaccount:<namespace>:
//!    threadgate-sandbox`, and its `extra` names that same pod (name and uid);
//! 3. the recorded pod's name is the reviewed one.
//!
//! The session is then the recorded one: a token of a pod adopted for another session
//! reaches only that session. A positive review is cached for at most
//! [`REVIEW_CACHE_TTL`] (and never past the token's expiry), keyed by the token's
//! digest, in at most [`REVIEW_CACHE_MAX`] entries; the adoption is looked up on every
//! connection, so a stopped session is refused at once. When the API server cannot be
//! asked in [`REVIEW_TIMEOUT`] the token is refused ([`PodTokenError::Unavailable`]),
//! never accepted. At most [`MAX_REVIEWS_IN_FLIGHT`] reviews run at once.
//!
//! A parked pod's relay waits for its adoption ([`PodTokenVerifier::wait_adopted`]):
//! its token is reviewed first (a forged token naming any pod waits for nothing), then
//! it holds one waiter in [`Adoptions`] that recording the pod's adoption wakes. One
//! waiter per pod: a later wait for the same pod takes the earlier one's place (which
//! is answered [`AdoptionWait::Superseded`]); at most [`MAX_ADOPTION_WAITERS`] pods'
//! waits are held at once, and at most [`MAX_WAIT_REVIEWS_IN_FLIGHT`] reviews of tokens
//! of pods not adopted run at once (one more wait is refused, never queued). A pod that
//! no instance has parked or claimed yet (a warm pool's pod) has its labels read again
//! every [`RELABEL_CHECK`] while its wait is held. A pod parked by another instance
//! (its instance label) is answered [`AdoptionWait::Elsewhere`], so the listener sends
//! the relay to the one instance that will adopt it instead of holding a wait nothing
//! here would wake.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::PostParams;
use kube::{Api, Client};
use sha2::{Digest as _, Sha256};
use tokio::sync::Semaphore;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt as _;
use kube::api::ListParams;

use super::adoptions::{Adopted, Adoptions, Woken};
use super::objects::{
    ANNOTATION_SESSION, COMPONENT_SANDBOX, RELAY_AUDIENCE, SANDBOX_SERVICE_ACCOUNT,
    instance_selector,
};
use super::{SandboxError, kube_err};
use crate::ids::SessionId;
use crate::sandbox::SandboxSpec;
use crate::sandbox::{AdoptionWait, MAX_POD_TOKEN_LEN, PodTokenError, PodTokenVerifier};
use crate::secrets::{ExposeSecret as _, SecretString};

/// How long a positive review is trusted without asking again.
pub(crate) const REVIEW_CACHE_TTL: Duration = Duration::from_secs(30);
/// Positive reviews kept at most (one per live claimed pod, and a rotation's overlap).
pub(crate) const REVIEW_CACHE_MAX: usize = 4096;
/// TokenReviews asked at once at most; more wait (within the listener's handshake time).
pub(crate) const MAX_REVIEWS_IN_FLIGHT: usize = 8;
/// How long one review may take (the client retries a 503 with backoff meanwhile);
/// within the relay listener's handshake time.
pub(crate) const REVIEW_TIMEOUT: Duration = Duration::from_secs(3);
/// How often a wait for a pod no instance has claimed yet reads the pod's instance
/// label again (a claim bound by another instance is told by nothing here).
pub(crate) const RELABEL_CHECK: Duration = Duration::from_secs(2);
/// Reviews of tokens of pods not adopted yet (waits) in flight at once, out of
/// [`MAX_REVIEWS_IN_FLIGHT`]: a flood of waits with forged tokens gets no more of the API
/// server, and never queues ahead of adopted pods' relays; one past it is refused.
pub const MAX_WAIT_REVIEWS_IN_FLIGHT: usize = 2;
/// The `extra` keys the API server puts in a pod-bound token's review.
const EXTRA_POD_NAME: &str = "authentication.kubernetes.io/pod-name";
const EXTRA_POD_UID: &str = "authentication.kubernetes.io/pod-uid";

impl super::KubeRuntime {
    /// Records the pod of every claim of this instance again (after a restart): the
    /// pods carry the claim's labels and the session's annotation. With plain pods, the
    /// parked pods adopted before (a slot label and the session's annotation); a cold
    /// pod's relay presents a minted credential and is recorded nowhere.
    pub(super) async fn restore_adoptions(&self) -> Result<(), SandboxError> {
        let params =
            ListParams::default().labels(&instance_selector(&self.instance_id, COMPONENT_SANDBOX));
        let pods = self
            .pods()
            .list(&params)
            .await
            .map_err(|e| kube_err("list", "claimed sandbox pods", e))?;
        let pooled = |pod: &Pod| pod.labels().contains_key(crate::sandbox::LABEL_SLOT);
        for pod in pods {
            if self.kind == super::Kind::Pods && !pooled(&pod) {
                continue;
            }
            if let Some((uid, adopted)) = adopted_pod(&pod) {
                self.adoptions.restore(uid, adopted);
            }
        }
        Ok(())
    }

    /// Finds the pod the controller bound to `spec`'s claim (it carries the claim's
    /// labels and the session's annotation) and records it: only that pod's token
    /// reaches the session.
    pub(super) async fn adopt_claimed_pod(
        &self,
        spec: &SandboxSpec,
        name: &str,
    ) -> Result<(), SandboxError> {
        let selector = format!(
            "{},{}={}",
            instance_selector(&self.instance_id, COMPONENT_SANDBOX),
            crate::sandbox::LABEL_SESSION,
            super::objects::label_value(&spec.session_id)
        );
        let pods = self
            .pods()
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(|e| kube_err("list", "the claimed sandbox's pod", e))?;
        let mut found: Vec<(String, Adopted)> = pods
            .iter()
            .filter(|pod| pod.metadata.deletion_timestamp.is_none())
            .filter_map(adopted_pod)
            .filter(|(_, adopted)| adopted.session == spec.session_id)
            .collect();
        let (Some((uid, adopted)), None) = (found.pop(), found.pop()) else {
            return Err(SandboxError::Cluster {
                reason: format!(
                    "claim {name:?} is ready but not exactly one pod carries its session's labels"
                ),
            });
        };
        tracing::info!(pod = %adopted.pod_name, "claimed sandbox pod recorded for its session");
        self.adoptions.record(uid, adopted);
        Ok(())
    }
}

/// A pod's uid and what it was adopted for, read from its labels and annotations.
fn adopted_pod(pod: &Pod) -> Option<(String, Adopted)> {
    let uid = pod.metadata.uid.clone()?;
    let pod_name = pod.metadata.name.clone()?;
    let session = pod.annotations().get(ANNOTATION_SESSION)?;
    let session = crate::ids::SessionId::parse(session.as_str()).ok()?;
    Some((uid, Adopted { pod_name, session }))
}

/// A review the API server gave: the pod it vouched for, until when it is trusted.
#[derive(Debug, Clone)]
struct Reviewed {
    pod_uid: String,
    pod_name: String,
    until: Instant,
}

/// Checks claimed pods' tokens (see the module's text).
pub struct TokenReviewer {
    reviews: Api<TokenReview>,
    username: String,
    adoptions: Adoptions,
    /// The sandbox pods and this instance's id: a wait for a pod another instance
    /// parked is sent there.
    parking: Option<(Api<Pod>, String)>,
    cache: Mutex<HashMap<[u8; 32], Reviewed>>,
    in_flight: Semaphore,
    /// The waits' share of `in_flight`, taken without queueing.
    waits_in_flight: Semaphore,
}

impl std::fmt::Debug for TokenReviewer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenReviewer")
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

impl TokenReviewer {
    /// Reviews on `client`'s cluster, for sandboxes in `namespace`, against `adoptions`.
    pub fn new(client: Client, namespace: &str, adoptions: Adoptions) -> TokenReviewer {
        TokenReviewer {
            reviews: Api::all(client),
            username: format!("system:serviceaccount:{namespace}:{SANDBOX_SERVICE_ACCOUNT}"),
            adoptions,
            parking: None,
            cache: Mutex::new(HashMap::new()),
            in_flight: Semaphore::new(MAX_REVIEWS_IN_FLIGHT),
            waits_in_flight: Semaphore::new(MAX_WAIT_REVIEWS_IN_FLIGHT),
        }
    }

    /// Pods parked by an instance other than `instance_id` (read from `pods`, the
    /// sandbox namespace's) are waited for there ([`AdoptionWait::Elsewhere`]).
    #[must_use]
    pub fn parking_for(mut self, pods: Api<Pod>, instance_id: &str) -> TokenReviewer {
        self.parking = Some((pods, instance_id.to_owned()));
        self
    }

    /// Who parked the pod `reviewed`, read from its instance label: another instance,
    /// this one, or nobody yet (a warm pool's pod before a claim binds it; also when the
    /// pod cannot be read now, or without `parking_for`).
    async fn parker(&self, reviewed: &Reviewed) -> Parker {
        let Some((pods, me)) = self.parking.as_ref() else {
            return Parker::Mine;
        };
        let read = tokio::time::timeout(REVIEW_TIMEOUT, pods.get_opt(&reviewed.pod_name));
        let pod = match read.await {
            Ok(Ok(Some(pod))) => pod,
            Ok(Ok(None)) | Err(_) => return Parker::Nobody,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "cannot read a waiting relay's pod");
                return Parker::Nobody;
            }
        };
        if pod.metadata.uid.as_deref() != Some(reviewed.pod_uid.as_str()) {
            return Parker::Nobody;
        }
        match pod.labels().get(crate::sandbox::LABEL_INSTANCE) {
            Some(owner) if owner == me => Parker::Mine,
            Some(owner) => Parker::Elsewhere(owner.clone()),
            None => Parker::Nobody,
        }
    }

    /// Positive reviews held now (tests, and the cap's check).
    pub fn cached(&self) -> usize {
        self.cache_lock().len()
    }

    fn cache_lock(&self) -> MutexGuard<'_, HashMap<[u8; 32], Reviewed>> {
        self.cache.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The pod `token` belongs to, from the cache or a fresh review. With
    /// `adopted_only`, a token naming no adopted pod is refused `Unknown` unreviewed.
    async fn reviewed_pod(
        &self,
        token: &str,
        adopted_only: bool,
    ) -> Result<Reviewed, PodTokenError> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let now = Instant::now();
        if let Some(hit) = self.cache_lock().get(&digest).filter(|r| r.until > now) {
            return Ok(hit.clone());
        }
        let claims = peek_claims(token).ok_or(PodTokenError::Invalid)?;
        if adopted_only && self.adoptions.get(&claims.pod_uid).is_none() {
            return Err(PodTokenError::Unknown);
        }
        let _permit = self
            .in_flight
            .acquire()
            .await
            .map_err(|_| PodTokenError::Unavailable)?;
        let (pod_name, pod_uid) = self.review(token).await?;
        // The review vouched for the token, so its claims are the issuer's.
        if pod_uid != claims.pod_uid {
            return Err(PodTokenError::Invalid);
        }
        let left = claims
            .expires_at
            .and_then(|exp| {
                let now_s = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .ok()?
                    .as_secs();
                Some(Duration::from_secs(exp.saturating_sub(now_s)))
            })
            .unwrap_or(REVIEW_CACHE_TTL);
        let reviewed = Reviewed {
            pod_uid,
            pod_name,
            until: now + left.min(REVIEW_CACHE_TTL),
        };
        let mut cache = self.cache_lock();
        if cache.len() >= REVIEW_CACHE_MAX {
            cache.retain(|_, r| r.until > now);
        }
        if cache.len() < REVIEW_CACHE_MAX {
            cache.insert(digest, reviewed.clone());
        }
        Ok(reviewed)
    }

    /// One TokenReview: the pod (name, uid) the API server vouches for.
    async fn review(&self, token: &str) -> Result<(String, String), PodTokenError> {
        let asked = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                audiences: Some(vec![RELAY_AUDIENCE.to_owned()]),
            },
            ..Default::default()
        };
        let params = PostParams::default();
        let asking = self.reviews.create(&params, &asked);
        let answered = match tokio::time::timeout(REVIEW_TIMEOUT, asking).await {
            Ok(Ok(answered)) => answered,
            Ok(Err(e)) => {
                // The error names the request, never the token (it is in the body).
                tracing::warn!(error = %e, "cannot review a claimed pod's relay token");
                return Err(PodTokenError::Unavailable);
            }
            Err(_) => {
                tracing::warn!(waited = ?REVIEW_TIMEOUT, "the API server did not review a claimed pod's relay token in time");
                return Err(PodTokenError::Unavailable);
            }
        };
        let status = answered.status.unwrap_or_default();
        if status.authenticated != Some(true) {
            return Err(PodTokenError::Invalid);
        }
        let audience_ok = status
            .audiences
            .as_ref()
            .is_some_and(|a| a.iter().any(|a| a == RELAY_AUDIENCE));
        let user = status.user.unwrap_or_default();
        if !audience_ok || user.username.as_deref() != Some(self.username.as_str()) {
            return Err(PodTokenError::Invalid);
        }
        let extra = user.extra.unwrap_or_default();
        let one = |key: &str| match extra.get(key).map(Vec::as_slice) {
            Some([value]) if !value.is_empty() => Some(value.clone()),
            _ => None,
        };
        match (one(EXTRA_POD_NAME), one(EXTRA_POD_UID)) {
            (Some(name), Some(uid)) => Ok((name, uid)),
            _ => Err(PodTokenError::Invalid),
        }
    }
}

#[async_trait::async_trait]
impl PodTokenVerifier for TokenReviewer {
    async fn session_of(&self, token: &SecretString) -> Result<SessionId, PodTokenError> {
        let token = token.expose_secret();
        if token.is_empty() || token.len() > MAX_POD_TOKEN_LEN {
            return Err(PodTokenError::Invalid);
        }
        let reviewed = self.reviewed_pod(token, true).await?;
        // Looked up on every connection: a stopped session's pod is forgotten at once.
        self.adopted_session(&reviewed)
            .ok_or(PodTokenError::Unknown)
    }

    async fn wait_adopted(
        &self,
        token: &SecretString,
        hold: Duration,
    ) -> Result<AdoptionWait, PodTokenError> {
        let token = token.expose_secret();
        if token.is_empty() || token.len() > MAX_POD_TOKEN_LEN {
            return Err(PodTokenError::Invalid);
        }
        // Reviewed even when its pod is not adopted: only a real pod's relay may wait.
        // Those reviews have a small share of their own, refused when it is taken.
        let reviewed = match self.reviewed_pod(token, true).await {
            Err(PodTokenError::Unknown) => {
                let Ok(_share) = self.waits_in_flight.try_acquire() else {
                    return Ok(AdoptionWait::TooMany);
                };
                self.reviewed_pod(token, false).await?
            }
            other => other?,
        };
        if let Some(session) = self.adopted_session(&reviewed) {
            return Ok(AdoptionWait::Adopted(session));
        }
        let parker = self.parker(&reviewed).await;
        if let Parker::Elsewhere(owner) = parker {
            return Ok(AdoptionWait::Elsewhere(owner));
        }
        let Some(mut waiter) = self.adoptions.waiter(&reviewed.pod_uid) else {
            return Ok(AdoptionWait::TooMany);
        };
        if let Some(session) = self.adopted_session(&reviewed) {
            return Ok(AdoptionWait::Adopted(session));
        }
        // A pod nobody parked yet may be claimed by another instance, which no adoption
        // here would tell: its label is read again every `RELABEL_CHECK`.
        let step = match parker {
            Parker::Nobody => RELABEL_CHECK,
            Parker::Mine | Parker::Elsewhere(_) => hold,
        };
        let deadline = tokio::time::Instant::now() + hold;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return Ok(AdoptionWait::NotYet);
            }
            match waiter.woken(left.min(step)).await {
                Some(Woken::Superseded) => return Ok(AdoptionWait::Superseded),
                Some(Woken::Adopted) => {
                    return Ok(self
                        .adopted_session(&reviewed)
                        .map_or(AdoptionWait::NotYet, AdoptionWait::Adopted));
                }
                None => {}
            }
            if step < hold
                && let Parker::Elsewhere(owner) = self.parker(&reviewed).await
            {
                return Ok(AdoptionWait::Elsewhere(owner));
            }
        }
    }
}

/// Who parked a waiting relay's pod.
enum Parker {
    Mine,
    Elsewhere(String),
    Nobody,
}

impl TokenReviewer {
    /// The session `reviewed`'s pod is adopted for, if it is (by uid, under the same name).
    fn adopted_session(&self, reviewed: &Reviewed) -> Option<SessionId> {
        self.adoptions
            .get(&reviewed.pod_uid)
            .filter(|adopted| adopted.pod_name == reviewed.pod_name)
            .map(|adopted| adopted.session)
    }
}

/// What a token says of itself before anyone vouched for it.
struct Claims {
    pod_uid: String,
    expires_at: Option<u64>,
}

/// The pod uid and expiry a JWT's payload claims (`kubernetes.io.pod.uid`, `exp`),
/// unverified: only used to skip reviewing a token of no adopted pod, and (after the
/// review vouched for the token) to bound the cache by its expiry.
fn peek_claims(token: &str) -> Option<Claims> {
    let mut parts = token.split('.');
    let (Some(_header), Some(payload), Some(_signature), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return None;
    };
    let bytes = URL_SAFE_NO_PAD.decode(payload).ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    let pod_uid = claims
        .get("kubernetes.io")?
        .get("pod")?
        .get("uid")?
        .as_str()?
        .to_owned();
    Some(Claims {
        pod_uid,
        expires_at: claims.get("exp").and_then(serde_json::Value::as_u64),
    })
}
