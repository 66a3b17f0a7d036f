//! Docker for the tests: whether it is there, and its CLI.
//!
//! A test that needs Docker starts with `if support::docker::skip() { return; }`. Without
//! a Docker engine answering, or without the sandbox image, [`skip`] prints one line to
//! the terminal (past the test harness's output capture) naming the test, the reason and
//! how many tests this binary has skipped so far, and the test returns. With
//! `THREADGATE_REQUIRE_DOCKER=1` (set by `scripts/test.sh`, so in CI) a missing Docker
//! fails the test instead.

use std::io::Write as _;
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;
use threadgate::sandbox::LABEL_INSTANCE;

/// The image sessions run in (built by `scripts/build-sandbox-image.sh`); another with
/// `THREADGATE_SANDBOX_IMAGE`.
pub fn image() -> String {
    std::env::var("THREADGATE_SANDBOX_IMAGE").unwrap_or_else(|_| "threadgate-sandbox:latest".into())
}

static MISSING: OnceLock<Option<String>> = OnceLock::new();
static SKIPPED: AtomicUsize = AtomicUsize::new(0);

/// Why Docker tests cannot run here (`None`: they can). Asked once per process.
pub fn missing() -> Option<String> {
    MISSING
        .get_or_init(|| {
            let engine = docker_within(
                &["version", "--format", "{{.Server.Version}}"],
                Duration::from_secs(30),
            );
            match engine {
                Err(e) => return Some(e),
                Ok(out) if !out.status.success() => {
                    let err = String::from_utf8_lossy(&out.stderr);
                    let first = err.lines().next().unwrap_or("no answer").trim().to_owned();
                    return Some(format!(
                        "the Docker engine does not answer ({first}); run scripts/docker-up.sh"
                    ));
                }
                Ok(_) => {}
            }
            let image = image();
            match docker_within(&["image", "inspect", &image], Duration::from_secs(30)) {
                Err(e) => Some(e),
                Ok(out) if !out.status.success() => Some(format!(
                    "image {image} is missing; run scripts/build-sandbox-image.sh"
                )),
                Ok(_) => None,
            }
        })
        .clone()
}

/// Whether Docker is required (`THREADGATE_REQUIRE_DOCKER=1`): then nothing is skipped.
pub fn required() -> bool {
    std::env::var("THREADGATE_REQUIRE_DOCKER").is_ok_and(|v| v == "1")
}

/// `true` when this test must be skipped for want of Docker, after saying so on the
/// terminal; panics instead when Docker is [`required`].
pub fn skip() -> bool {
    let Some(reason) = missing() else {
        return false;
    };
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("a Docker test");
    assert!(
        !required(),
        "{test} needs Docker, which THREADGATE_REQUIRE_DOCKER=1 requires: {reason}"
    );
    let count = SKIPPED.fetch_add(1, Ordering::SeqCst) + 1;
    let binary = std::env::args()
        .next()
        .and_then(|a| {
            let name = std::path::Path::new(&a)
                .file_name()?
                .to_string_lossy()
                .into_owned();
            // Cargo names test binaries `NAME-HASH`.
            Some(match name.rsplit_once('-') {
                Some((binary, _hash)) => binary.to_owned(),
                None => name,
            })
        })
        .unwrap_or_default();
    // Straight to the file descriptor: the test harness captures `eprintln!`.
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED {test} ({binary}: {count} Docker test(s) skipped so far): {reason}"
    );
    true
}

/// One container as `docker inspect` shows it.
#[derive(Debug, Clone)]
pub struct Container {
    pub id: String,
    pub running: bool,
    pub inspect: Value,
}

impl Container {
    /// The value of label `name`.
    pub fn label(&self, name: &str) -> Option<String> {
        self.inspect["Config"]["Labels"][name]
            .as_str()
            .map(str::to_owned)
    }
}

/// How long one docker CLI command may take before the engine is taken for wedged.
/// The slowest the tests run (`docker rm -f` of a world's containers, an `exec` of a
/// script) take seconds; a wedged engine never answers, and without a deadline the test
/// would hang the whole suite instead of failing.
pub const CLI_DEADLINE: Duration = Duration::from_secs(120);

/// Runs `docker ARGS` and waits at most `deadline` for it: `Err` names the command and
/// says the engine did not answer (the command is killed), otherwise its output.
pub fn docker_within(args: &[&str], deadline: Duration) -> Result<Output, String> {
    let mut child = Command::new("docker")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run docker ({e}); run scripts/docker-up.sh"))?;
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Ok(None) | Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "`docker {}` did not answer within {deadline:?}: the Docker engine is \
                     wedged (restart it: pkill dockerd containerd; scripts/docker-up.sh)",
                    args.join(" ")
                ));
            }
        }
    };
    Ok(Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    })
}

/// Reads `pipe` to its end on a thread of its own (a command's output is read while
/// the command runs, so a full pipe never stalls it).
fn drain<R: std::io::Read + Send + 'static>(pipe: Option<R>) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        if let Some(mut pipe) = pipe {
            let _ = pipe.read_to_end(&mut bytes);
        }
        bytes
    })
}

/// Runs `docker ARGS`, returning (exit code, stdout, stderr); panics, naming the
/// command, when the engine does not answer within [`CLI_DEADLINE`].
pub fn docker(args: &[&str]) -> (i32, String, String) {
    let out = docker_within(args, CLI_DEADLINE).unwrap_or_else(|e| panic!("{e}"));
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs a bash script in a container as its own user.
pub fn exec(container: &str, script: &str) -> (i32, String, String) {
    docker(&["exec", container, "bash", "-c", script])
}

/// `docker inspect` of a container, as JSON.
pub fn inspect(container: &str) -> Value {
    let (code, out, err) = docker(&["inspect", container]);
    assert_eq!(code, 0, "docker inspect {container}: {err}");
    let list: Value = serde_json::from_str(&out).expect("inspect json");
    list[0].clone()
}

/// Every container labelled with `instance`, inspected.
pub fn containers_of(instance: &str) -> Vec<Container> {
    let filter = format!("label={LABEL_INSTANCE}={instance}");
    let (code, out, err) = docker(&["ps", "-aq", "--no-trunc", "--filter", &filter]);
    assert_eq!(code, 0, "docker ps: {err}");
    out.split_whitespace()
        .filter_map(|id| {
            // A container removed between `ps` and `inspect` is simply gone.
            let (code, out, _) = docker(&["inspect", id]);
            if code != 0 {
                return None;
            }
            let list: Value = serde_json::from_str(&out).ok()?;
            let inspect = list[0].clone();
            Some(Container {
                id: id.to_owned(),
                running: inspect["State"]["Running"].as_bool() == Some(true),
                inspect,
            })
        })
        .collect()
}

/// How many containers labelled with `instance` run.
pub fn running_count(instance: &str) -> usize {
    let filter = format!("label={LABEL_INSTANCE}={instance}");
    let (_, out, _) = docker(&["ps", "-q", "--filter", &filter]);
    out.split_whitespace().count()
}

/// Force-removes every container labelled with `instance` (a world's cleanup, often run
/// from `Drop`: it never panics; a wedged engine is said on the terminal and left).
pub fn remove_instance_containers(instance: &str) {
    let filter = format!("label={LABEL_INSTANCE}={instance}");
    let out = match docker_within(&["ps", "-aq", "--filter", &filter], CLI_DEADLINE) {
        Ok(out) => out,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "cleanup of {instance}: {e}");
            return;
        }
    };
    let out = String::from_utf8_lossy(&out.stdout);
    let ids: Vec<&str> = out.split_whitespace().collect();
    if !ids.is_empty() {
        let mut args = vec!["rm", "-f"];
        args.extend(ids);
        if let Err(e) = docker_within(&args, CLI_DEADLINE) {
            let _ = writeln!(std::io::stderr(), "cleanup of {instance}: {e}");
        }
    }
}

/// Detaches every mount at or below `root` (deepest first), as `umount -l` would: what
/// parked sandboxes' slots leave when a test ends before their sandboxes are stopped.
pub fn unmount_under(root: &std::path::Path) {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let root = root.to_string_lossy().into_owned();
    let mut points: Vec<String> = info
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .filter(|point| *point == root || point.starts_with(&format!("{root}/")))
        .map(str::to_owned)
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for point in points {
        let _ = Command::new("umount").arg("-l").arg(&point).status();
    }
}

/// A command that never ends on its own (`docker events` follows the engine's events)
/// is killed at its deadline and named in the error, instead of hanging the test.
#[test]
fn a_docker_command_past_its_deadline_is_killed_and_named() {
    if skip() {
        return;
    }
    let err = docker_within(&["events"], Duration::from_millis(500))
        .expect_err("docker events does not end by itself");
    assert!(
        err.contains("`docker events` did not answer within"),
        "{err}"
    );
    let done = docker_within(&["version"], CLI_DEADLINE).expect("docker version answers");
    assert!(done.status.success(), "{done:?}");
}
