//! [`DockerRuntime`]: the real [`SandboxRuntime`], driving the Docker engine through
//! bollard with the API version negotiated (Debian 12's engine stops at 1.41).

use crate::secrets::ExposeSecret as _;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use bollard::Docker;
use bollard::errors::Error as BollardError;
use bollard::models::{
    ContainerCreateBody, ContainerSummaryStateEnum, HostConfig, Mount, MountType,
};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, ListContainersOptionsBuilder, RemoveContainerOptionsBuilder,
    StopContainerOptionsBuilder,
};
use tokio::sync::RwLock;

use super::host::{self, Owner, WriteSecrets};
use super::slot;
use super::{
    CONTAINER_SECRETS_DIR, CONTAINER_SOCKET_DIR, CONTAINER_WORKSPACE, LABEL_INSTANCE,
    LABEL_SESSION, LABEL_SLOT, LABEL_THREAD, ParkSpec, ParkedSandbox, SANDBOX_UID, SandboxError,
    SandboxHandle, SandboxInfo, SandboxRuntime, SandboxSpec, container_name, sanitise_id,
};

/// Size of the tmpfs mounted at `/tmp` in each container; its pages count against the
/// container's memory limit.
const TMP_BYTES: u64 = 256 << 20;
/// Default grace period between SIGTERM and SIGKILL when a container is stopped.
const DEFAULT_STOP_TIMEOUT_SECS: i32 = 5;

/// Starts and stops session containers on a Docker engine, for one threadgate instance.
///
/// Containers are labelled with the instance id; [`SandboxRuntime::list`],
/// [`SandboxRuntime::stop`] and [`SandboxRuntime::reap_orphan_secrets`] touch nothing
/// else. Secrets go to `<secrets_root>/<instance>/<session>/`, which must be on a tmpfs.
#[derive(Debug)]
pub struct DockerRuntime {
    pub(super) docker: Docker,
    pub(super) instance_id: String,
    secrets_root: PathBuf,
    /// Where parked sandboxes' slot directories live: `<secrets_root>/<instance>.pool`
    /// (a `.` cannot be in an instance id, so no instance's secrets share it).
    pub(super) pool_root: PathBuf,
    /// The uid:gid containers run as.
    pub(super) container_owner: Owner,
    /// Whether workspace and socket directories must be handed to `container_owner`
    /// (threadgate runs as root and the container does not).
    pub(super) chown_mounts: bool,
    stop_timeout_secs: i32,
    /// Held shared by every `start`, `park` and `adopt` and exclusively by
    /// `reap_orphan_secrets`, so the reaper never sees a secrets or slot directory
    /// whose container is still being created.
    pub(super) start_gate: RwLock<()>,
}

/// What a create request is made of (see [`DockerRuntime::body`]).
pub(super) struct BodyParts<'a> {
    /// Names the sandbox in errors: a session id, or a pool.
    pub who: &'a str,
    pub image: &'a str,
    pub limits: super::Limits,
    pub command: Option<Vec<String>>,
    pub env: &'a [(String, String)],
    pub labels: HashMap<String, String>,
    pub mounts: Vec<Mount>,
}

impl DockerRuntime {
    /// Connects to the engine named by `DOCKER_HOST` (default: the local unix socket),
    /// negotiates the API version, and checks that `secrets_root` is on a tmpfs.
    ///
    /// `instance_id` must be non-empty and made of ASCII letters, digits, `_` and `-`.
    pub async fn connect(instance_id: &str, secrets_root: PathBuf) -> Result<Self, SandboxError> {
        if instance_id.is_empty() || sanitise_id(instance_id) != instance_id {
            return Err(SandboxError::InvalidInstance {
                instance: instance_id.to_string(),
            });
        }
        host::require_tmpfs(&secrets_root)?;
        let docker = Docker::connect_with_defaults()
            .map_err(SandboxError::Connect)?
            .negotiate_version()
            .await
            .map_err(SandboxError::Connect)?;
        let me = host::process_owner();
        let (container_owner, chown_mounts) = if me.uid == 0 {
            let agent = Owner {
                uid: SANDBOX_UID,
                gid: SANDBOX_UID,
            };
            (agent, true)
        } else {
            (me, false)
        };
        Ok(DockerRuntime {
            docker,
            instance_id: instance_id.to_string(),
            pool_root: secrets_root.join(format!("{instance_id}.pool")),
            secrets_root,
            container_owner,
            chown_mounts,
            stop_timeout_secs: DEFAULT_STOP_TIMEOUT_SECS,
            start_gate: RwLock::new(()),
        })
    }

    /// Sets how long `stop` waits after SIGTERM before killing (default 5 s).
    pub fn with_stop_timeout_secs(mut self, secs: i32) -> Self {
        self.stop_timeout_secs = secs;
        self
    }

    /// The instance id this runtime labels and filters containers with.
    pub fn instance_id(&self) -> &str {
        &self.instance_id
    }

    /// The uid and gid containers run as.
    pub fn container_user(&self) -> (u32, u32) {
        (self.container_owner.uid, self.container_owner.gid)
    }

    /// The host directory that holds a session's secret files while it runs.
    pub fn secrets_dir(&self, session_id: &str) -> PathBuf {
        self.instance_secrets_root().join(sanitise_id(session_id))
    }

    fn instance_secrets_root(&self) -> PathBuf {
        self.secrets_root.join(&self.instance_id)
    }

    /// Writes the session's secrets directory. A directory left by a start that
    /// crashed halfway (no container by that name) is replaced; one that belongs to a
    /// live container is refused.
    pub(super) async fn prepare_secrets(
        &self,
        spec: &SandboxSpec,
        name: &str,
    ) -> Result<(), SandboxError> {
        let dir = self.secrets_dir(&spec.session_id);
        let owner = self.chown_mounts.then_some(self.container_owner);
        let secrets = spec.secrets.clone();
        let write = {
            let dir = dir.clone();
            move || host::write_secrets(&dir, &secrets, owner)
        };
        match blocking(write.clone()).await? {
            WriteSecrets::Written => return Ok(()),
            WriteSecrets::AlreadyExists => {}
        }
        if self.container_exists(name).await? {
            return Err(SandboxError::AlreadyExists {
                name: name.to_string(),
            });
        }
        tracing::warn!(session = %spec.session_id, "replacing a stale secrets directory");
        let stale = dir.clone();
        blocking(move || host::remove_secrets(&stale)).await?;
        match blocking(write).await? {
            WriteSecrets::Written => Ok(()),
            WriteSecrets::AlreadyExists => Err(SandboxError::AlreadyExists {
                name: name.to_string(),
            }),
        }
    }

    async fn container_exists(&self, name: &str) -> Result<bool, SandboxError> {
        match self.docker.inspect_container(name, None).await {
            Ok(_) => Ok(true),
            Err(err) if status_of(&err) == Some(404) => Ok(false),
            Err(source) => Err(docker_err("inspect container", name, source)),
        }
    }

    /// The create request for `spec`. Holds no secret value: secrets reach the
    /// container only through the read-only bind of their directory.
    fn container_body(&self, spec: &SandboxSpec) -> Result<ContainerCreateBody, SandboxError> {
        let labels = HashMap::from([
            (LABEL_INSTANCE.to_string(), self.instance_id.clone()),
            (LABEL_SESSION.to_string(), spec.session_id.to_string()),
            (LABEL_THREAD.to_string(), spec.thread_id.to_string()),
        ]);
        let mounts = vec![
            bind(&spec.workspace_dir, CONTAINER_WORKSPACE, false),
            // Read-only is enough to connect to a socket, and keeps the agent from
            // replacing it or leaving files there.
            bind(&spec.socket_dir, CONTAINER_SOCKET_DIR, true),
            bind(
                &self.secrets_dir(&spec.session_id),
                CONTAINER_SECRETS_DIR,
                true,
            ),
        ];
        self.body(BodyParts {
            who: &spec.session_id,
            image: &spec.image,
            limits: spec.limits,
            command: spec.command.clone(),
            env: &spec.env,
            labels,
            mounts,
        })
    }

    /// A create request with the lock-down every container gets (no network,
    /// read-only root, no capabilities, limits, a non-root user).
    pub(super) fn body(&self, parts: BodyParts<'_>) -> Result<ContainerCreateBody, SandboxError> {
        let invalid = |reason: &str| SandboxError::InvalidSpec {
            session: parts.who.to_string(),
            reason: reason.to_string(),
        };
        let memory = i64::try_from(parts.limits.memory_bytes)
            .map_err(|_| invalid("memory limit too large"))?;
        let nano_cpus =
            i64::try_from(parts.limits.nano_cpus).map_err(|_| invalid("cpu limit too large"))?;
        let pids = i64::try_from(parts.limits.pids).map_err(|_| invalid("pids limit too large"))?;
        let tmpfs = HashMap::from([(
            "/tmp".to_string(),
            format!("rw,exec,nosuid,nodev,mode=1777,size={TMP_BYTES}"),
        )]);
        let host_config = HostConfig {
            network_mode: Some("none".to_string()),
            readonly_rootfs: Some(true),
            mounts: Some(parts.mounts),
            tmpfs: Some(tmpfs),
            cap_drop: Some(vec!["ALL".to_string()]),
            security_opt: Some(vec!["no-new-privileges".to_string()]),
            memory: Some(memory),
            memory_swap: Some(memory),
            nano_cpus: Some(nano_cpus),
            pids_limit: Some(pids),
            ipc_mode: Some("private".to_string()),
            // tini as PID 1: reaps the agent's orphans and passes SIGTERM on.
            init: Some(true),
            auto_remove: Some(false),
            ..Default::default()
        };
        let owner = self.container_owner;
        Ok(ContainerCreateBody {
            image: Some(parts.image.to_string()),
            user: Some(format!("{}:{}", owner.uid, owner.gid)),
            working_dir: Some(CONTAINER_WORKSPACE.to_string()),
            env: Some(parts.env.iter().map(|(k, v)| format!("{k}={v}")).collect()),
            cmd: parts.command,
            labels: Some(parts.labels),
            host_config: Some(host_config),
            ..Default::default()
        })
    }

    /// Creates and starts the container; on failure removes whatever it created.
    pub(super) async fn create_and_start(
        &self,
        body: ContainerCreateBody,
        image: &str,
        name: &str,
    ) -> Result<String, SandboxError> {
        let options = CreateContainerOptionsBuilder::new().name(name).build();
        let created = self
            .docker
            .create_container(Some(options), body)
            .await
            .map_err(|source| match status_of(&source) {
                Some(404) => SandboxError::ImageMissing {
                    image: image.to_string(),
                },
                Some(409) => SandboxError::AlreadyExists {
                    name: name.to_string(),
                },
                _ => docker_err("create container", name, source),
            })?;
        if let Err(source) = self.docker.start_container(&created.id, None).await {
            let _ = self.remove_container(&created.id).await;
            return Err(docker_err("start container", name, source));
        }
        Ok(created.id)
    }

    /// Force-removes a container; one that is already gone (or being removed) is fine.
    pub(super) async fn remove_container(&self, container: &str) -> Result<(), SandboxError> {
        let options = RemoveContainerOptionsBuilder::new().force(true).build();
        match self.docker.remove_container(container, Some(options)).await {
            Ok(()) => Ok(()),
            Err(err) if matches!(status_of(&err), Some(404) | Some(409)) => Ok(()),
            Err(source) => Err(docker_err("remove container", container, source)),
        }
    }

    pub(super) fn validate(&self, spec: &SandboxSpec) -> Result<(), SandboxError> {
        let invalid = |reason: String| SandboxError::InvalidSpec {
            session: spec.session_id.to_string(),
            reason,
        };
        if spec.session_id.is_empty() || spec.thread_id.is_empty() || spec.image.is_empty() {
            return Err(invalid(
                "session id, thread id and image must not be empty".into(),
            ));
        }
        for (label, dir) in [
            ("workspace_dir", &spec.workspace_dir),
            ("socket_dir", &spec.socket_dir),
        ] {
            if !dir.is_absolute() || !dir.is_dir() {
                return Err(invalid(format!(
                    "{label} {dir:?} is not an absolute path to a directory"
                )));
            }
        }
        for (key, _) in &spec.env {
            if key.is_empty() || key.contains(['=', '\0']) {
                return Err(invalid(format!(
                    "environment variable name {key:?} is invalid"
                )));
            }
        }
        validate_secrets(spec).map_err(invalid)
    }
}

#[async_trait]
impl SandboxRuntime for DockerRuntime {
    async fn check_ready(&self, image: &str) -> Result<(), SandboxError> {
        self.docker
            .ping()
            .await
            .map_err(|source| docker_err("ping", "the engine", source))?;
        match self.docker.inspect_image(image).await {
            Ok(_) => Ok(()),
            Err(err) if status_of(&err) == Some(404) => Err(SandboxError::ImageMissing {
                image: image.to_owned(),
            }),
            Err(source) => Err(docker_err("inspect image", image, source)),
        }
    }

    #[tracing::instrument(skip_all, fields(session = %spec.session_id, thread = %spec.thread_id))]
    async fn start(&self, spec: &SandboxSpec) -> Result<SandboxHandle, SandboxError> {
        self.validate(spec)?;
        let name = container_name(&self.instance_id, &spec.session_id);
        if self.chown_mounts {
            let owner = self.container_owner;
            let workspace = spec.workspace_dir.clone();
            let socket_dir = spec.socket_dir.clone();
            blocking(move || {
                host::chown_tree(&workspace, owner)?;
                host::chown_tree(&socket_dir, owner)
            })
            .await?;
        }

        let _gate = self.start_gate.read().await;
        self.prepare_secrets(spec, &name).await?;
        let created = match self.container_body(spec) {
            Ok(body) => self.create_and_start(body, &spec.image, &name).await,
            Err(e) => Err(e),
        };
        match created {
            Ok(container_id) => {
                tracing::info!(container = %container_id, %name, "sandbox started");
                Ok(SandboxHandle { container_id, name })
            }
            Err(err) => {
                let dir = self.secrets_dir(&spec.session_id);
                let _ = blocking(move || host::remove_secrets(&dir)).await;
                Err(err)
            }
        }
    }

    #[tracing::instrument(skip_all, fields(container = %container_id))]
    async fn stop(&self, container_id: &str) -> Result<(), SandboxError> {
        let inspected = match self.docker.inspect_container(container_id, None).await {
            Ok(inspected) => inspected,
            Err(err) if status_of(&err) == Some(404) => return Ok(()),
            Err(source) => return Err(docker_err("inspect container", container_id, source)),
        };
        let labels = inspected
            .config
            .and_then(|config| config.labels)
            .unwrap_or_default();
        if labels.get(LABEL_INSTANCE) != Some(&self.instance_id) {
            return Err(SandboxError::NotOwned {
                container: container_id.to_string(),
            });
        }
        let options = StopContainerOptionsBuilder::new()
            .t(self.stop_timeout_secs)
            .build();
        match self
            .docker
            .stop_container(container_id, Some(options))
            .await
        {
            Ok(()) => {}
            Err(err) if status_of(&err) == Some(404) => {}
            Err(source) => return Err(docker_err("stop container", container_id, source)),
        }
        self.remove_container(container_id).await?;
        if let Some(session) = labels.get(LABEL_SESSION) {
            let dir = self.secrets_dir(session);
            blocking(move || host::remove_secrets(&dir)).await?;
        }
        if let Some(slot) = labels.get(LABEL_SLOT) {
            self.release_slot(slot).await?;
        }
        tracing::info!("sandbox stopped");
        Ok(())
    }

    async fn park(&self, spec: &ParkSpec) -> Result<ParkedSandbox, SandboxError> {
        self.park_sandbox(spec).await
    }

    async fn adopt(
        &self,
        parked: &ParkedSandbox,
        spec: &SandboxSpec,
    ) -> Result<SandboxHandle, SandboxError> {
        self.adopt_sandbox(parked, spec).await
    }

    async fn list_parked(&self) -> Result<Vec<ParkedSandbox>, SandboxError> {
        self.parked_sandboxes().await
    }

    async fn list(&self) -> Result<Vec<SandboxInfo>, SandboxError> {
        let filters = HashMap::from([(
            "label".to_string(),
            vec![format!("{LABEL_INSTANCE}={}", self.instance_id)],
        )]);
        let options = ListContainersOptionsBuilder::new()
            .all(true)
            .filters(&filters)
            .build();
        let containers = self
            .docker
            .list_containers(Some(options))
            .await
            .map_err(|source| docker_err("list containers", &self.instance_id, source))?;
        let mut infos = Vec::new();
        for summary in containers {
            let labels = summary.labels.unwrap_or_default();
            // The engine filtered already; checking again costs nothing.
            if labels.get(LABEL_INSTANCE) != Some(&self.instance_id) {
                continue;
            }
            let Some(container_id) = summary.id else {
                continue;
            };
            let running = summary.state == Some(ContainerSummaryStateEnum::RUNNING);
            let (session_id, thread_id) = match labels.get(LABEL_SLOT) {
                // A pooled sandbox: parked ones are the pool's (`list_parked`); an
                // adopted one names its session in its slot's marker, and one whose
                // marker cannot be read names none, so reconcile removes it.
                Some(slot) => match self.slot_adoption(slot).await? {
                    slot::Adoption::Parked => continue,
                    slot::Adoption::Adopted { session, thread } => (session, thread),
                    slot::Adoption::Unreadable => (String::new(), String::new()),
                },
                None => (
                    labels.get(LABEL_SESSION).cloned().unwrap_or_default(),
                    labels.get(LABEL_THREAD).cloned().unwrap_or_default(),
                ),
            };
            infos.push(SandboxInfo {
                container_id,
                session_id,
                thread_id,
                running,
            });
        }
        Ok(infos)
    }

    async fn reap_orphan_secrets(&self) -> Result<usize, SandboxError> {
        let _gate = self.start_gate.write().await;
        let live: HashSet<String> = self
            .list()
            .await?
            .into_iter()
            .map(|info| sanitise_id(&info.session_id))
            .collect();
        let root = self.instance_secrets_root();
        let dirs = blocking(move || host::subdirectories(&root)).await?;
        let mut removed = 0;
        for (session_dir, path) in dirs {
            if live.contains(&session_dir) {
                continue;
            }
            blocking(move || host::remove_secrets(&path)).await?;
            removed += 1;
        }
        Ok(removed + self.reap_orphan_slots().await?)
    }
}

/// Checks secret names, and that no secret value appears in the environment or the
/// command (where `docker inspect` would show it).
pub(super) fn validate_secrets(spec: &SandboxSpec) -> Result<(), String> {
    let mut names = HashSet::new();
    for (name, value) in &spec.secrets {
        if !host::valid_secret_name(name) {
            return Err(format!(
                "secret name {name:?} must be 1-128 of [A-Za-z0-9_.-] and not start with '.'"
            ));
        }
        if !names.insert(name.as_str()) {
            return Err(format!("secret name {name:?} is given twice"));
        }
        let needle = value.expose_secret();
        if needle.is_empty() {
            continue;
        }
        let visible = spec
            .env
            .iter()
            .flat_map(|(k, v)| [k.as_bytes(), v.as_bytes()])
            .chain(spec.command.iter().flatten().map(|arg| arg.as_bytes()));
        for text in visible {
            if text.windows(needle.len()).any(|window| window == needle) {
                return Err(format!(
                    "the value of secret {name:?} appears in the environment or command"
                ));
            }
        }
    }
    Ok(())
}

pub(super) fn bind(source: &Path, target: &str, read_only: bool) -> Mount {
    Mount {
        target: Some(target.to_string()),
        source: Some(source.to_string_lossy().into_owned()),
        typ: Some(MountType::BIND),
        read_only: Some(read_only),
        ..Default::default()
    }
}

/// The HTTP status of an engine error, if it was one.
pub(super) fn status_of(err: &BollardError) -> Option<u16> {
    match err {
        BollardError::DockerResponseServerError { status_code, .. } => Some(*status_code),
        _ => None,
    }
}

pub(super) fn docker_err(action: &'static str, target: &str, source: BollardError) -> SandboxError {
    SandboxError::Docker {
        action,
        target: target.to_string(),
        source,
    }
}

/// Runs blocking filesystem work on tokio's blocking pool.
pub(super) async fn blocking<T, F>(work: F) -> Result<T, SandboxError>
where
    F: FnOnce() -> Result<T, SandboxError> + Send + 'static,
    T: Send + 'static,
{
    crate::tasks::Tasks::spawn_blocking(work)
        .await
        .map_err(|join| SandboxError::Io {
            action: "run blocking filesystem task",
            path: PathBuf::new(),
            source: std::io::Error::other(join.to_string()),
        })?
}
