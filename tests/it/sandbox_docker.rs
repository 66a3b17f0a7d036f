//! The Docker sandbox runtime against a real engine and the real image built by
//! `scripts/build-sandbox-image.sh`. Each test has its own random instance id, so
//! tests running in parallel (and other threadgate instances) never see each other's
//! containers; each stops what it started.

use crate::support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bollard::query_parameters::RemoveContainerOptionsBuilder;
use support::sandbox::{TestEnv, exec, host_ipv4_addresses, image, sh};
use threadgate::sandbox::{SandboxError, SandboxRuntime};
use threadgate::secrets::secret_bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixListener;

const SECRET: &str = "sk_test_9f8e7d6c5b4a-not-for-inspect";

#[tokio::test]
async fn container_is_locked_down_and_the_secret_is_only_a_file() {
    if support::docker::skip() {
        return;
    }
    let env = TestEnv::new().await;
    let handle = env
        .runtime
        .start(&env.spec("lockdown", SECRET))
        .await
        .unwrap();
    let id = handle.container_id.as_str();

    // The secret is readable inside...
    let cat = exec(&env.docker, id, &["cat", "/run/secrets/API_TOKEN"]).await;
    assert_eq!((cat.code, cat.stdout.as_str()), (0, SECRET), "{cat:?}");
    // ...read-only, and nowhere in what `docker inspect` shows.
    let write = sh(&env.docker, id, "echo x > /run/secrets/API_TOKEN").await;
    assert_ne!(write.code, 0);
    let inspected = env.docker.inspect_container(id, None).await.unwrap();
    let json = serde_json::to_string(&inspected).unwrap();
    assert!(!json.contains(SECRET), "secret value in docker inspect");
    let environment = exec(&env.docker, id, &["env"]).await.stdout;
    assert!(!environment.contains(SECRET) && environment.contains("THREADGATE_MODE=test"));

    // The settings the engine actually applied.
    let host = inspected.host_config.unwrap();
    assert_eq!(host.network_mode.as_deref(), Some("none"));
    assert_eq!(host.readonly_rootfs, Some(true));
    assert_eq!(host.cap_drop, Some(vec!["ALL".to_string()]));
    assert_eq!(
        host.security_opt,
        Some(vec!["no-new-privileges".to_string()])
    );
    assert_eq!(
        (host.memory, host.nano_cpus, host.pids_limit),
        (Some(256 << 20), Some(500_000_000), Some(64))
    );
    let labels = inspected.config.unwrap().labels.unwrap();
    assert_eq!(labels["threadgate.instance"], env.instance);
    assert_eq!(labels["threadgate.session"], "lockdown");
    assert_eq!(labels["threadgate.thread"], "th_lockdown");
    assert_eq!(handle.name, format!("threadgate-{}-lockdown", env.instance));

    // Not root, no way to gain privileges.
    let (uid, _) = env.runtime.container_user();
    let id_u = exec(&env.docker, id, &["id", "-u"]).await;
    assert_eq!(id_u.stdout.trim(), uid.to_string());
    assert_ne!(id_u.stdout.trim(), "0");
    if uid == 10001 {
        assert_eq!(
            exec(&env.docker, id, &["whoami"]).await.stdout.trim(),
            "agent"
        );
    }
    let status = exec(
        &env.docker,
        id,
        &["grep", "-E", "^(CapEff|NoNewPrivs)", "/proc/self/status"],
    )
    .await;
    assert!(
        status.stdout.contains("CapEff:\t0000000000000000"),
        "{status:?}"
    );
    assert!(status.stdout.contains("NoNewPrivs:\t1"), "{status:?}");

    // Read-only root (the kernel says so, not mere permissions: /home/agent belongs to
    // the agent); writable /workspace (visible on the host) and /tmp.
    for target in [
        "/etc/threadgate-probe",
        "/home/agent/probe",
        "/usr/local/bin/probe",
    ] {
        let tried = sh(&env.docker, id, &format!("echo x > {target}")).await;
        assert_ne!(tried.code, 0, "{target}");
        assert!(
            tried.stderr.contains("Read-only file system"),
            "{target}: {tried:?}"
        );
    }
    let wrote = sh(
        &env.docker,
        id,
        "echo hello > /workspace/note.txt && echo y > /tmp/t",
    )
    .await;
    assert_eq!(wrote.code, 0, "{wrote:?}");
    let on_host = env.workspace.path().join("note.txt");
    assert_eq!(std::fs::read_to_string(&on_host).unwrap(), "hello\n");
    assert_eq!(std::fs::metadata(&on_host).unwrap().uid(), uid);

    env.runtime.stop(id).await.unwrap();
}

#[tokio::test]
async fn nothing_outside_the_container_is_reachable() {
    if support::docker::skip() {
        return;
    }
    let env = TestEnv::new().await;
    let listener = TcpListener::bind("0.0.0.0:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = accepted.clone();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            counter.fetch_add(1, Ordering::SeqCst);
            let _ = stream.write_all(b"hi\n");
        }
    });
    let probe = |ip: &str| format!("timeout 3 bash -c 'exec 3<>/dev/tcp/{ip}/{port}'");

    // The probe works: from the host it reaches the listener.
    let on_host = std::process::Command::new("bash")
        .args(["-c", &probe("127.0.0.1")])
        .status()
        .unwrap();
    assert!(
        on_host.success(),
        "probe cannot reach the listener even from the host"
    );
    let mut reply = String::new();
    std::net::TcpStream::connect(SocketAddr::from(([127, 0, 0, 1], port)))
        .unwrap()
        .read_to_string(&mut reply)
        .unwrap();
    assert_eq!(reply, "hi\n");
    let baseline = accepted.load(Ordering::SeqCst);
    assert_eq!(baseline, 2);

    let handle = env.runtime.start(&env.spec("nonet", SECRET)).await.unwrap();
    let id = handle.container_id.as_str();
    let addresses = host_ipv4_addresses(&env.docker).await;
    assert!(addresses.len() >= 3, "{addresses:?}");
    for ip in &addresses {
        let tried = sh(&env.docker, id, &probe(&ip.to_string())).await;
        assert_ne!(tried.code, 0, "reached {ip}:{port} from inside: {tried:?}");
    }
    // An address outside the machine, by number (there is no DNS either).
    assert_ne!(sh(&env.docker, id, &probe("192.0.2.123")).await.code, 0);
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        baseline,
        "the listener saw a connection"
    );

    // Only the loopback interface exists.
    let interfaces = exec(&env.docker, id, &["ls", "/sys/class/net"]).await;
    assert_eq!(
        interfaces.stdout.split_whitespace().collect::<Vec<_>>(),
        ["lo"]
    );
    let routes = exec(&env.docker, id, &["cat", "/proc/net/route"]).await;
    assert_eq!(routes.stdout.lines().count(), 1, "routes: {routes:?}");

    env.runtime.stop(id).await.unwrap();
}

#[tokio::test]
async fn the_session_socket_is_reachable_from_inside() {
    if support::docker::skip() {
        return;
    }
    let env = TestEnv::new().await;
    let socket = env.socket_dir.path().join("api.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let server = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut request = vec![0u8; 4096];
        let n = stream.read(&mut request).await.unwrap();
        let request = String::from_utf8_lossy(&request[..n]).into_owned();
        let body = "{\"events\":[]}";
        let response = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(response.as_bytes()).await.unwrap();
        request
    });

    let handle = env
        .runtime
        .start(&env.spec("socket", SECRET))
        .await
        .unwrap();
    let id = handle.container_id.as_str();
    let curl = exec(
        &env.docker,
        id,
        &[
            "curl",
            "-sS",
            "--max-time",
            "5",
            "--unix-socket",
            "/run/threadgate/api.sock",
            "http://sandbox/v1/events?after=0",
        ],
    )
    .await;
    assert_eq!(
        (curl.code, curl.stdout.as_str()),
        (0, "{\"events\":[]}"),
        "{curl:?}"
    );
    let request = tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .unwrap()
        .unwrap();
    assert!(
        request.starts_with("GET /v1/events?after=0 HTTP/1.1"),
        "{request}"
    );

    // The socket directory is read-only inside: the agent cannot replace the socket.
    assert_ne!(
        sh(&env.docker, id, "rm -f /run/threadgate/api.sock")
            .await
            .code,
        0
    );
    assert!(socket.exists());

    env.runtime.stop(id).await.unwrap();
}

#[tokio::test]
async fn list_is_per_instance_and_stop_is_complete_and_idempotent() {
    if support::docker::skip() {
        return;
    }
    let ours = TestEnv::new().await;
    let theirs = TestEnv::new().await;
    let a = ours.runtime.start(&ours.spec("s-a", SECRET)).await.unwrap();
    let b = theirs
        .runtime
        .start(&theirs.spec("s-b", SECRET))
        .await
        .unwrap();

    let listed = ours.runtime.list().await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].container_id, a.container_id);
    assert_eq!(
        (listed[0].session_id.as_str(), listed[0].thread_id.as_str()),
        ("s-a", "th_s-a")
    );
    assert!(listed[0].running);

    // Another instance's container is not ours to stop.
    let refused = ours.runtime.stop(&b.container_id).await.unwrap_err();
    assert!(
        matches!(refused, SandboxError::NotOwned { .. }),
        "{refused}"
    );
    assert!(
        theirs
            .docker
            .inspect_container(&b.container_id, None)
            .await
            .is_ok()
    );

    let secrets_dir = ours.runtime.secrets_dir("s-a");
    assert!(secrets_dir.join("API_TOKEN").exists());
    ours.runtime.stop(&a.container_id).await.unwrap();
    assert!(
        ours.docker
            .inspect_container(&a.container_id, None)
            .await
            .is_err()
    );
    assert!(!secrets_dir.exists(), "secrets dir left after stop");
    assert!(ours.runtime.list().await.unwrap().is_empty());
    ours.runtime.stop(&a.container_id).await.unwrap();

    // Stopping by name works too.
    theirs.runtime.stop(&b.name).await.unwrap();
    assert!(theirs.runtime.list().await.unwrap().is_empty());
}

#[tokio::test]
async fn failed_or_duplicate_starts_leave_nothing_behind() {
    if support::docker::skip() {
        return;
    }
    let env = TestEnv::new().await;
    let mut missing = env.spec("noimage", SECRET);
    missing.image = format!("threadgate-no-such-image:{}", env.instance);
    let err = env.runtime.start(&missing).await.unwrap_err();
    assert!(matches!(err, SandboxError::ImageMissing { .. }), "{err}");
    assert!(err.to_string().contains("scripts/build-sandbox-image.sh"));
    assert!(!err.to_string().contains(SECRET));
    assert!(!env.runtime.secrets_dir("noimage").exists());
    assert!(env.runtime.list().await.unwrap().is_empty());

    // A second start of a live session is refused without touching the first.
    let first = env.runtime.start(&env.spec("dup", SECRET)).await.unwrap();
    let mut again = env.spec("dup", "another-value");
    again.secrets.push(("EXTRA".into(), secret_bytes("x")));
    let err = env.runtime.start(&again).await.unwrap_err();
    assert!(matches!(err, SandboxError::AlreadyExists { .. }), "{err}");
    let cat = exec(
        &env.docker,
        &first.container_id,
        &["cat", "/run/secrets/API_TOKEN"],
    )
    .await;
    assert_eq!(cat.stdout, SECRET);
    assert_eq!(env.runtime.list().await.unwrap().len(), 1);

    // A secret value in the environment is refused before anything is created.
    let mut leaky = env.spec("leaky", SECRET);
    leaky.env.push(("TOKEN".into(), SECRET.into()));
    let err = env.runtime.start(&leaky).await.unwrap_err();
    assert!(matches!(err, SandboxError::InvalidSpec { .. }) && !err.to_string().contains(SECRET));
    assert!(!env.runtime.secrets_dir("leaky").exists());

    env.runtime.stop(&first.container_id).await.unwrap();
}

#[tokio::test]
async fn orphaned_secrets_are_reaped_and_a_stale_dir_does_not_block_a_restart() {
    if support::docker::skip() {
        return;
    }
    let env = TestEnv::new().await;
    let handle = env
        .runtime
        .start(&env.spec("orphan", SECRET))
        .await
        .unwrap();
    let keep = env.runtime.start(&env.spec("keep", SECRET)).await.unwrap();
    // The container vanishes behind threadgate's back.
    let force = RemoveContainerOptionsBuilder::new().force(true).build();
    env.docker
        .remove_container(&handle.container_id, Some(force))
        .await
        .unwrap();
    let dir = env.runtime.secrets_dir("orphan");
    assert!(dir.exists());

    // Starting the session again replaces the stale directory.
    let restarted = env
        .runtime
        .start(&env.spec("orphan", "rotated-value"))
        .await
        .unwrap();
    let cat = exec(
        &env.docker,
        &restarted.container_id,
        &["cat", "/run/secrets/API_TOKEN"],
    )
    .await;
    assert_eq!(cat.stdout, "rotated-value");

    let force = RemoveContainerOptionsBuilder::new().force(true).build();
    env.docker
        .remove_container(&restarted.container_id, Some(force))
        .await
        .unwrap();
    assert_eq!(env.runtime.reap_orphan_secrets().await.unwrap(), 1);
    assert!(!dir.exists());
    assert!(
        env.runtime.secrets_dir("keep").exists(),
        "reaped a live session's secrets"
    );
    assert_eq!(env.runtime.reap_orphan_secrets().await.unwrap(), 0);

    env.runtime.stop(&keep.container_id).await.unwrap();
}

/// What `/readyz` asks the engine: it answers, and the image exists or is named missing.
#[tokio::test]
async fn readiness_names_a_missing_image() {
    if support::docker::skip() {
        return;
    }
    let env = TestEnv::new().await;
    env.runtime
        .check_ready(&image())
        .await
        .expect("the built sandbox image is ready");
    let missing = format!("threadgate-no-such-image:{}", env.instance);
    let err = env.runtime.check_ready(&missing).await.unwrap_err();
    assert!(matches!(err, SandboxError::ImageMissing { .. }), "{err}");
    assert!(err.to_string().contains(&missing), "{err}");
}
