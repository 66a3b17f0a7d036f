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
//! of pods not adopted run at once (one more wait is refused, never queued). A pod parked by another instance (its instance label) is
//! answered [`AdoptionWait::Elsewhere`], so the listener sends the relay to the one
//! instance that will adopt it instead of holding a wait nothing here would wake.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
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
/// Pods whose relays may wait for their adoption at once (one wait each).
pub const MAX_ADOPTION_WAITERS: usize = REVIEW_CACHE_MAX;
/// Reviews of tokens of pods not adopted yet (waits) in flight at once, out of
/// [`MAX_REVIEWS_IN_FLIGHT`]: a flood of waits with forged tokens gets no more of the API
/// server, and never queues ahead of adopted pods' relays; one past it is refused.
pub const MAX_WAIT_REVIEWS_IN_FLIGHT: usize = 2;
/// The `extra` keys the API server puts in a pod-bound token's review.
const EXTRA_POD_NAME: &str = "authentication.kubernetes.io/pod-name";
const EXTRA_POD_UID: &str = "authentication.kubernetes.io/pod-uid";

/// A pod adopted for a session: its name, and the session it serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Adopted {
    pub pod_name: String,
    pub session: SessionId,
}

/// The pods this instance adopted for its sessions, by pod uid: recorded when a claim
/// is bound (and again from the pods' labels after a restart), forgotten when the
/// session's sandbox is stopped.
#[derive(Debug, Clone, Default)]
pub struct Adoptions {
    inner: Arc<Mutex<HashMap<String, Adopted>>>,
    /// The relays waiting for their pod's adoption, by pod uid: one each.
    waiters: Arc<Mutex<Waiters>>,
}

/// Waiting relays: the pod uid's one waiter (its number and how to wake it).
#[derive(Debug, Default)]
struct Waiters {
    next: u64,
    by_pod: HashMap<String, (u64, tokio::sync::oneshot::Sender<Woken>)>,
}

/// Why a waiter was woken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Woken {
    Adopted,
    Superseded,
}

/// One relay's wait for its pod's adoption; leaves its place when dropped.
#[derive(Debug)]
pub struct AdoptionWaiter {
    uid: String,
    id: u64,
    woken: tokio::sync::oneshot::Receiver<Woken>,
    waiters: Arc<Mutex<Waiters>>,
}

impl AdoptionWaiter {
    /// Waits at most `hold` to be woken: `Adopted` when the pod's adoption was recorded
    /// meanwhile (the caller looks it up), `Superseded` when a later wait for the same
    /// pod took this one's place, `NotYet` when `hold` passed.
    async fn woken(&mut self, hold: std::time::Duration) -> Option<Woken> {
        match tokio::time::timeout(hold, &mut self.woken).await {
            Ok(Ok(woken)) => Some(woken),
            Ok(Err(_)) | Err(_) => None,
        }
    }
}

impl Drop for AdoptionWaiter {
    fn drop(&mut self) {
        let mut waiters = self.waiters.lock().unwrap_or_else(PoisonError::into_inner);
        if waiters
            .by_pod
            .get(&self.uid)
            .is_some_and(|(id, _)| *id == self.id)
        {
            waiters.by_pod.remove(&self.uid);
        }
    }
}

impl Adoptions {
    /// Records that the pod `uid` serves `adopted.session`, replacing any earlier pod of
    /// the same session.
    pub fn record(&self, uid: String, adopted: Adopted) {
        {
            let mut pods = self.lock();
            pods.retain(|_, a| a.session != adopted.session);
            pods.insert(uid.clone(), adopted);
        }
        self.wake(&uid, Woken::Adopted);
    }

    /// A place to wait for the pod `uid`'s adoption, taking the place of an earlier
    /// wait for the same pod (woken as superseded); `None` when [`MAX_ADOPTION_WAITERS`]
    /// other pods' waits are held. Registered before the caller looks the adoption up,
    /// so an adoption recorded in between still wakes it.
    pub fn waiter(&self, uid: &str) -> Option<AdoptionWaiter> {
        let mut waiters = self.waiters_lock();
        if waiters.by_pod.len() >= MAX_ADOPTION_WAITERS && !waiters.by_pod.contains_key(uid) {
            return None;
        }
        waiters.next += 1;
        let id = waiters.next;
        let (wake, woken) = tokio::sync::oneshot::channel();
        if let Some((_, earlier)) = waiters.by_pod.insert(uid.to_owned(), (id, wake)) {
            let _ = earlier.send(Woken::Superseded);
        }
        Some(AdoptionWaiter {
            uid: uid.to_owned(),
            id,
            woken,
            waiters: self.waiters.clone(),
        })
    }

    /// Relays waiting now (tests, and the cap's check).
    pub fn waiting(&self) -> usize {
        self.waiters_lock().by_pod.len()
    }

    fn wake(&self, uid: &str, why: Woken) {
        if let Some((_, waiter)) = self.waiters_lock().by_pod.remove(uid) {
            let _ = waiter.send(why);
        }
    }

    fn waiters_lock(&self) -> MutexGuard<'_, Waiters> {
        self.waiters.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records the pod `uid` again after a restart, beside any other pod of the same
    /// session (a pod adopted before a crash its session's row never named is one:
    /// reconciliation removes it, and forgets only it, [`Adoptions::forget_pod`]).
    fn restore(&self, uid: String, adopted: Adopted) {
        self.lock().insert(uid.clone(), adopted);
        self.wake(&uid, Woken::Adopted);
    }

    /// Forgets the pod `uid`: its token reaches nothing from now on.
    pub fn forget_pod(&self, uid: &str) {
        self.lock().remove(uid);
    }

    /// Forgets the pod of `session`: its token reaches nothing from now on.
    pub fn forget_session(&self, session: &SessionId) {
        self.lock().retain(|_, a| &a.session != session);
    }

    /// The adoption of the pod `uid`.
    pub fn get(&self, uid: &str) -> Option<Adopted> {
        self.lock().get(uid).cloned()
    }

    /// How many pods are adopted.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Adopted>> {
        // Every statement leaves the map whole: a panic elsewhere half-writes nothing.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

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

    /// The instance other than this one that parked the pod `reviewed`, read from its
    /// instance label. `None` when it is this one's, carries no label (a warm pool's
    /// pod, not claimed yet) or cannot be read now: the wait is then held here.
    async fn parked_elsewhere(&self, reviewed: &Reviewed) -> Option<String> {
        let (pods, me) = self.parking.as_ref()?;
        let read = tokio::time::timeout(REVIEW_TIMEOUT, pods.get_opt(&reviewed.pod_name));
        let pod = match read.await {
            Ok(Ok(pod)) => pod?,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "cannot read a waiting relay's pod");
                return None;
            }
            Err(_) => return None,
        };
        if pod.metadata.uid.as_deref() != Some(reviewed.pod_uid.as_str()) {
            return None;
        }
        pod.labels()
            .get(crate::sandbox::LABEL_INSTANCE)
            .filter(|owner| *owner != me)
            .cloned()
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
        if let Some(owner) = self.parked_elsewhere(&reviewed).await {
            return Ok(AdoptionWait::Elsewhere(owner));
        }
        let Some(mut waiter) = self.adoptions.waiter(&reviewed.pod_uid) else {
            return Ok(AdoptionWait::TooMany);
        };
        if let Some(session) = self.adopted_session(&reviewed) {
            return Ok(AdoptionWait::Adopted(session));
        }
        Ok(match waiter.woken(hold).await {
            Some(Woken::Superseded) => AdoptionWait::Superseded,
            Some(Woken::Adopted) => self
                .adopted_session(&reviewed)
                .map_or(AdoptionWait::NotYet, AdoptionWait::Adopted),
            None => AdoptionWait::NotYet,
        })
    }
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
