//! [`FakeRuntime`]: an in-memory [`SandboxRuntime`] for fast orchestrator tests.
//!
//! It keeps the real runtime's contract (one container per session name, idempotent
//! stop, secrets directories that outlive a vanished container until reaped) and lets a
//! test make the next start fail, a container exit, or a container vanish behind the
//! orchestrator's back.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;

use super::{
    ParkSpec, ParkedSandbox, SandboxError, SandboxHandle, SandboxInfo, SandboxRuntime, SandboxSpec,
};
use crate::ids::{SessionId, ThreadId};

/// The instance id the fake puts in container names.
const FAKE_INSTANCE: &str = "fake";

/// One container the fake holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeContainer {
    /// Id and name, as `start` returned them.
    pub handle: SandboxHandle,
    /// The spec's session id.
    pub session_id: SessionId,
    /// The spec's thread id.
    pub thread_id: ThreadId,
    /// The spec's image.
    pub image: String,
    /// Names of the secrets granted (never their values).
    pub secret_names: Vec<String>,
    /// Whether it is running.
    pub running: bool,
}

#[derive(Debug, Default)]
struct FakeState {
    next_id: u64,
    containers: BTreeMap<String, FakeContainer>,
    /// Sessions whose secrets directory exists.
    secrets_dirs: BTreeSet<String>,
    fail_next_start: Option<SandboxError>,
    /// Images removed with [`FakeRuntime::remove_image`]: starts and readiness fail.
    missing_images: BTreeSet<String>,
    starts: usize,
    stops: usize,
    /// Whether `park` works (see [`FakeRuntime::with_pool`]).
    pool: bool,
    /// Parked sandboxes, by container id.
    parked: BTreeMap<String, ParkedSandbox>,
    /// Every container id ever adopted.
    adopted: BTreeSet<String>,
    fail_next_park: Option<SandboxError>,
    fail_next_adopt: Option<SandboxError>,
    /// What [`SandboxRuntime::pod_token_verifier`] answers.
    pod_tokens: PodTokens,
    /// What `park` reports as a sandbox's creation time.
    now_ms: i64,
    parks: usize,
}

/// The verifier a test hands the fake runtime.
#[derive(Default, Clone)]
struct PodTokens(Option<std::sync::Arc<dyn super::PodTokenVerifier>>);

impl std::fmt::Debug for PodTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "Some(..)" } else { "None" })
    }
}

/// An in-memory sandbox runtime. Cheap to create; share it behind an `Arc`.
#[derive(Debug, Default)]
pub struct FakeRuntime {
    state: Mutex<FakeState>,
    /// Held by [`FakeRuntime::hold_reaping`]: `reap_orphan_secrets` waits meanwhile,
    /// as the Docker runtime's reaper waits for the container starts in flight.
    reaping: Arc<tokio::sync::RwLock<()>>,
}

impl FakeRuntime {
    /// An empty runtime.
    pub fn new() -> Self {
        Self::default()
    }

    /// A runtime that can park sandboxes (warm starts); without it `park` answers
    /// [`SandboxError::PoolUnsupported`], like a runtime without a pool.
    pub fn with_pool() -> Self {
        let fake = Self::default();
        fake.lock().pool = true;
        fake
    }

    /// Makes [`SandboxRuntime::pod_token_verifier`] answer `verifier`, as a runtime
    /// whose sandboxes' relays present pod tokens does.
    pub fn set_pod_token_verifier(&self, verifier: std::sync::Arc<dyn super::PodTokenVerifier>) {
        self.lock().pod_tokens = PodTokens(Some(verifier));
    }

    /// Sets the creation time `park` reports from now on.
    pub fn set_now_ms(&self, now_ms: i64) {
        self.lock().now_ms = now_ms;
    }

    /// Makes `reap_orphan_secrets` wait until the guard is dropped (a reaper stuck
    /// behind slow container starts).
    pub async fn hold_reaping(&self) -> tokio::sync::OwnedRwLockWriteGuard<()> {
        self.reaping.clone().write_owned().await
    }

    /// Makes the next `park` fail with `err`.
    pub fn fail_next_park(&self, err: SandboxError) {
        self.lock().fail_next_park = Some(err);
    }

    /// Makes the next `adopt` fail with `err` after recording the adoption (the
    /// sandbox is removed, as the real runtime does).
    pub fn fail_next_adopt(&self, err: SandboxError) {
        self.lock().fail_next_adopt = Some(err);
    }

    /// The parked sandboxes held now, ordered by id.
    pub fn parked(&self) -> Vec<ParkedSandbox> {
        self.lock().parked.values().cloned().collect()
    }

    /// Every container id ever adopted.
    pub fn adopted(&self) -> Vec<String> {
        self.lock().adopted.iter().cloned().collect()
    }

    /// How many `park` calls succeeded so far.
    pub fn park_count(&self) -> usize {
        self.lock().parks
    }

    /// Makes the next `start` fail with `err` (leaving nothing behind, as the real
    /// runtime does).
    pub fn fail_next_start(&self, err: SandboxError) {
        self.lock().fail_next_start = Some(err);
    }

    /// Removes an image from the fake engine, as `docker rmi` would: readiness reports
    /// it missing and starts that need it fail with [`SandboxError::ImageMissing`].
    pub fn remove_image(&self, image: &str) {
        self.lock().missing_images.insert(image.to_owned());
    }

    /// Marks a container as exited (still listed, not running). Returns whether it
    /// existed.
    pub fn exit(&self, container_id: &str) -> bool {
        match self.lock().containers.get_mut(container_id) {
            Some(container) => {
                container.running = false;
                true
            }
            None => false,
        }
    }

    /// Removes a container without stopping it through the runtime, as `docker rm -f`
    /// from outside would: its secrets directory stays until reaped. Returns whether it
    /// existed.
    pub fn vanish(&self, container_id: &str) -> bool {
        self.lock().containers.remove(container_id).is_some()
    }

    /// The containers held now, ordered by id.
    pub fn containers(&self) -> Vec<FakeContainer> {
        self.lock().containers.values().cloned().collect()
    }

    /// Sessions whose secrets directory exists now.
    pub fn secrets_dirs(&self) -> Vec<String> {
        self.lock().secrets_dirs.iter().cloned().collect()
    }

    /// How many `start` calls succeeded so far.
    pub fn start_count(&self) -> usize {
        self.lock().starts
    }

    /// How many `stop` calls removed a container so far.
    pub fn stop_count(&self) -> usize {
        self.lock().stops
    }

    fn lock(&self) -> MutexGuard<'_, FakeState> {
        // A panic while holding the lock leaves plain data behind; keep going.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[async_trait]
impl SandboxRuntime for FakeRuntime {
    fn pod_token_verifier(&self) -> Option<std::sync::Arc<dyn super::PodTokenVerifier>> {
        self.lock().pod_tokens.0.clone()
    }

    async fn check_ready(&self, image: &str) -> Result<(), SandboxError> {
        if self.lock().missing_images.contains(image) {
            return Err(SandboxError::ImageMissing {
                image: image.to_owned(),
            });
        }
        Ok(())
    }

    async fn start(&self, spec: &SandboxSpec) -> Result<SandboxHandle, SandboxError> {
        let mut state = self.lock();
        if let Some(err) = state.fail_next_start.take() {
            return Err(err);
        }
        if state.missing_images.contains(&spec.image) {
            return Err(SandboxError::ImageMissing {
                image: spec.image.clone(),
            });
        }
        let name = super::container_name(FAKE_INSTANCE, &spec.session_id);
        if state.containers.values().any(|c| c.handle.name == name) {
            return Err(SandboxError::AlreadyExists { name });
        }
        state.next_id += 1;
        let handle = SandboxHandle {
            container_id: format!("fake{:060}", state.next_id),
            name,
        };
        state.containers.insert(
            handle.container_id.clone(),
            FakeContainer {
                handle: handle.clone(),
                session_id: spec.session_id.clone(),
                thread_id: spec.thread_id.clone(),
                image: spec.image.clone(),
                secret_names: spec.secrets.iter().map(|(name, _)| name.clone()).collect(),
                running: true,
            },
        );
        state.secrets_dirs.insert(spec.session_id.to_string());
        state.starts += 1;
        Ok(handle)
    }

    async fn stop(&self, container_id: &str) -> Result<(), SandboxError> {
        let mut state = self.lock();
        let key = state
            .containers
            .values()
            .find(|c| c.handle.container_id == container_id || c.handle.name == container_id)
            .map(|c| c.handle.container_id.clone());
        let Some(key) = key else {
            if state.parked.remove(container_id).is_some() {
                state.stops += 1;
            }
            return Ok(());
        };
        if let Some(container) = state.containers.remove(&key) {
            state.secrets_dirs.remove(container.session_id.as_str());
            state.stops += 1;
        }
        Ok(())
    }

    async fn park(&self, spec: &ParkSpec) -> Result<ParkedSandbox, SandboxError> {
        let mut state = self.lock();
        if !state.pool {
            return Err(SandboxError::PoolUnsupported {
                reason: "the fake runtime was made without a pool".into(),
            });
        }
        if let Some(err) = state.fail_next_park.take() {
            return Err(err);
        }
        state.next_id += 1;
        let slot = format!("slot{}", state.next_id);
        let parked = ParkedSandbox {
            container_id: format!("fake{:060}", state.next_id),
            name: super::container_name(FAKE_INSTANCE, &format!("pool-{slot}")),
            pool: spec.pool.clone(),
            slot,
            image: spec.image.clone(),
            created_at_ms: state.now_ms,
            clean: true,
        };
        state
            .parked
            .insert(parked.container_id.clone(), parked.clone());
        state.parks += 1;
        Ok(parked)
    }

    async fn adopt(
        &self,
        parked: &ParkedSandbox,
        spec: &SandboxSpec,
    ) -> Result<SandboxHandle, SandboxError> {
        let mut state = self.lock();
        let refuse = |reason: &str| SandboxError::NotAdoptable {
            container: parked.container_id.clone(),
            reason: reason.into(),
        };
        if !state.adopted.insert(parked.container_id.clone()) {
            return Err(refuse("it was adopted before"));
        }
        if state.parked.remove(&parked.container_id).is_none() {
            return Err(refuse("it is not parked"));
        }
        if let Some(err) = state.fail_next_adopt.take() {
            return Err(err);
        }
        let handle = SandboxHandle {
            container_id: parked.container_id.clone(),
            name: parked.name.clone(),
        };
        state.containers.insert(
            handle.container_id.clone(),
            FakeContainer {
                handle: handle.clone(),
                session_id: spec.session_id.clone(),
                thread_id: spec.thread_id.clone(),
                image: parked.image.clone(),
                secret_names: spec.secrets.iter().map(|(name, _)| name.clone()).collect(),
                running: true,
            },
        );
        state.secrets_dirs.insert(spec.session_id.to_string());
        Ok(handle)
    }

    async fn list_parked(&self) -> Result<Vec<ParkedSandbox>, SandboxError> {
        Ok(self.parked())
    }

    async fn list(&self) -> Result<Vec<SandboxInfo>, SandboxError> {
        Ok(self
            .lock()
            .containers
            .values()
            .map(|c| SandboxInfo {
                container_id: c.handle.container_id.clone(),
                session_id: c.session_id.to_string(),
                thread_id: c.thread_id.to_string(),
                running: c.running,
            })
            .collect())
    }

    async fn reap_orphan_secrets(&self) -> Result<usize, SandboxError> {
        drop(self.reaping.read().await);
        let mut state = self.lock();
        let live: BTreeSet<String> = state
            .containers
            .values()
            .map(|c| c.session_id.to_string())
            .collect();
        let before = state.secrets_dirs.len();
        state.secrets_dirs.retain(|session| live.contains(session));
        Ok(before - state.secrets_dirs.len())
    }
}
