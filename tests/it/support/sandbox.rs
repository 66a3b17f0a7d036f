//! Helpers for the real-Docker sandbox tests: a per-test environment with its own
//! random instance id and directories, `docker exec` through bollard, and the host's
//! own addresses.

use std::collections::{BTreeSet, HashMap};
use std::net::Ipv4Addr;
use std::path::PathBuf;

use bollard::Docker;
use bollard::exec::{CreateExecOptions, StartExecResults};
use bollard::query_parameters::{ListContainersOptionsBuilder, RemoveContainerOptionsBuilder};
use futures::StreamExt;
use tempfile::TempDir;
use threadgate::sandbox::{DockerRuntime, LABEL_INSTANCE, Limits, SandboxSpec};
use threadgate::secrets::secret_bytes;

pub use super::docker::image;

/// Where the tests put secrets directories (a tmpfs).
pub fn secrets_root() -> PathBuf {
    PathBuf::from("/dev/shm/threadgate-tests")
}

/// A bollard client with the API version negotiated.
pub async fn docker() -> Docker {
    Docker::connect_with_defaults()
        .expect("docker client: is DOCKER_HOST valid? run scripts/docker-up.sh")
        .negotiate_version()
        .await
        .expect("docker engine does not answer: run scripts/docker-up.sh")
}

/// Fails the test with a clear message when the sandbox image has not been built.
pub async fn require_image(docker: &Docker) {
    let image = image();
    if docker.inspect_image(&image).await.is_err() {
        panic!(
            "sandbox image {image:?} is missing: run scripts/build-sandbox-image.sh \
             (after scripts/docker-up.sh) before these tests"
        );
    }
}

/// One test's world: a runtime with a fresh instance id, a workspace and a socket dir.
/// Dropping it force-removes every container of the instance and its secrets.
pub struct TestEnv {
    pub docker: Docker,
    pub runtime: DockerRuntime,
    pub instance: String,
    pub workspace: TempDir,
    pub socket_dir: TempDir,
}

impl TestEnv {
    pub async fn new() -> TestEnv {
        let docker = docker().await;
        require_image(&docker).await;
        let instance = format!("t{}", uuid::Uuid::new_v4().simple());
        let runtime = DockerRuntime::connect(&instance, secrets_root())
            .await
            .expect("connect runtime")
            .with_stop_timeout_secs(2);
        TestEnv {
            docker,
            runtime,
            instance,
            workspace: tempfile::tempdir().expect("workspace dir"),
            socket_dir: tempfile::tempdir().expect("socket dir"),
        }
    }

    /// A spec for `session` with one secret, small limits and this env's directories.
    pub fn spec(&self, session: &str, secret: &str) -> SandboxSpec {
        SandboxSpec {
            session_id: threadgate::ids::SessionId::parse(session).expect("session id"),
            thread_id: threadgate::ids::ThreadId::parse(format!("th_{session}"))
                .expect("thread id"),
            image: image(),
            workspace_dir: self.workspace.path().to_path_buf(),
            socket_dir: self.socket_dir.path().to_path_buf(),
            secrets: vec![("API_TOKEN".to_string(), secret_bytes(secret))],
            limits: Limits {
                memory_bytes: 256 << 20,
                nano_cpus: 500_000_000,
                pids: 64,
            },
            command: None,
            env: vec![("THREADGATE_MODE".to_string(), "test".to_string())],
        }
    }
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        // A safety net for failed tests; passing tests stop their containers themselves.
        let instance = self.instance.clone();
        let docker = self.docker.clone();
        let cleanup = async move {
            let filters = HashMap::from([(
                "label".to_string(),
                vec![format!("{LABEL_INSTANCE}={instance}")],
            )]);
            let options = ListContainersOptionsBuilder::new()
                .all(true)
                .filters(&filters)
                .build();
            for summary in docker
                .list_containers(Some(options))
                .await
                .unwrap_or_default()
            {
                if let Some(id) = summary.id {
                    let force = RemoveContainerOptionsBuilder::new().force(true).build();
                    let _ = docker.remove_container(&id, Some(force)).await;
                }
            }
        };
        // Drop may run inside a tokio runtime; do the cleanup on a thread of its own.
        let _ = std::thread::spawn(move || {
            if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                rt.block_on(cleanup);
            }
        })
        .join();
        super::docker::unmount_under(&secrets_root().join(format!("{}.pool", self.instance)));
        let _ = std::fs::remove_dir_all(secrets_root().join(format!("{}.pool", self.instance)));
        let secrets = secrets_root().join(&self.instance);
        let _ = std::process::Command::new("chmod")
            .args(["-R", "u+rwx"])
            .arg(&secrets)
            .status();
        let _ = std::fs::remove_dir_all(secrets);
    }
}

/// What a command run with `docker exec` left.
#[derive(Debug)]
pub struct ExecOutput {
    pub code: i64,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `cmd` in the container (as the container's user) and waits for it.
pub async fn exec(docker: &Docker, container: &str, cmd: &[&str]) -> ExecOutput {
    let options = CreateExecOptions {
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        cmd: Some(cmd.to_vec()),
        ..Default::default()
    };
    let created = docker
        .create_exec(container, options)
        .await
        .expect("create exec");
    let mut stdout = Vec::new();
    let mut stderr = Vec::new();
    match docker
        .start_exec(&created.id, None)
        .await
        .expect("start exec")
    {
        StartExecResults::Attached { mut output, .. } => {
            while let Some(chunk) = output.next().await {
                match chunk.expect("exec output") {
                    bollard::container::LogOutput::StdErr { message } => {
                        stderr.extend_from_slice(&message)
                    }
                    other => stdout.extend_from_slice(&other.into_bytes()),
                }
            }
        }
        StartExecResults::Detached => panic!("exec detached unexpectedly"),
    }
    let inspected = docker
        .inspect_exec(&created.id)
        .await
        .expect("inspect exec");
    ExecOutput {
        code: inspected.exit_code.expect("exec exit code"),
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
    }
}

/// Runs a bash snippet in the container.
pub async fn sh(docker: &Docker, container: &str, script: &str) -> ExecOutput {
    exec(docker, container, &["bash", "-c", script]).await
}

/// Every IPv4 address of the host (from `/proc/net/fib_trie`'s local entries) plus
/// the Docker bridge gateway, loopback included.
pub async fn host_ipv4_addresses(docker: &Docker) -> BTreeSet<Ipv4Addr> {
    let mut found = BTreeSet::from([Ipv4Addr::LOCALHOST, Ipv4Addr::new(172, 17, 0, 1)]);
    let trie = std::fs::read_to_string("/proc/net/fib_trie").unwrap_or_default();
    let lines: Vec<&str> = trie.lines().collect();
    for pair in lines.windows(2) {
        let address = pair[0].trim().trim_start_matches("|-- ");
        if pair[1].contains("/32 host LOCAL")
            && let Ok(ip) = address.parse()
        {
            found.insert(ip);
        }
    }
    if let Ok(bridge) = docker.inspect_network("bridge", None).await {
        for config in bridge.ipam.and_then(|ipam| ipam.config).unwrap_or_default() {
            if let Some(ip) = config.gateway.and_then(|g| g.parse().ok()) {
                found.insert(ip);
            }
        }
    }
    found
}
