//! Parked sandboxes on Docker: [`DockerRuntime`]'s `park`, `adopt` and `list_parked`.
//!
//! A parked container is created with its slot's three mount points (see `slot`)
//! bound at `/workspace`, `/run/threadgate` and `/run/secrets` with `rslave`
//! propagation, its agent's command and environment, and the labels instance, pool
//! and slot only. Adoption writes the slot's marker first, then mounts the thread's
//! worktree, secrets and (last, so the runner finds everything in place when it sees
//! its socket) socket directory over the mount points; the kernel carries each mount
//! into the running container.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

use bollard::models::{
    ContainerSummaryStateEnum, Mount, MountBindOptions, MountBindOptionsPropagationEnum,
};
use bollard::query_parameters::ListContainersOptionsBuilder;

use super::docker::{BodyParts, DockerRuntime, bind, blocking, docker_err, status_of};
use super::host;
use super::slot::{self, Adoption};
use super::{
    CONTAINER_SECRETS_DIR, CONTAINER_SOCKET_DIR, CONTAINER_WORKSPACE, LABEL_INSTANCE, LABEL_POOL,
    LABEL_SLOT, ParkSpec, ParkedSandbox, SandboxError, SandboxHandle, SandboxRuntime as _,
    SandboxSpec, container_name, sanitise_id,
};

impl DockerRuntime {
    /// The directory of a slot (its id sanitised: it comes from a label).
    fn slot_path(&self, slot: &str) -> PathBuf {
        slot::slot_dir(&self.pool_root, &sanitise_id(slot))
    }

    /// What the marker of `slot` says.
    pub(super) async fn slot_adoption(&self, slot: &str) -> Result<Adoption, SandboxError> {
        let dir = self.slot_path(slot);
        blocking(move || Ok(slot::adoption(&dir))).await
    }

    fn require_root(&self) -> Result<(), SandboxError> {
        if self.chown_mounts {
            return Ok(());
        }
        Err(SandboxError::PoolUnsupported {
            reason: "threadgate is not root, so it cannot mount a thread's directories into \
                     a running container"
                .into(),
        })
    }

    pub(super) async fn park_sandbox(
        &self,
        spec: &ParkSpec,
    ) -> Result<ParkedSandbox, SandboxError> {
        self.require_root()?;
        let who = format!("pool {}", spec.pool);
        let invalid = |reason: String| SandboxError::InvalidSpec {
            session: who.clone(),
            reason,
        };
        if spec.pool.is_empty() || sanitise_id(&spec.pool) != spec.pool || spec.image.is_empty() {
            return Err(invalid(
                "the pool name must be 1 or more of [A-Za-z0-9_-] and the image not empty".into(),
            ));
        }
        if let Some((key, _)) = spec
            .env
            .iter()
            .find(|(k, _)| k.is_empty() || k.contains(['=', '\0']))
        {
            return Err(invalid(format!(
                "environment variable name {key:?} is invalid"
            )));
        }
        let simple = uuid::Uuid::new_v4().simple().to_string();
        let slot = simple.get(..16).unwrap_or(&simple).to_owned();
        let name = container_name(&self.instance_id, &format!("pool-{slot}"));
        let dir = self.slot_path(&slot);

        let _gate = self.start_gate.read().await;
        let made = dir.clone();
        blocking(move || slot::create(&made)).await?;
        let labels = HashMap::from([
            (LABEL_INSTANCE.to_string(), self.instance_id.clone()),
            (LABEL_POOL.to_string(), spec.pool.clone()),
            (LABEL_SLOT.to_string(), slot.clone()),
        ]);
        let mounts = vec![
            slave_bind(&dir, slot::Mount::Workspace, CONTAINER_WORKSPACE, false),
            slave_bind(&dir, slot::Mount::Socket, CONTAINER_SOCKET_DIR, true),
            slave_bind(&dir, slot::Mount::Secrets, CONTAINER_SECRETS_DIR, true),
        ];
        let body = self.body(BodyParts {
            who: &who,
            image: &spec.image,
            limits: spec.limits,
            command: spec.command.clone(),
            env: &spec.env,
            labels,
            mounts,
        });
        let created = match body {
            Ok(body) => self.create_and_start(body, &spec.image, &name).await,
            Err(e) => Err(e),
        };
        match created {
            Ok(container_id) => {
                tracing::info!(container = %container_id, pool = %spec.pool, %slot, "sandbox parked");
                Ok(ParkedSandbox {
                    container_id,
                    name,
                    pool: spec.pool.clone(),
                    slot,
                    image: spec.image.clone(),
                    created_at_ms: chrono::Utc::now().timestamp_millis(),
                    clean: true,
                })
            }
            Err(e) => {
                let _ = blocking(move || slot::release(&dir)).await;
                Err(e)
            }
        }
    }

    pub(super) async fn adopt_sandbox(
        &self,
        parked: &ParkedSandbox,
        spec: &SandboxSpec,
    ) -> Result<SandboxHandle, SandboxError> {
        self.require_root()?;
        self.validate(spec)?;
        let refuse = |reason: &str| SandboxError::NotAdoptable {
            container: parked.container_id.clone(),
            reason: reason.to_owned(),
        };
        let _gate = self.start_gate.read().await;
        let inspected = match self
            .docker
            .inspect_container(&parked.container_id, None)
            .await
        {
            Ok(inspected) => inspected,
            Err(err) if status_of(&err) == Some(404) => return Err(refuse("it is gone")),
            Err(source) => {
                return Err(docker_err(
                    "inspect container",
                    &parked.container_id,
                    source,
                ));
            }
        };
        let labels = inspected
            .config
            .and_then(|config| config.labels)
            .unwrap_or_default();
        if labels.get(LABEL_INSTANCE) != Some(&self.instance_id)
            || labels.get(LABEL_SLOT) != Some(&parked.slot)
        {
            // Not ours, or not that slot's: left alone.
            return Err(refuse("it is not this instance's parked sandbox"));
        }
        let dir = self.slot_path(&parked.slot);
        let (marked_dir, session, thread) = (
            dir.clone(),
            spec.session_id.to_string(),
            spec.thread_id.to_string(),
        );
        // INVARIANT: the adoption is recorded before anything of the thread enters the
        // slot; a slot with a marker is never parked or adopted again.
        let marked = blocking(move || slot::mark_adopted(&marked_dir, &session, &thread)).await;
        let running = inspected.state.and_then(|s| s.running) == Some(true);
        match marked {
            Ok(true) if running => {}
            Ok(true) => {
                let _ = self.stop(&parked.container_id).await;
                return Err(refuse("it is not running"));
            }
            // Adopted before: it stays its first session's (reconciliation removes it if
            // that session does not name it) and is refused here.
            Ok(false) => return Err(refuse("it was adopted before")),
            Err(e) => {
                let _ = self.stop(&parked.container_id).await;
                return Err(e);
            }
        }
        match self.bind_thread(spec, &dir).await {
            Ok(()) => {
                tracing::info!(container = %parked.container_id, session = %spec.session_id, "parked sandbox adopted");
                Ok(SandboxHandle {
                    container_id: parked.container_id.clone(),
                    name: parked.name.clone(),
                })
            }
            Err(e) => {
                // Removes the container, the slot's mounts and the secrets.
                let _ = self.stop(&parked.container_id).await;
                Err(e)
            }
        }
    }

    /// Writes the session's secrets and mounts its workspace, secrets and socket over
    /// the slot's mount points (the socket last).
    async fn bind_thread(
        &self,
        spec: &SandboxSpec,
        dir: &std::path::Path,
    ) -> Result<(), SandboxError> {
        let owner = self.container_owner;
        let workspace = spec.workspace_dir.clone();
        let socket_dir = spec.socket_dir.clone();
        blocking(move || {
            host::chown_tree(&workspace, owner)?;
            host::chown_tree(&socket_dir, owner)
        })
        .await?;
        let cold_name = container_name(&self.instance_id, &spec.session_id);
        self.prepare_secrets(spec, &cold_name).await?;
        let secrets = self.secrets_dir(&spec.session_id);
        let workspace = spec.workspace_dir.clone();
        let socket_dir = spec.socket_dir.clone();
        let dir = dir.to_path_buf();
        blocking(move || {
            slot::bind(&dir, slot::Mount::Workspace, &workspace, false)?;
            slot::bind(&dir, slot::Mount::Secrets, &secrets, true)?;
            slot::bind(&dir, slot::Mount::Socket, &socket_dir, true)
        })
        .await
    }

    pub(super) async fn parked_sandboxes(&self) -> Result<Vec<ParkedSandbox>, SandboxError> {
        let mut parked = Vec::new();
        for summary in self.pooled_containers().await? {
            let labels = summary.labels.clone().unwrap_or_default();
            let (Some(id), Some(pool), Some(slot_id)) = (
                summary.id.clone(),
                labels.get(LABEL_POOL),
                labels.get(LABEL_SLOT),
            ) else {
                continue;
            };
            let dir = self.slot_path(slot_id);
            let (adoption, clean) =
                blocking(move || Ok((slot::adoption(&dir), slot::is_clean(&dir)))).await?;
            if adoption != Adoption::Parked {
                continue;
            }
            let running = summary.state == Some(ContainerSummaryStateEnum::RUNNING);
            parked.push(ParkedSandbox {
                container_id: id,
                name: summary
                    .names
                    .as_ref()
                    .and_then(|n| n.first())
                    .map(|n| n.trim_start_matches('/').to_owned())
                    .unwrap_or_default(),
                pool: pool.clone(),
                slot: slot_id.clone(),
                image: summary.image.clone().unwrap_or_default(),
                created_at_ms: summary.created.unwrap_or(0).saturating_mul(1000),
                clean: clean && running,
            });
        }
        Ok(parked)
    }

    /// Every container of this instance with a slot, parked or adopted.
    async fn pooled_containers(
        &self,
    ) -> Result<Vec<bollard::models::ContainerSummary>, SandboxError> {
        let filters = HashMap::from([(
            "label".to_string(),
            vec![
                format!("{LABEL_INSTANCE}={}", self.instance_id),
                LABEL_SLOT.to_string(),
            ],
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
        Ok(containers
            .into_iter()
            .filter(|c| {
                c.labels
                    .as_ref()
                    .and_then(|l| l.get(LABEL_INSTANCE))
                    .is_some_and(|i| *i == self.instance_id)
            })
            .collect())
    }

    /// Unmounts and removes a slot, and the secrets of the session that adopted it.
    pub(super) async fn release_slot(&self, slot_id: &str) -> Result<(), SandboxError> {
        let dir = self.slot_path(slot_id);
        let secrets_of = |session: &str| self.secrets_dir(session);
        let secrets = match self.slot_adoption(slot_id).await? {
            Adoption::Adopted { session, .. } => Some(secrets_of(&session)),
            Adoption::Parked | Adoption::Unreadable => None,
        };
        blocking(move || {
            slot::release(&dir)?;
            match secrets {
                Some(secrets) => host::remove_secrets(&secrets),
                None => Ok(()),
            }
        })
        .await
    }

    /// Releases the slot directories no container has (a crash between making a slot
    /// and creating its container, or a container removed behind threadgate's back).
    /// Called with the start gate held exclusively.
    pub(super) async fn reap_orphan_slots(&self) -> Result<usize, SandboxError> {
        let live: HashSet<String> = self
            .pooled_containers()
            .await?
            .into_iter()
            .filter_map(|c| c.labels?.get(LABEL_SLOT).map(|s| sanitise_id(s)))
            .collect();
        let root = self.pool_root.clone();
        let dirs = blocking(move || slot::slots(&root)).await?;
        let mut removed = 0;
        for (slot_id, _) in dirs {
            if live.contains(&slot_id) {
                continue;
            }
            self.release_slot(&slot_id).await?;
            removed += 1;
        }
        Ok(removed)
    }
}

/// A bind of one of a slot's mount points with `rslave` propagation: what is mounted
/// over it on the host later appears in the container.
fn slave_bind(dir: &std::path::Path, mount: slot::Mount, target: &str, read_only: bool) -> Mount {
    Mount {
        bind_options: Some(MountBindOptions {
            propagation: Some(MountBindOptionsPropagationEnum::RSLAVE),
            ..Default::default()
        }),
        ..bind(&slot::mount_point(dir, mount), target, read_only)
    }
}
