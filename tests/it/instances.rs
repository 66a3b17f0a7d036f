//! Several real `threadgate serve` processes on ONE SQLite database file (WAL, busy
//! timeout) and one Docker engine, each with its own data directory (instance id,
//! worktrees, sockets), repository and secrets root: deliveries of 10 threads spread
//! across two instances give each thread exactly one session and never two running
//! containers at once; `kill -9` of one instance hands its sessions to the other within
//! the lease time (measured and printed); the killed instance, started again, reaps the
//! containers whose leases it lost; a third process with a live instance's id refuses
//! to start and says why.
//!
//! Needs `scripts/docker-up.sh` and the sandbox image, like `sessions_docker`.

use std::collections::HashMap;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::Utc;
use threadgate::secrets::MasterKey;

use crate::support;
use support::instances::{
    Serve, Shared, SharedDb, command, containers_per_thread, free_port, lease_owners,
    running_sessions, running_threads, serve, write_config,
};
use support::plain::{event_id, plain_event, thread_id};
use support::sessions::DockerWorld;
use support::wait::wait_for;

/// The lease time of the instances under test: short, so a takeover is quick to see.
const LEASE: Duration = Duration::from_secs(3);
const THREADS: usize = 10;
const WAIT: Duration = Duration::from_secs(120);
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_share_the_threads_and_one_takes_over_when_the_other_is_killed() {
    if support::docker::skip() {
        return;
    }
    let (world_a, world_b) = (DockerWorld::new(), DockerWorld::new());
    let shared = Shared {
        database: SharedDb::File(world_a.root.path().join("shared.db")),
        lease: LEASE,
        master_key: world_a.root.path().join("master.key"),
        signing_secret: world_a.signing_secret.clone(),
    };
    MasterKey::generate()
        .write_to(&shared.master_key)
        .expect("master key");
    let (id_a, id_b) = (world_a.instance.clone(), world_b.instance.clone());
    let a = serve(&world_a, &shared, &id_a, "a").await;
    let b = serve(&world_b, &shared, &id_b, "b").await;
    let db = shared.database.open();

    // Watch the engine the whole time both are alive: never two running containers of
    // one thread.
    let most = Arc::new(Mutex::new(HashMap::<String, usize>::new()));
    let watching = Arc::new(AtomicBool::new(true));
    let watcher = {
        let (most, watching) = (most.clone(), watching.clone());
        let (ia, ib) = (id_a.clone(), id_b.clone());
        std::thread::spawn(move || {
            while watching.load(Ordering::SeqCst) {
                for (thread, n) in containers_per_thread(&[&ia, &ib]) {
                    let mut most = most.lock().expect("lock");
                    let seen = most.entry(thread).or_insert(0);
                    *seen = (*seen).max(n);
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        })
    };

    // Ten threads, each delivered to one instance, every other one to both (the same
    // event twice: stored once, applied once).
    let http = reqwest::Client::new();
    let threads: Vec<String> = (0..THREADS).map(|_| thread_id()).collect();
    for (i, thread) in threads.iter().enumerate() {
        let body = plain_event("thread-created.json", thread, &event_id(), Utc::now()).to_string();
        let signature =
            threadgate::webhook::sign(shared.signing_secret.as_bytes(), body.as_bytes());
        let targets: Vec<&Serve> = match i % 3 {
            0 => vec![&a],
            1 => vec![&b],
            _ => vec![&a, &b],
        };
        for to in targets {
            let response = http
                .post(format!("http://{}/webhooks/plain", to.addr))
                .header("Plain-Request-Signature", &signature)
                .header("Content-Type", "application/json")
                .body(body.clone())
                .send()
                .await
                .expect("deliver");
            assert_eq!(response.status().as_u16(), 200);
        }
    }
    let started = Instant::now();
    let all_running = wait_for(WAIT, || {
        let (ia, ib, db) = (id_a.clone(), id_b.clone(), db.clone());
        let threads = threads.clone();
        async move {
            let per = containers_per_thread(&[&ia, &ib]);
            let each = threads.iter().all(|t| per.get(t) == Some(&1));
            (each && running_sessions(&db).await == THREADS).then_some(())
        }
    })
    .await;
    assert!(
        all_running.is_some(),
        "not every thread runs once: {:?}\n--- a ---\n{}\n--- b ---\n{}",
        containers_per_thread(&[&id_a, &id_b]),
        a.log(),
        b.log()
    );
    let owners = lease_owners(&db).await;
    let on_a: Vec<String> = threads
        .iter()
        .filter(|t| owners.get(*t) == Some(&id_a))
        .cloned()
        .collect();
    let on_b = threads.len() - on_a.len();
    println!(
        "{THREADS} threads running after {:.1} s: {} on instance a, {on_b} on instance b",
        started.elapsed().as_secs_f64(),
        on_a.len()
    );
    for thread in &threads {
        let here = running_threads(if owners.get(thread) == Some(&id_a) {
            &id_a
        } else {
            &id_b
        });
        assert!(here.contains(thread), "{thread} runs on its lease's owner");
    }
    watching.store(false, Ordering::SeqCst);
    watcher.join().expect("watcher");
    let doubled: Vec<(String, usize)> = most
        .lock()
        .expect("lock")
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(t, n)| (t.clone(), *n))
        .collect();
    assert!(doubled.is_empty(), "two containers at once: {doubled:?}");
    let events: i64 = db
        .read(|c| c.query_row("SELECT count(*) FROM events", (), |r| r.get(0)))
        .await
        .expect("count events");
    assert_eq!(events, THREADS as i64, "a delivery to both is stored once");

    // kill -9 the instance with the most sessions (a, if they are level).
    let (victim, survivor, victim_world, moved) = if on_a.len() >= on_b {
        (a, b, &world_a, on_a.clone())
    } else {
        let moved: Vec<String> = threads
            .iter()
            .filter(|t| owners.get(*t) == Some(&id_b))
            .cloned()
            .collect();
        (b, a, &world_b, moved)
    };
    let killed_id = victim.instance.clone();
    let victim_config_tag = if killed_id == id_a { "a" } else { "b" };
    let orphans = running_threads(&killed_id).len();
    let killed_at = Instant::now();
    let status = Command::new("kill")
        .args(["-9", &victim.child.id().to_string()])
        .status()
        .expect("kill -9");
    assert!(status.success());
    drop(victim);
    let leases_moved = wait_for(WAIT, || {
        let (db, moved, to) = (db.clone(), moved.clone(), survivor.instance.clone());
        async move {
            let owners = lease_owners(&db).await;
            moved
                .iter()
                .all(|t| owners.get(t) == Some(&to))
                .then(|| killed_at.elapsed())
        }
    })
    .await
    .unwrap_or_else(|| panic!("the leases did not move: {}", survivor.log()));
    let containers_moved = wait_for(WAIT, || {
        let (moved, to) = (moved.clone(), survivor.instance.clone());
        async move {
            let running = running_threads(&to);
            moved
                .iter()
                .all(|t| running.contains(t))
                .then(|| killed_at.elapsed())
        }
    })
    .await
    .unwrap_or_else(|| panic!("the sessions did not move: {}", survivor.log()));
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "kill -9 of an instance with {} sessions (lease time {} s): leases taken over after \
         {:.2} s, containers running on the other instance after {:.2} s (load {})",
        moved.len(),
        LEASE.as_secs(),
        leases_moved.as_secs_f64(),
        containers_moved.as_secs_f64(),
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    assert!(
        leases_moved <= LEASE + Duration::from_secs(5),
        "leases taken over after {leases_moved:?}"
    );
    // The dead instance's containers were not reached by the new owner.
    assert_eq!(running_threads(&killed_id).len(), orphans);
    let per = containers_per_thread(&[&survivor.instance]);
    assert!(threads.iter().all(|t| per.get(t) == Some(&1)), "{per:?}");

    // The killed instance comes back: it reaps the containers whose leases it lost.
    let back = serve(victim_world, &shared, &killed_id, victim_config_tag).await;
    let reaped = wait_for(WAIT, || async {
        running_threads(&killed_id).is_empty().then_some(())
    })
    .await;
    assert!(reaped.is_some(), "orphans left running: {}", back.log());
    let per = containers_per_thread(&[&survivor.instance, &killed_id]);
    assert!(threads.iter().all(|t| per.get(t) == Some(&1)), "{per:?}");

    // A third process with the survivor's (live) instance id refuses to start.
    let dir = victim_world.root.path().join("twin");
    std::fs::create_dir_all(&dir).expect("dir");
    let config = write_config(victim_world, &shared, &dir, free_port(), &survivor.instance);
    let log = dir.join("twin.log");
    let mut twin = command(&config, &shared, &log).spawn().expect("spawn twin");
    let exited = wait_for(Duration::from_secs(60), || {
        let status = twin.try_wait().expect("try_wait");
        async move { status }
    })
    .await;
    let Some(status) = exited else {
        let _ = twin.kill();
        panic!("a second process with a live instance id kept running");
    };
    assert!(!status.success());
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        said.contains("two instances with the same instance id")
            && said.contains(&survivor.instance),
        "{said}"
    );
    // The twin changed nothing: the survivor still owns and runs every thread.
    let owners = lease_owners(&db).await;
    assert!(
        threads
            .iter()
            .all(|t| owners.get(t) == Some(&survivor.instance)),
        "{owners:?}"
    );
    drop(back);
    drop(survivor);
}
