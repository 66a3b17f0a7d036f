//! The Docker sessions' world: one per test (a temp git repo, a data directory, a
//! unique instance id, a secrets root on `/dev/shm`) whose settings run the real Docker
//! runtime from the sandbox image; [`DockerWorld::start`] serves it through the one
//! [`spawn_app`]. Dropping the world force-removes every container of its instance.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use git2::{Oid, Repository, Signature};
use tempfile::TempDir;
use threadgate::app::Overrides;
use threadgate::clock::Clock;
use threadgate::config::{PlainSettings, RepoSettings, SandboxSettings, SessionSettings, Settings};
use threadgate::sandbox::SandboxRuntime;
use threadgate::secrets::{MasterKey, SecretStore, SecretString};
use threadgate::store::Db;

use super::app::{TestApp, spawn_app};
use super::docker::{self, Container};

/// What a test may change about the app it spawns.
#[derive(Clone)]
pub struct AppOptions {
    pub listen: SocketAddr,
    pub max_live: usize,
    /// How long a quiet session keeps its container.
    pub idle_timeout: Duration,
    /// The directory agent definitions are read from (the repository's `agents/` when
    /// `None`).
    pub agents_dir: Option<PathBuf>,
    /// Replaces the real Docker runtime (the burst benchmark's fake).
    pub sandbox: Option<Arc<dyn SandboxRuntime>>,
    /// Size of each session's workspace filesystem (0: unlimited).
    pub workspace_bytes: u64,
    /// Free space the data disk keeps for the database.
    pub disk_reserve_bytes: u64,
    /// threadgate's clock (the wall clock when `None`); see [`super::clock::TestClock`].
    pub clock: Option<Clock>,
    /// Parked sandboxes per agent (0, the tests' default: every start is cold, so
    /// container counts stay what each test expects).
    pub pool_size: usize,
    /// How long a sandbox stays parked before it is replaced.
    pub pool_max_idle: Duration,
}

impl Default for AppOptions {
    fn default() -> Self {
        AppOptions {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            max_live: 8,
            idle_timeout: Duration::from_secs(600),
            agents_dir: None,
            sandbox: None,
            workspace_bytes: 64 << 20,
            disk_reserve_bytes: 0,
            clock: None,
            pool_size: 0,
            pool_max_idle: Duration::from_secs(1800),
        }
    }
}

/// One test's world. Dropping it force-removes every container labelled with its
/// instance id (even when the test failed) and its secrets root.
pub struct DockerWorld {
    pub root: TempDir,
    pub instance: String,
    pub secrets_root: PathBuf,
    pub signing_secret: String,
}

impl DockerWorld {
    /// A fresh repository (`main` with two files, a branch `other` and a tag `v1`), an
    /// empty data directory and a unique instance id.
    pub fn new() -> DockerWorld {
        assert!(
            docker::missing().is_none(),
            "start the test with `if support::docker::skip() {{ return; }}`"
        );
        let root = tempfile::tempdir().expect("tempdir");
        let instance = format!("e2e{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
        init_repo(&root.path().join("repo"));
        DockerWorld {
            secrets_root: PathBuf::from(format!("/dev/shm/threadgate-{instance}")),
            root,
            instance,
            signing_secret: format!("whsec_{}", uuid::Uuid::new_v4().simple()),
        }
    }

    /// The world's git repository (threadgate's `repo.path`).
    pub fn repo_path(&self) -> PathBuf {
        self.root.path().join("repo")
    }

    /// threadgate's data directory.
    pub fn data_dir(&self) -> PathBuf {
        self.root.path().join("data")
    }

    /// The world's repository, opened.
    pub fn repo(&self) -> Repository {
        Repository::open(self.repo_path()).expect("open test repo")
    }

    /// Every ref of the repository with its target (symbolic refs by name).
    pub fn refs(&self) -> Vec<(String, String)> {
        all_refs(&self.repo())
    }

    /// The settings of an app of this world with `opts`.
    pub fn settings(&self, opts: &AppOptions) -> Settings {
        let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
        let data_dir = self.data_dir();
        let defaults = Settings::default();
        Settings {
            master_key_file: data_dir.join("master.key"),
            data_dir,
            instance_id: Some(self.instance.clone()),
            listen: opts.listen,
            policy_file: crate_dir.join("policies/support.yaml"),
            agents_dir: opts
                .agents_dir
                .clone()
                .unwrap_or_else(|| crate_dir.join("agents")),
            skills_dir: crate_dir.join("skills"),
            plain: PlainSettings {
                signing_secret: Some(SecretString::from(self.signing_secret.clone())),
                ..defaults.plain
            },
            repo: RepoSettings {
                path: self.repo_path(),
                default_branch: Some("main".into()),
                remote: None,
                ..defaults.repo
            },
            sandbox: SandboxSettings {
                image: docker::image(),
                memory_bytes: 256 << 20,
                nano_cpus: 500_000_000,
                pids: 128,
                secrets_root: self.secrets_root.clone(),
                ..defaults.sandbox
            },
            sessions: SessionSettings {
                max_live: opts.max_live,
                idle_timeout: opts.idle_timeout,
                reconcile_every: Duration::from_secs(1),
                workspace_bytes: opts.workspace_bytes,
                disk_reserve_bytes: opts.disk_reserve_bytes,
                pool_size: opts.pool_size,
                pool_max_idle: opts.pool_max_idle,
                ..SessionSettings::default()
            },
            ..defaults
        }
    }

    /// Stores `value` as secret `name` granted to `agent`, in the data directory the app
    /// will open (creating its master key), before the app is built.
    pub async fn grant_secret(&self, name: &str, value: &str, agent: &str) {
        let data_dir = self.data_dir();
        std::fs::create_dir_all(&data_dir).expect("data dir");
        let key_file = data_dir.join("master.key");
        MasterKey::generate()
            .write_to(&key_file)
            .expect("write master key");
        let db = Db::open(&data_dir.join("threadgate.db")).expect("open db");
        let key = MasterKey::from_file(&key_file).expect("read master key");
        let store = SecretStore::new(db, Arc::new(key));
        store
            .set(name, SecretString::from(value.to_owned()))
            .await
            .expect("set secret");
        store.grant(name, agent).await.expect("grant secret");
    }

    /// Builds the real application for this world (real Docker unless `opts.sandbox`
    /// says otherwise) and serves it.
    pub async fn start(&self, opts: AppOptions) -> TestApp {
        let overrides = Overrides {
            sandbox: opts.sandbox.clone(),
            clock: opts.clock.clone(),
        };
        spawn_app(self.settings(&opts), overrides).await
    }

    /// Every container labelled with this world's instance id, inspected.
    pub fn containers(&self) -> Vec<Container> {
        docker::containers_of(&self.instance)
    }
}

impl Default for DockerWorld {
    fn default() -> Self {
        DockerWorld::new()
    }
}

impl Drop for DockerWorld {
    fn drop(&mut self) {
        docker::remove_instance_containers(&self.instance);
        // Parked sandboxes' slots hold mounts (a thread's worktree among them): never
        // remove through one.
        docker::unmount_under(&self.secrets_root);
        let _ = std::fs::remove_dir_all(&self.secrets_root);
        // Workspace filesystems of sessions the test left running.
        let worktrees = self.data_dir().join("worktrees");
        if let Ok(entries) = std::fs::read_dir(&worktrees) {
            for entry in entries.flatten() {
                let _ = threadgate::workspace::volume::unmount(&entry.path());
            }
        }
    }
}

// ---------------------------------------------------------------------------------
// git

fn init_repo(path: &Path) {
    let mut opts = git2::RepositoryInitOptions::new();
    opts.initial_head("main");
    let repo = Repository::init_opts(path, &opts).expect("init repo");
    std::fs::write(path.join("README.md"), "# Service\n\nThe product's code.\n").expect("write");
    std::fs::create_dir_all(path.join("src")).expect("mkdir");
    std::fs::write(path.join("src/logs.rs"), "pub fn tail() {}\n").expect("write");
    let mut index = repo.index().expect("index");
    index
        .add_all(["*"], git2::IndexAddOption::DEFAULT, None)
        .expect("add");
    index.write().expect("write index");
    let tree = repo
        .find_tree(index.write_tree().expect("tree"))
        .expect("find tree");
    let sig = Signature::now("Maintainer", "maintainer@example.com").expect("sig");
    let commit = repo
        .commit(Some("HEAD"), &sig, &sig, "initial", &tree, &[])
        .expect("commit");
    let commit = repo.find_commit(commit).expect("find commit");
    repo.branch("other", &commit, false).expect("branch other");
    repo.tag_lightweight("v1", commit.as_object(), false)
        .expect("tag");
}

/// Every ref of `repo` with its target (symbolic refs by name), sorted.
pub fn all_refs(repo: &Repository) -> Vec<(String, String)> {
    let mut refs: Vec<(String, String)> = repo
        .references()
        .expect("refs")
        .filter_map(Result::ok)
        .map(|r| {
            let name = r.name().map(str::to_owned).unwrap_or_default();
            let target = r
                .target()
                .map(|o| o.to_string())
                .or_else(|| r.symbolic_target().ok().flatten().map(str::to_owned))
                .unwrap_or_default();
            (name, target)
        })
        .collect();
    refs.sort();
    refs
}

/// The commit `branch` points at, if it exists.
pub fn branch_tip(repo: &Repository, branch: &str) -> Option<Oid> {
    repo.find_reference(&format!("refs/heads/{branch}"))
        .ok()
        .and_then(|r| r.target())
}

/// The commit the thread's branch (`threadgate/<thread>`) points at in the repository at
/// `repo` (a worktree's repository or a bare remote), if it exists.
pub fn thread_tip(repo: &Path, thread: &str) -> Option<Oid> {
    let repo = Repository::open(repo).expect("open");
    branch_tip(&repo, &format!("threadgate/{thread}"))
}

/// Path -> content of the files of `commit`'s tree in the repository at `repo`.
pub fn files_of(repo: &Path, commit: Oid) -> Vec<(String, Vec<u8>)> {
    let repo = Repository::open(repo).expect("open");
    let tree = repo
        .find_commit(commit)
        .expect("commit")
        .tree()
        .expect("tree");
    let mut files = Vec::new();
    tree.walk(git2::TreeWalkMode::PreOrder, |dir, entry| {
        if entry.kind() == Some(git2::ObjectType::Blob) {
            let blob = repo.find_blob(entry.id()).expect("blob");
            files.push((
                format!("{dir}{}", entry.name().expect("name")),
                blob.content().to_vec(),
            ));
        }
        git2::TreeWalkResult::Ok
    })
    .expect("walk");
    files
}
