//! A read in a session without holds is decided from memory (`gateway::holds`), so the
//! session's holds must never be missed: once a read of the session waits for a person,
//! an identical read stays pending and another read of that tool is held, even after the
//! policy lets reads run, and even after a restart. A session that never had a hold
//! reads as before.

use serde_json::{Value, json};
use threadgate::gateway::LoadedPolicy;
use threadgate::policy::Policy;

use crate::support::app::TestApp;
use crate::support::world::{Session, World};

const HOLD_CHARGE_READS: &str = r#"
policy:
  default_mode: risk
policies:
  - match: "stripe.get_charge"
    action: require_approval
"#;

const RUN_CHARGE_READS: &str = r#"
policy:
  default_mode: risk
policies:
  - match: "stripe.get_charge"
    action: always_run
"#;

/// Puts `text` in force as the gate's policy, as a reload would.
fn use_policy(app: &TestApp, text: &str) {
    let policy = Policy::parse(text, "policy.yaml").expect("parse");
    let loaded = LoadedPolicy::new(policy, "policy.yaml".into());
    app.gate.set_policy(loaded);
}

async fn read_charge(session: &Session, charge: &str) -> (u16, Value) {
    session
        .call("stripe.get_charge", json!({"charge": charge}), None)
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_held_read_is_found_after_the_policy_lets_reads_run() {
    let world = World::with_policy_text(HOLD_CHARGE_READS).await;
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[4900, 3000])
        .await;
    let (status, held) = read_charge(&ada.session, &ada.charges[0]).await;
    assert_eq!(status, 202, "{held}");
    let held_id = held["execution_id"].as_str().expect("id").to_owned();

    use_policy(&app, RUN_CHARGE_READS);
    let (status, again) = read_charge(&ada.session, &ada.charges[0]).await;
    assert_eq!(status, 202, "the identical read is still pending: {again}");
    assert_eq!(again["execution_id"], held_id.as_str(), "{again}");
    let (status, other) = read_charge(&ada.session, &ada.charges[1]).await;
    assert_eq!(status, 202, "another read of the tool is held: {other}");
    assert_ne!(other["execution_id"], held_id.as_str());

    // Another session, which never had a hold, reads at once.
    let bob = world
        .customer_session(&app, "bob@example.com", &[2500])
        .await;
    let (status, body) = read_charge(&bob.session, &bob.charges[0]).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["result"]["amount"], 2500);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_made_before_a_restart_is_found_after_it() {
    let mut world = World::with_policy_text(HOLD_CHARGE_READS).await;
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[4900])
        .await;
    let thread = ada.session.thread_id.clone();
    let (status, held) = read_charge(&ada.session, &ada.charges[0]).await;
    assert_eq!(status, 202, "{held}");
    app.stop().await;

    // The next start runs under a policy that lets the read run.
    let policy = world.dir.path().join("run-reads.yaml");
    std::fs::write(&policy, RUN_CHARGE_READS).expect("write policy");
    world.settings.policy_file = policy;
    let app = world.start().await;
    let session = world.session_of(&app, &thread).await;
    let (status, again) = read_charge(&session, &ada.charges[0]).await;
    assert_eq!(status, 202, "still pending after the restart: {again}");
    assert_eq!(again["execution_id"], held["execution_id"], "{again}");
    app.stop().await;
}
