//! The demo's end by default: threadgate stays up with its review page, a reviewer
//! made for the demo (the library's reviewer creation, a fresh random password) is
//! printed with the held refund's approval link, and the demo prints what becomes of
//! the refund once a person decides it (and the agent's reply that follows) until
//! Ctrl-C.

use std::time::Duration;

use threadgate::reviewers;
use threadgate::secrets::SecretString;
use tokio::sync::watch;

use crate::flow::{Opened, unless_interrupted};
use crate::report::{Call, calls_of};
use crate::support::agent::AgentWorld;
use crate::support::app::TestApp;

/// The demo reviewer's name.
pub(crate) const REVIEWER: &str = "demo-reviewer";

/// Makes the demo's reviewer, prints how to review the held refund, and reports what
/// becomes of it until Ctrl-C.
pub(crate) async fn stay_up(
    w: &AgentWorld,
    app: &TestApp,
    threads: &[Opened],
    stop: &mut watch::Receiver<bool>,
) {
    let password = uuid::Uuid::new_v4().simple().to_string()[..20].to_owned();
    reviewers::add(&app.db, REVIEWER)
        .await
        .expect("the demo's reviewer");
    reviewers::set_password(
        &app.db,
        &app.hasher,
        REVIEWER,
        SecretString::from(password.clone()),
    )
    .await
    .expect("the demo reviewer's password");
    let held = held_refund(app, threads).await;
    println!("threadgate stays up with its review page (the links above work now):");
    println!("   review page:  http://{}/approvals", app.addr);
    println!("   reviewer:     {REVIEWER}");
    println!("   password:     {password}   (made for this demo; gone when it stops)");
    match &held {
        Some((_, call)) => {
            println!("   held refund:  {}", app.gate.approval_url(&call.id));
            println!(
                "Sign in, approve the held refund, and watch it run here. Ctrl-C stops everything and cleans up."
            );
        }
        None => println!("(no held refund to approve)\nCtrl-C stops everything and cleans up."),
    }
    let Some((thread, call)) = held else {
        let _ = stop.wait_for(|s| *s).await;
        println!("\nCtrl-C: stopping threadgate and cleaning up...");
        return;
    };
    if unless_interrupted(stop, watch_refund(w, app, &thread, &call.id))
        .await
        .is_some()
    {
        let _ = stop.wait_for(|s| *s).await;
        println!("\nCtrl-C: stopping threadgate and cleaning up...");
    }
}

/// The held `stripe.create_refund` of the demo's threads, with its thread.
async fn held_refund(app: &TestApp, threads: &[Opened]) -> Option<(String, Call)> {
    for t in threads {
        let held = calls_of(app, &t.thread)
            .await
            .into_iter()
            .find(|c| c.tool == "stripe.create_refund" && c.status == "held");
        if let Some(call) = held {
            return Some((t.thread.clone(), call));
        }
    }
    None
}

/// Prints each state the held call moves to, until it is final, then the agent's
/// next reply on the thread.
async fn watch_refund(w: &AgentWorld, app: &TestApp, thread: &str, id: &str) {
    let before = w.world.plain.thread(thread);
    let (replies_before, events_before) = (before.replies().len(), before.events().len());
    let mut last = "held".to_owned();
    let call = loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let Some(call) = calls_of(app, thread).await.into_iter().find(|c| c.id == id) else {
            continue;
        };
        if call.status != last {
            last = call.status.clone();
            say_status(&call);
            if !matches!(call.status.as_str(), "approved" | "running") {
                break call;
            }
        }
    };
    if call.status == "expired" {
        return;
    }
    println!("waiting for the agent's reply to the customer...");
    loop {
        let replies = w.world.plain.thread(thread).replies();
        if let Some((text, _)) = replies.get(replies_before) {
            println!("reply to the customer (written by the scripted model): {text:?}");
            for event in w
                .world
                .plain
                .thread(thread)
                .events()
                .iter()
                .skip(events_before)
            {
                println!(
                    "thread event on Plain: {}: {}",
                    event.title,
                    event.text().replace('\n', " / ")
                );
            }
            return;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

fn say_status(call: &Call) {
    let who = call.reviewer.as_deref().unwrap_or("a reviewer");
    let message = call
        .decision_message
        .as_deref()
        .filter(|m| !m.is_empty())
        .map(|m| format!(": {m:?}"))
        .unwrap_or_default();
    match call.status.as_str() {
        "approved" => println!("the held refund {} was approved by {who}", call.id),
        "running" => println!("the held refund {} is running", call.id),
        "succeeded" => println!("the held refund ran: {}", refund_result(call)),
        "denied" => println!("the held refund {} was denied by {who}{message}", call.id),
        "expired" => println!("the held refund {} expired without a decision", call.id),
        other => println!(
            "the held refund {} is {other}: {}",
            call.id,
            call.error.as_deref().unwrap_or("no detail")
        ),
    }
}

/// What Stripe answered for the refund: its id, amount, currency and status.
fn refund_result(call: &Call) -> String {
    let result: serde_json::Value = call
        .result
        .as_deref()
        .and_then(|r| serde_json::from_str(r).ok())
        .unwrap_or_default();
    let amount = result["currency"]
        .as_str()
        .and_then(threadgate::money::Currency::parse)
        .zip(result["amount"].as_i64())
        .map_or_else(|| result["amount"].to_string(), |(c, a)| c.format(a));
    format!(
        "refund {} of {amount} ({}), approved by {}",
        result["id"].as_str().unwrap_or("?"),
        result["status"].as_str().unwrap_or("?"),
        call.reviewer.as_deref().unwrap_or("a reviewer"),
    )
}
