//! Several real `threadgate serve` processes on ONE Postgres database and one Docker
//! engine (the SQLite twin is `instances`), each with its own data directory, repository
//! and secrets root:
//!
//! - a burst of deliveries of 100 threads spread across three instances (every fifth
//!   delivered to two of them: stored once), with the instance owning the most sessions
//!   killed with `kill -9` while the last deliveries are in flight (a delivery it does
//!   not answer goes to another instance, as behind a load balancer): every acked
//!   delivery is stored and applied, each thread ends with one session (one running
//!   row, one lease owner, one container on that owner), no thread ever has two running
//!   containers on live instances (the engine is sampled the whole time; a killed
//!   instance's containers are orphans nothing can reach until it is back), the killed
//!   instance's sessions are taken over within the lease time (measured, printed), and
//!   the killed instance, started again, reaps every container whose lease it lost;
//! - the takeover time after `kill -9`, over trials of two instances: three in the
//!   suite, 20 by `scripts/takeover-times.sh` (the `#[ignore]`d `takeover_times`),
//!   printed as p50 and max with the load average.
//!
//! Needs Docker with the sandbox image (like `sessions_docker`) and
//! `THREADGATE_TEST_DATABASE_URL` (scripts/test.sh starts a server with
//! scripts/postgres-up.sh); without the variable each test says so and passes.
//!
//! A hundred live containers on a 2-core machine: the sessions run the quiet agent
//! (`support::instances::quiet_agents`: the image's `sleep infinity`, no model calls),
//! so what a container costs is its start and a few MiB (the limit here is 64 MiB, a
//! cap, not a reservation); the agent runner with no model to answer it would retry
//! its model calls a hundred times over, load this suite does not test. Each instance may run all 100 (`max_live`), so the two
//! survivors of a kill can hold every thread. The module takes 50-80 s at a load
//! average of 15 to 50 (other engineers' builds), most of it Docker starting 100
//! containers.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::Utc;
use futures::StreamExt as _;
use threadgate::secrets::MasterKey;
use threadgate::store::testing::TestDb;

use crate::support;
use support::instances::{
    InstanceOptions, Running, Serve, Shared, SharedDb, deliver, kill9, lease_owners, load_average,
    pg_transactions, quiet_agents, running_of, serve_with, session_states, stored_events,
};
use support::plain::{event_id, plain_event, retry_of, thread_id};
use support::sessions::DockerWorld;
use support::wait::wait_for;

/// The lease time of the burst's instances: short, so the takeover is quick to see.
const LEASE: Duration = Duration::from_secs(5);
/// How far past the lease time a takeover may come: the survivors' tick (0.5 s) and
/// their database round trips while they start the rest of the burst.
const TAKEOVER_SLACK: Duration = Duration::from_secs(10);
/// The product's goal for the burst's takeover, from the kill: within 30 s. The
/// survivors are starting the rest of the burst's containers meanwhile, so at the full
/// suite's load they have come past the lease time plus the slack above (15.24 s and
/// 15.96 s in two CI runs, against 5 to 6 s alone); the figure is printed every run.
const BURST_TAKEOVER_GOAL: Duration = Duration::from_secs(30);
const THREADS: usize = 100;
/// Deliveries in flight at once during the burst.
const IN_FLIGHT: usize = 8;
/// The threads delivered before the kill is prepared; the rest are in flight around it.
const HELD: usize = 60;
/// Sessions the killed instance owns at least.
const VICTIM_OWNS: usize = 10;
const WAIT: Duration = Duration::from_secs(240);

/// A fresh Postgres database, or `None` (said on stderr) without a server.
fn database(test: &str) -> Option<TestDb> {
    let db = TestDb::postgres_from_env();
    if db.is_none() {
        eprintln!("{test}: THREADGATE_TEST_DATABASE_URL is not set: skipped");
    }
    db
}

/// What the instances share, on `db`, with the master key in `world`'s directory.
fn shared_on(db: &TestDb, world: &DockerWorld, lease: Duration) -> Shared {
    let shared = Shared {
        database: SharedDb::Url(db.url().expect("a Postgres test database").to_owned()),
        master_key: world.root.path().join("master.key"),
        signing_secret: world.signing_secret.clone(),
        lease,
    };
    MasterKey::generate()
        .write_to(&shared.master_key)
        .expect("master key");
    shared
}

/// Every instance may run all the threads (the survivors of a kill hold them all),
/// in small containers running the quiet agent.
fn options(agents: &std::path::Path) -> InstanceOptions {
    InstanceOptions {
        max_live: THREADS,
        memory_bytes: 64 << 20,
        agents_dir: Some(agents.to_owned()),
        ..InstanceOptions::default()
    }
}

/// Watches the engine on its own thread: the most running containers any thread had at
/// once on live instances. A killed instance's containers are orphans (nothing can reach
/// or stop them until it comes back): every one seen while it is dead is set aside, and
/// any other container it runs once it is back counts again.
struct Sampler {
    most: Arc<Mutex<HashMap<String, usize>>>,
    dead: Arc<Mutex<HashSet<String>>>,
    orphans: Arc<Mutex<HashSet<String>>>,
    samples: Arc<AtomicUsize>,
    watching: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Sampler {
    fn start(instances: Vec<String>) -> Sampler {
        let sampler = Sampler {
            most: Arc::default(),
            dead: Arc::default(),
            orphans: Arc::default(),
            samples: Arc::default(),
            watching: Arc::new(AtomicBool::new(true)),
            thread: None,
        };
        let (most, dead, orphans) = (
            sampler.most.clone(),
            sampler.dead.clone(),
            sampler.orphans.clone(),
        );
        let (samples, watching) = (sampler.samples.clone(), sampler.watching.clone());
        let thread = std::thread::spawn(move || {
            let names: Vec<&str> = instances.iter().map(String::as_str).collect();
            while watching.load(Ordering::SeqCst) {
                let running = running_of(&names);
                let mut per: HashMap<&str, usize> = HashMap::new();
                {
                    let dead = dead.lock().expect("lock");
                    let mut orphans = orphans.lock().expect("lock");
                    for c in &running {
                        if dead.contains(&c.instance) {
                            orphans.insert(c.id.clone());
                        }
                        if !orphans.contains(&c.id) {
                            *per.entry(c.thread.as_str()).or_insert(0) += 1;
                        }
                    }
                }
                let mut most = most.lock().expect("lock");
                for (thread, n) in per {
                    let seen = most.entry(thread.to_owned()).or_insert(0);
                    *seen = (*seen).max(n);
                }
                samples.fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        Sampler {
            thread: Some(thread),
            ..sampler
        }
    }

    /// `instance` was killed: its containers are orphans from now on.
    fn killed(&self, instance: &str) {
        self.dead.lock().expect("lock").insert(instance.to_owned());
    }

    /// `instance` runs again: containers it starts from now on count.
    fn back(&self, instance: &str) {
        // One more sample while it is still dead, so that every orphan is set aside.
        let seen = self.samples.load(Ordering::SeqCst);
        while self.samples.load(Ordering::SeqCst) < seen + 2 {
            std::thread::sleep(Duration::from_millis(20));
        }
        self.dead.lock().expect("lock").remove(instance);
    }

    /// Stops watching: the threads that ever had two running containers at once, and
    /// how many samples were taken.
    fn stop(mut self) -> (Vec<(String, usize)>, usize) {
        self.watching.store(false, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            thread.join().expect("sampler");
        }
        let doubled = self
            .most
            .lock()
            .expect("lock")
            .iter()
            .filter(|(_, n)| **n > 1)
            .map(|(t, n)| (t.clone(), *n))
            .collect();
        (doubled, self.samples.load(Ordering::SeqCst))
    }
}

/// One delivery as a load balancer in front of the instances makes it: to `first`,
/// and to the next instance while an instance does not answer 2xx (a killed one is
/// refused at once). `Some(status)` once acked.
async fn deliver_balanced(
    http: &reqwest::Client,
    shared: &Shared,
    addrs: &[String],
    first: usize,
    body: &serde_json::Value,
) -> Option<u16> {
    for attempt in 0..addrs.len() * 3 {
        let to = &addrs[(first + attempt) % addrs.len()];
        match deliver(http, shared, to, body).await {
            Ok(status) if (200..300).contains(&status) => return Some(status),
            Ok(_) | Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_of_100_threads_on_three_instances_survives_a_kill_9() {
    if support::docker::skip() {
        return;
    }
    let Some(pg) = database("instances_pg burst") else {
        return;
    };
    let began = Instant::now();
    let worlds: Vec<DockerWorld> = (0..3).map(|_| DockerWorld::new()).collect();
    let shared = shared_on(&pg, &worlds[0], LEASE);
    let ids: Vec<String> = worlds.iter().map(|w| w.instance.clone()).collect();
    let tags = ["a", "b", "c"];
    let agents = quiet_agents(&worlds[0].root.path().join("agents"));
    let mut serves: Vec<Option<Serve>> = Vec::new();
    for (i, world) in worlds.iter().enumerate() {
        serves.push(Some(
            serve_with(world, &shared, (&ids[i], tags[i]), &options(&agents)).await,
        ));
    }
    let addrs: Vec<String> = serves.iter().flatten().map(|s| s.addr.clone()).collect();
    let pids: Vec<u32> = serves.iter().flatten().map(|s| s.child.id()).collect();
    let db = shared.database.open();
    let sampler = Sampler::start(ids.clone());
    let up = began.elapsed();

    // The burst: each thread's first delivery to one instance in turn, every fifth
    // also (as Plain's retry of it: same event id, new attempt) to the next one. The
    // deliveries past the first HELD wait until the instances own sessions, and the
    // kill comes while they are in flight.
    let threads: Vec<String> = (0..THREADS).map(|_| thread_id()).collect();
    let bodies: Vec<serde_json::Value> = threads
        .iter()
        .map(|t| plain_event("thread-created.json", t, &event_id(), Utc::now()))
        .collect();
    let acked = Arc::new(Mutex::new(HashSet::<String>::new()));
    let (gate, gate_open) = tokio::sync::watch::channel(false);
    let http = reqwest::Client::new();
    let burst = async {
        let began = Instant::now();
        futures::stream::iter(bodies.iter().enumerate())
            .map(|(i, body)| {
                let (http, shared, addrs, acked) = (&http, &shared, &addrs, acked.clone());
                let mut gate_open = gate_open.clone();
                async move {
                    if i >= HELD {
                        gate_open.wait_for(|open| *open).await.expect("gate");
                    }
                    let mut copies = vec![(i % 3, body.clone())];
                    if i % 5 == 0 {
                        copies.push(((i + 1) % 3, retry_of(body)));
                    }
                    for (first, copy) in copies {
                        if deliver_balanced(http, shared, addrs, first, &copy)
                            .await
                            .is_some()
                        {
                            let id = copy["id"].as_str().expect("event id").to_owned();
                            acked.lock().expect("lock").insert(id);
                        }
                    }
                }
            })
            .buffer_unordered(IN_FLIGHT)
            .collect::<Vec<()>>()
            .await;
        began.elapsed()
    };
    // kill -9 of the instance owning the most sessions, a few deliveries into the
    // second part of the burst; then the time until its leases and sessions are on the
    // survivors.
    let takeover = async {
        let owning = wait_for(WAIT, || {
            let (db, acked) = (db.clone(), acked.lock().expect("lock").len());
            async move {
                let owners = lease_owners(&db).await;
                let most = owners
                    .values()
                    .fold(HashMap::<&String, usize>::new(), |mut n, o| {
                        *n.entry(o).or_insert(0) += 1;
                        n
                    });
                (acked >= HELD && most.values().any(|n| *n >= VICTIM_OWNS)).then_some(())
            }
        })
        .await;
        assert!(
            owning.is_some(),
            "no instance came to own {VICTIM_OWNS} sessions"
        );
        gate.send(true).expect("open the gate");
        let more = wait_for(WAIT, || {
            let n = acked.lock().expect("lock").len();
            async move { (n >= HELD + IN_FLIGHT).then_some(()) }
        })
        .await;
        assert!(more.is_some(), "the rest of the burst was not acked");
        let owners = lease_owners(&db).await;
        let victim = (0..ids.len())
            .max_by_key(|i| owners.values().filter(|o| **o == ids[*i]).count())
            .expect("an instance");
        sampler.killed(&ids[victim]);
        kill9(pids[victim]);
        let killed_at = Instant::now();
        let acked_at_kill = acked.lock().expect("lock").len();
        let owners = lease_owners(&db).await;
        let moved: Vec<String> = owners
            .iter()
            .filter(|(_, owner)| **owner == ids[victim])
            .map(|(thread, _)| thread.clone())
            .collect();
        let survivors: Vec<String> = (0..ids.len())
            .filter(|i| *i != victim)
            .map(|i| ids[i].clone())
            .collect();
        let leases_moved = wait_for(WAIT, || {
            let (db, moved, survivors) = (db.clone(), moved.clone(), survivors.clone());
            async move {
                let owners = lease_owners(&db).await;
                moved
                    .iter()
                    .all(|t| owners.get(t).is_some_and(|o| survivors.contains(o)))
                    .then(|| killed_at.elapsed())
            }
        })
        .await;
        let containers_moved = wait_for(WAIT, || {
            let (moved, survivors) = (moved.clone(), survivors.clone());
            async move {
                let names: Vec<&str> = survivors.iter().map(String::as_str).collect();
                let running: HashSet<String> =
                    running_of(&names).into_iter().map(|c| c.thread).collect();
                moved
                    .iter()
                    .all(|t| running.contains(t))
                    .then(|| killed_at.elapsed())
            }
        })
        .await;
        Takeover {
            victim,
            acked_at_kill,
            moved,
            leases_moved,
            containers_moved,
        }
    };
    let (burst_took, takeover) = tokio::join!(burst, takeover);
    let Takeover {
        victim,
        acked_at_kill,
        moved,
        leases_moved,
        containers_moved,
    } = takeover;
    let acked = acked.lock().expect("lock").clone();
    drop(serves[victim].take());
    let survivors: Vec<&str> = (0..ids.len())
        .filter(|i| *i != victim)
        .map(|i| ids[i].as_str())
        .collect();
    let survivors = survivors.as_slice();
    let logs = |serves: &[Option<Serve>]| -> String {
        serves
            .iter()
            .flatten()
            .map(|s| {
                let log = s.log();
                let tail = log.get(log.len().saturating_sub(20_000)..).unwrap_or(&log);
                format!("--- {} (the end of its log) ---\n{tail}", s.instance)
            })
            .collect()
    };
    let leases_moved = leases_moved.unwrap_or_else(|| {
        panic!(
            "the killed instance's leases did not move: {}",
            logs(&serves)
        )
    });
    let containers_moved = containers_moved.unwrap_or_else(|| {
        panic!(
            "the killed instance's sessions did not move: {}",
            logs(&serves)
        )
    });
    println!(
        "burst of {THREADS} threads acked in {:.1} s; kill -9 of instance {} after {acked_at_kill} \
         were acked, owning {} sessions (lease time {} s): leases taken over after {:.2} s, \
         containers running on the survivors after {:.2} s (load {})",
        burst_took.as_secs_f64(),
        tags[victim],
        moved.len(),
        LEASE.as_secs(),
        leases_moved.as_secs_f64(),
        containers_moved.as_secs_f64(),
        load_average()
    );
    assert!(
        !moved.is_empty(),
        "the victim owned no session when it was killed"
    );
    assert!(
        leases_moved <= BURST_TAKEOVER_GOAL,
        "leases taken over after {leases_moved:?}: {}",
        logs(&serves)
    );
    // Every thread was acked (the balancer found a survivor), each of its deliveries
    // acked is stored once and applied, and each thread runs once, on its lease's owner.
    let heads: HashSet<String> = bodies
        .iter()
        .map(|b| b["id"].as_str().expect("event id").to_owned())
        .collect();
    assert_eq!(acked, heads, "every thread's delivery was acked");
    let all_settled = wait_for(WAIT, || {
        let (db, threads) = (db.clone(), threads.clone());
        let acked = acked.clone();
        async move {
            let stored = stored_events(&db).await;
            let applied = acked.iter().all(|id| stored.get(id) == Some(&true));
            let states = session_states(&db).await;
            let owners = lease_owners(&db).await;
            let running = running_of(survivors);
            let per = per_thread(&running);
            let settled = threads.iter().all(|t| {
                states.get(t).map(String::as_str) == Some("running")
                    && owners
                        .get(t)
                        .is_some_and(|o| survivors.contains(&o.as_str()))
                    && per.get(t) == Some(&1)
                    && running
                        .iter()
                        .any(|c| &c.thread == t && Some(&c.instance) == owners.get(t))
            });
            (applied && settled).then_some(stored.len())
        }
    })
    .await;
    let stored = all_settled.unwrap_or_else(|| {
        panic!(
            "not every thread runs once on its owner: {:?}\n{}",
            per_thread(&running_of(survivors)),
            logs(&serves)
        )
    });
    assert_eq!(
        stored, THREADS,
        "a delivery to two instances is stored once"
    );
    let settled = began.elapsed();
    // What the survivors ask of the database while their 100 sessions sit idle: lease
    // renewals, heartbeats and their ticks' reads.
    let (before, window) = (pg_transactions(&db).await, Instant::now());
    tokio::time::sleep(Duration::from_secs(5)).await;
    let idle_rate = (pg_transactions(&db).await - before) as f64 / window.elapsed().as_secs_f64();
    println!(
        "database transactions with {THREADS} idle sessions on two instances: {idle_rate:.0}/s"
    );

    // The killed instance comes back on the same database: it reaps every container
    // whose lease it lost, and starts none of its own.
    sampler.back(&ids[victim]);
    let back = serve_with(
        &worlds[victim],
        &shared,
        (&ids[victim], tags[victim]),
        &options(&agents),
    )
    .await;
    let reaped = wait_for(WAIT, || {
        let id = ids[victim].clone();
        async move { running_of(&[&id]).is_empty().then_some(()) }
    })
    .await;
    assert!(reaped.is_some(), "orphans left running: {}", back.log());
    let all = [ids[0].as_str(), ids[1].as_str(), ids[2].as_str()];
    let per = per_thread(&running_of(&all));
    assert!(threads.iter().all(|t| per.get(t) == Some(&1)), "{per:?}");
    let (doubled, samples) = sampler.stop();
    assert!(doubled.is_empty(), "two containers at once: {doubled:?}");
    println!(
        "instances up in {:.1} s, every thread running once after {:.1} s, the killed \
         instance back and reaped after {:.1} s; {samples} samples of the engine; load {}",
        up.as_secs_f64(),
        settled.as_secs_f64(),
        began.elapsed().as_secs_f64(),
        load_average()
    );
    drop(back);
    drop(serves);
}

/// How long a takeover took after `kill -9`: until the killed instance's leases were
/// all on survivors, and until each of its sessions ran in a container there.
#[derive(Clone, Copy, Debug)]
struct TakeoverTimes {
    leases: Duration,
    containers: Duration,
}

/// One takeover trial: two instances on a fresh database, `threads` threads delivered
/// to the first, each running once; then `kill -9` of the instance owning the most, and
/// the time until the other owns and runs them all. `None` without a Postgres server.
async fn takeover_trial(lease: Duration, threads: usize) -> Option<(usize, TakeoverTimes)> {
    let pg = database("takeover trial")?;
    let worlds = [DockerWorld::new(), DockerWorld::new()];
    let shared = shared_on(&pg, &worlds[0], lease);
    let agents = quiet_agents(&worlds[0].root.path().join("agents"));
    let options = InstanceOptions {
        max_live: threads,
        ..options(&agents)
    };
    let ids = [worlds[0].instance.clone(), worlds[1].instance.clone()];
    let (a, b) = tokio::join!(
        serve_with(&worlds[0], &shared, (&ids[0], "a"), &options),
        serve_with(&worlds[1], &shared, (&ids[1], "b"), &options)
    );
    let mut serves = [Some(a), Some(b)];
    let db = shared.database.open();
    let http = reqwest::Client::new();
    let names = [ids[0].as_str(), ids[1].as_str()];
    let threads: Vec<String> = (0..threads).map(|_| thread_id()).collect();
    let to = serves[0].as_ref().expect("a").addr.clone();
    for thread in &threads {
        let body = plain_event("thread-created.json", thread, &event_id(), Utc::now());
        assert_eq!(deliver(&http, &shared, &to, &body).await.ok(), Some(200));
    }
    let running = wait_for(WAIT, || {
        let (db, threads) = (db.clone(), threads.clone());
        async move {
            let states = session_states(&db).await;
            let per = per_thread(&running_of(&names));
            threads
                .iter()
                .all(|t| {
                    states.get(t).map(String::as_str) == Some("running") && per.get(t) == Some(&1)
                })
                .then_some(())
        }
    })
    .await;
    assert!(running.is_some(), "the trial's threads did not all run");
    let owners = lease_owners(&db).await;
    let victim = usize::from(
        owners.values().filter(|o| **o == ids[1]).count()
            > owners.values().filter(|o| **o == ids[0]).count(),
    );
    let survivor = ids[1 - victim].clone();
    let moved: Vec<String> = threads
        .iter()
        .filter(|t| owners.get(*t) == Some(&ids[victim]))
        .cloned()
        .collect();
    kill9(serves[victim].as_ref().expect("victim").child.id());
    let killed_at = Instant::now();
    let leases = wait_for(WAIT, || {
        let (db, moved, survivor) = (db.clone(), moved.clone(), survivor.clone());
        async move {
            let owners = lease_owners(&db).await;
            moved
                .iter()
                .all(|t| owners.get(t) == Some(&survivor))
                .then(|| killed_at.elapsed())
        }
    })
    .await;
    let containers = wait_for(WAIT, || {
        let (moved, survivor) = (moved.clone(), survivor.clone());
        async move {
            let running: HashSet<String> = running_of(&[&survivor])
                .into_iter()
                .map(|c| c.thread)
                .collect();
            moved
                .iter()
                .all(|t| running.contains(t))
                .then(|| killed_at.elapsed())
        }
    })
    .await;
    drop(serves[victim].take());
    let log = serves[1 - victim]
        .as_ref()
        .map(Serve::log)
        .unwrap_or_default();
    let times = TakeoverTimes {
        leases: leases.unwrap_or_else(|| panic!("the leases did not move: {log}")),
        containers: containers.unwrap_or_else(|| panic!("the sessions did not move: {log}")),
    };
    Some((moved.len(), times))
}

/// Runs `trials` takeover trials and prints each and their p50 and max with the load
/// average; every takeover is asserted within the lease time and `slack`.
async fn takeover_trials(trials: usize, lease: Duration, threads: usize, slack: Duration) {
    let mut all = Vec::new();
    for trial in 1..=trials {
        let Some((moved, times)) = takeover_trial(lease, threads).await else {
            return;
        };
        println!(
            "takeover trial {trial}/{trials}: {moved} sessions, leases after {:.2} s, \
             containers after {:.2} s (lease time {} s, load {})",
            times.leases.as_secs_f64(),
            times.containers.as_secs_f64(),
            lease.as_secs(),
            load_average()
        );
        all.push(times);
    }
    let summary = |pick: fn(&TakeoverTimes) -> Duration| {
        let mut sorted: Vec<Duration> = all.iter().map(pick).collect();
        sorted.sort();
        let p50 = sorted[(sorted.len() - 1) / 2];
        let max = sorted[sorted.len() - 1];
        (p50.as_secs_f64(), max.as_secs_f64())
    };
    let (leases_p50, leases_max) = summary(|t| t.leases);
    let (containers_p50, containers_max) = summary(|t| t.containers);
    println!(
        "takeover after kill -9 over {trials} trials ({threads} threads each, lease time {} s): \
         leases p50 {leases_p50:.2} s, max {leases_max:.2} s; sessions running again p50 \
         {containers_p50:.2} s, max {containers_max:.2} s (load {})",
        lease.as_secs(),
        load_average()
    );
    for times in &all {
        assert!(
            times.leases <= lease + slack,
            "a takeover's leases moved after {:?}",
            times.leases
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_instances_sessions_are_taken_over_within_the_lease_time() {
    if support::docker::skip() {
        return;
    }
    takeover_trials(3, Duration::from_secs(3), 4, TAKEOVER_SLACK).await;
}

/// The takeover figure: 20 trials (`THREADGATE_TAKEOVER_TRIALS`) at the default lease
/// time, 15 s (`THREADGATE_TAKEOVER_LEASE_SECS`), of 10 sessions each
/// (`THREADGATE_TAKEOVER_THREADS`). Run by `scripts/takeover-times.sh`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark of several minutes: scripts/takeover-times.sh runs it"]
async fn takeover_times() {
    if support::docker::skip() {
        return;
    }
    let number = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .map(|v| {
                v.parse::<u64>()
                    .unwrap_or_else(|_| panic!("{name} is not a number: {v}"))
            })
            .unwrap_or(default)
    };
    let trials = usize::try_from(number("THREADGATE_TAKEOVER_TRIALS", 20)).expect("trials");
    let lease = Duration::from_secs(number("THREADGATE_TAKEOVER_LEASE_SECS", 15));
    let threads = usize::try_from(number("THREADGATE_TAKEOVER_THREADS", 10)).expect("threads");
    takeover_trials(trials, lease, threads, TAKEOVER_SLACK).await;
}

/// What the kill left to measure.
struct Takeover {
    victim: usize,
    acked_at_kill: usize,
    moved: Vec<String>,
    leases_moved: Option<Duration>,
    containers_moved: Option<Duration>,
}

/// Running containers per thread.
fn per_thread(running: &[Running]) -> HashMap<String, usize> {
    let mut per = HashMap::new();
    for c in running {
        *per.entry(c.thread.clone()).or_insert(0) += 1;
    }
    per
}
