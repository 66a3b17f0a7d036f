//! Time from `DockerRuntime::start` to a running container, against a bare start of the
//! same image measured in the same run.
//!
//! Three benchmarks, 20 samples of one start each:
//! - `threadgate_start`: `SandboxRuntime::start` with a secret and the full lockdown
//!   (returns once the container runs); the stop that follows is not timed.
//! - `bare_create_start`: bollard create + start of the image with default settings
//!   (what `docker run -d IMAGE` does), removal not timed; and the same with
//!   `--network none` only (`bare_create_start_network_none`), which isolates the cost
//!   of threadgate's own settings from the bridge network a bare run sets up.
//! - `docker_run_rm_true`: the CLI's `docker run --rm IMAGE true`, end to end.
//!
//! Needs a Docker engine and the image (`scripts/docker-up.sh`,
//! `scripts/build-sandbox-image.sh`). Run with `cargo bench --bench sandbox_start`;
//! the medians are printed at the end. Criterion warns that 20 samples do not fit in
//! its 1 s target: that is on purpose, so that each sample is exactly one start.

#![expect(
    clippy::indexing_slicing,
    reason = "test code: an index out of range is a failed test"
)]
#![expect(
    clippy::expect_used,
    reason = "test code: an unwrap or expect that fails is a failed test, with its message"
)]

#[path = "../tests/it/support/docker.rs"]
pub mod docker;

use std::cell::RefCell;
use std::path::PathBuf;
use std::process::Command;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::models::{ContainerCreateBody, HostConfig};
use bollard::query_parameters::RemoveContainerOptionsBuilder;
use criterion::{Criterion, SamplingMode, criterion_group, criterion_main};
use threadgate::sandbox::{DockerRuntime, Limits, SandboxRuntime, SandboxSpec};
use threadgate::secrets::secret_bytes;

const SAMPLES: usize = 20;

fn image() -> String {
    std::env::var("THREADGATE_SANDBOX_IMAGE")
        .unwrap_or_else(|_| "threadgate-sandbox:latest".to_string())
}

type Recorded = Rc<RefCell<Vec<Duration>>>;

fn median(recorded: &Recorded) -> Duration {
    let all = recorded.borrow();
    // The first calls are criterion's warm-up; the last SAMPLES are the measurement.
    let mut last: Vec<Duration> = all[all.len().saturating_sub(SAMPLES)..].to_vec();
    last.sort();
    last[last.len() / 2]
}

fn sandbox_start(c: &mut Criterion) {
    if docker::skip() {
        return;
    }
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    let docker = rt.block_on(async {
        let docker = Docker::connect_with_defaults()
            .expect("docker client")
            .negotiate_version()
            .await
            .expect("docker engine does not answer: run scripts/docker-up.sh");
        if docker.inspect_image(&image()).await.is_err() {
            panic!(
                "image {:?} missing: run scripts/build-sandbox-image.sh",
                image()
            );
        }
        docker
    });
    let instance = format!("bench{}", uuid::Uuid::new_v4().simple());
    let secrets_root = PathBuf::from("/dev/shm/threadgate-bench");
    let runtime = rt
        .block_on(DockerRuntime::connect(&instance, secrets_root.clone()))
        .expect("connect runtime")
        .with_stop_timeout_secs(2);
    let workspace = tempfile::tempdir().expect("workspace");
    let socket_dir = tempfile::tempdir().expect("socket dir");

    let mut group = c.benchmark_group("sandbox_start");
    group
        .sample_size(SAMPLES)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_millis(1))
        .measurement_time(Duration::from_secs(1));

    let ours: Recorded = Rc::default();
    let mut session = 0u32;
    group.bench_function("threadgate_start", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                session += 1;
                let spec = SandboxSpec {
                    session_id: threadgate::ids::SessionId::parse(format!("s{session}"))
                        .expect("id"),
                    thread_id: threadgate::ids::ThreadId::parse(format!("th{session}"))
                        .expect("id"),
                    image: image(),
                    workspace_dir: workspace.path().to_path_buf(),
                    socket_dir: socket_dir.path().to_path_buf(),
                    secrets: vec![("API_TOKEN".into(), secret_bytes("bench-secret"))],
                    limits: Limits::default(),
                    command: None,
                    env: vec![],
                };
                let started = Instant::now();
                let handle = rt.block_on(runtime.start(&spec)).expect("start");
                let took = started.elapsed();
                rt.block_on(runtime.stop(&handle.container_id))
                    .expect("stop");
                ours.borrow_mut().push(took);
                total += took;
            }
            total
        })
    });

    let bare: Recorded = Rc::default();
    let bare_none: Recorded = Rc::default();
    for (name, network, recorded) in [
        ("bare_create_start", None, &bare),
        ("bare_create_start_network_none", Some("none"), &bare_none),
    ] {
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let body = ContainerCreateBody {
                        image: Some(image()),
                        host_config: Some(HostConfig {
                            network_mode: network.map(str::to_string),
                            ..Default::default()
                        }),
                        ..Default::default()
                    };
                    let started = Instant::now();
                    let id = rt.block_on(async {
                        let created = docker.create_container(None, body).await.expect("create");
                        docker
                            .start_container(&created.id, None)
                            .await
                            .expect("start");
                        created.id
                    });
                    let took = started.elapsed();
                    let force = RemoveContainerOptionsBuilder::new().force(true).build();
                    rt.block_on(docker.remove_container(&id, Some(force)))
                        .expect("remove");
                    recorded.borrow_mut().push(took);
                    total += took;
                }
                total
            })
        });
    }

    let cli: Recorded = Rc::default();
    group.bench_function("docker_run_rm_true", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let started = Instant::now();
                let status = Command::new("docker")
                    .args(["run", "--rm", &image(), "true"])
                    .status()
                    .expect("docker cli");
                let took = started.elapsed();
                assert!(status.success(), "docker run failed");
                cli.borrow_mut().push(took);
                total += took;
            }
            total
        })
    });
    group.finish();

    let ms = |d: Duration| format!("{:8.1} ms", d.as_secs_f64() * 1000.0);
    let ours = median(&ours);
    let bare = median(&bare);
    let bare_none = median(&bare_none);
    let cli = median(&cli);
    println!("\nmedian over {SAMPLES} starts, same run:");
    println!("  threadgate start() to running : {}", ms(ours));
    println!("  bare create+start to running  : {}", ms(bare));
    println!("  same, --network none          : {}", ms(bare_none));
    println!("  docker run --rm IMAGE true    : {}", ms(cli));
    println!(
        "  start() vs bare create+start  : {:+.1}%",
        (ours.as_secs_f64() / bare.as_secs_f64() - 1.0) * 100.0
    );
    println!(
        "  start() vs bare, network none : {:+.1}%",
        (ours.as_secs_f64() / bare_none.as_secs_f64() - 1.0) * 100.0
    );
    println!(
        "  start() vs docker run --rm    : {:+.1}%",
        (ours.as_secs_f64() / cli.as_secs_f64() - 1.0) * 100.0
    );
    let _ = std::fs::remove_dir_all(secrets_root.join(&instance));
}

criterion_group!(benches, sandbox_start);
criterion_main!(benches);
