//! Approvals across several real `threadgate serve` processes on ONE Postgres database
//! (issue 19), each with its own data directory and instance id, sending refunds to one
//! localstripe, where every refund is counted (not only rows):
//!
//! - twenty approvals of one held refund, spread across three instances at once
//!   (approvals API and review page; MCP is the agent's side and decides nothing) make
//!   one refund at the fake and one `running` → `ran`;
//! - `kill -9` of the instance that would run approved calls, at random points around
//!   approve → claim → send, [`TRIALS`] trials (`THREADGATE_APPROVAL_TRIALS` for more,
//!   `scripts/stress-approvals.sh` runs 10,000): 0 double executions and 0 lost
//!   approvals, checked at the fake.
//!
//! Beside them, in process (two applications on one database, a fake sandbox): an
//! approval decided on B reaches the agent waiting on A's session socket, whoever runs
//! it (B, or a sweep when B died before claiming it), on Postgres and on one SQLite
//! file; and an instance told to stop while it sends a call keeps its heartbeat until
//! the call is done, so no sweep takes it over.
//!
//! The real-process tests are skipped (saying so) without `THREADGATE_TEST_DATABASE_URL`, Docker (the harness's
//! world) or localstripe (`scripts/localstripe.sh setup`).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rand::RngExt as _;
use serde_json::json;
use threadgate::executions::{Execution, Status, store as exec_store};
use threadgate::ids::{ExecutionId, SessionId, ThreadId};
use threadgate::secrets::{MasterKey, SecretString};
use threadgate::store::Db;
use threadgate::store::testing::{TestDb, test_database_url};

use crate::support;
use support::instances::{InstanceOptions, Serve, Shared, SharedDb, serve_with};
use support::localstripe::LocalStripe;
use support::sessions::DockerWorld;
use support::wait::wait_for;

/// The instances' lease time: an instance whose heartbeat is older is dead, and an
/// approved call no one claimed for a third of it is claimed by any instance.
const LEASE: Duration = Duration::from_secs(2);
/// Kill trials in the test (each one an approved call whose runner is killed around
/// it); `THREADGATE_APPROVAL_TRIALS` overrides it.
const TRIALS: usize = 200;
/// Calls approved per life of a victim (all on it, at random offsets around its kill).
const CALLS_PER_LIFE: usize = 10;
/// The reviewers' password on the review page.
const PASSWORD: &str = "correct horse battery staple 42";
/// The Stripe key the instances hold (localstripe takes any `sk_` key).
const STRIPE_KEY: &str = "sk_test_instances_approvals_4b1e";

/// Everything a test shares: the world (directories), the database, localstripe.
struct Cluster {
    world: DockerWorld,
    shared: Shared,
    db: Db,
    stripe: LocalStripe,
    extra: String,
    _pg: TestDb,
}

impl Cluster {
    /// `None` (having said why) when a prerequisite is missing.
    async fn new() -> Option<Cluster> {
        if test_database_url().is_none() {
            eprintln!("THREADGATE_TEST_DATABASE_URL is not set: instances_approvals skipped");
            return None;
        }
        if support::docker::skip() {
            return None;
        }
        let pg = TestDb::postgres_from_env()?;
        let url = pg.url().expect("a postgres url").to_owned();
        let world = DockerWorld::new();
        let shared = Shared {
            database: SharedDb::Url(url),
            master_key: world.root.path().join("master.key"),
            signing_secret: world.signing_secret.clone(),
            lease: LEASE,
        };
        MasterKey::generate()
            .write_to(&shared.master_key)
            .expect("master key");
        let stripe = tokio::task::spawn_blocking(LocalStripe::start)
            .await
            .expect("localstripe starts");
        let db = shared.database.open();
        let settings = threadgate::config::Settings {
            master_key_file: shared.master_key.clone(),
            data_dir: world.root.path().join("secrets-admin"),
            ..threadgate::config::Settings::default()
        };
        let secrets = threadgate::app::open_secrets(&db, &settings).expect("open secrets");
        secrets
            .set("stripe_api_key", SecretString::from(STRIPE_KEY.to_owned()))
            .await
            .expect("store the stripe key");
        let extra = format!("[stripe]\napi_url = {:?}\n", stripe.base_url());
        Some(Cluster {
            world,
            shared,
            db,
            stripe,
            extra,
            _pg: pg,
        })
    }

    async fn serve(&self, instance: &str, tag: &str) -> Serve {
        let options = InstanceOptions {
            extra: self.extra.clone(),
            ..InstanceOptions::default()
        };
        serve_with(&self.world, &self.shared, (instance, tag), &options).await
    }

    /// A charge of `amount` (cents) on a fresh customer.
    async fn charge(&self, amount: u64) -> String {
        let customer = self.stripe.create_customer("ada@example.com").await;
        self.stripe.create_charge(&customer, amount, "usd").await
    }

    /// `n` refunds of `amount` on `charge`, held for a person as the gate holds them
    /// (the frozen row a session's call leaves), all in one transaction.
    async fn hold(&self, charge: &str, amount: u64, n: usize) -> Vec<String> {
        let now = chrono::Utc::now().timestamp_millis();
        let calls: Vec<Execution> = (0..n).map(|_| held_refund(charge, amount, now)).collect();
        let ids = calls.iter().map(|e| e.id.to_string()).collect();
        self.db
            .write(move |c| {
                for e in &calls {
                    exec_store::insert(c, e)?;
                }
                Ok(())
            })
            .await
            .expect("hold the calls");
        ids
    }

    /// Each call's status and runner.
    async fn rows(&self) -> HashMap<String, (String, Option<String>)> {
        self.db
            .read(|c| {
                let mut stmt = c.prepare("SELECT id, status, runner FROM executions")?;
                let rows = stmt.query_map((), |r| Ok((r.get(0)?, (r.get(1)?, r.get(2)?))))?;
                rows.collect()
            })
            .await
            .expect("read executions")
    }

    /// Every refund localstripe made, counted by the execution that asked for it.
    async fn refunds_by_execution(&self) -> HashMap<String, usize> {
        let mut refunds = Refunds::default();
        refunds.update(&self.stripe).await;
        refunds.by_execution
    }

    /// Approves `id` on the instance at `addr` and waits until it ran: how long the
    /// approval took to be answered and the call to be recorded as run, in ms.
    async fn time_to_run(
        &self,
        http: &reqwest::Client,
        addr: &str,
        token: &str,
        id: &str,
    ) -> (u64, u64) {
        let sent = Instant::now();
        assert_eq!(approve_api(http, addr, token, id).await, 200);
        let answered = u64::try_from(sent.elapsed().as_millis()).unwrap_or(u64::MAX);
        let ran = wait_for(Duration::from_secs(30), || async {
            let rows = self.rows().await;
            rows.get(id)
                .is_some_and(|(s, _)| s == "succeeded")
                .then(|| sent.elapsed())
        })
        .await
        .expect("the warm-up call runs");
        (answered, u64::try_from(ran.as_millis()).unwrap_or(u64::MAX))
    }

    /// Audit steps of one execution, by event (and the recheck's outcome).
    async fn audit_steps(&self, id: &str) -> Vec<(String, Option<String>)> {
        // The instances chain in the background: chain what waits first.
        threadgate::audit::chain_waiting(&self.db)
            .await
            .expect("chain the audit rows waiting");
        let id = id.to_owned();
        self.db
            .read(move |c| {
                let mut stmt = c.prepare(
                    "SELECT event, outcome FROM audit WHERE execution_id = ?1 ORDER BY id",
                )?;
                let rows = stmt.query_map([id.as_str()], |r| Ok((r.get(0)?, r.get(1)?)))?;
                rows.collect()
            })
            .await
            .expect("read audit")
    }
}

/// The refunds localstripe made, counted by the execution that asked for them. Read
/// again from the newest (localstripe lists by creation second, newest first) down to
/// a few seconds before the newest seen at the last read, each refund counted once by
/// its id, so a long stress run does not page through every refund after each kill.
#[derive(Default)]
struct Refunds {
    seen: std::collections::HashSet<String>,
    newest: i64,
    by_execution: HashMap<String, usize>,
}

impl Refunds {
    async fn update(&mut self, stripe: &LocalStripe) {
        let stop_before = self.newest - 3;
        let mut after: Option<String> = None;
        loop {
            let path = match &after {
                Some(id) => format!("refunds?limit=100&starting_after={id}"),
                None => "refunds?limit=100".to_owned(),
            };
            let page = stripe.get(&path).await;
            let data = page["data"].as_array().cloned().unwrap_or_default();
            let mut oldest = i64::MAX;
            for refund in &data {
                let created = refund["created"].as_i64().unwrap_or(0);
                oldest = oldest.min(created);
                self.newest = self.newest.max(created);
                let id = refund["id"].as_str().unwrap_or_default().to_owned();
                if !self.seen.insert(id) {
                    continue;
                }
                let by = refund["metadata"]["threadgate_execution_id"]
                    .as_str()
                    .unwrap_or("(none)")
                    .to_owned();
                *self.by_execution.entry(by).or_insert(0) += 1;
            }
            after = data
                .last()
                .and_then(|r| r["id"].as_str())
                .map(str::to_owned);
            let more = page["has_more"].as_bool().unwrap_or(false);
            if !more || after.is_none() || oldest < stop_before {
                break;
            }
        }
    }
}

/// A refund held for a person, as the gate freezes it.
fn held_refund(charge: &str, amount: u64, now: i64) -> Execution {
    let id = ExecutionId::random();
    let args = json!({"amount": amount, "charge": charge, "reason": "requested_by_customer"});
    Execution {
        session_id: SessionId::random(),
        thread_id: ThreadId::parse(support::plain::thread_id()).expect("thread id"),
        agent: "support".into(),
        tool: "stripe.create_refund".into(),
        args: args.to_string(),
        account: "stripe:default".into(),
        binding_hash: format!("binding-{id}"),
        diagnosis: Some("the customer cancelled within the trial".into()),
        verdict: "hold".into(),
        because: "require_approval (support.yaml:35)".into(),
        rule_line: Some(35),
        policy_hash: String::new(),
        status: Status::Held,
        summary: Some(format!("Refund {amount} on {charge}")),
        expires_at_ms: Some(now + 3_600_000),
        reviewer: None,
        decision_message: None,
        decided_at_ms: None,
        result: None,
        error: None,
        attempts: 0,
        created_at_ms: now,
        finished_at_ms: None,
        id,
    }
}

/// `POST /api/approvals/{id}` with `token`: the HTTP status, or 0 when no answer came.
async fn approve_api(http: &reqwest::Client, addr: &str, token: &str, id: &str) -> u16 {
    http.post(format!("http://{addr}/api/approvals/{id}"))
        .bearer_auth(token)
        .json(&json!({"decision": "approve"}))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .map_or(0, |r| r.status().as_u16())
}

/// A reviewer signed in on one instance's review page: its cookie and CSRF token.
struct PageSession {
    base: String,
    http: reqwest::Client,
    cookie: String,
    csrf: String,
}

fn cookie_of(response: &reqwest::Response, name: &str) -> Option<String> {
    response
        .headers()
        .get_all(reqwest::header::SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| v.starts_with(&format!("{name}=")))
        .map(|v| v.split(';').next().unwrap_or_default().to_owned())
}

fn csrf_of(html: &str) -> String {
    let at = html.find("name=\"csrf\" value=\"").expect("a csrf field") + 19;
    let rest = &html[at..];
    rest[..rest.find('"').expect("end of the csrf value")].to_owned()
}

impl PageSession {
    async fn sign_in(addr: &str, name: &str) -> PageSession {
        let base = format!("http://{addr}");
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("client");
        let form = http
            .get(format!("{base}/login"))
            .send()
            .await
            .expect("login form");
        let login = cookie_of(&form, "tg_login").expect("login cookie");
        let csrf = csrf_of(&form.text().await.expect("body"));
        let signed = http
            .post(format!("{base}/login"))
            .header("Cookie", login)
            .form(&[
                ("csrf", csrf.as_str()),
                ("name", name),
                ("password", PASSWORD),
                ("next", "/approvals"),
            ])
            .send()
            .await
            .expect("login");
        assert_eq!(signed.status().as_u16(), 303, "sign-in redirects");
        let cookie = cookie_of(&signed, "tg_review").expect("session cookie");
        let page = http
            .get(format!("{base}/approvals"))
            .header("Cookie", &cookie)
            .send()
            .await
            .expect("queue");
        let csrf = csrf_of(&page.text().await.expect("body"));
        PageSession {
            base,
            http,
            cookie,
            csrf,
        }
    }

    /// Approves `id` on the page: the HTTP status.
    async fn approve(&self, id: &str) -> u16 {
        self.http
            .post(format!("{}/approvals/{id}/decide", self.base))
            .header("Cookie", &self.cookie)
            .form(&[("csrf", self.csrf.as_str()), ("decision", "approve")])
            .send()
            .await
            .map_or(0, |r| r.status().as_u16())
    }
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Twenty approvals of one held refund at once, spread across three instances (API
/// and review page, two reviewers): one is taken, the others are told it was decided,
/// and localstripe made one refund; the call went `running` once and `ran` once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_approvals_across_three_instances_make_one_refund() {
    let started = Instant::now();
    let Some(cluster) = Cluster::new().await else {
        return;
    };
    let alice = threadgate::reviewers::add(&cluster.db, "alice")
        .await
        .expect("alice");
    let alice = secrecy::ExposeSecret::expose_secret(&alice.token).to_owned();
    threadgate::reviewers::add(&cluster.db, "bob")
        .await
        .expect("bob");
    let hasher = threadgate::reviewers::hasher::Hasher::new(1, 4);
    threadgate::reviewers::set_password(
        &cluster.db,
        &hasher,
        "bob",
        SecretString::from(PASSWORD.to_owned()),
    )
    .await
    .expect("bob's password");
    let mut instances = Vec::new();
    for tag in ["a", "b", "c"] {
        let id = format!("{}{tag}", cluster.world.instance);
        instances.push(cluster.serve(&id, tag).await);
    }
    let mut pages = Vec::new();
    for serve in &instances {
        pages.push(PageSession::sign_in(&serve.addr, "bob").await);
    }
    let charge = cluster.charge(50_000).await;
    let id = cluster.hold(&charge, 1_000, 1).await.remove(0);

    let http = reqwest::Client::new();
    let mut racing = Vec::new();
    let pages = std::sync::Arc::new(pages);
    for i in 0..20 {
        let addr = instances[i % 3].addr.clone();
        let (http, token, id, pages) = (http.clone(), alice.clone(), id.clone(), pages.clone());
        racing.push(tokio::spawn(async move {
            if i % 2 == 0 {
                ("api", approve_api(&http, &addr, &token, &id).await)
            } else {
                ("page", pages[i % 3].approve(&id).await)
            }
        }));
    }
    let mut answers = Vec::new();
    for task in racing {
        answers.push(task.await.expect("an approval"));
    }
    let taken = answers.iter().filter(|(_, s)| *s == 200).count();
    let told = answers.iter().filter(|(_, s)| *s == 409).count();
    assert_eq!((taken, told), (1, 19), "{answers:?}");

    let done = wait_for(Duration::from_secs(30), || async {
        let rows = cluster.rows().await;
        rows.get(&id)
            .filter(|(status, _)| status == "succeeded")
            .cloned()
    })
    .await;
    let rows = cluster.rows().await;
    let runner = done
        .unwrap_or_else(|| {
            panic!(
                "the approved refund did not run: {:?}\n{}",
                rows.get(&id),
                instances
                    .iter()
                    .map(Serve::log)
                    .collect::<Vec<_>>()
                    .join("\n---\n")
            )
        })
        .1;
    let refunds = cluster.refunds_by_execution().await;
    assert_eq!(refunds.get(&id), Some(&1), "{refunds:?}");
    assert_eq!(refunds.values().sum::<usize>(), 1, "{refunds:?}");
    let charge_now = cluster.stripe.get(&format!("charges/{charge}")).await;
    assert_eq!(charge_now["amount_refunded"], 1_000);
    let steps = cluster.audit_steps(&id).await;
    let claimed = steps
        .iter()
        .filter(|(e, o)| e == "rechecked" && o.as_deref() == Some("run"))
        .count();
    let ran = steps.iter().filter(|(e, _)| e == "ran").count();
    let approved = steps.iter().filter(|(e, _)| e == "approved").count();
    assert_eq!((approved, claimed, ran), (1, 1, 1), "{steps:?}");
    println!(
        "20 approvals across 3 instances: 1 taken, 19 told; 1 refund at localstripe, run by \
         {} ({:.1} s, load {})",
        runner.unwrap_or_default(),
        started.elapsed().as_secs_f64(),
        load()
    );
}

/// Where a call stood when its runner was killed.
fn stage(status: &str, refunded: bool) -> &'static str {
    match (status, refunded) {
        ("held", _) => "before its approval was recorded",
        ("approved", _) => "between approve and claim",
        ("running", false) => "claimed, before the refund was made",
        ("running", true) => "after the refund was made, before its outcome was recorded",
        _ => "after it ran",
    }
}

/// `kill -9` of the instance that would run approved calls, around approve → claim →
/// send: a long-lived survivor, and a victim started again for each life (a new
/// instance id every other life, so both a restart's recovery and the survivor's sweep
/// recover calls). In each life [`CALLS_PER_LIFE`] held refunds are approved on the
/// victim at random offsets within half the time a warm-up approval on it took to be
/// answered, and the victim is killed with SIGKILL at a random point between that and a
/// quarter past the time the warm-up took to run (both measured on each life: debug
/// builds under load are slow, and the kill must land around approve → claim → send). Every call whose approval
/// was recorded must make exactly one refund at localstripe (0 double executions, 0
/// lost approvals), every approval answered 200 must have been recorded, and a call
/// never approved makes none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_the_runner_around_approve_claim_send_never_doubles_or_loses_a_refund() {
    let started = Instant::now();
    let Some(cluster) = Cluster::new().await else {
        return;
    };
    let trials = std::env::var("THREADGATE_APPROVAL_TRIALS")
        .ok()
        .and_then(|t| t.parse::<usize>().ok())
        .unwrap_or(TRIALS);
    let per_life = std::env::var("THREADGATE_APPROVAL_CALLS_PER_LIFE")
        .ok()
        .and_then(|t| t.parse::<usize>().ok())
        .unwrap_or(CALLS_PER_LIFE)
        .max(1);
    let token = threadgate::reviewers::add(&cluster.db, "alice")
        .await
        .expect("alice");
    let token = secrecy::ExposeSecret::expose_secret(&token.token).to_owned();
    let survivor_id = format!("{}s", cluster.world.instance);
    let survivor = cluster.serve(&survivor_id, "survivor").await;
    // One charge large enough for every refund (1 cent each): a double refund is never
    // refused for want of funds, it is counted.
    let charge = cluster.charge(99_999_999).await;
    let http = reqwest::Client::new();
    let mut acked: HashMap<String, u16> = HashMap::new();
    let mut stages: HashMap<&'static str, usize> = HashMap::new();
    let mut all = Vec::new();
    let lives = trials.div_ceil(per_life);
    let mut victim_starts = Duration::ZERO;
    let mut slowest = 0;
    let mut made = Refunds::default();
    for life in 0..lives {
        let n = per_life.min(trials - life * per_life);
        let ids = cluster.hold(&charge, 1, n).await;
        all.extend(ids.iter().cloned());
        // A new instance id every other life: the previous victim's calls are left to
        // the survivor's sweep (and a later start); otherwise its own restart recovers.
        let slot = life / 2;
        let victim_id = format!("{}v{slot}", cluster.world.instance);
        let began = Instant::now();
        let mut victim = cluster.serve(&victim_id, &format!("victim{slot}")).await;
        victim_starts += began.elapsed();
        // How long this victim takes from an approval sent to the call recorded as run
        // (a warm-up call, checked with the others): the window the kill lands in.
        let warm = cluster.hold(&charge, 1, 1).await;
        all.extend(warm.iter().cloned());
        let (answer_ms, run_ms) = cluster
            .time_to_run(&http, &victim.addr, &token, &warm[0])
            .await;
        acked.insert(warm[0].clone(), 200);
        slowest = slowest.max(run_ms);
        // The approvals are sent within half the answer's time, and the kill lands
        // between half of it and a quarter past the run's: before a decision is
        // recorded, between approve and claim, during the send, or after the run.
        let (offsets, kill_at): (Vec<u64>, u64) = {
            let mut rng = rand::rng();
            let from = answer_ms / 2;
            (
                (0..n).map(|_| rng.random_range(0..=from)).collect(),
                rng.random_range(from..=(run_ms + run_ms / 4).max(from)),
            )
        };
        let fired = Instant::now();
        let mut approving = Vec::new();
        for (id, offset) in ids.iter().zip(offsets) {
            let (http, addr, token, id) =
                (http.clone(), victim.addr.clone(), token.clone(), id.clone());
            approving.push(tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(offset)).await;
                let status = approve_api(&http, &addr, &token, &id).await;
                (id, status)
            }));
        }
        tokio::time::sleep_until((fired + Duration::from_millis(kill_at)).into()).await;
        victim.child.kill().expect("kill -9 the victim");
        victim.child.wait().expect("reap the victim");
        let rows = cluster.rows().await;
        made.update(&cluster.stripe).await;
        for id in &ids {
            let status = rows.get(id).map_or("missing", |(s, _)| s.as_str());
            let refunded = made.by_execution.contains_key(id);
            *stages.entry(stage(status, refunded)).or_insert(0) += 1;
        }
        for task in approving {
            let (id, status) = task.await.expect("an approval");
            acked.insert(id, status);
        }
        drop(victim);
    }
    let killed = started.elapsed();

    // Everything left behind is recovered: no call stays approved or running.
    let settled = wait_for(Duration::from_secs(60), || async {
        let rows = cluster.rows().await;
        let open = rows
            .values()
            .filter(|(s, _)| s == "approved" || s == "running")
            .count();
        (open == 0).then_some(rows)
    })
    .await;
    let rows = settled.unwrap_or_else(|| {
        panic!(
            "calls were left approved or running; survivor's log:\n{}",
            survivor.log()
        )
    });
    made.update(&cluster.stripe).await;
    let refunds = made.by_execution;
    // The incremental count agrees with one read of every refund.
    assert_eq!(refunds, cluster.refunds_by_execution().await);
    let mut doubled = Vec::new();
    let mut lost = Vec::new();
    let mut unapproved_ran = Vec::new();
    let mut acked_lost = Vec::new();
    let (mut approved, mut by_survivor) = (0, 0);
    for id in &all {
        let (status, runner) = rows.get(id).cloned().expect("the row");
        let made = refunds.get(id).copied().unwrap_or(0);
        if made > 1 {
            doubled.push((id.clone(), made));
        }
        if status == "held" {
            if made > 0 {
                unapproved_ran.push(id.clone());
            }
            if acked.get(id) == Some(&200) {
                acked_lost.push(id.clone());
            }
            continue;
        }
        approved += 1;
        if runner.as_deref() == Some(survivor_id.as_str()) {
            by_survivor += 1;
        }
        if status != "succeeded" || made != 1 {
            lost.push((id.clone(), status, made));
        }
    }
    let load = load();
    println!(
        "kill -9 trials: {} calls over {lives} victim lives ({approved} approved, {} never \
         approved); killed {stages:?}; {} double executions, {} lost approvals; {by_survivor} \
         run by the survivor's sweep; a warm-up approval took up to {slowest} ms to run; \
         victim starts {:.1} s in all; \
         {:.1} s with the kills, {:.1} s in all (load {load})",
        all.len(),
        all.len() - approved,
        doubled.len(),
        lost.len(),
        victim_starts.as_secs_f64(),
        killed.as_secs_f64(),
        started.elapsed().as_secs_f64(),
    );
    // The kills landed where it matters: some approved calls were cut between approve
    // and claim or while being sent (else these trials proved nothing).
    let in_flight: usize = [
        "between approve and claim",
        "claimed, before the refund was made",
        "after the refund was made, before its outcome was recorded",
    ]
    .iter()
    .map(|s| stages.get(s).copied().unwrap_or(0))
    .sum();
    if all.len() >= 100 {
        assert!(
            in_flight > 0,
            "no kill landed around approve -> claim -> send: {stages:?}"
        );
    }
    assert!(doubled.is_empty(), "double executions: {doubled:?}");
    assert!(
        lost.is_empty(),
        "approved calls that did not run once: {lost:?}"
    );
    assert!(
        acked_lost.is_empty(),
        "approvals answered 200 but not recorded: {acked_lost:?}"
    );
    assert!(
        unapproved_ran.is_empty(),
        "refunds made without an approval: {unapproved_ran:?}"
    );
    assert_eq!(
        refunds.values().sum::<usize>(),
        approved,
        "localstripe holds one refund per approved call, and no other: {refunds:?}"
    );
    let charge_now = cluster.stripe.get(&format!("charges/{charge}")).await;
    assert_eq!(charge_now["amount_refunded"], json!(approved));
    drop(survivor);
}

/// Where the two in-process instances of [`an_approval_decided_elsewhere_reaches_the_agent_waiting_here`]
/// keep their database.
enum Backend {
    Postgres(TestDb),
    SqliteFile,
}

/// The result of an approval decided on another instance reaches the agent waiting on
/// the instance that runs its session, whoever runs the call: the instance that
/// recorded the approval (case 1), or, when the decider died before claiming it, any
/// instance's sweep (case 2). Two in-process applications on one database (a fake
/// sandbox: the session's socket is real), localstripe counting the refunds.
async fn an_approval_decided_elsewhere_reaches_the_agent_waiting_here(backend: Backend) {
    use support::app::spawn_app;
    use support::world::{World, stored_secrets};

    let mut world = World::new().await;
    world.settings.sessions.lease_time = Duration::from_secs(3);
    let kind = match &backend {
        Backend::Postgres(pg) => {
            world.settings.store.url = pg.url().expect("url").to_owned();
            "postgres"
        }
        Backend::SqliteFile => {
            world.settings.database_file = world.settings.database_path();
            "one sqlite file"
        }
    };
    world.settings.instance_id = Some("inst-a".into());
    let db = Db::open_configured(
        Some(world.settings.store.url.as_str()).filter(|u| !u.is_empty()),
        world.settings.store.pool_size,
        &world.settings.database_path(),
    )
    .expect("open the shared database");
    let secrets = threadgate::app::open_secrets(&db, &world.settings).expect("secrets");
    for (name, value) in stored_secrets() {
        secrets
            .set(name, SecretString::from(value.to_owned()))
            .await
            .expect("store a secret");
    }
    let a = world.start().await;
    let ada = world
        .customer_session(&a, "ada@example.com", &[50_000])
        .await;
    // B starts once A owns the thread (else B's tick could take the new thread).
    let mut settings_b = world.settings.clone();
    settings_b.data_dir = world.dir.path().join("data-b");
    settings_b.instance_id = Some("inst-b".into());
    std::fs::create_dir_all(&settings_b.data_dir).expect("data dir b");
    let b = spawn_app(
        settings_b,
        threadgate::app::Overrides {
            sandbox: Some(std::sync::Arc::new(threadgate::sandbox::FakeRuntime::new())),
            clock: None,
        },
    )
    .await;
    let token = threadgate::reviewers::add(&db, "alice")
        .await
        .expect("alice");
    let token = secrecy::ExposeSecret::expose_secret(&token.token).to_owned();
    let charge = ada.charges[0].clone();

    // Case 1: approved on B, run by B; the agent waits on A's socket.
    let first = ada.session.hold_refund(&charge, 1_000).await;
    let waiting = {
        let (session, id) = (ada.session.clone(), first.clone());
        tokio::spawn(async move { session.wait(&id, 60).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let http = reqwest::Client::new();
    assert_eq!(
        approve_api(&http, &b.addr.to_string(), &token, &first).await,
        200
    );
    let seen = waiting.await.expect("the wait");
    assert_eq!(seen["status"], "ok", "{kind}: {seen}");
    let row = |id: String| {
        let db = db.clone();
        async move {
            db.read(move |c| {
                c.query_row(
                    "SELECT status, runner FROM executions WHERE id = ?1",
                    [id.as_str()],
                    |r| Ok((r.get::<_, String>(0)?, r.get::<_, Option<String>>(1)?)),
                )
            })
            .await
            .expect("the row")
        }
    };
    assert_eq!(
        row(first.clone()).await,
        ("succeeded".into(), Some("inst-b".into())),
        "{kind}"
    );

    // Case 2: the decider recorded the approval and died before claiming it (written
    // here as it would have: approved, a minute ago); a sweep runs it, and the agent
    // waiting on A gets the result.
    let second = ada.session.hold_refund(&charge, 500).await;
    let waiting = {
        let (session, id) = (ada.session.clone(), second.clone());
        tokio::spawn(async move { session.wait(&id, 60).await })
    };
    let decided_at = chrono::Utc::now().timestamp_millis() - 60_000;
    let id = second.clone();
    db.write(move |c| {
        c.execute(
            &format!(
                "UPDATE executions SET status = 'approved', reviewer = 'alice', \
                 decided_at_ms = {decided_at} WHERE id = ?1 AND status = 'held'"
            ),
            [id.as_str()],
        )
    })
    .await
    .expect("approve as a dead decider would have");
    let seen = waiting.await.expect("the wait");
    assert_eq!(seen["status"], "ok", "{kind}: {seen}");
    let (status, runner) = row(second.clone()).await;
    assert_eq!(status, "succeeded", "{kind}");
    assert!(
        ["inst-a", "inst-b"].contains(&runner.as_deref().unwrap_or_default()),
        "{kind}: {runner:?}"
    );
    let mut refunds = Refunds::default();
    refunds.update(&world.stripe).await;
    assert_eq!(refunds.by_execution.get(&first), Some(&1), "{kind}");
    assert_eq!(refunds.by_execution.get(&second), Some(&1), "{kind}");
    assert_eq!(refunds.by_execution.values().sum::<usize>(), 2, "{kind}");
    println!(
        "{kind}: an approval decided on B reached the agent waiting on A (run by B, then by {runner:?}'s sweep)"
    );
    drop(b);
    drop(a);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_decided_elsewhere_reaches_the_waiting_agent_on_postgres() {
    let Some(pg) = TestDb::postgres_from_env() else {
        eprintln!("THREADGATE_TEST_DATABASE_URL is not set: instances_approvals skipped");
        return;
    };
    an_approval_decided_elsewhere_reaches_the_agent_waiting_here(Backend::Postgres(pg)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_decided_elsewhere_reaches_the_waiting_agent_on_one_sqlite_file() {
    an_approval_decided_elsewhere_reaches_the_agent_waiting_here(Backend::SqliteFile).await;
}

/// An instance told to stop while it sends an approved refund keeps its heartbeat
/// fresh until the refund is done: another instance's sweep (lease time 1 s) does not
/// take the call for a dead instance's, though the send outlasts the lease time. On one
/// SQLite file, two in-process applications.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_sent_while_its_instance_drains_is_not_taken_over() {
    use support::app::spawn_app;
    use support::world::World;

    let mut world = World::new().await;
    world.settings.sessions.lease_time = Duration::from_secs(1);
    world.settings.database_file = world.settings.database_path();
    world.settings.instance_id = Some("inst-a".into());
    let arrived = std::sync::Arc::new(tokio::sync::Notify::new());
    world.settings.stripe.api_url = support::slow_stripe::start(
        world.stripe.base_url(),
        Duration::from_secs(4),
        arrived.clone(),
    )
    .await;
    let a = world.start().await;
    let ada = world
        .customer_session(&a, "ada@example.com", &[50_000])
        .await;
    let mut settings_b = world.settings.clone();
    settings_b.data_dir = world.dir.path().join("data-b");
    settings_b.instance_id = Some("inst-b".into());
    std::fs::create_dir_all(&settings_b.data_dir).expect("data dir b");
    let b = spawn_app(
        settings_b,
        threadgate::app::Overrides {
            sandbox: Some(std::sync::Arc::new(threadgate::sandbox::FakeRuntime::new())),
            clock: None,
        },
    )
    .await;
    let id = ada.session.hold_refund(&ada.charges[0], 700).await;
    let alice = a.add_reviewer("alice").await;
    let (status, body) = a.decide(&id, &alice, "approve", "").await;
    assert_eq!(status, 200, "{body}");
    tokio::time::timeout(Duration::from_secs(30), arrived.notified())
        .await
        .expect("the approved refund reaches Stripe");
    // A stops while the refund is held for 4 s, four times its lease time.
    a.stop().await;
    let (status, runner): (String, Option<String>) =
        b.db.read({
            let id = id.clone();
            move |c| {
                c.query_row(
                    "SELECT status, runner FROM executions WHERE id = ?1",
                    [id.as_str()],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
            }
        })
        .await
        .expect("the row");
    assert_eq!(
        (status.as_str(), runner.as_deref()),
        ("succeeded", Some("inst-a")),
        "the draining instance ran it; no sweep took it over"
    );
    let mut refunds = Refunds::default();
    refunds.update(&world.stripe).await;
    assert_eq!(refunds.by_execution.get(&id), Some(&1));
    drop(b);
}
